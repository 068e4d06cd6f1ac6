//! The SDK's value model ([`Value`]) and attribute paths ([`AttrPath`]).
//!
//! A [`Value`] is what a plugin reads (specs, provider config, function
//! arguments) and writes (state, function results). It is JSON plus two
//! explicit markers the protocol carries:
//!
//! - [`Value::Unknown`]: known only after deploy (only seen in validation and
//!   planning; the engine resolves everything before create and update).
//! - [`Value::Sensitive`]: a secret. Its `Debug` and `Display` print
//!   `(sensitive)`, so logging a value never leaks one.

use std::fmt;

use indexmap::IndexMap;
use trellis_proto::plugin::v1 as pb;

/// An ordered map of values (insertion order is kept, as everywhere in Trellis).
pub type Map = IndexMap<String, Value>;

/// A value exchanged with the engine.
#[derive(Clone, PartialEq, Default)]
pub enum Value {
    /// JSON null, also "not set".
    #[default]
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    String(String),
    List(Vec<Value>),
    Map(Map),
    /// Known only after deploy. Never a sentinel string.
    Unknown,
    /// A secret. Accessors (`as_str`, `get`, ...) look through it; `Debug`
    /// and `Display` mask it.
    Sensitive(Box<Value>),
}

impl Value {
    /// Marks `v` as sensitive (idempotent: never nests the marker).
    pub fn sensitive(v: impl Into<Value>) -> Value {
        match v.into() {
            s @ Value::Sensitive(_) => s,
            other => Value::Sensitive(Box::new(other)),
        }
    }

    /// An empty map.
    pub fn map() -> Value {
        Value::Map(Map::new())
    }

    /// A map from `(key, value)` pairs, in order.
    pub fn map_of<K: Into<String>, V: Into<Value>>(
        entries: impl IntoIterator<Item = (K, V)>,
    ) -> Value {
        Value::Map(
            entries
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )
    }

    /// Sets `key` when this is a map (or `Null`, which becomes a map); returns
    /// `self` for chaining. On other values it does nothing.
    pub fn with(mut self, key: impl Into<String>, value: impl Into<Value>) -> Value {
        self.insert(key, value);
        self
    }

    /// Sets `key` when this is a map (or `Null`, which becomes a map).
    /// Returns false (and changes nothing) on any other value.
    pub fn insert(&mut self, key: impl Into<String>, value: impl Into<Value>) -> bool {
        if let Value::Null = self {
            *self = Value::map();
        }
        match self.revealed_mut() {
            Value::Map(m) => {
                m.insert(key.into(), value.into());
                true
            }
            _ => false,
        }
    }

    /// True for [`Value::Sensitive`].
    pub fn is_sensitive(&self) -> bool {
        matches!(self, Value::Sensitive(_))
    }

    /// The value without its sensitive marker (the value itself when it has none).
    pub fn revealed(&self) -> &Value {
        match self {
            Value::Sensitive(inner) => inner.revealed(),
            other => other,
        }
    }

    fn revealed_mut(&mut self) -> &mut Value {
        match self {
            Value::Sensitive(inner) => inner.revealed_mut(),
            other => other,
        }
    }

    /// Consumes the value, dropping a top-level sensitive marker.
    pub fn into_revealed(self) -> Value {
        match self {
            Value::Sensitive(inner) => inner.into_revealed(),
            other => other,
        }
    }

    /// Null (or a sensitive null).
    pub fn is_null(&self) -> bool {
        matches!(self.revealed(), Value::Null)
    }

    /// Unknown at this level (not looking inside lists and maps).
    pub fn is_unknown(&self) -> bool {
        matches!(self.revealed(), Value::Unknown)
    }

    /// True when no [`Value::Unknown`] appears anywhere inside.
    pub fn is_known(&self) -> bool {
        match self.revealed() {
            Value::Unknown => false,
            Value::List(items) => items.iter().all(Value::is_known),
            Value::Map(m) => m.values().all(Value::is_known),
            _ => true,
        }
    }

    /// True when a sensitive marker appears anywhere inside.
    pub fn contains_sensitive(&self) -> bool {
        match self {
            Value::Sensitive(_) => true,
            Value::List(items) => items.iter().any(Value::contains_sensitive),
            Value::Map(m) => m.values().any(Value::contains_sensitive),
            _ => false,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self.revealed() {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// An integer (a float is not an integer, even `2.0`).
    pub fn as_i64(&self) -> Option<i64> {
        match self.revealed() {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// A float, or an integer widened to a float.
    pub fn as_f64(&self) -> Option<f64> {
        match self.revealed() {
            Value::Float(f) => Some(*f),
            Value::Int(i) => Some(*i as f64),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self.revealed() {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_list(&self) -> Option<&[Value]> {
        match self.revealed() {
            Value::List(items) => Some(items),
            _ => None,
        }
    }

    pub fn as_map(&self) -> Option<&Map> {
        match self.revealed() {
            Value::Map(m) => Some(m),
            _ => None,
        }
    }

    /// The entry `key` of a map (None when this is not a map or has no such key).
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.as_map().and_then(|m| m.get(key))
    }

    /// The value at `path` (fields of maps, indexes of lists).
    pub fn get_path(&self, path: &AttrPath) -> Option<&Value> {
        let mut cur = self;
        for step in path.steps() {
            cur = match step {
                PathStep::Field(f) => cur.get(f)?,
                PathStep::Index(i) => cur.as_list()?.get(usize::try_from(*i).ok()?)?,
            };
        }
        Some(cur)
    }

    /// The kind of value, for messages ("string", "integer", ...). Never the
    /// value itself, so it is safe for secrets.
    pub fn kind_name(&self) -> &'static str {
        match self.revealed() {
            Value::Null => "null",
            Value::Bool(_) => "boolean",
            Value::Int(_) => "integer",
            Value::Float(_) => "float",
            Value::String(_) => "string",
            Value::List(_) => "array",
            Value::Map(_) => "object",
            Value::Unknown => "unknown",
            Value::Sensitive(_) => "sensitive",
        }
    }

    /// Converts from JSON. Integers that fit `i64` become [`Value::Int`],
    /// other numbers [`Value::Float`].
    pub fn from_json(json: serde_json::Value) -> Value {
        Value::from(json)
    }

    /// Converts to JSON, revealing secrets and turning [`Value::Unknown`] into
    /// null. Use it for values you know to be complete (specs in create and
    /// update are). Non-finite floats become null.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match self {
            Value::Null | Value::Unknown => J::Null,
            Value::Bool(b) => J::Bool(*b),
            Value::Int(i) => J::from(*i),
            Value::Float(f) => serde_json::Number::from_f64(*f).map_or(J::Null, J::Number),
            Value::String(s) => J::String(s.clone()),
            Value::List(items) => J::Array(items.iter().map(Value::to_json).collect()),
            Value::Map(m) => J::Object(m.iter().map(|(k, v)| (k.clone(), v.to_json())).collect()),
            Value::Sensitive(inner) => inner.to_json(),
        }
    }

    /// Converts to the protocol's value.
    pub fn to_proto(&self) -> pb::Value {
        pb::Value::from(self.clone())
    }

    /// Converts from the protocol's value.
    pub fn from_proto(v: pb::Value) -> Value {
        Value::from(v)
    }
}

impl fmt::Debug for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Null => f.write_str("null"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Int(i) => write!(f, "{i}"),
            Value::Float(x) => write!(f, "{x:?}"),
            Value::String(s) => write!(f, "{s:?}"),
            Value::List(items) => f.debug_list().entries(items).finish(),
            Value::Map(m) => f.debug_map().entries(m.iter()).finish(),
            Value::Unknown => f.write_str("(known after deploy)"),
            Value::Sensitive(_) => f.write_str("(sensitive)"),
        }
    }
}

/// JSON-like rendering with secrets masked as `(sensitive)` and unknowns as
/// `(known after deploy)`.
impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::String(s) => write!(f, "{}", serde_json::Value::String(s.clone())),
            Value::List(items) => {
                f.write_str("[")?;
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{v}")?;
                }
                f.write_str("]")
            }
            Value::Map(m) => {
                f.write_str("{")?;
                for (i, (k, v)) in m.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{}:{v}", serde_json::Value::String(k.clone()))?;
                }
                f.write_str("}")
            }
            other => write!(f, "{other:?}"),
        }
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Bool(v)
    }
}
impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int(v)
    }
}
impl From<i32> for Value {
    fn from(v: i32) -> Self {
        Value::Int(i64::from(v))
    }
}
impl From<u32> for Value {
    fn from(v: u32) -> Self {
        Value::Int(i64::from(v))
    }
}
impl From<u64> for Value {
    /// Values above `i64::MAX` become floats.
    fn from(v: u64) -> Self {
        i64::try_from(v).map_or(Value::Float(v as f64), Value::Int)
    }
}
impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Value::Float(v)
    }
}
impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::String(v.to_owned())
    }
}
impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::String(v)
    }
}
impl From<&String> for Value {
    fn from(v: &String) -> Self {
        Value::String(v.clone())
    }
}
impl From<Map> for Value {
    fn from(v: Map) -> Self {
        Value::Map(v)
    }
}
impl<T: Into<Value>> From<Vec<T>> for Value {
    fn from(v: Vec<T>) -> Self {
        Value::List(v.into_iter().map(Into::into).collect())
    }
}
impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        v.map_or(Value::Null, Into::into)
    }
}
impl From<&Value> for Value {
    fn from(v: &Value) -> Self {
        v.clone()
    }
}

impl From<serde_json::Value> for Value {
    fn from(json: serde_json::Value) -> Self {
        use serde_json::Value as J;
        match json {
            J::Null => Value::Null,
            J::Bool(b) => Value::Bool(b),
            J::Number(n) => match n.as_i64() {
                Some(i) => Value::Int(i),
                None => n
                    .as_u64()
                    .map(Value::from)
                    .or_else(|| n.as_f64().map(Value::Float))
                    .unwrap_or(Value::Null),
            },
            J::String(s) => Value::String(s),
            J::Array(items) => Value::List(items.into_iter().map(Value::from).collect()),
            J::Object(m) => Value::Map(m.into_iter().map(|(k, v)| (k, Value::from(v))).collect()),
        }
    }
}

impl From<Value> for serde_json::Value {
    fn from(v: Value) -> Self {
        v.to_json()
    }
}

impl From<pb::Value> for Value {
    fn from(v: pb::Value) -> Self {
        use pb::value::Kind;
        let inner = match v.kind {
            None | Some(Kind::Null(_)) => Value::Null,
            Some(Kind::Bool(b)) => Value::Bool(b),
            Some(Kind::Int(i)) => Value::Int(i),
            Some(Kind::Float(f)) => Value::Float(f),
            Some(Kind::String(s)) => Value::String(s),
            Some(Kind::List(l)) => Value::List(l.items.into_iter().map(Value::from).collect()),
            Some(Kind::Map(m)) => Value::Map(
                m.entries
                    .into_iter()
                    .map(|e| (e.key, e.value.map_or(Value::Null, Value::from)))
                    .collect(),
            ),
            Some(Kind::Unknown(_)) => Value::Unknown,
        };
        if v.sensitive {
            Value::sensitive(inner)
        } else {
            inner
        }
    }
}

impl From<Value> for pb::Value {
    fn from(v: Value) -> Self {
        use pb::value::Kind;
        let (kind, sensitive) = match v {
            Value::Sensitive(inner) => {
                let mut p = pb::Value::from(*inner);
                p.sensitive = true;
                return p;
            }
            Value::Null => (Kind::Null(pb::NullValue::NullValue as i32), false),
            Value::Bool(b) => (Kind::Bool(b), false),
            Value::Int(i) => (Kind::Int(i), false),
            Value::Float(f) => (Kind::Float(f), false),
            Value::String(s) => (Kind::String(s), false),
            Value::List(items) => (
                Kind::List(pb::ListValue {
                    items: items.into_iter().map(pb::Value::from).collect(),
                }),
                false,
            ),
            Value::Map(m) => (
                Kind::Map(pb::MapValue {
                    entries: m
                        .into_iter()
                        .map(|(key, v)| pb::MapEntry {
                            key,
                            value: Some(pb::Value::from(v)),
                        })
                        .collect(),
                }),
                false,
            ),
            Value::Unknown => (Kind::Unknown(pb::Unknown {}), false),
        };
        pb::Value {
            kind: Some(kind),
            sensitive,
        }
    }
}

/// One step of an [`AttrPath`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PathStep {
    Field(String),
    Index(u64),
}

/// A path into a value, relative to the resource spec (or config, or
/// function arguments): `environment.variables["A.B"][0]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct AttrPath(Vec<PathStep>);

impl AttrPath {
    /// The empty path (the value itself).
    pub fn root() -> AttrPath {
        AttrPath(Vec::new())
    }

    /// This path followed by field `name`.
    pub fn field(mut self, name: impl Into<String>) -> AttrPath {
        self.0.push(PathStep::Field(name.into()));
        self
    }

    /// This path followed by list index `i`.
    pub fn index(mut self, i: u64) -> AttrPath {
        self.0.push(PathStep::Index(i));
        self
    }

    /// A copy of this path followed by field `name`.
    pub fn join(&self, name: &str) -> AttrPath {
        self.clone().field(name)
    }

    /// A copy of this path followed by index `i`.
    pub fn join_index(&self, i: usize) -> AttrPath {
        self.clone().index(i as u64)
    }

    pub fn steps(&self) -> &[PathStep] {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn to_proto(&self) -> pb::AttributePath {
        pb::AttributePath::from(self)
    }
}

impl From<&str> for AttrPath {
    /// A path of one field (not parsed: `"a.b"` is the single field `a.b`).
    fn from(field: &str) -> Self {
        AttrPath::root().field(field)
    }
}

impl From<String> for AttrPath {
    fn from(field: String) -> Self {
        AttrPath::root().field(field)
    }
}

impl From<&AttrPath> for AttrPath {
    fn from(p: &AttrPath) -> Self {
        p.clone()
    }
}

impl From<Vec<PathStep>> for AttrPath {
    fn from(steps: Vec<PathStep>) -> Self {
        AttrPath(steps)
    }
}

fn is_plain_field(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

impl fmt::Display for AttrPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("(root)");
        }
        for (i, step) in self.0.iter().enumerate() {
            match step {
                PathStep::Field(name) if is_plain_field(name) => {
                    if i > 0 {
                        f.write_str(".")?;
                    }
                    f.write_str(name)?;
                }
                PathStep::Field(name) => {
                    write!(f, "[{}]", serde_json::Value::String(name.clone()))?;
                }
                PathStep::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

impl From<&AttrPath> for pb::AttributePath {
    fn from(p: &AttrPath) -> Self {
        pb::AttributePath {
            steps: p
                .0
                .iter()
                .map(|s| pb::PathStep {
                    step: Some(match s {
                        PathStep::Field(f) => pb::path_step::Step::Field(f.clone()),
                        PathStep::Index(i) => pb::path_step::Step::Index(*i),
                    }),
                })
                .collect(),
        }
    }
}

impl From<pb::AttributePath> for AttrPath {
    fn from(p: pb::AttributePath) -> Self {
        AttrPath(
            p.steps
                .into_iter()
                .filter_map(|s| match s.step? {
                    pb::path_step::Step::Field(f) => Some(PathStep::Field(f)),
                    pb::path_step::Step::Index(i) => Some(PathStep::Index(i)),
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proto_round_trip_keeps_order_unknown_and_sensitive() {
        let v = Value::map()
            .with("z", 1)
            .with("a", Value::Unknown)
            .with("secret", Value::sensitive("hunter2"))
            .with(
                "list",
                vec![Value::from(1.5), Value::Null, Value::from(true)],
            );
        let back = Value::from(pb::Value::from(v.clone()));
        assert_eq!(back, v);
        let keys: Vec<_> = back
            .as_map()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        assert_eq!(keys, ["z", "a", "secret", "list"]);
        assert!(back.get("secret").is_some_and(Value::is_sensitive));
        assert!(!back.is_known());
    }

    #[test]
    fn sensitive_is_masked_and_never_nested() {
        let s = Value::sensitive(Value::sensitive("pw"));
        assert_eq!(s, Value::Sensitive(Box::new(Value::from("pw"))));
        assert_eq!(format!("{s:?}"), "(sensitive)");
        let m = Value::map().with("pw", s.clone()).with("u", "me");
        assert_eq!(m.to_string(), r#"{"pw":(sensitive),"u":"me"}"#);
        assert_eq!(s.as_str(), Some("pw"));
        assert_eq!(s.to_json(), serde_json::json!("pw"));
    }

    #[test]
    fn json_conversions() {
        let j = serde_json::json!({"b": 1, "a": [1.5, "x", null, true], "big": u64::MAX});
        let v = Value::from(j.clone());
        assert_eq!(v.get("b"), Some(&Value::Int(1)));
        assert!(matches!(v.get("big"), Some(Value::Float(_))));
        assert_eq!(
            v.get("a").and_then(|a| a.as_list()).map(<[Value]>::len),
            Some(4)
        );
        let back = Value::from(j).to_json();
        assert_eq!(back["a"], serde_json::json!([1.5, "x", null, true]));
        assert_eq!(Value::Float(f64::NAN).to_json(), serde_json::Value::Null);
    }

    #[test]
    fn empty_proto_value_is_null() {
        assert_eq!(Value::from(pb::Value::default()), Value::Null);
        let entry_without_value = pb::Value {
            kind: Some(pb::value::Kind::Map(pb::MapValue {
                entries: vec![pb::MapEntry {
                    key: "k".into(),
                    value: None,
                }],
            })),
            sensitive: false,
        };
        assert_eq!(
            Value::from(entry_without_value),
            Value::map().with("k", Value::Null)
        );
    }

    #[test]
    fn path_display_and_proto() {
        let p = AttrPath::root()
            .field("environment")
            .field("A.B")
            .index(0)
            .field("x");
        assert_eq!(p.to_string(), r#"environment["A.B"][0].x"#);
        assert_eq!(AttrPath::from(p.to_proto()), p);
        assert_eq!(AttrPath::root().to_string(), "(root)");
        let v = Value::map().with(
            "environment",
            Value::map().with("A.B", vec![Value::map().with("x", 3)]),
        );
        assert_eq!(v.get_path(&p), Some(&Value::Int(3)));
    }
}
