//! The engine: plans change sets, executes them, destroys and reconciles instances, and keeps
//! what happened in the state store.

pub mod diff;
