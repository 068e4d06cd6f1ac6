//! `aws/secretsmanager/secret` (CloudFormation `AWS::SecretsManager::Secret`; the name field
//! is `secretName`, as the specification's example writes it).
//!
//! The secret's value never appears in a message or a log line: errors name the secret,
//! never what it holds. Read reports the value only when the blueprint set `secretString`
//! (a generated value is the secret's own business), and then as a sensitive value.

use std::sync::Arc;

use aws_sdk_secretsmanager::types as t;
use sha2::{Digest, Sha256};
use trellis_plugin_sdk::prelude::*;

use crate::common::{self, NameStyle};
use crate::config::{ClientCache, Clients};
use crate::error::sdk;

pub struct Secret {
    pub clients: Arc<ClientCache>,
}

const MAX_NAME: usize = 512;
/// The key Secrets Manager uses when none is named; setting it is how a dropped
/// `kmsKeyId` goes back to the default.
const DEFAULT_KEY: &str = "alias/aws/secretsmanager";

fn secret_name(ctx: &Context, spec: &Spec<'_>, resource_name: &str) -> Result<String> {
    common::physical_name(
        ctx,
        spec,
        "secretName",
        resource_name,
        MAX_NAME,
        NameStyle::Standard,
    )
}

/// The secret's id for calls: its ARN as recorded, else its name.
fn secret_id(ctx: &Context, current: &ResourceState) -> Result<String> {
    if current.external_id.is_empty() {
        secret_name(ctx, &current.spec(), &current.name)
    } else {
        Ok(current.external_id.clone())
    }
}

/// A ClientRequestToken (Secrets Manager wants 32 to 64 characters) from the call's
/// idempotency key: a retried call sends the same token, which AWS answers as the same
/// request instead of making a second version. None without a key.
fn request_token(ctx: &Context, what: &str, name: &str) -> Option<String> {
    let key = ctx.idempotency_key();
    if key.is_empty() {
        return None;
    }
    let digest = Sha256::digest(format!("{key}/{what}/{name}").as_bytes());
    Some(digest.iter().map(|b| format!("{b:02x}")).collect())
}

async fn describe(
    c: &Clients,
    id: &str,
) -> Result<Option<aws_sdk_secretsmanager::operation::describe_secret::DescribeSecretOutput>> {
    match c.secrets.describe_secret().secret_id(id).send().await {
        Ok(out) => Ok(Some(out)),
        Err(e) => {
            let e = sdk(format!("reading secret {id}"), e);
            if e.class == ErrorClass::NotFound {
                Ok(None)
            } else {
                Err(e)
            }
        }
    }
}

fn tags_of(tags: &[t::Tag]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = tags
        .iter()
        .filter_map(|t| Some((t.key()?.to_owned(), t.value()?.to_owned())))
        .collect();
    out.sort();
    out
}

fn tag_list(tags: &[(String, String)]) -> Vec<t::Tag> {
    tags.iter()
        .map(|(k, v)| t::Tag::builder().key(k).value(v).build())
        .collect()
}

/// The current value, None when the secret has none.
async fn value_of(c: &Clients, id: &str) -> Result<Option<String>> {
    match c.secrets.get_secret_value().secret_id(id).send().await {
        Ok(out) => Ok(out.secret_string().map(str::to_owned)),
        Err(e) => {
            let e = sdk(format!("reading the value of secret {id}"), e);
            if e.class == ErrorClass::NotFound {
                Ok(None)
            } else {
                Err(e)
            }
        }
    }
}

/// A value made by GetRandomPassword per `generateSecretString`: the password itself, or
/// the template with the password at `generateStringKey`.
async fn generate(c: &Clients, g: &Spec<'_>) -> Result<String> {
    let mut call = c
        .secrets
        .get_random_password()
        .set_password_length(g.opt_i64("passwordLength")?)
        .set_exclude_characters(g.opt_str("excludeCharacters")?.map(str::to_owned))
        .set_exclude_numbers(g.opt_bool("excludeNumbers")?)
        .set_exclude_punctuation(g.opt_bool("excludePunctuation")?)
        .set_exclude_uppercase(g.opt_bool("excludeUppercase")?)
        .set_exclude_lowercase(g.opt_bool("excludeLowercase")?)
        .set_include_space(g.opt_bool("includeSpace")?);
    if let Some(b) = g.opt_bool("requireEachIncludedType")? {
        call = call.require_each_included_type(b);
    }
    let out = call.send().await.map_err(|e| {
        sdk(
            "generating a secret value (secretsmanager:GetRandomPassword)",
            e,
        )
    })?;
    let password = out
        .random_password()
        .ok_or_else(|| PluginError::internal("GetRandomPassword returned no password"))?
        .to_owned();
    let Some(template) = g.opt_str("secretStringTemplate")? else {
        return Ok(password);
    };
    let key = g.get_str("generateStringKey")?;
    let mut doc: serde_json::Map<String, serde_json::Value> = serde_json::from_str(template)
        .map_err(|_| {
            PluginError::bad_input("`secretStringTemplate` must be a JSON object")
                .at(g.path_of("secretStringTemplate"))
        })?;
    doc.insert(key.to_owned(), serde_json::Value::String(password));
    Ok(serde_json::Value::Object(doc).to_string())
}

/// The value a create sets: `secretString`, a generated one, or none.
async fn initial_value(c: &Clients, spec: &Spec<'_>) -> Result<Option<String>> {
    if let Some(v) = spec.opt_str("secretString")? {
        return Ok(Some(v.to_owned()));
    }
    match spec.opt_object("generateSecretString")? {
        Some(g) => generate(c, &g).await.map(Some),
        None => Ok(None),
    }
}

async fn put_value(ctx: &Context, c: &Clients, id: &str, name: &str, value: String) -> Result<()> {
    ctx.progress(format!("setting the value of secret {name}"), None);
    c.secrets
        .put_secret_value()
        .secret_id(id)
        .secret_string(value)
        .set_client_request_token(request_token(ctx, "put", name))
        .send()
        .await
        .map_err(|e| sdk(format!("setting the value of secret {name}"), e))?;
    Ok(())
}

/// Brings an existing secret to `spec`: description, key, value, tags. `before` is the
/// spec last applied (None when adopting).
async fn converge(
    ctx: &Context,
    c: &Clients,
    id: &str,
    spec: &Spec<'_>,
    before: Option<&Spec<'_>>,
    resource: &str,
) -> Result<()> {
    let Some(d) = describe(c, id).await? else {
        return Err(PluginError::not_found(format!(
            "secret {id} does not exist"
        )));
    };
    let name = d.name().unwrap_or(id).to_owned();
    let want_desc = spec.opt_str("description")?.unwrap_or_default();
    let desc = (want_desc != d.description().unwrap_or_default()).then_some(want_desc);
    let before_key = before
        .and_then(|b| b.get("kmsKeyId"))
        .and_then(Value::as_str);
    let want_key = spec.opt_str("kmsKeyId")?;
    let key = match (want_key, before_key) {
        (Some(w), Some(b)) if w == b => None,
        (Some(w), Some(_)) => Some(w),
        (Some(w), None) => (Some(w) != d.kms_key_id()).then_some(w),
        (None, Some(_)) => Some(DEFAULT_KEY),
        (None, None) => None,
    };
    if desc.is_some() || key.is_some() {
        c.secrets
            .update_secret()
            .secret_id(id)
            .set_description(desc.map(str::to_owned))
            .set_kms_key_id(key.map(str::to_owned))
            .send()
            .await
            .map_err(|e| sdk(format!("updating secret {name}"), e))?;
    }

    // The value: the blueprint's when it sets one (when it differs from AWS's); a new
    // generated one when the generator's settings changed or replace a set value.
    if let Some(v) = spec.opt_str("secretString")? {
        if value_of(c, id).await?.as_deref() != Some(v) {
            put_value(ctx, c, id, &name, v.to_owned()).await?;
        }
    } else if let Some(g) = spec.opt_object("generateSecretString")?
        && let Some(before) = before
        && (before.get("secretString").is_some()
            || before.get("generateSecretString").map(Value::revealed)
                != Some(g.value().revealed()))
    {
        let v = generate(c, &g).await?;
        put_value(ctx, c, id, &name, v).await?;
    }

    let want = common::all_tags(ctx, spec, resource)?;
    let (set, remove) = common::tag_diff(&tags_of(d.tags()), &want);
    if !set.is_empty() {
        c.secrets
            .tag_resource()
            .secret_id(id)
            .set_tags(Some(tag_list(&set)))
            .send()
            .await
            .map_err(|e| sdk(format!("tagging secret {name}"), e))?;
    }
    if !remove.is_empty() {
        c.secrets
            .untag_resource()
            .secret_id(id)
            .set_tag_keys(Some(remove))
            .send()
            .await
            .map_err(|e| sdk(format!("untagging secret {name}"), e))?;
    }
    Ok(())
}

fn state(arn: &str) -> Value {
    // CloudFormation's Ref and `Id` of a secret are both its ARN.
    Value::map().with("arn", arn).with("id", arn)
}

/// Adopts secret `name` found at create when it is this resource's (restoring it when an
/// earlier destroy scheduled it for deletion), then converges it.
async fn adopt(
    ctx: &Context,
    c: &Clients,
    d: &aws_sdk_secretsmanager::operation::describe_secret::DescribeSecretOutput,
    spec: &Spec<'_>,
    resource: &str,
    name: &str,
) -> Result<String> {
    common::adopt_or_conflict(
        ctx,
        resource,
        &tags_of(d.tags()),
        "secret",
        name,
        "secretName",
    )?;
    let arn = d.arn().unwrap_or(name).to_owned();
    if d.deleted_date().is_some() {
        ctx.progress(
            format!("restoring secret {name}, scheduled for deletion"),
            None,
        );
        c.secrets
            .restore_secret()
            .secret_id(&arn)
            .send()
            .await
            .map_err(|e| sdk(format!("restoring secret {name}"), e))?;
    }
    converge(ctx, c, &arn, spec, None, resource).await?;
    Ok(arn)
}

fn check(spec: &Value) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let text = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
    if let Some(n) = text(spec, "secretName") {
        if n.is_empty()
            || n.len() > MAX_NAME
            || !n.bytes().all(|b| {
                b.is_ascii_alphanumeric()
                    || matches!(b, b'/' | b'_' | b'+' | b'=' | b'.' | b'@' | b'-')
            })
        {
            out.push(
                Diagnostic::error(
                    "aws.secretsmanager.invalid-name",
                    format!("`secretName` \"{n}\" must be 1 to 512 letters, digits and `/_+=.@-`"),
                )
                .at("secretName"),
            );
        } else if n.len() > 7
            && n.as_bytes()[n.len() - 7] == b'-'
            && n[n.len() - 6..].bytes().all(|b| b.is_ascii_alphanumeric())
        {
            out.push(
                Diagnostic::warning(
                    "aws.secretsmanager.name-suffix",
                    format!(
                        "`secretName` \"{n}\" ends like the random suffix of a secret's ARN (a hyphen and six characters), which makes lookups by partial ARN ambiguous"
                    ),
                )
                .at("secretName"),
            );
        }
    }
    let generated = spec.get("generateSecretString").filter(|v| !v.is_null());
    if spec.get("secretString").is_some_and(|v| !v.is_null()) && generated.is_some() {
        out.push(
            Diagnostic::error(
                "aws.secretsmanager.value-conflict",
                "set `secretString` or `generateSecretString`, not both",
            )
            .at("generateSecretString"),
        );
    }
    if let Some(g) = generated {
        let gp = AttrPath::root().field("generateSecretString");
        if let Some(n) = g.get("passwordLength").and_then(Value::as_i64)
            && !(1..=4096).contains(&n)
        {
            out.push(
                Diagnostic::error(
                    "aws.out-of-range",
                    format!("`passwordLength` is {n}; it must be between 1 and 4096"),
                )
                .at(gp.join("passwordLength")),
            );
        }
        let template = g.get("secretStringTemplate").filter(|v| !v.is_null());
        let key = g.get("generateStringKey").filter(|v| !v.is_null());
        match (template, key) {
            (Some(_), None) => out.push(
                Diagnostic::error(
                    "aws.secretsmanager.template",
                    "`secretStringTemplate` needs `generateStringKey`, the key the generated password goes to",
                )
                .at(gp.join("generateStringKey")),
            ),
            (None, Some(_)) => out.push(
                Diagnostic::error(
                    "aws.secretsmanager.template",
                    "`generateStringKey` needs `secretStringTemplate`, the JSON object it is added to",
                )
                .at(gp.join("secretStringTemplate")),
            ),
            _ => {}
        }
        if let Some(tpl) = template.and_then(Value::as_str)
            && !matches!(
                serde_json::from_str::<serde_json::Value>(tpl),
                Ok(serde_json::Value::Object(_))
            )
        {
            out.push(
                Diagnostic::error(
                    "aws.secretsmanager.template",
                    "`secretStringTemplate` must be a JSON object",
                )
                .at(gp.join("secretStringTemplate")),
            );
        }
        let excluded = |k: &str| g.get(k).and_then(Value::as_bool) == Some(true);
        if [
            "excludeLowercase",
            "excludeUppercase",
            "excludeNumbers",
            "excludePunctuation",
        ]
        .iter()
        .all(|k| excluded(k))
            && !excluded("includeSpace")
        {
            out.push(
                Diagnostic::error(
                    "aws.secretsmanager.no-characters",
                    "every kind of character is excluded: there is nothing to generate from",
                )
                .at(gp),
            );
        }
    }
    if let Some(n) = spec.get("recoveryWindowInDays").and_then(Value::as_i64)
        && !(7..=30).contains(&n)
    {
        out.push(
            Diagnostic::error(
                "aws.out-of-range",
                format!("`recoveryWindowInDays` is {n}; it must be between 7 and 30"),
            )
            .at("recoveryWindowInDays"),
        );
    }
    if let Some(d) = text(spec, "description")
        && d.chars().count() > 2048
    {
        out.push(
            Diagnostic::error(
                "aws.secretsmanager.description-too-long",
                "`description` is longer than 2048 characters",
            )
            .at("description"),
        );
    }
    out
}

#[async_trait]
impl Resource for Secret {
    fn type_name(&self) -> &str {
        "aws/secretsmanager/secret"
    }

    fn description(&self) -> &str {
        "A Secrets Manager secret. Importable by its name or ARN."
    }

    fn schema(&self) -> Schema {
        let flag = |d: &str| Field::boolean().describe(d.to_owned());
        Schema::object()
            .describe("A Secrets Manager secret; fields as CloudFormation's AWS::SecretsManager::Secret in lowerCamelCase, with its name as `secretName`")
            .field("secretName", Field::string().must_recreate().describe("1 to 512 letters, digits and `/_+=.@-`. Derived from the instance and resource name when not set."))
            .field("description", Field::string().describe("Up to 2048 characters"))
            .field("kmsKeyId", Field::string().describe("The KMS key (id, ARN or alias) that encrypts the value; Secrets Manager's own key when not set"))
            .field("secretString", Field::string().sensitive().describe("The value. Read back (as a secret) only when set here."))
            .field(
                "generateSecretString",
                Field::object(
                    Schema::object()
                        .field("passwordLength", Field::integer().describe("1 to 4096 characters; 32 when not set"))
                        .field("excludeCharacters", Field::string().describe("Characters never to use"))
                        .field("excludeLowercase", flag("No lowercase letters"))
                        .field("excludeUppercase", flag("No uppercase letters"))
                        .field("excludeNumbers", flag("No digits"))
                        .field("excludePunctuation", flag("No punctuation"))
                        .field("includeSpace", flag("Spaces may occur"))
                        .field("requireEachIncludedType", flag("At least one of each kind of character not excluded (the default)"))
                        .field("secretStringTemplate", Field::string().describe("A JSON object the password is added to, at generateStringKey"))
                        .field("generateStringKey", Field::string().describe("The key of the password in secretStringTemplate")),
                )
                .describe("Generate the value at create (secretsmanager:GetRandomPassword); a change of these settings generates a new one"),
            )
            .field("recoveryWindowInDays", Field::integer().describe("Days (7 to 30) a destroyed secret can still be restored. When not set, destroy deletes at once: a secret waiting for deletion keeps its name, so a redeploy under the same name would fail until the window ends."))
            .field("tags", common::tags_field())
            .field("arn", Field::string().computed().describe("The secret's ARN"))
            .field("id", Field::string().computed().describe("The secret's id (its ARN, as CloudFormation's Ref)"))
    }

    async fn validate(&self, _ctx: &Context, req: &ValidateRequest) -> Result<Vec<Diagnostic>> {
        Ok(check(&req.spec))
    }

    async fn create(&self, ctx: &Context, req: &CreateRequest) -> Result<Applied> {
        let c = self.clients.get(ctx).await?;
        let spec = req.spec();
        let name = secret_name(ctx, &spec, &req.name)?;
        if let Some(d) = describe(&c, &name).await? {
            let arn = adopt(ctx, &c, &d, &spec, &req.name, &name).await?;
            return Ok(Applied::new(arn.clone(), state(&arn)));
        }
        let value = initial_value(&c, &spec).await?;
        let tags = common::all_tags(ctx, &spec, &req.name)?;
        ctx.progress(format!("creating secret {name}"), None);
        let created = c
            .secrets
            .create_secret()
            .name(&name)
            .set_description(spec.opt_str("description")?.map(str::to_owned))
            .set_kms_key_id(spec.opt_str("kmsKeyId")?.map(str::to_owned))
            .set_secret_string(value)
            .set_tags(Some(tag_list(&tags)))
            .set_client_request_token(request_token(ctx, "create", &name))
            .send()
            .await;
        let arn = match created {
            Ok(out) => out.arn().unwrap_or_default().to_owned(),
            Err(e) => {
                let e = sdk(format!("creating secret {name}"), e);
                // A concurrent or lost earlier attempt made it after the lookup.
                if e.class == ErrorClass::Conflict
                    && let Some(d) = describe(&c, &name).await?
                {
                    adopt(ctx, &c, &d, &spec, &req.name, &name).await?
                } else {
                    return Err(e);
                }
            }
        };
        if arn.is_empty() {
            return Err(PluginError::internal(format!(
                "creating secret {name}: no ARN returned"
            )));
        }
        Ok(Applied::new(arn.clone(), state(&arn)))
    }

    async fn update(&self, ctx: &Context, req: &UpdateRequest) -> Result<Applied> {
        let c = self.clients.get(ctx).await?;
        let id = secret_id(ctx, &req.current)?;
        let before = req.current.spec();
        converge(ctx, &c, &id, &req.spec(), Some(&before), &req.name).await?;
        let arn = describe(&c, &id)
            .await?
            .and_then(|d| d.arn().map(str::to_owned))
            .unwrap_or(id);
        Ok(Applied::new(arn.clone(), state(&arn)))
    }

    async fn destroy(&self, ctx: &Context, current: &ResourceState) -> Result<()> {
        let c = self.clients.get(ctx).await?;
        let id = secret_id(ctx, current)?;
        let Some(d) = describe(&c, &id).await? else {
            return Ok(());
        };
        if d.deleted_date().is_some() {
            // Already scheduled for deletion (an earlier attempt's work).
            return Ok(());
        }
        if current.external_id.is_empty()
            && common::owner(ctx, &current.name, &tags_of(d.tags())) != common::Owner::Ours
        {
            // Someone else's secret of that name: ours was never created.
            return Ok(());
        }
        // Without a recovery window the secret goes at once: one waiting for deletion
        // keeps its name for 7 to 30 days, and a recreate under that name would fail.
        let window = current
            .spec()
            .opt_i64("recoveryWindowInDays")
            .ok()
            .flatten();
        let call = c.secrets.delete_secret().secret_id(&id);
        let call = match window {
            Some(days) => call.recovery_window_in_days(days),
            None => call.force_delete_without_recovery(true),
        };
        match call.send().await {
            Ok(_) => Ok(()),
            Err(e) => {
                let e = sdk(format!("deleting secret {id}"), e);
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
        let id = secret_id(ctx, current)?;
        let Some(d) = describe(&c, &id).await? else {
            return Ok(None);
        };
        if d.deleted_date().is_some() {
            // Scheduled for deletion: unusable, as good as gone.
            return Ok(None);
        }
        let tags = tags_of(d.tags());
        if current.external_id.is_empty()
            && common::owner(ctx, &current.name, &tags) != common::Owner::Ours
        {
            // Someone else's secret of that name: ours was never created.
            return Ok(None);
        }
        let arn = d.arn().unwrap_or(&id).to_owned();
        let mut spec = Value::map().with("secretName", d.name().unwrap_or_default());
        common::put(
            &mut spec,
            "description",
            d.description().filter(|s| !s.is_empty()),
        );
        if let Some(k) = d.kms_key_id() {
            // AWS may name the key by ARN where the blueprint used its id.
            let mine = applied
                .get("kmsKeyId")
                .and_then(Value::as_str)
                .filter(|a| k == *a || k.ends_with(&format!("/{a}")));
            spec.insert("kmsKeyId", mine.unwrap_or(k));
        }
        if applied.get("secretString").is_some() {
            let v = value_of(&c, &arn).await?;
            common::put(&mut spec, "secretString", v.map(Value::sensitive));
        }
        // Settings of create and destroy, not of the secret: they read back as applied.
        for f in ["generateSecretString", "recoveryWindowInDays"] {
            common::put(&mut spec, f, applied.get(f));
        }
        common::put(&mut spec, "tags", common::tags_value(&tags, &applied));
        Ok(Some(ReadState {
            spec,
            state: state(&arn),
            external_id: Some(arn),
        }))
    }

    fn supports_import(&self) -> bool {
        true
    }

    /// By the secret's name or ARN (a partial ARN too, as Secrets Manager takes it); the
    /// external id is its ARN, as create reports it. `secretString` is the current value,
    /// marked sensitive; a secret holding a binary value (or none) imports without it, which
    /// applying leaves as it is. `generateSecretString` and `recoveryWindowInDays` are not
    /// the secret's (they say what create and destroy do) and are left out.
    async fn import(&self, ctx: &Context, req: &ImportRequest) -> Result<Option<ReadState>> {
        let c = self.clients.get(ctx).await?;
        let id = common::import_id(req, "the secret's name or ARN")?;
        // Secrets Manager takes the name or ARN as it is; an ARN is only checked to be one of
        // a secret of the provider's region and account.
        common::import_arn(&c, id, "secretsmanager").await?;
        let Some(d) = describe(&c, id).await? else {
            return Ok(None);
        };
        let Some(arn) = d.arn() else {
            return Err(PluginError::internal(format!(
                "reading secret {id}: no ARN returned"
            )));
        };
        // Read reports the value only when the applied spec sets one.
        let hint = Value::map().with("secretString", Value::sensitive(""));
        self.read(ctx, &common::import_state(req, arn, hint)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_fit_and_follow_the_idempotency_key() {
        let ctx = Context::new(Value::Null).with_idempotency_key("k1");
        let a = request_token(&ctx, "create", "db").unwrap_or_default();
        assert!((32..=64).contains(&a.len()), "{a}");
        assert_eq!(Some(a.clone()), request_token(&ctx, "create", "db"));
        let other = Context::new(Value::Null).with_idempotency_key("k2");
        assert_ne!(Some(a), request_token(&other, "create", "db"));
        assert_eq!(
            request_token(&Context::new(Value::Null), "create", "db"),
            None
        );
    }

    #[test]
    fn generator_settings_are_checked() {
        let spec = Value::from(serde_json::json!({
            "secretName": "db-abc123",
            "secretString": "x",
            "generateSecretString": {
                "passwordLength": 0,
                "secretStringTemplate": "[1]"
            },
            "recoveryWindowInDays": 3
        }));
        let got: Vec<(String, String)> = check(&spec)
            .into_iter()
            .map(|d| (d.code, d.path.map(|p| p.to_string()).unwrap_or_default()))
            .collect();
        let want = [
            ("aws.secretsmanager.name-suffix", "secretName"),
            ("aws.secretsmanager.value-conflict", "generateSecretString"),
            ("aws.out-of-range", "generateSecretString.passwordLength"),
            (
                "aws.secretsmanager.template",
                "generateSecretString.generateStringKey",
            ),
            (
                "aws.secretsmanager.template",
                "generateSecretString.secretStringTemplate",
            ),
            ("aws.out-of-range", "recoveryWindowInDays"),
        ];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect();
        assert_eq!(got, want);
    }
}
