//! `celerity/config` → a Secrets Manager secret, or SSM parameters when
//! `plaintext` names keys.
//!
//! - Without `plaintext` (or with it empty): one `aws/secretsmanager/secret`
//!   of the same name whose value is the JSON object of `values`.
//! - With `plaintext`: one `aws/ssm/parameter` per key of `values`, named
//!   `<abstract>_<key>` in the blueprint and `/<store>/<key>` in SSM
//!   (`<store>` is `name`, else the resource's name); the `plaintext` keys are
//!   `String`, the others `SecureString`. The AWS provider has one resource
//!   per parameter (no parameter tree), so the store is the set of them: each
//!   carries the config's labels, and a handler selecting the config links to
//!   every one of them (read access, and an environment variable each).

use crate::model::{Input, Out, Resource};
use serde_json::{Map, Value as Json, json};
use trellis_plugin_sdk::prelude::*;

pub const TYPE: &str = "celerity/config";
pub const DESCRIPTION: &str = "A secret and configuration store: a Secrets Manager secret, or SSM parameters with `plaintext`";

pub fn schema() -> Schema {
    Schema::object()
        .describe("A secret and configuration store")
        .field(
            "name",
            Field::string().describe(
                "The store's name: the secret's name, or the SSM path prefix (`/<name>/<key>`); the resource's name when not set for parameters, derived from the instance for a secret",
            ),
        )
        .field(
            "values",
            Field::map(Schema::any())
                .describe("Key → value (string, number or boolean); secret unless listed in `plaintext`"),
        )
        .field(
            "plaintext",
            Field::array(Schema::string()).describe(
                "Keys whose values are not sensitive; when any is listed the store is SSM parameters (String for these, SecureString for the rest)",
            ),
        )
        .field(
            "replicate",
            Field::boolean()
                .default(false)
                .describe("Replicate the store to other regions (not supported on AWS yet)"),
        )
        .field(
            "encryptionKeyId",
            Field::string().describe(
                "The KMS key that encrypts the secret (SSM parameters use the account's default key)",
            ),
        )
        .field(
            "rotation",
            Field::object(Schema::object().field("period", Field::integer()))
                .describe("Rotation of managed secrets (planned for Celerity v1; not supported)"),
        )
}

/// A JSON-escaped string literal body (without quotes).
fn escape(s: &str) -> String {
    let quoted = serde_json::to_string(s).expect("a string serialises");
    quoted[1..quoted.len() - 1].to_owned()
}

/// The JSON text of `values`, keeping substitutions whole: only the text
/// around them is escaped, so the engine can evaluate them inside it.
pub(crate) fn json_text(values: &Map<String, Json>) -> String {
    let mut out = String::from("{");
    for (i, (k, v)) in values.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push('"');
        out.push_str(&escape(k));
        out.push_str("\":");
        match v {
            Json::String(s) => {
                out.push('"');
                let mut rest = s.as_str();
                while let Some(open) = rest.find("${") {
                    out.push_str(&escape(&rest[..open]));
                    let close = rest[open..].find('}').map_or(rest.len(), |c| open + c + 1);
                    out.push_str(&rest[open..close]);
                    rest = &rest[close..];
                }
                out.push_str(&escape(rest));
                out.push('"');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    out.push('}');
    out
}

/// The blueprint name of the parameter of `key`.
fn param_resource(r: &Resource, key: &str) -> String {
    let k: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{}_{k}", r.name)
}

pub fn emit(_input: &Input, r: &Resource, out: &mut Out) {
    out.check_spec(r, &schema());
    let spec = r.spec();
    let empty = Map::new();
    let values = spec
        .get("values")
        .and_then(Json::as_object)
        .unwrap_or(&empty);
    for (k, v) in values {
        if v.is_array() || v.is_object() || v.is_null() {
            out.error(
                "config.value-type",
                format!(
                    "value `{k}` of config `{}` must be a string, number or boolean",
                    r.name
                ),
                r.spec_at("values").field(k.as_str()),
            );
        }
    }
    let plaintext: Vec<&str> = spec
        .get("plaintext")
        .and_then(Json::as_array)
        .map(|p| p.iter().filter_map(Json::as_str).collect())
        .unwrap_or_default();
    if spec.get("replicate") == Some(&Json::Bool(true)) {
        out.warning(
            "config.replicate",
            format!("config `{}` is deployed to the provider's region only: replication is not supported on AWS yet", r.name),
            r.spec_at("replicate"),
        );
    }
    if spec.contains_key("rotation") {
        out.warning(
            "config.rotation",
            "secret rotation is planned for Celerity v1 and not supported; nothing is rotated",
            r.spec_at("rotation"),
        );
    }

    if plaintext.is_empty() {
        let mut s = Map::new();
        if let Some(name) = spec.get("name") {
            s.insert("secretName".into(), name.clone());
        }
        s.insert("secretString".into(), json!(json_text(values)));
        if let Some(k) = spec.get("encryptionKeyId") {
            s.insert("kmsKeyId".into(), k.clone());
        }
        out.emit(&r.name, r, "aws/secretsmanager/secret", Json::Object(s));
        out.alias_fields(r, &[("name", "secretName"), ("id", "arn")]);
        return;
    }

    // Parameter Store.
    if values.is_empty() {
        out.warning(
            "config.empty-store",
            format!(
                "config `{}` keeps its values as SSM parameters, one per value, and has no `values`: nothing is deployed for it, and handlers that link to it get no access",
                r.name
            ),
            r.at().field("spec"),
        )
        .hint = Some(
            "set `values`, or leave `plaintext` empty to deploy the config as one secret".into(),
        );
    }
    for (i, key) in plaintext.iter().enumerate() {
        if !values.contains_key(*key) {
            out.warning(
                "config.plaintext-unknown",
                format!("`{key}` is not a key of `values`"),
                r.spec_at("plaintext").index(i as u64),
            );
        }
    }
    if spec.contains_key("encryptionKeyId") {
        out.warning(
            "config.parameter-key",
            "SecureString parameters are encrypted with the account's default SSM key: the AWS provider's parameters take no key yet",
            r.spec_at("encryptionKeyId"),
        )
        .hint = Some("leave `plaintext` empty to store the config as a secret, which takes the key".into());
    }
    let store = spec
        .get("name")
        .and_then(Json::as_str)
        .unwrap_or(&r.name)
        .trim_matches('/')
        .to_owned();
    for (k, v) in values {
        if !k
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
        {
            out.error(
                "config.parameter-name",
                format!("key `{k}` cannot be part of an SSM parameter name (letters, digits, `_`, `.` and `-`)"),
                r.spec_at("values").field(k.as_str()),
            );
            continue;
        }
        let value = match v {
            Json::String(s) => json!(s),
            other => json!(other.to_string()),
        };
        let ty = if plaintext.contains(&k.as_str()) {
            "String"
        } else {
            "SecureString"
        };
        let name = param_resource(r, k);
        out.emit(
            &name,
            r,
            "aws/ssm/parameter",
            json!({"name": format!("/{store}/{k}"), "type": ty, "value": value}),
        );
    }
    if !store.contains("${") {
        out.alias(r, "id", format!("\"/{store}\""));
        out.alias(r, "name", format!("\"{store}\""));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_text_escapes_text_and_keeps_substitutions_whole() {
        let values = serde_json::json!({
            "A": "plain \"quoted\"",
            "B": "${variables.dbPass}",
            "C": "x-${join(variables.hosts, \",\")}-y",
            "N": 5,
            "T": true
        });
        let text = json_text(values.as_object().expect("object"));
        assert_eq!(
            text,
            r#"{"A":"plain \"quoted\"","B":"${variables.dbPass}","C":"x-${join(variables.hosts, ",")}-y","N":5,"T":true}"#
        );
        // Without substitutions it is JSON.
        let plain = serde_json::json!({"A": "a\nb", "N": 1.5});
        let text = json_text(plain.as_object().expect("object"));
        assert_eq!(
            serde_json::from_str::<Json>(&text).expect("valid JSON"),
            plain
        );
    }

    #[test]
    fn config_as_a_secret_and_as_parameters() {
        let out = crate::transform_doc(serde_json::json!({
            "version": "2023-04-20",
            "transform": "celerity-2023-04-20",
            "resources": {
                "secrets": {
                    "type": "celerity/config",
                    "metadata": {"labels": {"app": "orders"}},
                    "spec": {"name": "orders-secrets", "encryptionKeyId": "alias/app",
                             "values": {"dbPassword": "${variables.dbPassword}", "retries": 3}}
                },
                "settings": {
                    "type": "celerity/config",
                    "metadata": {"labels": {"app": "orders"}},
                    "spec": {"values": {"region": "eu-west-1", "apiKey": "k", "debug": false},
                             "plaintext": ["region", "debug"]}
                },
                "reader": {
                    "type": "aws/lambda/function",
                    "spec": {"codeUri": "./r",
                             "description": "${resources.secrets.spec.id} ${resources.secrets.spec.name} ${resources.settings.spec.id}"}
                }
            }
        }));
        assert!(
            out.diagnostics.is_empty(),
            "{:?}",
            crate::model::diagnostic_lines(&out.diagnostics)
        );
        insta::assert_json_snapshot!("config", out.blueprint["resources"]);
        let derived: Vec<(&str, &str)> = out
            .derivations
            .iter()
            .map(|d| (d.generated_resource.as_str(), d.abstract_resource.as_str()))
            .collect();
        assert_eq!(
            derived,
            [
                ("secrets", "secrets"),
                ("settings_region", "settings"),
                ("settings_apiKey", "settings"),
                ("settings_debug", "settings")
            ]
        );
    }

    #[test]
    fn config_diagnostics() {
        let out = crate::transform_doc(serde_json::json!({
            "version": "2023-04-20",
            "transform": "celerity-2023-04-20",
            "resources": {
                "a": {"type": "celerity/config",
                      "spec": {"values": {"x": [1], "bad key": "v"}, "plaintext": ["x", "missing"],
                               "replicate": true, "encryptionKeyId": "k", "rotation": {"period": 30}}},
                "empty": {"type": "celerity/config", "spec": {"plaintext": ["LATER"]}}
            }
        }));
        insta::assert_json_snapshot!(
            "config_diagnostics",
            crate::model::diagnostic_lines(&out.diagnostics)
        );
    }
}
