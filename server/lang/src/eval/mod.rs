//! Evaluation of substitutions over a typed value model in which a value may
//! be unknown until deploy.
//!
//! - [`value`]: the value model ([`value::Value`], function values, unknown).
//! - [`functions`]: the 50 core functions, with the clock and working
//!   directory as inputs ([`functions::Env`]).
//! - [`expr`]: templates and expressions against a [`expr::Scope`]
//!   (lazy `and`/`or`, secrets tracked).
//! - [`blueprint`]: variables, values in dependency order, `each` expansion,
//!   conditions.
//! - [`console`]: `trellis eval` as a library.
//! - [`limits`]: bounds on value sizes, resources and total work per evaluation.
//! - [`render`]: printing values with unknowns and secrets masked.

pub mod blueprint;
pub mod console;
pub mod expr;
pub mod functions;
pub mod limits;
pub mod render;
pub mod value;
