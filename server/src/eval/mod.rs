//! Evaluation of substitutions over a typed value model in which a value may
//! be unknown until deploy.

pub mod functions;
pub mod value;
