//! Integration tests of the language crate: the conformance corpora (validation and evaluation), evaluation laws and no-panic properties.

mod conformance;
mod eval_conformance;
mod eval_laws;
mod no_panic;
