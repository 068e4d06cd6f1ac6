//! Import: adopting a resource that exists but that no deployment of the instance created
//! (`trellis import`). The resource's provider reads it by the id the user gave
//! (ImportResource, for types its manifest declares `importable`) and describes it as a
//! blueprint would declare it; the instance records that spec, the computed state and the
//! provider's id, as if a deploy had created it. A blueprint that declares exactly that spec
//! then plans no change, and destroy, drift and reconcile treat the resource like any other.
//!
//! It runs as an operation (kind `import`) so that it holds the instance like every other
//! write: no deploy can run halfway through it, and the instance's event log says who
//! adopted what.

use super::*;
use crate::operations::{OperationStart, Started};

/// What `trellis import` asks for.
#[derive(Clone, Debug, Default)]
pub struct ImportRequest {
    pub instance: String,
    /// The resource's name in the blueprint.
    pub name: String,
    pub resource_type: String,
    /// The id in the form the type documents (a path, a name, an ARN).
    pub external_id: String,
    /// Provider config for the read, recorded with the instance; only for an instance that
    /// records none yet.
    pub environment: Option<settings::Environment>,
}

impl ImportRequest {
    /// What identifies the request (besides its id).
    fn digest(&self) -> String {
        let env = self
            .environment
            .as_ref()
            .map(|e| e.to_json().to_string())
            .unwrap_or_default();
        trellis_ids::digest(&[
            "import",
            &self.instance,
            &self.name,
            &self.resource_type,
            &self.external_id,
            &env,
        ])
    }
}

/// The recorded resource of `state` that already stands for the provider's `external_id` of
/// `resource_type`, if any: one resource adopted twice would be destroyed twice.
fn recorded_as<'a>(
    state: &'a InstanceState,
    resource_type: &str,
    external_id: &str,
) -> Option<&'a str> {
    state
        .resources
        .iter()
        .find(|r| r.resource_type == resource_type && r.external_id.as_deref() == Some(external_id))
        .map(|r| r.name.as_str())
}

impl Engine {
    /// Starts importing an existing resource into an instance (created on first use). Bad
    /// requests are refused before anything is recorded; a resource the provider does not
    /// find fails the operation.
    pub async fn import(
        self: &Arc<Self>,
        request_id: &str,
        req: ImportRequest,
    ) -> Result<Operation> {
        let digest = req.digest();
        self.once(
            request_id,
            &digest,
            self.start_import(request_id, &digest, req),
        )
        .await
    }

    /// The checks that need no lease: names, the type, the id.
    async fn check_import(&self, req: &ImportRequest) -> Result<()> {
        let invalid = |m: String| Err(EngineError::InvalidArgument(m));
        if let Some(why) = names::instance_name_problem(&req.instance) {
            return invalid(why);
        }
        if !blueprint::is_valid_name(&req.name) {
            return invalid(format!(
                "`{}` cannot name a resource: use letters, digits, `_` and `-`, starting with a letter or `_`",
                req.name
            ));
        }
        if req.external_id.is_empty() {
            return invalid("the id of the resource to import is required".into());
        }
        let Some((namespace, _)) = req.resource_type.split_once('/') else {
            return invalid(format!(
                "`{}` is not a resource type (`namespace/type`, like `local/file`)",
                req.resource_type
            ));
        };
        let manifest = match self
            .host
            .manifest_of(plugins::PluginKind::Provider, namespace)
            .await
        {
            Ok(m) => m,
            Err(plugins::PluginError::NotFound { .. }) => {
                return invalid(format!(
                    "no provider plugin for namespace `{namespace}` (resource type `{}`)",
                    req.resource_type
                ));
            }
            Err(e) => return Err(EngineError::Unavailable(e.to_string())),
        };
        let importable: Vec<&str> = manifest
            .resource_types
            .iter()
            .filter(|t| t.importable)
            .map(|t| t.r#type.as_str())
            .collect();
        match manifest
            .resource_types
            .iter()
            .find(|t| t.r#type == req.resource_type)
        {
            None => invalid(format!(
                "provider `{namespace}` has no resource type `{}`",
                req.resource_type
            )),
            Some(t) if !t.importable => invalid(format!(
                "`{}` cannot be imported: provider `{namespace}` does not declare it importable ({})",
                req.resource_type,
                if importable.is_empty() {
                    "it declares no importable type".to_owned()
                } else {
                    format!("importable: {}", importable.join(", "))
                }
            )),
            Some(_) => Ok(()),
        }
    }

    async fn start_import(
        self: &Arc<Self>,
        request_id: &str,
        request_digest: &str,
        req: ImportRequest,
    ) -> Result<Operation> {
        self.accepting()?;
        self.check_import(&req).await?;
        let inst = match self.store.find_instance(&req.instance).await? {
            Some(i) => i,
            None => self.store.create_instance(&req.instance).await?,
        };
        let lease = self.lease(&inst.id).await?;
        let refused = |e: EngineError| async {
            let _ = self.store.release_lease(&lease).await;
            Err(e)
        };
        let state = match self.store.load_state(&inst.id).await {
            Ok(s) => s,
            Err(e) => return refused(e.into()).await,
        };
        if state.resources.iter().any(|r| r.name == req.name) {
            return refused(EngineError::AlreadyExists(format!(
                "instance `{}` already has a resource `{}`: import it under another name",
                req.instance, req.name
            )))
            .await;
        }
        if let Some(other) = recorded_as(&state, &req.resource_type, &req.external_id) {
            return refused(EngineError::AlreadyExists(format!(
                "instance `{}` already records {} `{}` as `{other}`",
                req.instance, req.resource_type, req.external_id
            )))
            .await;
        }
        if req.environment.is_some() && !state.instance.environment.is_null() {
            return refused(EngineError::FailedPrecondition(format!(
                "instance `{}` records the environment it was deployed with, and import uses \
                 it: leave the environment out",
                req.instance
            )))
            .await;
        }
        let op = match self
            .start_operation(
                &lease,
                OperationStart {
                    kind: OperationKind::Import,
                    request_id,
                    request_digest,
                    change_set_id: None,
                    instance_status: state.instance.status,
                    total: Some(1),
                },
            )
            .await
        {
            Ok(Started::New(op)) => op,
            Ok(Started::Existing(op)) => return Ok(op),
            Err(e) => return refused(e).await,
        };
        self.spawn_run(op.clone(), lease, move |engine, ctx, _| {
            engine.run_import(ctx, &state, &req)
        });
        Ok(op)
    }

    fn run_import(
        &self,
        ctx: &Arc<RunContext>,
        before: &InstanceState,
        req: &ImportRequest,
    ) -> Finish {
        let _secrets = crate::redact::hold(state_values::instance_secrets(before));
        let (configs, _settings_secrets) = match &req.environment {
            Some(env) => {
                let (merged, held) = match ctx.rt.block_on(self.checked_settings(env)) {
                    Ok(m) => m,
                    Err(e) => return Finish::failed(e.to_string()),
                };
                // Recorded before the read, as a deploy records it before its calls.
                let record =
                    json!({ "environment": env.to_json(), "providers": merged.record_json() });
                if let Err(e) =
                    ctx.commit_blocking(vec![Change::InstanceEnvironment(record)], vec![])
                {
                    return Finish::failed(ctx.store_error(&e));
                }
                (merged.configs(), held)
            }
            None => {
                let recorded = self.recorded_settings(&before.instance.environment);
                (
                    recorded.configs(),
                    crate::redact::hold(recorded.secret_texts()),
                )
            }
        };
        let _ = ctx.configs.set(configs.clone());
        let target = provision::Target {
            instance_id: before.instance.id.clone(),
            name: req.name.clone(),
            resource_type: req.resource_type.clone(),
            external_id: None,
            current_spec: None,
            current_state: None,
            configs,
            request_id: ctx.operation.request_id.clone(),
            progress: None,
        };
        let found = ctx
            .rt
            .block_on(self.provisioner.import(&target, &req.external_id));
        let (spec, state, external_id) = match found {
            Err(f) => return Finish::failed(format!("{}: {}", req.name, f.message)),
            Ok(provision::Observed::Missing) => {
                return Finish::failed(format!(
                    "{}: provider found no {} with id `{}`",
                    req.name, req.resource_type, req.external_id
                ));
            }
            Ok(provision::Observed::Exists {
                spec,
                state,
                external_id,
            }) => {
                let id = if external_id.is_empty() {
                    req.external_id.clone()
                } else {
                    external_id
                };
                (spec, state, id)
            }
        };
        // The id given may have been another form of one the instance records (a queue's
        // name for its URL).
        if let Some(other) = recorded_as(before, &req.resource_type, &external_id) {
            return Finish::failed(format!(
                "{}: instance `{}` already records {} `{external_id}` as `{other}`",
                req.name, req.instance, req.resource_type
            ));
        }
        let changes = vec![
            // Only recorded: the provider was asked to read, not to create.
            Change::IntendCreate {
                name: req.name.clone(),
                resource_type: req.resource_type.clone(),
                spec,
                depends_on: Vec::new(),
                metadata: Json::Null,
                key: String::new(),
            },
            Change::ResourceCreated {
                name: req.name.clone(),
                external_id: external_id.clone(),
                state,
            },
        ];
        let event = NewEvent::new(
            "resource.imported",
            json!({ "resource": req.name, "type": req.resource_type, "externalId": external_id }),
        );
        if let Err(e) = ctx.commit_blocking(changes, vec![event]) {
            return Finish::failed(ctx.store_error(&e));
        }
        let status = match before.instance.status {
            InstanceStatus::New | InstanceStatus::Destroyed => Some(InstanceStatus::Deployed),
            _ => None,
        };
        Finish {
            error: None,
            instance_status: status,
            changes: vec![],
        }
    }
}
