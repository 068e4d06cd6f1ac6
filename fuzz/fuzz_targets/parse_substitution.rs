//! The `${..}` parser on arbitrary strings, as a template and as a bare
//! expression. Must never panic, and spans must stay inside the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use trellis::diag::Diagnostics;
use trellis::source::{FileId, Span};
use trellis::subst::{parse_expression, parse_template, SpanMap};

fuzz_target!(|s: &str| {
    let mut diags = Diagnostics::default();
    let map = SpanMap::verbatim(FileId(0), 0);
    let t = parse_template(s, &map, Span::new(FileId(0), 0, s.len()), &mut diags);
    for sub in t.substitutions() {
        assert!(sub.span.end as usize <= s.len());
    }
    let _ = parse_expression(s, &map, &mut diags);
    for d in &diags.items {
        assert!(d.span.start <= d.span.end && d.span.end as usize <= s.len());
    }
});
