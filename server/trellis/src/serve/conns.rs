//! Connection hygiene for `trellis serve`: a limit on open connections, an idle timeout and TCP
//! keepalive (HTTP/2 keepalive is tonic's own setting, see `serve`).
//!
//! - **Limit.** [`Limited`] wraps the accepted-connection stream with a semaphore: at the limit
//!   it stops accepting, so new connections wait in the kernel's listen queue until a served one
//!   closes (an idle one is closed by the idle timeout). Connections already open keep working,
//!   and the engine never holds more sockets than the limit, whatever clients do.
//! - **Idle.** A connection is idle while no request on it is in flight; after the idle timeout
//!   of that it is closed ([`Tracked`] ends its reads). A connection that never sends a request
//!   (nor finishes one) counts as idle from its accept. Requests are counted by [`ActivityLayer`]
//!   from the start of a call to the end of its response body, so long plans and open watch
//!   streams keep their connection; keepalive pings do not.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_stream::Stream;
use tokio_util::sync::PollSemaphore;
use tonic::codegen::http;
use tonic::transport::server::Connected;

use super::listen::Conn;

/// What [`Limited`] enforces on each connection.
#[derive(Clone, Copy, Debug)]
pub(super) struct ConnLimits {
    pub max_connections: usize,
    /// `None`: idle connections stay open.
    pub idle_timeout: Option<Duration>,
    /// Idle time before TCP keepalive probes (and between them); `None`: no probes.
    pub tcp_keepalive: Option<Duration>,
}

/// The accepted connections of `inner`, at most `max_connections` open at once, each
/// [`Tracked`].
pub(super) struct Limited<S> {
    inner: S,
    permits: PollSemaphore,
    limits: ConnLimits,
    /// Set while the limit holds accepting back, so the warning is logged once per episode.
    full: bool,
}

impl<S> Limited<S> {
    pub(super) fn new(inner: S, limits: ConnLimits) -> Limited<S> {
        Limited {
            inner,
            permits: PollSemaphore::new(Arc::new(Semaphore::new(limits.max_connections))),
            limits,
            full: false,
        }
    }
}

impl<S> Stream for Limited<S>
where
    S: Stream<Item = io::Result<Conn>> + Unpin,
{
    type Item = io::Result<Tracked>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        // A permit first: without one the listener is not polled, so nothing is accepted.
        let permit = match this.permits.poll_acquire(cx) {
            Poll::Ready(Some(p)) => p,
            // The semaphore is never closed.
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => {
                if !this.full {
                    this.full = true;
                    tracing::warn!(
                        limit = this.limits.max_connections,
                        "connection limit reached: new connections wait until one closes \
                         (--max-connections, --idle-timeout)"
                    );
                }
                return Poll::Pending;
            }
        };
        this.full = false;
        match ready!(Pin::new(&mut this.inner).poll_next(cx)) {
            Some(Ok(conn)) => {
                if let (Conn::Tcp(stream), Some(idle)) = (&conn, this.limits.tcp_keepalive)
                    && let Err(e) = set_tcp_keepalive(stream, idle)
                {
                    tracing::debug!(error = %e, "cannot set TCP keepalive on a connection");
                }
                Poll::Ready(Some(Ok(Tracked::new(
                    conn,
                    permit,
                    this.limits.idle_timeout,
                ))))
            }
            // The permit goes back with `permit` dropped here.
            Some(Err(e)) => Poll::Ready(Some(Err(e))),
            None => Poll::Ready(None),
        }
    }
}

/// `SO_KEEPALIVE` with probes after `idle` without traffic, then every `idle`: a peer that
/// vanished (host down, cable pulled) is noticed even by a connection nobody uses.
fn set_tcp_keepalive(stream: &tokio::net::TcpStream, idle: Duration) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = stream.as_raw_fd();
    let secs = idle.as_secs().clamp(1, i32::MAX as u64) as libc::c_int;
    let set = |level: libc::c_int, name: libc::c_int, value: libc::c_int| {
        // SAFETY: `fd` is an open socket owned by `stream`, and the option value is a c_int
        // whose size is passed along.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    };
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, secs)?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, secs)
}

/// Requests in flight on one connection, and since when it has had none.
#[derive(Debug)]
pub(super) struct Activity {
    in_flight: AtomicUsize,
    idle_since: Mutex<Instant>,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            in_flight: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
        }
    }

    /// When the connection's idle timeout runs out, or `None` while a request is in flight.
    fn idle_deadline(&self, idle: Duration) -> Option<Instant> {
        let since = *self.idle_since.lock().unwrap_or_else(|e| e.into_inner());
        (self.in_flight.load(Ordering::SeqCst) == 0).then(|| since + idle)
    }

    fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(self.clone())
    }
}

/// One request in flight; ends when dropped.
#[derive(Debug)]
pub(super) struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        // The time first: a reader that sees no request in flight then sees when the last ended.
        *self.0.idle_since.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The connect info of a [`Tracked`] connection: its [`Activity`] for [`ActivityLayer`] (tonic
/// puts it in each request's extensions).
#[derive(Clone, Debug)]
pub(super) struct TrackedInfo {
    pub activity: Arc<Activity>,
}

/// An accepted connection that holds a place under the limit until it is dropped, and reads
/// end of file once it has been idle for the idle timeout (the HTTP/2 server then closes it).
pub(super) struct Tracked {
    conn: Conn,
    activity: Arc<Activity>,
    idle: Option<(Duration, Pin<Box<Sleep>>)>,
    _permit: OwnedSemaphorePermit,
}

impl Tracked {
    fn new(conn: Conn, permit: OwnedSemaphorePermit, idle: Option<Duration>) -> Tracked {
        Tracked {
            conn,
            activity: Arc::new(Activity::new()),
            idle: idle.map(|d| (d, Box::pin(tokio::time::sleep(d)))),
            _permit: permit,
        }
    }

    /// Whether the idle timeout has run out; otherwise the timer is armed to wake the reader.
    fn idle_expired(&mut self, cx: &mut Context<'_>) -> bool {
        let Some((idle, sleep)) = &mut self.idle else {
            return false;
        };
        loop {
            if sleep.as_mut().poll(cx).is_pending() {
                return false;
            }
            let now = Instant::now();
            match self.activity.idle_deadline(*idle) {
                Some(deadline) if deadline <= now => return true,
                Some(deadline) => sleep.as_mut().reset(deadline),
                // Busy: look again one timeout later.
                None => sleep.as_mut().reset(now + *idle),
            }
        }
    }
}

impl Connected for Tracked {
    type ConnectInfo = TrackedInfo;

    fn connect_info(&self) -> TrackedInfo {
        TrackedInfo {
            activity: self.activity.clone(),
        }
    }
}

impl AsyncRead for Tracked {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.conn).poll_read(cx, buf) {
            // The server always has a read pending, so the timer is checked while it waits.
            Poll::Pending if this.idle_expired(cx) => {
                tracing::debug!("closing an idle connection");
                // Nothing read: end of file.
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().conn).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().conn).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.conn.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().conn).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().conn).poll_shutdown(cx)
    }
}

/// Counts each request as in flight on its connection until its response body ends (or the
/// call fails, or the client cancels it).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct ActivityLayer;

impl<S> tower::Layer<S> for ActivityLayer {
    type Service = ActivityService<S>;

    fn layer(&self, inner: S) -> ActivityService<S> {
        ActivityService(inner)
    }
}

#[derive(Clone, Debug)]
pub(super) struct ActivityService<S>(S);

pub(super) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, RB> tower::Service<http::Request<B>> for ActivityService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<CountedBody<RB>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let guard = req
            .extensions()
            .get::<TrackedInfo>()
            .map(|info| info.activity.begin());
        let call = self.0.call(req);
        Box::pin(async move {
            let response = call.await?;
            Ok(response.map(|inner| CountedBody {
                inner,
                _in_flight: guard,
            }))
        })
    }
}

/// A response body that keeps its request counted as in flight until it is dropped.
pub(super) struct CountedBody<B> {
    inner: B,
    _in_flight: Option<InFlight>,
}

impl<B: Body + Unpin> Body for CountedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn idle_deadline_waits_for_requests_in_flight() {
        let activity = Arc::new(Activity::new());
        let idle = Duration::from_secs(10);
        let start = activity.idle_deadline(idle).unwrap();
        let guard = activity.begin();
        let second = activity.begin();
        assert_eq!(activity.idle_deadline(idle), None);
        drop(guard);
        assert_eq!(
            activity.idle_deadline(idle),
            None,
            "one request is still in flight"
        );
        drop(second);
        assert!(activity.idle_deadline(idle).unwrap() >= start);
    }
}
