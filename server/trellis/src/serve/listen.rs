//! Listening sockets: TCP or a Unix socket, a stale socket file replaced, and the accepted
//! connections as tonic sees them.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_stream::Stream;
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tonic::transport::server::Connected;
use trellis_proto::unix_conn::UnixConn;

use super::config::Listen;

/// A bound listening socket. Print [`Bound::display`] once bound (port 0 picks a free port),
/// then serve [`Bound::into_incoming`] with tonic's `serve_with_incoming_shutdown`, or match
/// the variants to serve tonic's own stream types.
#[derive(Debug)]
pub(super) enum Bound {
    Tcp(TcpListenerStream, SocketAddr),
    Unix(UnixListenerStream, PathBuf),
}

impl Bound {
    /// The address clients connect to: `127.0.0.1:PORT` or `unix:/path`.
    pub(super) fn display(&self) -> String {
        self.listen().to_string()
    }

    /// What was bound, with the actual port for TCP.
    pub(super) fn listen(&self) -> Listen {
        match self {
            Bound::Tcp(_, addr) => Listen::Tcp(*addr),
            Bound::Unix(_, path) => Listen::Unix(path.clone()),
        }
    }

    /// One stream of accepted connections for either kind of socket.
    pub(super) fn into_incoming(self) -> Incoming {
        Incoming {
            listener: self,
            pause: None,
        }
    }
}

/// Opens the listening socket. For a Unix socket: creates its directory, replaces a stale
/// socket file left by an engine that died (but not one a live process still answers on, nor
/// a file that is not a socket), and makes the socket owner-only (mode 0600).
pub(super) async fn bind(listen: &Listen) -> io::Result<Bound> {
    match listen {
        Listen::Tcp(addr) => {
            let listener = tokio::net::TcpListener::bind(addr).await?;
            let local = listener.local_addr()?;
            Ok(Bound::Tcp(TcpListenerStream::new(listener), local))
        }
        Listen::Unix(path) => {
            use std::os::unix::fs::PermissionsExt;
            remove_stale_socket(path)?;
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            let listener = tokio::net::UnixListener::bind(path)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
            Ok(Bound::Unix(UnixListenerStream::new(listener), path.clone()))
        }
    }
}

fn remove_stale_socket(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !meta.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a socket", path.display()),
        ));
    }
    // Refused means nobody is listening: the file is left over from a process that died.
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!(
                "{}: another process is listening on this socket",
                path.display()
            ),
        )),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => std::fs::remove_file(path),
        Err(e) => Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
    }
}

/// How long accepting pauses after an error such as running out of file descriptors: tonic
/// retries at once, which would spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Accepted connections of a [`Bound`] socket, for tonic's `serve_with_incoming_shutdown`.
pub(super) struct Incoming {
    listener: Bound,
    pause: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Stream for Incoming {
    type Item = io::Result<Conn>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Some(pause) = &mut this.pause {
            ready!(pause.as_mut().poll(cx));
            this.pause = None;
        }
        let polled = match &mut this.listener {
            Bound::Tcp(listener, _) => Pin::new(listener).poll_next(cx).map_ok(|stream| {
                // gRPC sends many small frames; Nagle's algorithm would delay them.
                let _ = stream.set_nodelay(true);
                Conn::Tcp(stream)
            }),
            // Any gRPC client may call over a Unix socket: gRPC's C core sends the socket
            // path as authority, which the rewriting connection lets through.
            Bound::Unix(listener, _) => Pin::new(listener)
                .poll_next(cx)
                .map_ok(|stream| Conn::Unix(UnixConn::new(stream))),
        };
        if let Poll::Ready(Some(Err(e))) = &polled
            && !is_connection_error(e)
        {
            tracing::warn!(error = %e, "cannot accept connections; retrying shortly");
            this.pause = Some(Box::pin(tokio::time::sleep(ACCEPT_ERROR_PAUSE)));
        }
        polled
    }
}

/// Errors that concern one connection only, so accepting the next can go on at once.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    )
}

/// An accepted connection.
#[derive(Debug)]
pub(super) enum Conn {
    Tcp(TcpStream),
    Unix(UnixConn),
}

/// Nothing about the peer is used (the server wraps connections in `conns::Tracked`, whose
/// connect info carries what requests need).
impl Connected for Conn {
    type ConnectInfo = ();

    fn connect_info(&self) {}
}

/// Runs `$body` with `$s` bound to the pinned inner stream of either variant.
macro_rules! with_stream {
    ($conn:expr, $s:ident => $body:expr) => {
        match $conn.get_mut() {
            Conn::Tcp(stream) => {
                let $s = Pin::new(stream);
                $body
            }
            Conn::Unix(stream) => {
                let $s = Pin::new(stream);
                $body
            }
        }
    };
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        with_stream!(self, s => s.poll_read(cx, buf))
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        with_stream!(self, s => s.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        with_stream!(self, s => s.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Tcp(stream) => stream.is_write_vectored(),
            Conn::Unix(stream) => stream.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        with_stream!(self, s => s.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        with_stream!(self, s => s.poll_shutdown(cx))
    }
}
