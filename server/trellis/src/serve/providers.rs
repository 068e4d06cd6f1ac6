//! The engine config's `[providers.<namespace>]` and `[injectors."<type>"]` tables
//! (docs/configuration.md): read from TOML, secrets resolved from the engine's environment or
//! files, then checked once at startup against the installed providers.

use std::path::Path;

use serde_json::{Map, Value as Json};

use crate::engine::settings::{self, EngineSettings, ProviderSettings};
use crate::engine::state_values::mark_secret;
use crate::plugins::PluginHost;

/// Reads the two tables. `file` names the config file in errors; `fromFile` paths are relative
/// to `dir`; `env` looks up the engine's environment variables.
pub(super) fn read(
    providers: Option<toml::Table>,
    injectors: Option<toml::Table>,
    file: &Path,
    dir: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<EngineSettings, String> {
    let at = |key: &str, why: &str| format!("`{key}` in {}: {why}", file.display());
    let mut out = EngineSettings::default();
    for (ns, table) in providers.unwrap_or_default() {
        let key = format!("providers.{ns}");
        let toml::Value::Table(table) = table else {
            return Err(at(&key, "must be a table of provider settings"));
        };
        let mut entry = ProviderSettings::default();
        for (k, v) in table {
            let key = format!("{key}.{k}");
            if k == "pinned" {
                entry.pinned = pinned(v).map_err(|why| at(&key, &why))?;
                continue;
            }
            let value = to_json(v, &key, dir, env).map_err(|why| at(&key, &why))?;
            entry.values.insert(k, value);
        }
        if let Some(p) = entry.pinned.iter().find(|p| !entry.values.contains_key(*p)) {
            return Err(at(
                &format!("providers.{ns}.pinned"),
                &format!("pins `{p}`, which the table does not set"),
            ));
        }
        settings::check_literal(&Json::Object(entry.values.clone()), &key)
            .map_err(|why| format!("{}: {why}", file.display()))?;
        out.providers.insert(ns, entry);
    }
    for (ty, table) in injectors.unwrap_or_default() {
        let key = format!("injectors.\"{ty}\"");
        let toml::Value::Table(_) = &table else {
            return Err(at(&key, "must be a table of spec fields"));
        };
        if holds_secret_ref(&table) {
            return Err(at(
                &key,
                "holds a secret (`fromEnv`/`fromFile`); injected values are shown in plans",
            ));
        }
        let value = to_json(table, &key, dir, &|_| None).map_err(|why| at(&key, &why))?;
        out.injectors.insert(ty, value);
    }
    settings::check_injectors(&format!("{}", file.display()), &out.injectors)?;
    Ok(out)
}

fn holds_secret_ref(v: &toml::Value) -> bool {
    match v {
        toml::Value::Table(t) => {
            t.contains_key("fromEnv")
                || t.contains_key("fromFile")
                || t.values().any(holds_secret_ref)
        }
        toml::Value::Array(items) => items.iter().any(holds_secret_ref),
        _ => false,
    }
}

fn pinned(v: toml::Value) -> Result<Vec<String>, String> {
    let toml::Value::Array(items) = v else {
        return Err("must be a list of key names".into());
    };
    items
        .into_iter()
        .map(|i| match i {
            toml::Value::String(s) => Ok(s),
            _ => Err("must be a list of key names".into()),
        })
        .collect()
}

/// A TOML value as JSON; `{ fromEnv = "NAME" }` and `{ fromFile = "PATH" }` read the secret
/// (wrapped as one). Errors never quote a secret.
fn to_json(
    v: toml::Value,
    key: &str,
    dir: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Json, String> {
    Ok(match v {
        toml::Value::String(s) => Json::String(s),
        toml::Value::Integer(i) => Json::from(i),
        toml::Value::Float(f) => serde_json::Number::from_f64(f)
            .map(Json::Number)
            .ok_or("a float that is not finite")?,
        toml::Value::Boolean(b) => Json::Bool(b),
        toml::Value::Datetime(d) => Json::String(d.to_string()),
        toml::Value::Array(items) => Json::Array(
            items
                .into_iter()
                .enumerate()
                .map(|(i, v)| to_json(v, &format!("{key}[{i}]"), dir, env))
                .collect::<Result<_, _>>()?,
        ),
        toml::Value::Table(t) => {
            if let Some(secret) = secret_ref(&t, dir, env)? {
                return Ok(mark_secret(Json::String(secret)));
            }
            let mut m = Map::new();
            for (k, v) in t {
                let value = to_json(v, &format!("{key}.{k}"), dir, env)?;
                m.insert(k, value);
            }
            Json::Object(m)
        }
    })
}

/// The value of a secret reference, `None` when `t` is not one.
fn secret_ref(
    t: &toml::Table,
    dir: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<String>, String> {
    let refs = ["fromEnv", "fromFile"];
    if !t.keys().any(|k| refs.contains(&k.as_str())) {
        return Ok(None);
    }
    if t.len() != 1 {
        return Err("`fromEnv` or `fromFile` must be the only key of its table".into());
    }
    let (kind, v) = t.iter().next().ok_or("an empty reference")?;
    let toml::Value::String(name) = v else {
        return Err(format!("`{kind}` must be a string"));
    };
    if kind == "fromEnv" {
        return env(name)
            .map(Some)
            .ok_or_else(|| format!("the engine's environment variable `{name}` is not set"));
    }
    let path = dir.join(name);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read `{}`: {e}", path.display()))?;
    Ok(Some(settings::secret_file_text(text)))
}

/// Confines the `local` provider under the engine: without a `root` it gets `cwd`, and its
/// root is always pinned (a request cannot widen it).
pub(super) fn confine_local(settings: &mut EngineSettings, cwd: &Path) {
    let local = settings.providers.entry("local".to_owned()).or_default();
    local
        .values
        .entry("root")
        .or_insert_with(|| Json::String(cwd.display().to_string()));
    if !local.pinned.iter().any(|p| p == "root") {
        local.pinned.push("root".to_owned());
    }
}

/// Checks the settings against the installed providers at startup: every namespace is an
/// installed provider, every key is in its config schema, and the provider accepts the
/// whole (ValidateConfig). Errors name the key.
pub(super) async fn check(settings: &EngineSettings, host: &PluginHost) -> Result<(), String> {
    let entries: Vec<_> = settings
        .providers
        .iter()
        .map(|(ns, entry)| (ns.as_str(), &entry.values, &entry.values))
        .collect();
    settings::check_providers(host, "engine config", &entries).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<EngineSettings, String> {
        #[derive(serde::Deserialize)]
        struct F {
            providers: Option<toml::Table>,
            injectors: Option<toml::Table>,
        }
        let f: F = toml::from_str(text).map_err(|e| e.to_string())?;
        read(
            f.providers,
            f.injectors,
            Path::new("/etc/trellis.toml"),
            Path::new("/nonexistent"),
            env,
        )
    }

    #[test]
    fn providers_with_secrets_and_pins() {
        let s = parse(
            r#"
[providers.aws]
region = "eu-west-1"
secret_key = { fromEnv = "AWS_SECRET" }
nested = { endpoints = { s3 = "http://x" } }
pinned = ["region"]

[injectors."local/file"]
mode = "0640"
"#,
            &|n| (n == "AWS_SECRET").then(|| "hunter2".to_owned()),
        )
        .expect("reads");
        let aws = &s.providers["aws"];
        assert_eq!(aws.pinned, ["region"]);
        assert_eq!(aws.values["secret_key"], mark_secret(Json::from("hunter2")));
        assert_eq!(aws.values["nested"]["endpoints"]["s3"], "http://x");
        assert_eq!(s.injectors["local/file"]["mode"], "0640");
        // Debug output (what a log line of the config would show) never holds the secret.
        assert!(!format!("{s:?}").contains("hunter2"));
    }

    #[test]
    fn errors_name_the_key_and_never_the_secret() {
        let none = |_: &str| None;
        let err = parse("[providers.aws]\nk = { fromEnv = \"NOPE\" }\n", &none).unwrap_err();
        assert!(
            err.contains("`providers.aws.k`") && err.contains("`NOPE`"),
            "{err}"
        );
        let err = parse("[providers.aws]\npinned = [\"root\"]\n", &none).unwrap_err();
        assert!(err.contains("pins `root`"), "{err}");
        let err = parse("[providers.aws]\nk = { fromEnv = \"A\", x = 1 }\n", &none).unwrap_err();
        assert!(err.contains("only key"), "{err}");
        let err = parse("[injectors.\"local/file\"]\nmode = \"${x}\"\n", &none).unwrap_err();
        assert!(err.contains("literal"), "{err}");
        let err = parse("[injectors.file]\nmode = \"1\"\n", &none).unwrap_err();
        assert!(err.contains("not a resource type"), "{err}");
        let err = parse(
            "[injectors.\"local/file\"]\nmode = { fromEnv = \"M\" }\n",
            &|_| Some("0600".into()),
        )
        .unwrap_err();
        assert!(err.contains("secret") && !err.contains("0600"), "{err}");
    }

    #[test]
    fn local_is_confined_to_the_working_directory_by_default() {
        let mut s = EngineSettings::default();
        confine_local(&mut s, Path::new("/srv/engine"));
        assert_eq!(s.providers["local"].values["root"], "/srv/engine");
        assert_eq!(s.providers["local"].pinned, ["root"]);
        // A configured root stays, and is pinned too.
        let mut s = parse("[providers.local]\nroot = \"/data\"\n", &|_| None).expect("reads");
        confine_local(&mut s, Path::new("/srv/engine"));
        assert_eq!(s.providers["local"].values["root"], "/data");
        assert_eq!(s.providers["local"].pinned, ["root"]);
    }
}
