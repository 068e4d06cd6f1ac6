//! The [`Transformer`] trait: expands abstract resources into concrete ones.

use trellis_proto::plugin::v1 as pb;

use crate::async_trait;
use crate::context::Context;
use crate::error::{Diagnostic, Result};
use crate::provider::ValidateRequest;
use crate::schema::Schema;

/// An abstract resource type a transformer expands (`celerity/handler`).
#[derive(Clone, Debug, PartialEq)]
pub struct AbstractResource {
    pub type_name: String,
    pub description: String,
    /// An object schema.
    pub schema: Schema,
}

impl AbstractResource {
    pub fn new(type_name: impl Into<String>, schema: Schema) -> AbstractResource {
        AbstractResource {
            type_name: type_name.into(),
            description: String::new(),
            schema,
        }
    }

    pub fn describe(mut self, d: impl Into<String>) -> AbstractResource {
        self.description = d.into();
        self
    }

    pub fn to_proto(&self) -> pb::ResourceTypeDef {
        pb::ResourceTypeDef {
            r#type: self.type_name.clone(),
            description: self.description.clone(),
            spec_schema: Some(self.schema.to_proto()),
            importable: false,
        }
    }
}

/// Which abstract resource a generated resource came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Derivation {
    pub generated_resource: String,
    pub abstract_resource: String,
}

impl Derivation {
    pub fn new(generated: impl Into<String>, from_abstract: impl Into<String>) -> Derivation {
        Derivation {
            generated_resource: generated.into(),
            abstract_resource: from_abstract.into(),
        }
    }
}

/// The result of a transform.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Transformed {
    /// The transformed blueprint document.
    pub blueprint: serde_json::Value,
    pub diagnostics: Vec<Diagnostic>,
    pub derivations: Vec<Derivation>,
}

/// A transformer plugin (`celerity-2023-04-20`). Only `name` and `transform`
/// are required.
#[async_trait]
pub trait Transformer: Send + Sync + 'static {
    /// The transform name as blueprints write it in `transform:`.
    fn name(&self) -> &str;

    fn version(&self) -> &str {
        "0.0.0"
    }

    /// The configuration schema (an object).
    fn config_schema(&self) -> Schema {
        Schema::object()
    }

    fn abstract_resources(&self) -> Vec<AbstractResource> {
        Vec::new()
    }

    /// Expands the blueprint: it arrives as JSON (`${..}` substitutions as
    /// written, insertion order kept) and is returned as JSON.
    async fn transform(&self, ctx: &Context, blueprint: serde_json::Value) -> Result<Transformed>;

    /// Checks an abstract resource beyond its schema.
    async fn validate_abstract_resource(
        &self,
        ctx: &Context,
        req: &ValidateRequest,
    ) -> Result<Vec<Diagnostic>> {
        let _ = (ctx, req);
        Ok(Vec::new())
    }
}
