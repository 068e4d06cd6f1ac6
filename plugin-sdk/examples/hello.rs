//! A complete provider with one resource, `hello/greeting`.
use std::process::ExitCode;

use trellis_plugin_sdk::prelude::*;

pub(crate) struct Hello;

impl Provider for Hello {
    fn namespace(&self) -> &str {
        "hello"
    }
    fn version(&self) -> &str {
        env!("CARGO_PKG_VERSION")
    }
    fn resources(&self) -> Vec<Box<dyn Resource>> {
        vec![Box::new(Greeting)]
    }
}

pub(crate) struct Greeting;

fn greet(ctx: &Context, spec: Spec<'_>) -> Result<Applied> {
    let name = spec.get_str("name")?; // BAD_INPUT at `name` when missing or not a string
    let excited = spec.opt_bool("excited")?.unwrap_or(false);
    ctx.progress(format!("greeting {name}"), Some(0.5));
    let message = format!("Hello, {name}{}", if excited { "!" } else { "." });
    let state = Value::map().with("message", message);
    Ok(Applied::new(format!("greeting-{name}"), state))
}

#[async_trait]
impl Resource for Greeting {
    fn type_name(&self) -> &str {
        "hello/greeting"
    }
    fn schema(&self) -> Schema {
        Schema::object()
            .field(
                "name",
                Field::string()
                    .required()
                    .must_recreate()
                    .describe("Who to greet"),
            )
            .field("excited", Field::boolean().default(false))
            .field("message", Field::string().computed())
    }
    async fn create(&self, ctx: &Context, req: &CreateRequest) -> Result<Applied> {
        greet(ctx, req.spec())
    }
    async fn update(&self, ctx: &Context, req: &UpdateRequest) -> Result<Applied> {
        greet(ctx, req.spec())
    }
    async fn destroy(&self, _ctx: &Context, _current: &ResourceState) -> Result<()> {
        Ok(()) // nothing to clean up
    }
}

fn main() -> ExitCode {
    trellis_plugin_sdk::serve_provider(Hello)
}
