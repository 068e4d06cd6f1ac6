//! Property tests: no input makes the readers, the substitution parser or
//! validation panic, and every reported span lies inside its file. The fuzz
//! targets in `fuzz/` explore the same properties far longer.

use proptest::prelude::*;
use trellis_lang::diag::Diagnostics;
use trellis_lang::source::{FileId, SourceMap, Span};
use trellis_lang::subst::{SpanMap, parse_template};
use trellis_lang::validate::Options;
use trellis_lang::validate::validate_source;

fn check_pipeline(name: &str, text: &str) {
    let mut sources = SourceMap::new();
    let mut diags = Diagnostics::default();
    validate_source(
        &mut sources,
        name,
        text.as_bytes().to_vec(),
        &Options::default(),
        1 << 20,
        &mut diags,
    );
    for d in &diags.items {
        let file = sources.get(d.span.file);
        assert!(d.span.start <= d.span.end, "{d:?}");
        assert!((d.span.end as usize) <= file.text.len(), "{d:?}");
        assert!(file.text.is_char_boundary(d.span.start as usize), "{d:?}");
        // Rendering must not panic either.
        let _ = trellis_lang::diag::render_text(d, &sources);
    }
}

/// Text built from the tokens blueprints are made of, so the generator
/// reaches deep into the grammar instead of failing at the first byte.
fn blueprint_like() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        Just("version: 2023-04-20\n".to_owned()),
        Just("resources:\n".to_owned()),
        Just("  r:\n    type: a/b\n    spec:\n".to_owned()),
        Just("      k: ".to_owned()),
        Just("${".to_owned()),
        Just("}".to_owned()),
        Just("variables.".to_owned()),
        Just("values.".to_owned()),
        Just("resources.r.spec".to_owned()),
        Just("datasources.d.f[0]".to_owned()),
        Just("elem".to_owned()),
        Just("(".to_owned()),
        Just(")".to_owned()),
        Just("\"".to_owned()),
        Just("[".to_owned()),
        Just("]".to_owned()),
        Just(",".to_owned()),
        Just("\n".to_owned()),
        Just("    each: ".to_owned()),
        Just("    condition:\n      and:\n        - ".to_owned()),
        Just("&a *a !t ".to_owned()),
        Just("{\"a\": [1, {\"b\": ".to_owned()),
        "[a-z0-9_.$ -]{0,8}",
        "\\PC{0,4}",
    ];
    prop::collection::vec(token, 0..40).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn yaml_pipeline_never_panics(text in blueprint_like()) {
        check_pipeline("p.yaml", &text);
    }

    #[test]
    fn json_pipeline_never_panics(text in blueprint_like()) {
        check_pipeline("p.json", &text);
    }

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
        check_pipeline("p.yaml", &text);
        check_pipeline("p.jsonc", &text);
    }

    #[test]
    fn templates_never_panic_and_spans_stay_inside(s in "(\\$\\{|\\}|[a-z.\\[\\]()\"\\\\, 0-9=-]|\\PC){0,60}") {
        let mut diags = Diagnostics::default();
        let map = SpanMap::verbatim(FileId(0), 0);
        let t = parse_template(&s, &map, Span::new(FileId(0), 0, s.len()), &mut diags);
        for d in &diags.items {
            prop_assert!(d.span.end as usize <= s.len());
        }
        for sub in t.substitutions() {
            prop_assert!(sub.span.end as usize <= s.len());
        }
    }

    /// A string without `${` is its own literal.
    #[test]
    fn plain_strings_round_trip(s in "[^$]{0,50}") {
        let mut diags = Diagnostics::default();
        let map = SpanMap::verbatim(FileId(0), 0);
        let t = parse_template(&s, &map, Span::default(), &mut diags);
        prop_assert!(diags.items.is_empty());
        prop_assert_eq!(t.as_literal(), Some(s));
    }
}
