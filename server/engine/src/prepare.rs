//! From request inputs to an evaluated blueprint: read the documents, validate them with the
//! providers' manifests, evaluate variables, values and resources, and work out which resource
//! waits for which. Runs on a blocking thread: plugin calls (validation, provider functions)
//! block on the engine's runtime.

use crate::blueprint::Blueprint;
use crate::check::{self, PluginContext};
use crate::diag::{Diagnostic, Diagnostics, Severity};
use crate::eval::blueprint::{DataSourceFetcher, Evaluation, evaluate_with, reevaluate};
use crate::eval::functions::Env;
use crate::eval::limits::Limits;
use crate::eval::value::Value;
use crate::settings::{self, Environment};
use crate::source::SourceMap;
use crate::validate::refs::{Graph, NodeRef};
use indexmap::IndexMap;

/// The exact inputs of a plan: the documents (the root blueprint first) and the variables as
/// given. The change set keeps them, so executing it evaluates exactly what was planned.
#[derive(Clone, Debug, PartialEq)]
pub struct Inputs {
    pub files: Vec<(String, Vec<u8>)>,
    pub variables: Vec<(String, String)>,
    /// The clock the plan read (`now()`, `datetime`), reused at execution.
    pub now_unix_nanos: i128,
    /// For a child blueprint: the documents of the parents that include it, outermost first
    /// (include cycles are refused).
    pub include_chain: Vec<String>,
    /// The request's environment (its children inherit it).
    pub environment: Environment,
    /// The engine config's property injectors when the plan was made: execution evaluates
    /// what was planned even if the engine's config changed since.
    pub engine_injectors: IndexMap<String, serde_json::Value>,
    /// The local assets the request carried, by path (as `InlineBlueprint.assets` keys them):
    /// their digests. The engine keeps their content (`assets::Store`).
    pub assets: IndexMap<String, String>,
}

impl Inputs {
    /// sha256 over the documents and variables, each length-prefixed so no two different inputs
    /// hash alike.
    pub fn digest(&self) -> String {
        let mut parts: Vec<&[u8]> = Vec::with_capacity(2 * self.files.len() + 1);
        for (name, content) in &self.files {
            parts.extend([name.as_bytes(), content.as_slice()]);
        }
        parts.push(b"--variables--");
        for (k, v) in &self.variables {
            parts.extend([k.as_bytes(), v.as_bytes()]);
        }
        // Settings only count when given, so the digests of plans without them are unchanged.
        let settings =
            (!self.environment.is_empty() || !self.engine_injectors.is_empty()).then(|| {
                serde_json::json!({
                    "environment": self.environment.to_json(),
                    "engineInjectors": self.engine_injectors,
                })
                .to_string()
            });
        if let Some(s) = &settings {
            parts.extend([b"--settings--".as_slice(), s.as_bytes()]);
        }
        // Likewise assets: a plan without them keeps its digest.
        if !self.assets.is_empty() {
            parts.push(b"--assets--");
            for (path, digest) in &self.assets {
                parts.extend([path.as_bytes(), digest.as_bytes()]);
            }
        }
        format!("sha256:{}", trellis_ids::digest(&parts))
    }
}

/// A validated, evaluated blueprint.
pub struct Prepared {
    pub sources: SourceMap,
    pub blueprint: Blueprint,
    pub graph: Graph,
    pub evaluation: Evaluation,
    pub diags: Diagnostics,
    /// For each entry of `evaluation.resources`: the entries it waits for (references, also
    /// through values, and `dependsOn`), in declaration order.
    pub deps: Vec<Vec<usize>>,
    /// `evaluation.resources` indexes in an order where dependencies come first.
    pub order: Vec<usize>,
    pub cwd: String,
    pub now_unix_nanos: i128,
    /// Entry of `evaluation.resources` by name.
    by_name: std::collections::HashMap<String, usize>,
    /// Template in `blueprint.resources` by name.
    templates: std::collections::HashMap<String, usize>,
    /// The links the blueprint selects.
    pub links: Vec<super::links::WantedLink>,
    /// Link data recorded in state, by (resource A, resource B): what `${link(a, b)}` reads.
    pub link_data: std::collections::HashMap<(String, String), Value>,
    /// The spec fields property injectors set, by resource template.
    pub injected: Vec<crate::inject::Injected>,
    /// The resources `transform:` generated, with the abstract resource each came from.
    pub derivations: Vec<crate::transform::Derivation>,
    /// The inputs' local assets (path → digest) and document names (the root first): every
    /// evaluation of a resource rewrites its asset fields from them (`assets::resolve`).
    assets: IndexMap<String, String>,
    documents: Vec<String>,
    /// The `local_asset` field paths of each resource type met so far.
    asset_fields: std::collections::HashMap<String, Vec<Vec<String>>>,
    /// Local assets the blueprint names that the inputs lack (a client sends them and plans
    /// again).
    pub missing_assets: Vec<String>,
}

impl Prepared {
    /// The fetched data sources' exports, for the change set body.
    pub fn datasources_json(&self) -> serde_json::Map<String, serde_json::Value> {
        self.evaluation
            .datasources
            .iter()
            .map(|(name, exports)| {
                let fields = exports
                    .iter()
                    .map(|(k, v)| (k.clone(), super::state_values::eval_to_json(v)))
                    .collect();
                (name.clone(), serde_json::Value::Object(fields))
            })
            .collect()
    }

    /// Diagnostics in the engine API's flat form.
    pub fn diagnostics_json(&self) -> Vec<serde_json::Value> {
        self.diags
            .items
            .iter()
            .map(|d| crate::diag::render_json_value(d, &self.sources))
            .collect()
    }

    /// The errors, rendered rustc-style (for a status message).
    pub fn errors_text(&self) -> String {
        self.diags
            .items
            .iter()
            .filter(|d| d.severity == Severity::Error)
            .map(|d| crate::diag::render_text(d, &self.sources))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The resource entry named `name`.
    pub fn find(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// Evaluates resource `idx` again against the states now recorded in the evaluation.
    pub fn reevaluate(&mut self, idx: usize, plugins: &PluginContext<'_>) -> Vec<Diagnostic> {
        let data = std::mem::take(&mut self.link_data);
        let link = |a: &str, b: &str| link_value(&data, a, b);
        let env = Env {
            cwd: &self.cwd,
            now_unix_nanos: self.now_unix_nanos,
            link: &link,
        };
        let mut diags = Diagnostics::default();
        let template = &self.evaluation.resources[idx].template;
        let Some(&t) = self.templates.get(template) else {
            return Vec::new();
        };
        reevaluate(
            &self.blueprint,
            &self.graph,
            &mut self.evaluation,
            idx,
            &self.blueprint.resources[t],
            &env,
            Some(plugins),
            &mut diags,
        );
        self.link_data = data;
        let mut found = diags.items;
        found.extend(self.resolve_assets(idx, plugins));
        found
    }

    /// Rewrites resource entry `idx`'s local asset fields to their asset URIs; diagnostics for
    /// those the inputs lack.
    fn resolve_assets(&mut self, idx: usize, plugins: &PluginContext<'_>) -> Vec<Diagnostic> {
        // The schema walk once per type: this runs before every apply.
        let ty = &self.evaluation.resources[idx].ty;
        let fields = match self.asset_fields.get(ty) {
            Some(f) if f.is_empty() => return Vec::new(),
            Some(f) => f.clone(),
            None => {
                let f = crate::assets::fields_of(&plugins.manifests, ty);
                self.asset_fields.insert(ty.clone(), f.clone());
                if f.is_empty() {
                    return Vec::new();
                }
                f
            }
        };
        let assets = std::mem::take(&mut self.assets);
        let documents = std::mem::take(&mut self.documents);
        let (diags, missing) = crate::assets::resolve(self, idx, &assets, &fields, &documents);
        self.assets = assets;
        self.documents = documents;
        for m in missing {
            if !self.missing_assets.contains(&m) {
                self.missing_assets.push(m);
            }
        }
        diags
    }

    /// The `(a, b)` of every `${link(a, b)}` that resource entry `idx` evaluates, in its own
    /// fields or in the values it reads (through other values too), where both resources are
    /// named literally (a bare name or a string). What a resource must wait for before its
    /// spec can be known.
    pub fn link_reads(&self, idx: usize) -> Vec<(String, String)> {
        use crate::subst::{ExprKind, Literal, Template};
        let Some(&t) = self.templates.get(&self.evaluation.resources[idx].template) else {
            return Vec::new();
        };
        let mut templates: Vec<&Template> = Vec::new();
        self.blueprint.resources[t].element_templates(&mut |x| templates.push(x));
        // The values the resource reads, and the values those read.
        let mut seen = vec![false; self.graph.nodes.len()];
        let mut stack = vec![self.graph.index(NodeRef::Resource(t))];
        while let Some(n) = stack.pop() {
            for &(to, _) in &self.graph.edges[n] {
                if let NodeRef::Value(v) = self.graph.nodes[to]
                    && !std::mem::replace(&mut seen[to], true)
                {
                    templates.extend(self.blueprint.values[v].value.as_ref());
                    stack.push(to);
                }
            }
        }
        let mut pairs = Vec::new();
        for template in templates {
            for sub in template.substitutions() {
                sub.expr.walk(&mut |e| {
                    let ExprKind::Call { name, args, .. } = &e.kind else {
                        return;
                    };
                    if name.text != "link" || args.len() != 2 {
                        return;
                    }
                    let named = |i: usize| match &args[i].value.kind {
                        ExprKind::Resource { name, path, .. } if path.is_empty() => {
                            Some(name.text.clone())
                        }
                        ExprKind::Lit(Literal::Str(s)) => Some(s.clone()),
                        _ => None,
                    };
                    if let (Some(a), Some(b)) = (named(0), named(1)) {
                        pairs.push((a, b));
                    }
                });
            }
        }
        pairs
    }

    /// Records the links in `state` for `${link(a, b)}`.
    pub fn read_links(&mut self, state: &crate::state::InstanceState) {
        self.link_data = state
            .links
            .iter()
            .map(|l| {
                (
                    (l.resource_a.clone(), l.resource_b.clone()),
                    super::state_values::to_eval(&super::links::link_data(&l.data)),
                )
            })
            .collect();
    }

    /// Renders diagnostics found after preparation (re-evaluation) as text.
    pub fn render(&self, diags: &[Diagnostic]) -> String {
        diags
            .iter()
            .map(|d| crate::diag::render_text(d, &self.sources))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// How large a request may be: its documents, and what evaluating them may build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestLimits {
    pub max_input_size: usize,
    pub eval: Limits,
}

impl super::EngineConfig {
    /// The limits every request's preparation runs under.
    pub fn request_limits(&self) -> RequestLimits {
        RequestLimits {
            max_input_size: self.max_input_size,
            eval: self.eval_limits,
        }
    }
}

/// Reads, validates and evaluates `inputs`. Errors are in `diags`; evaluation and the graph are
/// meaningful only without them.
pub fn prepare(
    inputs: &Inputs,
    limits: RequestLimits,
    plugins: &PluginContext<'_>,
    cwd: &str,
) -> Prepared {
    prepare_with(inputs, limits, plugins, cwd, None)
}

/// Data source exports a plan fetched, replayed when its change set executes.
pub struct RecordedDataSources<'a> {
    pub exports: IndexMap<String, IndexMap<String, Value>>,
    pub plugins: &'a PluginContext<'a>,
}

impl<'a> RecordedDataSources<'a> {
    /// What a change set body recorded under `datasources` (name -> export -> JSON value).
    pub fn new(
        recorded: &serde_json::Map<String, serde_json::Value>,
        plugins: &'a PluginContext<'a>,
    ) -> Self {
        let as_values = |fields: &serde_json::Value| -> IndexMap<String, Value> {
            fields
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| (k.clone(), Value::from_json(v)))
                .collect()
        };
        let exports = recorded
            .iter()
            .map(|(name, fields)| (name.clone(), as_values(fields)))
            .collect();
        RecordedDataSources { exports, plugins }
    }
}

impl DataSourceFetcher for RecordedDataSources<'_> {
    fn fetch(
        &self,
        data_source_type: &str,
        filters: &[crate::datasource::filter::Filter],
    ) -> Result<Vec<Value>, String> {
        self.plugins.fetch(data_source_type, filters)
    }

    fn recorded(&self, name: &str) -> Option<IndexMap<String, Value>> {
        self.exports.get(name).cloned()
    }
}

/// [`prepare`], with the data source exports a plan recorded (at execution).
pub fn prepare_with(
    inputs: &Inputs,
    limits: RequestLimits,
    plugins: &PluginContext<'_>,
    cwd: &str,
    recorded: Option<&RecordedDataSources<'_>>,
) -> Prepared {
    let mut sources = SourceMap::new();
    let mut diags = Diagnostics::default();
    let (name, bytes) = inputs
        .files
        .first()
        .cloned()
        .unwrap_or_else(|| ("blueprint.yaml".to_owned(), Vec::new()));
    let scopes = settings::injector_scopes(
        &settings::EngineSettings {
            injectors: inputs.engine_injectors.clone(),
            ..Default::default()
        },
        &inputs.environment,
    );
    let additions = check::Additions {
        injectors: &scopes,
        secret_variables: &inputs.environment.secret_variables,
    };
    let checked = check::check_source(
        &mut sources,
        &name,
        bytes,
        &inputs.variables,
        additions,
        limits.max_input_size,
        plugins,
        // Plan reads and checks each child itself (`plan::undeclared_child_variable`).
        &|_| None,
        &mut diags,
    );
    let mut prepared = Prepared {
        sources,
        blueprint: Blueprint::default(),
        graph: Graph::empty(),
        evaluation: Evaluation::default(),
        diags,
        deps: Vec::new(),
        order: Vec::new(),
        cwd: cwd.to_owned(),
        now_unix_nanos: inputs.now_unix_nanos,
        by_name: Default::default(),
        templates: Default::default(),
        links: Vec::new(),
        link_data: Default::default(),
        injected: Vec::new(),
        derivations: Vec::new(),
        assets: inputs.assets.clone(),
        documents: inputs.files.iter().map(|(n, _)| n.clone()).collect(),
        asset_fields: Default::default(),
        missing_assets: Vec::new(),
    };
    let Some(checked) = checked else {
        return prepared;
    };
    prepared.blueprint = checked.blueprint;
    prepared.graph = checked.graph;
    prepared.injected = checked.injected;
    prepared.derivations = checked.derivations;
    if prepared.diags.has_errors() {
        return prepared;
    }
    let link = |_: &str, _: &str| Value::Unknown;
    let env = Env {
        cwd,
        now_unix_nanos: inputs.now_unix_nanos,
        link: &link,
    };
    let mut diags = Diagnostics::default();
    let fetcher: &dyn DataSourceFetcher = match recorded {
        Some(r) => r,
        None => plugins,
    };
    prepared.evaluation = evaluate_with(
        &prepared.blueprint,
        &prepared.graph,
        &inputs.variables,
        &env,
        Some(plugins),
        Some(fetcher),
        limits.eval,
        &mut diags,
    );
    if !diags.has_errors() {
        for idx in 0..prepared.evaluation.resources.len() {
            diags.extend(prepared.resolve_assets(idx, plugins));
        }
    }
    diags.sort();
    prepared.diags.extend(diags.items);
    if !prepared.diags.has_errors() {
        let (deps, order) =
            resource_deps(&prepared.blueprint, &prepared.graph, &prepared.evaluation);
        prepared.deps = deps;
        prepared.order = order;
    }
    prepared.by_name = prepared
        .evaluation
        .resources
        .iter()
        .enumerate()
        .map(|(i, x)| (x.name.clone(), i))
        .collect();
    prepared.templates = prepared
        .blueprint
        .resources
        .iter()
        .enumerate()
        .map(|(i, r)| (r.name.value.clone(), i))
        .collect();
    if !prepared.diags.has_errors() {
        prepared.links = super::links::wanted(&prepared, &plugins.manifests);
        let links = prepared.links.clone();
        super::links::add_hard_link_order(&mut prepared, &links);
    }
    prepared
}

/// Which expanded resource waits for which. A reference to a resource template with `each`
/// waits for every element of it; references through values count as the resources the values
/// read.
fn resource_deps(bp: &Blueprint, graph: &Graph, ev: &Evaluation) -> (Vec<Vec<usize>>, Vec<usize>) {
    // Template index -> its expanded entries.
    let mut elements: Vec<Vec<usize>> = vec![Vec::new(); bp.resources.len()];
    let template_index: std::collections::HashMap<&str, usize> = bp
        .resources
        .iter()
        .enumerate()
        .map(|(i, r)| (r.name.value.as_str(), i))
        .collect();
    for (i, x) in ev.resources.iter().enumerate() {
        if let Some(&t) = template_index.get(x.template.as_str()) {
            elements[t].push(i);
        }
    }
    // Template-level: the resources reachable from each resource through values only.
    let mut template_deps: Vec<Vec<usize>> = vec![Vec::new(); bp.resources.len()];
    // Which walk last visited a node: one array for all walks keeps this linear per walk.
    let mut seen = vec![usize::MAX; graph.nodes.len()];
    for (t, deps) in template_deps.iter_mut().enumerate() {
        let start = graph.index(NodeRef::Resource(t));
        let mut stack: Vec<usize> = graph.edges[start].iter().map(|(w, _)| *w).collect();
        stack.reverse();
        while let Some(w) = stack.pop() {
            if std::mem::replace(&mut seen[w], t) == t {
                continue;
            }
            match graph.nodes[w] {
                NodeRef::Resource(d) if d != t && !deps.contains(&d) => deps.push(d),
                NodeRef::Value(_) => stack.extend(graph.edges[w].iter().map(|(x, _)| *x)),
                _ => {}
            }
        }
    }
    let mut deps = vec![Vec::new(); ev.resources.len()];
    for (t, tdeps) in template_deps.iter().enumerate() {
        for &x in &elements[t] {
            deps[x] = tdeps
                .iter()
                .flat_map(|d| elements[*d].iter().copied())
                .collect();
        }
    }
    // Dependency order of templates, expanded element by element.
    let order = graph
        .dependency_order()
        .into_iter()
        .filter_map(|n| match n {
            NodeRef::Resource(t) => Some(elements[t].clone()),
            _ => None,
        })
        .flatten()
        .collect();
    (deps, order)
}

impl Prepared {
    /// Every export's value against the evaluation as it is now (after a deploy: with every
    /// resource's state recorded), checked against its declared type, and whether it read a
    /// secret (then it is sensitive wherever it is shown).
    pub fn exports(&self, plugins: &PluginContext<'_>) -> Vec<EvaluatedExport> {
        let link = |a: &str, b: &str| link_value(&self.link_data, a, b);
        let env = Env {
            cwd: &self.cwd,
            now_unix_nanos: self.now_unix_nanos,
            link: &link,
        };
        let scope = self.evaluation.scope_with(&env, None, Some(plugins));
        let mut out = Vec::new();
        for x in &self.blueprint.exports {
            let name = x.name.value.clone();
            let ty =
                x.ty.as_ref()
                    .map_or("string", |t| t.value.as_str())
                    .to_owned();
            let Some(field) = &x.field else { continue };
            scope.touched_secret.set(false);
            let mut diags = Diagnostics::default();
            let map = crate::subst::SpanMap::verbatim(field.span.file, field.span.start);
            let result = match crate::subst::parse_expression(&field.value, &map, &mut diags) {
                None => Err(format!(
                    "export `{name}`: `{}` is not a reference",
                    field.value
                )),
                Some(expr) => match scope.guard(scope.expr(&expr)) {
                    Err(e) => Err(format!("export `{name}`: {}", e.message)),
                    Ok(v) if v.deep_contains_unknown() => Err(format!(
                        "export `{name}`: `{}` is not known after deploy",
                        field.value
                    )),
                    Ok(v) => check_export_type(&name, &ty, v),
                },
            };
            out.push(EvaluatedExport {
                name,
                ty,
                value: result,
                sensitive: scope.touched_secret.get(),
            });
        }
        out
    }
}

/// One export as [`Prepared::exports`] evaluated it.
pub struct EvaluatedExport {
    pub name: String,
    /// The declared type.
    pub ty: String,
    pub value: Result<Value, String>,
    /// Derived from a secret: stored marked, shown as `(sensitive)`.
    pub sensitive: bool,
}

/// The recorded data of the link between `a` and `b` (either way round); unknown until the
/// link is deployed.
pub(super) fn link_value(
    data: &std::collections::HashMap<(String, String), Value>,
    a: &str,
    b: &str,
) -> Value {
    data.get(&(a.to_owned(), b.to_owned()))
        .or_else(|| data.get(&(b.to_owned(), a.to_owned())))
        .cloned()
        .unwrap_or(Value::Unknown)
}

/// An export's value must be of its declared type.
fn check_export_type(name: &str, ty: &str, v: Value) -> Result<Value, String> {
    let ok = matches!(
        (ty, &v),
        ("string", Value::Str(_))
            | ("integer", Value::Int(_))
            | ("float", Value::Float(_) | Value::Int(_))
            | ("boolean", Value::Bool(_))
            | ("array", Value::List(_))
            | ("object", Value::Map(_))
    );
    if ok {
        Ok(v)
    } else {
        Err(format!(
            "export `{name}` is declared {ty}, but its field holds {}",
            crate::blueprint::article_of(v.type_name())
        ))
    }
}

impl Prepared {
    /// The includes in dependency order (a child another one reads comes first).
    pub fn include_order(&self) -> Vec<usize> {
        self.graph
            .dependency_order()
            .into_iter()
            .filter_map(|n| match n {
                NodeRef::Child(i) => Some(i),
                _ => None,
            })
            .collect()
    }

    /// Include `i`'s path and variables (as `--var` text), evaluated in the parent's scope as
    /// it is now (with the exports of the children deployed so far).
    pub fn include_inputs(
        &self,
        i: usize,
        plugins: &PluginContext<'_>,
    ) -> Result<(String, Vec<(String, String)>), String> {
        let inc = &self.blueprint.include[i];
        let name = &inc.name.value;
        let link = |a: &str, b: &str| link_value(&self.link_data, a, b);
        let env = Env {
            cwd: &self.cwd,
            now_unix_nanos: self.now_unix_nanos,
            link: &link,
        };
        let scope = self.evaluation.scope_with(&env, None, Some(plugins));
        let path = match &inc.path {
            Some(t) => match scope.template(t) {
                Ok(Value::Str(s)) => s,
                Ok(other) if other.deep_contains_unknown() => {
                    return Err(format!(
                        "include `{name}`: its path is known only after deploy"
                    ));
                }
                Ok(other) => {
                    return Err(format!(
                        "include `{name}`: its path must be a string, not {}",
                        other.type_name()
                    ));
                }
                Err(e) => return Err(format!("include `{name}`: {}", e.message)),
            },
            None => return Err(format!("include `{name}` has no path")),
        };
        let mut vars = Vec::new();
        for (key, node) in &inc.variables {
            let mut failed = None;
            let v = crate::eval::blueprint::node(node, &scope, &mut |e| {
                failed.get_or_insert(e.message);
            });
            if let Some(m) = failed {
                return Err(format!("include `{name}`, variable `{}`: {m}", key.name));
            }
            if v.deep_contains_unknown() {
                return Err(format!(
                    "include `{name}`, variable `{}`: its value is known only after deploy (a \
                     child may read variables, values, data sources and other children's \
                     exports, not resource state)",
                    key.name
                ));
            }
            let text = match &v {
                Value::Str(s) => s.clone(),
                other => super::state_values::eval_to_json(other).to_string(),
            };
            vars.push((key.name.clone(), text));
        }
        Ok((path, vars))
    }

    /// Records a deployed child's exports for `${children.name.field}`; reading one named in
    /// `secret` marks what reads it sensitive.
    pub fn set_child_exports(
        &mut self,
        name: &str,
        exports: IndexMap<String, Value>,
        secret: Vec<String>,
    ) {
        self.evaluation
            .children
            .insert(name.to_owned(), Value::Map(exports));
        self.evaluation
            .secret_children
            .insert(name.to_owned(), secret);
    }
}
