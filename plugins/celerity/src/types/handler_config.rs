//! `celerity/handlerConfig`: contributory only. The handlers that select it
//! by label inherit its fields (below their own, above the blueprint's
//! `metadata.sharedHandlerConfig`: [`super::handler::resolve`]); it has no
//! concrete resource of its own.

use crate::model::{Input, Out, Resource};
use crate::types::handler;
use trellis_plugin_sdk::prelude::*;

pub const TYPE: &str = "celerity/handlerConfig";
pub const DESCRIPTION: &str =
    "Shared handler settings that the handlers selecting it inherit (no resource of its own)";

/// The schema of a handlerConfig's spec, and of `metadata.sharedHandlerConfig`.
pub fn schema() -> Schema {
    Schema::object()
        .describe("Settings handlers inherit when they do not set them")
        .field(
            "codeLocation",
            Field::string().describe(
                "Where the handlers' code is (a directory, a .zip file or s3://bucket/key)",
            ),
        )
        .field(
            "runtime",
            Field::string()
                .allowed(handler::runtime_ids())
                .describe("The Celerity runtime identifier (python3.13.x → Lambda python3.13)"),
        )
        .field(
            "memory",
            Field::integer().describe("Memory in MB, 128 to 10240 on Lambda"),
        )
        .field(
            "timeout",
            Field::integer().describe("Seconds a handler may run, 1 to 900 on Lambda"),
        )
        .field(
            "tracingEnabled",
            Field::boolean().describe("X-Ray tracing (Lambda tracing Active)"),
        )
        .field(
            "environmentVariables",
            Field::map(Schema::string())
                .describe("Environment variables; a handler's own override these key by key"),
        )
}

pub fn emit(input: &Input, r: &Resource, out: &mut Out) {
    out.check_spec(r, &schema());
    let users = input.selecting(r).filter(|h| h.ty == handler::TYPE).count();
    if users == 0 {
        out.warning(
            "handler-config.unused",
            format!(
                "handlerConfig `{}` is selected by no handler, so nothing inherits it",
                r.name
            ),
            r.at(),
        )
        .hint = Some(
            "give it labels a handler's linkSelector selects (handlers link to their handlerConfig)"
                .into(),
        );
    }
}

/// Checks the blueprint's `metadata.sharedHandlerConfig` once.
pub fn finish(input: &Input, out: &mut Out) {
    match input.metadata.get("sharedHandlerConfig") {
        Some(serde_json::Value::Object(shared)) => out.check_value(
            shared,
            AttrPath::root()
                .field("metadata")
                .field("sharedHandlerConfig"),
            &schema(),
        ),
        Some(_) => {
            out.error(
                "schema.type",
                "`metadata.sharedHandlerConfig` must be an object",
                AttrPath::root()
                    .field("metadata")
                    .field("sharedHandlerConfig"),
            );
        }
        None => {}
    }
}
