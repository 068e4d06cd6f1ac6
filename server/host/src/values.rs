//! Conversions between the protocol's `Value` and JSON or the evaluator's
//! value model.

use serde_json::Value as Json;
use trellis_proto::plugin::v1 as pb;
use trellis_proto::plugin::v1::value::Kind;

use crate::eval::value::Value as EvalValue;

fn value(kind: Kind) -> pb::Value {
    pb::Value {
        kind: Some(kind),
        sensitive: false,
    }
}

pub fn null() -> pb::Value {
    value(Kind::Null(pb::NullValue::NullValue as i32))
}

pub fn string(s: impl Into<String>) -> pb::Value {
    value(Kind::String(s.into()))
}

/// JSON to a protocol value. Integers that fit `i64` stay integers; object
/// key order is kept.
pub fn from_json(j: &Json) -> pb::Value {
    match j {
        Json::Null => null(),
        Json::Bool(b) => value(Kind::Bool(*b)),
        Json::Number(n) => match n.as_i64() {
            Some(i) => value(Kind::Int(i)),
            None => value(Kind::Float(n.as_f64().unwrap_or(f64::NAN))),
        },
        Json::String(s) => string(s.clone()),
        Json::Array(items) => value(Kind::List(pb::ListValue {
            items: items.iter().map(from_json).collect(),
        })),
        Json::Object(map) => value(Kind::Map(pb::MapValue {
            entries: map
                .iter()
                .map(|(k, v)| pb::MapEntry {
                    key: k.clone(),
                    value: Some(from_json(v)),
                })
                .collect(),
        })),
    }
}

/// How [`to_json`] renders what JSON cannot carry.
#[derive(Clone, Copy, Debug, Default)]
pub struct JsonMarks {
    /// Render sensitive values as the string `(sensitive)`.
    pub mask_sensitive: bool,
}

/// A protocol value as JSON. Unknown values become `{"$unknown": true}`;
/// non-finite floats become null.
pub fn to_json(v: &pb::Value, marks: JsonMarks) -> Json {
    if marks.mask_sensitive && v.sensitive {
        return Json::String("(sensitive)".into());
    }
    match &v.kind {
        None | Some(Kind::Null(_)) => Json::Null,
        Some(Kind::Bool(b)) => Json::Bool(*b),
        Some(Kind::Int(i)) => Json::from(*i),
        Some(Kind::Float(f)) => serde_json::Number::from_f64(*f).map_or(Json::Null, Json::Number),
        Some(Kind::String(s)) => Json::String(s.clone()),
        Some(Kind::List(l)) => Json::Array(l.items.iter().map(|i| to_json(i, marks)).collect()),
        Some(Kind::Map(m)) => Json::Object(
            m.entries
                .iter()
                .map(|e| {
                    (
                        e.key.clone(),
                        e.value.as_ref().map_or(Json::Null, |v| to_json(v, marks)),
                    )
                })
                .collect(),
        ),
        Some(Kind::Unknown(_)) => serde_json::json!({"$unknown": true}),
    }
}

/// True when the value or anything inside it is marked sensitive.
pub fn any_sensitive(v: &pb::Value) -> bool {
    v.sensitive
        || match &v.kind {
            Some(Kind::List(l)) => l.items.iter().any(any_sensitive),
            Some(Kind::Map(m)) => m
                .entries
                .iter()
                .any(|e| e.value.as_ref().is_some_and(any_sensitive)),
            _ => false,
        }
}

/// A protocol value as an evaluator value.
pub fn to_eval(v: &pb::Value) -> EvalValue {
    match &v.kind {
        None | Some(Kind::Null(_)) => EvalValue::Null,
        Some(Kind::Bool(b)) => EvalValue::Bool(*b),
        Some(Kind::Int(i)) => EvalValue::Int(*i),
        Some(Kind::Float(f)) => EvalValue::Float(*f),
        Some(Kind::String(s)) => EvalValue::Str(s.clone()),
        Some(Kind::List(l)) => EvalValue::List(l.items.iter().map(to_eval).collect()),
        Some(Kind::Map(m)) => EvalValue::Map(
            m.entries
                .iter()
                .map(|e| {
                    (
                        e.key.clone(),
                        e.value.as_ref().map_or(EvalValue::Null, to_eval),
                    )
                })
                .collect(),
        ),
        Some(Kind::Unknown(_)) => EvalValue::Unknown,
    }
}

/// An evaluator value as a protocol value; `None` for a function value,
/// which cannot leave the evaluator.
pub fn from_eval(v: &EvalValue) -> Option<pb::Value> {
    Some(match v {
        EvalValue::Null => null(),
        EvalValue::Bool(b) => value(Kind::Bool(*b)),
        EvalValue::Int(i) => value(Kind::Int(*i)),
        EvalValue::Float(f) => value(Kind::Float(*f)),
        EvalValue::Str(s) => string(s.clone()),
        EvalValue::List(items) => value(Kind::List(pb::ListValue {
            items: items.iter().map(from_eval).collect::<Option<_>>()?,
        })),
        EvalValue::Map(m) => value(Kind::Map(pb::MapValue {
            entries: m
                .iter()
                .map(|(k, v)| {
                    Some(pb::MapEntry {
                        key: k.clone(),
                        value: Some(from_eval(v)?),
                    })
                })
                .collect::<Option<_>>()?,
        })),
        EvalValue::Func(_) => return None,
        EvalValue::Unknown => value(Kind::Unknown(pb::Unknown {})),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_round_trip_keeps_order_and_types() {
        let j: Json =
            serde_json::from_str(r#"{"b":1,"a":[true,null,1.5,"x"],"c":{"z":-3}}"#).unwrap();
        let v = from_json(&j);
        assert_eq!(to_json(&v, JsonMarks::default()), j);
        assert_eq!(
            serde_json::to_string(&to_json(&v, JsonMarks::default())).unwrap(),
            r#"{"b":1,"a":[true,null,1.5,"x"],"c":{"z":-3}}"#
        );
    }

    #[test]
    fn sensitive_is_masked() {
        let mut v = string("secret");
        v.sensitive = true;
        let list = value(Kind::List(pb::ListValue { items: vec![v] }));
        assert!(any_sensitive(&list));
        assert_eq!(
            to_json(
                &list,
                JsonMarks {
                    mask_sensitive: true
                }
            ),
            serde_json::json!(["(sensitive)"])
        );
    }
}
