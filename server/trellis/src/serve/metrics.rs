//! Prometheus metrics (`--metrics-listen ADDR`): `GET http://ADDR/metrics` answers the
//! OpenMetrics text of every crate's metrics (state store, plugin host, engine) and of the
//! engine API's own: RPCs by method and gRPC code, and the watch streams open. docs/serve.md
//! ("Metrics") lists them; docs/decisions/0009-metrics.md says why prometheus-client.
//!
//! Labels are bounded: an RPC's method is one the server serves (else `other`, so a client
//! cannot grow the label set with made-up paths), and no label carries an instance name.

use std::collections::HashSet;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::Bytes;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use prost::Message;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tonic::codegen::http;

use super::conns::BoxFuture;
use super::status_body::{Ending, OnEnd, StatusBody};

/// The label of a request for a path the server does not serve.
const OTHER: &str = "other";

/// Services the server runs besides those of the descriptor set (health, reflection).
const OTHER_METHODS: [&str; 4] = [
    "/grpc.health.v1.Health/Check",
    "/grpc.health.v1.Health/Watch",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
];

/// Scrapers served at once; more wait for a slot.
const MAX_CONNECTIONS: usize = 16;
/// A scraper must send its request headers within this.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Every RPC path of the Trellis protocols and of health and reflection.
static METHODS: LazyLock<HashSet<String>> = LazyLock::new(|| {
    let mut methods: HashSet<String> = OTHER_METHODS.iter().map(|m| (*m).to_owned()).collect();
    // Built into the binary, so it decodes; were it not to, every method would be `other`.
    if let Ok(set) = prost_types::FileDescriptorSet::decode(trellis_proto::FILE_DESCRIPTOR_SET) {
        for file in &set.file {
            for service in &file.service {
                for method in &service.method {
                    methods.insert(format!(
                        "/{}.{}/{}",
                        file.package(),
                        service.name(),
                        method.name()
                    ));
                }
            }
        }
    }
    methods
});

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcLabels {
    method: &'static str,
    code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabel {
    method: &'static str,
}

static RPCS: LazyLock<Family<RpcLabels, Counter>> = LazyLock::new(Family::default);

type HistogramMaker = fn() -> Histogram;

/// From 0.5 ms to about 90 s.
static RPC_SECONDS: LazyLock<Family<MethodLabel, Histogram, HistogramMaker>> =
    LazyLock::new(|| {
        Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.0005, 3.0, 12)))
    });

static WATCHES_OPEN: LazyLock<Gauge> = LazyLock::new(Gauge::default);

/// The method label of a request path: the path, or `other` for one the server does not serve.
fn method_label(path: &str) -> &'static str {
    METHODS.get(path).map_or(OTHER, String::as_str)
}

fn count_rpc(method: &'static str, code: &'static str) {
    RPCS.get_or_create(&RpcLabels { method, code }).inc();
}

/// Counts each RPC by method and gRPC code, and times it to its response headers (the
/// handler's work; a stream's later messages are not included).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct RpcMetricsLayer;

impl<S> tower::Layer<S> for RpcMetricsLayer {
    type Service = RpcMetrics<S>;

    fn layer(&self, inner: S) -> RpcMetrics<S> {
        RpcMetrics(inner)
    }
}

#[derive(Clone, Debug)]
pub(super) struct RpcMetrics<S>(S);

impl<S, B, RB> tower::Service<http::Request<B>> for RpcMetrics<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<StatusBody<RB, CountRpc>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let method = method_label(req.uri().path());
        let started = Instant::now();
        let call = self.0.call(req);
        Box::pin(async move {
            let response = call.await?;
            RPC_SECONDS
                .get_or_create(&MethodLabel { method })
                .observe(started.elapsed().as_secs_f64());
            let (parts, inner) = response.into_parts();
            let body = StatusBody::new(inner, &parts.headers, Some(CountRpc(method)));
            Ok(http::Response::from_parts(parts, body))
        })
    }
}

/// Counts its RPC once the call's status is known (`UNKNOWN` when it ended without one,
/// `CANCELLED` when the client went away first).
pub(super) struct CountRpc(&'static str);

impl OnEnd for CountRpc {
    fn ended(self, how: Ending) {
        count_rpc(self.0, how.code_name());
    }
}

/// A watch stream open: counted from [`watch_opened`] until dropped.
pub(super) struct WatchOpen(());

pub(super) fn watch_opened() -> WatchOpen {
    WATCHES_OPEN.inc();
    WatchOpen(())
}

impl Drop for WatchOpen {
    fn drop(&mut self) {
        WATCHES_OPEN.dec();
    }
}

/// Every metric of the engine.
fn registry() -> Registry {
    let mut registry = Registry::default();
    crate::state::metrics::register(&mut registry);
    crate::plugins::metrics::register(&mut registry);
    crate::engine::metrics::register(&mut registry);
    registry.register(
        "trellis_rpcs",
        "Engine API requests (and health and reflection), by method and gRPC status code",
        RPCS.clone(),
    );
    registry.register(
        "trellis_rpc_duration_seconds",
        "How long requests took until their response headers, by method",
        RPC_SECONDS.clone(),
    );
    registry.register(
        "trellis_watch_streams_open",
        "WatchOperation and WatchInstance streams open now",
        WATCHES_OPEN.clone(),
    );
    registry
}

/// Binds `addr` for [`serve`].
pub(super) async fn bind(addr: SocketAddr) -> Result<TcpListener, String> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr} for metrics (--metrics-listen): {e}"))
}

/// Serves `/metrics` over HTTP/1.1 on `listener` for as long as the runtime runs.
pub(super) fn serve(listener: TcpListener) {
    let registry = Arc::new(registry());
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tokio::spawn(async move {
        loop {
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors, most likely: wait instead of spinning.
                    tracing::warn!(error = %e, "metrics: cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let registry = registry.clone();
            tokio::spawn(async move {
                let _slot = slot;
                let service = hyper::service::service_fn(move |req| {
                    let answer = answer(&registry, &req);
                    async move { Ok::<_, Infallible>(answer) }
                });
                let served = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
                if let Err(e) = served {
                    tracing::debug!(error = %e, "metrics: connection ended with an error");
                }
            });
        }
    });
}

fn answer<B>(registry: &Registry, req: &http::Request<B>) -> http::Response<Full<Bytes>> {
    let reply = |status: http::StatusCode, content_type: &'static str, body: String| {
        let mut response = http::Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(content_type),
        );
        response
    };
    if req.uri().path() != "/metrics" {
        return reply(
            http::StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found: the metrics are at /metrics\n".to_owned(),
        );
    }
    if req.method() != http::Method::GET && req.method() != http::Method::HEAD {
        let mut response = reply(
            http::StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "only GET and HEAD\n".to_owned(),
        );
        response.headers_mut().insert(
            http::header::ALLOW,
            http::HeaderValue::from_static("GET, HEAD"),
        );
        return response;
    }
    let mut text = String::new();
    match prometheus_client::encoding::text::encode(&mut text, registry) {
        Ok(()) => reply(
            http::StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            text,
        ),
        Err(e) => reply(
            http::StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain; charset=utf-8",
            format!("cannot encode the metrics: {e}\n"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Layer, ServiceExt};

    #[test]
    fn methods_are_the_served_ones_or_other() {
        assert_eq!(
            method_label("/trellis.engine.v1.Engine/GetInstance"),
            "/trellis.engine.v1.Engine/GetInstance"
        );
        assert_eq!(
            method_label("/grpc.health.v1.Health/Check"),
            "/grpc.health.v1.Health/Check"
        );
        assert_eq!(method_label("/trellis.engine.v1.Engine/Nope"), OTHER);
        assert_eq!(method_label("/x"), OTHER);
    }

    fn rpcs(method: &'static str, code: &'static str) -> u64 {
        RPCS.get_or_create(&RpcLabels { method, code }).get()
    }

    /// A response whose status comes in the trailers (a successful unary call) is counted when
    /// the trailers are read, one with the status in its headers at once.
    #[tokio::test]
    async fn codes_come_from_the_trailers_or_the_headers() {
        use http_body_util::BodyExt;
        // Methods no other test uses: the counters are process-wide.
        let (ok_path, err_path) = (
            "/trellis.engine.v1.Engine/ListInstances",
            "/trellis.engine.v1.Engine/GetOperation",
        );
        let service = tower::service_fn(|req: http::Request<()>| async move {
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
            let body = http_body_util::StreamBody::new(futures_util::stream::iter([
                Ok::<_, Infallible>(hyper::body::Frame::data(Bytes::from_static(b"m"))),
                Ok(hyper::body::Frame::trailers(trailers)),
            ]));
            let mut response = http::Response::new(body);
            if req.uri().path().ends_with("GetOperation") {
                response
                    .headers_mut()
                    .insert("grpc-status", http::HeaderValue::from_static("5"));
            }
            Ok::<_, Infallible>(response)
        });
        let layered = RpcMetricsLayer.layer(service);
        let request = |path: &str| http::Request::builder().uri(path).body(()).unwrap();

        let response = layered.clone().oneshot(request(ok_path)).await.unwrap();
        assert_eq!(rpcs(ok_path, "OK"), 0, "counted before the trailers came");
        response.into_body().collect().await.unwrap();
        assert_eq!(rpcs(ok_path, "OK"), 1);

        let response = layered.oneshot(request(err_path)).await.unwrap();
        assert_eq!(rpcs(err_path, "NOT_FOUND"), 1);
        drop(response);
        assert_eq!(rpcs(err_path, "NOT_FOUND"), 1);
        assert_eq!(rpcs(err_path, "CANCELLED"), 0, "counted once");
    }

    #[test]
    fn watch_streams_are_counted_while_open() {
        let before = WATCHES_OPEN.get();
        let open = watch_opened();
        assert_eq!(WATCHES_OPEN.get(), before + 1);
        drop(open);
        assert_eq!(WATCHES_OPEN.get(), before);
    }

    #[test]
    fn the_registry_encodes() {
        // A family shows once it has a series.
        drop(RPCS.get_or_create(&RpcLabels {
            method: OTHER,
            code: "UNIMPLEMENTED",
        }));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry()).unwrap();
        assert!(text.contains("# TYPE trellis_rpcs counter"), "{text}");
        assert!(
            text.contains("\ntrellis_rpcs_total{method=\"other\",code=\"UNIMPLEMENTED\"} "),
            "{text}"
        );
        assert!(
            text.contains("# TYPE trellis_watch_streams_open gauge"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
