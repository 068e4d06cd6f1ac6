//! Printing evaluated values for people and for machines.
//!
//! Unknown values print as `(known after deploy)` in text and as
//! `{"unknown": true}` in JSON; anything derived from a secret prints as
//! `(sensitive)` / `{"sensitive": true}`.

use super::value::Value;
use serde_json::json;

pub const UNKNOWN_TEXT: &str = "(known after deploy)";
pub const SENSITIVE_TEXT: &str = "(sensitive)";

/// JSON for a value, with unknowns (at any depth) as `{"unknown": true}`.
pub fn to_json(v: &Value) -> serde_json::Value {
    match v {
        Value::Unknown => json!({"unknown": true}),
        Value::Func(_) => json!({"function": true}),
        Value::List(items) => serde_json::Value::Array(items.iter().map(to_json).collect()),
        Value::Map(m) => {
            serde_json::Value::Object(m.iter().map(|(k, v)| (k.clone(), to_json(v))).collect())
        }
        other => other.to_json().unwrap_or(serde_json::Value::Null),
    }
}

/// Text for a value: strings as they are, everything else as JSON in which
/// unknowns read `(known after deploy)`.
pub fn to_text(v: &Value) -> String {
    fn text_json(v: &Value) -> serde_json::Value {
        match v {
            Value::Unknown => serde_json::Value::String(UNKNOWN_TEXT.to_owned()),
            Value::Func(_) => serde_json::Value::String("(function)".to_owned()),
            Value::List(items) => serde_json::Value::Array(items.iter().map(text_json).collect()),
            Value::Map(m) => serde_json::Value::Object(
                m.iter().map(|(k, v)| (k.clone(), text_json(v))).collect(),
            ),
            other => other.to_json().unwrap_or(serde_json::Value::Null),
        }
    }
    match v {
        Value::Unknown => UNKNOWN_TEXT.to_owned(),
        Value::Str(s) => s.clone(),
        other => serde_json::to_string_pretty(&text_json(other)).unwrap_or_default(),
    }
}
