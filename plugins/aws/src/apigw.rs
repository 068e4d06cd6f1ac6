//! `aws/apigatewayv2/api` (CloudFormation `AWS::ApiGatewayV2::Api`): an HTTP API and the
//! stage it is served from (`stageName`, `$default` unless set), which the resource creates
//! with auto-deploy on and owns. Routes and integrations come from links.
//!
//! API names are not unique in AWS, so a create finds an earlier attempt's API by its
//! ownership tags (trellis:instance and trellis:resource), not by name; an API of the same
//! name that is not this resource's is left alone (AWS allows both).

use std::collections::HashMap;
use std::sync::Arc;

use aws_sdk_apigatewayv2::types as t;
use trellis_plugin_sdk::prelude::*;

use crate::common::{self, NameStyle, TAG_INSTANCE, TAG_RESOURCE};
use crate::config::{ClientCache, Clients};
use crate::error::sdk;

pub struct Api {
    pub clients: Arc<ClientCache>,
}

const MAX_NAME: usize = 128;
const DEFAULT_STAGE: &str = "$default";
const CORS_LISTS: [&str; 4] = [
    "allowOrigins",
    "allowMethods",
    "allowHeaders",
    "exposeHeaders",
];

/// What AWS reports about an API.
#[derive(Clone, Debug, Default)]
struct Found {
    id: String,
    endpoint: Option<String>,
    name: String,
    protocol: String,
    description: String,
    cors: Option<t::Cors>,
    disable_endpoint: bool,
    tags: Vec<(String, String)>,
}

fn sorted_tags(tags: Option<&HashMap<String, String>>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = tags
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default();
    out.sort();
    out
}

impl Found {
    fn of_api(a: &t::Api) -> Found {
        Found {
            id: a.api_id().unwrap_or_default().to_owned(),
            endpoint: a.api_endpoint().map(str::to_owned),
            name: a.name().unwrap_or_default().to_owned(),
            protocol: a
                .protocol_type()
                .map_or("HTTP", t::ProtocolType::as_str)
                .to_owned(),
            description: a.description().unwrap_or_default().to_owned(),
            cors: a.cors_configuration().cloned(),
            disable_endpoint: a.disable_execute_api_endpoint().unwrap_or(false),
            tags: sorted_tags(a.tags()),
        }
    }

    fn of_get(a: &aws_sdk_apigatewayv2::operation::get_api::GetApiOutput) -> Found {
        Found {
            id: a.api_id().unwrap_or_default().to_owned(),
            endpoint: a.api_endpoint().map(str::to_owned),
            name: a.name().unwrap_or_default().to_owned(),
            protocol: a
                .protocol_type()
                .map_or("HTTP", t::ProtocolType::as_str)
                .to_owned(),
            description: a.description().unwrap_or_default().to_owned(),
            cors: a.cors_configuration().cloned(),
            disable_endpoint: a.disable_execute_api_endpoint().unwrap_or(false),
            tags: sorted_tags(a.tags()),
        }
    }
}

fn api_name(ctx: &Context, spec: &Spec<'_>, resource_name: &str) -> Result<String> {
    common::physical_name(
        ctx,
        spec,
        "name",
        resource_name,
        MAX_NAME,
        NameStyle::Standard,
    )
}

fn stage_of(spec: &Spec<'_>) -> Result<String> {
    Ok(spec
        .opt_str("stageName")?
        .unwrap_or(DEFAULT_STAGE)
        .to_owned())
}

fn api_arn(c: &Clients, id: &str) -> String {
    format!("arn:{}:apigateway:{}::/apis/{id}", c.partition(), c.region)
}

/// The CORS settings a spec asks for (None when it sets none).
fn cors_of(spec: &Spec<'_>) -> Result<Option<t::Cors>> {
    let Some(o) = spec.opt_object("corsConfiguration")? else {
        return Ok(None);
    };
    let list = |k: &str| -> Result<Option<Vec<String>>> {
        Ok(o.opt_str_list(k)?
            .map(|l| l.into_iter().map(str::to_owned).collect()))
    };
    let max_age = match o.opt_i64("maxAge")? {
        Some(n) => Some(i32::try_from(n).map_err(|_| o.error("maxAge", "is out of range"))?),
        None => None,
    };
    Ok(Some(
        t::Cors::builder()
            .set_allow_origins(list("allowOrigins")?)
            .set_allow_methods(list("allowMethods")?)
            .set_allow_headers(list("allowHeaders")?)
            .set_expose_headers(list("exposeHeaders")?)
            .set_max_age(max_age)
            .set_allow_credentials(o.opt_bool("allowCredentials")?)
            .build(),
    ))
}

/// CORS settings in the blueprint's shape: empty lists and unset values left out.
fn cors_value(c: &t::Cors) -> Value {
    let mut v = Value::map();
    for (k, l) in [
        ("allowOrigins", c.allow_origins()),
        ("allowMethods", c.allow_methods()),
        ("allowHeaders", c.allow_headers()),
        ("exposeHeaders", c.expose_headers()),
    ] {
        if !l.is_empty() {
            v.insert(k, l.to_vec());
        }
    }
    common::put(&mut v, "maxAge", c.max_age());
    common::put(&mut v, "allowCredentials", c.allow_credentials());
    v
}

/// Whether two CORS settings are the same (list order aside).
fn same_cors(a: Option<&t::Cors>, b: Option<&t::Cors>) -> bool {
    let norm = |c: Option<&t::Cors>| {
        c.map(|c| {
            let s = |l: &[String]| {
                let mut l = l.to_vec();
                l.sort();
                l
            };
            (
                s(c.allow_origins()),
                s(c.allow_methods()),
                s(c.allow_headers()),
                s(c.expose_headers()),
                c.max_age(),
                c.allow_credentials(),
            )
        })
        // AWS may report an empty configuration where none was set.
        .filter(|n| *n != Default::default())
    };
    norm(a) == norm(b)
}

async fn get(c: &Clients, id: &str) -> Result<Option<Found>> {
    match c.apigw.get_api().api_id(id).send().await {
        Ok(out) => Ok(Some(Found::of_get(&out))),
        Err(e) => {
            let e = sdk(format!("reading API {id}"), e);
            if e.class == ErrorClass::NotFound {
                Ok(None)
            } else {
                Err(e)
            }
        }
    }
}

/// This resource's API, found by its ownership tags (the oldest, should a race have made
/// two).
async fn find_ours(ctx: &Context, c: &Clients, resource: &str) -> Result<Option<Found>> {
    let mut next: Option<String> = None;
    loop {
        let out = c
            .apigw
            .get_apis()
            .set_next_token(next.take())
            .send()
            .await
            .map_err(|e| sdk("listing APIs", e))?;
        for a in out.items() {
            let tags = a.tags();
            let tag = |k: &str| tags.and_then(|m| m.get(k)).map(String::as_str);
            if tag(TAG_INSTANCE) == Some(ctx.instance_id()) && tag(TAG_RESOURCE) == Some(resource) {
                return Ok(Some(Found::of_api(a)));
            }
        }
        match out.next_token() {
            Some(n) if !n.is_empty() => next = Some(n.to_owned()),
            _ => return Ok(None),
        }
    }
}

/// The API the engine recorded, or (after a crash cut a create short) the one with this
/// resource's ownership tags.
async fn current_api(ctx: &Context, c: &Clients, current: &ResourceState) -> Result<Option<Found>> {
    if current.external_id.is_empty() {
        find_ours(ctx, c, &current.name).await
    } else {
        get(c, &current.external_id).await
    }
}

/// The names of the API's stages.
async fn stages(c: &Clients, id: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut next: Option<String> = None;
    loop {
        let page = c
            .apigw
            .get_stages()
            .api_id(id)
            .set_next_token(next.take())
            .send()
            .await
            .map_err(|e| sdk(format!("listing the stages of API {id}"), e))?;
        out.extend(
            page.items()
                .iter()
                .filter_map(|s| s.stage_name().map(str::to_owned)),
        );
        match page.next_token() {
            Some(n) if !n.is_empty() => next = Some(n.to_owned()),
            _ => return Ok(out),
        }
    }
}

/// The API (and stage, when named) an import id names: the API's id, its ARN
/// (`arn:aws:apigateway:<region>::/apis/<id>`), a stage's ARN (`.../apis/<id>/stages/<name>`)
/// or the API's endpoint URL (`https://<id>.execute-api.<region>.amazonaws.com`).
async fn parse_import_id<'a>(c: &Clients, id: &'a str) -> Result<(&'a str, Option<&'a str>)> {
    if let Some(arn) = common::import_arn(c, id, "apigateway").await? {
        let parts: Vec<&str> = arn.resource.split('/').collect();
        return match parts.as_slice() {
            ["", "apis", api] if !api.is_empty() => Ok((api, None)),
            ["", "apis", api, "stages", stage] if !api.is_empty() && !stage.is_empty() => {
                Ok((api, Some(stage)))
            }
            _ => Err(PluginError::bad_input(format!(
                "`{id}` is not an HTTP API's ARN (`arn:aws:apigateway:<region>::/apis/<id>`)"
            ))),
        };
    }
    if let Some((_, rest)) = id.split_once("://") {
        let host = rest.split(['/', ':']).next().unwrap_or_default();
        return match host.split_once(".execute-api.") {
            Some((api, _)) if !api.is_empty() => Ok((api, None)),
            _ => Err(PluginError::bad_input(format!(
                "`{id}` is not an API's endpoint (`https://<id>.execute-api.<region>.amazonaws.com`)"
            ))),
        };
    }
    Ok((id, None))
}

async fn stage_exists(c: &Clients, id: &str, stage: &str) -> Result<bool> {
    match c
        .apigw
        .get_stage()
        .api_id(id)
        .stage_name(stage)
        .send()
        .await
    {
        Ok(_) => Ok(true),
        Err(e) => {
            let e = sdk(format!("reading stage {stage} of API {id}"), e);
            if e.class == ErrorClass::NotFound {
                Ok(false)
            } else {
                Err(e)
            }
        }
    }
}

/// Creates `stage` (auto-deploying) unless it exists, and deletes `old` when it differs.
async fn converge_stage(
    ctx: &Context,
    c: &Clients,
    id: &str,
    stage: &str,
    old: Option<&str>,
    tags: &[(String, String)],
) -> Result<()> {
    if !stage_exists(c, id, stage).await? {
        ctx.progress(format!("creating stage {stage} of API {id}"), None);
        c.apigw
            .create_stage()
            .api_id(id)
            .stage_name(stage)
            .auto_deploy(true)
            .set_tags(Some(tags.iter().cloned().collect()))
            .send()
            .await
            .map_err(|e| sdk(format!("creating stage {stage} of API {id}"), e).at("stageName"))?;
    }
    if let Some(old) = old
        && old != stage
        && let Err(e) = c
            .apigw
            .delete_stage()
            .api_id(id)
            .stage_name(old)
            .send()
            .await
    {
        let e = sdk(format!("deleting stage {old} of API {id}"), e);
        if e.class != ErrorClass::NotFound {
            return Err(e);
        }
    }
    Ok(())
}

/// Brings an existing API to `spec`.
async fn converge(
    ctx: &Context,
    c: &Clients,
    have: &Found,
    spec: &Spec<'_>,
    before: Option<&Spec<'_>>,
    resource: &str,
) -> Result<()> {
    let id = have.id.as_str();
    let name = api_name(ctx, spec, resource)?;
    let description = spec.opt_str("description")?.unwrap_or_default();
    let disable = spec.opt_bool("disableExecuteApiEndpoint")?.unwrap_or(false);
    let cors = cors_of(spec)?;
    let mut call = c.apigw.update_api().api_id(id);
    let mut changed = false;
    if name != have.name {
        call = call.name(&name);
        changed = true;
    }
    if description != have.description {
        call = call.description(description);
        changed = true;
    }
    if disable != have.disable_endpoint {
        call = call.disable_execute_api_endpoint(disable);
        changed = true;
    }
    let cors_changed = !same_cors(cors.as_ref(), have.cors.as_ref());
    if cors_changed && let Some(cors) = &cors {
        call = call.cors_configuration(cors.clone());
        changed = true;
    }
    if changed {
        call.send()
            .await
            .map_err(|e| sdk(format!("updating API {id}"), e))?;
    }
    if cors_changed && cors.is_none() {
        c.apigw
            .delete_cors_configuration()
            .api_id(id)
            .send()
            .await
            .map_err(|e| sdk(format!("removing the CORS settings of API {id}"), e))?;
    }

    let want = common::all_tags(ctx, spec, resource)?;
    let (set, remove) = common::tag_diff(&have.tags, &want);
    let arn = api_arn(c, id);
    if !set.is_empty() {
        c.apigw
            .tag_resource()
            .resource_arn(&arn)
            .set_tags(Some(set.into_iter().collect()))
            .send()
            .await
            .map_err(|e| sdk(format!("tagging API {id}"), e))?;
    }
    if !remove.is_empty() {
        c.apigw
            .untag_resource()
            .resource_arn(&arn)
            .set_tag_keys(Some(remove))
            .send()
            .await
            .map_err(|e| sdk(format!("untagging API {id}"), e))?;
    }
    let old = before.map(stage_of).transpose()?;
    converge_stage(ctx, c, id, &stage_of(spec)?, old.as_deref(), &want).await
}

async fn state(c: &Clients, id: &str, endpoint: Option<&str>) -> Result<Value> {
    let mut s = Value::map()
        .with("apiId", id)
        .with("arn", api_arn(c, id))
        .with(
            "executionArn",
            format!(
                "arn:{}:execute-api:{}:{}:{id}",
                c.partition(),
                c.region,
                c.account().await?
            ),
        );
    common::put(&mut s, "apiEndpoint", endpoint);
    Ok(s)
}

fn check(spec: &Value) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let text = |k: &str| spec.get(k).and_then(Value::as_str);
    if text("protocolType") == Some("WEBSOCKET") {
        out.push(
            Diagnostic::error(
                "aws.apigatewayv2.websocket-unsupported",
                "WebSocket APIs are not supported yet; `protocolType` must be HTTP",
            )
            .at("protocolType"),
        );
    }
    if let Some(n) = text("name")
        && (n.is_empty() || n.chars().count() > MAX_NAME)
    {
        out.push(
            Diagnostic::error(
                "aws.apigatewayv2.invalid-name",
                format!("`name` must be 1 to {MAX_NAME} characters"),
            )
            .at("name"),
        );
    }
    if let Some(s) = text("stageName")
        && s != DEFAULT_STAGE
        && (s.is_empty()
            || s.len() > 128
            || !s
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-')))
    {
        out.push(
            Diagnostic::error(
                "aws.apigatewayv2.invalid-stage",
                format!(
                    "`stageName` \"{s}\" must be `$default` or 1 to 128 letters, digits, `_` and `-`"
                ),
            )
            .at("stageName"),
        );
    }
    if let Some(cors) = spec.get("corsConfiguration") {
        let cp = AttrPath::root().field("corsConfiguration");
        if let Some(age) = cors.get("maxAge").and_then(Value::as_i64)
            && !(-1..=86_400).contains(&age)
        {
            out.push(
                Diagnostic::error(
                    "aws.out-of-range",
                    format!("`corsConfiguration.maxAge` is {age}; it must be between -1 and 86400 seconds"),
                )
                .at(cp.join("maxAge")),
            );
        }
        let origins = cors
            .get("allowOrigins")
            .and_then(Value::as_list)
            .unwrap_or_default();
        if cors.get("allowCredentials").and_then(Value::as_bool) == Some(true)
            && origins.iter().any(|o| o.as_str() == Some("*"))
        {
            out.push(
                Diagnostic::error(
                    "aws.apigatewayv2.cors-credentials",
                    "`allowCredentials: true` cannot go with the origin `*`: name the origins",
                )
                .at(cp.join("allowOrigins")),
            );
        }
        for k in CORS_LISTS {
            for (i, v) in cors
                .get(k)
                .and_then(Value::as_list)
                .unwrap_or_default()
                .iter()
                .enumerate()
            {
                if v.as_str().is_some_and(str::is_empty) {
                    out.push(
                        Diagnostic::error(
                            "aws.apigatewayv2.cors-empty",
                            format!("`corsConfiguration.{k}[{i}]` is empty"),
                        )
                        .at(cp.join(k).join_index(i)),
                    );
                }
            }
        }
    }
    out
}

#[async_trait]
impl Resource for Api {
    fn type_name(&self) -> &str {
        "aws/apigatewayv2/api"
    }

    fn description(&self) -> &str {
        "An API Gateway HTTP API and its stage. Importable by its id, ARN or endpoint URL (an API with one stage, or a `$default` stage), or by a stage's ARN."
    }

    fn schema(&self) -> Schema {
        let list = |d: &str| Field::array(Schema::string()).describe(d.to_owned());
        Schema::object()
            .describe("An HTTP API; fields as CloudFormation's AWS::ApiGatewayV2::Api in lowerCamelCase, plus `stageName`")
            .field("name", Field::string().describe("Up to 128 characters (not unique in AWS). Derived from the instance and resource name when not set."))
            .field("protocolType", Field::string().default("HTTP").allowed(["HTTP", "WEBSOCKET"]).must_recreate().describe("HTTP (WEBSOCKET is not supported yet)"))
            .field("description", Field::string())
            .field(
                "corsConfiguration",
                Field::object(
                    Schema::object()
                        .field("allowOrigins", list("Origins allowed (`*` for any)"))
                        .field("allowMethods", list("Methods allowed (`*` for any)"))
                        .field("allowHeaders", list("Request headers allowed"))
                        .field("exposeHeaders", list("Response headers exposed"))
                        .field("maxAge", Field::integer().describe("Seconds a preflight answer is cached (-1 to 86400)"))
                        .field("allowCredentials", Field::boolean().describe("Whether credentials may be sent")),
                )
                .describe("CORS"),
            )
            .field("disableExecuteApiEndpoint", Field::boolean().describe("Serve the API only from custom domains"))
            .field("stageName", Field::string().default(DEFAULT_STAGE).describe("The stage the API is served from, deployed automatically; `$default` serves it at the endpoint's root"))
            .field("tags", common::tags_field())
            .field("apiId", Field::string().computed().describe("The API's id"))
            .field("apiEndpoint", Field::string().computed().describe("The API's default endpoint URL"))
            .field("arn", Field::string().computed().describe("The API's ARN (arn:<partition>:apigateway:<region>::/apis/<id>)"))
            .field("executionArn", Field::string().computed().describe("The ARN to grant invocations on (arn:<partition>:execute-api:<region>:<account>:<id>)"))
    }

    async fn validate(&self, _ctx: &Context, req: &ValidateRequest) -> Result<Vec<Diagnostic>> {
        Ok(check(&req.spec))
    }

    async fn create(&self, ctx: &Context, req: &CreateRequest) -> Result<Applied> {
        let c = self.clients.get(ctx).await?;
        let spec = req.spec();
        let protocol = spec.opt_str("protocolType")?.unwrap_or("HTTP");
        if protocol != "HTTP" {
            return Err(PluginError::bad_input(format!(
                "`protocolType` {protocol} is not supported yet; use HTTP"
            ))
            .at("protocolType"));
        }
        let tags = common::all_tags(ctx, &spec, &req.name)?;
        if let Some(have) = find_ours(ctx, &c, &req.name).await? {
            tracing::info!(
                "API {} has this resource's ownership tags: adopting it (an earlier attempt created it)",
                have.id
            );
            converge(ctx, &c, &have, &spec, None, &req.name).await?;
            return Ok(Applied::new(
                have.id.clone(),
                state(&c, &have.id, have.endpoint.as_deref()).await?,
            ));
        }
        let name = api_name(ctx, &spec, &req.name)?;
        ctx.progress(format!("creating API {name}"), None);
        let out = c
            .apigw
            .create_api()
            .name(&name)
            .protocol_type(t::ProtocolType::Http)
            .set_description(spec.opt_str("description")?.map(str::to_owned))
            .set_cors_configuration(cors_of(&spec)?)
            .set_disable_execute_api_endpoint(spec.opt_bool("disableExecuteApiEndpoint")?)
            .set_tags(Some(tags.iter().cloned().collect()))
            .send()
            .await
            .map_err(|e| sdk(format!("creating API {name}"), e))?;
        let id = out
            .api_id()
            .ok_or_else(|| PluginError::internal(format!("creating API {name}: no id returned")))?
            .to_owned();
        let st = state(&c, &id, out.api_endpoint()).await?;
        // The API exists from here: a failure records it, so nothing is orphaned.
        if let Err(e) = converge_stage(ctx, &c, &id, &stage_of(&spec)?, None, &tags).await {
            return Err(e.with_partial(id, st));
        }
        Ok(Applied::new(id, st))
    }

    async fn update(&self, ctx: &Context, req: &UpdateRequest) -> Result<Applied> {
        let c = self.clients.get(ctx).await?;
        let Some(have) = current_api(ctx, &c, &req.current).await? else {
            return Err(PluginError::not_found(format!(
                "API {} no longer exists",
                req.current.external_id
            )));
        };
        let before = req.current.spec();
        converge(ctx, &c, &have, &req.spec(), Some(&before), &req.name).await?;
        Ok(Applied::new(
            have.id.clone(),
            state(&c, &have.id, have.endpoint.as_deref()).await?,
        ))
    }

    async fn destroy(&self, ctx: &Context, current: &ResourceState) -> Result<()> {
        let c = self.clients.get(ctx).await?;
        let id = if current.external_id.is_empty() {
            match find_ours(ctx, &c, &current.name).await? {
                Some(a) => a.id,
                None => return Ok(()),
            }
        } else {
            current.external_id.clone()
        };
        // Deleting the API deletes its stages.
        match c.apigw.delete_api().api_id(&id).send().await {
            Ok(_) => Ok(()),
            Err(e) => {
                let e = sdk(format!("deleting API {id}"), e);
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
        let Some(have) = current_api(ctx, &c, current).await? else {
            return Ok(None);
        };
        let mut spec = Value::map()
            .with("name", have.name.as_str())
            .with("protocolType", have.protocol.as_str())
            .with("disableExecuteApiEndpoint", have.disable_endpoint);
        if !have.description.is_empty() {
            spec.insert("description", have.description.as_str());
        }
        if let Some(cors) = &have.cors {
            let v = cors_value(cors);
            if v.as_map().is_some_and(|m| !m.is_empty())
                || applied.get("corsConfiguration").is_some()
            {
                spec.insert("corsConfiguration", v);
            }
        }
        // The stage the blueprint names, while it exists.
        let stage = applied
            .get("stageName")
            .and_then(Value::as_str)
            .unwrap_or(DEFAULT_STAGE);
        if stage_exists(&c, &have.id, stage).await? {
            spec.insert("stageName", stage);
        }
        common::put(&mut spec, "tags", common::tags_value(&have.tags, &applied));
        Ok(Some(ReadState {
            spec,
            state: state(&c, &have.id, have.endpoint.as_deref()).await?,
            external_id: Some(have.id),
        }))
    }

    fn supports_import(&self) -> bool {
        true
    }

    /// By the API's id, ARN or endpoint URL, or a stage's ARN; the external id is the API's
    /// id. The resource serves the API from one stage (`stageName`, `$default` when not set):
    /// the stage the id names, else `$default` when the API has it, else its only stage. An
    /// API without a stage, or with several and none chosen, is refused: a spec without the
    /// right `stageName` would create a stage.
    async fn import(&self, ctx: &Context, req: &ImportRequest) -> Result<Option<ReadState>> {
        let c = self.clients.get(ctx).await?;
        let id = common::import_id(req, "the API's id, ARN or endpoint URL, or a stage's ARN")?;
        let (api, stage) = parse_import_id(&c, id).await?;
        let Some(have) = get(&c, api).await? else {
            return Ok(None);
        };
        if have.protocol != "HTTP" {
            return Err(PluginError::bad_input(format!(
                "API {api} is a {} API; {} supports HTTP APIs only",
                have.protocol, req.resource_type
            )));
        }
        let all = stages(&c, api).await?;
        let stage = match stage {
            Some(s) if all.iter().any(|a| a == s) => s.to_owned(),
            // The stage named is not there: nothing to import.
            Some(_) => return Ok(None),
            None if all.iter().any(|a| a == DEFAULT_STAGE) => DEFAULT_STAGE.to_owned(),
            None => match all.as_slice() {
                [one] => one.clone(),
                [] => {
                    return Err(PluginError::bad_input(format!(
                        "API {api} has no stage, and {} serves its API from one: create a stage first",
                        req.resource_type
                    )));
                }
                many => {
                    return Err(PluginError::bad_input(format!(
                        "API {api} has the stages {}: import it by the ARN of the one to serve it from (arn:{}:apigateway:{}::/apis/{api}/stages/<name>)",
                        many.join(", "),
                        c.partition(),
                        c.region
                    )));
                }
            },
        };
        let hint = Value::map().with("stageName", stage);
        self.read(ctx, &common::import_state(req, &have.id, hint))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn websocket_and_bad_cors_are_diagnosed_at_their_fields() {
        let spec = Value::from(serde_json::json!({
            "protocolType": "WEBSOCKET",
            "stageName": "prod stage",
            "corsConfiguration": {
                "allowOrigins": ["*"],
                "allowCredentials": true,
                "maxAge": 100000,
                "allowHeaders": [""]
            }
        }));
        let got: Vec<(String, String)> = check(&spec)
            .into_iter()
            .map(|d| (d.code, d.path.map(|p| p.to_string()).unwrap_or_default()))
            .collect();
        let want = [
            ("aws.apigatewayv2.websocket-unsupported", "protocolType"),
            ("aws.apigatewayv2.invalid-stage", "stageName"),
            ("aws.out-of-range", "corsConfiguration.maxAge"),
            (
                "aws.apigatewayv2.cors-credentials",
                "corsConfiguration.allowOrigins",
            ),
            (
                "aws.apigatewayv2.cors-empty",
                "corsConfiguration.allowHeaders[0]",
            ),
        ];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn cors_comparison_ignores_order_and_empty_settings() {
        let a = t::Cors::builder()
            .allow_origins("https://a")
            .allow_origins("https://b")
            .build();
        let b = t::Cors::builder()
            .allow_origins("https://b")
            .allow_origins("https://a")
            .build();
        assert!(same_cors(Some(&a), Some(&b)));
        assert!(same_cors(None, Some(&t::Cors::builder().build())));
        assert!(!same_cors(None, Some(&a)));
    }
}
