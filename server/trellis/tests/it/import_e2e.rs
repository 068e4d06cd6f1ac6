//! `trellis import` on the real binary with the real `local` plugin: files and directories made
//! by hand are adopted, the printed entries make a blueprint that plans no change, and from
//! then on deploy and destroy manage them like any other resource.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::engine_common::{Engine, actions, stderr, write};
use crate::plugins_common::TempDir;

/// `trellis import` in text form: its exit code, stdout and stderr.
fn import(engine: &Engine, args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["import"];
    all.extend(args);
    let out = engine.cli(&all);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr(&out),
    )
}

/// A blueprint made of the `resources:` entries `trellis import` printed.
fn blueprint_of(printed: &[&str]) -> String {
    let mut out = String::from("version: 2023-04-20\nresources:\n");
    for text in printed {
        let entry = text
            .split_once("\nresources:\n")
            .unwrap_or_else(|| panic!("no resources entry in:\n{text}"))
            .1;
        out.push_str(entry);
    }
    out
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

#[test]
fn imported_resources_plan_no_change_and_are_managed_from_then_on() {
    let dir = TempDir::new("import");
    let root = dir.path();
    let existing = root.join("existing");
    std::fs::create_dir(&existing).unwrap();
    std::fs::set_permissions(&existing, std::fs::Permissions::from_mode(0o750)).unwrap();
    let notes = existing.join("notes.txt");
    // Text that looks like YAML and like a substitution: printed so that it reads back as is.
    let content = "key: value\n# not a comment\necho ${HOME}\n";
    write(&notes, content);
    std::fs::set_permissions(&notes, std::fs::Permissions::from_mode(0o600)).unwrap();
    let engine = Engine::start(root);

    let (code, dir_yaml, err) = import(
        &engine,
        &[
            "data",
            "--instance",
            "app",
            "--type",
            "local/directory",
            "--id",
            "existing",
        ],
    );
    assert_eq!(code, 0, "{err}\n{dir_yaml}");
    assert!(dir_yaml.contains("type: local/directory"), "{dir_yaml}");
    assert!(dir_yaml.contains("mode: \"0750\""), "{dir_yaml}");
    let (code, notes_yaml, err) = import(
        &engine,
        &[
            "notes",
            "--instance",
            "app",
            "--type",
            "local/file",
            "--id",
            "existing/notes.txt",
        ],
    );
    assert_eq!(code, 0, "{err}\n{notes_yaml}");
    assert!(notes_yaml.contains("$${HOME}"), "{notes_yaml}");
    // Nothing outside the engine changed.
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), content);
    assert_eq!(mode(&notes), 0o600);

    let inst = engine.instance("app");
    assert_eq!(inst["status"], "DEPLOYED", "{inst}");
    let recorded = &inst["resources"]["notes"];
    assert_eq!(recorded["status"], "CREATED", "{inst}");
    assert_eq!(
        recorded["externalId"],
        notes.to_str().unwrap(),
        "the provider's id is the absolute path: {inst}"
    );
    assert_eq!(recorded["spec"]["content"], content, "{inst}");
    let kinds: Vec<String> = engine.events("app").into_iter().map(|(k, _)| k).collect();
    assert_eq!(
        kinds.iter().filter(|k| *k == "resource.imported").count(),
        2,
        "{kinds:?}"
    );

    // The printed entries, as they are, make a blueprint with nothing to change.
    write(
        &root.join("app.yaml"),
        &blueprint_of(&[&dir_yaml, &notes_yaml]),
    );
    let (code, plan) = engine.json(&["plan", "app.yaml", "--instance", "app"]);
    assert_eq!(code, 0, "{plan}");
    assert_eq!(
        actions(&plan["changeSet"]["resources"]),
        vec![
            ("data".to_owned(), "NO_CHANGE".to_owned()),
            ("notes".to_owned(), "NO_CHANGE".to_owned())
        ],
        "{plan}"
    );
    let (code, drift) = engine.json(&["drift", "--instance", "app"]);
    assert_eq!(code, 0, "{drift}");

    // From now on the blueprint manages them: a change is an update of the adopted file...
    let changed = blueprint_of(&[&dir_yaml, &notes_yaml]).replace("0600", "0640");
    write(&root.join("app.yaml"), &changed);
    let (code, deployed) = engine.json(&["deploy", "app.yaml", "--instance", "app"]);
    assert_eq!(code, 0, "{deployed}");
    assert_eq!(mode(&notes), 0o640);
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), content);

    // ... and destroy removes what was adopted.
    let (code, destroyed) = engine.json(&["destroy", "--instance", "app"]);
    assert_eq!(code, 0, "{destroyed}");
    assert!(!notes.exists(), "the adopted file is deleted by destroy");
    // An adopted directory is the instance's too: destroy removes it (when empty; the two
    // above do not depend on each other, so which went first is not known).
    let empty = root.join("empty");
    std::fs::create_dir(&empty).unwrap();
    let (code, out, err) = import(
        &engine,
        &[
            "d",
            "--instance",
            "solo",
            "--type",
            "local/directory",
            "--id",
            "empty",
        ],
    );
    assert_eq!(code, 0, "{out}\n{err}");
    let (code, destroyed) = engine.json(&["destroy", "--instance", "solo"]);
    assert_eq!(code, 0, "{destroyed}");
    assert!(!empty.exists(), "the adopted directory is removed");
}

#[test]
fn import_refuses_what_it_cannot_adopt_and_says_why() {
    let dir = TempDir::new("import-refusals");
    let root = dir.path();
    write(&root.join("a.txt"), "a");
    let engine = Engine::start(root);
    // `trellis import NAME --instance app --type TYPE --id ID`.
    let run = |name: &str, ty: &str, id: &str| {
        import(
            &engine,
            &[name, "--instance", "app", "--type", ty, "--id", id],
        )
    };

    // A type its provider does not declare importable: the importable ones are named.
    let (code, _, err) = run("s", "local/randomSecret", "x");
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("cannot be imported"), "{err}");
    assert!(
        err.contains("local/file") && err.contains("local/directory"),
        "{err}"
    );
    let (code, _, err) = run("s", "nowhere/thing", "x");
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("no provider plugin for namespace `nowhere`"),
        "{err}"
    );
    let (code, _, err) = run("1st", "local/file", "a.txt");
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("cannot name a resource"), "{err}");

    // Nothing at the id: the operation fails, and the instance records nothing.
    let (code, out, err) = run("b", "local/file", "b.txt");
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(
        format!("{out}{err}").contains("found no local/file with id `b.txt`"),
        "{out}\n{err}"
    );

    let (code, out, err) = run("a", "local/file", "a.txt");
    assert_eq!(code, 0, "{out}\n{err}");
    // The name is taken; the file is recorded already (under another name, and in another
    // form of its id).
    let (code, _, err) = run("a", "local/file", "a.txt");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("already has a resource `a`"), "{err}");
    let absolute = root.join("a.txt");
    let (code, out, err) = run("again", "local/file", absolute.to_str().unwrap());
    assert_eq!(code, 2, "{out}\n{err}");
    assert!(err.contains("already records local/file"), "{err}");
    let (code, out, err) = run("again", "local/file", "./a.txt");
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(format!("{out}{err}").contains("as `a`"), "{out}\n{err}");
    let inst = engine.instance("app");
    let names: Vec<&String> = inst["resources"].as_object().unwrap().keys().collect();
    assert_eq!(names, ["a"], "{inst}");

    // --format json: the operation and the resource as recorded.
    write(&root.join("c.txt"), "c");
    let (code, doc) = engine.json(&[
        "import",
        "c",
        "--instance",
        "app",
        "--type",
        "local/file",
        "--id",
        "c.txt",
    ]);
    assert_eq!(code, 0, "{doc}");
    assert_eq!(doc["operation"]["status"], "SUCCEEDED", "{doc}");
    assert_eq!(doc["operation"]["kind"], "IMPORT", "{doc}");
    assert_eq!(doc["resource"]["name"], "c", "{doc}");
    assert_eq!(
        doc["resource"]["externalId"],
        root.join("c.txt").to_str().unwrap(),
        "{doc}"
    );
    assert_eq!(
        doc["resource"]["spec"],
        serde_json::json!({"path": "c.txt", "content": "c", "mode": "0644"}),
        "{doc}"
    );
}

/// AWS resources made outside Trellis (boto3 against moto) are adopted through the engine: the
/// printed entries plan no change, a change to one is an update, and destroy deletes them.
#[test]
fn aws_resources_made_elsewhere_are_adopted_and_then_managed() {
    use crate::aws_moto::{boto, moto, unique};
    use serde_json::json;
    let Some(m) = moto() else { return };
    let dir = TempDir::new("import-aws");
    let root = dir.path();
    let engine = crate::aws_e2e::engine(root, m);
    let queue = unique("adopted");
    let url = boto(
        m,
        "sqs",
        "create_queue",
        json!({"QueueName": queue, "Attributes": {"VisibilityTimeout": "45"}, "tags": {"team": "a"}}),
    )
    .expect("queue")["QueueUrl"]
        .as_str()
        .unwrap()
        .to_owned();
    let bucket = unique("adopted-bucket");
    boto(m, "s3", "create_bucket", json!({"Bucket": bucket})).expect("bucket");

    // The queue by its name (recorded by its URL), the bucket by its ARN.
    let (code, queue_yaml, err) = import(
        &engine,
        &[
            "jobs",
            "--instance",
            "cloud",
            "--type",
            "aws/sqs/queue",
            "--id",
            &queue,
        ],
    );
    assert_eq!(code, 0, "{err}\n{queue_yaml}");
    assert!(queue_yaml.contains("visibilityTimeout: 45"), "{queue_yaml}");
    let arn = format!("arn:aws:s3:::{bucket}");
    let (code, bucket_yaml, err) = import(
        &engine,
        &[
            "files",
            "--instance",
            "cloud",
            "--type",
            "aws/s3/bucket",
            "--id",
            &arn,
        ],
    );
    assert_eq!(code, 0, "{err}\n{bucket_yaml}");
    let inst = engine.instance("cloud");
    assert_eq!(
        inst["resources"]["jobs"]["externalId"],
        url.as_str(),
        "{inst}"
    );
    assert_eq!(
        inst["resources"]["files"]["externalId"],
        bucket.as_str(),
        "{inst}"
    );
    // Reading changed nothing in AWS: no trellis tags were added.
    let tags = boto(m, "sqs", "list_queue_tags", json!({"QueueUrl": url})).expect("tags");
    assert_eq!(tags["Tags"], json!({"team": "a"}), "{tags}");

    write(
        &root.join("cloud.yaml"),
        &blueprint_of(&[&queue_yaml, &bucket_yaml]),
    );
    let (code, plan) = engine.json(&["plan", "cloud.yaml", "--instance", "cloud"]);
    assert_eq!(code, 0, "{plan}");
    assert!(
        actions(&plan["changeSet"]["resources"])
            .iter()
            .all(|(_, a)| a == "NO_CHANGE"),
        "{plan}"
    );
    let changed = blueprint_of(&[&queue_yaml, &bucket_yaml])
        .replace("visibilityTimeout: 45", "visibilityTimeout: 60");
    write(&root.join("cloud.yaml"), &changed);
    let (code, deployed) = engine.json(&["deploy", "cloud.yaml", "--instance", "cloud"]);
    assert_eq!(code, 0, "{deployed}");
    let attrs = boto(
        m,
        "sqs",
        "get_queue_attributes",
        json!({"QueueUrl": url, "AttributeNames": ["VisibilityTimeout"]}),
    )
    .expect("attributes");
    assert_eq!(attrs["Attributes"]["VisibilityTimeout"], "60", "{attrs}");

    let (code, destroyed) = engine.json(&["destroy", "--instance", "cloud"]);
    assert_eq!(code, 0, "{destroyed}");
    assert!(boto(m, "sqs", "get_queue_url", json!({"QueueName": queue})).is_err());
    assert!(boto(m, "s3", "head_bucket", json!({"Bucket": bucket})).is_err());
}
