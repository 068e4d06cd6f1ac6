//! The Trellis plugin SDK: `serve`, provider and transformer traits, schemas,
//! typed errors and an in-process test harness.
//!
//! Empty until the plugin protocol lands (issue 4).
