//! Trellis: a deploy engine for the Blueprint Specification v2023-04-20.
//!
//! This crate is the `trellis` binary: `trellis serve` ([`serve`]: configuration, logging,
//! listeners, the gRPC API as thin handlers over the engine) and the CLI ([`cli`], and
//! [`cli::client`] for the commands that talk to an engine). The pipeline itself lives in the
//! crates below: trellis-lang, trellis-state, trellis-host and trellis-engine. See
//! ARCHITECTURE.md for the map and the invariants each crate keeps.

pub mod cli;
pub mod serve;

// The crates below the binary, under the names their modules had when they were one crate.
use trellis_engine as engine;
use trellis_engine::check;
use trellis_host as plugins;
#[cfg(test)]
use trellis_lang::test_dir;
use trellis_lang::{blueprint, diag, document, eval, functions, redact, source, subst, validate};
use trellis_state as state;
