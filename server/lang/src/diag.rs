//! Diagnostics: every mistake a user can make, with a stable code.
//!
//! Codes live in one registry ([`codes`]) with a one-line summary each;
//! `docs/diagnostics.md` is generated from it (`trellis explain --all`) and a
//! test keeps the two in sync. A code, once published, never changes meaning.

use crate::source::{SourceMap, Span};
use std::fmt::Write as _;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    Error,
    Warning,
    Info,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
            Severity::Info => "info",
        }
    }
}

/// A registered diagnostic code.
#[derive(Debug, PartialEq, Eq)]
pub struct Code {
    /// Stable identifier, e.g. `T0501`.
    pub id: &'static str,
    /// Kebab-case name, e.g. `unknown-variable`.
    pub name: &'static str,
    pub severity: Severity,
    /// One line: what the code means.
    pub summary: &'static str,
}

macro_rules! registry {
    ($( $konst:ident = $id:literal $name:literal $sev:ident $summary:literal; )*) => {
        /// The registry of diagnostic codes.
        pub mod codes {
            use super::{Code, Severity};
            $( pub static $konst: Code = Code { id: $id, name: $name, severity: Severity::$sev, summary: $summary }; )*
            /// Every code, in registry order.
            pub static ALL: &[&Code] = &[ $( &$konst, )* ];
        }
    };
}

registry! {
    // T01xx: reading the document.
    INPUT_TOO_LARGE = "T0101" "input-too-large" Error "The input is larger than the configured maximum size.";
    INVALID_UTF8 = "T0102" "invalid-utf8" Error "The input is not valid UTF-8.";
    YAML_SYNTAX = "T0103" "yaml-syntax" Error "The YAML document is not well formed.";
    JSON_SYNTAX = "T0104" "json-syntax" Error "The JSON document is not well formed (comments and trailing commas are accepted).";
    YAML_TAG = "T0105" "yaml-tag" Error "YAML tags are not supported in blueprints.";
    YAML_ANCHOR = "T0106" "yaml-anchor" Error "YAML anchors and aliases are not supported in blueprints.";
    MULTIPLE_DOCUMENTS = "T0107" "multiple-documents" Error "A blueprint file holds exactly one YAML document.";
    DUPLICATE_KEY = "T0108" "duplicate-key" Error "A mapping has the same key twice.";
    COMPLEX_KEY = "T0109" "complex-key" Error "A mapping key is a list or mapping; keys must be scalars.";
    NESTING_TOO_DEEP = "T0110" "nesting-too-deep" Error "The document nests deeper than the supported limit.";
    EMPTY_DOCUMENT = "T0111" "empty-document" Error "The document is empty.";

    // T02xx: the `${..}` substitution grammar.
    SUBST_UNTERMINATED = "T0201" "subst-unterminated" Error "A `${` substitution is not closed with `}`.";
    SUBST_SYNTAX = "T0202" "subst-syntax" Error "A substitution does not follow the substitution grammar.";
    SUBST_BAD_REFERENCE = "T0203" "subst-bad-reference" Error "A reference has a shape its kind does not allow (e.g. accessors after a variable).";
    SUBST_BAD_LITERAL = "T0204" "subst-bad-literal" Error "A literal in a substitution is malformed or out of range.";
    SUBST_EMPTY = "T0205" "subst-empty" Error "A substitution `${}` is empty.";

    // T03xx: document structure.
    WRONG_TYPE = "T0301" "wrong-type" Error "A field has the wrong type (e.g. a string where a mapping is expected).";
    MISSING_FIELD = "T0302" "missing-field" Error "A required field is missing.";
    UNKNOWN_FIELD = "T0303" "unknown-field" Error "A field is not part of the specification for this section.";
    UNSUPPORTED_VERSION = "T0304" "unsupported-version" Error "`version` is not `2023-04-20`.";
    NOTHING_TO_DEPLOY = "T0305" "nothing-to-deploy" Error "A blueprint has no `resources` section or an empty one; every blueprint, included children too, needs at least one resource.";
    INVALID_NAME = "T0306" "invalid-name" Error "A name does not match `[A-Za-z_][A-Za-z0-9_-]*` (resources, values, data sources and child blueprints may also have dots between such parts).";
    SUBST_NOT_ALLOWED = "T0307" "subst-not-allowed" Error "A `${..}` substitution appears where the specification forbids one.";
    SUBST_DISCOURAGED = "T0308" "subst-discouraged" Warning "A `${..}` substitution in a description works but hurts readability.";

    // T04xx: rules for each section.
    VARIABLE_TYPE = "T0401" "variable-type" Error "A variable type is not string, integer, float, boolean or `{provider}/{type}`.";
    VARIABLE_DEFAULT_TYPE = "T0402" "variable-default-type" Error "A variable's default does not match its type.";
    VARIABLE_ALLOWED_TYPE = "T0403" "variable-allowed-type" Error "An allowed value does not match the variable's type.";
    VARIABLE_DEFAULT_NOT_ALLOWED = "T0404" "variable-default-not-allowed" Error "A variable's default is not one of its allowed values.";
    VARIABLE_BOOLEAN_ALLOWED = "T0405" "variable-boolean-allowed" Error "Boolean variables cannot have allowed values.";
    VARIABLE_INPUT = "T0406" "variable-input" Error "A supplied variable value is undeclared, of the wrong type or not allowed.";
    VALUE_TYPE = "T0411" "value-type" Error "A value type is not string, integer, float, boolean, array or object.";
    VALUE_NOT_STRING = "T0412" "value-not-string" Error "The `value` field must be written as a string.";
    VALUE_INTERPOLATION = "T0413" "value-interpolation" Error "A non-string value must be one `${..}` substitution or a literal of its type, not an interpolation.";
    DATASOURCE_TYPE = "T0421" "datasource-type" Error "A data source type is not of the form `{provider}/{type}`.";
    FILTER_OPERATOR = "T0422" "filter-operator" Error "A data source filter operator is not one of the twelve the specification allows.";
    DATASOURCE_EXPORTS_EMPTY = "T0423" "datasource-exports-empty" Error "A data source must export at least one field.";
    DATASOURCE_EXPORT_TYPE = "T0424" "datasource-export-type" Error "A data source export type is not array, string, integer, float or boolean.";
    RESOURCE_TYPE = "T0431" "resource-type" Error "A resource type is not `{provider}/{service}/{type}` or `{provider}/{type}`.";
    DEPENDS_ON_UNKNOWN = "T0432" "depends-on-unknown" Error "`dependsOn` names a resource or child that does not exist.";
    DEPENDS_ON_SELF = "T0433" "depends-on-self" Error "A resource lists itself in `dependsOn`.";
    CONDITION_SHAPE = "T0434" "condition-shape" Error "A condition object must have exactly one of `and`, `or`, `not`.";
    EACH_SHAPE = "T0435" "each-shape" Error "`each` must be a single `${..}` substitution with nothing around it.";
    EACH_DEPENDS_ON_RESOURCE = "T0436" "each-depends-on-resource" Error "`each` depends, directly or through values, on a resource or child blueprint.";
    EXPORT_TYPE = "T0441" "export-type" Error "An export type is not string, integer, float, boolean, array or object.";
    EXPORT_FIELD = "T0442" "export-field" Error "An export `field` is not a plain reference such as `resources.x.spec.y`.";

    // T05xx: references.
    UNKNOWN_VARIABLE = "T0501" "unknown-variable" Error "A reference names a variable that is not declared.";
    UNKNOWN_VALUE = "T0502" "unknown-value" Error "A reference names a value that is not declared.";
    UNKNOWN_DATASOURCE = "T0503" "unknown-datasource" Error "A reference names a data source that is not declared.";
    UNKNOWN_DATASOURCE_FIELD = "T0504" "unknown-datasource-field" Error "A reference names a field the data source does not export.";
    DATASOURCE_FIELD_NOT_ARRAY = "T0505" "datasource-field-not-array" Error "A data source field is indexed but not exported as an array.";
    UNKNOWN_RESOURCE = "T0506" "unknown-resource" Error "A reference names a resource (or function) that does not exist.";
    UNKNOWN_CHILD = "T0507" "unknown-child" Error "A reference names a child blueprint that is not included.";
    ELEM_OUTSIDE_EACH = "T0508" "elem-outside-each" Error "`elem` or `i` is used outside a resource with `each`.";
    RESOURCE_FIELD = "T0509" "resource-field" Error "A resource reference must go through `.spec`, `.state` or `.metadata.{displayName,labels,annotations,custom}`, to a label or annotation the resource has, and not into a string.";
    UNKNOWN_FUNCTION = "T0510" "unknown-function" Error "A call names a function that is not defined.";
    FUNCTION_ARITY = "T0511" "function-arity" Error "A function is called with the wrong number of arguments.";
    RESOURCE_INDEX = "T0512" "resource-index" Error "A resource is indexed (`[n]`) but has no `each`, or an `each` resource is used without an index.";
    FUNCTION_VALUE = "T0513" "function-value" Error "A function value is used where a plain value is needed; functions can only be passed to functions.";

    // T06xx: the dependency graph.
    REFERENCE_CYCLE = "T0601" "reference-cycle" Error "Values, resources, data sources or children depend on each other in a cycle.";

    // T07xx: types and evaluation.
    ARGUMENT_TYPE = "T0701" "argument-type" Error "A function argument has the wrong type.";
    CONDITION_TYPE = "T0702" "condition-type" Error "A resource condition does not yield a boolean.";
    EACH_TYPE = "T0703" "each-type" Error "`each` does not yield an array.";
    VALUE_TYPE_MISMATCH = "T0704" "value-type-mismatch" Error "A value's substitution yields a different type than the value declares.";
    INTERPOLATE_COMPLEX = "T0705" "interpolate-complex" Error "An array, object or function is interpolated into a longer string.";
    EXPORT_TYPE_MISMATCH = "T0706" "export-type-mismatch" Error "An export's declared type differs from the type of the field it exports.";
    VARIABLE_REQUIRED = "T0707" "variable-required" Error "A variable without a default was given no value.";
    EVALUATION = "T0708" "evaluation" Error "Evaluating a substitution failed (a function rejected its input, a missing field or index).";
    VALUE_TOO_LARGE = "T0709" "value-too-large" Error "An expression would produce a string, array or object larger than the engine's limit per value (`max-value-bytes`).";
    TOO_MANY_RESOURCES = "T0710" "too-many-resources" Error "The blueprint would have more resources after `each` expansion than the engine's limit (`max-resources`).";
    EVALUATION_BUDGET = "T0711" "evaluation-budget" Error "Evaluating the blueprint produced more bytes of values in total than the engine's budget per evaluation (`max-eval-bytes`).";
    STRING_FIELD_COMPLEX = "T0712" "string-field-complex" Error "A string field (a description or display name) is one `${..}` that yields an array or object.";
    INCLUDE_PATH_TYPE = "T0713" "include-path-type" Error "An include's `path` is one `${..}` that yields something other than a string.";
    ARGUMENT_VALUE = "T0714" "argument-value" Error "A literal function argument is a value the function does not accept (an unsupported `datetime` format).";
    ACCESS_ON_SCALAR = "T0715" "access-on-scalar" Error "A field or index is read from a function's result that is a string, number or boolean.";

    // T08xx: provider checks (plugins).
    PROVIDER_MISSING = "T0801" "provider-missing" Error "No installed plugin provides the namespace a type needs.";
    UNKNOWN_RESOURCE_TYPE = "T0802" "unknown-resource-type" Error "The provider has no such resource type.";
    UNKNOWN_DATASOURCE_TYPE = "T0803" "unknown-datasource-type" Error "The provider has no such data source type.";
    SPEC_FIELD_UNKNOWN = "T0804" "spec-field-unknown" Error "A resource spec has a field its schema does not define.";
    SPEC_FIELD_MISSING = "T0805" "spec-field-missing" Error "A resource spec lacks a field its schema requires.";
    SPEC_FIELD_TYPE = "T0806" "spec-field-type" Error "A resource spec field has the wrong type for its schema.";
    SPEC_FIELD_NOT_ALLOWED = "T0807" "spec-field-not-allowed" Error "A resource spec field is not one of its schema's allowed values.";
    SPEC_FIELD_COMPUTED = "T0808" "spec-field-computed" Error "A resource spec sets a field the provider computes.";
    UNKNOWN_VARIABLE_TYPE = "T0809" "unknown-variable-type" Error "The provider has no such custom variable type.";
    VARIABLE_OPTION = "T0810" "variable-option" Error "A custom-typed variable's default or allowed value is not one of the type's option labels.";
    PROVIDER_DIAGNOSTIC = "T0811" "provider-diagnostic" Error "The provider's own validation rejected a resource (the message names the provider's code).";
    FILTER_FIELD_UNKNOWN = "T0812" "filter-field-unknown" Error "A data source filter uses a field the data source type cannot filter on.";
    DATASOURCE_EXPORT_UNKNOWN = "T0813" "datasource-export-unknown" Error "A data source exports a field its type does not have.";
    TRANSFORM = "T0814" "transform" Error "A transform named in `transform` is not installed or failed.";
    PLUGIN_UNAVAILABLE = "T0815" "plugin-unavailable" Error "A plugin needed for validation could not be started or answered with an error.";
    LOCAL_ASSET_MISSING = "T0816" "local-asset-missing" Error "A field that names a local file or directory (a local asset, such as a function's code) names one the request did not carry.";
    LOCAL_ASSET_UNKNOWN = "T0817" "local-asset-unknown" Error "A field that names a local file or directory has a value known only after deploy; the client must send the asset with the plan.";

    // T09xx: links.
    LINK_SELECTS_NOTHING = "T0901" "link-selects-nothing" Warning "A `linkSelector` selects no resource: no other resource of the blueprint carries all of its labels.";
    LINK_UNSUPPORTED = "T0902" "link-unsupported" Warning "A `linkSelector` selects a resource no provider can link to from the selecting resource's type, and nothing else links to it.";
    LINK_ANNOTATION_TYPE = "T0903" "link-annotation-type" Error "A link annotation has the wrong type for the link type that defines it.";
    LINK_ANNOTATION_NOT_ALLOWED = "T0904" "link-annotation-not-allowed" Error "A link annotation is not one of the values its definition allows.";
    LINK_ANNOTATION_MISSING = "T0905" "link-annotation-missing" Error "A linked resource lacks an annotation its link type requires.";
    LINK_ANNOTATION_UNKNOWN = "T0906" "link-annotation-unknown" Warning "An annotation in a provider's namespace is not defined for the resource's type by any of its link types.";
    LINK_CYCLE = "T0907" "link-cycle" Error "Hard links, with references and `dependsOn`, order resources in a cycle.";

    // T10xx: data sources at plan time.
    DATASOURCE_FETCH = "T1001" "datasource-fetch" Error "Fetching a data source from its provider failed.";
    DATASOURCE_NO_MATCH = "T1002" "datasource-no-match" Error "No item of a data source matched all of its filters.";
    DATASOURCE_FILTER = "T1003" "datasource-filter" Error "A data source filter cannot be applied: its operator does not accept the field's or the search value's type.";
    DATASOURCE_EXPORT = "T1004" "datasource-export" Error "The matched item lacks an exported field, or holds a value of another type than the export declares.";
}

/// Looks a code up by id (`T0501`) or name (`unknown-variable`).
pub fn lookup(key: &str) -> Option<&'static Code> {
    codes::ALL
        .iter()
        .copied()
        .find(|c| c.id.eq_ignore_ascii_case(key) || c.name == key)
}

/// One problem found in a blueprint.
#[derive(Clone, Debug, PartialEq)]
pub struct Diagnostic {
    pub severity: Severity,
    pub code: &'static Code,
    pub message: String,
    pub span: Span,
    pub hint: Option<String>,
}

impl Diagnostic {
    pub fn new(code: &'static Code, span: Span, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            severity: code.severity,
            code,
            message: message.into(),
            span,
            hint: None,
        }
    }

    pub fn with_hint(mut self, hint: impl Into<String>) -> Diagnostic {
        self.hint = Some(hint.into());
        self
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

/// Collects diagnostics in the order they are found.
#[derive(Debug, Default)]
pub struct Diagnostics {
    pub items: Vec<Diagnostic>,
}

impl Diagnostics {
    pub fn push(&mut self, d: Diagnostic) {
        self.items.push(d);
    }

    pub fn error(&mut self, code: &'static Code, span: Span, message: impl Into<String>) {
        self.items.push(Diagnostic::new(code, span, message));
    }

    pub fn has_errors(&self) -> bool {
        self.items.iter().any(Diagnostic::is_error)
    }

    pub fn extend(&mut self, other: impl IntoIterator<Item = Diagnostic>) {
        self.items.extend(other);
    }

    /// Sorts by file and position, keeping discovery order among equals, so
    /// output is stable whatever order the checks ran in.
    pub fn sort(&mut self) {
        self.items
            .sort_by_key(|d| (d.span.file, d.span.start, d.span.end));
    }
}

/// Renders a diagnostic rustc-style, with the source line and a caret.
pub fn render_text(d: &Diagnostic, sources: &SourceMap) -> String {
    let file = sources.get(d.span.file);
    let (start, end) = sources.resolve(d.span);
    let mut out = String::new();
    let _ = writeln!(out, "{}[{}]: {}", d.severity.as_str(), d.code.id, d.message);
    let gutter = start.line.to_string().len();
    let pad = " ".repeat(gutter);
    let _ = writeln!(
        out,
        "{pad}--> {}:{}:{}",
        file.name, start.line, start.column
    );
    let line = file.line_text(start.line);
    if !(line.is_empty() && start.line > file.line_count()) {
        let _ = writeln!(out, "{pad} |");
        let _ = writeln!(out, "{} | {}", start.line, line.replace('\t', " "));
        let width = line.chars().count() as u32;
        let first = start.column.min(width + 1);
        let last = if end.line == start.line {
            end.column.max(first + 1)
        } else {
            width + 1
        };
        let carets = (last - first).max(1) as usize;
        let _ = writeln!(
            out,
            "{pad} | {}{}",
            " ".repeat(first as usize - 1),
            "^".repeat(carets)
        );
    }
    if let Some(hint) = &d.hint {
        let _ = writeln!(out, "{pad} = hint: {hint}");
    }
    out
}

/// Renders a diagnostic as one JSON object in the documented shape.
pub fn render_json(d: &Diagnostic, sources: &SourceMap) -> String {
    render_json_value(d, sources).to_string()
}

/// The documented JSON shape of a diagnostic, as a value.
pub fn render_json_value(d: &Diagnostic, sources: &SourceMap) -> serde_json::Value {
    let file = sources.get(d.span.file);
    let (start, end) = sources.resolve(d.span);
    let mut v = serde_json::json!({
        "severity": d.severity.as_str(),
        "code": d.code.id,
        "message": d.message,
        "file": file.name,
        "line": start.line,
        "column": start.column,
        "end_line": end.line,
        "end_column": end.column,
    });
    if let (Some(h), Some(o)) = (&d.hint, v.as_object_mut()) {
        o.insert("hint".into(), serde_json::Value::String(h.clone()));
    }
    v
}

/// The closest candidate by edit distance, for "did you mean" hints.
pub fn did_you_mean<'a>(
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let limit = (name.chars().count() / 3).max(1);
    candidates
        .into_iter()
        .map(|c| (edit_distance(name, c), c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.chars().enumerate() {
        cur[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(!ca.eq_ignore_ascii_case(&cb));
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// The registry as a Markdown reference page (docs/diagnostics.md).
pub fn registry_markdown() -> String {
    let mut out = String::from(
        "# Diagnostic codes\n\n\
         Generated by `trellis explain --all`; a test fails when this page and the\n\
         registry in `server/lang/src/diag.rs` disagree. Codes are stable: a code never\n\
         changes meaning once released. `trellis explain CODE` prints one entry.\n\n\
         | code | name | severity | meaning |\n| --- | --- | --- | --- |\n",
    );
    for c in codes::ALL {
        let _ = writeln!(
            out,
            "| {} | `{}` | {} | {} |",
            c.id,
            c.name,
            c.severity.as_str(),
            c.summary
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_and_well_formed() {
        let mut ids = std::collections::HashSet::new();
        let mut names = std::collections::HashSet::new();
        for c in codes::ALL {
            assert!(ids.insert(c.id), "duplicate id {}", c.id);
            assert!(names.insert(c.name), "duplicate name {}", c.name);
            assert!(c.id.len() == 5 && c.id.starts_with('T'), "{}", c.id);
            assert!(c.summary.ends_with('.'), "{}", c.id);
        }
    }

    #[test]
    fn did_you_mean_finds_close_names() {
        assert_eq!(
            did_you_mean("dependOn", ["dependsOn", "spec"]),
            Some("dependsOn")
        );
        assert_eq!(did_you_mean("zzz", ["dependsOn", "spec"]), None);
    }
}
