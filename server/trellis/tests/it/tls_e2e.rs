//! End to end over TLS: `trellis serve --tls-cert/--tls-key` reached by the CLI at an
//! `https://` address (with and without `--ca-cert`), and child blueprints fetched over https
//! from an allow-listed host (the HTTPS server runs in this test), refused from other hosts
//! and past `--max-include-bytes`. Certificates are made at test time with rcgen.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use crate::engine_common::Engine;
use crate::plugins_common::TempDir;
use serde_json::Value;
use tokio_rustls::rustls;

/// A CA and a server certificate it signed for `localhost` and 127.0.0.1, as PEM files in
/// `dir` (`ca.pem`, `server.pem`, `server-key.pem`), plus the server's DER chain and key.
struct Pki {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    chain: Vec<rustls::pki_types::CertificateDer<'static>>,
    key_der: Vec<u8>,
}

fn make_pki(dir: &Path) -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "trellis test CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);

    let key = KeyPair::generate().unwrap();
    let params =
        CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();

    let pki = Pki {
        ca: dir.join("ca.pem"),
        cert: dir.join("server.pem"),
        key: dir.join("server-key.pem"),
        chain: vec![cert.der().clone()],
        key_der: key.serialize_der(),
    };
    std::fs::write(&pki.ca, ca_cert.pem()).unwrap();
    std::fs::write(&pki.cert, cert.pem()).unwrap();
    std::fs::write(&pki.key, key.serialize_pem()).unwrap();
    pki
}

fn serve_with_tls_args(pki: &Pki) -> Vec<String> {
    vec![
        "--tls-cert".into(),
        pki.cert.display().to_string(),
        "--tls-key".into(),
        pki.key.display().to_string(),
    ]
}

#[test]
fn cli_reaches_a_tls_engine_with_its_ca() {
    let root = TempDir::new("tls-api");
    let pki = make_pki(root.path());
    let args = serve_with_tls_args(&pki);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let engine = Engine::builder(root.path()).args(&args).start();
    assert!(
        engine.addr.starts_with("https://127.0.0.1:"),
        "{}",
        engine.addr
    );
    let https = format!("https://localhost:{}", engine.port());
    let ca = pki.ca.to_str().unwrap();

    // Trusting the test CA: the command works, by name and by IP address.
    for addr in [https.as_str(), engine.addr.as_str()] {
        let out = engine.cli_at(addr, &["instances", "--ca-cert", ca, "--format", "json"]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{addr}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(v["instances"].is_array(), "{v}");
    }
    // The same through the environment.
    let out = Command::new(env!("CARGO_BIN_EXE_trellis"))
        .args(["instances", "--format", "json"])
        .env("TRELLIS_ENGINE", &https)
        .env("TRELLIS_CA_CERT", ca)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Without the CA the certificate is not trusted: exit 2 and a message saying so.
    let out = engine.cli_at(&https, &["instances"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(
        stderr.contains("--ca-cert") && stderr.contains(&https),
        "{stderr}"
    );
    assert!(!stderr.contains('\u{1b}'), "{stderr}");

    // Plain HTTP/2 to a TLS engine fails; a CA file that is not one is a usage error.
    let out = engine.cli_at(
        &format!("http://localhost:{}", engine.port()),
        &["instances"],
    );
    assert_eq!(out.status.code(), Some(2));
    let out = engine.cli_at(
        &https,
        &["instances", "--ca-cert", pki.key.to_str().unwrap()],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--ca-cert") && stderr.contains("no PEM certificate"),
        "{stderr}"
    );
}

#[test]
fn serve_refuses_incomplete_or_invalid_tls_settings() {
    let root = TempDir::new("tls-bad");
    let pki = make_pki(root.path());
    let serve = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_trellis"))
            .arg("serve")
            .args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(root.join("data"))
            .args(args)
            .env_remove("TRELLIS_TLS_CERT")
            .env_remove("TRELLIS_TLS_KEY")
            .output()
            .unwrap()
    };
    let cert = pki.cert.to_str().unwrap();
    let key = pki.key.to_str().unwrap();
    let out = serve(&["--tls-cert", cert]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--tls-cert") && stderr.contains("--tls-key"),
        "{stderr}"
    );
    // A key that is not the certificate's.
    let other = root.join("other-key.pem");
    std::fs::write(&other, rcgen::KeyPair::generate().unwrap().serialize_pem()).unwrap();
    let out = serve(&["--tls-cert", cert, "--tls-key", other.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--tls-key") && stderr.contains("other-key.pem"),
        "{stderr}"
    );
    let out = serve(&["--tls-cert", key, "--tls-key", key]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no PEM certificate"));
}

/// A small HTTPS server on 127.0.0.1 serving `files` by path (HTTP/1.1, one request per
/// connection), recording the paths asked for. Runs until the test process ends.
fn https_server(pki: &Pki, files: Vec<(&'static str, Vec<u8>)>) -> (u16, Arc<Mutex<Vec<String>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        pki.chain.clone(),
        rustls::pki_types::PrivateKeyDer::Pkcs8(pki.key_der.clone().into()),
    )
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let asked = Arc::new(Mutex::new(Vec::new()));
    let log = asked.clone();
    let files = Arc::new(files);
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, files, log) = (acceptor.clone(), files.clone(), log.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut request = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match tls.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    let text = String::from_utf8_lossy(&request);
                    let path = text.split(' ').nth(1).unwrap_or("/").to_owned();
                    log.lock().unwrap().push(path.clone());
                    // The query (a token, say) is logged but does not pick the file.
                    let file = path.split('?').next().unwrap_or_default();
                    let response = match files.iter().find(|(p, _)| *p == file) {
                        Some((_, body)) => {
                            let mut r = format!(
                                "HTTP/1.1 200 OK\r\nContent-Type: application/yaml\r\n\
                                 Content-Length: {}\r\nConnection: close\r\n\r\n",
                                body.len()
                            )
                            .into_bytes();
                            r.extend_from_slice(body);
                            r
                        }
                        None => b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_vec(),
                    };
                    let _ = tls.write_all(&response).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
    });
    (port, asked)
}

const CHILD: &str = r#"
version: 2023-04-20
include:
  nested:
    path: ./grand.yaml
resources:
  file:
    type: local/file
    spec:
      path: from-remote.txt
      content: fetched over https
exports:
  path:
    type: string
    field: resources.file.spec.path
"#;

const GRANDCHILD: &str = r#"
version: 2023-04-20
resources:
  file:
    type: local/file
    spec:
      path: from-grandchild.txt
      content: nested
"#;

fn parent(url: &str) -> String {
    format!(
        r#"
version: 2023-04-20
include:
  remote:
    path: {url}
resources:
  pointer:
    type: local/file
    spec:
      path: pointer.txt
      content: ${{children.remote.path}}
"#
    )
}

#[test]
fn https_includes_come_only_from_allow_listed_hosts_within_the_size_limit() {
    let root = TempDir::new("tls-include");
    let pki = make_pki(root.path());
    let big = format!("version: 2023-04-20\n{}", "# padding\n".repeat(500));
    let (port, asked) = https_server(
        &pki,
        vec![
            ("/bp/child.yaml", CHILD.as_bytes().to_vec()),
            ("/bp/grand.yaml", GRANDCHILD.as_bytes().to_vec()),
            ("/bp/big.yaml", big.into_bytes()),
        ],
    );
    let allowed = format!("localhost:{port}");
    let engine = Engine::builder(root.path())
        .args(&[
            "--allow-include-host",
            &allowed,
            "--include-ca-cert",
            pki.ca.to_str().unwrap(),
            "--max-include-bytes",
            "2000",
        ])
        .start();

    // From the allow-listed host: the child and the file it includes relative to its URL.
    std::fs::write(
        root.join("main.yaml"),
        parent(&format!(
            "https://localhost:{port}/bp/child.yaml?token=s3cret"
        )),
    )
    .unwrap();
    let (code, out) = engine.json(&["deploy", "main.yaml", "--instance", "main"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        std::fs::read_to_string(root.join("from-remote.txt")).unwrap(),
        "fetched over https"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("from-grandchild.txt")).unwrap(),
        "nested"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("pointer.txt")).unwrap(),
        "from-remote.txt"
    );
    assert_eq!(
        *asked.lock().unwrap(),
        ["/bp/child.yaml?token=s3cret", "/bp/grand.yaml"]
    );
    let (code, child) = engine.json(&["instance", "main/remote"]);
    assert_eq!(code, 0, "{child}");
    assert_eq!(child["status"], "DEPLOYED", "{child}");

    // The same server by another name is not allow-listed: refused without a request.
    asked.lock().unwrap().clear();
    std::fs::write(
        root.join("other.yaml"),
        parent(&format!("https://127.0.0.1:{port}/bp/child.yaml")),
    )
    .unwrap();
    let (code, out) = engine.json(&["deploy", "other.yaml", "--instance", "other"]);
    assert_eq!(code, 1, "{out}");
    let text = out.to_string();
    assert!(
        text.contains(&format!("host `127.0.0.1:{port}` is not allow-listed")),
        "{text}"
    );
    assert!(text.contains("include `remote`"), "{text}");
    assert!(asked.lock().unwrap().is_empty());

    // Larger than --max-include-bytes: refused.
    std::fs::write(
        root.join("big.yaml"),
        parent(&format!("https://localhost:{port}/bp/big.yaml")),
    )
    .unwrap();
    let (code, out) = engine.json(&["deploy", "big.yaml", "--instance", "big"]);
    assert_eq!(code, 1, "{out}");
    let text = out.to_string();
    assert!(text.contains("--max-include-bytes"), "{text}");
    assert!(text.contains("/bp/big.yaml"), "{text}");

    // Plain http:// is never fetched.
    std::fs::write(
        root.join("plain.yaml"),
        parent(&format!("http://localhost:{port}/bp/child.yaml")),
    )
    .unwrap();
    let (code, out) = engine.json(&["deploy", "plain.yaml", "--instance", "plain"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.to_string().contains("not encrypted"), "{out}");
}
