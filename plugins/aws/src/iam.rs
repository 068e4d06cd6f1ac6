//! `aws/iam/role` (CloudFormation `AWS::IAM::Role`), and the role helpers other resource
//! types and links share:
//!
//! - [`ensure_role`]: a role of a given name, trust policy and ownership tags exists
//!   (idempotent: created once, adopted when ours, CONFLICT when someone else's);
//! - [`put_inline_policy`] / [`delete_inline_policy`] / [`inline_policy`]: one inline policy
//!   of a role by name (a link adds one least-privilege policy per link);
//! - [`attach_managed_policy`] / [`detach_managed_policy`];
//! - [`delete_role`]: detaches every managed policy, deletes every inline policy, then the
//!   role (IAM refuses to delete a role with policies); a role already gone is success;
//! - [`role_name_of_arn`] and [`policy_json`] (IAM returns documents URL-encoded).
//!
//! Inline policies whose names start with [`RESERVED_POLICY_PREFIX`] (`trellis-`) belong to
//! links: `aws/iam/role` neither reports nor removes them, and refuses that prefix in its own
//! `policies`.

use std::sync::Arc;

use aws_sdk_iam::types::Tag;
use trellis_plugin_sdk::prelude::*;

use crate::common::{self, NameStyle, Owner};
use crate::config::{ClientCache, Clients};
use crate::error::sdk;

/// Inline policies named so are managed by links, not by the role's `policies`.
pub const RESERVED_POLICY_PREFIX: &str = "trellis-";

const MAX_NAME: usize = 64;
const DEFAULT_MAX_SESSION: i32 = 3600;

pub struct Role {
    pub clients: Arc<ClientCache>,
}

/// A role as other code needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoleInfo {
    pub name: String,
    pub arn: String,
    pub role_id: String,
}

/// What [`ensure_role`] makes sure of.
#[derive(Clone, Debug)]
pub struct RoleRequest<'a> {
    /// The role's name (up to 64 characters).
    pub name: &'a str,
    /// The trust policy (AssumeRolePolicyDocument), as JSON.
    pub trust_policy: &'a serde_json::Value,
    /// The blueprint resource that owns the role: its ownership tags name it.
    pub owner: &'a str,
    pub description: Option<&'a str>,
    /// The spec field a CONFLICT is reported at (the field the name comes from).
    pub field: &'a str,
}

/// `arn:aws:iam::123456789012:role/path/name` → `name`.
pub fn role_name_of_arn(arn: &str) -> Option<&str> {
    let (_, rest) = arn.strip_prefix("arn:")?.split_once(":role/")?;
    rest.rsplit('/').next().filter(|s| !s.is_empty())
}

/// A policy document as IAM returns it (URL-encoded JSON text), as JSON. Text that is not
/// JSON either way comes back as a JSON string.
pub fn policy_json(text: &str) -> serde_json::Value {
    if let Ok(v) = serde_json::from_str(text) {
        return v;
    }
    let decoded = percent_decode(text);
    serde_json::from_str(&decoded).unwrap_or(serde_json::Value::String(decoded))
}

/// `%7B%22a%22` → `{"a"`; IAM encodes with `%20` for spaces, so `+` stays `+`.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && let Some(hex) = b.get(i + 1..i + 3)
            && let Some(n) = std::str::from_utf8(hex)
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(n);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A policy document field (a map, or JSON text) as JSON.
fn document_of(v: &Value) -> serde_json::Value {
    match v.revealed() {
        Value::String(s) => serde_json::from_str(s).unwrap_or(serde_json::Value::String(s.clone())),
        other => other.to_json(),
    }
}

/// A document found in IAM, shaped as the blueprint wrote it: JSON text stays text when it
/// means the same, so an unchanged document is not drift.
fn document_value(found: serde_json::Value, applied: Option<&Value>) -> Value {
    if let Some(Value::String(s)) = applied.map(Value::revealed)
        && serde_json::from_str::<serde_json::Value>(s).ok().as_ref() == Some(&found)
    {
        return Value::String(s.clone());
    }
    Value::from_json(found)
}

fn tags_of(role: &aws_sdk_iam::types::Role) -> Vec<(String, String)> {
    let mut tags: Vec<(String, String)> = role
        .tags
        .iter()
        .flatten()
        .map(|t| (t.key.clone(), t.value.clone()))
        .collect();
    tags.sort();
    tags
}

fn iam_tags(tags: &[(String, String)]) -> Result<Vec<Tag>> {
    tags.iter()
        .map(|(k, v)| {
            Tag::builder()
                .key(k)
                .value(v)
                .build()
                .map_err(|e| PluginError::internal(format!("tag {k}: {e}")))
        })
        .collect()
}

fn info(role: &aws_sdk_iam::types::Role) -> RoleInfo {
    RoleInfo {
        name: role.role_name.clone(),
        arn: role.arn.clone(),
        role_id: role.role_id.clone(),
    }
}

/// The role of that name, or None.
pub async fn get_role(c: &Clients, name: &str) -> Result<Option<aws_sdk_iam::types::Role>> {
    match c.iam.get_role().role_name(name).send().await {
        Ok(out) => Ok(out.role),
        Err(e) => {
            let e = sdk(format!("reading IAM role {name}"), e);
            if e.class == ErrorClass::NotFound {
                Ok(None)
            } else {
                Err(e)
            }
        }
    }
}

/// Makes sure role `req.name` exists with `req.trust_policy` and the ownership tags of
/// `req.owner`: creates it, or finds it (ours: the trust policy is set again if it
/// differs; anyone else's: CONFLICT at `req.field`).
pub async fn ensure_role(ctx: &Context, c: &Clients, req: &RoleRequest<'_>) -> Result<RoleInfo> {
    let name = req.name;
    if let Some(role) = get_role(c, name).await? {
        let owner = common::owner(ctx, req.owner, &tags_of(&role));
        if owner != Owner::Ours {
            return Err(common::taken("IAM role", name, &owner, req.field));
        }
        let current = role.assume_role_policy_document.as_deref().map(policy_json);
        if current.as_ref() != Some(req.trust_policy) {
            c.iam
                .update_assume_role_policy()
                .role_name(name)
                .policy_document(req.trust_policy.to_string())
                .send()
                .await
                .map_err(|e| sdk(format!("updating the trust policy of IAM role {name}"), e))?;
        }
        return Ok(info(&role));
    }
    let out = c
        .iam
        .create_role()
        .role_name(name)
        .assume_role_policy_document(req.trust_policy.to_string())
        .set_description(req.description.map(str::to_owned))
        .set_tags(Some(iam_tags(&common::ownership_tags(ctx, req.owner))?))
        .send()
        .await
        .map_err(|e| sdk(format!("creating IAM role {name}"), e))?;
    let role = out.role.ok_or_else(|| {
        PluginError::internal(format!("creating IAM role {name}: no role returned"))
    })?;
    Ok(info(&role))
}

/// Puts (creates or replaces) inline policy `policy` on role `role`.
pub async fn put_inline_policy(
    c: &Clients,
    role: &str,
    policy: &str,
    document: &serde_json::Value,
) -> Result<()> {
    c.iam
        .put_role_policy()
        .role_name(role)
        .policy_name(policy)
        .policy_document(document.to_string())
        .send()
        .await
        .map_err(|e| sdk(format!("putting policy {policy} on IAM role {role}"), e))?;
    Ok(())
}

/// Deletes inline policy `policy` of role `role`; gone already (or the role gone) is success.
pub async fn delete_inline_policy(c: &Clients, role: &str, policy: &str) -> Result<()> {
    match c
        .iam
        .delete_role_policy()
        .role_name(role)
        .policy_name(policy)
        .send()
        .await
    {
        Ok(_) => Ok(()),
        Err(e) => {
            let e = sdk(format!("deleting policy {policy} of IAM role {role}"), e);
            if e.class == ErrorClass::NotFound {
                Ok(())
            } else {
                Err(e)
            }
        }
    }
}

/// Inline policy `policy` of role `role` as JSON, or None when there is none.
pub async fn inline_policy(
    c: &Clients,
    role: &str,
    policy: &str,
) -> Result<Option<serde_json::Value>> {
    match c
        .iam
        .get_role_policy()
        .role_name(role)
        .policy_name(policy)
        .send()
        .await
    {
        Ok(out) => Ok(Some(policy_json(&out.policy_document))),
        Err(e) => {
            let e = sdk(format!("reading policy {policy} of IAM role {role}"), e);
            if e.class == ErrorClass::NotFound {
                Ok(None)
            } else {
                Err(e)
            }
        }
    }
}

/// The names of every inline policy of role `role` (links' included).
pub async fn inline_policy_names(c: &Clients, role: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut marker = None;
    loop {
        let page = c
            .iam
            .list_role_policies()
            .role_name(role)
            .set_marker(marker)
            .send()
            .await
            .map_err(|e| sdk(format!("listing the policies of IAM role {role}"), e))?;
        out.extend(page.policy_names);
        match page.marker.filter(|_| page.is_truncated) {
            Some(m) => marker = Some(m),
            None => return Ok(out),
        }
    }
}

/// The ARNs of the managed policies attached to role `role`.
pub async fn attached_policy_arns(c: &Clients, role: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut marker = None;
    loop {
        let page = c
            .iam
            .list_attached_role_policies()
            .role_name(role)
            .set_marker(marker)
            .send()
            .await
            .map_err(|e| {
                sdk(
                    format!("listing the managed policies of IAM role {role}"),
                    e,
                )
            })?;
        out.extend(
            page.attached_policies
                .unwrap_or_default()
                .into_iter()
                .filter_map(|p| p.policy_arn),
        );
        match page.marker.filter(|_| page.is_truncated) {
            Some(m) => marker = Some(m),
            None => return Ok(out),
        }
    }
}

/// Attaches managed policy `arn` to role `role` (attaching it again changes nothing).
pub async fn attach_managed_policy(c: &Clients, role: &str, arn: &str) -> Result<()> {
    c.iam
        .attach_role_policy()
        .role_name(role)
        .policy_arn(arn)
        .send()
        .await
        .map_err(|e| sdk(format!("attaching policy {arn} to IAM role {role}"), e))?;
    Ok(())
}

/// Detaches managed policy `arn` from role `role`; not attached (or gone) is success.
pub async fn detach_managed_policy(c: &Clients, role: &str, arn: &str) -> Result<()> {
    match c
        .iam
        .detach_role_policy()
        .role_name(role)
        .policy_arn(arn)
        .send()
        .await
    {
        Ok(_) => Ok(()),
        Err(e) => {
            let e = sdk(format!("detaching policy {arn} from IAM role {role}"), e);
            if e.class == ErrorClass::NotFound {
                Ok(())
            } else {
                Err(e)
            }
        }
    }
}

/// Deletes role `role` with everything attached to it: its managed policies are detached
/// and its inline policies deleted first (IAM refuses to delete a role that has any).
/// A role already gone is success.
pub async fn delete_role(c: &Clients, role: &str) -> Result<()> {
    let gone = |e: PluginError| {
        if e.class == ErrorClass::NotFound {
            Ok(())
        } else {
            Err(e)
        }
    };
    let attached = match attached_policy_arns(c, role).await {
        Ok(a) => a,
        Err(e) => return gone(e),
    };
    for arn in attached {
        detach_managed_policy(c, role, &arn).await?;
    }
    let inline = match inline_policy_names(c, role).await {
        Ok(n) => n,
        Err(e) => return gone(e),
    };
    for name in inline {
        delete_inline_policy(c, role, &name).await?;
    }
    match c.iam.delete_role().role_name(role).send().await {
        Ok(_) => Ok(()),
        Err(e) => gone(sdk(format!("deleting IAM role {role}"), e)),
    }
}

/// The role a spec describes, with unset fields at IAM's defaults.
struct Desired {
    path: String,
    trust: serde_json::Value,
    description: String,
    max_session: i32,
    boundary: Option<String>,
    managed: Vec<String>,
    inline: Vec<(String, serde_json::Value)>,
}

impl Desired {
    fn of(spec: &Spec<'_>) -> Result<Desired> {
        let trust = document_of(spec.require("assumeRolePolicyDocument")?);
        let max_session = match spec.opt_i64("maxSessionDuration")? {
            Some(n) => i32::try_from(n).map_err(|_| {
                PluginError::bad_input(format!("`maxSessionDuration` {n} is out of range"))
                    .at(spec.path_of("maxSessionDuration"))
            })?,
            None => DEFAULT_MAX_SESSION,
        };
        let mut inline = Vec::new();
        for p in spec.opt_list("policies")?.unwrap_or_default() {
            inline.push((
                p.get_str("policyName")?.to_owned(),
                document_of(p.require("policyDocument")?),
            ));
        }
        Ok(Desired {
            path: spec.opt_str("path")?.unwrap_or("/").to_owned(),
            trust,
            description: spec.opt_str("description")?.unwrap_or("").to_owned(),
            max_session,
            boundary: spec.opt_str("permissionsBoundary")?.map(str::to_owned),
            managed: spec
                .opt_str_list("managedPolicyArns")?
                .unwrap_or_default()
                .into_iter()
                .map(str::to_owned)
                .collect(),
            inline,
        })
    }
}

fn role_name(ctx: &Context, spec: &Spec<'_>, resource: &str) -> Result<String> {
    common::physical_name(
        ctx,
        spec,
        "roleName",
        resource,
        MAX_NAME,
        NameStyle::Standard,
    )
}

/// Brings role `role` to `want`: trust policy, description and session length, boundary,
/// managed and inline policies (links' `trellis-` policies untouched), tags.
async fn converge(
    ctx: &Context,
    c: &Clients,
    role: &aws_sdk_iam::types::Role,
    want: &Desired,
    spec: &Spec<'_>,
    resource: &str,
) -> Result<()> {
    let name = role.role_name.as_str();
    let trust = role.assume_role_policy_document.as_deref().map(policy_json);
    if trust.as_ref() != Some(&want.trust) {
        c.iam
            .update_assume_role_policy()
            .role_name(name)
            .policy_document(want.trust.to_string())
            .send()
            .await
            .map_err(|e| sdk(format!("updating the trust policy of IAM role {name}"), e))?;
    }
    if role.description.as_deref().unwrap_or("") != want.description
        || role.max_session_duration.unwrap_or(DEFAULT_MAX_SESSION) != want.max_session
    {
        // Both at once: UpdateRole sets what it is given (an empty description clears it).
        c.iam
            .update_role()
            .role_name(name)
            .description(&want.description)
            .max_session_duration(want.max_session)
            .send()
            .await
            .map_err(|e| sdk(format!("updating IAM role {name}"), e))?;
    }
    let boundary = role
        .permissions_boundary
        .as_ref()
        .and_then(|b| b.permissions_boundary_arn.clone());
    if boundary != want.boundary {
        match &want.boundary {
            Some(arn) => {
                c.iam
                    .put_role_permissions_boundary()
                    .role_name(name)
                    .permissions_boundary(arn)
                    .send()
                    .await
                    .map_err(|e| {
                        sdk(
                            format!("setting the permissions boundary of IAM role {name}"),
                            e,
                        )
                        .at("permissionsBoundary")
                    })?;
            }
            None => {
                c.iam
                    .delete_role_permissions_boundary()
                    .role_name(name)
                    .send()
                    .await
                    .map_err(|e| {
                        sdk(
                            format!("removing the permissions boundary of IAM role {name}"),
                            e,
                        )
                    })?;
            }
        }
    }
    let attached = attached_policy_arns(c, name).await?;
    for (i, arn) in want.managed.iter().enumerate() {
        if !attached.contains(arn) {
            attach_managed_policy(c, name, arn)
                .await
                .map_err(|e| e.at(spec.path_of("managedPolicyArns").join_index(i)))?;
        }
    }
    for arn in attached.iter().filter(|a| !want.managed.contains(a)) {
        detach_managed_policy(c, name, arn).await?;
    }
    let names = inline_policy_names(c, name).await?;
    for (i, (policy, doc)) in want.inline.iter().enumerate() {
        let current = if names.contains(policy) {
            inline_policy(c, name, policy).await?
        } else {
            None
        };
        if current.as_ref() != Some(doc) {
            put_inline_policy(c, name, policy, doc)
                .await
                .map_err(|e| e.at(spec.path_of("policies").join_index(i)))?;
        }
    }
    for policy in names.iter().filter(|n| {
        !n.starts_with(RESERVED_POLICY_PREFIX) && !want.inline.iter().any(|(p, _)| p == *n)
    }) {
        delete_inline_policy(c, name, policy).await?;
    }
    let want_tags = common::all_tags(ctx, spec, resource)?;
    let (set, remove) = common::tag_diff(&tags_of(role), &want_tags);
    if !set.is_empty() {
        c.iam
            .tag_role()
            .role_name(name)
            .set_tags(Some(iam_tags(&set)?))
            .send()
            .await
            .map_err(|e| sdk(format!("tagging IAM role {name}"), e))?;
    }
    if !remove.is_empty() {
        c.iam
            .untag_role()
            .role_name(name)
            .set_tag_keys(Some(remove))
            .send()
            .await
            .map_err(|e| sdk(format!("untagging IAM role {name}"), e))?;
    }
    Ok(())
}

fn state(role: &aws_sdk_iam::types::Role) -> Value {
    Value::map()
        .with("arn", role.arn.as_str())
        .with("roleId", role.role_id.as_str())
}

/// `found` in the order of `applied` (those it does not name last, in IAM's order).
fn in_applied_order(mut found: Vec<String>, applied: &[String]) -> Vec<String> {
    found.sort_by_key(|f| applied.iter().position(|a| a == f).unwrap_or(usize::MAX));
    found
}

/// The spec as IAM reports it.
async fn spec_of(
    c: &Clients,
    role: &aws_sdk_iam::types::Role,
    applied: &Spec<'_>,
) -> Result<Value> {
    let name = role.role_name.as_str();
    let mut spec = Value::map()
        .with("roleName", name)
        .with("path", role.path.as_str());
    if let Some(doc) = &role.assume_role_policy_document {
        spec.insert(
            "assumeRolePolicyDocument",
            document_value(policy_json(doc), applied.get("assumeRolePolicyDocument")),
        );
    }
    match role.description.as_deref().filter(|d| !d.is_empty()) {
        Some(d) => {
            spec.insert("description", d);
        }
        None if applied.get("description").is_some() => {
            spec.insert("description", "");
        }
        None => {}
    }
    common::put(
        &mut spec,
        "maxSessionDuration",
        role.max_session_duration.map(i64::from),
    );
    common::put(
        &mut spec,
        "permissionsBoundary",
        role.permissions_boundary
            .as_ref()
            .and_then(|b| b.permissions_boundary_arn.as_deref()),
    );
    let applied_managed: Vec<String> = applied
        .opt_str_list("managedPolicyArns")
        .ok()
        .flatten()
        .unwrap_or_default()
        .into_iter()
        .map(str::to_owned)
        .collect();
    let managed = in_applied_order(attached_policy_arns(c, name).await?, &applied_managed);
    if !managed.is_empty() || applied.get("managedPolicyArns").is_some() {
        spec.insert("managedPolicyArns", Value::from(managed));
    }
    let applied_policies = applied
        .opt_list("policies")
        .ok()
        .flatten()
        .unwrap_or_default();
    let applied_names: Vec<String> = applied_policies
        .iter()
        .filter_map(|p| p.get_str("policyName").ok().map(str::to_owned))
        .collect();
    let names: Vec<String> = inline_policy_names(c, name)
        .await?
        .into_iter()
        .filter(|n| !n.starts_with(RESERVED_POLICY_PREFIX))
        .collect();
    let mut policies = Vec::new();
    for policy in in_applied_order(names, &applied_names) {
        let Some(doc) = inline_policy(c, name, &policy).await? else {
            continue;
        };
        let was = applied_policies
            .iter()
            .find(|p| p.get_str("policyName").ok() == Some(policy.as_str()))
            .and_then(|p| p.get("policyDocument"));
        policies.push(
            Value::map()
                .with("policyName", policy.as_str())
                .with("policyDocument", document_value(doc, was)),
        );
    }
    if !policies.is_empty() || applied.get("policies").is_some() {
        spec.insert("policies", Value::List(policies));
    }
    common::put(
        &mut spec,
        "tags",
        common::tags_value(&tags_of(role), applied),
    );
    Ok(spec)
}

fn valid_name(n: &str, max: usize) -> bool {
    !n.is_empty()
        && n.len() <= max
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+=,.@_-".contains(&b))
}

/// A policy document field: a map, or text that is a JSON object.
fn valid_document(v: &Value) -> bool {
    match v.revealed() {
        Value::Map(_) | Value::Unknown => true,
        Value::String(s) => {
            matches!(
                serde_json::from_str::<serde_json::Value>(s),
                Ok(serde_json::Value::Object(_))
            )
        }
        _ => false,
    }
}

fn valid_policy_arn(a: &str) -> bool {
    a.starts_with("arn:") && a.contains(":policy/")
}

#[async_trait]
impl Resource for Role {
    fn type_name(&self) -> &str {
        "aws/iam/role"
    }

    fn description(&self) -> &str {
        "An IAM role with its trust policy, managed and inline policies. Importable by its name or ARN."
    }

    fn schema(&self) -> Schema {
        Schema::object()
            .describe("An IAM role; fields as CloudFormation's AWS::IAM::Role in lowerCamelCase")
            .field("roleName", Field::string().must_recreate().describe("Up to 64 letters, digits and `+=,.@_-`. Derived from the instance and resource name when not set."))
            .field("path", Field::string().must_recreate().describe("The role's path, `/` by default (like `/service/`)"))
            .field("assumeRolePolicyDocument", Field::any().required().describe("The trust policy: who may assume the role (a JSON object)"))
            .field("description", Field::string().describe("Up to 1000 characters"))
            .field("maxSessionDuration", Field::integer().describe("Longest session, 3600 (the default) to 43200 seconds"))
            .field("managedPolicyArns", Field::array(Schema::string()).describe("ARNs of managed policies to attach"))
            .field(
                "policies",
                Field::array(
                    Schema::object()
                        .field("policyName", Field::string().required().describe("The inline policy's name (the `trellis-` prefix is reserved for links)"))
                        .field("policyDocument", Field::any().required().describe("The policy (a JSON object)")),
                )
                .describe("Inline policies"),
            )
            .field("permissionsBoundary", Field::string().describe("ARN of the managed policy that bounds the role's permissions"))
            .field("tags", common::tags_field())
            .field("arn", Field::string().computed().describe("The role's ARN"))
            .field("roleId", Field::string().computed().describe("The role's stable id (AROA...)"))
    }

    async fn validate(&self, _ctx: &Context, req: &ValidateRequest) -> Result<Vec<Diagnostic>> {
        let spec = req.spec();
        let mut out = Vec::new();
        if let Some(n) = spec.get("roleName").and_then(Value::as_str)
            && !valid_name(n, MAX_NAME)
        {
            out.push(
                Diagnostic::error(
                    "aws.iam.invalid-name",
                    format!("`roleName` \"{n}\" must be 1 to 64 letters, digits or `+=,.@_-`"),
                )
                .at("roleName"),
            );
        }
        if let Some(p) = spec.get("path").and_then(Value::as_str)
            && (!p.starts_with('/') || !p.ends_with('/') || p.len() > 512)
        {
            out.push(
                Diagnostic::error(
                    "aws.iam.invalid-path",
                    format!("`path` \"{p}\" must begin and end with `/` (like `/service/`)"),
                )
                .at("path"),
            );
        }
        if let Some(d) = spec.get("assumeRolePolicyDocument")
            && !valid_document(d)
        {
            out.push(
                Diagnostic::error(
                    "aws.iam.policy-document",
                    "`assumeRolePolicyDocument` must be a JSON object",
                )
                .at("assumeRolePolicyDocument"),
            );
        }
        if let Some(v) = spec.get("maxSessionDuration").and_then(Value::as_i64)
            && !(3600..=43_200).contains(&v)
        {
            out.push(
                Diagnostic::error(
                    "aws.out-of-range",
                    format!("`maxSessionDuration` is {v}; it must be between 3600 and 43200"),
                )
                .at("maxSessionDuration"),
            );
        }
        if let Some(arns) = spec.get("managedPolicyArns").and_then(Value::as_list) {
            for (i, a) in arns.iter().enumerate() {
                if let Some(a) = a.as_str()
                    && !valid_policy_arn(a)
                {
                    out.push(
                        Diagnostic::error(
                            "aws.iam.policy-arn",
                            format!("\"{a}\" is not a managed policy ARN (`arn:aws:iam::aws:policy/...`)"),
                        )
                        .at(spec.path_of("managedPolicyArns").join_index(i)),
                    );
                }
            }
        }
        if let Some(a) = spec.get("permissionsBoundary").and_then(Value::as_str)
            && !valid_policy_arn(a)
        {
            out.push(
                Diagnostic::error(
                    "aws.iam.policy-arn",
                    format!("`permissionsBoundary` \"{a}\" is not a managed policy ARN"),
                )
                .at("permissionsBoundary"),
            );
        }
        if let Some(policies) = spec.get("policies").and_then(Value::as_list) {
            let mut seen = Vec::new();
            for (i, p) in policies.iter().enumerate() {
                let at = spec.path_of("policies").join_index(i);
                if let Some(n) = p.get("policyName").and_then(Value::as_str) {
                    if !valid_name(n, 128) {
                        out.push(
                            Diagnostic::error(
                                "aws.iam.invalid-name",
                                format!("policy name \"{n}\" must be 1 to 128 letters, digits or `+=,.@_-`"),
                            )
                            .at(at.join("policyName")),
                        );
                    } else if n.starts_with(RESERVED_POLICY_PREFIX) {
                        out.push(
                            Diagnostic::error(
                                "aws.iam.reserved-policy-name",
                                format!("policy name \"{n}\": the `{RESERVED_POLICY_PREFIX}` prefix is reserved for policies links add"),
                            )
                            .at(at.join("policyName")),
                        );
                    }
                    if seen.contains(&n) {
                        out.push(
                            Diagnostic::error(
                                "aws.iam.duplicate-policy",
                                format!("policy name \"{n}\" is used twice"),
                            )
                            .at(at.join("policyName")),
                        );
                    }
                    seen.push(n);
                }
                if let Some(d) = p.get("policyDocument")
                    && !valid_document(d)
                {
                    out.push(
                        Diagnostic::error(
                            "aws.iam.policy-document",
                            "`policyDocument` must be a JSON object",
                        )
                        .at(at.join("policyDocument")),
                    );
                }
            }
        }
        Ok(out)
    }

    async fn create(&self, ctx: &Context, req: &CreateRequest) -> Result<Applied> {
        let c = self.clients.get(ctx).await?;
        let spec = req.spec();
        let name = role_name(ctx, &spec, &req.name)?;
        let want = Desired::of(&spec)?;
        let role = match get_role(&c, &name).await? {
            Some(role) => {
                common::adopt_or_conflict(
                    ctx,
                    &req.name,
                    &tags_of(&role),
                    "IAM role",
                    &name,
                    "roleName",
                )?;
                role
            }
            None => c
                .iam
                .create_role()
                .role_name(&name)
                .path(&want.path)
                .assume_role_policy_document(want.trust.to_string())
                .set_description(Some(want.description.clone()).filter(|d| !d.is_empty()))
                .max_session_duration(want.max_session)
                .set_permissions_boundary(want.boundary.clone())
                .set_tags(Some(iam_tags(&common::all_tags(ctx, &spec, &req.name)?)?))
                .send()
                .await
                .map_err(|e| sdk(format!("creating IAM role {name}"), e))?
                .role
                .ok_or_else(|| {
                    PluginError::internal(format!("creating IAM role {name}: no role returned"))
                })?,
        };
        // From here the role exists: a failure records it, so it is not orphaned.
        let partial = |e: PluginError| e.with_partial(name.clone(), state(&role));
        converge(ctx, &c, &role, &want, &spec, &req.name)
            .await
            .map_err(partial)?;
        Ok(Applied::new(name.clone(), state(&role)))
    }

    async fn update(&self, ctx: &Context, req: &UpdateRequest) -> Result<Applied> {
        let c = self.clients.get(ctx).await?;
        let spec = req.spec();
        let name = if req.current.external_id.is_empty() {
            role_name(ctx, &spec, &req.name)?
        } else {
            req.current.external_id.clone()
        };
        let role = get_role(&c, &name)
            .await?
            .ok_or_else(|| PluginError::not_found(format!("IAM role {name} no longer exists")))?;
        converge(ctx, &c, &role, &Desired::of(&spec)?, &spec, &req.name).await?;
        Ok(Applied::new(name, state(&role)))
    }

    async fn destroy(&self, ctx: &Context, current: &ResourceState) -> Result<()> {
        let c = self.clients.get(ctx).await?;
        if !current.external_id.is_empty() {
            return delete_role(&c, &current.external_id).await;
        }
        // Never recorded: delete the role of that name only when it is ours.
        let name = role_name(ctx, &current.spec(), &current.name)?;
        match get_role(&c, &name).await? {
            Some(role) if common::owner(ctx, &current.name, &tags_of(&role)) == Owner::Ours => {
                delete_role(&c, &name).await
            }
            _ => Ok(()),
        }
    }

    fn supports_read(&self) -> bool {
        true
    }

    async fn read(&self, ctx: &Context, current: &ResourceState) -> Result<Option<ReadState>> {
        let c = self.clients.get(ctx).await?;
        let spec = current.spec();
        let name = if current.external_id.is_empty() {
            role_name(ctx, &spec, &current.name)?
        } else {
            current.external_id.clone()
        };
        let Some(role) = get_role(&c, &name).await? else {
            return Ok(None);
        };
        if current.external_id.is_empty()
            && common::owner(ctx, &current.name, &tags_of(&role)) != Owner::Ours
        {
            // Someone else's role of that name: ours was never created.
            return Ok(None);
        }
        let found = match spec_of(&c, &role, &spec).await {
            Ok(s) => s,
            Err(e) if e.class == ErrorClass::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        Ok(Some(ReadState {
            spec: found,
            state: state(&role),
            external_id: Some(name),
        }))
    }

    fn supports_import(&self) -> bool {
        true
    }

    /// By the role's name or ARN (`arn:aws:iam::<account>:role/<path><name>`); the external id
    /// is its name. Inline policies named `trellis-...` belong to links and are left out, as
    /// read leaves them out.
    async fn import(&self, ctx: &Context, req: &ImportRequest) -> Result<Option<ReadState>> {
        let c = self.clients.get(ctx).await?;
        let id = common::import_id(req, "the role's name or ARN")?;
        let name = match common::import_arn(&c, id, "iam").await? {
            Some(_) => role_name_of_arn(id).ok_or_else(|| {
                PluginError::bad_input(format!(
                    "`{id}` is not a role's ARN (`arn:aws:iam::<account>:role/<name>`)"
                ))
            })?,
            None => id,
        };
        self.read(ctx, &common::import_state(req, name, Value::map()))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_names_of_arns() {
        assert_eq!(
            role_name_of_arn("arn:aws:iam::123456789012:role/service/fn-role"),
            Some("fn-role")
        );
        assert_eq!(role_name_of_arn("arn:aws-cn:iam::1:role/r"), Some("r"));
        assert_eq!(role_name_of_arn("arn:aws:iam::1:policy/p"), None);
        assert_eq!(role_name_of_arn("r"), None);
    }

    #[test]
    fn documents_are_decoded() {
        let doc = serde_json::json!({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "a:b+c", "Resource": "*"}]});
        let encoded = "%7B%22Version%22%3A%20%222012-10-17%22%2C%20%22Statement%22%3A%20%5B%7B%22Effect%22%3A%20%22Allow%22%2C%20%22Action%22%3A%20%22a%3Ab+c%22%2C%20%22Resource%22%3A%20%22%2A%22%7D%5D%7D";
        assert_eq!(policy_json(encoded), doc);
        assert_eq!(policy_json(&doc.to_string()), doc);
        assert_eq!(
            policy_json("%zz"),
            serde_json::Value::String("%zz".to_owned())
        );
    }

    #[test]
    fn text_documents_read_back_as_text() {
        let text = r#"{"Version": "2012-10-17"}"#;
        let found = serde_json::json!({"Version": "2012-10-17"});
        assert_eq!(
            document_value(found.clone(), Some(&Value::from(text))),
            Value::from(text)
        );
        assert_eq!(document_value(found.clone(), None), Value::from_json(found));
    }
}
