use std::process::ExitCode;

use trellis_provider_aws::AwsProvider;

fn main() -> ExitCode {
    trellis_plugin_sdk::serve_provider(AwsProvider::default())
}
