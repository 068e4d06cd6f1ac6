//! The 50 core functions of `core-functions.md`, evaluated over [`Value`]s.
//!
//! [`call`] runs a core function on evaluated arguments; [`apply`] runs a
//! function value (a bare core function, a `_g`/`getattr`/`getelem` partial,
//! a composition or a pipe). Names, arities and parameter types follow the
//! signature table in `crate::functions`; arity is checked against it.
//!
//! Unknown values (known only after deploy) propagate: a call with an
//! unknown argument returns [`Value::Unknown`] instead of failing, except
//! `and`/`or` (which short-circuit on a known deciding operand) and
//! `list`/`object` (which build a container holding the unknown value).
//! Functions that look inside arrays and objects (`eq`, `contains`, `join`,
//! the higher-order functions) return unknown only where an unknown element
//! decides the result.
//!
//! Choices where the specification is silent or ambiguous (each tested):
//! - `substr(s, start, end)`: character indexes, `start` inclusive, `end`
//!   exclusive; a negative index, `start > end` or an index beyond the length
//!   is an error (no clamping). `start == len` gives `""`.
//! - `index`/`last_index` return character (not byte) indexes; an empty
//!   substring is found at 0 and at the length respectively.
//! - `split(s, "")` splits into characters; `split("", d)` is `[""]`.
//! - `eq` compares deeply; integers and floats compare by numeric value
//!   (`eq(1, 1.0)` is true); values of different types are unequal (not an
//!   error); comparing two functions at the top level is an error.
//! - `gt`/`ge`/`lt`/`le` compare integers and floats exactly, also mixed.
//! - `list` requires its (known) arguments to share a type; integers and
//!   floats count as one numeric type.
//! - `object` with duplicate names or positional arguments is an error.
//! - `map` and `flatmap` pass `(item, index)` to functions that can take a
//!   second argument and `(item)` otherwise; `reduce` likewise passes
//!   `(acc, item, index)` or `(acc, item)`. "Can take" means the function's
//!   fixed maximum arity exceeds the base count and its minimum does not
//!   exceed base + 1: variadic functions (`list`) and partials (which take
//!   exactly one argument) never receive the index. `filter` and `sort`
//!   never pass an index.
//! - `compose()`/`pipe()` with no functions is the identity function.
//! - `datetime("unix")` returns a string (the declared return type); the
//!   `rfc3339` format is `YYYY-MM-DDThh:mm:ssZ` (whole seconds, UTC).
//! - `link` takes resource names as strings; the caller resolves resource
//!   references to names before calling.

use std::cmp::Ordering;
use std::fmt;

use indexmap::IndexMap;

use super::limits::{Budget, LimitError, VALUE_BYTES, measure_capped, string_bytes};
use super::value::{Func, Value};
use crate::functions as signatures;

/// What the core functions need from the host. Clock and working directory
/// are inputs so that evaluation is deterministic under test.
pub struct Env<'a> {
    pub cwd: &'a str,
    pub now_unix_nanos: i128,
    /// The state of the link between two resources (by name); typically
    /// [`Value::Unknown`] at plan time.
    pub link: &'a dyn Fn(&str, &str) -> Value,
}

/// A failed function call.
#[derive(Clone, Debug, PartialEq)]
pub struct FnError {
    pub function: String,
    /// 1-based argument position; `None` when the error is not about one
    /// argument (e.g. the argument count).
    pub position: Option<usize>,
    pub message: String,
    /// Set when the call ran into an evaluation limit rather than rejecting its input.
    pub limit: Option<LimitError>,
}

impl FnError {
    fn at(function: &str, position: usize, message: impl Into<String>) -> Self {
        FnError {
            function: function.to_owned(),
            position: Some(position),
            message: message.into(),
            limit: None,
        }
    }

    fn general(function: &str, message: impl Into<String>) -> Self {
        FnError {
            function: function.to_owned(),
            position: None,
            message: message.into(),
            limit: None,
        }
    }

    /// `function` ran into an evaluation limit.
    pub fn limit(function: &str, e: LimitError) -> Self {
        FnError {
            function: function.to_owned(),
            position: None,
            message: e.to_string(),
            limit: Some(e),
        }
    }
}

impl fmt::Display for FnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.position {
            Some(position) => write!(
                f,
                "{}: argument {position}: {}",
                self.function, self.message
            ),
            None => write!(f, "{}: {}", self.function, self.message),
        }
    }
}

impl std::error::Error for FnError {}

/// The function value of a core function used by name (`map(xs, to_upper)`).
pub fn function_value(name: &str) -> Option<Func> {
    signatures::core(name).map(|sig| Func::Core(sig.name))
}

/// Calls a core function with evaluated arguments. `named` holds named
/// arguments, meaningful only for `object`; for other functions the
/// specification ignores the names, so their values are appended to the
/// positional arguments.
pub fn call(
    name: &str,
    args: Vec<Value>,
    named: Vec<(String, Value)>,
    env: &Env,
) -> Result<Value, FnError> {
    call_in(name, args, named, env, &Budget::default())
}

/// [`call`] within an evaluation's [`Budget`]: the result is checked against the size limit
/// and charged.
pub fn call_in(
    name: &str,
    args: Vec<Value>,
    named: Vec<(String, Value)>,
    env: &Env,
    budget: &Budget,
) -> Result<Value, FnError> {
    let result = call_unchecked(name, args, named, env, budget)?;
    budget
        .produced(&result)
        .map_err(|e| FnError::limit(name, e))?;
    Ok(result)
}

fn call_unchecked(
    name: &str,
    args: Vec<Value>,
    named: Vec<(String, Value)>,
    env: &Env,
    budget: &Budget,
) -> Result<Value, FnError> {
    let Some(sig) = signatures::core(name) else {
        return Err(FnError::general(name, "unknown function"));
    };
    let name = sig.name;
    if name == "object" {
        return object(args, named);
    }
    let mut args = args;
    args.extend(named.into_iter().map(|(_, value)| value));

    let count = args.len();
    if count < sig.min_args() || sig.max_args().is_some_and(|max| count > max) {
        return Err(FnError::general(
            name,
            format!("expected {}, found {count}", sig.arity_text()),
        ));
    }
    // These decide for themselves what an unknown argument means.
    let handles_unknown = matches!(name, "and" | "or" | "list");
    if !handles_unknown && args.iter().any(Value::is_unknown) {
        return Ok(Value::Unknown);
    }
    dispatch(
        Args {
            function: name,
            values: &args,
            budget,
        },
        env,
    )
}

/// Applies a function value to arguments.
pub fn apply(f: &Func, args: Vec<Value>, env: &Env) -> Result<Value, FnError> {
    apply_in(f, args, env, &Budget::default())
}

/// [`apply`] within an evaluation's [`Budget`].
pub fn apply_in(f: &Func, args: Vec<Value>, env: &Env, budget: &Budget) -> Result<Value, FnError> {
    match f {
        Func::Core(name) => call_in(name, args, Vec::new(), env, budget),
        Func::Partial {
            name,
            args: captured,
        } => apply_partial(name, captured, args, env, budget),
        // compose(f, g)(x) == f(g(x))
        Func::Compose(fs) => apply_chain("compose", fs.iter().rev(), args, env, budget),
        // pipe(f, g)(x) == g(f(x))
        Func::Pipe(fs) => apply_chain("pipe", fs.iter(), args, env, budget),
    }
}

fn dispatch(a: Args, env: &Env) -> Result<Value, FnError> {
    match a.function {
        "fromjson" => fromjson(&a),
        "jsondecode" => Ok(Value::from_json(&parse_json(&a, 0)?)),
        "len" => len(&a),
        "substr" => substr(&a),
        "replace" => replace(&a),
        "trim" => Ok(Value::from(a.str(0)?.trim())),
        "trimprefix" => {
            let s = a.str(0)?;
            Ok(Value::from(s.strip_prefix(a.str(1)?).unwrap_or(s)))
        }
        "trimsuffix" => {
            let s = a.str(0)?;
            Ok(Value::from(s.strip_suffix(a.str(1)?).unwrap_or(s)))
        }
        "split" => split(&a),
        "join" => join(&a),
        "index" => {
            let s = a.str(0)?;
            Ok(Value::Int(
                s.find(a.str(1)?).map_or(-1, |at| char_index(s, at)),
            ))
        }
        "last_index" => {
            let s = a.str(0)?;
            Ok(Value::Int(
                s.rfind(a.str(1)?).map_or(-1, |at| char_index(s, at)),
            ))
        }
        "to_upper" => Ok(Value::Str(a.str(0)?.to_uppercase())),
        "to_lower" => Ok(Value::Str(a.str(0)?.to_lowercase())),
        "has_prefix" => Ok(Value::Bool(a.str(0)?.starts_with(a.str(1)?))),
        "has_suffix" => Ok(Value::Bool(a.str(0)?.ends_with(a.str(1)?))),
        "contains" => contains(&a),
        "list" => list(&a),
        "keys" => Ok(Value::List(
            a.map(0)?.keys().map(|k| Value::from(k.as_str())).collect(),
        )),
        "vals" => Ok(Value::List(a.map(0)?.values().cloned().collect())),
        "map" => map(&a, env),
        "filter" => filter(&a, env),
        "reduce" => reduce(&a, env),
        "sort" => sort(&a, env),
        "flatmap" => flatmap(&a, env),
        "compose" => Ok(Value::Func(Func::Compose(a.funcs()?))),
        "pipe" => Ok(Value::Func(Func::Pipe(a.funcs()?))),
        "getattr" => {
            a.str(0)?;
            Ok(a.partial())
        }
        "getelem" => {
            let index = a.int(0)?;
            if index < 0 {
                return Err(a.error(0, format!("index must not be negative, found {index}")));
            }
            Ok(a.partial())
        }
        "link" => Ok((env.link)(a.str(0)?, a.str(1)?)),
        "and" => and_or(&a, false),
        "or" => and_or(&a, true),
        "not" => Ok(Value::Bool(!a.bool(0)?)),
        "eq" => eq(&a),
        "gt" => compare(&a, |o| o == Ordering::Greater),
        "ge" => compare(&a, |o| o != Ordering::Less),
        "lt" => compare(&a, |o| o == Ordering::Less),
        "le" => compare(&a, |o| o != Ordering::Greater),
        "cwd" => Ok(Value::from(env.cwd)),
        "datetime" => datetime(&a, env),
        // The composable variants check their static arguments now, so that a
        // mistake is reported where it was written, and capture them.
        "fromjson_g" | "replace_g" | "trimprefix_g" | "trimsuffix_g" | "split_g"
        | "has_prefix_g" | "has_suffix_g" => {
            for i in 0..a.values.len() {
                a.str(i)?;
            }
            Ok(a.partial())
        }
        "substr_g" => {
            a.int(0)?;
            a.opt_int(1)?;
            Ok(a.partial())
        }
        "contains_g" => Ok(a.partial()),
        other => Err(FnError::general(other, "not implemented")),
    }
}

// ---------------------------------------------------------------------------
// Argument extraction

/// The evaluated arguments of one call, with the function they belong to so
/// that every error names the function and the argument position.
struct Args<'v> {
    function: &'static str,
    values: &'v [Value],
    /// The evaluation's limits: checked before building a result whose size is known early.
    budget: &'v Budget,
}

impl<'v> Args<'v> {
    /// An error about argument `i` (0-based).
    fn error(&self, i: usize, message: impl Into<String>) -> FnError {
        FnError::at(self.function, i + 1, message)
    }

    fn type_error(&self, i: usize, expected: &str, found: &Value) -> FnError {
        self.error(
            i,
            format!("expected {expected}, found {}", found.type_name()),
        )
    }

    fn get(&self, i: usize) -> Result<&'v Value, FnError> {
        // Arity is checked before dispatch; this guards against a mismatch
        // between the signature table and an implementation.
        self.values
            .get(i)
            .ok_or_else(|| FnError::general(self.function, format!("missing argument {}", i + 1)))
    }

    fn str(&self, i: usize) -> Result<&'v str, FnError> {
        match self.get(i)? {
            Value::Str(s) => Ok(s),
            other => Err(self.type_error(i, "string", other)),
        }
    }

    fn int(&self, i: usize) -> Result<i64, FnError> {
        match self.get(i)? {
            Value::Int(n) => Ok(*n),
            other => Err(self.type_error(i, "integer", other)),
        }
    }

    fn opt_int(&self, i: usize) -> Result<Option<i64>, FnError> {
        if i < self.values.len() {
            self.int(i).map(Some)
        } else {
            Ok(None)
        }
    }

    fn bool(&self, i: usize) -> Result<bool, FnError> {
        match self.get(i)? {
            Value::Bool(b) => Ok(*b),
            other => Err(self.type_error(i, "boolean", other)),
        }
    }

    /// A boolean, or `None` when unknown.
    fn bool_or_unknown(&self, i: usize) -> Result<Option<bool>, FnError> {
        match self.get(i)? {
            Value::Unknown => Ok(None),
            _ => self.bool(i).map(Some),
        }
    }

    fn list(&self, i: usize) -> Result<&'v [Value], FnError> {
        match self.get(i)? {
            Value::List(items) => Ok(items),
            other => Err(self.type_error(i, "array", other)),
        }
    }

    fn map(&self, i: usize) -> Result<&'v IndexMap<String, Value>, FnError> {
        match self.get(i)? {
            Value::Map(map) => Ok(map),
            other => Err(self.type_error(i, "object", other)),
        }
    }

    fn func(&self, i: usize) -> Result<&'v Func, FnError> {
        match self.get(i)? {
            Value::Func(f) => Ok(f),
            other => Err(self.type_error(i, "function", other)),
        }
    }

    fn num(&self, i: usize) -> Result<Num, FnError> {
        match self.get(i)? {
            Value::Int(n) => Ok(Num::Int(*n)),
            Value::Float(x) => Ok(Num::Float(*x)),
            other => Err(self.type_error(i, "integer or float", other)),
        }
    }

    /// Every argument as a function (`compose`, `pipe`).
    fn funcs(&self) -> Result<Vec<Func>, FnError> {
        (0..self.values.len())
            .map(|i| self.func(i).cloned())
            .collect()
    }

    /// This call as a function value capturing its arguments.
    fn partial(&self) -> Value {
        Value::Func(Func::Partial {
            name: self.function,
            args: self.values.to_vec(),
        })
    }

    /// Wraps the error of a function applied by a higher-order function
    /// (whose function is argument 2) with the element it was applied to.
    fn element_error(&self, index: usize, inner: FnError) -> FnError {
        // A limit is the evaluation's, not the element's: keep it as it is.
        if inner.limit.is_some() {
            return inner;
        }
        self.error(
            1,
            format!("applying the function to the element at index {index}: {inner}"),
        )
    }

    /// Refuses a result of `bytes` before it is built.
    fn check_size(&self, bytes: u64, what: &str) -> Result<(), FnError> {
        self.budget
            .check_size(bytes, || what.to_owned())
            .map_err(|e| FnError::limit(self.function, e))
    }
}

fn to_int(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The character index of a byte offset on a character boundary.
fn char_index(s: &str, byte_offset: usize) -> i64 {
    to_int(
        s.char_indices()
            .take_while(|(at, _)| *at < byte_offset)
            .count(),
    )
}

// ---------------------------------------------------------------------------
// JSON

fn parse_json(a: &Args, i: usize) -> Result<serde_json::Value, FnError> {
    let text = a.str(i)?;
    // A short text can decode to many values (`[0,0,..]`): refuse before decoding one too big.
    a.check_size(
        json_values(text).saturating_mul(VALUE_BYTES) + text.len() as u64,
        "the decoded JSON document",
    )?;
    // serde_json bounds nesting depth, so hostile input cannot overflow the stack.
    serde_json::from_str(text).map_err(|e| a.error(i, format!("invalid JSON: {e}")))
}

/// At most how many values the JSON text `s` decodes to: one, plus one per `,` and `:` and
/// per opening bracket outside strings (an upper bound that needs no parse).
fn json_values(s: &str) -> u64 {
    let mut count = 1u64;
    let mut in_string = false;
    let mut escaped = false;
    for b in s.bytes() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b',' | b':' | b'[' | b'{' => count += 1,
            _ => {}
        }
    }
    count
}

fn json_type(json: &serde_json::Value) -> &'static str {
    match json {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "boolean",
        serde_json::Value::Number(_) => "number",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "array",
        serde_json::Value::Object(_) => "object",
    }
}

fn fromjson(a: &Args) -> Result<Value, FnError> {
    let doc = parse_json(a, 0)?;
    let pointer = a.str(1)?;
    // The specification supports extraction only from documents whose root is an object.
    if !doc.is_object() {
        return Err(a.error(
            0,
            format!(
                "the JSON document's root must be an object, found {}",
                json_type(&doc)
            ),
        ));
    }
    let found = resolve_pointer(&doc, pointer).map_err(|message| a.error(1, message))?;
    Ok(Value::from_json(found))
}

/// Resolves an RFC 6901 JSON pointer. A missing value is an error, as is a
/// malformed pointer or array index.
fn resolve_pointer<'j>(
    doc: &'j serde_json::Value,
    pointer: &str,
) -> Result<&'j serde_json::Value, String> {
    if pointer.is_empty() {
        return Ok(doc);
    }
    let Some(tokens) = pointer.strip_prefix('/') else {
        return Err(format!(
            "invalid JSON pointer \"{pointer}\": it must be empty or start with \"/\""
        ));
    };
    let mut current = doc;
    for raw in tokens.split('/') {
        let token = unescape_pointer_token(raw).ok_or_else(|| {
            format!("invalid JSON pointer \"{pointer}\": \"~\" must be followed by \"0\" or \"1\"")
        })?;
        let next = match current {
            serde_json::Value::Object(map) => map.get(&token),
            serde_json::Value::Array(items) => {
                pointer_array_index(&token).and_then(|i| items.get(i))
            }
            _ => None,
        };
        current = next.ok_or_else(|| match current {
            serde_json::Value::Object(_) | serde_json::Value::Array(_) => {
                format!(
                    "no value at \"{pointer}\": \"{token}\" not found in {}",
                    json_type(current)
                )
            }
            other => format!(
                "no value at \"{pointer}\": cannot look up \"{token}\" in a {}",
                json_type(other)
            ),
        })?;
    }
    Ok(current)
}

/// `~1` is `/` and `~0` is `~`; decoding left to right keeps `~01` as `~1`.
fn unescape_pointer_token(raw: &str) -> Option<String> {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c == '~' {
            match chars.next() {
                Some('0') => out.push('~'),
                Some('1') => out.push('/'),
                _ => return None,
            }
        } else {
            out.push(c);
        }
    }
    Some(out)
}

/// RFC 6901 array indexes are `0` or digits without a leading zero; `-`
/// (one past the end) never names an existing element.
fn pointer_array_index(token: &str) -> Option<usize> {
    let digits = !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit());
    if digits && (token == "0" || !token.starts_with('0')) {
        token.parse().ok()
    } else {
        None
    }
}

// ---------------------------------------------------------------------------
// Strings

fn len(a: &Args) -> Result<Value, FnError> {
    let n = match a.get(0)? {
        Value::Str(s) => s.chars().count(),
        Value::List(items) => items.len(),
        Value::Map(map) => map.len(),
        other => return Err(a.type_error(0, "string, array or object", other)),
    };
    Ok(Value::Int(to_int(n)))
}

fn substr(a: &Args) -> Result<Value, FnError> {
    let s = a.str(0)?;
    let start = a.int(1)?;
    let length = to_int(s.chars().count());
    if start < 0 {
        return Err(a.error(
            1,
            format!("start index must not be negative, found {start}"),
        ));
    }
    if start > length {
        return Err(a.error(
            1,
            format!("start index {start} is beyond the end of the string (length {length})"),
        ));
    }
    let end = match a.opt_int(2)? {
        None => length,
        Some(end) if end < start => {
            return Err(a.error(
                2,
                format!("end index {end} is before the start index {start}"),
            ));
        }
        Some(end) if end > length => {
            return Err(a.error(
                2,
                format!("end index {end} is beyond the end of the string (length {length})"),
            ));
        }
        Some(end) => end,
    };
    // 0 <= start <= end <= length, so the conversions are exact.
    let skip = usize::try_from(start).unwrap_or(usize::MAX);
    let take = usize::try_from(end - start).unwrap_or(0);
    Ok(Value::Str(s.chars().skip(skip).take(take).collect()))
}

fn split(a: &Args) -> Result<Value, FnError> {
    let s = a.str(0)?;
    let delimiter = a.str(1)?;
    // Each part costs a value: a long string split finely is many times its size.
    let count = if delimiter.is_empty() {
        s.chars().count()
    } else {
        s.matches(delimiter).count() + 1
    } as u64;
    a.check_size(
        (count + 1) * VALUE_BYTES + s.len() as u64,
        &format!("an array of {count} elements"),
    )?;
    let parts: Vec<Value> = if delimiter.is_empty() {
        // Rather than str::split's leading and trailing empty strings.
        s.chars().map(|c| Value::Str(c.to_string())).collect()
    } else {
        s.split(delimiter).map(Value::from).collect()
    };
    Ok(Value::List(parts))
}

fn join(a: &Args) -> Result<Value, FnError> {
    let items = a.list(0)?;
    let delimiter = a.str(1)?;
    let mut parts = Vec::with_capacity(items.len());
    let mut unknown = false;
    for (i, item) in items.iter().enumerate() {
        match item {
            Value::Str(s) => parts.push(s.as_str()),
            Value::Unknown => unknown = true,
            other => {
                return Err(a.error(
                    0,
                    format!(
                        "expected an array of strings, found {} at index {i}",
                        other.type_name()
                    ),
                ));
            }
        }
    }
    if unknown {
        return Ok(Value::Unknown);
    }
    let length = parts.iter().map(|p| p.len() as u64).sum::<u64>()
        + (parts.len().saturating_sub(1) * delimiter.len()) as u64;
    a.check_size(string_bytes(0) + length, "a string")?;
    Ok(Value::Str(parts.join(delimiter)))
}

fn replace(a: &Args) -> Result<Value, FnError> {
    let s = a.str(0)?;
    let from = a.str(1)?;
    let to = a.str(2)?;
    // Replacing something short by something long multiplies the length: check first.
    let count = if from.is_empty() {
        s.chars().count() + 1
    } else {
        s.matches(from).count()
    } as u64;
    let length = (s.len() as u64 - count * from.len() as u64) + count * to.len() as u64;
    a.check_size(string_bytes(0) + length, "a string")?;
    Ok(Value::Str(s.replace(from, to)))
}

fn contains(a: &Args) -> Result<Value, FnError> {
    match a.get(0)? {
        Value::Str(s) => Ok(Value::Bool(s.contains(a.str(1)?))),
        Value::List(items) => {
            let needle = a.get(1)?;
            Ok(any_known(items.iter().map(|item| equal(item, needle))))
        }
        other => Err(a.type_error(0, "string or array", other)),
    }
}

// ---------------------------------------------------------------------------
// Constructors

fn list(a: &Args) -> Result<Value, FnError> {
    // "N arguments of the same type": the first known argument sets the type.
    let mut first: Option<(usize, &Value)> = None;
    for (i, value) in a.values.iter().enumerate() {
        if value.is_unknown() {
            continue;
        }
        match first {
            None => first = Some((i, value)),
            Some((j, model)) if !same_type(model, value) => {
                return Err(a.error(
                    i,
                    format!(
                        "list elements must have the same type: expected {} (like argument {}), found {}",
                        model.type_name(),
                        j + 1,
                        value.type_name()
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    Ok(Value::List(a.values.to_vec()))
}

fn same_type(a: &Value, b: &Value) -> bool {
    let numeric = |v: &Value| matches!(v, Value::Int(_) | Value::Float(_));
    a.type_name() == b.type_name() || (numeric(a) && numeric(b))
}

fn object(positional: Vec<Value>, named: Vec<(String, Value)>) -> Result<Value, FnError> {
    if !positional.is_empty() {
        return Err(FnError::at(
            "object",
            1,
            "expected a named argument (name = value), found a positional argument",
        ));
    }
    let mut map = IndexMap::with_capacity(named.len());
    for (i, (name, value)) in named.into_iter().enumerate() {
        if map.contains_key(&name) {
            return Err(FnError::at(
                "object",
                i + 1,
                format!("duplicate argument name \"{name}\""),
            ));
        }
        map.insert(name, value);
    }
    Ok(Value::Map(map))
}

// ---------------------------------------------------------------------------
// Higher-order functions

/// The argument counts a function value accepts: minimum and maximum (`None`
/// for variadic).
fn arity(f: &Func) -> (usize, Option<usize>) {
    match f {
        Func::Core(name) => {
            signatures::core(name).map_or((0, None), |sig| (sig.min_args(), sig.max_args()))
        }
        // A partial takes exactly the dynamic value.
        Func::Partial { .. } => (1, Some(1)),
        // A chain takes what its first applied function takes.
        Func::Compose(fs) => fs.last().map_or((1, Some(1)), arity),
        Func::Pipe(fs) => fs.first().map_or((1, Some(1)), arity),
    }
}

/// Whether `f`, given `base` arguments, can also take an optional index.
fn takes_index(f: &Func, base: usize) -> bool {
    let (min, max) = arity(f);
    min <= base + 1 && max.is_some_and(|max| max > base)
}

fn apply_chain<'f>(
    name: &str,
    mut fs: impl Iterator<Item = &'f Func>,
    args: Vec<Value>,
    env: &Env,
    budget: &Budget,
) -> Result<Value, FnError> {
    let Some(first) = fs.next() else {
        // Composing no functions gives the identity function.
        let mut args = args.into_iter();
        return match (args.next(), args.next()) {
            (Some(value), None) => Ok(value),
            _ => Err(FnError::general(
                name,
                "the empty composition takes exactly 1 argument",
            )),
        };
    };
    let mut value = apply_in(first, args, env, budget)?;
    for f in fs {
        value = apply_in(f, vec![value], env, budget)?;
    }
    Ok(value)
}

fn apply_partial(
    name: &'static str,
    captured: &[Value],
    args: Vec<Value>,
    env: &Env,
    budget: &Budget,
) -> Result<Value, FnError> {
    let count = args.len();
    let Ok([input]) = <[Value; 1]>::try_from(args) else {
        return Err(FnError::general(
            name,
            format!("the function returned by {name} takes 1 argument, found {count}"),
        ));
    };
    if input.is_unknown() {
        return Ok(Value::Unknown);
    }
    match (name, captured) {
        ("getattr", [Value::Str(attribute)]) => match input {
            Value::Map(mut map) => map.swap_remove(attribute).ok_or_else(|| {
                FnError::general(name, format!("the object has no attribute \"{attribute}\""))
            }),
            other => Err(FnError::general(
                name,
                format!(
                    "expected an object to take \"{attribute}\" from, found {}",
                    other.type_name()
                ),
            )),
        },
        ("getelem", [Value::Int(index)]) => match input {
            Value::List(mut items) => {
                let length = items.len();
                match usize::try_from(*index).ok().filter(|i| *i < length) {
                    Some(i) => Ok(items.swap_remove(i)),
                    None => Err(FnError::general(
                        name,
                        format!("index {index} is out of range for an array of length {length}"),
                    )),
                }
            }
            other => Err(FnError::general(
                name,
                format!(
                    "expected an array to take element {index} from, found {}",
                    other.type_name()
                ),
            )),
        },
        // A `_g` function applied: the dynamic value is the base function's
        // first argument, followed by the captured static arguments.
        _ => match name.strip_suffix("_g").and_then(function_value) {
            Some(Func::Core(base)) => {
                let mut all = Vec::with_capacity(captured.len() + 1);
                all.push(input);
                all.extend(captured.iter().cloned());
                call_in(base, all, Vec::new(), env, budget)
            }
            _ => Err(FnError::general(
                name,
                "not a function that captures arguments",
            )),
        },
    }
}

fn map(a: &Args, env: &Env) -> Result<Value, FnError> {
    let items = a.list(0)?;
    let f = a.func(1)?;
    let with_index = takes_index(f, 1);
    let mut out = Vec::with_capacity(items.len());
    // Each result may be larger than its element: the list is checked as it grows.
    let mut size = VALUE_BYTES;
    for (i, item) in items.iter().enumerate() {
        let mut call_args = vec![item.clone()];
        if with_index {
            call_args.push(Value::Int(to_int(i)));
        }
        let mapped = apply_in(f, call_args, env, a.budget).map_err(|e| a.element_error(i, e))?;
        size += measure_capped(&mapped, a.budget.limits().max_value_bytes);
        a.check_size(
            size,
            &format!("the array built so far ({} elements)", i + 1),
        )?;
        out.push(mapped);
    }
    Ok(Value::List(out))
}

fn filter(a: &Args, env: &Env) -> Result<Value, FnError> {
    let items = a.list(0)?;
    let predicate = a.func(1)?;
    let mut out = Vec::new();
    // An unknown verdict makes the result unknown, but the remaining elements
    // are still checked so that errors surface at plan time.
    let mut unknown = false;
    for (i, item) in items.iter().enumerate() {
        match apply_in(predicate, vec![item.clone()], env, a.budget)
            .map_err(|e| a.element_error(i, e))?
        {
            Value::Bool(true) => out.push(item.clone()),
            Value::Bool(false) => {}
            Value::Unknown => unknown = true,
            other => {
                return Err(a.error(
                    1,
                    format!(
                        "the function must return a boolean, returned {} for the element at index {i}",
                        other.type_name()
                    ),
                ));
            }
        }
    }
    Ok(if unknown {
        Value::Unknown
    } else {
        Value::List(out)
    })
}

fn reduce(a: &Args, env: &Env) -> Result<Value, FnError> {
    let items = a.list(0)?;
    let f = a.func(1)?;
    let mut accumulator = a.get(2)?.clone();
    let with_index = takes_index(f, 2);
    for (i, item) in items.iter().enumerate() {
        let mut call_args = vec![accumulator, item.clone()];
        if with_index {
            call_args.push(Value::Int(to_int(i)));
        }
        accumulator = apply_in(f, call_args, env, a.budget).map_err(|e| a.element_error(i, e))?;
    }
    Ok(accumulator)
}

fn sort(a: &Args, env: &Env) -> Result<Value, FnError> {
    let items = a.list(0)?;
    let compare = a.func(1)?;
    let mut unknown = false;
    let mut compare_values = |x: &Value, y: &Value| -> Result<Ordering, FnError> {
        match apply_in(compare, vec![x.clone(), y.clone()], env, a.budget).map_err(|e| {
            if e.limit.is_some() {
                e
            } else {
                a.error(1, e.to_string())
            }
        })? {
            Value::Int(n) => Ok(n.cmp(&0)),
            Value::Unknown => {
                unknown = true;
                Ok(Ordering::Equal)
            }
            other => Err(a.error(
                1,
                format!(
                    "the comparison function must return an integer, returned {}",
                    other.type_name()
                ),
            )),
        }
    };
    let sorted = merge_sort(items.to_vec(), &mut compare_values)?;
    Ok(if unknown {
        Value::Unknown
    } else {
        Value::List(sorted)
    })
}

/// A stable merge sort with a fallible comparison. The standard library's
/// sorts may panic when a comparison is not a total order, and a user's
/// comparison function need not be one.
fn merge_sort<E>(
    mut items: Vec<Value>,
    compare: &mut dyn FnMut(&Value, &Value) -> Result<Ordering, E>,
) -> Result<Vec<Value>, E> {
    if items.len() <= 1 {
        return Ok(items);
    }
    let right = items.split_off(items.len() / 2);
    let left = merge_sort(items, compare)?;
    let right = merge_sort(right, compare)?;
    let mut out = Vec::with_capacity(left.len() + right.len());
    let mut left = left.into_iter().peekable();
    let mut right = right.into_iter().peekable();
    while let (Some(l), Some(r)) = (left.peek(), right.peek()) {
        // Take from the right only when strictly smaller: ties keep input order.
        let next = if compare(l, r)? == Ordering::Greater {
            right.next()
        } else {
            left.next()
        };
        out.extend(next);
    }
    out.extend(left);
    out.extend(right);
    Ok(out)
}

fn flatmap(a: &Args, env: &Env) -> Result<Value, FnError> {
    let items = a.list(0)?;
    let f = a.func(1)?;
    let with_index = takes_index(f, 1);
    let mut out = Vec::new();
    // An unknown result hides how many elements it contributes, so it makes
    // the whole result unknown.
    let mut unknown = false;
    let mut size = VALUE_BYTES;
    for (i, item) in items.iter().enumerate() {
        let mut call_args = vec![item.clone()];
        if with_index {
            call_args.push(Value::Int(to_int(i)));
        }
        match apply_in(f, call_args, env, a.budget).map_err(|e| a.element_error(i, e))? {
            Value::List(mapped) => {
                // Only the elements are kept, not the list holding them.
                let cap = a.budget.limits().max_value_bytes;
                size += mapped.iter().map(|m| measure_capped(m, cap)).sum::<u64>();
                a.check_size(
                    size,
                    &format!(
                        "the array built so far ({} elements)",
                        out.len() + mapped.len()
                    ),
                )?;
                out.extend(mapped)
            }
            Value::Unknown => unknown = true,
            other => {
                return Err(a.error(
                    1,
                    format!(
                        "the function must return an array, returned {} for the element at index {i}",
                        other.type_name()
                    ),
                ));
            }
        }
    }
    Ok(if unknown {
        Value::Unknown
    } else {
        Value::List(out)
    })
}

// ---------------------------------------------------------------------------
// Logic and comparison

/// `and` (`short_circuit == false`) and `or` (`short_circuit == true`),
/// with the semantics of lazy left-to-right evaluation: a deciding left
/// operand makes the right one irrelevant, even if it is not a boolean;
/// otherwise a known deciding right operand decides even against an unknown
/// left one.
fn and_or(a: &Args, short_circuit: bool) -> Result<Value, FnError> {
    let left = a.bool_or_unknown(0)?;
    if left == Some(short_circuit) {
        return Ok(Value::Bool(short_circuit));
    }
    let right = a.bool_or_unknown(1)?;
    Ok(match (left, right) {
        (_, Some(r)) if r == short_circuit => Value::Bool(short_circuit),
        (Some(_), Some(r)) => Value::Bool(r),
        _ => Value::Unknown,
    })
}

fn eq(a: &Args) -> Result<Value, FnError> {
    for i in 0..2 {
        if let Value::Func(_) = a.get(i)? {
            return Err(a.error(i, "functions cannot be compared"));
        }
    }
    Ok(match equal(a.get(0)?, a.get(1)?) {
        Some(b) => Value::Bool(b),
        None => Value::Unknown,
    })
}

/// Deep equality; `None` when unknown values decide it.
fn equal(x: &Value, y: &Value) -> Option<bool> {
    match (x, y) {
        (Value::Unknown, _) | (_, Value::Unknown) => None,
        (Value::Int(_) | Value::Float(_), Value::Int(_) | Value::Float(_)) => {
            Some(compare_numbers(Num::of(x)?, Num::of(y)?) == Some(Ordering::Equal))
        }
        (Value::List(xs), Value::List(ys)) => {
            if xs.len() != ys.len() {
                return Some(false);
            }
            all_known(xs.iter().zip(ys).map(|(x, y)| equal(x, y)))
        }
        (Value::Map(xs), Value::Map(ys)) => {
            // Key order does not matter.
            if xs.len() != ys.len() || xs.keys().any(|k| !ys.contains_key(k)) {
                return Some(false);
            }
            all_known(
                xs.iter()
                    .map(|(k, x)| ys.get(k).map_or(Some(false), |y| equal(x, y))),
            )
        }
        // Same-variant scalars and functions compare structurally; values of
        // different types are unequal.
        _ => Some(x == y),
    }
}

/// Three-valued "all": false if any is false, else unknown if any is unknown.
fn all_known(results: impl Iterator<Item = Option<bool>>) -> Option<bool> {
    let mut unknown = false;
    for result in results {
        match result {
            Some(false) => return Some(false),
            None => unknown = true,
            Some(true) => {}
        }
    }
    if unknown { None } else { Some(true) }
}

/// Three-valued "any" as a value: true if any is true, else unknown if any
/// is unknown.
fn any_known(results: impl Iterator<Item = Option<bool>>) -> Value {
    let mut unknown = false;
    for result in results {
        match result {
            Some(true) => return Value::Bool(true),
            None => unknown = true,
            Some(false) => {}
        }
    }
    if unknown {
        Value::Unknown
    } else {
        Value::Bool(false)
    }
}

#[derive(Clone, Copy)]
enum Num {
    Int(i64),
    Float(f64),
}

impl Num {
    fn of(value: &Value) -> Option<Num> {
        match value {
            Value::Int(n) => Some(Num::Int(*n)),
            Value::Float(x) => Some(Num::Float(*x)),
            _ => None,
        }
    }
}

/// Numeric comparison, exact across integers and floats (converting a large
/// integer to a float would round it). `None` when a NaN is involved.
fn compare_numbers(x: Num, y: Num) -> Option<Ordering> {
    match (x, y) {
        (Num::Int(x), Num::Int(y)) => Some(x.cmp(&y)),
        (Num::Float(x), Num::Float(y)) => x.partial_cmp(&y),
        (Num::Int(x), Num::Float(y)) => compare_int_float(x, y),
        (Num::Float(x), Num::Int(y)) => compare_int_float(y, x).map(Ordering::reverse),
    }
}

fn compare_int_float(i: i64, f: f64) -> Option<Ordering> {
    // 2^63: every float in [-2^63, 2^63) truncates to an i64 exactly.
    const LIMIT: f64 = 9_223_372_036_854_775_808.0;
    if f.is_nan() {
        return None;
    }
    if f >= LIMIT {
        return Some(Ordering::Less);
    }
    if f < -LIMIT {
        return Some(Ordering::Greater);
    }
    let whole = f.trunc();
    match i.cmp(&(whole as i64)) {
        // Same integral part: the fractional part decides.
        Ordering::Equal => 0.0_f64.partial_cmp(&(f - whole)),
        other => Some(other),
    }
}

fn compare(a: &Args, holds: fn(Ordering) -> bool) -> Result<Value, FnError> {
    let x = a.num(0)?;
    let y = a.num(1)?;
    Ok(Value::Bool(compare_numbers(x, y).is_some_and(holds)))
}

// ---------------------------------------------------------------------------
// Environment

const DATETIME_FORMATS: &str = "unix, rfc3339, tag, tagcompact";

fn datetime(a: &Args, env: &Env) -> Result<Value, FnError> {
    let format = a.str(0)?;
    let seconds = env.now_unix_nanos.div_euclid(1_000_000_000);
    let t = CivilTime::from_unix_seconds(seconds);
    let text = match format {
        "unix" => seconds.to_string(),
        "rfc3339" => format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
            t.year, t.month, t.day, t.hour, t.minute, t.second
        ),
        "tag" => format!(
            "{:04}-{:02}-{:02}--{:02}-{:02}-{:02}",
            t.year, t.month, t.day, t.hour, t.minute, t.second
        ),
        "tagcompact" => format!(
            "{:04}{:02}{:02}{:02}{:02}{:02}",
            t.year, t.month, t.day, t.hour, t.minute, t.second
        ),
        other => {
            return Err(a.error(
                0,
                format!("unsupported format \"{other}\", expected one of: {DATETIME_FORMATS}"),
            ));
        }
    };
    Ok(Value::Str(text))
}

/// A UTC date and time of the proleptic Gregorian calendar.
struct CivilTime {
    year: i128,
    month: i128,
    day: i128,
    hour: i128,
    minute: i128,
    second: i128,
}

impl CivilTime {
    /// Howard Hinnant's `civil_from_days`, on i128 so that no input overflows.
    fn from_unix_seconds(seconds: i128) -> CivilTime {
        let days = seconds.div_euclid(86_400);
        let second_of_day = seconds.rem_euclid(86_400);
        // Shift the epoch to 0000-03-01 so that leap days end each 400-year era.
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let day_of_era = z.rem_euclid(146_097); // [0, 146096]
        let year_of_era =
            (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365; // [0, 399]
        let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100); // [0, 365]
        let month_from_march = (5 * day_of_year + 2) / 153; // [0, 11]
        let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
        let month = if month_from_march < 10 {
            month_from_march + 3
        } else {
            month_from_march - 9
        };
        let year = year_of_era + era * 400 + i128::from(month <= 2);
        CivilTime {
            year,
            month,
            day,
            hour: second_of_day / 3_600,
            minute: second_of_day % 3_600 / 60,
            second: second_of_day % 60,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// 2023-04-20T10:15:30Z
    const NOW: i128 = 1_681_985_730 * 1_000_000_000 + 123_456_789;

    fn no_link(_: &str, _: &str) -> Value {
        Value::Unknown
    }

    fn env() -> Env<'static> {
        Env {
            cwd: "/home/user/project",
            now_unix_nanos: NOW,
            link: &no_link,
        }
    }

    fn run(name: &str, args: Vec<Value>) -> Result<Value, FnError> {
        call(name, args, Vec::new(), &env())
    }

    fn ok(name: &str, args: Vec<Value>) -> Value {
        match run(name, args) {
            Ok(value) => value,
            Err(e) => panic!("{name} failed: {e}"),
        }
    }

    fn err(name: &str, args: Vec<Value>) -> FnError {
        match run(name, args) {
            Ok(value) => panic!("{name} should fail, returned {value:?}"),
            Err(e) => e,
        }
    }

    fn s(text: &str) -> Value {
        Value::from(text)
    }

    fn i(n: i64) -> Value {
        Value::Int(n)
    }

    fn b(v: bool) -> Value {
        Value::Bool(v)
    }

    fn j(json: serde_json::Value) -> Value {
        Value::from_json(&json)
    }

    fn f(name: &str) -> Value {
        Value::Func(function_value(name).expect("core function"))
    }

    fn apply_ok(func: &Value, args: Vec<Value>) -> Value {
        let Value::Func(func) = func else {
            panic!("not a function: {func:?}")
        };
        apply(func, args, &env()).unwrap_or_else(|e| panic!("apply failed: {e}"))
    }

    // -- errors ------------------------------------------------------------

    #[test]
    fn wrong_type_names_function_position_and_types() {
        let e = err("to_upper", vec![i(1)]);
        assert_eq!(e.function, "to_upper");
        assert_eq!(e.position, Some(1));
        assert_eq!(
            e.to_string(),
            "to_upper: argument 1: expected string, found integer"
        );
        let e = err("substr", vec![s("abc"), s("0")]);
        assert_eq!(
            e.to_string(),
            "substr: argument 2: expected integer, found string"
        );
        let e = err("join", vec![s("a,b"), s(",")]);
        assert_eq!(
            e.to_string(),
            "join: argument 1: expected array, found string"
        );
        let e = err("map", vec![j(json!([1])), s("to_upper")]);
        assert_eq!(
            e.to_string(),
            "map: argument 2: expected function, found string"
        );
        let e = err("gt", vec![i(1), s("2")]);
        assert_eq!(
            e.to_string(),
            "gt: argument 2: expected integer or float, found string"
        );
        let e = err("not", vec![s("true")]);
        assert_eq!(
            e.to_string(),
            "not: argument 1: expected boolean, found string"
        );
        let e = err("keys", vec![j(json!([1]))]);
        assert_eq!(
            e.to_string(),
            "keys: argument 1: expected object, found array"
        );
        let e = err("len", vec![i(3)]);
        assert_eq!(
            e.to_string(),
            "len: argument 1: expected string, array or object, found integer"
        );
        let e = err("trim", vec![f("trim")]);
        assert_eq!(
            e.to_string(),
            "trim: argument 1: expected string, found function"
        );
    }

    #[test]
    fn wrong_argument_count_has_no_position() {
        let e = err("to_upper", vec![]);
        assert_eq!(e.position, None);
        assert_eq!(e.to_string(), "to_upper: expected 1 argument, found 0");
        let e = err("substr", vec![s("a"), i(0), i(1), i(2)]);
        assert_eq!(e.to_string(), "substr: expected 2 to 3 arguments, found 4");
        let e = err("cwd", vec![s("x")]);
        assert_eq!(e.to_string(), "cwd: expected 0 arguments, found 1");
        // Arity is checked before unknown propagation.
        assert!(run("trim", vec![Value::Unknown, Value::Unknown]).is_err());
    }

    #[test]
    fn unknown_function() {
        let e = err("nope", vec![]);
        assert_eq!(e.to_string(), "nope: unknown function");
        assert_eq!(function_value("nope"), None);
    }

    #[test]
    fn every_core_function_is_implemented_and_a_function_value() {
        let text = s("{\"a\":[1,2]}");
        let samples: Vec<(&str, Vec<Value>)> = vec![
            ("fromjson", vec![text.clone(), s("/a/1")]),
            ("fromjson_g", vec![s("/a")]),
            ("jsondecode", vec![text.clone()]),
            ("len", vec![s("abc")]),
            ("substr", vec![s("abc"), i(1)]),
            ("substr_g", vec![i(1)]),
            ("replace", vec![s("a"), s("a"), s("b")]),
            ("replace_g", vec![s("a"), s("b")]),
            ("trim", vec![s(" a ")]),
            ("trimprefix", vec![s("ab"), s("a")]),
            ("trimprefix_g", vec![s("a")]),
            ("trimsuffix", vec![s("ab"), s("b")]),
            ("trimsuffix_g", vec![s("b")]),
            ("split", vec![s("a,b"), s(",")]),
            ("split_g", vec![s(",")]),
            ("join", vec![j(json!(["a"])), s(",")]),
            ("index", vec![s("ab"), s("b")]),
            ("last_index", vec![s("ab"), s("b")]),
            ("to_upper", vec![s("a")]),
            ("to_lower", vec![s("A")]),
            ("has_prefix", vec![s("ab"), s("a")]),
            ("has_prefix_g", vec![s("a")]),
            ("has_suffix", vec![s("ab"), s("b")]),
            ("has_suffix_g", vec![s("b")]),
            ("contains", vec![s("ab"), s("b")]),
            ("contains_g", vec![s("b")]),
            ("list", vec![i(1)]),
            ("object", vec![]),
            ("keys", vec![j(json!({"a": 1}))]),
            ("vals", vec![j(json!({"a": 1}))]),
            ("map", vec![j(json!(["a"])), f("to_upper")]),
            ("filter", vec![j(json!([true])), f("not")]),
            ("reduce", vec![j(json!([true])), f("and"), b(true)]),
            ("sort", vec![j(json!(["b", "a"])), f("index")]),
            ("flatmap", vec![j(json!(["a,b"])), f("split_g")]),
            ("compose", vec![f("trim")]),
            ("pipe", vec![f("trim")]),
            ("getattr", vec![s("id")]),
            ("getelem", vec![i(0)]),
            ("link", vec![s("a"), s("b")]),
            ("and", vec![b(true), b(true)]),
            ("or", vec![b(false), b(true)]),
            ("not", vec![b(true)]),
            ("eq", vec![i(1), i(1)]),
            ("gt", vec![i(2), i(1)]),
            ("ge", vec![i(2), i(1)]),
            ("lt", vec![i(1), i(2)]),
            ("le", vec![i(1), i(2)]),
            ("cwd", vec![]),
            ("datetime", vec![s("unix")]),
        ];
        assert_eq!(samples.len(), signatures::CORE.len());
        for sig in signatures::CORE {
            assert_eq!(function_value(sig.name), Some(Func::Core(sig.name)));
            let (_, args) = samples
                .iter()
                .find(|(name, _)| *name == sig.name)
                .unwrap_or_else(|| panic!("no sample for {}", sig.name));
            let result = run(sig.name, args.clone());
            // flatmap with a bare split_g is an error of the applied
            // function, not of dispatch; everything else succeeds.
            if let Err(e) = &result {
                assert!(!e.message.contains("not implemented"), "{}: {e}", sig.name);
                assert_eq!(sig.name, "flatmap", "{e}");
            }
        }
    }

    // -- fromjson / jsondecode ------------------------------------------------

    #[test]
    fn fromjson_doc_examples() {
        // ${fromjson("{\"host\":\"localhost\"}", "/host")}
        assert_eq!(
            ok("fromjson", vec![s("{\"host\":\"localhost\"}"), s("/host")]),
            s("localhost")
        );
        // ${fromjson(trim(variables.cacheClusterConfig), "/host")}
        let config = ok(
            "trim",
            vec![s("  {\"host\": \"cache.local\", \"port\": 6379}\n")],
        );
        assert_eq!(ok("fromjson", vec![config, s("/host")]), s("cache.local"));
    }

    #[test]
    fn fromjson_pointers() {
        let doc =
            s(r#"{"a": {"b/c": [10, {"d~e": true}], "": "empty"}, "n": null, "x": {"y": [1.5]}}"#);
        assert_eq!(ok("fromjson", vec![doc.clone(), s("/a/b~1c/0")]), i(10));
        assert_eq!(
            ok("fromjson", vec![doc.clone(), s("/a/b~1c/1/d~0e")]),
            b(true)
        );
        assert_eq!(ok("fromjson", vec![doc.clone(), s("/a/")]), s("empty"));
        assert_eq!(ok("fromjson", vec![doc.clone(), s("/n")]), Value::Null);
        assert_eq!(
            ok("fromjson", vec![doc.clone(), s("/x")]),
            j(json!({"y": [1.5]}))
        );
        // The empty pointer is the whole document.
        assert_eq!(
            ok("fromjson", vec![s(r#"{"k": [1]}"#), s("")]),
            j(json!({"k": [1]}))
        );
        // "~01" decodes to "~1", not "/".
        assert_eq!(
            ok("fromjson", vec![s(r#"{"~1": 1, "/": 2}"#), s("/~01")]),
            i(1)
        );
    }

    #[test]
    fn fromjson_errors() {
        let doc = s(r#"{"a": [1, 2], "s": "text"}"#);
        let e = err("fromjson", vec![doc.clone(), s("/missing")]);
        assert_eq!(e.position, Some(2));
        assert!(e.message.contains("no value at \"/missing\""), "{e}");
        for pointer in ["/a/2", "/a/01", "/a/-", "/a/x", "/s/0"] {
            let e = err("fromjson", vec![doc.clone(), s(pointer)]);
            assert_eq!(e.position, Some(2), "{pointer}: {e}");
        }
        let e = err("fromjson", vec![doc.clone(), s("a")]);
        assert!(
            e.message.contains("must be empty or start with \"/\""),
            "{e}"
        );
        let e = err("fromjson", vec![doc.clone(), s("/a~2")]);
        assert!(e.message.contains("\"~\" must be followed by"), "{e}");
        let e = err("fromjson", vec![doc, s("/a~")]);
        assert_eq!(e.position, Some(2));
        let e = err("fromjson", vec![s("[1, 2]"), s("/0")]);
        assert_eq!(
            e.to_string(),
            "fromjson: argument 1: the JSON document's root must be an object, found array"
        );
        let e = err("fromjson", vec![s("{not json"), s("/a")]);
        assert_eq!(e.position, Some(1));
        assert!(e.message.starts_with("invalid JSON"), "{e}");
    }

    #[test]
    fn fromjson_g_doc_example() {
        // ${map(values.cacheClusterConfigDefs, fromjson_g("/host"))}
        let getter = ok("fromjson_g", vec![s("/host")]);
        assert_eq!(
            getter,
            Value::Func(Func::Partial {
                name: "fromjson_g",
                args: vec![s("/host")]
            })
        );
        let defs = j(json!(["{\"host\":\"a\"}", "{\"host\":\"b\",\"port\":1}"]));
        assert_eq!(ok("map", vec![defs, getter]), j(json!(["a", "b"])));
    }

    #[test]
    fn jsondecode_any_root() {
        assert_eq!(
            ok("jsondecode", vec![s(r#"{"b": 1, "a": [true, null]}"#)]),
            j(json!({"b": 1, "a": [true, null]}))
        );
        assert_eq!(ok("jsondecode", vec![s("[1, 2.5]")]), j(json!([1, 2.5])));
        assert_eq!(ok("jsondecode", vec![s("\"x\"")]), s("x"));
        assert_eq!(ok("jsondecode", vec![s("7")]), i(7));
        assert_eq!(ok("jsondecode", vec![s("null")]), Value::Null);
        let e = err("jsondecode", vec![s("")]);
        assert_eq!(e.position, Some(1));
        // Deep nesting is an error, not a stack overflow.
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(run("jsondecode", vec![s(&deep)]).is_err());
    }

    // -- strings ---------------------------------------------------------------

    #[test]
    fn len_counts_characters_elements_and_pairs() {
        assert_eq!(ok("len", vec![s("héllo")]), i(5));
        assert_eq!(ok("len", vec![s("")]), i(0));
        assert_eq!(ok("len", vec![s("日本語")]), i(3));
        // ${len(values.cacheClusterConfig.endpoints)}
        assert_eq!(ok("len", vec![j(json!(["a", "b", "c"]))]), i(3));
        assert_eq!(ok("len", vec![j(json!([]))]), i(0));
        assert_eq!(ok("len", vec![j(json!({"a": 1, "b": 2}))]), i(2));
        // Unknown elements do not hide the length.
        assert_eq!(
            ok("len", vec![Value::List(vec![Value::Unknown, i(1)])]),
            i(2)
        );
    }

    #[test]
    fn substr_uses_character_indexes_end_exclusive() {
        // ${substr(values.cacheClusterConfig.host, 0, 3)}
        assert_eq!(ok("substr", vec![s("localhost"), i(0), i(3)]), s("loc"));
        assert_eq!(ok("substr", vec![s("localhost"), i(5)]), s("host"));
        assert_eq!(ok("substr", vec![s("héllo"), i(1), i(2)]), s("é"));
        assert_eq!(ok("substr", vec![s("héllo"), i(1), i(5)]), s("éllo"));
        assert_eq!(ok("substr", vec![s("abc"), i(3)]), s(""));
        assert_eq!(ok("substr", vec![s("abc"), i(1), i(1)]), s(""));
        assert_eq!(ok("substr", vec![s(""), i(0)]), s(""));
    }

    #[test]
    fn substr_rejects_bad_indexes() {
        let e = err("substr", vec![s("abc"), i(-1)]);
        assert_eq!(
            e.to_string(),
            "substr: argument 2: start index must not be negative, found -1"
        );
        let e = err("substr", vec![s("abc"), i(4)]);
        assert_eq!(e.position, Some(2));
        let e = err("substr", vec![s("abc"), i(2), i(1)]);
        assert_eq!(
            e.to_string(),
            "substr: argument 3: end index 1 is before the start index 2"
        );
        let e = err("substr", vec![s("abc"), i(0), i(4)]);
        assert_eq!(e.position, Some(3));
        let e = err("substr", vec![s("abc"), i(0), i(-1)]);
        assert_eq!(e.position, Some(3));
        assert!(run("substr", vec![s("abc"), i(i64::MIN), i(i64::MAX)]).is_err());
        assert!(run("substr", vec![s("abc"), i(i64::MAX)]).is_err());
    }

    #[test]
    fn substr_g_doc_example() {
        // ${map(values.cacheClusterConfig.hosts, substr_g(0, 3))}
        let hosts = j(json!(["localhost", "example.com"]));
        assert_eq!(
            ok("map", vec![hosts.clone(), ok("substr_g", vec![i(0), i(3)])]),
            j(json!(["loc", "exa"]))
        );
        assert_eq!(
            ok("map", vec![hosts, ok("substr_g", vec![i(7)])]),
            j(json!(["st", ".com"]))
        );
        let e = err("substr_g", vec![s("0")]);
        assert_eq!(
            e.to_string(),
            "substr_g: argument 1: expected integer, found string"
        );
        // Range errors surface when the function is applied.
        let e = err(
            "map",
            vec![j(json!(["ab"])), ok("substr_g", vec![i(0), i(3)])],
        );
        assert_eq!(e.position, Some(2));
        assert!(e.message.contains("substr: argument 3"), "{e}");
    }

    #[test]
    fn replace_replaces_every_occurrence() {
        // ${replace(values.cacheClusterConfig.host, "http://", "https://")}
        assert_eq!(
            ok(
                "replace",
                vec![s("http://a.com/?r=http://b"), s("http://"), s("https://")]
            ),
            s("https://a.com/?r=https://b")
        );
        assert_eq!(ok("replace", vec![s("aaa"), s("a"), s("")]), s(""));
        assert_eq!(ok("replace", vec![s("abc"), s("x"), s("y")]), s("abc"));
        // ${map(values.cacheClusterConfig.hosts, replace_g("http://", "https://"))}
        let hosts = j(json!(["http://a", "https://b", "http://c"]));
        let g = ok("replace_g", vec![s("http://"), s("https://")]);
        assert_eq!(
            ok("map", vec![hosts, g]),
            j(json!(["https://a", "https://b", "https://c"]))
        );
    }

    #[test]
    fn trimming() {
        // ${trim(values.cacheClusterConfig.host)}
        assert_eq!(ok("trim", vec![s(" \t localhost\n ")]), s("localhost"));
        assert_eq!(ok("trim", vec![s("\u{3000}wide\u{a0}")]), s("wide"));
        assert_eq!(ok("trim", vec![s("")]), s(""));
        // ${trimprefix(values.cacheClusterConfig.host, "http://")}
        assert_eq!(
            ok("trimprefix", vec![s("http://example.com"), s("http://")]),
            s("example.com")
        );
        assert_eq!(
            ok("trimprefix", vec![s("https://example.com"), s("http://")]),
            s("https://example.com")
        );
        // Only one occurrence is removed.
        assert_eq!(ok("trimprefix", vec![s("aab"), s("a")]), s("ab"));
        // ${trimsuffix(values.cacheClusterConfig.host, ":3000")}
        assert_eq!(
            ok("trimsuffix", vec![s("localhost:3000"), s(":3000")]),
            s("localhost")
        );
        assert_eq!(
            ok("trimsuffix", vec![s("localhost:30001"), s(":3000")]),
            s("localhost:30001")
        );
        assert_eq!(ok("trimsuffix", vec![s("abb"), s("b")]), s("ab"));
    }

    #[test]
    fn trim_g_doc_examples() {
        // ${map(variables.cacheClusterConfig.hosts, trimprefix_g("http://"))}
        let hosts = j(json!(["http://a", "b"]));
        let g = ok("trimprefix_g", vec![s("http://")]);
        assert_eq!(
            g,
            Value::Func(Func::Partial {
                name: "trimprefix_g",
                args: vec![s("http://")]
            })
        );
        assert_eq!(
            apply_ok(&g, vec![s("http://x")]),
            ok("trimprefix", vec![s("http://x"), s("http://")])
        );
        assert_eq!(ok("map", vec![hosts, g]), j(json!(["a", "b"])));
        // ${map(values.cacheClusterConfig.hosts, trimsuffix_g("/config"))}
        let hosts = j(json!(["a/config", "b/config/x"]));
        let g = ok("trimsuffix_g", vec![s("/config")]);
        assert_eq!(ok("map", vec![hosts, g]), j(json!(["a", "b/config/x"])));
    }

    #[test]
    fn split_and_join() {
        // ${split(values.cacheClusterConfig.hosts, ",")}
        assert_eq!(
            ok("split", vec![s("a,b,,c"), s(",")]),
            j(json!(["a", "b", "", "c"]))
        );
        assert_eq!(ok("split", vec![s("abc"), s(",")]), j(json!(["abc"])));
        assert_eq!(ok("split", vec![s(""), s(",")]), j(json!([""])));
        assert_eq!(ok("split", vec![s("a--b"), s("--")]), j(json!(["a", "b"])));
        assert_eq!(
            ok("split", vec![s("hé!"), s("")]),
            j(json!(["h", "é", "!"]))
        );
        assert_eq!(ok("split", vec![s(""), s("")]), j(json!([])));
        // ${join(values.cacheClusterConfig.hosts, ",")}
        assert_eq!(
            ok("join", vec![j(json!(["a", "b", "c"])), s(",")]),
            s("a,b,c")
        );
        assert_eq!(ok("join", vec![j(json!([])), s(",")]), s(""));
        assert_eq!(ok("join", vec![j(json!(["a"])), s(", ")]), s("a"));
        let e = err("join", vec![j(json!(["a", 1])), s(",")]);
        assert_eq!(
            e.to_string(),
            "join: argument 1: expected an array of strings, found integer at index 1"
        );
        assert_eq!(
            ok(
                "join",
                vec![Value::List(vec![s("a"), Value::Unknown]), s(",")]
            ),
            Value::Unknown
        );
    }

    #[test]
    fn split_g_with_flatmap_doc_example() {
        // values.hosts = ["host1,example.com:3049", "host2,example.com:4095"]
        // ${flatmap(values.hosts, split_g(","))}
        let hosts = j(json!(["host1,example.com:3049", "host2,example.com:4095"]));
        let g = ok("split_g", vec![s(",")]);
        assert_eq!(
            apply_ok(&g, vec![s("a,b")]),
            ok("split", vec![s("a,b"), s(",")])
        );
        assert_eq!(
            ok("flatmap", vec![hosts, g]),
            j(json!([
                "host1",
                "example.com:3049",
                "host2",
                "example.com:4095"
            ]))
        );
    }

    #[test]
    fn index_and_last_index_count_characters() {
        // ${index(values.cacheClusterConfig.host, ":3000")}
        assert_eq!(ok("index", vec![s("localhost:3000"), s(":3000")]), i(9));
        assert_eq!(ok("index", vec![s("localhost"), s(":3000")]), i(-1));
        assert_eq!(ok("index", vec![s("héllo:3000"), s(":")]), i(5));
        assert_eq!(ok("index", vec![s("abab"), s("b")]), i(1));
        assert_eq!(ok("index", vec![s("abc"), s("")]), i(0));
        assert_eq!(ok("index", vec![s(""), s("a")]), i(-1));
        // ${last_index(values.cacheClusterConfig.host, ":3000")}
        assert_eq!(ok("last_index", vec![s("a:3000,b:3000"), s(":3000")]), i(8));
        assert_eq!(ok("last_index", vec![s("é:3000 é:3000"), s(":3000")]), i(8));
        assert_eq!(ok("last_index", vec![s("abc"), s("x")]), i(-1));
        assert_eq!(ok("last_index", vec![s("abc"), s("")]), i(3));
    }

    #[test]
    fn case_conversion_is_unicode_aware() {
        // ${to_upper(values.cacheClusterConfig.hostName)}
        assert_eq!(ok("to_upper", vec![s("straße")]), s("STRASSE"));
        assert_eq!(ok("to_upper", vec![s("héllo-1")]), s("HÉLLO-1"));
        // ${to_lower(values.cacheClusterConfig.hostId)}
        assert_eq!(ok("to_lower", vec![s("ÀÉÎ-ID")]), s("àéî-id"));
        assert_eq!(ok("to_lower", vec![s("")]), s(""));
    }

    #[test]
    fn prefixes_and_suffixes() {
        // ${has_prefix(values.cacheClusterConfig.host, "http://")}
        assert_eq!(ok("has_prefix", vec![s("http://a"), s("http://")]), b(true));
        assert_eq!(
            ok("has_prefix", vec![s("https://a"), s("http://")]),
            b(false)
        );
        assert_eq!(ok("has_prefix", vec![s("a"), s("")]), b(true));
        // ${has_suffix(values.cacheClusterConfig.host, "/config")}
        assert_eq!(ok("has_suffix", vec![s("a/config"), s("/config")]), b(true));
        assert_eq!(
            ok("has_suffix", vec![s("a/config/"), s("/config")]),
            b(false)
        );
        // ${filter(values.cacheClusterConfig.hosts, has_prefix_g("http://"))}
        let hosts = j(json!(["http://a", "https://b", "http://c"]));
        assert_eq!(
            ok(
                "filter",
                vec![hosts, ok("has_prefix_g", vec![s("http://")])]
            ),
            j(json!(["http://a", "http://c"]))
        );
        // ${filter(values.cacheClusterConfig.hosts, has_suffix_g("/config"))}
        let hosts = j(json!(["a/config", "b", "c/config"]));
        assert_eq!(
            ok(
                "filter",
                vec![hosts, ok("has_suffix_g", vec![s("/config")])]
            ),
            j(json!(["a/config", "c/config"]))
        );
    }

    #[test]
    fn contains_strings_and_arrays() {
        // ${contains(values.cacheClusterConfig.host, "celerityframework.com")}
        assert_eq!(
            ok(
                "contains",
                vec![s("api.celerityframework.com"), s("celerityframework.com")]
            ),
            b(true)
        );
        assert_eq!(
            ok(
                "contains",
                vec![s("example.com"), s("celerityframework.com")]
            ),
            b(false)
        );
        assert_eq!(ok("contains", vec![s("abc"), s("")]), b(true));
        assert_eq!(
            ok(
                "contains",
                vec![j(json!([1, "a", {"k": [1]}])), j(json!({"k": [1]}))]
            ),
            b(true)
        );
        assert_eq!(
            ok("contains", vec![j(json!([1, 2])), Value::Float(2.0)]),
            b(true)
        );
        assert_eq!(ok("contains", vec![j(json!([1, 2])), s("1")]), b(false));
        assert_eq!(ok("contains", vec![j(json!([])), i(1)]), b(false));
        let e = err("contains", vec![s("abc"), i(1)]);
        assert_eq!(
            e.to_string(),
            "contains: argument 2: expected string, found integer"
        );
        let e = err("contains", vec![j(json!({"a": 1})), s("a")]);
        assert_eq!(
            e.to_string(),
            "contains: argument 1: expected string or array, found object"
        );
        // An unknown element decides only when nothing else matches.
        let haystack = Value::List(vec![s("a"), Value::Unknown]);
        assert_eq!(ok("contains", vec![haystack.clone(), s("a")]), b(true));
        assert_eq!(ok("contains", vec![haystack, s("b")]), Value::Unknown);
        // ${filter(values.cacheClusterConfig.hosts, contains_g("celerityframework.com"))}
        let hosts = j(json!(["a.celerityframework.com", "b.example.com"]));
        let g = ok("contains_g", vec![s("celerityframework.com")]);
        assert_eq!(
            ok("filter", vec![hosts, g]),
            j(json!(["a.celerityframework.com"]))
        );
        let g = ok("contains_g", vec![i(2)]);
        assert_eq!(
            ok("filter", vec![j(json!([[1, 2], [3]])), g]),
            j(json!([[1, 2]]))
        );
    }

    // -- constructors ------------------------------------------------------------

    #[test]
    fn list_of_same_typed_arguments() {
        // ${list("item1", "item2", "item3", "item4")}
        let items = vec![s("item1"), s("item2"), s("item3"), s("item4")];
        assert_eq!(
            ok("list", items),
            j(json!(["item1", "item2", "item3", "item4"]))
        );
        assert_eq!(ok("list", vec![]), j(json!([])));
        assert_eq!(
            ok("list", vec![i(1), Value::Float(2.5)]),
            j(json!([1, 2.5]))
        );
        assert_eq!(
            ok("list", vec![s("a"), Value::Unknown]),
            Value::List(vec![s("a"), Value::Unknown])
        );
        let e = err("list", vec![s("a"), s("b"), i(3)]);
        assert_eq!(
            e.to_string(),
            "list: argument 3: list elements must have the same type: expected string (like argument 1), found integer"
        );
    }

    #[test]
    fn object_from_named_arguments() {
        // ${object(id = "subnet-1234", label = "Subnet 1234")}
        let named = vec![
            ("id".to_owned(), s("subnet-1234")),
            ("label".to_owned(), s("Subnet 1234")),
        ];
        let value = call("object", vec![], named, &env()).unwrap();
        assert_eq!(
            value,
            j(json!({"id": "subnet-1234", "label": "Subnet 1234"}))
        );
        let Value::Map(map) = &value else { panic!() };
        assert_eq!(map.keys().collect::<Vec<_>>(), ["id", "label"]);
        assert_eq!(ok("object", vec![]), j(json!({})));
        let named = vec![("a".to_owned(), Value::Unknown)];
        let value = call("object", vec![], named, &env()).unwrap();
        assert!(!value.is_unknown() && value.deep_contains_unknown());
        let named = vec![("a".to_owned(), i(1)), ("a".to_owned(), i(2))];
        let e = call("object", vec![], named, &env()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "object: argument 2: duplicate argument name \"a\""
        );
        let e = err("object", vec![i(1)]);
        assert_eq!(e.position, Some(1));
    }

    #[test]
    fn named_arguments_of_other_functions_are_positional() {
        let named = vec![("prefix".to_owned(), s("http://"))];
        let value = call("trimprefix", vec![s("http://a")], named, &env()).unwrap();
        assert_eq!(value, s("a"));
    }

    #[test]
    fn keys_and_vals_keep_order() {
        // ${keys(datasources.network.subnets)} / ${vals(datasources.network.subnets)}
        let subnets = j(json!({"z": "subnet-1", "a": "subnet-2", "m": {"id": 3}}));
        assert_eq!(ok("keys", vec![subnets.clone()]), j(json!(["z", "a", "m"])));
        assert_eq!(
            ok("vals", vec![subnets]),
            j(json!(["subnet-1", "subnet-2", {"id": 3}]))
        );
        assert_eq!(ok("keys", vec![j(json!({}))]), j(json!([])));
        let mut map = IndexMap::new();
        map.insert("k".to_owned(), Value::Unknown);
        assert_eq!(ok("keys", vec![Value::Map(map.clone())]), j(json!(["k"])));
        assert_eq!(
            ok("vals", vec![Value::Map(map)]),
            Value::List(vec![Value::Unknown])
        );
    }

    // -- higher-order functions ------------------------------------------------

    fn subnets() -> Value {
        j(json!([
            {"id": "subnet-402948-a", "definition": {"id": "subnet-1234"}},
            {"id": "subnet-999-b", "definition": {"id": "subnet-5678"}}
        ]))
    }

    #[test]
    fn map_with_bare_function_and_composition() {
        assert_eq!(
            ok("map", vec![j(json!(["a", "é"])), f("to_upper")]),
            j(json!(["A", "É"]))
        );
        assert_eq!(ok("map", vec![j(json!([])), f("to_upper")]), j(json!([])));
        // ${map(datasources.network.subnets, compose(to_upper, getattr("id")))}
        let upper_id = ok("compose", vec![f("to_upper"), ok("getattr", vec![s("id")])]);
        assert_eq!(
            ok("map", vec![subnets(), upper_id]),
            j(json!(["SUBNET-402948-A", "SUBNET-999-B"]))
        );
        // ${map(datasources.network.subnets, pipe(getattr("id"), to_upper))}
        let upper_id = ok("pipe", vec![ok("getattr", vec![s("id")]), f("to_upper")]);
        assert_eq!(
            ok("map", vec![subnets(), upper_id]),
            j(json!(["SUBNET-402948-A", "SUBNET-999-B"]))
        );
    }

    #[test]
    fn map_passes_the_index_only_to_functions_that_take_it() {
        // substr takes 2 to 3 arguments: (item, index).
        assert_eq!(
            ok("map", vec![j(json!(["abc", "abc", "abc"])), f("substr")]),
            j(json!(["abc", "bc", "c"]))
        );
        // list is variadic: (item) only.
        assert_eq!(
            ok("map", vec![j(json!(["a", "b"])), f("list")]),
            j(json!([["a"], ["b"]]))
        );
        // cwd takes no argument: an error of the applied function.
        let e = err("map", vec![j(json!(["a"])), f("cwd")]);
        assert_eq!(
            e.to_string(),
            "map: argument 2: applying the function to the element at index 0: cwd: expected 0 arguments, found 1"
        );
        let e = err("map", vec![j(json!(["a", 1])), f("to_upper")]);
        assert_eq!(
            e.to_string(),
            "map: argument 2: applying the function to the element at index 1: to_upper: argument 1: expected string, found integer"
        );
    }

    #[test]
    fn filter_doc_example_and_errors() {
        // ${filter(datasources.network.subnets, has_prefix_g("subnet-402948-"))}
        let ids = ok("map", vec![subnets(), ok("getattr", vec![s("id")])]);
        assert_eq!(
            ok(
                "filter",
                vec![ids, ok("has_prefix_g", vec![s("subnet-402948-")])]
            ),
            j(json!(["subnet-402948-a"]))
        );
        let e = err("filter", vec![j(json!(["a"])), f("to_upper")]);
        assert_eq!(
            e.to_string(),
            "filter: argument 2: the function must return a boolean, returned string for the element at index 0"
        );
        let items = Value::List(vec![s("http://a"), Value::Unknown]);
        assert_eq!(
            ok(
                "filter",
                vec![items, ok("has_prefix_g", vec![s("http://")])]
            ),
            Value::Unknown
        );
    }

    #[test]
    fn reduce_folds_with_optional_index() {
        assert_eq!(
            ok(
                "reduce",
                vec![j(json!([true, true, false])), f("and"), b(true)]
            ),
            b(false)
        );
        assert_eq!(
            ok("reduce", vec![j(json!([false, true])), f("or"), b(false)]),
            b(true)
        );
        assert_eq!(
            ok("reduce", vec![j(json!([])), f("and"), s("initial")]),
            s("initial")
        );
        // list is variadic: (acc, item).
        assert_eq!(
            ok(
                "reduce",
                vec![j(json!([[1], [2]])), f("list"), j(json!([]))]
            ),
            j(json!([[[], [1]], [2]]))
        );
        // substr takes 2 to 3 arguments: (acc, item, index) == substr("abcdef", 1, 0)
        let e = err("reduce", vec![j(json!([1])), f("substr"), s("abcdef")]);
        assert!(
            e.message
                .contains("end index 0 is before the start index 1"),
            "{e}"
        );
        // ${reduce(datasources.network.subnets, extract_crucial_network_info, object())}
        // has no core reducer; a composition stands in for one.
        let pick_item = ok("compose", vec![ok("getelem", vec![i(1)]), f("list")]);
        assert_eq!(
            ok("reduce", vec![subnets(), pick_item, ok("object", vec![])]),
            j(json!({"id": "subnet-999-b", "definition": {"id": "subnet-5678"}}))
        );
        assert_eq!(
            ok("reduce", vec![j(json!([true])), f("and"), Value::Unknown]),
            Value::Unknown
        );
    }

    #[test]
    fn sort_with_comparison_function() {
        // ${sort(datasources.network.subnets, compare_cidr_ranges)}: no core
        // function is a comparison function; index(a, b) orders suffixes.
        assert_eq!(
            ok("sort", vec![j(json!(["ba", "a"])), f("index")]),
            j(json!(["a", "ba"]))
        );
        assert_eq!(
            ok("sort", vec![j(json!(["cab", "ab", "b"])), f("index")]),
            j(json!(["b", "ab", "cab"]))
        );
        assert_eq!(ok("sort", vec![j(json!([])), f("index")]), j(json!([])));
        let e = err("sort", vec![j(json!([1, 2])), f("eq")]);
        assert_eq!(
            e.to_string(),
            "sort: argument 2: the comparison function must return an integer, returned boolean"
        );
        let e = err("sort", vec![j(json!([1, 2])), f("index")]);
        assert_eq!(e.position, Some(2));
        assert!(
            e.message
                .contains("index: argument 1: expected string, found integer"),
            "{e}"
        );
        assert_eq!(
            ok(
                "sort",
                vec![Value::List(vec![s("a"), Value::Unknown]), f("index")]
            ),
            Value::Unknown
        );
    }

    #[test]
    fn merge_sort_is_stable_and_survives_inconsistent_comparisons() {
        let items: Vec<Value> = [(2, "a"), (1, "b"), (2, "c"), (1, "d"), (0, "e"), (2, "f")]
            .iter()
            .map(|(k, v)| j(json!([k, v])))
            .collect();
        let key = |v: &Value| match v {
            Value::List(pair) => pair.first().cloned(),
            _ => None,
        };
        let mut by_key = |x: &Value, y: &Value| -> Result<Ordering, ()> {
            match (key(x), key(y)) {
                (Some(Value::Int(x)), Some(Value::Int(y))) => Ok(x.cmp(&y)),
                _ => Err(()),
            }
        };
        let sorted = merge_sort(items.clone(), &mut by_key).unwrap();
        let labels: Vec<_> = sorted
            .iter()
            .filter_map(|v| match v {
                Value::List(pair) => pair.get(1).and_then(Value::display_string),
                _ => None,
            })
            .collect();
        assert_eq!(labels, ["e", "b", "d", "a", "c", "f"]);
        // A comparison that is not an order must not panic.
        let mut chaos = 0u32;
        let mut inconsistent = |_: &Value, _: &Value| -> Result<Ordering, ()> {
            chaos += 1;
            Ok(if chaos.is_multiple_of(3) {
                Ordering::Less
            } else {
                Ordering::Greater
            })
        };
        assert_eq!(merge_sort(items, &mut inconsistent).unwrap().len(), 6);
    }

    #[test]
    fn flatmap_flattens_one_level() {
        assert_eq!(
            ok(
                "flatmap",
                vec![j(json!([[1, [2]], [3]])), ok("compose", vec![])]
            ),
            j(json!([1, [2], 3]))
        );
        let e = err("flatmap", vec![j(json!(["a"])), f("to_upper")]);
        assert_eq!(
            e.to_string(),
            "flatmap: argument 2: the function must return an array, returned string for the element at index 0"
        );
        let items = Value::List(vec![s("a,b"), Value::Unknown]);
        assert_eq!(
            ok("flatmap", vec![items, ok("split_g", vec![s(",")])]),
            Value::Unknown
        );
    }

    #[test]
    fn compose_is_right_to_left_and_pipe_left_to_right() {
        let add_x = ok("replace_g", vec![s("a"), s("x")]);
        let x_to_y = ok("replace_g", vec![s("x"), s("y")]);
        // compose(f, g)(s) == f(g(s)): a -> x, then x -> y.
        let composed = ok("compose", vec![x_to_y.clone(), add_x.clone()]);
        assert_eq!(apply_ok(&composed, vec![s("a")]), s("y"));
        // pipe(f, g)(s) == g(f(s)): x -> y first (no-op on "a"), then a -> x.
        let piped = ok("pipe", vec![x_to_y, add_x]);
        assert_eq!(apply_ok(&piped, vec![s("a")]), s("x"));
        // Empty chains are the identity.
        assert_eq!(apply_ok(&ok("compose", vec![]), vec![i(1)]), i(1));
        assert_eq!(apply_ok(&ok("pipe", vec![]), vec![i(1)]), i(1));
        let e = err("compose", vec![f("trim"), s("trim")]);
        assert_eq!(
            e.to_string(),
            "compose: argument 2: expected function, found string"
        );
    }

    #[test]
    fn getattr_doc_example() {
        // ${map(datasources.network.subnets, compose(getattr("id"), getattr("definition")))}
        let id = ok(
            "compose",
            vec![
                ok("getattr", vec![s("id")]),
                ok("getattr", vec![s("definition")]),
            ],
        );
        assert_eq!(
            ok("map", vec![subnets(), id]),
            j(json!(["subnet-1234", "subnet-5678"]))
        );
        let e = err("map", vec![subnets(), ok("getattr", vec![s("nope")])]);
        assert!(
            e.message
                .contains("getattr: the object has no attribute \"nope\""),
            "{e}"
        );
        let e = err("map", vec![j(json!(["a"])), ok("getattr", vec![s("id")])]);
        assert!(
            e.message
                .contains("expected an object to take \"id\" from, found string"),
            "{e}"
        );
        let e = err("getattr", vec![i(1)]);
        assert_eq!(
            e.to_string(),
            "getattr: argument 1: expected string, found integer"
        );
    }

    #[test]
    fn getelem_doc_example() {
        // ${map(datasources.network.subnets, compose(getattr("id"), getelem(0)))}
        // (the specification's example writes `get_attr`)
        let subnets = j(json!([
            [{"id": "subnet-1234", "label": "Subnet 1234"}, "10.0.0.0/16"],
            [{"id": "subnet-5678", "label": "Subnet 5678"}, "172.31.0.0/16"]
        ]));
        let id = ok(
            "compose",
            vec![ok("getattr", vec![s("id")]), ok("getelem", vec![i(0)])],
        );
        assert_eq!(
            ok("map", vec![subnets.clone(), id]),
            j(json!(["subnet-1234", "subnet-5678"]))
        );
        assert_eq!(
            ok("map", vec![subnets.clone(), ok("getelem", vec![i(1)])]),
            j(json!(["10.0.0.0/16", "172.31.0.0/16"]))
        );
        let e = err("map", vec![subnets, ok("getelem", vec![i(2)])]);
        assert!(
            e.message
                .contains("getelem: index 2 is out of range for an array of length 2"),
            "{e}"
        );
        let e = err("getelem", vec![i(-1)]);
        assert_eq!(
            e.to_string(),
            "getelem: argument 1: index must not be negative, found -1"
        );
        let e = err("map", vec![j(json!([{"a": 1}])), ok("getelem", vec![i(0)])]);
        assert!(
            e.message
                .contains("expected an array to take element 0 from, found object"),
            "{e}"
        );
    }

    #[test]
    fn partials_take_exactly_one_argument() {
        let g = ok("getattr", vec![s("id")]);
        let Value::Func(g) = g else { panic!() };
        let e = apply(&g, vec![], &env()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "getattr: the function returned by getattr takes 1 argument, found 0"
        );
        assert_eq!(apply(&g, vec![Value::Unknown], &env()), Ok(Value::Unknown));
        let bogus = Func::Partial {
            name: "trim",
            args: vec![],
        };
        assert!(apply(&bogus, vec![s("a")], &env()).is_err());
    }

    // -- link, logic, comparison ---------------------------------------------------

    #[test]
    fn link_asks_the_host() {
        // ${link("orderApi", "deleteOrderFunction")}
        assert_eq!(
            ok("link", vec![s("orderApi"), s("deleteOrderFunction")]),
            Value::Unknown
        );
        let known = |a: &str, b: &str| j(json!({"from": a, "to": b}));
        let env = Env {
            cwd: "/",
            now_unix_nanos: 0,
            link: &known,
        };
        let value = call(
            "link",
            vec![s("orderApi"), s("listOrdersFunction")],
            vec![],
            &env,
        )
        .unwrap();
        assert_eq!(
            value,
            j(json!({"from": "orderApi", "to": "listOrdersFunction"}))
        );
        assert_eq!(err("link", vec![s("a"), i(1)]).position, Some(2));
    }

    #[test]
    fn boolean_logic_short_circuits_over_unknowns() {
        // ${and(resources.orderApi.spec.isProd, eq(variables.environment, "prod"))}
        let is_prod = ok("eq", vec![s("prod"), s("prod")]);
        assert_eq!(ok("and", vec![b(true), is_prod.clone()]), b(true));
        assert_eq!(ok("and", vec![b(false), is_prod]), b(false));
        // ${or(resources.orderApi.spec.isDev, eq(variables.environment, "dev"))}
        assert_eq!(ok("or", vec![b(false), b(false)]), b(false));
        assert_eq!(ok("or", vec![b(false), b(true)]), b(true));
        // ${not(eq(variables.environment, "prod"))}
        assert_eq!(ok("not", vec![b(true)]), b(false));

        let u = Value::Unknown;
        assert_eq!(ok("and", vec![b(false), u.clone()]), b(false));
        assert_eq!(ok("and", vec![u.clone(), b(false)]), b(false));
        assert_eq!(ok("and", vec![b(true), u.clone()]), u);
        assert_eq!(ok("and", vec![u.clone(), b(true)]), u);
        assert_eq!(ok("or", vec![b(true), u.clone()]), b(true));
        assert_eq!(ok("or", vec![u.clone(), b(true)]), b(true));
        assert_eq!(ok("or", vec![b(false), u.clone()]), u);
        assert_eq!(ok("or", vec![u.clone(), u.clone()]), u);
        assert_eq!(ok("not", vec![u.clone()]), u);
        // A deciding left operand hides the right one, as lazy evaluation would.
        assert_eq!(ok("and", vec![b(false), s("x")]), b(false));
        assert_eq!(ok("or", vec![b(true), i(1)]), b(true));
        assert_eq!(
            err("and", vec![b(true), s("x")]).to_string(),
            "and: argument 2: expected boolean, found string"
        );
        assert_eq!(err("or", vec![s("x"), b(true)]).position, Some(1));
        assert_eq!(err("and", vec![u, s("x")]).position, Some(2));
    }

    #[test]
    fn eq_is_deep_and_numeric() {
        // ${eq(variables.environment, "prod")}
        assert_eq!(ok("eq", vec![s("prod"), s("prod")]), b(true));
        assert_eq!(ok("eq", vec![s("dev"), s("prod")]), b(false));
        assert_eq!(ok("eq", vec![i(1), Value::Float(1.0)]), b(true));
        assert_eq!(ok("eq", vec![i(1), Value::Float(1.5)]), b(false));
        assert_eq!(
            ok(
                "eq",
                vec![i(i64::MAX), Value::Float(9_223_372_036_854_775_808.0)]
            ),
            b(false)
        );
        assert_eq!(ok("eq", vec![i(1), s("1")]), b(false));
        assert_eq!(ok("eq", vec![Value::Null, Value::Null]), b(true));
        assert_eq!(
            ok(
                "eq",
                vec![
                    j(json!({"a": [1, {"b": 2}], "c": null})),
                    j(json!({"c": null, "a": [1.0, {"b": 2}]}))
                ]
            ),
            b(true)
        );
        assert_eq!(
            ok("eq", vec![j(json!({"a": 1})), j(json!({"b": 1}))]),
            b(false)
        );
        assert_eq!(ok("eq", vec![j(json!([1, 2])), j(json!([2, 1]))]), b(false));
        assert_eq!(
            ok("eq", vec![Value::Float(f64::NAN), Value::Float(f64::NAN)]),
            b(false)
        );
        // Unknown sides.
        assert_eq!(ok("eq", vec![Value::Unknown, s("a")]), Value::Unknown);
        let with_unknown = Value::List(vec![i(1), Value::Unknown]);
        assert_eq!(
            ok("eq", vec![with_unknown.clone(), j(json!([1, 2]))]),
            Value::Unknown
        );
        assert_eq!(
            ok("eq", vec![with_unknown.clone(), j(json!([2, 2]))]),
            b(false)
        );
        assert_eq!(ok("eq", vec![with_unknown, j(json!([1]))]), b(false));
        let e = err("eq", vec![f("trim"), f("trim")]);
        assert_eq!(
            e.to_string(),
            "eq: argument 1: functions cannot be compared"
        );
    }

    #[test]
    fn numeric_comparisons() {
        // ${gt(len(datasources.network.subnets), 10)} and friends
        let eleven = ok("len", vec![j(json!([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]))]);
        assert_eq!(ok("gt", vec![eleven.clone(), i(10)]), b(true));
        assert_eq!(ok("ge", vec![eleven.clone(), i(11)]), b(true));
        assert_eq!(ok("lt", vec![eleven.clone(), i(10)]), b(false));
        assert_eq!(ok("le", vec![eleven, i(11)]), b(true));
        assert_eq!(ok("gt", vec![Value::Float(1.5), i(1)]), b(true));
        assert_eq!(ok("lt", vec![i(1), Value::Float(1.5)]), b(true));
        assert_eq!(ok("lt", vec![i(-2), Value::Float(-1.5)]), b(true));
        assert_eq!(ok("gt", vec![i(-1), Value::Float(-1.5)]), b(true));
        assert_eq!(ok("ge", vec![Value::Float(2.0), i(2)]), b(true));
        assert_eq!(
            ok("le", vec![Value::Float(2.0), Value::Float(1.0)]),
            b(false)
        );
        // Exact at the edge of f64 precision: 2^53 + 1 > 2^53 as a float.
        assert_eq!(
            ok(
                "gt",
                vec![i((1 << 53) + 1), Value::Float(9_007_199_254_740_992.0)]
            ),
            b(true)
        );
        assert_eq!(ok("lt", vec![i(i64::MAX), Value::Float(1e19)]), b(true));
        assert_eq!(ok("gt", vec![i(i64::MIN), Value::Float(-1e19)]), b(true));
        assert_eq!(ok("gt", vec![i(1), Value::Float(f64::NAN)]), b(false));
        assert_eq!(ok("le", vec![i(1), Value::Float(f64::NAN)]), b(false));
        assert_eq!(ok("gt", vec![Value::Unknown, i(1)]), Value::Unknown);
        assert_eq!(err("ge", vec![s("1"), i(1)]).position, Some(1));
    }

    // -- environment ------------------------------------------------------------

    #[test]
    fn cwd_comes_from_the_environment() {
        // ${cwd()}/blueprints/core-infra.blueprint.yaml
        assert_eq!(ok("cwd", vec![]), s("/home/user/project"));
    }

    #[test]
    fn datetime_formats_at_a_fixed_instant() {
        // ${datetime("tag")}
        assert_eq!(ok("datetime", vec![s("tag")]), s("2023-04-20--10-15-30"));
        assert_eq!(ok("datetime", vec![s("tagcompact")]), s("20230420101530"));
        assert_eq!(
            ok("datetime", vec![s("rfc3339")]),
            s("2023-04-20T10:15:30Z")
        );
        assert_eq!(ok("datetime", vec![s("unix")]), s("1681985730"));
        let e = err("datetime", vec![s("iso")]);
        assert_eq!(
            e.to_string(),
            "datetime: argument 1: unsupported format \"iso\", expected one of: unix, rfc3339, tag, tagcompact"
        );
    }

    #[test]
    fn civil_time_conversion() {
        let at = |nanos: i128| {
            let env = Env {
                cwd: "/",
                now_unix_nanos: nanos,
                link: &no_link,
            };
            call("datetime", vec![s("rfc3339")], vec![], &env).unwrap()
        };
        assert_eq!(at(0), s("1970-01-01T00:00:00Z"));
        // Just before the epoch: floor, not truncation.
        assert_eq!(at(-1), s("1969-12-31T23:59:59Z"));
        assert_eq!(at(951_782_400 * 1_000_000_000), s("2000-02-29T00:00:00Z"));
        assert_eq!(
            at(-2_203_891_200 * 1_000_000_000),
            s("1900-03-01T00:00:00Z")
        );
        // 2024-12-31T23:59:59Z, the last second of a leap year.
        assert_eq!(at(1_735_689_599 * 1_000_000_000), s("2024-12-31T23:59:59Z"));
        // Extremes do not panic.
        let _ = at(i128::MAX);
        let _ = at(i128::MIN);
    }

    // -- unknown propagation ----------------------------------------------------------

    #[test]
    fn unknown_arguments_propagate() {
        let u = Value::Unknown;
        for (name, args) in [
            ("to_upper", vec![u.clone()]),
            ("substr", vec![u.clone(), i(0)]),
            ("substr", vec![s("abc"), u.clone()]),
            ("fromjson", vec![u.clone(), s("/a")]),
            ("len", vec![u.clone()]),
            ("map", vec![u.clone(), f("trim")]),
            ("map", vec![j(json!(["a"])), u.clone()]),
            ("trimprefix_g", vec![u.clone()]),
            ("getattr", vec![u.clone()]),
            ("link", vec![s("a"), u.clone()]),
            ("datetime", vec![u.clone()]),
        ] {
            assert_eq!(ok(name, args), Value::Unknown, "{name}");
        }
        // Unknown elements flow through map element by element.
        let items = Value::List(vec![s("a"), u.clone()]);
        assert_eq!(
            ok("map", vec![items, f("to_upper")]),
            Value::List(vec![s("A"), u.clone()])
        );
        let items = j(json!([{"id": "a"}]));
        let Value::List(mut list) = items else {
            panic!()
        };
        list.push(u.clone());
        let id = ok("pipe", vec![ok("getattr", vec![s("id")]), f("to_upper")]);
        assert_eq!(
            ok("map", vec![Value::List(list), id]),
            Value::List(vec![s("A"), u])
        );
    }
}
