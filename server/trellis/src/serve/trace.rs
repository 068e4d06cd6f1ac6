//! A span and a log line per engine API request.
//!
//! Every log line a request causes carries its method and request id (the span), and when the
//! request is over one line says what happened: method, caller, instance, request id, gRPC
//! code and duration (target `trellis::rpc`, docs/serve.md "Logs"). The caller is noted by the
//! auth layer, the instance by the handler once it knows it ([`note_caller`],
//! [`note_instance`]); both go into the span too, so the engine's own lines name them.
//!
//! The request id is the caller's `x-request-id` header when it sends a usable one (the CLI
//! sends its operation's `request_id`), else a fresh `req_…` id; either way it comes back in
//! the response's `x-request-id` header. The request is over when its response body is: a
//! watch stream's line comes when the stream ends.

use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Instant;

use tonic::codegen::http;
use tracing::Instrument;

use super::conns::BoxFuture;
use super::status_body::{Ending, OnEnd, StatusBody};

pub(crate) const REQUEST_ID_HEADER: &str = "x-request-id";

/// The engine API's methods (`/trellis.engine.v1.Engine/GetInstance`, …).
const ENGINE_PATH: &str = "/trellis.engine.v1.Engine/";

/// The longest caller-chosen id kept; a longer one (or one with control characters) is
/// replaced, so a caller cannot flood or forge log lines through it.
const MAX_ID_LEN: usize = 128;

/// What the layers and the handler learn about a request while it runs.
#[derive(Debug, Default)]
struct Notes {
    caller: OnceLock<String>,
    instance: OnceLock<String>,
}

tokio::task_local! {
    /// The running request's notes: the handler runs inside the request's task.
    static NOTES: Arc<Notes>;
}

/// The token name the request was authenticated with.
pub(crate) fn note_caller(name: &str) {
    let _ = NOTES.try_with(|n| n.caller.set(name.to_owned()));
    tracing::Span::current().record("caller", name);
}

/// The instance the request is about (the first one named, for requests naming several).
pub(crate) fn note_instance(name: &str) {
    let _ = NOTES.try_with(|n| n.instance.set(name.to_owned()));
    tracing::Span::current().record("instance", name);
}

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
    type Response = http::Response<StatusBody<RB, RequestEnd>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        // Health checks and reflection are not engine requests: no span, no id, no line.
        if !req.uri().path().starts_with(ENGINE_PATH) {
            let call = self.0.call(req);
            return Box::pin(async move {
                let response = call.await?;
                let (parts, inner) = response.into_parts();
                let body = StatusBody::new(inner, &parts.headers, None);
                Ok(http::Response::from_parts(parts, body))
            });
        }
        let id = request_id(req.headers());
        let method = req.uri().path()[ENGINE_PATH.len()..].to_owned();
        let span = tracing::info_span!(
            "request",
            method = %method,
            request_id = id.to_str().unwrap_or_default(),
            caller = tracing::field::Empty,
            instance = tracing::field::Empty,
        );
        let notes = Arc::new(Notes::default());
        let started = Instant::now();
        // The auth layer decides inside `call`, the handler inside the future: both see the notes.
        let call = span.in_scope(|| NOTES.sync_scope(notes.clone(), || self.0.call(req)));
        let request_id = id.to_str().unwrap_or_default().to_owned();
        let engine_request_id = request_id.clone();
        Box::pin(
            NOTES
                .scope(
                    notes.clone(),
                    crate::engine::serving_request(engine_request_id, async move {
                        let end = RequestEnd {
                            method,
                            request_id,
                            notes,
                            started,
                        };
                        let response = match call.await {
                            Ok(r) => r,
                            Err(e) => {
                                end.log("TRANSPORT_ERROR");
                                return Err(e);
                            }
                        };
                        let (mut parts, inner) = response.into_parts();
                        parts.headers.insert(REQUEST_ID_HEADER, id);
                        let body = StatusBody::new(inner, &parts.headers, Some(end));
                        Ok(http::Response::from_parts(parts, body))
                    }),
                )
                .instrument(span),
        )
    }
}

/// What the request's line says, written once the call's status is known.
#[derive(Debug)]
pub(crate) struct RequestEnd {
    method: String,
    request_id: String,
    notes: Arc<Notes>,
    started: Instant,
}

impl RequestEnd {
    /// The caller and the instance, as noted so far.
    fn who(&self) -> (&str, &str) {
        let caller = self.notes.caller.get().map_or("-", String::as_str);
        let instance = self.notes.instance.get().map_or("-", String::as_str);
        (caller, instance)
    }

    fn log(self, code: &'static str) {
        let (caller, instance) = self.who();
        let ms = self.started.elapsed().as_millis() as u64;
        // The engine's own failures stand out; a caller's mistakes are routine.
        if matches!(
            code,
            "INTERNAL" | "UNKNOWN" | "DATA_LOSS" | "TRANSPORT_ERROR"
        ) {
            tracing::warn!(target: "trellis::rpc", method = %self.method, caller, instance,
                request_id = %self.request_id, code, ms, "request");
        } else {
            tracing::info!(target: "trellis::rpc", method = %self.method, caller, instance,
                request_id = %self.request_id, code, ms, "request");
        }
    }
}

impl OnEnd for RequestEnd {
    fn ended(self, how: Ending) {
        self.log(how.code_name());
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

    async fn answer(req: http::Request<()>) -> http::Response<StatusBody<(), RequestEnd>> {
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

    fn id_of<B>(r: &http::Response<B>) -> String {
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

    /// A service that notes its caller (as the auth layer does) and its instance (as a
    /// handler does).
    async fn call_noting() -> http::Response<StatusBody<(), RequestEnd>> {
        let service = tower::service_fn(move |_: http::Request<()>| {
            note_caller("ci-bot");
            async move {
                note_instance("team-a/app");
                Ok::<_, Infallible>(http::Response::new(()))
            }
        });
        TraceLayer
            .layer(service)
            .oneshot(request(Some("ci-run-7")))
            .await
            .unwrap()
    }

    /// How the call ends (and so the line's code) is `StatusBody`'s, tested there; the e2e test
    /// `logs_e2e` reads the lines themselves (a log capture here would race with the other
    /// tests' callsites).
    #[tokio::test]
    async fn the_line_names_the_caller_and_the_instance_noted_while_serving() {
        let response = call_noting().await;
        let end = response.body().observer().expect("not ended yet");
        assert_eq!(end.who(), ("ci-bot", "team-a/app"));
        assert_eq!(end.method, "GetInstance");
        assert_eq!(end.request_id, "ci-run-7");
        assert_eq!(id_of(&response), "ci-run-7");
    }

    #[tokio::test]
    async fn health_requests_get_no_line() {
        let health = http::Request::builder()
            .uri("/grpc.health.v1.Health/Check")
            .body(())
            .unwrap();
        assert!(answer(health).await.body().observer().is_none());
    }
}
