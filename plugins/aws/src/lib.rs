//! Provider `aws`, on aws-sdk-rust; tested against moto (an AWS emulator).
//!
//! Resource types are CloudFormation's resources with their property names in
//! lowerCamelCase (plus the specification's own examples: `codeUri`, `tracing`,
//! `environment.variables`). Every resource carries ownership tags (see [`common`]) so a
//! retried or crash-interrupted create adopts only what it made itself.
//!
//! See README.md for every type, field, link and data source.

use std::sync::Arc;
use std::time::Duration;

use trellis_plugin_sdk::prelude::*;

pub mod common;
pub mod config;
pub mod datasources;
pub mod error;
pub mod links;
pub mod sqs;
pub mod variables;

use config::ClientCache;

/// The `aws` provider. Clients are built once per distinct provider config.
#[derive(Default)]
pub struct AwsProvider {
    clients: Arc<ClientCache>,
    locks: Arc<links::Locks>,
}

#[async_trait]
impl Provider for AwsProvider {
    fn namespace(&self) -> &str {
        "aws"
    }

    fn version(&self) -> &str {
        env!("CARGO_PKG_VERSION")
    }

    fn config_schema(&self) -> Schema {
        config::schema()
    }

    /// AWS throttles bursts and has the odd 5xx: the SDK makes one attempt and the engine
    /// retries with backoff up to about a minute in all.
    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy {
            max_attempts: 6,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(20),
            multiplier: 2.0,
        }
    }

    fn resources(&self) -> Vec<Box<dyn Resource>> {
        let c = || self.clients.clone();
        vec![Box::new(sqs::Queue { clients: c() })]
    }

    fn data_sources(&self) -> Vec<Box<dyn DataSource>> {
        let c = || self.clients.clone();
        vec![
            Box::new(datasources::LambdaFunctions { clients: c() }),
            Box::new(datasources::DynamoTables { clients: c() }),
            Box::new(datasources::Vpcs { clients: c() }),
        ]
    }

    fn custom_variable_types(&self) -> Vec<Box<dyn CustomVariableType>> {
        vec![
            Box::new(variables::RegionType),
            Box::new(variables::InstanceSizeType),
        ]
    }

    fn links(&self) -> Vec<Box<dyn Link>> {
        links::all(&links::Shared {
            clients: self.clients.clone(),
            locks: self.locks.clone(),
        })
    }

    async fn validate_config(&self, ctx: &Context) -> Result<Vec<Diagnostic>> {
        let settings = match config::AwsSettings::from_config(ctx.config()) {
            Ok(s) => s,
            Err(e) => {
                let mut d = Diagnostic::error("aws.invalid-config", e.message);
                d.path = e.path;
                return Ok(vec![d]);
            }
        };
        let mut out = settings.diagnostics();
        if out.is_empty() && settings.region.is_none() {
            // The chain may still find one (AWS_REGION, the profile): ask it.
            if let Err(e) = self.clients.get(ctx).await {
                let mut d = Diagnostic::error(config::NO_REGION, e.message)
                    .hint("set `region` in the provider config");
                d.path = e.path;
                out.push(d);
            }
        }
        Ok(out)
    }
}
