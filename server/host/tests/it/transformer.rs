//! Transformers go through the same host: launch, handshake, manifest,
//! Transform, shutdown. Against the real `celerity-2023-04-20` transformer.

use crate::plugins_common::*;
use trellis_host::{CallOptions, PluginHost, PluginKind};

const NAME: &str = "celerity-2023-04-20";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transformer_launches_and_transforms() {
    let bin = workspace_binary(
        "trellis-transformer-celerity",
        &format!("trellis-transformer-{NAME}"),
        "TRELLIS_TEST_CELERITY",
    );
    let root = TempDir::new("transformer");
    let dir = root.join("plugins");
    std::fs::create_dir_all(&dir).expect("dir");
    std::os::unix::fs::symlink(&bin, dir.join(format!("trellis-transformer-{NAME}")))
        .expect("link");
    let host = PluginHost::new(config(&root, &dir));
    assert_eq!(host.plugins()[0].kind, PluginKind::Transformer);

    let m = host.manifest(NAME).await.expect("manifest");
    assert!(
        m.abstract_resource_types
            .iter()
            .any(|r| r.r#type == "celerity/handler"),
        "{m:?}"
    );
    let t = host.transformer(NAME).expect("discovered");
    let blueprint = serde_json::json!({
        "version": "2023-04-20",
        "transform": NAME,
        "resources": {
            "orders": {
                "type": "celerity/handler",
                "spec": {
                    "codeLocation": "./orders",
                    "handler": "orders.handler",
                    "runtime": "python3.12"
                }
            }
        }
    });
    let resp = t
        .transform(blueprint.to_string(), &CallOptions::default())
        .await
        .expect("transform");
    assert!(resp.error.is_none(), "{:?}", resp.error);
    let out: serde_json::Value =
        serde_json::from_str(&resp.blueprint_json).expect("JSON blueprint");
    let ty = &out["resources"]["orders"]["type"];
    assert!(
        ty.as_str().is_some_and(|t| !t.starts_with("celerity/")),
        "not expanded: {out}"
    );
    assert!(
        resp.derivations
            .iter()
            .any(|d| d.abstract_resource == "orders"),
        "{:?}",
        resp.derivations
    );
    let pid = t.pid().expect("running");
    host.shutdown().await;
    assert!(has_exited(pid));
    assert!(entries(&root.join("run")).is_empty());
}
