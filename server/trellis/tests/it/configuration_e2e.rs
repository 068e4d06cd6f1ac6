//! End to end, configuration (docs/configuration.md): provider settings from the engine's config
//! file, pinned keys, the local provider's confinement, environment files with secrets read on
//! the caller's machine, and property injectors with their precedence and origin. The real
//! `trellis serve` with the real `local` plugin, driven by the real CLI.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use crate::engine_common::{Engine, all_output, read, stderr, write};
use crate::plugins_common::TempDir;
use serde_json::Value;

/// Unusual enough to appear nowhere by chance.
const SECRET: &str = "Vq3-env-secret-71Lp";

/// A client command with extra environment variables (what `fromEnv` reads).
fn cli_env(engine: &Engine, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trellis"))
        .args(args)
        .args(["--engine", &engine.addr])
        .current_dir(&engine.cwd)
        .env_remove("TRELLIS_CA_CERT")
        .envs(env.iter().copied())
        .output()
        .expect("run trellis")
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .expect("file exists")
        .permissions()
        .mode()
        & 0o777
}

/// `trellis serve --config FILE` that must fail at startup: its exit code and stderr.
fn serve_fails(root: &Path, config: &Path) -> (Option<i32>, String) {
    let plugins = crate::engine_common::plugin_dir(root);
    let out = Command::new(env!("CARGO_BIN_EXE_trellis"))
        .args(["serve", "--listen", "127.0.0.1:0", "--no-bundled-plugins"])
        .arg("--plugin-dir")
        .arg(&plugins)
        .arg("--data-dir")
        .arg(root.join("data-bad"))
        .arg("--config")
        .arg(config)
        .current_dir(root)
        .output()
        .expect("run trellis serve");
    (out.status.code(), stderr(&out))
}

const FILES: &str = r#"version: 2023-04-20
variables:
  token:
    type: string
resources:
  secretFile:
    type: local/file
    spec:
      path: secret.txt
      content: ${variables.token}
  authorFile:
    type: local/file
    spec:
      path: author.txt
      content: author
      mode: "0644"
"#;

#[test]
fn engine_root_confines_at_validation_and_at_apply_and_cannot_be_overridden() {
    let dir = TempDir::new("cfg-root");
    let root = dir.path().join("files");
    std::fs::create_dir_all(root.join("inside")).unwrap();
    std::fs::create_dir_all(dir.path().join("outside")).unwrap();
    let root = root.canonicalize().unwrap();
    let config = dir.path().join("trellis.toml");
    write(
        &config,
        &format!(
            "[providers.local]\nroot = \"{}\"\npinned = [\"root\"]\n",
            root.display()
        ),
    );
    let engine = Engine::builder(dir.path())
        .args(&["--config", config.to_str().unwrap()])
        .start();

    // Validation: an absolute path outside the root is refused at the attribute.
    let outside = dir.path().join("outside/x.txt");
    write(
        &dir.path().join("out.yaml"),
        &format!(
            "version: 2023-04-20\nresources:\n  x:\n    type: local/file\n    spec:\n      path: {}\n      content: no\n",
            outside.display()
        ),
    );
    let out = engine.cli(&["plan", "out.yaml", "--instance", "out"]);
    let text = all_output(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("local.path-outside-root"), "{text}");
    assert!(text.contains("out.yaml:6:7"), "{text}");

    // Apply: a path that resolved inside the root when planned (through a symlink) and points
    // outside when executed is refused by the provider, and nothing is written outside.
    std::os::unix::fs::symlink(root.join("inside"), root.join("link")).unwrap();
    write(
        &dir.path().join("link.yaml"),
        "version: 2023-04-20\nresources:\n  y:\n    type: local/file\n    spec:\n      path: link/y.txt\n      content: moved\n",
    );
    let (code, plan) = engine.json(&["plan", "link.yaml", "--instance", "link"]);
    assert_eq!(code, 0, "{plan}");
    let cs = plan["changeSet"]["id"].as_str().unwrap().to_owned();
    std::fs::remove_file(root.join("link")).unwrap();
    std::os::unix::fs::symlink(dir.path().join("outside"), root.join("link")).unwrap();
    let out = engine.cli(&["deploy", "--change-set", &cs]);
    let text = all_output(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("outside the provider's root"), "{text}");
    assert!(!dir.path().join("outside/y.txt").exists());

    // A request cannot move the pinned root.
    write(
        &dir.path().join("wide.yaml"),
        "name: wide\nproviders:\n  local:\n    root: /\n",
    );
    let out = engine.cli(&[
        "plan",
        "out.yaml",
        "--instance",
        "wide",
        "--env",
        "wide.yaml",
    ]);
    let text = all_output(&out);
    assert_ne!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("environment `wide`: `providers.local.root` is pinned"),
        "{text}"
    );
}

#[test]
fn without_configuration_local_is_confined_to_the_engines_directory() {
    let dir = TempDir::new("cfg-default-root");
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let engine = Engine::builder(dir.path()).cwd(&work).start();
    let outside = dir.path().join("escaped.txt");
    write(
        &work.join("bp.yaml"),
        &format!(
            "version: 2023-04-20\nresources:\n  x:\n    type: local/file\n    spec:\n      path: {}\n      content: no\n",
            outside.display()
        ),
    );
    let out = engine.cli(&["deploy", "bp.yaml", "--instance", "esc"]);
    let text = all_output(&out);
    assert_ne!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("local.path-outside-root"), "{text}");
    assert!(!outside.exists());
    // The same request with the root widened by an environment is refused: the default root
    // is pinned too.
    write(
        &work.join("wide.yaml"),
        "providers:\n  local:\n    root: /\n",
    );
    let out = engine.cli(&["plan", "bp.yaml", "--instance", "esc", "--env", "wide.yaml"]);
    assert!(
        all_output(&out).contains("is pinned"),
        "{}",
        all_output(&out)
    );
}

#[test]
fn environment_secrets_reach_the_resource_and_nothing_else() {
    let dir = TempDir::new("cfg-secret");
    let engine = Engine::builder(dir.path())
        .env("TRELLIS_LOG_LEVEL", "debug")
        .capture_stderr()
        .start();
    write(&dir.path().join("bp.yaml"), FILES);
    write(
        &dir.path().join("dev.yaml"),
        "variables:\n  token: { fromEnv: CFG_TEST_TOKEN }\n",
    );
    let env = [("CFG_TEST_TOKEN", SECRET)];
    let mut shown = String::new();
    for args in [
        vec!["plan", "bp.yaml", "--instance", "dev", "--env", "dev.yaml"],
        vec![
            "plan",
            "bp.yaml",
            "--instance",
            "dev",
            "--env",
            "dev.yaml",
            "--format",
            "json",
        ],
        vec![
            "deploy",
            "bp.yaml",
            "--instance",
            "dev",
            "--env",
            "dev.yaml",
        ],
        vec!["instance", "dev", "--format", "json"],
        vec!["instance", "dev"],
        vec!["events", "--instance", "dev", "--format", "json"],
    ] {
        let out = cli_env(&engine, &args, &env);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", all_output(&out));
        shown.push_str(&all_output(&out));
    }
    // Where the blueprint puts it, and nowhere else.
    assert_eq!(read(&dir.path().join("secret.txt")), SECRET);
    assert!(!shown.contains(SECRET), "a secret was shown:\n{shown}");
    assert!(shown.contains("(sensitive)"), "{shown}");
    let (_, logs) = engine.stop();
    assert!(!logs.contains(SECRET), "a secret reached the engine's log");
}

#[test]
fn injectors_follow_precedence_and_plans_show_their_origin() {
    let dir = TempDir::new("cfg-injectors");
    let config = dir.path().join("trellis.toml");
    write(
        &config,
        "[injectors.\"local/file\"]\nmode = \"0640\"\n\n[injectors.\"local/directory\"]\nmode = \"0750\"\n",
    );
    let engine = Engine::builder(dir.path())
        .args(&["--config", config.to_str().unwrap()])
        .start();
    let bp =
        format!("{FILES}  plainDir:\n    type: local/directory\n    spec:\n      path: plain\n");
    write(&dir.path().join("bp.yaml"), &bp);
    write(
        &dir.path().join("stage.yaml"),
        "name: stage\nvariables:\n  token: t\ninjectors:\n  local/file:\n    mode: \"0600\"\n",
    );
    let (code, plan) = engine.json(&[
        "plan",
        "bp.yaml",
        "--instance",
        "inj",
        "--env",
        "stage.yaml",
    ]);
    assert_eq!(code, 0, "{plan}");
    let field = |resource: &str, path: &str| -> Value {
        plan["changeSet"]["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == resource)
            .and_then(|r| {
                r["fields"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|f| f["path"] == path)
            })
            .cloned()
            .unwrap_or(Value::Null)
    };
    // The environment's value beats the engine's, and says so.
    assert_eq!(field("secretFile", "spec.mode")["new"], "0600");
    assert_eq!(field("secretFile", "spec.mode")["origin"], "environment");
    // The engine's applies where the environment has none.
    assert_eq!(field("plainDir", "spec.mode")["new"], "0750");
    assert_eq!(field("plainDir", "spec.mode")["origin"], "engine");
    // The author's value beats both, and has no origin.
    assert_eq!(field("authorFile", "spec.mode")["new"], "0644");
    assert_eq!(field("authorFile", "spec.mode").get("origin"), None);

    let text = all_output(&engine.cli(&[
        "plan",
        "bp.yaml",
        "--instance",
        "inj",
        "--env",
        "stage.yaml",
    ]));
    assert!(
        text.contains("spec.mode: \"0600\"  (injected by environment)"),
        "{text}"
    );

    let out = engine.cli(&[
        "deploy",
        "bp.yaml",
        "--instance",
        "inj",
        "--env",
        "stage.yaml",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    assert_eq!(mode(&dir.path().join("secret.txt")), 0o600);
    assert_eq!(mode(&dir.path().join("author.txt")), 0o644);
    assert_eq!(mode(&dir.path().join("plain")), 0o750);

    // The instance records the environment it was deployed with.
    let inst = engine.instance("inj");
    assert_eq!(inst["environment"]["name"], "stage");
    let digest = inst["environment"]["digest"].as_str().unwrap();
    assert!(digest.starts_with("sha256:"), "{inst}");
    assert_eq!(
        inst["environment"]["providers"]["local"]["root"],
        dir.path().canonicalize().unwrap().display().to_string()
    );
    // Destroy takes no environment: it runs with the recorded one.
    let out = engine.cli(&["destroy", "--instance", "inj"]);
    assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    assert!(!dir.path().join("secret.txt").exists());
    assert!(!dir.path().join("plain").exists());
}

#[test]
fn an_injected_value_is_validated_like_a_written_one() {
    let dir = TempDir::new("cfg-inj-invalid");
    let engine = Engine::start(dir.path());
    write(&dir.path().join("bp.yaml"), FILES);
    write(
        &dir.path().join("bad.yaml"),
        "variables:\n  token: t\ninjectors:\n  local/file:\n    mode: \"rwx\"\n",
    );
    let out = engine.cli(&["plan", "bp.yaml", "--instance", "bad", "--env", "bad.yaml"]);
    let text = all_output(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    // Checked against the provider's schema (its allowed modes) like a written value...
    assert!(
        text.contains("error[T0807]") && text.contains("\"rwx\""),
        "{text}"
    );
    // ...and the diagnostic points into the injector's source, not the blueprint.
    assert!(text.contains("--> environment bad (injectors):"), "{text}");
}

#[test]
fn unknown_namespaces_and_keys_are_clear_errors() {
    let dir = TempDir::new("cfg-unknown");
    // At engine startup: the engine does not start.
    let config = dir.path().join("ns.toml");
    write(&config, "[providers.nope]\nregion = \"x\"\n");
    let (code, err) = serve_fails(dir.path(), &config);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("`providers.nope`: no provider `nope` is installed"),
        "{err}"
    );
    let config = dir.path().join("key.toml");
    write(&config, "[providers.local]\nrooot = \"/tmp\"\n");
    let (code, err) = serve_fails(dir.path(), &config);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("`providers.local.rooot`: provider `local` has no config key `rooot`"),
        "{err}"
    );
    let config = dir.path().join("env.toml");
    write(
        &config,
        "[providers.local]\nroot = { fromEnv = \"CFG_TEST_UNSET_ROOT\" }\n",
    );
    let (code, err) = serve_fails(dir.path(), &config);
    // A config file that cannot be read is a usage error (2), like a bad flag.
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("`CFG_TEST_UNSET_ROOT` is not set"), "{err}");
    // A root the provider refuses (ValidateConfig), named by its key.
    let config = dir.path().join("missing.toml");
    write(
        &config,
        "[providers.local]\nroot = \"/nonexistent/trellis-root\"\n",
    );
    let (code, err) = serve_fails(dir.path(), &config);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("`providers.local.root` [local.root-invalid]"),
        "{err}"
    );

    // In a request's environment: refused with the key named.
    let engine = Engine::start(dir.path());
    write(&dir.path().join("bp.yaml"), FILES);
    write(
        &dir.path().join("ns.yaml"),
        "name: n\nproviders:\n  nope:\n    a: 1\n",
    );
    let plan_with = |env: &str| {
        all_output(&engine.cli(&[
            "plan",
            "bp.yaml",
            "--instance",
            "u",
            "--env",
            env,
            "--var",
            "token=t",
        ]))
    };
    let text = plan_with("ns.yaml");
    assert!(
        text.contains("environment `n`: `providers.nope`: no provider `nope` is installed"),
        "{text}"
    );
    write(
        &dir.path().join("key.yaml"),
        "name: k\nproviders:\n  local:\n    rooot: /x\n",
    );
    let text = plan_with("key.yaml");
    assert!(
        text.contains(
            "environment `k`: `providers.local.rooot`: provider `local` has no config key"
        ),
        "{text}"
    );
}

#[test]
fn var_files_and_vars_override_the_environment_in_order() {
    let dir = TempDir::new("cfg-var-files");
    let engine = Engine::start(dir.path());
    write(&dir.path().join("bp.yaml"), FILES);
    write(
        &dir.path().join("env.yaml"),
        "variables:\n  token: from-env\n",
    );
    write(&dir.path().join("a.yaml"), "token: from-file-a\n");
    write(&dir.path().join("b.json"), "{\"token\": \"from-file-b\"}\n");
    let deploy = |extra: &[&str]| {
        let mut args = vec!["deploy", "bp.yaml", "--instance", "v", "--env", "env.yaml"];
        args.extend_from_slice(extra);
        let out = engine.cli(&args);
        assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
        read(&dir.path().join("secret.txt"))
    };
    assert_eq!(deploy(&[]), "from-env");
    assert_eq!(deploy(&["--var-file", "a.yaml"]), "from-file-a");
    assert_eq!(
        deploy(&["--var-file", "a.yaml", "--var-file", "b.json"]),
        "from-file-b"
    );
    assert_eq!(
        deploy(&["--var-file", "a.yaml", "--var", "token=from-var"]),
        "from-var"
    );
}

/// The README's example: one blueprint, two stages, two instances with their environments.
#[test]
fn the_example_stages_deploy_one_blueprint_twice() {
    let dir = TempDir::new("cfg-examples");
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    for f in ["local-app.yaml", "dev.yaml", "prod.yaml"] {
        std::fs::copy(examples.join(f), dir.path().join(f)).unwrap();
    }
    let engine = Engine::start(dir.path());
    for (instance, env) in [("shop-dev", "dev.yaml"), ("shop-prod", "prod.yaml")] {
        let out = engine.cli(&[
            "deploy",
            "local-app.yaml",
            "--instance",
            instance,
            "--env",
            env,
        ]);
        assert_eq!(out.status.code(), Some(0), "{}", all_output(&out));
    }
    let app = dir.path().join(".trellis-example");
    // The stages' variables: dev lays out staging with one service, prod production with three.
    assert!(app.join("staging/api.conf").exists());
    assert!(!app.join("staging/worker.conf").exists());
    assert!(app.join("production/scheduler.conf").exists());
    // The dev injector sets the mode the blueprint leaves out; the blueprint's own wins.
    assert_eq!(mode(&app.join("staging/DEBUG.txt")), 0o600);
    assert_eq!(mode(&app.join("staging/api.conf")), 0o640);
    let dev = engine.instance("shop-dev");
    let prod = engine.instance("shop-prod");
    assert_eq!(dev["environment"]["name"], "dev");
    assert_eq!(prod["environment"]["name"], "prod");
    assert_ne!(dev["environment"]["digest"], prod["environment"]["digest"]);
}
