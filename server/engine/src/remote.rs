//! `https://` child blueprints: fetched by the engine only from hosts the operator allow-lists
//! (`--allow-include-host`), at most `--max-include-bytes` long, within [`FETCH_TIMEOUT`],
//! without following redirects. Plain `http://` is never fetched: a blueprint read over an
//! unencrypted connection could be changed by anyone on the way.
//!
//!
//! URLs are shown (messages, logs) without their query string, which may carry a token.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::Bytes;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{self, ClientConfig};

/// Connecting, the TLS handshake, the request and reading the whole body: at most this long.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(30);
const HTTPS_PORT: u16 = 443;

/// Whether an include path names a network source (`https://` or `http://`), as opposed to a
/// file.
pub fn is_remote(path: &str) -> bool {
    has_scheme(path, "https") || has_scheme(path, "http")
}

fn has_scheme(text: &str, scheme: &str) -> bool {
    text.len() > scheme.len() + 3
        && text.as_bytes()[..scheme.len()].eq_ignore_ascii_case(scheme.as_bytes())
        && text[scheme.len()..].starts_with("://")
}

/// An `https://` include: host, port, path and query, parsed and checked. Displays as
/// `https://host[:port]/path`, without the query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IncludeUrl {
    /// Lower-case, without a trailing dot; an IPv6 address keeps its brackets.
    host: String,
    /// As written; `None` means 443.
    port: Option<u16>,
    /// Starts with `/`.
    path: String,
    query: Option<String>,
}

impl IncludeUrl {
    /// Parses `https://host[:port][/path][?query][#fragment]` (the fragment is dropped).
    /// `http://` is refused: it is not encrypted.
    pub fn parse(text: &str) -> Result<IncludeUrl, String> {
        let text = text.trim();
        if has_scheme(text, "http") {
            return Err(format!(
                "`{}`: plain http:// is never fetched: it is not encrypted, so anyone on the way \
                 could change the blueprint; use https://",
                without_query(text)
            ));
        }
        if !has_scheme(text, "https") {
            return Err(format!("`{}` is not an https:// URL", without_query(text)));
        }
        let rest = &text["https://".len()..];
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, rest) = rest.split_at(end);
        let bad = |why: &str| format!("`{}`: {why}", without_query(text));
        if authority.contains('@') {
            return Err(bad(
                "credentials in the URL are not supported (the engine would store and show them)",
            ));
        }
        let (host, port) = split_host_port(authority).map_err(|e| bad(&e))?;
        let rest = rest.split('#').next().unwrap_or("");
        let (path, query) = match rest.split_once('?') {
            Some((path, query)) => (path, Some(query.to_owned())),
            None => (rest, None),
        };
        let path = if path.is_empty() { "/" } else { path };
        if path
            .chars()
            .chain(query.iter().flat_map(|q| q.chars()))
            .any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(bad("spaces and control characters must be percent-encoded"));
        }
        Ok(IncludeUrl {
            host,
            port,
            path: path.to_owned(),
            query,
        })
    }

    /// `host` or `host:port` (a port only when written and not 443): what the allow list and
    /// the `Host` header use.
    pub fn authority(&self) -> String {
        match self.port {
            Some(port) if port != HTTPS_PORT => format!("{}:{port}", self.host),
            _ => self.host.clone(),
        }
    }

    pub fn host(&self) -> &str {
        &self.host
    }

    pub fn port(&self) -> u16 {
        self.port.unwrap_or(HTTPS_PORT)
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    /// A path written in the blueprint at this URL, resolved against it: same host and port,
    /// relative to this URL's directory, with no query. An absolute path is refused: in a
    /// fetched blueprint it could only mean a file on the engine host, which a remote author
    /// must not reach.
    pub fn join(&self, relative: &str) -> Result<IncludeUrl, String> {
        if relative.starts_with('/') {
            return Err(format!(
                "`{relative}`: a blueprint fetched from {self} cannot include files by absolute \
                 path; use a path relative to it or an https:// URL"
            ));
        }
        let (rel_path, query) = match relative.split_once('?') {
            Some((p, q)) => (p, Some(q.to_owned())),
            None => (relative, None),
        };
        let dir = self.path.rfind('/').map_or("", |i| &self.path[..i]);
        let joined = super::children::normalize(&format!("{dir}/{rel_path}"));
        // `normalize` keeps a `..` that would climb above the root.
        if joined.split('/').any(|p| p == "..") {
            return Err(format!(
                "`{relative}`: resolved against {self} it leaves the server's root"
            ));
        }
        let path = if joined.starts_with('/') {
            joined
        } else {
            format!("/{joined}")
        };
        IncludeUrl::parse(&format!(
            "https://{}{path}{}",
            self.authority(),
            query.map(|q| format!("?{q}")).unwrap_or_default()
        ))
    }

    /// The request target: path and query.
    fn target(&self) -> String {
        match &self.query {
            Some(q) => format!("{}?{q}", self.path),
            None => self.path.clone(),
        }
    }
}

impl fmt::Display for IncludeUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "https://{}{}", self.authority(), self.path)
    }
}

/// A URL (or anything) cut before its query and fragment, for messages.
fn without_query(text: &str) -> &str {
    text.split(['?', '#']).next().unwrap_or(text)
}

/// `host`, `host:port`, `[v6]` or `[v6]:port` → lower-case host (brackets kept, trailing dot
/// dropped) and port.
fn split_host_port(authority: &str) -> Result<(String, Option<u16>), String> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let close = rest.find(']').ok_or("an IPv6 address misses its `]`")?;
        let host = &authority[..close + 2];
        match &rest[close + 1..] {
            "" => (host, None),
            after => match after.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None => return Err(format!("unexpected `{after}` after the address")),
            },
        }
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    if host.is_empty() || host == "[]" {
        return Err("the host is missing".to_owned());
    }
    let valid = if host.starts_with('[') {
        host[1..host.len() - 1]
            .chars()
            .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
    } else {
        host.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_')
    };
    if !valid {
        return Err(format!("`{host}` is not a host name"));
    }
    let port = match port {
        None => None,
        Some(p) => match p.parse::<u16>() {
            Ok(0) | Err(_) => return Err(format!("`{p}` is not a port")),
            Ok(n) => Some(n),
        },
    };
    Ok((host, port))
}

/// Whether `url` is allowed by an allow-list entry: `host` allows the host on port 443 only,
/// `host:port` that port only (so allowing a host never opens its other services).
pub fn host_allowed(allowed: &[String], url: &IncludeUrl) -> bool {
    allowed.iter().any(|entry| {
        // A bare IPv6 address without brackets (`::1`) means port 443.
        let parsed = if !entry.starts_with('[') && entry.matches(':').count() > 1 {
            split_host_port(&format!("[{entry}]"))
        } else {
            split_host_port(entry)
        };
        parsed
            .is_ok_and(|(host, port)| host == url.host && port.unwrap_or(HTTPS_PORT) == url.port())
    })
}

/// How many bytes a response may have: refused up front when its `Content-Length` says more,
/// and cut off as soon as more arrive.
#[derive(Debug)]
pub struct SizeLimit {
    max: u64,
    body: Vec<u8>,
}

impl SizeLimit {
    pub fn new(max: u64) -> SizeLimit {
        SizeLimit {
            max,
            body: Vec::new(),
        }
    }

    /// Checks a declared length (`Content-Length`), before anything is read.
    pub fn declared(&self, length: Option<u64>) -> Result<(), String> {
        match length {
            Some(n) if n > self.max => Err(format!(
                "it is {n} bytes, more than the engine accepts (--max-include-bytes {})",
                self.max
            )),
            _ => Ok(()),
        }
    }

    /// Adds a chunk; an error once the body passes the limit.
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), String> {
        if self.body.len() as u64 + chunk.len() as u64 > self.max {
            return Err(format!(
                "it is more than the {} bytes the engine accepts (--max-include-bytes); \
                 stopped reading",
                self.max
            ));
        }
        self.body.extend_from_slice(chunk);
        Ok(())
    }

    pub fn into_body(self) -> Vec<u8> {
        self.body
    }
}

/// The engine's settings for remote includes.
#[derive(Clone)]
pub struct RemoteIncludes {
    /// Lower-case `host` or `host:port` entries; empty refuses every remote include.
    hosts: Vec<String>,
    max_bytes: u64,
    timeout: Duration,
    /// Built only when some host is allowed.
    tls: Option<Arc<ClientConfig>>,
}

impl fmt::Debug for RemoteIncludes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteIncludes")
            .field("hosts", &self.hosts)
            .field("max_bytes", &self.max_bytes)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Default for RemoteIncludes {
    /// Nothing is fetched.
    fn default() -> Self {
        RemoteIncludes {
            hosts: Vec::new(),
            max_bytes: 0,
            timeout: FETCH_TIMEOUT,
            tls: None,
        }
    }
}

impl RemoteIncludes {
    /// Fetches from `hosts`, trusting the system's roots and the PEM certificates in
    /// `extra_roots` (a private CA).
    pub fn new(
        hosts: Vec<String>,
        max_bytes: u64,
        extra_roots: &[CertificateDer<'static>],
    ) -> Result<RemoteIncludes, String> {
        let tls = if hosts.is_empty() {
            None
        } else {
            let roots = crate::tls::trust_roots(extra_roots)?;
            let mut config = ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            Some(Arc::new(config))
        };
        Ok(RemoteIncludes {
            hosts,
            max_bytes,
            timeout: FETCH_TIMEOUT,
            tls,
        })
    }

    #[cfg(test)]
    fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The allow-list check alone.
    pub fn check(&self, url: &IncludeUrl) -> Result<(), String> {
        if self.hosts.is_empty() {
            return Err(format!(
                "{url}: remote includes are not fetched: no host is allow-listed on this \
                 engine (--allow-include-host); send the file with the request instead"
            ));
        }
        if !host_allowed(&self.hosts, url) {
            return Err(format!(
                "{url}: host `{}` is not allow-listed on this engine (--allow-include-host)",
                url.authority()
            ));
        }
        Ok(())
    }

    /// Fetches a child blueprint: allow-listed host, 2xx answer, size limit, timeout.
    pub async fn fetch(&self, url: &IncludeUrl) -> Result<Vec<u8>, String> {
        self.check(url)?;
        let Some(tls) = &self.tls else {
            return Err(format!("{url}: TLS is not set up for remote includes"));
        };
        tracing::info!(host = %url.authority(), path = %url.path, "fetching a remote include");
        match tokio::time::timeout(self.timeout, self.get(tls.clone(), url)).await {
            Ok(Ok(body)) => {
                tracing::debug!(url = %url, bytes = body.len(), "remote include fetched");
                Ok(body)
            }
            Ok(Err(e)) => Err(format!("{url}: {e}")),
            Err(_) => Err(format!(
                "{url}: no complete answer within {:?}",
                self.timeout
            )),
        }
    }

    async fn get(&self, tls: Arc<ClientConfig>, url: &IncludeUrl) -> Result<Vec<u8>, String> {
        let bare_host = url.host.trim_start_matches('[').trim_end_matches(']');
        let tcp = tokio::net::TcpStream::connect((bare_host, url.port()))
            .await
            .map_err(|e| format!("cannot connect: {e}"))?;
        let _ = tcp.set_nodelay(true);
        let name = ServerName::try_from(bare_host.to_owned())
            .map_err(|e| format!("`{bare_host}`: {e}"))?;
        let stream = tokio_rustls::TlsConnector::from(tls)
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| format!("HTTP: {e}"))?;
        let conn = AbortOnDrop(tokio::spawn(conn));
        let request = hyper::Request::get(url.target())
            .header(hyper::header::HOST, url.authority())
            .header(
                hyper::header::USER_AGENT,
                concat!("trellis/", env!("CARGO_PKG_VERSION")),
            )
            .header(
                hyper::header::ACCEPT,
                "application/yaml, application/json, text/plain, */*",
            )
            .header(hyper::header::CONNECTION, "close")
            .body(http_body_util::Empty::<Bytes>::new())
            .map_err(|e| format!("bad request: {e}"))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("HTTP: {e}"))?;
        let status = response.status();
        if status.is_redirection() {
            let to = response
                .headers()
                .get(hyper::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .map(|l| format!(" to `{}`", without_query(l)))
                .unwrap_or_default();
            return Err(format!(
                "the server answered {status}{to}; redirects are not followed: include the final \
                 URL"
            ));
        }
        if !status.is_success() {
            return Err(format!("the server answered {status}"));
        }
        let mut limit = SizeLimit::new(self.max_bytes);
        let declared = response
            .headers()
            .get(hyper::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
        limit.declared(declared)?;
        let mut body = response.into_body();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| format!("reading the answer: {e}"))?;
            if let Ok(data) = frame.into_data() {
                limit.push(&data)?;
            }
        }
        drop(conn);
        Ok(limit.into_body())
    }
}

/// Stops the connection task when the fetch ends, however it ends.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(text: &str) -> IncludeUrl {
        IncludeUrl::parse(text).unwrap()
    }

    #[test]
    fn urls_parse_and_display_without_their_query() {
        let u = url("HTTPS://Raw.Example.COM./org/repo/child.yaml?token=s3cret#frag");
        assert_eq!(u.host(), "raw.example.com");
        assert_eq!(u.port(), 443);
        assert_eq!(u.path(), "/org/repo/child.yaml");
        assert_eq!(u.target(), "/org/repo/child.yaml?token=s3cret");
        assert_eq!(u.to_string(), "https://raw.example.com/org/repo/child.yaml");
        assert_eq!(url("https://h:8443").to_string(), "https://h:8443/");
        assert_eq!(url("https://h:443/x").authority(), "h");
        let v6 = url("https://[::1]:9000/c.yaml");
        assert_eq!((v6.host(), v6.port()), ("[::1]", 9000));

        let err = |t: &str| IncludeUrl::parse(t).unwrap_err();
        let plain = err("http://example.com/c.yaml?k=v");
        assert!(plain.contains("not encrypted"), "{plain}");
        assert!(!plain.contains("k=v"), "{plain}");
        assert!(err("https://user:pw@example.com/").contains("credentials"));
        assert!(err("https://example.com:0/").contains("not a port"));
        assert!(err("https://example.com:http/").contains("not a port"));
        assert!(err("https:///x").contains("host is missing"));
        assert!(err("https://exa mple.com/").contains("not a host"));
        assert!(err("https://e.com/a b").contains("percent-encoded"));
        assert!(err("ftp://e.com/").contains("not an https"));

        assert!(is_remote("https://x/y") && is_remote("HTTP://x") && !is_remote("https.yaml"));
        assert!(!is_remote("./http://x") && !is_remote("/srv/https/x.yaml"));
    }

    #[test]
    fn allow_list_entries_match_host_and_port() {
        let hosts = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let allowed = hosts(&["raw.example.com", "localhost:8443", "::1", "[fe80::1]:444"]);
        let ok = |t: &str| host_allowed(&allowed, &url(t));
        assert!(ok("https://raw.example.com/x.yaml"));
        assert!(ok("https://RAW.example.com:443/x.yaml"));
        // A bare host allows 443 only, and never other hosts ending like it.
        assert!(!ok("https://raw.example.com:8443/x.yaml"));
        assert!(!ok("https://evil-raw.example.com/x.yaml"));
        assert!(!ok("https://raw.example.com.evil.net/x.yaml"));
        assert!(ok("https://localhost:8443/x.yaml"));
        assert!(!ok("https://localhost/x.yaml"));
        assert!(ok("https://[::1]/x.yaml"));
        assert!(ok("https://[fe80::1]:444/x.yaml"));
        assert!(!ok("https://[fe80::1]/x.yaml"));
        assert!(!host_allowed(&[], &url("https://raw.example.com/x.yaml")));

        let remote = RemoteIncludes {
            hosts: allowed.clone(),
            ..RemoteIncludes::default()
        };
        let denied = remote
            .check(&url("https://other.example/c.yaml?token=x"))
            .unwrap_err();
        assert!(denied.contains("`other.example`"), "{denied}");
        assert!(denied.contains("--allow-include-host"), "{denied}");
        assert!(!denied.contains("token"), "{denied}");
        let none = RemoteIncludes::default()
            .check(&url("https://raw.example.com/x.yaml"))
            .unwrap_err();
        assert!(none.contains("no host is allow-listed"), "{none}");
    }

    #[test]
    fn relative_paths_join_against_the_parent_url() {
        let parent = url("https://h:8443/bp/app/main.yaml?token=t");
        assert_eq!(
            parent.join("child.yaml").unwrap().to_string(),
            "https://h:8443/bp/app/child.yaml"
        );
        let up = parent.join("../shared/./db.yaml?v=2").unwrap();
        assert_eq!(up.to_string(), "https://h:8443/bp/shared/db.yaml");
        assert_eq!(up.target(), "/bp/shared/db.yaml?v=2");
        assert!(parent.join("../../../x.yaml").unwrap_err().contains("root"));
        assert!(parent.join("/etc/passwd").unwrap_err().contains("absolute"));
    }

    #[test]
    fn size_limit_refuses_declared_and_streamed_excess() {
        let mut limit = SizeLimit::new(10);
        assert!(limit.declared(None).is_ok());
        assert!(limit.declared(Some(10)).is_ok());
        let too_big = limit.declared(Some(11)).unwrap_err();
        assert!(too_big.contains("11 bytes") && too_big.contains("--max-include-bytes"));
        limit.push(b"12345").unwrap();
        limit.push(b"67890").unwrap();
        let over = limit.push(b"x").unwrap_err();
        assert!(over.contains("stopped reading"), "{over}");
        assert_eq!(limit.into_body(), b"1234567890");
    }

    /// A one-connection-at-a-time HTTPS server on loopback answering `respond(path)` as raw
    /// HTTP/1.1 bytes; its CA certificate.
    async fn https_server(
        respond: impl Fn(&str) -> Vec<u8> + Send + Sync + 'static,
    ) -> (u16, CertificateDer<'static>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let der = cert.der().clone();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![der.clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let respond = Arc::new(respond);
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let respond = respond.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut request = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !request.ends_with(b"\r\n\r\n") {
                        match tls.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    let text = String::from_utf8_lossy(&request);
                    let path = text.split(' ').nth(1).unwrap_or("/").to_owned();
                    if path.starts_with("/slow") {
                        tokio::time::sleep(Duration::from_secs(10)).await;
                    }
                    let _ = tls.write_all(&respond(&path)).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        (port, der)
    }

    fn ok_response(body: &[u8], content_length: bool) -> Vec<u8> {
        let mut out = if content_length {
            format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes()
        } else {
            // Chunked: no length up front, so only the streaming limit can stop it.
            let mut chunks = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
            for chunk in body.chunks(7) {
                chunks.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                chunks.extend_from_slice(chunk);
                chunks.extend_from_slice(b"\r\n");
            }
            chunks.extend_from_slice(b"0\r\n\r\n");
            return chunks;
        };
        out.extend_from_slice(body);
        out
    }

    #[tokio::test]
    async fn fetches_over_tls_with_limits() {
        let (port, ca) = https_server(|path| match path {
            "/small.yaml?k=v" => ok_response(b"version: 2023-04-20\n", true),
            "/big.yaml" => ok_response(&[b'#'; 100], true),
            "/chunked.yaml" => ok_response(&[b'#'; 100], false),
            "/moved.yaml" => {
                b"HTTP/1.1 302 Found\r\nLocation: https://elsewhere.example/x.yaml?sig=1\r\nContent-Length: 0\r\n\r\n".to_vec()
            }
            _ => b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_vec(),
        })
        .await;
        let remote = RemoteIncludes::new(vec![format!("localhost:{port}")], 64, &[ca]).unwrap();
        let at = |path: &str| url(&format!("https://localhost:{port}{path}"));

        assert_eq!(
            remote.fetch(&at("/small.yaml?k=v")).await.unwrap(),
            b"version: 2023-04-20\n"
        );
        let big = remote.fetch(&at("/big.yaml")).await.unwrap_err();
        assert!(
            big.contains("100 bytes") && big.contains("big.yaml"),
            "{big}"
        );
        let chunked = remote.fetch(&at("/chunked.yaml")).await.unwrap_err();
        assert!(chunked.contains("stopped reading"), "{chunked}");
        let moved = remote.fetch(&at("/moved.yaml")).await.unwrap_err();
        assert!(
            moved.contains("302") && moved.contains("not followed"),
            "{moved}"
        );
        assert!(
            moved.contains("elsewhere.example") && !moved.contains("sig=1"),
            "{moved}"
        );
        let missing = remote.fetch(&at("/missing.yaml")).await.unwrap_err();
        assert!(
            missing.contains("404") && missing.contains(&format!("localhost:{port}/missing.yaml")),
            "{missing}"
        );
        let slow = remote
            .clone()
            .with_timeout(Duration::from_millis(300))
            .fetch(&at("/slow.yaml"))
            .await
            .unwrap_err();
        assert!(slow.contains("within"), "{slow}");

        // Without the CA, the server's certificate is not trusted.
        let untrusted = RemoteIncludes::new(vec![format!("localhost:{port}")], 64, &[]);
        if let Ok(untrusted) = untrusted {
            let err = untrusted.fetch(&at("/small.yaml")).await.unwrap_err();
            assert!(err.contains("TLS") && err.contains("certificate"), "{err}");
        }
    }
}
