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

/// Resolves an RFC 6901 JSON pointer, in its string form (`/a/b`) or its URI
/// fragment form (`#/a/b`, percent-decoded). A missing value is an error, as is
/// a malformed pointer or array index.
fn resolve_pointer<'j>(
    doc: &'j serde_json::Value,
    pointer: &str,
) -> Result<&'j serde_json::Value, String> {
    let decoded;
    let pointer = match pointer.strip_prefix('#') {
        Some(fragment) => {
            decoded = percent_decode(fragment).ok_or_else(|| {
                format!("invalid JSON pointer \"{pointer}\": a `%` must start a percent-encoded UTF-8 byte (`%2F`)")
            })?;
            decoded.as_str()
        }
        None => pointer,
    };
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

/// `%XX` escapes decoded (RFC 3986); `None` for a malformed escape or bytes
/// that are not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
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

/// The formats `datetime` accepts (validation checks literal formats against them).
pub const DATETIME_FORMAT_NAMES: &[&str] = &["unix", "rfc3339", "tag", "tagcompact"];
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
mod tests;
