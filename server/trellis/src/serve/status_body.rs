//! How a gRPC call ended, seen from its response: the status a trailers-only response (an
//! error before any message) carries in its headers, else the one in its trailers, or none
//! when the body ends without trailers or is dropped first (the client went away). The
//! request log line ([`super::trace`]) and the RPC counters ([`super::metrics`]) both hear it
//! from [`StatusBody`].

use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::body::{Body, Frame, SizeHint};
use tonic::codegen::http;

/// How a call ended.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Ending {
    /// A `grpc-status` value (one that is not a number reads as UNKNOWN, as a client takes it).
    Status(i32),
    /// The body ended without trailers, or failed.
    NoStatus,
    /// The body was dropped before its end.
    Abandoned,
}

impl Ending {
    /// The canonical name: `OK`, `NOT_FOUND`, …; `UNKNOWN` without a status, `CANCELLED` when
    /// abandoned.
    pub(crate) fn code_name(self) -> &'static str {
        match self {
            Ending::Status(code) => code_name(code),
            Ending::NoStatus => "UNKNOWN",
            Ending::Abandoned => "CANCELLED",
        }
    }
}

/// Told once how the call ended.
pub(crate) trait OnEnd {
    fn ended(self, how: Ending);
}

/// A response body that tells its observer how the call ended, as soon as it is known.
pub(crate) struct StatusBody<B, O: OnEnd> {
    inner: B,
    observer: Option<O>,
}

impl<B, O: OnEnd> StatusBody<B, O> {
    /// `inner` with `observer` (none: a body that only passes through); told at once when
    /// `headers` already carry the status.
    pub(crate) fn new(inner: B, headers: &http::HeaderMap, observer: Option<O>) -> Self {
        let mut body = StatusBody { inner, observer };
        if let Some(value) = headers.get("grpc-status") {
            body.end(Ending::Status(status_of(value)));
        }
        body
    }

    fn end(&mut self, how: Ending) {
        if let Some(observer) = self.observer.take() {
            observer.ended(how);
        }
    }

    /// The observer, until it is told.
    #[cfg(test)]
    pub(crate) fn observer(&self) -> Option<&O> {
        self.observer.as_ref()
    }
}

impl<B, O: OnEnd> Drop for StatusBody<B, O> {
    fn drop(&mut self) {
        self.end(Ending::Abandoned);
    }
}

impl<B: Body + Unpin, O: OnEnd + Unpin> Body for StatusBody<B, O> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(trailers) = frame.trailers_ref() {
                    let code = trailers.get("grpc-status").map_or(UNKNOWN, status_of);
                    this.end(Ending::Status(code));
                }
            }
            Poll::Ready(Some(Err(_)) | None) => this.end(Ending::NoStatus),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

const UNKNOWN: i32 = 2;

fn status_of(value: &http::HeaderValue) -> i32 {
    value
        .to_str()
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(UNKNOWN)
}

/// The canonical name of a gRPC status code, as logs and metrics print it.
fn code_name(code: i32) -> &'static str {
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

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::body::Bytes;
    use std::convert::Infallible;
    use std::sync::{Arc, Mutex};

    /// Keeps what it is told.
    #[derive(Clone, Default)]
    struct Told(Arc<Mutex<Vec<Ending>>>);

    impl OnEnd for Told {
        fn ended(self, how: Ending) {
            self.0.lock().unwrap().push(how);
        }
    }

    impl Told {
        fn all(&self) -> Vec<Ending> {
            self.0.lock().unwrap().clone()
        }
    }

    /// Frames, then the end.
    struct Frames(Vec<Frame<Bytes>>);

    impl Body for Frames {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            let frames = &mut self.get_mut().0;
            Poll::Ready((!frames.is_empty()).then(|| Ok(frames.remove(0))))
        }
    }

    fn message() -> Frame<Bytes> {
        Frame::data(Bytes::from_static(b"message"))
    }

    fn trailers(status: Option<&'static str>) -> Frame<Bytes> {
        let mut map = http::HeaderMap::new();
        if let Some(s) = status {
            map.insert("grpc-status", http::HeaderValue::from_static(s));
        }
        Frame::trailers(map)
    }

    /// Reads `frames` through a [`StatusBody`] (after `headers`) to the end, then drops it: what
    /// the observer was told.
    async fn read(
        frames: Vec<Frame<Bytes>>,
        headers: &[(&'static str, &'static str)],
    ) -> Vec<Ending> {
        let mut map = http::HeaderMap::new();
        for (k, v) in headers {
            map.insert(*k, http::HeaderValue::from_static(v));
        }
        let told = Told::default();
        let mut body = StatusBody::new(Frames(frames), &map, Some(told.clone()));
        while std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx))
            .await
            .is_some()
        {}
        drop(body);
        told.all()
    }

    #[tokio::test]
    async fn the_status_comes_from_the_trailers_or_the_headers_once() {
        let ok = read(vec![message(), trailers(Some("0"))], &[]).await;
        assert_eq!(ok, [Ending::Status(0)]);
        let headers_only = read(vec![], &[("grpc-status", "7")]).await;
        assert_eq!(headers_only, [Ending::Status(7)]);
        let unreadable = read(vec![trailers(Some("x"))], &[]).await;
        assert_eq!(unreadable, [Ending::Status(UNKNOWN)]);
        let no_status_in_trailers = read(vec![trailers(None)], &[]).await;
        assert_eq!(no_status_in_trailers, [Ending::Status(UNKNOWN)]);
        let no_trailers = read(vec![message()], &[]).await;
        assert_eq!(no_trailers, [Ending::NoStatus]);
    }

    #[test]
    fn a_body_dropped_before_its_end_is_abandoned() {
        let told = Told::default();
        let body = StatusBody::new(
            Frames(vec![message(), trailers(Some("0"))]),
            &http::HeaderMap::new(),
            Some(told.clone()),
        );
        assert!(told.all().is_empty());
        drop(body);
        assert_eq!(told.all(), [Ending::Abandoned]);
    }

    #[test]
    fn codes_are_named() {
        assert_eq!(Ending::Status(0).code_name(), "OK");
        assert_eq!(Ending::Status(5).code_name(), "NOT_FOUND");
        assert_eq!(Ending::Status(7).code_name(), "PERMISSION_DENIED");
        assert_eq!(Ending::Status(16).code_name(), "UNAUTHENTICATED");
        assert_eq!(Ending::Status(99).code_name(), "UNKNOWN");
        assert_eq!(Ending::NoStatus.code_name(), "UNKNOWN");
        assert_eq!(Ending::Abandoned.code_name(), "CANCELLED");
    }
}
