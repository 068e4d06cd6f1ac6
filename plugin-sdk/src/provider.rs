//! The traits a provider implements: [`Provider`], [`Resource`],
//! [`DataSource`], [`Link`], [`Function`], [`CustomVariableType`], and the
//! plain types their methods take and return.
//!
//! Async methods use [`async_trait`]: put
//! `#[trellis_plugin_sdk::async_trait]` on your `impl` blocks.

use std::time::Duration;

use trellis_proto::plugin::v1 as pb;

use crate::async_trait;
use crate::context::Context;
use crate::error::{Diagnostic, PluginError, Result};
use crate::schema::{Schema, SchemaType, Spec};
use crate::value::{AttrPath, Value};

/// A provider: a namespace of resource types, data sources, links, functions
/// and custom variable types. Only [`Provider::namespace`] is required.
///
/// The lists are read once at startup. Capabilities in Handshake follow from
/// them: `data_sources`, `links`, `functions` and `custom_variable_types` are
/// declared when the list is not empty, `plan_resource` / `read_resource` /
/// `import_resource` when a resource says [`Resource::supports_plan`] /
/// [`Resource::supports_read`] / [`Resource::supports_import`], and `cancel`
/// always (the SDK implements it).
#[async_trait]
pub trait Provider: Send + Sync + 'static {
    /// `local` for `local/file`.
    fn namespace(&self) -> &str;

    /// The plugin's version, e.g. `env!("CARGO_PKG_VERSION")`.
    fn version(&self) -> &str {
        "0.0.0"
    }

    /// The schema of the provider configuration (an object).
    fn config_schema(&self) -> Schema {
        Schema::object()
    }

    /// How the engine retries this provider's TRANSIENT errors.
    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy::default()
    }

    fn resources(&self) -> Vec<Box<dyn Resource>> {
        Vec::new()
    }

    fn data_sources(&self) -> Vec<Box<dyn DataSource>> {
        Vec::new()
    }

    fn links(&self) -> Vec<Box<dyn Link>> {
        Vec::new()
    }

    fn functions(&self) -> Vec<Box<dyn Function>> {
        Vec::new()
    }

    fn custom_variable_types(&self) -> Vec<Box<dyn CustomVariableType>> {
        Vec::new()
    }

    /// Checks the provider configuration (`ctx.config()`) beyond its schema.
    async fn validate_config(&self, ctx: &Context) -> Result<Vec<Diagnostic>> {
        let _ = ctx;
        Ok(Vec::new())
    }
}

/// How the engine retries TRANSIENT errors.
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    pub multiplier: f64,
}

impl Default for RetryPolicy {
    /// 3 attempts, 200 ms doubling up to 5 s.
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(5),
            multiplier: 2.0,
        }
    }
}

impl RetryPolicy {
    /// No retries.
    pub fn none() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        }
    }

    pub fn to_proto(&self) -> pb::RetryPolicy {
        pb::RetryPolicy {
            max_attempts: self.max_attempts,
            initial_backoff_ms: u64::try_from(self.initial_backoff.as_millis()).unwrap_or(u64::MAX),
            max_backoff_ms: u64::try_from(self.max_backoff.as_millis()).unwrap_or(u64::MAX),
            multiplier: self.multiplier,
        }
    }
}

/// A resource as the engine knows it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ResourceState {
    /// `local/file`.
    pub resource_type: String,
    /// The resource's name in the blueprint.
    pub name: String,
    /// The provider's id for it, once created.
    pub external_id: String,
    /// The spec as last applied.
    pub spec: Value,
    /// Computed fields reported by the provider.
    pub state: Value,
}

impl ResourceState {
    /// A typed view of `spec`.
    pub fn spec(&self) -> Spec<'_> {
        Spec::new(&self.spec)
    }

    /// A typed view of `state`.
    pub fn state(&self) -> Spec<'_> {
        Spec::new(&self.state)
    }

    pub fn to_proto(&self) -> pb::ResourceState {
        pb::ResourceState {
            resource_type: self.resource_type.clone(),
            resource_name: self.name.clone(),
            external_id: self.external_id.clone(),
            spec: Some(self.spec.to_proto()),
            state: Some(self.state.to_proto()),
        }
    }

    pub fn from_proto(s: pb::ResourceState) -> ResourceState {
        ResourceState {
            resource_type: s.resource_type,
            name: s.resource_name,
            external_id: s.external_id,
            spec: s.spec.map_or(Value::Null, Value::from),
            state: s.state.map_or(Value::Null, Value::from),
        }
    }
}

/// ValidateResource: the spec may hold [`Value::Unknown`] where a value is
/// known only after deploy.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidateRequest {
    pub resource_type: String,
    pub name: String,
    pub spec: Value,
}

impl ValidateRequest {
    pub fn spec(&self) -> Spec<'_> {
        Spec::new(&self.spec)
    }
}

/// PlanResource.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanRequest {
    /// The resource's name (`resource_name`; from `current` when a caller leaves it out).
    pub name: String,
    /// Absent for a new resource.
    pub current: Option<ResourceState>,
    /// May hold [`Value::Unknown`].
    pub desired: Value,
}

impl PlanRequest {
    pub fn spec(&self) -> Spec<'_> {
        Spec::new(&self.desired)
    }
}

/// The provider's view of a change.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// Fields whose change replaces the resource, beyond the schema's `must_recreate`.
    pub recreate_paths: Vec<AttrPath>,
    /// The state the provider expects; [`Value::Unknown`] where it cannot tell.
    pub planned_state: Value,
    /// Warnings about the change, shown with the plan (an error fails the plan).
    pub diagnostics: Vec<Diagnostic>,
}

/// ApplyResource for a new resource.
#[derive(Clone, Debug, PartialEq)]
pub struct CreateRequest {
    pub resource_type: String,
    pub name: String,
    /// The desired spec, fully known.
    pub spec: Value,
}

impl CreateRequest {
    pub fn spec(&self) -> Spec<'_> {
        Spec::new(&self.spec)
    }
}

/// ApplyResource for an existing resource.
#[derive(Clone, Debug, PartialEq)]
pub struct UpdateRequest {
    pub resource_type: String,
    pub name: String,
    /// The desired spec, fully known.
    pub spec: Value,
    /// The resource as last applied.
    pub current: ResourceState,
}

impl UpdateRequest {
    pub fn spec(&self) -> Spec<'_> {
        Spec::new(&self.spec)
    }
}

/// The result of create and update.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Applied {
    pub external_id: String,
    /// Computed fields (a map). Fields declared `sensitive` in the schema are
    /// marked sensitive by the SDK.
    pub state: Value,
}

impl Applied {
    pub fn new(external_id: impl Into<String>, state: impl Into<Value>) -> Applied {
        Applied {
            external_id: external_id.into(),
            state: state.into(),
        }
    }
}

/// What ReadResource found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReadState {
    /// The spec as it is now (compared with the applied spec for drift).
    pub spec: Value,
    pub state: Value,
    /// The resource's id, when the provider can tell it. The engine asks without an id after
    /// a crash cut a create short (`current.external_id` is empty) and records this one;
    /// `None` answers with the id the engine sent.
    pub external_id: Option<String>,
}

impl ReadState {
    /// The resource as found: its spec now and its computed state (the id the engine sent).
    pub fn new(spec: impl Into<Value>, state: impl Into<Value>) -> ReadState {
        ReadState {
            spec: spec.into(),
            state: state.into(),
            external_id: None,
        }
    }

    /// The resource's id as the provider found it (after a crash cut a create short, the
    /// engine asks without one and records this).
    pub fn with_external_id(mut self, external_id: impl Into<String>) -> ReadState {
        self.external_id = Some(external_id.into());
        self
    }
}

/// What ImportResource asks for: an existing resource, by its id.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ImportRequest {
    pub resource_type: String,
    /// The name it will have in the blueprint.
    pub name: String,
    /// The id the user gave, in the form the type documents (a path, a name, a URL, an ARN).
    pub external_id: String,
}

/// A resource type. `create`, `update` and `destroy` are required; the rest
/// have defaults.
#[async_trait]
pub trait Resource: Send + Sync + 'static {
    /// `local/file`.
    fn type_name(&self) -> &str;

    fn description(&self) -> &str {
        ""
    }

    /// The spec schema (an object); exactly what GetManifest sends.
    fn schema(&self) -> Schema;

    /// Checks beyond the schema (the engine checks the schema itself).
    async fn validate(&self, ctx: &Context, req: &ValidateRequest) -> Result<Vec<Diagnostic>> {
        let _ = (ctx, req);
        Ok(Vec::new())
    }

    /// Return true when you implement [`Resource::plan`].
    fn supports_plan(&self) -> bool {
        false
    }

    /// The provider's view of a change (Capabilities.plan_resource).
    async fn plan(&self, ctx: &Context, req: &PlanRequest) -> Result<Plan> {
        let _ = (ctx, req);
        Ok(Plan {
            recreate_paths: Vec::new(),
            planned_state: Value::Unknown,
            diagnostics: Vec::new(),
        })
    }

    async fn create(&self, ctx: &Context, req: &CreateRequest) -> Result<Applied>;

    async fn update(&self, ctx: &Context, req: &UpdateRequest) -> Result<Applied>;

    async fn destroy(&self, ctx: &Context, current: &ResourceState) -> Result<()>;

    /// Return true when you implement [`Resource::read`].
    fn supports_read(&self) -> bool {
        false
    }

    /// The resource as it exists now, for drift; `Ok(None)` when it no longer
    /// exists (Capabilities.read_resource).
    async fn read(&self, ctx: &Context, current: &ResourceState) -> Result<Option<ReadState>> {
        let _ = ctx;
        Err(PluginError::internal(format!(
            "{} does not implement ReadResource",
            current.resource_type
        )))
    }

    /// Return true when you implement [`Resource::import`]: the manifest then declares the
    /// type `importable`.
    fn supports_import(&self) -> bool {
        false
    }

    /// An existing resource found by `req.external_id`, as a blueprint would declare it
    /// (`trellis import`); `Ok(None)` when there is none. `spec` holds every field a
    /// blueprint sets (no computed one) with the values the resource has, so that applying it
    /// changes nothing; `state` the computed fields; `external_id` the id as create would
    /// report it, when the id given is another form of it (Capabilities.import_resource).
    async fn import(&self, ctx: &Context, req: &ImportRequest) -> Result<Option<ReadState>> {
        let _ = ctx;
        Err(PluginError::bad_input(format!(
            "{} cannot be imported",
            req.resource_type
        )))
    }
}

/// A filter the engine passes to a data source as a hint (the engine
/// applies filters itself).
#[derive(Clone, Debug, PartialEq)]
pub struct Filter {
    pub field: String,
    pub operator: String,
    pub search: Value,
}

/// A data source type.
#[async_trait]
pub trait DataSource: Send + Sync + 'static {
    fn type_name(&self) -> &str;

    fn description(&self) -> &str {
        ""
    }

    /// Fields a filter may use (an object schema; only its fields are sent).
    fn filter_fields(&self) -> Schema {
        Schema::object()
    }

    /// Fields that may be exported (an object schema).
    fn exports(&self) -> Schema;

    /// Candidate items, each a map; the engine filters them and uses the
    /// first match.
    async fn fetch(&self, ctx: &Context, filters: &[Filter]) -> Result<Vec<Value>>;
}

/// Whether a link orders deployment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkKind {
    /// The priority resource is deployed first.
    Hard,
    /// No ordering; applied once both exist.
    Soft,
}

/// Which side of a HARD link is deployed first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkPriority {
    ResourceA,
    ResourceB,
}

/// An annotation a link reads from a resource's metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct Annotation {
    pub name: String,
    pub applies_to: String,
    pub ty: SchemaType,
    pub required: bool,
    pub allowed_values: Vec<Value>,
    pub default: Option<Value>,
    pub description: String,
}

impl Annotation {
    /// Annotation `name` (e.g. `local.envFile.name`) set on resources of type `applies_to`.
    pub fn new(
        name: impl Into<String>,
        applies_to: impl Into<String>,
        ty: SchemaType,
    ) -> Annotation {
        Annotation {
            name: name.into(),
            applies_to: applies_to.into(),
            ty,
            required: false,
            allowed_values: Vec::new(),
            default: None,
            description: String::new(),
        }
    }
    pub fn required(mut self) -> Annotation {
        self.required = true;
        self
    }
    pub fn allowed<V: Into<Value>>(mut self, values: impl IntoIterator<Item = V>) -> Annotation {
        self.allowed_values = values.into_iter().map(Into::into).collect();
        self
    }
    pub fn default(mut self, v: impl Into<Value>) -> Annotation {
        self.default = Some(v.into());
        self
    }
    pub fn describe(mut self, d: impl Into<String>) -> Annotation {
        self.description = d.into();
        self
    }
    pub fn to_proto(&self) -> pb::AnnotationDef {
        pb::AnnotationDef {
            name: self.name.clone(),
            applies_to: self.applies_to.clone(),
            r#type: self.ty.to_proto() as i32,
            required: self.required,
            allowed_values: self.allowed_values.iter().map(Value::to_proto).collect(),
            default: self.default.as_ref().map(Value::to_proto),
            description: self.description.clone(),
        }
    }
}

/// Both ends of a link, as deployed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LinkRequest {
    pub link_type: String,
    pub resource_a: ResourceState,
    pub resource_b: ResourceState,
    pub annotations_a: Value,
    pub annotations_b: Value,
    /// Link data persisted by earlier phases or deployments.
    pub link_data: Value,
    /// Create, update or destroy (`LINK_DESTROY`: undo what earlier phases did).
    pub update_type: pb::LinkUpdateType,
}

impl LinkRequest {
    pub fn to_proto(&self, call: pb::CallContext) -> pb::LinkContext {
        pb::LinkContext {
            context: Some(call),
            link_type: self.link_type.clone(),
            resource_a: Some(self.resource_a.to_proto()),
            resource_b: Some(self.resource_b.to_proto()),
            annotations_a: Some(self.annotations_a.to_proto()),
            annotations_b: Some(self.annotations_b.to_proto()),
            link_data: Some(self.link_data.to_proto()),
            update_type: self.update_type as i32,
        }
    }

    pub(crate) fn from_proto(l: pb::LinkContext) -> (Option<pb::CallContext>, LinkRequest) {
        let v = |x: Option<pb::Value>| x.map_or(Value::Null, Value::from);
        let r = |x: Option<pb::ResourceState>| x.map(ResourceState::from_proto).unwrap_or_default();
        (
            l.context,
            LinkRequest {
                link_type: l.link_type,
                resource_a: r(l.resource_a),
                resource_b: r(l.resource_b),
                annotations_a: v(l.annotations_a),
                annotations_b: v(l.annotations_b),
                link_data: v(l.link_data),
                update_type: pb::LinkUpdateType::try_from(l.update_type)
                    .unwrap_or(pb::LinkUpdateType::Unspecified),
            },
        )
    }
}

/// What StageLink reports.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StagedLink {
    /// Fields of A the link will change (excluded from drift).
    pub owned_paths_a: Vec<AttrPath>,
    pub owned_paths_b: Vec<AttrPath>,
    pub diagnostics: Vec<Diagnostic>,
}

/// What UpdateLinkIntermediaries reports.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct IntermediariesUpdate {
    /// Merged into the link data the engine persists.
    pub link_data: Value,
    pub intermediaries: Vec<ResourceState>,
}

/// A link type between resource types A and B. Every phase defaults to a
/// no-op.
#[async_trait]
pub trait Link: Send + Sync + 'static {
    /// The resource whose linkSelector selects B.
    fn resource_type_a(&self) -> &str;
    fn resource_type_b(&self) -> &str;

    /// The link type's name as the engine sends it in `LinkContext.link_type`:
    /// `"<type A>::<type B>"` by default. (The SDK also matches a call by the
    /// types of its two resources.)
    fn link_type(&self) -> String {
        format!("{}::{}", self.resource_type_a(), self.resource_type_b())
    }

    fn kind(&self) -> LinkKind {
        LinkKind::Soft
    }

    fn priority(&self) -> LinkPriority {
        LinkPriority::ResourceA
    }

    fn description(&self) -> &str {
        ""
    }

    fn annotations(&self) -> Vec<Annotation> {
        Vec::new()
    }

    async fn stage(&self, ctx: &Context, link: &LinkRequest) -> Result<StagedLink> {
        let _ = (ctx, link);
        Ok(StagedLink::default())
    }

    /// Returns link data to merge into what the engine persists.
    async fn update_resource_a(&self, ctx: &Context, link: &LinkRequest) -> Result<Value> {
        let _ = (ctx, link);
        Ok(Value::Null)
    }

    async fn update_resource_b(&self, ctx: &Context, link: &LinkRequest) -> Result<Value> {
        let _ = (ctx, link);
        Ok(Value::Null)
    }

    async fn update_intermediaries(
        &self,
        ctx: &Context,
        link: &LinkRequest,
    ) -> Result<IntermediariesUpdate> {
        let _ = (ctx, link);
        Ok(IntermediariesUpdate::default())
    }

    async fn read_intermediaries(
        &self,
        ctx: &Context,
        link: &LinkRequest,
    ) -> Result<Vec<ResourceState>> {
        let _ = (ctx, link);
        Ok(Vec::new())
    }
}

/// A parameter of a [`Signature`].
#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    pub name: String,
    pub ty: SchemaType,
    pub optional: bool,
    pub description: String,
}

impl Param {
    pub fn new(name: impl Into<String>, ty: SchemaType) -> Param {
        Param {
            name: name.into(),
            ty,
            optional: false,
            description: String::new(),
        }
    }
    pub fn optional(mut self) -> Param {
        self.optional = true;
        self
    }
    pub fn describe(mut self, d: impl Into<String>) -> Param {
        self.description = d.into();
        self
    }
    fn to_proto(&self) -> pb::FunctionParam {
        pb::FunctionParam {
            name: self.name.clone(),
            r#type: self.ty.to_proto() as i32,
            optional: self.optional,
            description: self.description.clone(),
        }
    }
}

/// A function's signature. The SDK checks arguments against it (count and
/// types) before calling [`Function::call`], answering BAD_INPUT at
/// `[index N]` otherwise.
#[derive(Clone, Debug, PartialEq)]
pub struct Signature {
    pub name: String,
    pub description: String,
    pub params: Vec<Param>,
    pub variadic: Option<Param>,
    pub returns: SchemaType,
}

impl Signature {
    /// A function `name` with no parameters returning `any`.
    pub fn new(name: impl Into<String>) -> Signature {
        Signature {
            name: name.into(),
            description: String::new(),
            params: Vec::new(),
            variadic: None,
            returns: SchemaType::Any,
        }
    }
    pub fn describe(mut self, d: impl Into<String>) -> Signature {
        self.description = d.into();
        self
    }
    /// Adds a parameter (use `Param::new(..).optional()` for trailing optional ones).
    pub fn param(mut self, p: Param) -> Signature {
        self.params.push(p);
        self
    }
    /// Any number of further arguments of this type.
    pub fn variadic(mut self, p: Param) -> Signature {
        self.variadic = Some(p);
        self
    }
    pub fn returns(mut self, t: SchemaType) -> Signature {
        self.returns = t;
        self
    }

    pub fn to_proto(&self) -> pb::FunctionDef {
        pb::FunctionDef {
            name: self.name.clone(),
            description: self.description.clone(),
            params: self.params.iter().map(Param::to_proto).collect(),
            variadic: self.variadic.as_ref().map(Param::to_proto),
            returns: self.returns.to_proto() as i32,
        }
    }

    /// Checks argument count and types.
    pub fn check_args(&self, args: &[Value]) -> Result<()> {
        let required = self.params.iter().filter(|p| !p.optional).count();
        if args.len() < required {
            return Err(PluginError::bad_input(format!(
                "{} expects at least {required} argument(s), got {}",
                self.name,
                args.len()
            )));
        }
        if self.variadic.is_none() && args.len() > self.params.len() {
            return Err(PluginError::bad_input(format!(
                "{} expects at most {} argument(s), got {}",
                self.name,
                self.params.len(),
                args.len()
            ))
            .at(AttrPath::root().index(self.params.len() as u64)));
        }
        for (i, arg) in args.iter().enumerate() {
            let Some(p) = self.params.get(i).or(self.variadic.as_ref()) else {
                continue;
            };
            if (arg.is_null() && p.optional) || p.ty.accepts(arg) {
                continue;
            }
            return Err(PluginError::bad_input(format!(
                "argument {} (`{}`) of {} must be of type {}, found {}",
                i + 1,
                p.name,
                self.name,
                p.ty.name(),
                arg.kind_name()
            ))
            .at(AttrPath::root().index(i as u64)));
        }
        Ok(())
    }
}

/// A provider function, callable from blueprints.
#[async_trait]
pub trait Function: Send + Sync + 'static {
    fn signature(&self) -> Signature;

    /// Called with arguments already checked against the signature. Return
    /// BAD_INPUT errors `.at(AttrPath::root().index(n))` for argument `n`.
    async fn call(&self, ctx: &Context, args: Vec<Value>) -> Result<Value>;
}

/// An option of a custom variable type.
#[derive(Clone, Debug, PartialEq)]
pub struct VariableOption {
    /// What blueprints write.
    pub label: String,
    pub value: Value,
    pub description: String,
}

impl VariableOption {
    pub fn new(label: impl Into<String>, value: impl Into<Value>) -> VariableOption {
        VariableOption {
            label: label.into(),
            value: value.into(),
            description: String::new(),
        }
    }
    pub fn describe(mut self, d: impl Into<String>) -> VariableOption {
        self.description = d.into();
        self
    }
}

/// A custom variable type (`local/fileMode`).
#[async_trait]
pub trait CustomVariableType: Send + Sync + 'static {
    fn type_name(&self) -> &str;

    fn description(&self) -> &str {
        ""
    }

    async fn options(&self, ctx: &Context) -> Result<Vec<VariableOption>>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorClass;

    #[test]
    fn signature_checks_arguments() {
        let sig = Signature::new("f")
            .param(Param::new("a", SchemaType::String))
            .param(Param::new("b", SchemaType::Float).optional());
        assert!(sig.check_args(&["x".into()]).is_ok());
        assert!(sig.check_args(&["x".into(), 2.into()]).is_ok());
        assert!(sig.check_args(&["x".into(), Value::Null]).is_ok());
        let e = sig.check_args(&[]).err();
        assert_eq!(e.map(|e| e.class), Some(ErrorClass::BadInput));
        let e = sig
            .check_args(&["x".into(), "y".into()])
            .err()
            .and_then(|e| e.path);
        assert_eq!(e, Some(AttrPath::root().index(1)));
        let e = sig
            .check_args(&["x".into(), 1.into(), 2.into()])
            .err()
            .and_then(|e| e.path);
        assert_eq!(e, Some(AttrPath::root().index(2)));
        let var = Signature::new("g").variadic(Param::new("xs", SchemaType::Integer));
        assert!(var.check_args(&[1.into(), 2.into(), 3.into()]).is_ok());
        assert!(var.check_args(&[1.into(), 2.5.into()]).is_err());
    }

    #[test]
    fn retry_policy_proto() {
        let p = RetryPolicy::default().to_proto();
        assert_eq!(
            (p.max_attempts, p.initial_backoff_ms, p.max_backoff_ms),
            (3, 200, 5000)
        );
    }
}
