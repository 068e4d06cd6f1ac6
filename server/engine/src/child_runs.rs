//! Children at deploy time: each include deployed, rolled back or destroyed as an instance
//! of its own, under its parent's operation.

use super::*;

/// A child deployed by its parent's operation.
struct ChildRun {
    instance_id: String,
    /// Its change set changed something.
    changed: bool,
    exports: indexmap::IndexMap<String, crate::eval::value::Value>,
    /// The names of the exports it stored marked sensitive.
    secret_exports: Vec<String>,
}

/// A child instance must be at the version the parent's plan read: otherwise what the plan
/// showed (and what the parent's plan relied on) may no longer hold.
fn check_child_version(
    planned: &plan::ChildPlan,
    state: &InstanceState,
) -> std::result::Result<(), String> {
    if planned.planned_version == state.instance.version {
        Ok(())
    } else {
        Err(format!(
            "child `{}` changed since the change set was planned (version {} then, {} now); \
             plan again",
            planned.instance, planned.planned_version, state.instance.version
        ))
    }
}

/// The exports a child ended with must be those its plan knew: the parent's plan (what it
/// left unchanged) relied on them.
fn check_child_exports(
    planned: &plan::ChildPlan,
    exports: &indexmap::IndexMap<String, crate::eval::value::Value>,
) -> std::result::Result<(), String> {
    for e in &planned.exports {
        let Some(diff::Shown::Value(expected)) = &e.new else {
            continue;
        };
        let actual = exports.get(&e.name).map(state_values::eval_to_json);
        if actual.as_ref() != Some(expected) && e.sensitive {
            // The error is stored and shown: a secret's values are not quoted.
            return Err(format!(
                "child `{}`: export `{}` (sensitive) is not what its plan expected after its \
                 deploy; plan again",
                planned.instance, e.name
            ));
        }
        if actual.as_ref() != Some(expected) {
            return Err(format!(
                "child `{}`: export `{}` is {} after its deploy, not {expected} as planned; plan \
                 again",
                planned.instance,
                e.name,
                actual.map_or_else(|| "missing".to_owned(), |a| a.to_string())
            ));
        }
    }
    Ok(())
}

/// How to undo what a deploy did to one child when it rolls back.
#[derive(Clone, Debug)]
pub(crate) enum ChildUndo {
    /// Created by the operation: destroyed.
    Destroy { name: String, instance: String },
    /// Updated (or destroyed as no longer included) by the operation: deployed again from
    /// the inputs of its last successful deploy before it (`None`: there is none, so it is
    /// destroyed).
    Restore {
        name: String,
        instance: String,
        instance_id: String,
        previous: Option<Box<Inputs>>,
    },
}

impl Engine {
    /// Undoes what a deploy did to its children, the last first: a child it created is
    /// destroyed, one it updated or destroyed is deployed again from its previous inputs.
    /// Each outcome is a `child.rolled_back` event of the parent. Returns the first error.
    pub(crate) fn roll_back_children(
        self: &Arc<Self>,
        ctx: &Arc<RunContext>,
        undo: &[ChildUndo],
    ) -> std::result::Result<(), String> {
        let mut first_error = None;
        for u in undo.iter().rev() {
            let (name, instance, result) = match u {
                ChildUndo::Destroy { name, instance } => (
                    name,
                    instance,
                    self.destroy_child_instance(ctx, name, instance, "rollback")
                        .map(|()| ("destroyed", "created by the failed operation")),
                ),
                ChildUndo::Restore {
                    name,
                    instance,
                    previous: None,
                    ..
                } => (
                    name,
                    instance,
                    self.destroy_child_instance(ctx, name, instance, "rollback")
                        .map(|()| ("destroyed", "no earlier successful deploy is recorded")),
                ),
                ChildUndo::Restore {
                    name,
                    instance,
                    instance_id,
                    previous: Some(inputs),
                } => (
                    name,
                    instance,
                    self.restore_child(ctx, name, instance, instance_id, inputs)
                        .map(|()| ("restored", "deployed again as it was before the operation")),
                ),
            };
            let payload = match &result {
                Ok((status, why)) => json!({
                    "child": name, "instance": instance, "status": status,
                    "reason": format!("{instance}: {why}"),
                }),
                Err(e) => json!({
                    "child": name, "instance": instance, "status": "failed", "error": e,
                }),
            };
            let _ = ctx.commit_blocking(vec![], vec![NewEvent::new("child.rolled_back", payload)]);
            if let Err(e) = result {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Destroys a child's instance and forgets it in the parent (if the parent records it).
    fn destroy_child_instance(
        self: &Arc<Self>,
        ctx: &Arc<RunContext>,
        name: &str,
        instance: &str,
        why: &str,
    ) -> std::result::Result<(), String> {
        let request = format!("{}:{why}:destroy:{instance}", ctx.operation.id);
        let op = ctx
            .rt
            .block_on(async {
                let op = self.destroy(&request, instance).await?;
                self.wait_operation(&op.id).await
            })
            .map_err(|e| format!("child `{instance}`: {e}"))?;
        if op.status != OperationStatus::Succeeded {
            return Err(format!(
                "child `{instance}` {}: {}",
                op.status,
                op.error.unwrap_or_default()
            ));
        }
        self.forget_child(ctx, name)
    }

    /// Removes the parent's record of child `name`, if it has one.
    fn forget_child(&self, ctx: &RunContext, name: &str) -> std::result::Result<(), String> {
        let state = ctx
            .rt
            .block_on(self.store.load_state(&ctx.operation.instance_id))
            .map_err(|e| e.to_string())?;
        if state.children.iter().any(|c| c.name == name) {
            ctx.commit_blocking(
                vec![Change::RemoveChild {
                    name: name.to_owned(),
                }],
                vec![],
            )
            .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Deploys a child again from recorded inputs (its last successful deploy's) and records
    /// it in the parent.
    fn restore_child(
        self: &Arc<Self>,
        ctx: &Arc<RunContext>,
        name: &str,
        instance: &str,
        instance_id: &str,
        inputs: &Inputs,
    ) -> std::result::Result<(), String> {
        let what = |e: EngineError| format!("child `{instance}`: {e}");
        let mut files = inputs.files.clone();
        if files.is_empty() {
            return Err(format!(
                "child `{instance}`: its previous inputs hold no document"
            ));
        }
        let (file_name, content) = files.remove(0);
        let source = Source::Inline {
            file_name,
            content,
            children: files,
            assets: inputs.assets.clone(),
        };
        let request = format!("{}:rollback:restore:{instance}", ctx.operation.id);
        let op = ctx
            .rt
            .block_on(async {
                let cs = self
                    .create_change_set_in(
                        instance,
                        source,
                        inputs.variables.clone(),
                        (inputs.environment.clone(), inputs.engine_injectors.clone()),
                        inputs.include_chain.clone(),
                        Some(inputs.now_unix_nanos),
                        None,
                    )
                    .await?;
                let op = self.execute(&request, &cs.change_set.id, false).await?;
                self.wait_operation(&op.id).await
            })
            .map_err(what)?;
        if op.status != OperationStatus::Succeeded {
            return Err(format!(
                "child `{instance}` {}: {}",
                op.status,
                op.error.unwrap_or_default()
            ));
        }
        ctx.commit_blocking(
            vec![Change::PutChild {
                name: name.to_owned(),
                child_instance_id: instance_id.to_owned(),
            }],
            vec![],
        )
        .map_err(|e| e.to_string())?;
        Ok(())
    }

    /// The inputs of a child's last successful deploy (its newest executed change set), `None`
    /// when it has none. An error when they cannot be read: a rollback would otherwise take
    /// "none" for an answer and destroy the child.
    fn last_deployed_inputs(
        &self,
        ctx: &RunContext,
        instance_id: &str,
    ) -> std::result::Result<Option<Box<Inputs>>, String> {
        let sets = ctx
            .rt
            .block_on(self.store.list_change_sets(instance_id))
            .map_err(|e| format!("state store: {e}"))?;
        sets.iter()
            .rev()
            .find(|cs| cs.status == ChangeSetStatus::Executed)
            .map(|cs| {
                crate::body::decode_inputs(&cs.body)
                    .map(Box::new)
                    .map_err(|e| format!("change set {}: {e}", cs.id))
            })
            .transpose()
    }

    /// Plans and executes every include as an instance of its own (`<parent>/<name>`), in
    /// dependency order, records its exports for the parent's evaluation, and destroys the
    /// children the blueprint no longer includes. Returns the parent's child records to write;
    /// `undo` gets how to undo each child this did something to, in order (for a rollback;
    /// with `rollback`, a failing child also rolls itself back).
    ///
    /// A child whose instance changed since `planned` read it is refused (the parent's change
    /// set is stale), and so is a child whose exports differ from what the plan knew of them
    /// (the parent's plan relied on them).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn deploy_children(
        self: &Arc<Self>,
        ctx: &Arc<RunContext>,
        prepared: &mut Prepared,
        inputs: &Inputs,
        planned: &[plan::ChildPlan],
        before: &InstanceState,
        plugins: &PluginContext<'_>,
        rollback: bool,
        undo: &mut Vec<ChildUndo>,
    ) -> std::result::Result<Vec<Change>, String> {
        // Nothing is deployed when the plan is stale for any child.
        for p in planned {
            check_child_version(p, &self.child_state(&p.instance)?)?;
        }
        let parent = before.instance.name.clone();
        let parent_file = inputs
            .files
            .first()
            .map(|f| f.0.clone())
            .unwrap_or_default();
        let mut chain = inputs.include_chain.clone();
        chain.push(children::normalize(&parent_file));
        let mut changes = Vec::new();
        for i in prepared.include_order() {
            let name = prepared.blueprint.include[i].name.value.clone();
            let (path, variables) = prepared.include_inputs(i, plugins)?;
            if chain.len() > children::MAX_DEPTH {
                return Err(format!(
                    "include `{name}`: includes nest deeper than {} levels ({})",
                    children::MAX_DEPTH,
                    chain.join(" -> ")
                ));
            }
            let (file, content) = children::resolve(
                &parent_file,
                &path,
                &inputs.files,
                &self.config.allowed_roots,
                self.config.max_input_size,
                // On the operation's blocking thread: wait for the fetch on the runtime.
                &|url| ctx.rt.block_on(self.config.remote_includes.fetch(url)),
            )
            .map_err(|e| format!("include `{name}`: {e}"))?;
            let key = children::normalize(&file);
            if chain.contains(&key) {
                return Err(format!(
                    "include `{name}`: an include cycle: {} -> {key}",
                    chain.join(" -> ")
                ));
            }
            // The child sees every file of the request, so its own includes resolve too.
            let others: Vec<(String, Vec<u8>)> = inputs
                .files
                .iter()
                .filter(|(n, _)| children::normalize(n) != key)
                .cloned()
                .collect();
            let instance = format!("{parent}/{name}");
            let source = Source::Inline {
                file_name: file,
                content,
                children: others,
                assets: inputs.assets.clone(),
            };
            let child_plan = planned.iter().find(|c| c.name == name);
            let state = self.child_state(&instance)?;
            if let Some(p) = child_plan {
                check_child_version(p, &state)?;
            }
            // What a rollback would go back to: captured before the child changes.
            let previous = if plan::deployed(&state) {
                Some(self.last_deployed_inputs(ctx, &state.instance.id)?)
            } else {
                None
            };
            let run = ctx.rt.block_on(self.run_child(
                ctx,
                &instance,
                source,
                variables,
                (inputs.environment.clone(), inputs.engine_injectors.clone()),
                chain.clone(),
                inputs.now_unix_nanos,
                rollback,
            ))?;
            match previous {
                None => undo.push(ChildUndo::Destroy {
                    name: name.clone(),
                    instance: instance.clone(),
                }),
                Some(previous) if run.changed => undo.push(ChildUndo::Restore {
                    name: name.clone(),
                    instance: instance.clone(),
                    instance_id: run.instance_id.clone(),
                    previous,
                }),
                Some(_) => {}
            }
            if let Some(p) = child_plan {
                check_child_exports(p, &run.exports)?;
            }
            prepared.set_child_exports(&name, run.exports, run.secret_exports);
            changes.push(Change::PutChild {
                name,
                child_instance_id: run.instance_id,
            });
        }
        let gone: Vec<String> = before
            .children
            .iter()
            .filter(|c| {
                !prepared
                    .blueprint
                    .include
                    .iter()
                    .any(|i| i.name.value == c.name)
            })
            .map(|c| c.name.clone())
            .collect();
        if !gone.is_empty() {
            for c in before.children.iter().filter(|c| gone.contains(&c.name)) {
                let state = ctx
                    .rt
                    .block_on(self.store.load_state(&c.child_instance_id))
                    .map_err(|e| format!("child `{}`: {e}", c.name))?;
                if let Some(p) = planned.iter().find(|p| p.name == c.name) {
                    check_child_version(p, &state)?;
                }
                undo.push(ChildUndo::Restore {
                    name: c.name.clone(),
                    instance: state.instance.name.clone(),
                    instance_id: c.child_instance_id.clone(),
                    previous: self.last_deployed_inputs(ctx, &c.child_instance_id)?,
                });
            }
            self.destroy_children(ctx, before, &gone)?;
        }
        Ok(changes)
    }

    /// Plans and executes one child (on its parent's clock `now`; with `rollback`, a failure
    /// rolls the child back); its exports once it is deployed.
    #[allow(clippy::too_many_arguments)]
    async fn run_child(
        self: &Arc<Self>,
        ctx: &RunContext,
        instance: &str,
        source: Source,
        variables: Vec<(String, String)>,
        settings: (settings::Environment, IndexMap<String, Json>),
        chain: Vec<String>,
        now: i128,
        rollback: bool,
    ) -> std::result::Result<ChildRun, String> {
        let what = |e: EngineError| format!("child `{instance}`: {e}");
        let cs = self
            .create_change_set_in(
                instance,
                source,
                variables,
                settings,
                chain,
                Some(now),
                None,
            )
            .await
            .map_err(what)?;
        let request = format!("{}:{instance}", ctx.operation.id);
        let op = self
            .execute(&request, &cs.change_set.id, rollback)
            .await
            .map_err(what)?;
        let op = self.wait_operation(&op.id).await.map_err(what)?;
        if op.status != OperationStatus::Succeeded {
            return Err(format!(
                "child `{instance}` {}: {}",
                op.status,
                op.error.unwrap_or_default()
            ));
        }
        let state = self
            .store
            .load_state(&op.instance_id)
            .await
            .map_err(|e| e.to_string())?;
        Ok(ChildRun {
            instance_id: op.instance_id.clone(),
            changed: !cs.plan.is_empty(),
            exports: state
                .exports
                .iter()
                .map(|e| {
                    (
                        e.name.clone(),
                        crate::eval::value::Value::from_json(&state_values::unwrap(&e.value)),
                    )
                })
                .collect(),
            secret_exports: state
                .exports
                .iter()
                .filter(|e| state_values::holds_secret(&e.value))
                .map(|e| e.name.clone())
                .collect(),
        })
    }

    /// Destroys the named children's instances (and forgets them in the parent), the last
    /// deployed first: children were recorded in dependency order, so a child that reads
    /// another goes before it.
    pub(crate) fn destroy_children(
        self: &Arc<Self>,
        ctx: &Arc<RunContext>,
        state: &InstanceState,
        names: &[String],
    ) -> std::result::Result<(), String> {
        for c in state
            .children
            .iter()
            .rev()
            .filter(|c| names.contains(&c.name))
        {
            let child = ctx
                .rt
                .block_on(self.store.get_instance(&c.child_instance_id))
                .map_err(|e| e.to_string())?;
            let request = format!("{}:destroy:{}", ctx.operation.id, child.name);
            let result = ctx.rt.block_on(async {
                let op = self.destroy(&request, &child.name).await?;
                self.wait_operation(&op.id).await
            });
            match result {
                Ok(op) if op.status == OperationStatus::Succeeded => {}
                Ok(op) => {
                    return Err(format!(
                        "child `{}` {}: {}",
                        child.name,
                        op.status,
                        op.error.unwrap_or_default()
                    ));
                }
                Err(e) => return Err(format!("child `{}`: {e}", child.name)),
            }
            ctx.commit_blocking(
                vec![Change::RemoveChild {
                    name: c.name.clone(),
                }],
                vec![NewEvent::new(
                    "child.destroyed",
                    json!({ "child": c.name, "instance": child.name }),
                )],
            )
            .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}
