//! Links against moto: what each link makes, checked with boto3, and undone on LINK_DESTROY.

use serde_json::json;
use trellis_plugin_sdk::proto::LinkUpdateType;
use trellis_plugin_sdk::testing::Harness;
use trellis_plugin_sdk::{LinkRequest, ResourceState, Value};

use crate::support::{Moto, boto, harness, moto, unique};

fn code_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(unique("trellis-link-code"));
    std::fs::create_dir_all(&d).expect("dir");
    std::fs::write(d.join("handler.py"), "def handler(e, c):\n    return 1\n").expect("code");
    d
}

async fn function(h: &Harness, name: &str) -> ResourceState {
    let spec = Value::map()
        .with("functionName", unique(name).as_str())
        .with("codeUri", code_dir().to_str().expect("utf-8"))
        .with("handler", "handler.handler")
        .with("runtime", "python3.12")
        .with(
            "environment",
            Value::map().with("variables", Value::map().with("OWN", "1")),
        );
    h.create("aws/lambda/function", name, spec)
        .await
        .expect("function created")
}

fn link(
    a: &ResourceState,
    b: &ResourceState,
    annotations_a: Value,
    update: LinkUpdateType,
) -> LinkRequest {
    LinkRequest {
        link_type: format!("{}::{}", a.resource_type, b.resource_type),
        resource_a: a.clone(),
        resource_b: b.clone(),
        annotations_a,
        annotations_b: Value::map(),
        link_data: Value::Null,
        update_type: update,
    }
}

fn text<'a>(r: &'a ResourceState, key: &str) -> &'a str {
    r.state
        .get(key)
        .and_then(Value::as_str)
        .expect("state field")
}

fn env_vars(m: &Moto, function: &str) -> serde_json::Value {
    boto(
        m,
        "lambda",
        "get_function_configuration",
        json!({"FunctionName": function}),
    )
    .expect("function")["Environment"]["Variables"]
        .clone()
}

#[tokio::test]
async fn a_function_linked_to_a_table_gets_a_policy_and_a_variable_and_loses_them() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let f = function(&h, "saveOrder").await;
    let table = h
        .create(
            "aws/dynamodb/table",
            "ordersTable",
            Value::map()
                .with("tableName", unique("orders").as_str())
                .with(
                    "attributeDefinitions",
                    Value::List(vec![
                        Value::map()
                            .with("attributeName", "id")
                            .with("attributeType", "S"),
                    ]),
                )
                .with(
                    "keySchema",
                    Value::List(vec![
                        Value::map()
                            .with("attributeName", "id")
                            .with("keyType", "HASH"),
                    ]),
                ),
        )
        .await
        .expect("table created");
    let role = text(&f, "roleArn")
        .rsplit('/')
        .next()
        .expect("role name")
        .to_owned();
    let annotations = Value::map().with("aws.lambda.function.populateEnvVars", true);
    let l = link(&f, &table, annotations.clone(), LinkUpdateType::Create);
    let staged = h.stage_link(&l).await.expect("staged");
    assert_eq!(
        staged
            .owned_paths_a
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        vec!["environment.variables.ORDERS_TABLE".to_owned()]
    );
    let data = h.update_link_resource_a(&l).await.expect("linked");

    // The role's policy names the table's ARN (and its indexes), data-plane actions only.
    let policy = boto(
        m,
        "iam",
        "get_role_policy",
        json!({"RoleName": role, "PolicyName": "trellis-link-ordersTable"}),
    )
    .expect("policy exists");
    let doc = policy["PolicyDocument"].to_string();
    let table_arn = text(&table, "arn");
    assert!(
        doc.contains(table_arn) && doc.contains(&format!("{table_arn}/index/*")),
        "{doc}"
    );
    assert!(
        doc.contains("dynamodb:PutItem") && !doc.contains("dynamodb:DeleteTable"),
        "{doc}"
    );
    // The variable names the table; the function's own variable is untouched.
    let vars = env_vars(m, text(&f, "arn"));
    let table_name = table
        .spec
        .get("tableName")
        .and_then(Value::as_str)
        .expect("name");
    assert_eq!(vars["ORDERS_TABLE"], table_name, "{vars}");
    assert_eq!(vars["OWN"], "1", "{vars}");

    // Going away undoes both.
    let mut gone = link(&f, &table, annotations, LinkUpdateType::Destroy);
    gone.link_data = data;
    h.update_link_resource_a(&gone).await.expect("unlinked");
    assert!(
        boto(
            m,
            "iam",
            "get_role_policy",
            json!({"RoleName": role, "PolicyName": "trellis-link-ordersTable"})
        )
        .is_err()
    );
    let vars = env_vars(m, text(&f, "arn"));
    assert!(
        vars.get("ORDERS_TABLE").is_none() && vars["OWN"] == "1",
        "{vars}"
    );
}

#[tokio::test]
async fn a_queue_triggers_its_function_and_a_topic_feeds_its_queue() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let f = function(&h, "worker").await;
    let queue = h
        .create(
            "aws/sqs/queue",
            "jobs",
            Value::map().with("queueName", unique("jobs").as_str()),
        )
        .await
        .expect("queue created");
    let topic = h
        .create(
            "aws/sns/topic",
            "events",
            Value::map().with("topicName", unique("events").as_str()),
        )
        .await
        .expect("topic created");

    // Queue -> function: one event source mapping, receive rights on the function's role.
    let l = link(&queue, &f, Value::map(), LinkUpdateType::Create);
    let up = h.update_link_intermediaries(&l).await.expect("mapped");
    let mappings = boto(
        m,
        "lambda",
        "list_event_source_mappings",
        json!({"FunctionName": text(&f, "arn"), "EventSourceArn": text(&queue, "arn")}),
    )
    .expect("mappings")["EventSourceMappings"]
        .clone();
    assert_eq!(mappings.as_array().map(Vec::len), Some(1), "{mappings}");
    // Applying again (a retry) makes no second mapping.
    h.update_link_intermediaries(&l).await.expect("again");
    let again = boto(
        m,
        "lambda",
        "list_event_source_mappings",
        json!({"FunctionName": text(&f, "arn"), "EventSourceArn": text(&queue, "arn")}),
    )
    .expect("mappings")["EventSourceMappings"]
        .clone();
    assert_eq!(again.as_array().map(Vec::len), Some(1), "{again}");
    let mut gone = link(&queue, &f, Value::map(), LinkUpdateType::Destroy);
    gone.link_data = up.link_data;
    h.update_link_intermediaries(&gone).await.expect("unmapped");
    let after = boto(
        m,
        "lambda",
        "list_event_source_mappings",
        json!({"FunctionName": text(&f, "arn"), "EventSourceArn": text(&queue, "arn")}),
    )
    .expect("mappings")["EventSourceMappings"]
        .clone();
    assert_eq!(after.as_array().map(Vec::len), Some(0), "{after}");

    // Topic -> queue: a subscription, and the queue's policy lets this topic send.
    let l = link(&topic, &queue, Value::map(), LinkUpdateType::Create);
    h.update_link_intermediaries(&l).await.expect("subscribed");
    let subs = boto(
        m,
        "sns",
        "list_subscriptions_by_topic",
        json!({"TopicArn": text(&topic, "arn")}),
    )
    .expect("subscriptions")["Subscriptions"]
        .clone();
    assert_eq!(subs[0]["Endpoint"], text(&queue, "arn"), "{subs}");
    let attrs = boto(
        m,
        "sqs",
        "get_queue_attributes",
        json!({"QueueUrl": text(&queue, "queueUrl"), "AttributeNames": ["Policy"]}),
    )
    .expect("attributes");
    let policy = attrs["Attributes"]["Policy"].as_str().unwrap_or("");
    assert!(
        policy.contains(text(&topic, "arn")) && policy.contains("sqs:SendMessage"),
        "{policy}"
    );
    let gone = link(&topic, &queue, Value::map(), LinkUpdateType::Destroy);
    h.update_link_intermediaries(&gone)
        .await
        .expect("unsubscribed");
    let subs = boto(
        m,
        "sns",
        "list_subscriptions_by_topic",
        json!({"TopicArn": text(&topic, "arn")}),
    )
    .expect("subscriptions")["Subscriptions"]
        .clone();
    assert_eq!(subs.as_array().map(Vec::len), Some(0), "{subs}");
}
