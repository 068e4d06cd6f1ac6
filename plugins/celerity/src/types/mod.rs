//! One module per abstract type: its schema (what `trellis plugins` and
//! validation show) and its emission into concrete `aws/*` resources.

use crate::model::{Input, Out, Resource};
use trellis_plugin_sdk::prelude::*;

pub mod api;
pub mod bucket;
pub mod config;
pub mod consumer;
pub mod datastore;
pub mod handler;
pub mod handler_config;
pub mod queue;
pub mod schedule;
pub mod topic;

/// An abstract type this transformer implements.
pub struct Kind {
    pub ty: &'static str,
    pub description: &'static str,
    pub schema: fn() -> Schema,
    /// Emits the concrete resources of one abstract resource (document order).
    pub emit: fn(&Input, &Resource, &mut Out),
    /// Runs once after every resource is emitted, in [`KINDS`] order: wiring
    /// that patches resources other kinds emitted (a consumer's labels on
    /// its handler's function).
    pub finish: Option<fn(&Input, &mut Out)>,
}

macro_rules! kind {
    ($m:ident, $desc:expr) => {
        Kind {
            ty: $m::TYPE,
            description: $desc,
            schema: $m::schema,
            emit: $m::emit,
            finish: None,
        }
    };
    ($m:ident, $desc:expr, finish) => {
        Kind {
            ty: $m::TYPE,
            description: $desc,
            schema: $m::schema,
            emit: $m::emit,
            finish: Some($m::finish),
        }
    };
}

pub const KINDS: &[Kind] = &[
    kind!(handler_config, handler_config::DESCRIPTION, finish),
    kind!(config, config::DESCRIPTION),
    kind!(datastore, datastore::DESCRIPTION),
    kind!(queue, queue::DESCRIPTION),
    kind!(topic, topic::DESCRIPTION),
    kind!(bucket, bucket::DESCRIPTION),
    kind!(handler, handler::DESCRIPTION),
    kind!(api, api::DESCRIPTION, finish),
    kind!(consumer, consumer::DESCRIPTION, finish),
    kind!(schedule, schedule::DESCRIPTION, finish),
];

/// Types of the Celerity documentation this transformer does not implement
/// yet: reported, never dropped.
pub const LATER: &[&str] = &[
    "celerity/cache",
    "celerity/sqlDatabase",
    "celerity/vpc",
    "celerity/workflow",
    "celerity/channel",
];

pub fn kind(ty: &str) -> Option<&'static Kind> {
    KINDS.iter().find(|k| k.ty == ty)
}

pub fn not_supported(r: &Resource, out: &mut Out) {
    let supported: Vec<&str> = KINDS.iter().map(|k| k.ty).collect();
    out.error(
        "unsupported-type",
        format!("`{}` is not supported by this transformer yet", r.ty),
        r.at().field("type"),
    )
    .hint = Some(format!("supported: {}", supported.join(", ")));
}
