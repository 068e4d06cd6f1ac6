//! The blueprint language, bytes to values, with no I/O runtime: [`document`] (YAML/JSON to a
//! spanned tree), [`inject`] (property injectors' spec defaults, on that tree), [`blueprint`]
//! (the typed model), [`subst`] (the `${..}` language), [`validate`] (diagnostics, with plugins'
//! schemas through traits), [`eval`] (values, with data sources and functions through traits),
//! [`transform`] and [`plugin_checks`] (what plugins are asked, as traits). No tokio, gRPC or SQL
//! in its dependencies: everything that talks to a plugin or a store sits above it.
//! ARCHITECTURE.md has the map.

pub mod blueprint;
pub mod datasource;
pub mod diag;
pub mod document;
pub mod eval;
pub mod functions;
pub mod inject;
pub mod plugin_checks;
pub mod redact;
pub mod source;
pub mod subst;
#[cfg(any(test, feature = "test-util"))]
pub mod test_dir;
pub mod transform;
pub mod validate;
