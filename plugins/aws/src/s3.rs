//! `aws/s3/bucket` (CloudFormation `AWS::S3::Bucket`).
//!
//! Bucket names are global: a name may be free, ours (this account's, with or without our
//! ownership tags) or another account's. Create looks first (HeadBucket) because in
//! us-east-1 CreateBucket of a bucket this account owns succeeds silently.
//!
//! Destroy refuses a bucket that still holds objects (CONFLICT) unless `forceDestroy` is
//! set, which deletes every object version and delete marker first.
//!
//! Not supported yet: `lifecycleConfiguration`, and CloudFormation's other bucket
//! configurations (CORS, logging, notifications, website, replication, object lock, ...).

use std::sync::Arc;

use aws_sdk_s3::error::ProvideErrorMetadata;
use aws_sdk_s3::types::{
    BucketLocationConstraint, BucketVersioningStatus, CreateBucketConfiguration, Delete,
    ObjectIdentifier, PublicAccessBlockConfiguration, ServerSideEncryption,
    ServerSideEncryptionByDefault, ServerSideEncryptionConfiguration, ServerSideEncryptionRule,
    Tag, Tagging, VersioningConfiguration,
};
use trellis_plugin_sdk::prelude::*;

use crate::common::{self, NameStyle};
use crate::config::{ClientCache, Clients};
use crate::error::sdk;

pub struct Bucket {
    pub clients: Arc<ClientCache>,
}

const MAX_NAME: usize = 63;

/// The public access block flags, in the order `spec_of` reads them.
const PUBLIC_ACCESS: [&str; 4] = [
    "blockPublicAcls",
    "blockPublicPolicy",
    "ignorePublicAcls",
    "restrictPublicBuckets",
];

fn bucket_name(ctx: &Context, spec: &Spec<'_>, name: &str) -> Result<String> {
    common::physical_name(
        ctx,
        spec,
        "bucketName",
        name,
        MAX_NAME,
        NameStyle::Lowercase,
    )
}

fn built<T, E: std::fmt::Display>(r: std::result::Result<T, E>) -> Result<T> {
    r.map_err(|e| PluginError::internal(format!("building an S3 request: {e}")))
}

fn s3_tags(tags: &[(String, String)]) -> Result<Vec<Tag>> {
    tags.iter()
        .map(|(k, v)| built(Tag::builder().key(k).value(v).build()))
        .collect()
}

/// What HeadBucket says about a name.
enum Found {
    /// It exists and this account can use it.
    Yes,
    No,
    /// It exists and belongs to another account (or this one may not look at it).
    Forbidden,
}

async fn find(c: &Clients, name: &str) -> Result<Found> {
    let account = c.account().await?;
    match c
        .s3
        .head_bucket()
        .bucket(name)
        .expected_bucket_owner(account)
        .send()
        .await
    {
        Ok(_) => Ok(Found::Yes),
        Err(e) => {
            let e = sdk(format!("looking for bucket {name}"), e);
            match e.class {
                ErrorClass::NotFound => Ok(Found::No),
                ErrorClass::Permission => Ok(Found::Forbidden),
                _ => Err(e),
            }
        }
    }
}

async fn tags_of(c: &Clients, name: &str) -> Result<Vec<(String, String)>> {
    match c.s3.get_bucket_tagging().bucket(name).send().await {
        Ok(out) => {
            let mut tags: Vec<(String, String)> =
                out.tag_set.into_iter().map(|t| (t.key, t.value)).collect();
            tags.sort();
            Ok(tags)
        }
        // A bucket without tags answers NoSuchTagSet.
        Err(e) if e.code() == Some("NoSuchTagSet") => Ok(Vec::new()),
        Err(e) => Err(sdk(format!("reading the tags of bucket {name}"), e)),
    }
}

/// The versioning status (`Enabled`, `Suspended`); None for a bucket never versioned.
async fn versioning_of(c: &Clients, bucket: &str) -> Result<Option<String>> {
    match c.s3.get_bucket_versioning().bucket(bucket).send().await {
        Ok(out) => Ok(out.status().map(|s| s.as_str().to_owned())),
        Err(e) => {
            // moto 5.2 names the answer's root element `GetBucketVersioningResponse` (S3:
            // `VersioningConfiguration`), which the SDK refuses; the rest is the same.
            let body = e
                .raw_response()
                .filter(|r| r.status().is_success())
                .and_then(|r| r.body().bytes())
                .map(String::from_utf8_lossy);
            if let Some(body) = body
                && body.contains("<GetBucketVersioningResponse")
            {
                return Ok(element_text(&body, "Status"));
            }
            Err(sdk(format!("reading the versioning of bucket {bucket}"), e))
        }
    }
}

/// The text of the first `<name>...</name>` in `xml`.
fn element_text(xml: &str, name: &str) -> Option<String> {
    let open = format!("<{name}>");
    let start = xml.find(&open)? + open.len();
    let len = xml[start..].find(&format!("</{name}>"))?;
    Some(xml[start..start + len].to_owned())
}

fn state(c: &Clients, name: &str) -> Value {
    let suffix = if c.partition() == "aws-cn" {
        "amazonaws.com.cn"
    } else {
        "amazonaws.com"
    };
    Value::map()
        .with("arn", format!("arn:{}:s3:::{name}", c.partition()))
        .with("domainName", format!("{name}.s3.{suffix}"))
        .with(
            "regionalDomainName",
            format!("{name}.s3.{}.{suffix}", c.region),
        )
}

fn public_access_block(cfg: &Spec<'_>) -> Result<PublicAccessBlockConfiguration> {
    Ok(PublicAccessBlockConfiguration::builder()
        .block_public_acls(cfg.opt_bool("blockPublicAcls")?.unwrap_or(false))
        .block_public_policy(cfg.opt_bool("blockPublicPolicy")?.unwrap_or(false))
        .ignore_public_acls(cfg.opt_bool("ignorePublicAcls")?.unwrap_or(false))
        .restrict_public_buckets(cfg.opt_bool("restrictPublicBuckets")?.unwrap_or(false))
        .build())
}

fn encryption(cfg: &Spec<'_>) -> Result<ServerSideEncryptionConfiguration> {
    let mut rules = Vec::new();
    for rule in cfg.get_list("serverSideEncryptionConfiguration")? {
        let mut b = ServerSideEncryptionRule::builder();
        if let Some(d) = rule.opt_object("serverSideEncryptionByDefault")? {
            let by_default = ServerSideEncryptionByDefault::builder()
                .sse_algorithm(ServerSideEncryption::from(d.get_str("sseAlgorithm")?))
                .set_kms_master_key_id(d.opt_str("kmsMasterKeyId")?.map(str::to_owned))
                .build();
            b = b.apply_server_side_encryption_by_default(built(by_default)?);
        }
        if let Some(k) = rule.opt_bool("bucketKeyEnabled")? {
            b = b.bucket_key_enabled(k);
        }
        rules.push(b.build());
    }
    built(
        ServerSideEncryptionConfiguration::builder()
            .set_rules(Some(rules))
            .build(),
    )
}

/// Sets tags, versioning, public access block and default encryption as the spec says;
/// what the spec dropped goes back to what a new bucket has.
async fn converge(
    ctx: &Context,
    c: &Clients,
    bucket: &str,
    spec: &Spec<'_>,
    before: Option<&Spec<'_>>,
    name: &str,
) -> Result<()> {
    let dropped = |f: &str| spec.get(f).is_none() && before.is_some_and(|b| b.get(f).is_some());

    // Tags first: they mark the bucket as ours. The tag set is replaced whole, and it is
    // never empty (the ownership tags are in it).
    let want = common::all_tags(ctx, spec, name)?;
    let have = tags_of(c, bucket).await?;
    let (set, remove) = common::tag_diff(&have, &want);
    if !set.is_empty() || !remove.is_empty() {
        let tagging = built(
            Tagging::builder()
                .set_tag_set(Some(s3_tags(&want)?))
                .build(),
        )?;
        c.s3.put_bucket_tagging()
            .bucket(bucket)
            .tagging(tagging)
            .send()
            .await
            .map_err(|e| sdk(format!("tagging bucket {bucket}"), e))?;
    }

    let versioning = match spec.opt_object("versioningConfiguration")? {
        Some(v) => Some(v.get_str("status")?.to_owned()),
        // A bucket's versioning cannot be switched off, only suspended.
        None if dropped("versioningConfiguration") => Some("Suspended".to_owned()),
        None => None,
    };
    if let Some(status) = versioning {
        let unchanged = match versioning_of(c, bucket).await? {
            Some(s) => s == status,
            // Never versioned is as good as suspended.
            None => status == "Suspended",
        };
        if !unchanged {
            c.s3.put_bucket_versioning()
                .bucket(bucket)
                .versioning_configuration(
                    VersioningConfiguration::builder()
                        .status(BucketVersioningStatus::from(status.as_str()))
                        .build(),
                )
                .send()
                .await
                .map_err(|e| sdk(format!("setting the versioning of bucket {bucket}"), e))?;
        }
    }

    let block = match spec.opt_object("publicAccessBlockConfiguration")? {
        Some(p) => Some(public_access_block(&p)?),
        // New buckets block all public access (AWS's default since April 2023).
        None if dropped("publicAccessBlockConfiguration") => Some(
            PublicAccessBlockConfiguration::builder()
                .block_public_acls(true)
                .block_public_policy(true)
                .ignore_public_acls(true)
                .restrict_public_buckets(true)
                .build(),
        ),
        None => None,
    };
    if let Some(block) = block {
        c.s3.put_public_access_block()
            .bucket(bucket)
            .public_access_block_configuration(block)
            .send()
            .await
            .map_err(|e| {
                sdk(
                    format!("setting the public access block of bucket {bucket}"),
                    e,
                )
            })?;
    }

    if let Some(e) = spec.opt_object("bucketEncryption")? {
        c.s3.put_bucket_encryption()
            .bucket(bucket)
            .server_side_encryption_configuration(encryption(&e)?)
            .send()
            .await
            .map_err(|e| {
                sdk(
                    format!("setting the default encryption of bucket {bucket}"),
                    e,
                )
            })?;
    } else if dropped("bucketEncryption") {
        // Without a configuration AWS encrypts with S3-managed keys (SSE-S3).
        c.s3.delete_bucket_encryption()
            .bucket(bucket)
            .send()
            .await
            .map_err(|e| {
                sdk(
                    format!("resetting the default encryption of bucket {bucket}"),
                    e,
                )
            })?;
    }
    Ok(())
}

/// The bucket's configuration in the blueprint's shapes.
async fn spec_of(
    c: &Clients,
    bucket: &str,
    tags: &[(String, String)],
    applied: &Spec<'_>,
) -> Result<Value> {
    let mut spec = Value::map().with("bucketName", bucket);

    match versioning_of(c, bucket).await? {
        Some(s) => {
            spec.insert("versioningConfiguration", Value::map().with("status", s));
        }
        None if applied.get("versioningConfiguration").is_some() => {
            // Never versioned: what `Suspended` reads as.
            spec.insert(
                "versioningConfiguration",
                Value::map().with("status", "Suspended"),
            );
        }
        None => {}
    }

    let block = match c.s3.get_public_access_block().bucket(bucket).send().await {
        Ok(out) => out.public_access_block_configuration,
        Err(e) if e.code() == Some("NoSuchPublicAccessBlockConfiguration") => None,
        Err(e) => {
            return Err(sdk(
                format!("reading the public access block of bucket {bucket}"),
                e,
            ));
        }
    };
    if block.is_some() || applied.get("publicAccessBlockConfiguration").is_some() {
        let b = block.unwrap_or_else(|| PublicAccessBlockConfiguration::builder().build());
        let flags = [
            b.block_public_acls(),
            b.block_public_policy(),
            b.ignore_public_acls(),
            b.restrict_public_buckets(),
        ];
        let mut m = Value::map();
        for (field, flag) in PUBLIC_ACCESS.iter().zip(flags) {
            m.insert(*field, flag.unwrap_or(false));
        }
        spec.insert("publicAccessBlockConfiguration", m);
    }

    let enc = match c.s3.get_bucket_encryption().bucket(bucket).send().await {
        Ok(out) => out.server_side_encryption_configuration,
        Err(e) if e.code() == Some("ServerSideEncryptionConfigurationNotFoundError") => None,
        Err(e) => {
            return Err(sdk(
                format!("reading the default encryption of bucket {bucket}"),
                e,
            ));
        }
    };
    if let Some(enc) = enc {
        let rules: Vec<Value> = enc
            .rules()
            .iter()
            .map(|r| {
                let mut rule = Value::map();
                if let Some(d) = r.apply_server_side_encryption_by_default() {
                    let mut by_default =
                        Value::map().with("sseAlgorithm", d.sse_algorithm().as_str());
                    common::put(&mut by_default, "kmsMasterKeyId", d.kms_master_key_id());
                    rule.insert("serverSideEncryptionByDefault", by_default);
                }
                common::put(&mut rule, "bucketKeyEnabled", r.bucket_key_enabled());
                rule
            })
            .collect();
        spec.insert(
            "bucketEncryption",
            Value::map().with("serverSideEncryptionConfiguration", Value::List(rules)),
        );
    }

    common::put(&mut spec, "tags", common::tags_value(tags, applied));
    // Not AWS's: what destroy will do, as applied.
    common::put(
        &mut spec,
        "forceDestroy",
        applied.get("forceDestroy").cloned(),
    );
    Ok(spec)
}

/// Deletes every object version and delete marker, a page (up to 1000, as many as
/// DeleteObjects takes) at a time. Each listing starts from the top, as what the last page
/// held is gone: S3 would also go on from the page's markers, but moto 5.2 finds nothing
/// after a marker whose version was deleted.
async fn empty(ctx: &Context, c: &Clients, bucket: &str) -> Result<()> {
    let account = c.account().await?;
    let mut deleted = 0usize;
    let mut last_first: Option<(String, Option<String>)> = None;
    loop {
        ctx.check_cancelled()?;
        let page =
            c.s3.list_object_versions()
                .bucket(bucket)
                .expected_bucket_owner(&account)
                .send()
                .await
                .map_err(|e| sdk(format!("listing the objects of bucket {bucket}"), e))?;
        let versions = page.versions().iter().map(|v| (v.key(), v.version_id()));
        let markers = page
            .delete_markers()
            .iter()
            .map(|m| (m.key(), m.version_id()));
        let entries: Vec<(String, Option<String>)> = versions
            .chain(markers)
            .filter_map(|(k, v)| Some((k?.to_owned(), v.map(str::to_owned))))
            .collect();
        let Some(first) = entries.first().cloned() else {
            return Ok(());
        };
        if last_first.as_ref() == Some(&first) {
            // Deleted, yet listed again: stop rather than loop.
            return Err(PluginError::transient(format!(
                "emptying bucket {bucket}: `{}` is still listed after it was deleted",
                first.0
            )));
        }
        let n = entries.len();
        let objects = entries
            .into_iter()
            .map(|(k, v)| built(ObjectIdentifier::builder().key(k).set_version_id(v).build()))
            .collect::<Result<Vec<_>>>()?;
        let delete = built(
            Delete::builder()
                .set_objects(Some(objects))
                .quiet(true)
                .build(),
        )?;
        let out =
            c.s3.delete_objects()
                .bucket(bucket)
                .expected_bucket_owner(&account)
                .delete(delete)
                .send()
                .await
                .map_err(|e| sdk(format!("deleting the objects of bucket {bucket}"), e))?;
        if let Some(err) = out.errors().first() {
            return Err(PluginError::conflict(format!(
                "emptying bucket {bucket}: {} of {n} objects could not be deleted; the first, `{}`: {}: {}",
                out.errors().len(),
                err.key().unwrap_or("?"),
                err.code().unwrap_or("error"),
                err.message().unwrap_or("")
            )));
        }
        deleted += n;
        ctx.progress(
            format!("emptying bucket {bucket}: {deleted} object versions deleted"),
            None,
        );
        last_first = Some(first);
    }
}

/// Adopts `bucket` when its ownership tags say it is this resource's.
async fn adopt(ctx: &Context, c: &Clients, bucket: &str, resource: &str) -> Result<()> {
    let tags = tags_of(c, bucket).await?;
    common::adopt_or_conflict(ctx, resource, &tags, "bucket", bucket, "bucketName")
}

fn valid_name(n: &str) -> bool {
    let b = n.as_bytes();
    let edge = |c: Option<&u8>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    (3..=MAX_NAME).contains(&n.len())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-' || *c == b'.')
        && edge(b.first())
        && edge(b.last())
        && !n.contains("..")
        && !n.starts_with("xn--")
        && !n.starts_with("sthree-")
        && !n.ends_with("-s3alias")
        && !n.ends_with("--ol-s3")
        // Not formatted like an IP address.
        && !(n.split('.').count() == 4 && n.split('.').all(|p| p.parse::<u8>().is_ok()))
}

#[async_trait]
impl Resource for Bucket {
    fn type_name(&self) -> &str {
        "aws/s3/bucket"
    }

    fn description(&self) -> &str {
        "An S3 bucket. Importable by its name, ARN or `s3://` URI."
    }

    fn schema(&self) -> Schema {
        let flag = |d: &str| Field::boolean().describe(d.to_owned());
        Schema::object()
            .describe("An S3 bucket; fields as CloudFormation's AWS::S3::Bucket in lowerCamelCase, plus `forceDestroy`")
            .field("bucketName", Field::string().must_recreate().describe("3 to 63 lowercase letters, digits, `.` and `-`, globally unique. Derived from the instance and resource name when not set."))
            .field(
                "versioningConfiguration",
                Field::object(
                    Schema::object().field(
                        "status",
                        Field::string().required().allowed(["Enabled", "Suspended"]).describe("`Enabled` or `Suspended` (a versioned bucket cannot go back to unversioned)"),
                    ),
                )
                .describe("Object versioning; dropping it suspends versioning"),
            )
            .field(
                "publicAccessBlockConfiguration",
                Field::object(
                    Schema::object()
                        .field("blockPublicAcls", flag("Reject requests that set public ACLs"))
                        .field("blockPublicPolicy", flag("Reject bucket policies that allow public access"))
                        .field("ignorePublicAcls", flag("Ignore public ACLs"))
                        .field("restrictPublicBuckets", flag("Only AWS services and this account may use a bucket with a public policy")),
                )
                .describe("Block Public Access; a flag not set is false. Dropping it blocks everything again (a new bucket's setting)."),
            )
            .field(
                "bucketEncryption",
                Field::object(
                    Schema::object().field(
                        "serverSideEncryptionConfiguration",
                        Field::array(
                            Schema::object()
                                .field(
                                    "serverSideEncryptionByDefault",
                                    Field::object(
                                        Schema::object()
                                            .field("sseAlgorithm", Field::string().required().allowed(["AES256", "aws:kms", "aws:kms:dsse"]).describe("`AES256` (SSE-S3), `aws:kms` or `aws:kms:dsse`"))
                                            .field("kmsMasterKeyId", Field::string().describe("KMS: the key (AWS's managed key when not set)")),
                                    )
                                    .describe("The encryption applied to new objects"),
                                )
                                .field("bucketKeyEnabled", flag("KMS: use an S3 Bucket Key to cut KMS requests")),
                        )
                        .required()
                        .describe("One rule"),
                    ),
                )
                .describe("Default encryption; dropping it goes back to SSE-S3 (AWS's default)"),
            )
            .field("tags", common::tags_field())
            .field("forceDestroy", Field::boolean().describe("Destroy deletes every object (all versions and delete markers) first. Without it, destroying a bucket that is not empty fails with CONFLICT."))
            .field("arn", Field::string().computed().describe("The bucket's ARN"))
            .field("domainName", Field::string().computed().describe("`<bucket>.s3.amazonaws.com`"))
            .field("regionalDomainName", Field::string().computed().describe("`<bucket>.s3.<region>.amazonaws.com`"))
    }

    async fn validate(&self, _ctx: &Context, req: &ValidateRequest) -> Result<Vec<Diagnostic>> {
        let spec = req.spec();
        let mut out = Vec::new();
        if let Some(n) = spec.get("bucketName").and_then(Value::as_str)
            && !valid_name(n)
        {
            out.push(
                Diagnostic::error(
                    "aws.s3.invalid-name",
                    format!("`bucketName` \"{n}\" is not a valid bucket name"),
                )
                .at("bucketName")
                .hint("3 to 63 lowercase letters, digits, `.` and `-`, starting and ending with a letter or digit"),
            );
        }
        let rules_path = AttrPath::root()
            .field("bucketEncryption")
            .field("serverSideEncryptionConfiguration");
        if let Some(rules) = spec
            .get("bucketEncryption")
            .and_then(|e| e.get("serverSideEncryptionConfiguration"))
            .and_then(Value::as_list)
        {
            if rules.len() != 1 {
                out.push(
                    Diagnostic::error(
                        "aws.s3.one-encryption-rule",
                        format!(
                            "`serverSideEncryptionConfiguration` has {} rules; S3 takes exactly one",
                            rules.len()
                        ),
                    )
                    .at(rules_path.clone()),
                );
            }
            for (i, rule) in rules.iter().enumerate() {
                let Some(d) = rule.get("serverSideEncryptionByDefault") else {
                    continue;
                };
                let algorithm = d.get("sseAlgorithm").and_then(Value::as_str);
                if d.get("kmsMasterKeyId").is_some() && algorithm == Some("AES256") {
                    out.push(
                        Diagnostic::error(
                            "aws.s3.kms-key-without-kms",
                            "`kmsMasterKeyId` needs `sseAlgorithm` `aws:kms` or `aws:kms:dsse`",
                        )
                        .at(rules_path
                            .clone()
                            .index(i as u64)
                            .field("serverSideEncryptionByDefault")
                            .field("kmsMasterKeyId")),
                    );
                }
            }
        }
        Ok(out)
    }

    async fn create(&self, ctx: &Context, req: &CreateRequest) -> Result<Applied> {
        let c = self.clients.get(ctx).await?;
        let spec = req.spec();
        let name = bucket_name(ctx, &spec, &req.name)?;
        match find(&c, &name).await? {
            Found::Yes => adopt(ctx, &c, &name, &req.name).await?,
            // Forbidden: another account's, or HeadBucket is not allowed; CreateBucket tells.
            Found::No | Found::Forbidden => {
                let mut cfg = CreateBucketConfiguration::builder()
                    .set_tags(Some(s3_tags(&common::all_tags(ctx, &spec, &req.name)?)?));
                // us-east-1 takes no location constraint; every other region needs its own.
                if c.region != "us-east-1" {
                    cfg =
                        cfg.location_constraint(BucketLocationConstraint::from(c.region.as_str()));
                }
                let created =
                    c.s3.create_bucket()
                        .bucket(&name)
                        .create_bucket_configuration(cfg.build())
                        .send()
                        .await;
                if let Err(e) = created {
                    match e.code() {
                        // This account's: ours only with our tags.
                        Some("BucketAlreadyOwnedByYou") => adopt(ctx, &c, &name, &req.name).await?,
                        Some("BucketAlreadyExists") => {
                            return Err(PluginError::conflict(format!(
                                "bucket `{name}` already exists in another AWS account (bucket names are global); choose another name"
                            ))
                            .at("bucketName"));
                        }
                        _ => return Err(sdk(format!("creating bucket {name}"), e)),
                    }
                }
            }
        }
        // Tags again (an emulator may ignore them at create) and the configuration.
        converge(ctx, &c, &name, &spec, None, &req.name).await?;
        Ok(Applied::new(name.clone(), state(&c, &name)))
    }

    async fn update(&self, ctx: &Context, req: &UpdateRequest) -> Result<Applied> {
        let c = self.clients.get(ctx).await?;
        let name = if req.current.external_id.is_empty() {
            bucket_name(ctx, &req.current.spec(), &req.name)?
        } else {
            req.current.external_id.clone()
        };
        converge(
            ctx,
            &c,
            &name,
            &req.spec(),
            Some(&req.current.spec()),
            &req.name,
        )
        .await?;
        Ok(Applied::new(name.clone(), state(&c, &name)))
    }

    async fn destroy(&self, ctx: &Context, current: &ResourceState) -> Result<()> {
        let c = self.clients.get(ctx).await?;
        let spec = current.spec();
        let name = if current.external_id.is_empty() {
            let name = bucket_name(ctx, &spec, &current.name)?;
            // Never recorded: delete only a bucket of that name that is ours.
            if !matches!(find(&c, &name).await?, Found::Yes)
                || common::owner(ctx, &current.name, &tags_of(&c, &name).await?)
                    != common::Owner::Ours
            {
                return Ok(());
            }
            name
        } else {
            current.external_id.clone()
        };
        let force = spec.opt_bool("forceDestroy")?.unwrap_or(false);
        if force {
            match empty(ctx, &c, &name).await {
                Ok(()) => {}
                Err(e) if e.class == ErrorClass::NotFound => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        let account = c.account().await?;
        match c
            .s3
            .delete_bucket()
            .bucket(&name)
            .expected_bucket_owner(account)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            // Emptied, yet written to again before the delete.
            Err(e) if force && e.code() == Some("BucketNotEmpty") => Err(PluginError::transient(
                format!("bucket `{name}` received new objects while it was being emptied"),
            )),
            Err(e) if e.code() == Some("BucketNotEmpty") => Err(PluginError::conflict(format!(
                "bucket `{name}` is not empty, and S3 deletes only empty buckets: empty it first, or set `forceDestroy: true` to have destroy delete every object"
            ))
            .at("forceDestroy")),
            Err(e) => {
                let e = sdk(format!("deleting bucket {name}"), e);
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
        let name = if current.external_id.is_empty() {
            bucket_name(ctx, &applied, &current.name)?
        } else {
            current.external_id.clone()
        };
        match find(&c, &name).await? {
            Found::Yes => {}
            Found::No => return Ok(None),
            // Never recorded: the name is someone else's, so ours was never created.
            Found::Forbidden if current.external_id.is_empty() => return Ok(None),
            // Recorded: not knowing is not the same as gone.
            Found::Forbidden => {
                return Err(PluginError::permission(format!(
                    "bucket `{name}` cannot be looked at (HeadBucket is forbidden): this account may not read it, or it now belongs to another account"
                )));
            }
        }
        let tags = tags_of(&c, &name).await?;
        if current.external_id.is_empty()
            && common::owner(ctx, &current.name, &tags) != common::Owner::Ours
        {
            // Someone else's bucket of that name: ours was never created.
            return Ok(None);
        }
        let spec = match spec_of(&c, &name, &tags, &applied).await {
            Ok(s) => s,
            Err(e) if e.class == ErrorClass::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        Ok(Some(ReadState {
            spec,
            state: state(&c, &name),
            external_id: Some(name),
        }))
    }

    fn supports_import(&self) -> bool {
        true
    }

    /// By the bucket's name, ARN (`arn:aws:s3:::<name>`) or `s3://<name>`; the external id is
    /// its name. `forceDestroy` is not AWS's and is left out (destroy keeps a bucket that is
    /// not empty).
    async fn import(&self, ctx: &Context, req: &ImportRequest) -> Result<Option<ReadState>> {
        let c = self.clients.get(ctx).await?;
        let id = common::import_id(req, "the bucket's name, ARN or s3:// URI")?;
        let name = match common::import_arn(&c, id, "s3").await? {
            Some(arn) => arn.resource,
            None => id.strip_prefix("s3://").unwrap_or(id).trim_end_matches('/'),
        };
        if name.contains('/') {
            return Err(PluginError::bad_input(format!(
                "`{id}` names an object; give the bucket's name"
            )));
        }
        let hint = Value::map().with("bucketName", name);
        self.read(ctx, &common::import_state(req, name, hint)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_names() {
        for ok in ["abc", "my-bucket.logs", "a1-b2", &"x".repeat(63)] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in [
            "ab",
            "My-Bucket",
            "-abc",
            "abc-",
            "a..b",
            "192.168.1.1",
            "xn--abc",
            "a_b",
            &"x".repeat(64),
        ] {
            assert!(!valid_name(bad), "{bad}");
        }
        let derived = common::derived_name("i", "Buckets[0]", MAX_NAME, NameStyle::Lowercase);
        assert!(valid_name(&derived), "{derived}");
    }
}
