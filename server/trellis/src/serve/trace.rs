//! A span per engine API request, so that every log line a request causes carries its method
//! and request id, and the caller can find them.
//!
//! The request id is the caller's `x-request-id` header when it sends a usable one (the CLI
//! sends its operation's `request_id`), else a fresh `req_…` id; either way it comes back in
//! the response's `x-request-id` header. The span covers the handler, not a streaming
//! response's later messages (a watch outlives its request).

use std::task::{Context, Poll};
use std::time::Instant;

use tonic::codegen::http;
use tracing::Instrument;

use super::conns::BoxFuture;

pub(crate) const REQUEST_ID_HEADER: &str = "x-request-id";

/// The engine API's methods (`/trellis.engine.v1.Engine/GetInstance`, …).
const ENGINE_PATH: &str = "/trellis.engine.v1.Engine/";

/// The longest caller-chosen id kept; a longer one (or one with control characters) is
/// replaced, so a caller cannot flood or forge log lines through it.
const MAX_ID_LEN: usize = 128;

#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TraceLayer;

impl<S> tower::Layer<S> for TraceLayer {
    type Service = Trace<S>;

    fn layer(&self, inner: S) -> Trace<S> {
        Trace(inner)
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Trace<S>(S);

impl<S, B, RB> tower::Service<http::Request<B>> for Trace<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        // Health checks and reflection are not engine requests: no span, no id.
        if !req.uri().path().starts_with(ENGINE_PATH) {
            return Box::pin(self.0.call(req));
        }
        let id = request_id(req.headers());
        let span = tracing::info_span!(
            "request",
            method = %req.uri().path(),
            request_id = id.to_str().unwrap_or_default(),
        );
        let started = Instant::now();
        let call = span.in_scope(|| self.0.call(req));
        Box::pin(
            async move {
                let mut response = call.await?;
                tracing::debug!(
                    grpc_status = response
                        .headers()
                        .get("grpc-status")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("0"),
                    ms = started.elapsed().as_millis() as u64,
                    "request answered"
                );
                response.headers_mut().insert(REQUEST_ID_HEADER, id);
                Ok(response)
            }
            .instrument(span),
        )
    }
}

/// The caller's id when it is short printable ASCII without spaces, else a fresh one.
fn request_id(headers: &http::HeaderMap) -> http::HeaderValue {
    headers
        .get(REQUEST_ID_HEADER)
        .filter(|v| !v.is_empty() && v.len() <= MAX_ID_LEN)
        .filter(|v| v.as_bytes().iter().all(u8::is_ascii_graphic))
        .cloned()
        .unwrap_or_else(|| {
            http::HeaderValue::try_from(trellis_ids::new_id("req")).expect("a new id is ASCII hex")
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use tower::{Layer, ServiceExt};

    async fn answer(req: http::Request<()>) -> http::Response<()> {
        let echo = tower::service_fn(|_: http::Request<()>| async {
            Ok::<_, Infallible>(http::Response::new(()))
        });
        TraceLayer.layer(echo).oneshot(req).await.unwrap()
    }

    fn request(id: Option<&str>) -> http::Request<()> {
        let mut b = http::Request::builder().uri("/trellis.engine.v1.Engine/GetInstance");
        if let Some(id) = id {
            b = b.header(REQUEST_ID_HEADER, id);
        }
        b.body(()).unwrap()
    }

    fn id_of(r: &http::Response<()>) -> String {
        r.headers()[REQUEST_ID_HEADER].to_str().unwrap().to_owned()
    }

    #[tokio::test]
    async fn only_engine_requests_are_traced() {
        let health = http::Request::builder()
            .uri("/grpc.health.v1.Health/Check")
            .body(())
            .unwrap();
        assert!(
            answer(health)
                .await
                .headers()
                .get(REQUEST_ID_HEADER)
                .is_none()
        );
    }

    #[tokio::test]
    async fn the_callers_id_comes_back() {
        assert_eq!(
            id_of(&answer(request(Some("ci-run-42"))).await),
            "ci-run-42"
        );
    }

    #[tokio::test]
    async fn a_missing_or_unusable_id_is_replaced_by_a_fresh_one() {
        let long = "x".repeat(MAX_ID_LEN + 1);
        for id in [None, Some(""), Some("two words"), Some(long.as_str())] {
            let got = id_of(&answer(request(id)).await);
            assert!(got.starts_with("req_"), "{id:?} gave {got}");
        }
        let a = id_of(&answer(request(None)).await);
        let b = id_of(&answer(request(None)).await);
        assert_ne!(a, b);
    }
}
