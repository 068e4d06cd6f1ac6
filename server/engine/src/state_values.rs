//! How values are kept in state: JSON, with a secret wrapped as `{"$sensitive": value}` so the
//! mark survives storage. The wrapper is removed where the value is used (evaluation, diffs),
//! turned into the protocol's `sensitive` flag for providers, and masked in everything shown
//! (API answers, events, plans).

use serde_json::{Map, Value as Json};
use trellis_proto::plugin::v1::{self as pb, value::Kind};

use crate::eval::value::Value;

const SENSITIVE: &str = "$sensitive";

fn wrapped(o: &Map<String, Json>) -> Option<&Json> {
    if o.len() == 1 { o.get(SENSITIVE) } else { None }
}

/// `v` marked secret, as stored.
pub fn mark_secret(v: Json) -> Json {
    let mut o = Map::new();
    o.insert(SENSITIVE.to_owned(), v);
    Json::Object(o)
}

/// The content of a secret mark (`{"$sensitive": v}` gives `v`); `None` for any other value.
pub fn sensitive_inner(v: &Json) -> Option<&Json> {
    match v {
        Json::Object(o) => wrapped(o),
        _ => None,
    }
}

/// Whether a stored value is, or holds, a secret.
pub fn holds_secret(v: &Json) -> bool {
    match v {
        Json::Object(o) => wrapped(o).is_some() || o.values().any(holds_secret),
        Json::Array(items) => items.iter().any(holds_secret),
        _ => false,
    }
}

/// The text of every scalar marked secret inside `v` (`inside`: `v` is within a mark).
pub fn secret_texts(v: &Json, inside: bool, out: &mut Vec<String>) {
    match v {
        Json::Object(o) => match wrapped(o) {
            Some(inner) => secret_texts(inner, true, out),
            None => o.values().for_each(|x| secret_texts(x, inside, out)),
        },
        Json::Array(items) => items.iter().for_each(|x| secret_texts(x, inside, out)),
        Json::String(s) if inside && !s.is_empty() => out.push(s.clone()),
        Json::Number(n) if inside => out.push(n.to_string()),
        _ => {}
    }
}

/// The secrets an instance records: in its resources' specs and states, its links' data and
/// its exports.
pub fn instance_secrets(state: &crate::state::InstanceState) -> Vec<String> {
    let mut out = Vec::new();
    for r in &state.resources {
        secret_texts(&r.spec, false, &mut out);
        if let Some(s) = &r.state {
            secret_texts(s, false, &mut out);
        }
    }
    for l in &state.links {
        secret_texts(&l.data, false, &mut out);
    }
    for e in &state.exports {
        secret_texts(&e.value, false, &mut out);
    }
    out
}

/// `v` with every string outside a mark that `is_secret` says holds a secret marked: a
/// provider's output that quotes a secret it was given (an absolute path built from a secret
/// one) is as secret as its input, whether or not the provider marked it.
pub fn mark_mentions(v: Json, is_secret: &dyn Fn(&str) -> bool) -> Json {
    match v {
        Json::Object(o) if wrapped(&o).is_some() => Json::Object(o),
        Json::Object(o) => Json::Object(
            o.into_iter()
                .map(|(k, x)| (k, mark_mentions(x, is_secret)))
                .collect(),
        ),
        Json::Array(items) => Json::Array(
            items
                .into_iter()
                .map(|x| mark_mentions(x, is_secret))
                .collect(),
        ),
        Json::String(s) if is_secret(&s) => mark_secret(Json::String(s)),
        other => other,
    }
}

/// The value without secret wrappers.
pub fn unwrap(v: &Json) -> Json {
    match v {
        Json::Object(o) => match wrapped(o) {
            Some(inner) => unwrap(inner),
            None => Json::Object(o.iter().map(|(k, v)| (k.clone(), unwrap(v))).collect()),
        },
        Json::Array(items) => Json::Array(items.iter().map(unwrap).collect()),
        other => other.clone(),
    }
}

/// A stored value as the evaluator sees it (secrets in clear: it feeds providers).
pub fn to_eval(v: &Json) -> Value {
    Value::from_json(&unwrap(v))
}

/// A resource's recorded state (`None`: not deployed) given to the evaluation: the value, and
/// a masked copy when the provider marked some of it sensitive, so reads of it are secret.
pub fn set_state(rv: &mut crate::eval::expr::ResourceValue, stored: Option<&Json>) {
    rv.state = stored.map(to_eval);
    rv.masked_state = stored.filter(|s| holds_secret(s)).map(masked_eval);
}

/// A stored value with each secret replaced by the sensitive marker.
fn masked_eval(v: &Json) -> Value {
    match v {
        Json::Object(o) if wrapped(o).is_some() => {
            Value::Str(crate::eval::render::SENSITIVE_TEXT.to_owned())
        }
        Json::Object(o) => Value::Map(o.iter().map(|(k, v)| (k.clone(), masked_eval(v))).collect()),
        Json::Array(items) => Value::List(items.iter().map(masked_eval).collect()),
        other => Value::from_json(other),
    }
}

/// A stored value for a provider call: secrets carry the protocol's sensitive flag.
pub fn to_pb(v: &Json) -> pb::Value {
    match v {
        Json::Object(o) => {
            if let Some(inner) = wrapped(o) {
                let mut p = to_pb(inner);
                p.sensitive = true;
                return p;
            }
            pb::Value {
                kind: Some(Kind::Map(pb::MapValue {
                    entries: o
                        .iter()
                        .map(|(k, v)| pb::MapEntry {
                            key: k.clone(),
                            value: Some(to_pb(v)),
                        })
                        .collect(),
                })),
                sensitive: false,
            }
        }
        Json::Array(items) => pb::Value {
            kind: Some(Kind::List(pb::ListValue {
                items: items.iter().map(to_pb).collect(),
            })),
            sensitive: false,
        },
        other => crate::plugins::values::from_json(other),
    }
}

/// A provider's value for storage: sensitive parts wrapped, unknown parts null.
pub fn from_pb(v: &pb::Value) -> Json {
    let plain = match &v.kind {
        None | Some(Kind::Null(_)) | Some(Kind::Unknown(_)) => Json::Null,
        Some(Kind::Bool(b)) => Json::Bool(*b),
        Some(Kind::Int(i)) => Json::from(*i),
        Some(Kind::Float(f)) => serde_json::Number::from_f64(*f).map_or(Json::Null, Json::Number),
        Some(Kind::String(s)) => Json::String(s.clone()),
        Some(Kind::List(l)) => Json::Array(l.items.iter().map(from_pb).collect()),
        Some(Kind::Map(m)) => Json::Object(
            m.entries
                .iter()
                .map(|e| (e.key.clone(), e.value.as_ref().map_or(Json::Null, from_pb)))
                .collect(),
        ),
    };
    if v.sensitive {
        mark_secret(plain)
    } else {
        plain
    }
}

/// An evaluated spec for storage. Where `masked` (the evaluator's copy with secret-derived
/// strings replaced) differs, the field is wrapped as sensitive. Unknown parts are null (an
/// executed spec has none).
pub fn eval_to_stored(v: &Value, masked: Option<&Value>) -> Json {
    match (v, masked) {
        (Value::Map(m), Some(Value::Map(mm))) => Json::Object(
            m.iter()
                .map(|(k, x)| (k.clone(), eval_to_stored(x, mm.get(k))))
                .collect(),
        ),
        (Value::List(items), Some(Value::List(mi))) => Json::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, x)| eval_to_stored(x, mi.get(i)))
                .collect(),
        ),
        (x, Some(m)) if x != m => mark_secret(eval_to_json(x)),
        (x, _) => eval_to_json(x),
    }
}

/// An evaluated value as plain JSON (unknowns and functions as null).
pub fn eval_to_json(v: &Value) -> Json {
    match v {
        Value::List(items) => Json::Array(items.iter().map(eval_to_json).collect()),
        Value::Map(m) => Json::Object(
            m.iter()
                .map(|(k, x)| (k.clone(), eval_to_json(x)))
                .collect(),
        ),
        other => other.to_json().unwrap_or(Json::Null),
    }
}

/// A stored value as it may be printed: each secret replaced by `"(sensitive)"`.
pub fn masked(v: &Json) -> Json {
    match v {
        Json::Object(o) if wrapped(o).is_some() => Json::String("(sensitive)".to_owned()),
        Json::Object(o) => Json::Object(o.iter().map(|(k, v)| (k.clone(), masked(v))).collect()),
        Json::Array(items) => Json::Array(items.iter().map(masked).collect()),
        other => other.clone(),
    }
}

/// A stored value for API answers: secrets replaced by the sensitive marker (no value).
pub fn to_api(v: &Json) -> pb::Value {
    match v {
        Json::Object(o) => {
            if wrapped(o).is_some() {
                return pb::Value {
                    kind: None,
                    sensitive: true,
                };
            }
            pb::Value {
                kind: Some(Kind::Map(pb::MapValue {
                    entries: o
                        .iter()
                        .map(|(k, v)| pb::MapEntry {
                            key: k.clone(),
                            value: Some(to_api(v)),
                        })
                        .collect(),
                })),
                sensitive: false,
            }
        }
        Json::Array(items) => pb::Value {
            kind: Some(Kind::List(pb::ListValue {
                items: items.iter().map(to_api).collect(),
            })),
            sensitive: false,
        },
        other => crate::plugins::values::from_json(other),
    }
}

/// An evaluated value for API answers (plans): unknowns as `unknown`, secrets per `masked`.
pub fn eval_to_api(v: &Value) -> pb::Value {
    match v {
        Value::Unknown => pb::Value {
            kind: Some(Kind::Unknown(pb::Unknown {})),
            sensitive: false,
        },
        Value::List(items) => pb::Value {
            kind: Some(Kind::List(pb::ListValue {
                items: items.iter().map(eval_to_api).collect(),
            })),
            sensitive: false,
        },
        Value::Map(m) => pb::Value {
            kind: Some(Kind::Map(pb::MapValue {
                entries: m
                    .iter()
                    .map(|(k, x)| pb::MapEntry {
                        key: k.clone(),
                        value: Some(eval_to_api(x)),
                    })
                    .collect(),
            })),
            sensitive: false,
        },
        other => crate::plugins::values::from_json(&other.to_json().unwrap_or(Json::Null)),
    }
}

/// `observed` (a provider's view of a spec) as an evaluator value in which every field that is
/// secret in `recorded` reads `(sensitive)`: the masked copy the diff needs so drift reports
/// never show a secret. `None` when `recorded` holds no secret.
pub fn mask_like(observed: &Json, recorded: &Json) -> Option<Value> {
    fn has_secret(v: &Json) -> bool {
        match v {
            Json::Object(o) => wrapped(o).is_some() || o.values().any(has_secret),
            Json::Array(items) => items.iter().any(has_secret),
            _ => false,
        }
    }
    fn go(observed: &Json, recorded: Option<&Json>) -> Value {
        match (observed, recorded) {
            (_, Some(Json::Object(r))) if wrapped(r).is_some() => {
                Value::Str(crate::eval::render::SENSITIVE_TEXT.to_owned())
            }
            (Json::Object(o), Some(Json::Object(r))) => Value::Map(
                o.iter()
                    .map(|(k, v)| (k.clone(), go(v, r.get(k))))
                    .collect(),
            ),
            (Json::Array(items), Some(Json::Array(r))) => Value::List(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, v)| go(v, r.get(i)))
                    .collect(),
            ),
            (other, _) => Value::from_json(other),
        }
    }
    has_secret(recorded).then(|| go(observed, Some(recorded)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use indexmap::IndexMap;
    use serde_json::json;

    #[test]
    fn secrets_survive_storage_and_are_masked_when_shown() {
        let mut m = IndexMap::new();
        m.insert("user".to_owned(), Value::Str("app".into()));
        m.insert("password".to_owned(), Value::Str("hunter2".into()));
        let mut mm = m.clone();
        mm.insert("password".to_owned(), Value::Str("(sensitive)".into()));
        let stored = eval_to_stored(&Value::Map(m), Some(&Value::Map(mm)));
        assert_eq!(
            stored,
            json!({ "user": "app", "password": { "$sensitive": "hunter2" } })
        );
        // Providers get the value, flagged.
        let p = to_pb(&stored);
        assert!(crate::plugins::values::any_sensitive(&p));
        // Evaluation and diffs see the plain value.
        assert_eq!(
            unwrap(&stored),
            json!({ "user": "app", "password": "hunter2" })
        );
        // API answers never carry it.
        let shown = format!("{:?}", to_api(&stored));
        assert!(!shown.contains("hunter2"), "{shown}");
        // A provider's sensitive output is wrapped for storage.
        let from = from_pb(&p);
        assert_eq!(from, stored);
    }
}
