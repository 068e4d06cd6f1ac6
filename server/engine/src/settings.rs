//! Provider configuration and property injectors as one model (docs/configuration.md).
//!
//! Two scopes set them: the engine's config file (the organisation) and a request's
//! environment (the stage). Nearest wins: what the blueprint writes, then the environment,
//! then the engine. Provider config from the environment is merged over the engine's, except
//! the keys the engine pins, which no request may set.
//!
//! Secret values (`fromEnv`/`fromFile` in either scope) are kept wrapped as
//! `{"$sensitive": value}` (the state convention, [`crate::state_values`]): they reach providers
//! with the protocol's `sensitive` flag and are masked in everything shown.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use indexmap::IndexMap;
use serde_json::{Map, Value as Json, json};
use trellis_proto::plugin::v1 as pb;

use crate::inject::InjectorScope;
use crate::state_values::{self, sensitive_inner};

/// A provider's config: keys to values (secrets wrapped).
pub type Table = Map<String, Json>;

/// One provider's table in the engine's config.
#[derive(Clone, Default, PartialEq)]
pub struct ProviderSettings {
    /// Config keys, secrets wrapped.
    pub values: Map<String, Json>,
    /// Keys a request cannot set.
    pub pinned: Vec<String>,
}

/// What the engine's config sets for every request.
#[derive(Clone, Default, PartialEq)]
pub struct EngineSettings {
    /// By provider namespace.
    pub providers: BTreeMap<String, ProviderSettings>,
    /// Resource type -> spec defaults (an object each).
    pub injectors: IndexMap<String, Json>,
}

/// What a request's environment adds (`--env FILE`, or the API's `environment` field).
#[derive(Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Environment {
    /// Shown with the instance (`dev`, `prod`).
    pub name: String,
    /// The client's digest of the environment file (`sha256:..`); empty when the request gave
    /// none, and then [`Environment::digest`] computes one.
    #[serde(rename = "digest")]
    pub file_digest: String,
    /// Per namespace: keys merged over the engine's (secrets wrapped).
    pub providers: IndexMap<String, Map<String, Json>>,
    pub injectors: IndexMap<String, Json>,
    /// Variables whose values the caller marked secret (`fromEnv`/`fromFile`): treated as if
    /// the blueprint declared them `secret: true`.
    pub secret_variables: Vec<String>,
}

impl Environment {
    pub fn is_empty(&self) -> bool {
        *self == Environment::default()
    }

    /// The file's digest when given, else a digest of the structured fields (secret values left
    /// out: the digest names the environment, not its secrets).
    pub fn digest(&self) -> String {
        if !self.file_digest.is_empty() || self.is_empty() {
            return self.file_digest.clone();
        }
        let providers: Map<String, Json> = self
            .providers
            .iter()
            .map(|(k, v)| (k.clone(), without_secret_values(&Json::Object(v.clone()))))
            .collect();
        let shown = json!({
            "name": self.name,
            "providers": providers,
            "injectors": self.injectors,
            "secretVariables": self.secret_variables,
        });
        format!(
            "sha256:{}",
            trellis_ids::sha256_hex(shown.to_string().as_bytes())
        )
    }

    /// The stored form (change set bodies, the instance record): secrets stay wrapped.
    pub fn to_json(&self) -> Json {
        serde_json::to_value(self).unwrap_or(Json::Null)
    }

    /// Reads [`Environment::to_json`]'s form; `null` is the empty environment.
    pub fn from_json(v: &Json) -> Result<Environment, String> {
        if v.is_null() {
            return Ok(Environment::default());
        }
        serde_path_to_error::deserialize(v).map_err(|e| format!("{}: {}", e.path(), e.inner()))
    }
}

impl fmt::Debug for Environment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Environment")
            .field("name", &self.name)
            .field("digest", &self.file_digest)
            .field("providers", &self.providers.keys().collect::<Vec<_>>())
            .field("injectors", &self.injectors.keys().collect::<Vec<_>>())
            .field("secret_variables", &self.secret_variables)
            .finish()
    }
}

impl fmt::Debug for ProviderSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProviderSettings")
            .field(
                "values",
                &state_values::masked(&Json::Object(self.values.clone())),
            )
            .field("pinned", &self.pinned)
            .finish()
    }
}

impl EngineSettings {
    /// Every secret text in the providers' settings, for redaction.
    pub fn secret_texts(&self) -> Vec<String> {
        secret_texts(self.providers.values().map(|p| &p.values))
    }
}

/// The secret texts in provider config tables.
fn secret_texts<'m>(tables: impl Iterator<Item = &'m Map<String, Json>>) -> Vec<String> {
    let mut out = Vec::new();
    for t in tables {
        for v in t.values() {
            state_values::secret_texts(v, false, &mut out);
        }
    }
    out
}

impl fmt::Debug for EngineSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EngineSettings")
            .field("providers", &self.providers)
            .field("injectors", &self.injectors)
            .finish()
    }
}

/// `v` with each secret's value left out (its mark kept): a digest of a low-entropy secret
/// would let anyone who sees it guess the secret.
fn without_secret_values(v: &Json) -> Json {
    match v {
        Json::Object(o) => match sensitive_inner(v) {
            Some(_) => state_values::mark_secret(Json::Null),
            None => Json::Object(
                o.iter()
                    .map(|(k, v)| (k.clone(), without_secret_values(v)))
                    .collect(),
            ),
        },
        Json::Array(items) => Json::Array(items.iter().map(without_secret_values).collect()),
        other => other.clone(),
    }
}

/// The provider config each plugin is sent, by namespace: the same for every call of a request
/// or run. Cheap to clone.
#[derive(Clone, Default)]
pub struct ProviderConfigs(Arc<HashMap<String, pb::Value>>);

impl ProviderConfigs {
    pub fn get(&self, namespace: &str) -> Option<pb::Value> {
        self.0.get(namespace).cloned()
    }

    /// Every namespace's config.
    pub fn to_map(&self) -> HashMap<String, pb::Value> {
        (*self.0).clone()
    }
}

impl fmt::Debug for ProviderConfigs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut keys: Vec<_> = self.0.keys().collect();
        keys.sort();
        f.debug_tuple("ProviderConfigs").field(&keys).finish()
    }
}

/// The effective provider settings of a request: the engine's, with the environment's merged
/// over them. A request may not set a pinned key.
#[derive(Clone, Default, PartialEq)]
pub struct Merged {
    pub providers: BTreeMap<String, Map<String, Json>>,
}

impl fmt::Debug for Merged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Merged").field(&self.masked_json()).finish()
    }
}

impl Merged {
    pub fn configs(&self) -> ProviderConfigs {
        ProviderConfigs(Arc::new(
            self.providers
                .iter()
                .map(|(ns, m)| (ns.clone(), state_values::to_pb(&Json::Object(m.clone()))))
                .collect(),
        ))
    }

    /// For the instance record: each secret's value left out, its mark kept (API answers show
    /// it as sensitive).
    pub fn record_json(&self) -> Json {
        without_secret_values(&serde_json::to_value(&self.providers).unwrap_or(Json::Null))
    }

    /// For logs: secrets masked.
    pub fn masked_json(&self) -> Json {
        state_values::masked(&serde_json::to_value(&self.providers).unwrap_or(Json::Null))
    }

    /// Every secret text in the settings, for redaction.
    pub fn secret_texts(&self) -> Vec<String> {
        secret_texts(self.providers.values())
    }
}

/// Merges `env` over `engine`. Errors name the environment key.
pub fn merge(engine: &EngineSettings, env: &Environment) -> Result<Merged, String> {
    let mut providers: BTreeMap<String, Map<String, Json>> = engine
        .providers
        .iter()
        .map(|(ns, s)| (ns.clone(), s.values.clone()))
        .collect();
    let label = env_label(env);
    for (ns, over) in &env.providers {
        let pinned = engine.providers.get(ns).map(|s| s.pinned.as_slice());
        if let Some(key) = over.keys().find(|k| pinned.is_some_and(|p| p.contains(k))) {
            return Err(format!(
                "{label}: `providers.{ns}.{key}` is pinned by the engine's configuration; a request cannot set it"
            ));
        }
        check_literal(&Json::Object(over.clone()), &format!("providers.{ns}"))
            .map_err(|e| format!("{label}: {e}"))?;
        let into = providers.entry(ns.clone()).or_default();
        for (k, v) in over {
            deep_merge(into, k, v.clone());
        }
    }
    Ok(Merged { providers })
}

/// Merges an instance's recorded environment over `engine`: keys the engine has pinned since
/// are the engine's (returned, for a warning); the rest of the record still applies.
pub fn merge_recorded(engine: &EngineSettings, recorded: &Environment) -> (Merged, Vec<String>) {
    let mut env = recorded.clone();
    let mut dropped = Vec::new();
    for (ns, over) in &mut env.providers {
        if let Some(p) = engine.providers.get(ns) {
            over.retain(|k, _| {
                let pinned = p.pinned.contains(k);
                if pinned {
                    dropped.push(format!("providers.{ns}.{k}"));
                }
                !pinned
            });
        }
    }
    match merge(engine, &env) {
        Ok(m) => (m, dropped),
        // Only pins can refuse a merge, and they were removed; literal checks were passed
        // when the environment was first given.
        Err(_) => (
            merge(engine, &Environment::default()).unwrap_or_default(),
            dropped,
        ),
    }
}

fn env_label(env: &Environment) -> String {
    if env.name.is_empty() {
        "the request's environment".to_owned()
    } else {
        format!("environment `{}`", env.name)
    }
}

/// Sets `key` in `into` to `v`, merging maps key by key (a secret counts as a scalar).
fn deep_merge(into: &mut Map<String, Json>, key: &str, v: Json) {
    match (into.get_mut(key), v) {
        (Some(Json::Object(a)), Json::Object(b))
            if sensitive_inner(&Json::Object(a.clone())).is_none()
                && sensitive_inner(&Json::Object(b.clone())).is_none() =>
        {
            for (k, v) in b {
                deep_merge(a, &k, v);
            }
        }
        (_, v) => {
            into.insert(key.to_owned(), v);
        }
    }
}

/// A secret read from a file, without the file's final line break (editors add one).
pub fn secret_file_text(mut text: String) -> String {
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    text
}

/// Config and injector values are literal: a `${` would read as a substitution.
pub fn check_literal(v: &Json, at: &str) -> Result<(), String> {
    match v {
        Json::String(s) if s.contains("${") => Err(format!(
            "`{at}` holds `${{`: configuration values are literal, substitutions are not evaluated"
        )),
        Json::Object(o) => {
            if sensitive_inner(v).is_some() {
                return Ok(());
            }
            o.iter()
                .try_for_each(|(k, v)| check_literal(v, &format!("{at}.{k}")))
        }
        Json::Array(items) => items
            .iter()
            .enumerate()
            .try_for_each(|(i, v)| check_literal(v, &format!("{at}[{i}]"))),
        _ => Ok(()),
    }
}

/// The top-level keys of `config` that `schema` (an OBJECT schema) does not declare, as an
/// error naming the first, with the keys it has.
pub fn check_keys(
    what: &str,
    namespace: &str,
    config: &Map<String, Json>,
    schema: Option<&pb::Schema>,
) -> Result<(), String> {
    let fields: Vec<&str> = schema
        .map(|s| s.fields.iter().map(|f| f.name.as_str()).collect())
        .unwrap_or_default();
    match config.keys().find(|k| !fields.contains(&k.as_str())) {
        None => Ok(()),
        Some(k) if fields.is_empty() => Err(format!(
            "{what}: `providers.{namespace}.{k}`: provider `{namespace}` takes no configuration"
        )),
        Some(k) => Err(format!(
            "{what}: `providers.{namespace}.{k}`: provider `{namespace}` has no config key `{k}` (it has: {})",
            fields.join(", ")
        )),
    }
}

/// The injector scopes of a request, nearest first.
pub fn injector_scopes(engine: &EngineSettings, env: &Environment) -> Vec<InjectorScope> {
    let mut scopes = Vec::new();
    if !env.injectors.is_empty() {
        let label = if env.name.is_empty() {
            "environment (injectors)".to_owned()
        } else {
            format!("environment {} (injectors)", env.name)
        };
        scopes.push(InjectorScope {
            origin: "environment".into(),
            label,
            by_type: env.injectors.clone(),
        });
    }
    if !engine.injectors.is_empty() {
        scopes.push(InjectorScope {
            origin: "engine".into(),
            label: "engine config (injectors)".into(),
            by_type: engine.injectors.clone(),
        });
    }
    scopes
}

/// Checks an injector table (type -> object of literal values).
pub fn check_injectors(what: &str, injectors: &IndexMap<String, Json>) -> Result<(), String> {
    for (ty, defaults) in injectors {
        if !ty.contains('/') {
            return Err(format!(
                "{what}: injector `{ty}` is not a resource type (`namespace/name`)"
            ));
        }
        if !defaults.is_object() || sensitive_inner(defaults).is_some() {
            return Err(format!(
                "{what}: injector `{ty}` must be a table of spec fields"
            ));
        }
        if state_values::holds_secret(defaults) {
            return Err(format!(
                "{what}: injector `{ty}` holds a secret; injected values are shown in plans"
            ));
        }
        check_literal(defaults, &format!("injectors.{ty}")).map_err(|e| format!("{what}: {e}"))?;
    }
    Ok(())
}

/// Checks provider settings a scope gives against the installed providers, each entry
/// `(namespace, the keys the scope sets, the whole config the provider will get)`: the
/// namespace must be an installed provider that answered, every key must be in its config
/// schema, and the provider must accept the whole (ValidateConfig). The error names the key;
/// `what` says whose settings they are (`engine config`, `environment \`dev\``).
pub async fn check_providers(
    host: &crate::plugins::PluginHost,
    what: &str,
    entries: &[(&str, &Table, &Table)],
) -> Result<(), String> {
    let manifests = host.provider_manifests().await;
    for &(ns, given, whole) in entries {
        let manifest = match manifests.iter().find(|(name, _)| name == ns) {
            Some((_, Ok(m))) => m,
            Some((_, Err(e))) => {
                return Err(format!(
                    "{what}: `providers.{ns}`: the provider could not be asked: {e}"
                ));
            }
            None => {
                let installed: Vec<&str> = manifests.iter().map(|(n, _)| n.as_str()).collect();
                return Err(format!(
                    "{what}: `providers.{ns}`: no provider `{ns}` is installed (installed: {})",
                    installed.join(", ")
                ));
            }
        };
        check_keys(what, ns, given, manifest.config_schema.as_ref())?;
        validate_with_provider(host, what, ns, whole).await?;
    }
    Ok(())
}

/// Asks provider `namespace` whether `config` is valid (ValidateConfig); its errors, each
/// naming the key (`providers.<ns>.<key>`), joined. `what` says whose config it is.
async fn validate_with_provider(
    host: &crate::plugins::PluginHost,
    what: &str,
    namespace: &str,
    config: &Map<String, Json>,
) -> Result<(), String> {
    let client = host
        .provider(namespace)
        .map_err(|e| format!("{what}: `providers.{namespace}`: {e}"))?;
    let opts = crate::plugins::CallOptions {
        provider_config: Some(state_values::to_pb(&Json::Object(config.clone()))),
        ..Default::default()
    };
    let answer = client
        .validate_config(&opts)
        .await
        .map_err(|e| format!("{what}: `providers.{namespace}`: {e}"))?;
    let errors: Vec<String> = answer
        .diagnostics
        .iter()
        .filter(|d| d.severity() != pb::Severity::Warning && d.severity() != pb::Severity::Info)
        .map(|d| {
            let mut at = format!("providers.{namespace}");
            for step in d.path.iter().flat_map(|p| p.steps.iter()) {
                match &step.step {
                    Some(pb::path_step::Step::Field(f)) => {
                        at.push('.');
                        at.push_str(f);
                    }
                    Some(pb::path_step::Step::Index(i)) => at.push_str(&format!("[{i}]")),
                    None => {}
                }
            }
            let code = if d.code.is_empty() {
                String::new()
            } else {
                format!(" [{}]", d.code)
            };
            // A provider may quote a value it was sent; the caller holds the secrets.
            let message = crate::redact::scrub(&d.message);
            format!("{what}: `{at}`{code}: {message}")
        })
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine() -> EngineSettings {
        let mut providers = BTreeMap::new();
        providers.insert(
            "local".to_owned(),
            ProviderSettings {
                values: json!({"root": "/srv", "opts": {"a": 1, "b": 2}})
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
                pinned: vec!["root".into()],
            },
        );
        EngineSettings {
            providers,
            injectors: IndexMap::new(),
        }
    }

    fn env(providers: Json) -> Environment {
        Environment {
            name: "dev".into(),
            providers: providers
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.as_object().cloned().unwrap_or_default()))
                .collect(),
            ..Environment::default()
        }
    }

    #[test]
    fn environment_merges_over_the_engine_deeply() {
        let m = merge(
            &engine(),
            &env(json!({"local": {"opts": {"b": 3, "c": 4}}, "aws": {"region": "x"}})),
        )
        .expect("merge");
        assert_eq!(
            Json::Object(m.providers["local"].clone()),
            json!({"root": "/srv", "opts": {"a": 1, "b": 3, "c": 4}})
        );
        assert_eq!(
            Json::Object(m.providers["aws"].clone()),
            json!({"region": "x"})
        );
    }

    #[test]
    fn a_pinned_key_cannot_be_set() {
        let err = merge(&engine(), &env(json!({"local": {"root": "/"}}))).unwrap_err();
        assert!(err.contains("`providers.local.root` is pinned"), "{err}");
        assert!(err.contains("environment `dev`"), "{err}");
    }

    #[test]
    fn secrets_stay_wrapped_and_masked() {
        let e = env(json!({"aws": {"key": {"$sensitive": "hunter2"}}}));
        let m = merge(&engine(), &e).expect("merge");
        assert_eq!(m.secret_texts(), vec!["hunter2".to_owned()]);
        assert!(!m.masked_json().to_string().contains("hunter2"));
        assert!(m.configs().get("aws").is_some_and(|v| {
            matches!(&v.kind, Some(pb::value::Kind::Map(map)) if map.entries[0].value.as_ref().is_some_and(|x| x.sensitive))
        }));
        let digest = e.digest();
        assert!(digest.starts_with("sha256:"));
        assert!(!format!("{e:?}").contains("hunter2"));
        let back = Environment::from_json(&e.to_json()).expect("read back");
        assert_eq!(back, e);
    }

    #[test]
    fn a_recorded_environment_loses_only_the_keys_pinned_since() {
        let recorded = env(json!({"local": {"root": "/", "opts": {"b": 9}}}));
        let (m, dropped) = merge_recorded(&engine(), &recorded);
        assert_eq!(dropped, ["providers.local.root"]);
        assert_eq!(
            Json::Object(m.providers["local"].clone()),
            json!({"root": "/srv", "opts": {"a": 1, "b": 9}})
        );
    }

    #[test]
    fn the_record_keeps_no_secret_value() {
        let e = env(json!({"aws": {"key": {"$sensitive": "hunter2"}}}));
        let m = merge(&engine(), &e).expect("merge");
        let record = m.record_json();
        assert!(!record.to_string().contains("hunter2"));
        assert!(state_values::holds_secret(&record));
        assert!(
            !Environment {
                file_digest: String::new(),
                ..e
            }
            .digest()
            .is_empty()
        );
    }

    #[test]
    fn secret_files_lose_their_final_newline() {
        assert_eq!(secret_file_text("abc\n".into()), "abc");
        assert_eq!(secret_file_text("abc\r\n".into()), "abc");
        assert_eq!(secret_file_text("abc\n\n".into()), "abc\n");
        assert_eq!(secret_file_text("abc".into()), "abc");
    }

    #[test]
    fn substitutions_are_refused_in_config() {
        let err = merge(
            &engine(),
            &env(json!({"aws": {"region": "${variables.r}"}})),
        )
        .unwrap_err();
        assert!(err.contains("providers.aws.region"), "{err}");
    }

    #[test]
    fn keys_are_checked_against_the_schema() {
        let schema = pb::Schema {
            fields: vec![pb::SchemaField {
                name: "root".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let cfg = json!({"rooot": "/x"})
            .as_object()
            .cloned()
            .unwrap_or_default();
        let err = check_keys("engine config", "local", &cfg, Some(&schema)).unwrap_err();
        assert!(
            err.contains("`providers.local.rooot`") && err.contains("it has: root"),
            "{err}"
        );
        let ok = json!({"root": "/x"})
            .as_object()
            .cloned()
            .unwrap_or_default();
        assert!(check_keys("engine config", "local", &ok, Some(&schema)).is_ok());
    }

    #[test]
    fn injectors_are_checked_and_ordered_nearest_first() {
        let mut e = engine();
        e.injectors
            .insert("local/file".into(), json!({"mode": "0640"}));
        let mut en = env(json!({}));
        en.injectors
            .insert("local/file".into(), json!({"mode": "0600"}));
        let scopes = injector_scopes(&e, &en);
        assert_eq!(
            scopes.iter().map(|s| s.origin.as_str()).collect::<Vec<_>>(),
            ["environment", "engine"]
        );
        let mut bad = IndexMap::new();
        bad.insert("local/file".to_owned(), json!("0600"));
        assert!(check_injectors("env", &bad).is_err());
        bad.insert("local/file".to_owned(), json!({"k": {"$sensitive": "s"}}));
        assert!(check_injectors("env", &bad).unwrap_err().contains("secret"));
    }
}
