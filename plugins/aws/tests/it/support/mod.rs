//! The provider's tests: moto ([`moto`]) and the provider behind its real gRPC services.

#![allow(dead_code, unreachable_pub)]

pub mod moto;

pub use moto::{Moto, boto, moto, unique};
use trellis_plugin_sdk::testing::Harness;
use trellis_plugin_sdk::{ResourceState, Value};
use trellis_provider_aws::AwsProvider;

/// The provider config that points every service at `moto`.
pub fn config(moto: &Moto) -> Value {
    Value::map()
        .with("region", "us-east-1")
        .with("endpoint", moto.endpoint.as_str())
}

/// The provider in this process, behind its real gRPC services, configured for moto.
pub async fn harness(moto: &Moto) -> Harness {
    Harness::provider(AwsProvider::default())
        .await
        .expect("harness")
        .with_config(config(moto))
}

/// A queue made outside the provider (boto3): its URL and its ARN.
pub fn outside_queue(m: &Moto, name: &str) -> (String, String) {
    outside_queue_as(m, serde_json::json!({"QueueName": name}))
}

/// A queue made outside the provider by `create_queue` with these parameters: its URL and ARN.
pub fn outside_queue_as(m: &Moto, create: serde_json::Value) -> (String, String) {
    let url = boto(m, "sqs", "create_queue", create).expect("queue")["QueueUrl"]
        .as_str()
        .expect("url")
        .to_owned();
    let arn = boto(
        m,
        "sqs",
        "get_queue_attributes",
        serde_json::json!({"QueueUrl": url, "AttributeNames": ["QueueArn"]}),
    )
    .expect("attributes")["Attributes"]["QueueArn"]
        .as_str()
        .expect("arn")
        .to_owned();
    (url, arn)
}

/// A resource as the engine would send it for update, read or destroy.
pub fn current(ty: &str, name: &str, applied: &ResourceState, spec: Value) -> ResourceState {
    ResourceState {
        resource_type: ty.to_owned(),
        name: name.to_owned(),
        external_id: applied.external_id.clone(),
        spec,
        state: applied.state.clone(),
    }
}
