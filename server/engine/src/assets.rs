//! Local assets (docs/assets.md): the files and directories that resource fields marked
//! `local_asset` name, such as a function's `codeUri`. The client sends their content with the
//! request; the engine keeps each one by digest in its data directory, rewrites the field to
//! `asset:sha256:<hex>/<name>` after every evaluation (so a change of content is a change of
//! the field, in plans and in state), and hands a provider call the path of its copy.
//!
//! Planning never reads the engine host's files for an asset: a path the request did not
//! carry is a diagnostic (and `missing_assets`, which the CLI answers by sending it).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use trellis_proto::engine::v1 as api;
use trellis_proto::plugin::v1 as pb;

use crate::blueprint::PathStep;
use crate::diag::{Diagnostic, codes};
use crate::eval::value::Value;
use crate::prepare::Prepared;
use crate::validate::providers::Manifests;

/// What a rewritten field value starts with.
pub const SCHEME: &str = "asset:";

/// The most one request's assets may hold, all files together.
pub const MAX_REQUEST_BYTES: usize = 48 * 1024 * 1024;

/// The most files one directory asset may hold.
pub const MAX_FILES: usize = 10_000;

/// An asset a request carried, checked and hashed.
#[derive(Clone, Debug, PartialEq)]
pub struct Received {
    /// Its key: the path as the request names it (`InlineBlueprint.assets`), normalised.
    pub path: String,
    /// `sha256:<hex>` over its name, kind and files.
    pub digest: String,
    pub directory: bool,
    /// By relative path, sorted (one entry with an empty path for a file).
    pub files: Vec<(String, Vec<u8>, bool)>,
}

impl Received {
    /// The last part of its path: the name of the engine's copy and of its URI.
    pub fn name(&self) -> &str {
        base_name(&self.path)
    }

    /// The field value that stands for it.
    pub fn uri(&self) -> String {
        uri(&self.digest, self.name())
    }
}

fn base_name(path: &str) -> &str {
    path.rsplit('/').find(|p| !p.is_empty()).unwrap_or(path)
}

/// What an asset is kept under in a shared state: `sha256:<hex>/<name>`.
fn key(digest: &str, name: &str) -> String {
    format!("{digest}/{name}")
}

/// `asset:sha256:<hex>/<name>`.
pub fn uri(digest: &str, name: &str) -> String {
    format!("{SCHEME}{digest}/{name}")
}

/// The digest and name of an asset URI.
pub fn parse_uri(value: &str) -> Option<(&str, &str)> {
    let rest = value.strip_prefix(SCHEME)?;
    let (digest, name) = rest.split_once('/')?;
    let hex = digest.strip_prefix("sha256:")?;
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) && valid_name(name))
        .then_some((digest, name))
}

fn valid_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('\0')
}

/// A relative path inside a directory asset: `/`-separated, no empty, `.` or `..` parts.
fn valid_relative(path: &str) -> bool {
    !path.is_empty()
        && !path.contains('\0')
        && path
            .split('/')
            .all(|p| !p.is_empty() && p != "." && p != "..")
}

/// The request's assets, checked: keys unique, names and relative paths safe, sizes bounded.
/// The error is for an INVALID_ARGUMENT answer.
pub fn receive(assets: Vec<api::Asset>) -> Result<Vec<Received>, String> {
    let mut out: Vec<Received> = Vec::with_capacity(assets.len());
    let mut total = 0usize;
    for a in assets {
        let path = crate::children::normalize(&a.path);
        if path.is_empty() || path == "/" || !valid_name(base_name(&path)) || a.path.contains("://")
        {
            return Err(format!("asset `{}`: not a file or directory path", a.path));
        }
        if out.iter().any(|r| r.path == path) {
            return Err(format!("asset `{path}` is sent twice"));
        }
        if a.files.len() > MAX_FILES {
            return Err(format!(
                "asset `{path}` has {} files; at most {MAX_FILES}",
                a.files.len()
            ));
        }
        let mut files = Vec::with_capacity(a.files.len());
        for f in a.files {
            let ok = if a.directory {
                valid_relative(&f.path)
            } else {
                f.path.is_empty()
            };
            if !ok {
                return Err(format!(
                    "asset `{path}`: `{}` is not {}",
                    f.path,
                    if a.directory {
                        "a relative path inside it"
                    } else {
                        "allowed: a file asset has one entry with an empty path"
                    }
                ));
            }
            total += f.content.len();
            if total > MAX_REQUEST_BYTES {
                return Err(format!(
                    "the request's assets exceed {MAX_REQUEST_BYTES} bytes (at `{path}`)"
                ));
            }
            files.push((f.path, f.content, f.executable));
        }
        if !a.directory && files.len() != 1 {
            return Err(format!(
                "asset `{path}`: a file asset has exactly one entry"
            ));
        }
        files.sort_by(|x, y| x.0.cmp(&y.0));
        if files.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err(format!("asset `{path}` names a file twice"));
        }
        let digest = digest(base_name(&path), a.directory, &files);
        out.push(Received {
            path,
            digest,
            directory: a.directory,
            files,
        });
    }
    Ok(out)
}

/// The content digest: its name, its kind, then each file's path, mode and bytes, framed so
/// no two different assets hash alike.
fn digest(name: &str, directory: bool, files: &[(String, Vec<u8>, bool)]) -> String {
    let mut parts: Vec<&[u8]> = Vec::with_capacity(2 + 3 * files.len());
    parts.push(name.as_bytes());
    parts.push(if directory { b"dir" } else { b"file" });
    for (path, content, exec) in files {
        parts.extend([
            path.as_bytes(),
            if *exec { b"x".as_slice() } else { b"-" },
            content,
        ]);
    }
    format!("sha256:{}", trellis_ids::digest(&parts))
}

/// The engine's copies of assets: `<root>/<hex>/<name>`, written once, never changed. With a
/// state store shared by replicas, each asset is also kept there, and a replica that executes
/// a plan another one made fetches what it lacks.
#[derive(Clone)]
pub struct Store {
    root: PathBuf,
    shared: Option<std::sync::Arc<dyn crate::state::StateStore>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("root", &self.root)
            .field("shared", &self.shared.is_some())
            .finish()
    }
}

impl Store {
    pub fn new(root: impl Into<PathBuf>) -> Store {
        Store {
            root: root.into(),
            shared: None,
        }
    }

    /// Also keeps assets in `state`, when it shares them between engines.
    pub fn shared_through(mut self, state: std::sync::Arc<dyn crate::state::StateStore>) -> Store {
        if state.shares_assets() {
            self.shared = Some(state);
        }
        self
    }

    /// Keeps `a` in the shared state too (nothing without one).
    pub async fn share(&self, a: &Received) -> Result<(), String> {
        let Some(state) = &self.shared else {
            return Ok(());
        };
        let key = key(&a.digest, a.name());
        let encoded = prost::Message::encode_to_vec(&api::Asset {
            path: a.name().to_owned(),
            directory: a.directory,
            files: a
                .files
                .iter()
                .map(|(path, content, executable)| api::AssetFile {
                    path: path.clone(),
                    content: content.clone(),
                    executable: *executable,
                })
                .collect(),
        });
        state
            .put_asset(&key, encoded)
            .await
            .map_err(|e| e.to_string())
    }

    /// Copies the asset `digest`/`name` from the shared state into this engine's copies;
    /// `Ok(false)` when the state does not have it either (or is not shared). What it holds is
    /// checked against the digest before it is used.
    async fn fetch(&self, digest: &str, name: &str) -> Result<bool, String> {
        let Some(state) = &self.shared else {
            return Ok(false);
        };
        let Some(encoded) = state
            .get_asset(&key(digest, name))
            .await
            .map_err(|e| e.to_string())?
        else {
            return Ok(false);
        };
        let asset = <api::Asset as prost::Message>::decode(encoded.as_slice())
            .map_err(|e| format!("the asset {digest}/{name} in the state is damaged: {e}"))?;
        let received = receive(vec![asset])?
            .pop()
            .ok_or_else(|| format!("the asset {digest}/{name} in the state is empty"))?;
        if received.digest != digest || received.name() != name {
            return Err(format!(
                "the asset {digest}/{name} in the state does not match its digest"
            ));
        }
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.put(&received))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("keeping the asset {digest}/{name}: {e}"))?;
        Ok(true)
    }

    /// Where the copy of the asset `digest` named `name` is (whether or not it exists).
    pub fn path_of(&self, digest: &str, name: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
        self.root.join(hex).join(name)
    }

    /// Keeps `a` (nothing to do when it is already kept): written beside, synced, then
    /// renamed into place, so a crash leaves either the whole copy or none.
    pub fn put(&self, a: &Received) -> std::io::Result<()> {
        let hex = a.digest.strip_prefix("sha256:").unwrap_or(&a.digest);
        let dest = self.root.join(hex);
        if dest.join(a.name()).exists() {
            return Ok(());
        }
        std::fs::create_dir_all(&self.root)?;
        let tmp = self
            .root
            .join(format!(".tmp-{}", trellis_ids::random_hex(8)));
        let result = (|| {
            let top = tmp.join(a.name());
            if a.directory {
                std::fs::create_dir_all(&top)?;
                for (rel, content, exec) in &a.files {
                    let path = top.join(rel);
                    if let Some(parent) = path.parent() {
                        std::fs::create_dir_all(parent)?;
                    }
                    write_file(&path, content, *exec)?;
                }
            } else {
                std::fs::create_dir_all(&tmp)?;
                let (_, content, exec) = &a.files[0];
                write_file(&top, content, *exec)?;
            }
            std::fs::File::open(&tmp)?.sync_all()?;
            match std::fs::rename(&tmp, &dest) {
                Ok(()) => {}
                // Kept meanwhile by a concurrent plan of the same content.
                Err(_) if dest.join(a.name()).exists() => {
                    std::fs::remove_dir_all(&tmp)?;
                }
                Err(e) => return Err(e),
            }
            std::fs::File::open(&self.root)?.sync_all()
        })();
        if result.is_err() {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        result
    }
}

fn write_file(path: &Path, content: &[u8], exec: bool) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if exec { 0o755 } else { 0o644 })
        .open(path)?;
    f.write_all(content)?;
    f.sync_all()
}

/// The `local_asset` fields of a resource type, as paths of field names (objects only).
pub fn fields_of(manifests: &Manifests, ty: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    if let Some(schema) = manifests
        .resource_type(ty)
        .and_then(|d| d.spec_schema.as_ref())
    {
        walk(schema, &mut Vec::new(), &mut out);
    }
    out
}

fn walk(schema: &pb::Schema, at: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    for f in &schema.fields {
        at.push(f.name.clone());
        if f.local_asset {
            out.push(at.clone());
        } else if let Some(s) = &f.schema {
            walk(s, at, out);
        }
        at.pop();
    }
}

/// A field value that names a local file or directory (rather than a URI, such as `s3://`,
/// or an asset already resolved).
fn is_local(value: &str) -> bool {
    !value.is_empty() && !value.contains("://") && !value.starts_with(SCHEME)
}

fn get_mut<'a>(v: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    let mut cur = v;
    for k in path {
        match cur {
            Value::Map(m) => cur = m.get_mut(k)?,
            _ => return None,
        }
    }
    Some(cur)
}

/// Rewrites resource entry `idx`'s local asset fields (`fields`, from [`fields_of`]) to their
/// URIs, from the assets the inputs carry (`assets`: request path → digest; `documents`: the
/// inputs' file names, the root first). Returns a diagnostic for each field that names a path
/// the inputs lack, or one not known yet, with the missing paths.
pub fn resolve(
    prepared: &mut Prepared,
    idx: usize,
    assets: &IndexMap<String, String>,
    fields: &[Vec<String>],
    documents: &[String],
) -> (Vec<Diagnostic>, Vec<String>) {
    let x = &prepared.evaluation.resources[idx];
    // A resource its condition leaves out is not deployed: nothing to send for it.
    if matches!(x.condition, Some(Value::Bool(false))) {
        return (Vec::new(), Vec::new());
    }
    let maybe = matches!(x.condition, Some(Value::Unknown));
    let (template, instance) = (x.template.clone(), x.instance);
    let node = prepared
        .blueprint
        .resources
        .iter()
        .find(|r| r.name.value == template);
    let locate = |path: &[String]| {
        let steps: Vec<PathStep> = path.iter().map(|k| PathStep::Field(k.clone())).collect();
        node.and_then(|r| r.spec.as_ref().map(|s| s.locate(&steps)))
            .or_else(|| node.map(|r| r.name.span))
            .unwrap_or(prepared.blueprint.span)
    };
    // Paths are relative to the file the resource is written in, when that is one of the
    // request's documents; otherwise (a transform's output, an injected value) to the root.
    let base = |span: crate::source::Span| -> String {
        let name = &prepared.sources.get(span.file).name;
        let file = if documents.iter().any(|d| d == name) {
            name.as_str()
        } else {
            documents.first().map_or("", String::as_str)
        };
        file.rfind('/')
            .map_or(String::new(), |i| file[..i].to_owned())
    };
    let mut diags = Vec::new();
    let mut missing = Vec::new();
    for path in fields {
        let span = locate(path);
        let dir = base(span);
        let inst = &mut prepared.evaluation.instances[instance];
        let Some(v) = get_mut(&mut inst.spec, path) else {
            continue;
        };
        let written = match v {
            Value::Str(s) if is_local(s) => s.clone(),
            // Whether it exists is known only at deploy: so is what it names.
            Value::Unknown if maybe => continue,
            Value::Unknown => {
                diags.push(
                    Diagnostic::new(
                        &codes::LOCAL_ASSET_UNKNOWN,
                        span,
                        format!(
                            "`{}` names a local file or directory, but its value is known only after deploy",
                            path.join(".")
                        ),
                    )
                    .with_hint("the client must send the asset with the plan: compute the path from variables or values, not from resources"),
                );
                continue;
            }
            _ => continue,
        };
        let key = crate::children::normalize(&if written.starts_with('/') || dir.is_empty() {
            written.clone()
        } else {
            format!("{dir}/{written}")
        });
        match assets.get(&key) {
            Some(digest) => {
                let uri = uri(digest, base_name(&key));
                *v = Value::Str(uri.clone());
                if let Some(masked) = inst.masked_spec.as_mut()
                    && let Some(m) = get_mut(masked, path)
                    && *m == Value::Str(written)
                {
                    *m = Value::Str(uri);
                }
            }
            None => {
                diags.push(
                    Diagnostic::new(
                        &codes::LOCAL_ASSET_MISSING,
                        span,
                        format!(
                            "`{}` names `{key}`, a local file or directory the request did not carry",
                            path.join("."),
                        ),
                    )
                    .with_hint("`trellis plan` and `trellis deploy` send the assets the engine asks for; an API client sends them in `InlineBlueprint.assets` (docs/assets.md)"),
                );
                if !missing.contains(&key) {
                    missing.push(key);
                }
            }
        }
    }
    (diags, missing)
}

/// For a provider call: each asset URI in `spec` with the path of the engine's copy. Every
/// string is looked at, not only `local_asset` fields: a URI is a content digest, so naming
/// one anywhere hands over only what its content already is. A copy that is gone is an error
/// naming it.
pub async fn call_assets(
    store: &Store,
    spec: &pb::Value,
) -> Result<BTreeMap<String, String>, String> {
    fn walk(v: &pb::Value, out: &mut Vec<String>) {
        use pb::value::Kind;
        match &v.kind {
            Some(Kind::String(s)) if s.starts_with(SCHEME) => out.push(s.clone()),
            Some(Kind::List(l)) => l.items.iter().for_each(|x| walk(x, out)),
            Some(Kind::Map(m)) => m
                .entries
                .iter()
                .filter_map(|e| e.value.as_ref())
                .for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    let mut uris = Vec::new();
    walk(spec, &mut uris);
    let mut out = BTreeMap::new();
    for value in uris {
        let Some((digest, name)) = parse_uri(&value) else {
            continue;
        };
        let at = store.path_of(digest, name);
        // Planned through another replica: its copy is in the shared state.
        if !at.exists() && !store.fetch(digest, name).await? {
            return Err(format!(
                "the asset {value} is not in the engine's data directory: plan the change again to send it"
            ));
        }
        out.insert(value, at.display().to_string());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(path: &str, files: &[(&str, &str, bool)]) -> api::Asset {
        api::Asset {
            path: path.to_owned(),
            directory: true,
            files: files
                .iter()
                .map(|(p, c, x)| api::AssetFile {
                    path: (*p).to_owned(),
                    content: c.as_bytes().to_vec(),
                    executable: *x,
                })
                .collect(),
        }
    }

    #[test]
    fn digests_depend_on_content_mode_and_name_not_order() {
        let a = receive(vec![dir(
            "x/code",
            &[("a.py", "1", false), ("b/c.py", "2", false)],
        )])
        .unwrap();
        let b = receive(vec![dir(
            "./x/code/",
            &[("b/c.py", "2", false), ("a.py", "1", false)],
        )])
        .unwrap();
        assert_eq!(a[0].digest, b[0].digest);
        assert_eq!(a[0].path, "x/code");
        let changed = receive(vec![dir(
            "x/code",
            &[("a.py", "1!", false), ("b/c.py", "2", false)],
        )])
        .unwrap();
        assert_ne!(a[0].digest, changed[0].digest);
        let mode = receive(vec![dir(
            "x/code",
            &[("a.py", "1", true), ("b/c.py", "2", false)],
        )])
        .unwrap();
        assert_ne!(a[0].digest, mode[0].digest);
        let renamed = receive(vec![dir(
            "x/other",
            &[("a.py", "1", false), ("b/c.py", "2", false)],
        )])
        .unwrap();
        assert_ne!(a[0].digest, renamed[0].digest);
        assert!(a[0].uri().starts_with("asset:sha256:") && a[0].uri().ends_with("/code"));
        assert_eq!(parse_uri(&a[0].uri()), Some((a[0].digest.as_str(), "code")));
    }

    #[test]
    fn unsafe_paths_and_duplicates_are_refused() {
        for bad in ["../x", "a/./b", "/etc/passwd", "a//b", ""] {
            let e = receive(vec![dir("code", &[(bad, "x", false)])]).unwrap_err();
            assert!(e.contains("code"), "{bad}: {e}");
        }
        assert!(receive(vec![dir("", &[])]).is_err());
        assert!(receive(vec![dir("s3://b/k", &[])]).is_err());
        assert!(receive(vec![dir("code", &[("a", "1", false), ("a", "2", false)])]).is_err());
        assert!(receive(vec![dir("code", &[]), dir("./code", &[])]).is_err());
        let file_with_path = api::Asset {
            path: "f.zip".into(),
            directory: false,
            files: vec![api::AssetFile {
                path: "inner".into(),
                content: vec![],
                executable: false,
            }],
        };
        assert!(receive(vec![file_with_path]).is_err());
        assert_eq!(parse_uri("asset:sha256:abc/x"), None);
        assert_eq!(
            parse_uri(&uri(&format!("sha256:{}", "a".repeat(64)), "..")),
            None
        );
    }

    #[tokio::test]
    async fn the_store_keeps_a_copy_once_with_modes() {
        let root =
            std::env::temp_dir().join(format!("trellis-assets-{}", trellis_ids::random_hex(6)));
        let store = Store::new(&root);
        let a = &receive(vec![dir(
            "src/code",
            &[("run.sh", "#!/bin/sh", true), ("lib/m.py", "x=1", false)],
        )])
        .unwrap()[0];
        store.put(a).unwrap();
        store.put(a).unwrap();
        let at = store.path_of(&a.digest, a.name());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(at.join("run.sh"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o111, 0o111);
        assert_eq!(std::fs::read_to_string(at.join("lib/m.py")).unwrap(), "x=1");
        // Nothing left beside the copies.
        let entries: Vec<_> = std::fs::read_dir(&root).unwrap().collect();
        assert_eq!(entries.len(), 1);
        let spec = crate::plugins::values::from_json(
            &serde_json::json!({"code": {"uri": a.uri()}, "other": "asset:not-one"}),
        );
        let got = call_assets(&store, &spec).await.unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(
            got.get(&a.uri()).map(String::as_str),
            Some(at.to_str().unwrap())
        );
        std::fs::remove_dir_all(&root).unwrap();
        let gone = call_assets(&store, &spec).await.unwrap_err();
        assert!(gone.contains("plan the change again"), "{gone}");
    }
}
