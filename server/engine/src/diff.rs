//! Field-level differences between a resource's recorded spec and its planned one.
//!
//! The planner calls [`diff_spec`] for every resource: the recorded spec is the
//! JSON last applied as stored (secrets included, each inside its
//! `{"$sensitive": ..}` mark), the new spec is what evaluation
//! produced, possibly with [`Value::Unknown`] where a value is only known after
//! deploy. The result is a list of [`FieldChange`]s, each at a path such as
//! `spec.environment.variables["A.B"]`, saying what is shown before and after
//! and whether the change replaces the resource ([`RecreatePaths`]).
//!
//! Everything here is pure: no I/O, no clock, so plans are reproducible.
//!
//! Changes are reported at the shallowest path that says everything: a field
//! added or removed as a whole is one change at its root, not one per leaf;
//! fields present on both sides are compared recursively, so a change deep in a
//! map is reported deep.

use serde_json::Value as Json;
use trellis_proto::plugin::v1::Schema;

use super::state_values;
use crate::eval::render::SENSITIVE_TEXT;
use crate::eval::value::Value;

/// How a value may be shown in a plan.
#[derive(Clone, Debug, PartialEq)]
pub enum Shown {
    /// The value itself.
    Value(serde_json::Value),
    /// Known only after deploy.
    Unknown,
    /// Derived from a secret: never shown.
    Sensitive,
}

/// One difference between the recorded spec and the new one.
#[derive(Clone, Debug, PartialEq)]
pub struct FieldChange {
    /// `spec.a.b`, `spec.items[0]`, `spec["key.with.dots"]`: keys that are not
    /// plain identifiers (`[A-Za-z0-9_-]+`) are quoted JSON-style in brackets.
    pub path: String,
    /// `None`: the field is new.
    pub previous: Option<Shown>,
    /// `None`: the field is removed.
    pub new: Option<Shown>,
    /// The change replaces the resource (delete and create) instead of
    /// updating it.
    pub must_recreate: bool,
    /// Where a value the blueprint does not write came from: `environment` or `engine` (a
    /// property injector); `None` for what the blueprint writes.
    pub origin: Option<String>,
}

/// Paths whose change forces a recreate.
///
/// Paths use the [`FieldChange::path`] syntax, starting at `spec`, with two
/// wildcards: `[*]` for any element of a list and `.*` for any value of a map
/// (a key that is literally `*` is written `["*"]`, so `.*` is unambiguous).
#[derive(Clone, Debug, Default)]
pub struct RecreatePaths {
    paths: Vec<Vec<Seg>>,
}

impl RecreatePaths {
    /// The `must_recreate` fields of a resource type's spec schema (an OBJECT
    /// schema), walking nested objects, array items (`[*]`) and map values
    /// (`.*`). `None` (type without a schema) gives no paths.
    pub fn from_schema(schema: Option<&Schema>) -> RecreatePaths {
        let mut paths = Vec::new();
        if let Some(schema) = schema {
            collect_recreate(schema, &mut vec![Seg::Key("spec".to_owned())], &mut paths);
        }
        RecreatePaths { paths }
    }

    /// Adds a path, e.g. one from the provider's `PlanResource` answer.
    ///
    /// A malformed path is cut at the first part that does not parse: the
    /// shorter path covers more fields, so a typo recreates too much rather than
    /// silently updating in place something the provider said must be replaced.
    pub fn add(&mut self, path: &str) {
        let segs = parse_path(path);
        if !self.paths.contains(&segs) {
            self.paths.push(segs);
        }
    }

    /// Whether a change at `path` forces a recreate: `path` or one of its
    /// ancestors is a recreate path (`spec.items[0].name` matches
    /// `spec.items[*]`).
    pub fn matches(&self, path: &str) -> bool {
        let query = parse_path(path);
        self.paths
            .iter()
            .any(|p| p.len() <= query.len() && compatible(p, &query))
    }

    /// Whether replacing the value at `path` (`previous` by `new`, either
    /// absent) forces a recreate: [`RecreatePaths::matches`], or a recreate path
    /// lies below `path` and the field it names exists on either side (adding
    /// an object that contains a must-recreate field recreates; adding one
    /// without it does not). An unknown new value may contain anything.
    fn affects(&self, path: &str, previous: Option<&Json>, new: Option<&Value>) -> bool {
        let query = parse_path(path);
        self.paths.iter().any(|p| {
            if !compatible(p, &query) {
                return false;
            }
            match p.get(query.len()..) {
                Some(below) if !below.is_empty() => {
                    previous.is_some_and(|v| json_reaches(v, below))
                        || new.is_some_and(|v| value_reaches(v, below))
                }
                // The path itself or an ancestor is a recreate path.
                _ => true,
            }
        })
    }
}

/// Differences between the recorded spec (`None` for a new resource: then every
/// top-level field is an addition) and the new one, in the new spec's key
/// order, then removed keys in the recorded order.
///
/// `masked` is the masked copy of `new`, identical except that every string
/// derived from a secret is [`SENSITIVE_TEXT`] (`None` when nothing in `new`
/// came from a secret). Values are compared unmasked, so a changed secret is
/// reported, but shown as [`Shown::Sensitive`] on both sides.
///
/// `previous` is the stored spec, secret marks included: a recorded value that
/// is or holds a secret is compared by its content but shown as
/// [`Shown::Sensitive`], whether it changed or was removed.
pub fn diff_spec(
    previous: Option<&serde_json::Value>,
    new: &Value,
    masked: Option<&Value>,
    recreate: &RecreatePaths,
) -> Vec<FieldChange> {
    diff_at("spec", previous, new, masked, recreate)
}

/// [`diff_spec`] for a value at another `root` path, such as `metadata.annotations`.
pub fn diff_at(
    root: &str,
    previous: Option<&serde_json::Value>,
    new: &Value,
    masked: Option<&Value>,
    recreate: &RecreatePaths,
) -> Vec<FieldChange> {
    let mut differ = Differ {
        recreate,
        path: root.to_owned(),
        in_secret: false,
        out: Vec::new(),
    };
    match (previous, new) {
        // A new resource: one addition per top-level field keeps plans short.
        (None, Value::Map(fields)) => {
            for (key, value) in fields {
                differ.at_key(key, |d| d.added(value, child_by_key(masked, key)));
            }
        }
        (None, _) => differ.added(new, masked),
        (Some(previous), _) => differ.node(previous, new, masked),
    }
    differ.out
}

/// True when [`diff_spec`] would return no change (key order is not a change).
/// Cheaper than diffing: it stops at the first difference and allocates
/// nothing.
pub fn unchanged(previous: &serde_json::Value, new: &Value) -> bool {
    equal(previous, new)
}

/// Converts a known eval value to JSON: `None` if it contains
/// [`Value::Unknown`] or a function value (or a non-finite float, which JSON
/// cannot represent).
pub fn to_json(v: &Value) -> Option<serde_json::Value> {
    v.to_json()
}

/// The walk of [`diff_spec`]: the path of the node being compared, extended
/// and truncated as the walk goes down and up, and the changes so far.
struct Differ<'a> {
    recreate: &'a RecreatePaths,
    path: String,
    /// The walk is inside a recorded secret: nothing recorded below is shown.
    in_secret: bool,
    out: Vec<FieldChange>,
}

impl Differ<'_> {
    /// Runs `f` with `.key` (or `["key"]`) appended to the path.
    fn at_key(&mut self, key: &str, f: impl FnOnce(&mut Self)) {
        let len = self.path.len();
        push_key(&mut self.path, key);
        f(self);
        self.path.truncate(len);
    }

    /// Runs `f` with `[index]` appended to the path.
    fn at_index(&mut self, index: usize, f: impl FnOnce(&mut Self)) {
        let len = self.path.len();
        self.path.push_str(&format!("[{index}]"));
        f(self);
        self.path.truncate(len);
    }

    /// Compares a field present on both sides.
    fn node(&mut self, previous: &Json, new: &Value, masked: Option<&Value>) {
        if let Some(inner) = state_values::sensitive_inner(previous) {
            let outer = std::mem::replace(&mut self.in_secret, true);
            self.node(inner, new, masked);
            self.in_secret = outer;
            return;
        }
        match (previous, new) {
            (Json::Object(old_fields), Value::Map(new_fields)) => {
                for (key, value) in new_fields {
                    let masked = child_by_key(masked, key);
                    self.at_key(key, |d| match old_fields.get(key) {
                        Some(old) => d.node(old, value, masked),
                        None => d.added(value, masked),
                    });
                }
                for (key, old) in old_fields {
                    if !new_fields.contains_key(key) {
                        self.at_key(key, |d| d.removed(old));
                    }
                }
            }
            (Json::Array(old_items), Value::List(new_items)) => {
                for index in 0..old_items.len().max(new_items.len()) {
                    let masked = child_by_index(masked, index);
                    self.at_index(index, |d| {
                        match (old_items.get(index), new_items.get(index)) {
                            (Some(old), Some(value)) => d.node(old, value, masked),
                            (None, Some(value)) => d.added(value, masked),
                            (Some(old), None) => d.removed(old),
                            (None, None) => unreachable!("index below the longer length"),
                        }
                    });
                }
            }
            // Whatever it was, it cannot be known equal until deploy; the walk
            // got here only through containers present on both sides, so this
            // is the deepest path where the unknown sits.
            (_, Value::Unknown) => self.changed(previous, new, masked),
            _ if equal(previous, new) => {}
            // A scalar that differs, or a change of type (scalar to object,
            // list to map..): one change for the whole value.
            _ => self.changed(previous, new, masked),
        }
    }

    /// A field only in the new spec, reported whole.
    fn added(&mut self, new: &Value, masked: Option<&Value>) {
        let must_recreate = self.recreate.affects(&self.path, None, Some(new));
        self.out.push(FieldChange {
            path: self.path.clone(),
            previous: None,
            new: Some(show(new, masked)),
            must_recreate,
            origin: None,
        });
    }

    /// A field only in the recorded spec, reported whole.
    fn removed(&mut self, previous: &Json) {
        let must_recreate = self.recreate.affects(&self.path, Some(previous), None);
        self.out.push(FieldChange {
            path: self.path.clone(),
            previous: Some(self.recorded(previous)),
            new: None,
            must_recreate,
            origin: None,
        });
    }

    /// A field on both sides whose value changed (or may change).
    fn changed(&mut self, previous: &Json, new: &Value, masked: Option<&Value>) {
        let must_recreate = self.recreate.affects(&self.path, Some(previous), Some(new));
        // The recorded value of a field that is now secret is almost certainly
        // the old secret: mask both sides.
        let (previous, new) = if masks_secret(new, masked) {
            (Shown::Sensitive, Shown::Sensitive)
        } else {
            (self.recorded(previous), show(new, masked))
        };
        self.out.push(FieldChange {
            path: self.path.clone(),
            previous: Some(previous),
            new: Some(new),
            must_recreate,
            origin: None,
        });
    }
}

impl Differ<'_> {
    /// How a recorded value is shown: never when it is, holds or lies inside a
    /// secret.
    fn recorded(&self, previous: &Json) -> Shown {
        if self.in_secret || state_values::holds_secret(previous) {
            Shown::Sensitive
        } else {
            Shown::Value(previous.clone())
        }
    }
}

/// How a new value is shown: masked if any of it came from a secret, unknown
/// if any of it is unknown (showing a partial value would suggest the rest is
/// final), the value otherwise.
fn show(new: &Value, masked: Option<&Value>) -> Shown {
    if masks_secret(new, masked) {
        return Shown::Sensitive;
    }
    match to_json(new) {
        Some(json) => Shown::Value(json),
        // Unknown somewhere inside; or a function or non-finite float, which
        // evaluation reports as errors and which no plan can show either.
        None => Shown::Unknown,
    }
}

/// Whether the masked copy hides a secret somewhere in `new`: it holds the
/// marker where the real value does not.
fn masks_secret(new: &Value, masked: Option<&Value>) -> bool {
    let Some(masked) = masked else {
        return false;
    };
    match (new, masked) {
        (Value::Map(fields), Value::Map(masked_fields)) => fields
            .iter()
            .any(|(key, value)| masks_secret(value, masked_fields.get(key))),
        (Value::List(items), Value::List(masked_items)) => items
            .iter()
            .zip(masked_items)
            .any(|(value, masked)| masks_secret(value, Some(masked))),
        (_, Value::Str(text)) => {
            text == SENSITIVE_TEXT && !matches!(new, Value::Str(s) if s == text)
        }
        _ => false,
    }
}

/// The masked copy of a map field, if there is one.
fn child_by_key<'v>(masked: Option<&'v Value>, key: &str) -> Option<&'v Value> {
    match masked {
        Some(Value::Map(fields)) => fields.get(key),
        _ => None,
    }
}

/// The masked copy of a list element, if there is one.
fn child_by_index(masked: Option<&Value>, index: usize) -> Option<&Value> {
    match masked {
        Some(Value::List(items)) => items.get(index),
        _ => None,
    }
}

/// Deep equality as the diff sees it: map key order does not matter, and
/// numbers compare by value (a `1.0` recorded in JSON may come back as `1`).
/// Unknown and function values are never equal to anything recorded.
fn equal(previous: &Json, new: &Value) -> bool {
    if let Some(inner) = state_values::sensitive_inner(previous) {
        return equal(inner, new);
    }
    match (previous, new) {
        (Json::Null, Value::Null) => true,
        (Json::Bool(a), Value::Bool(b)) => a == b,
        (Json::String(a), Value::Str(b)) => a == b,
        (Json::Number(n), Value::Int(i)) => number_is_int(n, *i),
        (Json::Number(n), Value::Float(f)) => number_is_float(n, *f),
        (Json::Array(a), Value::List(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| equal(x, y))
        }
        (Json::Object(a), Value::Map(b)) => {
            a.len() == b.len()
                && b.iter()
                    .all(|(key, y)| a.get(key).is_some_and(|x| equal(x, y)))
        }
        _ => false,
    }
}

/// `2^63` as a float: the first float beyond the `i64` range (exactly
/// representable, unlike `i64::MAX`).
const I64_END: f64 = 9_223_372_036_854_775_808.0;

fn number_is_int(n: &serde_json::Number, i: i64) -> bool {
    if let Some(j) = n.as_i64() {
        j == i
    } else if n.is_u64() {
        // Above i64::MAX.
        false
    } else {
        n.as_f64().is_some_and(|f| float_is_int(f, i))
    }
}

fn number_is_float(n: &serde_json::Number, f: f64) -> bool {
    if let Some(j) = n.as_i64() {
        float_is_int(f, j)
    } else if let Some(u) = n.as_u64() {
        f.fract() == 0.0 && (0.0..2.0 * I64_END).contains(&f) && f as u64 == u
    } else {
        n.as_f64() == Some(f)
    }
}

/// Exact comparison: casting `i` to a float could round it onto `f`.
fn float_is_int(f: f64, i: i64) -> bool {
    f.fract() == 0.0 && (-I64_END..I64_END).contains(&f) && f as i64 == i
}

/// One step of a path.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seg {
    Key(String),
    Index(usize),
    /// `.*`: any value of a map.
    AnyKey,
    /// `[*]`: any element of a list.
    AnyIndex,
}

impl Seg {
    /// Whether two steps can name the same field (a wildcard matches any step
    /// of its kind, on either side).
    fn matches(&self, other: &Seg) -> bool {
        match (self, other) {
            (Seg::Key(a), Seg::Key(b)) => a == b,
            (Seg::Index(a), Seg::Index(b)) => a == b,
            (Seg::AnyKey, Seg::Key(_) | Seg::AnyKey) | (Seg::Key(_), Seg::AnyKey) => true,
            (Seg::AnyIndex, Seg::Index(_) | Seg::AnyIndex) | (Seg::Index(_), Seg::AnyIndex) => true,
            _ => false,
        }
    }
}

/// Whether two paths agree on their common length (one is a prefix of the
/// other, wildcards allowed).
fn compatible(a: &[Seg], b: &[Seg]) -> bool {
    a.iter().zip(b).all(|(x, y)| x.matches(y))
}

/// Collects the `must_recreate` fields of `schema`, whose own path is `path`.
fn collect_recreate(schema: &Schema, path: &mut Vec<Seg>, out: &mut Vec<Vec<Seg>>) {
    for field in &schema.fields {
        path.push(Seg::Key(field.name.clone()));
        if field.must_recreate {
            // Everything below is covered by this path already.
            out.push(path.clone());
        } else if let Some(schema) = &field.schema {
            collect_recreate(schema, path, out);
        }
        path.pop();
    }
    if let Some(items) = schema.items.as_deref() {
        path.push(Seg::AnyIndex);
        collect_recreate(items, path, out);
        path.pop();
    }
    if let Some(values) = schema.values.as_deref() {
        path.push(Seg::AnyKey);
        collect_recreate(values, path, out);
        path.pop();
    }
}

/// Whether the recorded value has something at `below` (relative to itself).
fn json_reaches(v: &Json, below: &[Seg]) -> bool {
    if let Some(inner) = state_values::sensitive_inner(v) {
        return json_reaches(inner, below);
    }
    let Some((first, rest)) = below.split_first() else {
        return true;
    };
    match (first, v) {
        (Seg::Key(key), Json::Object(fields)) => {
            fields.get(key).is_some_and(|c| json_reaches(c, rest))
        }
        (Seg::AnyKey, Json::Object(fields)) => fields.values().any(|c| json_reaches(c, rest)),
        (Seg::Index(i), Json::Array(items)) => items.get(*i).is_some_and(|c| json_reaches(c, rest)),
        (Seg::AnyIndex, Json::Array(items)) => items.iter().any(|c| json_reaches(c, rest)),
        _ => false,
    }
}

/// Whether the new value has (or, being unknown, may have) something at
/// `below` (relative to itself).
fn value_reaches(v: &Value, below: &[Seg]) -> bool {
    let Some((first, rest)) = below.split_first() else {
        return true;
    };
    match (first, v) {
        (_, Value::Unknown) => true,
        (Seg::Key(key), Value::Map(fields)) => {
            fields.get(key).is_some_and(|c| value_reaches(c, rest))
        }
        (Seg::AnyKey, Value::Map(fields)) => fields.values().any(|c| value_reaches(c, rest)),
        (Seg::Index(i), Value::List(items)) => {
            items.get(*i).is_some_and(|c| value_reaches(c, rest))
        }
        (Seg::AnyIndex, Value::List(items)) => items.iter().any(|c| value_reaches(c, rest)),
        _ => false,
    }
}

/// Whether a key can be written after a dot.
fn is_plain_key(key: &str) -> bool {
    !key.is_empty() && key.len() == plain_len(key)
}

/// The length of the plain-identifier prefix of `s`.
fn plain_len(s: &str) -> usize {
    s.bytes()
        .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'-')
        .count()
}

/// The path of a spec field reached by `keys`, as [`FieldChange::path`] writes it.
pub fn spec_path(keys: &[String]) -> String {
    let mut path = "spec".to_owned();
    for k in keys {
        push_key(&mut path, k);
    }
    path
}

/// Appends `.key`, or `["key"]` (JSON-quoted) when the key is not plain.
pub(crate) fn push_key(path: &mut String, key: &str) {
    if is_plain_key(key) {
        path.push('.');
        path.push_str(key);
    } else {
        path.push('[');
        // Serialising a string cannot fail.
        path.push_str(&serde_json::to_string(key).unwrap_or_default());
        path.push(']');
    }
}

/// Parses a path (`spec.a["b.c"][0]`, wildcards `[*]` and `.*`). Parsing
/// stops at the first part that is not well-formed, keeping the steps before
/// it (see [`RecreatePaths::add`] for why a prefix is the safe reading).
fn parse_path(path: &str) -> Vec<Seg> {
    let mut segs = Vec::new();
    let root = plain_len(path);
    if root == 0 {
        return segs;
    }
    segs.push(Seg::Key(path[..root].to_owned()));
    let mut rest = &path[root..];
    loop {
        if let Some(after) = rest.strip_prefix('.') {
            if let Some(after) = after.strip_prefix('*') {
                segs.push(Seg::AnyKey);
                rest = after;
            } else {
                let n = plain_len(after);
                if n == 0 {
                    break;
                }
                segs.push(Seg::Key(after[..n].to_owned()));
                rest = &after[n..];
            }
        } else if let Some(inside) = rest.strip_prefix('[') {
            let Some((seg, after)) = parse_bracket(inside) else {
                break;
            };
            segs.push(seg);
            rest = after;
        } else {
            break;
        }
    }
    segs
}

/// Parses what follows a `[`: `*]`, `123]` or `"json string"]`.
fn parse_bracket(inside: &str) -> Option<(Seg, &str)> {
    if let Some(after) = inside.strip_prefix("*]") {
        return Some((Seg::AnyIndex, after));
    }
    if inside.starts_with('"') {
        let mut strings = serde_json::Deserializer::from_str(inside).into_iter::<String>();
        let key = strings.next()?.ok()?;
        let after = inside[strings.byte_offset()..].strip_prefix(']')?;
        return Some((Seg::Key(key), after));
    }
    let digits = inside.bytes().take_while(u8::is_ascii_digit).count();
    let index = inside[..digits].parse().ok()?;
    let after = inside[digits..].strip_prefix(']')?;
    Some((Seg::Index(index), after))
}

#[cfg(test)]
mod tests {
    use super::*;
    use indexmap::IndexMap;
    use serde_json::json;
    use trellis_proto::plugin::v1::{SchemaField, SchemaType};

    /// Builds an eval value from JSON, with the string `"?"` standing for
    /// Unknown so tests can write new specs compactly.
    fn val(j: Json) -> Value {
        match j {
            Json::String(s) if s == "?" => Value::Unknown,
            Json::Array(items) => Value::List(items.into_iter().map(val).collect()),
            Json::Object(map) => Value::Map(map.into_iter().map(|(k, v)| (k, val(v))).collect()),
            other => Value::from_json(&other),
        }
    }

    fn diff(previous: Option<Json>, new: Json) -> Vec<FieldChange> {
        diff_spec(
            previous.as_ref(),
            &val(new),
            None,
            &RecreatePaths::default(),
        )
    }

    fn change(path: &str, previous: Option<Shown>, new: Option<Shown>) -> FieldChange {
        FieldChange {
            path: path.to_owned(),
            previous,
            new,
            must_recreate: false,
            origin: None,
        }
    }

    fn shown(j: Json) -> Option<Shown> {
        Some(Shown::Value(j))
    }

    fn schema_object(fields: Vec<SchemaField>) -> Schema {
        Schema {
            r#type: SchemaType::Object as i32,
            fields,
            ..Default::default()
        }
    }

    fn field(name: &str, schema: Schema, must_recreate: bool) -> SchemaField {
        SchemaField {
            name: name.to_owned(),
            schema: Some(schema),
            must_recreate,
            ..Default::default()
        }
    }

    fn scalar(t: SchemaType) -> Schema {
        Schema {
            r#type: t as i32,
            ..Default::default()
        }
    }

    #[test]
    fn new_resource_reports_top_level_fields_whole() {
        let changes = diff(
            None,
            json!({"path": "/tmp/a", "options": {"mode": 420, "owner": "me"}, "id": "?"}),
        );
        assert_eq!(
            changes,
            vec![
                change("spec.path", None, shown(json!("/tmp/a"))),
                change(
                    "spec.options",
                    None,
                    shown(json!({"mode": 420, "owner": "me"}))
                ),
                change("spec.id", None, Some(Shown::Unknown)),
            ]
        );
    }

    #[test]
    fn nested_map_change_is_reported_at_the_leaf() {
        let previous = json!({"a": {"b": {"c": 1, "d": "same"}}, "e": true});
        let changes = diff(
            Some(previous),
            json!({"a": {"b": {"c": 2, "d": "same"}}, "e": true}),
        );
        assert_eq!(
            changes,
            vec![change("spec.a.b.c", shown(json!(1)), shown(json!(2)))]
        );
    }

    #[test]
    fn added_and_removed_keys_in_order() {
        let previous = json!({"keep": 1, "gone": {"x": 1}, "also_gone": 2});
        let changes = diff(
            Some(previous),
            json!({"fresh": {"deep": [1, 2]}, "keep": 1}),
        );
        assert_eq!(
            changes,
            vec![
                change("spec.fresh", None, shown(json!({"deep": [1, 2]}))),
                change("spec.gone", shown(json!({"x": 1})), None),
                change("spec.also_gone", shown(json!(2)), None),
            ]
        );
    }

    #[test]
    fn lists_grow_and_shrink_by_index() {
        let grown = diff(
            Some(json!({"items": ["a", "b"]})),
            json!({"items": ["a", "B", "c", {"d": 1}]}),
        );
        assert_eq!(
            grown,
            vec![
                change("spec.items[1]", shown(json!("b")), shown(json!("B"))),
                change("spec.items[2]", None, shown(json!("c"))),
                change("spec.items[3]", None, shown(json!({"d": 1}))),
            ]
        );
        let shrunk = diff(
            Some(json!({"items": ["a", "b", "c"]})),
            json!({"items": ["a"]}),
        );
        assert_eq!(
            shrunk,
            vec![
                change("spec.items[1]", shown(json!("b")), None),
                change("spec.items[2]", shown(json!("c")), None),
            ]
        );
    }

    #[test]
    fn type_change_is_one_change() {
        let changes = diff(Some(json!({"a": "text"})), json!({"a": {"b": 1}}));
        assert_eq!(
            changes,
            vec![change(
                "spec.a",
                shown(json!("text")),
                shown(json!({"b": 1}))
            )]
        );
    }

    #[test]
    fn unknown_is_reported_where_it_sits() {
        let previous = json!({"env": {"A": "1", "B": "2"}, "arn": "old", "list": [1, 2]});
        let changes = diff(
            Some(previous),
            json!({"env": {"A": "1", "B": "?"}, "arn": "?", "list": [1, "?"], "extra": {"x": "?"}}),
        );
        assert_eq!(
            changes,
            vec![
                change("spec.env.B", shown(json!("2")), Some(Shown::Unknown)),
                change("spec.arn", shown(json!("old")), Some(Shown::Unknown)),
                change("spec.list[1]", shown(json!(2)), Some(Shown::Unknown)),
                // An added subtree with an unknown inside is unknown as a whole.
                change("spec.extra", None, Some(Shown::Unknown)),
            ]
        );
        // Unknown is never "unchanged", even if the value may end up the same.
        let previous = json!({"arn": "old"});
        assert!(!unchanged(&previous, &val(json!({"arn": "?"}))));
    }

    #[test]
    fn secrets_are_masked_and_never_shown() {
        let secret = "hunter2-new-secret";
        let old_secret = "hunter1-old-secret";
        let previous = json!({
            "password": old_secret,
            "env": {"DB_URL": format!("postgres://u:{old_secret}@db"), "PLAIN": "a"},
            "args": ["--user", "me"],
        });
        let new = val(json!({
            "password": secret,
            "env": {"DB_URL": format!("postgres://u:{secret}@db"), "PLAIN": "b"},
            "args": ["--user", "me", format!("--token={secret}")],
            "added": {"token": secret, "name": "n"},
        }));
        let mut masked = new.clone();
        let Value::Map(fields) = &mut masked else {
            unreachable!()
        };
        let sensitive = || Value::Str(SENSITIVE_TEXT.to_owned());
        fields["password"] = sensitive();
        if let Value::Map(env) = &mut fields["env"] {
            env["DB_URL"] = sensitive();
        }
        if let Value::List(args) = &mut fields["args"] {
            args[2] = sensitive();
        }
        if let Value::Map(added) = &mut fields["added"] {
            added["token"] = sensitive();
        }

        let changes = diff_spec(
            Some(&previous),
            &new,
            Some(&masked),
            &RecreatePaths::default(),
        );
        let s = Some(Shown::Sensitive);
        assert_eq!(
            changes,
            vec![
                change("spec.password", s.clone(), s.clone()),
                change("spec.env.DB_URL", s.clone(), s.clone()),
                change("spec.env.PLAIN", shown(json!("a")), shown(json!("b"))),
                change("spec.args[2]", None, s.clone()),
                // The whole added subtree is masked: part of it is secret.
                change("spec.added", None, s),
            ]
        );
        let debug = format!("{changes:?}");
        assert!(!debug.contains("hunter"), "secret leaked: {debug}");

        // Comparison uses the real values: an unchanged secret is no change.
        assert!(
            diff_spec(
                Some(&to_json(&new).unwrap()),
                &new,
                Some(&masked),
                &RecreatePaths::default()
            )
            .is_empty()
        );
    }

    /// A secret recorded in state (inside its `$sensitive` mark) is never shown: not when it
    /// is removed, not when the field becomes a plain value, not inside a removed subtree.
    #[test]
    fn recorded_secrets_are_never_shown() {
        let old = "hunter1-old-secret";
        let previous = json!({
            "token": {"$sensitive": old},
            "password": {"$sensitive": old},
            "kept": {"$sensitive": old},
            "env": {"DB": {"$sensitive": format!("postgres://{old}@db")}, "A": "1"},
            "plain": "p",
        });
        let new = val(json!({"password": "now-plain", "kept": old, "plain": "p"}));
        let changes = diff_spec(Some(&previous), &new, None, &RecreatePaths::default());
        let s = Some(Shown::Sensitive);
        assert_eq!(
            changes,
            vec![
                // Changed from a secret to a plain value: the new value is not secret.
                change("spec.password", s.clone(), shown(json!("now-plain"))),
                change("spec.token", s.clone(), None),
                // A removed subtree holding a secret is masked whole.
                change("spec.env", s, None),
            ]
        );
        let debug = format!("{changes:?}");
        assert!(!debug.contains("hunter"), "secret leaked: {debug}");
        // The mark is not part of the value: the same secret is no change.
        assert!(unchanged(
            &json!({"k": {"$sensitive": "x"}}),
            &val(json!({"k": "x"}))
        ));
    }

    #[test]
    fn recreate_paths_from_schema() {
        let schema = schema_object(vec![
            field("name", scalar(SchemaType::String), true),
            field("size", scalar(SchemaType::Integer), false),
            field(
                "network",
                schema_object(vec![
                    field("vpc", scalar(SchemaType::String), true),
                    field("tags", scalar(SchemaType::String), false),
                ]),
                false,
            ),
            field(
                "disks",
                Schema {
                    r#type: SchemaType::Array as i32,
                    items: Some(Box::new(schema_object(vec![
                        field("device", scalar(SchemaType::String), true),
                        field("size", scalar(SchemaType::Integer), false),
                    ]))),
                    ..Default::default()
                },
                false,
            ),
            field(
                "mounts",
                Schema {
                    r#type: SchemaType::Map as i32,
                    values: Some(Box::new(schema_object(vec![field(
                        "target",
                        scalar(SchemaType::String),
                        true,
                    )]))),
                    ..Default::default()
                },
                false,
            ),
        ]);
        let recreate = RecreatePaths::from_schema(Some(&schema));
        assert!(recreate.matches("spec.name"));
        assert!(!recreate.matches("spec.size"));
        assert!(recreate.matches("spec.network.vpc"));
        assert!(!recreate.matches("spec.network.tags"));
        assert!(!recreate.matches("spec.network"));
        assert!(recreate.matches("spec.disks[0].device"));
        assert!(recreate.matches("spec.disks[7].device"));
        assert!(!recreate.matches("spec.disks[0].size"));
        assert!(recreate.matches("spec.mounts.data.target"));
        assert!(recreate.matches(r#"spec.mounts["a.b"].target"#));
        assert!(!recreate.matches("spec.mounts.data.other"));
        assert!(!RecreatePaths::from_schema(None).matches("spec.name"));

        let previous = json!({
            "name": "a", "size": 1, "network": {"vpc": "v1", "tags": "t"},
            "disks": [{"device": "sda", "size": 10}],
        });
        let new = val(json!({
            "name": "a", "size": 2, "network": {"vpc": "v2", "tags": "t"},
            "disks": [{"device": "sda", "size": 20}, {"device": "sdb", "size": 5}],
            "mounts": {"data": {"target": "/data"}},
        }));
        let changes = diff_spec(Some(&previous), &new, None, &recreate);
        let flags: Vec<(&str, bool)> = changes
            .iter()
            .map(|c| (c.path.as_str(), c.must_recreate))
            .collect();
        assert_eq!(
            flags,
            vec![
                ("spec.size", false),
                ("spec.network.vpc", true),
                ("spec.disks[0].size", false),
                // Added elements and maps containing a must-recreate field.
                ("spec.disks[1]", true),
                ("spec.mounts", true),
            ]
        );
    }

    #[test]
    fn recreate_below_an_added_or_removed_subtree_only_if_present() {
        let mut recreate = RecreatePaths::default();
        recreate.add("spec.config.engine");
        recreate.add(r#"spec.labels["team.name"]"#);

        // Adding a config without the field: nothing to recreate.
        let c = diff_spec(
            Some(&json!({})),
            &val(json!({"config": {"other": 1}})),
            None,
            &recreate,
        );
        assert_eq!(c.len(), 1);
        assert!(!c[0].must_recreate);
        // With it, or removing it, recreates; an unknown config might hold it.
        for (previous, new) in [
            (json!({}), json!({"config": {"engine": "pg"}})),
            (json!({"config": {"engine": "pg"}}), json!({})),
            (json!({"config": {"other": 1}}), json!({"config": "?"})),
            (
                json!({"labels": {"team.name": "a"}}),
                json!({"labels": {"team.name": "b"}}),
            ),
        ] {
            let c = diff_spec(Some(&previous), &val(new.clone()), None, &recreate);
            assert_eq!(c.len(), 1, "{previous} -> {new}");
            assert!(c[0].must_recreate, "{previous} -> {new}");
        }
        // A new resource's fields carry the flag the same way.
        let c = diff_spec(
            None,
            &val(json!({"config": {"engine": "pg"}})),
            None,
            &recreate,
        );
        assert!(c[0].must_recreate);
    }

    #[test]
    fn added_paths_with_indices_and_malformed_paths() {
        let mut recreate = RecreatePaths::default();
        recreate.add("spec.rules[2].port");
        assert!(recreate.matches("spec.rules[2].port"));
        assert!(recreate.matches("spec.rules[2].port.x"));
        assert!(!recreate.matches("spec.rules[1].port"));
        assert!(!recreate.matches("spec.rules[2]"));

        // A malformed tail is dropped: the path covers more, not less.
        let mut recreate = RecreatePaths::default();
        recreate.add("spec.volume[oops].size");
        assert!(recreate.matches("spec.volume[0].size"));
        assert!(recreate.matches("spec.volume.x"));
        assert!(!recreate.matches("spec.other"));
    }

    #[test]
    fn int_and_float_compare_by_value() {
        let previous = json!({"a": 1, "b": 2.0, "c": 1.5, "big": 9007199254740993_i64});
        assert!(unchanged(
            &previous,
            &Value::Map(IndexMap::from([
                ("a".to_owned(), Value::Float(1.0)),
                ("b".to_owned(), Value::Int(2)),
                ("c".to_owned(), Value::Float(1.5)),
                ("big".to_owned(), Value::Int(9007199254740993)),
            ]))
        ));
        // 2^53 + 1 is not exactly a float: a float 2^53 is a different number.
        let changes = diff_spec(
            Some(&previous),
            &Value::Map(IndexMap::from([
                ("a".to_owned(), Value::Float(1.0)),
                ("b".to_owned(), Value::Int(3)),
                ("c".to_owned(), Value::Float(1.5)),
                ("big".to_owned(), Value::Float(9007199254740992.0)),
            ])),
            None,
            &RecreatePaths::default(),
        );
        let paths: Vec<&str> = changes.iter().map(|c| c.path.as_str()).collect();
        assert_eq!(paths, vec!["spec.b", "spec.big"]);
        assert!(!float_is_int(I64_END, i64::MAX));
        assert!(!unchanged(&json!({"a": 1}), &val(json!({"a": "1"}))));
    }

    #[test]
    fn keys_needing_quotes() {
        let changes = diff(
            Some(json!({"env": {"A.B": "1", "with space": "x", "": 0, "ok_key-2": 1}})),
            json!({"env": {"A.B": "2", "with space": "y", "": 1, "ok_key-2": 2, "q\"uote": 3}}),
        );
        let paths: Vec<&str> = changes.iter().map(|c| c.path.as_str()).collect();
        assert_eq!(
            paths,
            vec![
                r#"spec.env["A.B"]"#,
                r#"spec.env["with space"]"#,
                r#"spec.env[""]"#,
                "spec.env.ok_key-2",
                r#"spec.env["q\"uote"]"#,
            ]
        );
        // Every path parses back to the keys it was built from.
        assert_eq!(
            parse_path(r#"spec.env["q\"uote"][3].*[*]"#),
            vec![
                Seg::Key("spec".into()),
                Seg::Key("env".into()),
                Seg::Key("q\"uote".into()),
                Seg::Index(3),
                Seg::AnyKey,
                Seg::AnyIndex,
            ]
        );
        let mut recreate = RecreatePaths::default();
        recreate.add(r#"spec.env["A.B"]"#);
        assert!(recreate.matches(&changes[0].path));
        assert!(!recreate.matches("spec.env.A.B"));
    }

    #[test]
    fn unchanged_agrees_with_diff_spec() {
        let cases = [
            (
                json!({"a": {"b": 1, "c": [1, 2]}}),
                json!({"a": {"c": [1, 2], "b": 1}}),
            ),
            (json!({"a": {"b": 1}}), json!({"a": {"b": 1, "c": 2}})),
            (json!({"a": [1, 2]}), json!({"a": [1]})),
            (json!({"a": null}), json!({"a": null})),
            (json!({"a": null}), json!({"a": false})),
            (json!({"a": 1}), json!({"a": "?"})),
            (json!({}), json!({})),
        ];
        for (previous, new) in cases {
            let new = val(new);
            assert_eq!(
                unchanged(&previous, &new),
                diff_spec(Some(&previous), &new, None, &RecreatePaths::default()).is_empty(),
                "{previous} vs {new:?}"
            );
        }
        // Key order alone is not a change.
        assert!(unchanged(
            &json!({"x": 1, "y": 2}),
            &val(json!({"y": 2, "x": 1}))
        ));
    }

    #[test]
    fn to_json_refuses_unknowns() {
        assert_eq!(
            to_json(&val(json!({"a": [1, "s"]}))),
            Some(json!({"a": [1, "s"]}))
        );
        assert_eq!(to_json(&val(json!({"a": [1, "?"]}))), None);
    }
}
