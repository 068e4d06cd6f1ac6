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
mod tests;
