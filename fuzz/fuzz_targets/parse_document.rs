//! Whole pipeline on arbitrary bytes: read as YAML and as JSON, build the
//! model, validate, render every diagnostic. Must never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use trellis::cli::validate_source;
use trellis::diag::{render_json, render_text, Diagnostics};
use trellis::source::SourceMap;
use trellis::validate::Options;

fuzz_target!(|data: &[u8]| {
    for name in ["fuzz.yaml", "fuzz.jsonc"] {
        let mut sources = SourceMap::new();
        let mut diags = Diagnostics::default();
        validate_source(&mut sources, name, data.to_vec(), &Options::default(), 1 << 20, &mut diags);
        for d in &diags.items {
            let _ = render_text(d, &sources);
            let _ = render_json(d, &sources);
        }
    }
});
