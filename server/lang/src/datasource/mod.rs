//! Data sources at plan time: selecting one of the items a provider's
//! `FetchDataSource` returned with the blueprint's filters, and reading its
//! exported fields. Pure functions over [`Value`](crate::eval::value::Value);
//! no I/O.
//!
//! - [`select`]: the first item that matches all the filters;
//!   [`matches()`]: one item against one filter.
//! - [`export`]: the exported fields of the selected item, type-checked.
//! - [`FieldPath`]: the paths filters and exports use (`metadata.name`,
//!   `subnets[0].az`, `subnets[].az`, `tags["app.kubernetes.io/name"]`).
//!
//! The operators follow the "Operator Behaviours" section of the Blueprint
//! Specification exactly; any combination of field and search types the
//! specification does not list is an error naming the field, the operator,
//! both types and what the operator accepts. Where the specification leaves
//! a choice (`docs/datasource-filters.md` explains each):
//!
//! - integers and floats are one primitive type, numbers, compared exactly
//!   by value (`1 = 1.0`), as everywhere else in the evaluator;
//! - a field the item does not have (absent key, index out of range, null)
//!   matches no operator, negated ones included;
//! - array `=` requires equal lengths;
//! - an unknown search value, or an unknown field value, is an error that
//!   [`FilterError::is_unknown`] recognises (evaluate after deploy);
//! - [`select`] checks the filters before any item, tests every item (so an
//!   error does not depend on item order), and evaluates the filters of an
//!   item in order, stopping at the first that fails (so a filter can guard
//!   the next on heterogeneous items);
//! - [`export`] converts an integer to a declared `float` (when exact) and
//!   passes unknown values through.

pub mod filter;

pub use filter::{
    Export, ExportError, ExportErrorKind, ExportType, FieldPath, Filter, FilterError,
    FilterErrorKind, Lookup, Operator, PathError, Signature, Step, UnknownOperator, absent_fields,
    describe, export, matches, select,
};
