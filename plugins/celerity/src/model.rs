//! The transformer's view of a blueprint: the abstract resources it reads
//! ([`Input`]) and the concrete document it writes ([`Out`]).
//!
//! Conventions every type module follows (docs/celerity/README.md):
//! - The primary concrete resource of an abstract resource keeps its name
//!   (handler `saveOrder` becomes `aws/lambda/function` `saveOrder`), so
//!   references, `dependsOn` and plan lines still name what the user wrote.
//!   Extra resources are named `<abstract>_<suffix>`.
//! - Every emitted resource is recorded as derived from its abstract resource.
//! - A field the AWS target cannot back is a diagnostic at that field.

use serde_json::{Map, Value as Json};
use std::collections::BTreeMap;
use trellis_plugin_sdk::PathStep;
use trellis_plugin_sdk::prelude::*;

/// `v` as the SDK's value, every string that holds a substitution (`${...}`)
/// unknown: the engine evaluates it after the transform.
fn checkable(v: &Json) -> Value {
    match v {
        Json::String(s) if s.contains("${") => Value::Unknown,
        Json::Array(items) => Value::List(items.iter().map(checkable).collect()),
        Json::Object(m) => Value::Map(m.iter().map(|(k, v)| (k.clone(), checkable(v))).collect()),
        other => Value::from(other.clone()),
    }
}

/// One resource of the input blueprint (abstract or not).
#[derive(Clone, Debug)]
pub struct Resource {
    pub name: String,
    pub ty: String,
    pub def: Map<String, Json>,
}

static EMPTY: std::sync::LazyLock<Map<String, Json>> = std::sync::LazyLock::new(Map::new);

impl Resource {
    pub fn spec(&self) -> &Map<String, Json> {
        self.def
            .get("spec")
            .and_then(Json::as_object)
            .unwrap_or(&EMPTY)
    }

    pub fn metadata(&self) -> &Map<String, Json> {
        self.def
            .get("metadata")
            .and_then(Json::as_object)
            .unwrap_or(&EMPTY)
    }

    pub fn labels(&self) -> &Map<String, Json> {
        self.metadata()
            .get("labels")
            .and_then(Json::as_object)
            .unwrap_or(&EMPTY)
    }

    pub fn annotations(&self) -> &Map<String, Json> {
        self.metadata()
            .get("annotations")
            .and_then(Json::as_object)
            .unwrap_or(&EMPTY)
    }

    /// `linkSelector.byLabel`, when set.
    pub fn selector(&self) -> Option<&Map<String, Json>> {
        self.def
            .get("linkSelector")
            .and_then(|s| s.get("byLabel"))
            .and_then(Json::as_object)
    }

    /// `spec.<field>` when it is a string.
    pub fn spec_str(&self, field: &str) -> Option<&str> {
        self.spec().get(field).and_then(Json::as_str)
    }

    /// `resources.<name>`
    pub fn at(&self) -> AttrPath {
        AttrPath::root()
            .field("resources")
            .field(self.name.as_str())
    }

    /// `resources.<name>.spec.<field>`
    pub fn spec_at(&self, field: &str) -> AttrPath {
        self.at().field("spec").field(field)
    }

    /// Whether this resource's selector selects `other` (every label of
    /// `byLabel` present on `other` with the same value), as the engine
    /// selects link targets.
    pub fn selects(&self, other: &Resource) -> bool {
        match self.selector() {
            Some(sel) if !sel.is_empty() && other.name != self.name => {
                let labels = other.labels();
                sel.iter().all(|(k, v)| labels.get(k) == Some(v))
            }
            _ => false,
        }
    }
}

/// The input blueprint's resources, in document order.
#[derive(Debug, Default)]
pub struct Input {
    pub resources: Vec<Resource>,
    /// The blueprint's own `metadata` (`sharedHandlerConfig` lives there).
    pub metadata: Map<String, Json>,
}

impl Input {
    pub fn from_doc(doc: &Json) -> Input {
        let resources = doc
            .get("resources")
            .and_then(Json::as_object)
            .map(|rs| {
                rs.iter()
                    .filter_map(|(name, def)| {
                        let def = def.as_object()?.clone();
                        let ty = def.get("type").and_then(Json::as_str)?.to_owned();
                        Some(Resource {
                            name: name.clone(),
                            ty,
                            def,
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        let metadata = doc
            .get("metadata")
            .and_then(Json::as_object)
            .cloned()
            .unwrap_or_default();
        Input {
            resources,
            metadata,
        }
    }

    pub fn get(&self, name: &str) -> Option<&Resource> {
        self.resources.iter().find(|r| r.name == name)
    }

    pub fn of_type<'a>(&'a self, ty: &'a str) -> impl Iterator<Item = &'a Resource> + 'a {
        self.resources.iter().filter(move |r| r.ty == ty)
    }

    /// The resources `from` selects by label.
    pub fn selected_by<'a>(
        &'a self,
        from: &'a Resource,
    ) -> impl Iterator<Item = &'a Resource> + 'a {
        self.resources.iter().filter(move |r| from.selects(r))
    }

    /// The resources that select `to` by label.
    pub fn selecting<'a>(&'a self, to: &'a Resource) -> impl Iterator<Item = &'a Resource> + 'a {
        self.resources.iter().filter(move |r| r.selects(to))
    }
}

/// The transform's output under construction.
#[derive(Debug, Default)]
pub struct Out {
    /// Concrete resources emitted, by name, in emission order.
    pub resources: Map<String, Json>,
    pub diagnostics: Vec<Diagnostic>,
    pub derivations: Vec<Derivation>,
    /// `(abstract resource, abstract spec field)` → path in the concrete
    /// document (`resources.saveOrder.spec.functionName`) that references to
    /// the abstract field are rewritten to.
    pub aliases: BTreeMap<(String, String), String>,
}

impl Out {
    /// Emit a concrete resource derived from `from`. `condition`, `each`,
    /// `dependsOn`, `linkSelector` and `metadata` are carried over from the
    /// abstract resource; the caller adjusts them afterwards when needed.
    pub fn emit(
        &mut self,
        name: &str,
        from: &Resource,
        ty: &str,
        spec: Json,
    ) -> &mut Map<String, Json> {
        let mut def = Map::new();
        def.insert("type".into(), Json::from(ty));
        for key in [
            "description",
            "condition",
            "each",
            "dependsOn",
            "linkSelector",
            "metadata",
        ] {
            if let Some(v) = from.def.get(key) {
                def.insert(key.into(), v.clone());
            }
        }
        def.insert("spec".into(), spec);
        self.derivations
            .push(Derivation::new(name.to_owned(), from.name.clone()));
        self.resources.insert(name.to_owned(), Json::Object(def));
        self.resources
            .get_mut(name)
            .and_then(Json::as_object_mut)
            .expect("just inserted")
    }

    /// An emitted resource, to adjust after its emission.
    pub fn get_mut(&mut self, name: &str) -> Option<&mut Map<String, Json>> {
        self.resources.get_mut(name).and_then(Json::as_object_mut)
    }

    pub fn error(
        &mut self,
        code: &str,
        message: impl Into<String>,
        at: AttrPath,
    ) -> &mut Diagnostic {
        self.diagnostics
            .push(Diagnostic::error(format!("celerity.{code}"), message).at(at));
        self.diagnostics.last_mut().expect("just pushed")
    }

    pub fn warning(
        &mut self,
        code: &str,
        message: impl Into<String>,
        at: AttrPath,
    ) -> &mut Diagnostic {
        self.diagnostics
            .push(Diagnostic::warning(format!("celerity.{code}"), message).at(at));
        self.diagnostics.last_mut().expect("just pushed")
    }

    /// Checks `from`'s spec against `schema` (types, allowed values, required
    /// and unknown fields), each finding a diagnostic at its field with the
    /// code `celerity.<schema code>` (`celerity.schema.type`). Strings holding
    /// a substitution are taken as unknown: the engine evaluates them later.
    pub fn check_spec(&mut self, from: &Resource, schema: &Schema) {
        self.check_value(from.spec(), from.at().field("spec"), schema);
    }

    /// [`Out::check_spec`] for any object of the document, at `base`.
    pub fn check_value(&mut self, value: &Map<String, Json>, base: AttrPath, schema: &Schema) {
        let value = checkable(&Json::Object(value.clone()));
        for d in schema.check(&value) {
            let mut at = base.clone();
            for step in d.path.as_ref().map(AttrPath::steps).unwrap_or_default() {
                at = match step {
                    PathStep::Field(f) => at.field(f.as_str()),
                    PathStep::Index(i) => at.index(*i),
                };
            }
            let mut nd =
                Diagnostic::new(d.severity, format!("celerity.{}", d.code), d.message).at(at);
            nd.hint = d.hint;
            self.diagnostics.push(nd);
        }
    }

    /// Sets `metadata.<group>.<key>` (labels or annotations) of an emitted
    /// resource.
    pub fn set_metadata(&mut self, name: &str, group: &str, key: &str, value: Json) {
        if let Some(def) = self.get_mut(name) {
            let meta = def
                .entry("metadata")
                .or_insert_with(|| Json::Object(Map::new()));
            if let Some(meta) = meta.as_object_mut() {
                let g = meta
                    .entry(group)
                    .or_insert_with(|| Json::Object(Map::new()));
                if let Some(g) = g.as_object_mut() {
                    g.insert(key.to_owned(), value);
                }
            }
        }
    }

    /// References to `${resources.<abstract>.spec.<field>}` become references
    /// to `concrete` (a path like `resources.saveOrder.spec.functionName`).
    pub fn alias(&mut self, from: &Resource, field: &str, concrete: impl Into<String>) {
        self.aliases
            .insert((from.name.clone(), field.to_owned()), concrete.into());
    }

    /// Aliases of abstract fields to fields of the concrete resource of the same name:
    /// `(abstract field, concrete field)` pairs.
    pub fn alias_fields(&mut self, from: &Resource, pairs: &[(&str, &str)]) {
        for (field, concrete) in pairs {
            let path = format!("resources.{}.spec.{concrete}", from.name);
            self.alias(from, field, path);
        }
    }
}

// ---- wiring of triggers (api, consumer, schedule) onto emitted resources ----

/// The marker annotations by which a handler says which of its linked
/// triggers it serves (`celerity.handler.http`, `.schedule`, `.consumer`).
pub const TRIGGER_MARKERS: &[&str] = &[
    "celerity.handler.http",
    "celerity.handler.websocket",
    "celerity.handler.schedule",
    "celerity.handler.consumer",
];

/// Whether a handler serves the trigger kind `marker` (one of
/// [`TRIGGER_MARKERS`]): a handler without any marker serves every trigger
/// that selects it; one with markers only those it marks `true`. The HTTP
/// route annotations count as the HTTP marker.
pub fn serves(handler: &Resource, marker: &str) -> bool {
    let ann = handler.annotations();
    let on = |key: &str| match ann.get(key) {
        Some(Json::Bool(b)) => *b,
        Some(Json::String(s)) => s == "true",
        _ => false,
    };
    let http = on("celerity.handler.http")
        || ann.contains_key("celerity.handler.http.method")
        || ann.contains_key("celerity.handler.http.path");
    let marked = |m: &str| {
        if m == "celerity.handler.http" {
            http
        } else {
            on(m)
        }
    };
    if TRIGGER_MARKERS.iter().any(|m| marked(m)) {
        marked(marker)
    } else {
        true
    }
}

/// `metadata.<section>` of an emitted resource, created when missing.
pub fn metadata_map<'a>(
    def: &'a mut Map<String, Json>,
    section: &str,
) -> &'a mut Map<String, Json> {
    let meta = def
        .entry("metadata")
        .or_insert_with(|| Json::Object(Map::new()));
    if !meta.is_object() {
        *meta = Json::Object(Map::new());
    }
    let map = meta
        .as_object_mut()
        .expect("an object")
        .entry(section)
        .or_insert_with(|| Json::Object(Map::new()));
    if !map.is_object() {
        *map = Json::Object(Map::new());
    }
    map.as_object_mut().expect("an object")
}

/// Adds a label to an emitted resource; `Err(existing value)` when the
/// resource already carries the key with another value.
pub fn add_label(def: &mut Map<String, Json>, key: &str, value: &Json) -> Result<(), Json> {
    let labels = metadata_map(def, "labels");
    match labels.get(key) {
        Some(v) if v != value => Err(v.clone()),
        _ => {
            labels.insert(key.to_owned(), value.clone());
            Ok(())
        }
    }
}

/// `linkSelector.byLabel` of an emitted resource, when set and not empty.
pub fn emitted_selector(def: &Map<String, Json>) -> Option<Map<String, Json>> {
    def.get("linkSelector")
        .and_then(|s| s.get("byLabel"))
        .and_then(Json::as_object)
        .filter(|m| !m.is_empty())
        .cloned()
}

/// Diagnostics as one line each (`Error celerity.x at resources.a.spec.b: ...`),
/// for tests' snapshots.
#[cfg(test)]
pub fn diagnostic_lines(diagnostics: &[Diagnostic]) -> Vec<String> {
    diagnostics
        .iter()
        .map(|d| {
            let at = d.path.as_ref().map(ToString::to_string).unwrap_or_default();
            let hint = d
                .hint
                .as_deref()
                .map(|h| format!(" (hint: {h})"))
                .unwrap_or_default();
            format!("{:?} {} at {at}: {}{hint}", d.severity, d.code, d.message)
        })
        .collect()
}
