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

use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Instant;

use hyper::body::{Body, Frame, SizeHint};
use tonic::codegen::http;
use tracing::Instrument;

use super::conns::BoxFuture;

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
    type Response = http::Response<LoggedBody<RB>>;
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
                Ok(call.await?.map(|inner| LoggedBody { inner, end: None }))
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
                        let mut end = RequestEnd {
                            method,
                            request_id,
                            notes,
                            started,
                            code: None,
                        };
                        let mut response = match call.await {
                            Ok(r) => r,
                            Err(e) => {
                                end.code = Some(Code::TransportError);
                                return Err(e);
                            }
                        };
                        // A trailers-only response (an error before any message) has its status
                        // in the headers; other responses in the trailers, seen by the body.
                        end.code = grpc_status(response.headers()).map(Code::Grpc);
                        response.headers_mut().insert(REQUEST_ID_HEADER, id);
                        Ok(response.map(|inner| LoggedBody {
                            inner,
                            end: Some(end),
                        }))
                    }),
                )
                .instrument(span),
        )
    }
}

/// How a request ended, as far as the engine saw it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Code {
    Grpc(i32),
    /// The server failed before it had a response.
    TransportError,
}

/// What the request's line says, written when the response body is dropped.
#[derive(Debug)]
struct RequestEnd {
    method: String,
    request_id: String,
    notes: Arc<Notes>,
    started: Instant,
    code: Option<Code>,
}

impl RequestEnd {
    /// The line's code, caller and instance as they stand.
    fn summary(&self) -> (&'static str, &str, &str) {
        // Without a status the response never finished: the client went away first.
        let code = match self.code {
            Some(Code::Grpc(c)) => code_name(c),
            Some(Code::TransportError) => "TRANSPORT_ERROR",
            None => "CANCELLED",
        };
        let caller = self.notes.caller.get().map_or("-", String::as_str);
        let instance = self.notes.instance.get().map_or("-", String::as_str);
        (code, caller, instance)
    }
}

impl Drop for RequestEnd {
    fn drop(&mut self) {
        let (code, caller, instance) = self.summary();
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

/// A response body that watches for the gRPC status in the trailers and writes the request's
/// line once the response is over (or abandoned).
pub(crate) struct LoggedBody<B> {
    inner: B,
    end: Option<RequestEnd>,
}

impl<B: Body + Unpin> Body for LoggedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let frame = Pin::new(&mut this.inner).poll_frame(cx);
        if let (Poll::Ready(Some(Ok(f))), Some(end)) = (&frame, this.end.as_mut())
            && let Some(code) = f.trailers_ref().and_then(grpc_status)
        {
            end.code = Some(Code::Grpc(code));
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

fn grpc_status(headers: &http::HeaderMap) -> Option<i32> {
    headers.get("grpc-status")?.to_str().ok()?.parse().ok()
}

/// The canonical name of a gRPC status code (`OK`, `NOT_FOUND`, …), as logs and metrics print it.
pub(crate) fn code_name(code: i32) -> &'static str {
    const NAMES: [&str; 17] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    usize::try_from(code)
        .ok()
        .and_then(|i| NAMES.get(i))
        .copied()
        .unwrap_or("UNKNOWN")
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

    async fn answer(req: http::Request<()>) -> http::Response<LoggedBody<()>> {
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

    /// One message, then the trailers with `grpc-status`, as tonic ends a unary response.
    struct Unary(Vec<Frame<hyper::body::Bytes>>);

    impl Body for Unary {
        type Data = hyper::body::Bytes;
        type Error = Infallible;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<hyper::body::Bytes>, Infallible>>> {
            let frames = &mut self.get_mut().0;
            Poll::Ready((!frames.is_empty()).then(|| Ok(frames.remove(0))))
        }
    }

    fn unary(status: &str) -> Unary {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", status.parse().unwrap());
        Unary(vec![
            Frame::data(hyper::body::Bytes::from_static(b"message")),
            Frame::trailers(trailers),
        ])
    }

    /// A service that notes its caller (as the auth layer does) and its instance (as a
    /// handler does), then answers with `body`.
    async fn call_noting<RB: Send + 'static>(body: RB) -> http::Response<LoggedBody<RB>> {
        let mut body = Some(body);
        let service = tower::service_fn(move |_: http::Request<()>| {
            note_caller("ci-bot");
            let body = body.take().unwrap();
            async move {
                note_instance("team-a/app");
                Ok::<_, Infallible>(http::Response::new(body))
            }
        });
        TraceLayer
            .layer(service)
            .oneshot(request(Some("ci-run-7")))
            .await
            .unwrap()
    }

    /// What the request's line will say (the e2e test `logs_e2e` reads the lines themselves:
    /// a log capture here would race with the other tests' callsites).
    fn summary<B>(r: &http::Response<LoggedBody<B>>) -> (String, String, String) {
        let (code, caller, instance) = r.body().end.as_ref().unwrap().summary();
        (code.to_owned(), caller.to_owned(), instance.to_owned())
    }

    #[tokio::test]
    async fn the_line_has_the_caller_the_instance_and_the_code_of_the_trailers() {
        let mut response = call_noting(unary("5")).await;
        assert_eq!(summary(&response).0, "CANCELLED", "no status seen yet");
        while let Some(frame) =
            std::future::poll_fn(|cx| Pin::new(response.body_mut()).poll_frame(cx)).await
        {
            frame.unwrap();
        }
        assert_eq!(
            summary(&response),
            ("NOT_FOUND".into(), "ci-bot".into(), "team-a/app".into())
        );
        assert_eq!(id_of(&response), "ci-run-7");
    }

    #[tokio::test]
    async fn a_trailers_only_error_has_its_code_in_the_headers() {
        let service = tower::service_fn(|_: http::Request<()>| async {
            Ok::<_, Infallible>(tonic::Status::permission_denied("no").into_http::<()>())
        });
        let response = TraceLayer
            .layer(service)
            .oneshot(request(None))
            .await
            .unwrap();
        assert_eq!(
            summary(&response),
            ("PERMISSION_DENIED".into(), "-".into(), "-".into())
        );
    }

    #[test]
    fn code_names() {
        assert_eq!(code_name(0), "OK");
        assert_eq!(code_name(7), "PERMISSION_DENIED");
        assert_eq!(code_name(16), "UNAUTHENTICATED");
        assert_eq!(code_name(99), "UNKNOWN");
    }
}
