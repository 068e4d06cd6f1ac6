//! The value model of substitution evaluation.
//!
//! A [`Value`] is what a `${..}` expression evaluates to: a JSON-like value,
//! a function value (only ever an argument of a higher-order function), or
//! [`Value::Unknown`], a value that will only be known after deploy (for
//! example the ARN of a resource that does not exist yet). Unknown values
//! propagate through functions instead of failing them, so that planning can
//! evaluate everything that is known and defer the rest.
//!
//! Mappings keep insertion order, like the documents they come from.

use indexmap::IndexMap;

/// A value of the substitution language.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    List(Vec<Value>),
    Map(IndexMap<String, Value>),
    /// A function used as a value (`to_upper`, `getattr("id")`,
    /// `compose(..)`); it can only be passed to another function.
    Func(Func),
    /// Known only after deploy.
    Unknown,
}

/// A function value.
#[derive(Clone, Debug, PartialEq)]
pub enum Func {
    /// A bare core function name used as a value, e.g. `to_upper` in
    /// `map(xs, to_upper)`.
    Core(&'static str),
    /// The result of a `_g` function, `getattr` or `getelem`: the function
    /// that produced it and the static arguments it captured.
    Partial {
        name: &'static str,
        args: Vec<Value>,
    },
    /// `compose(f, g, ..)`: applied right to left.
    Compose(Vec<Func>),
    /// `pipe(f, g, ..)`: applied left to right.
    Pipe(Vec<Func>),
}

impl Value {
    /// The name of the value's type as error messages spell it.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "boolean",
            Value::Int(_) => "integer",
            Value::Float(_) => "float",
            Value::Str(_) => "string",
            Value::List(_) => "array",
            Value::Map(_) => "object",
            Value::Func(_) => "function",
            Value::Unknown => "unknown",
        }
    }

    /// Whether the value itself is unknown (see [`Value::deep_contains_unknown`]
    /// for unknowns nested in arrays and objects).
    pub fn is_unknown(&self) -> bool {
        matches!(self, Value::Unknown)
    }

    /// Whether the value is unknown or contains an unknown value at any depth
    /// (including the static arguments captured by a function value).
    pub fn deep_contains_unknown(&self) -> bool {
        match self {
            Value::Unknown => true,
            Value::List(items) => items.iter().any(Value::deep_contains_unknown),
            Value::Map(map) => map.values().any(Value::deep_contains_unknown),
            Value::Func(f) => f.contains_unknown(),
            Value::Null | Value::Bool(_) | Value::Int(_) | Value::Float(_) | Value::Str(_) => false,
        }
    }

    /// Converts a JSON value. Integers that fit in an `i64` become
    /// [`Value::Int`]; every other number (fractions, exponents, integers
    /// beyond `i64`) becomes [`Value::Float`].
    pub fn from_json(json: &serde_json::Value) -> Value {
        match json {
            serde_json::Value::Null => Value::Null,
            serde_json::Value::Bool(b) => Value::Bool(*b),
            serde_json::Value::Number(n) => match n.as_i64() {
                Some(i) => Value::Int(i),
                // Without arbitrary_precision every number is an i64, u64 or f64.
                None => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            serde_json::Value::String(s) => Value::Str(s.clone()),
            serde_json::Value::Array(items) => {
                Value::List(items.iter().map(Value::from_json).collect())
            }
            serde_json::Value::Object(map) => Value::Map(
                map.iter()
                    .map(|(k, v)| (k.clone(), Value::from_json(v)))
                    .collect(),
            ),
        }
    }

    /// Converts to JSON. `None` when the value is or contains a function or
    /// an unknown value, or a non-finite float (which JSON cannot represent).
    /// Floats keep their float form: `Float(2.0)` becomes `2.0`, not `2`.
    pub fn to_json(&self) -> Option<serde_json::Value> {
        Some(match self {
            Value::Null => serde_json::Value::Null,
            Value::Bool(b) => serde_json::Value::Bool(*b),
            Value::Int(i) => serde_json::Value::from(*i),
            Value::Float(f) => serde_json::Value::Number(serde_json::Number::from_f64(*f)?),
            Value::Str(s) => serde_json::Value::String(s.clone()),
            Value::List(items) => {
                serde_json::Value::Array(items.iter().map(Value::to_json).collect::<Option<_>>()?)
            }
            Value::Map(map) => serde_json::Value::Object(
                map.iter()
                    .map(|(k, v)| Some((k.clone(), v.to_json()?)))
                    .collect::<Option<_>>()?,
            ),
            Value::Func(_) | Value::Unknown => return None,
        })
    }

    /// The text the value contributes when interpolated into a string
    /// (`"https://${..}:3000"`).
    ///
    /// - strings as they are; booleans as `true`/`false`; integers in decimal;
    /// - floats as in JSON (`2.0`, `0.5`, `1e21`), so that a value reads the
    ///   same interpolated as it does serialised;
    /// - null as the empty string: null is the absence of a value, and
    ///   interpolating it as the word `null` would silently produce text
    ///   nobody wrote;
    /// - `None` for arrays, objects and functions, which the specification
    ///   says must be reported as errors, and for unknown values, which the
    ///   caller defers.
    pub fn display_string(&self) -> Option<String> {
        match self {
            Value::Null => Some(String::new()),
            Value::Bool(b) => Some(b.to_string()),
            Value::Int(i) => Some(i.to_string()),
            Value::Float(f) => Some(float_text(*f)),
            Value::Str(s) => Some(s.clone()),
            Value::List(_) | Value::Map(_) | Value::Func(_) | Value::Unknown => None,
        }
    }
}

impl Func {
    /// Whether any captured argument is or contains an unknown value.
    pub fn contains_unknown(&self) -> bool {
        match self {
            Func::Core(_) => false,
            Func::Partial { args, .. } => args.iter().any(Value::deep_contains_unknown),
            Func::Compose(fs) | Func::Pipe(fs) => fs.iter().any(Func::contains_unknown),
        }
    }
}

/// A float as JSON writes it; non-finite floats (which JSON lacks) as Rust does.
fn float_text(f: f64) -> String {
    match serde_json::Number::from_f64(f) {
        Some(n) => n.to_string(),
        None => f.to_string(),
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::Str(s.to_owned())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::Str(s)
    }
}

impl From<i64> for Value {
    fn from(i: i64) -> Self {
        Value::Int(i)
    }
}

impl From<f64> for Value {
    fn from(f: f64) -> Self {
        Value::Float(f)
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}

impl From<Vec<Value>> for Value {
    fn from(items: Vec<Value>) -> Self {
        Value::List(items)
    }
}

impl From<Func> for Value {
    fn from(f: Func) -> Self {
        Value::Func(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn type_names() {
        assert_eq!(Value::Null.type_name(), "null");
        assert_eq!(Value::Bool(true).type_name(), "boolean");
        assert_eq!(Value::Int(1).type_name(), "integer");
        assert_eq!(Value::Float(1.5).type_name(), "float");
        assert_eq!(Value::from("a").type_name(), "string");
        assert_eq!(Value::List(vec![]).type_name(), "array");
        assert_eq!(Value::Map(IndexMap::new()).type_name(), "object");
        assert_eq!(Value::Func(Func::Core("trim")).type_name(), "function");
        assert_eq!(Value::Unknown.type_name(), "unknown");
    }

    #[test]
    fn json_round_trip_keeps_order_and_number_kinds() {
        let json = json!({"z": 1, "a": [true, null, 2.0, 0.5, "s"], "m": {"y": -3, "b": {}}});
        let value = Value::from_json(&json);
        let Value::Map(map) = &value else {
            panic!("expected a map")
        };
        assert_eq!(map.keys().collect::<Vec<_>>(), ["z", "a", "m"]);
        assert_eq!(map["z"], Value::Int(1));
        assert_eq!(
            map["a"],
            Value::List(vec![
                Value::Bool(true),
                Value::Null,
                Value::Float(2.0),
                Value::Float(0.5),
                Value::from("s")
            ])
        );
        let back = value.to_json().unwrap();
        assert_eq!(back, json);
        assert_eq!(
            back.to_string(),
            r#"{"z":1,"a":[true,null,2.0,0.5,"s"],"m":{"y":-3,"b":{}}}"#
        );
    }

    #[test]
    fn big_unsigned_json_numbers_become_floats() {
        let value = Value::from_json(&json!(u64::MAX));
        assert_eq!(value, Value::Float(u64::MAX as f64));
    }

    #[test]
    fn to_json_is_none_for_functions_unknowns_and_non_finite_floats() {
        assert_eq!(Value::Unknown.to_json(), None);
        assert_eq!(Value::Func(Func::Core("trim")).to_json(), None);
        assert_eq!(
            Value::List(vec![Value::Int(1), Value::Unknown]).to_json(),
            None
        );
        assert_eq!(Value::Float(f64::NAN).to_json(), None);
        assert_eq!(Value::Float(f64::INFINITY).to_json(), None);
    }

    #[test]
    fn display_strings() {
        assert_eq!(
            Value::from("héllo").display_string().as_deref(),
            Some("héllo")
        );
        assert_eq!(Value::Int(-42).display_string().as_deref(), Some("-42"));
        assert_eq!(Value::Float(2.0).display_string().as_deref(), Some("2.0"));
        assert_eq!(Value::Float(0.25).display_string().as_deref(), Some("0.25"));
        assert_eq!(
            Value::Bool(false).display_string().as_deref(),
            Some("false")
        );
        assert_eq!(Value::Null.display_string().as_deref(), Some(""));
        assert_eq!(Value::List(vec![]).display_string(), None);
        assert_eq!(Value::Map(IndexMap::new()).display_string(), None);
        assert_eq!(Value::Func(Func::Core("trim")).display_string(), None);
        assert_eq!(Value::Unknown.display_string(), None);
    }

    #[test]
    fn unknown_detection() {
        assert!(Value::Unknown.is_unknown());
        assert!(!Value::List(vec![Value::Unknown]).is_unknown());
        assert!(Value::List(vec![Value::Int(1), Value::Unknown]).deep_contains_unknown());
        let mut map = IndexMap::new();
        map.insert("a".to_owned(), Value::List(vec![Value::Unknown]));
        assert!(Value::Map(map).deep_contains_unknown());
        let partial = Func::Partial {
            name: "contains_g",
            args: vec![Value::Unknown],
        };
        assert!(
            Value::Func(Func::Compose(vec![Func::Core("trim"), partial])).deep_contains_unknown()
        );
        assert!(!Value::from_json(&json!({"a": [1, {"b": null}]})).deep_contains_unknown());
    }
}
