//! `aws/ssm/parameter` (CloudFormation `AWS::SSM::Parameter`).
//!
//! A SecureString parameter's value is a secret: read returns it sensitive, and no message
//! carries a value of any type.

use std::sync::Arc;

use aws_sdk_ssm::types as t;
use trellis_plugin_sdk::prelude::*;

use crate::common::{self, NameStyle};
use crate::config::{ClientCache, Clients};
use crate::error::sdk;

pub struct Parameter {
    pub clients: Arc<ClientCache>,
}

const MAX_NAME: usize = 1011;
const TYPES: [&str; 3] = ["String", "StringList", "SecureString"];
const TIERS: [&str; 3] = ["Standard", "Advanced", "Intelligent-Tiering"];
const DATA_TYPES: [&str; 3] = ["text", "aws:ec2:image", "aws:ssm:integration"];

/// What a parameter holds, as the spec asks for it or as AWS reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Settings {
    kind: String,
    value: String,
    description: String,
    allowed_pattern: String,
    tier: Option<String>,
    data_type: String,
}

impl Settings {
    fn from_spec(spec: &Spec<'_>) -> Result<Settings> {
        Ok(Settings {
            kind: spec.opt_str("type")?.unwrap_or("String").to_owned(),
            value: spec.get_str("value")?.to_owned(),
            // Absent is empty: an overwrite keeps the old description unless given one.
            description: spec.opt_str("description")?.unwrap_or_default().to_owned(),
            allowed_pattern: spec
                .opt_str("allowedPattern")?
                .unwrap_or_default()
                .to_owned(),
            tier: spec.opt_str("tier")?.map(str::to_owned),
            data_type: spec.opt_str("dataType")?.unwrap_or("text").to_owned(),
        })
    }

    /// Whether a PutParameter would change anything. A tier AWS chose (Intelligent-Tiering)
    /// or kept (AWS never lowers one by itself) is not a change unless the spec names another.
    fn differs(&self, have: &Settings) -> bool {
        let tier = match (&self.tier, &have.tier) {
            (Some(w), Some(h)) => w != h && w != "Intelligent-Tiering",
            (Some(w), None) => w != "Standard",
            _ => false,
        };
        self.kind != have.kind
            || self.value != have.value
            || self.description != have.description
            || self.allowed_pattern != have.allowed_pattern
            || self.data_type != have.data_type
            || tier
    }
}

fn param_name(ctx: &Context, spec: &Spec<'_>, resource_name: &str) -> Result<String> {
    common::physical_name(
        ctx,
        spec,
        "name",
        resource_name,
        MAX_NAME,
        NameStyle::Standard,
    )
}

/// The parameter's name: the id the engine recorded, else the one the spec gives.
fn current_name(ctx: &Context, current: &ResourceState) -> Result<String> {
    if current.external_id.is_empty() {
        param_name(ctx, &current.spec(), &current.name)
    } else {
        Ok(current.external_id.clone())
    }
}

async fn arn_of(c: &Clients, name: &str) -> Result<String> {
    Ok(format!(
        "arn:{}:ssm:{}:{}:parameter/{}",
        c.partition(),
        c.region,
        c.account().await?,
        name.trim_start_matches('/')
    ))
}

/// The parameter as AWS has it (value decrypted), with its version; None when absent.
async fn find(c: &Clients, name: &str) -> Result<Option<(Settings, i64)>> {
    let got = match c
        .ssm
        .get_parameter()
        .name(name)
        .with_decryption(true)
        .send()
        .await
    {
        Ok(out) => out.parameter,
        Err(e) => {
            let e = sdk(format!("reading parameter {name}"), e);
            if e.class == ErrorClass::NotFound {
                return Ok(None);
            }
            return Err(e);
        }
    };
    let Some(p) = got else { return Ok(None) };
    let filter = t::ParameterStringFilter::builder()
        .key("Name")
        .option("Equals")
        .values(name)
        .build()
        .map_err(|e| PluginError::internal(format!("building an SSM request: {e}")))?;
    let meta = c
        .ssm
        .describe_parameters()
        .parameter_filters(filter)
        .send()
        .await
        .map_err(|e| sdk(format!("describing parameter {name}"), e))?;
    let meta = meta.parameters().first();
    Ok(Some((
        Settings {
            kind: p
                .r#type()
                .map_or("String", t::ParameterType::as_str)
                .to_owned(),
            value: p.value().unwrap_or_default().to_owned(),
            description: meta
                .and_then(t::ParameterMetadata::description)
                .unwrap_or_default()
                .to_owned(),
            allowed_pattern: meta
                .and_then(t::ParameterMetadata::allowed_pattern)
                .unwrap_or_default()
                .to_owned(),
            tier: meta
                .and_then(t::ParameterMetadata::tier)
                .map(|t| t.as_str().to_owned()),
            data_type: p.data_type().unwrap_or("text").to_owned(),
        },
        p.version(),
    )))
}

async fn tags_of(c: &Clients, name: &str) -> Result<Vec<(String, String)>> {
    let out = c
        .ssm
        .list_tags_for_resource()
        .resource_type(t::ResourceTypeForTagging::Parameter)
        .resource_id(name)
        .send()
        .await
        .map_err(|e| sdk(format!("reading the tags of parameter {name}"), e))?;
    let mut tags: Vec<(String, String)> = out
        .tag_list()
        .iter()
        .map(|t| (t.key().to_owned(), t.value().to_owned()))
        .collect();
    tags.sort();
    Ok(tags)
}

fn tag_list(tags: Vec<(String, String)>) -> Result<Vec<t::Tag>> {
    tags.into_iter()
        .map(|(k, v)| {
            t::Tag::builder()
                .key(k)
                .value(v)
                .build()
                .map_err(|e| PluginError::internal(format!("building an SSM tag: {e}")))
        })
        .collect()
}

/// PutParameter. Values never appear in messages, whatever their type.
async fn put(
    c: &Clients,
    name: &str,
    want: &Settings,
    tags: Option<Vec<(String, String)>>,
) -> Result<()> {
    let overwrite = tags.is_none();
    let mut call = c
        .ssm
        .put_parameter()
        .name(name)
        .value(&want.value)
        .r#type(t::ParameterType::from(want.kind.as_str()))
        .data_type(&want.data_type)
        .overwrite(overwrite)
        .set_tier(want.tier.as_deref().map(t::ParameterTier::from));
    // Empty text clears an overwritten parameter's description and pattern (an overwrite
    // keeps what it is not given); a new parameter has nothing to clear.
    if overwrite || !want.description.is_empty() {
        call = call.description(&want.description);
    }
    if overwrite || !want.allowed_pattern.is_empty() {
        call = call.allowed_pattern(&want.allowed_pattern);
    }
    if let Some(tags) = tags {
        call = call.set_tags(Some(tag_list(tags)?));
    }
    call.send().await.map_err(|e| {
        let mut e = sdk(format!("writing parameter {name}"), e);
        // A message may quote the value (a pattern mismatch does): never pass it on.
        if e.message.contains(&want.value) {
            e.message = format!("writing parameter {name}: AWS refused the value");
        }
        e
    })?;
    Ok(())
}

async fn converge_tags(c: &Clients, name: &str, want: &[(String, String)]) -> Result<()> {
    let have = tags_of(c, name).await?;
    let (set, remove) = common::tag_diff(&have, want);
    if !set.is_empty() {
        c.ssm
            .add_tags_to_resource()
            .resource_type(t::ResourceTypeForTagging::Parameter)
            .resource_id(name)
            .set_tags(Some(tag_list(set)?))
            .send()
            .await
            .map_err(|e| sdk(format!("tagging parameter {name}"), e))?;
    }
    if !remove.is_empty() {
        c.ssm
            .remove_tags_from_resource()
            .resource_type(t::ResourceTypeForTagging::Parameter)
            .resource_id(name)
            .set_tag_keys(Some(remove))
            .send()
            .await
            .map_err(|e| sdk(format!("untagging parameter {name}"), e))?;
    }
    Ok(())
}

/// Writes the value and settings when they differ, then the tags.
async fn converge(
    ctx: &Context,
    c: &Clients,
    name: &str,
    spec: &Spec<'_>,
    resource: &str,
) -> Result<i64> {
    let want = Settings::from_spec(spec)?;
    let have = find(c, name).await?;
    if have.as_ref().is_none_or(|(h, _)| want.differs(h)) {
        put(c, name, &want, None).await?;
    }
    converge_tags(c, name, &common::all_tags(ctx, spec, resource)?).await?;
    version_of(c, name).await
}

async fn version_of(c: &Clients, name: &str) -> Result<i64> {
    match find(c, name).await? {
        Some((_, v)) => Ok(v),
        None => Err(PluginError::not_found(format!(
            "parameter {name} disappeared while it was being written"
        ))),
    }
}

async fn state(c: &Clients, name: &str, version: i64) -> Result<Value> {
    Ok(Value::map()
        .with("arn", arn_of(c, name).await?)
        .with("version", version))
}

fn valid_name(n: &str) -> Option<&'static str> {
    let bare = n.strip_prefix('/').unwrap_or(n).to_ascii_lowercase();
    if n.is_empty() || n.len() > 2048 {
        Some("must be 1 to 2048 characters")
    } else if !n
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-' | b'/'))
    {
        Some("may hold letters, digits, `_`, `.`, `-` and `/` only")
    } else if bare.starts_with("aws") || bare.starts_with("ssm") {
        Some("must not begin with `aws` or `ssm` (reserved by AWS)")
    } else if n.contains('/') && !n.starts_with('/') {
        Some("is a path, so it begins with `/`")
    } else if n.contains("//") || (n.len() > 1 && n.ends_with('/')) {
        Some("has an empty path segment")
    } else if n.matches('/').count() > 15 {
        Some("has more than 15 levels")
    } else {
        None
    }
}

fn check(spec: &Value) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let text = |k: &str| spec.get(k).and_then(Value::as_str);
    if let Some(n) = text("name")
        && let Some(why) = valid_name(n)
    {
        out.push(
            Diagnostic::error("aws.ssm.invalid-name", format!("`name` \"{n}\" {why}")).at("name"),
        );
    }
    let advanced = matches!(text("tier"), Some("Advanced" | "Intelligent-Tiering"));
    if let Some(v) = text("value") {
        let max = if advanced { 8192 } else { 4096 };
        if v.is_empty() {
            out.push(
                Diagnostic::error("aws.ssm.empty-value", "`value` must not be empty").at("value"),
            );
        } else if v.len() > max {
            // The length only: the value may be a secret.
            out.push(
                Diagnostic::error(
                    "aws.ssm.value-too-long",
                    format!(
                        "`value` is {} bytes; the {} tier takes at most {max}",
                        v.len(),
                        if advanced { "Advanced" } else { "Standard" }
                    ),
                )
                .at("value")
                .hint("set `tier: Advanced` for values up to 8192 bytes"),
            );
        }
    }
    if let Some(d) = text("description")
        && d.chars().count() > 1024
    {
        out.push(
            Diagnostic::error(
                "aws.ssm.description-too-long",
                "`description` is longer than 1024 characters",
            )
            .at("description"),
        );
    }
    if let Some(dt) = text("dataType")
        && dt != "text"
        && text("type").is_some_and(|t| t != "String")
    {
        out.push(
            Diagnostic::error(
                "aws.ssm.data-type",
                format!("`dataType: {dt}` applies to `type: String` only"),
            )
            .at("dataType"),
        );
    }
    out
}

#[async_trait]
impl Resource for Parameter {
    fn type_name(&self) -> &str {
        "aws/ssm/parameter"
    }

    fn description(&self) -> &str {
        "A Systems Manager Parameter Store parameter. Importable by its name (or path) or ARN."
    }

    fn schema(&self) -> Schema {
        Schema::object()
            .describe("An SSM parameter; fields as CloudFormation's AWS::SSM::Parameter in lowerCamelCase")
            .field("name", Field::string().must_recreate().describe("The name, or a path beginning with `/` (`/orders/db/host`). Derived from the instance and resource name when not set."))
            .field("type", Field::string().default("String").allowed(TYPES).describe("String (the default), StringList (comma-separated) or SecureString (encrypted with the account's default SSM key; its value is read back as a secret)"))
            .field("value", Field::string().required().describe("The value (up to 4096 bytes; 8192 in the Advanced tier)"))
            .field("description", Field::string().describe("Up to 1024 characters"))
            .field("allowedPattern", Field::string().describe("A regular expression the value must match"))
            .field("tier", Field::string().allowed(TIERS).describe("Standard (the default), Advanced or Intelligent-Tiering; AWS cannot move a parameter back to Standard"))
            .field("dataType", Field::string().allowed(DATA_TYPES).describe("text (the default), aws:ec2:image or aws:ssm:integration"))
            .field("tags", common::tags_field())
            .field("arn", Field::string().computed().describe("The parameter's ARN"))
            .field("version", Field::integer().computed().describe("The parameter's version, one more at every change of its value or settings"))
    }

    async fn validate(&self, _ctx: &Context, req: &ValidateRequest) -> Result<Vec<Diagnostic>> {
        Ok(check(&req.spec))
    }

    async fn create(&self, ctx: &Context, req: &CreateRequest) -> Result<Applied> {
        let c = self.clients.get(ctx).await?;
        let spec = req.spec();
        let name = param_name(ctx, &spec, &req.name)?;
        let version = if find(&c, &name).await?.is_some() {
            let tags = tags_of(&c, &name).await?;
            common::adopt_or_conflict(ctx, &req.name, &tags, "parameter", &name, "name")?;
            converge(ctx, &c, &name, &spec, &req.name).await?
        } else {
            let want = Settings::from_spec(&spec)?;
            put(
                &c,
                &name,
                &want,
                Some(common::all_tags(ctx, &spec, &req.name)?),
            )
            .await?;
            version_of(&c, &name).await?
        };
        Ok(Applied::new(name.clone(), state(&c, &name, version).await?))
    }

    async fn update(&self, ctx: &Context, req: &UpdateRequest) -> Result<Applied> {
        let c = self.clients.get(ctx).await?;
        let name = current_name(ctx, &req.current)?;
        let version = converge(ctx, &c, &name, &req.spec(), &req.name).await?;
        Ok(Applied::new(name.clone(), state(&c, &name, version).await?))
    }

    async fn destroy(&self, ctx: &Context, current: &ResourceState) -> Result<()> {
        let c = self.clients.get(ctx).await?;
        let name = current_name(ctx, current)?;
        if current.external_id.is_empty() {
            if find(&c, &name).await?.is_none() {
                return Ok(());
            }
            let tags = tags_of(&c, &name).await?;
            if common::owner(ctx, &current.name, &tags) != common::Owner::Ours {
                // Someone else's parameter of that name: ours was never created.
                return Ok(());
            }
        }
        match c.ssm.delete_parameter().name(&name).send().await {
            Ok(_) => Ok(()),
            Err(e) => {
                let e = sdk(format!("deleting parameter {name}"), e);
                if e.class == ErrorClass::NotFound {
                    Ok(())
                } else {
                    Err(e)
                }
            }
        }
    }

    fn supports_read(&self) -> bool {
        true
    }

    async fn read(&self, ctx: &Context, current: &ResourceState) -> Result<Option<ReadState>> {
        let c = self.clients.get(ctx).await?;
        let applied = current.spec();
        let name = current_name(ctx, current)?;
        let Some((have, version)) = find(&c, &name).await? else {
            return Ok(None);
        };
        let tags = tags_of(&c, &name).await?;
        if current.external_id.is_empty()
            && common::owner(ctx, &current.name, &tags) != common::Owner::Ours
        {
            // Someone else's parameter of that name: ours was never created.
            return Ok(None);
        }
        let value = if have.kind == "SecureString" {
            Value::sensitive(have.value.as_str())
        } else {
            Value::from(have.value.as_str())
        };
        let mut spec = Value::map()
            .with("name", name.as_str())
            .with("type", have.kind.as_str())
            .with("value", value)
            .with("dataType", have.data_type.as_str());
        if !have.description.is_empty() {
            spec.insert("description", have.description.as_str());
        }
        if !have.allowed_pattern.is_empty() {
            spec.insert("allowedPattern", have.allowed_pattern.as_str());
        }
        // Intelligent-Tiering is a choice AWS makes at each write, reported as the tier
        // it chose: the blueprint's word stands.
        let tier = match (applied.get("tier").and_then(Value::as_str), &have.tier) {
            (Some("Intelligent-Tiering"), _) => Some("Intelligent-Tiering"),
            (_, t) => t.as_deref(),
        };
        common::put(&mut spec, "tier", tier);
        common::put(&mut spec, "tags", common::tags_value(&tags, &applied));
        Ok(Some(ReadState {
            spec,
            state: state(&c, &name, version).await?,
            external_id: Some(name),
        }))
    }

    fn supports_import(&self) -> bool {
        true
    }

    /// By the parameter's name (or path) or ARN (`arn:aws:ssm:<region>:<account>:parameter/<name
    /// without its leading />`); the external id is its name. The value is read decrypted, a
    /// SecureString's as a secret. A SecureString encrypted with a key other than the
    /// account's default SSM key imports too (the spec has no field for the key; applying it
    /// leaves the key as it is).
    async fn import(&self, ctx: &Context, req: &ImportRequest) -> Result<Option<ReadState>> {
        let c = self.clients.get(ctx).await?;
        let id = common::import_id(req, "the parameter's name or ARN")?;
        let name = match common::import_arn(&c, id, "ssm").await? {
            Some(arn) => match arn.resource.strip_prefix("parameter/") {
                // A path's ARN drops its leading `/`: a name with `/` in it is a path.
                Some(n) if n.contains('/') => format!("/{n}"),
                Some(n) if !n.is_empty() => n.to_owned(),
                _ => {
                    return Err(PluginError::bad_input(format!(
                        "`{id}` is not a parameter's ARN (`arn:aws:ssm:<region>:<account>:parameter/<name>`)"
                    )));
                }
            },
            None => id.to_owned(),
        };
        self.read(ctx, &common::import_state(req, &name, Value::map()))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["db-host", "/orders/db/host", "a.b_c-d"] {
            assert_eq!(valid_name(ok), None, "{ok}");
        }
        for bad in [
            "",
            "orders/db",
            "/aws/x",
            "ssm-thing",
            "a b",
            "/a//b",
            "/a/",
        ] {
            assert!(valid_name(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn a_long_secret_is_reported_by_its_length_only() {
        let secret = "s".repeat(5000);
        let d = check(
            &Value::map()
                .with("type", "SecureString")
                .with("value", Value::sensitive(secret.as_str())),
        );
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].code, "aws.ssm.value-too-long");
        assert!(!d[0].message.contains(&secret));
    }
}
