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
        msg.contains("the search is array[string], which `has key` does not accept for any field"),
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
