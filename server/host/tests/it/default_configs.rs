//! A call whose caller gives no provider config (a plugin calling another's function through
//! the host, the CLI) carries the host's default for that provider: the engine's own
//! settings. Against the real `local` provider, whose ValidateConfig checks its `root`.

use std::collections::HashMap;

use crate::plugins_common::*;
use trellis_host::{CallOptions, PluginHost};
use trellis_proto::plugin::v1 as pb;

fn root_config(root: &str) -> pb::Value {
    pb::Value {
        kind: Some(pb::value::Kind::Map(pb::MapValue {
            entries: vec![pb::MapEntry {
                key: "root".into(),
                value: Some(pb::Value {
                    kind: Some(pb::value::Kind::String(root.into())),
                    sensitive: false,
                }),
            }],
        })),
        sensitive: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_without_a_config_carry_the_default() {
    let root = TempDir::new("default-configs");
    let dir = root.join("plugins");
    std::fs::create_dir_all(&dir).unwrap();
    let local = workspace_binary(
        "trellis-provider-local",
        "trellis-provider-local",
        "TRELLIS_TEST_LOCAL",
    );
    std::os::unix::fs::symlink(local, dir.join("trellis-provider-local")).unwrap();
    let host = PluginHost::new(config(&root, &dir));
    let client = host.provider("local").expect("discovered");
    let diagnostics = |r: pb::ValidateResponse| -> Vec<String> {
        r.diagnostics.into_iter().map(|d| d.code).collect()
    };
    // No default yet: the provider gets no root and has nothing to check.
    let none = client
        .validate_config(&CallOptions::default())
        .await
        .unwrap();
    assert_eq!(diagnostics(none), Vec::<String>::new());
    // With a default, a call without a config of its own carries it.
    host.set_default_configs(HashMap::from([(
        "local".to_owned(),
        root_config("/nonexistent/trellis-default-root"),
    )]));
    let defaulted = client
        .validate_config(&CallOptions::default())
        .await
        .unwrap();
    assert_eq!(diagnostics(defaulted), ["local.root-invalid"]);
    // A caller's own config wins over the default.
    let own = CallOptions {
        provider_config: Some(root_config(&root.join("plugins").display().to_string())),
        ..CallOptions::default()
    };
    let given = client.validate_config(&own).await.unwrap();
    assert_eq!(diagnostics(given), Vec::<String>::new());
    host.shutdown().await;
}
