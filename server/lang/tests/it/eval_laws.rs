//! Property tests: algebraic laws the 50 core functions of
//! `core-functions.md` must satisfy, checked on generated inputs through
//! `trellis_lang::eval::functions::{call, apply}`, and the guarantee that no
//! function panics, whatever values of whatever types it is given.

use indexmap::IndexMap;
use proptest::prelude::*;
use proptest::sample::select;
use trellis_lang::eval::functions::{Env, apply, call};
use trellis_lang::eval::value::{Func, Value};

/// The 50 core functions, in the order of `core-functions.md`.
const CORE: [&str; 50] = [
    "fromjson",
    "fromjson_g",
    "jsondecode",
    "len",
    "substr",
    "substr_g",
    "replace",
    "replace_g",
    "trim",
    "trimprefix",
    "trimprefix_g",
    "trimsuffix",
    "trimsuffix_g",
    "split",
    "split_g",
    "join",
    "index",
    "last_index",
    "to_upper",
    "to_lower",
    "has_prefix",
    "has_prefix_g",
    "has_suffix",
    "has_suffix_g",
    "contains",
    "contains_g",
    "list",
    "object",
    "keys",
    "vals",
    "map",
    "filter",
    "reduce",
    "sort",
    "flatmap",
    "compose",
    "pipe",
    "getattr",
    "getelem",
    "link",
    "and",
    "or",
    "not",
    "eq",
    "gt",
    "ge",
    "lt",
    "le",
    "cwd",
    "datetime",
];

/// The functions that return a function (`_g` variants and friends).
const MAKERS: [&str; 13] = [
    "fromjson_g",
    "substr_g",
    "replace_g",
    "trimprefix_g",
    "trimsuffix_g",
    "split_g",
    "has_prefix_g",
    "has_suffix_g",
    "contains_g",
    "getattr",
    "getelem",
    "compose",
    "pipe",
];

/// Moderate case counts; failures are reported, not persisted to files.
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn no_link(_: &str, _: &str) -> Value {
    Value::Unknown
}

fn env() -> Env<'static> {
    Env {
        cwd: "/srv/app",
        now_unix_nanos: 1_681_985_730 * 1_000_000_000,
        link: &no_link,
    }
}

fn try_call(name: &str, args: Vec<Value>) -> Result<Value, String> {
    call(name, args, Vec::new(), &env()).map_err(|e| e.to_string())
}

fn ok(name: &str, args: Vec<Value>) -> Value {
    try_call(name, args).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn try_apply(f: &Func, args: Vec<Value>) -> Result<Value, String> {
    apply(f, args, &env()).map_err(|e| e.to_string())
}

fn s(x: &str) -> Value {
    Value::from(x)
}

fn strs<S: AsRef<str>>(items: &[S]) -> Value {
    Value::List(items.iter().map(|x| s(x.as_ref())).collect())
}

fn func(name: &str, args: Vec<Value>) -> Func {
    match ok(name, args) {
        Value::Func(f) => f,
        other => panic!("{name} returned {other:?}, not a function"),
    }
}

fn as_str(v: &Value) -> &str {
    match v {
        Value::Str(x) => x,
        other => panic!("expected a string, found {other:?}"),
    }
}

fn as_int(v: &Value) -> i64 {
    match v {
        Value::Int(i) => *i,
        other => panic!("expected an integer, found {other:?}"),
    }
}

fn as_bool(v: &Value) -> bool {
    match v {
        Value::Bool(b) => *b,
        other => panic!("expected a boolean, found {other:?}"),
    }
}

fn as_list(v: &Value) -> &[Value] {
    match v {
        Value::List(items) => items,
        other => panic!("expected an array, found {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// Strategies

/// Strings from a small alphabet (so that searches find something), with
/// multi-byte characters so that byte and character positions differ.
fn small_text() -> impl Strategy<Value = String> {
    "[abé,; 日]{0,12}"
}

/// Any printable text, including emoji and other non-BMP characters.
fn any_text() -> impl Strategy<Value = String> {
    "\\PC{0,16}"
}

/// The string-to-string functions used in composition laws; every one is
/// total on strings.
fn string_fn() -> impl Strategy<Value = Func> {
    select(vec![0usize, 1, 2, 3, 4, 5, 6, 7]).prop_map(|k| match k {
        0 => Func::Core("to_upper"),
        1 => Func::Core("to_lower"),
        2 => Func::Core("trim"),
        3 => func("trimprefix_g", vec![s("a")]),
        4 => func("trimsuffix_g", vec![s("é")]),
        5 => func("replace_g", vec![s("a"), s("bb")]),
        6 => func("substr_g", vec![Value::Int(0)]),
        _ => func("replace_g", vec![s(" "), s("")]),
    })
}

fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::Int),
        (-1000i64..1000).prop_map(Value::Int),
        (-1.0e6f64..1.0e6).prop_map(Value::Float),
        (-1000i64..1000).prop_map(|i| Value::Float(i as f64)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::Float),
    ]
}

/// Numbers whose decimal form is short (eighths), which any JSON reader
/// decodes exactly; `jsondecode_reads_floats_exactly` covers the rest.
fn short_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::Int),
        (-1000i64..1000).prop_map(Value::Int),
        (-8000i64..8000).prop_map(|i| Value::Float(i as f64 / 8.0)),
    ]
}

/// JSON-like values: no functions, no unknowns, finite floats.
fn data_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        short_number(),
        any_text().prop_map(Value::Str),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::List),
            prop::collection::vec(("[a-z]{1,4}", inner), 0..4)
                .prop_map(|kvs| Value::Map(kvs.into_iter().collect::<IndexMap<_, _>>())),
        ]
    })
}

/// A function value as the language can produce it: a bare core function,
/// or what a function-returning function gives for some arguments.
fn func_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        select(CORE.to_vec()).prop_map(|n| Value::Func(Func::Core(n))),
        (
            select(MAKERS.to_vec()),
            prop::collection::vec(simple_value(), 0..3)
        )
            .prop_filter_map("makes a function", |(n, args)| {
                match try_call(n, args) {
                    Ok(v @ Value::Func(_)) => Some(v),
                    _ => None,
                }
            }),
    ];
    leaf.prop_recursive(2, 8, 3, |inner| {
        (
            select(vec!["compose", "pipe"]),
            prop::collection::vec(inner, 0..3),
        )
            .prop_filter_map("composes", |(n, fs)| match try_call(n, fs) {
                Ok(v @ Value::Func(_)) => Some(v),
                _ => None,
            })
    })
}

/// Scalars that make sensible static arguments (pointers, indexes, names).
fn simple_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        small_text().prop_map(Value::Str),
        Just(s("/a")),
        Just(s("a")),
        (-3i64..5).prop_map(Value::Int),
        any::<bool>().prop_map(Value::Bool),
    ]
}

/// Anything at all: every type, unknowns, functions, non-finite floats,
/// extreme integers, JSON text.
fn any_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        4 => data_value(),
        1 => Just(Value::Unknown),
        1 => select(vec![
            Value::Float(f64::NAN),
            Value::Float(f64::INFINITY),
            Value::Float(f64::NEG_INFINITY),
            Value::Int(i64::MIN),
            Value::Int(i64::MAX),
            Value::Int(-1),
            s(""),
            s("{\"a\": [1, {\"b\": null}]}"),
            s("[1, 2]"),
            s("/a/0"),
            s("unix"),
            s("rfc3339"),
            s("tag"),
            s("tagcompact"),
        ]),
        2 => simple_value(),
        2 => func_value(),
    ];
    leaf.prop_recursive(2, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::List),
            prop::collection::vec(("[a-z]{1,3}", inner), 0..3)
                .prop_map(|kvs| Value::Map(kvs.into_iter().collect::<IndexMap<_, _>>())),
        ]
    })
}

// ---------------------------------------------------------------------------
// The catalogue

#[test]
fn all_fifty_functions_exist() {
    for name in CORE {
        let sig = trellis_lang::functions::core(name)
            .unwrap_or_else(|| panic!("`{name}` is missing from the signature table"));
        assert_eq!(sig.name, name);
    }
    assert_eq!(trellis_lang::functions::CORE.len(), 50);
}

// ---------------------------------------------------------------------------
// Strings

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn join_undoes_split(text in small_text(), delim in "[a,;é日]{1,2}") {
        let parts = ok("split", vec![s(&text), s(&delim)]);
        prop_assert_eq!(as_list(&parts).len(), text.matches(delim.as_str()).count() + 1);
        for p in as_list(&parts) {
            prop_assert!(!as_str(p).contains(delim.as_str()));
        }
        let joined = ok("join", vec![parts, s(&delim)]);
        prop_assert_eq!(as_str(&joined), text.as_str());
    }

    #[test]
    fn split_g_agrees_with_split(text in small_text(), delim in "[a,;é]{1,2}") {
        let direct = ok("split", vec![s(&text), s(&delim)]);
        let composed = try_apply(&func("split_g", vec![s(&delim)]), vec![s(&text)]);
        prop_assert_eq!(composed, Ok(direct));
    }

    #[test]
    fn compose_is_pipe_reversed(f in string_fn(), g in string_fn(), h in string_fn(), x in any_text()) {
        let fv = Value::Func(f.clone());
        let gv = Value::Func(g.clone());
        let hv = Value::Func(h.clone());
        let compose = func("compose", vec![fv.clone(), gv.clone()]);
        let pipe = func("pipe", vec![gv.clone(), fv.clone()]);
        let by_hand = try_apply(&g, vec![s(&x)]).and_then(|y| try_apply(&f, vec![y]));
        prop_assert_eq!(try_apply(&compose, vec![s(&x)]), by_hand.clone());
        prop_assert_eq!(try_apply(&pipe, vec![s(&x)]), by_hand);

        let compose3 = func("compose", vec![fv.clone(), gv.clone(), hv.clone()]);
        let pipe3 = func("pipe", vec![hv, gv, fv]);
        prop_assert_eq!(
            try_apply(&compose3, vec![s(&x)]),
            try_apply(&pipe3, vec![s(&x)])
        );
    }

    #[test]
    fn len_counts_characters(text in any_text()) {
        let n = as_int(&ok("len", vec![s(&text)]));
        prop_assert_eq!(n, text.chars().count() as i64);
    }

    #[test]
    fn len_of_arrays_and_mappings(items in prop::collection::vec(data_value(), 0..6),
                                   keys in prop::collection::btree_set("[a-z]{1,4}", 0..6)) {
        prop_assert_eq!(as_int(&ok("len", vec![Value::List(items.clone())])), items.len() as i64);
        let map: IndexMap<String, Value> = keys.iter().map(|k| (k.clone(), Value::Null)).collect();
        prop_assert_eq!(as_int(&ok("len", vec![Value::Map(map)])), keys.len() as i64);
    }

    #[test]
    fn trim_is_idempotent(text in "[ \t\n\u{3000}abé]{0,12}") {
        let once = ok("trim", vec![s(&text)]);
        let twice = ok("trim", vec![once.clone()]);
        prop_assert_eq!(&once, &twice);
        let t = as_str(&once);
        prop_assert!(!t.starts_with(char::is_whitespace) && !t.ends_with(char::is_whitespace));
        prop_assert!(text.contains(t));
    }

    #[test]
    fn case_conversion_on_ascii(text in "[ -~]{0,16}") {
        let upper = ok("to_upper", vec![s(&text)]);
        let lower = ok("to_lower", vec![s(&text)]);
        prop_assert_eq!(ok("to_upper", vec![lower.clone()]), upper.clone());
        prop_assert_eq!(ok("to_lower", vec![upper.clone()]), lower.clone());
        prop_assert_eq!(as_str(&upper), text.to_ascii_uppercase());
        prop_assert_eq!(as_str(&lower), text.to_ascii_lowercase());
    }

    #[test]
    fn substr_whole_and_halves(text in any_text(), cut in any::<prop::sample::Index>()) {
        let n = text.chars().count();
        let whole = ok("substr", vec![s(&text), Value::Int(0), Value::Int(n as i64)]);
        prop_assert_eq!(as_str(&whole), text.as_str());
        prop_assert_eq!(ok("substr", vec![s(&text), Value::Int(0)]), s(&text));
        // Half-open ranges compose: substr(s, 0, k) + substr(s, k) == s.
        let k = cut.index(n + 1) as i64;
        let left = ok("substr", vec![s(&text), Value::Int(0), Value::Int(k)]);
        let right = ok("substr", vec![s(&text), Value::Int(k)]);
        prop_assert_eq!(format!("{}{}", as_str(&left), as_str(&right)), text.clone());
        prop_assert_eq!(as_int(&ok("len", vec![left])), k);
        // Beyond the end is an error, not a clamp.
        prop_assert!(try_call("substr", vec![s(&text), Value::Int(0), Value::Int(n as i64 + 1)]).is_err());
        prop_assert!(try_call("substr", vec![s(&text), Value::Int(-1)]).is_err());
    }

    #[test]
    fn index_agrees_with_contains(text in "[abé日]{0,8}", needle in "[abé日]{0,3}") {
        let first = as_int(&ok("index", vec![s(&text), s(&needle)]));
        let last = as_int(&ok("last_index", vec![s(&text), s(&needle)]));
        let found = as_bool(&ok("contains", vec![s(&text), s(&needle)]));
        prop_assert_eq!(first >= 0, found);
        prop_assert_eq!(last >= 0, found);
        prop_assert!(last >= first);
        if found {
            let m = needle.chars().count() as i64;
            for at in [first, last] {
                let piece = ok("substr", vec![s(&text), Value::Int(at), Value::Int(at + m)]);
                prop_assert_eq!(as_str(&piece), needle.as_str());
            }
        } else {
            prop_assert_eq!(first, -1);
        }
    }

    #[test]
    fn prefixes_and_suffixes(a in any_text(), b in any_text()) {
        let ab = format!("{a}{b}");
        prop_assert!(as_bool(&ok("has_prefix", vec![s(&ab), s(&a)])));
        prop_assert!(as_bool(&ok("has_suffix", vec![s(&ab), s(&b)])));
        prop_assert_eq!(ok("trimprefix", vec![s(&ab), s(&a)]), s(&b));
        prop_assert_eq!(ok("trimsuffix", vec![s(&ab), s(&b)]), s(&a));
        prop_assert!(as_bool(&ok("contains", vec![s(&ab), s(&a)])));
        let g = func("has_prefix_g", vec![s(&a)]);
        prop_assert_eq!(try_apply(&g, vec![s(&ab)]), Ok(Value::Bool(true)));
        let g = func("trimsuffix_g", vec![s(&b)]);
        prop_assert_eq!(try_apply(&g, vec![s(&ab)]), Ok(s(&a)));
    }

    #[test]
    fn replace_removes_every_occurrence(text in small_text(), search in "[abé]{1,2}") {
        let out = ok("replace", vec![s(&text), s(&search), s("")]);
        prop_assert_eq!(as_str(&out), text.replace(search.as_str(), ""));
        let g = func("replace_g", vec![s(&search), s("")]);
        prop_assert_eq!(try_apply(&g, vec![s(&text)]), Ok(out));
    }
}

// ---------------------------------------------------------------------------
// JSON

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn jsondecode_round_trips(v in data_value()) {
        let json = v.to_json().expect("data values are JSON");
        let text = serde_json::to_string(&json).unwrap();
        let back = ok("jsondecode", vec![s(&text)]);
        prop_assert_eq!(ok("eq", vec![back, v]), Value::Bool(true));
    }

    /// A float written the shortest way that reads back exactly (as
    /// serde_json and JavaScript write them) must decode to the same float.
    #[test]
    fn jsondecode_reads_floats_exactly(f in any::<f64>().prop_filter("finite", |f| f.is_finite())) {
        let text = serde_json::to_string(&f).unwrap();
        prop_assert_eq!(ok("jsondecode", vec![s(&text)]), Value::Float(f), "{}", text);
        let doc = format!("{{\"x\": {text}}}");
        prop_assert_eq!(ok("fromjson", vec![s(&doc), s("/x")]), Value::Float(f), "{}", doc);
    }

    #[test]
    fn fromjson_reads_top_level_fields(fields in prop::collection::vec(("[a-z]{1,4}", data_value()), 1..5),
                                       pick in any::<prop::sample::Index>()) {
        let map: IndexMap<String, Value> = fields.into_iter().collect();
        let text = serde_json::to_string(&Value::Map(map.clone()).to_json().unwrap()).unwrap();
        let (key, want) = map.get_index(pick.index(map.len())).unwrap();
        let got = ok("fromjson", vec![s(&text), s(&format!("/{key}"))]);
        prop_assert_eq!(ok("eq", vec![got, want.clone()]), Value::Bool(true));
        prop_assert_eq!(ok("fromjson", vec![s(&text), s("")]), ok("jsondecode", vec![s(&text)]));
    }
}

// ---------------------------------------------------------------------------
// Collections and higher-order functions

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn keys_and_vals_line_up(entries in prop::collection::vec(("[a-z]{1,4}", data_value()), 0..6)) {
        let map: IndexMap<String, Value> = entries.into_iter().collect();
        let keys = ok("keys", vec![Value::Map(map.clone())]);
        let vals = ok("vals", vec![Value::Map(map.clone())]);
        prop_assert_eq!(as_list(&keys).len(), map.len());
        prop_assert_eq!(as_list(&vals).len(), map.len());
        for ((k, v), (kk, vv)) in as_list(&keys).iter().zip(as_list(&vals)).zip(&map) {
            prop_assert_eq!(as_str(k), kk.as_str());
            prop_assert_eq!(v, vv);
        }
    }

    #[test]
    fn list_keeps_its_arguments(items in prop::collection::vec(any_text(), 0..6)) {
        let args: Vec<Value> = items.iter().map(|x| s(x)).collect();
        prop_assert_eq!(ok("list", args.clone()), Value::List(args));
    }

    #[test]
    fn map_preserves_length(items in prop::collection::vec(any_text(), 0..8), f in string_fn()) {
        let out = ok("map", vec![strs(&items), Value::Func(f.clone())]);
        prop_assert_eq!(as_list(&out).len(), items.len());
        for (x, y) in items.iter().zip(as_list(&out)) {
            prop_assert_eq!(Ok(y.clone()), try_apply(&f, vec![s(x)]));
        }
    }

    #[test]
    fn filter_keeps_a_subsequence(items in prop::collection::vec(small_text(), 0..8), prefix in "[abé]{0,2}") {
        let out = ok("filter", vec![strs(&items), Value::Func(func("has_prefix_g", vec![s(&prefix)]))]);
        let kept: Vec<&str> = as_list(&out).iter().map(as_str).collect();
        prop_assert!(kept.len() <= items.len());
        let want: Vec<&str> = items.iter().map(String::as_str).filter(|x| x.starts_with(prefix.as_str())).collect();
        prop_assert_eq!(kept, want);
    }

    #[test]
    fn flatmap_is_concatenated_map(items in prop::collection::vec(small_text(), 0..6)) {
        let g = Value::Func(func("split_g", vec![s(",")]));
        let mapped = ok("map", vec![strs(&items), g.clone()]);
        let flat = ok("flatmap", vec![strs(&items), g]);
        let concat: Vec<Value> = as_list(&mapped).iter().flat_map(|v| as_list(v).to_vec()).collect();
        prop_assert_eq!(flat, Value::List(concat));
    }

    #[test]
    fn reduce_folds_left(items in prop::collection::vec(any::<bool>(), 0..8), init in any::<bool>()) {
        let list = Value::List(items.iter().map(|b| Value::Bool(*b)).collect());
        let all = ok("reduce", vec![list.clone(), Value::Func(Func::Core("and")), Value::Bool(init)]);
        let any_ = ok("reduce", vec![list, Value::Func(Func::Core("or")), Value::Bool(init)]);
        prop_assert_eq!(all, Value::Bool(items.iter().fold(init, |a, b| a && *b)));
        prop_assert_eq!(any_, Value::Bool(items.iter().fold(init, |a, b| a || *b)));
    }

    /// `index` is a consistent comparison on the suffixes of a string whose
    /// characters are distinct (a suffix contains every shorter one, at a
    /// positive position): sorting by it orders by length.
    #[test]
    fn sort_orders_by_a_consistent_comparison(picks in prop::collection::vec(0usize..10, 0..10)) {
        const WORD: &str = "abcdéfghij";
        let suffix = |k: usize| WORD.chars().skip(k).collect::<String>();
        let items: Vec<String> = picks.iter().map(|k| suffix(*k)).collect();
        let out = ok("sort", vec![strs(&items), Value::Func(Func::Core("index"))]);
        let got: Vec<String> = as_list(&out).iter().map(|v| as_str(v).to_owned()).collect();
        let mut want = items.clone();
        want.sort_by_key(|x| x.chars().count());
        prop_assert_eq!(&got, &want);
        // Sorting sorted output changes nothing.
        let again = ok("sort", vec![out.clone(), Value::Func(Func::Core("index"))]);
        prop_assert_eq!(again, out);
    }

    /// Whatever the comparison (here an inconsistent one), the output is a
    /// permutation of the input.
    #[test]
    fn sort_output_is_a_permutation(items in prop::collection::vec(small_text(), 0..10),
                                    last in any::<bool>()) {
        let cmp = Func::Core(if last { "last_index" } else { "index" });
        let out = ok("sort", vec![strs(&items), Value::Func(cmp)]);
        let mut got: Vec<String> = as_list(&out).iter().map(|v| as_str(v).to_owned()).collect();
        let mut want = items.clone();
        got.sort();
        want.sort();
        prop_assert_eq!(got, want);
    }

    #[test]
    fn getattr_and_getelem_read_what_they_name(items in prop::collection::vec(data_value(), 1..5),
                                              pick in any::<prop::sample::Index>()) {
        let i = pick.index(items.len());
        let elem = func("getelem", vec![Value::Int(i as i64)]);
        prop_assert_eq!(try_apply(&elem, vec![Value::List(items.clone())]), Ok(items[i].clone()));
        let mut obj = IndexMap::new();
        obj.insert("id".to_owned(), items[i].clone());
        let attr = func("getattr", vec![s("id")]);
        prop_assert_eq!(try_apply(&attr, vec![Value::Map(obj)]), Ok(items[i].clone()));
    }
}

// ---------------------------------------------------------------------------
// Logic and comparison

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn eq_is_reflexive_and_symmetric(a in data_value(), b in data_value()) {
        prop_assert_eq!(ok("eq", vec![a.clone(), a.clone()]), Value::Bool(true));
        prop_assert_eq!(ok("eq", vec![a.clone(), b.clone()]), ok("eq", vec![b, a]));
    }

    #[test]
    fn comparisons_mirror_each_other(a in number(), b in number()) {
        let gt = as_bool(&ok("gt", vec![a.clone(), b.clone()]));
        let ge = as_bool(&ok("ge", vec![a.clone(), b.clone()]));
        let lt = as_bool(&ok("lt", vec![a.clone(), b.clone()]));
        let le = as_bool(&ok("le", vec![a.clone(), b.clone()]));
        let eq = as_bool(&ok("eq", vec![a.clone(), b.clone()]));
        prop_assert_eq!(gt, as_bool(&ok("lt", vec![b.clone(), a.clone()])));
        prop_assert_eq!(ge, as_bool(&ok("le", vec![b.clone(), a.clone()])));
        prop_assert_eq!(ge, gt || eq);
        prop_assert_eq!(le, lt || eq);
        // Exactly one of <, =, > holds for numbers.
        prop_assert_eq!(u8::from(lt) + u8::from(eq) + u8::from(gt), 1);
    }

    #[test]
    fn integer_comparisons_match_rust(a in any::<i64>(), b in any::<i64>()) {
        prop_assert_eq!(ok("gt", vec![Value::Int(a), Value::Int(b)]), Value::Bool(a > b));
        prop_assert_eq!(ok("le", vec![Value::Int(a), Value::Int(b)]), Value::Bool(a <= b));
        prop_assert_eq!(ok("eq", vec![Value::Int(a), Value::Int(b)]), Value::Bool(a == b));
    }

    #[test]
    fn boolean_laws(a in any::<bool>(), b in any::<bool>()) {
        let (va, vb) = (Value::Bool(a), Value::Bool(b));
        prop_assert_eq!(ok("not", vec![ok("not", vec![va.clone()])]), va.clone());
        prop_assert_eq!(ok("and", vec![va.clone(), vb.clone()]), Value::Bool(a && b));
        prop_assert_eq!(ok("or", vec![va.clone(), vb.clone()]), Value::Bool(a || b));
        // De Morgan.
        prop_assert_eq!(
            ok("not", vec![ok("and", vec![va.clone(), vb.clone()])]),
            ok("or", vec![ok("not", vec![va.clone()]), ok("not", vec![vb.clone()])])
        );
        prop_assert_eq!(
            ok("not", vec![ok("or", vec![va.clone(), vb.clone()])]),
            ok("and", vec![ok("not", vec![va]), ok("not", vec![vb])])
        );
    }
}

// ---------------------------------------------------------------------------
// Unknown values

proptest! {
    #![proptest_config(config(256))]

    /// Any unknown argument makes the result unknown (decisions/0003), except
    /// where the known arguments decide `and`/`or`, and the constructors
    /// `list`/`object`, which hold values rather than compute from them.
    #[test]
    fn unknown_arguments_make_unknown_results(
        name in select(CORE.iter().copied().filter(|n| !matches!(*n, "and" | "or" | "list" | "object" | "cwd")).collect::<Vec<_>>()),
        others in prop::collection::vec(any_value(), 4),
        at in any::<prop::sample::Index>(),
    ) {
        let sig = trellis_lang::functions::core(name).unwrap();
        let count = sig.max_args().unwrap_or(sig.min_args().max(1)).max(1);
        let mut args: Vec<Value> = others.into_iter().take(count).collect();
        let at = at.index(count);
        args[at] = Value::Unknown;
        prop_assert_eq!(try_call(name, args), Ok(Value::Unknown));
    }

    #[test]
    fn and_or_are_decided_by_a_known_operand(left in any::<bool>()) {
        let decided = |name: &str, b: bool| {
            (ok(name, vec![Value::Bool(b), Value::Unknown]), ok(name, vec![Value::Unknown, Value::Bool(b)]))
        };
        let (l, r) = decided("and", left);
        let want = if left { Value::Unknown } else { Value::Bool(false) };
        prop_assert_eq!(&l, &want);
        prop_assert_eq!(&r, &want);
        let (l, r) = decided("or", left);
        let want = if left { Value::Bool(true) } else { Value::Unknown };
        prop_assert_eq!(&l, &want);
        prop_assert_eq!(&r, &want);
    }
}

// ---------------------------------------------------------------------------
// No panics

proptest! {
    #![proptest_config(config(512))]

    /// Every core function, with 0 to 4 arguments of any type, returns a
    /// value or an error; it never panics.
    #[test]
    fn no_function_panics(name in select(CORE.to_vec()), args in prop::collection::vec(any_value(), 0..=4)) {
        let _ = try_call(name, args);
    }

    /// Named arguments (only meaningful for `object`) never panic either.
    #[test]
    fn named_arguments_never_panic(name in select(CORE.to_vec()),
                                   named in prop::collection::vec(("[a-c]{1,2}", any_value()), 0..3)) {
        let _ = call(name, Vec::new(), named, &env());
    }

    /// Applying any function value the language can make, to anything.
    #[test]
    fn no_function_value_panics(f in func_value(), args in prop::collection::vec(any_value(), 0..=3)) {
        let Value::Func(f) = f else { unreachable!() };
        let _ = try_apply(&f, args);
    }

    /// Higher-order functions over arbitrary arrays and function values.
    #[test]
    fn no_higher_order_call_panics(
        name in select(vec!["map", "filter", "flatmap", "sort", "reduce"]),
        items in prop::collection::vec(any_value(), 0..5),
        f in func_value(),
        init in any_value(),
    ) {
        let mut args = vec![Value::List(items), f];
        if name == "reduce" {
            args.push(init);
        }
        let _ = try_call(name, args);
    }
}
