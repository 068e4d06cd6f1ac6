//! Checks that need provider knowledge, answered from plugin manifests:
//! resource and data source types exist, specs match their schemas, custom
//! variable types exist, provider functions are known to `${..}`.
//!
//! Pure: the manifests are data (fetched or read from the cache by the plugin
//! host beforehand). Calls into plugins (custom validation, variable options)
//! happen outside validation, in `plugin_checks`.

use super::ProviderChecks;
use super::types::{Static, Typer};
use crate::blueprint::{Blueprint, TKind, TNode, article_of};
use crate::diag::{Diagnostic, Diagnostics, codes, did_you_mean};
use crate::functions::{FunctionCatalog, Param, Signature, Ty};
use crate::source::Span;
use trellis_proto::plugin::v1::{self as pb, Manifest, Schema, SchemaType};

/// The manifests of the providers available to a validation.
#[derive(Clone)]
pub struct Manifests {
    providers: Vec<Manifest>,
    /// Provider functions as signatures (see [`Manifests::functions`]).
    signatures: Vec<&'static Signature>,
    /// Providers that are installed but could not answer, and why: their
    /// types are reported as unavailable rather than missing.
    unavailable: Vec<(String, String)>,
}

impl Manifests {
    pub fn new(providers: Vec<Manifest>) -> Manifests {
        Manifests::with_unavailable(providers, Vec::new())
    }

    /// Manifests of the providers that answered, plus (namespace, reason)
    /// for installed ones that did not.
    pub fn with_unavailable(
        providers: Vec<Manifest>,
        unavailable: Vec<(String, String)>,
    ) -> Manifests {
        let signatures = providers
            .iter()
            .flat_map(|m| m.functions.iter())
            .map(signature_of)
            .collect();
        Manifests {
            providers,
            signatures,
            unavailable,
        }
    }

    pub fn namespaces(&self) -> impl Iterator<Item = &str> {
        self.providers
            .iter()
            .filter_map(|m| m.plugin.as_ref().map(|p| p.name.as_str()))
    }

    /// The manifest of provider `namespace`, if it answered.
    pub fn provider(&self, namespace: &str) -> Option<&Manifest> {
        self.providers
            .iter()
            .find(|m| m.plugin.as_ref().is_some_and(|p| p.name == namespace))
    }

    pub fn resource_type(&self, ty: &str) -> Option<&pb::ResourceTypeDef> {
        let ns = ty.split('/').next()?;
        self.provider(ns)?
            .resource_types
            .iter()
            .find(|r| r.r#type == ty)
    }

    /// The namespace of the provider that declares a function.
    pub fn function_namespace(&self, function: &str) -> Option<&str> {
        self.providers
            .iter()
            .find(|m| m.functions.iter().any(|f| f.name == function))
            .and_then(|m| m.plugin.as_ref().map(|p| p.name.as_str()))
    }

    pub fn has_variable_type(&self, ty: &str) -> bool {
        let ns = ty.split('/').next().unwrap_or_default();
        self.provider(ns)
            .is_some_and(|m| m.custom_variable_types.iter().any(|c| c.r#type == ty))
    }

    /// Every provider's link types with the provider's namespace, in
    /// provider order, then declaration order.
    pub fn link_types(&self) -> impl Iterator<Item = (&str, &pb::LinkTypeDef)> {
        self.providers.iter().flat_map(|m| {
            let ns = m.plugin.as_ref().map_or("", |p| p.name.as_str());
            m.link_types.iter().map(move |l| (ns, l))
        })
    }

    /// Core functions plus every provider's functions.
    pub fn functions(&self) -> WithProviderFunctions<'_> {
        WithProviderFunctions { manifests: self }
    }
}

/// A function catalog: the core set first, then provider functions.
pub struct WithProviderFunctions<'a> {
    manifests: &'a Manifests,
}

impl FunctionCatalog for WithProviderFunctions<'_> {
    fn lookup(&self, name: &str) -> Option<&Signature> {
        crate::functions::core(name).or_else(|| {
            self.manifests
                .signatures
                .iter()
                .copied()
                .find(|s| s.name == name)
        })
    }

    fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = crate::functions::CORE.iter().map(|s| s.name).collect();
        names.extend(self.manifests.signatures.iter().map(|s| s.name));
        names
    }
}

fn ty_of(t: i32) -> Ty {
    match SchemaType::try_from(t).unwrap_or(SchemaType::Any) {
        SchemaType::String => Ty::String,
        SchemaType::Integer => Ty::Integer,
        SchemaType::Float => Ty::Float,
        SchemaType::Boolean => Ty::Boolean,
        SchemaType::Array => Ty::Array,
        SchemaType::Object | SchemaType::Map => Ty::Object,
        SchemaType::Any | SchemaType::Unspecified => Ty::Any,
    }
}

/// A provider function's signature. Signatures are `'static` because the
/// core table is; provider ones are leaked once per loaded manifest, which
/// the plugin host loads once per plugin binary.
fn signature_of(f: &pb::FunctionDef) -> &'static Signature {
    let leak = |s: &str| -> &'static str { Box::leak(s.to_owned().into_boxed_str()) };
    let params: Vec<Param> = f
        .params
        .iter()
        .map(|p| Param {
            name: leak(&p.name),
            ty: ty_of(p.r#type),
            optional: p.optional,
        })
        .collect();
    Box::leak(Box::new(Signature {
        name: leak(&f.name),
        params: Box::leak(params.into_boxed_slice()),
        variadic: f.variadic.as_ref().map(|v| ty_of(v.r#type)),
        returns: ty_of(f.returns),
        summary: leak(&f.description),
    }))
}

fn schema_type(s: &Schema) -> SchemaType {
    SchemaType::try_from(s.r#type).unwrap_or(SchemaType::Any)
}

fn type_label(t: SchemaType) -> &'static str {
    match t {
        SchemaType::String => "string",
        SchemaType::Integer => "integer",
        SchemaType::Float => "float",
        SchemaType::Boolean => "boolean",
        SchemaType::Array => "array",
        SchemaType::Object => "object",
        SchemaType::Map => "mapping",
        SchemaType::Any | SchemaType::Unspecified => "any",
    }
}

impl ProviderChecks for Manifests {
    fn spec_fields(&self, resource_type: &str) -> Option<&[pb::SchemaField]> {
        let schema = self.resource_type(resource_type)?.spec_schema.as_ref()?;
        (schema.r#type == SchemaType::Object as i32).then_some(schema.fields.as_slice())
    }

    fn check(&self, bp: &Blueprint, functions: &dyn FunctionCatalog, diags: &mut Diagnostics) {
        let typer = Typer { bp, functions };
        for r in &bp.resources {
            let Some(ty) = &r.ty else { continue };
            let Some(ns) = ty.value.split('/').next() else {
                continue;
            };
            let Some(provider) = self.provider(ns) else {
                self.missing_provider(ns, ty.span, "resource", diags);
                continue;
            };
            let Some(def) = provider
                .resource_types
                .iter()
                .find(|d| d.r#type == ty.value)
            else {
                let names = provider.resource_types.iter().map(|d| d.r#type.as_str());
                let mut d = Diagnostic::new(
                    &codes::UNKNOWN_RESOURCE_TYPE,
                    ty.span,
                    format!("provider `{ns}` has no resource type `{}`", ty.value),
                );
                d.hint = did_you_mean(&ty.value, names).map(|s| format!("did you mean `{s}`?"));
                diags.push(d);
                continue;
            };
            if let (Some(spec), Some(schema)) = (&r.spec, &def.spec_schema) {
                let what = format!("the spec of resource `{}`", r.name.value);
                check_node(spec, schema, &what, &typer, diags);
            }
        }
        for d in &bp.datasources {
            let Some(ty) = &d.ty else { continue };
            let Some(ns) = ty.value.split('/').next() else {
                continue;
            };
            let Some(provider) = self.provider(ns) else {
                self.missing_provider(ns, ty.span, "data source", diags);
                continue;
            };
            let Some(def) = provider
                .data_source_types
                .iter()
                .find(|x| x.r#type == ty.value)
            else {
                let names = provider.data_source_types.iter().map(|x| x.r#type.as_str());
                let mut diag = Diagnostic::new(
                    &codes::UNKNOWN_DATASOURCE_TYPE,
                    ty.span,
                    format!("provider `{ns}` has no data source type `{}`", ty.value),
                );
                diag.hint = did_you_mean(&ty.value, names).map(|s| format!("did you mean `{s}`?"));
                diags.push(diag);
                continue;
            };
            for f in &d.filters {
                let Some(field) = &f.field else { continue };
                // A filter field is a path into the item (`subnets[0].zone`): its first
                // step is the filterable field.
                let root = field.value.split(['.', '[']).next().unwrap_or_default();
                if !def.filter_fields.iter().any(|x| x.name == root) {
                    let names = def.filter_fields.iter().map(|x| x.name.as_str());
                    let mut diag = Diagnostic::new(
                        &codes::FILTER_FIELD_UNKNOWN,
                        field.span,
                        format!(
                            "data source type `{}` cannot be filtered on `{}`",
                            ty.value, field.value
                        ),
                    );
                    diag.hint = did_you_mean(&field.value, names.clone())
                        .map(|s| format!("did you mean `{s}`?"))
                        .or_else(|| {
                            Some(format!(
                                "filterable fields: {}",
                                names.collect::<Vec<_>>().join(", ")
                            ))
                        });
                    diags.push(diag);
                }
            }
            for x in &d.exports {
                let source = x.source_field();
                if !def.exports.iter().any(|e| e.name == source) {
                    let names = def.exports.iter().map(|e| e.name.as_str());
                    let span = x.alias_for.as_ref().map_or(x.name.span, |a| a.span);
                    let mut diag = Diagnostic::new(
                        &codes::DATASOURCE_EXPORT_UNKNOWN,
                        span,
                        format!(
                            "data source type `{}` has no field `{source}` to export",
                            ty.value
                        ),
                    );
                    diag.hint = did_you_mean(source, names).map(|s| format!("did you mean `{s}`?"));
                    diags.push(diag);
                }
            }
        }
        for v in &bp.variables {
            let Some(ty) = &v.ty else { continue };
            if !ty.value.contains('/') {
                continue;
            }
            let ns = ty.value.split('/').next().unwrap_or_default();
            let Some(provider) = self.provider(ns) else {
                self.missing_provider(ns, ty.span, "variable type", diags);
                continue;
            };
            if !provider
                .custom_variable_types
                .iter()
                .any(|c| c.r#type == ty.value)
            {
                let names = provider
                    .custom_variable_types
                    .iter()
                    .map(|c| c.r#type.as_str());
                let mut diag = Diagnostic::new(
                    &codes::UNKNOWN_VARIABLE_TYPE,
                    ty.span,
                    format!("provider `{ns}` has no custom variable type `{}`", ty.value),
                );
                diag.hint = did_you_mean(&ty.value, names).map(|s| format!("did you mean `{s}`?"));
                diags.push(diag);
            }
        }
        super::links::check(self, bp, functions, diags);
    }
}

impl Manifests {
    fn missing_provider(&self, ns: &str, span: Span, what: &str, diags: &mut Diagnostics) {
        if let Some((_, why)) = self.unavailable.iter().find(|(n, _)| n == ns) {
            diags.push(Diagnostic::new(
                &codes::PLUGIN_UNAVAILABLE,
                span,
                format!("provider `{ns}` is installed but unavailable: {why}"),
            ));
            return;
        }
        let mut d = Diagnostic::new(
            &codes::PROVIDER_MISSING,
            span,
            format!("no installed plugin provides the `{ns}` namespace this {what} type needs"),
        );
        d.hint = Some(match did_you_mean(ns, self.namespaces()) {
            Some(s) => format!(
                "did you mean `{s}`? (or install `trellis-provider-{ns}`; --skip-provider-checks validates without plugins)"
            ),
            None => format!(
                "install `trellis-provider-{ns}` in the plugin directory, or validate with --skip-provider-checks"
            ),
        });
        diags.push(d);
    }
}

/// Checks a spec node against its schema, field by field.
fn check_node(
    node: &TNode,
    schema: &Schema,
    what: &str,
    typer: &Typer<'_>,
    diags: &mut Diagnostics,
) {
    let want = schema_type(schema);
    // The type of the node as written, or of its substitution when it is one.
    let (got, literal) = match &node.kind {
        TKind::Null => return,
        TKind::Bool(_) => (Static::Boolean, true),
        TKind::Int(_) => (Static::Integer, true),
        TKind::Float(_) => (Static::Float, true),
        TKind::List(_) => (Static::Array, true),
        TKind::Map(_) => (Static::Object, true),
        TKind::Str(t) => (typer.template(t), !t.has_substitutions()),
    };
    let fits = match want {
        SchemaType::Any | SchemaType::Unspecified => true,
        SchemaType::String => got.fits(Static::String),
        SchemaType::Integer => got.fits(Static::Integer),
        SchemaType::Float => got.fits(Static::Float),
        SchemaType::Boolean => got.fits(Static::Boolean),
        SchemaType::Array => got.fits(Static::Array),
        SchemaType::Object | SchemaType::Map => got.fits(Static::Object),
    };
    if !fits {
        diags.push(Diagnostic::new(
            &codes::SPEC_FIELD_TYPE,
            node.span,
            format!(
                "{what} must be {}, found {}",
                article_of(type_label(want)),
                article_of(got.as_str())
            ),
        ));
        return;
    }
    if literal
        && !schema.allowed_values.is_empty()
        && let Some(v) = literal_value(node)
        && !schema.allowed_values.iter().any(|a| same(a, &v))
    {
        let list: Vec<String> = schema.allowed_values.iter().map(render).collect();
        let mut d = Diagnostic::new(
            &codes::SPEC_FIELD_NOT_ALLOWED,
            node.span,
            format!("{what} is {}, which is not an allowed value", render(&v)),
        );
        d.hint = Some(format!("allowed: {}", list.join(", ")));
        diags.push(d);
    }
    match (&node.kind, want) {
        (TKind::Map(entries), SchemaType::Object) => {
            for field in &schema.fields {
                let present = entries.iter().find(|(k, _)| k.name == field.name);
                match present {
                    None if field.required
                        && field.schema.as_ref().is_none_or(|s| s.default.is_none()) =>
                    {
                        diags.push(
                            Diagnostic::new(
                                &codes::SPEC_FIELD_MISSING,
                                node.span.start_point(),
                                format!("{what} is missing the required field `{}`", field.name),
                            )
                            .with_hint(
                                field
                                    .schema
                                    .as_ref()
                                    .map_or(String::new(), |s| s.description.clone()),
                            ),
                        );
                    }
                    Some((k, _)) if field.computed => {
                        diags.push(
                            Diagnostic::new(
                                &codes::SPEC_FIELD_COMPUTED,
                                k.span,
                                format!(
                                    "`{}` in {what} is computed by the provider and cannot be set",
                                    field.name
                                ),
                            )
                            .with_hint(
                                "read it after deploy with `${resources.<name>.spec.<field>}`",
                            ),
                        );
                    }
                    Some((k, v)) => {
                        if let Some(s) = &field.schema {
                            check_node(v, s, &format!("`{}` in {what}", k.name), typer, diags);
                        }
                    }
                    None => {}
                }
            }
            for (k, _) in entries {
                if !schema.fields.iter().any(|f| f.name == k.name) {
                    let names = schema
                        .fields
                        .iter()
                        .filter(|f| !f.computed)
                        .map(|f| f.name.as_str());
                    let mut d = Diagnostic::new(
                        &codes::SPEC_FIELD_UNKNOWN,
                        k.span,
                        format!("unknown field `{}` in {what}", k.name),
                    );
                    d.hint = did_you_mean(&k.name, names.clone())
                        .map(|s| format!("did you mean `{s}`?"))
                        .or_else(|| {
                            Some(format!("fields: {}", names.collect::<Vec<_>>().join(", ")))
                        });
                    diags.push(d);
                }
            }
        }
        (TKind::Map(entries), SchemaType::Map) => {
            if let Some(values) = &schema.values {
                for (k, v) in entries {
                    check_node(v, values, &format!("`{}` in {what}", k.name), typer, diags);
                }
            }
        }
        (TKind::List(items), SchemaType::Array) => {
            if let Some(item) = &schema.items {
                for (i, v) in items.iter().enumerate() {
                    check_node(v, item, &format!("element {i} of {what}"), typer, diags);
                }
            }
        }
        _ => {}
    }
}

/// A literal scalar node as a protocol value, for allowed-value checks.
pub(super) fn literal_value(node: &TNode) -> Option<pb::Value> {
    use pb::value::Kind;
    let kind = match &node.kind {
        TKind::Bool(b) => Kind::Bool(*b),
        TKind::Int(i) => Kind::Int(*i),
        TKind::Float(f) => Kind::Float(*f),
        TKind::Str(t) => Kind::String(t.as_literal()?),
        _ => return None,
    };
    Some(pb::Value {
        kind: Some(kind),
        sensitive: false,
    })
}

/// Value equality where an integer equals the float of the same value.
pub(super) fn same(a: &pb::Value, b: &pb::Value) -> bool {
    use pb::value::Kind;
    match (&a.kind, &b.kind) {
        (Some(Kind::Int(x)), Some(Kind::Float(y))) | (Some(Kind::Float(y)), Some(Kind::Int(x))) => {
            (*x as f64) == *y
        }
        (x, y) => x == y,
    }
}

/// A scalar for messages.
pub(super) fn render(v: &pb::Value) -> String {
    use pb::value::Kind;
    match &v.kind {
        Some(Kind::String(s)) => format!("{s:?}"),
        Some(Kind::Int(i)) => i.to_string(),
        Some(Kind::Float(f)) => f.to_string(),
        Some(Kind::Bool(b)) => b.to_string(),
        _ => "..".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::SourceMap;
    use crate::validate::Options;
    use crate::validate::validate_source;

    fn field(name: &str, t: SchemaType) -> pb::SchemaField {
        pb::SchemaField {
            name: name.into(),
            schema: Some(Schema {
                r#type: t as i32,
                ..Schema::default()
            }),
            ..pb::SchemaField::default()
        }
    }

    fn manifest() -> Manifest {
        let mut path = field("path", SchemaType::String);
        path.required = true;
        let mut mode = field("mode", SchemaType::String);
        mode.schema.as_mut().unwrap().allowed_values = ["0644", "0600"]
            .iter()
            .map(|s| pb::Value {
                kind: Some(pb::value::Kind::String((*s).into())),
                sensitive: false,
            })
            .collect();
        let mut sha = field("sha256", SchemaType::String);
        sha.computed = true;
        Manifest {
            plugin: Some(pb::PluginInfo {
                kind: pb::PluginKind::Provider as i32,
                name: "local".into(),
                version: "1".into(),
            }),
            resource_types: vec![pb::ResourceTypeDef {
                r#type: "local/file".into(),
                description: String::new(),
                spec_schema: Some(Schema {
                    r#type: SchemaType::Object as i32,
                    fields: vec![
                        path,
                        field("content", SchemaType::String),
                        mode,
                        sha,
                        field("size", SchemaType::Integer),
                    ],
                    ..Schema::default()
                }),
                importable: false,
            }],
            custom_variable_types: vec![pb::CustomVariableTypeDef {
                r#type: "local/fileMode".into(),
                description: String::new(),
            }],
            functions: vec![pb::FunctionDef {
                name: "sha256".into(),
                description: "hash".into(),
                params: vec![pb::FunctionParam {
                    name: "text".into(),
                    r#type: SchemaType::String as i32,
                    optional: false,
                    description: String::new(),
                }],
                variadic: None,
                returns: SchemaType::String as i32,
            }],
            ..Manifest::default()
        }
    }

    fn codes_of(text: &str) -> Vec<(&'static str, u32)> {
        let m = Manifests::new(vec![manifest()]);
        let functions = m.functions();
        let opts = Options {
            functions: &functions,
            providers: Some(&m),
            variables: &[],
            unchecked_functions: false,
        };
        let mut sources = SourceMap::new();
        let mut diags = Diagnostics::default();
        validate_source(
            &mut sources,
            "bp.yaml",
            text.as_bytes().to_vec(),
            &opts,
            1 << 20,
            &mut diags,
        );
        diags
            .items
            .iter()
            .map(|d| (d.code.id, sources.resolve(d.span).0.line))
            .collect()
    }

    #[test]
    fn specs_are_checked_against_schemas() {
        let bp = "version: 2023-04-20
variables:
  mode: {type: local/fileMod}
resources:
  ok:
    type: local/file
    spec:
      path: /tmp/a
      content: ${sha256(\"x\")}
  bad:
    type: local/fiel
    spec: {}
  wrong:
    type: local/file
    spec:
      content: 3
      mode: \"0777\"
      sha256: abc
      colour: red
  other:
    type: aws/s3/bucket
    spec: {}
";
        assert_eq!(
            codes_of(bp),
            [
                ("T0809", 3),
                ("T0802", 11),
                ("T0805", 16),
                ("T0806", 16),
                ("T0807", 17),
                ("T0808", 18),
                ("T0804", 19),
                ("T0801", 21),
            ]
        );
    }

    #[test]
    fn provider_functions_are_typed_like_core_ones() {
        let bp = "version: 2023-04-20
resources:
  a:
    type: local/file
    spec:
      path: ${sha256(1)}
      content: ${sha265(\"x\")}
";
        assert_eq!(codes_of(bp), [("T0701", 6), ("T0510", 7)]);
    }
}
