//! Integration tests of the `trellis` binary: the CLI, and the engine end to end (a real `trellis serve` with real plugin processes).

mod engine_common;
// Shared with the plugin host's tests: starting plugins, temp dirs, process checks.
#[path = "../../../host/tests/it/plugins_common.rs"]
mod plugins_common;
// moto and boto3, shared with the AWS provider's tests.
#[path = "../../../../plugins/aws/tests/it/support/moto.rs"]
mod aws_moto;

mod assets_e2e;
mod auth_e2e;
mod aws_e2e;
mod aws_types_e2e;
mod backup_e2e;
mod blueprint_features_e2e;
mod celerity_backing_e2e;
mod celerity_cli;
mod celerity_common;
mod celerity_events_e2e;
mod change_order_e2e;
mod children_e2e;
mod cli;
mod configuration_e2e;
mod drain_e2e;
mod engine_e2e;
mod import_e2e;
mod interop_e2e;
mod limits_e2e;
mod link_drift_e2e;
mod links_e2e;
mod logs_e2e;
mod metrics_e2e;
mod plugins_cli;
mod reflection_e2e;
mod replicas_e2e;
mod secrets_e2e;
mod serve_e2e;
mod serve_hostile_e2e;
mod spec_examples_e2e;
mod state_files_e2e;
mod store_full_e2e;
mod tls_e2e;
mod unanswered_e2e;
mod validate_links;
mod validate_plugins;
mod wait_e2e;
