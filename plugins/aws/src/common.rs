//! What every resource type shares: physical names, ownership tags, tag lists.
//!
//! Ownership: every resource the provider creates carries the tags `trellis:instance`
//! (the blueprint instance's id) and `trellis:resource` (the resource's name). A create
//! that finds its name taken adopts the resource only when those tags name the same
//! instance and resource (a retried or crash-interrupted create of its own); anything
//! else is a CONFLICT, so a deploy never takes over what another instance or a person made.

use sha2::{Digest, Sha256};
use trellis_plugin_sdk::prelude::*;

use crate::config::Clients;

pub const TAG_INSTANCE: &str = "trellis:instance";
pub const TAG_RESOURCE: &str = "trellis:resource";

/// Which characters a service accepts in a name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameStyle {
    /// Letters, digits, `-` and `_` (Lambda, SQS, SNS, IAM, DynamoDB, EventBridge).
    Standard,
    /// Lowercase letters, digits and `-` (S3 buckets).
    Lowercase,
}

/// The name the resource has in AWS: `field` of the spec when set, else one derived from
/// the instance and the resource's name, the same on every attempt (so a retry finds what
/// an earlier attempt created): `<resource name>-<10 hex digits>`, cut to `max` characters.
pub fn physical_name(
    ctx: &Context,
    spec: &Spec<'_>,
    field: &str,
    resource_name: &str,
    max: usize,
    style: NameStyle,
) -> Result<String> {
    if let Some(n) = spec.opt_str(field)? {
        return Ok(n.to_owned());
    }
    Ok(derived_name(ctx.instance_id(), resource_name, max, style))
}

/// See [`physical_name`].
pub fn derived_name(
    instance_id: &str,
    resource_name: &str,
    max: usize,
    style: NameStyle,
) -> String {
    let digest = Sha256::digest(format!("{instance_id}/{resource_name}").as_bytes());
    let suffix: String = digest.iter().take(5).map(|b| format!("{b:02x}")).collect();
    let mut base: String = resource_name
        .chars()
        .map(|c| match style {
            NameStyle::Standard if c.is_ascii_alphanumeric() || c == '-' || c == '_' => c,
            NameStyle::Lowercase if c.is_ascii_alphanumeric() || c == '-' => c.to_ascii_lowercase(),
            _ => '-',
        })
        .collect();
    let room = max.saturating_sub(suffix.len() + 1);
    base.truncate(room);
    let base = base.trim_matches('-');
    if base.is_empty() {
        format!("trellis-{suffix}")
    } else {
        format!("{base}-{suffix}")
    }
}

/// The ownership tags of a resource created for `ctx`'s instance.
pub fn ownership_tags(ctx: &Context, resource_name: &str) -> Vec<(String, String)> {
    vec![
        (TAG_INSTANCE.to_owned(), ctx.instance_id().to_owned()),
        (TAG_RESOURCE.to_owned(), resource_name.to_owned()),
    ]
}

/// The blueprint's `tags` (`[{key, value}]`, CloudFormation's shape) followed by the
/// ownership tags.
pub fn all_tags(
    ctx: &Context,
    spec: &Spec<'_>,
    resource_name: &str,
) -> Result<Vec<(String, String)>> {
    let mut out = user_tags(spec)?;
    out.extend(ownership_tags(ctx, resource_name));
    Ok(out)
}

/// The blueprint's `tags`; the reserved `trellis:` prefix is refused.
pub fn user_tags(spec: &Spec<'_>) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for (i, t) in spec
        .opt_list("tags")?
        .unwrap_or_default()
        .into_iter()
        .enumerate()
    {
        let key = t.get_str("key")?;
        if key.starts_with("trellis:") {
            return Err(PluginError::bad_input(format!(
                "tag `{key}`: the `trellis:` prefix is reserved for ownership tags"
            ))
            .at(spec.path_of("tags").join_index(i).join("key")));
        }
        out.push((key.to_owned(), t.get_str("value")?.to_owned()));
    }
    Ok(out)
}

/// `tags` as the spec shows them: user tags only, in the blueprint's order when they are
/// all still there, else sorted by key.
pub fn tags_value(tags: &[(String, String)], applied: &Spec<'_>) -> Option<Value> {
    let mut user: Vec<(String, String)> = tags
        .iter()
        .filter(|(k, _)| !k.starts_with("trellis:"))
        .cloned()
        .collect();
    if user.is_empty() && applied.get("tags").is_none() {
        return None;
    }
    if let Ok(Some(order)) = applied.opt_list("tags") {
        let keys: Vec<&str> = order.iter().filter_map(|t| t.get_str("key").ok()).collect();
        user.sort_by_key(|(k, _)| keys.iter().position(|x| x == k).unwrap_or(usize::MAX));
    }
    Some(Value::List(
        user.into_iter()
            .map(|(k, v)| Value::map().with("key", k).with("value", v))
            .collect(),
    ))
}

/// The schema of `tags`.
pub fn tags_field() -> Field {
    Field::array(
        Schema::object()
            .field("key", Field::string().required())
            .field("value", Field::string().required()),
    )
    .describe("Tags, as `[{key, value}]`. The provider adds `trellis:instance` and `trellis:resource` to mark what it owns.")
}

/// Who a resource found by name belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Owner {
    /// This instance's resource of this name: adopt it.
    Ours,
    /// Another instance's, or another resource's of this instance.
    Other(String),
    /// No ownership tags: not made by Trellis.
    Nobody,
}

pub fn owner(ctx: &Context, resource_name: &str, tags: &[(String, String)]) -> Owner {
    let get = |k: &str| tags.iter().find(|(t, _)| t == k).map(|(_, v)| v.as_str());
    match (get(TAG_INSTANCE), get(TAG_RESOURCE)) {
        (Some(i), Some(r)) if i == ctx.instance_id() && r == resource_name => Owner::Ours,
        (Some(i), Some(r)) => Owner::Other(format!("resource `{r}` of instance {i}")),
        (Some(i), None) => Owner::Other(format!("instance {i}")),
        _ => Owner::Nobody,
    }
}

/// CONFLICT for a name taken by something this resource does not own.
pub fn taken(kind: &str, name: &str, by: &Owner, field: &str) -> PluginError {
    let whose = match by {
        Owner::Other(o) => format!("it belongs to {o}"),
        _ => "it was not created by Trellis".to_owned(),
    };
    PluginError::conflict(format!(
        "{kind} `{name}` already exists and {whose}; choose another name (Trellis does not take over existing resources)"
    ))
    .at(field)
}

/// Checks `owner` before adopting an existing resource.
pub fn adopt_or_conflict(
    ctx: &Context,
    resource_name: &str,
    tags: &[(String, String)],
    kind: &str,
    name: &str,
    field: &str,
) -> Result<()> {
    match owner(ctx, resource_name, tags) {
        Owner::Ours => {
            tracing::info!(
                "{kind} {name} exists with this resource's ownership tags: adopting it (an earlier attempt created it)"
            );
            Ok(())
        }
        other => Err(taken(kind, name, &other, field)),
    }
}

/// Tag changes from `before` to `after`: (to set, keys to remove).
pub fn tag_diff(
    before: &[(String, String)],
    after: &[(String, String)],
) -> (Vec<(String, String)>, Vec<String>) {
    let set = after
        .iter()
        .filter(|t| !before.contains(t))
        .cloned()
        .collect();
    let remove = before
        .iter()
        .filter(|(k, _)| !after.iter().any(|(a, _)| a == k))
        .map(|(k, _)| k.clone())
        .collect();
    (set, remove)
}

/// Puts `v` at `key` of a map value when present.
pub fn put(map: &mut Value, key: &str, v: Option<impl Into<Value>>) {
    if let Some(v) = v {
        map.insert(key, v.into());
    }
}

/// A JSON document field (an IAM policy, a redrive policy) as text: a map or list is
/// serialised, a string passed as is.
pub fn json_text(v: &Value) -> String {
    match v.revealed() {
        Value::String(s) => s.clone(),
        other => other.to_json().to_string(),
    }
}

/// A JSON document AWS returns, as a value (a string when it is not JSON).
pub fn json_value(text: &str) -> Value {
    serde_json::from_str::<serde_json::Value>(text)
        .map_or_else(|_| Value::from(text), Value::from_json)
}

/// An ARN's parts: `arn:<partition>:<service>:<region>:<account>:<resource>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arn<'a> {
    pub partition: &'a str,
    pub service: &'a str,
    /// Empty for global services (IAM, S3).
    pub region: &'a str,
    /// Empty for S3 buckets.
    pub account: &'a str,
    /// Everything after the account (it may hold `:` and `/`).
    pub resource: &'a str,
}

impl<'a> Arn<'a> {
    pub fn parse(s: &'a str) -> Option<Arn<'a>> {
        let mut parts = s.splitn(6, ':');
        if parts.next()? != "arn" {
            return None;
        }
        let arn = Arn {
            partition: parts.next()?,
            service: parts.next()?,
            region: parts.next()?,
            account: parts.next()?,
            resource: parts.next()?,
        };
        (!arn.service.is_empty() && !arn.resource.is_empty()).then_some(arn)
    }
}

/// The id an import was given, trimmed; BAD_INPUT when empty (`forms` says what to give).
pub fn import_id<'a>(req: &'a ImportRequest, forms: &str) -> Result<&'a str> {
    let id = req.external_id.trim();
    if id.is_empty() {
        return Err(PluginError::bad_input(format!(
            "importing {}: give {forms}",
            req.resource_type
        )));
    }
    Ok(id)
}

/// `id` as an ARN of `service` when it is one (None when it does not start with `arn:`).
/// The provider manages one partition, region and account: an ARN naming others (or another
/// service, or malformed) is BAD_INPUT rather than "not found", so a wrong id says why.
pub async fn import_arn<'a>(c: &Clients, id: &'a str, service: &str) -> Result<Option<Arn<'a>>> {
    if !id.starts_with("arn:") {
        return Ok(None);
    }
    let bad = |why: String| Err(PluginError::bad_input(format!("`{id}`: {why}")));
    let Some(arn) = Arn::parse(id) else {
        return bad("not a well-formed ARN".to_owned());
    };
    if arn.service != service {
        return bad(format!("an ARN of {}, not of {service}", arn.service));
    }
    if arn.partition != c.partition() || (!arn.region.is_empty() && arn.region != c.region) {
        return bad(format!(
            "the provider is configured for region {} (partition {})",
            c.region,
            c.partition()
        ));
    }
    if !arn.account.is_empty() {
        let account = c.account().await?;
        if arn.account != account {
            return bad(format!(
                "of account {}, while the provider's credentials are of account {account}",
                arn.account
            ));
        }
    }
    Ok(Some(arn))
}

/// The resource import reads through the type's read: `external_id` in the form create
/// reports, and `hint`, a spec with what read needs to find the resource (its name) or to
/// report a field in full (read reports some fields only when the applied spec has them).
pub fn import_state(req: &ImportRequest, external_id: &str, hint: Value) -> ResourceState {
    ResourceState {
        resource_type: req.resource_type.clone(),
        name: req.name.clone(),
        external_id: external_id.to_owned(),
        spec: hint,
        state: Value::Null,
    }
}

/// The error for a spec whose field must be set.
pub fn missing(spec: &Spec<'_>, key: &str) -> PluginError {
    PluginError::bad_input(format!("`{key}` is required")).at(spec.path_of(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_names_are_stable_and_fit() {
        let a = derived_name("inst-1", "saveOrder", 64, NameStyle::Standard);
        assert_eq!(
            a,
            derived_name("inst-1", "saveOrder", 64, NameStyle::Standard)
        );
        assert_ne!(
            a,
            derived_name("inst-2", "saveOrder", 64, NameStyle::Standard)
        );
        assert!(a.starts_with("saveOrder-"), "{a}");
        let long = derived_name("i", &"x".repeat(100), 63, NameStyle::Lowercase);
        assert_eq!(long.len(), 63);
        let b = derived_name("i", "Buckets[0]", 63, NameStyle::Lowercase);
        assert!(b.starts_with("buckets-0-"), "{b}");
        assert!(
            b.bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        );
    }

    #[test]
    fn ownership() {
        let ctx = Context::new(Value::Null);
        let tags = ownership_tags(&ctx, "q");
        assert_eq!(owner(&ctx, "q", &tags), Owner::Ours);
        assert!(matches!(owner(&ctx, "other", &tags), Owner::Other(_)));
        assert_eq!(owner(&ctx, "q", &[]), Owner::Nobody);
    }

    #[test]
    fn arns() {
        let a = Arn::parse("arn:aws:iam::123:role/path/r").expect("arn");
        assert_eq!(
            (a.service, a.region, a.account, a.resource),
            ("iam", "", "123", "role/path/r")
        );
        let a = Arn::parse("arn:aws:lambda:us-east-1:1:function:f:live").expect("arn");
        assert_eq!(a.resource, "function:f:live");
        assert_eq!(Arn::parse("arn:aws:s3:::b").map(|a| a.resource), Some("b"));
        assert_eq!(Arn::parse("arn:aws:s3"), None);
        assert_eq!(Arn::parse("queue-name"), None);
    }

    #[test]
    fn tag_diffs() {
        let b = vec![
            ("a".to_owned(), "1".to_owned()),
            ("b".to_owned(), "2".to_owned()),
        ];
        let a = vec![
            ("a".to_owned(), "1".to_owned()),
            ("c".to_owned(), "3".to_owned()),
        ];
        assert_eq!(
            tag_diff(&b, &a),
            (vec![("c".to_owned(), "3".to_owned())], vec!["b".to_owned()])
        );
    }
}
