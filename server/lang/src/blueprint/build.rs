//! Document tree → typed blueprint, with structural diagnostics.

use super::*;
use crate::diag::{Code, Diagnostic, Diagnostics, codes, did_you_mean};
use crate::document::{Node, NodeKind};
use crate::source::SourceFile;
use crate::subst::{SpanMap, parse_template};

/// Builds the typed model from a parsed document. Always returns a model
/// (possibly partial); problems go to `diags`.
pub fn load(root: &Node, src: &SourceFile, file: FileId, diags: &mut Diagnostics) -> Blueprint {
    let mut b = Builder { src, file, diags };
    b.blueprint(root)
}

struct Builder<'a> {
    src: &'a SourceFile,
    file: FileId,
    diags: &'a mut Diagnostics,
}

const TOP_FIELDS: &[&str] = &[
    "version",
    "transform",
    "variables",
    "values",
    "datasources",
    "resources",
    "include",
    "exports",
    "metadata",
];
const VARIABLE_FIELDS: &[&str] = &["type", "description", "secret", "default", "allowedValues"];
const VALUE_FIELDS: &[&str] = &["type", "value", "description", "secret"];
const DATASOURCE_FIELDS: &[&str] = &["type", "metadata", "filter", "exports", "description"];
const DS_METADATA_FIELDS: &[&str] = &["displayName", "annotations", "custom"];
const FILTER_FIELDS: &[&str] = &["field", "operator", "search"];
const DS_EXPORT_FIELDS: &[&str] = &["type", "aliasFor", "description"];
const RESOURCE_FIELDS: &[&str] = &[
    "type",
    "description",
    "metadata",
    "condition",
    "each",
    "linkSelector",
    "dependsOn",
    "spec",
];
const RESOURCE_METADATA_FIELDS: &[&str] = &["displayName", "annotations", "labels", "custom"];
const LINK_SELECTOR_FIELDS: &[&str] = &["byLabel"];
const INCLUDE_FIELDS: &[&str] = &["path", "variables", "metadata", "description"];
const EXPORT_FIELDS: &[&str] = &["type", "field", "description"];
const CONDITION_FIELDS: &[&str] = &["and", "or", "not"];

/// Finds a field in a mapping's entries.
fn get<'n>(entries: &'n [(Key, Node)], name: &str) -> Option<&'n Node> {
    entries.iter().find(|(k, _)| k.name == name).map(|(_, v)| v)
}

/// Finds `${` that is not the `$${` escape.
fn has_substitution(s: &str) -> bool {
    let b = s.as_bytes();
    let mut from = 0;
    while let Some(i) = crate::subst::find_open(b, from) {
        if i == 0 || b[i - 1] != b'$' {
            return true;
        }
        from = i + 2;
    }
    false
}

impl Builder<'_> {
    fn push(&mut self, code: &'static Code, span: Span, msg: impl Into<String>) {
        self.diags.push(Diagnostic::new(code, span, msg));
    }

    fn wrong_type(&mut self, node: &Node, what: &str, expected: &str) {
        let mut d = Diagnostic::new(
            &codes::WRONG_TYPE,
            node.span,
            format!(
                "{what} must be {expected}, found {}",
                article(node.type_name())
            ),
        );
        if matches!(node.kind, NodeKind::Null) {
            d = d.with_hint(
                "an empty YAML value is null (YAML 1.2 core schema); write `\"\"` for the empty string, or remove the field",
            );
        }
        self.diags.push(d);
    }

    /// The entries of a mapping whose fields are fixed by the specification;
    /// unknown fields are reported, with a suggestion when one is close.
    fn fields<'n>(
        &mut self,
        node: &'n Node,
        what: &str,
        allowed: &[&str],
    ) -> Option<&'n [(Key, Node)]> {
        let Some(entries) = node.as_map() else {
            self.wrong_type(node, what, "a mapping");
            return None;
        };
        for (k, _) in entries {
            if allowed.contains(&k.name.as_str()) {
                continue;
            }
            if self.key_has_substitution(k) {
                continue;
            }
            let mut d = Diagnostic::new(
                &codes::UNKNOWN_FIELD,
                k.span,
                format!("unknown field `{}` in {what}", k.name),
            );
            d = match did_you_mean(&k.name, allowed.iter().copied()) {
                Some(s) => d.with_hint(format!("did you mean `{s}`?")),
                None => d.with_hint(format!("expected one of: {}", allowed.join(", "))),
            };
            self.diags.push(d);
        }
        Some(entries)
    }

    /// Keys can never hold substitutions.
    fn key_has_substitution(&mut self, k: &Key) -> bool {
        if has_substitution(&k.name) {
            self.push(
                &codes::SUBST_NOT_ALLOWED,
                k.span,
                "substitutions are not allowed in mapping keys",
            );
            return true;
        }
        false
    }

    fn missing(&mut self, at: Span, field: &str, what: &str) {
        self.push(
            &codes::MISSING_FIELD,
            at,
            format!("{what} is missing the required field `{field}`"),
        );
    }

    /// A string where the specification forbids `${..}`; `$${` is unescaped.
    fn plain_string(&mut self, node: &Node, what: &str) -> Option<Spanned<String>> {
        let Some(s) = node.as_str() else {
            self.wrong_type(node, what, "a string");
            return None;
        };
        if has_substitution(s) {
            self.push(
                &codes::SUBST_NOT_ALLOWED,
                node.span,
                format!("substitutions are not allowed in {what}"),
            );
            return None;
        }
        Some(Spanned {
            value: if s.contains("$${") {
                s.replace("$${", "${")
            } else {
                s.to_owned()
            },
            span: node.span,
        })
    }

    /// A name key of a section entry, checked against the `name` rule.
    fn name(&mut self, k: &Key, what: &str) -> Spanned<String> {
        // Resources, values, data sources and child blueprints may have dots
        // in their names (referred to as `resources["a.v1"]`); variables and
        // exports may not.
        let dotted = !matches!(what, "variable" | "export");
        let valid = if dotted {
            is_valid_dotted_name(&k.name)
        } else {
            is_valid_name(&k.name)
        };
        if !self.key_has_substitution(k) && !valid {
            self.diags.push(
                Diagnostic::new(
                    &codes::INVALID_NAME,
                    k.span,
                    format!("`{}` is not a valid {what} name", k.name),
                )
                .with_hint(if dotted {
                    "names start with a letter or `_` and contain only letters, digits, `_`, `-` and dots between parts"
                } else {
                    "names start with a letter or `_` and contain only letters, digits, `_` and `-`"
                }),
            );
        }
        Spanned {
            value: k.name.clone(),
            span: k.span,
        }
    }

    fn template_of(&mut self, node: &Node) -> Option<Template> {
        let NodeKind::Str(s, style) = &node.kind else {
            return None;
        };
        let raw = self
            .src
            .text
            .get(node.span.start as usize..node.span.end as usize)
            .unwrap_or("");
        // Only build an alignment table when there is something to locate.
        let map = if matches!(style, crate::document::StrStyle::Transformed) && !s.contains("${") {
            SpanMap::verbatim(self.file, node.span.start)
        } else {
            SpanMap::new(self.file, s, *style, raw, node.span.start)
        };
        Some(parse_template(s, &map, node.span, self.diags))
    }

    /// A string where substitutions are allowed.
    fn template(&mut self, node: &Node, what: &str) -> Option<Template> {
        let t = self.template_of(node);
        if t.is_none() {
            self.wrong_type(node, what, "a string");
        }
        t
    }

    /// A description: substitutions work but are discouraged.
    fn description(&mut self, node: &Node, what: &str) -> Option<Template> {
        let t = self.template(node, what)?;
        if let Some(sub) = t.substitutions().next() {
            self.diags.push(
                Diagnostic::new(
                    &codes::SUBST_DISCOURAGED,
                    sub.span,
                    format!("a substitution in {what} is allowed but not recommended"),
                )
                .with_hint("keep descriptions static so a blueprint reads the same before and after deploy"),
            );
        }
        Some(t)
    }

    fn tnode(&mut self, node: &Node) -> TNode {
        let kind = match &node.kind {
            NodeKind::Null => TKind::Null,
            NodeKind::Bool(b) => TKind::Bool(*b),
            NodeKind::Int(i) => TKind::Int(*i),
            NodeKind::Float(f) => TKind::Float(*f),
            NodeKind::Str(..) => TKind::Str(self.template_of(node).expect("string node")),
            NodeKind::List(items) => TKind::List(items.iter().map(|n| self.tnode(n)).collect()),
            NodeKind::Map(entries) => TKind::Map(
                entries
                    .iter()
                    .map(|(k, v)| {
                        self.key_has_substitution(k);
                        (k.clone(), self.tnode(v))
                    })
                    .collect(),
            ),
        };
        TNode {
            kind,
            span: node.span,
        }
    }

    /// A mapping whose values are converted to template trees.
    fn tmap(&mut self, node: &Node, what: &str) -> Vec<(Key, TNode)> {
        let Some(entries) = node.as_map() else {
            self.wrong_type(node, what, "a mapping");
            return Vec::new();
        };
        entries
            .iter()
            .map(|(k, v)| {
                self.key_has_substitution(k);
                (k.clone(), self.tnode(v))
            })
            .collect()
    }

    /// A mapping of scalars (`string | integer | float | boolean`).
    fn scalar_map(&mut self, node: &Node, what: &str) -> Vec<(Key, TNode)> {
        let out = self.tmap(node, what);
        for (k, v) in &out {
            if matches!(v.kind, TKind::List(_) | TKind::Map(_) | TKind::Null) {
                self.push(
                    &codes::WRONG_TYPE,
                    v.span,
                    format!(
                        "`{}` in {what} must be a string, integer, float or boolean, found {}",
                        k.name,
                        article(v.type_name())
                    ),
                );
            }
        }
        out
    }

    /// A mapping of strings to strings where substitutions are forbidden.
    fn string_map(&mut self, node: &Node, what: &str) -> Vec<(Key, Spanned<String>)> {
        let Some(entries) = node.as_map() else {
            self.wrong_type(node, what, "a mapping of strings to strings");
            return Vec::new();
        };
        let mut out = Vec::with_capacity(entries.len());
        for (k, v) in entries {
            if self.key_has_substitution(k) {
                continue;
            }
            if !matches!(v.kind, NodeKind::Str(..)) {
                self.diags.push(
                    Diagnostic::new(
                        &codes::WRONG_TYPE,
                        v.span,
                        format!(
                            "`{}` in {what} must be a string, found {}",
                            k.name,
                            article(v.type_name())
                        ),
                    )
                    .with_hint("quote the value to make it a string"),
                );
                continue;
            }
            if let Some(s) = self.plain_string(v, what) {
                out.push((k.clone(), s));
            }
        }
        out
    }

    /// Iterates the entries of a top-level section mapping.
    fn section<'n>(&mut self, node: &'n Node, what: &str) -> &'n [(Key, Node)] {
        match node.as_map() {
            Some(e) => e,
            None => {
                self.wrong_type(node, &format!("`{what}`"), "a mapping");
                &[]
            }
        }
    }

    fn blueprint(&mut self, root: &Node) -> Blueprint {
        let mut bp = Blueprint {
            file: self.file,
            span: root.span,
            ..Blueprint::default()
        };
        let Some(top) = self.fields(root, "the blueprint", TOP_FIELDS) else {
            bp.malformed = true;
            return bp;
        };
        bp.malformed = get(top, "resources").is_some_and(|n| n.as_map().is_none());
        match get(top, "version") {
            None => self.diags.push(
                Diagnostic::new(
                    &codes::MISSING_FIELD,
                    root.span.start_point(),
                    "the blueprint is missing the required field `version`",
                )
                .with_hint(format!("add `version: {SPEC_VERSION}`")),
            ),
            Some(v) => {
                if let Some(s) = self.plain_string(v, "`version`") {
                    if s.value != SPEC_VERSION {
                        self.diags.push(
                            Diagnostic::new(
                                &codes::UNSUPPORTED_VERSION,
                                v.span,
                                format!("unsupported version `{}`", s.value),
                            )
                            .with_hint(format!("this engine implements version `{SPEC_VERSION}`")),
                        );
                    }
                    bp.version = Some(s);
                }
            }
        }
        if let Some(t) = get(top, "transform") {
            match &t.kind {
                NodeKind::List(items) => {
                    for item in items {
                        if let Some(s) = self.plain_string(item, "`transform`") {
                            bp.transform.push(s);
                        }
                    }
                }
                _ => {
                    if let Some(s) = self.plain_string(t, "`transform`") {
                        bp.transform.push(s);
                    }
                }
            }
        }
        for (key, node) in top {
            match key.name.as_str() {
                "variables" => {
                    for (k, v) in self.section(node, "variables") {
                        let var = self.variable(k, v);
                        bp.variables.push(var);
                    }
                }
                "values" => {
                    for (k, v) in self.section(node, "values") {
                        let val = self.value(k, v);
                        bp.values.push(val);
                    }
                }
                "datasources" => {
                    for (k, v) in self.section(node, "datasources") {
                        let ds = self.datasource(k, v);
                        bp.datasources.push(ds);
                    }
                }
                "resources" => {
                    for (k, v) in self.section(node, "resources") {
                        let r = self.resource(k, v);
                        bp.resources.push(r);
                    }
                }
                "include" => {
                    for (k, v) in self.section(node, "include") {
                        let i = self.include(k, v);
                        bp.include.push(i);
                    }
                }
                "exports" => {
                    for (k, v) in self.section(node, "exports") {
                        let e = self.export(k, v);
                        bp.exports.push(e);
                    }
                }
                "metadata" => {
                    if node.as_map().is_none() {
                        self.wrong_type(node, "`metadata`", "a mapping");
                    } else {
                        bp.metadata = Some(self.tnode(node));
                    }
                }
                _ => {}
            }
        }
        bp
    }

    fn variable(&mut self, k: &Key, node: &Node) -> Variable {
        let name = self.name(k, "variable");
        let what = format!("variable `{}`", k.name);
        let mut var = Variable {
            name,
            ty: None,
            description: None,
            secret: false,
            default: None,
            allowed_values: None,
        };
        let Some(f) = self.fields(node, &what, VARIABLE_FIELDS) else {
            return var;
        };
        match get(f, "type") {
            Some(t) => var.ty = self.plain_string(t, &format!("the type of {what}")),
            None => self.missing(k.span, "type", &what),
        }
        if let Some(d) = get(f, "description") {
            var.description = self.plain_string(d, &format!("the description of {what}"));
        }
        if let Some(s) = get(f, "secret") {
            match s.kind {
                NodeKind::Bool(b) => var.secret = b,
                _ => self.wrong_type(s, &format!("`secret` of {what}"), "a boolean"),
            }
        }
        if let Some(d) = get(f, "default") {
            var.default = self.scalar(d, &format!("the default of {what}"));
        }
        if let Some(a) = get(f, "allowedValues") {
            match &a.kind {
                NodeKind::List(items) => {
                    let vals = items
                        .iter()
                        .filter_map(|i| self.scalar(i, &format!("an allowed value of {what}")))
                        .collect();
                    var.allowed_values = Some(Spanned {
                        value: vals,
                        span: a.span,
                    });
                }
                _ => self.wrong_type(a, &format!("`allowedValues` of {what}"), "an array"),
            }
        }
        var
    }

    /// A scalar in a variable definition, where substitutions are forbidden.
    fn scalar(&mut self, node: &Node, what: &str) -> Option<Spanned<Scalar>> {
        let value = match &node.kind {
            NodeKind::Str(..) => Scalar::Str(self.plain_string(node, what)?.value),
            NodeKind::Int(i) => Scalar::Int(*i),
            NodeKind::Float(f) => Scalar::Float(*f),
            NodeKind::Bool(b) => Scalar::Bool(*b),
            _ => {
                self.wrong_type(node, what, "a string, integer, float or boolean");
                return None;
            }
        };
        Some(Spanned {
            value,
            span: node.span,
        })
    }

    fn value(&mut self, k: &Key, node: &Node) -> ValueDef {
        let name = self.name(k, "value");
        let what = format!("value `{}`", k.name);
        let mut def = ValueDef {
            name,
            ty: None,
            value: None,
            description: None,
            secret: false,
        };
        let Some(f) = self.fields(node, &what, VALUE_FIELDS) else {
            return def;
        };
        match get(f, "type") {
            Some(t) => def.ty = self.plain_string(t, &format!("the type of {what}")),
            None => self.missing(k.span, "type", &what),
        }
        match get(f, "value") {
            Some(v) => match self.template_of(v) {
                Some(t) => def.value = Some(t),
                None => self.diags.push(
                    Diagnostic::new(
                        &codes::VALUE_NOT_STRING,
                        v.span,
                        format!(
                            "the `value` of {what} must be written as a string, found {}",
                            article(v.type_name())
                        ),
                    )
                    .with_hint(
                        "quote it: integers, floats and booleans are parsed from the string",
                    ),
                ),
            },
            None => self.missing(k.span, "value", &what),
        }
        if let Some(d) = get(f, "description") {
            def.description = self.description(d, &format!("the description of {what}"));
        }
        if let Some(s) = get(f, "secret") {
            match s.kind {
                NodeKind::Bool(b) => def.secret = b,
                _ => self.wrong_type(s, &format!("`secret` of {what}"), "a boolean"),
            }
        }
        def
    }

    fn metadata(&mut self, node: &Node, what: &str, allowed: &[&str]) -> Metadata {
        let mut md = Metadata::default();
        let Some(f) = self.fields(node, what, allowed) else {
            return md;
        };
        if let Some(d) = get(f, "displayName") {
            md.display_name = self.template(d, &format!("`displayName` in {what}"));
        }
        if let Some(a) = get(f, "annotations") {
            md.annotations = self.scalar_map(a, &format!("the annotations in {what}"));
        }
        if let Some(l) = get(f, "labels") {
            md.labels = self.string_map(l, &format!("the labels in {what}"));
        }
        if let Some(c) = get(f, "custom") {
            if c.as_map().is_none() {
                self.wrong_type(c, &format!("`custom` in {what}"), "a mapping");
            } else {
                md.custom = Some(self.tnode(c));
            }
        }
        md
    }

    fn datasource(&mut self, k: &Key, node: &Node) -> DataSource {
        let name = self.name(k, "data source");
        let what = format!("data source `{}`", k.name);
        let mut ds = DataSource {
            name,
            ty: None,
            description: None,
            metadata: Metadata::default(),
            filters: Vec::new(),
            exports: Vec::new(),
            exports_span: None,
        };
        let Some(f) = self.fields(node, &what, DATASOURCE_FIELDS) else {
            return ds;
        };
        match get(f, "type") {
            Some(t) => ds.ty = self.plain_string(t, &format!("the type of {what}")),
            None => self.missing(k.span, "type", &what),
        }
        if let Some(m) = get(f, "metadata") {
            ds.metadata = self.metadata(m, &format!("the metadata of {what}"), DS_METADATA_FIELDS);
        }
        match f.iter().find(|(key, _)| key.name == "filter") {
            Some((fk, fl)) => match &fl.kind {
                NodeKind::List(items) => {
                    if items.is_empty() {
                        self.missing(fl.span, "filter", &what);
                    }
                    for item in items {
                        let filter = self.filter(item, item.span.start_point(), &what);
                        ds.filters.push(filter);
                    }
                }
                _ => {
                    let filter = self.filter(fl, fk.span, &what);
                    ds.filters.push(filter);
                }
            },
            None => self.missing(k.span, "filter", &what),
        }
        match f.iter().find(|(key, _)| key.name == "exports") {
            Some((ek, e)) => {
                ds.exports_span = Some(ek.span);
                let entries = match e.as_map() {
                    Some(entries) => entries,
                    None => {
                        self.wrong_type(e, &format!("the exports of {what}"), "a mapping");
                        &[]
                    }
                };
                for (xk, xv) in entries {
                    if self.key_has_substitution(xk) {
                        continue;
                    }
                    let export = self.datasource_export(xk, xv, &what);
                    ds.exports.push(export);
                }
            }
            None => self.missing(k.span, "exports", &what),
        }
        if let Some(d) = get(f, "description") {
            ds.description = self.description(d, &format!("the description of {what}"));
        }
        ds
    }

    /// One filter; `at` is where a missing field is reported (the `filter`
    /// key, or the list item).
    fn filter(&mut self, node: &Node, at: Span, ds_what: &str) -> Filter {
        let what = format!("the filter of {ds_what}");
        let mut filter = Filter {
            span: node.span,
            field: None,
            operator: None,
            search: None,
        };
        let Some(f) = self.fields(node, &what, FILTER_FIELDS) else {
            return filter;
        };
        match get(f, "field") {
            Some(v) => filter.field = self.plain_string(v, &format!("`field` of {what}")),
            None => self.missing(at, "field", &what),
        }
        match get(f, "operator") {
            Some(v) => filter.operator = self.plain_string(v, &format!("`operator` of {what}")),
            None => self.missing(at, "operator", &what),
        }
        match get(f, "search") {
            Some(v) => {
                let t = self.tnode(v);
                let ok = match &t.kind {
                    TKind::List(items) => items
                        .iter()
                        .all(|i| !matches!(i.kind, TKind::List(_) | TKind::Map(_) | TKind::Null)),
                    TKind::Map(_) | TKind::Null => false,
                    _ => true,
                };
                if !ok {
                    self.push(
                        &codes::WRONG_TYPE,
                        v.span,
                        format!("`search` of {what} must be a scalar or an array of scalars"),
                    );
                }
                filter.search = Some(t);
            }
            None => self.missing(at, "search", &what),
        }
        filter
    }

    fn datasource_export(&mut self, k: &Key, node: &Node, ds_what: &str) -> DataSourceExport {
        // Export names may be dot paths into the external resource.
        let valid = !k.name.is_empty() && k.name.split('.').all(is_valid_name);
        if !valid {
            self.diags.push(
                Diagnostic::new(
                    &codes::INVALID_NAME,
                    k.span,
                    format!("`{}` is not a valid exported field name", k.name),
                )
                .with_hint("use a name, or a dot path of names such as `metadata.name`"),
            );
        }
        let what = format!("export `{}` of {ds_what}", k.name);
        let mut x = DataSourceExport {
            name: Spanned {
                value: k.name.clone(),
                span: k.span,
            },
            ty: None,
            alias_for: None,
            description: None,
        };
        let Some(f) = self.fields(node, &what, DS_EXPORT_FIELDS) else {
            return x;
        };
        match get(f, "type") {
            Some(t) => x.ty = self.plain_string(t, &format!("the type of {what}")),
            None => self.missing(k.span, "type", &what),
        }
        if let Some(a) = get(f, "aliasFor") {
            x.alias_for = self.plain_string(a, &format!("`aliasFor` of {what}"));
            if let Some(alias) = &x.alias_for
                && (alias.value.is_empty() || !alias.value.split('.').all(is_valid_name))
            {
                self.push(
                    &codes::INVALID_NAME,
                    alias.span,
                    format!(
                        "`aliasFor` of {what} must be a field name or dot path, found `{}`",
                        alias.value
                    ),
                );
            }
        }
        if let Some(d) = get(f, "description") {
            x.description = self.plain_string(d, &format!("the description of {what}"));
        }
        x
    }

    fn resource(&mut self, k: &Key, node: &Node) -> Resource {
        let name = self.name(k, "resource");
        let what = format!("resource `{}`", k.name);
        let mut r = Resource {
            name,
            ty: None,
            description: None,
            metadata: Metadata::default(),
            condition: None,
            each: None,
            has_each: false,
            link_selector: None,
            depends_on: Vec::new(),
            spec: None,
        };
        let Some(f) = self.fields(node, &what, RESOURCE_FIELDS) else {
            return r;
        };
        match get(f, "type") {
            Some(t) => r.ty = self.plain_string(t, &format!("the type of {what}")),
            None => self.missing(k.span, "type", &what),
        }
        if let Some(d) = get(f, "description") {
            r.description = self.description(d, &format!("the description of {what}"));
        }
        if let Some(m) = get(f, "metadata") {
            r.metadata = self.metadata(
                m,
                &format!("the metadata of {what}"),
                RESOURCE_METADATA_FIELDS,
            );
        }
        if let Some(c) = get(f, "condition") {
            r.condition = self.condition(c, &what);
        }
        if let Some(e) = get(f, "each") {
            r.has_each = true;
            r.each = self.template(e, &format!("`each` of {what}"));
        }
        if let Some(ls) = get(f, "linkSelector") {
            let lwhat = format!("the linkSelector of {what}");
            if let Some(lf) = self.fields(ls, &lwhat, LINK_SELECTOR_FIELDS) {
                // `byLabel` is the only selector in this version, but the
                // specification does not mark it required.
                let by_label = match get(lf, "byLabel") {
                    Some(b) => self.string_map(b, &format!("`byLabel` of {lwhat}")),
                    None => Vec::new(),
                };
                r.link_selector = Some(LinkSelector {
                    span: ls.span,
                    by_label,
                });
            }
        }
        if let Some(d) = get(f, "dependsOn") {
            let dwhat = format!("`dependsOn` of {what}");
            match &d.kind {
                NodeKind::List(items) => {
                    for item in items {
                        if let Some(s) = self.plain_string(item, &dwhat) {
                            r.depends_on.push(s);
                        }
                    }
                }
                _ => {
                    if let Some(s) = self.plain_string(d, &dwhat) {
                        r.depends_on.push(s);
                    }
                }
            }
        }
        match get(f, "spec") {
            Some(s) => {
                if s.as_map().is_none() {
                    self.wrong_type(s, &format!("the spec of {what}"), "a mapping");
                } else {
                    r.spec = Some(self.tnode(s));
                }
            }
            None => self.missing(k.span, "spec", &what),
        }
        r
    }

    fn condition(&mut self, node: &Node, what: &str) -> Option<Condition> {
        match &node.kind {
            NodeKind::Str(..) => self.template_of(node).map(Condition::Expr),
            NodeKind::Map(_) => {
                let cwhat = format!("a condition of {what}");
                let f = self.fields(node, &cwhat, CONDITION_FIELDS)?;
                let present: Vec<&(Key, Node)> = f
                    .iter()
                    .filter(|(k, _)| CONDITION_FIELDS.contains(&k.name.as_str()))
                    .collect();
                if present.len() != 1 {
                    let found = present
                        .iter()
                        .map(|(k, _)| format!("`{}`", k.name))
                        .collect::<Vec<_>>();
                    self.diags.push(
                        Diagnostic::new(
                            &codes::CONDITION_SHAPE,
                            node.span,
                            if found.is_empty() {
                                format!("{cwhat} has none of `and`, `or`, `not`")
                            } else {
                                format!("{cwhat} has {}; it must have exactly one of `and`, `or`, `not`", found.join(" and "))
                            },
                        )
                        .with_hint("nest conditions to combine operators, e.g. `and: [.., {not: ..}]`"),
                    );
                    return None;
                }
                let (k, v) = present[0];
                match k.name.as_str() {
                    "not" => self
                        .condition(v, what)
                        .map(|c| Condition::Not(Box::new(c), node.span)),
                    op => {
                        let NodeKind::List(items) = &v.kind else {
                            self.wrong_type(
                                v,
                                &format!("`{op}` in {cwhat}"),
                                "an array of conditions",
                            );
                            return None;
                        };
                        let parts: Vec<Condition> = items
                            .iter()
                            .filter_map(|i| self.condition(i, what))
                            .collect();
                        Some(if op == "and" {
                            Condition::And(parts, node.span)
                        } else {
                            Condition::Or(parts, node.span)
                        })
                    }
                }
            }
            _ => {
                self.wrong_type(
                    node,
                    &format!("the condition of {what}"),
                    "a string or a condition object",
                );
                None
            }
        }
    }

    fn include(&mut self, k: &Key, node: &Node) -> Include {
        let name = self.name(k, "child blueprint");
        let what = format!("include `{}`", k.name);
        let mut inc = Include {
            name,
            path: None,
            variables: Vec::new(),
            metadata: None,
            description: None,
        };
        let Some(f) = self.fields(node, &what, INCLUDE_FIELDS) else {
            return inc;
        };
        match get(f, "path") {
            Some(p) => {
                inc.path = self.template(p, &format!("the path of {what}"));
                if p.as_str().is_some_and(|s| s.trim().is_empty()) {
                    self.push(
                        &codes::MISSING_FIELD,
                        p.span,
                        format!("the path of {what} is empty"),
                    );
                }
            }
            None => self.missing(k.span, "path", &what),
        }
        if let Some(v) = get(f, "variables") {
            inc.variables = self.scalar_map(v, &format!("the variables of {what}"));
        }
        if let Some(m) = get(f, "metadata") {
            if m.as_map().is_none() {
                self.wrong_type(m, &format!("the metadata of {what}"), "a mapping");
            } else {
                inc.metadata = Some(self.tnode(m));
            }
        }
        if let Some(d) = get(f, "description") {
            inc.description = self.template(d, &format!("the description of {what}"));
        }
        inc
    }

    fn export(&mut self, k: &Key, node: &Node) -> Export {
        let name = self.name(k, "export");
        let what = format!("export `{}`", k.name);
        let mut x = Export {
            name,
            ty: None,
            field: None,
            description: None,
        };
        let Some(f) = self.fields(node, &what, EXPORT_FIELDS) else {
            return x;
        };
        match get(f, "type") {
            Some(t) => x.ty = self.plain_string(t, &format!("the type of {what}")),
            None => self.missing(k.span, "type", &what),
        }
        match get(f, "field") {
            Some(v) => x.field = self.plain_string(v, &format!("the field of {what}")),
            None => self.missing(k.span, "field", &what),
        }
        if let Some(d) = get(f, "description") {
            x.description = self.description(d, &format!("the description of {what}"));
        }
        x
    }
}

/// "a string", "an array", "an integer".
pub fn article(type_name: &str) -> String {
    match type_name.as_bytes().first() {
        Some(b'a' | b'e' | b'i' | b'o' | b'u') => format!("an {type_name}"),
        Some(b'n') if type_name == "null" => "null".to_owned(),
        _ => format!("a {type_name}"),
    }
}
