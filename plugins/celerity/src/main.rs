use std::process::ExitCode;
use trellis_transformer_celerity::Celerity;

fn main() -> ExitCode {
    trellis_plugin_sdk::serve_transformer(Celerity)
}
