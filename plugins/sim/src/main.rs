//! `trellis-provider-sim`: started by the Trellis engine (see README.md).

fn main() -> std::process::ExitCode {
    trellis_plugin_sdk::serve_provider(trellis_provider_sim::Sim::new())
}
