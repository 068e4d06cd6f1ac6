//! gRPC reflection on a real `trellis serve`: both protocol versions (grpcurl asks v1,
//! grpcio-reflection and many other tools v1alpha) list exactly the services the engine
//! answers, not the plugin protocol's services that share its descriptor set.

use crate::engine_common::{Engine, runtime};
use crate::plugins_common::TempDir;

const SERVED: [&str; 4] = [
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
    "trellis.engine.v1.Engine",
];

async fn channel(addr: &str) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// The services reflection version `$v` lists (v1 and v1alpha are the same messages in two
/// packages).
macro_rules! list_services {
    ($v:ident, $addr:expr) => {{
        use tonic_reflection::pb::$v::ServerReflectionRequest;
        use tonic_reflection::pb::$v::server_reflection_client::ServerReflectionClient;
        use tonic_reflection::pb::$v::server_reflection_request::MessageRequest;
        use tonic_reflection::pb::$v::server_reflection_response::MessageResponse;

        let request = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut answers = ServerReflectionClient::new(channel($addr).await)
            .server_reflection_info(tokio_stream::iter([request]))
            .await
            .unwrap()
            .into_inner();
        match answers.message().await.unwrap().map(|a| a.message_response) {
            Some(Some(MessageResponse::ListServicesResponse(list))) => list
                .service
                .into_iter()
                .map(|s| s.name)
                .collect::<Vec<String>>(),
            other => panic!("{other:?}"),
        }
    }};
}

async fn list_v1(addr: &str) -> Vec<String> {
    list_services!(v1, addr)
}

async fn list_v1alpha(addr: &str) -> Vec<String> {
    list_services!(v1alpha, addr)
}

/// Asks v1alpha for the file defining `symbol`; true when it is found.
async fn v1alpha_resolves(addr: &str, symbol: &str) -> bool {
    use tonic_reflection::pb::v1alpha::ServerReflectionRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse;

    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::FileContainingSymbol(symbol.to_owned())),
    };
    let mut answers = ServerReflectionClient::new(channel(addr).await)
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    match answers.message().await.unwrap().map(|a| a.message_response) {
        Some(Some(MessageResponse::FileDescriptorResponse(files))) => {
            !files.file_descriptor_proto.is_empty()
        }
        Some(Some(MessageResponse::ErrorResponse(_))) => false,
        other => panic!("{other:?}"),
    }
}

#[test]
fn both_reflection_versions_list_exactly_the_served_services() {
    let root = TempDir::new("reflect-both");
    let engine = Engine::start(root.path());
    let addr = engine.addr.clone();
    let (v1, v1alpha, health, engine_api) = runtime().block_on(async move {
        let mut v1 = list_v1(&addr).await;
        let mut v1alpha = list_v1alpha(&addr).await;
        v1.sort();
        v1alpha.sort();
        (
            v1,
            v1alpha,
            v1alpha_resolves(&addr, "grpc.health.v1.Health").await,
            v1alpha_resolves(&addr, "trellis.engine.v1.Engine").await,
        )
    });
    assert_eq!(v1, SERVED, "v1");
    assert_eq!(v1alpha, SERVED, "v1alpha");
    // A listed service can be described too, so tools can call it.
    assert!(health && engine_api, "health {health}, engine {engine_api}");
}
