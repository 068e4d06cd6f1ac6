//! Generated protobuf code for `trellis.engine.v1` and `trellis.plugin.v1`.
//!
//! Empty until the plugin protocol lands (issue 4); the crate exists so the
//! workspace layout matches ARCHITECTURE.md from the first commit.
