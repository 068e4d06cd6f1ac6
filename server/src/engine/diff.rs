//! Field-level differences between a resource's recorded spec and its planned one.
