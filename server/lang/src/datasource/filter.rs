//! Data source filters and exports over the items a provider returns.
//!
//! See the [module documentation](super) for the rules and
//! `docs/datasource-filters.md` for the operator tables with examples.

use std::fmt;
use std::str::FromStr;

use indexmap::IndexMap;

use crate::eval::value::Value;

// ---------------------------------------------------------------------------
// Field paths
// ---------------------------------------------------------------------------

/// One step of a [`FieldPath`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// `.name` or `["name"]`: a key of a mapping.
    Key(String),
    /// `[n]` (or `[]`, which is `[0]`): an item of an array.
    Index(usize),
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Key(k) if is_plain_name(k) => write!(f, ".{k}"),
            Step::Key(k) => write!(f, "[\"{k}\"]"),
            Step::Index(i) => write!(f, "[{i}]"),
        }
    }
}

/// A path into an item: `metadata.name`, `subnets[0].az`, `subnets[].az`,
/// `tags["app.kubernetes.io/name"]`.
///
/// Grammar: a path is a name or a bracket accessor, followed by any number of
/// `.name` and bracket accessors. A name is one or more characters other than
/// `.`, `[`, `]`, `"` and whitespace; a bracket accessor is `[n]` (an array
/// index), `[]` (the first item, as in the specification's references) or
/// `["key"]` (a mapping key that may contain any character but `"`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldPath {
    text: String,
    steps: Vec<Step>,
}

/// Why a path could not be parsed; `offset` is a byte offset into the path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathError {
    pub offset: usize,
    pub message: String,
}

impl fmt::Display for PathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid path (at byte {}): {}",
            self.offset, self.message
        )
    }
}

impl std::error::Error for PathError {}

/// The result of reading a [`FieldPath`] from an item.
#[derive(Clone, Debug, PartialEq)]
pub enum Lookup<'v> {
    /// The value at the path (never null, never unknown).
    Found(&'v Value),
    /// A key is absent, an index is out of range, or a mapping or array on
    /// the way is null.
    Missing,
    /// The value at the path is null.
    Null,
    /// The value at the path, or a container on the way, is unknown.
    Unknown,
    /// A step cannot be applied to what was found: a key read from something
    /// that is not a mapping, or an index from something that is not an
    /// array. `prefix` is the path up to the step (empty for the item itself)
    /// and `found` the type of the value there.
    Mismatch {
        prefix: String,
        step: Step,
        found: &'static str,
    },
}

impl FieldPath {
    /// Parses a path.
    pub fn parse(text: &str) -> Result<FieldPath, PathError> {
        let err = |offset: usize, message: String| Err(PathError { offset, message });
        if text.is_empty() {
            return err(0, "the path is empty".into());
        }
        let bytes = text.as_bytes();
        let mut steps = Vec::new();
        let mut i = 0;
        while i < bytes.len() {
            let at_start = steps.is_empty();
            match bytes[i] {
                b'[' => {
                    let (step, next) = parse_bracket(text, i)?;
                    steps.push(step);
                    i = next;
                }
                b'.' if !at_start => {
                    let (name, next) = parse_name(text, i + 1);
                    if name.is_empty() {
                        return err(
                            i + 1,
                            format!("expected a name after `.`{}", found_at(text, i + 1)),
                        );
                    }
                    steps.push(Step::Key(name.to_owned()));
                    i = next;
                }
                _ if at_start => {
                    let (name, next) = parse_name(text, 0);
                    if name.is_empty() {
                        return err(0, format!("expected a name{}", found_at(text, 0)));
                    }
                    steps.push(Step::Key(name.to_owned()));
                    i = next;
                }
                _ => {
                    let c = text[i..].chars().next().unwrap_or(' ');
                    let hint = if c.is_whitespace() {
                        ": names cannot contain whitespace; quote the key, as in `[\"a b\"]`"
                    } else {
                        ""
                    };
                    return err(i, format!("expected `.` or `[`, found `{c}`{hint}"));
                }
            }
        }
        Ok(FieldPath {
            text: text.to_owned(),
            steps,
        })
    }

    /// The path as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// Reads the path from an item.
    pub fn lookup<'v>(&self, item: &'v Value) -> Lookup<'v> {
        let mut cur = item;
        for (n, step) in self.steps.iter().enumerate() {
            cur = match (step, cur) {
                (_, Value::Null) => return Lookup::Missing,
                (_, Value::Unknown) => return Lookup::Unknown,
                (Step::Key(k), Value::Map(m)) => match m.get(k) {
                    Some(v) => v,
                    None => return Lookup::Missing,
                },
                (Step::Index(i), Value::List(items)) => match items.get(*i) {
                    Some(v) => v,
                    None => return Lookup::Missing,
                },
                _ => {
                    return Lookup::Mismatch {
                        prefix: render_steps(&self.steps[..n]),
                        step: step.clone(),
                        found: type_word(cur),
                    };
                }
            };
        }
        match cur {
            Value::Null => Lookup::Null,
            Value::Unknown => Lookup::Unknown,
            v => Lookup::Found(v),
        }
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl FromStr for FieldPath {
    type Err = PathError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FieldPath::parse(s)
    }
}

fn is_name_char(c: char) -> bool {
    !matches!(c, '.' | '[' | ']' | '"') && !c.is_whitespace()
}

fn is_plain_name(s: &str) -> bool {
    !s.is_empty() && s.chars().all(is_name_char)
}

/// The name starting at `start` and the offset just after it.
fn parse_name(text: &str, start: usize) -> (&str, usize) {
    let rest = &text[start..];
    let len = rest
        .char_indices()
        .find(|&(_, c)| !is_name_char(c))
        .map_or(rest.len(), |(i, _)| i);
    (&rest[..len], start + len)
}

/// The bracket accessor starting at `start` (which holds `[`).
fn parse_bracket(text: &str, start: usize) -> Result<(Step, usize), PathError> {
    let bytes = text.as_bytes();
    let err = |offset: usize, message: String| Err(PathError { offset, message });
    let mut i = start + 1;
    match bytes.get(i) {
        Some(b']') => Ok((Step::Index(0), i + 1)),
        Some(b'0'..=b'9') => {
            while bytes.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
            let digits = &text[start + 1..i];
            if bytes.get(i) != Some(&b']') {
                return err(
                    i,
                    format!("expected `]` after `[{digits}`{}", found_at(text, i)),
                );
            }
            match digits.parse::<usize>() {
                Ok(n) => Ok((Step::Index(n), i + 1)),
                Err(_) => err(start + 1, format!("index `{digits}` is too large")),
            }
        }
        Some(b'"') => {
            i += 1;
            let Some(len) = text[i..].find('"') else {
                return err(start, "unterminated quoted key".into());
            };
            let key = &text[i..i + len];
            if key.is_empty() {
                return err(i, "a quoted key cannot be empty".into());
            }
            let close = i + len + 1;
            if bytes.get(close) != Some(&b']') {
                return err(
                    close,
                    format!("expected `]` after the quoted key{}", found_at(text, close)),
                );
            }
            Ok((Step::Key(key.to_owned()), close + 1))
        }
        _ => err(
            i,
            format!(
                "expected an index (`[0]`), `[]` or a quoted key (`[\"key\"]`) after `[`{}",
                found_at(text, i)
            ),
        ),
    }
}

/// `, found `x`` or `, found the end of the path`.
fn found_at(text: &str, offset: usize) -> String {
    match text.get(offset..).and_then(|r| r.chars().next()) {
        Some(c) => format!(", found `{c}`"),
        None => ", found the end of the path".into(),
    }
}

fn render_steps(steps: &[Step]) -> String {
    let mut s = String::new();
    for (n, step) in steps.iter().enumerate() {
        match step {
            Step::Key(k) if n == 0 && is_plain_name(k) => s.push_str(k),
            step => s.push_str(&step.to_string()),
        }
    }
    s
}

// ---------------------------------------------------------------------------
// Types as the operator tables see them
// ---------------------------------------------------------------------------

/// The word for a value's type in messages, in the specification's terms
/// (`mapping`, not `object`).
fn type_word(v: &Value) -> &'static str {
    match v {
        Value::Map(_) => "mapping",
        v => v.type_name(),
    }
}

/// A value's type in the notation of the operator tables: `string`,
/// `array[string]`, `mapping[string, integer]`, `array[string | integer]`,
/// `empty array`.
pub fn describe(v: &Value) -> String {
    fn elements<'a>(items: impl Iterator<Item = &'a Value>) -> String {
        let mut words: Vec<&str> = Vec::new();
        for v in items {
            let w = type_word(v);
            if !words.contains(&w) {
                words.push(w);
            }
        }
        words.join(" | ")
    }
    match v {
        Value::List(items) if items.is_empty() => "empty array".into(),
        Value::List(items) => format!("array[{}]", elements(items.iter())),
        Value::Map(m) if m.is_empty() => "empty mapping".into(),
        Value::Map(m) => format!("mapping[string, {}]", elements(m.values())),
        v => type_word(v).into(),
    }
}

/// The primitive types of the operator tables; integers and floats are one
/// kind, numbers (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Str,
    Num,
    Bool,
}

fn kind(v: &Value) -> Option<Kind> {
    match v {
        Value::Str(_) => Some(Kind::Str),
        Value::Int(_) | Value::Float(_) => Some(Kind::Num),
        Value::Bool(_) => Some(Kind::Bool),
        _ => None,
    }
}

/// The kind shared by all the values: `Ok(None)` when there are none,
/// `Err(())` when one is not a primitive or the kinds differ. With
/// `allow_unknown`, unknown values are skipped.
fn common_kind<'a>(
    values: impl IntoIterator<Item = &'a Value>,
    allow_unknown: bool,
) -> Result<Option<Kind>, ()> {
    let mut found = None;
    for v in values {
        if allow_unknown && v.is_unknown() {
            continue;
        }
        let k = kind(v).ok_or(())?;
        match found {
            None => found = Some(k),
            Some(f) if f != k => return Err(()),
            Some(_) => {}
        }
    }
    Ok(found)
}

/// Whether two element kinds may be compared (an empty side fits anything).
fn compatible(a: Option<Kind>, b: Option<Kind>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a == b,
        _ => true,
    }
}

/// Equality of two primitives of the same kind; numbers compare exactly by
/// value across integer and float.
fn prim_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Str(x), Value::Str(y)) => x == y,
        (Value::Bool(x), Value::Bool(y)) => x == y,
        (Value::Int(x), Value::Int(y)) => x == y,
        (Value::Float(x), Value::Float(y)) => x == y,
        (Value::Int(i), Value::Float(f)) | (Value::Float(f), Value::Int(i)) => int_float_eq(*i, *f),
        _ => false,
    }
}

/// Exact equality of an integer and a float: no rounding, so
/// `2^53 + 1` does not equal the float `2^53`.
fn int_float_eq(i: i64, f: f64) -> bool {
    // -2^63 is exact as a float; 2^63 is the first float beyond i64.
    const MIN: f64 = -9_223_372_036_854_775_808.0;
    f.fract() == 0.0 && (MIN..-MIN).contains(&f) && f as i64 == i
}

// ---------------------------------------------------------------------------
// Operators
// ---------------------------------------------------------------------------

/// A filter operator, as the specification spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operator {
    Eq,
    NotEq,
    In,
    NotIn,
    HasKey,
    NotHasKey,
    Contains,
    NotContains,
    StartsWith,
    NotStartsWith,
    EndsWith,
    NotEndsWith,
}

/// One accepted combination of an operator: `field(string) starts with
/// search(string)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Signature {
    pub field: &'static str,
    pub search: &'static str,
}

const SIG_EQ: &[Signature] = &[
    Signature {
        field: "primitive",
        search: "primitive",
    },
    Signature {
        field: "array[primitive]",
        search: "array[primitive]",
    },
];
const SIG_IN: &[Signature] = &[Signature {
    field: "primitive",
    search: "array[primitive]",
}];
const SIG_HAS_KEY: &[Signature] = &[Signature {
    field: "mapping[string, any]",
    search: "string",
}];
const SIG_CONTAINS: &[Signature] = &[
    Signature {
        field: "array[primitive]",
        search: "primitive",
    },
    Signature {
        field: "string",
        search: "string",
    },
    Signature {
        field: "mapping[string, primitive]",
        search: "primitive",
    },
];
const SIG_STRING: &[Signature] = &[Signature {
    field: "string",
    search: "string",
}];

impl Operator {
    pub const ALL: [Operator; 12] = [
        Operator::Eq,
        Operator::NotEq,
        Operator::In,
        Operator::NotIn,
        Operator::HasKey,
        Operator::NotHasKey,
        Operator::Contains,
        Operator::NotContains,
        Operator::StartsWith,
        Operator::NotStartsWith,
        Operator::EndsWith,
        Operator::NotEndsWith,
    ];

    /// The operator spelled exactly as in the specification (`not in`,
    /// `has key`); `None` for anything else.
    pub fn parse(s: &str) -> Option<Operator> {
        Operator::ALL.into_iter().find(|op| op.as_str() == s)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Operator::Eq => "=",
            Operator::NotEq => "!=",
            Operator::In => "in",
            Operator::NotIn => "not in",
            Operator::HasKey => "has key",
            Operator::NotHasKey => "not has key",
            Operator::Contains => "contains",
            Operator::NotContains => "not contains",
            Operator::StartsWith => "starts with",
            Operator::NotStartsWith => "not starts with",
            Operator::EndsWith => "ends with",
            Operator::NotEndsWith => "not ends with",
        }
    }

    /// Whether this is the negation of another operator (`!=`, `not ..`).
    pub fn is_negated(self) -> bool {
        matches!(
            self,
            Operator::NotEq
                | Operator::NotIn
                | Operator::NotHasKey
                | Operator::NotContains
                | Operator::NotStartsWith
                | Operator::NotEndsWith
        )
    }

    /// The operator this one negates, or itself.
    pub fn positive(self) -> Operator {
        match self {
            Operator::NotEq => Operator::Eq,
            Operator::NotIn => Operator::In,
            Operator::NotHasKey => Operator::HasKey,
            Operator::NotContains => Operator::Contains,
            Operator::NotStartsWith => Operator::StartsWith,
            Operator::NotEndsWith => Operator::EndsWith,
            op => op,
        }
    }

    /// The operator with the opposite result.
    pub fn negation(self) -> Operator {
        match self {
            Operator::Eq => Operator::NotEq,
            Operator::NotEq => Operator::Eq,
            Operator::In => Operator::NotIn,
            Operator::NotIn => Operator::In,
            Operator::HasKey => Operator::NotHasKey,
            Operator::NotHasKey => Operator::HasKey,
            Operator::Contains => Operator::NotContains,
            Operator::NotContains => Operator::Contains,
            Operator::StartsWith => Operator::NotStartsWith,
            Operator::NotStartsWith => Operator::StartsWith,
            Operator::EndsWith => Operator::NotEndsWith,
            Operator::NotEndsWith => Operator::EndsWith,
        }
    }

    /// The field and search types the operator accepts (the rows of its
    /// table in the specification).
    pub fn accepts(self) -> &'static [Signature] {
        match self.positive() {
            Operator::Eq => SIG_EQ,
            Operator::In => SIG_IN,
            Operator::HasKey => SIG_HAS_KEY,
            Operator::Contains => SIG_CONTAINS,
            _ => SIG_STRING,
        }
    }

    /// The accepted combinations as a sentence: `field(string) starts with
    /// search(string)`, joined with `or`, with what `primitive` means.
    pub fn accepts_text(self) -> String {
        let sigs = self.accepts();
        let mut s = sigs
            .iter()
            .map(|sig| {
                format!(
                    "field({}) {} search({})",
                    sig.field,
                    self.as_str(),
                    sig.search
                )
            })
            .collect::<Vec<_>>()
            .join(", or ");
        if sigs.iter().any(|sig| sig.field.contains("primitive")) {
            s.push_str(
                " (primitive = string | integer | float | boolean, the same type on both \
                 sides; integers and floats are both numbers)",
            );
        }
        s
    }
}

impl fmt::Display for Operator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An operator string that is not one of the specification's twelve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownOperator(pub String);

impl fmt::Display for UnknownOperator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let all: Vec<String> = Operator::ALL.iter().map(|op| format!("`{op}`")).collect();
        write!(
            f,
            "unknown filter operator `{}`; the operators are {}",
            self.0,
            all.join(", ")
        )
    }
}

impl std::error::Error for UnknownOperator {}

impl FromStr for Operator {
    type Err = UnknownOperator;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Operator::parse(s).ok_or_else(|| UnknownOperator(s.to_owned()))
    }
}

// ---------------------------------------------------------------------------
// Filters
// ---------------------------------------------------------------------------

/// A data source filter: `field` (a [`FieldPath`]) compared with `search`
/// by `operator`, read as "field operator search".
#[derive(Clone, Debug, PartialEq)]
pub struct Filter {
    pub field: String,
    pub operator: Operator,
    pub search: Value,
}

impl Filter {
    pub fn new(field: impl Into<String>, operator: Operator, search: impl Into<Value>) -> Filter {
        Filter {
            field: field.into(),
            operator,
            search: search.into(),
        }
    }

    /// The checks that do not depend on an item: the field is a valid path,
    /// the search has a type the operator accepts for some field, and the
    /// search is known. [`select`] runs them before looking at any item, so
    /// they fail even when the provider returns no items.
    pub fn check(&self) -> Result<(), FilterError> {
        self.compile().map(drop)
    }

    fn compile(&self) -> Result<FieldPath, FilterError> {
        let path =
            FieldPath::parse(&self.field).map_err(|e| self.error(FilterErrorKind::Path(e)))?;
        if !search_fits(self.operator, &self.search) {
            return Err(self.error(FilterErrorKind::InvalidCombination {
                field_type: None,
                search_type: describe(&self.search),
                hint: search_hint(self.operator, &self.search),
            }));
        }
        if self.search.deep_contains_unknown() {
            return Err(self.error(FilterErrorKind::UnknownSearch));
        }
        Ok(path)
    }

    fn error(&self, kind: FilterErrorKind) -> FilterError {
        FilterError {
            field: self.field.clone(),
            operator: self.operator,
            item: None,
            kind,
        }
    }

    /// The filter applied to one item, once [`Filter::compile`] passed.
    fn eval(&self, path: &FieldPath, item: &Value) -> Result<bool, FilterError> {
        let field = match path.lookup(item) {
            Lookup::Found(v) => v,
            Lookup::Missing | Lookup::Null => return Ok(false),
            Lookup::Unknown => return Err(self.error(FilterErrorKind::UnknownField)),
            Lookup::Mismatch {
                prefix,
                step,
                found,
            } => {
                return Err(self.error(FilterErrorKind::PathMismatch {
                    prefix,
                    step,
                    found,
                }));
            }
        };
        // `has key` looks at keys only; unknown values in the mapping do not
        // stop it. Every other operator compares the values themselves.
        if self.operator.positive() != Operator::HasKey && field.deep_contains_unknown() {
            return Err(self.error(FilterErrorKind::UnknownField));
        }
        match compare(self.operator.positive(), field, &self.search) {
            Some(m) => Ok(m != self.operator.is_negated()),
            None => Err(self.error(FilterErrorKind::InvalidCombination {
                field_type: Some(describe(field)),
                search_type: describe(&self.search),
                hint: combination_hint(self.operator, field, &self.search),
            })),
        }
    }
}

/// Whether the search has a type that `op` accepts for at least one field
/// type. Unknown values fit anywhere (they are reported afterwards).
fn search_fits(op: Operator, search: &Value) -> bool {
    let prim = |v: &Value| v.is_unknown() || kind(v).is_some();
    let prim_array = |v: &Value| match v {
        Value::List(items) => common_kind(items, true).is_ok(),
        v => v.is_unknown(),
    };
    let string = |v: &Value| matches!(v, Value::Str(_) | Value::Unknown);
    match op.positive() {
        Operator::Eq => prim(search) || prim_array(search),
        Operator::In => prim_array(search),
        Operator::HasKey => string(search),
        Operator::Contains => prim(search),
        _ => string(search),
    }
}

/// The comparison of a positive operator; `None` when the types are not a
/// combination the operator accepts. The search already passed
/// [`search_fits`] and contains no unknown value.
fn compare(op: Operator, field: &Value, search: &Value) -> Option<bool> {
    let same_kind = |a: &Value, b: &Value| kind(a).is_some() && kind(a) == kind(b);
    match (op, field, search) {
        (Operator::Eq, f, s) if same_kind(f, s) => Some(prim_eq(f, s)),
        (Operator::Eq, Value::List(fs), Value::List(ss)) => {
            let fk = common_kind(fs, false).ok()?;
            let sk = common_kind(ss, false).ok()?;
            compatible(fk, sk)
                .then(|| fs.len() == ss.len() && fs.iter().zip(ss).all(|(f, s)| prim_eq(f, s)))
        }
        (Operator::In, f, Value::List(ss)) if kind(f).is_some() => {
            let sk = common_kind(ss, false).ok()?;
            compatible(kind(f), sk).then(|| ss.iter().any(|s| prim_eq(f, s)))
        }
        (Operator::HasKey, Value::Map(m), Value::Str(k)) => Some(m.contains_key(k)),
        (Operator::Contains, Value::Str(f), Value::Str(s)) => Some(f.contains(s.as_str())),
        (Operator::Contains, Value::List(fs), s) if kind(s).is_some() => {
            let fk = common_kind(fs, false).ok()?;
            compatible(fk, kind(s)).then(|| fs.iter().any(|f| prim_eq(f, s)))
        }
        (Operator::Contains, Value::Map(m), s) if kind(s).is_some() => {
            let fk = common_kind(m.values(), false).ok()?;
            compatible(fk, kind(s)).then(|| m.values().any(|f| prim_eq(f, s)))
        }
        (Operator::StartsWith, Value::Str(f), Value::Str(s)) => Some(f.starts_with(s.as_str())),
        (Operator::EndsWith, Value::Str(f), Value::Str(s)) => Some(f.ends_with(s.as_str())),
        _ => None,
    }
}

/// A hint for a search the operator never accepts.
fn search_hint(op: Operator, search: &Value) -> Option<&'static str> {
    match (op.positive(), search) {
        (Operator::Contains, Value::List(_)) => Some(
            "`contains` takes one search value; to require several, write one filter per value \
             (all filters must match)",
        ),
        (Operator::In, s) if kind(s).is_some() => {
            Some("`in` takes an array of search values; to compare with one value, use `=`")
        }
        (Operator::HasKey, Value::List(_)) => Some(
            "`has key` takes one key; to require several, write one filter per key \
             (all filters must match)",
        ),
        (_, Value::Null) => {
            Some("the search value is null: check the variable or value it comes from")
        }
        _ => None,
    }
}

/// A hint for a field and search the operator does not accept together.
fn combination_hint(op: Operator, field: &Value, search: &Value) -> Option<&'static str> {
    let (fk, sk) = (kind(field), kind(search));
    match (op.positive(), field, search) {
        _ if fk.is_some() && sk.is_some() && fk != sk => Some(
            "values are compared without conversion: a string never equals a number or a \
             boolean (\"80\" is not 80)",
        ),
        (Operator::Eq, f, Value::List(_)) if kind(f).is_some() => Some(if op.is_negated() {
            "to exclude several values, use `not in`"
        } else {
            "to match one of several values, use `in`"
        }),
        (Operator::In, Value::List(_), _) => Some(
            "`in` compares a single field value with the search values; to look for a value in \
             an array field, use `contains` with a single search value",
        ),
        (Operator::HasKey, Value::List(_) | Value::Str(_), _) => {
            Some("`has key` needs a mapping field; for arrays and strings, use `contains`")
        }
        (_, Value::List(items), _) if common_kind(items, false).is_err() => Some(
            "only arrays whose items are all primitives of one type can be compared; filter on \
             a nested field instead, such as `subnets[0].id`",
        ),
        (_, Value::Map(_), _) if op.positive() != Operator::HasKey => {
            Some("to compare a field of a mapping, filter on its path, such as `metadata.name`")
        }
        _ => None,
    }
}

/// Why a filter could not be applied.
#[derive(Clone, Debug, PartialEq)]
pub struct FilterError {
    /// The filter's field, as written.
    pub field: String,
    pub operator: Operator,
    /// The index of the item being compared, when there was one.
    pub item: Option<usize>,
    pub kind: FilterErrorKind,
}

#[derive(Clone, Debug, PartialEq)]
pub enum FilterErrorKind {
    /// The field is not a valid path.
    Path(PathError),
    /// The search value is, or contains, a value that is only known after
    /// deploy: the filter cannot be evaluated at plan time.
    UnknownSearch,
    /// The item's field (or a container on its path) is unknown.
    UnknownField,
    /// The field and search types are not a combination the operator
    /// accepts. `field_type` is `None` when the search alone rules out every
    /// field type (reported before any item is looked at).
    InvalidCombination {
        field_type: Option<String>,
        search_type: String,
        hint: Option<&'static str>,
    },
    /// A step of the path cannot be applied to what the item holds (a key
    /// of a string, an index of a mapping).
    PathMismatch {
        prefix: String,
        step: Step,
        found: &'static str,
    },
}

impl FilterError {
    /// Whether the filter failed only because a value is unknown at plan
    /// time (the data source can be resolved once it is known).
    pub fn is_unknown(&self) -> bool {
        matches!(
            self.kind,
            FilterErrorKind::UnknownSearch | FilterErrorKind::UnknownField
        )
    }

    fn at_item(mut self, i: usize) -> FilterError {
        self.item = Some(i);
        self
    }
}

impl fmt::Display for FilterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = self.operator;
        write!(f, "filter `{} {op} ..`", self.field)?;
        if let Some(i) = self.item {
            write!(f, " on the item at index {i}")?;
        }
        f.write_str(": ")?;
        let hint = match &self.kind {
            FilterErrorKind::Path(e) => {
                write!(
                    f,
                    "the field `{}` is not a valid path: {}",
                    self.field, e.message
                )?;
                None
            }
            FilterErrorKind::UnknownSearch => {
                f.write_str(
                    "the search value is only known after deploy, so the filter cannot be \
                     evaluated at plan time",
                )?;
                None
            }
            FilterErrorKind::UnknownField => {
                write!(
                    f,
                    "the value of `{}` is unknown, so the filter cannot be evaluated",
                    self.field
                )?;
                None
            }
            FilterErrorKind::InvalidCombination {
                field_type,
                search_type,
                hint,
            } => {
                match field_type {
                    Some(ft) => write!(
                        f,
                        "the field `{}` is {ft} and the search is {search_type}, which `{op}` \
                         does not accept",
                        self.field
                    )?,
                    None => write!(
                        f,
                        "the search is {search_type}, which `{op}` does not accept for any field"
                    )?,
                }
                write!(f, "; `{op}` accepts {}", op.accepts_text())?;
                *hint
            }
            FilterErrorKind::PathMismatch {
                prefix,
                step,
                found,
            } => {
                let at = if prefix.is_empty() {
                    "the item".to_owned()
                } else {
                    format!("`{prefix}`")
                };
                write!(
                    f,
                    "{at} is {} {found}, so `{step}` cannot be read from it",
                    article(found)
                )?;
                Some(match step {
                    Step::Key(_) => "a key can only be read from a mapping; use `[n]` for an array",
                    Step::Index(_) => "an index can only be read from an array",
                })
            }
        };
        if let Some(h) = hint {
            write!(f, " (hint: {h})")?;
        }
        Ok(())
    }
}

impl std::error::Error for FilterError {}

fn article(word: &str) -> &'static str {
    if word.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    }
}

/// Whether `item` matches `filter`.
///
/// A field the item does not have (an absent key, an index out of range, a
/// null anywhere on the path) matches no operator, negated ones included.
/// Errors: an invalid path, a search or field type combination the operator
/// does not accept, a path step that does not fit the item, an unknown
/// search or field value ([`FilterError::is_unknown`]).
pub fn matches(item: &Value, filter: &Filter) -> Result<bool, FilterError> {
    let path = filter.compile()?;
    filter.eval(&path, item)
}

/// The first item that matches all the filters.
///
/// Every filter is checked before any item is looked at ([`Filter::check`]).
/// Then each item is tested with the filters in order, stopping at the first
/// filter it fails (so an earlier filter can guard a later one, as with
/// `&&`). Every item is tested, not only those before the selected one, so
/// that an error does not depend on the order in which the provider returned
/// the items. An empty list of filters selects the first item.
pub fn select<'v>(
    items: &'v [Value],
    filters: &[Filter],
) -> Result<Option<&'v Value>, FilterError> {
    let paths = filters
        .iter()
        .map(Filter::compile)
        .collect::<Result<Vec<_>, _>>()?;
    let mut selected = None;
    for (i, item) in items.iter().enumerate() {
        let mut all = true;
        for (filter, path) in filters.iter().zip(&paths) {
            if !filter.eval(path, item).map_err(|e| e.at_item(i))? {
                all = false;
                break;
            }
        }
        if all && selected.is_none() {
            selected = Some(item);
        }
    }
    Ok(selected)
}

/// The fields of `filters` that none of `items` has: when [`select`] finds
/// nothing, these are likely misspelt, and worth naming in the message.
/// Empty when there are no items. Invalid paths are left out (the filters
/// report them).
pub fn absent_fields<'f>(items: &[Value], filters: &'f [Filter]) -> Vec<&'f str> {
    if items.is_empty() {
        return Vec::new();
    }
    filters
        .iter()
        .filter(|f| {
            FieldPath::parse(&f.field).is_ok_and(|path| {
                items
                    .iter()
                    .all(|item| matches!(path.lookup(item), Lookup::Missing | Lookup::Null))
            })
        })
        .map(|f| f.field.as_str())
        .collect()
}

// ---------------------------------------------------------------------------
// Exports
// ---------------------------------------------------------------------------

/// The declared type of an exported field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExportType {
    /// An array of primitives of one type.
    Array,
    String,
    Integer,
    Float,
    Boolean,
}

impl ExportType {
    pub const ALL: [ExportType; 5] = [
        ExportType::Array,
        ExportType::String,
        ExportType::Integer,
        ExportType::Float,
        ExportType::Boolean,
    ];

    pub fn parse(s: &str) -> Option<ExportType> {
        ExportType::ALL.into_iter().find(|t| t.as_str() == s)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ExportType::Array => "array",
            ExportType::String => "string",
            ExportType::Integer => "integer",
            ExportType::Float => "float",
            ExportType::Boolean => "boolean",
        }
    }
}

impl fmt::Display for ExportType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An exported field: `name` is the key in the blueprint's `exports`
/// mapping (and of the exported values); the item's field read is
/// `alias_for` when set, else `name`. Both may be paths (`metadata.name`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Export {
    pub name: String,
    pub alias_for: Option<String>,
    pub ty: ExportType,
}

impl Export {
    pub fn new(name: impl Into<String>, ty: ExportType) -> Export {
        Export {
            name: name.into(),
            alias_for: None,
            ty,
        }
    }

    pub fn alias_for(mut self, field: impl Into<String>) -> Export {
        self.alias_for = Some(field.into());
        self
    }

    /// The path of the item's field this export reads.
    pub fn source_field(&self) -> &str {
        self.alias_for.as_deref().unwrap_or(&self.name)
    }
}

/// Why an exported field could not be read.
#[derive(Clone, Debug, PartialEq)]
pub struct ExportError {
    /// The export's name.
    pub export: String,
    /// The item's field it reads (`aliasFor`, or the name).
    pub field: String,
    pub kind: ExportErrorKind,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ExportErrorKind {
    /// The field is not a valid path.
    Path(PathError),
    /// The item has no such field.
    Missing,
    /// The field is null.
    Null,
    /// A step of the path cannot be applied to what the item holds.
    PathMismatch {
        prefix: String,
        step: Step,
        found: &'static str,
    },
    /// The field's value is not of the declared type.
    WrongType {
        declared: ExportType,
        found: String,
        hint: Option<&'static str>,
    },
}

impl fmt::Display for ExportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "export `{}`", self.export)?;
        if self.field != self.export {
            write!(f, " (field `{}`)", self.field)?;
        }
        f.write_str(": ")?;
        match &self.kind {
            ExportErrorKind::Path(e) => {
                write!(f, "`{}` is not a valid path: {}", self.field, e.message)
            }
            ExportErrorKind::Missing => {
                write!(f, "the selected item has no field `{}`", self.field)
            }
            ExportErrorKind::Null => {
                write!(f, "the field `{}` of the selected item is null", self.field)
            }
            ExportErrorKind::PathMismatch {
                prefix,
                step,
                found,
            } => {
                let at = if prefix.is_empty() {
                    "the item".to_owned()
                } else {
                    format!("`{prefix}`")
                };
                write!(
                    f,
                    "{at} is {} {found}, so `{step}` cannot be read from it",
                    article(found)
                )
            }
            ExportErrorKind::WrongType {
                declared,
                found,
                hint,
            } => {
                write!(f, "declared {declared} but the field is {found}")?;
                if *declared == ExportType::Array {
                    f.write_str("; an exported array holds primitives of one type")?;
                }
                if let Some(h) = hint {
                    write!(f, " (hint: {h})")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for ExportError {}

/// The exported fields of the selected item, keyed by export name in the
/// order given.
///
/// Each field must be present and not null, and of its declared type:
/// `string`, `integer`, `boolean` exactly; `float` also takes an integer that
/// a float represents exactly (converted to a float); `array` an array of
/// primitives of one type (integers and floats counting as one). Unknown
/// values pass through unchanged. The first failing export is the error.
pub fn export(item: &Value, exports: &[Export]) -> Result<IndexMap<String, Value>, ExportError> {
    let mut out = IndexMap::with_capacity(exports.len());
    for x in exports {
        let error = |kind| ExportError {
            export: x.name.clone(),
            field: x.source_field().to_owned(),
            kind,
        };
        let path =
            FieldPath::parse(x.source_field()).map_err(|e| error(ExportErrorKind::Path(e)))?;
        let value = match path.lookup(item) {
            Lookup::Found(v) => v,
            Lookup::Unknown => &Value::Unknown,
            Lookup::Missing => return Err(error(ExportErrorKind::Missing)),
            Lookup::Null => return Err(error(ExportErrorKind::Null)),
            Lookup::Mismatch {
                prefix,
                step,
                found,
            } => {
                return Err(error(ExportErrorKind::PathMismatch {
                    prefix,
                    step,
                    found,
                }));
            }
        };
        let converted = convert_export(value, x.ty).map_err(|(found, hint)| {
            error(ExportErrorKind::WrongType {
                declared: x.ty,
                found,
                hint,
            })
        })?;
        out.insert(x.name.clone(), converted);
    }
    Ok(out)
}

type TypeMismatch = (String, Option<&'static str>);

fn convert_export(v: &Value, ty: ExportType) -> Result<Value, TypeMismatch> {
    let mismatch = |hint| Err((describe(v), hint));
    match (ty, v) {
        (_, Value::Unknown) => Ok(Value::Unknown),
        (ExportType::String, Value::Str(_))
        | (ExportType::Integer, Value::Int(_))
        | (ExportType::Float, Value::Float(_))
        | (ExportType::Boolean, Value::Bool(_)) => Ok(v.clone()),
        (ExportType::Float, Value::Int(i)) => {
            let f = *i as f64;
            if int_float_eq(*i, f) {
                Ok(Value::Float(f))
            } else {
                Err((
                    format!("the integer {i}, which a float cannot represent exactly"),
                    Some("declare the export as `integer`"),
                ))
            }
        }
        (ExportType::Array, Value::List(items)) => match common_kind(items, true) {
            Ok(_) => Ok(v.clone()),
            Err(()) => mismatch(Some(
                "export a nested field with a path instead, such as `subnets[0].id`",
            )),
        },
        (_, Value::List(_)) => mismatch(Some("declare the export as `array`")),
        (_, Value::Map(_)) => mismatch(Some(
            "a mapping cannot be exported; export its fields with paths, such as `metadata.name`",
        )),
        (_, Value::Str(_)) => mismatch(Some("declare the export as `string`")),
        (_, Value::Int(_)) => mismatch(Some("declare the export as `integer` or `float`")),
        (_, Value::Float(_)) => mismatch(Some("declare the export as `float`")),
        (_, Value::Bool(_)) => mismatch(Some("declare the export as `boolean`")),
        (_, Value::Null | Value::Func(_)) => mismatch(None),
    }
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    type J = serde_json::Value;

    fn v(j: J) -> Value {
        Value::from_json(&j)
    }

    fn op(s: &str) -> Operator {
        Operator::parse(s).unwrap_or_else(|| panic!("operator `{s}`"))
    }

    /// An item `{"f": field}` and a filter on `f`.
    fn run(field: &Value, operator: Operator, search: &Value) -> Result<bool, FilterError> {
        let mut m = IndexMap::new();
        m.insert("f".to_owned(), field.clone());
        matches(&Value::Map(m), &Filter::new("f", operator, search.clone()))
    }

    /// Rows of (field, search, whether the positive operator matches): the
    /// positive operator must give the expected result and the negated one
    /// its opposite.
    fn check_row(positive: &str, rows: &[(J, J, bool)]) {
        let pos = op(positive);
        assert!(!pos.is_negated());
        for (field, search, expected) in rows {
            let (field, search) = (v(field.clone()), v(search.clone()));
            for (o, want) in [(pos, *expected), (pos.negation(), !*expected)] {
                let got = run(&field, o, &search);
                assert_eq!(got, Ok(want), "{field:?} {o} {search:?}");
            }
        }
    }

    // ---- One test per row of the specification's operator tables ----

    #[test]
    #[rustfmt::skip]
    fn eq_primitive_primitive() {
        check_row("=", &[
            (json!("vpc-1"), json!("vpc-1"), true),
            (json!("vpc-1"), json!("vpc-2"), false),
            (json!("Vpc-1"), json!("vpc-1"), false),
            (json!(""), json!(""), true),
            (json!(80), json!(80), true),
            (json!(80), json!(81), false),
            (json!(1.5), json!(1.5), true),
            (json!(1.5), json!(2.5), false),
            (json!(true), json!(true), true),
            (json!(false), json!(true), false),
            // Integers and floats are both numbers, compared exactly.
            (json!(1), json!(1.0), true),
            (json!(1.0), json!(1), true),
            (json!(1), json!(1.5), false),
            (json!(9007199254740993_i64), json!(9007199254740992.0), false),
        ]);
    }

    #[test]
    #[rustfmt::skip]
    fn eq_array_array() {
        check_row("=", &[
            (json!(["a", "b"]), json!(["a", "b"]), true),
            (json!(["a", "b"]), json!(["b", "a"]), false),
            // Equal lengths: `=` is not a prefix test.
            (json!(["a", "b"]), json!(["a"]), false),
            (json!(["a"]), json!(["a", "b"]), false),
            (json!([1, 2]), json!([1, 2]), true),
            (json!([1, 2]), json!([1.0, 2.0]), true),
            (json!([1.5]), json!([1.5]), true),
            (json!([true, false]), json!([true, false]), true),
            (json!([true, false]), json!([true, true]), false),
            (json!([]), json!([]), true),
            (json!([]), json!(["a"]), false),
            (json!(["a"]), json!([]), false),
        ]);
    }

    #[test]
    #[rustfmt::skip]
    fn in_primitive_array() {
        check_row("in", &[
            (json!("eu-west-1a"), json!(["eu-west-1a", "eu-west-1b"]), true),
            (json!("eu-west-1c"), json!(["eu-west-1a", "eu-west-1b"]), false),
            (json!(443), json!([80, 443]), true),
            (json!(22), json!([80, 443]), false),
            (json!(2.0), json!([1, 2]), true),
            (json!(0.5), json!([0.25, 0.5]), true),
            (json!(true), json!([true]), true),
            (json!(false), json!([true]), false),
            (json!("a"), json!([]), false),
        ]);
    }

    #[test]
    #[rustfmt::skip]
    fn has_key_mapping_string() {
        check_row("has key", &[
            (json!({"env": "prod", "app": "x"}), json!("env"), true),
            (json!({"env": "prod"}), json!("Env"), false),
            (json!({"env": "prod"}), json!("prod"), false),
            // Any values: nested, null.
            (json!({"a": {"b": [1]}, "n": null}), json!("n"), true),
            (json!({}), json!("env"), false),
            (json!({"a.b": 1}), json!("a.b"), true),
        ]);
    }

    #[test]
    #[rustfmt::skip]
    fn contains_array_primitive() {
        check_row("contains", &[
            (json!(["sg-1", "sg-2"]), json!("sg-2"), true),
            (json!(["sg-1", "sg-2"]), json!("sg-3"), false),
            (json!(["sg-12"]), json!("sg-1"), false),
            (json!([80, 443]), json!(443), true),
            (json!([80, 443]), json!(443.0), true),
            (json!([1.5, 2.5]), json!(3.5), false),
            (json!([false]), json!(false), true),
            (json!([]), json!("x"), false),
        ]);
    }

    #[test]
    #[rustfmt::skip]
    fn contains_string_string() {
        check_row("contains", &[
            (json!("production-db"), json!("prod"), true),
            (json!("production-db"), json!("staging"), false),
            (json!("production-db"), json!("PROD"), false),
            (json!("abc"), json!(""), true),
            (json!(""), json!("a"), false),
            (json!("café au lait"), json!("é a"), true),
        ]);
    }

    #[test]
    #[rustfmt::skip]
    fn contains_mapping_primitive() {
        check_row("contains", &[
            (json!({"env": "prod", "team": "core"}), json!("core"), true),
            // Keys are not values.
            (json!({"env": "prod"}), json!("env"), false),
            (json!({"a": 1, "b": 2}), json!(2), true),
            (json!({"a": 1, "b": 2.5}), json!(2.5), true),
            (json!({"a": true}), json!(false), false),
            (json!({}), json!("x"), false),
        ]);
    }

    #[test]
    #[rustfmt::skip]
    fn starts_with_string_string() {
        check_row("starts with", &[
            (json!("vpc-0abc"), json!("vpc-"), true),
            (json!("vpc-0abc"), json!("subnet-"), false),
            (json!("vpc-0abc"), json!("VPC-"), false),
            (json!("vpc"), json!("vpc-"), false),
            (json!("abc"), json!(""), true),
            (json!("abc"), json!("abc"), true),
        ]);
    }

    #[test]
    #[rustfmt::skip]
    fn ends_with_string_string() {
        check_row("ends with", &[
            (json!("api.example.com"), json!(".example.com"), true),
            (json!("api.example.com"), json!(".example.org"), false),
            (json!("api.example.com"), json!(".EXAMPLE.com"), false),
            (json!("com"), json!(".com"), false),
            (json!("abc"), json!(""), true),
        ]);
    }

    // ---- Invalid combinations ----

    /// Rows of (field, search, "FIELD TYPE vs SEARCH TYPE") for `positive`
    /// and its negation, both of which must fail with those types in the
    /// error; the field type is `any` when the search alone is rejected.
    fn check_invalid(positive: &str, rows: &[(J, J, &str)]) {
        for (field, search, types) in rows {
            let (ft, st) = types.split_once(" vs ").expect("FIELD vs SEARCH");
            let field_type = (ft != "any").then_some(ft);
            let (field, search) = (v(field.clone()), v(search.clone()));
            for o in [op(positive), op(positive).negation()] {
                let err = run(&field, o, &search).expect_err(&format!("{field:?} {o} {search:?}"));
                assert_eq!((err.operator, err.field.as_str()), (o, "f"));
                match &err.kind {
                    FilterErrorKind::InvalidCombination {
                        field_type: got_ft,
                        search_type: got_st,
                        ..
                    } => assert_eq!((got_ft.as_deref(), got_st.as_str()), (field_type, st)),
                    k => panic!("{field:?} {o} {search:?}: {k:?}"),
                }
                let msg = err.to_string();
                assert!(msg.contains(&format!("filter `f {o} ..`")), "{msg}");
                assert!(msg.contains(&format!("`{o}` accepts field(")), "{msg}");
                assert!(msg.contains(&format!("the search is {st}")), "{msg}");
                if let Some(ft) = field_type {
                    assert!(msg.contains(&format!("the field `f` is {ft}")), "{msg}");
                }
            }
        }
    }

    #[test]
    #[rustfmt::skip]
    fn eq_invalid_combinations() {
        check_invalid("=", &[
            // Primitives of different types.
            (json!("80"), json!(80), "string vs integer"),
            (json!(80), json!("80"), "integer vs string"),
            (json!(true), json!("true"), "boolean vs string"),
            (json!(1), json!(true), "integer vs boolean"),
            // Primitive against array and back.
            (json!("a"), json!(["a"]), "string vs array[string]"),
            (json!(["a"]), json!("a"), "array[string] vs string"),
            // Arrays of different types, or not of primitives of one type.
            (json!(["1"]), json!([1]), "array[string] vs array[integer]"),
            (json!([1, "a"]), json!([1]), "array[integer | string] vs array[integer]"),
            (json!([{"a": 1}]), json!([]), "array[mapping] vs empty array"),
            (json!([null]), json!(["a"]), "array[null] vs array[string]"),
            (json!([["a"]]), json!(["a"]), "array[array] vs array[string]"),
            // Mappings are never compared with `=`.
            (json!({"a": 1}), json!("a"), "mapping[string, integer] vs string"),
            (json!({"a": 1}), json!([1]), "mapping[string, integer] vs array[integer]"),
            // Searches `=` never accepts.
            (json!("a"), json!(null), "any vs null"),
            (json!("a"), json!({"a": 1}), "any vs mapping[string, integer]"),
            (json!(["a"]), json!([["a"]]), "any vs array[array]"),
            (json!(["a"]), json!(["a", 1]), "any vs array[string | integer]"),
        ]);
    }

    #[test]
    #[rustfmt::skip]
    fn in_invalid_combinations() {
        check_invalid("in", &[
            // Searches `in` never accepts.
            (json!("a"), json!("a"), "any vs string"),
            (json!(1), json!(1), "any vs integer"),
            (json!("a"), json!(["a", 1]), "any vs array[string | integer]"),
            (json!("a"), json!(null), "any vs null"),
            (json!("a"), json!({"k": "a"}), "any vs mapping[string, string]"),
            // A primitive of another type than the search values.
            (json!("80"), json!([80]), "string vs array[integer]"),
            (json!(true), json!(["true"]), "boolean vs array[string]"),
            // The field is not a primitive.
            (json!(["a"]), json!(["a"]), "array[string] vs array[string]"),
            (json!({"a": 1}), json!([1]), "mapping[string, integer] vs array[integer]"),
        ]);
    }

    #[test]
    #[rustfmt::skip]
    fn has_key_invalid_combinations() {
        check_invalid("has key", &[
            (json!({"a": 1}), json!(1), "any vs integer"),
            (json!({"a": 1}), json!(true), "any vs boolean"),
            (json!({"a": 1}), json!(["a"]), "any vs array[string]"),
            (json!({"a": 1}), json!(null), "any vs null"),
            (json!(["a"]), json!("a"), "array[string] vs string"),
            (json!("a"), json!("a"), "string vs string"),
            (json!(1), json!("a"), "integer vs string"),
        ]);
    }

    #[test]
    #[rustfmt::skip]
    fn contains_invalid_combinations() {
        check_invalid("contains", &[
            // Searches `contains` never accepts.
            (json!(["a"]), json!(["a"]), "any vs array[string]"),
            (json!(["a"]), json!(null), "any vs null"),
            (json!({"a": "b"}), json!({"a": "b"}), "any vs mapping[string, string]"),
            // Array of primitives with a search of another type.
            (json!(["1"]), json!(1), "array[string] vs integer"),
            (json!([1, "a"]), json!("a"), "array[integer | string] vs string"),
            (json!([{"id": "a"}]), json!("a"), "array[mapping] vs string"),
            // String with a non-string search.
            (json!("abc1"), json!(1), "string vs integer"),
            // Mapping whose values are not primitives of the search's type.
            (json!({"a": "1"}), json!(1), "mapping[string, string] vs integer"),
            (json!({"a": "x", "b": 1}), json!("x"), "mapping[string, string | integer] vs string"),
            (json!({"a": {"b": "x"}}), json!("x"), "mapping[string, mapping] vs string"),
            (json!({"a": null}), json!("x"), "mapping[string, null] vs string"),
            // Primitives other than strings contain nothing.
            (json!(12), json!(1), "integer vs integer"),
            (json!(true), json!(true), "boolean vs boolean"),
        ]);
    }

    #[test]
    #[rustfmt::skip]
    fn starts_and_ends_with_invalid_combinations() {
        for o in ["starts with", "ends with"] {
            check_invalid(o, &[
                (json!("abc"), json!(1), "any vs integer"),
                (json!("abc"), json!(["a"]), "any vs array[string]"),
                (json!("abc"), json!(null), "any vs null"),
                (json!(123), json!("1"), "integer vs string"),
                (json!(["abc"]), json!("a"), "array[string] vs string"),
                (json!({"a": "abc"}), json!("a"), "mapping[string, string] vs string"),
                (json!(true), json!("t"), "boolean vs string"),
            ]);
        }
    }

    #[test]
    fn invalid_combination_messages_are_informative() {
        let err = run(&v(json!(123)), Operator::NotStartsWith, &v(json!("1"))).unwrap_err();
        assert_eq!(
            err.to_string(),
            "filter `f not starts with ..`: the field `f` is integer and the search is string, \
             which `not starts with` does not accept; `not starts with` accepts \
             field(string) not starts with search(string) (hint: values are compared without \
             conversion: a string never equals a number or a boolean (\"80\" is not 80))"
        );
        let err = run(&v(json!("a")), Operator::Eq, &v(json!(["a", "b"]))).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(
                "field(primitive) = search(primitive), or \
                 field(array[primitive]) = search(array[primitive])"
            ),
            "{msg}"
        );
        assert!(
            msg.contains("primitive = string | integer | float | boolean"),
            "{msg}"
        );
        assert!(msg.contains("use `in`"), "{msg}");
        let err = run(&v(json!("a")), Operator::NotEq, &v(json!(["a"]))).unwrap_err();
        assert!(err.to_string().contains("use `not in`"), "{err}");
        let err = run(&v(json!({"a": 1})), Operator::HasKey, &v(json!(["a", "b"]))).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(
                "the search is array[string], which `has key` does not accept for any field"
            ),
            "{msg}"
        );
        assert!(msg.contains("one filter per key"), "{msg}");
        let err = run(&v(json!(["a"])), Operator::In, &v(json!(["a"]))).unwrap_err();
        assert!(err.to_string().contains("use `contains`"), "{err}");
    }

    // ---- Missing fields, nulls, unknowns ----

    #[test]
    fn missing_fields_match_no_operator() {
        let items = [
            json!({}),
            json!({"f": null}),
            json!({"g": "x"}),
            json!({"meta": null}),
            json!({"list": []}),
        ];
        let filters = [
            ("f", "=", json!("x")),
            ("f", "in", json!(["x"])),
            ("f", "has key", json!("x")),
            ("f", "contains", json!("x")),
            ("f", "starts with", json!("x")),
            ("f", "ends with", json!("x")),
            ("meta.name", "=", json!("x")),
            ("list[0]", "=", json!("x")),
            ("list[].id", "=", json!("x")),
        ];
        for item in &items {
            let item = v(item.clone());
            for (field, o, search) in &filters {
                for o in [op(o), op(o).negation()] {
                    let filter = Filter::new(*field, o, v(search.clone()));
                    assert_eq!(matches(&item, &filter), Ok(false), "{item:?} {field} {o}");
                }
            }
        }
    }

    #[test]
    fn missing_field_does_not_hide_an_invalid_search() {
        let filter = Filter::new("absent", Operator::HasKey, 1);
        let err = matches(&v(json!({})), &filter).unwrap_err();
        assert!(matches!(
            err.kind,
            FilterErrorKind::InvalidCombination {
                field_type: None,
                ..
            }
        ));
    }

    #[test]
    fn unknown_search_cannot_be_evaluated() {
        let item = v(json!({"f": "x"}));
        let searches = [
            Value::Unknown,
            Value::List(vec![Value::from("x"), Value::Unknown]),
        ];
        for search in searches {
            for o in [Operator::Eq, Operator::In, Operator::NotIn] {
                let err = matches(&item, &Filter::new("f", o, search.clone())).unwrap_err();
                assert!(err.is_unknown(), "{err}");
                assert_eq!(err.kind, FilterErrorKind::UnknownSearch);
                assert!(err.to_string().contains("only known after deploy"));
            }
        }
        // Even when the item lacks the field, and when there are no items.
        let filter = Filter::new("absent", Operator::Eq, Value::Unknown);
        assert!(matches(&v(json!({})), &filter).unwrap_err().is_unknown());
        assert!(select(&[], &[filter]).unwrap_err().is_unknown());
        // A search shape the operator never accepts is reported first.
        let filter = Filter::new("f", Operator::Contains, Value::List(vec![Value::Unknown]));
        assert!(!matches(&item, &filter).unwrap_err().is_unknown());
    }

    #[test]
    fn unknown_field_cannot_be_evaluated() {
        let mut m = IndexMap::new();
        m.insert("f".to_owned(), Value::Unknown);
        let list = Value::List(vec![Value::from("a"), Value::Unknown]);
        m.insert("l".to_owned(), list);
        let mut tags = IndexMap::new();
        tags.insert("env".to_owned(), Value::Unknown);
        m.insert("tags".to_owned(), Value::Map(tags));
        let item = Value::Map(m);
        for (field, o, search) in [
            ("f", Operator::Eq, Value::from("x")),
            ("f.deeper", Operator::Eq, Value::from("x")),
            ("l", Operator::Contains, Value::from("a")),
            ("l", Operator::NotContains, Value::from("a")),
            ("tags", Operator::Contains, Value::from("prod")),
        ] {
            let err = matches(&item, &Filter::new(field, o, search)).unwrap_err();
            assert_eq!(err.kind, FilterErrorKind::UnknownField, "{field}");
            assert!(err.is_unknown());
        }
        // `has key` needs only the keys.
        let has = |o| matches(&item, &Filter::new("tags", o, "env"));
        assert_eq!(has(Operator::HasKey), Ok(true));
        assert_eq!(has(Operator::NotHasKey), Ok(false));
    }

    // ---- Paths ----

    #[test]
    #[rustfmt::skip]
    fn path_parsing() {
        use Step::{Index as I, Key as K};
        let k = |s: &str| K(s.to_owned());
        let ok: &[(&str, Vec<Step>)] = &[
            ("name", vec![k("name")]),
            ("metadata.name", vec![k("metadata"), k("name")]),
            ("subnets[0].az", vec![k("subnets"), I(0), k("az")]),
            ("subnets[].az", vec![k("subnets"), I(0), k("az")]),
            ("a[12][3]", vec![k("a"), I(12), I(3)]),
            ("tags[\"app.kubernetes.io/name\"]", vec![k("tags"), k("app.kubernetes.io/name")]),
            ("[\"a b\"].c", vec![k("a b"), k("c")]),
            ("aws:cloudformation:stack-name", vec![k("aws:cloudformation:stack-name")]),
            ("_x-1.$ref", vec![k("_x-1"), k("$ref")]),
            ("ünïcode.名前", vec![k("ünïcode"), k("名前")]),
        ];
        for (text, steps) in ok {
            let p = FieldPath::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(p.steps(), steps.as_slice(), "{text}");
            assert_eq!(p.as_str(), *text);
        }
        let bad: &[(&str, usize, &str)] = &[
            ("", 0, "empty"),
            (".a", 0, "expected a name"),
            ("a.", 2, "expected a name after `.`, found the end"),
            ("a..b", 2, "expected a name after `.`, found `.`"),
            ("a b", 1, "whitespace"),
            ("a[", 2, "expected an index"),
            ("a[x]", 2, "expected an index"),
            ("a[-1]", 2, "expected an index"),
            ("a[1", 3, "expected `]`"),
            ("a[1.5]", 3, "expected `]`"),
            ("a[\"x", 1, "unterminated"),
            ("a[\"\"]", 3, "cannot be empty"),
            ("a[\"x\"", 5, "expected `]` after the quoted key"),
            ("a]", 1, "expected `.` or `[`"),
            ("a\"b", 1, "expected `.` or `[`"),
            ("a[99999999999999999999999]", 2, "too large"),
        ];
        for (text, offset, message) in bad {
            let e = FieldPath::parse(text).expect_err(text);
            assert_eq!(e.offset, *offset, "{text}: {e}");
            assert!(e.message.contains(message), "{text}: {e}");
        }
    }

    #[test]
    #[rustfmt::skip]
    fn dot_paths_and_indexes() {
        let item = v(json!({
            "metadata": {"name": "web", "labels": {"app.kubernetes.io/name": "web"}},
            "subnets": [{"az": "eu-west-1a", "id": "s-1"}, {"az": "eu-west-1b", "id": "s-2"}],
            "ports": [80, 443],
            "matrix": [[1, 2], [3, 4]],
        }));
        let rows: &[(&str, &str, J, bool)] = &[
            ("metadata.name", "=", json!("web"), true),
            ("metadata.name", "starts with", json!("we"), true),
            ("metadata.labels[\"app.kubernetes.io/name\"]", "=", json!("web"), true),
            ("metadata.labels", "has key", json!("app.kubernetes.io/name"), true),
            ("subnets[0].az", "=", json!("eu-west-1a"), true),
            ("subnets[].az", "=", json!("eu-west-1a"), true),
            ("subnets[1].az", "in", json!(["eu-west-1b", "eu-west-1c"]), true),
            ("subnets[1].id", "=", json!("s-1"), false),
            ("ports[1]", "=", json!(443), true),
            ("ports", "contains", json!(80), true),
            ("matrix[1][0]", "=", json!(3), true),
            ("matrix[1]", "=", json!([3, 4]), true),
            // Out of range, absent key: missing, so no match either way.
            ("subnets[2].az", "=", json!("eu-west-1a"), false),
            ("subnets[2].az", "!=", json!("eu-west-1a"), false),
            ("metadata.namespace", "!=", json!("x"), false),
        ];
        for (field, o, search, want) in rows {
            let got = matches(&item, &Filter::new(*field, op(o), v(search.clone())));
            assert_eq!(got, Ok(*want), "{field} {o} {search}");
        }
    }

    #[test]
    #[rustfmt::skip]
    fn path_steps_that_do_not_fit_the_item_are_errors() {
        let item = v(json!({"metadata": "web", "subnets": [{"az": "a"}], "tags": {"a": 1}}));
        let rows: &[(&str, &str, &str)] = &[
            ("metadata.name", "`metadata` is a string, so `.name` cannot be read", "a key can only"),
            ("subnets.az", "`subnets` is an array, so `.az` cannot be read", "use `[n]`"),
            ("tags[0]", "`tags` is a mapping, so `[0]` cannot be read", "an index can only"),
            ("subnets[0].az[0]", "`subnets[0].az` is a string, so `[0]` cannot be read", ""),
        ];
        for (field, text, hint) in rows {
            let err = matches(&item, &Filter::new(*field, Operator::Eq, "x")).unwrap_err();
            assert!(matches!(err.kind, FilterErrorKind::PathMismatch { .. }), "{field}");
            let msg = err.to_string();
            assert!(msg.contains(text), "{msg}");
            assert!(msg.contains(hint), "{msg}");
        }
        // The item itself is not a mapping.
        let err = matches(&v(json!("x")), &Filter::new("name", Operator::Eq, "x")).unwrap_err();
        assert!(err.to_string().contains("the item is a string, so `.name`"), "{err}");
        // An invalid path is an error even before anything is looked up.
        let err = matches(&item, &Filter::new("a..b", Operator::Eq, "x")).unwrap_err();
        assert!(matches!(err.kind, FilterErrorKind::Path(_)));
        assert!(err.to_string().contains("not a valid path"), "{err}");
    }

    // ---- Operators ----

    #[test]
    fn operators_parse_exactly() {
        for o in Operator::ALL {
            assert_eq!(Operator::parse(o.as_str()), Some(o));
            assert_eq!(o.as_str().parse::<Operator>(), Ok(o));
            assert_eq!(o.negation().negation(), o);
            assert_ne!(o.is_negated(), o.negation().is_negated());
            assert_eq!(o.positive(), o.negation().positive());
        }
        for bad in [
            "==", "IN", "not  in", " in", "haskey", "has_key", "not_in", "",
        ] {
            assert_eq!(Operator::parse(bad), None, "{bad}");
            let e = bad.parse::<Operator>().unwrap_err();
            assert!(e.to_string().contains("`not ends with`"));
        }
    }

    // ---- select ----

    #[rustfmt::skip]
    fn vpcs() -> Vec<Value> {
        [
            json!({"id": "vpc-1", "name": "default", "tags": {"env": "dev"}, "cidr": "10.0.0.0/16"}),
            json!({"id": "vpc-2", "name": "main", "tags": {"env": "prod"}, "cidr": "10.1.0.0/16"}),
            json!({"id": "vpc-3", "name": "main", "tags": {"env": "prod", "team": "core"}, "cidr": "10.2.0.0/16"}),
            json!({"id": "vpc-4", "tags": {}}),
        ]
        .into_iter()
        .map(v)
        .collect()
    }

    fn id(item: Option<&Value>) -> Option<&str> {
        match item? {
            Value::Map(m) => match m.get("id")? {
                Value::Str(s) => Some(s),
                _ => None,
            },
            _ => None,
        }
    }

    #[test]
    #[rustfmt::skip]
    fn select_first_match_of_all_filters() {
        let items = vpcs();
        type Row<'a> = (&'a [(&'a str, &'a str, J)], Option<&'a str>);
        let rows: &[Row] = &[
            (&[("name", "=", json!("main"))], Some("vpc-2")),
            (&[("tags", "has key", json!("env"))], Some("vpc-1")),
            (&[("tags", "contains", json!("prod"))], Some("vpc-2")),
            (&[("name", "=", json!("main")), ("tags", "has key", json!("team"))], Some("vpc-3")),
            (&[("tags", "has key", json!("team")), ("name", "=", json!("main"))], Some("vpc-3")),
            (&[("name", "=", json!("main")), ("cidr", "starts with", json!("10.9."))], None),
            // Negations skip items without the field (vpc-4 has no name).
            (&[("name", "!=", json!("default"))], Some("vpc-2")),
            (&[("tags", "not has key", json!("env"))], Some("vpc-4")),
            (&[("id", "in", json!(["vpc-9", "vpc-4", "vpc-3"]))], Some("vpc-3")),
            // No filters: the first item.
            (&[], Some("vpc-1")),
        ];
        for (filters, want) in rows {
            let filters: Vec<Filter> = filters
                .iter()
                .map(|(f, o, s)| Filter::new(*f, op(o), v(s.clone())))
                .collect();
            let got = select(&items, &filters).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(id(got), *want, "{filters:?}");
        }
        assert_eq!(select(&[], &[Filter::new("id", Operator::Eq, "x")]), Ok(None));
    }

    #[test]
    fn select_reports_errors_on_any_item_with_its_index() {
        let mut items = vpcs();
        // An item after the match whose `name` is a number.
        items.push(v(json!({"id": "vpc-5", "name": 5})));
        let err = select(&items, &[Filter::new("name", Operator::Eq, "main")]).unwrap_err();
        assert_eq!(err.item, Some(4));
        assert!(err.to_string().contains("on the item at index 4"), "{err}");
        assert!(matches!(
            err.kind,
            FilterErrorKind::InvalidCombination {
                field_type: Some(_),
                ..
            }
        ));
    }

    #[test]
    fn select_earlier_filters_guard_later_ones() {
        // Heterogeneous items: `port` is a number on services and a string
        // on ingresses. Filtering on the kind first keeps the number filter
        // away from the string ports.
        let items: Vec<Value> = [
            json!({"kind": "ingress", "port": "http"}),
            json!({"kind": "service", "port": 80}),
            json!({"kind": "service", "port": 443}),
        ]
        .into_iter()
        .map(v)
        .collect();
        let port = Filter::new("port", Operator::Eq, 443);
        let kind = Filter::new("kind", Operator::Eq, "service");
        let got = select(&items, &[kind.clone(), port.clone()]).unwrap();
        assert_eq!(got, Some(&items[2]));
        // The other way round, the ingress's string port is compared: error.
        let err = select(&items, &[port, kind]).unwrap_err();
        assert_eq!(err.item, Some(0));
    }

    #[test]
    fn select_checks_filters_before_items() {
        for filter in [
            Filter::new("a..b", Operator::Eq, "x"),
            Filter::new("tags", Operator::HasKey, 1),
            Filter::new("id", Operator::In, "x"),
        ] {
            let err = select(&[], std::slice::from_ref(&filter)).unwrap_err();
            assert_eq!(err.item, None);
            assert_eq!(filter.check(), Err(err));
        }
        let ok = Filter::new("a.b[0]", Operator::In, v(json!([1, 2.5])));
        assert_eq!(ok.check(), Ok(()));
    }

    #[test]
    fn absent_fields_names_likely_typos() {
        let items = vpcs();
        let filters = [
            Filter::new("name", Operator::Eq, "x"),
            Filter::new("nmae", Operator::Eq, "x"),
            Filter::new("tags.owner", Operator::Eq, "x"),
            Filter::new("a..b", Operator::Eq, "x"),
        ];
        assert_eq!(absent_fields(&items, &filters), ["nmae", "tags.owner"]);
        assert!(absent_fields(&[], &filters).is_empty());
    }

    // ---- Exports ----

    fn vpc() -> Value {
        v(json!({
            "vpcId": "vpc-1",
            "metadata": {"name": "main", "owner": null},
            "subnets": ["s-1", "s-2"],
            "ports": [80, 443.5],
            "mixed": [1, "a"],
            "rules": [{"port": 80}],
            "count": 3,
            "ratio": 0.5,
            "big": 9007199254740993_i64,
            "enabled": true,
            "tags": {"env": "prod"},
            "list": [{"id": "a"}],
        }))
    }

    #[test]
    #[rustfmt::skip]
    fn exports_with_alias_and_paths() {
        use ExportType::*;
        let exports = [
            Export::new("vpc", String).alias_for("vpcId"),
            Export::new("metadata.name", String),
            Export::new("owner", String).alias_for("metadata.name"),
            Export::new("subnets", Array),
            Export::new("firstSubnet", String).alias_for("subnets[]"),
            Export::new("secondSubnet", String).alias_for("subnets[1]"),
            Export::new("ports", Array),
            Export::new("count", Integer),
            Export::new("ratio", Float),
            Export::new("countAsFloat", Float).alias_for("count"),
            Export::new("enabled", Boolean),
            Export::new("env", String).alias_for("tags.env"),
            Export::new("listId", String).alias_for("list[0].id"),
        ];
        let out = export(&vpc(), &exports).unwrap_or_else(|e| panic!("{e}"));
        let want = json!({
            "vpc": "vpc-1",
            "metadata.name": "main",
            "owner": "main",
            "subnets": ["s-1", "s-2"],
            "firstSubnet": "s-1",
            "secondSubnet": "s-2",
            "ports": [80, 443.5],
            "count": 3,
            "ratio": 0.5,
            "countAsFloat": 3.0,
            "enabled": true,
            "env": "prod",
            "listId": "a",
        });
        assert_eq!(Value::Map(out.clone()), v(want));
        // Declaration order, and the integer really became a float.
        assert_eq!(out.keys().next().map(|k| k.as_str()), Some("vpc"));
        assert_eq!(out["countAsFloat"], Value::Float(3.0));
    }

    #[test]
    #[rustfmt::skip]
    fn export_errors() {
        use ExportType::*;
        let item = vpc();
        let rows: &[(Export, &str)] = &[
            (Export::new("vpc", String), "export `vpc`: the selected item has no field `vpc`"),
            (Export::new("id", String).alias_for("metadata.uid"),
                "export `id` (field `metadata.uid`): the selected item has no field `metadata.uid`"),
            (Export::new("subnet", String).alias_for("subnets[5]"), "has no field `subnets[5]`"),
            (Export::new("owner", String).alias_for("metadata.owner"),
                "the field `metadata.owner` of the selected item is null"),
            (Export::new("count", String),
                "declared string but the field is integer (hint: declare the export as `integer` or `float`)"),
            (Export::new("ratio", Integer),
                "declared integer but the field is float (hint: declare the export as `float`)"),
            (Export::new("vpcId", Integer), "declared integer but the field is string"),
            (Export::new("enabled", String), "declared string but the field is boolean"),
            (Export::new("vpcId", Boolean), "declared boolean but the field is string"),
            (Export::new("vpcId", Float), "declared float but the field is string"),
            (Export::new("big", Float),
                "the integer 9007199254740993, which a float cannot represent exactly"),
            (Export::new("subnets", String),
                "declared string but the field is array[string] (hint: declare the export as `array`)"),
            (Export::new("vpcId", Array), "declared array but the field is string"),
            (Export::new("mixed", Array),
                "declared array but the field is array[integer | string]; an exported array holds primitives of one type"),
            (Export::new("rules", Array), "declared array but the field is array[mapping]"),
            (Export::new("tags", String), "a mapping cannot be exported"),
            (Export::new("tags", Array), "declared array but the field is mapping[string, string]"),
            (Export::new("x", String).alias_for("vpcId.name"),
                "`vpcId` is a string, so `.name` cannot be read"),
            (Export::new("x", String).alias_for("a..b"), "`a..b` is not a valid path"),
        ];
        for (x, text) in rows {
            let err = export(&item, std::slice::from_ref(x)).expect_err(&x.name);
            assert!(err.to_string().contains(text), "{x:?}: {err}");
            assert_eq!(err.export, x.name);
            assert_eq!(err.field, x.source_field());
        }
        // The first failing export is the error.
        let xs = [Export::new("vpcId", String), Export::new("a", String), Export::new("b", String)];
        assert_eq!(export(&item, &xs).unwrap_err().export, "a");
    }

    #[test]
    fn exports_pass_unknown_values_through() {
        let ids = Value::List(vec![Value::from("a"), Value::Unknown]);
        let mut m = IndexMap::new();
        m.insert("arn".to_owned(), Value::Unknown);
        m.insert("ids".to_owned(), ids.clone());
        m.insert("meta".to_owned(), Value::Unknown);
        let exports = [
            Export::new("arn", ExportType::String),
            Export::new("ids", ExportType::Array),
            Export::new("name", ExportType::String).alias_for("meta.name"),
        ];
        let out = export(&Value::Map(m), &exports).unwrap();
        assert_eq!(out["arn"], Value::Unknown);
        assert_eq!(out["ids"], ids);
        assert_eq!(out["name"], Value::Unknown);
    }

    #[test]
    fn export_types_parse() {
        for t in ExportType::ALL {
            assert_eq!(ExportType::parse(t.as_str()), Some(t));
        }
        assert_eq!(ExportType::parse("object"), None);
        assert_eq!(ExportType::parse("Array"), None);
    }

    // ---- Properties ----

    mod props {
        use super::*;
        use proptest::prelude::*;

        fn prim() -> impl Strategy<Value = Value> {
            prop_oneof![
                "[ab]{0,2}".prop_map(Value::Str),
                (-2i64..3).prop_map(Value::Int),
                prop_oneof![Just(0.0), Just(1.0), Just(1.5)].prop_map(Value::Float),
                any::<bool>().prop_map(Value::Bool),
            ]
        }

        fn value() -> impl Strategy<Value = Value> {
            prop_oneof![
                4 => prim(),
                1 => Just(Value::Null),
                2 => prop::collection::vec(prim(), 0..3).prop_map(Value::List),
                2 => prop::collection::vec(("[ab]", prim()), 0..3)
                    .prop_map(|kv| Value::Map(kv.into_iter().collect())),
            ]
        }

        fn without_hint(kind: FilterErrorKind) -> FilterErrorKind {
            match kind {
                FilterErrorKind::InvalidCombination {
                    field_type,
                    search_type,
                    ..
                } => FilterErrorKind::InvalidCombination {
                    field_type,
                    search_type,
                    hint: None,
                },
                k => k,
            }
        }

        proptest! {
            /// A negated operator is the exact complement of its positive
            /// form, except that both are false on a missing (null) field;
            /// errors are the same for both.
            #[test]
            fn negation_is_the_complement(
                field in value(),
                search in value(),
                o in prop::sample::select(Operator::ALL.to_vec()),
            ) {
                let pos = run(&field, o.positive(), &search);
                let neg = run(&field, o.positive().negation(), &search);
                match (pos, neg) {
                    (Ok(p), Ok(n)) => {
                        if field == Value::Null {
                            prop_assert!(!p && !n);
                        } else {
                            prop_assert_ne!(p, n);
                        }
                    }
                    // The same error; only the hint may differ (`in`, `not in`).
                    (Err(p), Err(n)) => {
                        prop_assert_eq!(without_hint(p.kind), without_hint(n.kind));
                    }
                    (p, n) => prop_assert!(false, "{:?} vs {:?}", p, n),
                }
            }
        }
    }
}
