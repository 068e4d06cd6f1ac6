//! Trellis: a deploy engine for the Blueprint Specification v2023-04-20.
//!
//! The pipeline, bytes to state: [`document`] (YAML/JSON to a spanned tree),
//! [`blueprint`] (the typed model), [`subst`] (the `${..}` language),
//! [`validate`] (diagnostics). See ARCHITECTURE.md for the map and the
//! invariants each module keeps.

pub mod blueprint;
pub mod check;
pub mod cli;
pub mod cli_client;
mod cli_eval;
pub mod datasource;
pub mod diag;
pub mod document;
pub mod engine;
pub mod eval;
pub mod functions;
pub mod plugin_checks;
pub mod plugins;
pub mod redact;
pub mod serve;
pub mod source;
pub mod state;
pub mod subst;
#[cfg(test)]
mod test_dir;
pub mod transform;
pub mod validate;
