//! Accepted Unix-socket connections for the gRPC servers (the engine API on `unix:`, the Host
//! service, SDK-built plugins) that gRPC clients of any language can call.
//!
//! gRPC's C core (Python, Ruby, PHP, C++) and grpc-java send the socket path as the HTTP/2
//! `:authority` of a request on a Unix socket (C core percent-encodes it: `tmp%2Fx.sock`).
//! That is not a URI authority, and h2, under hyper and tonic, resets such a stream with
//! PROTOCOL_ERROR before any service sees it; it has no option to allow it. So [`UnixConn`]
//! rewrites the client's header blocks on their way to the server: it decodes each one with
//! h2's HPACK decoder, drops an `:authority` that is not a valid URI authority (a Unix socket
//! names no host, and nothing here routes by it), and encodes the block again for the server.
//! Until a connection's first such authority, its header blocks pass as sent (a Rust client's
//! never need the change, and decoding alone costs half as much as decoding and encoding).
//! Every other frame passes through byte for byte, so flow control is untouched; what the
//! server writes goes to the client as is.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::{Buf as _, Bytes, BytesMut};
use h2::Codec;
use h2::frame::{Frame, Headers};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UnixStream;
use tokio_stream::Stream;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::server::{Connected, UdsConnectInfo};

/// The HTTP/2 client connection preface (RFC 9113 §3.4), passed through as is.
const PREFACE_LEN: usize = 24;
const FRAME_HEADER_LEN: usize = 9;
const KIND_HEADERS: u8 = 0x1;
const KIND_CONTINUATION: u8 = 0x9;
/// The HPACK table size of the server (HTTP/2's default; ours never announce another) and
/// of the encoder here.
const TABLE_SIZE: usize = 4_096;
/// How much is read from the socket at a time.
const READ_CHUNK: usize = 16 * 1024;

/// Accepted connections of a Unix listener, each wrapped in a [`UnixConn`]: what
/// `serve_with_incoming*` takes.
pub fn incoming(
    listener: tokio::net::UnixListener,
) -> impl Stream<Item = io::Result<UnixConn>> + Send + 'static {
    tokio_stream::StreamExt::map(UnixListenerStream::new(listener), |conn| {
        conn.map(UnixConn::new)
    })
}

/// An accepted Unix-socket connection whose request headers reach the server with an
/// `:authority` h2 accepts (see the module docs).
pub struct UnixConn {
    io: UnixStream,
    /// Read from the client, not yet looked at.
    raw: BytesMut,
    /// Ready for the server.
    out: BytesMut,
    preface_left: usize,
    /// Bytes of the current frame (not a header block) still to pass through.
    pass_left: usize,
    /// Boxed: two HPACK codecs would make every connection value large.
    headers: Box<HeaderRewrite>,
    eof: bool,
}

impl std::fmt::Debug for UnixConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnixConn").field("io", &self.io).finish()
    }
}

impl UnixConn {
    pub fn new(io: UnixStream) -> Self {
        UnixConn {
            io,
            raw: BytesMut::new(),
            out: BytesMut::new(),
            preface_left: PREFACE_LEN,
            pass_left: 0,
            headers: Box::new(HeaderRewrite::new()),
            eof: false,
        }
    }

    /// Moves what can be moved from `raw` to `out`.
    fn process(&mut self) -> io::Result<()> {
        loop {
            if self.preface_left > 0 || self.pass_left > 0 {
                let left = if self.preface_left > 0 {
                    &mut self.preface_left
                } else {
                    &mut self.pass_left
                };
                let n = (*left).min(self.raw.len());
                if n == 0 {
                    return Ok(());
                }
                self.out.extend_from_slice(&self.raw.split_to(n));
                *left -= n;
                continue;
            }
            if self.raw.len() < FRAME_HEADER_LEN {
                return Ok(());
            }
            let len = usize::from(self.raw[0]) << 16
                | usize::from(self.raw[1]) << 8
                | usize::from(self.raw[2]);
            let kind = self.raw[3];
            if kind != KIND_HEADERS && kind != KIND_CONTINUATION {
                self.pass_left = FRAME_HEADER_LEN + len;
                continue;
            }
            // A header block is decoded whole: wait for the rest of the frame (its length
            // field bounds it to 16 MiB).
            if self.raw.len() < FRAME_HEADER_LEN + len {
                self.raw.reserve(FRAME_HEADER_LEN + len - self.raw.len());
                return Ok(());
            }
            let frame = self.raw.split_to(FRAME_HEADER_LEN + len);
            self.headers.rewrite(&frame, &mut self.out)?;
        }
    }
}

impl AsyncRead for UnixConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.out.is_empty() {
                let n = this.out.len().min(buf.remaining());
                buf.put_slice(&this.out[..n]);
                this.out.advance(n);
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                // A frame cut short by the client stays cut short for the server.
                if !this.raw.is_empty() {
                    this.out = this.raw.split();
                    continue;
                }
                return Poll::Ready(Ok(()));
            }
            this.raw.reserve(READ_CHUNK);
            // Into the spare capacity as it is: zeroing it first, on every poll (most of which
            // find nothing to read), took a fifth of a plugin's CPU under load.
            let n = std::task::ready!(tokio_util::io::poll_read_buf(
                Pin::new(&mut this.io),
                cx,
                &mut this.raw
            ))?;
            if n == 0 {
                this.eof = true;
            }
            this.process()?;
        }
    }
}

impl AsyncWrite for UnixConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl Connected for UnixConn {
    type ConnectInfo = UdsConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

/// The two HPACK contexts of one connection: the client's (decoding what it sent) and the
/// server's (encoding what the server gets). Both are h2's codecs over in-memory buffers,
/// polled synchronously: reading an empty buffer is `Pending`, writing never waits.
///
/// While `as_sent`, the server gets the client's own bytes, so its HPACK table is the client's.
/// The first block that needs a change turns that off for good: from then on every block is
/// encoded here. That switch is sound mid-connection because this encoder refers only to
/// entries it added itself, which the server's table holds as its newest: the server evicts the
/// client's older entries first, and one of these only when this encoder does too. For that
/// both tables must have the same size limit, and a client may have set the server's smaller
/// in a block passed as sent: the first encoded block sets it back to this encoder's.
struct HeaderRewrite {
    decode: Codec<Mem, Bytes>,
    encode: Codec<Mem, Bytes>,
    as_sent: bool,
    /// The frames of the header block being read, as the client sent them.
    block: BytesMut,
}

impl HeaderRewrite {
    fn new() -> Self {
        let mut decode = Codec::new(Mem::default());
        // The server enforces its own limits on what it gets; this side only has to read
        // any frame a client may send it.
        decode.set_max_recv_frame_size(h2::frame::MAX_MAX_FRAME_SIZE as usize);
        HeaderRewrite {
            decode,
            encode: Codec::new(Mem::default()),
            as_sent: true,
            block: BytesMut::new(),
        }
    }

    /// Takes one HEADERS or CONTINUATION frame; once a header block is complete, appends it,
    /// rewritten, to `out`.
    fn rewrite(&mut self, frame: &[u8], out: &mut BytesMut) -> io::Result<()> {
        let mut cx = Context::from_waker(Waker::noop());
        self.decode.get_mut().input.extend_from_slice(frame);
        if self.as_sent {
            self.block.extend_from_slice(frame);
        }
        let headers = match Pin::new(&mut self.decode).poll_next(&mut cx) {
            // The block continues in CONTINUATION frames still to come.
            Poll::Pending => return Ok(()),
            Poll::Ready(Some(Ok(Frame::Headers(h)))) => h,
            Poll::Ready(Some(Ok(other))) => return Err(bad(format!("unexpected {other:?}"))),
            Poll::Ready(Some(Err(e))) => return Err(bad(format!("{e:?}"))),
            Poll::Ready(None) => return Err(bad("header decoder ended".into())),
        };
        if headers.is_over_size() {
            return Err(bad("header list too large".into()));
        }
        let (id, end_stream) = (headers.stream_id(), headers.is_end_stream());
        let (mut pseudo, fields) = headers.into_parts();
        let block = std::mem::take(&mut self.block);
        if pseudo
            .authority
            .as_ref()
            .is_some_and(|a| http::uri::Authority::try_from(&**a).is_err())
        {
            pseudo.authority = None;
            if self.as_sent {
                self.as_sent = false;
                // Two size updates (h2 writes none for the size its table already has).
                self.encode.set_send_header_table_size(TABLE_SIZE - 1);
                self.encode.set_send_header_table_size(TABLE_SIZE);
            }
        } else if self.as_sent {
            out.extend_from_slice(&block);
            return Ok(());
        }
        // Built anew: padding and the deprecated priority fields of the original are gone.
        let mut rewritten = Headers::new(id, pseudo, fields);
        if end_stream {
            rewritten.set_end_stream();
        }
        let encoded = self.encode.poll_ready(&mut cx).map(|r| {
            r.and_then(|()| {
                self.encode
                    .buffer(Frame::Headers(rewritten))
                    .map_err(|e| bad(format!("{e:?}")))
            })
        });
        match encoded {
            Poll::Ready(r) => r?,
            Poll::Pending => return Err(bad("header encoder not ready".into())),
        }
        match self.encode.flush(&mut cx) {
            Poll::Ready(r) => r?,
            Poll::Pending => return Err(bad("header encoder did not flush".into())),
        }
        out.extend_from_slice(&self.encode.get_mut().output.split());
        Ok(())
    }
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("HTTP/2 headers: {msg}"))
}

#[derive(Default)]
struct Mem {
    input: BytesMut,
    output: BytesMut,
}

impl AsyncRead for Mem {
    fn poll_read(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.input.is_empty() {
            return Poll::Pending;
        }
        let n = this.input.len().min(buf.remaining());
        buf.put_slice(&this.input.split_to(n));
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Mem {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().output.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Encodes request headers as a client would, with its own HPACK context.
    fn client_block(client: &mut Codec<Mem, Bytes>, id: u32, authority: &str) -> BytesMut {
        let mut pseudo = h2::frame::Pseudo::request(
            http::Method::POST,
            http::Uri::from_static("http://placeholder/pkg.Svc/Call"),
            None,
        );
        pseudo.authority = Some(
            h2::frame::BytesStr::try_from(Bytes::copy_from_slice(authority.as_bytes())).unwrap(),
        );
        let mut fields = http::HeaderMap::new();
        fields.insert("te", http::HeaderValue::from_static("trailers"));
        // One field new in every block and one the client's table holds from the first:
        // a server whose table has drifted from what its blocks refer to reads them wrong.
        fields.insert("x-call", http::HeaderValue::from(id));
        fields.insert("x-tenant", http::HeaderValue::from_static(TENANT));
        let headers = Headers::new(h2::frame::StreamId::from(id), pseudo, fields);
        let mut cx = Context::from_waker(Waker::noop());
        assert!(client.poll_ready(&mut cx).is_ready());
        client.buffer(Frame::Headers(headers)).unwrap();
        assert!(client.flush(&mut cx).is_ready());
        client.get_mut().output.split()
    }

    const TENANT: &str = "orders-production-eu-west-1";

    /// Decodes what the rewrite produced, as the server would, and checks the fields every
    /// client block has.
    fn server_reads(server: &mut Codec<Mem, Bytes>, block: &[u8]) -> h2::frame::Pseudo {
        server.get_mut().input.extend_from_slice(block);
        let mut cx = Context::from_waker(Waker::noop());
        let (pseudo, fields) = match Pin::new(server).poll_next(&mut cx) {
            Poll::Ready(Some(Ok(Frame::Headers(h)))) => h.into_parts(),
            other => panic!("not headers: {other:?}"),
        };
        assert_eq!(fields["te"], "trailers");
        assert_eq!(fields["x-tenant"], TENANT);
        assert!(fields.contains_key("x-call"));
        pseudo
    }

    #[test]
    fn drops_an_authority_that_is_not_one_and_keeps_a_valid_one() {
        let mut client = Codec::new(Mem::default());
        let mut rewrite = HeaderRewrite::new();
        let mut server = Codec::new(Mem::default());
        // The same authority twice: the second time the client refers to its HPACK table.
        for (id, authority, kept) in [
            (1, "tmp%2Fx.sock", false),
            (3, "tmp%2Fx.sock", false),
            (5, "/var/run/x.sock", false),
            (7, "localhost", true),
            (9, "localhost", true),
        ] {
            let block = client_block(&mut client, id, authority);
            let mut out = BytesMut::new();
            rewrite.rewrite(&block, &mut out).unwrap();
            let pseudo = server_reads(&mut server, &out);
            let got = pseudo.authority.as_deref().map(str::to_owned);
            assert_eq!(got, kept.then(|| authority.to_owned()), "{authority}");
            assert_eq!(pseudo.path.as_deref(), Some("/pkg.Svc/Call"));
        }
    }

    /// A connection's blocks pass as sent until one needs a change; after it, those that need
    /// none still reach the server intact, including ones that refer to the client's HPACK
    /// table from before the change.
    #[test]
    fn blocks_pass_as_sent_until_one_needs_a_change() {
        let mut client = Codec::new(Mem::default());
        let mut rewrite = HeaderRewrite::new();
        let mut server = Codec::new(Mem::default());
        for (id, authority, kept, as_sent) in [
            (1, "localhost", true, true),
            (3, "localhost", true, true),
            (5, "tmp%2Fx.sock", false, false),
            (7, "localhost", true, false),
            (9, "tmp%2Fx.sock", false, false),
            (11, "engine.invalid", true, false),
        ] {
            if id == 3 {
                // The client shrinks its table, in a block the server gets as sent: the server's
                // table is then as small, until the first encoded block sets it back.
                client.set_send_header_table_size(64);
            }
            let block = client_block(&mut client, id, authority);
            let mut out = BytesMut::new();
            rewrite.rewrite(&block, &mut out).unwrap();
            assert_eq!(rewrite.as_sent, as_sent, "{id}: passing blocks as sent");
            if as_sent {
                assert_eq!(out, block, "{id}: passed as sent");
            }
            let pseudo = server_reads(&mut server, &out);
            let got = pseudo.authority.as_deref().map(str::to_owned);
            assert_eq!(got, kept.then(|| authority.to_owned()), "{id}: {authority}");
            assert_eq!(pseudo.path.as_deref(), Some("/pkg.Svc/Call"));
        }
    }

    /// Everything but header blocks reaches the server byte for byte, however the client's
    /// writes are split and whatever the reads find waiting: a frame larger than a read, a
    /// preface cut in two, and a frame cut short by the end of the stream.
    #[tokio::test]
    async fn passes_other_frames_through_byte_for_byte() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let (mut client, server) = UnixStream::pair().unwrap();
        let mut sent = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        for (len, fill) in [(40_000usize, 7u8), (10, 9), (3, 1)] {
            sent.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8]);
            sent.extend_from_slice(&[0x0, 0x0, 0, 0, 0, 1]); // DATA on stream 1
            sent.extend(std::iter::repeat_n(fill, len));
        }
        sent.extend_from_slice(&[0, 1, 0, 0x0, 0x0, 0, 0, 0, 1, 42]); // 256 bytes promised, 1 sent
        let writer = tokio::spawn({
            let sent = sent.clone();
            async move {
                for piece in sent.chunks(1_000) {
                    client.write_all(piece).await.unwrap();
                    tokio::task::yield_now().await;
                }
            }
        });
        let mut got = Vec::new();
        UnixConn::new(server).read_to_end(&mut got).await.unwrap();
        writer.await.unwrap();
        assert_eq!(got.len(), sent.len());
        assert!(got == sent, "the bytes differ");
    }
}
