//! `trellis plugins check PLUGIN [--cases FILE]`: the conformance harness a plugin author runs
//! against their executable (docs/plugin-protocol.md, "Checking a plugin").
//!
//! Without cases it checks what every plugin must do: launch and handshake (the stdout line,
//! the nonce, the protocol version, its name), the manifest (well-formed schemas, computed
//! fields not required, link types naming known types, function signatures), gRPC health,
//! and both ways of stopping (SIGTERM, stdin reaching end-of-file: exit 0, socket removed).
//! With a cases file (a YAML or JSON list of `{type, config?, spec, update?}`) it runs each
//! case through a provider's life: validate, create, read (what was written must read back:
//! a field that reads differently is phantom drift), a repeated create with the same
//! idempotency key (no second resource), update, read, destroy, read (gone), destroy again
//! (and, when the plugin declares `destroy_resources`, again as a DestroyResources of two);
//! an importable type's resource is also imported by its id and must read back as imported.
//!
//! Every finding names the check, the RPC and, where there is one, the field. The lifecycle
//! checks launch the executable directly, as the engine would; the calls go through the
//! engine's own plugin host, so a plugin is judged by the client it will meet.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value as Json, json};
use trellis_proto::plugin::v1 as pb;

use crate::cli::OutputFormat;
use crate::plugins::{
    CallOptions, HostConfig, PluginError, PluginHost, PluginKind, ProviderClient, values,
};

/// How long a plugin may take to print its handshake line, and to exit once asked to.
const START_LIMIT: Duration = Duration::from_secs(30);
const STOP_LIMIT: Duration = Duration::from_secs(20);

#[derive(clap::Args, Debug)]
pub struct PluginsCheckArgs {
    /// The plugin: a path to its executable (named `trellis-provider-NAME` or
    /// `trellis-transformer-NAME`), or the name of a discovered plugin.
    #[arg(value_name = "PLUGIN")]
    pub plugin: String,
    /// A YAML or JSON list of cases, each `{type, config?, spec, update?}`: a
    /// resource of `type` created with `spec` (and the provider configuration
    /// `config`), updated to `update` when given, then destroyed.
    #[arg(long, value_name = "FILE")]
    pub cases: Option<PathBuf>,
    #[command(flatten)]
    pub dirs: super::plugin_cmds::PluginDirArgs,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub format: OutputFormat,
}

/// One thing found wrong.
#[derive(Debug, Clone, PartialEq)]
struct Finding {
    /// The RPC (or step) that showed it: `Handshake`, `ReadResource`, `launch`...
    rpc: String,
    /// The field it is about (`spec.mode`, `resource_types[0].spec_schema.fields.id`).
    field: Option<String>,
    message: String,
}

impl Finding {
    fn new(rpc: &str, message: impl Into<String>) -> Finding {
        Finding {
            rpc: rpc.to_owned(),
            field: None,
            message: message.into(),
        }
    }

    fn at(mut self, field: impl Into<String>) -> Finding {
        self.field = Some(field.into());
        self
    }
}

/// The outcome of one check.
struct Checked {
    name: String,
    findings: Vec<Finding>,
}

/// A case from the cases file.
#[derive(Debug, Clone)]
struct Case {
    resource_type: String,
    config: Option<Json>,
    spec: Json,
    update: Option<Json>,
}

pub async fn run(args: &PluginsCheckArgs) -> ExitCode {
    let path = match resolve(args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let cases = match &args.cases {
        Some(file) => match load_cases(file) {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        },
        None => None,
    };
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut report: Vec<Checked> = Vec::new();
    let Some((kind, name)) = crate::plugins::parse_file_name(&file_name) else {
        report.push(Checked {
            name: "file name".into(),
            findings: vec![Finding::new(
                "launch",
                format!(
                    "`{file_name}` is not a plugin's name: the engine discovers \
                     `trellis-provider-NAME` and `trellis-transformer-NAME` ([A-Za-z0-9_-])"
                ),
            )],
        });
        return finish(&path, report, args.format);
    };
    let name = name.to_owned();
    if cases.is_some() && kind != PluginKind::Provider {
        eprintln!(
            "error: --cases runs resources through a provider; `{file_name}` is a transformer"
        );
        return ExitCode::from(2);
    }
    let scratch = match Scratch::new() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: cannot make a scratch directory: {e}");
            return ExitCode::from(2);
        }
    };

    // The lifecycle, as the engine's launcher sees it.
    let (handshake, launched) = lifecycle_handshake(&path, kind, &name, &scratch).await;
    report.push(handshake);
    if launched {
        report.push(stop_check(&path, &scratch, Stop::Sigterm).await);
        report.push(stop_check(&path, &scratch, Stop::StdinEof).await);
    }

    // The calls, through the engine's plugin host.
    if launched {
        let host = match host_for(&path, &scratch) {
            Ok(h) => h,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        };
        let manifest = host
            .manifests(&[(kind, name.as_str())])
            .await
            .pop()
            .expect("one answer per plugin");
        match manifest {
            Err(e) => report.push(Checked {
                name: "manifest".into(),
                findings: vec![Finding::new("GetManifest", e.to_string())],
            }),
            Ok(m) => {
                report.push(Checked {
                    name: "manifest".into(),
                    findings: manifest_findings(&m, kind, &name),
                });
                if let (Some(cases), Ok(client)) = (&cases, host.provider(&name)) {
                    for (i, case) in cases.iter().enumerate() {
                        report.push(Checked {
                            name: format!("case {} ({})", i + 1, case.resource_type),
                            findings: run_case(&client, &m, case, i).await,
                        });
                    }
                }
            }
        }
        host.shutdown().await;
    }
    finish(&path, report, args.format)
}

/// The executable PLUGIN names: a path, or a discovered plugin's name.
fn resolve(args: &PluginsCheckArgs) -> Result<PathBuf, String> {
    let given = Path::new(&args.plugin);
    if args.plugin.contains('/') || given.is_file() {
        let meta = std::fs::metadata(given).map_err(|e| format!("{}: {e}", given.display()))?;
        if !meta.is_file() {
            return Err(format!("{} is not a file", given.display()));
        }
        return std::path::absolute(given).map_err(|e| e.to_string());
    }
    let host = PluginHost::new(args.dirs.host_config());
    let found = host
        .plugins()
        .into_iter()
        .find(|p| p.name == args.plugin)
        .map(|p| p.path);
    found.ok_or_else(|| {
        format!(
            "no plugin named `{}` (`trellis plugins list` shows them; or give a path)",
            args.plugin
        )
    })
}

fn load_cases(file: &Path) -> Result<Vec<Case>, String> {
    let bytes = super::environment::read_limited(file)?;
    let (_, root) = super::environment::parse_file(file, bytes)?;
    let json = trellis_lang::transform::to_json(&root);
    let shown = file.display();
    let items = json
        .as_array()
        .ok_or_else(|| format!("{shown}: expected a list of cases"))?;
    items
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let at = |what: &str| format!("{shown}: case {}: {what}", i + 1);
            let obj = c.as_object().ok_or_else(|| at("expected a map"))?;
            for key in obj.keys() {
                if !["type", "config", "spec", "update"].contains(&key.as_str()) {
                    return Err(at(&format!(
                        "unknown key `{key}` (expected type, config, spec, update)"
                    )));
                }
            }
            let resource_type = obj
                .get("type")
                .and_then(Json::as_str)
                .ok_or_else(|| at("`type` (a string) is required"))?
                .to_owned();
            let spec = obj
                .get("spec")
                .filter(|s| s.is_object())
                .cloned()
                .ok_or_else(|| at("`spec` (a map) is required"))?;
            let update = match obj.get("update") {
                None | Some(Json::Null) => None,
                Some(u) if u.is_object() => Some(u.clone()),
                Some(_) => return Err(at("`update` must be a map")),
            };
            Ok(Case {
                resource_type,
                config: obj.get("config").filter(|c| !c.is_null()).cloned(),
                spec,
                update,
            })
        })
        .collect()
}

/// A private directory for sockets and the host's files, removed at the end.
struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    fn new() -> std::io::Result<Scratch> {
        use std::os::unix::fs::DirBuilderExt;
        let dir =
            std::env::temp_dir().join(format!("trellis-check-{}", trellis_ids::random_hex(6)));
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        Ok(Scratch { dir })
    }

    /// A fresh 0700 socket directory for one launch.
    fn socket_dir(&self) -> std::io::Result<PathBuf> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = self.dir.join(format!("s-{}", trellis_ids::random_hex(4)));
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        Ok(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A plugin process started the way the engine starts one.
struct Launched {
    child: Child,
    socket: PathBuf,
    nonce: String,
    stderr: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Launched {
    fn stderr_tail(&self) -> String {
        let lines = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
        let tail: Vec<&str> = lines
            .iter()
            .rev()
            .take(5)
            .rev()
            .map(String::as_str)
            .collect();
        if tail.is_empty() {
            String::new()
        } else {
            format!("; its stderr ends with: {}", tail.join(" | "))
        }
    }
}

impl Drop for Launched {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the plugin and reads its handshake line.
async fn launch(path: &Path, scratch: &Scratch) -> Result<Launched, Finding> {
    let dir = scratch
        .socket_dir()
        .map_err(|e| Finding::new("launch", format!("cannot make a socket directory: {e}")))?;
    let nonce = trellis_ids::random_hex(16);
    let mut child = Command::new(path)
        .env(crate::plugins::ENV_NONCE, &nonce)
        .env(crate::plugins::ENV_PROTOCOL_VERSIONS, "1")
        .env(crate::plugins::ENV_SOCKET_DIR, &dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Finding::new("launch", format!("cannot start it: {e}")))?;
    let stderr = Arc::new(std::sync::Mutex::new(Vec::new()));
    if let Some(err) = child.stderr.take() {
        let lines = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                lines.lock().unwrap_or_else(|e| e.into_inner()).push(line);
            }
        });
    }
    let stdout = child.stdout.take().expect("piped");
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        let read = reader.read_line(&mut line).map(|_| line);
        let _ = tx.send(read);
        // Keep reading so a chatty plugin never blocks on a full pipe.
        for _ in reader.lines() {}
    });
    let mut launched = Launched {
        child,
        socket: PathBuf::new(),
        nonce,
        stderr,
    };
    let line = match tokio::time::timeout(START_LIMIT, rx).await {
        Ok(Ok(Ok(line))) if !line.is_empty() => line,
        Ok(_) => {
            return Err(Finding::new(
                "launch",
                format!(
                    "it exited or closed stdout before printing its handshake line{}",
                    launched.stderr_tail()
                ),
            ));
        }
        Err(_) => {
            return Err(Finding::new(
                "launch",
                format!(
                    "no handshake line on stdout within {}s{}",
                    START_LIMIT.as_secs(),
                    launched.stderr_tail()
                ),
            ));
        }
    };
    let line = line.trim_end();
    let Some(rest) = line.strip_prefix(crate::plugins::HANDSHAKE_PREFIX) else {
        return Err(Finding::new(
            "launch",
            format!(
                "the first line on stdout must be the handshake line `TRELLIS_PLUGIN|1|unix|PATH`, got `{line}`"
            ),
        ));
    };
    launched.socket =
        crate::plugins::parse_handshake_line(rest, &dir).map_err(|e| Finding::new("launch", e))?;
    Ok(launched)
}

/// Launch, the handshake line, the socket's mode, Handshake (a wrong nonce refused, the
/// right one answered with protocol 1 and the plugin's own kind and name) and health.
async fn lifecycle_handshake(
    path: &Path,
    kind: PluginKind,
    name: &str,
    scratch: &Scratch,
) -> (Checked, bool) {
    // Whether it launched and answered the handshake: the other checks need that much.
    let mut findings = Vec::new();
    let checked = |findings, answered| {
        (
            Checked {
                name: "launch and handshake".into(),
                findings,
            },
            answered,
        )
    };
    let launched = match launch(path, scratch).await {
        Ok(l) => l,
        Err(f) => return checked(vec![f], false),
    };
    // The socket's own mode is not the protocol's business: its 0700 directory keeps other
    // users out (docs/plugin-protocol.md, "2."). It must exist, though.
    if !launched.socket.exists() {
        findings.push(Finding::new(
            "launch",
            format!(
                "the announced socket {} does not exist",
                launched.socket.display()
            ),
        ));
    }
    let channel = match crate::plugins::connect_plugin_socket(launched.socket.clone()).await {
        Ok(c) => c,
        Err(e) => {
            findings.push(Finding::new(
                "launch",
                format!("cannot connect to its socket: {e}"),
            ));
            return checked(findings, false);
        }
    };
    let mut plugin = pb::plugin_client::PluginClient::new(channel.clone());
    let request = |nonce: &str| pb::HandshakeRequest {
        nonce: nonce.to_owned(),
        protocol_versions: vec![1],
        ..Default::default()
    };
    match plugin.handshake(request("not-the-nonce")).await {
        Ok(_) => findings.push(
            Finding::new(
                "Handshake",
                "a wrong nonce was accepted (answer FAILED_PRECONDITION)",
            )
            .at("nonce"),
        ),
        Err(s) if s.code() != tonic::Code::FailedPrecondition => findings.push(
            Finding::new(
                "Handshake",
                format!(
                    "a wrong nonce was refused with {:?}, not FAILED_PRECONDITION",
                    s.code()
                ),
            )
            .at("nonce"),
        ),
        Err(_) => {}
    }
    let mut answered = false;
    match plugin.handshake(request(&launched.nonce)).await {
        Err(s) => findings.push(Finding::new(
            "Handshake",
            format!(
                "the right nonce was refused: {:?}: {}",
                s.code(),
                s.message()
            ),
        )),
        Ok(r) => {
            answered = true;
            let r = r.into_inner();
            if r.protocol_version != 1 {
                findings.push(
                    Finding::new(
                        "Handshake",
                        format!(
                            "answered protocol version {}, asked for 1",
                            r.protocol_version
                        ),
                    )
                    .at("protocol_version"),
                );
            }
            let info = r.plugin.unwrap_or_default();
            if info.name != name || info.kind != proto_kind(kind) as i32 {
                findings.push(
                    Finding::new(
                        "Handshake",
                        format!(
                            "says it is {} `{}`, but its file name says {} `{name}`",
                            kind_name(info.kind),
                            info.name,
                            kind.as_str()
                        ),
                    )
                    .at("plugin"),
                );
            }
            if info.version.is_empty() {
                findings.push(Finding::new("Handshake", "no version").at("plugin.version"));
            }
        }
    }
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    match health
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
    {
        Ok(r)
            if r.get_ref().status
                == tonic_health::pb::health_check_response::ServingStatus::Serving as i32 => {}
        Ok(r) => findings.push(Finding::new(
            "Health.Check",
            format!(
                "answered status {} for the server, not SERVING",
                r.get_ref().status
            ),
        )),
        Err(s) => findings.push(Finding::new(
            "Health.Check",
            format!(
                "grpc.health.v1 is not served: {:?}: {}",
                s.code(),
                s.message()
            ),
        )),
    }
    checked(findings, answered)
}

fn proto_kind(kind: PluginKind) -> pb::PluginKind {
    match kind {
        PluginKind::Provider => pb::PluginKind::Provider,
        PluginKind::Transformer => pb::PluginKind::Transformer,
    }
}

fn kind_name(kind: i32) -> &'static str {
    match pb::PluginKind::try_from(kind) {
        Ok(pb::PluginKind::Provider) => "provider",
        Ok(pb::PluginKind::Transformer) => "transformer",
        _ => "an unknown kind of plugin",
    }
}

#[derive(Clone, Copy)]
enum Stop {
    Sigterm,
    StdinEof,
}

/// Asked to stop (SIGTERM, or its stdin closed as when the engine dies), the plugin exits 0
/// in time and removes its socket.
async fn stop_check(path: &Path, scratch: &Scratch, how: Stop) -> Checked {
    let (name, step) = match how {
        Stop::Sigterm => ("stops on SIGTERM", "SIGTERM"),
        Stop::StdinEof => ("stops when stdin closes", "stdin EOF"),
    };
    let checked = |findings| Checked {
        name: name.into(),
        findings,
    };
    let mut launched = match launch(path, scratch).await {
        Ok(l) => l,
        Err(f) => return checked(vec![f]),
    };
    match how {
        Stop::Sigterm => {
            // SAFETY: signalling the child this function started and has not reaped.
            unsafe {
                libc::kill(launched.child.id() as i32, libc::SIGTERM);
            }
        }
        Stop::StdinEof => drop(launched.child.stdin.take()),
    }
    let deadline = Instant::now() + STOP_LIMIT;
    let status = loop {
        match launched.child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            _ => break None,
        }
    };
    let mut findings = Vec::new();
    match status {
        None => findings.push(Finding::new(
            step,
            format!("still running {}s after {step}", STOP_LIMIT.as_secs()),
        )),
        Some(s) if s.code() != Some(0) => findings.push(Finding::new(
            step,
            format!(
                "exited with {} after {step}, not 0{}",
                crate::plugins::describe_exit(s),
                launched.stderr_tail()
            ),
        )),
        Some(_) => {}
    }
    if status.is_some() && launched.socket.exists() {
        findings.push(Finding::new(
            step,
            format!("left its socket {} behind", launched.socket.display()),
        ));
    }
    checked(findings)
}

/// A plugin host that finds the plugin where it is (a launcher script may find its files
/// beside itself), with a cache of its own.
fn host_for(path: &Path, scratch: &Scratch) -> Result<PluginHost, String> {
    let dir = path.parent().ok_or("the plugin's path has no directory")?;
    let mut config = HostConfig::with_data_dir(&scratch.dir.join("data"));
    config.plugin_dirs = vec![dir.to_path_buf()];
    config.search_exe_dir = false;
    config.shutdown_grace = Duration::from_secs(5);
    Ok(PluginHost::new(config))
}

/// What is wrong with a manifest.
fn manifest_findings(m: &pb::Manifest, kind: PluginKind, name: &str) -> Vec<Finding> {
    let mut out = Vec::new();
    let declared: Vec<&str> = m.resource_types.iter().map(|t| t.r#type.as_str()).collect();
    let types = match kind {
        PluginKind::Provider => &m.resource_types,
        PluginKind::Transformer => &m.abstract_resource_types,
    };
    let list = match kind {
        PluginKind::Provider => "resource_types",
        PluginKind::Transformer => "abstract_resource_types",
    };
    let mut seen = std::collections::HashSet::new();
    for (i, t) in types.iter().enumerate() {
        let at = format!("{list}[{i}]");
        if !seen.insert(t.r#type.as_str()) {
            out.push(
                Finding::new("GetManifest", format!("`{}` is declared twice", t.r#type)).at(&at),
            );
        }
        if kind == PluginKind::Provider && !t.r#type.starts_with(&format!("{name}/")) {
            out.push(
                Finding::new(
                    "GetManifest",
                    format!(
                        "resource type `{}` is not in the plugin's namespace `{name}/`",
                        t.r#type
                    ),
                )
                .at(&at),
            );
        }
        match &t.spec_schema {
            None => out.push(
                Finding::new("GetManifest", "no spec schema").at(format!("{at}.spec_schema")),
            ),
            Some(s) if s.r#type != pb::SchemaType::Object as i32 => out.push(
                Finding::new("GetManifest", "a spec schema must be an OBJECT")
                    .at(format!("{at}.spec_schema")),
            ),
            Some(s) => schema_findings(s, &format!("{at}.spec_schema"), &mut out),
        }
    }
    for (i, l) in m.link_types.iter().enumerate() {
        let at = format!("link_types[{i}]");
        let link = format!("{}::{}", l.resource_type_a, l.resource_type_b);
        for side in [l.resource_type_a.as_str(), l.resource_type_b.as_str()] {
            if side.is_empty() {
                out.push(
                    Finding::new(
                        "GetManifest",
                        format!("link type `{link}` leaves a side empty"),
                    )
                    .at(&at),
                );
                continue;
            }
            // A type of this plugin's namespace must be one it declares; another namespace's
            // belongs to another provider, which this check cannot see.
            if side.starts_with(&format!("{name}/")) && !declared.contains(&side) {
                out.push(
                    Finding::new(
                        "GetManifest",
                        format!(
                            "link type `{link}` names `{side}`, which the plugin does not declare"
                        ),
                    )
                    .at(&at),
                );
            }
        }
    }
    let mut names = std::collections::HashSet::new();
    for (i, f) in m.functions.iter().enumerate() {
        let at = format!("functions[{i}]");
        if f.name.is_empty() {
            out.push(Finding::new("GetManifest", "a function without a name").at(&at));
        } else if !names.insert(f.name.as_str()) {
            out.push(
                Finding::new(
                    "GetManifest",
                    format!("function `{}` is declared twice", f.name),
                )
                .at(&at),
            );
        }
        if f.returns == pb::SchemaType::Unspecified as i32 {
            out.push(
                Finding::new(
                    "GetManifest",
                    format!("function `{}` declares no return type", f.name),
                )
                .at(format!("{at}.returns")),
            );
        }
        for (j, p) in f.params.iter().enumerate() {
            if p.name.is_empty() || p.r#type == pb::SchemaType::Unspecified as i32 {
                out.push(
                    Finding::new(
                        "GetManifest",
                        format!(
                            "parameter {} of `{}` needs a name and a type",
                            j + 1,
                            f.name
                        ),
                    )
                    .at(format!("{at}.params[{j}]")),
                );
            }
        }
    }
    out
}

fn schema_findings(s: &pb::Schema, at: &str, out: &mut Vec<Finding>) {
    if s.r#type == pb::SchemaType::Unspecified as i32 {
        out.push(Finding::new("GetManifest", "a schema without a type").at(at));
    }
    if s.r#type == pb::SchemaType::Array as i32 && s.items.is_none() {
        out.push(Finding::new("GetManifest", "an ARRAY schema without `items`").at(at));
    }
    let mut names = std::collections::HashSet::new();
    for f in &s.fields {
        let field_at = format!("{at}.fields.{}", f.name);
        if f.name.is_empty() {
            out.push(Finding::new("GetManifest", "a field without a name").at(at));
        } else if !names.insert(f.name.as_str()) {
            out.push(
                Finding::new(
                    "GetManifest",
                    format!("field `{}` is declared twice", f.name),
                )
                .at(&field_at),
            );
        }
        if f.computed && f.required {
            out.push(
                Finding::new(
                    "GetManifest",
                    "a computed field cannot be required: the provider sets it, a blueprint cannot",
                )
                .at(&field_at),
            );
        }
        match &f.schema {
            None => out.push(Finding::new("GetManifest", "a field without a schema").at(&field_at)),
            Some(child) => schema_findings(child, &field_at, out),
        }
    }
    if let Some(items) = &s.items {
        schema_findings(items, &format!("{at}.items"), out);
    }
    if let Some(values) = &s.values {
        schema_findings(values, &format!("{at}.values"), out);
    }
}

/// One case through its life.
async fn run_case(
    client: &ProviderClient,
    m: &pb::Manifest,
    case: &Case,
    index: usize,
) -> Vec<Finding> {
    let mut out = Vec::new();
    if !m
        .resource_types
        .iter()
        .any(|t| t.r#type == case.resource_type)
    {
        out.push(Finding::new(
            "GetManifest",
            format!(
                "the plugin declares no resource type `{}`",
                case.resource_type
            ),
        ));
        return out;
    }
    let name = format!("check-{}", index + 1);
    let options = |key: &str| CallOptions {
        idempotency_key: Some(key.to_owned()),
        instance_id: "trellis-plugins-check".into(),
        provider_config: case.config.as_ref().map(values::from_json),
        ..CallOptions::default()
    };
    let spec = values::from_json(&case.spec);

    // ValidateResource: a case's spec is meant to be valid.
    match client
        .validate_resource(
            pb::ValidateResourceRequest {
                context: None,
                resource_type: case.resource_type.clone(),
                resource_name: name.clone(),
                spec: Some(spec.clone()),
            },
            &options(""),
        )
        .await
    {
        Err(e) => out.push(Finding::new("ValidateResource", e.to_string())),
        Ok(r) => {
            for d in r.diagnostics {
                if d.severity == pb::Severity::Error as i32 {
                    out.push(Finding::new(
                        "ValidateResource",
                        format!("refused the case's spec: {}", d.message),
                    ));
                }
            }
        }
    }
    if !out.is_empty() {
        return out;
    }

    // Create, then the same create again with the same key.
    let key = format!("check-{}", trellis_ids::random_hex(8));
    let create = |current: Option<pb::ResourceState>, spec: pb::Value, key: String| {
        let req = pb::ApplyResourceRequest {
            context: None,
            current,
            resource_type: case.resource_type.clone(),
            resource_name: name.clone(),
            desired_spec: Some(spec),
        };
        async move { client.apply_resource(req, &options(&key), |_| {}).await }
    };
    let created = match create(None, spec.clone(), key.clone()).await {
        Ok(r) if r.external_id.is_empty() => {
            out.push(
                Finding::new("ApplyResource", "a create answered no external_id").at("external_id"),
            );
            return out;
        }
        Ok(r) => r,
        Err(e) => {
            out.push(Finding::new(
                "ApplyResource",
                format!("create failed: {}", describe(&e)),
            ));
            return out;
        }
    };
    let mut current = pb::ResourceState {
        resource_type: case.resource_type.clone(),
        resource_name: name.clone(),
        external_id: created.external_id.clone(),
        spec: Some(spec.clone()),
        state: created.state.clone(),
    };
    read_back(
        client,
        &options(""),
        &current,
        &case.spec,
        "after create",
        &mut out,
    )
    .await;
    if m.resource_types
        .iter()
        .any(|t| t.r#type == case.resource_type && t.importable)
    {
        import_back(client, &options(""), &current, &case.spec, &mut out).await;
    }
    match create(None, spec.clone(), key.clone()).await {
        Ok(again) if again.external_id != created.external_id => {
            out.push(
                Finding::new(
                    "ApplyResource",
                    format!(
                        "a create repeated with the same idempotency key made a second resource \
                         (`{}`, then `{}`): a retried create must find the first",
                        created.external_id, again.external_id
                    ),
                )
                .at("context.idempotency_key"),
            );
            // Clean up the duplicate.
            let twin = pb::ResourceState {
                external_id: again.external_id,
                state: again.state,
                ..current.clone()
            };
            let _ = destroy(client, &options(&format!("{key}-twin")), &twin).await;
        }
        Ok(_) => {}
        Err(e) => out.push(
            Finding::new(
                "ApplyResource",
                format!(
                    "a create repeated with the same idempotency key failed: {}",
                    describe(&e)
                ),
            )
            .at("context.idempotency_key"),
        ),
    }

    // Update, then read it back.
    if let Some(update) = &case.update {
        let updated_spec = values::from_json(update);
        match create(
            Some(current.clone()),
            updated_spec.clone(),
            format!("{key}-update"),
        )
        .await
        {
            Ok(r) => {
                if !r.external_id.is_empty() {
                    current.external_id = r.external_id;
                }
                current.spec = Some(updated_spec);
                current.state = r.state;
                read_back(
                    client,
                    &options(""),
                    &current,
                    update,
                    "after update",
                    &mut out,
                )
                .await;
            }
            Err(e) => out.push(Finding::new(
                "ApplyResource",
                format!("update failed: {}", describe(&e)),
            )),
        }
    }

    // Destroy; then it is gone, and a second destroy succeeds.
    if let Err(e) = destroy(client, &options(&format!("{key}-destroy")), &current).await {
        out.push(Finding::new(
            "DestroyResource",
            format!("destroy failed: {}", describe(&e)),
        ));
        return out;
    }
    match client
        .read_resource(
            pb::ReadResourceRequest {
                context: None,
                current: Some(current.clone()),
            },
            &options(""),
        )
        .await
    {
        Ok(r) if r.exists => out.push(
            Finding::new(
                "ReadResource",
                "the resource still reads as existing after destroy",
            )
            .at("exists"),
        ),
        Ok(_) => {}
        Err(PluginError::Protocol { message, .. }) if message.contains("read_resource") => {}
        Err(e) => out.push(Finding::new(
            "ReadResource",
            format!("after destroy: {}", describe(&e)),
        )),
    }
    if let Err(e) = destroy(client, &options(&format!("{key}-destroy-again")), &current).await {
        out.push(Finding::new(
            "DestroyResource",
            format!(
                "destroying what is already gone must succeed (destroy is retried): {}",
                describe(&e)
            ),
        ));
    }
    // A plugin declaring DestroyResources answers each item once (the client checks it), and
    // what is gone is destroyed.
    if client
        .capabilities()
        .await
        .is_ok_and(|c| c.destroy_resources)
    {
        let items = (0..2)
            .map(|n| pb::DestroyItem {
                idempotency_key: format!("{key}-destroy-batch-{n}"),
                current: Some(current.clone()),
            })
            .collect();
        let failed = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = failed.clone();
        let r = client
            .destroy_resources(
                pb::DestroyResourcesRequest {
                    context: None,
                    items,
                },
                &options(""),
                move |e| {
                    if let Some(err) = e
                        .error
                        .filter(|e| e.error_class != pb::ErrorClass::NotFound as i32)
                    {
                        seen.lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(err.message);
                    }
                },
            )
            .await;
        let failed = failed.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match r {
            Err(e) => out.push(Finding::new("DestroyResources", describe(&e))),
            Ok(()) if !failed.is_empty() => out.push(Finding::new(
                "DestroyResources",
                format!(
                    "destroying what is already gone must succeed, in a batch too: {}",
                    failed.join("; ")
                ),
            )),
            Ok(()) => {}
        }
    }
    out
}

async fn destroy(
    client: &ProviderClient,
    options: &CallOptions,
    current: &pb::ResourceState,
) -> Result<(), PluginError> {
    client
        .destroy_resource(
            pb::DestroyResourceRequest {
                context: None,
                current: Some(current.clone()),
            },
            options,
        )
        .await
        .map(drop)
}

/// Reads the resource and compares what it reports with what was written: every field the
/// case sets must read back the same (a field the provider adds, a default, is not drift).
async fn read_back(
    client: &ProviderClient,
    options: &CallOptions,
    current: &pb::ResourceState,
    written: &Json,
    when: &str,
    out: &mut Vec<Finding>,
) {
    let r = match client
        .read_resource(
            pb::ReadResourceRequest {
                context: None,
                current: Some(current.clone()),
            },
            options,
        )
        .await
    {
        Ok(r) => r,
        // A provider without ReadResource cannot show drift; nothing to compare.
        Err(PluginError::Protocol { message, .. }) if message.contains("read_resource") => return,
        Err(e) => {
            out.push(Finding::new(
                "ReadResource",
                format!("{when}: {}", describe(&e)),
            ));
            return;
        }
    };
    if !r.exists {
        out.push(
            Finding::new(
                "ReadResource",
                format!("{when}: the resource reads as missing"),
            )
            .at("exists"),
        );
        return;
    }
    let read = r
        .spec
        .as_ref()
        .map(|v| values::to_json(v, Default::default()))
        .unwrap_or(Json::Null);
    let mut diffs = Vec::new();
    phantom_drift(written, &read, "spec", &mut diffs);
    for (field, wrote, got) in diffs {
        out.push(
            Finding::new(
                "ReadResource",
                format!(
                    "phantom drift {when}: wrote {wrote}, read {got} (every deploy would report \
                     drift: return values as they were applied)"
                ),
            )
            .at(field),
        );
    }
}

/// For an importable type: importing the resource just created by its id gives the id create
/// gave, a spec with what the case wrote, and a spec that reads back as itself (so a
/// blueprint carrying it would plan no change).
async fn import_back(
    client: &ProviderClient,
    options: &CallOptions,
    created: &pb::ResourceState,
    written: &Json,
    out: &mut Vec<Finding>,
) {
    let r = match client
        .import_resource(
            pb::ImportResourceRequest {
                context: None,
                resource_type: created.resource_type.clone(),
                resource_name: created.resource_name.clone(),
                external_id: created.external_id.clone(),
            },
            options,
        )
        .await
    {
        Ok(r) => r,
        Err(e) => {
            out.push(Finding::new(
                "ImportResource",
                format!("importing what was just created: {}", describe(&e)),
            ));
            return;
        }
    };
    if !r.exists {
        out.push(
            Finding::new(
                "ImportResource",
                format!(
                    "the resource just created (`{}`) imports as missing",
                    created.external_id
                ),
            )
            .at("exists"),
        );
        return;
    }
    if !r.external_id.is_empty() && r.external_id != created.external_id {
        out.push(
            Finding::new(
                "ImportResource",
                format!(
                    "import answered the id `{}` for what create called `{}`: answer the id as \
                     create gives it",
                    r.external_id, created.external_id
                ),
            )
            .at("external_id"),
        );
    }
    let imported = r
        .spec
        .as_ref()
        .map(|v| values::to_json(v, Default::default()))
        .unwrap_or(Json::Null);
    let mut diffs = Vec::new();
    phantom_drift(written, &imported, "spec", &mut diffs);
    for (field, wrote, got) in diffs {
        out.push(
            Finding::new(
                "ImportResource",
                format!("created with {wrote}, imported as {got}: import must report the resource as it is"),
            )
            .at(field),
        );
    }
    let recorded = pb::ResourceState {
        spec: r.spec.clone(),
        state: r.state.clone(),
        ..created.clone()
    };
    let before = out.len();
    read_back(
        client,
        options,
        &recorded,
        &imported,
        "of the imported spec",
        out,
    )
    .await;
    for f in &mut out[before..] {
        f.message
            .push_str(" (a blueprint carrying the imported spec would not plan clean)");
    }
}

/// The fields of `written` that `read` does not report the same, recursively through maps.
fn phantom_drift(written: &Json, read: &Json, at: &str, out: &mut Vec<(String, String, String)>) {
    match (written, read) {
        (Json::Object(w), Json::Object(r)) => {
            for (k, wv) in w {
                let path = format!("{at}.{k}");
                match r.get(k) {
                    Some(rv) => phantom_drift(wv, rv, &path, out),
                    None => out.push((path, wv.to_string(), "nothing".into())),
                }
            }
        }
        (w, r) if same(w, r) => {}
        (w, r) => out.push((at.to_owned(), w.to_string(), r.to_string())),
    }
}

/// Equal as values: 1 and 1.0 are the same number.
fn same(a: &Json, b: &Json) -> bool {
    match (a, b) {
        (Json::Number(x), Json::Number(y)) => x.as_f64() == y.as_f64(),
        (Json::Array(x), Json::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q))
        }
        (Json::Object(x), Json::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

fn describe(e: &PluginError) -> String {
    e.to_string()
}

fn finish(path: &Path, report: Vec<Checked>, format: OutputFormat) -> ExitCode {
    let total: usize = report.iter().map(|c| c.findings.len()).sum();
    match format {
        OutputFormat::Json => {
            let checks: Vec<Json> = report
                .iter()
                .map(|c| {
                    json!({
                        "check": c.name,
                        "ok": c.findings.is_empty(),
                        "findings": c.findings.iter().map(|f| json!({
                            "rpc": f.rpc,
                            "field": f.field,
                            "message": f.message,
                        })).collect::<Vec<_>>(),
                    })
                })
                .collect();
            println!(
                "{}",
                json!({ "plugin": path.display().to_string(), "checks": checks, "findings": total })
            );
        }
        OutputFormat::Text => {
            println!("{}", path.display());
            for c in &report {
                if c.findings.is_empty() {
                    println!("  ok    {}", c.name);
                }
                for f in &c.findings {
                    let field = f
                        .field
                        .as_deref()
                        .map(|s| format!(" {s}"))
                        .unwrap_or_default();
                    println!("  FAIL  {}: {}{field}: {}", c.name, f.rpc, f.message);
                }
            }
            println!(
                "{} checks, {total} finding{}",
                report.len(),
                if total == 1 { "" } else { "s" }
            );
        }
    }
    if total == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phantom_drift_compares_only_what_was_written() {
        let mut out = Vec::new();
        phantom_drift(
            &json!({"mode": "0644", "size": 1, "tags": {"a": "b"}}),
            &json!({"mode": "644", "size": 1.0, "tags": {"a": "b", "added": "x"}, "extra": true}),
            "spec",
            &mut out,
        );
        assert_eq!(
            out,
            vec![(
                "spec.mode".to_owned(),
                "\"0644\"".to_owned(),
                "\"644\"".to_owned()
            )]
        );
        let mut out = Vec::new();
        phantom_drift(&json!({"gone": 1}), &json!({}), "spec", &mut out);
        assert_eq!(out[0].0, "spec.gone");
    }

    #[test]
    fn manifests_with_mistakes_are_found() {
        let field =
            |name: &str, ty: pb::SchemaType, computed: bool, required: bool| pb::SchemaField {
                name: name.into(),
                schema: Some(pb::Schema {
                    r#type: ty as i32,
                    ..Default::default()
                }),
                computed,
                required,
                ..Default::default()
            };
        let m = pb::Manifest {
            resource_types: vec![
                pb::ResourceTypeDef {
                    r#type: "kv/entry".into(),
                    spec_schema: Some(pb::Schema {
                        r#type: pb::SchemaType::Object as i32,
                        fields: vec![
                            field("id", pb::SchemaType::String, true, true),
                            field("list", pb::SchemaType::Array, false, false),
                        ],
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                pb::ResourceTypeDef {
                    r#type: "other/thing".into(),
                    spec_schema: None,
                    ..Default::default()
                },
            ],
            link_types: vec![pb::LinkTypeDef {
                resource_type_a: "kv/entry".into(),
                resource_type_b: "kv/missing".into(),
                ..Default::default()
            }],
            functions: vec![pb::FunctionDef {
                name: "f".into(),
                returns: pb::SchemaType::Unspecified as i32,
                ..Default::default()
            }],
            ..Default::default()
        };
        let found = manifest_findings(&m, PluginKind::Provider, "kv");
        let fields: Vec<Option<&str>> = found.iter().map(|f| f.field.as_deref()).collect();
        assert!(
            fields.contains(&Some("resource_types[0].spec_schema.fields.id")),
            "{found:?}"
        );
        assert!(
            fields.contains(&Some("resource_types[0].spec_schema.fields.list")),
            "{found:?}"
        );
        assert!(fields.contains(&Some("resource_types[1]")), "{found:?}");
        assert!(
            fields.contains(&Some("resource_types[1].spec_schema")),
            "{found:?}"
        );
        assert!(fields.contains(&Some("link_types[0]")), "{found:?}");
        assert!(fields.contains(&Some("functions[0].returns")), "{found:?}");
        assert_eq!(found.len(), 6, "{found:?}");
    }
}
