//! Data sources `aws/lambda/function`, `aws/dynamodb/table` and `aws/vpc`.
//!
//! Each fetch returns every candidate, in a stable order (by name or id), and the engine
//! picks the first that matches all the filters. The filters narrow the AWS calls only
//! through the **first** filter ([`Hint`]): the engine evaluates an item's filters in order
//! and stops at the first that fails, so leaving out an item the first filter certainly
//! rejects changes nothing, not even which errors are reported. A first filter
//! `functionName = x` / `tableName = x` (or `in [..]`) reads just those; `vpcId`,
//! `isDefault`, `cidrBlock` and `tags has key` become DescribeVpcs filters; any other
//! first filter on a plain string, number or boolean field is applied before the calls
//! made per item.
//!
//! `tags` are maps (`tags has key team`, `tags contains prod`). A map cannot be exported,
//! so tags only serve filters: for functions and tables they cost one call per item
//! (lambda:ListTags, dynamodb:ListTagsOfResource) and are fetched only when a filter
//! reads `tags`. VPC tags come with DescribeVpcs and are always there.
//!
//! `aws/vpc` `subnets` and `securityGroups`: exported, they are arrays of ids (an exported
//! array holds primitives), as the specification's `exports: {subnets: {type: array}}`
//! expects; when a filter reads into them (`subnets[].availabilityZone in [..]`, the
//! specification's other example), they are arrays of objects instead
//! (`{subnetId, availabilityZone, availabilityZoneId, cidrBlock, defaultForAz,
//! mapPublicIpOnLaunch}`, `{groupId, groupName, description}`). `subnetIds` and
//! `securityGroupIds` are always the ids.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use trellis_plugin_sdk::prelude::*;

use crate::config::{ClientCache, Clients};
use crate::error;

/// Calls made per item (DescribeTable, ListTags) run this many at a time.
const CONCURRENCY: usize = 8;

/// Above this many VPCs, subnets and security groups are listed for the whole region
/// rather than with a `vpc-id` filter (whose value count AWS limits).
const MAX_VPC_FILTER_VALUES: usize = 100;

// ---------------------------------------------------------------------------
// The first filter as a hint
// ---------------------------------------------------------------------------

/// The first filter, with the engine's semantics where this module relies on them.
pub struct Hint {
    field: String,
    op: String,
    search: Value,
}

impl Hint {
    pub fn first(filters: &[Filter]) -> Option<Hint> {
        let f = filters.first()?;
        let search = f.search.revealed().clone();
        if search.is_unknown() {
            return None;
        }
        Some(Hint {
            field: f.field.clone(),
            op: f.operator.clone(),
            search,
        })
    }

    /// The only values `field` can have for the filter to match: `field = "x"`, or
    /// `field in ["x", "y"]` (all strings).
    pub fn exact_strings(&self, field: &str) -> Option<Vec<String>> {
        if self.field != field {
            return None;
        }
        match (self.op.as_str(), &self.search) {
            ("=", Value::String(s)) => Some(vec![s.clone()]),
            ("in", Value::List(items)) => items
                .iter()
                .map(|v| v.as_str().map(str::to_owned))
                .collect(),
            _ => None,
        }
    }

    /// `field = true|false`.
    pub fn bool_equal(&self, field: &str) -> Option<bool> {
        match (self.op.as_str(), &self.search) {
            ("=", Value::Bool(b)) if self.field == field => Some(*b),
            _ => None,
        }
    }

    /// `field has key "k"`.
    pub fn has_key(&self, field: &str) -> Option<&str> {
        match (self.op.as_str(), &self.search) {
            ("has key", Value::String(k)) if self.field == field => Some(k),
            _ => None,
        }
    }

    /// False only when the item has the filter's field (a top-level one) and the filter
    /// certainly does not match it, with types the engine accepts. An item may be partial
    /// (a table known by name only): an absent field may still match.
    pub fn may_match(&self, item: &Value) -> bool {
        if self.field.contains(['.', '[']) {
            return true;
        }
        let Some(value) = item.get(&self.field) else {
            return true;
        };
        let op = self.op.as_str();
        let result = match (value, &self.search) {
            (Value::String(text), Value::String(s)) => match op.trim_start_matches("not ") {
                "starts with" => Some(text.starts_with(s.as_str())),
                "ends with" => Some(text.ends_with(s.as_str())),
                "contains" => Some(text.contains(s.as_str())),
                _ => match op {
                    "=" => Some(text == s),
                    "!=" => Some(text != s),
                    _ => None,
                },
            }
            .map(|hit| if op.starts_with("not ") { !hit } else { hit }),
            (Value::String(text), Value::List(items)) if matches!(op, "in" | "not in") => {
                let strings: Option<Vec<&str>> = items.iter().map(Value::as_str).collect();
                strings.map(|s| s.contains(&text.as_str()) == (op == "in"))
            }
            (Value::Bool(b), Value::Bool(s)) => match op {
                "=" => Some(b == s),
                "!=" => Some(b != s),
                _ => None,
            },
            (Value::Int(n), Value::Int(s)) => match op {
                "=" => Some(n == s),
                "!=" => Some(n != s),
                _ => None,
            },
            (Value::Map(m), Value::String(k)) => match op {
                "has key" => Some(m.contains_key(k)),
                "not has key" => Some(!m.contains_key(k)),
                _ => None,
            },
            (Value::List(items), Value::String(s))
                if matches!(op, "contains" | "not contains")
                    && items.iter().all(|v| v.as_str().is_some()) =>
            {
                let hit = items.iter().any(|v| v.as_str() == Some(s.as_str()));
                Some(hit == (op == "contains"))
            }
            _ => None,
        };
        result.unwrap_or(true)
    }
}

fn may_match(hint: Option<&Hint>, item: &Value) -> bool {
    hint.is_none_or(|h| h.may_match(item))
}

/// Whether a filter reads `field` itself or something in it (`tags`, `tags["a b"]`).
fn reads(filters: &[Filter], field: &str) -> bool {
    filters
        .iter()
        .any(|f| f.field.split(['.', '[']).next() == Some(field))
}

/// Whether a filter reads into `field` (`subnets[0].availabilityZone`), not just `field`.
fn reads_into(filters: &[Filter], field: &str) -> bool {
    filters.iter().any(|f| {
        f.field
            .strip_prefix(field)
            .is_some_and(|rest| rest.starts_with(['.', '[']))
    })
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// Runs `f` over `inputs`, [`CONCURRENCY`] at a time; the results in input order, `None`
/// dropped. Cancelling the call abandons the calls still running.
async fn each<I, R, F, Fut>(ctx: &Context, inputs: Vec<I>, f: F) -> Result<Vec<R>>
where
    I: Send + 'static,
    R: Send + 'static,
    F: Fn(I) -> Fut,
    Fut: Future<Output = Result<Option<R>>> + Send + 'static,
{
    let permits = Arc::new(Semaphore::new(CONCURRENCY));
    let mut set = JoinSet::new();
    let n = inputs.len();
    for (i, input) in inputs.into_iter().enumerate() {
        let fut = f(input);
        let permits = permits.clone();
        set.spawn(async move {
            let _permit = permits
                .acquire_owned()
                .await
                .map_err(|_| PluginError::internal("the call's task limit closed"))?;
            fut.await.map(|r| (i, r))
        });
    }
    let mut out: Vec<Option<R>> = (0..n).map(|_| None).collect();
    ctx.run_cancellable(async {
        while let Some(joined) = set.join_next().await {
            let (i, r) =
                joined.map_err(|e| PluginError::internal(format!("a task failed: {e}")))??;
            if let Some(slot) = out.get_mut(i) {
                *slot = r;
            }
        }
        Ok(())
    })
    .await?;
    Ok(out.into_iter().flatten().collect())
}

/// Tags as a map, keys sorted.
fn tag_map<'a>(tags: impl IntoIterator<Item = (&'a str, &'a str)>) -> Value {
    let sorted: BTreeMap<&str, &str> = tags.into_iter().collect();
    Value::map_of(sorted)
}

fn put<V: Into<Value>>(item: &mut Value, key: &str, v: Option<V>) {
    if let Some(v) = v {
        item.insert(key, v.into());
    }
}

fn strings<'a>(items: impl IntoIterator<Item = &'a str>) -> Value {
    Value::List(items.into_iter().map(Value::from).collect())
}

// ---------------------------------------------------------------------------
// aws/lambda/function
// ---------------------------------------------------------------------------

/// `aws/lambda/function`: the region's functions ($LATEST), by name.
pub struct LambdaFunctions {
    pub clients: Arc<ClientCache>,
}

fn function_fields(s: Schema, exported: bool) -> Schema {
    let s = s
        .field(
            "functionName",
            Field::string().describe("The function's name"),
        )
        .field("arn", Field::string().describe("The function's ARN"))
        .field(
            "runtime",
            Field::string()
                .describe("`nodejs20.x`, `python3.12`, ...; absent for container images"),
        )
        .field(
            "handler",
            Field::string().describe("`index.handler`; absent for container images"),
        )
        .field("role", Field::string().describe("The execution role's ARN"))
        .field("timeout", Field::integer().describe("Timeout in seconds"))
        .field("memorySize", Field::integer().describe("Memory in MB"))
        .field(
            "architectures",
            Field::array(Schema::string()).describe("`[\"x86_64\"]` or `[\"arm64\"]`"),
        )
        .field(
            "description",
            Field::string().describe("The description (empty when none)"),
        )
        .field("packageType", Field::string().describe("`Zip` or `Image`"))
        .field(
            "state",
            Field::string().describe("`Active`, `Pending`, `Inactive` or `Failed`"),
        )
        .field(
            "lastModified",
            Field::string().describe("When the function last changed (ISO 8601)"),
        );
    if exported {
        s
    } else {
        s.field(
            "tags",
            Field::map(Schema::string()).describe("The function's tags, a map: `tags has key team` (one lambda:ListTags call per function, made only when a filter reads tags)"),
        )
    }
}

fn function_item(f: &aws_sdk_lambda::types::FunctionConfiguration) -> Option<Value> {
    let name = f.function_name()?;
    let mut item = Value::map().with("functionName", name);
    put(&mut item, "arn", f.function_arn());
    put(&mut item, "runtime", f.runtime().map(|r| r.as_str()));
    put(&mut item, "handler", f.handler());
    put(&mut item, "role", f.role());
    put(&mut item, "timeout", f.timeout().map(i64::from));
    put(&mut item, "memorySize", f.memory_size().map(i64::from));
    if !f.architectures().is_empty() {
        item.insert(
            "architectures",
            strings(f.architectures().iter().map(|a| a.as_str())),
        );
    }
    item.insert("description", f.description().unwrap_or(""));
    put(
        &mut item,
        "packageType",
        f.package_type().map(|p| p.as_str()),
    );
    put(&mut item, "state", f.state().map(|s| s.as_str()));
    put(&mut item, "lastModified", f.last_modified());
    Some(item)
}

/// A Lambda function name as AWS allows it: only such a name can be a function's.
fn valid_function_name(n: &str) -> bool {
    (1..=64).contains(&n.len())
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

async fn get_function(c: Arc<Clients>, name: String) -> Result<Option<Value>> {
    let out = match c.lambda.get_function().function_name(&name).send().await {
        Ok(out) => out,
        Err(e) => {
            let e = error::sdk(format!("reading function {name} (lambda:GetFunction)"), e);
            return if error::is_not_found(&e) {
                Ok(None)
            } else {
                Err(e)
            };
        }
    };
    let Some(mut item) = out.configuration().and_then(function_item) else {
        return Ok(None);
    };
    if let Some(tags) = out.tags() {
        item.insert(
            "tags",
            tag_map(tags.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
        );
    }
    Ok(Some(item))
}

async fn function_tags(c: Arc<Clients>, mut item: Value) -> Result<Option<Value>> {
    let Some(arn) = item.get("arn").and_then(Value::as_str).map(str::to_owned) else {
        return Ok(Some(item));
    };
    match c.lambda.list_tags().resource(&arn).send().await {
        Ok(out) => {
            let tags = out.tags().into_iter().flatten();
            item.insert("tags", tag_map(tags.map(|(k, v)| (k.as_str(), v.as_str()))));
            Ok(Some(item))
        }
        Err(e) => {
            let e = error::sdk(format!("reading the tags of {arn} (lambda:ListTags)"), e);
            // Deleted since it was listed: no longer a candidate.
            if error::is_not_found(&e) {
                Ok(None)
            } else {
                Err(e)
            }
        }
    }
}

#[async_trait]
impl DataSource for LambdaFunctions {
    fn type_name(&self) -> &str {
        "aws/lambda/function"
    }

    fn description(&self) -> &str {
        "Lambda functions of the provider's region ($LATEST), by name. A first filter `functionName = x` (or `in`) reads only those; tags are read only when a filter uses them."
    }

    fn filter_fields(&self) -> Schema {
        function_fields(Schema::object(), false)
    }

    fn exports(&self) -> Schema {
        function_fields(Schema::object(), true)
    }

    async fn fetch(&self, ctx: &Context, filters: &[Filter]) -> Result<Vec<Value>> {
        let c = self.clients.get(ctx).await?;
        let hint = Hint::first(filters);
        if let Some(mut names) = hint.as_ref().and_then(|h| h.exact_strings("functionName")) {
            names.retain(|n| valid_function_name(n));
            names.sort();
            names.dedup();
            return each(ctx, names, |n| get_function(c.clone(), n)).await;
        }
        let mut items = Vec::new();
        let mut marker: Option<String> = None;
        loop {
            ctx.check_cancelled()?;
            let out = c
                .lambda
                .list_functions()
                .set_marker(marker.take())
                .send()
                .await
                .map_err(|e| error::sdk("listing functions (lambda:ListFunctions)", e))?;
            items.extend(
                out.functions()
                    .iter()
                    .filter_map(function_item)
                    .filter(|i| may_match(hint.as_ref(), i)),
            );
            match out.next_marker() {
                Some(m) if !m.is_empty() => marker = Some(m.to_owned()),
                _ => break,
            }
        }
        items.sort_by(|a, b| {
            let name = |v: &Value| {
                v.get("functionName")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            };
            name(a).cmp(&name(b))
        });
        if reads(filters, "tags") {
            items = each(ctx, items, |i| function_tags(c.clone(), i)).await?;
        }
        Ok(items)
    }
}

// ---------------------------------------------------------------------------
// aws/dynamodb/table
// ---------------------------------------------------------------------------

/// `aws/dynamodb/table`: the region's tables, by name.
pub struct DynamoTables {
    pub clients: Arc<ClientCache>,
}

fn table_fields(s: Schema, exported: bool) -> Schema {
    let key_schema = Schema::object()
        .field("attributeName", Field::string())
        .field("keyType", Field::string().describe("`HASH` or `RANGE`"));
    let attribute = Schema::object()
        .field("attributeName", Field::string())
        .field("attributeType", Field::string().describe("`S`, `N` or `B`"));
    let s = s
        .field("tableName", Field::string().describe("The table's name"))
        .field("arn", Field::string().describe("The table's ARN"))
        .field(
            "streamArn",
            Field::string()
                .describe("The latest stream's ARN; absent when the table never had a stream"),
        )
        .field(
            "partitionKey",
            Field::string().describe("The name of the partition (HASH) key attribute"),
        )
        .field(
            "sortKey",
            Field::string()
                .describe("The name of the sort (RANGE) key attribute; absent when none"),
        )
        .field(
            "billingMode",
            Field::string().describe("`PROVISIONED` or `PAY_PER_REQUEST`"),
        )
        .field(
            "itemCount",
            Field::integer().describe("Items, as DynamoDB last counted (about every 6 hours)"),
        )
        .field(
            "status",
            Field::string().describe("`ACTIVE`, `CREATING`, `UPDATING`, `DELETING`, ..."),
        );
    if exported {
        s
    } else {
        s.field(
            "keySchema",
            Field::array(key_schema).describe("`[{attributeName, keyType}]`: filter with `keySchema[0].attributeName`"),
        )
        .field(
            "attributeDefinitions",
            Field::array(attribute).describe("`[{attributeName, attributeType}]`"),
        )
        .field(
            "tags",
            Field::map(Schema::string()).describe("The table's tags, a map: `tags has key team` (one dynamodb:ListTagsOfResource call per table, made only when a filter reads tags)"),
        )
    }
}

fn table_item(t: &aws_sdk_dynamodb::types::TableDescription) -> Option<Value> {
    let name = t.table_name()?;
    let mut item = Value::map().with("tableName", name);
    put(&mut item, "arn", t.table_arn());
    put(&mut item, "streamArn", t.latest_stream_arn());
    let keys = t.key_schema();
    item.insert(
        "keySchema",
        Value::List(
            keys.iter()
                .map(|k| {
                    Value::map()
                        .with("attributeName", k.attribute_name())
                        .with("keyType", k.key_type().as_str())
                })
                .collect(),
        ),
    );
    let key = |ty: aws_sdk_dynamodb::types::KeyType| {
        keys.iter()
            .find(|k| *k.key_type() == ty)
            .map(|k| k.attribute_name())
    };
    put(
        &mut item,
        "partitionKey",
        key(aws_sdk_dynamodb::types::KeyType::Hash),
    );
    put(
        &mut item,
        "sortKey",
        key(aws_sdk_dynamodb::types::KeyType::Range),
    );
    item.insert(
        "attributeDefinitions",
        Value::List(
            t.attribute_definitions()
                .iter()
                .map(|a| {
                    Value::map()
                        .with("attributeName", a.attribute_name())
                        .with("attributeType", a.attribute_type().as_str())
                })
                .collect(),
        ),
    );
    // DynamoDB leaves the summary out for tables that were always provisioned.
    let billing = t
        .billing_mode_summary()
        .and_then(|b| b.billing_mode())
        .map_or("PROVISIONED", |m| m.as_str());
    item.insert("billingMode", billing);
    put(&mut item, "itemCount", t.item_count());
    put(&mut item, "status", t.table_status().map(|s| s.as_str()));
    Some(item)
}

/// A table name as DynamoDB allows it: only such a name can be a table's.
fn valid_table_name(n: &str) -> bool {
    (3..=255).contains(&n.len())
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

async fn describe_table(c: Arc<Clients>, name: String) -> Result<Option<Value>> {
    match c.dynamodb.describe_table().table_name(&name).send().await {
        Ok(out) => Ok(out.table().and_then(table_item)),
        Err(e) => {
            let e = error::sdk(format!("reading table {name} (dynamodb:DescribeTable)"), e);
            // Deleted since it was listed, or never there: not a candidate.
            if error::is_not_found(&e) {
                Ok(None)
            } else {
                Err(e)
            }
        }
    }
}

async fn table_tags(c: Arc<Clients>, mut item: Value) -> Result<Option<Value>> {
    let Some(arn) = item.get("arn").and_then(Value::as_str).map(str::to_owned) else {
        return Ok(Some(item));
    };
    let mut tags: Vec<(String, String)> = Vec::new();
    let mut next: Option<String> = None;
    loop {
        let out = match c
            .dynamodb
            .list_tags_of_resource()
            .resource_arn(&arn)
            .set_next_token(next.take())
            .send()
            .await
        {
            Ok(out) => out,
            Err(e) => {
                let e = error::sdk(
                    format!("reading the tags of {arn} (dynamodb:ListTagsOfResource)"),
                    e,
                );
                return if error::is_not_found(&e) {
                    Ok(None)
                } else {
                    Err(e)
                };
            }
        };
        tags.extend(
            out.tags()
                .iter()
                .map(|t| (t.key().to_owned(), t.value().to_owned())),
        );
        match out.next_token() {
            Some(t) if !t.is_empty() => next = Some(t.to_owned()),
            _ => break,
        }
    }
    item.insert(
        "tags",
        tag_map(tags.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
    );
    Ok(Some(item))
}

#[async_trait]
impl DataSource for DynamoTables {
    fn type_name(&self) -> &str {
        "aws/dynamodb/table"
    }

    fn description(&self) -> &str {
        "DynamoDB tables of the provider's region, by name. A first filter `tableName = x` (or `in`) describes only those; tags are read only when a filter uses them."
    }

    fn filter_fields(&self) -> Schema {
        table_fields(Schema::object(), false)
    }

    fn exports(&self) -> Schema {
        table_fields(Schema::object(), true)
    }

    async fn fetch(&self, ctx: &Context, filters: &[Filter]) -> Result<Vec<Value>> {
        let c = self.clients.get(ctx).await?;
        let hint = Hint::first(filters);
        let mut names = match hint.as_ref().and_then(|h| h.exact_strings("tableName")) {
            Some(names) => names,
            None => {
                let mut names = Vec::new();
                let mut start: Option<String> = None;
                loop {
                    ctx.check_cancelled()?;
                    let out = c
                        .dynamodb
                        .list_tables()
                        .set_exclusive_start_table_name(start.take())
                        .send()
                        .await
                        .map_err(|e| error::sdk("listing tables (dynamodb:ListTables)", e))?;
                    names.extend(out.table_names().iter().cloned());
                    match out.last_evaluated_table_name() {
                        Some(n) if !n.is_empty() => start = Some(n.to_owned()),
                        _ => break,
                    }
                }
                names
            }
        };
        // A filter on the name alone spares the DescribeTable calls of the others.
        names.retain(|n| {
            valid_table_name(n)
                && may_match(hint.as_ref(), &Value::map().with("tableName", n.as_str()))
        });
        names.sort();
        names.dedup();
        let mut items = each(ctx, names, |n| describe_table(c.clone(), n)).await?;
        items.retain(|i| may_match(hint.as_ref(), i));
        if reads(filters, "tags") {
            items = each(ctx, items, |i| table_tags(c.clone(), i)).await?;
        }
        Ok(items)
    }
}

// ---------------------------------------------------------------------------
// aws/vpc
// ---------------------------------------------------------------------------

/// `aws/vpc`: the region's VPCs with their subnets and security groups, by id.
pub struct Vpcs {
    pub clients: Arc<ClientCache>,
}

fn vpc_fields(s: Schema, exported: bool) -> Schema {
    let s = s
        .field("vpcId", Field::string().describe("The VPC's id, `vpc-0abc...`"))
        .field("arn", Field::string().describe("The VPC's ARN"))
        .field("ownerId", Field::string().describe("The owning account's id"))
        .field("cidrBlock", Field::string().describe("The primary IPv4 CIDR block"))
        .field(
            "cidrBlocks",
            Field::array(Schema::string()).describe("Every associated IPv4 CIDR block, the primary first"),
        )
        .field("isDefault", Field::boolean().describe("Whether it is the region's default VPC"))
        .field("state", Field::string().describe("`available` or `pending`"))
        .field("instanceTenancy", Field::string().describe("`default`, `dedicated` or `host`"))
        .field("dhcpOptionsId", Field::string().describe("The DHCP options set's id"))
        .field(
            "subnets",
            Field::array(Schema::any()).describe("The subnets' ids, by availability zone; objects `{subnetId, availabilityZone, availabilityZoneId, cidrBlock, defaultForAz, mapPublicIpOnLaunch}` when a filter reads into them (`subnets[].availabilityZone`), and then not exportable"),
        )
        .field(
            "subnetIds",
            Field::array(Schema::string()).describe("The subnets' ids, by availability zone"),
        )
        .field(
            "availabilityZones",
            Field::array(Schema::string()).describe("The availability zones its subnets are in, sorted"),
        )
        .field(
            "securityGroups",
            Field::array(Schema::any()).describe("The security groups' ids, sorted; objects `{groupId, groupName, description}` when a filter reads into them, and then not exportable"),
        )
        .field(
            "securityGroupIds",
            Field::array(Schema::string()).describe("The security groups' ids, sorted"),
        );
    if exported {
        s
    } else {
        s.field(
            "tags",
            Field::map(Schema::string())
                .describe("The VPC's tags, a map: `tags has key environment`"),
        )
    }
}

fn ec2_filter(name: &str, values: impl IntoIterator<Item = String>) -> aws_sdk_ec2::types::Filter {
    aws_sdk_ec2::types::Filter::builder()
        .name(name)
        .set_values(Some(values.into_iter().collect()))
        .build()
}

/// An EC2 filter value matches exactly only without its wildcards and escapes.
fn literal(s: &str) -> bool {
    !s.contains(['*', '?', '\\'])
}

/// The DescribeVpcs filter the first filter amounts to.
fn vpc_query(hint: Option<&Hint>) -> Option<aws_sdk_ec2::types::Filter> {
    let h = hint?;
    if let Some(ids) = h.exact_strings("vpcId") {
        return ids
            .iter()
            .all(|s| literal(s))
            .then(|| ec2_filter("vpc-id", ids));
    }
    if let Some(cidrs) = h.exact_strings("cidrBlock") {
        return cidrs
            .iter()
            .all(|s| literal(s))
            .then(|| ec2_filter("cidr", cidrs));
    }
    if let Some(b) = h.bool_equal("isDefault") {
        return Some(ec2_filter("is-default", [b.to_string()]));
    }
    let key = h.has_key("tags")?;
    literal(key).then(|| ec2_filter("tag-key", [key.to_owned()]))
}

fn vpc_item(v: &aws_sdk_ec2::types::Vpc, c: &Clients) -> Option<Value> {
    let id = v.vpc_id()?;
    let mut item = Value::map().with("vpcId", id);
    if let Some(owner) = v.owner_id() {
        item.insert("ownerId", owner);
        item.insert(
            "arn",
            format!("arn:{}:ec2:{}:{owner}:vpc/{id}", c.partition(), c.region),
        );
    }
    put(&mut item, "cidrBlock", v.cidr_block());
    let mut cidrs: Vec<&str> = v.cidr_block().into_iter().collect();
    for a in v.cidr_block_association_set() {
        let associated = a
            .cidr_block_state()
            .and_then(|s| s.state())
            .is_none_or(|s| s.as_str() == "associated");
        if let Some(b) = a.cidr_block()
            && associated
            && !cidrs.contains(&b)
        {
            cidrs.push(b);
        }
    }
    item.insert("cidrBlocks", strings(cidrs));
    item.insert("isDefault", v.is_default().unwrap_or(false));
    put(&mut item, "state", v.state().map(|s| s.as_str()));
    put(
        &mut item,
        "instanceTenancy",
        v.instance_tenancy().map(|t| t.as_str()),
    );
    put(&mut item, "dhcpOptionsId", v.dhcp_options_id());
    item.insert(
        "tags",
        tag_map(
            v.tags()
                .iter()
                .filter_map(|t| Some((t.key()?, t.value().unwrap_or("")))),
        ),
    );
    Some(item)
}

/// The filters for the subnets or security groups of `vpcs` (none: the whole region).
fn in_vpcs(vpcs: &[String]) -> Option<Vec<aws_sdk_ec2::types::Filter>> {
    (vpcs.len() <= MAX_VPC_FILTER_VALUES).then(|| vec![ec2_filter("vpc-id", vpcs.to_vec())])
}

/// Subnets by VPC: (availability zone, id, object).
async fn subnets(
    c: &Clients,
    vpcs: &[String],
) -> Result<BTreeMap<String, Vec<(String, String, Value)>>> {
    let mut by_vpc: BTreeMap<String, Vec<(String, String, Value)>> = BTreeMap::new();
    let mut next: Option<String> = None;
    loop {
        let out = c
            .ec2
            .describe_subnets()
            .set_filters(in_vpcs(vpcs))
            .set_next_token(next.take())
            .send()
            .await
            .map_err(|e| error::sdk("listing subnets (ec2:DescribeSubnets)", e))?;
        for s in out.subnets() {
            let (Some(vpc), Some(id)) = (s.vpc_id(), s.subnet_id()) else {
                continue;
            };
            let az = s.availability_zone().unwrap_or("");
            let mut o = Value::map().with("subnetId", id);
            put(&mut o, "availabilityZone", s.availability_zone());
            put(&mut o, "availabilityZoneId", s.availability_zone_id());
            put(&mut o, "cidrBlock", s.cidr_block());
            put(&mut o, "defaultForAz", s.default_for_az());
            put(&mut o, "mapPublicIpOnLaunch", s.map_public_ip_on_launch());
            by_vpc
                .entry(vpc.to_owned())
                .or_default()
                .push((az.to_owned(), id.to_owned(), o));
        }
        match out.next_token() {
            Some(t) if !t.is_empty() => next = Some(t.to_owned()),
            _ => break,
        }
    }
    for list in by_vpc.values_mut() {
        list.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    }
    Ok(by_vpc)
}

/// Security groups by VPC: (id, object).
async fn security_groups(
    c: &Clients,
    vpcs: &[String],
) -> Result<BTreeMap<String, Vec<(String, Value)>>> {
    let mut by_vpc: BTreeMap<String, Vec<(String, Value)>> = BTreeMap::new();
    let mut next: Option<String> = None;
    loop {
        let out = c
            .ec2
            .describe_security_groups()
            .set_filters(in_vpcs(vpcs))
            .set_next_token(next.take())
            .send()
            .await
            .map_err(|e| error::sdk("listing security groups (ec2:DescribeSecurityGroups)", e))?;
        for g in out.security_groups() {
            let (Some(vpc), Some(id)) = (g.vpc_id(), g.group_id()) else {
                continue;
            };
            let mut o = Value::map().with("groupId", id);
            put(&mut o, "groupName", g.group_name());
            put(&mut o, "description", g.description());
            by_vpc
                .entry(vpc.to_owned())
                .or_default()
                .push((id.to_owned(), o));
        }
        match out.next_token() {
            Some(t) if !t.is_empty() => next = Some(t.to_owned()),
            _ => break,
        }
    }
    for list in by_vpc.values_mut() {
        list.sort_by(|a, b| a.0.cmp(&b.0));
    }
    Ok(by_vpc)
}

#[async_trait]
impl DataSource for Vpcs {
    fn type_name(&self) -> &str {
        "aws/vpc"
    }

    fn description(&self) -> &str {
        "VPCs of the provider's region with their subnets and security groups, by id. `subnets` and `securityGroups` are ids, or objects when a filter reads into them (`subnets[].availabilityZone in [..]`); `subnetIds` and `securityGroupIds` are always ids."
    }

    fn filter_fields(&self) -> Schema {
        vpc_fields(Schema::object(), false)
    }

    fn exports(&self) -> Schema {
        vpc_fields(Schema::object(), true)
    }

    async fn fetch(&self, ctx: &Context, filters: &[Filter]) -> Result<Vec<Value>> {
        let c = self.clients.get(ctx).await?;
        let hint = Hint::first(filters);
        let query = vpc_query(hint.as_ref());
        let mut items = Vec::new();
        let mut next: Option<String> = None;
        loop {
            ctx.check_cancelled()?;
            let out = c
                .ec2
                .describe_vpcs()
                .set_filters(query.clone().map(|q| vec![q]))
                .set_next_token(next.take())
                .send()
                .await
                .map_err(|e| error::sdk("listing VPCs (ec2:DescribeVpcs)", e))?;
            items.extend(
                out.vpcs()
                    .iter()
                    .filter_map(|v| vpc_item(v, &c))
                    .filter(|i| may_match(hint.as_ref(), i)),
            );
            match out.next_token() {
                Some(t) if !t.is_empty() => next = Some(t.to_owned()),
                _ => break,
            }
        }
        if items.is_empty() {
            return Ok(items);
        }
        let id = |v: &Value| {
            v.get("vpcId")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        items.sort_by_key(id);
        let ids: Vec<String> = items.iter().map(id).collect();
        let (mut subnets, mut groups) = ctx
            .run_cancellable(async {
                tokio::try_join!(subnets(&c, &ids), security_groups(&c, &ids))
            })
            .await?;
        let subnet_objects = reads_into(filters, "subnets");
        let group_objects = reads_into(filters, "securityGroups");
        for item in &mut items {
            let vpc = id(item);
            let subnets = subnets.remove(&vpc).unwrap_or_default();
            let ids = strings(subnets.iter().map(|s| s.1.as_str()));
            let mut zones: Vec<&str> = subnets
                .iter()
                .map(|s| s.0.as_str())
                .filter(|z| !z.is_empty())
                .collect();
            zones.dedup();
            item.insert("availabilityZones", strings(zones));
            item.insert("subnetIds", ids.clone());
            item.insert(
                "subnets",
                if subnet_objects {
                    Value::List(subnets.into_iter().map(|s| s.2).collect())
                } else {
                    ids
                },
            );
            let groups = groups.remove(&vpc).unwrap_or_default();
            let ids = strings(groups.iter().map(|g| g.0.as_str()));
            item.insert("securityGroupIds", ids.clone());
            item.insert(
                "securityGroups",
                if group_objects {
                    Value::List(groups.into_iter().map(|g| g.1).collect())
                } else {
                    ids
                },
            );
        }
        Ok(items)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(field: &str, op: &str, search: impl Into<Value>) -> Filter {
        Filter {
            field: field.to_owned(),
            operator: op.to_owned(),
            search: search.into(),
        }
    }

    fn hint(field: &str, op: &str, search: impl Into<Value>) -> Hint {
        Hint::first(&[filter(field, op, search)]).expect("a hint")
    }

    #[test]
    fn exact_names_only_from_equality_and_in_over_strings() {
        assert_eq!(
            hint("tableName", "=", "t").exact_strings("tableName"),
            Some(vec!["t".to_owned()])
        );
        assert_eq!(
            hint("tableName", "in", vec!["a", "b"]).exact_strings("tableName"),
            Some(vec!["a".to_owned(), "b".to_owned()])
        );
        assert_eq!(
            hint("tableName", "in", Value::List(vec![])).exact_strings("tableName"),
            Some(vec![])
        );
        assert_eq!(
            hint("tableName", "!=", "t").exact_strings("tableName"),
            None
        );
        assert_eq!(hint("tableName", "=", 3).exact_strings("tableName"), None);
        assert_eq!(
            hint("tableName", "in", Value::List(vec!["a".into(), 1.into()]))
                .exact_strings("tableName"),
            None
        );
        assert_eq!(hint("arn", "=", "t").exact_strings("tableName"), None);
        assert!(Hint::first(&[filter("tableName", "=", Value::Unknown)]).is_none());
    }

    #[test]
    fn may_match_drops_only_certain_misses() {
        let item = Value::map()
            .with("name", "orders-prod")
            .with("n", 3)
            .with("on", true)
            .with("tags", Value::map().with("team", "a"))
            .with("arch", vec!["arm64"]);
        let yes = |f: &str, op: &str, s: Value| hint(f, op, s).may_match(&item);
        assert!(yes("name", "starts with", "orders".into()));
        assert!(!yes("name", "starts with", "x".into()));
        assert!(yes("name", "not starts with", "x".into()));
        assert!(!yes("name", "not ends with", "prod".into()));
        assert!(yes("name", "contains", "s-p".into()));
        assert!(!yes("name", "=", "orders".into()));
        assert!(yes("name", "!=", "orders".into()));
        assert!(yes("name", "in", vec!["orders-prod"].into()));
        assert!(!yes("name", "not in", vec!["orders-prod"].into()));
        assert!(!yes("n", "=", 4.into()));
        assert!(!yes("on", "=", false.into()));
        assert!(!yes("tags", "has key", "env".into()));
        assert!(yes("tags", "not has key", "env".into()));
        assert!(!yes("arch", "contains", "x86_64".into()));
        // Types the engine rejects, other paths and absent fields: kept, for the engine.
        assert!(yes("name", "=", 3.into()));
        assert!(yes("name", "in", Value::List(vec!["x".into(), 1.into()])));
        assert!(yes("tags.team", "=", "b".into()));
        assert!(yes("missing", "=", "x".into()));
        assert!(yes("name", "has key", "x".into()));
    }

    #[test]
    fn which_filters_read_what() {
        let fs = [
            filter("tags", "has key", "a"),
            filter("subnets[].availabilityZone", "in", vec!["eu-west-1a"]),
        ];
        assert!(reads(&fs, "tags"));
        assert!(!reads(&fs, "tagsx"));
        assert!(reads_into(&fs, "subnets"));
        assert!(!reads_into(&fs, "securityGroups"));
        assert!(!reads_into(
            &[filter("subnets", "contains", "s-1")],
            "subnets"
        ));
        assert!(!reads_into(&[filter("subnetsX.a", "=", "s")], "subnets"));
    }

    #[test]
    fn vpc_queries() {
        let q = |f: &str, op: &str, s: Value| vpc_query(Some(&hint(f, op, s)));
        let name = |f: Option<aws_sdk_ec2::types::Filter>| {
            f.map(|f| (f.name().unwrap_or("").to_owned(), f.values().to_vec()))
        };
        assert_eq!(
            name(q("vpcId", "=", "vpc-1".into())),
            Some(("vpc-id".to_owned(), vec!["vpc-1".to_owned()]))
        );
        assert_eq!(
            name(q("isDefault", "=", true.into())),
            Some(("is-default".to_owned(), vec!["true".to_owned()]))
        );
        assert_eq!(
            name(q("tags", "has key", "env".into())),
            Some(("tag-key".to_owned(), vec!["env".to_owned()]))
        );
        assert_eq!(name(q("tags", "has key", "e*".into())), None);
        assert_eq!(name(q("tags", "not has key", "env".into())), None);
        assert_eq!(name(q("vpcId", "!=", "vpc-1".into())), None);
    }

    #[test]
    fn names_aws_allows() {
        assert!(valid_function_name("orders-api_v1"));
        assert!(!valid_function_name("my func"));
        assert!(!valid_function_name(
            "arn:aws:lambda:us-east-1:1:function:f"
        ));
        assert!(valid_table_name("orders.v1"));
        assert!(!valid_table_name("ab"));
        assert!(!valid_table_name("a b c"));
    }
}
