//! Link selection and link validation (docs/links.md): `linkSelector`
//! matches ALL labels, link types come from provider manifests, link
//! annotations are checked against their definitions, and hard links order
//! deployment (and can close a cycle). The last test runs the real `local`
//! provider.

use crate::plugins_common::{TempDir, workspace_binary};
use std::process::Command;
use trellis_lang::blueprint::Blueprint;
use trellis_lang::diag::{Diagnostics, Severity};
use trellis_lang::document::{self, Format};
use trellis_lang::source::SourceMap;
use trellis_lang::validate::Options;
use trellis_lang::validate::links::{LinkKind, LinkPlan, Side, select_links};
use trellis_lang::validate::providers::Manifests;
use trellis_lang::validate::validate_source;
use trellis_proto::plugin::v1::{self as pb, SchemaType};

fn string(s: &str) -> pb::Value {
    pb::Value {
        kind: Some(pb::value::Kind::String(s.into())),
        sensitive: false,
    }
}

fn annotation(name: &str, applies_to: &str, t: SchemaType) -> pb::AnnotationDef {
    pb::AnnotationDef {
        name: name.into(),
        applies_to: applies_to.into(),
        r#type: t as i32,
        ..pb::AnnotationDef::default()
    }
}

fn link(a: &str, b: &str, kind: pb::LinkKind, priority: pb::LinkPriority) -> pb::LinkTypeDef {
    pb::LinkTypeDef {
        resource_type_a: a.into(),
        resource_type_b: b.into(),
        kind: kind as i32,
        priority: priority as i32,
        ..pb::LinkTypeDef::default()
    }
}

/// Provider `t`: an API linking to functions (soft, with annotations),
/// functions linking to tables and to each other (soft) and to queues (hard,
/// the function first), files inside directories (hard, the directory
/// first). Buckets link to nothing.
fn manifest() -> pb::Manifest {
    use pb::LinkKind::{Hard, Soft};
    use pb::LinkPriority::{ResourceA, ResourceB, Unspecified};
    let mut method = annotation("t.api.method", "t/fn", SchemaType::String);
    method.required = true;
    method.allowed_values = vec![string("get"), string("post")];
    method.description = "The HTTP method that routes to the function.".into();
    let mut api_fn = link("t/api", "t/fn", Soft, Unspecified);
    api_fn.annotations = vec![
        method,
        annotation("t.api.path", "t/fn", SchemaType::String),
        annotation("t.api.timeout", "t/api", SchemaType::Integer),
    ];
    let types = [
        "t/api", "t/fn", "t/table", "t/bucket", "t/queue", "t/dir", "t/file",
    ];
    pb::Manifest {
        plugin: Some(pb::PluginInfo {
            kind: pb::PluginKind::Provider as i32,
            name: "t".into(),
            version: "1".into(),
        }),
        resource_types: types
            .iter()
            .map(|t| pb::ResourceTypeDef {
                r#type: (*t).into(),
                ..pb::ResourceTypeDef::default()
            })
            .collect(),
        link_types: vec![
            api_fn,
            link("t/fn", "t/table", Soft, ResourceA),
            link("t/fn", "t/fn", Soft, ResourceA),
            link("t/fn", "t/queue", Hard, ResourceA),
            link("t/file", "t/dir", Hard, ResourceB),
        ],
        ..pb::Manifest::default()
    }
}

fn manifests() -> Manifests {
    Manifests::new(vec![manifest()])
}

/// Validates with the `t` provider: (code, line, severity) and messages,
/// with hints, in position order.
fn check(text: &str) -> (Vec<(&'static str, u32, Severity)>, Vec<String>) {
    let m = manifests();
    let functions = m.functions();
    let opts = Options {
        functions: &functions,
        providers: Some(&m),
        variables: &[],
        unchecked_functions: false,
    };
    let mut sources = SourceMap::new();
    let mut diags = Diagnostics::default();
    validate_source(
        &mut sources,
        "bp.yaml",
        text.as_bytes().to_vec(),
        &opts,
        1 << 20,
        &mut diags,
    );
    (
        diags
            .items
            .iter()
            .map(|d| (d.code.id, sources.resolve(d.span).0.line, d.severity))
            .collect(),
        diags
            .items
            .iter()
            .map(|d| format!("{} (hint: {})", d.message, d.hint.as_deref().unwrap_or("")))
            .collect(),
    )
}

fn codes(text: &str) -> Vec<(&'static str, u32)> {
    check(text).0.into_iter().map(|(c, l, _)| (c, l)).collect()
}

fn load(text: &str) -> Blueprint {
    let mut sources = SourceMap::new();
    let mut diags = Diagnostics::default();
    let file =
        document::load_bytes(&mut sources, "bp.yaml", text.into(), 1 << 20, &mut diags).unwrap();
    let root =
        document::parse(&sources, file, Format::from_path("bp.yaml"), &mut diags).expect("parses");
    trellis_lang::blueprint::load(&root, sources.get(file), file, &mut diags)
}

/// (A, B, link type) of every selected link.
fn pairs(text: &str) -> Vec<(String, String, String)> {
    select_links(&load(text), &manifests())
        .into_iter()
        .map(|p| (p.resource_a, p.resource_b, p.link_type))
        .collect()
}

fn owned(list: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
    list.iter()
        .map(|(a, b, t)| ((*a).into(), (*b).into(), (*t).into()))
        .collect()
}

#[test]
fn a_selector_selects_resources_with_all_of_its_labels() {
    let bp = "version: 2023-04-20
resources:
  api:
    type: t/api
    linkSelector:
      byLabel:
        app: orders
        tier: web
    spec: {}
  both:
    type: t/fn
    metadata:
      labels: {app: orders, tier: web}
      annotations: {t.api.method: get}
    spec: {}
  appOnly:
    type: t/fn
    metadata:
      labels: {app: orders}
    spec: {}
  tierOnly:
    type: t/fn
    metadata:
      labels: {tier: web, other: x}
    spec: {}
";
    assert_eq!(pairs(bp), owned(&[("api", "both", "t/api::t/fn")]));
    // `appOnly` and `tierOnly` are not linked, so the required method
    // annotation is not asked of them.
    assert_eq!(codes(bp), []);
}

#[test]
fn a_resource_never_selects_itself() {
    let bp = "version: 2023-04-20
resources:
  lonely:
    type: t/fn
    metadata:
      labels: {app: self}
    linkSelector:
      byLabel: {app: self}
    spec: {}
";
    assert!(pairs(bp).is_empty());
    let (diags, messages) = check(bp);
    assert_eq!(diags, [("T0901", 8, Severity::Warning)], "{messages:#?}");
    assert!(messages[0].contains("no other resource has the label `app: self`"));
}

#[test]
fn a_selector_that_selects_nothing_points_at_the_label_nobody_has() {
    let bp = "version: 2023-04-20
resources:
  api:
    type: t/api
    linkSelector:
      byLabel:
        app: orders
        tier: wbe
    spec: {}
  f:
    type: t/fn
    metadata:
      labels: {app: orders, tier: web}
    spec: {}
  g:
    type: t/fn
    linkSelector:
      byLabel:
        app: orders
        tier: other
    spec: {}
  h:
    type: t/fn
    metadata:
      labels: {tier: other}
    spec: {}
  empty:
    type: t/fn
    linkSelector: {byLabel: {}}
    spec: {}
";
    let (diags, messages) = check(bp);
    assert_eq!(
        diags.iter().map(|d| (d.0, d.1)).collect::<Vec<_>>(),
        [("T0901", 8), ("T0901", 19), ("T0901", 29)],
        "{messages:#?}"
    );
    assert!(messages[0].contains("`tier: wbe`"), "{}", messages[0]);
    assert!(
        messages[0].contains("did you mean `tier: web`?"),
        "{}",
        messages[0]
    );
    // Each label alone matches some resource, but none has both.
    assert!(
        messages[1].contains("all of the labels `app: orders`, `tier: other`"),
        "{}",
        messages[1]
    );
    assert!(messages[2].contains("has no labels"), "{}", messages[2]);
}

#[test]
fn selecting_a_type_nothing_links_to_is_a_warning_per_type() {
    let bp = "version: 2023-04-20
resources:
  handler:
    type: t/fn
    linkSelector:
      byLabel:
        app: orders
    spec: {}
  table:
    type: t/table
    metadata:
      labels: {app: orders}
    spec: {}
  bucketOne:
    type: t/bucket
    metadata:
      labels: {app: orders}
    spec: {}
  bucketTwo:
    type: t/bucket
    metadata:
      labels: {app: orders}
    spec: {}
  api:
    type: t/api
    linkSelector:
      byLabel:
        app: orders
    metadata:
      labels: {app: orders}
    spec: {}
";
    let (diags, messages) = check(bp);
    // `handler` -> buckets: one warning for the type, at the label. `api`
    // also selects the table and the buckets, which it cannot link either:
    // the table is linked by `handler` (its label serves that link), the
    // buckets by nothing. `handler` -> `api` (t/fn::t/api) is not a link
    // type either, and nothing links to `api`.
    assert_eq!(
        diags,
        [
            ("T0902", 7, Severity::Warning),
            ("T0902", 7, Severity::Warning),
            ("T0902", 28, Severity::Warning),
        ],
        "{messages:#?}"
    );
    assert!(
        messages[0].contains(
            "the linkSelector of `handler` (t/fn) selects `bucketOne`, `bucketTwo` (t/bucket), but no provider links t/fn to t/bucket"
        ),
        "{}",
        messages[0]
    );
    assert!(
        messages[0].contains("t/fn links to t/table, t/fn, t/queue"),
        "{}",
        messages[0]
    );
    assert!(
        messages[1].contains("selects `api` (t/api)"),
        "{}",
        messages[1]
    );
    assert!(
        messages[2].contains("selects `bucketOne`, `bucketTwo` (t/bucket)"),
        "{}",
        messages[2]
    );
    assert!(
        messages.iter().all(|m| !m.contains("`table` (t/table)")),
        "{messages:#?}"
    );
    assert_eq!(pairs(bp), owned(&[("handler", "table", "t/fn::t/table")]));
}

#[test]
fn link_annotations_are_checked_against_their_definitions() {
    let bp = "version: 2023-04-20
variables:
  wait: {type: string, default: soon}
resources:
  api:
    type: t/api
    metadata:
      annotations:
        t.api.timeout: ${variables.wait}
    linkSelector:
      byLabel: {app: orders}
    spec: {}
  typed:
    type: t/fn
    metadata:
      labels: {app: orders}
      annotations:
        t.api.method: 3
        t.api.path: /orders
    spec: {}
  notAllowed:
    type: t/fn
    metadata:
      labels: {app: orders}
      annotations:
        t.api.method: put
    spec: {}
  missing:
    type: t/fn
    metadata:
      labels: {app: orders}
      annotations:
        t.api.methd: get
        other.tool.setting: 1
    spec: {}
  unlinked:
    type: t/fn
    metadata:
      annotations:
        t.api.method: 4
    spec: {}
";
    let (diags, messages) = check(bp);
    assert_eq!(
        diags,
        [
            ("T0903", 9, Severity::Error),
            ("T0903", 18, Severity::Error),
            ("T0904", 26, Severity::Error),
            ("T0905", 28, Severity::Error),
            ("T0906", 33, Severity::Warning),
            ("T0903", 40, Severity::Error),
        ],
        "{messages:#?}"
    );
    assert!(
        messages[0].contains(
            "annotation `t.api.timeout` of resource `api` must be an integer, found a string"
        ),
        "{}",
        messages[0]
    );
    assert!(
        messages[1].contains("must be a string, found an integer")
            && messages[1].contains("defined by the link type `t/api::t/fn`")
            && messages[1].contains("quote the value"),
        "{}",
        messages[1]
    );
    assert!(
        messages[2].contains("is \"put\", which is not an allowed value")
            && messages[2].contains("allowed: \"get\", \"post\""),
        "{}",
        messages[2]
    );
    assert!(
        messages[3].contains(
            "resource `missing` is linked from `api` by the link type `t/api::t/fn`, which requires the annotation `t.api.method` on it"
        ) && messages[3].contains("The HTTP method"),
        "{}",
        messages[3]
    );
    assert!(
        messages[4].contains("did you mean `t.api.method`?"),
        "{}",
        messages[4]
    );
}

#[test]
fn an_annotation_set_on_the_wrong_end_is_reported_with_where_it_belongs() {
    let bp = "version: 2023-04-20
resources:
  api:
    type: t/api
    metadata:
      annotations:
        t.api.method: get
    spec: {}
";
    let (diags, messages) = check(bp);
    assert_eq!(diags, [("T0906", 7, Severity::Warning)], "{messages:#?}");
    assert!(
        messages[0].contains("`t.api.method` is set on t/fn"),
        "{}",
        messages[0]
    );
}

#[test]
fn each_templates_link_every_element() {
    let bp = "version: 2023-04-20
variables:
  names: {type: string, default: '[\"a\", \"b\"]'}
resources:
  api:
    type: t/api
    linkSelector:
      byLabel: {app: orders}
    spec: {}
  handlers:
    type: t/fn
    each: ${jsondecode(variables.names)}
    metadata:
      labels: {app: orders}
      annotations:
        t.api.method: get
        t.api.path: /${elem}
    linkSelector:
      byLabel: {app: orders}
    spec: {}
  table:
    type: t/table
    metadata:
      labels: {app: orders}
    spec: {}
";
    assert_eq!(codes(bp), []);
    let plans = select_links(&load(bp), &manifests());
    // `handlers` selects the table but not its own elements (t/fn::t/fn
    // would otherwise link them to each other).
    let got: Vec<_> = plans
        .iter()
        .map(|p| {
            (
                p.resource_a.as_str(),
                p.resource_b.as_str(),
                p.each_a,
                p.each_b,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("api", "handlers", false, true),
            ("handlers", "table", true, false)
        ]
    );
    assert_eq!(
        plans[0].element_pairs(1, 2),
        [
            ("api".to_owned(), "handlers_0".to_owned()),
            ("api".to_owned(), "handlers_1".to_owned())
        ]
    );
    assert_eq!(
        plans[1].element_pairs(3, 1),
        (0..3)
            .map(|i| (format!("handlers_{i}"), "table".to_owned()))
            .collect::<Vec<_>>()
    );
}

#[test]
fn hard_links_order_the_priority_resource_first() {
    let bp = "version: 2023-04-20
resources:
  file:
    type: t/file
    linkSelector:
      byLabel: {app: site}
    spec: {}
  dir:
    type: t/dir
    metadata:
      labels: {app: site}
    spec: {}
  worker:
    type: t/fn
    linkSelector:
      byLabel: {role: jobs}
    spec: {}
  jobs:
    type: t/queue
    metadata:
      labels: {role: jobs}
    spec: {}
";
    assert_eq!(codes(bp), []);
    let plans = select_links(&load(bp), &manifests());
    let want = [
        LinkPlan {
            resource_a: "file".into(),
            resource_b: "dir".into(),
            index_a: 0,
            index_b: 1,
            each_a: false,
            each_b: false,
            link_type: "t/file::t/dir".into(),
            provider: "t".into(),
            kind: LinkKind::Hard,
            priority: Side::B,
        },
        LinkPlan {
            resource_a: "worker".into(),
            resource_b: "jobs".into(),
            index_a: 2,
            index_b: 3,
            each_a: false,
            each_b: false,
            link_type: "t/fn::t/queue".into(),
            provider: "t".into(),
            kind: LinkKind::Hard,
            priority: Side::A,
        },
    ];
    assert_eq!(plans, want);
    assert_eq!(plans[0].order(), Some(("dir", "file")));
    assert_eq!(plans[1].order(), Some(("worker", "jobs")));
}

#[test]
fn a_hard_link_against_a_reference_is_a_cycle() {
    // The link puts `dir` before `file`; `dir` references `file` (through a
    // value), so `file` must also come before `dir`.
    let bp = "version: 2023-04-20
values:
  filePath:
    type: string
    value: ${resources.file.spec.path}
resources:
  file:
    type: t/file
    linkSelector:
      byLabel: {app: site}
    spec: {path: /srv/site/index.html}
  dir:
    type: t/dir
    metadata:
      labels: {app: site}
    spec:
      index: ${values.filePath}
  worker:
    type: t/fn
    dependsOn: [jobs]
    linkSelector:
      byLabel: {role: jobs}
    spec: {}
  jobs:
    type: t/queue
    metadata:
      labels: {role: jobs}
    spec: {}
";
    let (diags, messages) = check(bp);
    assert_eq!(
        diags,
        [
            ("T0907", 10, Severity::Error),
            ("T0907", 22, Severity::Error)
        ],
        "{messages:#?}"
    );
    assert_eq!(
        messages[0],
        "hard links make a deployment cycle: values.filePath -> resources.file -> resources.dir -> values.filePath \
         (resources.file -> resources.dir is the hard link `t/file::t/dir`, which deploys `dir` first) \
         (hint: each resource in the cycle waits for the next one; remove a reference or `dependsOn`, or change labels so these resources are not linked)"
    );
    assert!(
        messages[1].starts_with(
            "hard links make a deployment cycle: resources.worker -> resources.jobs -> resources.worker \
             (resources.jobs -> resources.worker is the hard link `t/fn::t/queue`, which deploys `worker` first)"
        ),
        "{}",
        messages[1]
    );
}

#[test]
fn soft_links_add_no_order() {
    // `api` -> `handler` is soft: `handler` referencing `api` is no cycle.
    let bp = "version: 2023-04-20
resources:
  api:
    type: t/api
    linkSelector:
      byLabel: {app: orders}
    spec: {}
  handler:
    type: t/fn
    metadata:
      labels: {app: orders}
      annotations: {t.api.method: post}
    spec:
      url: ${resources.api.spec.url}
";
    assert_eq!(codes(bp), []);
    assert_eq!(pairs(bp), owned(&[("api", "handler", "t/api::t/fn")]));
}

/// `trellis validate` with the real `local` provider: `local/envFile`
/// selects a file, a directory and a secret by label; the
/// `local.envFile.name` annotation (a string) is checked where it is set.
#[test]
fn the_local_provider_s_env_file_links_are_checked() {
    let root = TempDir::new("validate-links");
    let plugins = root.join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let bin = workspace_binary(
        "trellis-provider-local",
        "trellis-provider-local",
        "TRELLIS_TEST_NONE",
    );
    std::os::unix::fs::symlink(bin, plugins.join("trellis-provider-local")).unwrap();
    let file = root.join("bp.yaml");
    std::fs::write(
        &file,
        "version: 2023-04-20
resources:
  out:
    type: local/directory
    metadata:
      labels: {app: demo}
    spec: {path: ./out}
  conf:
    type: local/file
    metadata:
      labels: {app: demo}
      annotations:
        local.envFile.name: 3
    spec: {path: ./out/app.conf, content: hi}
  key:
    type: local/randomSecret
    metadata:
      labels: {app: demo}
      annotations:
        local.envFile.nmae: API_KEY
    spec: {length: 32}
  env:
    type: local/envFile
    linkSelector:
      byLabel: {app: demo}
    spec: {path: ./out/app.env}
",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_trellis"))
        .args([
            "validate",
            "--format",
            "json",
            "--no-bundled-plugins",
            "--plugin-dir",
        ])
        .arg(&plugins)
        .arg("--data-dir")
        .arg(root.join("data"))
        .arg(&file)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    let diags = v["diagnostics"].as_array().unwrap();
    let got: Vec<(&str, u64)> = diags
        .iter()
        .map(|d| (d["code"].as_str().unwrap(), d["line"].as_u64().unwrap()))
        .collect();
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert_eq!(got, [("T0903", 13), ("T0906", 20)], "{text}");
    assert!(
        diags[0]["message"].as_str().unwrap().contains(
            "annotation `local.envFile.name` of resource `conf` must be a string, found an integer"
        ),
        "{text}"
    );
    assert_eq!(
        diags[1]["hint"].as_str(),
        Some("did you mean `local.envFile.name`?"),
        "{text}"
    );
}
