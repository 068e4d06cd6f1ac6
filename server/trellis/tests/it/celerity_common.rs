//! What the celerity end-to-end tests share: an engine whose plugins are the celerity
//! transformer and the `aws` provider (calling moto), and boto3 checks run as one python
//! process per phase (one per call would dominate these tests' time).

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::aws_moto::Moto;
use crate::engine_common::{Engine, plugin_dir};
use crate::plugins_common::workspace_binary;

/// The aws engine of `aws_e2e`, with the celerity transformer among its plugins.
pub(crate) fn engine(root: &Path, m: &Moto) -> Engine {
    let link = plugin_dir(root).join("trellis-transformer-celerity-2023-04-20");
    if !link.exists() {
        let bin = workspace_binary(
            "trellis-transformer-celerity",
            "trellis-transformer-celerity-2023-04-20",
            "TRELLIS_TEST_CELERITY",
        );
        std::os::unix::fs::symlink(bin, link).expect("link the celerity transformer");
    }
    crate::aws_e2e::engine(root, m)
}

/// Runs a boto3 script against moto. The script sees `args` (the JSON given; also as
/// `names`), `client(service)`, `call(service, operation, **params)` (the response without
/// its metadata, or `{"Error": code}`) and `gone(f)` (whether `f()` raises a client error);
/// it fills `out`, which comes back as JSON.
pub(crate) fn boto_script(m: &Moto, args: &Value, body: &str) -> Value {
    let script = format!(
        r#"import json, sys
import boto3, botocore.exceptions
endpoint, args = sys.argv[1], json.loads(sys.argv[2])
names = args
clients = {{}}
def client(service):
    if service not in clients:
        clients[service] = boto3.client(service, endpoint_url=endpoint, region_name="us-east-1",
                                        aws_access_key_id="testing", aws_secret_access_key="testing")
    return clients[service]
def call(service, operation, **params):
    try:
        r = getattr(client(service), operation)(**params)
    except botocore.exceptions.ClientError as e:
        return {{"Error": e.response.get("Error", {{}}).get("Code", "?")}}
    r.pop("ResponseMetadata", None)
    return r
def gone(f):
    try:
        f()
        return False
    except botocore.exceptions.ClientError:
        return True
out = {{}}
{body}
print(json.dumps(out, default=str))
"#
    );
    let run = Command::new("python3")
        .args(["-c", &script, &m.endpoint, &args.to_string()])
        .output()
        .expect("python3 runs");
    assert!(
        run.status.success(),
        "boto script failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    serde_json::from_slice(&run.stdout).expect("the script prints JSON")
}
