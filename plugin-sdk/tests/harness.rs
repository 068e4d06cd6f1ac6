//! The SDK through the real protocol, with the in-process harness: the
//! README's example provider, and a test provider that uses every feature.

#[path = "../examples/hello.rs"]
#[allow(dead_code)]
mod hello;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use trellis_plugin_sdk::prelude::*;
use trellis_plugin_sdk::proto as pb;
use trellis_plugin_sdk::testing::Harness;

async fn start<P: Provider>(p: P) -> Harness {
    match Harness::provider(p).await {
        Ok(h) => h,
        Err(e) => panic!("harness: {e}"),
    }
}

#[tokio::test]
async fn hello_handshake_and_manifest() {
    let h = start(hello::Hello).await;
    let hs = h.handshake().await.expect("handshake");
    assert_eq!(hs.protocol_version, 1);
    let plugin = hs.plugin.expect("plugin info");
    assert_eq!(
        (plugin.kind, plugin.name.as_str()),
        (pb::PluginKind::Provider as i32, "hello")
    );
    let caps = hs.capabilities.expect("capabilities");
    assert!(caps.cancel);
    assert!(!caps.read_resource && !caps.plan_resource && !caps.functions && !caps.links);

    let wrong = h
        .handshake_with("not-the-nonce", vec![1])
        .await
        .err()
        .map(|s| s.code());
    assert_eq!(wrong, Some(tonic::Code::FailedPrecondition));
    let wrong_version = h
        .handshake_with(h.nonce(), vec![7])
        .await
        .err()
        .map(|s| s.code());
    assert_eq!(wrong_version, Some(tonic::Code::FailedPrecondition));

    let m = h.manifest().await.expect("manifest");
    assert_eq!(m.resource_types.len(), 1);
    let rt = &m.resource_types[0];
    assert_eq!(rt.r#type, "hello/greeting");
    let schema = Schema::from_proto(rt.spec_schema.clone().expect("schema"));
    assert_eq!(
        schema,
        <hello::Greeting as Resource>::schema(&hello::Greeting)
    );
    let name = schema.get_field("name").expect("name field");
    assert!(name.is_required() && name.is_must_recreate());
    assert!(schema.get_field("message").is_some_and(Field::is_computed));
    let retry = m.retry_policy.expect("retry policy");
    assert_eq!(retry.max_attempts, 3);
}

#[tokio::test]
async fn hello_lifecycle() {
    let h = start(hello::Hello).await;
    let spec = Value::map().with("name", "world");
    let created = h.create("hello/greeting", "g", spec).await.expect("create");
    assert_eq!(created.external_id, "greeting-world");
    assert_eq!(
        created.state.get("message").and_then(Value::as_str),
        Some("Hello, world.")
    );

    let updated = h
        .update(
            &created,
            Value::map().with("name", "world").with("excited", true),
        )
        .await
        .expect("update");
    assert_eq!(
        updated.state.get("message").and_then(Value::as_str),
        Some("Hello, world!")
    );
    h.destroy(&updated).await.expect("destroy");

    let mut req = pb::ApplyResourceRequest {
        context: Some(h.call_context()),
        resource_type: "hello/greeting".into(),
        resource_name: "g".into(),
        desired_spec: Some(Value::map().with("name", "you").to_proto()),
        current: None,
    };
    let out = h.apply_with(req.clone()).await.expect("apply");
    assert_eq!(out.progress, vec![("greeting you".to_owned(), 0.5)]);

    req.desired_spec = Some(Value::map().with("name", 3).to_proto());
    let err = h
        .apply_with(req)
        .await
        .expect("apply")
        .result
        .expect_err("an error");
    assert_eq!(err.class, ErrorClass::BadInput);
    assert_eq!(err.path, Some(AttrPath::from("name")));
    assert_eq!(err.message, "`name` must be a string, found integer");

    let err = h
        .create("hello/nope", "x", Value::map())
        .await
        .expect_err("an error");
    assert_eq!(err.class, ErrorClass::BadInput);
    assert!(err.message.contains("hello/nope"), "{}", err.message);

    // The engine would not call ReadResource: the harness says why.
    let err = h.read(&created).await.expect_err("an error");
    assert!(err.message.contains("supports_read"), "{}", err.message);
}

#[tokio::test]
async fn hello_serves_grpc_health() {
    use tonic_health::pb::{
        HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
    };
    let h = start(hello::Hello).await;
    let mut client = HealthClient::new(h.channel());
    for service in ["", "trellis.plugin.v1.Plugin", "trellis.plugin.v1.Provider"] {
        let r = client
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .expect("health check")
            .into_inner();
        assert_eq!(r.status, ServingStatus::Serving as i32, "{service}");
    }
}

// ---------------------------------------------------------------------------
// A provider using every feature.

struct Kitchen {
    attempts: Arc<AtomicU32>,
    /// The idempotency keys `destroy` was called with.
    destroyed: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Provider for Kitchen {
    fn namespace(&self) -> &str {
        "kitchen"
    }
    fn config_schema(&self) -> Schema {
        Schema::object().field("region", Field::string().required())
    }
    fn resources(&self) -> Vec<Box<dyn Resource>> {
        vec![Box::new(Sink {
            attempts: self.attempts.clone(),
            destroyed: self.destroyed.clone(),
        })]
    }
    fn data_sources(&self) -> Vec<Box<dyn DataSource>> {
        vec![Box::new(Shelf)]
    }
    fn links(&self) -> Vec<Box<dyn Link>> {
        vec![Box::new(Pipe)]
    }
    fn functions(&self) -> Vec<Box<dyn Function>> {
        vec![Box::new(Upper)]
    }
    fn custom_variable_types(&self) -> Vec<Box<dyn CustomVariableType>> {
        vec![Box::new(Sizes)]
    }
}

#[async_trait]
impl Provider for Broken {
    fn namespace(&self) -> &str {
        "broken"
    }
    fn resources(&self) -> Vec<Box<dyn Resource>> {
        vec![Box::new(Sink::default()), Box::new(Sink::default())]
    }
    async fn validate_config(&self, ctx: &Context) -> Result<Vec<Diagnostic>> {
        ctx.config_spec().get_str("region")?;
        Ok(vec![])
    }
}
struct Broken;

#[derive(Default)]
struct Sink {
    attempts: Arc<AtomicU32>,
    destroyed: Arc<std::sync::Mutex<Vec<String>>>,
}

#[async_trait]
impl Resource for Sink {
    fn type_name(&self) -> &str {
        "kitchen/sink"
    }
    fn schema(&self) -> Schema {
        Schema::object()
            .field("mode", Field::string().required())
            .field("colour", Field::string().default("blue"))
            .field("password", Field::string().computed().sensitive())
    }
    async fn validate(&self, _ctx: &Context, req: &ValidateRequest) -> Result<Vec<Diagnostic>> {
        let spec = req.spec();
        if spec.is_unknown("mode") {
            return Ok(vec![
                Diagnostic::info("kitchen.mode-unknown", "mode is known after deploy").at("mode"),
            ]);
        }
        match spec.get_str("mode")? {
            "ok" => Ok(vec![]),
            other => Ok(vec![
                Diagnostic::error("kitchen.bad-mode", format!("unknown mode {other}"))
                    .at("mode")
                    .hint("use ok"),
            ]),
        }
    }
    fn supports_plan(&self) -> bool {
        true
    }
    async fn plan(&self, _ctx: &Context, req: &PlanRequest) -> Result<Plan> {
        Ok(Plan {
            recreate_paths: if req.current.is_some() {
                vec![AttrPath::from("mode")]
            } else {
                vec![]
            },
            planned_state: Value::map().with("password", Value::Unknown),
            ..Plan::default()
        })
    }
    async fn create(&self, ctx: &Context, req: &CreateRequest) -> Result<Applied> {
        let spec = req.spec();
        match spec.get_str("mode")? {
            "panic" => panic!("the sink overflowed"),
            "slow" => {
                ctx.progress("waiting", None);
                ctx.sleep(Duration::from_secs(30)).await?;
                Ok(Applied::new("slow", Value::map()))
            }
            "partial" => Err(PluginError::transient("half done")
                .with_partial("sink-partial", Value::map().with("password", "p1"))),
            "flaky" => {
                if self.attempts.fetch_add(1, Ordering::SeqCst) == 0 {
                    Err(PluginError::transient("try again"))
                } else {
                    Ok(Applied::new("sink-flaky", Value::map()))
                }
            }
            "config" => {
                let region = ctx.config_spec().get_str("region")?;
                Ok(Applied::new(
                    format!("sink-{region}-{}", ctx.idempotency_key()),
                    Value::map(),
                ))
            }
            "io" => {
                std::fs::read("/nonexistent/trellis/file")?;
                Ok(Applied::default())
            }
            // Reports the spec it received, defaults included.
            "echo" => Ok(Applied::new(
                "sink-echo",
                Value::map().with("colour", spec.get_str("colour")?),
            )),
            _ => Ok(Applied::new(
                "sink-1",
                Value::map().with("password", "hunter2"),
            )),
        }
    }
    async fn update(&self, _ctx: &Context, req: &UpdateRequest) -> Result<Applied> {
        Ok(Applied::new(
            req.current.external_id.clone(),
            req.current.state.clone(),
        ))
    }
    async fn destroy(&self, ctx: &Context, current: &ResourceState) -> Result<()> {
        self.destroyed
            .lock()
            .expect("lock")
            .push(ctx.idempotency_key().to_owned());
        match current.external_id.as_str() {
            "gone" => Err(PluginError::not_found("no such sink")),
            "slow" => ctx.sleep(Duration::from_secs(30)).await,
            _ => Ok(()),
        }
    }
    fn supports_read(&self) -> bool {
        true
    }
    async fn read(&self, _ctx: &Context, current: &ResourceState) -> Result<Option<ReadState>> {
        if current.external_id == "gone" {
            return Ok(None);
        }
        Ok(Some(ReadState {
            spec: current.spec.clone(),
            state: Value::map().with("password", "from-read"),
            external_id: None,
        }))
    }
}

struct Shelf;

#[async_trait]
impl DataSource for Shelf {
    fn type_name(&self) -> &str {
        "kitchen/shelf"
    }
    fn filter_fields(&self) -> Schema {
        Schema::object().field("label", Field::string())
    }
    fn exports(&self) -> Schema {
        Schema::object()
            .field("label", Field::string())
            .field("count", Field::integer())
    }
    async fn fetch(&self, _ctx: &Context, filters: &[Filter]) -> Result<Vec<Value>> {
        let items = ["cups", "plates"].map(|l| Value::map().with("label", l).with("count", 2));
        Ok(items
            .into_iter()
            .filter(|i| {
                filters
                    .iter()
                    .all(|f| f.field != "label" || i.get("label") == Some(&f.search))
            })
            .collect())
    }
}

struct Pipe;

#[async_trait]
impl Link for Pipe {
    fn resource_type_a(&self) -> &str {
        "kitchen/sink"
    }
    fn resource_type_b(&self) -> &str {
        "kitchen/sink"
    }
    fn kind(&self) -> LinkKind {
        LinkKind::Hard
    }
    fn annotations(&self) -> Vec<Annotation> {
        vec![Annotation::new("kitchen.pipe.width", "kitchen/sink", SchemaType::Integer).required()]
    }
    async fn stage(&self, _ctx: &Context, link: &LinkRequest) -> Result<StagedLink> {
        Ok(StagedLink {
            owned_paths_a: vec![AttrPath::from("drain")],
            diagnostics: vec![Diagnostic::warning(
                "kitchen.pipe",
                format!("linking {}", link.resource_b.name),
            )],
            ..Default::default()
        })
    }
    async fn update_resource_a(&self, _ctx: &Context, link: &LinkRequest) -> Result<Value> {
        let width = Spec::new(&link.annotations_a).get_i64("kitchen.pipe.width")?;
        Ok(Value::map().with("width", width))
    }
    async fn update_intermediaries(
        &self,
        _ctx: &Context,
        link: &LinkRequest,
    ) -> Result<IntermediariesUpdate> {
        Ok(IntermediariesUpdate {
            link_data: link.link_data.clone().with("pipes", 1),
            intermediaries: vec![ResourceState {
                resource_type: "kitchen/pipe".into(),
                name: "pipe-1".into(),
                ..Default::default()
            }],
        })
    }
}

struct Upper;

#[async_trait]
impl Function for Upper {
    fn signature(&self) -> Signature {
        Signature::new("upper")
            .param(Param::new("s", SchemaType::String))
            .returns(SchemaType::String)
    }
    async fn call(&self, _ctx: &Context, args: Vec<Value>) -> Result<Value> {
        let s = args.first().and_then(Value::as_str).unwrap_or_default();
        Ok(s.to_uppercase().into())
    }
}

struct Sizes;

#[async_trait]
impl CustomVariableType for Sizes {
    fn type_name(&self) -> &str {
        "kitchen/size"
    }
    async fn options(&self, _ctx: &Context) -> Result<Vec<VariableOption>> {
        Ok(vec![
            VariableOption::new("small", 1).describe("a small one"),
            VariableOption::new("large", 3),
        ])
    }
}

fn kitchen() -> Kitchen {
    Kitchen {
        attempts: Arc::new(AtomicU32::new(0)),
        destroyed: Arc::default(),
    }
}

#[tokio::test]
async fn capabilities_follow_what_is_implemented() {
    let h = start(kitchen()).await;
    let caps = h
        .handshake()
        .await
        .expect("handshake")
        .capabilities
        .expect("caps");
    assert!(
        caps.plan_resource
            && caps.read_resource
            && caps.links
            && caps.data_sources
            && caps.functions
            && caps.custom_variable_types
            && caps.cancel
            && caps.destroy_resources
    );
    let m = h.manifest().await.expect("manifest");
    assert_eq!(m.data_source_types[0].filter_fields.len(), 1);
    assert_eq!(m.data_source_types[0].exports.len(), 2);
    assert_eq!(m.link_types[0].kind, pb::LinkKind::Hard as i32);
    assert_eq!(m.link_types[0].annotations[0].name, "kitchen.pipe.width");
    assert_eq!(m.functions[0].name, "upper");
    assert_eq!(m.custom_variable_types[0].r#type, "kitchen/size");
    assert_eq!(m.config_schema.map(|s| s.fields.len()), Some(1));
}

#[tokio::test]
async fn a_malformed_declaration_is_refused() {
    let err = Harness::provider(Broken)
        .await
        .err()
        .expect("duplicate types are refused");
    assert_eq!(err.class, ErrorClass::Internal);
    assert!(err.message.contains("declared twice"), "{}", err.message);
}

#[tokio::test]
async fn validation_paths_and_config() {
    let h = start(kitchen())
        .await
        .with_config(Value::map().with("region", "eu"));
    let d = h
        .validate("kitchen/sink", "s", Value::map().with("mode", "odd"))
        .await
        .expect("validate");
    assert_eq!(d.len(), 1);
    assert_eq!(
        (d[0].severity, d[0].code.as_str()),
        (Severity::Error, "kitchen.bad-mode")
    );
    assert_eq!(
        (d[0].path.clone(), d[0].hint.as_deref()),
        (Some(AttrPath::from("mode")), Some("use ok"))
    );
    let d = h
        .validate(
            "kitchen/sink",
            "s",
            Value::map().with("mode", Value::Unknown),
        )
        .await
        .expect("validate");
    assert_eq!(d[0].severity, Severity::Info);
    let d = h
        .validate("kitchen/sink", "s", Value::map())
        .await
        .expect("validate");
    assert_eq!(
        (d[0].code.as_str(), d[0].path.clone()),
        ("plugin.bad-input", Some(AttrPath::from("mode")))
    );
    assert!(
        h.validate_config()
            .await
            .expect("validate config")
            .is_empty()
    );
    let created = h
        .create("kitchen/sink", "s", Value::map().with("mode", "config"))
        .await
        .expect("create");
    assert!(
        created.external_id.starts_with("sink-eu-harness-key-"),
        "{}",
        created.external_id
    );
}

#[tokio::test]
async fn panics_become_internal_errors_and_the_plugin_lives_on() {
    let h = start(kitchen()).await;
    let err = h
        .create("kitchen/sink", "s", Value::map().with("mode", "panic"))
        .await
        .expect_err("error");
    assert_eq!(err.class, ErrorClass::Internal);
    assert!(
        err.message.contains("the sink overflowed"),
        "{}",
        err.message
    );
    assert!(
        h.create("kitchen/sink", "s", Value::map().with("mode", "ok"))
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn errors_carry_class_and_partial_state() {
    let h = start(kitchen()).await;
    let err = h
        .create("kitchen/sink", "s", Value::map().with("mode", "partial"))
        .await
        .expect_err("error");
    assert_eq!(err.class, ErrorClass::Transient);
    assert_eq!(err.partial_external_id.as_deref(), Some("sink-partial"));
    let ps = err.partial_state.expect("partial state");
    assert!(
        ps.get("password").is_some_and(Value::is_sensitive),
        "schema-sensitive fields are masked"
    );

    let err = h
        .create("kitchen/sink", "s", Value::map().with("mode", "io"))
        .await
        .expect_err("error");
    assert_eq!(err.class, ErrorClass::NotFound);

    let first = h
        .create("kitchen/sink", "s", Value::map().with("mode", "flaky"))
        .await;
    assert!(first.is_err_and(|e| e.is_transient()));
    assert!(
        h.create("kitchen/sink", "s", Value::map().with("mode", "flaky"))
            .await
            .is_ok()
    );

    let gone = ResourceState {
        resource_type: "kitchen/sink".into(),
        name: "s".into(),
        external_id: "gone".into(),
        ..Default::default()
    };
    assert_eq!(
        h.destroy(&gone).await.err().map(|e| e.class),
        Some(ErrorClass::NotFound)
    );
    assert_eq!(h.read(&gone).await.expect("read"), None);
}

#[tokio::test]
async fn sensitive_state_plan_and_read() {
    let h = start(kitchen()).await;
    let st = h
        .create("kitchen/sink", "s", Value::map().with("mode", "ok"))
        .await
        .expect("create");
    let pw = st.state.get("password").expect("password");
    assert!(pw.is_sensitive());
    assert_eq!(pw.as_str(), Some("hunter2"));
    assert_eq!(format!("{:?}", st.state), r#"{"password": (sensitive)}"#);

    let read = h.read(&st).await.expect("read").expect("exists");
    assert!(read.state.get("password").is_some_and(Value::is_sensitive));
    assert_eq!(read.spec, st.spec);

    let plan = h
        .plan(None, Value::map().with("mode", "ok"))
        .await
        .expect("plan");
    assert!(plan.recreate_paths.is_empty());
    assert!(
        plan.planned_state
            .get("password")
            .is_some_and(Value::is_unknown)
    );
    let plan = h
        .plan(Some(&st), Value::map().with("mode", "x"))
        .await
        .expect("plan");
    assert_eq!(plan.recreate_paths, vec![AttrPath::from("mode")]);
}

#[tokio::test]
async fn cancel_by_call_id() {
    let h = start(kitchen()).await;
    let ctx = h.call_context();
    let id = ctx.call_id.clone();
    let req = pb::ApplyResourceRequest {
        context: Some(ctx),
        resource_type: "kitchen/sink".into(),
        resource_name: "slow".into(),
        desired_spec: Some(Value::map().with("mode", "slow").to_proto()),
        current: None,
    };
    let canceller = async {
        for _ in 0..500 {
            if h.cancel(&id).await.expect("cancel") {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    };
    let (out, cancelled) = tokio::join!(h.apply_with(req), canceller);
    assert!(cancelled);
    let out = out.expect("apply");
    assert_eq!(out.progress, vec![("waiting".to_owned(), -1.0)]);
    let err = out.result.expect_err("cancelled");
    assert_eq!(err, PluginError::cancelled());
    assert!(
        !h.cancel(&id).await.expect("cancel"),
        "finished calls are forgotten"
    );
    assert!(!h.cancel("never-started").await.expect("cancel"));
}

/// DestroyResources: each item goes through the resource's `destroy` with its own key, and its
/// outcome comes as soon as it is known (the quick ones are not held behind a slow one); Cancel
/// with the call's id reaches the items still running, and the stream ends with the last.
#[tokio::test]
async fn destroy_resources_streams_each_outcome_as_it_comes() {
    let k = kitchen();
    let destroyed = k.destroyed.clone();
    let h = start(k).await;
    let ctx = pb::CallContext {
        idempotency_key: String::new(),
        ..h.call_context()
    };
    let id = ctx.call_id.clone();
    let item = |ty: &str, external_id: &str, key: &str| pb::DestroyItem {
        idempotency_key: key.into(),
        current: Some(
            ResourceState {
                resource_type: ty.into(),
                name: external_id.into(),
                external_id: external_id.into(),
                ..Default::default()
            }
            .to_proto(),
        ),
    };
    let req = pb::DestroyResourcesRequest {
        context: Some(ctx),
        items: vec![
            item("kitchen/sink", "slow", "k0"),
            item("kitchen/sink", "sink-1", "k1"),
            item("kitchen/sink", "gone", "k2"),
            item("kitchen/oven", "oven-1", "k3"),
        ],
    };
    let mut stream = h
        .provider_client()
        .destroy_resources(req)
        .await
        .expect("call")
        .into_inner();
    let class = |e: &pb::DestroyResourcesEvent| e.error.as_ref().map(|e| e.error_class);
    let mut quick = Vec::new();
    for _ in 0..3 {
        let e = stream.message().await.expect("stream").expect("an outcome");
        quick.push((e.index, class(&e)));
    }
    quick.sort_unstable();
    assert_eq!(
        quick,
        vec![
            (1, None),
            (2, Some(pb::ErrorClass::NotFound as i32)),
            (3, Some(pb::ErrorClass::BadInput as i32)),
        ]
    );
    assert!(
        h.cancel(&id).await.expect("cancel"),
        "the batch is one call"
    );
    let last = stream
        .message()
        .await
        .expect("stream")
        .expect("the slow one");
    assert_eq!(
        (last.index, class(&last)),
        (0, Some(pb::ErrorClass::Transient as i32))
    );
    assert!(last.error.is_some_and(|e| e.message.contains("cancelled")));
    assert!(stream.message().await.expect("stream").is_none());
    let mut keys = destroyed.lock().expect("lock").clone();
    keys.sort();
    assert_eq!(keys, ["k0", "k1", "k2"]);
    assert!(
        !h.cancel(&id).await.expect("cancel"),
        "finished calls are forgotten"
    );
}

#[tokio::test]
async fn the_deadline_cancels_the_call() {
    let h = start(kitchen()).await;
    let req = pb::ApplyResourceRequest {
        context: Some(h.call_context_with_deadline(Duration::from_millis(200))),
        resource_type: "kitchen/sink".into(),
        resource_name: "slow".into(),
        desired_spec: Some(Value::map().with("mode", "slow").to_proto()),
        current: None,
    };
    let out = h.apply_with(req).await.expect("apply");
    assert_eq!(
        out.result.err().map(|e| e.class),
        Some(ErrorClass::Transient)
    );
}

#[tokio::test]
async fn data_sources_functions_variables() {
    let h = start(kitchen()).await;
    let all = h.fetch("kitchen/shelf", vec![]).await.expect("fetch");
    assert_eq!(all.len(), 2);
    let cups = h
        .fetch(
            "kitchen/shelf",
            vec![Filter {
                field: "label".into(),
                operator: "=".into(),
                search: "cups".into(),
            }],
        )
        .await
        .expect("fetch");
    assert_eq!(
        cups,
        vec![Value::map().with("label", "cups").with("count", 2)]
    );
    assert!(h.fetch("kitchen/nope", vec![]).await.is_err());

    assert_eq!(
        h.call_function("upper", vec!["abc".into()])
            .await
            .expect("call"),
        Value::from("ABC")
    );
    let err = h
        .call_function("upper", vec![1.into()])
        .await
        .expect_err("bad arg");
    assert_eq!(
        (err.class, err.path),
        (ErrorClass::BadInput, Some(AttrPath::root().index(0)))
    );
    assert!(h.call_function("upper", vec![]).await.is_err());
    assert!(h.call_function("lower", vec![]).await.is_err());

    let opts = h.variable_options("kitchen/size").await.expect("options");
    assert_eq!(opts.len(), 2);
    assert_eq!(
        (
            opts[0].label.as_str(),
            &opts[0].value,
            opts[0].description.as_str()
        ),
        ("small", &Value::Int(1), "a small one")
    );
}

#[tokio::test]
async fn links_in_deploy_order() {
    let h = start(kitchen()).await;
    let sink = |n: &str| ResourceState {
        resource_type: "kitchen/sink".into(),
        name: n.into(),
        ..Default::default()
    };
    let link = LinkRequest {
        link_type: "kitchen/sink::kitchen/sink".into(),
        resource_a: sink("a"),
        resource_b: sink("b"),
        annotations_a: Value::map().with("kitchen.pipe.width", 4),
        ..Default::default()
    };
    let staged = h.stage_link(&link).await.expect("stage");
    assert_eq!(staged.owned_paths_a, vec![AttrPath::from("drain")]);
    assert_eq!(staged.diagnostics[0].message, "linking b");
    assert_eq!(
        h.update_link_resource_a(&link).await.expect("a"),
        Value::map().with("width", 4)
    );
    assert_eq!(
        h.update_link_resource_b(&link).await.expect("b"),
        Value::Null
    );
    let inter = h
        .update_link_intermediaries(&link)
        .await
        .expect("intermediaries");
    assert_eq!(inter.link_data, Value::map().with("pipes", 1));
    assert_eq!(inter.intermediaries[0].name, "pipe-1");
    assert!(
        h.read_link_intermediaries(&link)
            .await
            .expect("read")
            .is_empty()
    );

    // Matched by the resources' types when the name differs.
    let by_types = LinkRequest {
        link_type: "something-else".into(),
        ..link.clone()
    };
    assert!(h.stage_link(&by_types).await.is_ok());
    let bad = LinkRequest {
        annotations_a: Value::map(),
        ..link
    };
    let err = h
        .update_link_resource_a(&bad)
        .await
        .expect_err("missing annotation");
    assert_eq!(err.path, Some(AttrPath::from("kitchen.pipe.width")));
}

// ---------------------------------------------------------------------------
// Transformers.

struct Expand;

#[async_trait]
impl Transformer for Expand {
    fn name(&self) -> &str {
        "expand-2024"
    }
    fn abstract_resources(&self) -> Vec<AbstractResource> {
        vec![AbstractResource::new(
            "expand/thing",
            Schema::object().field("n", Field::integer().required()),
        )]
    }
    async fn transform(
        &self,
        _ctx: &Context,
        mut blueprint: serde_json::Value,
    ) -> Result<Transformed> {
        let mut derivations = Vec::new();
        if let Some(resources) = blueprint
            .get_mut("resources")
            .and_then(|r| r.as_object_mut())
        {
            let names: Vec<String> = resources.keys().cloned().collect();
            for name in names {
                let generated = format!("{name}-gen");
                resources.insert(
                    generated.clone(),
                    serde_json::json!({"type": "sim/resource"}),
                );
                derivations.push(Derivation::new(generated, name));
            }
        }
        Ok(Transformed {
            blueprint,
            diagnostics: vec![Diagnostic::info("expand.done", "expanded")],
            derivations,
        })
    }
    async fn validate_abstract_resource(
        &self,
        _ctx: &Context,
        req: &ValidateRequest,
    ) -> Result<Vec<Diagnostic>> {
        req.spec().get_i64("n")?;
        Ok(vec![])
    }
}

#[tokio::test]
async fn transformer_round_trip() {
    let h = match Harness::transformer(Expand).await {
        Ok(h) => h,
        Err(e) => panic!("harness: {e}"),
    };
    let hs = h.handshake().await.expect("handshake");
    assert_eq!(
        hs.plugin.map(|p| p.kind),
        Some(pb::PluginKind::Transformer as i32)
    );
    let m = h.manifest().await.expect("manifest");
    assert_eq!(m.abstract_resource_types[0].r#type, "expand/thing");
    let bp =
        serde_json::json!({"version": "2023-04-20", "resources": {"a": {"type": "expand/thing"}}});
    let t = h.transform(&bp).await.expect("transform");
    assert_eq!(t.derivations, vec![Derivation::new("a-gen", "a")]);
    let keys: Vec<&String> = t.blueprint["resources"]
        .as_object()
        .map(|o| o.keys().collect())
        .unwrap_or_default();
    assert_eq!(keys, ["a", "a-gen"]);
    assert_eq!(t.diagnostics[0].code, "expand.done");
    let d = h
        .validate_abstract("expand/thing", "a", Value::map())
        .await
        .expect("validate");
    assert_eq!(d[0].path, Some(AttrPath::from("n")));

    let mut client = h.transformer_client();
    let bad = pb::TransformRequest {
        context: Some(h.call_context()),
        blueprint_json: "{not json".into(),
    };
    let r = client.transform(bad).await.expect("transform").into_inner();
    assert_eq!(
        r.error.map(|e| e.error_class),
        Some(pb::ErrorClass::BadInput as i32)
    );
}

#[tokio::test]
async fn schema_defaults_reach_the_resource() {
    let h = start(kitchen()).await;
    let st = h
        .create("kitchen/sink", "s", Value::map().with("mode", "echo"))
        .await
        .expect("create");
    assert_eq!(st.state.get("colour").and_then(Value::as_str), Some("blue"));
}
