//! Provider config (`region`, `endpoint`, `endpoints.<service>`, `profile`) and the
//! service clients built from it.
//!
//! Credentials never come from the config or the blueprint: the standard AWS chain
//! (environment, shared files with `profile`, web identity, container and instance
//! metadata) supplies them, so the config has no key that could hold one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_config::BehaviorVersion;
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};
use aws_types::region::Region;
use tokio::sync::OnceCell;
use trellis_plugin_sdk::prelude::*;

/// The services an `endpoints.<service>` key may name, with what each is used for.
pub const SERVICES: [(&str, &str); 12] = [
    ("apigatewayv2", "aws/apigatewayv2/api"),
    ("dynamodb", "aws/dynamodb/table"),
    ("ec2", "data source aws/vpc"),
    ("events", "aws/events/rule"),
    ("iam", "aws/iam/role and the roles functions own"),
    ("lambda", "aws/lambda/function"),
    ("s3", "aws/s3/bucket and s3:// code"),
    ("secretsmanager", "aws/secretsmanager/secret"),
    ("sns", "aws/sns/topic"),
    ("sqs", "aws/sqs/queue"),
    ("ssm", "aws/ssm/parameter"),
    ("sts", "the account id"),
];

/// Diagnostic codes of ValidateConfig.
pub const INVALID_REGION: &str = "aws.invalid-region";
pub const INVALID_ENDPOINT: &str = "aws.invalid-endpoint";
pub const UNKNOWN_SERVICE: &str = "aws.unknown-service";
pub const NO_REGION: &str = "aws.no-region";

pub fn schema() -> Schema {
    Schema::object()
        .describe("Provider `aws`. Credentials come from the standard AWS chain (environment, shared files, web identity, container or instance metadata), never from here.")
        .field(
            "region",
            Field::string().describe("The region, like `eu-west-1`. Without it, the chain's (AWS_REGION, the profile's `region`)."),
        )
        .field(
            "endpoint",
            Field::string().describe("One endpoint URL for every service, as an emulator needs (`http://127.0.0.1:5000`). Addressing of S3 buckets becomes path-style."),
        )
        .field(
            "endpoints",
            Field::map(Schema::string()).describe("Endpoint URL per service (`endpoints.sqs`), over `endpoint`: apigatewayv2, dynamodb, ec2, events, iam, lambda, s3, secretsmanager, sns, sqs, ssm, sts."),
        )
        .field(
            "profile",
            Field::string().describe("The shared-config profile to read credentials and region from."),
        )
}

/// The config of one call, checked.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct AwsSettings {
    pub region: Option<String>,
    pub endpoint: Option<String>,
    pub endpoints: Vec<(String, String)>,
    pub profile: Option<String>,
}

impl AwsSettings {
    /// Reads a config; an unknown (not yet resolved) value is treated as absent.
    pub fn from_config(config: &Value) -> Result<AwsSettings> {
        let spec = Spec::new(config);
        let text = |k: &str| -> Result<Option<String>> {
            if spec.is_unknown(k) {
                return Ok(None);
            }
            Ok(spec.opt_str(k)?.map(str::to_owned))
        };
        let mut endpoints = Vec::new();
        if !spec.is_unknown("endpoints")
            && let Some(map) = spec.opt_map("endpoints")?
        {
            for (service, url) in map {
                let url = url.revealed().as_str().ok_or_else(|| {
                    PluginError::bad_input("must be a URL")
                        .at(spec.path_of("endpoints").join(service))
                })?;
                endpoints.push((service.clone(), url.to_owned()));
            }
        }
        endpoints.sort();
        Ok(AwsSettings {
            region: text("region")?,
            endpoint: text("endpoint")?,
            endpoints,
            profile: text("profile")?,
        })
    }

    /// Problems with the settings themselves (no network): each at its key.
    pub fn diagnostics(&self) -> Vec<Diagnostic> {
        let mut out = Vec::new();
        if let Some(r) = &self.region
            && !valid_region(r)
        {
            out.push(
                Diagnostic::error(
                    INVALID_REGION,
                    format!("`region` is \"{r}\", which is not a region name"),
                )
                .at("region")
                .hint("a region looks like `us-east-1` or `eu-west-2`"),
            );
        }
        if let Some(e) = &self.endpoint
            && let Err(why) = check_url(e)
        {
            out.push(
                Diagnostic::error(INVALID_ENDPOINT, format!("`endpoint`: {why}")).at("endpoint"),
            );
        }
        for (service, url) in &self.endpoints {
            let path = AttrPath::root().field("endpoints").field(service.as_str());
            if !SERVICES.iter().any(|(s, _)| s == service) {
                let names: Vec<&str> = SERVICES.iter().map(|(s, _)| *s).collect();
                out.push(
                    Diagnostic::error(
                        UNKNOWN_SERVICE,
                        format!(
                            "`endpoints.{service}`: this provider calls no service `{service}`"
                        ),
                    )
                    .at(path.clone())
                    .hint(format!("services: {}", names.join(", "))),
                );
            }
            if let Err(why) = check_url(url) {
                out.push(
                    Diagnostic::error(INVALID_ENDPOINT, format!("`endpoints.{service}`: {why}"))
                        .at(path),
                );
            }
        }
        out
    }

    /// The endpoint for `service`: its own, else the shared one.
    pub fn endpoint_for(&self, service: &str) -> Option<&str> {
        self.endpoints
            .iter()
            .find(|(s, _)| s == service)
            .map(|(_, u)| u.as_str())
            .or(self.endpoint.as_deref())
    }
}

/// `us-east-1`, `eu-central-2`, `us-gov-west-1`, `cn-north-1`, `ap-southeast-4`.
pub fn valid_region(r: &str) -> bool {
    let parts: Vec<&str> = r.split('-').collect();
    parts.len() >= 3
        && parts[0].len() == 2
        && parts
            .iter()
            .take(parts.len() - 1)
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_lowercase()))
        && parts
            .last()
            .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

fn check_url(u: &str) -> std::result::Result<(), String> {
    let rest = u
        .strip_prefix("https://")
        .or_else(|| u.strip_prefix("http://"))
        .ok_or_else(|| format!("\"{u}\" is not an http:// or https:// URL"))?;
    let host = rest.split('/').next().unwrap_or("");
    if host.is_empty() {
        return Err(format!("\"{u}\" has no host"));
    }
    Ok(())
}

/// One client per service, built once per distinct config and shared by every call.
pub struct Clients {
    pub settings: AwsSettings,
    pub region: String,
    pub apigw: aws_sdk_apigatewayv2::Client,
    pub dynamodb: aws_sdk_dynamodb::Client,
    pub ec2: aws_sdk_ec2::Client,
    pub events: aws_sdk_eventbridge::Client,
    pub iam: aws_sdk_iam::Client,
    pub lambda: aws_sdk_lambda::Client,
    pub s3: aws_sdk_s3::Client,
    pub secrets: aws_sdk_secretsmanager::Client,
    pub sns: aws_sdk_sns::Client,
    pub sqs: aws_sdk_sqs::Client,
    pub ssm: aws_sdk_ssm::Client,
    sdk: aws_types::SdkConfig,
    account: OnceCell<String>,
}

macro_rules! client {
    ($krate:ident, $sdk:expr, $settings:expr, $service:literal) => {{
        let mut b = $krate::config::Builder::from($sdk);
        if let Some(u) = $settings.endpoint_for($service) {
            b = b.endpoint_url(u);
        }
        $krate::Client::from_conf(b.build())
    }};
}

impl Clients {
    async fn build(settings: AwsSettings) -> Result<Clients> {
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
            .build_https();
        // The engine retries per the manifest's policy (lib.rs): one attempt here, so a
        // throttled call is not retried three times inside each of the engine's attempts.
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .http_client(http)
            .retry_config(RetryConfig::disabled())
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(10))
                    .operation_attempt_timeout(Duration::from_secs(120))
                    .build(),
            );
        if let Some(r) = &settings.region {
            loader = loader.region(Region::new(r.clone()));
        }
        if let Some(p) = &settings.profile {
            loader = loader.profile_name(p);
        }
        let sdk = loader.load().await;
        let region = sdk
            .region()
            .map(|r| r.as_ref().to_owned())
            .ok_or_else(|| {
                PluginError::bad_input(
                    "no region: set the provider config's `region`, AWS_REGION, or a profile's `region`",
                )
                .at("region")
            })?;
        let s3 = {
            let mut b = aws_sdk_s3::config::Builder::from(&sdk);
            if let Some(u) = settings.endpoint_for("s3") {
                // An emulator at an IP or localhost has no per-bucket host names.
                b = b.endpoint_url(u).force_path_style(true);
            }
            aws_sdk_s3::Client::from_conf(b.build())
        };
        Ok(Clients {
            apigw: client!(aws_sdk_apigatewayv2, &sdk, settings, "apigatewayv2"),
            dynamodb: client!(aws_sdk_dynamodb, &sdk, settings, "dynamodb"),
            ec2: client!(aws_sdk_ec2, &sdk, settings, "ec2"),
            events: client!(aws_sdk_eventbridge, &sdk, settings, "events"),
            iam: client!(aws_sdk_iam, &sdk, settings, "iam"),
            lambda: client!(aws_sdk_lambda, &sdk, settings, "lambda"),
            s3,
            secrets: client!(aws_sdk_secretsmanager, &sdk, settings, "secretsmanager"),
            sns: client!(aws_sdk_sns, &sdk, settings, "sns"),
            sqs: client!(aws_sdk_sqs, &sdk, settings, "sqs"),
            ssm: client!(aws_sdk_ssm, &sdk, settings, "ssm"),
            settings,
            region,
            sdk,
            account: OnceCell::new(),
        })
    }

    /// The caller's account id (STS GetCallerIdentity, once per config).
    pub async fn account(&self) -> Result<String> {
        self.account
            .get_or_try_init(|| async {
                let sts = {
                    let mut b = aws_sdk_sts::config::Builder::from(&self.sdk);
                    if let Some(u) = self.settings.endpoint_for("sts") {
                        b = b.endpoint_url(u);
                    }
                    aws_sdk_sts::Client::from_conf(b.build())
                };
                let out = sts.get_caller_identity().send().await.map_err(|e| {
                    crate::error::sdk("reading the account id (sts:GetCallerIdentity)", e)
                })?;
                out.account.ok_or_else(|| {
                    PluginError::internal("sts:GetCallerIdentity returned no account")
                })
            })
            .await
            .cloned()
    }

    /// `arn:aws:<service>:<region>:<account>:<rest>` in this config's partition.
    pub fn partition(&self) -> &'static str {
        if self.region.starts_with("cn-") {
            "aws-cn"
        } else if self.region.starts_with("us-gov-") {
            "aws-us-gov"
        } else {
            "aws"
        }
    }
}

/// Clients by config: a deploy's thousands of calls share one set per config.
#[derive(Default)]
pub struct ClientCache {
    by_settings: Mutex<HashMap<AwsSettings, Arc<OnceCell<Arc<Clients>>>>>,
}

impl ClientCache {
    pub async fn get(&self, ctx: &Context) -> Result<Arc<Clients>> {
        let settings = AwsSettings::from_config(ctx.config())?;
        let cell = {
            let mut map = self.by_settings.lock().unwrap_or_else(|p| p.into_inner());
            map.entry(settings.clone()).or_default().clone()
        };
        cell.get_or_try_init(|| async { Clients::build(settings).await.map(Arc::new) })
            .await
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions() {
        for ok in [
            "us-east-1",
            "eu-central-2",
            "us-gov-west-1",
            "ap-southeast-4",
        ] {
            assert!(valid_region(ok), "{ok}");
        }
        for bad in [
            "",
            "us-east",
            "US-EAST-1",
            "useast1",
            "us-east-x",
            "u-east-1",
        ] {
            assert!(!valid_region(bad), "{bad}");
        }
    }

    #[test]
    fn settings_are_read_and_checked_at_their_keys() {
        let cfg = Value::map()
            .with("region", "eu-west-9x")
            .with("endpoint", "ftp://x")
            .with(
                "endpoints",
                Value::map()
                    .with("sqs", "http://127.0.0.1:1")
                    .with("sqsx", "http://h"),
            );
        let s = AwsSettings::from_config(&cfg).expect("reads");
        assert_eq!(s.endpoint_for("sqs"), Some("http://127.0.0.1:1"));
        assert_eq!(s.endpoint_for("sns"), Some("ftp://x"));
        let d = s.diagnostics();
        let codes: Vec<(&str, String)> = d
            .iter()
            .map(|d| {
                (
                    d.code.as_str(),
                    d.path.as_ref().map(ToString::to_string).unwrap_or_default(),
                )
            })
            .collect();
        assert_eq!(
            codes,
            vec![
                (INVALID_REGION, "region".to_owned()),
                (INVALID_ENDPOINT, "endpoint".to_owned()),
                (UNKNOWN_SERVICE, "endpoints.sqsx".to_owned()),
            ]
        );
    }
}
