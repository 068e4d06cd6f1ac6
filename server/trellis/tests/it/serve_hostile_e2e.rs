//! End to end against a real `trellis serve`: what a careless or hostile client can do to the
//! engine's API and connections — idle connections and the connection limit, huge error lists,
//! undecodable requests, instance names that would forge output.

use std::io::{ErrorKind, Read};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::engine_common::{Engine, PATIENCE, client, runtime, write};
use crate::plugins_common::TempDir;
use trellis_proto::engine::v1 as api;

/// A blueprint with `n` resources, each with an error of its own (an unknown variable).
fn blueprint_with_errors(n: usize) -> String {
    let mut s = String::from("version: 2023-04-20\nresources:\n");
    for i in 0..n {
        s.push_str(&format!(
            "  r{i}:\n    type: sim/resource\n    spec:\n      latencyMs: \"${{variables.missing{i}}}\"\n"
        ));
    }
    s
}

// ---- item 11: invalid blueprints come back as diagnostics --------------------------------------

#[test]
fn plan_of_a_blueprint_with_hundreds_of_errors_shows_every_diagnostic() {
    const ERRORS: usize = 320;
    let dir = TempDir::new("hostile-many-errors");
    let engine = Engine::start(dir.path());
    write(&dir.path().join("bad.yaml"), &blueprint_with_errors(ERRORS));

    // Text: every diagnostic as `trellis validate` shows it, with its source line.
    let out = engine.cli(&["plan", "bad.yaml", "--instance", "app"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    let shown = stdout
        .lines()
        .filter(|l| l.starts_with("error[T0501]: unknown variable `missing"))
        .count();
    assert_eq!(shown, ERRORS, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("latencyMs: \"${variables.missing319}\""),
        "the source line is shown: {stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "error: the blueprint is invalid: {ERRORS} errors, 0 warnings"
        )),
        "{stdout}"
    );

    // JSON: the same diagnostics, in the shape of `trellis validate --format json`.
    let (code, doc) = engine.json(&["plan", "bad.yaml", "--instance", "app"]);
    assert_eq!(code, 1, "{doc}");
    let cs = &doc["changeSet"];
    assert_eq!(cs["status"], "INVALID", "{cs}");
    let diagnostics = cs["diagnostics"].as_array().unwrap();
    assert_eq!(diagnostics.len(), ERRORS);
    for (i, d) in diagnostics.iter().enumerate() {
        assert_eq!(d["severity"], "error");
        assert_eq!(d["code"], "T0501");
        assert_eq!(d["file"], "bad.yaml");
        assert_eq!(d["message"], format!("unknown variable `missing{i}`"));
        assert_eq!(d["line"], 4 * i + 6, "{d}");
        assert_eq!(d["column"], 31, "{d}");
    }

    // `deploy` stops at the plan the same way; nothing was recorded.
    let out = engine.cli(&["deploy", "bad.yaml", "--instance", "app"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout
            .lines()
            .filter(|l| l.starts_with("error[T0501]"))
            .count(),
        ERRORS
    );
    let (code, _) = engine.json(&["instance", "app"]);
    assert_eq!(code, 2, "an invalid blueprint creates no instance");

    // Over the API: an answer with every diagnostic, and a summary that stays one line.
    let rt = runtime();
    let answer = rt.block_on(async {
        client(&engine.addr)
            .await
            .create_change_set(api::CreateChangeSetRequest {
                instance: "app".into(),
                source: Some(api::BlueprintSource {
                    source: Some(api::blueprint_source::Source::Inline(
                        api::InlineBlueprint {
                            file_name: "bad.yaml".into(),
                            content: blueprint_with_errors(ERRORS).into_bytes(),
                            children: Vec::new(),
                            assets: vec![],
                        },
                    )),
                }),
                ..Default::default()
            })
            .await
    });
    let cs = answer
        .expect("an invalid blueprint is an answer")
        .into_inner();
    assert_eq!(cs.status(), api::ChangeSetStatus::Invalid);
    assert!(cs.id.is_empty());
    assert_eq!(cs.diagnostics.len(), ERRORS);
    assert!(!cs.summary.contains('\n'), "{}", cs.summary);
    assert!(
        cs.summary
            .starts_with(&format!("the blueprint has {ERRORS} errors")),
        "{}",
        cs.summary
    );
}

#[test]
fn child_blueprint_errors_come_back_as_diagnostics_too() {
    let dir = TempDir::new("hostile-child-errors");
    let engine = Engine::start(dir.path());
    write(
        &dir.path().join("app.yaml"),
        "version: 2023-04-20\ninclude:\n  net:\n    path: ./net.yaml\nresources:\n  own:\n    type: sim/resource\n    spec:\n      latencyMs: 0\n",
    );
    write(&dir.path().join("net.yaml"), &blueprint_with_errors(150));
    let (code, doc) = engine.json(&["plan", "app.yaml", "--instance", "app"]);
    assert_eq!(code, 1, "{doc}");
    let diagnostics = doc["changeSet"]["diagnostics"].as_array().unwrap();
    assert_eq!(diagnostics.len(), 150, "{doc}");
    assert!(diagnostics.iter().all(|d| d["file"] == "net.yaml"), "{doc}");
}

// ---- item 14: undecodable requests and instance names ------------------------------------------

/// Sends bytes as they are and reads the answer's bytes: a client that speaks gRPC framing
/// but not the engine's messages.
#[derive(Clone, Copy, Default)]
struct RawCodec;

struct RawEncoder;
struct RawDecoder;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

impl tonic::codec::Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        use prost::bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawDecoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        use prost::bytes::Buf;
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

async fn raw_call(addr: &str, method: &str, body: Vec<u8>) -> Result<Vec<u8>, tonic::Status> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("connect");
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
    let path = format!("/trellis.engine.v1.Engine/{method}")
        .parse()
        .unwrap();
    grpc.unary(tonic::Request::new(body), path, RawCodec)
        .await
        .map(|r| r.into_inner())
}

#[test]
fn undecodable_requests_are_invalid_argument() {
    let dir = TempDir::new("hostile-garbage");
    let engine = Engine::start(dir.path());
    let rt = runtime();
    // Field 1 with wire type 7, which does not exist; then a varint that never ends.
    for garbage in [vec![0x0f, 0x00], vec![0xff; 12]] {
        for method in ["GetInstance", "CreateChangeSet", "ListInstances"] {
            let err = rt
                .block_on(raw_call(&engine.addr, method, garbage.clone()))
                .expect_err("garbage is refused");
            assert_eq!(
                err.code(),
                tonic::Code::InvalidArgument,
                "{method} {garbage:?}: {err:?}"
            );
        }
    }
    // The engine's own errors keep their codes, and a well-formed request still works.
    let err = rt
        .block_on(raw_call(
            &engine.addr,
            "GetInstance",
            vec![0x0a, 0x01, b'x'],
        ))
        .expect_err("no such instance");
    assert_eq!(err.code(), tonic::Code::NotFound, "{err:?}");
    rt.block_on(raw_call(&engine.addr, "ListInstances", Vec::new()))
        .expect("an empty ListInstancesRequest is valid");
}

#[test]
fn instance_names_that_would_forge_output_are_refused() {
    let dir = TempDir::new("hostile-names");
    let engine = Engine::start(dir.path());
    write(
        &dir.path().join("ok.yaml"),
        "version: 2023-04-20\nresources:\n  r:\n    type: sim/resource\n    spec:\n      latencyMs: 0\n",
    );
    let long = "a".repeat(201);
    for name in [
        "app\nfake                DEPLOYED",
        "app\tx",
        "\u{1b}[2Kapp",
        "evil\u{202E}lmay",
        " app",
        long.as_str(),
    ] {
        let out = engine.cli(&["plan", "ok.yaml", "--instance", name]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name:?}: {stderr}");
        assert!(stderr.contains("instance name"), "{name:?}: {stderr}");
        assert!(
            !stderr.contains(['\u{1b}', '\u{202E}', '\t']),
            "the refusal does not print the raw name: {stderr:?}"
        );
    }
    // Through the API the rule is INVALID_ARGUMENT with its reason.
    let rt = runtime();
    let err = rt
        .block_on(async {
            client(&engine.addr)
                .await
                .create_change_set(api::CreateChangeSetRequest {
                    instance: "a\nb".into(),
                    source: Some(api::BlueprintSource {
                        source: Some(api::blueprint_source::Source::Inline(
                            api::InlineBlueprint {
                                file_name: "ok.yaml".into(),
                                content: b"version: 2023-04-20\nresources:\n  r:\n    type: sim/resource\n    spec:\n      latencyMs: 0\n".to_vec(),
                                children: Vec::new(),
                                assets: vec![],
                            },
                        )),
                    }),
                    ..Default::default()
                })
                .await
        })
        .expect_err("refused");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("(U+000A)"), "{}", err.message());

    let (code, list) = engine.json(&["instances"]);
    assert_eq!(code, 0, "{list}");
    assert_eq!(
        list["instances"].as_array().map(Vec::len),
        Some(0),
        "{list}"
    );
    // Ordinary names, Unicode included, still work.
    let out = engine.cli(&["plan", "ok.yaml", "--instance", "team/app-ü"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

// ---- item 10: idle connections, the connection limit, keepalive --------------------------------

/// A TCP connection that sends nothing, once the engine has accepted it (its HTTP/2 server
/// has written its settings).
fn idle_connection(engine: &Engine) -> TcpStream {
    let mut c = TcpStream::connect(&engine.addr).unwrap();
    c.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut first = [0u8; 1];
    assert_eq!(
        c.read(&mut first)
            .expect("the engine accepts the connection"),
        1
    );
    c
}

/// Reads until the engine closes `c`; false if it is still open after [`PATIENCE`].
fn closed_by_engine(c: &mut TcpStream) -> bool {
    let deadline = Instant::now() + PATIENCE;
    let mut buf = [0u8; 1024];
    while Instant::now() < deadline {
        match c.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return false;
            }
            Err(_) => return true,
        }
    }
    false
}

#[test]
fn an_idle_connection_is_closed_by_the_engine() {
    let dir = TempDir::new("hostile-idle");
    let engine = Engine::builder(dir.path())
        .args(&["--idle-timeout", "1s"])
        .start();
    // Not even the HTTP/2 preface.
    let mut silent = TcpStream::connect(&engine.addr).unwrap();
    silent.set_read_timeout(Some(PATIENCE)).unwrap();
    assert!(
        closed_by_engine(&mut silent),
        "the engine kept a silent connection open"
    );
    // Real clients are served as before.
    let (code, list) = engine.json(&["instances"]);
    assert_eq!(code, 0, "{list}");
}

#[test]
fn a_long_watch_is_not_idle() {
    let dir = TempDir::new("hostile-watch");
    let engine = Engine::builder(dir.path())
        .args(&["--idle-timeout", "1s"])
        .start();
    write(
        &dir.path().join("ok.yaml"),
        "version: 2023-04-20\nresources:\n  r:\n    type: sim/resource\n    spec:\n      latencyMs: 0\n",
    );
    let out = engine.cli(&["deploy", "ok.yaml", "--instance", "app"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let rt = runtime();
    rt.block_on(async {
        let mut c = client(&engine.addr).await;
        let mut stream = c
            .watch_instance(api::WatchInstanceRequest {
                instance: "app".into(),
                after_seq: 0,
                follow: true,
            })
            .await
            .unwrap()
            .into_inner();
        let mut last = 0;
        // Read what is there, then stay quiet well past the idle timeout.
        while let Ok(Ok(Some(item))) =
            tokio::time::timeout(Duration::from_millis(500), stream.message()).await
        {
            if let Some(api::watch_response::Item::Event(e)) = item.item {
                last = e.seq;
            }
        }
        assert!(last > 0);
        tokio::time::sleep(Duration::from_secs(4)).await;
        // The stream is still open: a new deploy's events arrive on it.
        write(
            &dir.path().join("ok.yaml"),
            "version: 2023-04-20\nresources:\n  r:\n    type: sim/resource\n    spec:\n      latencyMs: 1\n",
        );
        let out = engine.cli(&["deploy", "ok.yaml", "--instance", "app"]);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let deadline = Instant::now() + PATIENCE;
        loop {
            assert!(Instant::now() < deadline, "no new event on the watch");
            let item = tokio::time::timeout(PATIENCE, stream.message())
                .await
                .expect("the watch hangs")
                .expect("the watch stream broke: its connection was closed as idle")
                .expect("the watch ended");
            if let Some(api::watch_response::Item::Event(e)) = item.item
                && e.seq > last
            {
                break;
            }
        }
    });
}

#[test]
fn at_the_connection_limit_new_clients_wait_for_a_free_place() {
    let dir = TempDir::new("hostile-limit");
    let engine = Engine::builder(dir.path())
        .args(&["--max-connections", "2", "--idle-timeout", "0"])
        .start();
    let first = idle_connection(&engine);
    let _second = idle_connection(&engine);
    let mut waiting = Command::new(env!("CARGO_BIN_EXE_trellis"))
        .args(["instances", "--engine", &engine.addr])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Held back while both places are taken (a lower bound only: it has not been served yet).
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        waiting.try_wait().unwrap().is_none(),
        "a third connection was served past --max-connections 2"
    );
    // A place frees up: the waiting client is served.
    drop(first);
    let deadline = Instant::now() + PATIENCE;
    let status = loop {
        if let Some(status) = waiting.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the waiting client was never served"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    waiting
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(status.success(), "{stderr}");
}

#[test]
fn idle_connections_give_their_places_to_real_clients() {
    let dir = TempDir::new("hostile-limit-idle");
    let engine = Engine::builder(dir.path())
        .args(&["--max-connections", "3", "--idle-timeout", "1s"])
        .start();
    let mut idle: Vec<TcpStream> = (0..3).map(|_| idle_connection(&engine)).collect();
    // More idle connections than places: the extra ones wait, then are closed in turn.
    let extra: Vec<TcpStream> = (0..3)
        .map(|_| TcpStream::connect(&engine.addr).unwrap())
        .collect();
    let (code, list) = engine.json(&["instances"]);
    assert_eq!(code, 0, "{list}");
    for c in &mut idle {
        assert!(closed_by_engine(c), "an idle connection stayed open");
    }
    drop(extra);
}
