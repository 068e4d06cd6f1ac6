//! The transformer's view of a blueprint: the abstract resources it reads
//! ([`Input`]) and the concrete document it writes ([`Out`]).
//!
//! Conventions every type module follows (docs/celerity.md):
//! - The primary concrete resource of an abstract resource keeps its name
//!   (handler `saveOrder` becomes `aws/lambda/function` `saveOrder`), so
//!   references, `dependsOn` and plan lines still name what the user wrote.
//!   Extra resources are named `<abstract>_<suffix>`.
//! - Every emitted resource is recorded as derived from its abstract resource.
//! - A field the AWS target cannot back is a diagnostic at that field.

use serde_json::{Map, Value as Json};
use std::collections::BTreeMap;
use trellis_plugin_sdk::prelude::*;

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
        Input { resources }
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

    /// References to `${resources.<abstract>.spec.<field>}` become references
    /// to `concrete` (a path like `resources.saveOrder.spec.functionName`).
    pub fn alias(&mut self, from: &Resource, field: &str, concrete: impl Into<String>) {
        self.aliases
            .insert((from.name.clone(), field.to_owned()), concrete.into());
    }
}
