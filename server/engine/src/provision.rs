//! The narrow door between the executor and providers. The executor only ever calls a
//! [`Provisioner`]; production uses [`PluginProvisioner`] (gRPC plugin clients through the
//! host, which applies deadlines and the provider's retry policy), tests may use anything else.

use std::sync::Arc;

use serde_json::Value as Json;
use trellis_proto::plugin::v1 as pb;

use crate::plugins::{CallOptions, PluginError, PluginHost};
use crate::settings::ProviderConfigs;

/// A resource as the executor hands it to a provider.
#[derive(Clone, Debug)]
pub struct Target {
    pub instance_id: String,
    pub name: String,
    pub resource_type: String,
    /// The provider's id, once created.
    pub external_id: Option<String>,
    /// The spec last applied (for updates and destroys).
    pub current_spec: Option<Json>,
    pub current_state: Option<Json>,
    /// The provider config of the run, by namespace.
    pub configs: ProviderConfigs,
    /// The request that started the operation (empty outside one), for the plugin's logs.
    pub request_id: String,
    /// Where an apply's progress messages go (`None`: nowhere).
    pub progress: Option<ProgressSink>,
}

/// Receives a provider call's progress messages (see `progress.rs`).
#[derive(Clone)]
pub struct ProgressSink(pub(crate) Arc<dyn Fn(&pb::Progress) + Send + Sync>);

impl std::fmt::Debug for ProgressSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProgressSink")
    }
}

/// A provider call's success: the external id and computed state.
#[derive(Clone, Debug, PartialEq)]
pub struct Applied {
    pub external_id: String,
    pub state: Json,
}

/// A provider call's failure, with whatever it created before failing.
#[derive(Clone, Debug)]
pub struct Failure {
    pub message: String,
    /// Something was created before the failure: record it, so it is not orphaned.
    pub partial: Option<Applied>,
    /// No answer came (the plugin died, the deadline passed, the connection broke): the call
    /// may have happened, so its intent stays until the provider has been asked.
    pub unknown: bool,
}

impl Failure {
    pub fn new(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            partial: None,
            unknown: false,
        }
    }

    /// A provider call that failed in the host or on the way: `unknown` when the provider may
    /// have acted on it before the answer was lost.
    pub fn of_call(e: &PluginError) -> Failure {
        let unknown = matches!(
            e,
            PluginError::Crashed { .. }
                | PluginError::DeadlineExceeded { .. }
                | PluginError::Transport { .. }
                // An answer that could not be read: the provider may have acted.
                | PluginError::Protocol { .. }
        );
        Failure {
            unknown,
            ..Failure::new(describe(e))
        }
    }
}

/// What a provider reports about an existing resource.
#[derive(Clone, Debug, PartialEq)]
pub enum Observed {
    Missing,
    /// `external_id`: the provider's id for it (empty when the provider did not say).
    Exists {
        spec: Json,
        state: Json,
        external_id: String,
    },
}

/// What is happening to a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkUpdate {
    Create,
    Update,
    Destroy,
}

/// One link between two deployed resources, for the provider that implements its type.
#[derive(Clone, Debug)]
pub struct LinkCall {
    /// The provider namespace that implements the link type.
    pub provider: String,
    /// `<type A>::<type B>`.
    pub link_type: String,
    pub a: Target,
    pub b: Target,
    pub annotations_a: Json,
    pub annotations_b: Json,
    /// What earlier phases and deployments recorded.
    pub link_data: Json,
    pub update: LinkUpdate,
}

#[async_trait::async_trait]
pub trait Provisioner: Send + Sync + 'static {
    /// Creates (`target.external_id` is `None`) or updates the resource to `spec`.
    /// `idempotency_key` is stable for the operation and resource, so a retried call does not
    /// create twice.
    async fn apply(
        &self,
        target: &Target,
        spec: pb::Value,
        idempotency_key: &str,
    ) -> Result<Applied, Failure>;
    async fn destroy(&self, target: &Target, idempotency_key: &str) -> Result<(), Failure>;
    /// Destroys several resources of one provider at once (`items`: each target with its
    /// idempotency key): calls `done(k, result)` once for each item `k` as its outcome is
    /// known, in any order, the result `destroy` of it alone would give.
    async fn destroy_many(
        &self,
        items: &[(Target, String)],
        done: &(dyn Fn(usize, Result<(), Failure>) + Send + Sync),
    ) {
        destroy_each(self, items, done).await;
    }
    async fn read(&self, target: &Target) -> Result<Observed, Failure>;
    /// An existing resource the state does not record, found by the id a user gave
    /// (`trellis import`), described as a blueprint would declare it.
    async fn import(&self, target: &Target, external_id: &str) -> Result<Observed, Failure> {
        let _ = external_id;
        Err(Failure::new(format!(
            "{} cannot be imported",
            target.resource_type
        )))
    }
    /// Runs a link through its phases (stage, update resource A, update resource B, update
    /// intermediaries); returns the link data to record, with the fields the link owns
    /// (`links::record_data`). `call.link_data` is the recorded data, owned paths included.
    async fn link(&self, call: &LinkCall, idempotency_key: &str) -> Result<Json, Failure>;
    /// The spec schema of a resource type, when its provider declares one: drift checks read
    /// it to tell a map (whose new entries are drift) from an object.
    async fn spec_schema(&self, resource_type: &str) -> Option<pb::Schema> {
        let _ = resource_type;
        None
    }
}

/// [`Provisioner::destroy_many`] as one `destroy` per item, all at once.
async fn destroy_each<P: Provisioner + ?Sized>(
    p: &P,
    items: &[(Target, String)],
    done: &(dyn Fn(usize, Result<(), Failure>) + Send + Sync),
) {
    use futures_util::StreamExt as _;
    let mut calls: futures_util::stream::FuturesUnordered<_> = items
        .iter()
        .enumerate()
        .map(|(k, (target, key))| async move { (k, p.destroy(target, key).await) })
        .collect();
    while let Some((k, r)) = calls.next().await {
        done(k, r);
    }
}

/// Link data from a phase merged over what earlier phases returned (top-level keys replace).
fn merge(into: &mut Json, more: Json) {
    match (into, more) {
        (Json::Object(a), Json::Object(b)) => a.extend(b),
        (slot, Json::Null) => {
            let _ = slot;
        }
        (slot, other) => *slot = other,
    }
}

/// The text of every scalar inside the parts of `v` marked sensitive (`inside`: `v` is within
/// one).
fn collect_secrets(v: &pb::Value, inside: bool, out: &mut Vec<String>) {
    use pb::value::Kind;
    let inside = inside || v.sensitive;
    match &v.kind {
        Some(Kind::String(s)) if inside && !s.is_empty() => out.push(s.clone()),
        Some(Kind::Int(i)) if inside => out.push(i.to_string()),
        Some(Kind::Float(f)) if inside => out.push(f.to_string()),
        Some(Kind::List(l)) => l.items.iter().for_each(|i| collect_secrets(i, inside, out)),
        Some(Kind::Map(m)) => m
            .entries
            .iter()
            .filter_map(|e| e.value.as_ref())
            .for_each(|x| collect_secrets(x, inside, out)),
        _ => {}
    }
}

/// The secrets of a resource as recorded: its spec and its state.
fn target_secrets(target: &Target) -> Vec<String> {
    let mut out = Vec::new();
    for v in [&target.current_spec, &target.current_state]
        .into_iter()
        .flatten()
    {
        collect_secrets(&stored_pb(v), false, &mut out);
    }
    out
}

impl Failure {
    fn redacted(self, secrets: &[String]) -> Failure {
        Failure {
            message: crate::redact::redact(&self.message, secrets),
            partial: self.partial.map(|a| a.marked(secrets)),
            unknown: self.unknown,
        }
    }
}

/// Provider output for storage, with every string that quotes one of `secrets` or a secret of
/// the running operations marked (see `state_values::mark_mentions`).
fn mark_output(v: Json, secrets: &[String]) -> Json {
    if secrets.is_empty() && !crate::redact::any_held() {
        return v;
    }
    super::state_values::mark_mentions(v, &|s| crate::redact::mentions_secret(s, secrets))
}

impl Applied {
    fn marked(self, secrets: &[String]) -> Applied {
        Applied {
            state: mark_output(self.state, secrets),
            ..self
        }
    }
}

/// Providers reached through the plugin host.
pub struct PluginProvisioner {
    pub host: Arc<PluginHost>,
    /// The engine's copies of local assets, handed to apply calls by path.
    pub assets: crate::assets::Store,
}

pub(crate) fn namespace(resource_type: &str) -> &str {
    resource_type.split('/').next().unwrap_or_default()
}

fn describe(e: &PluginError) -> String {
    e.to_string()
}

/// Provider output for storage: secrets keep their mark.
fn raw_json(v: &pb::Value) -> Json {
    super::state_values::from_pb(v)
}

/// Recorded values for a provider: secrets flagged.
fn stored_pb(v: &Json) -> pb::Value {
    super::state_values::to_pb(v)
}

/// The Host service's `LookupResource` (a plugin reading a resource of the instance it serves
/// a call for), answered from the engine's state: the spec as last applied or intended and the
/// computed state, secrets as the plugin gets them in its own calls.
pub struct StoreLookup(pub Arc<dyn crate::state::StateStore>);

impl crate::plugins::StateLookup for StoreLookup {
    fn lookup<'a>(
        &'a self,
        instance_id: &'a str,
        name: &'a str,
    ) -> std::pin::Pin<
        Box<
            dyn std::future::Future<Output = Result<Option<pb::ResourceState>, String>> + Send + 'a,
        >,
    > {
        Box::pin(async move {
            let resource = self
                .0
                .get_resource(instance_id, name)
                .await
                .map_err(|e| e.to_string())?;
            Ok(resource.map(|r| pb::ResourceState {
                spec: Some(stored_pb(&r.spec)),
                state: r.state.as_ref().map(stored_pb),
                resource_type: r.resource_type,
                resource_name: r.name,
                external_id: r.external_id.unwrap_or_default(),
            }))
        })
    }
}

fn current(target: &Target) -> Option<pb::ResourceState> {
    target.external_id.as_ref().map(|id| pb::ResourceState {
        resource_type: target.resource_type.clone(),
        resource_name: target.name.clone(),
        external_id: id.clone(),
        spec: target.current_spec.as_ref().map(stored_pb),
        state: target.current_state.as_ref().map(stored_pb),
    })
}

fn options(target: &Target, namespace: &str, key: &str) -> CallOptions {
    CallOptions {
        idempotency_key: (!key.is_empty()).then(|| key.to_owned()),
        instance_id: target.instance_id.clone(),
        provider_config: target.configs.get(namespace),
        request_id: (!target.request_id.is_empty()).then(|| target.request_id.clone()),
        ..CallOptions::default()
    }
}

/// What a destroy's answer (`error` from provider `ns`) means for its resource.
#[allow(clippy::result_large_err)]
fn destroy_answer(ns: &str, error: Option<pb::Error>) -> Result<(), Failure> {
    match error {
        // Already gone is what destroy wants.
        Some(e) if e.error_class != pb::ErrorClass::NotFound as i32 => {
            Err(Failure::new(format!("provider `{ns}`: {}", e.message)))
        }
        _ => Ok(()),
    }
}

/// What a DestroyResources item's answer means for its resource, as for a DestroyResource;
/// `None`: a transient failure, to retry on its own.
fn item_outcome(
    ns: &str,
    target: &Target,
    error: Option<pb::Error>,
) -> Option<Result<(), Failure>> {
    match error {
        Some(e) if e.error_class == pb::ErrorClass::Transient as i32 => None,
        error => Some(destroy_answer(ns, error).map_err(|f| f.redacted(&target_secrets(target)))),
    }
}

/// The calls themselves; the [`Provisioner`] implementation below cuts secrets out of their
/// failures.
impl PluginProvisioner {
    async fn apply_call(
        &self,
        target: &Target,
        spec: pb::Value,
        idempotency_key: &str,
    ) -> Result<Applied, Failure> {
        let client = self
            .host
            .provider(namespace(&target.resource_type))
            .map_err(|e| Failure::new(describe(&e)))?;
        let local_assets = crate::assets::call_assets(&self.assets, &spec)
            .await
            .map_err(Failure::new)?;
        let req = pb::ApplyResourceRequest {
            context: (!local_assets.is_empty()).then(|| pb::CallContext {
                local_assets: local_assets.into_iter().collect(),
                ..Default::default()
            }),
            current: current(target),
            resource_type: target.resource_type.clone(),
            resource_name: target.name.clone(),
            desired_spec: Some(spec),
        };
        match client
            .apply_resource(
                req,
                &options(target, namespace(&target.resource_type), idempotency_key),
                {
                    let sink = target.progress.clone();
                    move |p: &pb::Progress| {
                        if let Some(sink) = &sink {
                            (sink.0)(p)
                        }
                    }
                },
            )
            .await
        {
            Ok(res) => Ok(Applied {
                external_id: res.external_id,
                state: res.state.as_ref().map_or(Json::Null, raw_json),
            }),
            Err(PluginError::Application(app)) => {
                let partial = app
                    .external_id
                    .clone()
                    .filter(|id| !id.is_empty())
                    .map(|id| Applied {
                        external_id: id,
                        state: app.state.as_ref().map_or(Json::Null, raw_json),
                    });
                Err(Failure {
                    message: PluginError::Application(app).to_string(),
                    partial,
                    unknown: false,
                })
            }
            Err(e) => Err(Failure::of_call(&e)),
        }
    }

    async fn destroy_call(&self, target: &Target, idempotency_key: &str) -> Result<(), Failure> {
        let Some(current) = current(target) else {
            // Never created: nothing to ask the provider.
            return Ok(());
        };
        let client = self
            .host
            .provider(namespace(&target.resource_type))
            .map_err(|e| Failure::new(describe(&e)))?;
        let req = pb::DestroyResourceRequest {
            context: None,
            current: Some(current),
        };
        let resp = client
            .destroy_resource(
                req,
                &options(target, namespace(&target.resource_type), idempotency_key),
            )
            .await
            .map_err(|e| Failure::of_call(&e))?;
        destroy_answer(namespace(&target.resource_type), resp.error)
    }

    /// The provider's client when `items` can go in one DestroyResources call: more than one,
    /// all of one provider, which declares the capability.
    async fn batch_client(
        &self,
        items: &[(Target, String)],
    ) -> Option<crate::plugins::ProviderClient> {
        let ns = namespace(&items.first()?.0.resource_type);
        if items.len() < 2 || items.iter().any(|(t, _)| namespace(&t.resource_type) != ns) {
            return None;
        }
        let client = self.host.provider(ns).ok()?;
        let caps = client.capabilities().await.ok()?;
        caps.destroy_resources.then_some(client)
    }

    /// `items` in DestroyResources calls, failures cleaned of the secrets of their own item. An
    /// item that fails transiently is retried alone, as a DestroyResource under the provider's
    /// retry policy.
    async fn destroy_batch(
        &self,
        client: crate::plugins::ProviderClient,
        items: &[(Target, String)],
        done: &(dyn Fn(usize, Result<(), Failure>) + Send + Sync),
    ) {
        use futures_util::StreamExt as _;
        let ns = namespace(&items[0].0.resource_type);
        // Never created: nothing to ask the provider.
        let mut sent = Vec::with_capacity(items.len());
        let mut req = pb::DestroyResourcesRequest::default();
        for (k, (target, key)) in items.iter().enumerate() {
            match current(target) {
                None => done(k, Ok(())),
                Some(current) => {
                    sent.push(k);
                    req.items.push(pb::DestroyItem {
                        idempotency_key: key.clone(),
                        current: Some(current),
                    });
                }
            }
        }
        let Some(&first) = sent.first() else { return };
        let opts = CallOptions {
            // Each item carries its own.
            idempotency_key: Some(String::new()),
            ..options(&items[first].0, ns, "")
        };
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<pb::DestroyResourcesEvent>();
        let call = client.destroy_resources(req, &opts, move |e| {
            let _ = tx.send(e);
        });
        tokio::pin!(call);
        let retry = |k: usize| {
            let (target, key) = &items[k];
            async move { (k, self.destroy(target, key).await) }
        };
        let mut answered = vec![false; sent.len()];
        let mut retries = futures_util::stream::FuturesUnordered::new();
        let mut ended: Option<Result<(), PluginError>> = None;
        let mut arrived = Vec::new();
        loop {
            tokio::select! {
                r = &mut call, if ended.is_none() => ended = Some(r),
                Some(e) = rx.recv(), if ended.is_none() => arrived.push(e),
                Some((k, r)) = retries.next(), if !retries.is_empty() => done(k, r),
                else => break,
            }
            if ended.is_some() {
                // What came before the end is all there will be.
                while let Ok(e) = rx.try_recv() {
                    arrived.push(e);
                }
            }
            for e in arrived.drain(..) {
                // The client passes only indexes in range, once each.
                let j = e.index as usize;
                answered[j] = true;
                let k = sent[j];
                match item_outcome(ns, &items[k].0, e.error) {
                    Some(r) => done(k, r),
                    None => retries.push(retry(k)),
                }
            }
        }
        if let Some(Err(e)) = ended {
            for (j, _) in answered.iter().enumerate().filter(|(_, a)| !**a) {
                let k = sent[j];
                done(
                    k,
                    Err(Failure::of_call(&e).redacted(&target_secrets(&items[k].0))),
                );
            }
        }
    }

    async fn link_call(&self, call: &LinkCall, idempotency_key: &str) -> Result<Json, Failure> {
        let client = self
            .host
            .provider(&call.provider)
            .map_err(|e| Failure::new(describe(&e)))?;
        let opts = options(&call.a, &call.provider, idempotency_key);
        // The provider sees its own link data, without the owned paths kept beside it.
        let recorded = super::links::link_data(&call.link_data);
        let mut ctx = pb::LinkContext {
            context: None,
            link_type: call.link_type.clone(),
            resource_a: current(&call.a),
            resource_b: current(&call.b),
            annotations_a: Some(stored_pb(&call.annotations_a)),
            annotations_b: Some(stored_pb(&call.annotations_b)),
            link_data: Some(stored_pb(&recorded)),
            update_type: match call.update {
                LinkUpdate::Create => pb::LinkUpdateType::Create,
                LinkUpdate::Update => pb::LinkUpdateType::Update,
                LinkUpdate::Destroy => pb::LinkUpdateType::Destroy,
            } as i32,
        };
        let label = |phase: &str, e: &pb::Error| {
            format!(
                "link {} -> {} ({}): {phase}: {}",
                call.a.name, call.b.name, call.link_type, e.message
            )
        };
        let fail = |e: PluginError| Failure::new(describe(&e));
        let staged = client
            .stage_link(
                pb::StageLinkRequest {
                    link: Some(ctx.clone()),
                },
                &opts,
            )
            .await
            .map_err(fail)?;
        if let Some(e) = &staged.error {
            return Err(Failure::new(label("stage", e)));
        }
        let errors: Vec<&str> = staged
            .diagnostics
            .iter()
            .filter(|d| d.severity == pb::Severity::Error as i32)
            .map(|d| d.message.as_str())
            .collect();
        if !errors.is_empty() && call.update != LinkUpdate::Destroy {
            return Err(Failure::new(format!(
                "link {} -> {} ({}): {}",
                call.a.name,
                call.b.name,
                call.link_type,
                errors.join("; ")
            )));
        }
        let owned = super::links::OwnedPaths::from_pb(&staged.owned_paths_a, &staged.owned_paths_b);
        let mut data = recorded;
        // Resource A, then resource B; each phase sees the link data of the ones before it.
        for phase in ["update resource A", "update resource B"] {
            let req = pb::UpdateLinkResourceRequest {
                link: Some(ctx.clone()),
            };
            let resp = if phase.ends_with('A') {
                client.update_link_resource_a(req, &opts).await
            } else {
                client.update_link_resource_b(req, &opts).await
            }
            .map_err(fail)?;
            if let Some(e) = &resp.error {
                return Err(Failure::new(label(phase, e)));
            }
            merge(
                &mut data,
                resp.link_data.as_ref().map_or(Json::Null, raw_json),
            );
            ctx.link_data = Some(stored_pb(&data));
        }
        let resp = client
            .update_link_intermediaries(
                pb::UpdateLinkIntermediariesRequest { link: Some(ctx) },
                &opts,
            )
            .await
            .map_err(fail)?;
        if let Some(e) = &resp.error {
            return Err(Failure::new(label("update intermediaries", e)));
        }
        merge(
            &mut data,
            resp.link_data.as_ref().map_or(Json::Null, raw_json),
        );
        Ok(super::links::record_data(data, &owned))
    }

    async fn import_call(&self, target: &Target, external_id: &str) -> Result<Observed, Failure> {
        let ns = namespace(&target.resource_type);
        let client = self
            .host
            .provider(ns)
            .map_err(|e| Failure::new(describe(&e)))?;
        let req = pb::ImportResourceRequest {
            context: None,
            resource_type: target.resource_type.clone(),
            resource_name: target.name.clone(),
            external_id: external_id.to_owned(),
        };
        let r = client
            .import_resource(req, &options(target, ns, ""))
            .await
            .map_err(|e| Failure::new(describe(&e)))?;
        observed(ns, r.error, r.exists, r.spec, r.state, r.external_id)
    }

    async fn read_call(&self, target: &Target) -> Result<Observed, Failure> {
        let Some(current) = current(target) else {
            return Ok(Observed::Missing);
        };
        let client = self
            .host
            .provider(namespace(&target.resource_type))
            .map_err(|e| Failure::new(describe(&e)))?;
        let req = pb::ReadResourceRequest {
            context: None,
            current: Some(current),
        };
        let ns = namespace(&target.resource_type);
        let r = client
            .read_resource(req, &options(target, ns, ""))
            .await
            .map_err(|e| Failure::new(describe(&e)))?;
        observed(ns, r.error, r.exists, r.spec, r.state, r.external_id)
    }
}

/// A read's or an import's answer (`ReadResourceResponse`, `ImportResourceResponse`).
// `Failure` travels by value through every provisioner call; boxing it here alone buys nothing.
#[allow(clippy::result_large_err)]
fn observed(
    namespace: &str,
    error: Option<pb::Error>,
    exists: bool,
    spec: Option<pb::Value>,
    state: Option<pb::Value>,
    external_id: String,
) -> Result<Observed, Failure> {
    if let Some(e) = error {
        return Err(Failure::new(format!(
            "provider `{namespace}`: {}",
            e.message
        )));
    }
    if !exists {
        return Ok(Observed::Missing);
    }
    Ok(Observed::Exists {
        spec: spec.as_ref().map_or(Json::Null, raw_json),
        state: state.as_ref().map_or(Json::Null, raw_json),
        external_id,
    })
}

/// A provider may quote what it was sent in an error, and failures are recorded in state and
/// events and shown by the CLI: every failure is cleaned of the secrets of the call's inputs
/// and of those the running operations registered (`crate::redact::hold`), which catch a
/// secret quoted inside a longer text (an absolute path built from a secret-derived one).
/// This is the one door every provider failure of an operation passes (resources, links,
/// children's resources, rollbacks, reads), so it is the one place that redacts them.
#[async_trait::async_trait]
impl Provisioner for PluginProvisioner {
    async fn apply(
        &self,
        target: &Target,
        spec: pb::Value,
        idempotency_key: &str,
    ) -> Result<Applied, Failure> {
        // The spec goes into the call, so its secrets are noted now (nothing is allocated
        // unless it holds some); the recorded ones are read only if the call fails.
        let mut sent = Vec::new();
        collect_secrets(&spec, false, &mut sent);
        match self.apply_call(target, spec, idempotency_key).await {
            Ok(applied) => Ok(applied.marked(&sent)),
            Err(f) => {
                sent.extend(target_secrets(target));
                Err(f.redacted(&sent))
            }
        }
    }

    async fn destroy(&self, target: &Target, idempotency_key: &str) -> Result<(), Failure> {
        self.destroy_call(target, idempotency_key)
            .await
            .map_err(|f| f.redacted(&target_secrets(target)))
    }

    async fn destroy_many(
        &self,
        items: &[(Target, String)],
        done: &(dyn Fn(usize, Result<(), Failure>) + Send + Sync),
    ) {
        match self.batch_client(items).await {
            Some(client) => self.destroy_batch(client, items, done).await,
            None => destroy_each(self, items, done).await,
        }
    }

    async fn read(&self, target: &Target) -> Result<Observed, Failure> {
        match self.read_call(target).await {
            Ok(Observed::Exists {
                spec,
                state,
                external_id,
            }) => {
                let secrets = target_secrets(target);
                Ok(Observed::Exists {
                    spec: mark_output(spec, &secrets),
                    state: mark_output(state, &secrets),
                    external_id,
                })
            }
            Ok(Observed::Missing) => Ok(Observed::Missing),
            Err(f) => Err(f.redacted(&target_secrets(target))),
        }
    }

    async fn import(&self, target: &Target, external_id: &str) -> Result<Observed, Failure> {
        // Nothing of it is recorded yet: the secrets to keep out of a failure are the
        // settings' and the id's own when it quotes one (held by the caller).
        self.import_call(target, external_id)
            .await
            .map_err(|f| f.redacted(&[]))
    }

    async fn link(&self, call: &LinkCall, idempotency_key: &str) -> Result<Json, Failure> {
        let result = self.link_call(call, idempotency_key).await;
        let mut secrets = target_secrets(&call.a);
        secrets.extend(target_secrets(&call.b));
        for v in [&call.annotations_a, &call.annotations_b, &call.link_data] {
            collect_secrets(&stored_pb(v), false, &mut secrets);
        }
        match result {
            Ok(data) => Ok(mark_output(data, &secrets)),
            Err(f) => Err(f.redacted(&secrets)),
        }
    }

    async fn spec_schema(&self, resource_type: &str) -> Option<pb::Schema> {
        let manifest = self
            .host
            .manifest_of(
                crate::plugins::PluginKind::Provider,
                namespace(resource_type),
            )
            .await
            .ok()?;
        manifest
            .resource_types
            .iter()
            .find(|t| t.r#type == resource_type)?
            .spec_schema
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redact::redact;
    use serde_json::json;

    #[test]
    fn failures_never_quote_the_secrets_they_were_sent() {
        let stored = json!({
            "name": "db",
            "password": {"$sensitive": "hunter2"},
            "env": {"URL": {"$sensitive": "postgres://u:hunter2-long@db"}, "A": "db"},
        });
        let mut secrets = Vec::new();
        collect_secrets(&stored_pb(&stored), false, &mut secrets);
        assert_eq!(secrets.len(), 2, "{secrets:?}");
        let message = "cannot create db: bad url postgres://u:hunter2-long@db (password hunter2)";
        let redacted = redact(message, &secrets);
        assert!(!redacted.contains("hunter2"), "{redacted}");
        // Plain values, even equal to a part of a secret's text, stay.
        assert!(
            redacted.starts_with("cannot create db: bad url"),
            "{redacted}"
        );
        assert_eq!(redact("no secret here", &secrets), "no secret here");

        // A short secret, or a number, cannot be cut out cleanly: the message is withheld.
        let stored = json!({"pin": {"$sensitive": 4242}, "k": {"$sensitive": "ab"}});
        let mut secrets = Vec::new();
        collect_secrets(&stored_pb(&stored), false, &mut secrets);
        assert_eq!(
            redact("pin 4242 refused", &secrets),
            crate::redact::WITHHELD
        );
        assert_eq!(redact("cannot grab it", &secrets), crate::redact::WITHHELD);
        assert_eq!(redact("nothing secret", &secrets), "nothing secret");
    }
}
