use std::process::ExitCode;

use trellis_provider_local::LocalProvider;

fn main() -> ExitCode {
    trellis_plugin_sdk::serve_provider(LocalProvider)
}
