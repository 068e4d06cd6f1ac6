//! Planning: change sets for a blueprint and its children, and their views.

use super::*;

/// What planning a blueprint found, handed back from the planning thread.
#[derive(Default)]
pub(crate) struct Planned {
    plan: Plan,
    diagnostics: Vec<Json>,
    datasources: serde_json::Map<String, Json>,
    /// Why the blueprint cannot be planned.
    error: Option<PlanFailure>,
    prepared: Option<Prepared>,
    /// Included documents read from this host while planning.
    files: Vec<(String, Vec<u8>)>,
}

/// Why planning stopped: a message, and for an invalid blueprint (the root's or a child's)
/// its diagnostics, which the API returns as data (they may be far too many for a status).
struct PlanFailure {
    message: String,
    diagnostics: Vec<Json>,
    missing_assets: Vec<String>,
}

impl PlanFailure {
    /// `prepared` has errors: `prefix` names the child they are in ("" for the root).
    pub(crate) fn invalid(prefix: &str, prepared: &Prepared) -> PlanFailure {
        PlanFailure {
            message: format!(
                "{prefix}the blueprint has errors:\n{}",
                prepared.errors_text()
            ),
            diagnostics: prepared.diagnostics_json(),
            missing_assets: prepared.missing_assets.clone(),
        }
    }
}

impl From<String> for PlanFailure {
    fn from(message: String) -> PlanFailure {
        PlanFailure {
            message,
            diagnostics: Vec::new(),
            missing_assets: Vec::new(),
        }
    }
}

impl From<PlanFailure> for EngineError {
    fn from(f: PlanFailure) -> EngineError {
        if f.diagnostics.is_empty() {
            EngineError::InvalidArgument(f.message)
        } else {
            EngineError::InvalidBlueprint {
                message: f.message,
                diagnostics: f.diagnostics,
                missing_assets: f.missing_assets,
            }
        }
    }
}

/// What planning a blueprint's children found.
#[derive(Default)]
struct PlannedChildren {
    children: Vec<plan::ChildPlan>,
    /// Documents read from the engine host (not sent with the request), named as execution
    /// looks them up: added to the root's inputs, so its digest covers them and execution
    /// deploys what was planned.
    files: Vec<(String, Vec<u8>)>,
}

/// One include to plan.
struct ChildInputs<'a> {
    name: &'a str,
    instance: &'a str,
    file: String,
    content: Vec<u8>,
    /// Known values, as `--var` text.
    variables: Vec<(String, String)>,
    /// Variables known only after deploy.
    unknown: Vec<String>,
    /// The variables the child declares.
    declared: Vec<crate::blueprint::Variable>,
    chain: Vec<String>,
    now: i128,
    /// The parent's environment and engine injectors: a child is planned with them.
    settings: (&'a settings::Environment, &'a IndexMap<String, Json>),
    /// The parent's local assets: a child names them relative to its own file.
    assets: &'a IndexMap<String, String>,
}

/// A child whose changes are worked out only at deploy.
fn deferred_child(
    name: &str,
    state: &InstanceState,
    unknown: Vec<String>,
    why: String,
) -> plan::ChildPlan {
    plan::ChildPlan {
        name: name.to_owned(),
        instance: state.instance.name.clone(),
        action: if plan::deployed(state) {
            plan::Action::Update
        } else {
            plan::Action::Create
        },
        planned_version: state.instance.version,
        plan: Plan::default(),
        exports: Vec::new(),
        unknown_variables: unknown,
        deferred: why,
        diagnostics: Vec::new(),
    }
}

/// The name under which `children::resolve` finds the document `path` included by `parent`
/// among the request's files.
fn include_key(parent: &str, path: &str) -> String {
    let dir = parent.rfind('/').map_or("", |i| &parent[..i]);
    if path.starts_with('/') || dir.is_empty() {
        children::normalize(path)
    } else {
        children::normalize(&format!("{dir}/{path}"))
    }
}

/// The state of an instance that does not exist yet.
fn empty_state(name: &str) -> InstanceState {
    let t = crate::state::Timestamp::from_millis(0);
    InstanceState {
        instance: crate::state::Instance {
            id: String::new(),
            name: name.to_owned(),
            status: InstanceStatus::New,
            version: 0,
            last_seq: 0,
            pruned_through: 0,
            lease_epoch: 0,
            lease: None,
            created_at: t,
            updated_at: t,
            environment: Json::Null,
        },
        resources: Vec::new(),
        links: Vec::new(),
        children: Vec::new(),
        exports: Vec::new(),
    }
}

pub(crate) fn view(cs: ChangeSet, instance_name: String) -> ChangeSetView {
    // A body this engine cannot read still shows as a change set (its id, status, summary);
    // executing it says why it cannot run.
    let (plan, diagnostics) = match crate::body::decode_plan(&cs.body) {
        Ok(read) => read,
        Err(e) => {
            tracing::warn!(change_set = %cs.id, error = %e, "change set body not readable");
            (Plan::default(), Vec::new())
        }
    };
    ChangeSetView {
        change_set: cs,
        instance_name,
        plan,
        diagnostics,
    }
}

impl Engine {
    pub(crate) async fn instance_named(&self, name: &str) -> Result<crate::state::Instance> {
        self.store
            .find_instance(name)
            .await?
            .ok_or_else(|| EngineError::NotFound(format!("instance `{name}` not found")))
    }

    /// Plans `source` against `instance`. With a `request_id`, a retry of the same request
    /// (same instance, documents and variables) returns the change set the first one recorded
    /// and plans nothing; the id with another request is `AlreadyExists`. Without one, every
    /// call records a new change set.
    pub async fn create_change_set(
        self: &Arc<Self>,
        request_id: &str,
        instance: &str,
        source: Source,
        variables: Vec<(String, String)>,
        environment: settings::Environment,
    ) -> Result<ChangeSetView> {
        if let Some(why) = names::instance_name_problem(instance) {
            return Err(EngineError::InvalidArgument(why));
        }
        let key = (!request_id.is_empty()).then(|| RequestKey {
            id: request_id.to_owned(),
            digest: plan_request_digest(instance, &source, &variables, &environment),
        });
        // Identical requests arriving together take turns: the second finds the first's
        // change set instead of planning again. Keyed apart from operations' ids.
        let ticket = key
            .as_ref()
            .map(|_| self.starting(&format!("plan\u{0}{request_id}")));
        let _one_at_a_time = match &ticket {
            Some(t) => Some(t.lock.lock().await),
            None => None,
        };
        if let Some(key) = &key
            && let Some(cs) = self.store.find_change_set(key).await?
        {
            let inst = self.store.get_instance(&cs.instance_id).await?;
            return Ok(view(cs, inst.name));
        }
        let injectors = self.config.settings.injectors.clone();
        self.create_change_set_in(
            instance,
            source,
            variables,
            (environment, injectors),
            Vec::new(),
            None,
            key,
        )
        .await
    }

    /// [`Engine::create_change_set`] for a child blueprint included by `include_chain`, on its
    /// parent's clock (`now`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn create_change_set_in(
        self: &Arc<Self>,
        instance: &str,
        source: Source,
        variables: Vec<(String, String)>,
        (environment, engine_injectors): (settings::Environment, IndexMap<String, Json>),
        include_chain: Vec<String>,
        now: Option<i128>,
        request: Option<RequestKey>,
    ) -> Result<ChangeSetView> {
        if instance.is_empty() {
            return Err(EngineError::InvalidArgument(
                "an instance name is required".into(),
            ));
        }
        let (files, assets) = self.read_source(source)?;
        let mut inputs = Inputs {
            files,
            variables,
            now_unix_nanos: now.unwrap_or_else(now_nanos),
            include_chain,
            environment,
            engine_injectors,
            assets,
        };
        // A new instance is planned from empty state and recorded only with its first change
        // set: a blueprint that fails to plan leaves no instance behind.
        let existing = self.store.find_instance(instance).await?;
        let current = match &existing {
            Some(i) => self.store.load_state(&i.id).await?,
            None => empty_state(instance),
        };
        // The version of the very snapshot the plan reads: execution requires it unchanged.
        let planned_version = current.instance.version;
        let max = self.config.request_limits();
        let cwd = self.config.cwd.display().to_string();
        let planned_inputs = inputs.clone();
        let name = instance.to_owned();
        let planned = self
            .with_plugins(move |engine, plugins| {
                let failed = |error: PlanFailure| Planned {
                    error: Some(error),
                    ..Planned::default()
                };
                let (plugins, _held) =
                    match engine.request_plugins(&planned_inputs.environment, plugins) {
                        Ok(p) => p,
                        Err(e) => return failed(e.to_string().into()),
                    };
                let plugins = &plugins;
                let mut prepared = prepare::prepare(&planned_inputs, max, plugins, &cwd);
                if prepared.diags.has_errors() {
                    return failed(PlanFailure::invalid("", &prepared));
                }
                prepared.read_links(&current);
                // The children are planned first, each against its own instance: the exports
                // they will have, where known, feed the parent's resources and the children
                // after them.
                let children = match engine.plan_children(
                    &name,
                    &mut prepared,
                    &planned_inputs,
                    &current,
                    plugins,
                ) {
                    Ok(c) => c,
                    Err(e) => return failed(e),
                };
                let mut plan = plan::plan(&mut prepared, &current, &plugins.manifests, plugins);
                // Providers that plan say what the engine cannot know (docs/plugin-protocol.md).
                crate::provider_plan::consult(&mut plan, &mut prepared, &current, plugins);
                if prepared.diags.has_errors() {
                    return failed(PlanFailure::invalid("", &prepared));
                }
                plan.children = children.children;
                Planned {
                    datasources: prepared.datasources_json(),
                    diagnostics: prepared.diagnostics_json(),
                    plan,
                    error: None,
                    prepared: Some(prepared),
                    files: children.files,
                }
            })
            .await?;
        if let Some(failure) = planned.error {
            return Err(failure.into());
        }
        let Planned {
            plan,
            diagnostics,
            datasources,
            prepared,
            files,
            ..
        } = planned;
        // Included documents read from this host are part of what was planned: the digest
        // covers them and execution reads them from the change set.
        inputs.files.extend(files);
        let inst = match existing {
            Some(i) => i,
            None => match self.store.create_instance(instance).await {
                Ok(i) => i,
                // Created meanwhile by a concurrent plan (at version 0 still, or this plan
                // is stale at execution, as it should be).
                Err(StateError::Conflict(Conflict::NameTaken { .. })) => {
                    self.instance_named(instance).await?
                }
                Err(e) => return Err(e.into()),
            },
        };
        // What the plan's data sources returned: execution uses exactly these.
        let body = crate::body::encode(&inputs, &plan, datasources, diagnostics.clone());
        let cs = self
            .store
            .create_change_set(NewChangeSet {
                instance_id: inst.id.clone(),
                planned_version,
                digest: inputs.digest(),
                body,
                request,
            })
            .await?;
        if let Some(prepared) = prepared {
            *self.last_planned.lock().unwrap_or_else(|e| e.into_inner()) = Some(LastPlanned {
                change_set_id: cs.id.clone(),
                inputs,
                plan: plan.clone(),
                prepared,
            });
        }
        Ok(ChangeSetView {
            change_set: cs,
            instance_name: inst.name,
            plan,
            diagnostics,
        })
    }

    /// Plans every include of `prepared` against its own instance (`<parent>/<name>`), in
    /// dependency order, and the children `current` has that the blueprint no longer includes
    /// (deleted). Records the exports the plan knows of each child in `prepared` and evaluates
    /// the parent's resources again with them.
    fn plan_children(
        &self,
        parent: &str,
        prepared: &mut Prepared,
        inputs: &Inputs,
        current: &InstanceState,
        plugins: &PluginContext<'_>,
    ) -> std::result::Result<PlannedChildren, PlanFailure> {
        let mut out = PlannedChildren::default();
        if prepared.blueprint.include.is_empty() && current.children.is_empty() {
            return Ok(out);
        }
        let parent_file = inputs
            .files
            .first()
            .map(|f| f.0.clone())
            .unwrap_or_default();
        let mut chain = inputs.include_chain.clone();
        chain.push(children::normalize(&parent_file));
        // The request's documents and those read while planning, for the children's includes.
        let mut files = inputs.files.clone();
        for i in prepared.include_order() {
            let name = prepared.blueprint.include[i].name.value.clone();
            let instance = format!("{parent}/{name}");
            let state = self.child_state(&instance)?;
            let at = plan::include_at_plan(prepared, i, plugins)?;
            let Some(path) = at.path.clone() else {
                out.children.push(deferred_child(
                    &name,
                    &state,
                    at.unknown,
                    "its path is known only after deploy".into(),
                ));
                continue;
            };
            if chain.len() > children::MAX_DEPTH {
                return Err(format!(
                    "include `{name}`: includes nest deeper than {} levels ({})",
                    children::MAX_DEPTH,
                    chain.join(" -> ")
                )
                .into());
            }
            let (file, content) = children::resolve(
                &parent_file,
                &path,
                &files,
                &self.config.allowed_roots,
                self.config.max_input_size,
                // On a blocking thread: wait for the fetch on the runtime.
                &|url| self.rt.block_on(self.config.remote_includes.fetch(url)),
            )
            .map_err(|e| format!("include `{name}`: {e}"))?;
            // Read from this host or fetched: kept under the name execution looks it up by,
            // so execution deploys the very document planned.
            let file = if files.iter().any(|(n, _)| *n == file) {
                file
            } else if remote::is_remote(&file) {
                files.push((file.clone(), content.clone()));
                out.files.push((file.clone(), content.clone()));
                file
            } else {
                let key = include_key(&parent_file, &path);
                files.push((key.clone(), content.clone()));
                out.files.push((key.clone(), content.clone()));
                key
            };
            let key = children::normalize(&file);
            if chain.contains(&key) {
                return Err(format!(
                    "include `{name}`: an include cycle: {} -> {key}",
                    chain.join(" -> ")
                )
                .into());
            }
            let declared = plan::child_variables(&file, &content, self.config.max_input_size)
                .unwrap_or_default();
            let include = &prepared.blueprint.include[i];
            if let Some(d) = plan::undeclared_child_variable(include, &file, &declared)
                .or_else(|| plan::mistyped_child_variable(include, &file, &declared, &at))
            {
                prepared.diags.push(d);
                return Err(PlanFailure::invalid("", prepared));
            }
            let child = ChildInputs {
                name: &name,
                instance: &instance,
                file,
                content,
                declared,
                variables: at.variables,
                unknown: at.unknown,
                chain: chain.clone(),
                now: inputs.now_unix_nanos,
                settings: (&inputs.environment, &inputs.engine_injectors),
                assets: &inputs.assets,
            };
            let found = out.files.len();
            let planned = self.plan_child(child, &files, &state, plugins, &mut out.files)?;
            files.extend(out.files[found..].iter().cloned());
            if planned.deferred.is_empty() {
                prepared.set_child_exports(
                    &name,
                    planned.known_exports(),
                    planned.secret_exports(),
                );
            }
            out.children.push(planned);
        }
        for c in &current.children {
            if prepared
                .blueprint
                .include
                .iter()
                .any(|i| i.name.value == c.name)
            {
                continue;
            }
            let state = self
                .rt
                .block_on(self.store.load_state(&c.child_instance_id))
                .map_err(|e| format!("child `{}`: {e}", c.name))?;
            out.children.push(self.plan_deleted_child(&c.name, &state)?);
        }
        if !prepared.blueprint.include.is_empty() {
            // The parent's resources read the children's exports known now.
            for idx in prepared.order.clone() {
                let found = prepared.reevaluate(idx, plugins);
                prepared.diags.extend(found);
            }
        }
        Ok(out)
    }

    /// Plans one child against its instance's state; its own children first.
    fn plan_child(
        &self,
        child: ChildInputs<'_>,
        files: &[(String, Vec<u8>)],
        state: &InstanceState,
        plugins: &PluginContext<'_>,
        read: &mut Vec<(String, Vec<u8>)>,
    ) -> std::result::Result<plan::ChildPlan, PlanFailure> {
        let ChildInputs {
            name,
            instance,
            file,
            content,
            mut variables,
            unknown,
            declared,
            chain,
            now,
            settings,
            assets,
        } = child;
        let max = self.config.request_limits();
        variables.extend(plan::placeholder_variables(&declared, &unknown));
        let key = children::normalize(&file);
        let mut child_files = vec![(file, content)];
        child_files.extend(
            files
                .iter()
                .filter(|(n, _)| children::normalize(n) != key)
                .cloned(),
        );
        let inputs = Inputs {
            files: child_files,
            variables,
            now_unix_nanos: now,
            include_chain: chain,
            environment: settings.0.clone(),
            engine_injectors: settings.1.clone(),
            assets: assets.clone(),
        };
        let cwd = self.config.cwd.display().to_string();
        let mut prepared = prepare::prepare(&inputs, max, plugins, &cwd);
        // With stand-ins for unknown variables, a child may not evaluate (a data source
        // filter, a function): its changes are then worked out at deploy.
        let unknown_note = || {
            format!(
                "{} known only after deploy",
                unknown
                    .iter()
                    .map(|u| format!("`{u}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
                    + if unknown.len() == 1 { " is" } else { " are" }
            )
        };
        if prepared.diags.has_errors() {
            if !unknown.is_empty() {
                return Ok(deferred_child(name, state, unknown.clone(), unknown_note()));
            }
            return Err(PlanFailure::invalid(
                &format!("child `{instance}`: "),
                &prepared,
            ));
        }
        plan::forget_variables(&mut prepared, &unknown, plugins);
        prepared.read_links(state);
        let nested = self.plan_children(instance, &mut prepared, &inputs, state, plugins)?;
        read.extend(nested.files);
        let mut planned = plan::plan(&mut prepared, state, &plugins.manifests, plugins);
        crate::provider_plan::consult(&mut planned, &mut prepared, state, plugins);
        if prepared.diags.has_errors() {
            if !unknown.is_empty() {
                return Ok(deferred_child(name, state, unknown.clone(), unknown_note()));
            }
            return Err(PlanFailure::invalid(
                &format!("child `{instance}`: "),
                &prepared,
            ));
        }
        planned.children = nested.children;
        let exports = plan::planned_exports(&mut prepared, &planned, state, plugins);
        Ok(plan::ChildPlan {
            name: name.to_owned(),
            instance: instance.to_owned(),
            action: plan::child_action(plan::deployed(state), &planned, &exports),
            planned_version: state.instance.version,
            plan: planned,
            exports,
            unknown_variables: unknown,
            deferred: String::new(),
            diagnostics: prepared.diagnostics_json(),
        })
    }

    /// The plan of a child no longer included, and of its own children.
    fn plan_deleted_child(
        &self,
        name: &str,
        state: &InstanceState,
    ) -> std::result::Result<plan::ChildPlan, String> {
        let mut nested = Vec::new();
        for c in state.children.iter().rev() {
            let s = self
                .rt
                .block_on(self.store.load_state(&c.child_instance_id))
                .map_err(|e| format!("child `{}`: {e}", c.name))?;
            nested.push(self.plan_deleted_child(&c.name, &s)?);
        }
        Ok(plan::deleted_child(name, state, nested))
    }

    /// A child instance's state; an empty new instance when there is none yet.
    pub(crate) fn child_state(&self, instance: &str) -> std::result::Result<InstanceState, String> {
        let found = self
            .rt
            .block_on(self.store.find_instance(instance))
            .map_err(|e| format!("child `{instance}`: {e}"))?;
        match found {
            Some(i) => self
                .rt
                .block_on(self.store.load_state(&i.id))
                .map_err(|e| format!("child `{instance}`: {e}")),
            None => Ok(empty_state(instance)),
        }
    }

    pub async fn get_change_set(&self, id: &str) -> Result<ChangeSetView> {
        let cs = self.store.get_change_set(id).await?;
        let inst = self.store.get_instance(&cs.instance_id).await?;
        Ok(view(cs, inst.name))
    }

    pub async fn list_change_sets(&self, instance: &str) -> Result<Vec<ChangeSetView>> {
        let inst = self.instance_named(instance).await?;
        Ok(self
            .store
            .list_change_sets(&inst.id)
            .await?
            .into_iter()
            .map(|cs| view(cs, inst.name.clone()))
            .collect())
    }
}
