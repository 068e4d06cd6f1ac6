//! Provider `local`: real resources on the local machine.
//!
//! - `local/directory`, `local/file`, `local/randomSecret`, `local/envFile`
//!   resources (with drift detection through ReadResource);
//! - links `local/file::local/directory` (HARD) and
//!   `local/envFile::local/{file,directory,randomSecret}` (SOFT);
//! - data source `local/file`, function `sha256`, custom variable type
//!   `local/fileMode`.
//!
//! The provider config's optional `root` confines every path (see
//! [`paths`]). See README.md for the user documentation.

use std::path::PathBuf;
use std::time::Duration;

use trellis_plugin_sdk::prelude::*;

pub mod datasource;
pub mod directory;
pub mod envfile;
pub mod file;
pub mod fsutil;
pub mod functions;
pub mod links;
pub mod paths;
pub mod secret;

use paths::{Base, ROOT_INVALID};

/// The `local` provider.
pub struct LocalProvider;

#[async_trait]
impl Provider for LocalProvider {
    fn namespace(&self) -> &str {
        "local"
    }

    fn version(&self) -> &str {
        env!("CARGO_PKG_VERSION")
    }

    fn config_schema(&self) -> Schema {
        Schema::object().describe("Provider `local`").field(
            "root",
            Field::string().describe(
                "When set, every path must resolve inside this directory (after `..` and symlinks); relative paths are relative to it. Without it, relative paths are relative to the plugin's working directory.",
            ),
        )
    }

    /// Local file-system errors are rarely transient: two retries, quickly.
    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
            multiplier: 2.0,
        }
    }

    fn resources(&self) -> Vec<Box<dyn Resource>> {
        vec![
            Box::new(directory::Directory),
            Box::new(file::File),
            Box::new(secret::RandomSecret),
            Box::new(envfile::EnvFile),
        ]
    }

    fn data_sources(&self) -> Vec<Box<dyn DataSource>> {
        vec![Box::new(datasource::FileDataSource)]
    }

    fn links(&self) -> Vec<Box<dyn Link>> {
        vec![
            Box::new(links::FileInDirectory),
            Box::new(links::EnvFileLink::file()),
            Box::new(links::EnvFileLink::directory()),
            Box::new(links::EnvFileLink::secret()),
        ]
    }

    fn functions(&self) -> Vec<Box<dyn Function>> {
        vec![Box::new(functions::Sha256Fn)]
    }

    fn custom_variable_types(&self) -> Vec<Box<dyn CustomVariableType>> {
        vec![Box::new(functions::FileModeType)]
    }

    async fn validate_config(&self, ctx: &Context) -> Result<Vec<Diagnostic>> {
        if ctx.config_spec().is_unknown("root") {
            return Ok(Vec::new());
        }
        Ok(match Base::from_ctx(ctx) {
            Ok(_) => Vec::new(),
            Err(e) => {
                let mut d = Diagnostic::error(ROOT_INVALID, e.message)
                    .hint("`root` must be an existing directory");
                d.path = e.path;
                vec![d]
            }
        })
    }
}

/// The path of an existing resource: its recorded `id` (state) or external
/// id when absolute, else its spec `path`; resolved against the current
/// root either way.
pub(crate) fn existing_path(base: &Base, current: &ResourceState) -> Result<PathBuf> {
    let recorded = current
        .state
        .get("id")
        .and_then(Value::as_str)
        .filter(|s| s.starts_with('/'))
        .or_else(|| Some(current.external_id.as_str()).filter(|s| s.starts_with('/')));
    match recorded {
        Some(r) => base.recorded(r, "path"),
        None => base.resolve_attr(current.spec().get_str("path")?, "path"),
    }
}

/// A diagnostic for a mode that is not 3-4 octal digits (skipped when unknown).
pub(crate) fn mode_diagnostic(spec: &Spec<'_>, key: &str) -> Option<Diagnostic> {
    let m = spec.get(key)?.as_str()?;
    if fsutil::parse_mode(m).is_some() {
        return None;
    }
    Some(
        Diagnostic::error(
            "local.invalid-mode",
            format!("`{key}` is \"{m}\", which is not an octal mode"),
        )
        .at(spec.path_of(key))
        .hint("write 3 or 4 octal digits, like \"0755\""),
    )
}
