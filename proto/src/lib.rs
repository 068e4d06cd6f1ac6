//! Generated code for the Trellis protocols.
//!
//! - [`plugin::v1`]: the plugin protocol (`proto/trellis/plugin/v1/`), spoken
//!   between the engine and its provider and transformer plugins. The .proto
//!   files are the contract; docs/plugin-protocol.md explains them.
//! - [`engine::v1`]: the engine API (`proto/trellis/engine/v1/`), what CI
//!   systems and the CLI speak to `trellis serve`; docs/engine-api.md.
//!
//! Without the `grpc` feature (on by default) only the messages are built, with prost and no
//! gRPC stack: what the language crate needs to read plugin schemas.

pub mod engine {
    pub mod v1 {
        #![allow(clippy::all, missing_docs)]
        #[cfg(feature = "grpc")]
        include!(concat!(env!("OUT_DIR"), "/grpc/trellis.engine.v1.rs"));
        #[cfg(not(feature = "grpc"))]
        include!(concat!(env!("OUT_DIR"), "/messages/trellis.engine.v1.rs"));
    }
}

pub mod plugin {
    pub mod v1 {
        #![allow(clippy::all, missing_docs)]
        #[cfg(feature = "grpc")]
        include!(concat!(env!("OUT_DIR"), "/grpc/trellis.plugin.v1.rs"));
        #[cfg(not(feature = "grpc"))]
        include!(concat!(env!("OUT_DIR"), "/messages/trellis.plugin.v1.rs"));
    }
}

/// The encoded `FileDescriptorSet` of every Trellis .proto file, for gRPC
/// reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/trellis_descriptor.bin"));

/// Unix-socket connections for the gRPC servers that accept what every gRPC client sends.
#[cfg(feature = "grpc")]
pub mod unix_conn;
