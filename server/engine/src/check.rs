//! The whole check of a blueprint file with plugins: read, run `transform:`,
//! validate (with provider manifests), ask providers, and map what their
//! output says back onto what the user wrote. `trellis validate` runs this
//! unless `--skip-provider-checks`; the daemon's validate call will too.

use crate::diag::Diagnostics;
use crate::document::{self, Format};
use crate::inject::{Injected, InjectorScope};
use crate::plugin_checks::{self, PluginAccess};
use crate::plugins::{CallOptions, PluginError, PluginHost};
use crate::settings::ProviderConfigs;
use crate::source::{SourceMap, Span};
use crate::transform::{self, Transforms};
use crate::validate::providers::Manifests;
use crate::validate::{self, Options};
use tokio::runtime::Handle;
use trellis_proto::plugin::v1 as pb;

/// Plugin knowledge gathered once per run: the providers' manifests (which
/// also know why any installed provider could not be asked).
pub struct PluginContext<'a> {
    pub host: &'a PluginHost,
    /// Plugin calls block on this runtime: callers run on a blocking thread (or outside any
    /// runtime), never on an async worker.
    pub rt: Handle,
    pub manifests: Manifests,
    /// Whether validation asks providers (their own resource validation, variable options).
    /// Executing a change set turns it off: its inputs are exactly those validated at plan
    /// time (the digest is checked), and a second round of calls would sit on the critical
    /// path of every deploy.
    pub ask_providers: bool,
    /// The provider config every call of this request or run is sent, by namespace.
    pub configs: ProviderConfigs,
    /// The engine API request the calls serve, sent for the plugins' logs.
    pub request_id: Option<String>,
}

impl<'a> PluginContext<'a> {
    /// Fetches the manifest of every discovered provider (from the cache
    /// when the binary is unchanged, otherwise by starting it).
    pub fn load(host: &'a PluginHost, rt: Handle) -> PluginContext<'a> {
        let mut ok = Vec::new();
        let mut unavailable = Vec::new();
        for (name, result) in rt.block_on(host.provider_manifests()) {
            match result {
                Ok(m) => ok.push((*m).clone()),
                Err(e) => unavailable.push((name, e.to_string())),
            }
        }
        PluginContext {
            host,
            rt,
            manifests: Manifests::with_unavailable(ok, unavailable),
            ask_providers: true,
            configs: ProviderConfigs::default(),
            request_id: None,
        }
    }

    /// The same plugin knowledge, for calls sent with `configs`.
    pub fn with_configs(&self, configs: ProviderConfigs) -> PluginContext<'a> {
        PluginContext {
            host: self.host,
            rt: self.rt.clone(),
            manifests: self.manifests.clone(),
            ask_providers: self.ask_providers,
            configs,
            request_id: self.request_id.clone(),
        }
    }

    /// The options of a call to plugin `name`: its provider config.
    fn options(&self, name: &str) -> CallOptions {
        CallOptions {
            provider_config: self.configs.get(name),
            request_id: self.request_id.clone(),
            ..CallOptions::default()
        }
    }
}

fn message(e: PluginError) -> String {
    e.to_string()
}

impl PluginAccess for PluginContext<'_> {
    fn validate_resource(
        &self,
        resource_type: &str,
        name: &str,
        spec: pb::Value,
    ) -> Result<Vec<pb::Diagnostic>, String> {
        let ns = resource_type.split('/').next().unwrap_or_default();
        let client = self.host.provider(ns).map_err(message)?;
        let req = pb::ValidateResourceRequest {
            context: None,
            resource_type: resource_type.to_owned(),
            resource_name: name.to_owned(),
            spec: Some(spec),
        };
        let resp = self
            .rt
            .block_on(client.validate_resource(req, &self.options(ns)))
            .map_err(message)?;
        Ok(resp.diagnostics)
    }

    fn validate_resources(
        &self,
        items: Vec<(String, String, pb::Value)>,
    ) -> Vec<Result<Vec<pb::Diagnostic>, String>> {
        use futures_util::stream::{self, StreamExt};
        // Concurrent, bounded: the plugin answers many calls at once over one connection.
        const IN_FLIGHT: usize = 64;
        let calls = items.into_iter().map(|(ty, name, spec)| async move {
            let ns = ty.split('/').next().unwrap_or_default();
            let client = self.host.provider(ns).map_err(message)?;
            let req = pb::ValidateResourceRequest {
                context: None,
                resource_type: ty.clone(),
                resource_name: name,
                spec: Some(spec),
            };
            client
                .validate_resource(req, &self.options(ns))
                .await
                .map(|r| r.diagnostics)
                .map_err(message)
        });
        self.rt
            .block_on(stream::iter(calls).buffered(IN_FLIGHT).collect::<Vec<_>>())
    }

    fn custom_variable_options(
        &self,
        variable_type: &str,
    ) -> Result<Vec<pb::CustomVariableOption>, String> {
        let ns = variable_type.split('/').next().unwrap_or_default();
        let client = self.host.provider(ns).map_err(message)?;
        let resp = self
            .rt
            .block_on(client.custom_variable_options(variable_type, &self.options(ns)))
            .map_err(message)?;
        if let Some(e) = resp.error {
            return Err(format!("provider `{ns}`: {}", e.message));
        }
        Ok(resp.options)
    }
}

impl crate::eval::expr::ExternalFunctions for PluginContext<'_> {
    fn call(
        &self,
        name: &str,
        args: Vec<crate::eval::value::Value>,
    ) -> Option<Result<crate::eval::value::Value, String>> {
        let ns = self.manifests.function_namespace(name)?;
        let mut pb_args = Vec::with_capacity(args.len());
        for (i, a) in args.iter().enumerate() {
            match crate::plugins::values::from_eval(a) {
                Some(v) => pb_args.push(v),
                None => {
                    return Some(Err(format!(
                        "argument {} is a function, which cannot be sent to a provider",
                        i + 1
                    )));
                }
            }
        }
        let result = self.host.provider(ns).map_err(message).and_then(|client| {
            self.rt
                .block_on(client.call_function(name, pb_args, &self.options(ns)))
                .map_err(message)
        });
        Some(result.map(|v| crate::plugins::values::to_eval(&v)))
    }
}

impl crate::eval::blueprint::DataSourceFetcher for PluginContext<'_> {
    fn fetch(
        &self,
        data_source_type: &str,
        filters: &[crate::datasource::filter::Filter],
    ) -> Result<Vec<crate::eval::value::Value>, String> {
        let ns = data_source_type.split('/').next().unwrap_or_default();
        let client = self.host.provider(ns).map_err(message)?;
        let req = pb::FetchDataSourceRequest {
            context: None,
            data_source_type: data_source_type.to_owned(),
            filters: filters
                .iter()
                .map(|f| pb::Filter {
                    field: f.field.clone(),
                    operator: f.operator.as_str().to_owned(),
                    search: crate::plugins::values::from_eval(&f.search),
                })
                .collect(),
        };
        let resp = self
            .rt
            .block_on(client.fetch_data_source(req, &self.options(ns)))
            .map_err(message)?;
        if let Some(e) = resp.error {
            return Err(format!("provider `{ns}`: {}", e.message));
        }
        Ok(resp
            .items
            .iter()
            .map(crate::plugins::values::to_eval)
            .collect())
    }
}

impl Transforms for PluginContext<'_> {
    fn transform(
        &self,
        name: &str,
        blueprint_json: String,
    ) -> Result<pb::TransformResponse, String> {
        let client = self.host.transformer(name).map_err(message)?;
        self.rt
            .block_on(client.transform(blueprint_json, &CallOptions::default()))
            .map_err(message)
    }
}

/// What a request adds to a blueprint before it is validated: property injectors (nearest
/// scope first) and the variables whose values it marked secret.
#[derive(Clone, Copy, Default)]
pub struct Additions<'a> {
    pub injectors: &'a [InjectorScope],
    pub secret_variables: &'a [String],
}

/// Validates one file with plugins; diagnostics are appended sorted. Each include whose
/// `path` is written literally and is local is also checked against the child document
/// `read_child` returns for it (the path joined to the directory of `name`; `None` when it
/// cannot be read, which leaves the include to plan): the variables passed must have the
/// types the child declares, and the child's required variables must be passed
/// (`validate::includes::check_include_variables`). `trellis validate` passes a reader of
/// files on its own machine; the engine, which checks children at plan, one that reads none.
#[allow(clippy::too_many_arguments)]
pub fn validate_source(
    sources: &mut SourceMap,
    name: &str,
    bytes: Vec<u8>,
    variables: &[(String, String)],
    additions: Additions<'_>,
    max_input_size: usize,
    plugins: &PluginContext<'_>,
    read_child: &dyn Fn(&str) -> Option<Vec<u8>>,
    diags: &mut Diagnostics,
) {
    check_source(
        sources,
        name,
        bytes,
        variables,
        additions,
        max_input_size,
        plugins,
        read_child,
        diags,
    );
}

/// A blueprint as validated: the model of the document that was checked (the transformers'
/// output when it has `transform:`), and its dependency graph.
pub struct Checked {
    pub file: crate::source::FileId,
    pub blueprint: crate::blueprint::Blueprint,
    pub graph: crate::validate::refs::Graph,
    /// The spec fields property injectors set.
    pub injected: Vec<Injected>,
    /// Whether `file` is the transformers' output (the blueprint has `transform:`).
    pub transformed: bool,
    /// Each resource the transformers generated, with the abstract resource it came from.
    pub derivations: Vec<transform::Derivation>,
}

/// [`validate_source`], also returning what was validated (`None` when the file could not be
/// read or parsed). Check `diags` for errors before using it.
#[allow(clippy::too_many_arguments)]
pub fn check_source(
    sources: &mut SourceMap,
    name: &str,
    bytes: Vec<u8>,
    variables: &[(String, String)],
    additions: Additions<'_>,
    max_input_size: usize,
    plugins: &PluginContext<'_>,
    read_child: &dyn Fn(&str) -> Option<Vec<u8>>,
    diags: &mut Diagnostics,
) -> Option<Checked> {
    let mut local = Diagnostics::default();
    let Some(file) = document::load_bytes(sources, name, bytes, max_input_size, &mut local) else {
        finish(local, diags);
        return None;
    };
    let Some(root) = document::parse(sources, file, Format::from_path(name), &mut local) else {
        finish(local, diags);
        return None;
    };
    // Transforms come first: the document that is validated is their output.
    let original =
        crate::blueprint::load(&root, sources.get(file), file, &mut Diagnostics::default());
    let transformed = if original.transform.is_empty() {
        None
    } else {
        let names: Vec<(String, Span)> = original
            .transform
            .iter()
            .map(|t| (t.value.clone(), t.span))
            .collect();
        match transform::run(sources, &root, &names, plugins, &mut local) {
            Some(t) => Some(t),
            None => {
                finish(local, diags);
                return None;
            }
        }
    };
    let (vfile, mut vroot) = match &transformed {
        Some(t) => (t.file, &t.root),
        None => (file, &root),
    };
    // Injected defaults become part of the document, so they are validated like written
    // values and diagnostics about them point into the injectors' own source.
    let with_defaults;
    let mut injected = Vec::new();
    if !additions.injectors.is_empty() {
        let mut doc = vroot.clone();
        injected = crate::inject::inject(sources, &mut doc, additions.injectors);
        with_defaults = doc;
        vroot = &with_defaults;
    }
    let functions = plugins.manifests.functions();
    let opts = Options {
        functions: &functions,
        providers: Some(&plugins.manifests),
        variables,
        unchecked_functions: false,
    };
    let src = sources.get(vfile);
    let mut bp = crate::blueprint::load(vroot, src, vfile, &mut local);
    // A value the caller marked secret is treated as declared `secret: true`.
    for v in &mut bp.variables {
        if additions.secret_variables.contains(&v.name.value) {
            v.secret = true;
        }
    }
    let graph = validate::validate(&bp, src, &opts, &mut local);
    for inc in &bp.include {
        let Some(path) = inc.path.as_ref().and_then(|t| t.as_literal()) else {
            continue;
        };
        let Some(child) = crate::validate::local_child_path(name, &path) else {
            continue;
        };
        let Some(content) = read_child(&child) else {
            continue;
        };
        let Some(declared) = crate::plan::child_variables(&child, &content, max_input_size) else {
            continue;
        };
        validate::includes::check_include_variables(
            &bp, inc, &path, &declared, &functions, &mut local,
        );
    }
    // Plugins are asked even when static checks failed, so one run reports
    // everything; only types a provider declares are sent.
    let known = |ty: &str| {
        plugins.manifests.resource_type(ty).is_some() || plugins.manifests.has_variable_type(ty)
    };
    if plugins.ask_providers {
        plugin_checks::check(&bp, &known, plugins, &mut local);
    }
    if let Some(t) = &transformed {
        t.map_back(&root, &mut local);
    }
    finish(local, diags);
    Some(Checked {
        file: vfile,
        blueprint: bp,
        graph,
        injected,
        transformed: transformed.is_some(),
        derivations: transformed.map(|t| t.derivations).unwrap_or_default(),
    })
}

fn finish(mut local: Diagnostics, diags: &mut Diagnostics) {
    local.sort();
    diags.extend(local.items);
}
