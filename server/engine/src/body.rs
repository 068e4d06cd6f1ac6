//! The stored form of a change set's body: what a plan records for its execution (the inputs
//! it evaluated, the plan of resources, links and children, the data sources it fetched) and
//! what the API shows (summary, diagnostics).
//!
//! These types are the storage format, versioned and kept apart from the engine's working
//! types (`Plan`, `Inputs`, …), so either can change without the other. Bodies written before
//! the format had a version have version 1's shape and read as version 1. A body of a newer
//! version than this engine knows is refused with a message saying so; a body that does not
//! decode names the field (`plan[3].fields[0].mustRecreate`).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

use crate::diff::{FieldChange, Shown};
use crate::links::PlannedLink;
use crate::plan::{Action, ChildPlan, DerivedFrom, Plan, PlannedExport, PlannedResource};
use crate::prepare::Inputs;
use crate::settings::Environment;
use indexmap::IndexMap;

/// The version this engine writes, and the newest it reads.
pub const BODY_VERSION: u64 = 1;

/// A change set body as read back.
#[derive(Debug)]
pub struct Body {
    pub inputs: Inputs,
    pub plan: Plan,
    /// What the plan's data sources returned (name -> export -> value): execution replays it.
    pub datasources: Map<String, Json>,
    pub diagnostics: Vec<Json>,
}

/// Why a stored body cannot be read.
#[derive(Debug, Clone, PartialEq)]
pub struct BodyError {
    /// Where in the body (`plan[3].action`); empty for the body as a whole.
    pub path: String,
    pub message: String,
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path.is_empty() || self.path == "." {
            write!(
                f,
                "the change set's body cannot be read: {}; plan the change again",
                self.message
            )
        } else {
            write!(
                f,
                "the change set's body cannot be read at `{}`: {}; plan the change again",
                self.path, self.message
            )
        }
    }
}

/// The body a plan records.
pub fn encode(
    inputs: &Inputs,
    plan: &Plan,
    datasources: Map<String, Json>,
    diagnostics: Vec<Json>,
) -> Json {
    let stored = StoredBody {
        version: BODY_VERSION,
        inputs: StoredInputs::from(inputs),
        plan: plan.resources.iter().map(StoredResource::from).collect(),
        links: plan.links.iter().map(StoredLink::from).collect(),
        children: plan.children.iter().map(StoredChild::from).collect(),
        datasources,
        summary: plan.summary(),
        diagnostics,
    };
    // Only string keys and plain values: serialising cannot fail.
    serde_json::to_value(stored).expect("a change set body serialises")
}

/// Reads a stored body back.
pub fn decode(body: &Json) -> Result<Body, BodyError> {
    let stored: StoredBody = read(body)?;
    Ok(Body {
        inputs: stored.inputs.into(),
        plan: plan_of(stored.plan, stored.links, stored.children),
        datasources: stored.datasources,
        diagnostics: stored.diagnostics,
    })
}

/// Only the inputs of a stored body (what a rollback deploys a child again from).
pub fn decode_inputs(body: &Json) -> Result<Inputs, BodyError> {
    let stored: StoredInputsOnly = read(body)?;
    Ok(stored.inputs.into())
}

/// Only the plan and diagnostics of a stored body (what the API shows of a change set).
pub fn decode_plan(body: &Json) -> Result<(Plan, Vec<Json>), BodyError> {
    let stored: StoredPlanOnly = read(body)?;
    Ok((
        plan_of(stored.plan, stored.links, stored.children),
        stored.diagnostics,
    ))
}

/// A body (or the part `T` takes of it) of a version this engine reads.
fn read<T: serde::de::DeserializeOwned>(body: &Json) -> Result<T, BodyError> {
    // Absent in bodies written before the format had a version: those are version 1.
    let version = match body.get("version") {
        None => 1,
        Some(v) => v.as_u64().ok_or_else(|| BodyError {
            path: "version".into(),
            message: format!("not a version number: {v}"),
        })?,
    };
    if !(1..=BODY_VERSION).contains(&version) {
        return Err(BodyError {
            path: "version".into(),
            message: if version > BODY_VERSION {
                format!(
                    "version {version} was written by a newer engine (this one reads up to \
                     {BODY_VERSION}), which can execute it"
                )
            } else {
                format!("no version {version} exists")
            },
        });
    }
    serde_path_to_error::deserialize(body).map_err(|e| BodyError {
        path: e.path().to_string(),
        message: e.inner().to_string(),
    })
}

fn plan_of(
    resources: Vec<StoredResource>,
    links: Vec<StoredLink>,
    children: Vec<StoredChild>,
) -> Plan {
    Plan {
        resources: resources.into_iter().map(Into::into).collect(),
        links: links.into_iter().map(Into::into).collect(),
        children: children.into_iter().map(Into::into).collect(),
    }
}

// ---- version 1 --------------------------------------------------------------------------------

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredBody {
    /// Written, and checked by [`read`] before anything else is decoded.
    #[serde(skip_deserializing)]
    version: u64,
    inputs: StoredInputs,
    plan: Vec<StoredResource>,
    #[serde(default)]
    links: Vec<StoredLink>,
    #[serde(default)]
    children: Vec<StoredChild>,
    #[serde(default)]
    datasources: Map<String, Json>,
    #[serde(default)]
    summary: String,
    #[serde(default)]
    diagnostics: Vec<Json>,
}

#[derive(Deserialize)]
struct StoredInputsOnly {
    inputs: StoredInputs,
}

#[derive(Deserialize)]
struct StoredPlanOnly {
    plan: Vec<StoredResource>,
    #[serde(default)]
    links: Vec<StoredLink>,
    #[serde(default)]
    children: Vec<StoredChild>,
    #[serde(default)]
    diagnostics: Vec<Json>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredInputs {
    files: Vec<StoredFile>,
    /// `[name, value]` pairs, in the order given. Kept as given: a secret variable's value is
    /// needed to execute the plan later (the state database must be protected like the
    /// credentials it holds; docs/state.md).
    variables: Vec<(String, String)>,
    /// A decimal string: the value exceeds what JSON numbers carry exactly.
    #[serde(with = "decimal")]
    now_unix_nanos: i128,
    #[serde(default)]
    include_chain: Vec<String>,
    #[serde(default, skip_serializing_if = "Environment::is_empty")]
    environment: Environment,
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    engine_injectors: IndexMap<String, Json>,
    /// Local assets, path → digest (their content is in the engine's asset store).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    assets: IndexMap<String, String>,
}

#[derive(Serialize, Deserialize)]
struct StoredFile {
    name: String,
    /// Blueprint documents are UTF-8 (anything else was refused before planning).
    content: String,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredResource {
    name: String,
    #[serde(rename = "type")]
    resource_type: String,
    action: StoredAction,
    fields: Vec<StoredField>,
    reason: String,
    depends_on: Vec<String>,
    /// The abstract resource a transformer generated it from (absent in bodies written
    /// before derivations were recorded, and for resources no transformer generated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    derived_from: Option<StoredDerivedFrom>,
}

#[derive(Serialize, Deserialize)]
struct StoredDerivedFrom {
    resource: String,
    transform: String,
}

#[derive(Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
enum StoredAction {
    Create,
    Update,
    Recreate,
    Delete,
    NoChange,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredField {
    path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    previous: Option<StoredShown>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    new: Option<StoredShown>,
    must_recreate: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    origin: Option<String>,
}

/// `{"value": v}`, `{"unknown": true}` or `{"sensitive": true}`.
#[derive(Clone, Serialize, Deserialize)]
#[serde(try_from = "ShownFields", into = "ShownFields")]
struct StoredShown(Shown);

#[derive(Serialize, Deserialize)]
struct ShownFields {
    /// Present (even as `null`) for a value; absent otherwise.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    value: Option<Json>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    unknown: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    sensitive: bool,
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Json>, D::Error> {
    Json::deserialize(d).map(Some)
}

impl TryFrom<ShownFields> for StoredShown {
    type Error = String;

    fn try_from(f: ShownFields) -> Result<Self, String> {
        Ok(StoredShown(match (f.value, f.unknown, f.sensitive) {
            (Some(v), false, false) => Shown::Value(v),
            (None, true, false) => Shown::Unknown,
            (None, false, true) => Shown::Sensitive,
            _ => {
                return Err(
                    "exactly one of `value`, `unknown: true` and `sensitive: true` is expected"
                        .into(),
                );
            }
        }))
    }
}

impl From<StoredShown> for ShownFields {
    fn from(s: StoredShown) -> Self {
        let (value, unknown, sensitive) = match s.0 {
            Shown::Value(v) => (Some(v), false, false),
            Shown::Unknown => (None, true, false),
            Shown::Sensitive => (None, false, true),
        };
        ShownFields {
            value,
            unknown,
            sensitive,
        }
    }
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredLink {
    a: String,
    b: String,
    link_type: String,
    provider: String,
    action: StoredAction,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredChild {
    name: String,
    instance: String,
    action: StoredAction,
    planned_version: u64,
    plan: Vec<StoredResource>,
    #[serde(default)]
    links: Vec<StoredLink>,
    #[serde(default)]
    children: Vec<StoredChild>,
    exports: Vec<StoredExport>,
    unknown_variables: Vec<String>,
    deferred: String,
    diagnostics: Vec<Json>,
}

#[derive(Serialize, Deserialize)]
struct StoredExport {
    name: String,
    action: StoredAction,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    previous: Option<StoredShown>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    new: Option<StoredShown>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    sensitive: bool,
}

/// An `i128` as a decimal string.
mod decimal {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(v: &i128, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&v.to_string())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<i128, D::Error> {
        let text = String::deserialize(d)?;
        text.parse()
            .map_err(|e| serde::de::Error::custom(format!("not a decimal integer `{text}`: {e}")))
    }
}

// ---- between the stored and the working types -------------------------------------------------

impl From<Action> for StoredAction {
    fn from(a: Action) -> Self {
        match a {
            Action::Create => StoredAction::Create,
            Action::Update => StoredAction::Update,
            Action::Recreate => StoredAction::Recreate,
            Action::Delete => StoredAction::Delete,
            Action::NoChange => StoredAction::NoChange,
        }
    }
}

impl From<StoredAction> for Action {
    fn from(a: StoredAction) -> Self {
        match a {
            StoredAction::Create => Action::Create,
            StoredAction::Update => Action::Update,
            StoredAction::Recreate => Action::Recreate,
            StoredAction::Delete => Action::Delete,
            StoredAction::NoChange => Action::NoChange,
        }
    }
}

impl From<&Inputs> for StoredInputs {
    fn from(i: &Inputs) -> Self {
        StoredInputs {
            files: i
                .files
                .iter()
                .map(|(name, content)| StoredFile {
                    name: name.clone(),
                    content: String::from_utf8_lossy(content).into_owned(),
                })
                .collect(),
            variables: i.variables.clone(),
            now_unix_nanos: i.now_unix_nanos,
            include_chain: i.include_chain.clone(),
            environment: i.environment.clone(),
            engine_injectors: i.engine_injectors.clone(),
            assets: i.assets.clone(),
        }
    }
}

impl From<StoredInputs> for Inputs {
    fn from(i: StoredInputs) -> Self {
        Inputs {
            files: i
                .files
                .into_iter()
                .map(|f| (f.name, f.content.into_bytes()))
                .collect(),
            variables: i.variables,
            now_unix_nanos: i.now_unix_nanos,
            include_chain: i.include_chain,
            environment: i.environment,
            engine_injectors: i.engine_injectors,
            assets: i.assets,
        }
    }
}

impl From<&PlannedResource> for StoredResource {
    fn from(r: &PlannedResource) -> Self {
        StoredResource {
            name: r.name.clone(),
            resource_type: r.resource_type.clone(),
            action: r.action.into(),
            fields: r.fields.iter().map(StoredField::from).collect(),
            reason: r.reason.clone(),
            depends_on: r.depends_on.clone(),
            derived_from: r.derived_from.as_ref().map(|d| StoredDerivedFrom {
                resource: d.resource.clone(),
                transform: d.transform.clone(),
            }),
        }
    }
}

impl From<StoredResource> for PlannedResource {
    fn from(r: StoredResource) -> Self {
        PlannedResource {
            name: r.name,
            resource_type: r.resource_type,
            action: r.action.into(),
            fields: r.fields.into_iter().map(Into::into).collect(),
            reason: r.reason,
            depends_on: r.depends_on,
            derived_from: r.derived_from.map(|d| DerivedFrom {
                resource: d.resource,
                transform: d.transform,
            }),
        }
    }
}

impl From<&FieldChange> for StoredField {
    fn from(f: &FieldChange) -> Self {
        StoredField {
            path: f.path.clone(),
            previous: f.previous.clone().map(StoredShown),
            new: f.new.clone().map(StoredShown),
            must_recreate: f.must_recreate,
            origin: f.origin.clone(),
        }
    }
}

impl From<StoredField> for FieldChange {
    fn from(f: StoredField) -> Self {
        FieldChange {
            path: f.path,
            previous: f.previous.map(|s| s.0),
            new: f.new.map(|s| s.0),
            must_recreate: f.must_recreate,
            origin: f.origin,
        }
    }
}

impl From<&PlannedLink> for StoredLink {
    fn from(l: &PlannedLink) -> Self {
        StoredLink {
            a: l.a.clone(),
            b: l.b.clone(),
            link_type: l.link_type.clone(),
            provider: l.provider.clone(),
            action: l.action.into(),
        }
    }
}

impl From<StoredLink> for PlannedLink {
    fn from(l: StoredLink) -> Self {
        PlannedLink {
            a: l.a,
            b: l.b,
            link_type: l.link_type,
            provider: l.provider,
            action: l.action.into(),
        }
    }
}

impl From<&ChildPlan> for StoredChild {
    fn from(c: &ChildPlan) -> Self {
        StoredChild {
            name: c.name.clone(),
            instance: c.instance.clone(),
            action: c.action.into(),
            planned_version: c.planned_version,
            plan: c.plan.resources.iter().map(StoredResource::from).collect(),
            links: c.plan.links.iter().map(StoredLink::from).collect(),
            children: c.plan.children.iter().map(StoredChild::from).collect(),
            exports: c.exports.iter().map(StoredExport::from).collect(),
            unknown_variables: c.unknown_variables.clone(),
            deferred: c.deferred.clone(),
            diagnostics: c.diagnostics.clone(),
        }
    }
}

impl From<StoredChild> for ChildPlan {
    fn from(c: StoredChild) -> Self {
        ChildPlan {
            name: c.name,
            instance: c.instance,
            action: c.action.into(),
            planned_version: c.planned_version,
            plan: plan_of(c.plan, c.links, c.children),
            exports: c.exports.into_iter().map(Into::into).collect(),
            unknown_variables: c.unknown_variables,
            deferred: c.deferred,
            diagnostics: c.diagnostics,
        }
    }
}

impl From<&PlannedExport> for StoredExport {
    fn from(e: &PlannedExport) -> Self {
        StoredExport {
            name: e.name.clone(),
            action: e.action.into(),
            previous: e.previous.clone().map(StoredShown),
            new: e.new.clone().map(StoredShown),
            sensitive: e.sensitive,
        }
    }
}

impl From<StoredExport> for PlannedExport {
    fn from(e: StoredExport) -> Self {
        PlannedExport {
            name: e.name,
            action: e.action.into(),
            previous: e.previous.map(|s| s.0),
            new: e.new.map(|s| s.0),
            sensitive: e.sensitive,
        }
    }
}

#[cfg(test)]
mod tests;
