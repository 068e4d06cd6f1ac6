//! `celerity/datastore` → `aws/dynamodb/table` of the same name.
//!
//! `keys` become the key schema, `indexes` global secondary indexes (first
//! field the partition key, second the sort key), `timeToLive` the table's
//! TTL. Key attributes take their DynamoDB type from the inline `schema`
//! (`number` → N, `string` → S), S when the schema does not describe them.
//! A datastore that links to a consumer gets a stream of new and old images.

use crate::model::{Input, Out, Resource};
use serde_json::{Map, Value as Json, json};
use trellis_plugin_sdk::prelude::*;

pub const TYPE: &str = "celerity/datastore";
pub const DESCRIPTION: &str = "A NoSQL data store, deployed as a DynamoDB table";

fn field_schema() -> Schema {
    Schema::object()
        .field(
            "type",
            Field::string()
                .allowed(["string", "number", "boolean", "object", "array"])
                .describe("The field's type; a key's decides its DynamoDB attribute type"),
        )
        .field("description", Field::string())
        .field("nullable", Field::boolean())
        .field("default", Field::string())
        .field("classification", Field::string())
        .field("tags", Field::array(Schema::string()))
        .field(
            "fields",
            Field::map(Schema::any()).describe("An object's fields"),
        )
        .field("items", Field::any().describe("An array's items"))
}

pub fn schema() -> Schema {
    Schema::object()
        .describe("A NoSQL data store")
        .field(
            "name",
            Field::string().describe(
                "The table's name; derived from the instance and resource name when not set",
            ),
        )
        .field(
            "keys",
            Field::object(
                Schema::object()
                    .field(
                        "partitionKey",
                        Field::string()
                            .required()
                            .describe("The partition (HASH) key attribute"),
                    )
                    .field(
                        "sortKey",
                        Field::string().describe("The sort (RANGE) key attribute"),
                    ),
            )
            .required()
            .describe("The primary key"),
        )
        .field(
            "schema",
            Field::object(
                Schema::object()
                    .field("description", Field::string())
                    .field("owner", Field::string())
                    .field("tags", Field::array(Schema::string()))
                    .field("required", Field::array(Schema::string()))
                    .field("fields", Field::map(field_schema())),
            )
            .describe("Documents the items; the keys' types come from it (number → N, else S)"),
        )
        .field(
            "schemaPath",
            Field::string()
                .describe("An external schema file (Celerity's schema tooling; not deployed)"),
        )
        .field(
            "scriptsPath",
            Field::string().describe("Data scripts (Celerity's schema tooling; not deployed)"),
        )
        .field(
            "indexes",
            Field::array(
                Schema::object()
                    .field("name", Field::string().required())
                    .field(
                        "fields",
                        Field::array(Schema::string())
                            .required()
                            .describe("One or two fields: the partition key, then the sort key"),
                    ),
            )
            .describe("Global secondary indexes (projection ALL)"),
        )
        .field(
            "timeToLive",
            Field::object(
                Schema::object()
                    .field(
                        "fieldName",
                        Field::string()
                            .required()
                            .describe("The attribute holding the expiry time (epoch seconds)"),
                    )
                    .field("enabled", Field::boolean().default(true)),
            )
            .describe("Expiring items"),
        )
}

/// The DynamoDB attribute type of `attr`, from the datastore's schema.
fn attribute_type(r: &Resource, attr: &str, at: AttrPath, out: &mut Out) -> &'static str {
    let ty = r
        .spec()
        .get("schema")
        .and_then(|s| s.get("fields"))
        .and_then(|f| f.get(attr))
        .and_then(|f| f.get("type"))
        .and_then(Json::as_str);
    match ty {
        Some("number") => "N",
        None | Some("string") => "S",
        Some(other) => {
            out.error(
                "datastore.key-type",
                format!("key attribute `{attr}` is a{} {other}; DynamoDB keys are strings, numbers or binary",
                    if other.starts_with(['a', 'o']) { "n" } else { "" }),
                at,
            );
            "S"
        }
    }
}

pub fn emit(input: &Input, r: &Resource, out: &mut Out) {
    out.check_spec(r, &schema());
    let spec = r.spec();
    let mut table = Map::new();
    if let Some(name) = spec.get("name") {
        table.insert("tableName".into(), name.clone());
    }
    // Attribute definitions: every key attribute of the table and its
    // indexes, once, in order of first use.
    let mut attrs: Vec<(String, &'static str)> = Vec::new();
    let mut define = |attr: &str, at: AttrPath, out: &mut Out| {
        if !attrs.iter().any(|(a, _)| a == attr) {
            let ty = attribute_type(r, attr, at, out);
            attrs.push((attr.to_owned(), ty));
        }
    };
    let keys = spec.get("keys");
    let mut key_schema = Vec::new();
    for (field, key_type) in [("partitionKey", "HASH"), ("sortKey", "RANGE")] {
        if let Some(attr) = keys.and_then(|k| k.get(field)).and_then(Json::as_str) {
            define(attr, r.spec_at("keys").field(field), out);
            key_schema.push(json!({"attributeName": attr, "keyType": key_type}));
        }
    }
    let mut gsis = Vec::new();
    if let Some(indexes) = spec.get("indexes").and_then(Json::as_array) {
        for (i, index) in indexes.iter().enumerate() {
            let at = r.spec_at("indexes").index(i as u64);
            let fields: Vec<&str> = index
                .get("fields")
                .and_then(Json::as_array)
                .map(|f| f.iter().filter_map(Json::as_str).collect())
                .unwrap_or_default();
            if fields.is_empty() || fields.len() > 2 {
                out.error(
                    "datastore.index-fields",
                    format!(
                        "index {i} of datastore `{}` has {} fields; a DynamoDB index takes a partition key and optionally a sort key",
                        r.name,
                        fields.len()
                    ),
                    at.field("fields"),
                );
                continue;
            }
            let mut ks = Vec::new();
            for (j, (attr, key_type)) in fields.iter().zip(["HASH", "RANGE"]).enumerate() {
                define(attr, at.clone().field("fields").index(j as u64), out);
                ks.push(json!({"attributeName": attr, "keyType": key_type}));
            }
            gsis.push(json!({
                "indexName": index.get("name").cloned().unwrap_or(Json::Null),
                "keySchema": ks,
                "projection": {"projectionType": "ALL"},
            }));
        }
    }
    table.insert(
        "attributeDefinitions".into(),
        Json::Array(
            attrs
                .iter()
                .map(|(a, t)| json!({"attributeName": a, "attributeType": t}))
                .collect(),
        ),
    );
    table.insert("keySchema".into(), Json::Array(key_schema));
    table.insert("billingMode".into(), json!("PAY_PER_REQUEST"));
    if !gsis.is_empty() {
        table.insert("globalSecondaryIndexes".into(), Json::Array(gsis));
    }
    if let Some(ttl) = spec.get("timeToLive").and_then(Json::as_object) {
        table.insert(
            "timeToLiveSpecification".into(),
            json!({
                "attributeName": ttl.get("fieldName").cloned().unwrap_or(Json::Null),
                "enabled": ttl.get("enabled").cloned().unwrap_or(json!(true)),
            }),
        );
    }
    if input
        .selected_by(r)
        .any(|c| c.ty == crate::types::consumer::TYPE)
    {
        table.insert(
            "streamSpecification".into(),
            json!({"streamViewType": "NEW_AND_OLD_IMAGES"}),
        );
    }
    for field in ["schemaPath", "scriptsPath"] {
        if spec.contains_key(field) {
            out.warning(
                "datastore.schema-tooling",
                format!(
                    "`{field}` is read by Celerity's schema tooling; the deploy does not use it"
                ),
                r.spec_at(field),
            );
        }
    }
    out.emit(&r.name, r, "aws/dynamodb/table", Json::Object(table));
    out.alias_fields(r, &[("name", "tableName"), ("id", "arn")]);
}

#[cfg(test)]
mod tests {
    use crate::model::diagnostic_lines;
    use crate::transform_doc;
    use serde_json::{Value, json};

    fn doc(resources: Value) -> Value {
        json!({"version": "2023-04-20", "transform": "celerity-2023-04-20", "resources": resources})
    }

    #[test]
    fn datastore_keys_indexes_and_time_to_live() {
        let out = transform_doc(doc(json!({
            "users": {
                "type": "celerity/datastore",
                "metadata": {"labels": {"app": "users"}},
                "spec": {
                    "name": "users",
                    "keys": {"partitionKey": "id", "sortKey": "createdAt"},
                    "schema": {"fields": {
                        "id": {"type": "string"},
                        "createdAt": {"type": "number"},
                        "email": {"type": "string"}
                    }},
                    "indexes": [
                        {"name": "byEmail", "fields": ["email"]},
                        {"name": "byOrg", "fields": ["orgId", "createdAt"]}
                    ],
                    "timeToLive": {"fieldName": "expiresAt", "enabled": true}
                }
            },
            "minimal": {"type": "celerity/datastore", "spec": {"keys": {"partitionKey": "pk"}}},
            "reader": {
                "type": "aws/lambda/function",
                "spec": {"codeUri": "./r", "description": "${resources.users.spec.name} ${resources.users.spec.id}"}
            }
        })));
        assert!(
            out.diagnostics.is_empty(),
            "{:?}",
            diagnostic_lines(&out.diagnostics)
        );
        insta::assert_json_snapshot!("datastore_table", out.blueprint["resources"]);
    }

    #[test]
    fn datastore_diagnostics() {
        let out = transform_doc(doc(json!({
            "bad": {
                "type": "celerity/datastore",
                "spec": {
                    "keys": {"partitionKey": "flag"},
                    "schema": {"fields": {"flag": {"type": "boolean"}}},
                    "schemaPath": "./schemas/bad.yaml",
                    "indexes": [{"name": "wide", "fields": ["a", "b", "c"]}],
                    "timeToLive": {"enabled": true}
                }
            },
            "nokeys": {"type": "celerity/datastore", "spec": {}}
        })));
        insta::assert_json_snapshot!("datastore_diagnostics", diagnostic_lines(&out.diagnostics));
    }
}
