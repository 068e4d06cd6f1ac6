//! Integration tests of the state crate: the conformance suite on each store, then what only
//! one store has.

mod postgres;
mod sqlite;
