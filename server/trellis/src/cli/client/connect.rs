//! The connection to an engine: `http(s)://`, `host:port` or `unix:` addresses, TLS, and
//! the gRPC client the commands use.

use super::*;

/// Where the engine listens, from `--engine`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum EngineAddr {
    /// An `http://` URI.
    Http(String),
    /// An `https://` URI: TLS, trusting the system's roots and `--ca-cert`.
    Https(String),
    /// A Unix socket path.
    Unix(PathBuf),
}

/// Parses `http://host:port`, `host:port` (plain HTTP/2), `https://host:port` (TLS) or
/// `unix:/path`.
pub(super) fn parse_engine_addr(addr: &str) -> Result<EngineAddr, String> {
    let addr = addr.trim();
    if let Some(path) = addr.strip_prefix("unix:") {
        // `unix:///run/x.sock` (URI style) and `unix:/run/x.sock` mean the same path.
        let path = path.strip_prefix("//").unwrap_or(path);
        if path.is_empty() {
            return Err(format!("`{addr}`: the socket path is missing (unix:/path)"));
        }
        return Ok(EngineAddr::Unix(PathBuf::from(path)));
    }
    let (uri, tls) = match addr.split_once("://") {
        Some(("http", _)) => (addr.to_owned(), false),
        Some(("https", _)) => (addr.to_owned(), true),
        Some((scheme, _)) => {
            return Err(format!(
                "`{addr}`: unsupported scheme `{scheme}` (use http://host:port, \
                 https://host:port, host:port or unix:/path)"
            ));
        }
        None if addr.is_empty() => return Err("the engine address is empty".to_owned()),
        None => (format!("http://{addr}"), false),
    };
    match uri.parse::<Uri>() {
        Ok(u) if u.host().is_some_and(|h| !h.is_empty()) => Ok(if tls {
            EngineAddr::Https(uri)
        } else {
            EngineAddr::Http(uri)
        }),
        Ok(_) => Err(format!("`{addr}`: the host is missing")),
        Err(e) => Err(format!("`{addr}` is not a valid address: {e}")),
    }
}

/// The engine API client the commands use: every call carries the caller's token, if any.
pub type Api = EngineClient<InterceptedService<Channel, BearerToken>>;

/// Adds `authorization: Bearer TOKEN` to every call (nothing without a token). The value is
/// marked sensitive, so HTTP/2 never indexes it in its header tables.
#[derive(Clone, Default)]
pub struct BearerToken(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl std::fmt::Debug for BearerToken {
    /// Never the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "BearerToken(..)"
        } else {
            "BearerToken(none)"
        })
    }
}

impl BearerToken {
    /// A token as given (surrounding whitespace removed); `None` when it is empty.
    pub fn new(token: &str) -> Result<BearerToken, String> {
        let token = token.trim();
        if token.is_empty() {
            return Ok(BearerToken(None));
        }
        let mut value: tonic::metadata::MetadataValue<tonic::metadata::Ascii> =
            format!("Bearer {token}")
                .parse()
                .map_err(|_| "the token has characters a header cannot carry".to_owned())?;
        value.set_sensitive(true);
        Ok(BearerToken(Some(value)))
    }

    /// The token from `--token-file FILE` when given, else from `TRELLIS_TOKEN` (a token is
    /// never taken from the command line, where other users and shell history see it).
    pub(super) fn from_args(token_file: Option<&std::path::Path>) -> Result<BearerToken, Failure> {
        match token_file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| Failure::usage(format!("--token-file {}: {e}", path.display())))?;
                BearerToken::new(&text)
                    .map_err(|e| Failure::usage(format!("--token-file {}: {e}", path.display())))
            }
            None => BearerToken::new(&std::env::var("TRELLIS_TOKEN").unwrap_or_default())
                .map_err(|e| Failure::usage(format!("TRELLIS_TOKEN: {e}"))),
        }
    }
}

impl tonic::service::Interceptor for BearerToken {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            req.metadata_mut().insert("authorization", value.clone());
        }
        Ok(req)
    }
}

/// Connects to the engine at `addr` (any form [`parse_engine_addr`] accepts), without a
/// token. The connection is made now, so an engine that is not there is reported here with
/// the documented message.
pub async fn connect(addr: &str) -> Result<EngineClient<Channel>, Failure> {
    Ok(EngineClient::new(channel(addr, None).await?)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES))
}

/// [`connect`] with a token on every call.
pub async fn connect_with_token(addr: &str, token: &str) -> Result<Api, Failure> {
    let token = BearerToken::new(token).map_err(Failure::usage)?;
    connect_with(addr, None, token).await
}

/// [`connect`], also trusting the CA certificates in `ca_cert` (PEM) for an `https://`
/// engine (`ca_cert` is not used for the other kinds of address), with `token` on every call.
pub(super) async fn connect_with(
    addr: &str,
    ca_cert: Option<&std::path::Path>,
    token: BearerToken,
) -> Result<Api, Failure> {
    Ok(
        EngineClient::with_interceptor(channel(addr, ca_cert).await?, token)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
    )
}

/// The connection [`connect`] and [`connect_with`] make.
async fn channel(addr: &str, ca_cert: Option<&std::path::Path>) -> Result<Channel, Failure> {
    let target = parse_engine_addr(addr).map_err(|m| Failure::usage(format!("--engine {m}")))?;
    let connected = match target {
        EngineAddr::Http(uri) => {
            let endpoint = Endpoint::from_shared(uri)
                .map_err(|e| Failure::usage(format!("--engine `{addr}`: {e}")))?;
            endpoint.connect_timeout(CONNECT_TIMEOUT).connect().await
        }
        EngineAddr::Https(uri) => {
            let extra = match ca_cert {
                Some(path) => crate::engine::tls::read_certificates(path)
                    .map_err(|e| Failure::usage(format!("--ca-cert {e}")))?,
                None => Vec::new(),
            };
            let roots = crate::engine::tls::trust_roots(&extra)
                .map_err(|e| Failure::usage(format!("--engine `{addr}`: {e}; pass --ca-cert")))?;
            let tls = ClientTlsConfig::new()
                .trust_anchors(roots.roots)
                .timeout(CONNECT_TIMEOUT);
            let endpoint = Endpoint::from_shared(uri)
                .and_then(|e| e.tls_config(tls))
                .map_err(|e| Failure::usage(format!("--engine `{addr}`: {e}")))?;
            endpoint.connect_timeout(CONNECT_TIMEOUT).connect().await
        }
        EngineAddr::Unix(path) => {
            // The authority is never used for routing over a socket; any valid one will do.
            Endpoint::from_static("http://trellis-engine.invalid")
                .connect_timeout(CONNECT_TIMEOUT)
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        let stream = tokio::net::UnixStream::connect(path).await?;
                        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                    }
                }))
                .await
        }
    };
    let channel = connected.map_err(|e| {
        let detail = error_chain(&e);
        // "transport error" says nothing the caller does not know; its cause does.
        let detail = detail.strip_prefix("transport error: ").unwrap_or(&detail);
        if detail.contains("certificate") {
            // The engine is there; its certificate is not trusted (or not for this name).
            return Failure::new(
                2,
                "UNREACHABLE",
                format!(
                    "cannot reach the engine at {addr}: {detail} (for a self-signed or private \
                     CA certificate, pass --ca-cert FILE or set TRELLIS_CA_CERT)"
                ),
            );
        }
        Failure::unreachable(addr, detail)
    })?;
    Ok(channel)
}

/// An error and its causes, `a: b: c` (tonic's transport errors say little at the top).
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        // Some layers repeat their cause's text in their own.
        if !text.contains(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        source = s.source();
    }
    text
}

/// The connected API and the address it was reached at (for error messages).
pub(crate) struct Client {
    pub(crate) api: Api,
    pub(crate) engine: String,
}

impl Client {
    pub(crate) fn fail(&self, status: tonic::Status) -> Failure {
        status_failure(&status, &self.engine)
    }
}

/// The blueprint as sent to the engine: the file as given, and the files it includes.
pub(crate) fn blueprint_source(path: &str) -> Result<pb::BlueprintSource, Failure> {
    let content = crate::cli::read_limited(path, crate::document::DEFAULT_MAX_INPUT_BYTES)
        .map_err(|e| Failure::usage(format!("cannot read {path}: {e}")))?;
    let children = include_files(path, &content)?;
    Ok(pb::BlueprintSource {
        source: Some(pb::blueprint_source::Source::Inline(pb::InlineBlueprint {
            file_name: path.to_owned(),
            content,
            children,
            // Sent when the engine asks for them (docs/assets.md).
            assets: vec![],
        })),
    })
}

/// Local files the blueprint includes (and what they include), to send along with it: every
/// include whose `path` is written literally and relative, keyed by its path on this machine
/// as the blueprint's own name gives it (`sub/app.yaml` includes `./a.yaml` as `sub/a.yaml`),
/// which is how the engine looks them up. Paths with `${..}` or absolute ones
/// are resolved by the engine on its host; a file that cannot be read is left for the engine
/// to report where the include is written.
fn include_files(path: &str, content: &[u8]) -> Result<Vec<pb::SourceFile>, Failure> {
    let mut out: Vec<pb::SourceFile> = Vec::new();
    let root_dir = path
        .rfind('/')
        .map_or(String::new(), |i| path[..i].to_owned());
    let mut queue = vec![(root_dir, path.to_owned(), content.to_vec(), 0usize)];
    while let Some((dir, name, bytes, depth)) = queue.pop() {
        if depth > crate::engine::children::MAX_DEPTH {
            continue;
        }
        for literal in literal_includes(&name, bytes) {
            let key = crate::engine::children::normalize(&if dir.is_empty() {
                literal
            } else {
                format!("{dir}/{literal}")
            });
            if key == path || out.iter().any(|f| f.path == key) {
                continue;
            }
            let Ok(child) = std::fs::read(&key) else {
                continue;
            };
            let child_dir = key
                .rfind('/')
                .map_or(String::new(), |i| key[..i].to_owned());
            queue.push((child_dir, key.clone(), child.clone(), depth + 1));
            out.push(pb::SourceFile {
                path: key,
                content: child,
            });
        }
    }
    Ok(out)
}

/// The include paths of a document that are plain relative text (no `${..}`, no scheme).
fn literal_includes(name: &str, bytes: Vec<u8>) -> Vec<String> {
    use crate::subst::Part;
    let mut sources = crate::source::SourceMap::new();
    let mut diags = crate::diag::Diagnostics::default();
    let Some(file) = crate::document::load_bytes(&mut sources, name, bytes, usize::MAX, &mut diags)
    else {
        return Vec::new();
    };
    let format = crate::document::Format::from_path(name);
    let Some(root) = crate::document::parse(&sources, file, format, &mut diags) else {
        return Vec::new();
    };
    let bp = crate::blueprint::load(&root, sources.get(file), file, &mut diags);
    bp.include
        .iter()
        .filter_map(|inc| match inc.path.as_ref()?.parts.as_slice() {
            [Part::Lit(text)] if !text.starts_with('/') && !text.contains("://") => {
                Some(text.clone())
            }
            _ => None,
        })
        .collect()
}
