//! Integration tests of the state crate: the conformance suite and what only the SQLite store has.

mod sqlite;
