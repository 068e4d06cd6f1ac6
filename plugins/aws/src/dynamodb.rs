//! `aws/dynamodb/table` (CloudFormation `AWS::DynamoDB::Table`).
//!
//! DynamoDB is asynchronous: a table is CREATING, then ACTIVE; an index is CREATING
//! (backfilling) before it is ACTIVE. Every change waits for ACTIVE before the next, since
//! UpdateTable takes one kind of change at a time (one index created or deleted per call,
//! streams apart from throughput, ...) and refuses calls while the table is busy.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types as t;
use aws_smithy_types::error::operation::BuildError;
use trellis_plugin_sdk::prelude::*;

use crate::common::{self, NameStyle};
use crate::config::{ClientCache, Clients};
use crate::error::sdk;

pub struct Table {
    pub clients: Arc<ClientCache>,
}

const MAX_NAME: usize = 255;
const PROVISIONED: &str = "PROVISIONED";
const PAY_PER_REQUEST: &str = "PAY_PER_REQUEST";
const MAX_GSIS: usize = 20;
const MAX_LSIS: usize = 5;
/// Creating an index on a large table backfills it, which can take long.
const ACTIVE_WAIT: Duration = Duration::from_secs(30 * 60);
const DELETE_WAIT: Duration = Duration::from_secs(15 * 60);
const MAX_POLL: Duration = Duration::from_secs(10);

#[derive(Clone, Debug, PartialEq, Eq)]
struct Key {
    name: String,
    kind: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Projection {
    kind: String,
    non_key: Vec<String>,
}

impl Projection {
    fn all() -> Projection {
        Projection {
            kind: "ALL".to_owned(),
            non_key: Vec::new(),
        }
    }

    /// The same projection (the order of non-key attributes does not matter).
    fn same(&self, other: &Projection) -> bool {
        let set = |p: &Projection| p.non_key.iter().cloned().collect::<HashSet<String>>();
        self.kind == other.kind && set(self) == set(other)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Throughput {
    read: i64,
    write: i64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Index {
    name: String,
    keys: Vec<Key>,
    projection: Projection,
    throughput: Option<Throughput>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Sse {
    enabled: bool,
    kind: Option<String>,
    key: Option<String>,
}

/// A table's settings: what a spec asks for, or what AWS reports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Settings {
    name: String,
    attributes: Vec<(String, String)>,
    keys: Vec<Key>,
    billing: String,
    throughput: Option<Throughput>,
    gsis: Vec<Index>,
    lsis: Vec<Index>,
    /// The stream's view type when streams are on.
    stream: Option<String>,
    /// TTL attribute and whether it is on.
    ttl: Option<(String, bool)>,
    pitr: Option<bool>,
    sse: Option<Sse>,
    table_class: Option<String>,
    deletion_protection: Option<bool>,
}

fn keys_of(list: &[Spec<'_>]) -> Result<Vec<Key>> {
    list.iter()
        .map(|k| {
            Ok(Key {
                name: k.get_str("attributeName")?.to_owned(),
                kind: k.get_str("keyType")?.to_owned(),
            })
        })
        .collect()
}

fn throughput_of(spec: &Spec<'_>) -> Result<Option<Throughput>> {
    spec.opt_object("provisionedThroughput")?
        .map(|o| {
            Ok(Throughput {
                read: o.get_i64("readCapacityUnits")?,
                write: o.get_i64("writeCapacityUnits")?,
            })
        })
        .transpose()
}

fn indexes_of(spec: &Spec<'_>, field: &str) -> Result<Vec<Index>> {
    let mut out = Vec::new();
    for i in spec.opt_list(field)?.unwrap_or_default() {
        let projection = match i.opt_object("projection")? {
            None => Projection::all(),
            Some(p) => Projection {
                kind: p.opt_str("projectionType")?.unwrap_or("ALL").to_owned(),
                non_key: p
                    .opt_str_list("nonKeyAttributes")?
                    .unwrap_or_default()
                    .into_iter()
                    .map(str::to_owned)
                    .collect(),
            },
        };
        out.push(Index {
            name: i.get_str("indexName")?.to_owned(),
            keys: keys_of(&i.get_list("keySchema")?)?,
            projection,
            throughput: throughput_of(&i)?,
        });
    }
    Ok(out)
}

impl Settings {
    fn from_spec(ctx: &Context, spec: &Spec<'_>, resource_name: &str) -> Result<Settings> {
        let name = common::physical_name(
            ctx,
            spec,
            "tableName",
            resource_name,
            MAX_NAME,
            NameStyle::Standard,
        )?;
        let mut attributes = Vec::new();
        for a in spec.get_list("attributeDefinitions")? {
            attributes.push((
                a.get_str("attributeName")?.to_owned(),
                a.get_str("attributeType")?.to_owned(),
            ));
        }
        let throughput = throughput_of(spec)?;
        let billing = match spec.opt_str("billingMode")? {
            Some(b) => b.to_owned(),
            None if throughput.is_some() => PROVISIONED.to_owned(),
            None => PAY_PER_REQUEST.to_owned(),
        };
        let ttl = spec
            .opt_object("timeToLiveSpecification")?
            .map(|o| -> Result<(String, bool)> {
                Ok((
                    o.get_str("attributeName")?.to_owned(),
                    o.get_bool("enabled")?,
                ))
            })
            .transpose()?;
        let pitr = match spec.opt_object("pointInTimeRecoverySpecification")? {
            Some(o) => Some(o.opt_bool("pointInTimeRecoveryEnabled")?.unwrap_or(false)),
            None => None,
        };
        let sse = spec
            .opt_object("sseSpecification")?
            .map(|o| -> Result<Sse> {
                Ok(Sse {
                    enabled: o.get_bool("sseEnabled")?,
                    kind: o.opt_str("sseType")?.map(str::to_owned),
                    key: o.opt_str("kmsMasterKeyId")?.map(str::to_owned),
                })
            })
            .transpose()?;
        Ok(Settings {
            name,
            attributes,
            keys: keys_of(&spec.get_list("keySchema")?)?,
            billing,
            throughput,
            gsis: indexes_of(spec, "globalSecondaryIndexes")?,
            lsis: indexes_of(spec, "localSecondaryIndexes")?,
            stream: spec
                .opt_object("streamSpecification")?
                .map(|o| o.get_str("streamViewType").map(str::to_owned))
                .transpose()?,
            ttl,
            pitr,
            sse,
            table_class: spec.opt_str("tableClass")?.map(str::to_owned),
            deletion_protection: spec.opt_bool("deletionProtectionEnabled")?,
        })
    }

    /// The settings AWS reports.
    fn observed(
        d: &t::TableDescription,
        ttl: Option<&t::TimeToLiveDescription>,
        pitr: bool,
    ) -> Settings {
        let keys = |ks: &[t::KeySchemaElement]| -> Vec<Key> {
            ks.iter()
                .map(|k| Key {
                    name: k.attribute_name().to_owned(),
                    kind: k.key_type().as_str().to_owned(),
                })
                .collect()
        };
        let projection = |p: Option<&t::Projection>| match p {
            None => Projection::all(),
            Some(p) => Projection {
                kind: p
                    .projection_type()
                    .map_or("ALL", t::ProjectionType::as_str)
                    .to_owned(),
                non_key: p.non_key_attributes().to_vec(),
            },
        };
        let throughput = |p: Option<&t::ProvisionedThroughputDescription>| {
            p.map(|p| Throughput {
                read: p.read_capacity_units().unwrap_or(0),
                write: p.write_capacity_units().unwrap_or(0),
            })
        };
        // Tables made before on-demand existed have no summary: they are PROVISIONED.
        let billing = d
            .billing_mode_summary()
            .and_then(t::BillingModeSummary::billing_mode)
            .map_or(PROVISIONED, t::BillingMode::as_str)
            .to_owned();
        let provisioned = billing == PROVISIONED;
        let ttl = ttl.and_then(|t| {
            let on = matches!(
                t.time_to_live_status(),
                Some(t::TimeToLiveStatus::Enabled | t::TimeToLiveStatus::Enabling)
            );
            t.attribute_name().map(|a| (a.to_owned(), on))
        });
        let sse = d.sse_description().filter(|s| {
            matches!(
                s.status(),
                Some(t::SseStatus::Enabled | t::SseStatus::Enabling | t::SseStatus::Updating)
            )
        });
        Settings {
            name: d.table_name().unwrap_or_default().to_owned(),
            attributes: d
                .attribute_definitions()
                .iter()
                .map(|a| {
                    (
                        a.attribute_name().to_owned(),
                        a.attribute_type().as_str().to_owned(),
                    )
                })
                .collect(),
            keys: keys(d.key_schema()),
            throughput: if provisioned {
                throughput(d.provisioned_throughput())
            } else {
                None
            },
            billing,
            gsis: d
                .global_secondary_indexes()
                .iter()
                .map(|i| Index {
                    name: i.index_name().unwrap_or_default().to_owned(),
                    keys: keys(i.key_schema()),
                    projection: projection(i.projection()),
                    throughput: if provisioned {
                        throughput(i.provisioned_throughput())
                    } else {
                        None
                    },
                })
                .collect(),
            lsis: d
                .local_secondary_indexes()
                .iter()
                .map(|i| Index {
                    name: i.index_name().unwrap_or_default().to_owned(),
                    keys: keys(i.key_schema()),
                    projection: projection(i.projection()),
                    throughput: None,
                })
                .collect(),
            stream: d
                .stream_specification()
                .filter(|s| s.stream_enabled())
                .map(|s| {
                    s.stream_view_type()
                        .map_or("NEW_AND_OLD_IMAGES", t::StreamViewType::as_str)
                        .to_owned()
                }),
            ttl,
            pitr: Some(pitr),
            sse: Some(Sse {
                enabled: sse.is_some(),
                kind: sse
                    .and_then(t::SseDescription::sse_type)
                    .map(|k| k.as_str().to_owned()),
                key: sse
                    .and_then(t::SseDescription::kms_master_key_arn)
                    .map(str::to_owned),
            }),
            // No summary means STANDARD, the class every table had before classes existed.
            table_class: Some(
                d.table_class_summary()
                    .and_then(t::TableClassSummary::table_class)
                    .map_or("STANDARD", t::TableClass::as_str)
                    .to_owned(),
            ),
            deletion_protection: Some(d.deletion_protection_enabled().unwrap_or(false)),
        }
    }

    /// The attributes the keys of the table and of `gsis` use.
    fn used_attributes<'a>(&'a self, gsis: impl Iterator<Item = &'a Index>) -> HashSet<&'a str> {
        self.keys
            .iter()
            .chain(self.lsis.iter().flat_map(|i| &i.keys))
            .chain(gsis.flat_map(|i| &i.keys))
            .map(|k| k.name.as_str())
            .collect()
    }

    /// The definitions of the attributes `used` names. DynamoDB keeps (and accepts) only
    /// the attributes some key uses; a blueprint may define more, as the specification's
    /// example does (validation warns about them).
    fn definitions(&self, used: &HashSet<&str>) -> Result<Vec<t::AttributeDefinition>> {
        let mut out = Vec::new();
        for name in used {
            let Some((_, ty)) = self.attributes.iter().find(|(a, _)| a == name) else {
                return Err(PluginError::bad_input(format!(
                    "key attribute `{name}` is not in `attributeDefinitions`"
                ))
                .at("attributeDefinitions"));
            };
            out.push(built(
                t::AttributeDefinition::builder()
                    .attribute_name(*name)
                    .attribute_type(t::ScalarAttributeType::from(ty.as_str()))
                    .build(),
            )?);
        }
        out.sort_by(|a, b| a.attribute_name().cmp(b.attribute_name()));
        Ok(out)
    }
}

fn built<T>(r: std::result::Result<T, BuildError>) -> Result<T> {
    r.map_err(|e| PluginError::internal(format!("building a DynamoDB request: {e}")))
}

fn key_schema(keys: &[Key]) -> Result<Vec<t::KeySchemaElement>> {
    keys.iter()
        .map(|k| {
            built(
                t::KeySchemaElement::builder()
                    .attribute_name(&k.name)
                    .key_type(t::KeyType::from(k.kind.as_str()))
                    .build(),
            )
        })
        .collect()
}

fn projection(p: &Projection) -> t::Projection {
    t::Projection::builder()
        .projection_type(t::ProjectionType::from(p.kind.as_str()))
        .set_non_key_attributes((!p.non_key.is_empty()).then(|| p.non_key.clone()))
        .build()
}

fn throughput(tp: Throughput) -> Result<t::ProvisionedThroughput> {
    built(
        t::ProvisionedThroughput::builder()
            .read_capacity_units(tp.read)
            .write_capacity_units(tp.write)
            .build(),
    )
}

/// The throughput a PROVISIONED table or index needs.
fn needed(tp: Option<Throughput>, path: AttrPath) -> Result<Throughput> {
    tp.ok_or_else(|| {
        PluginError::bad_input("`billingMode` PROVISIONED needs `provisionedThroughput`").at(path)
    })
}

fn sse_spec(s: &Sse) -> t::SseSpecification {
    t::SseSpecification::builder()
        .enabled(s.enabled)
        .set_sse_type(s.kind.as_deref().map(t::SseType::from))
        .set_kms_master_key_id(s.key.clone())
        .build()
}

fn stream_spec(view: Option<&str>) -> Result<t::StreamSpecification> {
    built(
        t::StreamSpecification::builder()
            .stream_enabled(view.is_some())
            .set_stream_view_type(view.map(t::StreamViewType::from))
            .build(),
    )
}

fn gsi_path(want: &Settings, name: &str) -> AttrPath {
    let root = AttrPath::root().field("globalSecondaryIndexes");
    match want.gsis.iter().position(|i| i.name == name) {
        Some(n) => root.index(n as u64),
        None => root,
    }
}

async fn describe(c: &Clients, name: &str) -> Result<Option<t::TableDescription>> {
    match c.dynamodb.describe_table().table_name(name).send().await {
        Ok(out) => Ok(out.table),
        Err(e) => {
            let e = sdk(format!("reading table {name}"), e);
            if e.class == ErrorClass::NotFound {
                Ok(None)
            } else {
                Err(e)
            }
        }
    }
}

async fn tags_of(c: &Clients, arn: &str) -> Result<Vec<(String, String)>> {
    let mut tags = Vec::new();
    let mut next: Option<String> = None;
    loop {
        let out = c
            .dynamodb
            .list_tags_of_resource()
            .resource_arn(arn)
            .set_next_token(next.take())
            .send()
            .await
            .map_err(|e| sdk(format!("reading the tags of table {arn}"), e))?;
        tags.extend(
            out.tags()
                .iter()
                .map(|t| (t.key().to_owned(), t.value().to_owned())),
        );
        match out.next_token() {
            Some(n) if !n.is_empty() => next = Some(n.to_owned()),
            _ => break,
        }
    }
    tags.sort();
    Ok(tags)
}

async fn ttl_of(c: &Clients, name: &str) -> Result<Option<t::TimeToLiveDescription>> {
    let out = c
        .dynamodb
        .describe_time_to_live()
        .table_name(name)
        .send()
        .await
        .map_err(|e| sdk(format!("reading the TTL of table {name}"), e))?;
    Ok(out.time_to_live_description)
}

async fn pitr_of(c: &Clients, name: &str) -> Result<bool> {
    let out = c
        .dynamodb
        .describe_continuous_backups()
        .table_name(name)
        .send()
        .await
        .map_err(|e| sdk(format!("reading the backups of table {name}"), e))?;
    Ok(out
        .continuous_backups_description()
        .and_then(t::ContinuousBackupsDescription::point_in_time_recovery_description)
        .and_then(t::PointInTimeRecoveryDescription::point_in_time_recovery_status)
        == Some(&t::PointInTimeRecoveryStatus::Enabled))
}

/// Waits until the table and all its indexes are ACTIVE.
async fn wait_active(ctx: &Context, c: &Clients, name: &str) -> Result<t::TableDescription> {
    let start = Instant::now();
    let mut delay = Duration::from_secs(1);
    loop {
        let Some(d) = describe(c, name).await? else {
            return Err(PluginError::not_found(format!(
                "table {name} disappeared while waiting for it to become ACTIVE"
            )));
        };
        let status = d.table_status().map_or("UNKNOWN", t::TableStatus::as_str);
        let busy = d
            .global_secondary_indexes()
            .iter()
            .find(|i| i.index_status() != Some(&t::IndexStatus::Active));
        match status {
            "ACTIVE" if busy.is_none() => return Ok(d),
            "DELETING" => {
                return Err(PluginError::conflict(format!(
                    "table {name} is being deleted"
                )));
            }
            "INACCESSIBLE_ENCRYPTION_CREDENTIALS" | "ARCHIVING" | "ARCHIVED" => {
                return Err(PluginError::conflict(format!(
                    "table {name} is {status}: its KMS key is not accessible"
                )));
            }
            _ => {}
        }
        let what = match busy {
            Some(i) => format!(
                "index {} of table {name} ({})",
                i.index_name().unwrap_or("?"),
                i.index_status().map_or("?", t::IndexStatus::as_str)
            ),
            None => format!("table {name} ({status})"),
        };
        if start.elapsed() >= ACTIVE_WAIT {
            return Err(PluginError::transient(format!(
                "{what} did not become ACTIVE within {} minutes",
                ACTIVE_WAIT.as_secs() / 60
            )));
        }
        ctx.progress(format!("waiting for {what} to become ACTIVE"), None);
        ctx.sleep(delay).await?;
        delay = (delay * 2).min(MAX_POLL);
    }
}

async fn wait_gone(ctx: &Context, c: &Clients, name: &str) -> Result<()> {
    let start = Instant::now();
    let mut delay = Duration::from_secs(1);
    while describe(c, name).await?.is_some() {
        if start.elapsed() >= DELETE_WAIT {
            return Err(PluginError::transient(format!(
                "table {name} is still being deleted after {} minutes",
                DELETE_WAIT.as_secs() / 60
            )));
        }
        ctx.progress(format!("waiting for table {name} to be deleted"), None);
        ctx.sleep(delay).await?;
        delay = (delay * 2).min(MAX_POLL);
    }
    Ok(())
}

/// Everything AWS reports about the table.
async fn observe(c: &Clients, d: &t::TableDescription) -> Result<Settings> {
    let name = d.table_name().unwrap_or_default();
    let ttl = ttl_of(c, name).await?;
    let pitr = pitr_of(c, name).await?;
    Ok(Settings::observed(d, ttl.as_ref(), pitr))
}

fn state(d: &t::TableDescription) -> Value {
    let mut s = Value::map();
    common::put(&mut s, "arn", d.table_arn());
    if d.stream_specification().is_some_and(|s| s.stream_enabled()) {
        common::put(&mut s, "streamArn", d.latest_stream_arn());
    }
    s
}

/// `want`'s value of a setting, else AWS's default when the previous spec set it (a field
/// the spec dropped goes back to the default), else nothing to do.
fn target<T: Clone>(want: Option<&T>, before_had: bool, default: T) -> Option<T> {
    want.cloned().or_else(|| before_had.then_some(default))
}

/// One UpdateTable and the wait for ACTIVE after it.
async fn update_table(
    ctx: &Context,
    c: &Clients,
    name: &str,
    what: &str,
    call: aws_sdk_dynamodb::operation::update_table::builders::UpdateTableFluentBuilder,
) -> Result<t::TableDescription> {
    ctx.progress(format!("table {name}: {what}"), None);
    call.table_name(name)
        .send()
        .await
        .map_err(|e| sdk(format!("updating table {name} ({what})"), e))?;
    wait_active(ctx, c, name).await
}

/// Makes table `want.name` match `want`, each kind of change in its own call.
async fn converge(
    ctx: &Context,
    c: &Clients,
    want: &Settings,
    before: Option<&Settings>,
    tags: &[(String, String)],
) -> Result<t::TableDescription> {
    let name = want.name.as_str();
    let mut d = wait_active(ctx, c, name).await?;
    let obs = observe(c, &d).await?;
    let had = |f: fn(&Settings) -> bool| before.is_some_and(f);

    // The type of a key attribute is part of the table; changing it takes a new table.
    for (attr, ty) in &obs.attributes {
        if obs.keys.iter().any(|k| &k.name == attr)
            && let Some((_, want_ty)) = want.attributes.iter().find(|(a, _)| a == attr)
            && want_ty != ty
        {
            return Err(PluginError::bad_input(format!(
                "key attribute `{attr}` of table {name} is of type {ty}; changing its type needs a new table (change `tableName` to replace it)"
            ))
            .at("attributeDefinitions"));
        }
    }

    // Indexes that went away, or whose keys or projection changed (DynamoDB cannot change
    // those in place): delete them, one per call.
    let mut kept: Vec<Index> = Vec::new();
    for idx in &obs.gsis {
        let same = want
            .gsis
            .iter()
            .find(|w| w.name == idx.name)
            .is_some_and(|w| w.keys == idx.keys && w.projection.same(&idx.projection));
        if same {
            kept.push(idx.clone());
            continue;
        }
        let action = built(
            t::DeleteGlobalSecondaryIndexAction::builder()
                .index_name(&idx.name)
                .build(),
        )?;
        d = update_table(
            ctx,
            c,
            name,
            &format!("deleting index {}", idx.name),
            c.dynamodb.update_table().global_secondary_index_updates(
                t::GlobalSecondaryIndexUpdate::builder()
                    .delete(action)
                    .build(),
            ),
        )
        .await?;
    }

    // Billing mode and throughput, of the table and the indexes it keeps (switching to
    // PROVISIONED needs the throughput of every index in the same call).
    let switching = want.billing != obs.billing;
    let provisioned = want.billing == PROVISIONED;
    let table_tp = if provisioned && (switching || want.throughput != obs.throughput) {
        Some(needed(want.throughput, "provisionedThroughput".into())?)
    } else {
        None
    };
    let mut index_tp = Vec::new();
    if provisioned {
        for idx in &kept {
            let Some(w) = want.gsis.iter().find(|w| w.name == idx.name) else {
                continue;
            };
            if switching || w.throughput != idx.throughput {
                let tp = needed(
                    w.throughput,
                    gsi_path(want, &w.name).field("provisionedThroughput"),
                )?;
                index_tp.push(
                    t::GlobalSecondaryIndexUpdate::builder()
                        .update(built(
                            t::UpdateGlobalSecondaryIndexAction::builder()
                                .index_name(&w.name)
                                .provisioned_throughput(throughput(tp)?)
                                .build(),
                        )?)
                        .build(),
                );
            }
        }
    }
    if switching || table_tp.is_some() || !index_tp.is_empty() {
        let mut call = c
            .dynamodb
            .update_table()
            .set_provisioned_throughput(table_tp.map(throughput).transpose()?)
            .set_global_secondary_index_updates((!index_tp.is_empty()).then_some(index_tp));
        if switching {
            call = call.billing_mode(t::BillingMode::from(want.billing.as_str()));
        }
        d = update_table(ctx, c, name, "changing billing mode and throughput", call).await?;
    }

    // New indexes, one per call, with the definitions of every key attribute in use.
    let mut present: Vec<&Index> = want
        .gsis
        .iter()
        .filter(|w| kept.iter().any(|k| k.name == w.name))
        .collect();
    for w in &want.gsis {
        if present.iter().any(|p| p.name == w.name) {
            continue;
        }
        present.push(w);
        let defs = want.definitions(&want.used_attributes(present.iter().copied()))?;
        let mut action = t::CreateGlobalSecondaryIndexAction::builder()
            .index_name(&w.name)
            .set_key_schema(Some(key_schema(&w.keys)?))
            .projection(projection(&w.projection));
        if provisioned {
            let tp = needed(
                w.throughput,
                gsi_path(want, &w.name).field("provisionedThroughput"),
            )?;
            action = action.provisioned_throughput(throughput(tp)?);
        }
        d = update_table(
            ctx,
            c,
            name,
            &format!("creating index {}", w.name),
            c.dynamodb
                .update_table()
                .set_attribute_definitions(Some(defs))
                .global_secondary_index_updates(
                    t::GlobalSecondaryIndexUpdate::builder()
                        .create(built(action.build())?)
                        .build(),
                ),
        )
        .await?;
    }

    // Streams: a view type cannot change while on, so off first, then on again.
    let stream = target(
        want.stream.as_ref().map(Some).as_ref(),
        had(|b| b.stream.is_some()),
        None,
    );
    if let Some(stream) = stream
        && stream.map(String::as_str) != obs.stream.as_deref()
    {
        if obs.stream.is_some() {
            d = update_table(
                ctx,
                c,
                name,
                "turning the stream off",
                c.dynamodb
                    .update_table()
                    .stream_specification(stream_spec(None)?),
            )
            .await?;
        }
        if let Some(view) = stream {
            d = update_table(
                ctx,
                c,
                name,
                "turning the stream on",
                c.dynamodb
                    .update_table()
                    .stream_specification(stream_spec(Some(view))?),
            )
            .await?;
        }
    }

    // Encryption: AWS reports the key's ARN where a blueprint may name an alias, so a
    // change is what the spec changed (or, adopting, a different on/off).
    let obs_sse_on = obs.sse.as_ref().is_some_and(|s| s.enabled);
    let sse = match (&want.sse, before.and_then(|b| b.sse.as_ref())) {
        (Some(w), Some(b)) if w != b => Some(w.clone()),
        (Some(w), None) if w.enabled != obs_sse_on => Some(w.clone()),
        (None, Some(_)) if obs_sse_on => Some(Sse {
            enabled: false,
            kind: None,
            key: None,
        }),
        _ => None,
    };
    if let Some(s) = sse {
        d = update_table(
            ctx,
            c,
            name,
            "changing encryption",
            c.dynamodb.update_table().sse_specification(sse_spec(&s)),
        )
        .await?;
    }

    let class = target(
        want.table_class.as_ref(),
        had(|b| b.table_class.is_some()),
        "STANDARD".to_owned(),
    );
    if let Some(class) = class
        && Some(&class) != obs.table_class.as_ref()
    {
        d = update_table(
            ctx,
            c,
            name,
            "changing the table class",
            c.dynamodb
                .update_table()
                .table_class(t::TableClass::from(class.as_str())),
        )
        .await?;
    }

    let protection = target(
        want.deletion_protection.as_ref(),
        had(|b| b.deletion_protection.is_some()),
        false,
    );
    if let Some(p) = protection
        && Some(p) != obs.deletion_protection
    {
        d = update_table(
            ctx,
            c,
            name,
            "changing deletion protection",
            c.dynamodb.update_table().deletion_protection_enabled(p),
        )
        .await?;
    }

    // TTL has its own call; its attribute changes only while TTL is off.
    let ttl = match (&want.ttl, before.and_then(|b| b.ttl.as_ref())) {
        (Some(w), _) => Some(w.clone()),
        (None, Some((attr, _))) => Some((attr.clone(), false)),
        (None, None) => None,
    };
    if let Some((attr, on)) = ttl {
        let current = obs.ttl.clone().filter(|(_, on)| *on);
        let set = |attr: &str, on: bool| {
            built(
                t::TimeToLiveSpecification::builder()
                    .attribute_name(attr)
                    .enabled(on)
                    .build(),
            )
        };
        if let Some((cur, _)) = &current
            && (!on || cur != &attr)
        {
            ctx.progress(format!("table {name}: turning TTL off"), None);
            c.dynamodb
                .update_time_to_live()
                .table_name(name)
                .time_to_live_specification(set(cur, false)?)
                .send()
                .await
                .map_err(|e| sdk(format!("turning TTL of table {name} off"), e))?;
        }
        if on && current.as_ref().is_none_or(|(cur, _)| cur != &attr) {
            ctx.progress(format!("table {name}: turning TTL on"), None);
            c.dynamodb
                .update_time_to_live()
                .table_name(name)
                .time_to_live_specification(set(&attr, true)?)
                .send()
                .await
                .map_err(|e| {
                    sdk(format!("turning TTL of table {name} on"), e).at("timeToLiveSpecification")
                })?;
        }
    }

    let pitr = target(want.pitr.as_ref(), had(|b| b.pitr.is_some()), false);
    if let Some(p) = pitr
        && Some(p) != obs.pitr
    {
        set_pitr(ctx, c, name, p).await?;
    }

    let arn = d.table_arn().unwrap_or_default().to_owned();
    let have = tags_of(c, &arn).await?;
    let (set, mut remove) = common::tag_diff(&have, tags);
    // A changed value is removed first: some emulators (moto) add a second tag of the same
    // key instead of replacing it; AWS does either way.
    remove.extend(
        set.iter()
            .filter(|(k, _)| have.iter().any(|(h, _)| h == k))
            .map(|(k, _)| k.clone()),
    );
    if !remove.is_empty() {
        c.dynamodb
            .untag_resource()
            .resource_arn(&arn)
            .set_tag_keys(Some(remove))
            .send()
            .await
            .map_err(|e| sdk(format!("untagging table {name}"), e))?;
    }
    if !set.is_empty() {
        let tags = set
            .into_iter()
            .map(|(k, v)| built(t::Tag::builder().key(k).value(v).build()))
            .collect::<Result<Vec<_>>>()?;
        c.dynamodb
            .tag_resource()
            .resource_arn(&arn)
            .set_tags(Some(tags))
            .send()
            .await
            .map_err(|e| sdk(format!("tagging table {name}"), e))?;
    }
    Ok(d)
}

/// Point-in-time recovery. Right after a table is created, AWS may still be turning its
/// continuous backups on and answers ContinuousBackupsUnavailableException: wait and retry.
async fn set_pitr(ctx: &Context, c: &Clients, name: &str, on: bool) -> Result<()> {
    let start = Instant::now();
    let mut delay = Duration::from_secs(1);
    loop {
        ctx.progress(
            format!(
                "table {name}: turning point-in-time recovery {}",
                if on { "on" } else { "off" }
            ),
            None,
        );
        let spec = built(
            t::PointInTimeRecoverySpecification::builder()
                .point_in_time_recovery_enabled(on)
                .build(),
        )?;
        match c
            .dynamodb
            .update_continuous_backups()
            .table_name(name)
            .point_in_time_recovery_specification(spec)
            .send()
            .await
        {
            Ok(_) => return Ok(()),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_continuous_backups_unavailable_exception())
                    && start.elapsed() < ACTIVE_WAIT =>
            {
                ctx.sleep(delay).await?;
                delay = (delay * 2).min(MAX_POLL);
            }
            Err(e) => {
                return Err(sdk(
                    format!("setting point-in-time recovery of table {name}"),
                    e,
                ));
            }
        }
    }
}

async fn create_table(c: &Clients, want: &Settings, tags: &[(String, String)]) -> Result<()> {
    let name = want.name.as_str();
    let provisioned = want.billing == PROVISIONED;
    let defs = want.definitions(&want.used_attributes(want.gsis.iter()))?;
    let mut gsis = Vec::new();
    for (n, g) in want.gsis.iter().enumerate() {
        let mut b = t::GlobalSecondaryIndex::builder()
            .index_name(&g.name)
            .set_key_schema(Some(key_schema(&g.keys)?))
            .projection(projection(&g.projection));
        if provisioned {
            let path = AttrPath::root()
                .field("globalSecondaryIndexes")
                .index(n as u64)
                .field("provisionedThroughput");
            b = b.provisioned_throughput(throughput(needed(g.throughput, path)?)?);
        }
        gsis.push(built(b.build())?);
    }
    let mut lsis = Vec::new();
    for l in &want.lsis {
        lsis.push(built(
            t::LocalSecondaryIndex::builder()
                .index_name(&l.name)
                .set_key_schema(Some(key_schema(&l.keys)?))
                .projection(projection(&l.projection))
                .build(),
        )?);
    }
    let tags = tags
        .iter()
        .map(|(k, v)| built(t::Tag::builder().key(k).value(v).build()))
        .collect::<Result<Vec<_>>>()?;
    let mut call = c
        .dynamodb
        .create_table()
        .table_name(name)
        .set_attribute_definitions(Some(defs))
        .set_key_schema(Some(key_schema(&want.keys)?))
        .billing_mode(t::BillingMode::from(want.billing.as_str()))
        .set_global_secondary_indexes((!gsis.is_empty()).then_some(gsis))
        .set_local_secondary_indexes((!lsis.is_empty()).then_some(lsis))
        .set_sse_specification(want.sse.as_ref().map(sse_spec))
        .set_table_class(want.table_class.as_deref().map(t::TableClass::from))
        .set_deletion_protection_enabled(want.deletion_protection)
        .set_tags(Some(tags));
    if provisioned {
        call = call.provisioned_throughput(throughput(needed(
            want.throughput,
            "provisionedThroughput".into(),
        )?)?);
    }
    if let Some(view) = &want.stream {
        call = call.stream_specification(stream_spec(Some(view))?);
    }
    call.send()
        .await
        .map_err(|e| sdk(format!("creating table {name}"), e))?;
    Ok(())
}

/// `items` ordered as the names in `order` (those not there last, in their order).
fn ordered<T>(mut items: Vec<T>, order: &[&str], name: impl Fn(&T) -> &str) -> Vec<T> {
    items.sort_by_key(|i| {
        order
            .iter()
            .position(|o| *o == name(i))
            .unwrap_or(usize::MAX)
    });
    items
}

/// The names at `key` of each element of list `field` of a spec.
fn names<'a>(spec: &Spec<'a>, field: &str, key: &str) -> Vec<&'a str> {
    spec.get(field)
        .and_then(Value::as_list)
        .unwrap_or_default()
        .iter()
        .filter_map(|v| v.get(key).and_then(Value::as_str))
        .collect()
}

fn keys_value(keys: &[Key]) -> Value {
    Value::List(
        keys.iter()
            .map(|k| {
                Value::map()
                    .with("attributeName", k.name.as_str())
                    .with("keyType", k.kind.as_str())
            })
            .collect(),
    )
}

fn throughput_value(tp: Throughput) -> Value {
    Value::map()
        .with("readCapacityUnits", tp.read)
        .with("writeCapacityUnits", tp.write)
}

fn indexes_value(indexes: &[Index], applied: &Spec<'_>, field: &str) -> Value {
    let order = names(applied, field, "indexName");
    let indexes = ordered(indexes.to_vec(), &order, |i| i.name.as_str());
    Value::List(
        indexes
            .iter()
            .map(|i| {
                let mut p = Value::map().with("projectionType", i.projection.kind.as_str());
                if !i.projection.non_key.is_empty() {
                    p.insert("nonKeyAttributes", i.projection.non_key.clone());
                }
                let mut v = Value::map()
                    .with("indexName", i.name.as_str())
                    .with("keySchema", keys_value(&i.keys))
                    .with("projection", p);
                common::put(
                    &mut v,
                    "provisionedThroughput",
                    i.throughput.map(throughput_value),
                );
                v
            })
            .collect(),
    )
}

/// The spec as AWS reports it, in the blueprint's shapes and order.
fn spec_of(obs: &Settings, tags: &[(String, String)], applied: &Spec<'_>) -> Value {
    let mut spec = Value::map().with("tableName", obs.name.as_str());

    // AWS keeps only the definitions of key attributes; those the blueprint defines
    // beyond them cannot differ from anything, so they read back as written.
    let order = names(applied, "attributeDefinitions", "attributeName");
    let mut attrs = ordered(obs.attributes.clone(), &order, |(n, _)| n.as_str());
    let used: HashSet<&str> = obs.used_attributes(obs.gsis.iter());
    if let Some(list) = applied.get("attributeDefinitions").and_then(Value::as_list) {
        for a in list {
            if let (Some(n), Some(ty)) = (
                a.get("attributeName").and_then(Value::as_str),
                a.get("attributeType").and_then(Value::as_str),
            ) && !used.contains(n)
                && !attrs.iter().any(|(x, _)| x == n)
            {
                attrs.push((n.to_owned(), ty.to_owned()));
            }
        }
        attrs = ordered(attrs, &order, |(n, _)| n.as_str());
    }
    spec.insert(
        "attributeDefinitions",
        Value::List(
            attrs
                .iter()
                .map(|(n, ty)| {
                    Value::map()
                        .with("attributeName", n.as_str())
                        .with("attributeType", ty.as_str())
                })
                .collect(),
        ),
    );
    spec.insert("keySchema", keys_value(&obs.keys));
    spec.insert("billingMode", obs.billing.as_str());
    common::put(
        &mut spec,
        "provisionedThroughput",
        obs.throughput.map(throughput_value),
    );
    for (field, list) in [
        ("globalSecondaryIndexes", &obs.gsis),
        ("localSecondaryIndexes", &obs.lsis),
    ] {
        if !list.is_empty() || applied.get(field).is_some() {
            spec.insert(field, indexes_value(list, applied, field));
        }
    }
    if let Some(view) = &obs.stream {
        spec.insert(
            "streamSpecification",
            Value::map().with("streamViewType", view.as_str()),
        );
    }
    let applied_ttl = applied.get("timeToLiveSpecification");
    match &obs.ttl {
        Some((attr, true)) => spec.insert(
            "timeToLiveSpecification",
            Value::map()
                .with("attributeName", attr.as_str())
                .with("enabled", true),
        ),
        _ if applied_ttl.is_some() => {
            let attr = obs
                .ttl
                .as_ref()
                .map(|(a, _)| a.as_str())
                .or_else(|| {
                    applied_ttl
                        .and_then(|t| t.get("attributeName"))
                        .and_then(Value::as_str)
                })
                .unwrap_or_default();
            spec.insert(
                "timeToLiveSpecification",
                Value::map()
                    .with("attributeName", attr)
                    .with("enabled", false),
            )
        }
        _ => false,
    };
    if obs.pitr == Some(true) || applied.get("pointInTimeRecoverySpecification").is_some() {
        spec.insert(
            "pointInTimeRecoverySpecification",
            Value::map().with("pointInTimeRecoveryEnabled", obs.pitr == Some(true)),
        );
    }
    let applied_sse = applied.get("sseSpecification");
    if let Some(sse) = &obs.sse
        && (sse.enabled || applied_sse.is_some())
    {
        let mut v = Value::map().with("sseEnabled", sse.enabled);
        if sse.enabled {
            // AWS reports the key's ARN; the blueprint may name it by id or alias, which
            // cannot be told apart from here: the blueprint's name stands while a key is set.
            let from_applied = |k: &str| applied_sse.and_then(|s| s.get(k)).cloned();
            if let Some(kind) = &sse.kind
                && from_applied("sseType").is_some()
            {
                v.insert("sseType", kind.as_str());
            }
            if sse.key.is_some()
                && let Some(k) = from_applied("kmsMasterKeyId")
            {
                v.insert("kmsMasterKeyId", k);
            }
        }
        spec.insert("sseSpecification", v);
    }
    common::put(&mut spec, "tableClass", obs.table_class.as_deref());
    common::put(
        &mut spec,
        "deletionProtectionEnabled",
        obs.deletion_protection,
    );
    common::put(&mut spec, "tags", common::tags_value(tags, applied));
    spec
}

/// The table's name: the id the engine recorded, else the one the spec gives.
fn table_name(ctx: &Context, current: &ResourceState) -> Result<String> {
    if current.external_id.is_empty() {
        common::physical_name(
            ctx,
            &current.spec(),
            "tableName",
            &current.name,
            MAX_NAME,
            NameStyle::Standard,
        )
    } else {
        Ok(current.external_id.clone())
    }
}

fn valid_name(n: &str) -> bool {
    (3..=MAX_NAME).contains(&n.len())
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

fn items(v: Option<&Value>) -> &[Value] {
    v.and_then(Value::as_list).unwrap_or_default()
}

fn text<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// Checks a key schema at `path`: one HASH key, then at most one RANGE key, each of a
/// defined attribute.
fn check_keys(path: &AttrPath, keys: &[Value], defined: &[&str], out: &mut Vec<Diagnostic>) {
    if keys.is_empty() || keys.len() > 2 {
        out.push(
            Diagnostic::error(
                "aws.dynamodb.key-schema",
                format!(
                    "`{path}` has {} keys; it takes a HASH key and at most one RANGE key",
                    keys.len()
                ),
            )
            .at(path),
        );
    }
    for (i, k) in keys.iter().enumerate() {
        let at = path.join_index(i);
        let want = if i == 0 { "HASH" } else { "RANGE" };
        if let Some(kind) = text(k, "keyType")
            && kind != want
            && i < 2
        {
            out.push(
                Diagnostic::error(
                    "aws.dynamodb.key-schema",
                    format!(
                        "`{at}.keyType` is {kind}; the first key is the HASH (partition) key and the second the RANGE (sort) key"
                    ),
                )
                .at(at.join("keyType")),
            );
        }
        if let Some(attr) = text(k, "attributeName") {
            if !defined.contains(&attr) {
                out.push(
                    Diagnostic::error(
                        "aws.dynamodb.undefined-attribute",
                        format!("key attribute `{attr}` is not in `attributeDefinitions`"),
                    )
                    .at(at.join("attributeName"))
                    .hint(format!(
                        "add {{attributeName: {attr}, attributeType: S|N|B}} to `attributeDefinitions`"
                    )),
                );
            }
            if keys[..i]
                .iter()
                .any(|p| text(p, "attributeName") == Some(attr))
            {
                out.push(
                    Diagnostic::error(
                        "aws.dynamodb.key-schema",
                        format!("`{attr}` is both keys of `{path}`"),
                    )
                    .at(at.join("attributeName")),
                );
            }
        }
    }
}

fn check_throughput(v: &Value, path: &AttrPath, out: &mut Vec<Diagnostic>) {
    for f in ["readCapacityUnits", "writeCapacityUnits"] {
        if let Some(n) = v.get(f).and_then(Value::as_i64)
            && n < 1
        {
            out.push(
                Diagnostic::error(
                    "aws.out-of-range",
                    format!("`{path}.{f}` is {n}; it must be at least 1"),
                )
                .at(path.join(f)),
            );
        }
    }
}

fn check(spec: &Value) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let root = AttrPath::root();
    if let Some(n) = text(spec, "tableName")
        && !valid_name(n)
    {
        out.push(
            Diagnostic::error(
                "aws.dynamodb.invalid-name",
                format!("`tableName` \"{n}\" must be 3 to 255 letters, digits, `_`, `-` or `.`"),
            )
            .at("tableName"),
        );
    }

    let defs = items(spec.get("attributeDefinitions"));
    let defined: Vec<&str> = defs
        .iter()
        .filter_map(|d| text(d, "attributeName"))
        .collect();
    for (i, d) in defs.iter().enumerate() {
        if let Some(n) = text(d, "attributeName")
            && defs[..i]
                .iter()
                .any(|p| text(p, "attributeName") == Some(n))
        {
            out.push(
                Diagnostic::error(
                    "aws.dynamodb.duplicate-attribute",
                    format!("attribute `{n}` is defined twice"),
                )
                .at(root
                    .join("attributeDefinitions")
                    .join_index(i)
                    .join("attributeName")),
            );
        }
    }

    let keys = items(spec.get("keySchema"));
    if spec.get("keySchema").is_some_and(|k| !k.is_unknown()) {
        check_keys(&root.join("keySchema"), keys, &defined, &mut out);
    }
    let hash = keys.first().and_then(|k| text(k, "attributeName"));
    let has_range = keys.len() > 1;

    let billing = text(spec, "billingMode");
    let tp = spec.get("provisionedThroughput").filter(|v| !v.is_null());
    if let Some(tp) = tp {
        check_throughput(tp, &root.join("provisionedThroughput"), &mut out);
    }
    match (billing, tp) {
        (Some(PAY_PER_REQUEST), Some(_)) => out.push(
            Diagnostic::error(
                "aws.dynamodb.billing-mode",
                "`provisionedThroughput` applies to `billingMode: PROVISIONED` only",
            )
            .at("provisionedThroughput"),
        ),
        (Some(PROVISIONED), None) => out.push(
            Diagnostic::error(
                "aws.dynamodb.billing-mode",
                "`billingMode: PROVISIONED` needs `provisionedThroughput`",
            )
            .at("billingMode"),
        ),
        _ => {}
    }
    let provisioned = billing == Some(PROVISIONED) || (billing.is_none() && tp.is_some());

    let mut used: Vec<&str> = keys
        .iter()
        .filter_map(|k| text(k, "attributeName"))
        .collect();
    let mut index_names: Vec<&str> = Vec::new();
    for (field, max) in [
        ("globalSecondaryIndexes", MAX_GSIS),
        ("localSecondaryIndexes", MAX_LSIS),
    ] {
        let list = items(spec.get(field));
        let lp = root.join(field);
        if list.len() > max {
            out.push(
                Diagnostic::error(
                    "aws.dynamodb.too-many-indexes",
                    format!(
                        "`{field}` has {} indexes; a table takes at most {max}",
                        list.len()
                    ),
                )
                .at(&lp),
            );
        }
        let global = field == "globalSecondaryIndexes";
        if !global && !list.is_empty() && !has_range && !keys.is_empty() {
            out.push(
                Diagnostic::error(
                    "aws.dynamodb.local-index",
                    "local secondary indexes need a table with a RANGE (sort) key",
                )
                .at(&lp),
            );
        }
        for (i, idx) in list.iter().enumerate() {
            let ip = lp.join_index(i);
            if let Some(n) = text(idx, "indexName") {
                if !valid_name(n) {
                    out.push(
                        Diagnostic::error(
                            "aws.dynamodb.invalid-name",
                            format!(
                                "index name \"{n}\" must be 3 to 255 letters, digits, `_`, `-` or `.`"
                            ),
                        )
                        .at(ip.join("indexName")),
                    );
                }
                if index_names.contains(&n) {
                    out.push(
                        Diagnostic::error(
                            "aws.dynamodb.duplicate-index",
                            format!("index `{n}` is declared twice"),
                        )
                        .at(ip.join("indexName")),
                    );
                }
                index_names.push(n);
            }
            let ikeys = items(idx.get("keySchema"));
            if idx.get("keySchema").is_some_and(|k| !k.is_unknown()) {
                check_keys(&ip.join("keySchema"), ikeys, &defined, &mut out);
            }
            used.extend(ikeys.iter().filter_map(|k| text(k, "attributeName")));
            if !global
                && let (Some(h), Some(ih)) =
                    (hash, ikeys.first().and_then(|k| text(k, "attributeName")))
                && h != ih
            {
                out.push(
                    Diagnostic::error(
                        "aws.dynamodb.local-index",
                        format!(
                            "a local secondary index has the table's HASH key (`{h}`), not `{ih}`"
                        ),
                    )
                    .at(ip.join("keySchema").join_index(0).join("attributeName")),
                );
            }
            if let Some(p) = idx.get("projection") {
                let kind = text(p, "projectionType").unwrap_or("ALL");
                let non_key = p.get("nonKeyAttributes").filter(|v| !v.is_null());
                let empty = non_key
                    .and_then(Value::as_list)
                    .is_some_and(<[Value]>::is_empty);
                if kind == "INCLUDE" && (non_key.is_none() || empty) {
                    out.push(
                        Diagnostic::error(
                            "aws.dynamodb.projection",
                            "`projectionType: INCLUDE` needs `nonKeyAttributes`",
                        )
                        .at(ip.join("projection").join("nonKeyAttributes")),
                    );
                } else if kind != "INCLUDE" && non_key.is_some() {
                    out.push(
                        Diagnostic::error(
                            "aws.dynamodb.projection",
                            format!("`nonKeyAttributes` applies to `projectionType: INCLUDE` only, not {kind}"),
                        )
                        .at(ip.join("projection").join("nonKeyAttributes")),
                    );
                }
            }
            if global {
                let itp = idx.get("provisionedThroughput").filter(|v| !v.is_null());
                match itp {
                    Some(v) if provisioned => {
                        check_throughput(v, &ip.join("provisionedThroughput"), &mut out);
                    }
                    Some(_) => out.push(
                        Diagnostic::error(
                            "aws.dynamodb.billing-mode",
                            "an index's `provisionedThroughput` applies to `billingMode: PROVISIONED` only",
                        )
                        .at(ip.join("provisionedThroughput")),
                    ),
                    None if provisioned => out.push(
                        Diagnostic::error(
                            "aws.dynamodb.billing-mode",
                            "with `billingMode: PROVISIONED` every global secondary index needs `provisionedThroughput`",
                        )
                        .at(&ip),
                    ),
                    None => {}
                }
            }
        }
    }

    // Definitions no key uses: AWS refuses them, so they are left out of the table.
    let all_known = spec.is_known();
    for (i, d) in defs.iter().enumerate() {
        if let Some(n) = text(d, "attributeName")
            && all_known
            && !used.contains(&n)
        {
            out.push(
                Diagnostic::warning(
                    "aws.dynamodb.unused-attribute",
                    format!(
                        "attribute `{n}` is not a key of the table or of an index; DynamoDB keeps only key attributes' definitions, so it is not sent"
                    ),
                )
                .at(root.join("attributeDefinitions").join_index(i)),
            );
        }
    }

    if let Some(sse) = spec.get("sseSpecification")
        && sse.get("sseEnabled").and_then(Value::as_bool) == Some(false)
    {
        for f in ["sseType", "kmsMasterKeyId"] {
            if sse.get(f).is_some_and(|v| !v.is_null()) {
                out.push(
                    Diagnostic::error(
                        "aws.dynamodb.sse",
                        format!("`sseSpecification.{f}` applies when `sseEnabled` is true"),
                    )
                    .at(root.join("sseSpecification").join(f)),
                );
            }
        }
    }
    out
}

fn keys_schema() -> Schema {
    Schema::object()
        .field(
            "attributeName",
            Field::string().required().describe("A defined attribute"),
        )
        .field(
            "keyType",
            Field::string()
                .required()
                .allowed(["HASH", "RANGE"])
                .describe("HASH (partition key, first) or RANGE (sort key)"),
        )
}

fn throughput_schema() -> Schema {
    Schema::object()
        .field(
            "readCapacityUnits",
            Field::integer().required().describe("Reads per second"),
        )
        .field(
            "writeCapacityUnits",
            Field::integer().required().describe("Writes per second"),
        )
}

fn projection_schema() -> Field {
    Field::object(
        Schema::object()
            .field(
                "projectionType",
                Field::string()
                    .allowed(["ALL", "KEYS_ONLY", "INCLUDE"])
                    .describe("Which attributes the index holds (ALL when not set)"),
            )
            .field(
                "nonKeyAttributes",
                Field::array(Schema::string()).describe("INCLUDE: the attributes besides the keys"),
            ),
    )
    .describe("What the index holds; ALL when not set")
}

#[async_trait]
impl Resource for Table {
    fn type_name(&self) -> &str {
        "aws/dynamodb/table"
    }

    fn description(&self) -> &str {
        "A DynamoDB table. Importable by its name or ARN."
    }

    fn schema(&self) -> Schema {
        Schema::object()
            .describe("A DynamoDB table; fields as CloudFormation's AWS::DynamoDB::Table in lowerCamelCase")
            .field("tableName", Field::string().must_recreate().describe("3 to 255 letters, digits, `_`, `-` and `.`. Derived from the instance and resource name when not set."))
            .field(
                "attributeDefinitions",
                Field::array(
                    Schema::object()
                        .field("attributeName", Field::string().required())
                        .field("attributeType", Field::string().required().allowed(["S", "N", "B"]).describe("S (string), N (number) or B (binary)")),
                )
                .required()
                .describe("The types of the key attributes of the table and its indexes"),
            )
            .field("keySchema", Field::array(keys_schema()).required().must_recreate().describe("The primary key: a HASH key, then optionally a RANGE key"))
            .field("billingMode", Field::string().allowed([PROVISIONED, PAY_PER_REQUEST]).describe("PAY_PER_REQUEST (on demand; the default without provisionedThroughput) or PROVISIONED"))
            .field("provisionedThroughput", Field::object(throughput_schema()).describe("PROVISIONED: the table's capacity"))
            .field(
                "globalSecondaryIndexes",
                Field::array(
                    Schema::object()
                        .field("indexName", Field::string().required())
                        .field("keySchema", Field::array(keys_schema()).required())
                        .field("projection", projection_schema())
                        .field("provisionedThroughput", Field::object(throughput_schema()).describe("PROVISIONED: the index's capacity")),
                )
                .describe("Global secondary indexes; added and removed in place, one at a time"),
            )
            .field(
                "localSecondaryIndexes",
                Field::array(
                    Schema::object()
                        .field("indexName", Field::string().required())
                        .field("keySchema", Field::array(keys_schema()).required())
                        .field("projection", projection_schema()),
                )
                .must_recreate()
                .describe("Local secondary indexes (the table's HASH key, another RANGE key); fixed at creation"),
            )
            .field(
                "streamSpecification",
                Field::object(Schema::object().field(
                    "streamViewType",
                    Field::string().required().allowed(["NEW_IMAGE", "OLD_IMAGE", "NEW_AND_OLD_IMAGES", "KEYS_ONLY"]),
                ))
                .describe("A DynamoDB stream of changes"),
            )
            .field(
                "timeToLiveSpecification",
                Field::object(
                    Schema::object()
                        .field("attributeName", Field::string().required().describe("The attribute holding the expiry time (epoch seconds)"))
                        .field("enabled", Field::boolean().required()),
                )
                .describe("Expiring items"),
            )
            .field(
                "pointInTimeRecoverySpecification",
                Field::object(Schema::object().field("pointInTimeRecoveryEnabled", Field::boolean()))
                    .describe("Continuous backups"),
            )
            .field(
                "sseSpecification",
                Field::object(
                    Schema::object()
                        .field("sseEnabled", Field::boolean().required().describe("true: a KMS key (AWS-managed unless kmsMasterKeyId); false: an AWS-owned key"))
                        .field("sseType", Field::string().allowed(["KMS"]))
                        .field("kmsMasterKeyId", Field::string().describe("A KMS key id, ARN or alias")),
                )
                .describe("Encryption at rest"),
            )
            .field("tableClass", Field::string().allowed(["STANDARD", "STANDARD_INFREQUENT_ACCESS"]).describe("STANDARD (the default) or STANDARD_INFREQUENT_ACCESS"))
            .field("deletionProtectionEnabled", Field::boolean().describe("While true the table cannot be deleted (destroy fails)"))
            .field("tags", common::tags_field())
            .field("arn", Field::string().computed().describe("The table's ARN"))
            .field("streamArn", Field::string().computed().describe("The stream's ARN, while the stream is on"))
    }

    async fn validate(&self, _ctx: &Context, req: &ValidateRequest) -> Result<Vec<Diagnostic>> {
        Ok(check(&req.spec))
    }

    async fn create(&self, ctx: &Context, req: &CreateRequest) -> Result<Applied> {
        let c = self.clients.get(ctx).await?;
        let spec = req.spec();
        let want = Settings::from_spec(ctx, &spec, &req.name)?;
        let tags = common::all_tags(ctx, &spec, &req.name)?;
        let name = want.name.clone();
        let mut found = describe(&c, &name).await?;
        if found
            .as_ref()
            .is_some_and(|d| d.table_status() == Some(&t::TableStatus::Deleting))
        {
            // A table of this name on its way out (an earlier destroy): the name is free
            // once it is gone.
            wait_gone(ctx, &c, &name).await?;
            found = None;
        }
        match found {
            Some(d) => {
                let have = tags_of(&c, d.table_arn().unwrap_or_default()).await?;
                common::adopt_or_conflict(ctx, &req.name, &have, "table", &name, "tableName")?;
            }
            None => {
                ctx.progress(format!("creating table {name}"), None);
                create_table(&c, &want, &tags).await?;
            }
        }
        // The table exists from here: a failure records it, so nothing is orphaned.
        let d = match converge(ctx, &c, &want, None, &tags).await {
            Ok(d) => d,
            Err(e) => {
                let partial = describe(&c, &name).await.ok().flatten();
                let st = partial.as_ref().map_or_else(Value::map, state);
                return Err(e.with_partial(name, st));
            }
        };
        Ok(Applied::new(name, state(&d)))
    }

    async fn update(&self, ctx: &Context, req: &UpdateRequest) -> Result<Applied> {
        let c = self.clients.get(ctx).await?;
        let spec = req.spec();
        let mut want = Settings::from_spec(ctx, &spec, &req.name)?;
        if !req.current.external_id.is_empty() {
            want.name = req.current.external_id.clone();
        }
        let before = Settings::from_spec(ctx, &req.current.spec(), &req.name).ok();
        let tags = common::all_tags(ctx, &spec, &req.name)?;
        let d = converge(ctx, &c, &want, before.as_ref(), &tags).await?;
        Ok(Applied::new(want.name, state(&d)))
    }

    async fn destroy(&self, ctx: &Context, current: &ResourceState) -> Result<()> {
        let c = self.clients.get(ctx).await?;
        let name = table_name(ctx, current)?;
        let Some(d) = describe(&c, &name).await? else {
            return Ok(());
        };
        if current.external_id.is_empty() {
            let tags = tags_of(&c, d.table_arn().unwrap_or_default()).await?;
            if common::owner(ctx, &current.name, &tags) != common::Owner::Ours {
                // Someone else's table of that name: ours was never created.
                return Ok(());
            }
        }
        let d = match d.table_status() {
            Some(t::TableStatus::Deleting) => return wait_gone(ctx, &c, &name).await,
            Some(t::TableStatus::Creating | t::TableStatus::Updating) => {
                wait_active(ctx, &c, &name).await?
            }
            _ => d,
        };
        if d.deletion_protection_enabled() == Some(true) {
            return Err(PluginError::bad_input(format!(
                "table {name} has deletion protection: deploy it with `deletionProtectionEnabled: false` first"
            ))
            .at("deletionProtectionEnabled"));
        }
        ctx.progress(format!("deleting table {name}"), None);
        if let Err(e) = c.dynamodb.delete_table().table_name(&name).send().await {
            let e = sdk(format!("deleting table {name}"), e);
            if e.class == ErrorClass::NotFound {
                return Ok(());
            }
            return Err(e);
        }
        wait_gone(ctx, &c, &name).await
    }

    fn supports_read(&self) -> bool {
        true
    }

    async fn read(&self, ctx: &Context, current: &ResourceState) -> Result<Option<ReadState>> {
        let c = self.clients.get(ctx).await?;
        let name = table_name(ctx, current)?;
        let Some(d) = describe(&c, &name).await? else {
            return Ok(None);
        };
        if d.table_status() == Some(&t::TableStatus::Deleting) {
            return Ok(None);
        }
        let tags = tags_of(&c, d.table_arn().unwrap_or_default()).await?;
        if current.external_id.is_empty()
            && common::owner(ctx, &current.name, &tags) != common::Owner::Ours
        {
            // Someone else's table of that name: ours was never created.
            return Ok(None);
        }
        let obs = match observe(&c, &d).await {
            Ok(o) => o,
            Err(e) if e.class == ErrorClass::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        Ok(Some(ReadState {
            spec: spec_of(&obs, &tags, &current.spec()),
            state: state(&d),
            external_id: Some(name),
        }))
    }

    fn supports_import(&self) -> bool {
        true
    }

    /// By the table's name or ARN (`arn:aws:dynamodb:<region>:<account>:table/<name>`); the
    /// external id is its name.
    async fn import(&self, ctx: &Context, req: &ImportRequest) -> Result<Option<ReadState>> {
        let c = self.clients.get(ctx).await?;
        let id = common::import_id(req, "the table's name or ARN")?;
        let name = match common::import_arn(&c, id, "dynamodb").await? {
            Some(arn) => match arn.resource.strip_prefix("table/") {
                Some(n) if !n.is_empty() && !n.contains('/') => n,
                _ => {
                    return Err(PluginError::bad_input(format!(
                        "`{id}` is not a table's ARN (`arn:aws:dynamodb:<region>:<account>:table/<name>`)"
                    )));
                }
            },
            None => id,
        };
        let Some(d) = describe(&c, name).await? else {
            return Ok(None);
        };
        if d.table_status() == Some(&t::TableStatus::Deleting) {
            return Ok(None);
        }
        let tags = tags_of(&c, d.table_arn().unwrap_or_default()).await?;
        let obs = observe(&c, &d).await?;
        // Read reports the encryption's type and key only when the applied spec names them
        // (a blueprint may name the key by alias); an import names them as AWS does.
        let mut hint = Value::map();
        if let Some(sse) = obs.sse.as_ref().filter(|s| s.enabled) {
            let mut v = Value::map();
            common::put(&mut v, "sseType", sse.kind.as_deref());
            common::put(&mut v, "kmsMasterKeyId", sse.key.as_deref());
            hint.insert("sseSpecification", v);
        }
        Ok(Some(ReadState {
            spec: spec_of(&obs, &tags, &Spec::new(&hint)),
            state: state(&d),
            external_id: Some(obs.name.clone()),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codes(spec: serde_json::Value) -> Vec<(String, String)> {
        check(&Value::from(spec))
            .into_iter()
            .map(|d| (d.code, d.path.map(|p| p.to_string()).unwrap_or_default()))
            .collect()
    }

    #[test]
    fn the_specification_example_only_warns_about_the_unused_attribute() {
        let got = codes(serde_json::json!({
            "attributeDefinitions": [
                {"attributeName": "order_id", "attributeType": "N"},
                {"attributeName": "product_id", "attributeType": "N"},
                {"attributeName": "amount", "attributeType": "N"}
            ],
            "keySchema": [
                {"attributeName": "order_id", "keyType": "HASH"},
                {"attributeName": "product_id", "keyType": "RANGE"}
            ],
            "tableName": "orders"
        }));
        assert_eq!(
            got,
            vec![(
                "aws.dynamodb.unused-attribute".to_owned(),
                "attributeDefinitions[2]".to_owned()
            )]
        );
    }

    #[test]
    fn keys_and_billing_are_checked_at_their_fields() {
        let got = codes(serde_json::json!({
            "tableName": "x",
            "attributeDefinitions": [{"attributeName": "id", "attributeType": "S"}],
            "keySchema": [
                {"attributeName": "sk", "keyType": "RANGE"},
                {"attributeName": "id", "keyType": "HASH"}
            ],
            "billingMode": "PAY_PER_REQUEST",
            "provisionedThroughput": {"readCapacityUnits": 0, "writeCapacityUnits": 1},
            "globalSecondaryIndexes": [{
                "indexName": "byX",
                "keySchema": [{"attributeName": "id", "keyType": "HASH"}],
                "projection": {"projectionType": "INCLUDE"}
            }]
        }));
        let want = [
            ("aws.dynamodb.invalid-name", "tableName"),
            ("aws.dynamodb.key-schema", "keySchema[0].keyType"),
            (
                "aws.dynamodb.undefined-attribute",
                "keySchema[0].attributeName",
            ),
            ("aws.dynamodb.key-schema", "keySchema[1].keyType"),
            (
                "aws.out-of-range",
                "provisionedThroughput.readCapacityUnits",
            ),
            ("aws.dynamodb.billing-mode", "provisionedThroughput"),
            (
                "aws.dynamodb.projection",
                "globalSecondaryIndexes[0].projection.nonKeyAttributes",
            ),
        ];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn unknown_values_are_not_judged() {
        let spec = Value::map()
            .with("attributeDefinitions", Value::Unknown)
            .with("keySchema", Value::Unknown);
        assert!(check(&spec).is_empty());
    }
}
