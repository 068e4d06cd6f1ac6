//! Static validation: every rule of the specification that can be checked
//! without plugins, in one pass that reports every problem it finds.
//!
//! Pure: no I/O, no clock. Provider knowledge (resource types, schemas,
//! provider functions) comes in through [`Options`]: a [`FunctionCatalog`]
//! and an optional [`ProviderChecks`].

mod graph;
pub mod includes;
pub mod links;
pub mod providers;
pub mod refs;
mod sections;
pub mod types;

pub use sections::parse_input as parse_variable_input;

use crate::blueprint::Blueprint;
use crate::diag::Diagnostics;
use crate::functions::{CoreFunctions, FunctionCatalog};
use crate::source::SourceFile;

/// Checks that need a provider: does a resource type exist, is its spec
/// valid. The plugin host implements this; validation without plugins
/// (`--skip-provider-checks`) passes `None`.
pub trait ProviderChecks {
    /// Checks every resource, data source and custom variable type of the
    /// blueprint against what the providers declare.
    fn check(&self, bp: &Blueprint, functions: &dyn FunctionCatalog, diags: &mut Diagnostics);

    /// The top-level fields of a resource type's spec schema (`computed` says which the
    /// provider fills in), when the type has an object schema; `None` when nothing is known (no
    /// such type, no schema, or an open one). References to `resources.x.spec.<field>` are
    /// checked against them.
    fn spec_fields(
        &self,
        resource_type: &str,
    ) -> Option<&[trellis_proto::plugin::v1::SchemaField]> {
        let _ = resource_type;
        None
    }
}

pub struct Options<'a> {
    pub functions: &'a dyn FunctionCatalog,
    pub providers: Option<&'a dyn ProviderChecks>,
    /// Variable values supplied by the caller (`--var name=value`), as text.
    pub variables: &'a [(String, String)],
    /// Provider functions are not known (`trellis validate --skip-provider-checks`): a call to
    /// a function `functions` lacks is a warning (it may be a provider's), not an error.
    pub unchecked_functions: bool,
}

impl Default for Options<'_> {
    fn default() -> Self {
        Options {
            functions: &CoreFunctions,
            providers: None,
            variables: &[],
            unchecked_functions: false,
        }
    }
}

/// Validates a loaded blueprint; diagnostics are appended in discovery order.
/// Returns the dependency graph, which evaluation walks in order.
pub fn validate(
    bp: &Blueprint,
    src: &SourceFile,
    opts: &Options<'_>,
    diags: &mut Diagnostics,
) -> refs::Graph {
    sections::check(bp, opts, diags);
    let graph = refs::check(bp, src, opts, diags);
    graph::report_cycles(bp, &graph, diags);
    graph::check_each_sources(bp, &graph, diags);
    if let Some(p) = opts.providers {
        p.check(bp, opts.functions, diags);
    }
    graph
}

/// Checks a template that stands outside the blueprint (`trellis eval`'s
/// expression) against the blueprint's names, functions and types.
pub fn check_template(
    bp: &Blueprint,
    opts: &Options<'_>,
    t: &crate::subst::Template,
    diags: &mut Diagnostics,
) {
    refs::check_detached(bp, opts, t, diags);
}

/// Validates one in-memory document: reads it (up to `max_input_size` bytes), parses it,
/// builds the blueprint and validates it, adding what it finds to `diags` in source order.
/// What `trellis validate` does per file.
pub fn validate_source(
    sources: &mut crate::source::SourceMap,
    name: &str,
    bytes: Vec<u8>,
    opts: &Options<'_>,
    max_input_size: usize,
    diags: &mut crate::diag::Diagnostics,
) {
    validate_source_with_children(sources, name, bytes, opts, max_input_size, &|_| None, diags);
}

/// [`validate_source`], also checking each include whose `path` is a literal local path
/// against the child document `read_child` returns for it (the path joined to the
/// directory of `name`; `None` when it cannot be read, which leaves the include to plan):
/// the variables passed must have the types the child declares, and the child's required
/// variables must be passed ([`includes::check_include_variables`]). `read_child` is the
/// caller's file access; this crate does no I/O.
pub fn validate_source_with_children(
    sources: &mut crate::source::SourceMap,
    name: &str,
    bytes: Vec<u8>,
    opts: &Options<'_>,
    max_input_size: usize,
    read_child: &dyn Fn(&str) -> Option<Vec<u8>>,
    diags: &mut crate::diag::Diagnostics,
) {
    use crate::document::{self, Format};
    let mut local = crate::diag::Diagnostics::default();
    if let Some(file) = document::load_bytes(sources, name, bytes, max_input_size, &mut local)
        && let Some(root) = document::parse(sources, file, Format::from_path(name), &mut local)
    {
        let src = sources.get(file);
        let bp = crate::blueprint::load(&root, src, file, &mut local);
        drop(root);
        validate(&bp, src, opts, &mut local);
        for inc in &bp.include {
            let Some(path) = inc.path.as_ref().and_then(|t| t.as_literal()) else {
                continue;
            };
            let Some(child) = local_child_path(name, &path) else {
                continue;
            };
            let Some(content) = read_child(&child) else {
                continue;
            };
            let Some(declared) = child_variables(&child, content, max_input_size) else {
                continue;
            };
            includes::check_include_variables(
                &bp,
                inc,
                &path,
                &declared,
                opts.functions,
                &mut local,
            );
        }
    }
    local.sort();
    diags.extend(local.items);
}

/// A local include path resolved against the directory of the including file; `None` for
/// remote or empty paths.
pub fn local_child_path(parent: &str, path: &str) -> Option<String> {
    if path.is_empty() || path.contains("://") {
        return None;
    }
    if path.starts_with('/') {
        return Some(path.to_owned());
    }
    Some(match parent.rfind('/') {
        Some(i) => format!("{}/{path}", &parent[..i]),
        None => path.to_owned(),
    })
}

/// The variables a child document declares; `None` when it does not load.
fn child_variables(
    file: &str,
    content: Vec<u8>,
    max_input_size: usize,
) -> Option<Vec<crate::blueprint::Variable>> {
    use crate::document::{self, Format};
    let mut sources = crate::source::SourceMap::new();
    let mut ignored = crate::diag::Diagnostics::default();
    let id = document::load_bytes(&mut sources, file, content, max_input_size, &mut ignored)?;
    let root = document::parse(&sources, id, Format::from_path(file), &mut ignored)?;
    Some(crate::blueprint::load(&root, sources.get(id), id, &mut ignored).variables)
}
