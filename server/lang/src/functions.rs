//! Function signatures: the 50 core functions of `core-functions.md`, and the
//! [`FunctionCatalog`] trait through which providers add their own.
//!
//! Validation needs only signatures (does the function exist, how many
//! arguments, of which types); evaluation lives elsewhere.

/// A parameter or return type as the specification writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ty {
    Any,
    String,
    Integer,
    Float,
    Boolean,
    Array,
    Object,
    /// `integer | float`
    Number,
    /// `string | array`
    StringOrArray,
    /// `string | array | object` (what `len` measures).
    Sized,
    /// `string | ResourceRef` (the arguments of `link`).
    ResourceName,
    /// A function value.
    Func,
}

impl Ty {
    pub fn as_str(self) -> &'static str {
        match self {
            Ty::Any => "any",
            Ty::String => "string",
            Ty::Integer => "integer",
            Ty::Float => "float",
            Ty::Boolean => "boolean",
            Ty::Array => "array",
            Ty::Object => "object",
            Ty::Number => "integer | float",
            Ty::StringOrArray => "string | array",
            Ty::Sized => "string | array | object",
            Ty::ResourceName => "string | resource",
            Ty::Func => "function",
        }
    }
}

#[derive(Debug)]
pub struct Param {
    pub name: &'static str,
    pub ty: Ty,
    pub optional: bool,
}

#[derive(Debug)]
pub struct Signature {
    pub name: &'static str,
    pub params: &'static [Param],
    /// Any number of further arguments of this type (`list`, `object`, `compose`).
    pub variadic: Option<Ty>,
    pub returns: Ty,
    pub summary: &'static str,
}

impl Signature {
    pub fn min_args(&self) -> usize {
        self.params.iter().filter(|p| !p.optional).count()
    }

    pub fn max_args(&self) -> Option<usize> {
        match self.variadic {
            Some(_) => None,
            None => Some(self.params.len()),
        }
    }

    /// "2 arguments", "1 to 2 arguments", "any number of arguments".
    pub fn arity_text(&self) -> std::string::String {
        let plural = |n: usize| if n == 1 { "" } else { "s" };
        match (self.min_args(), self.max_args()) {
            (_, None) if self.min_args() == 0 => "any number of arguments".into(),
            (min, None) => format!("at least {min} argument{}", plural(min)),
            (min, Some(max)) if min == max => format!("{min} argument{}", plural(min)),
            (min, Some(max)) => format!("{min} to {max} arguments"),
        }
    }
}

/// Where validation looks functions up. The core set always; providers add
/// theirs through the plugin host.
pub trait FunctionCatalog {
    fn lookup(&self, name: &str) -> Option<&Signature>;
    fn names(&self) -> Vec<&str>;
}

/// The core functions only.
#[derive(Clone, Copy, Debug, Default)]
pub struct CoreFunctions;

impl FunctionCatalog for CoreFunctions {
    fn lookup(&self, name: &str) -> Option<&Signature> {
        core(name)
    }

    fn names(&self) -> Vec<&str> {
        CORE.iter().map(|s| s.name).collect()
    }
}

/// Looks up a core function.
pub fn core(name: &str) -> Option<&'static Signature> {
    CORE.iter().find(|s| s.name == name)
}

const fn p(name: &'static str, ty: Ty) -> Param {
    Param {
        name,
        ty,
        optional: false,
    }
}

const fn opt(name: &'static str, ty: Ty) -> Param {
    Param {
        name,
        ty,
        optional: true,
    }
}

macro_rules! sig {
    ($name:literal, [$($param:expr),*], $ret:ident, $summary:literal) => {
        Signature { name: $name, params: &[$($param),*], variadic: None, returns: Ty::$ret, summary: $summary }
    };
    ($name:literal, [$($param:expr),*], ...$var:ident, $ret:ident, $summary:literal) => {
        Signature { name: $name, params: &[$($param),*], variadic: Some(Ty::$var), returns: Ty::$ret, summary: $summary }
    };
}

use Ty::*;

/// The 50 core functions, in the order of `core-functions.md`.
pub static CORE: &[Signature] = &[
    sig!(
        "fromjson",
        [p("json", String), p("pointer", String)],
        Any,
        "Extracts a value from a JSON string with a JSON pointer (RFC 6901)."
    ),
    sig!(
        "fromjson_g",
        [p("pointer", String)],
        Func,
        "Composable fromjson: takes the pointer, returns func(string) -> any."
    ),
    sig!(
        "jsondecode",
        [p("json", String)],
        Any,
        "Decodes a JSON string into a value."
    ),
    sig!(
        "len",
        [p("value", Sized)],
        Integer,
        "Length of a string (in characters), array or mapping."
    ),
    sig!(
        "substr",
        [
            p("string", String),
            p("start", Integer),
            opt("end", Integer)
        ],
        String,
        "Substring between two character indexes."
    ),
    sig!(
        "substr_g",
        [p("start", Integer), opt("end", Integer)],
        Func,
        "Composable substr."
    ),
    sig!(
        "replace",
        [
            p("string", String),
            p("search", String),
            p("replacement", String)
        ],
        String,
        "Replaces every occurrence of a substring."
    ),
    sig!(
        "replace_g",
        [p("search", String), p("replacement", String)],
        Func,
        "Composable replace."
    ),
    sig!(
        "trim",
        [p("string", String)],
        String,
        "Removes leading and trailing whitespace."
    ),
    sig!(
        "trimprefix",
        [p("string", String), p("prefix", String)],
        String,
        "Removes a prefix if present."
    ),
    sig!(
        "trimprefix_g",
        [p("prefix", String)],
        Func,
        "Composable trimprefix."
    ),
    sig!(
        "trimsuffix",
        [p("string", String), p("suffix", String)],
        String,
        "Removes a suffix if present."
    ),
    sig!(
        "trimsuffix_g",
        [p("suffix", String)],
        Func,
        "Composable trimsuffix."
    ),
    sig!(
        "split",
        [p("string", String), p("delimiter", String)],
        Array,
        "Splits a string by a delimiter."
    ),
    sig!(
        "split_g",
        [p("delimiter", String)],
        Func,
        "Composable split."
    ),
    sig!(
        "join",
        [p("strings", Array), p("delimiter", String)],
        String,
        "Joins an array of strings with a delimiter."
    ),
    sig!(
        "index",
        [p("string", String), p("substring", String)],
        Integer,
        "Character index of the first occurrence, or -1."
    ),
    sig!(
        "last_index",
        [p("string", String), p("substring", String)],
        Integer,
        "Character index of the last occurrence, or -1."
    ),
    sig!(
        "to_upper",
        [p("string", String)],
        String,
        "Upper-cases a string."
    ),
    sig!(
        "to_lower",
        [p("string", String)],
        String,
        "Lower-cases a string."
    ),
    sig!(
        "has_prefix",
        [p("string", String), p("prefix", String)],
        Boolean,
        "Whether a string starts with a prefix."
    ),
    sig!(
        "has_prefix_g",
        [p("prefix", String)],
        Func,
        "Composable has_prefix."
    ),
    sig!(
        "has_suffix",
        [p("string", String), p("suffix", String)],
        Boolean,
        "Whether a string ends with a suffix."
    ),
    sig!(
        "has_suffix_g",
        [p("suffix", String)],
        Func,
        "Composable has_suffix."
    ),
    sig!(
        "contains",
        [p("haystack", StringOrArray), p("needle", Any)],
        Boolean,
        "Whether a string contains a substring or an array an element."
    ),
    sig!(
        "contains_g",
        [p("needle", Any)],
        Func,
        "Composable contains."
    ),
    sig!("list", [], ...Any, Array, "Makes an array of its arguments."),
    sig!("object", [], ...Any, Object, "Makes an object of its named arguments."),
    sig!(
        "keys",
        [p("mapping", Object)],
        Array,
        "The keys of a mapping."
    ),
    sig!(
        "vals",
        [p("mapping", Object)],
        Array,
        "The values of a mapping."
    ),
    sig!(
        "map",
        [p("items", Array), p("f", Func)],
        Array,
        "Applies a function to every element."
    ),
    sig!(
        "filter",
        [p("items", Array), p("predicate", Func)],
        Array,
        "Keeps the elements a predicate accepts."
    ),
    sig!(
        "reduce",
        [p("items", Array), p("f", Func), p("initial", Any)],
        Any,
        "Folds an array into one value."
    ),
    sig!(
        "sort",
        [p("items", Array), p("compare", Func)],
        Array,
        "Sorts with a comparison function."
    ),
    sig!(
        "flatmap",
        [p("items", Array), p("f", Func)],
        Array,
        "Maps and flattens one level."
    ),
    sig!("compose", [], ...Func, Func, "Combines functions right to left."),
    sig!("pipe", [], ...Func, Func, "Combines functions left to right."),
    sig!(
        "getattr",
        [p("name", String)],
        Func,
        "Returns func(object) -> the named attribute."
    ),
    sig!(
        "getelem",
        [p("index", Integer)],
        Func,
        "Returns func(array) -> the element at an index."
    ),
    sig!(
        "link",
        [p("resourceA", ResourceName), p("resourceB", ResourceName)],
        Object,
        "The state of the link between two resources."
    ),
    sig!(
        "and",
        [p("a", Boolean), p("b", Boolean)],
        Boolean,
        "Logical AND (short-circuits)."
    ),
    sig!(
        "or",
        [p("a", Boolean), p("b", Boolean)],
        Boolean,
        "Logical OR (short-circuits)."
    ),
    sig!("not", [p("a", Boolean)], Boolean, "Logical NOT."),
    sig!("eq", [p("a", Any), p("b", Any)], Boolean, "Deep equality."),
    sig!("gt", [p("a", Number), p("b", Number)], Boolean, "a > b."),
    sig!("ge", [p("a", Number), p("b", Number)], Boolean, "a >= b."),
    sig!("lt", [p("a", Number), p("b", Number)], Boolean, "a < b."),
    sig!("le", [p("a", Number), p("b", Number)], Boolean, "a <= b."),
    sig!(
        "cwd",
        [],
        String,
        "The working directory of the engine or CLI."
    ),
    sig!(
        "datetime",
        [p("format", String)],
        String,
        "The current UTC time as unix, rfc3339, tag or tagcompact."
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifty_unique_core_functions() {
        assert_eq!(CORE.len(), 50);
        let mut names: Vec<_> = CORE.iter().map(|s| s.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 50);
        assert_eq!(core("substr").unwrap().arity_text(), "2 to 3 arguments");
        assert_eq!(
            core("list").unwrap().arity_text(),
            "any number of arguments"
        );
        assert_eq!(core("cwd").unwrap().arity_text(), "0 arguments");
    }
}
