//! `trellis serve`: the engine daemon.

pub mod config;

pub use config::ServeArgs;
