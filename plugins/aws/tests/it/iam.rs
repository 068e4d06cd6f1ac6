//! `aws/iam/role`, and the role helpers links use.

use std::sync::Arc;

use serde_json::json;
use trellis_plugin_sdk::{ErrorClass, Resource, Value};
use trellis_provider_aws::config::ClientCache;
use trellis_provider_aws::iam::Role;

use crate::support::{Moto, boto, harness, moto, unique};

/// A trust policy for `service`.
pub(crate) fn trust(service: &str) -> Value {
    Value::from_json(json!({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}]
    }))
}

fn allow(action: &str) -> Value {
    Value::from_json(json!({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": action, "Resource": "*"}]
    }))
}

/// A customer managed policy made with boto3; its ARN.
fn managed_policy(m: &Moto, name: &str) -> String {
    let out = boto(
        m,
        "iam",
        "create_policy",
        json!({"PolicyName": name, "PolicyDocument": allow("s3:ListBucket").to_json().to_string()}),
    )
    .expect("policy created");
    out["Policy"]["Arn"].as_str().expect("arn").to_owned()
}

fn attached(m: &Moto, role: &str) -> Vec<String> {
    let out = boto(
        m,
        "iam",
        "list_attached_role_policies",
        json!({"RoleName": role}),
    )
    .expect("attached");
    let mut arns: Vec<String> = out["AttachedPolicies"]
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|p| p["PolicyArn"].as_str().map(str::to_owned))
        .collect();
    arns.sort();
    arns
}

fn inline(m: &Moto, role: &str) -> Vec<String> {
    let out = boto(m, "iam", "list_role_policies", json!({"RoleName": role})).expect("inline");
    let mut names: Vec<String> = out["PolicyNames"]
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|p| p.as_str().map(str::to_owned))
        .collect();
    names.sort();
    names
}

/// Every field `applied` sets reads back the same.
pub(crate) fn assert_reads_back(read: &Value, applied: &Value) {
    for (k, v) in applied.as_map().expect("a map") {
        assert_eq!(read.get(k), Some(v), "field `{k}` of {read:?}");
    }
}

#[tokio::test]
async fn a_role_is_created_read_updated_and_destroyed() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = unique("role");
    let p1 = managed_policy(m, &unique("p1"));
    let p2 = managed_policy(m, &unique("p2"));
    let spec = Value::map()
        .with("roleName", name.as_str())
        .with("path", "/service/")
        .with("assumeRolePolicyDocument", trust("lambda.amazonaws.com"))
        .with("description", "orders")
        .with("maxSessionDuration", 7200)
        .with("managedPolicyArns", Value::from(vec![p1.as_str()]))
        .with(
            "policies",
            Value::List(vec![
                Value::map()
                    .with("policyName", "read")
                    .with("policyDocument", allow("s3:GetObject")),
            ]),
        )
        .with("permissionsBoundary", p2.as_str())
        .with(
            "tags",
            Value::List(vec![Value::map().with("key", "team").with("value", "a")]),
        );
    let r = h
        .create("aws/iam/role", "orders", spec.clone())
        .await
        .expect("created");
    assert_eq!(r.external_id, name);
    let arn = r.state.get("arn").and_then(Value::as_str).expect("arn");
    assert_eq!(
        arn,
        format!("arn:aws:iam::123456789012:role/service/{name}")
    );
    assert!(r.state.get("roleId").and_then(Value::as_str).is_some());

    let got = boto(m, "iam", "get_role", json!({"RoleName": name})).expect("role")["Role"].clone();
    assert_eq!(got["Path"], "/service/");
    assert_eq!(got["Description"], "orders");
    assert_eq!(got["MaxSessionDuration"], 7200);
    assert_eq!(
        got["AssumeRolePolicyDocument"],
        trust("lambda.amazonaws.com").to_json()
    );
    assert_eq!(
        got["PermissionsBoundary"]["PermissionsBoundaryArn"],
        p2.as_str()
    );
    let tags = got["Tags"].as_array().expect("tags");
    assert!(
        tags.contains(&json!({"Key": "team", "Value": "a"})),
        "{tags:?}"
    );
    assert!(
        tags.contains(&json!({"Key": "trellis:resource", "Value": "orders"})),
        "{tags:?}"
    );
    assert_eq!(attached(m, &name), vec![p1.clone()]);
    let doc = boto(
        m,
        "iam",
        "get_role_policy",
        json!({"RoleName": name, "PolicyName": "read"}),
    )
    .expect("inline policy");
    assert_eq!(doc["PolicyDocument"], allow("s3:GetObject").to_json());

    // Read: nothing changed, so the spec reads back as applied.
    let read = h.read(&r).await.expect("read").expect("exists");
    assert_reads_back(&read.spec, &spec);

    // A link's policy (the reserved prefix) is neither drift nor removed by an update.
    boto(
        m,
        "iam",
        "put_role_policy",
        json!({"RoleName": name, "PolicyName": "trellis-link-orders", "PolicyDocument": allow("sqs:SendMessage").to_json().to_string()}),
    )
    .expect("link policy");
    let read = h.read(&r).await.expect("read").expect("exists");
    assert_reads_back(&read.spec, &spec);

    // Drift made outside: a second client changes the description and adds a policy.
    boto(
        m,
        "iam",
        "update_role",
        json!({"RoleName": name, "Description": "changed", "MaxSessionDuration": 7200}),
    )
    .expect("updated");
    boto(
        m,
        "iam",
        "put_role_policy",
        json!({"RoleName": name, "PolicyName": "handmade", "PolicyDocument": allow("s3:*").to_json().to_string()}),
    )
    .expect("handmade");
    let read = h.read(&r).await.expect("read").expect("exists");
    assert_eq!(read.spec.get("description"), Some(&Value::from("changed")));
    let names: Vec<&str> = read
        .spec
        .get("policies")
        .and_then(Value::as_list)
        .expect("policies")
        .iter()
        .filter_map(|p| p.get("policyName").and_then(Value::as_str))
        .collect();
    assert_eq!(names, ["read", "handmade"]);

    // Update in place: another trust policy (as JSON text), description, the session length
    // dropped (back to 3600), the other managed policy, another inline policy, no boundary,
    // no tags.
    let trust_text = trust("edgelambda.amazonaws.com").to_json().to_string();
    let spec2 = Value::map()
        .with("roleName", name.as_str())
        .with("path", "/service/")
        .with("assumeRolePolicyDocument", trust_text.as_str())
        .with("description", "orders v2")
        .with("managedPolicyArns", Value::from(vec![p2.as_str()]))
        .with(
            "policies",
            Value::List(vec![
                Value::map()
                    .with("policyName", "write")
                    .with("policyDocument", allow("s3:PutObject")),
            ]),
        );
    let r2 = h.update(&r, spec2.clone()).await.expect("updated");
    assert_eq!(r2.external_id, name);
    let got = boto(m, "iam", "get_role", json!({"RoleName": name})).expect("role")["Role"].clone();
    assert_eq!(got["Description"], "orders v2");
    assert_eq!(got["MaxSessionDuration"], 3600);
    assert_eq!(
        got["AssumeRolePolicyDocument"],
        trust("edgelambda.amazonaws.com").to_json()
    );
    assert!(got.get("PermissionsBoundary").is_none(), "{got}");
    let tags = got["Tags"].as_array().expect("tags");
    assert!(!tags.iter().any(|t| t["Key"] == "team"), "{tags:?}");
    assert_eq!(attached(m, &name), vec![p2.clone()]);
    assert_eq!(inline(m, &name), ["trellis-link-orders", "write"]);
    let read = h.read(&r2).await.expect("read").expect("exists");
    assert_reads_back(&read.spec, &spec2);

    // Destroy: policies (the link's too) and the role go; again is fine.
    h.destroy(&r2).await.expect("destroyed");
    assert_eq!(
        boto(m, "iam", "get_role", json!({"RoleName": name}))
            .err()
            .as_deref(),
        Some("NoSuchEntity")
    );
    h.destroy(&r2).await.expect("destroy is idempotent");
    assert!(h.read(&r2).await.expect("read").is_none());
}

#[tokio::test]
async fn a_retried_create_adopts_its_own_role_and_refuses_anyone_elses() {
    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let name = unique("retry-role");
    let spec = Value::map()
        .with("roleName", name.as_str())
        .with("assumeRolePolicyDocument", trust("lambda.amazonaws.com"));
    let first = h
        .create("aws/iam/role", "retry", spec.clone())
        .await
        .expect("created");
    let again = h
        .create("aws/iam/role", "retry", spec.clone())
        .await
        .expect("adopted");
    assert_eq!(again.external_id, first.external_id);
    assert_eq!(again.state, first.state);
    // A crash before the id was recorded: read by name finds it.
    let mut unrecorded = first.clone();
    unrecorded.external_id.clear();
    let found = h.read(&unrecorded).await.expect("read").expect("found");
    assert_eq!(found.external_id.as_deref(), Some(name.as_str()));

    // Another resource of the same name: CONFLICT; and its destroy leaves the role alone.
    let err = h
        .create("aws/iam/role", "other", spec.clone())
        .await
        .expect_err("taken");
    assert_eq!(err.class, ErrorClass::Conflict, "{err:?}");
    assert!(
        err.message.contains("belongs to resource `retry`"),
        "{}",
        err.message
    );
    let mut other = unrecorded.clone();
    other.name = "other".to_owned();
    assert!(h.read(&other).await.expect("read").is_none());
    h.destroy(&other)
        .await
        .expect("nothing of its own to destroy");
    boto(m, "iam", "get_role", json!({"RoleName": name})).expect("still there");

    // One made outside Trellis: CONFLICT too.
    let outside = unique("outside-role");
    boto(
        m,
        "iam",
        "create_role",
        json!({"RoleName": outside, "AssumeRolePolicyDocument": trust("lambda.amazonaws.com").to_json().to_string()}),
    )
    .expect("made outside");
    let err = h
        .create(
            "aws/iam/role",
            "outside",
            Value::map()
                .with("roleName", outside.as_str())
                .with("assumeRolePolicyDocument", trust("lambda.amazonaws.com")),
        )
        .await
        .expect_err("not ours");
    assert_eq!(err.class, ErrorClass::Conflict);
    assert!(
        err.message.contains("not created by Trellis"),
        "{}",
        err.message
    );
    h.destroy(&first).await.expect("destroyed");
}

#[tokio::test]
async fn name_and_path_replace_the_role_and_validation_names_the_field() {
    let schema = Role {
        clients: Arc::new(ClientCache::default()),
    }
    .schema();
    for (field, recreate) in [
        ("roleName", true),
        ("path", true),
        ("assumeRolePolicyDocument", false),
        ("policies", false),
    ] {
        assert_eq!(
            schema.get_field(field).map(|f| f.is_must_recreate()),
            Some(recreate),
            "{field}"
        );
    }
    for computed in ["arn", "roleId"] {
        assert!(schema.get_field(computed).is_some_and(|f| f.is_computed()));
    }

    let Some(m) = moto() else { return };
    let h = harness(m).await;
    let d = h
        .validate(
            "aws/iam/role",
            "r",
            Value::map()
                .with("roleName", "has space")
                .with("path", "service")
                .with("assumeRolePolicyDocument", "not json")
                .with("maxSessionDuration", 60)
                .with("managedPolicyArns", Value::from(vec!["ReadOnlyAccess"]))
                .with(
                    "policies",
                    Value::List(vec![
                        Value::map()
                            .with("policyName", "trellis-mine")
                            .with("policyDocument", allow("s3:*")),
                    ]),
                ),
        )
        .await
        .expect("validated");
    let got: Vec<(String, String)> = d
        .iter()
        .map(|d| {
            (
                d.code.clone(),
                d.path.as_ref().map(ToString::to_string).unwrap_or_default(),
            )
        })
        .collect();
    let want = [
        ("aws.iam.invalid-name", "roleName"),
        ("aws.iam.invalid-path", "path"),
        ("aws.iam.policy-document", "assumeRolePolicyDocument"),
        ("aws.out-of-range", "maxSessionDuration"),
        ("aws.iam.policy-arn", "managedPolicyArns[0]"),
        ("aws.iam.reserved-policy-name", "policies[0].policyName"),
    ];
    assert_eq!(
        got,
        want.iter()
            .map(|(c, p)| ((*c).to_owned(), (*p).to_owned()))
            .collect::<Vec<_>>()
    );
}
