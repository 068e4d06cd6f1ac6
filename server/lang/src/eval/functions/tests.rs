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
