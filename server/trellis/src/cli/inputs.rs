//! `--env FILE`, `--var-file FILE` and `--var NAME=VALUE`: what `validate`, `plan` and `deploy`
//! send besides the blueprint (docs/configuration.md). Secret references in an environment file
//! are read here, on the caller's machine, so a secret never needs to be in argv.

use std::path::PathBuf;

use indexmap::IndexMap;
use serde_json::{Map, Value as Json};
use trellis_proto::engine::v1 as pb;
use trellis_proto::plugin::v1 as pv;

use super::environment::{EnvironmentFile, load_environment, load_var_file};
use crate::engine::settings::Environment;
use crate::engine::state_values::to_pb;

#[derive(clap::Args, Debug, Clone, Default)]
pub struct InputArgs {
    /// An environment file (YAML): the stage's variables (values, or `{fromEnv: NAME}` /
    /// `{fromFile: PATH}` secrets read on this machine), provider settings merged over the
    /// engine's, and property injectors. See docs/configuration.md.
    #[arg(long = "env", value_name = "FILE")]
    pub env: Option<PathBuf>,
    /// A file of variable values (a YAML or JSON mapping of name to value). Repeatable: later
    /// files win over earlier ones and over `--env`; `--var` wins over all.
    #[arg(long = "var-file", value_name = "FILE")]
    pub var_files: Vec<PathBuf>,
}

impl InputArgs {
    pub fn is_empty(&self) -> bool {
        self.env.is_none() && self.var_files.is_empty()
    }
}

/// The request's inputs, resolved.
#[derive(Default)]
pub struct Resolved {
    /// In precedence order (the engine takes the last value given for a name).
    pub variables: Vec<pb::Variable>,
    pub environment: Option<EnvironmentFile>,
}

impl Resolved {
    /// The variables as `(name, value)` text pairs, for local validation.
    pub fn pairs(&self) -> Vec<(String, String)> {
        self.variables
            .iter()
            .map(|v| (v.name.clone(), v.value.clone()))
            .collect()
    }

    /// The environment as the engine API carries it.
    pub fn environment_pb(&self) -> Option<pb::Environment> {
        let env = self.environment.as_ref()?;
        let map = |entries: Vec<(String, Json)>| pv::Value {
            kind: Some(pv::value::Kind::Map(pv::MapValue {
                entries: entries
                    .into_iter()
                    .map(|(key, v)| pv::MapEntry {
                        key,
                        value: Some(to_pb(&v)),
                    })
                    .collect(),
            })),
            sensitive: false,
        };
        Some(pb::Environment {
            name: env.name.clone(),
            digest: env.digest.clone(),
            providers: Some(map(env
                .providers
                .iter()
                .map(|(k, v)| (k.clone(), Json::Object(v.clone())))
                .collect())),
            injectors: Some(map(env
                .injectors
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect())),
        })
    }

    /// The environment as the engine's model has it (for local validation).
    pub fn environment_model(&self) -> Environment {
        let Some(env) = &self.environment else {
            return Environment::default();
        };
        Environment {
            name: env.name.clone(),
            file_digest: env.digest.clone(),
            providers: env
                .providers
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<IndexMap<String, Map<String, Json>>>(),
            injectors: env
                .injectors
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            secret_variables: self
                .variables
                .iter()
                .filter(|v| v.secret)
                .map(|v| v.name.clone())
                .collect(),
        }
    }
}

/// Reads the environment file and variable files; `vars` are the `--var` values.
pub fn resolve(args: &InputArgs, vars: &[(String, String)]) -> Result<Resolved, String> {
    let mut out = Resolved::default();
    if let Some(path) = &args.env {
        let env = load_environment(path)?;
        out.variables
            .extend(env.variables.iter().map(|v| pb::Variable {
                name: v.name.clone(),
                value: v.value.clone(),
                secret: v.secret,
            }));
        out.environment = Some(env);
    }
    for path in &args.var_files {
        out.variables.extend(
            load_var_file(path)?
                .into_iter()
                .map(|(name, value)| pb::Variable {
                    name,
                    value,
                    secret: false,
                }),
        );
    }
    out.variables
        .extend(vars.iter().map(|(name, value)| pb::Variable {
            name: name.clone(),
            value: value.clone(),
            secret: false,
        }));
    // A variable an environment file marked secret stays secret whatever overrides it.
    let secret: Vec<String> = out
        .variables
        .iter()
        .filter(|v| v.secret)
        .map(|v| v.name.clone())
        .collect();
    for v in &mut out.variables {
        v.secret |= secret.contains(&v.name);
    }
    Ok(out)
}
