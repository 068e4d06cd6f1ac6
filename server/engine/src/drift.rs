//! Drift: what a provider reports about a deployed resource, compared with the spec recorded
//! for it (`trellis drift`, and reconcile's test of whether a resource needs settling).
//!
//! A field is drift when it differs from the recorded spec, except:
//!
//! - fields the recorded spec does not set (provider defaults, computed fields) — unless the
//!   field is a new entry of a **map** the recorded spec sets (the resource type's schema says
//!   `MAP`): the entries of a map the blueprint writes are the blueprint's, so an entry added
//!   by hand is drift;
//! - fields **owned by a link** on the resource: the paths a link's StageLink declared
//!   (`owned_paths_a` when the resource is the link's A, `owned_paths_b` when it is B), and
//!   everything under them. The link changes them, so a difference there is the link's doing,
//!   not drift. The paths are kept with the link's record (see [`super::links::OWNED_KEY`]).
//!
//! Secrets are masked on both sides: a field secret in the recorded spec or marked sensitive
//! by the provider is shown as `(sensitive)`.

use std::collections::{HashMap, HashSet};

use serde_json::Value as Json;
use trellis_proto::plugin::v1::{Schema, SchemaType};

use super::diff::{self, FieldChange};
use super::provision::Provisioner;
use super::state_values;
use crate::eval::render::SENSITIVE_TEXT;
use crate::eval::value::Value;
use crate::state::{InstanceState, Resource};

/// What drift checks of one instance need besides the two specs: the fields each resource's
/// links own, and the spec schema of each resource type (to tell maps from objects).
#[derive(Clone, Debug, Default)]
pub struct Checker {
    /// Resource name → paths (`spec.values.FILE_A`) owned by links on it.
    owned: HashMap<String, Vec<String>>,
    /// Resource type → its spec schema, when the provider has one.
    schemas: HashMap<String, Schema>,
}

impl Checker {
    /// The owned paths of `state`'s links, and the schemas of its resources' types.
    pub async fn load(provisioner: &dyn Provisioner, state: &InstanceState) -> Checker {
        let mut schemas = HashMap::new();
        for r in &state.resources {
            if schemas.contains_key(&r.resource_type) {
                continue;
            }
            let schema = provisioner.spec_schema(&r.resource_type).await;
            schemas.insert(r.resource_type.clone(), schema);
        }
        Checker {
            owned: super::links::owned_by_resource(&state.links),
            schemas: schemas
                .into_iter()
                .filter_map(|(t, s)| Some((t, s?)))
                .collect(),
        }
    }

    /// The drifted fields of `r`, as its provider reports its spec (`observed`).
    pub fn fields(&self, r: &Resource, observed: &Json) -> Vec<FieldChange> {
        drift_fields(
            &r.spec,
            observed,
            self.owned.get(&r.name).map_or(&[], Vec::as_slice),
            self.schemas.get(&r.resource_type),
        )
    }
}

/// Differences between a recorded spec and one a provider reports (secrets masked) that are
/// drift (see the module documentation). `owned` are paths in [`FieldChange::path`] syntax
/// (`spec.values.FILE_A`); `schema` is the resource type's spec schema, if known.
pub fn drift_fields(
    recorded: &Json,
    observed: &Json,
    owned: &[String],
    schema: Option<&Schema>,
) -> Vec<FieldChange> {
    let plain = state_values::unwrap(recorded);
    let observed_plain = state_values::unwrap(observed);
    let new = Value::from_json(&observed_plain);
    let masked = (state_values::holds_secret(recorded) || state_values::holds_secret(observed))
        .then(|| mask(observed, Some(recorded)));
    let mut fields = diff::diff_spec(
        Some(recorded),
        &new,
        masked.as_ref(),
        &diff::RecreatePaths::default(),
    );
    let mut entries = HashSet::new();
    if let Some(schema) = schema {
        new_map_entries(
            schema,
            &plain,
            &observed_plain,
            &mut "spec".to_owned(),
            &mut entries,
        );
    }
    fields.retain(|f| {
        (f.previous.is_some() || entries.contains(&f.path))
            && !owned.iter().any(|o| at_or_under(&f.path, o))
    });
    fields
}

/// Whether `path` is `owned` or a field under it (`spec.values.A` is under `spec.values`;
/// `spec.valuesX` is not).
pub fn at_or_under(path: &str, owned: &str) -> bool {
    path.strip_prefix(owned)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
}

/// `observed` as the diff's masked copy: `(sensitive)` wherever it, or the recorded value at
/// the same place, is secret.
fn mask(observed: &Json, recorded: Option<&Json>) -> Value {
    let secret = |v: Option<&Json>| v.and_then(state_values::sensitive_inner).is_some();
    if secret(Some(observed)) || secret(recorded) {
        return Value::Str(SENSITIVE_TEXT.to_owned());
    }
    match (observed, recorded) {
        (Json::Object(o), r) => Value::Map(
            o.iter()
                .map(|(k, v)| {
                    let r = match r {
                        Some(Json::Object(r)) => r.get(k),
                        _ => None,
                    };
                    (k.clone(), mask(v, r))
                })
                .collect(),
        ),
        (Json::Array(items), r) => Value::List(
            items
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    let r = match r {
                        Some(Json::Array(r)) => r.get(i),
                        _ => None,
                    };
                    mask(v, r)
                })
                .collect(),
        ),
        (other, _) => Value::from_json(other),
    }
}

/// Paths (as the diff writes them) of entries present in `observed` but not in `recorded`
/// inside fields the schema declares as maps, where both sides have the map.
fn new_map_entries(
    schema: &Schema,
    recorded: &Json,
    observed: &Json,
    path: &mut String,
    out: &mut HashSet<String>,
) {
    let ty = SchemaType::try_from(schema.r#type).unwrap_or(SchemaType::Unspecified);
    match (recorded, observed) {
        (Json::Object(r), Json::Object(o)) if ty == SchemaType::Map => {
            for (k, v) in o {
                let len = path.len();
                push_key(path, k);
                match r.get(k) {
                    None => {
                        out.insert(path.clone());
                    }
                    Some(rv) => {
                        if let Some(values) = schema.values.as_deref() {
                            new_map_entries(values, rv, v, path, out);
                        }
                    }
                }
                path.truncate(len);
            }
        }
        (Json::Object(r), Json::Object(o)) => {
            for field in &schema.fields {
                let (Some(rv), Some(ov), Some(s)) = (
                    r.get(&field.name),
                    o.get(&field.name),
                    field.schema.as_ref(),
                ) else {
                    continue;
                };
                let len = path.len();
                push_key(path, &field.name);
                new_map_entries(s, rv, ov, path, out);
                path.truncate(len);
            }
        }
        (Json::Array(r), Json::Array(o)) => {
            let Some(items) = schema.items.as_deref() else {
                return;
            };
            for (i, (rv, ov)) in r.iter().zip(o).enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                new_map_entries(items, rv, ov, path, out);
                path.truncate(len);
            }
        }
        _ => {}
    }
}

/// Appends `.key`, or `["key"]` (JSON-quoted) when the key is not plain (`[A-Za-z0-9_-]+`):
/// the diff's path syntax ([`FieldChange::path`]).
pub fn push_key(path: &mut String, key: &str) {
    let plain = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if plain {
        path.push('.');
        path.push_str(key);
    } else {
        path.push('[');
        path.push_str(&serde_json::to_string(key).unwrap_or_default());
        path.push(']');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use trellis_proto::plugin::v1::SchemaField;

    fn schema(ty: SchemaType) -> Schema {
        Schema {
            r#type: ty as i32,
            ..Schema::default()
        }
    }

    /// `{path: string, values: map[string]string, tags: object{..}}`.
    fn env_schema() -> Schema {
        let field = |name: &str, s: Schema| SchemaField {
            name: name.into(),
            schema: Some(s),
            ..SchemaField::default()
        };
        let mut values = schema(SchemaType::Map);
        values.values = Some(Box::new(schema(SchemaType::String)));
        let mut tags = schema(SchemaType::Object);
        tags.fields = vec![field("a", schema(SchemaType::String))];
        let mut spec = schema(SchemaType::Object);
        spec.fields = vec![
            field("path", schema(SchemaType::String)),
            field("values", values),
            field("tags", tags),
        ];
        spec
    }

    fn paths(fields: &[FieldChange]) -> Vec<&str> {
        fields.iter().map(|f| f.path.as_str()).collect()
    }

    #[test]
    fn unset_fields_are_not_drift_but_new_map_entries_are() {
        let recorded = json!({"path": "/e", "values": {"PORT": "1"}, "tags": {"a": "x"}});
        let observed = json!({
            "path": "/e", "mode": "0600",
            "values": {"PORT": "1", "EXTRA": "y", "with.dot": "z"},
            "tags": {"a": "x", "default": "d"},
        });
        let s = env_schema();
        assert_eq!(
            paths(&drift_fields(&recorded, &observed, &[], Some(&s))),
            ["spec.values.EXTRA", r#"spec.values["with.dot"]"#]
        );
        // Without a schema, nothing says `values` is a map.
        assert!(drift_fields(&recorded, &observed, &[], None).is_empty());
        // A map the recorded spec does not set is not the blueprint's.
        let bare = json!({"path": "/e"});
        assert!(drift_fields(&bare, &observed, &[], Some(&s)).is_empty());
    }

    #[test]
    fn owned_fields_are_not_drift() {
        let recorded = json!({"path": "/e", "values": {"PORT": "1", "FILE_A": "old"}});
        let observed =
            json!({"path": "/e", "values": {"PORT": "2", "FILE_A": "new", "FILE_B": "b"}});
        let s = env_schema();
        let all = drift_fields(&recorded, &observed, &[], Some(&s));
        assert_eq!(
            paths(&all),
            [
                "spec.values.PORT",
                "spec.values.FILE_A",
                "spec.values.FILE_B"
            ]
        );
        let owned = [
            "spec.values.FILE_A".to_owned(),
            "spec.values.FILE_B".to_owned(),
        ];
        assert_eq!(
            paths(&drift_fields(&recorded, &observed, &owned, Some(&s))),
            ["spec.values.PORT"]
        );
        // Owning a field owns what is under it.
        assert_eq!(
            paths(&drift_fields(
                &recorded,
                &observed,
                &["spec.values".to_owned()],
                Some(&s)
            )),
            Vec::<&str>::new()
        );
    }

    #[test]
    fn secrets_on_either_side_are_masked() {
        let recorded = json!({"path": "/e", "values": {"TOKEN": {"$sensitive": "a"}}});
        let observed = json!({"path": "/e", "values": {"TOKEN": "b", "NEW": {"$sensitive": "c"}}});
        let s = env_schema();
        let fields = drift_fields(&recorded, &observed, &[], Some(&s));
        assert_eq!(paths(&fields), ["spec.values.TOKEN", "spec.values.NEW"]);
        assert_eq!(fields[0].previous, Some(diff::Shown::Sensitive));
        assert_eq!(fields[0].new, Some(diff::Shown::Sensitive));
        assert_eq!(fields[1].new, Some(diff::Shown::Sensitive));
        // A value the provider marks sensitive equals its plain recorded value.
        let recorded = json!({"path": "/e", "values": {"K": "v"}});
        let observed = json!({"path": "/e", "values": {"K": {"$sensitive": "v"}}});
        assert!(drift_fields(&recorded, &observed, &[], Some(&s)).is_empty());
        // A recorded secret the provider no longer reports is drift, and stays hidden.
        let recorded = json!({"path": "/e", "values": {"TOKEN": {"$sensitive": "hunter2"}}});
        let observed = json!({"path": "/e", "values": {}});
        let fields = drift_fields(&recorded, &observed, &[], Some(&s));
        assert_eq!(paths(&fields), ["spec.values.TOKEN"]);
        assert_eq!(fields[0].previous, Some(diff::Shown::Sensitive));
        assert!(!format!("{fields:?}").contains("hunter2"));
    }

    #[test]
    fn paths_at_or_under() {
        assert!(at_or_under("spec.values.A", "spec.values.A"));
        assert!(at_or_under("spec.values.A.b", "spec.values.A"));
        assert!(at_or_under("spec.values.A[0]", "spec.values.A"));
        assert!(at_or_under(r#"spec.values["a.b"]"#, "spec.values"));
        assert!(!at_or_under("spec.values.AB", "spec.values.A"));
        assert!(!at_or_under("spec.values", "spec.values.A"));
        let mut p = "spec".to_owned();
        push_key(&mut p, "a.b");
        push_key(&mut p, "c-d_1");
        assert_eq!(p, r#"spec["a.b"].c-d_1"#);
    }
}
