//! The celerity transformer end to end against moto: APIs, consumers and schedules that trigger handlers.
//!
//! The real `trellis serve` runs the real `celerity-2023-04-20` transformer and the real `aws`
//! provider (calling moto); the CLI deploys the abstract blueprint, and one boto3 script per
//! check phase reads back what AWS holds: functions, routes, mappings, subscriptions, rules.

use std::path::Path;

use serde_json::{Value, json};

use crate::aws_moto::{moto, unique};
use crate::celerity_common::{boto_script, engine};
use crate::engine_common::write;
use crate::plugins_common::TempDir;

/// The handlers' code, next to the blueprint.
fn code(root: &Path) {
    std::fs::create_dir_all(root.join("app")).expect("dir");
    write(
        &root.join("app/handler.py"),
        "def handler(event, context):\n    return {\"statusCode\": 200}\n",
    );
}

/// A resource's state field in the engine's record of an instance.
fn state<'a>(inst: &'a Value, resource: &str, field: &str) -> &'a str {
    inst["resources"][resource]["state"][field]
        .as_str()
        .unwrap_or_else(|| panic!("no state.{field} of `{resource}`: {inst}"))
}

/// Every link of the instance as (A, B, link type), all CREATED.
fn links(inst: &Value) -> Vec<(String, String, String)> {
    let mut out: Vec<(String, String, String)> = inst["links"]
        .as_array()
        .expect("links")
        .iter()
        .map(|l| {
            assert_eq!(l["status"], "CREATED", "{l}");
            let s = |k: &str| l[k].as_str().unwrap_or_default().to_owned();
            (s("resourceA"), s("resourceB"), s("linkType"))
        })
        .collect();
    out.sort();
    out
}

fn triples(items: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
    items
        .iter()
        .map(|(a, b, t)| ((*a).to_owned(), (*b).to_owned(), (*t).to_owned()))
        .collect()
}

fn api_blueprint(with_list: bool, save_memory: u32) -> String {
    let list = if with_list {
        r#"
  listOrders:
    type: celerity/handler
    metadata:
      labels:
        app: orders
      annotations:
        celerity.handler.http.method: GET
        celerity.handler.http.path: /orders
    linkSelector:
      byLabel:
        store: orders
    spec:
      handlerName: ${variables.prefix}-list
      codeLocation: app
      handler: handler.handler
      runtime: python3.12.x
"#
    } else {
        ""
    };
    format!(
        r#"version: 2023-04-20
transform: celerity-2023-04-20
variables:
  prefix:
    type: string
resources:
  ordersApi:
    type: celerity/api
    linkSelector:
      byLabel:
        app: orders
    spec:
      protocols: [http]
      cors:
        allowOrigins: ["https://shop.example.com"]
        allowMethods: [GET, POST]
        maxAge: 600
  orders:
    type: celerity/datastore
    metadata:
      labels:
        store: orders
    spec:
      name: ${{variables.prefix}}-orders
      keys:
        partitionKey: id
  saveOrder:
    type: celerity/handler
    metadata:
      labels:
        app: orders
      annotations:
        celerity.handler.http.method: POST
        celerity.handler.http.path: /orders
    linkSelector:
      byLabel:
        store: orders
    spec:
      handlerName: ${{variables.prefix}}-save
      codeLocation: app
      handler: handler.handler
      runtime: python3.12.x
      memory: {save_memory}
  getOrder:
    type: celerity/handler
    metadata:
      labels:
        app: orders
      annotations:
        celerity.handler.http.path: /orders/{{id}}
    linkSelector:
      byLabel:
        store: orders
    spec:
      handlerName: ${{variables.prefix}}-get
      codeLocation: app
      handler: handler.handler
      runtime: python3.12.x
{list}
exports:
  baseUrl:
    type: string
    field: resources.ordersApi.spec.baseUrl
"#
    )
}

/// What AWS holds of the API app: the API's CORS and routes (each to an AWS_PROXY integration
/// of its function), and per function its memory, its invoke permission for the API and its
/// role's access to the table.
const API_CHECKS: &str = r#"
api = args["api"]
out["api"] = call("apigatewayv2", "get_api", ApiId=api)
integrations = {i["IntegrationId"]: i for i in call("apigatewayv2", "get_integrations", ApiId=api).get("Items", [])}
out["routes"] = {}
for r in call("apigatewayv2", "get_routes", ApiId=api).get("Items", []):
    i = integrations.get(r.get("Target", "").removeprefix("integrations/"), {})
    out["routes"][r["RouteKey"]] = [i.get("IntegrationType"), i.get("IntegrationUri")]
out["functions"] = {}
for name, fn in args["functions"].items():
    cfg = call("lambda", "get_function_configuration", FunctionName=fn)
    policy = call("lambda", "get_policy", FunctionName=fn).get("Policy", "{}")
    role = cfg.get("Role", "").rsplit("/", 1)[-1]
    access = call("iam", "get_role_policy", RoleName=role, PolicyName="trellis-link-orders")
    out["functions"][name] = {
        "arn": cfg.get("FunctionArn"), "memory": cfg.get("MemorySize"), "role": role,
        "apiInvokes": api in policy and "apigateway.amazonaws.com" in policy,
        "tableAccess": json.dumps(access.get("PolicyDocument", "")),
    }
out["table"] = call("dynamodb", "describe_table", TableName=args["table"]).get("Table", {}).get("TableName")
"#;

/// After destroy: the API, the functions, their roles and the table are gone.
const API_GONE: &str = r#"
out["api"] = call("apigatewayv2", "get_api", ApiId=args["api"]).get("Error")
out["functions"] = [call("lambda", "get_function", FunctionName=f).get("Error") for f in args["functions"]]
out["roles"] = [call("iam", "get_role", RoleName=r).get("Error") for r in args["roles"]]
out["table"] = call("dynamodb", "describe_table", TableName=args["table"]).get("Error")
"#;

#[test]
fn an_http_api_with_handlers_and_a_datastore_deploys_updates_and_destroys() {
    let Some(m) = moto() else { return };
    let dir = TempDir::new("celerity-api");
    let root = dir.path();
    code(root);
    let engine = engine(root, m);
    let prefix = unique("cel-api");
    let var = format!("prefix={prefix}");
    write(&root.join("app.yaml"), &api_blueprint(false, 256));
    let out = engine.cli(&["deploy", "app.yaml", "--instance", "shop", "--var", &var]);
    assert!(out.status.success(), "{out:?}");

    let inst = engine.instance("shop");
    let api_link = "aws/apigatewayv2/api::aws/lambda/function";
    let table_link = "aws/lambda/function::aws/dynamodb/table";
    assert_eq!(
        links(&inst),
        triples(&[
            ("getOrder", "orders", table_link),
            ("ordersApi", "getOrder", api_link),
            ("ordersApi", "saveOrder", api_link),
            ("saveOrder", "orders", table_link),
        ]),
        "{inst}"
    );
    let api = state(&inst, "ordersApi", "apiId").to_owned();
    assert!(
        inst["exports"]["baseUrl"]
            .as_str()
            .is_some_and(|u| u.contains(&api)),
        "baseUrl is the API's endpoint: {inst}"
    );
    let functions = |list: bool| {
        let mut f =
            json!({"saveOrder": format!("{prefix}-save"), "getOrder": format!("{prefix}-get")});
        if list {
            f["listOrders"] = json!(format!("{prefix}-list"));
        }
        f
    };
    let args =
        json!({"api": api, "functions": functions(false), "table": format!("{prefix}-orders")});
    let seen = boto_script(m, &args, API_CHECKS);
    let cors = &seen["api"]["CorsConfiguration"];
    assert_eq!(
        cors["AllowOrigins"],
        json!(["https://shop.example.com"]),
        "{seen}"
    );
    assert_eq!(cors["AllowMethods"], json!(["GET", "POST"]), "{seen}");
    assert_eq!(cors["MaxAge"], 600, "{seen}");
    let f = &seen["functions"];
    assert_eq!(
        seen["routes"],
        json!({
            "POST /orders": ["AWS_PROXY", f["saveOrder"]["arn"]],
            "GET /orders/{id}": ["AWS_PROXY", f["getOrder"]["arn"]],
        }),
        "{seen}"
    );
    assert_eq!(f["saveOrder"]["memory"], 256, "{seen}");
    assert_eq!(f["getOrder"]["memory"], 512, "the handler default: {seen}");
    for name in ["saveOrder", "getOrder"] {
        assert_eq!(f[name]["apiInvokes"], true, "{name}: {seen}");
        let access = f[name]["tableAccess"].as_str().unwrap_or_default();
        assert!(access.contains("dynamodb:PutItem"), "{name}: {seen}");
    }
    assert_eq!(seen["table"], format!("{prefix}-orders"), "{seen}");

    // The update: a new handler adds a route, and saveOrder gets more memory.
    write(&root.join("app.yaml"), &api_blueprint(true, 1024));
    let out = engine.cli(&["deploy", "app.yaml", "--instance", "shop", "--var", &var]);
    assert!(out.status.success(), "{out:?}");
    let inst = engine.instance("shop");
    assert_eq!(state(&inst, "ordersApi", "apiId"), api, "the same API");
    let args =
        json!({"api": api, "functions": functions(true), "table": format!("{prefix}-orders")});
    let seen = boto_script(m, &args, API_CHECKS);
    let f = &seen["functions"];
    assert_eq!(
        seen["routes"],
        json!({
            "POST /orders": ["AWS_PROXY", f["saveOrder"]["arn"]],
            "GET /orders/{id}": ["AWS_PROXY", f["getOrder"]["arn"]],
            "GET /orders": ["AWS_PROXY", f["listOrders"]["arn"]],
        }),
        "{seen}"
    );
    assert_eq!(f["saveOrder"]["memory"], 1024, "{seen}");
    assert_eq!(f["listOrders"]["apiInvokes"], true, "{seen}");

    // Destroy leaves nothing: the API, the functions and their own roles, the table.
    let roles: Vec<Value> = ["saveOrder", "getOrder", "listOrders"]
        .iter()
        .map(|n| f[*n]["role"].clone())
        .collect();
    let out = engine.cli(&["destroy", "--instance", "shop"]);
    assert!(out.status.success(), "{out:?}");
    let fns: Vec<String> = ["save", "get", "list"]
        .iter()
        .map(|s| format!("{prefix}-{s}"))
        .collect();
    let gone = boto_script(
        m,
        &json!({"api": api, "functions": fns, "roles": roles, "table": format!("{prefix}-orders")}),
        API_GONE,
    );
    assert_eq!(
        gone,
        json!({
            "api": "NotFoundException",
            "functions": vec!["ResourceNotFoundException"; 3],
            "roles": vec!["NoSuchEntity"; 3],
            "table": "ResourceNotFoundException",
        }),
        "{gone}"
    );
}

const EVENTS_BLUEPRINT: &str = r#"version: 2023-04-20
transform: celerity-2023-04-20
variables:
  prefix:
    type: string
resources:
  jobs:
    type: celerity/queue
    linkSelector:
      byLabel:
        consumes: jobs
    spec:
      name: ${variables.prefix}-jobs
  jobsConsumer:
    type: celerity/consumer
    metadata:
      labels:
        consumes: jobs
    linkSelector:
      byLabel:
        handles: jobs
    spec:
      batchSize: 5
      visibilityTimeout: 60
      partialFailures: true
  worker:
    type: celerity/handler
    metadata:
      labels:
        handles: jobs
    spec:
      handlerName: ${variables.prefix}-worker
      codeLocation: app
      handler: handler.handler
      runtime: python3.12.x
      timeout: 10

  events:
    type: celerity/topic
    linkSelector:
      byLabel:
        subscribes: events
    spec:
      name: ${variables.prefix}-events
  audit:
    type: celerity/consumer
    metadata:
      labels:
        subscribes: events
    linkSelector:
      byLabel:
        handles: audit
    spec:
      visibilityTimeout: 60
  notify:
    type: celerity/consumer
    metadata:
      labels:
        subscribes: events
      annotations:
        celerity.consumer.deadLetterQueue: false
    linkSelector:
      byLabel:
        handles: notify
    spec:
      batchSize: 2
  auditor:
    type: celerity/handler
    metadata:
      labels:
        handles: audit
    spec:
      handlerName: ${variables.prefix}-auditor
      codeLocation: app
      handler: handler.handler
      runtime: python3.12.x
      timeout: 10
  notifier:
    type: celerity/handler
    metadata:
      labels:
        handles: notify
    spec:
      handlerName: ${variables.prefix}-notifier
      codeLocation: app
      handler: handler.handler
      runtime: python3.12.x
      timeout: 10

  ledger:
    type: celerity/datastore
    linkSelector:
      byLabel:
        streams: ledger
    spec:
      name: ${variables.prefix}-ledger
      keys:
        partitionKey: id
  ledgerConsumer:
    type: celerity/consumer
    metadata:
      labels:
        streams: ledger
      annotations:
        celerity.consumer.datastore.startFromBeginning: true
    linkSelector:
      byLabel:
        handles: ledger
    spec:
      batchSize: 50
      partialFailures: true
  ledgerHandler:
    type: celerity/handler
    metadata:
      labels:
        handles: ledger
    spec:
      handlerName: ${variables.prefix}-ledger
      codeLocation: app
      handler: handler.handler
      runtime: python3.12.x

  nightly:
    type: celerity/schedule
    linkSelector:
      byLabel:
        job: cleanup
    spec:
      schedule: cron(0 3 * * ? *)
      input:
        task: cleanup
  cleanup:
    type: celerity/handler
    metadata:
      labels:
        job: cleanup
    spec:
      handlerName: ${variables.prefix}-cleanup
      codeLocation: app
      handler: handler.handler
      runtime: python3.12.x
"#;

/// What AWS holds of the events app: per queue its attributes and its mappings; the topic's
/// subscriptions; the rule's schedule and targets; per function its role's policies.
const EVENT_CHECKS: &str = r#"
out["queues"] = {}
for name, q in args["queues"].items():
    attrs = call("sqs", "get_queue_attributes", QueueUrl=q["url"], AttributeNames=["All"]).get("Attributes", {})
    maps = call("lambda", "list_event_source_mappings", EventSourceArn=q["arn"]).get("EventSourceMappings", [])
    out["queues"][name] = {
        "visibility": attrs.get("VisibilityTimeout"),
        "redrive": json.loads(attrs["RedrivePolicy"]) if "RedrivePolicy" in attrs else None,
        "mappings": [[m["FunctionArn"], m["BatchSize"], m.get("FunctionResponseTypes", [])] for m in maps],
    }
stream = call("dynamodb", "describe_table", TableName=args["table"]).get("Table", {}).get("LatestStreamArn")
out["stream"] = [[m["FunctionArn"], m["BatchSize"], m.get("StartingPosition"), m.get("FunctionResponseTypes", [])]
                 for m in call("lambda", "list_event_source_mappings", EventSourceArn=stream).get("EventSourceMappings", [])]
subs = call("sns", "list_subscriptions_by_topic", TopicArn=args["topic"]).get("Subscriptions", [])
out["subscriptions"] = sorted([s["Protocol"], s["Endpoint"]] for s in subs)
rule = args["rule"]
out["rule"] = call("events", "describe_rule", Name=rule).get("ScheduleExpression")
out["targets"] = [[t["Arn"], t.get("Input")] for t in call("events", "list_targets_by_rule", Rule=rule).get("Targets", [])]
out["functions"] = {}
for name, fn in args["functions"].items():
    cfg = call("lambda", "get_function_configuration", FunctionName=fn)
    role = cfg.get("Role", "").rsplit("/", 1)[-1]
    policy = call("lambda", "get_policy", FunctionName=fn).get("Policy", "")
    out["functions"][name] = {
        "arn": cfg.get("FunctionArn"), "role": role,
        "policies": sorted(call("iam", "list_role_policies", RoleName=role).get("PolicyNames", [])),
        "eventsInvoke": "events.amazonaws.com" in policy,
    }
"#;

const EVENTS_GONE: &str = r#"
out["queues"] = [call("sqs", "get_queue_attributes", QueueUrl=u).get("Error") for u in args["queues"]]
out["table"] = call("dynamodb", "describe_table", TableName=args["table"]).get("Error")
out["topic"] = call("sns", "get_topic_attributes", TopicArn=args["topic"]).get("Error")
out["rule"] = call("events", "describe_rule", Name=args["rule"]).get("Error")
out["functions"] = [call("lambda", "get_function", FunctionName=f).get("Error") for f in args["functions"]]
out["mappings"] = call("lambda", "list_event_source_mappings", FunctionName=args["worker"]).get("EventSourceMappings")
out["roles"] = [call("iam", "get_role", RoleName=r).get("Error") for r in args["roles"]]
"#;

#[test]
fn a_queue_consumer_a_topic_fan_out_and_a_schedule_deploy_and_destroy() {
    let Some(m) = moto() else { return };
    let dir = TempDir::new("celerity-events");
    let root = dir.path();
    code(root);
    let engine = engine(root, m);
    let prefix = unique("cel-ev");
    let var = format!("prefix={prefix}");
    write(&root.join("events.yaml"), EVENTS_BLUEPRINT);
    let out = engine.cli(&["deploy", "events.yaml", "--instance", "ev", "--var", &var]);
    assert!(out.status.success(), "{out:?}");

    // The consumers are absorbed: the queue, the consumers' own queues and the rule select
    // the functions, and the provider's links wire them.
    let inst = engine.instance("ev");
    let trigger = "aws/sqs/queue::aws/lambda/function";
    assert_eq!(
        links(&inst),
        triples(&[
            ("audit_queue", "auditor", trigger),
            ("events", "audit_queue", "aws/sns/topic::aws/sqs/queue"),
            ("events", "notify_queue", "aws/sns/topic::aws/sqs/queue"),
            ("jobs", "worker", trigger),
            (
                "ledger",
                "ledgerHandler",
                "aws/dynamodb/table::aws/lambda/function",
            ),
            ("nightly", "cleanup", "aws/events/rule::aws/lambda/function"),
            ("notify_queue", "notifier", trigger),
        ]),
        "{inst}"
    );
    assert!(
        inst["resources"].get("notify_dlq").is_none(),
        "deadLetterQueue: false"
    );
    let queue = |name: &str| json!({"url": state(&inst, name, "queueUrl"), "arn": state(&inst, name, "arn")});
    let fns = json!({
        "worker": format!("{prefix}-worker"), "auditor": format!("{prefix}-auditor"),
        "notifier": format!("{prefix}-notifier"), "cleanup": format!("{prefix}-cleanup"),
        "ledgerHandler": format!("{prefix}-ledger"),
    });
    let rule = state(&inst, "nightly", "arn")
        .rsplit('/')
        .next()
        .expect("rule name")
        .to_owned();
    let args = json!({
        "queues": {"jobs": queue("jobs"), "audit_queue": queue("audit_queue"),
                   "audit_dlq": queue("audit_dlq"), "notify_queue": queue("notify_queue")},
        "topic": state(&inst, "events", "arn"),
        "rule": rule,
        "functions": fns,
        "table": format!("{prefix}-ledger"),
    });
    let seen = boto_script(m, &args, EVENT_CHECKS);
    let q = &seen["queues"];
    let f = &seen["functions"];

    // Queue → consumer → handler: one mapping with the batch size and partial failures, the
    // consumer's visibility timeout on the queue, receive rights on the function's role.
    assert_eq!(
        q["jobs"]["mappings"],
        json!([[f["worker"]["arn"], 5, ["ReportBatchItemFailures"]]]),
        "{seen}"
    );
    assert_eq!(q["jobs"]["visibility"], "60", "{seen}");
    assert_eq!(
        f["worker"]["policies"],
        json!(["trellis-trigger-jobs"]),
        "{seen}"
    );

    // Topic fan-out: a queue per consumer, subscribed, each triggering its handler; the
    // audit queue redrives to its dead-letter queue, the notify queue has none.
    assert_eq!(
        seen["subscriptions"],
        json!([
            ["sqs", args["queues"]["audit_queue"]["arn"]],
            ["sqs", args["queues"]["notify_queue"]["arn"]]
        ]),
        "{seen}"
    );
    assert_eq!(
        q["audit_queue"]["mappings"],
        json!([[f["auditor"]["arn"], 10, []]]),
        "{seen}"
    );
    assert_eq!(q["audit_queue"]["visibility"], "60", "{seen}");
    assert_eq!(
        q["audit_queue"]["redrive"],
        json!({"deadLetterTargetArn": args["queues"]["audit_dlq"]["arn"], "maxReceiveCount": 10}),
        "{seen}"
    );
    assert_eq!(q["audit_dlq"]["mappings"], json!([]), "{seen}");
    assert_eq!(
        q["notify_queue"]["mappings"],
        json!([[f["notifier"]["arn"], 2, []]]),
        "{seen}"
    );
    assert_eq!(q["notify_queue"]["redrive"], Value::Null, "{seen}");

    // Datastore → consumer → handler: a mapping on the table's stream from its oldest
    // record, with the batch size and partial failures; stream read rights on the role.
    assert_eq!(
        seen["stream"],
        json!([[
            f["ledgerHandler"]["arn"],
            50,
            "TRIM_HORIZON",
            ["ReportBatchItemFailures"]
        ]]),
        "{seen}"
    );
    assert_eq!(
        f["ledgerHandler"]["policies"],
        json!(["trellis-trigger-ledger"]),
        "{seen}"
    );

    // Schedule → handler: the rule's cron, its target with the schedule's input, the
    // invoke permission for EventBridge.
    assert_eq!(seen["rule"], "cron(0 3 * * ? *)", "{seen}");
    assert_eq!(
        seen["targets"],
        json!([[f["cleanup"]["arn"], "{\"task\":\"cleanup\"}"]]),
        "{seen}"
    );
    assert_eq!(f["cleanup"]["eventsInvoke"], true, "{seen}");

    // Nothing drifted.
    let (code, drift) = engine.json(&["drift", "--instance", "ev"]);
    assert_eq!(code, 0, "{drift}");

    // Destroy leaves nothing: queues, topic, rule, functions, mappings, roles.
    let out = engine.cli(&["destroy", "--instance", "ev"]);
    assert!(out.status.success(), "{out:?}");
    let urls: Vec<&Value> = ["jobs", "audit_queue", "audit_dlq", "notify_queue"]
        .iter()
        .map(|n| &args["queues"][*n]["url"])
        .collect();
    let roles: Vec<&Value> = ["worker", "auditor", "notifier", "cleanup", "ledgerHandler"]
        .iter()
        .map(|n| &f[*n]["role"])
        .collect();
    let gone = boto_script(
        m,
        &json!({
            "queues": urls, "topic": args["topic"], "rule": args["rule"],
            "functions": fns.as_object().expect("map").values().collect::<Vec<_>>(),
            "worker": f["worker"]["arn"], "roles": roles, "table": args["table"],
        }),
        EVENTS_GONE,
    );
    assert_eq!(
        gone,
        json!({
            "queues": vec!["AWS.SimpleQueueService.NonExistentQueue"; 4],
            "topic": "NotFound",
            "rule": "ResourceNotFoundException",
            "table": "ResourceNotFoundException",
            "functions": vec!["ResourceNotFoundException"; 5],
            "mappings": [],
            "roles": vec!["NoSuchEntity"; 5],
        }),
        "{gone}"
    );
}
