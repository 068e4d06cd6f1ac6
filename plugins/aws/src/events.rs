//! `aws/events/rule` (CloudFormation `AWS::Events::Rule`).
//!
//! PutRule both creates and replaces a rule of a name, so create looks the name up first
//! and adopts only a rule with our ownership tags. Targets are not part of the spec (links
//! add them); destroy removes whatever targets remain, as DeleteRule refuses a rule that
//! has any.

use std::sync::Arc;

use aws_sdk_eventbridge::types::{RuleState, Tag};
use trellis_plugin_sdk::prelude::*;

use crate::common::{self, NameStyle};
use crate::config::{ClientCache, Clients};
use crate::error::sdk;

pub struct Rule {
    pub clients: Arc<ClientCache>,
}

const MAX_NAME: usize = 64;
const DEFAULT_BUS: &str = "default";
/// RemoveTargets takes at most this many ids.
const REMOVE_BATCH: usize = 100;

fn rule_name(ctx: &Context, spec: &Spec<'_>, name: &str) -> Result<String> {
    common::physical_name(ctx, spec, "name", name, MAX_NAME, NameStyle::Standard)
}

fn bus(spec: &Spec<'_>) -> Result<String> {
    Ok(spec
        .opt_str("eventBusName")?
        .unwrap_or(DEFAULT_BUS)
        .to_owned())
}

fn eb_tags(tags: Vec<(String, String)>) -> Result<Vec<Tag>> {
    tags.into_iter()
        .map(|(k, v)| {
            Tag::builder()
                .key(k)
                .value(v)
                .build()
                .map_err(|e| PluginError::internal(format!("building a tag: {e}")))
        })
        .collect()
}

/// What DescribeRule says, or None when there is no such rule (or bus).
async fn describe(
    c: &Clients,
    name: &str,
    bus: &str,
) -> Result<Option<aws_sdk_eventbridge::operation::describe_rule::DescribeRuleOutput>> {
    match c
        .events
        .describe_rule()
        .name(name)
        .event_bus_name(bus)
        .send()
        .await
    {
        Ok(out) => Ok(Some(out)),
        Err(e) => {
            let e = sdk(format!("reading rule {name}"), e);
            if e.class == ErrorClass::NotFound {
                Ok(None)
            } else {
                Err(e)
            }
        }
    }
}

async fn tags_of(c: &Clients, arn: &str) -> Result<Vec<(String, String)>> {
    let out = c
        .events
        .list_tags_for_resource()
        .resource_arn(arn)
        .send()
        .await
        .map_err(|e| sdk(format!("reading the tags of rule {arn}"), e))?;
    let mut tags: Vec<(String, String)> = out
        .tags
        .unwrap_or_default()
        .into_iter()
        .map(|t| (t.key, t.value))
        .collect();
    tags.sort();
    Ok(tags)
}

/// PutRule with the whole spec: on an existing rule it replaces every setting, so a field
/// the spec dropped is cleared.
async fn put(
    c: &Clients,
    name: &str,
    spec: &Spec<'_>,
    tags: Option<Vec<(String, String)>>,
) -> Result<String> {
    let state = spec.opt_str("state")?.unwrap_or("ENABLED");
    let mut req = c
        .events
        .put_rule()
        .name(name)
        .event_bus_name(bus(spec)?)
        .state(RuleState::from(state))
        .set_description(spec.opt_str("description")?.map(str::to_owned))
        .set_schedule_expression(spec.opt_str("scheduleExpression")?.map(str::to_owned))
        .set_role_arn(spec.opt_str("roleArn")?.map(str::to_owned))
        .set_event_pattern(spec.get("eventPattern").map(common::json_text));
    if let Some(tags) = tags {
        req = req.set_tags(Some(eb_tags(tags)?));
    }
    let out = req.send().await.map_err(|e| {
        let e = sdk(format!("putting rule {name}"), e);
        if e.class == ErrorClass::NotFound {
            // The rule is being made: what is missing is its bus.
            PluginError::bad_input(format!("{}: does the event bus exist?", e.message))
                .at("eventBusName")
        } else {
            e
        }
    })?;
    out.rule_arn
        .ok_or_else(|| PluginError::internal(format!("putting rule {name}: no ARN returned")))
}

async fn set_tags(
    ctx: &Context,
    c: &Clients,
    arn: &str,
    spec: &Spec<'_>,
    name: &str,
) -> Result<()> {
    let want = common::all_tags(ctx, spec, name)?;
    let have = tags_of(c, arn).await?;
    let (set, remove) = common::tag_diff(&have, &want);
    if !set.is_empty() {
        c.events
            .tag_resource()
            .resource_arn(arn)
            .set_tags(Some(eb_tags(set)?))
            .send()
            .await
            .map_err(|e| sdk(format!("tagging rule {arn}"), e))?;
    }
    if !remove.is_empty() {
        c.events
            .untag_resource()
            .resource_arn(arn)
            .set_tag_keys(Some(remove))
            .send()
            .await
            .map_err(|e| sdk(format!("untagging rule {arn}"), e))?;
    }
    Ok(())
}

/// The pattern AWS stores as JSON text, as a map; the applied value itself when it is the
/// same JSON (key order is not drift).
fn pattern_like(text: &str, applied: Option<&Value>) -> Value {
    let found = common::json_value(text);
    match applied {
        Some(a) if a.to_json() == found.to_json() => a.clone(),
        _ => found,
    }
}

fn spec_of(
    out: &aws_sdk_eventbridge::operation::describe_rule::DescribeRuleOutput,
    name: &str,
    tags: &[(String, String)],
    applied: &Spec<'_>,
) -> Value {
    let mut spec = Value::map().with("name", out.name().unwrap_or(name));
    let found_bus = out.event_bus_name().unwrap_or(DEFAULT_BUS);
    // The blueprint may name the bus by ARN; AWS answers with its name.
    let bus = match applied.get("eventBusName").and_then(Value::as_str) {
        Some(a) if a == found_bus || a.ends_with(&format!("/{found_bus}")) => a,
        _ => found_bus,
    };
    spec.insert("eventBusName", bus);
    common::put(&mut spec, "description", out.description());
    if let Some(p) = out.event_pattern() {
        spec.insert("eventPattern", pattern_like(p, applied.get("eventPattern")));
    }
    common::put(&mut spec, "scheduleExpression", out.schedule_expression());
    common::put(&mut spec, "state", out.state().map(RuleState::as_str));
    common::put(&mut spec, "roleArn", out.role_arn());
    common::put(&mut spec, "tags", common::tags_value(tags, applied));
    spec
}

fn state(arn: &str) -> Value {
    Value::map().with("arn", arn)
}

/// Removes every target of the rule, a page at a time.
async fn remove_targets(ctx: &Context, c: &Clients, name: &str, bus: &str) -> Result<()> {
    let mut before: Vec<String> = Vec::new();
    loop {
        ctx.check_cancelled()?;
        // Always the first page: the targets listed before are gone.
        let out = c
            .events
            .list_targets_by_rule()
            .rule(name)
            .event_bus_name(bus)
            .send()
            .await
            .map_err(|e| sdk(format!("listing the targets of rule {name}"), e))?;
        let ids: Vec<String> = out.targets().iter().map(|t| t.id().to_owned()).collect();
        if ids.is_empty() {
            return Ok(());
        }
        if ids == before {
            // Removed but still listed: say so rather than loop.
            return Err(PluginError::transient(format!(
                "rule {name} still lists {} targets after removing them",
                ids.len()
            )));
        }
        ctx.progress(
            format!("removing {} targets of rule {name}", ids.len()),
            None,
        );
        for batch in ids.chunks(REMOVE_BATCH) {
            let out = c
                .events
                .remove_targets()
                .rule(name)
                .event_bus_name(bus)
                .set_ids(Some(batch.to_vec()))
                .send()
                .await
                .map_err(|e| sdk(format!("removing the targets of rule {name}"), e))?;
            if let Some(f) = out.failed_entries().first() {
                return Err(PluginError::transient(format!(
                    "removing the targets of rule {name}: {} failed; target `{}`: {}: {}",
                    out.failed_entries().len(),
                    f.target_id().unwrap_or("?"),
                    f.error_code().unwrap_or("error"),
                    f.error_message().unwrap_or("")
                )));
            }
        }
        before = ids;
    }
}

/// `rate(5 minutes)`, `rate(1 hour)`.
fn valid_rate(inner: &str) -> bool {
    let mut parts = inner.split_whitespace();
    let (Some(n), Some(unit), None) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let Ok(n) = n.parse::<u64>() else {
        return false;
    };
    let singular = ["minute", "hour", "day"].contains(&unit);
    let plural = ["minutes", "hours", "days"].contains(&unit);
    n > 0 && (singular && n == 1 || plural && n != 1)
}

/// `cron(0 12 * * ? *)`: six fields.
fn valid_cron(inner: &str) -> bool {
    inner.split_whitespace().count() == 6
}

fn valid_schedule(s: &str) -> bool {
    if let Some(inner) = s.strip_prefix("rate(").and_then(|r| r.strip_suffix(')')) {
        valid_rate(inner)
    } else if let Some(inner) = s.strip_prefix("cron(").and_then(|r| r.strip_suffix(')')) {
        valid_cron(inner)
    } else {
        false
    }
}

fn valid_name(n: &str) -> bool {
    (1..=MAX_NAME).contains(&n.len())
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

#[async_trait]
impl Resource for Rule {
    fn type_name(&self) -> &str {
        "aws/events/rule"
    }

    fn description(&self) -> &str {
        "An EventBridge rule (an event pattern or a schedule); targets come through links. Importable by its ARN, its name (on the default bus) or `<bus>|<name>`."
    }

    fn schema(&self) -> Schema {
        Schema::object()
            .describe("An EventBridge rule; fields as CloudFormation's AWS::Events::Rule in lowerCamelCase (targets come through links)")
            .field("name", Field::string().must_recreate().describe("Up to 64 letters, digits, `.`, `-` and `_`. Derived from the instance and resource name when not set."))
            .field("eventBusName", Field::string().must_recreate().default(DEFAULT_BUS).describe("The event bus (name or ARN); `default` when not set"))
            .field("description", Field::string().describe("Up to 512 characters"))
            .field("eventPattern", Field::map(Schema::any()).describe("The events the rule matches, as a map (stored by AWS as JSON)"))
            .field("scheduleExpression", Field::string().describe("`rate(5 minutes)` or `cron(0 12 * * ? *)`; default bus only"))
            .field("state", Field::string().allowed(["ENABLED", "DISABLED", "ENABLED_WITH_ALL_CLOUDTRAIL_MANAGEMENT_EVENTS"]).describe("`ENABLED` (when not set) or `DISABLED`"))
            .field("roleArn", Field::string().describe("The role EventBridge uses to deliver to targets"))
            .field("tags", common::tags_field())
            .field("arn", Field::string().computed().describe("The rule's ARN"))
    }

    async fn validate(&self, _ctx: &Context, req: &ValidateRequest) -> Result<Vec<Diagnostic>> {
        let spec = req.spec();
        let mut out = Vec::new();
        if let Some(n) = spec.get("name").and_then(Value::as_str)
            && !valid_name(n)
        {
            out.push(
                Diagnostic::error(
                    "aws.events.invalid-name",
                    format!("`name` \"{n}\" must be 1 to 64 letters, digits, `.`, `-` or `_`"),
                )
                .at("name"),
            );
        }
        let pattern = spec.get("eventPattern");
        let schedule = spec.get("scheduleExpression");
        if pattern.is_none() && schedule.is_none() {
            out.push(
                Diagnostic::error(
                    "aws.events.no-trigger",
                    "a rule needs `eventPattern` or `scheduleExpression` (or both)",
                )
                .at("eventPattern"),
            );
        }
        if let Some(s) = schedule.and_then(Value::as_str) {
            if !valid_schedule(s) {
                out.push(
                    Diagnostic::error(
                        "aws.events.invalid-schedule",
                        format!(
                            "`scheduleExpression` \"{s}\" is neither `rate(...)` nor `cron(...)`"
                        ),
                    )
                    .at("scheduleExpression")
                    .hint("`rate(5 minutes)`, `rate(1 hour)`, `cron(0 12 * * ? *)` (six fields)"),
                );
            }
            if let Some(b) = spec.get("eventBusName").and_then(Value::as_str)
                && b != DEFAULT_BUS
                && !b.ends_with(":event-bus/default")
            {
                out.push(
                    Diagnostic::error(
                        "aws.events.schedule-on-custom-bus",
                        "`scheduleExpression` works on the default event bus only",
                    )
                    .at("scheduleExpression"),
                );
            }
        }
        if let Some(p) = pattern
            && let Some(m) = p.as_map()
            && m.is_empty()
        {
            out.push(
                Diagnostic::error(
                    "aws.events.empty-pattern",
                    "`eventPattern` is empty; it must name at least one field to match",
                )
                .at("eventPattern"),
            );
        }
        if let Some(d) = spec.get("description").and_then(Value::as_str)
            && d.chars().count() > 512
        {
            out.push(
                Diagnostic::error(
                    "aws.events.description-too-long",
                    "`description` must be at most 512 characters",
                )
                .at("description"),
            );
        }
        Ok(out)
    }

    async fn create(&self, ctx: &Context, req: &CreateRequest) -> Result<Applied> {
        let c = self.clients.get(ctx).await?;
        let spec = req.spec();
        let name = rule_name(ctx, &spec, &req.name)?;
        let arn = match describe(&c, &name, &bus(&spec)?).await? {
            Some(found) => {
                let arn = found.arn.clone().ok_or_else(|| {
                    PluginError::internal(format!("reading rule {name}: no ARN returned"))
                })?;
                let tags = tags_of(&c, &arn).await?;
                common::adopt_or_conflict(ctx, &req.name, &tags, "rule", &name, "name")?;
                put(&c, &name, &spec, None).await?;
                set_tags(ctx, &c, &arn, &spec, &req.name).await?;
                arn
            }
            None => {
                let tags = common::all_tags(ctx, &spec, &req.name)?;
                put(&c, &name, &spec, Some(tags)).await?
            }
        };
        Ok(Applied::new(arn.clone(), state(&arn)))
    }

    async fn update(&self, ctx: &Context, req: &UpdateRequest) -> Result<Applied> {
        let c = self.clients.get(ctx).await?;
        let spec = req.spec();
        let name = rule_name(ctx, &spec, &req.name)?;
        let arn = put(&c, &name, &spec, None).await?;
        set_tags(ctx, &c, &arn, &spec, &req.name).await?;
        Ok(Applied::new(arn.clone(), state(&arn)))
    }

    async fn destroy(&self, ctx: &Context, current: &ResourceState) -> Result<()> {
        let c = self.clients.get(ctx).await?;
        let spec = current.spec();
        let name = rule_name(ctx, &spec, &current.name)?;
        let bus = bus(&spec)?;
        let Some(found) = describe(&c, &name, &bus).await? else {
            return Ok(());
        };
        if current.external_id.is_empty() {
            // Never recorded: delete only a rule of that name that is ours.
            let arn = found.arn.unwrap_or_default();
            if common::owner(ctx, &current.name, &tags_of(&c, &arn).await?) != common::Owner::Ours {
                return Ok(());
            }
        }
        let gone = |e: PluginError| {
            if e.class == ErrorClass::NotFound {
                Ok(())
            } else {
                Err(e)
            }
        };
        if let Err(e) = remove_targets(ctx, &c, &name, &bus).await {
            return gone(e);
        }
        match c
            .events
            .delete_rule()
            .name(&name)
            .event_bus_name(&bus)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => gone(sdk(format!("deleting rule {name}"), e)),
        }
    }

    fn supports_read(&self) -> bool {
        true
    }

    async fn read(&self, ctx: &Context, current: &ResourceState) -> Result<Option<ReadState>> {
        let c = self.clients.get(ctx).await?;
        let applied = current.spec();
        let name = rule_name(ctx, &applied, &current.name)?;
        let Some(found) = describe(&c, &name, &bus(&applied)?).await? else {
            return Ok(None);
        };
        let Some(arn) = found.arn().map(str::to_owned) else {
            return Err(PluginError::internal(format!(
                "reading rule {name}: no ARN returned"
            )));
        };
        let tags = match tags_of(&c, &arn).await {
            Ok(t) => t,
            Err(e) if e.class == ErrorClass::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        if current.external_id.is_empty()
            && common::owner(ctx, &current.name, &tags) != common::Owner::Ours
        {
            // Someone else's rule of that name: ours was never created.
            return Ok(None);
        }
        Ok(Some(ReadState {
            spec: spec_of(&found, &name, &tags, &applied),
            state: state(&arn),
            external_id: Some(arn),
        }))
    }

    fn supports_import(&self) -> bool {
        true
    }

    /// By the rule's ARN (`arn:aws:events:<region>:<account>:rule/[<bus>/]<name>`), its name
    /// (a rule of the default bus) or `<bus>|<name>` (CloudFormation's id of a rule of another
    /// bus); the external id is its ARN, as create reports it. Targets are not part of the
    /// spec (links add them).
    async fn import(&self, ctx: &Context, req: &ImportRequest) -> Result<Option<ReadState>> {
        let c = self.clients.get(ctx).await?;
        let id = common::import_id(req, "the rule's ARN, name or <bus>|<name>")?;
        let (bus, name) = match common::import_arn(&c, id, "events").await? {
            Some(arn) => {
                let path = arn.resource.strip_prefix("rule/").ok_or_else(|| {
                    PluginError::bad_input(format!(
                        "`{id}` is not a rule's ARN (`arn:aws:events:<region>:<account>:rule/<name>`)"
                    ))
                })?;
                path.rsplit_once('/').unwrap_or((DEFAULT_BUS, path))
            }
            None => id.split_once('|').unwrap_or((DEFAULT_BUS, id)),
        };
        let Some(arn) = describe(&c, name, bus).await?.and_then(|f| f.arn) else {
            return Ok(None);
        };
        // Read finds the rule by the name and bus in the spec.
        let hint = Value::map().with("name", name).with("eventBusName", bus);
        self.read(ctx, &common::import_state(req, &arn, hint)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules() {
        for ok in [
            "rate(5 minutes)",
            "rate(1 minute)",
            "rate(2 days)",
            "cron(0 12 * * ? *)",
            "cron(0/15 * ? * MON-FRI *)",
        ] {
            assert!(valid_schedule(ok), "{ok}");
        }
        for bad in [
            "every 5 minutes",
            "rate(5)",
            "rate(0 minutes)",
            "rate(1 minutes)",
            "rate(5 minute)",
            "rate(5 weeks)",
            "cron(0 12 * * ?)",
            "cron 0 12 * * ? *",
            "",
        ] {
            assert!(!valid_schedule(bad), "{bad}");
        }
    }

    #[test]
    fn patterns_compare_as_json() {
        let applied = Value::map()
            .with("source", Value::List(vec![Value::from("app")]))
            .with("detail-type", Value::List(vec![Value::from("x")]));
        let text = r#"{"detail-type":["x"],"source":["app"]}"#;
        assert_eq!(pattern_like(text, Some(&applied)), applied);
        let changed = r#"{"detail-type":["y"],"source":["app"]}"#;
        assert_ne!(pattern_like(changed, Some(&applied)), applied);
    }
}
