//! The Trellis plugin SDK: everything a Rust author needs to write a
//! provider or transformer plugin.
//!
//! - [`serve_provider`] / [`serve_transformer`]: the whole plugin protocol
//!   (launch, handshake, gRPC services, health, cancellation, shutdown), from
//!   a plain `fn main()`.
//! - [`Provider`], [`Resource`], [`DataSource`], [`Link`], [`Function`],
//!   [`CustomVariableType`], [`Transformer`]: the traits to implement.
//! - [`Schema`] / [`Field`]: declare a spec schema once; [`Spec`] reads
//!   specs with typed accessors whose errors carry the attribute path.
//! - [`Value`]: JSON plus explicit unknown and sensitive markers.
//! - [`PluginError`]: typed errors usable with `?`.
//! - [`Context`]: config, ids, deadline, cancellation and progress.
//! - [`testing::Harness`]: calls your plugin through the real protocol in
//!   the test process.
//!
//! See README.md for a complete provider.

pub mod context;
pub mod error;
pub mod provider;
pub mod schema;
mod serve;
mod service;
pub mod testing;
pub mod transformer;
pub mod value;

pub use context::Context;
pub use error::{Diagnostic, ErrorClass, PluginError, Result, ResultExt, Severity};
pub use provider::{
    Annotation, Applied, CreateRequest, CustomVariableType, DataSource, Filter, Function,
    ImportRequest, IntermediariesUpdate, Link, LinkKind, LinkPriority, LinkRequest, Param, Plan,
    PlanRequest, Provider, ReadState, Resource, ResourceState, RetryPolicy, Signature, StagedLink,
    UpdateRequest, ValidateRequest, VariableOption,
};
pub use schema::{Field, Schema, SchemaType, Spec};
pub use serve::{PROTOCOL_VERSION, serve_provider, serve_transformer};
pub use transformer::{AbstractResource, Derivation, Transformed, Transformer};
pub use value::{AttrPath, Map, PathStep, Value};

/// Put `#[trellis_plugin_sdk::async_trait]` on `impl` blocks of the SDK's
/// traits (the `async-trait` crate's macro, so a plugin needs no dependency of its own).
pub use async_trait::async_trait;

/// The generated protocol types, for those who need them.
pub use trellis_proto::plugin::v1 as proto;

/// Everything a plugin usually imports: `use trellis_plugin_sdk::prelude::*;`.
pub mod prelude {
    pub use crate::async_trait;
    pub use crate::{
        AbstractResource, Annotation, Applied, AttrPath, Context, CreateRequest,
        CustomVariableType, DataSource, Derivation, Diagnostic, ErrorClass, Field, Filter,
        Function, ImportRequest, IntermediariesUpdate, Link, LinkKind, LinkPriority, LinkRequest,
        Param, Plan, PlanRequest, PluginError, Provider, ReadState, Resource, ResourceState,
        Result, ResultExt, RetryPolicy, Schema, SchemaType, Severity, Signature, Spec, StagedLink,
        Transformed, Transformer, UpdateRequest, ValidateRequest, Value, VariableOption,
    };
}
