//! The `local` provider through the real protocol (the SDK's in-process
//! harness), on temporary directories.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use trellis_plugin_sdk::prelude::*;
use trellis_plugin_sdk::testing::Harness;
use trellis_provider_local::LocalProvider;
use trellis_provider_local::envfile::MARKER;

static N: AtomicU64 = AtomicU64::new(0);

/// A unique temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let n = N.fetch_add(1, Ordering::SeqCst);
        let p =
            std::env::temp_dir().join(format!("trellis-local-{}-{n}-{tag}", std::process::id()));
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(std::fs::canonicalize(&p).expect("canonical temp dir"))
    }
    fn path(&self) -> &Path {
        &self.0
    }
    fn join(&self, p: &str) -> PathBuf {
        self.0.join(p)
    }
    fn s(&self, p: &str) -> String {
        self.join(p).to_string_lossy().into_owned()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn harness(root: &Path) -> Harness {
    Harness::provider(LocalProvider)
        .await
        .expect("start harness")
        .with_config(Value::map().with("root", root.to_string_lossy().into_owned()))
}

fn spec(json: serde_json::Value) -> Value {
    Value::from(json)
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).expect("metadata").permissions().mode() & 0o7777
}

fn state_str<'a>(st: &'a ResourceState, key: &str) -> &'a str {
    st.state
        .get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn codes(ds: &[Diagnostic]) -> Vec<(String, String)> {
    ds.iter()
        .map(|d| {
            (
                d.code.clone(),
                d.path.as_ref().map(ToString::to_string).unwrap_or_default(),
            )
        })
        .collect()
}

fn pair(code: &str, path: &str) -> (String, String) {
    (code.to_owned(), path.to_owned())
}

/// A spec read back, without the `values` read adds.
fn without_values(spec: &Value) -> Value {
    let mut m = spec.as_map().cloned().unwrap_or_default();
    m.shift_remove("values");
    Value::Map(m)
}

/// The names in a spec's `values`.
fn value_names(spec: &Value) -> Vec<String> {
    spec.get("values")
        .and_then(Value::as_map)
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn manifest_declares_everything() {
    let tmp = TempDir::new("manifest");
    let h = harness(tmp.path()).await;
    let m = h.manifest().await.expect("manifest");
    let types: Vec<_> = m.resource_types.iter().map(|r| r.r#type.as_str()).collect();
    assert_eq!(
        types,
        [
            "local/directory",
            "local/file",
            "local/randomSecret",
            "local/envFile"
        ]
    );
    assert_eq!(m.data_source_types.len(), 1);
    assert_eq!(m.data_source_types[0].r#type, "local/file");
    let filter: Vec<_> = m.data_source_types[0]
        .filter_fields
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(filter, ["path", "name", "size", "json"]);
    let links: Vec<_> = m
        .link_types
        .iter()
        .map(|l| {
            (
                l.resource_type_a.as_str(),
                l.resource_type_b.as_str(),
                l.kind,
                l.priority,
            )
        })
        .collect();
    use trellis_plugin_sdk::proto::{LinkKind, LinkPriority};
    assert_eq!(
        links,
        [
            (
                "local/file",
                "local/directory",
                LinkKind::Hard as i32,
                LinkPriority::ResourceB as i32
            ),
            (
                "local/envFile",
                "local/file",
                LinkKind::Soft as i32,
                LinkPriority::ResourceA as i32
            ),
            (
                "local/envFile",
                "local/directory",
                LinkKind::Soft as i32,
                LinkPriority::ResourceA as i32
            ),
            (
                "local/envFile",
                "local/randomSecret",
                LinkKind::Soft as i32,
                LinkPriority::ResourceA as i32
            ),
        ]
    );
    for l in &m.link_types[1..] {
        assert_eq!(l.annotations.len(), 1);
        assert_eq!(l.annotations[0].name, "local.envFile.name");
        assert_eq!(l.annotations[0].applies_to, l.resource_type_b);
    }
    assert_eq!(
        m.functions
            .iter()
            .map(|f| f.name.as_str())
            .collect::<Vec<_>>(),
        ["sha256"]
    );
    assert_eq!(m.custom_variable_types[0].r#type, "local/fileMode");
    assert_eq!(m.retry_policy.map(|r| r.max_attempts), Some(3));
    let caps = h.capabilities();
    assert!(
        caps.read_resource
            && caps.links
            && caps.data_sources
            && caps.functions
            && caps.custom_variable_types
    );
    assert!(!caps.plan_resource);
    // The secret's value is declared sensitive.
    let secret = &m.resource_types[2];
    let value = secret
        .spec_schema
        .as_ref()
        .and_then(|s| s.fields.iter().find(|f| f.name == "value"));
    assert!(value.is_some_and(|f| f.sensitive && f.computed));
}

#[tokio::test]
async fn config_validation() {
    let tmp = TempDir::new("config");
    let h = harness(tmp.path()).await;
    assert!(h.validate_config().await.expect("validate").is_empty());
    let missing = h.with_config(Value::map().with("root", tmp.s("does-not-exist")));
    let ds = missing.validate_config().await.expect("validate");
    assert_eq!(codes(&ds), [pair("local.root-invalid", "root")]);
    let none = Harness::provider(LocalProvider).await.expect("harness");
    assert!(none.validate_config().await.expect("validate").is_empty());
}

#[tokio::test]
async fn directory_lifecycle_removes_only_what_it_created() {
    let tmp = TempDir::new("dir");
    let h = harness(tmp.path()).await;
    let st = h
        .create(
            "local/directory",
            "deep",
            spec(serde_json::json!({"path": "a/b/c", "mode": "0750"})),
        )
        .await
        .expect("create");
    let c = tmp.join("a/b/c");
    assert!(c.is_dir());
    assert_eq!(mode(&c), 0o750);
    assert_eq!(st.external_id, tmp.s("a/b/c"));
    assert_eq!(state_str(&st, "id"), tmp.s("a/b/c"));
    assert_eq!(st.state.get("created").and_then(Value::as_bool), Some(true));
    assert_eq!(
        st.state.get("createdParents"),
        Some(&Value::from(vec![tmp.s("a"), tmp.s("a/b")]))
    );

    // No drift; then a hand-made chmod is drift, and update repairs it.
    let read = h.read(&st).await.expect("read").expect("exists");
    assert_eq!(read.spec, st.spec);
    std::fs::set_permissions(&c, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let read = h.read(&st).await.expect("read").expect("exists");
    assert_eq!(read.spec.get("mode").and_then(Value::as_str), Some("0700"));
    let st = h.update(&st, st.spec.clone()).await.expect("update");
    assert_eq!(mode(&c), 0o750);
    assert_eq!(st.state.get("created").and_then(Value::as_bool), Some(true));

    // Not empty: left in place, destroy still succeeds.
    std::fs::write(c.join("user.txt"), "mine").expect("write");
    h.destroy(&st).await.expect("destroy");
    assert!(c.join("user.txt").is_file());
    std::fs::remove_file(c.join("user.txt")).expect("rm");
    h.destroy(&st).await.expect("destroy");
    assert!(
        !tmp.join("a").exists(),
        "the directory and the parents it made are gone"
    );
    assert!(tmp.path().is_dir());
    assert_eq!(h.read(&st).await.expect("read"), None);
    h.destroy(&st).await.expect("destroy again is fine");
}

#[tokio::test]
async fn directory_that_existed_is_adopted_and_kept() {
    let tmp = TempDir::new("adopt");
    let h = harness(tmp.path()).await;
    std::fs::create_dir(tmp.join("existing")).expect("mkdir");
    let st = h
        .create(
            "local/directory",
            "existing",
            spec(serde_json::json!({"path": "existing"})),
        )
        .await
        .expect("create");
    assert_eq!(
        st.state.get("created").and_then(Value::as_bool),
        Some(false)
    );
    h.destroy(&st).await.expect("destroy");
    assert!(tmp.join("existing").is_dir());

    // A file where the directory should be is a conflict.
    std::fs::write(tmp.join("plain"), "x").expect("write");
    let e = h
        .create(
            "local/directory",
            "plain",
            spec(serde_json::json!({"path": "plain"})),
        )
        .await
        .expect_err("conflict");
    assert_eq!(e.class, ErrorClass::Conflict);

    // A bad mode is a diagnostic.
    let ds = h
        .validate(
            "local/directory",
            "d",
            spec(serde_json::json!({"path": "d", "mode": "rwx"})),
        )
        .await
        .expect("validate");
    assert_eq!(codes(&ds), [pair("local.invalid-mode", "mode")]);
}

#[tokio::test]
async fn directory_removed_by_hand_reads_as_gone_and_update_recreates() {
    let tmp = TempDir::new("gone");
    let h = harness(tmp.path()).await;
    let st = h
        .create(
            "local/directory",
            "d",
            spec(serde_json::json!({"path": "d"})),
        )
        .await
        .expect("create");
    std::fs::remove_dir(tmp.join("d")).expect("rmdir");
    assert_eq!(h.read(&st).await.expect("read"), None);
    let st = h.update(&st, st.spec.clone()).await.expect("update");
    assert!(tmp.join("d").is_dir());
    assert_eq!(st.state.get("created").and_then(Value::as_bool), Some(true));
}

#[tokio::test]
async fn file_lifecycle_drift_and_conflicting_destroy() {
    let tmp = TempDir::new("file");
    let h = harness(tmp.path()).await;
    let st = h
        .create(
            "local/file",
            "cfg",
            spec(serde_json::json!({"path": "cfg.txt", "content": "hello", "mode": "0600"})),
        )
        .await
        .expect("create");
    let f = tmp.join("cfg.txt");
    assert_eq!(std::fs::read_to_string(&f).expect("read"), "hello");
    assert_eq!(mode(&f), 0o600);
    assert_eq!(st.external_id, tmp.s("cfg.txt"));
    assert_eq!(
        state_str(&st, "sha256"),
        "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
    );
    assert_eq!(st.state.get("size").and_then(Value::as_i64), Some(5));
    let names: Vec<_> = std::fs::read_dir(tmp.path())
        .expect("ls")
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .collect();
    assert_eq!(names, ["cfg.txt"], "no temporary file is left behind");

    let read = h.read(&st).await.expect("read").expect("exists");
    assert_eq!(read.spec, st.spec, "no drift");
    assert_eq!(read.state, st.state);

    // Edited by hand: drift on content, and destroy refuses.
    std::fs::write(&f, "edited").expect("edit");
    let read = h.read(&st).await.expect("read").expect("exists");
    assert_eq!(
        read.spec.get("content").and_then(Value::as_str),
        Some("edited")
    );
    assert_ne!(read.state.get("sha256"), st.state.get("sha256"));
    assert_eq!(read.state.get("size").and_then(Value::as_i64), Some(6));
    let e = h.destroy(&st).await.expect_err("conflict");
    assert_eq!(e.class, ErrorClass::Conflict);
    assert!(f.is_file());

    // Update rewrites it; then destroy deletes it.
    let st = h
        .update(
            &st,
            spec(serde_json::json!({"path": "cfg.txt", "content": "hello again", "mode": "0640"})),
        )
        .await
        .expect("update");
    assert_eq!(std::fs::read_to_string(&f).expect("read"), "hello again");
    assert_eq!(mode(&f), 0o640);
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let read = h.read(&st).await.expect("read").expect("exists");
    assert_eq!(read.spec.get("mode").and_then(Value::as_str), Some("0644"));
    h.destroy(&st).await.expect("destroy");
    assert!(!f.exists());
    assert_eq!(h.read(&st).await.expect("read"), None);
    h.destroy(&st)
        .await
        .expect("destroying a gone file succeeds");
}

#[tokio::test]
async fn file_defaults_and_foreign_files() {
    let tmp = TempDir::new("defaults");
    let h = harness(tmp.path()).await;
    let st = h
        .create(
            "local/file",
            "empty",
            spec(serde_json::json!({"path": "empty"})),
        )
        .await
        .expect("create");
    assert_eq!(
        std::fs::read_to_string(tmp.join("empty")).expect("read"),
        ""
    );
    assert_eq!(mode(&tmp.join("empty")), 0o644);
    let read = h.read(&st).await.expect("read").expect("exists");
    assert_eq!(read.spec, st.spec, "defaults are not drift");

    std::fs::write(tmp.join("theirs"), "not yours").expect("write");
    let e = h
        .create(
            "local/file",
            "theirs",
            spec(serde_json::json!({"path": "theirs", "content": "mine"})),
        )
        .await
        .expect_err("conflict");
    assert_eq!(e.class, ErrorClass::Conflict);
    assert_eq!(e.path.map(|p| p.to_string()).as_deref(), Some("path"));
    assert_eq!(
        std::fs::read_to_string(tmp.join("theirs")).expect("read"),
        "not yours"
    );

    // Same content: taken over (a retried create finds its own file).
    let st = h
        .create(
            "local/file",
            "same",
            spec(serde_json::json!({"path": "theirs", "content": "not yours"})),
        )
        .await
        .expect("take over");
    assert_eq!(st.state.get("size").and_then(Value::as_i64), Some(9));

    let e = h
        .create(
            "local/file",
            "orphan",
            spec(serde_json::json!({"path": "no/such/dir/f"})),
        )
        .await
        .expect_err("no parent");
    assert_eq!(e.class, ErrorClass::NotFound);
}

#[tokio::test]
async fn sensitive_content_keeps_derived_fields_sensitive() {
    let tmp = TempDir::new("sensitive");
    let h = harness(tmp.path()).await;
    let s = Value::map()
        .with("path", "s.txt")
        .with("content", Value::sensitive("hunter2"));
    let st = h.create("local/file", "s", s).await.expect("create");
    assert!(st.state.get("sha256").is_some_and(Value::is_sensitive));
    std::fs::write(tmp.join("s.txt"), "changed").expect("edit");
    let read = h.read(&st).await.expect("read").expect("exists");
    assert!(read.spec.get("content").is_some_and(Value::is_sensitive));
    assert_eq!(
        read.spec.get("content").and_then(Value::as_str),
        Some("changed")
    );
}

#[tokio::test]
async fn root_restriction() {
    let outside = TempDir::new("outside");
    let tmp = TempDir::new("root");
    let h = harness(tmp.path()).await;
    std::os::unix::fs::symlink(outside.path(), tmp.join("escape")).expect("symlink");
    std::fs::create_dir(tmp.join("inner")).expect("mkdir");

    for ty in ["local/file", "local/directory", "local/envFile"] {
        for bad in ["../x", "/etc/passwd", "escape/x", "inner/../../x", "escape"] {
            let ds = h
                .validate(ty, "r", spec(serde_json::json!({"path": bad})))
                .await
                .expect("validate");
            assert_eq!(
                codes(&ds),
                [pair("local.path-outside-root", "path")],
                "{ty} {bad}"
            );
        }
        for good in ["x", "inner/x", "inner/../x", &tmp.s("abs")] {
            let ds = h
                .validate(ty, "r", spec(serde_json::json!({"path": good})))
                .await
                .expect("validate");
            assert!(ds.is_empty(), "{ty} {good}: {ds:?}");
        }
        let ds = h
            .validate(ty, "r", Value::map().with("path", Value::Unknown))
            .await
            .expect("validate");
        assert!(ds.is_empty(), "unknown paths are not checked");
    }

    for (ty, path) in [
        ("local/file", "escape/f"),
        ("local/directory", "../d"),
        ("local/envFile", "escape/.env"),
    ] {
        let e = h
            .create(ty, "r", spec(serde_json::json!({"path": path})))
            .await
            .expect_err("outside");
        assert_eq!(e.class, ErrorClass::BadInput, "{ty}");
        assert_eq!(e.path.map(|p| p.to_string()).as_deref(), Some("path"));
    }
    assert_eq!(
        std::fs::read_dir(outside.path()).expect("ls").count(),
        0,
        "nothing written outside"
    );
    assert!(
        !tmp.path()
            .parent()
            .map(|p| p.join("d").exists())
            .unwrap_or(false)
    );

    // Relative paths are relative to the root.
    h.create(
        "local/file",
        "rel",
        spec(serde_json::json!({"path": "inner/rel.txt", "content": "r"})),
    )
    .await
    .expect("create");
    assert!(tmp.join("inner/rel.txt").is_file());
}

#[tokio::test]
async fn random_secret_is_stable() {
    let tmp = TempDir::new("secret");
    let h = harness(tmp.path()).await;
    let st = h
        .create("local/randomSecret", "token", Value::map())
        .await
        .expect("create");
    let v = st.state.get("value").expect("value");
    assert!(v.is_sensitive());
    let value = v.as_str().unwrap_or_default().to_owned();
    assert_eq!(value.len(), 32);
    assert!(value.bytes().all(|b| b.is_ascii_alphanumeric()));

    let st2 = h
        .update(&st, Value::map().with("length", 32))
        .await
        .expect("update");
    assert_eq!(
        st2.state.get("value").and_then(Value::as_str),
        Some(value.as_str()),
        "kept"
    );
    assert_eq!(
        h.read(&st2).await.expect("read"),
        Some(ReadState {
            spec: st2.spec.clone(),
            state: st2.state.clone(),
            external_id: Some(st2.external_id.clone()),
        })
    );

    let st3 = h
        .update(
            &st2,
            spec(serde_json::json!({"length": 64, "charset": "hex"})),
        )
        .await
        .expect("update");
    let hex = st3
        .state
        .get("value")
        .and_then(Value::as_str)
        .unwrap_or_default();
    assert_eq!(hex.len(), 64);
    assert!(
        hex.bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    );

    let b64 = h
        .create(
            "local/randomSecret",
            "b64",
            spec(serde_json::json!({"length": 4096, "charset": "base64url"})),
        )
        .await
        .expect("create");
    let b64 = b64
        .state
        .get("value")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    assert_eq!(b64.len(), 4096);
    assert!(
        b64.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    );

    let ds = h
        .validate(
            "local/randomSecret",
            "short",
            spec(serde_json::json!({"length": 4})),
        )
        .await
        .expect("validate");
    assert_eq!(codes(&ds), [pair("local.length-out-of-range", "length")]);
    let e = h
        .create(
            "local/randomSecret",
            "short",
            spec(serde_json::json!({"length": 4})),
        )
        .await
        .expect_err("too short");
    assert_eq!(
        (e.class, e.path.map(|p| p.to_string())),
        (ErrorClass::BadInput, Some("length".to_owned()))
    );
    h.destroy(&st3).await.expect("destroy is a no-op");
}

fn link(
    a: &ResourceState,
    b: &ResourceState,
    annotations_b: Value,
    link_data: Value,
) -> LinkRequest {
    LinkRequest {
        link_type: format!("{}::{}", a.resource_type, b.resource_type),
        resource_a: a.clone(),
        resource_b: b.clone(),
        annotations_a: Value::map(),
        annotations_b,
        link_data,
        ..LinkRequest::default()
    }
}

#[tokio::test]
async fn env_file_links_annotations_and_removal() {
    let tmp = TempDir::new("env");
    let h = harness(tmp.path()).await;
    let dir = h
        .create(
            "local/directory",
            "dataDir",
            spec(serde_json::json!({"path": "data"})),
        )
        .await
        .expect("dir");
    let file = h
        .create(
            "local/file",
            "appConfig",
            spec(serde_json::json!({"path": "data/app.conf", "content": "x"})),
        )
        .await
        .expect("file");
    let secret = h
        .create("local/randomSecret", "dbPassword", Value::map())
        .await
        .expect("secret");
    let secret_value = secret
        .state
        .get("value")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let env = h
        .create(
            "local/envFile",
            "env",
            spec(serde_json::json!({"path": ".env", "header": "generated"})),
        )
        .await
        .expect("env");
    let env_path = tmp.join(".env");
    assert_eq!(mode(&env_path), 0o600);
    assert_eq!(
        std::fs::read_to_string(&env_path).expect("read"),
        format!("{MARKER}\n# generated\n")
    );

    let named = Value::map().with("local.envFile.name", "database");
    let data = h
        .update_link_resource_a(&link(&env, &secret, named.clone(), Value::Null))
        .await
        .expect("secret link");
    assert_eq!(
        data.get("variable").and_then(Value::as_str),
        Some("SECRET_DATABASE")
    );
    assert_eq!(
        data.get("path").and_then(Value::as_str),
        Some(tmp.s(".env").as_str())
    );
    assert!(
        !data.to_string().contains(&secret_value),
        "link data never holds the secret"
    );
    let fdata = h
        .update_link_resource_a(&link(&env, &file, Value::map(), Value::Null))
        .await
        .expect("file link");
    assert_eq!(
        fdata.get("variable").and_then(Value::as_str),
        Some("FILE_APP_CONFIG")
    );
    let ddata = h
        .update_link_resource_a(&link(&env, &dir, Value::map(), Value::Null))
        .await
        .expect("dir link");
    assert_eq!(
        ddata.get("variable").and_then(Value::as_str),
        Some("DIR_DATA_DIR")
    );

    let expected = format!(
        "{MARKER}\n# generated\nDIR_DATA_DIR='{}'\nFILE_APP_CONFIG='{}'\nSECRET_DATABASE='{secret_value}'\n",
        tmp.s("data"),
        tmp.s("data/app.conf")
    );
    assert_eq!(std::fs::read_to_string(&env_path).expect("read"), expected);

    // Idempotent.
    h.update_link_resource_a(&link(&env, &secret, named, data.clone()))
        .await
        .expect("again");
    assert_eq!(std::fs::read_to_string(&env_path).expect("read"), expected);

    // The annotation changes: the old variable is replaced.
    let renamed = h
        .update_link_resource_a(&link(
            &env,
            &secret,
            Value::map().with("local.envFile.name", "db"),
            data,
        ))
        .await
        .expect("rename");
    let text = std::fs::read_to_string(&env_path).expect("read");
    assert!(text.contains(&format!("SECRET_DB='{secret_value}'")));
    assert!(!text.contains("SECRET_DATABASE"));

    // The env file's own update keeps the entries; read reports them in
    // `values` (sensitive: the links' lines may be secrets), the rest of the
    // spec unchanged.
    let read = h.read(&env).await.expect("read").expect("exists");
    assert_eq!(without_values(&read.spec), env.spec);
    assert_eq!(
        value_names(&read.spec),
        ["DIR_DATA_DIR", "FILE_APP_CONFIG", "SECRET_DB"]
    );
    assert!(
        read.spec
            .get("values")
            .and_then(|v| v.get("SECRET_DB"))
            .is_some_and(Value::is_sensitive)
    );
    let env = h
        .update(
            &env,
            spec(serde_json::json!({"path": ".env", "header": "line 1\nline 2"})),
        )
        .await
        .expect("update");
    let text = std::fs::read_to_string(&env_path).expect("read");
    assert!(text.starts_with(&format!("{MARKER}\n# line 1\n# line 2\nDIR_DATA_DIR=")));
    assert!(text.contains("SECRET_DB="));
    assert_eq!(
        without_values(&h.read(&env).await.expect("read").expect("exists").spec),
        env.spec
    );

    // Removal: resource B's state absent means "remove the line".
    let mut gone = secret.clone();
    gone.state = Value::Null;
    let removed = h
        .update_link_resource_a(&link(
            &env,
            &gone,
            Value::map().with("local.envFile.name", "db"),
            renamed,
        ))
        .await
        .expect("remove");
    assert_eq!(removed.get("removed").and_then(Value::as_bool), Some(true));
    assert_eq!(
        removed.get("variable").and_then(Value::as_str),
        Some("SECRET_DB")
    );
    let text = std::fs::read_to_string(&env_path).expect("read");
    assert!(!text.contains("SECRET_"));
    assert!(!text.contains(&secret_value));
    assert!(text.contains("FILE_APP_CONFIG="));

    // A header edited by hand is drift.
    std::fs::write(&env_path, text.replace("# line 2", "# edited")).expect("edit");
    let read = h.read(&env).await.expect("read").expect("exists");
    assert_eq!(
        read.spec.get("header").and_then(Value::as_str),
        Some("line 1\nedited")
    );

    h.destroy(&env).await.expect("destroy");
    assert!(!env_path.exists());
    assert_eq!(h.read(&env).await.expect("read"), None);
    // Removing a line from a destroyed env file is fine.
    let mut dir_gone = dir.clone();
    dir_gone.state = Value::map();
    h.update_link_resource_a(&link(&env, &dir_gone, Value::map(), ddata))
        .await
        .expect("remove from missing file");
    assert!(!env_path.exists());
}

#[tokio::test]
async fn env_file_stage_and_foreign_files() {
    let tmp = TempDir::new("envstage");
    let h = harness(tmp.path()).await;
    let secret = h
        .create("local/randomSecret", "s", Value::map())
        .await
        .expect("secret");
    let env = h
        .create(
            "local/envFile",
            "env",
            spec(serde_json::json!({"path": "app.env"})),
        )
        .await
        .expect("env");
    let staged = h
        .stage_link(&link(
            &env,
            &secret,
            Value::map().with("local.envFile.name", "--"),
            Value::Null,
        ))
        .await
        .expect("stage");
    assert_eq!(staged.diagnostics.len(), 1);
    assert_eq!(staged.diagnostics[0].code, "local.envfile-variable-invalid");
    let staged = h
        .stage_link(&link(
            &env,
            &secret,
            Value::map().with("local.envFile.name", 3),
            Value::Null,
        ))
        .await
        .expect("stage");
    assert_eq!(staged.diagnostics.len(), 1);
    let staged = h
        .stage_link(&link(&env, &secret, Value::map(), Value::Null))
        .await
        .expect("stage");
    assert!(staged.diagnostics.is_empty());

    std::fs::write(tmp.join("theirs.env"), "FOO=bar\n").expect("write");
    let e = h
        .create(
            "local/envFile",
            "theirs",
            spec(serde_json::json!({"path": "theirs.env"})),
        )
        .await
        .expect_err("conflict");
    assert_eq!(e.class, ErrorClass::Conflict);
    assert_eq!(
        std::fs::read_to_string(tmp.join("theirs.env")).expect("read"),
        "FOO=bar\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_env_file_links_keep_every_line() {
    let tmp = TempDir::new("envconc");
    let h = Arc::new(harness(tmp.path()).await);
    let env = h
        .create(
            "local/envFile",
            "env",
            spec(serde_json::json!({"path": ".env"})),
        )
        .await
        .expect("env");
    let mut secrets = Vec::new();
    for i in 0..8 {
        secrets.push(
            h.create("local/randomSecret", &format!("secret{i}"), Value::map())
                .await
                .expect("secret"),
        );
    }
    let mut tasks = Vec::new();
    for s in secrets {
        let h = h.clone();
        let req = link(&env, &s, Value::map(), Value::Null);
        tasks.push(tokio::spawn(
            async move { h.update_link_resource_a(&req).await },
        ));
    }
    for t in tasks {
        t.await.expect("join").expect("link");
    }
    let text = std::fs::read_to_string(tmp.join(".env")).expect("read");
    for i in 0..8 {
        assert!(text.contains(&format!("SECRET_SECRET{i}=")), "{text}");
    }
}

#[tokio::test]
async fn file_in_directory_link() {
    let tmp = TempDir::new("hard");
    let h = harness(tmp.path()).await;
    let dir = h
        .create(
            "local/directory",
            "conf",
            spec(serde_json::json!({"path": "conf"})),
        )
        .await
        .expect("dir");
    let inside = h
        .create(
            "local/file",
            "a",
            spec(serde_json::json!({"path": "conf/a.txt"})),
        )
        .await
        .expect("file");
    let outside = h
        .create(
            "local/file",
            "b",
            spec(serde_json::json!({"path": "b.txt"})),
        )
        .await
        .expect("file");
    let data = h
        .update_link_resource_a(&link(&inside, &dir, Value::map(), Value::Null))
        .await
        .expect("link");
    assert_eq!(data, Value::map().with("directory", tmp.s("conf")));
    let e = h
        .update_link_resource_a(&link(&outside, &dir, Value::map(), Value::Null))
        .await
        .expect_err("outside");
    assert_eq!(e.class, ErrorClass::BadInput);
    let staged = h
        .stage_link(&link(&outside, &dir, Value::map(), Value::Null))
        .await
        .expect("stage");
    assert_eq!(staged.diagnostics.len(), 1);
    assert_eq!(staged.diagnostics[0].code, "local.file-outside-directory");
    let staged = h
        .stage_link(&link(&inside, &dir, Value::map(), Value::Null))
        .await
        .expect("stage");
    assert!(staged.diagnostics.is_empty());
}

#[tokio::test]
async fn data_source_lists_candidates() {
    let tmp = TempDir::new("ds");
    let h = harness(tmp.path()).await;
    std::fs::write(tmp.join("a.txt"), "A").expect("write");
    std::fs::create_dir_all(tmp.join("sub/deeper")).expect("mkdir");
    std::fs::write(tmp.join("sub/b.txt"), "B").expect("write");
    std::fs::write(tmp.join("sub/deeper/c.txt"), "C").expect("write");
    std::fs::write(tmp.join("big.bin"), vec![b'x'; 1024 * 1024 + 1]).expect("write");
    std::fs::write(tmp.join("binary"), [0xff, 0xfe]).expect("write");
    std::os::unix::fs::symlink("/etc/hostname", tmp.join("link")).expect("symlink");

    let items = h.fetch("local/file", vec![]).await.expect("fetch");
    let paths: Vec<_> = items
        .iter()
        .filter_map(|i| i.get("path").and_then(Value::as_str))
        .collect();
    assert_eq!(paths, ["a.txt", "big.bin", "binary", "sub/b.txt"]);
    let a = &items[0];
    assert_eq!(a.get("name").and_then(Value::as_str), Some("a.txt"));
    assert_eq!(a.get("content").and_then(Value::as_str), Some("A"));
    assert_eq!(a.get("size").and_then(Value::as_i64), Some(1));
    assert_eq!(
        a.get("absolutePath").and_then(Value::as_str),
        Some(tmp.s("a.txt").as_str())
    );
    assert!(items[1].get("content").is_none(), "over 1 MiB: no content");
    assert_eq!(
        items[1].get("size").and_then(Value::as_i64),
        Some(1024 * 1024 + 1)
    );
    assert!(items[2].get("content").is_none(), "not UTF-8: no content");
    assert_eq!(items[3].get("name").and_then(Value::as_str), Some("b.txt"));

    let by_name = Filter {
        field: "name".into(),
        operator: "=".into(),
        search: "b.txt".into(),
    };
    let items = h
        .fetch("local/file", vec![by_name.clone()])
        .await
        .expect("fetch");
    assert_eq!(items.len(), 1);
    assert_eq!(items[0].get("content").and_then(Value::as_str), Some("B"));
    // Operators the provider does not pre-filter return every candidate.
    let other = Filter {
        field: "name".into(),
        operator: "in".into(),
        search: Value::from(vec!["b.txt"]),
    };
    assert_eq!(
        h.fetch("local/file", vec![other])
            .await
            .expect("fetch")
            .len(),
        4
    );
    let prefix = Filter {
        field: "path".into(),
        operator: "starts with".into(),
        search: "sub/".into(),
    };
    assert_eq!(
        h.fetch("local/file", vec![prefix])
            .await
            .expect("fetch")
            .len(),
        1
    );
}

#[tokio::test]
async fn file_mode_options() {
    let tmp = TempDir::new("opts");
    let h = harness(tmp.path()).await;
    let opts = h.variable_options("local/fileMode").await.expect("options");
    let pairs: Vec<(String, Option<String>)> = opts
        .iter()
        .map(|o| (o.label.clone(), o.value.as_str().map(str::to_owned)))
        .collect();
    for (label, value) in [
        ("private", "0600"),
        ("shared", "0644"),
        ("executable", "0755"),
    ] {
        assert!(
            pairs.contains(&(label.to_owned(), Some(value.to_owned()))),
            "{label}"
        );
    }
    assert_eq!(opts.len(), 7);
    // Every value is a mode local/file accepts.
    for o in &opts {
        let v = o.value.as_str().unwrap_or_default();
        assert!(trellis_provider_local::file::FILE_MODES.contains(&v), "{v}");
    }
}

#[tokio::test]
async fn sha256_function() {
    let tmp = TempDir::new("fn");
    let h = harness(tmp.path()).await;
    let r = h
        .call_function("sha256", vec!["abc".into()])
        .await
        .expect("call");
    assert_eq!(
        r.as_str(),
        Some("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
    );
    assert!(!r.is_sensitive());
    let r = h
        .call_function("sha256", vec![Value::sensitive("pw")])
        .await
        .expect("call");
    assert!(r.is_sensitive());
    let r = h
        .call_function("sha256", vec![Value::Unknown])
        .await
        .expect("call");
    assert!(r.is_unknown());
    let e = h
        .call_function("sha256", vec![3.into()])
        .await
        .expect_err("bad arg");
    assert_eq!(e.class, ErrorClass::BadInput);
    assert_eq!(e.path, Some(AttrPath::root().index(0)));
}

#[tokio::test]
async fn link_destroy_removes_the_env_line() {
    let tmp = TempDir::new("env-destroy");
    let h = harness(tmp.path()).await;
    let env = h
        .create("local/envFile", "env", Value::map().with("path", "app.env"))
        .await
        .expect("env file");
    let file = h
        .create("local/file", "conf", Value::map().with("path", "conf.txt"))
        .await
        .expect("file");
    let added = h
        .update_link_resource_a(&link(&env, &file, Value::map(), Value::Null))
        .await
        .expect("link");
    let text = std::fs::read_to_string(tmp.path().join("app.env")).expect("env text");
    assert!(text.contains("FILE_CONF="), "{text}");
    let mut gone = link(&env, &file, Value::map(), added);
    gone.update_type = trellis_plugin_sdk::proto::LinkUpdateType::Destroy;
    h.update_link_resource_a(&gone).await.expect("unlink");
    let text = std::fs::read_to_string(tmp.path().join("app.env")).expect("env text");
    assert!(!text.contains("FILE_CONF="), "{text}");
}

#[tokio::test]
async fn env_file_values_and_owned_entries() {
    let tmp = TempDir::new("envvalues");
    let h = harness(tmp.path()).await;
    let env_path = tmp.join(".env");
    let env = h
        .create(
            "local/envFile",
            "env",
            spec(serde_json::json!({"path": ".env", "values": {"PORT": "8080", "MODE": "it's"}})),
        )
        .await
        .expect("env");
    assert_eq!(
        std::fs::read_to_string(&env_path).expect("read"),
        format!("{MARKER}\nMODE=\"it's\"\nPORT='8080'\n")
    );
    // Read reports the file's entries; the spec's own values as they are.
    let read = h.read(&env).await.expect("read").expect("exists");
    assert_eq!(read.spec, env.spec);

    // A link's line: stage declares it owned (values.<VARIABLE> of A).
    let secret = h
        .create("local/randomSecret", "dbPassword", Value::map())
        .await
        .expect("secret");
    let req = link(&env, &secret, Value::map(), Value::Null);
    let staged = h.stage_link(&req).await.expect("stage");
    assert!(staged.diagnostics.is_empty(), "{:?}", staged.diagnostics);
    assert_eq!(
        staged.owned_paths_a,
        [AttrPath::root().field("values").field("SECRET_DB_PASSWORD")]
    );
    assert!(staged.owned_paths_b.is_empty());
    h.update_link_resource_a(&req).await.expect("link");
    let read = h.read(&env).await.expect("read").expect("exists");
    assert_eq!(
        value_names(&read.spec),
        ["MODE", "PORT", "SECRET_DB_PASSWORD"]
    );
    let values = read.spec.get("values").cloned().unwrap_or_default();
    assert!(
        values
            .get("SECRET_DB_PASSWORD")
            .is_some_and(Value::is_sensitive)
    );
    assert!(!values.get("PORT").is_some_and(Value::is_sensitive));

    // A line added and a value changed by hand are seen.
    let text = std::fs::read_to_string(&env_path).expect("read");
    std::fs::write(
        &env_path,
        text.replace("PORT='8080'", "PORT='9090'") + "EXTRA=x\n",
    )
    .expect("edit");
    let read = h.read(&env).await.expect("read").expect("exists");
    let values = read.spec.get("values").cloned().unwrap_or_default();
    assert_eq!(values.get("PORT").and_then(Value::as_str), Some("9090"));
    assert_eq!(values.get("EXTRA").and_then(Value::as_str), Some("x"));

    // An update writes the new values, removes the ones dropped from the
    // spec, and keeps the rest (the link's line, the hand-added one).
    let env = h
        .update(
            &env,
            spec(serde_json::json!({"path": ".env", "values": {"PORT": "8081"}})),
        )
        .await
        .expect("update");
    let text = std::fs::read_to_string(&env_path).expect("read");
    assert!(text.contains("PORT='8081'"), "{text}");
    assert!(!text.contains("MODE="), "{text}");
    assert!(text.contains("SECRET_DB_PASSWORD="), "{text}");
    assert!(text.contains("EXTRA='x'"), "{text}");

    // A static value with the link's variable is reported by stage.
    let env2 = h
        .update(
            &env,
            spec(serde_json::json!({"path": ".env", "values": {"SECRET_DB_PASSWORD": "mine"}})),
        )
        .await
        .expect("update");
    let staged = h
        .stage_link(&link(&env2, &secret, Value::map(), Value::Null))
        .await
        .expect("stage");
    assert_eq!(
        codes(&staged.diagnostics),
        [pair("local.envfile-variable-taken", "")]
    );
}

#[tokio::test]
async fn env_file_values_names_are_checked() {
    let tmp = TempDir::new("envnames");
    let h = harness(tmp.path()).await;
    let bad = spec(serde_json::json!({"path": ".env", "values": {"1X": "a", "OK": "b"}}));
    let ds = h
        .validate("local/envFile", "env", bad.clone())
        .await
        .expect("validate");
    assert_eq!(
        codes(&ds),
        [pair("local.envfile-variable-invalid", r#"values["1X"]"#)]
    );
    let e = h
        .create("local/envFile", "env", bad)
        .await
        .expect_err("bad name");
    assert_eq!(e.class, ErrorClass::BadInput);
    assert!(!tmp.join(".env").exists());
}

#[tokio::test]
async fn data_source_json_objects() {
    let tmp = TempDir::new("dsjson");
    let h = harness(tmp.path()).await;
    std::fs::write(
        tmp.join("a.json"),
        r#"{"name": "a", "tags": {"env": "prod"}}"#,
    )
    .expect("write");
    std::fs::write(tmp.join("b.json"), "[1, 2]").expect("write");
    std::fs::write(tmp.join("c.txt"), "{not json").expect("write");
    std::fs::write(tmp.join("d.json"), " {}\n").expect("write");
    let items = h.fetch("local/file", vec![]).await.expect("fetch");
    let json: Vec<_> = items.iter().map(|i| i.get("json").cloned()).collect();
    assert_eq!(
        json,
        [
            Some(spec(
                serde_json::json!({"name": "a", "tags": {"env": "prod"}})
            )),
            None,
            None,
            Some(Value::map()),
        ]
    );
}

#[tokio::test]
async fn files_and_directories_are_importable_by_path_and_read_back_without_drift() {
    let tmp = TempDir::new("import");
    let h = harness(tmp.path()).await;
    let m = h.manifest().await.expect("manifest");
    let importable: Vec<_> = m
        .resource_types
        .iter()
        .filter(|t| t.importable)
        .map(|t| t.r#type.as_str())
        .collect();
    assert_eq!(importable, ["local/directory", "local/file"]);
    assert!(h.capabilities().import_resource);

    std::fs::create_dir(tmp.join("d")).unwrap();
    std::fs::write(tmp.join("d/f.txt"), "text\n").unwrap();
    std::fs::set_permissions(tmp.join("d/f.txt"), PermissionsExt::from_mode(0o640)).unwrap();
    let found = h
        .import("local/file", "f", "d/f.txt")
        .await
        .expect("import")
        .expect("found");
    assert_eq!(
        found.spec,
        spec(serde_json::json!({"path": "d/f.txt", "content": "text\n", "mode": "0640"}))
    );
    assert_eq!(
        found.external_id.as_deref(),
        Some(tmp.s("d/f.txt").as_str())
    );
    // What import reported is what a read of the recorded resource reports: no drift.
    let recorded = ResourceState {
        resource_type: "local/file".into(),
        name: "f".into(),
        external_id: tmp.s("d/f.txt"),
        spec: found.spec.clone(),
        state: found.state.clone(),
    };
    let read = h.read(&recorded).await.expect("read").expect("exists");
    assert_eq!(read.spec, found.spec);
    assert_eq!(read.state, found.state);

    let dir = h
        .import("local/directory", "d", &tmp.s("d"))
        .await
        .expect("import")
        .expect("found");
    assert_eq!(
        dir.spec.get("path").and_then(Value::as_str),
        Some(tmp.s("d").as_str())
    );
    assert_eq!(
        dir.state.get("created").and_then(Value::as_bool),
        Some(true)
    );

    // Nothing there, a directory where a file was asked for, and text that cannot be carried.
    assert_eq!(
        h.import("local/file", "f", "nothing.txt")
            .await
            .expect("import"),
        None
    );
    assert_eq!(
        h.import("local/file", "f", "d").await.expect("import"),
        None
    );
    std::fs::write(tmp.join("bin"), [0xff, 0xfe, 0x00]).unwrap();
    let err = h
        .import("local/file", "b", "bin")
        .await
        .expect_err("not UTF-8");
    assert_eq!(err.class, ErrorClass::BadInput, "{err:?}");
    // The root holds for imports too.
    let err = h
        .import("local/file", "x", "/etc/hostname")
        .await
        .expect_err("outside the root");
    assert!(err.message.contains("root"), "{err:?}");
    let err = h
        .import("local/randomSecret", "s", "x")
        .await
        .expect_err("not importable");
    assert!(err.message.contains("cannot be imported"), "{err:?}");
}
