//! Links: `local/file::local/directory` (HARD, the directory first) and
//! `local/envFile::local/{file,directory,randomSecret}` (SOFT).

use std::path::PathBuf;

use trellis_plugin_sdk::prelude::*;

use crate::envfile::{Change, change, env_file_path, is_var_name};
use crate::existing_path;
use crate::fsutil::blocking;
use crate::paths::{Base, path_str};

/// The annotation, set on resource B, that replaces `<NAME>` in the
/// variable an env file gets for it.
pub const NAME_ANNOTATION: &str = "local.envFile.name";

/// `local/file` (A) lives inside `local/directory` (B).
pub struct FileInDirectory;

/// The directory's path: its recorded `id`, else its spec path.
fn directory_path(base: &Base, dir: &ResourceState) -> Result<PathBuf> {
    existing_path(base, dir)
}

/// Both paths, when they are known (in stage they may not be).
fn known_paths(base: &Base, link: &LinkRequest) -> Option<(PathBuf, PathBuf)> {
    let a = link.resource_a.spec.get("path").and_then(Value::as_str)?;
    let b = link.resource_b.spec.get("path").and_then(Value::as_str)?;
    Some((base.resolve(a).ok()?, base.resolve(b).ok()?))
}

#[async_trait]
impl Link for FileInDirectory {
    fn resource_type_a(&self) -> &str {
        "local/file"
    }

    fn resource_type_b(&self) -> &str {
        "local/directory"
    }

    fn kind(&self) -> LinkKind {
        LinkKind::Hard
    }

    fn priority(&self) -> LinkPriority {
        LinkPriority::ResourceB
    }

    fn description(&self) -> &str {
        "The file lives inside the directory: the directory is deployed first, and the file's path must be inside it. Link data: {directory}."
    }

    async fn stage(&self, ctx: &Context, link: &LinkRequest) -> Result<StagedLink> {
        let mut staged = StagedLink::default();
        if let Some((file, dir)) = Base::from_ctx(ctx).ok().and_then(|b| known_paths(&b, link))
            && !(file.starts_with(&dir) && file != dir)
        {
            staged.diagnostics.push(
                Diagnostic::error(
                    "local.file-outside-directory",
                    format!(
                        "file `{}` ({}) is not inside directory `{}` ({})",
                        link.resource_a.name,
                        file.display(),
                        link.resource_b.name,
                        dir.display()
                    ),
                )
                .hint("put the file's path inside the directory, or remove the link"),
            );
        }
        Ok(staged)
    }

    async fn update_resource_a(&self, ctx: &Context, link: &LinkRequest) -> Result<Value> {
        if is_removal(link) {
            return Ok(Value::map().with("directory", Value::Null));
        }
        let base = Base::from_ctx(ctx)?;
        let file = existing_path(&base, &link.resource_a)?;
        let dir = directory_path(&base, &link.resource_b)?;
        if !(file.starts_with(&dir) && file != dir) {
            return Err(PluginError::bad_input(format!(
                "file `{}` ({}) is not inside directory `{}` ({})",
                link.resource_a.name,
                file.display(),
                link.resource_b.name,
                dir.display()
            ))
            .at("path"));
        }
        Ok(Value::map().with("directory", path_str(&dir)?))
    }
}

/// A resource state that says "gone": null or an empty map.
fn is_absent(state: &Value) -> bool {
    state.is_null() || state.as_map().is_some_and(|m| m.is_empty())
}

/// Whether the call undoes the link: the engine says so (`LINK_DESTROY`), or
/// resource B is gone (engines that predate `update_type`).
fn is_removal(link: &LinkRequest) -> bool {
    link.update_type == trellis_plugin_sdk::proto::LinkUpdateType::Destroy
        || is_absent(&link.resource_b.state)
}

/// `FooBar-baz.txt` → `FOO_BAR_BAZ_TXT`.
pub fn upper_snake(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::new();
    for (i, &c) in chars.iter().enumerate() {
        if !c.is_ascii_alphanumeric() {
            if !out.ends_with('_') && !out.is_empty() {
                out.push('_');
            }
            continue;
        }
        if c.is_ascii_uppercase() && i > 0 {
            let prev = chars[i - 1];
            let next_lower = chars.get(i + 1).is_some_and(char::is_ascii_lowercase);
            let boundary = prev.is_ascii_lowercase()
                || prev.is_ascii_digit()
                || (prev.is_ascii_uppercase() && next_lower);
            if boundary && !out.ends_with('_') && !out.is_empty() {
                out.push('_');
            }
        }
        out.push(c.to_ascii_uppercase());
    }
    while out.ends_with('_') {
        out.pop();
    }
    out
}

/// What kind of resource B is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    File,
    Directory,
    Secret,
}

impl Target {
    fn resource_type(self) -> &'static str {
        match self {
            Target::File => "local/file",
            Target::Directory => "local/directory",
            Target::Secret => "local/randomSecret",
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Target::File => "FILE_",
            Target::Directory => "DIR_",
            Target::Secret => "SECRET_",
        }
    }

    fn link_type(self) -> String {
        format!("local/envFile::{}", self.resource_type())
    }
}

/// The field of an env file's spec holding the entry `var`: `values.<var>`.
pub fn owned_entry(var: &str) -> AttrPath {
    AttrPath::root().field("values").field(var)
}

/// `local/envFile` (A) gets one line for the linked resource (B).
pub struct EnvFileLink {
    target: Target,
    link_type: String,
}

impl EnvFileLink {
    fn new(target: Target) -> EnvFileLink {
        EnvFileLink {
            target,
            link_type: target.link_type(),
        }
    }
    pub fn file() -> EnvFileLink {
        EnvFileLink::new(Target::File)
    }
    pub fn directory() -> EnvFileLink {
        EnvFileLink::new(Target::Directory)
    }
    pub fn secret() -> EnvFileLink {
        EnvFileLink::new(Target::Secret)
    }

    /// The variable for B: prefix + upper-snake of the annotation, else of B's name.
    fn variable(&self, link: &LinkRequest) -> Result<String> {
        let name = match link.annotations_b.get(NAME_ANNOTATION) {
            None | Some(Value::Null) => link.resource_b.name.as_str(),
            Some(v) => v.as_str().ok_or_else(|| {
                PluginError::bad_input(format!(
                    "annotation `{NAME_ANNOTATION}` of `{}` must be a string, found {}",
                    link.resource_b.name,
                    v.kind_name()
                ))
            })?,
        };
        let var = format!("{}{}", self.target.prefix(), upper_snake(name));
        if var.len() == self.target.prefix().len() || !is_var_name(&var) {
            return Err(PluginError::bad_input(format!(
                "`{name}` (of `{}`) gives no usable variable name: use letters, digits and separators, or set the annotation `{NAME_ANNOTATION}`",
                link.resource_b.name
            )));
        }
        Ok(var)
    }

    /// The line's value, from B's state (or spec).
    fn value(&self, base: &Base, b: &ResourceState) -> Result<String> {
        match self.target {
            Target::File | Target::Directory => Ok(path_str(&existing_path(base, b)?)?.to_owned()),
            Target::Secret => b
                .state
                .get("value")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| {
                    PluginError::bad_input(format!(
                        "secret `{}` has no `value` in its state",
                        b.name
                    ))
                }),
        }
    }
}

#[async_trait]
impl Link for EnvFileLink {
    fn resource_type_a(&self) -> &str {
        "local/envFile"
    }

    fn resource_type_b(&self) -> &str {
        self.target.resource_type()
    }

    fn link_type(&self) -> String {
        self.link_type.clone()
    }

    fn kind(&self) -> LinkKind {
        LinkKind::Soft
    }

    fn description(&self) -> &str {
        match self.target {
            Target::File => {
                "The env file gets FILE_<NAME>=<absolute path of the file>. Link data: {variable, path, removed}."
            }
            Target::Directory => {
                "The env file gets DIR_<NAME>=<absolute path of the directory>. Link data: {variable, path, removed}."
            }
            Target::Secret => {
                "The env file gets SECRET_<NAME>=<the secret's value>. Link data: {variable, path, removed} (never the value)."
            }
        }
    }

    fn annotations(&self) -> Vec<Annotation> {
        vec![
            Annotation::new(NAME_ANNOTATION, self.target.resource_type(), SchemaType::String).describe(format!(
                "Replaces <NAME> in the variable {}<NAME> that a linked local/envFile gets for this resource (upper-snake-cased; default: the resource's name)",
                self.target.prefix()
            )),
        ]
    }

    /// Checks the variable name, and declares the env file's entry for it
    /// (`values.<VARIABLE>` of resource A) as owned by the link: the line is
    /// the link's, so it is not drift of the env file.
    async fn stage(&self, _ctx: &Context, link: &LinkRequest) -> Result<StagedLink> {
        let mut staged = StagedLink::default();
        let unknown = link
            .annotations_b
            .get(NAME_ANNOTATION)
            .is_some_and(Value::is_unknown);
        if unknown {
            return Ok(staged);
        }
        match self.variable(link) {
            Ok(var) => {
                if link.update_type != trellis_plugin_sdk::proto::LinkUpdateType::Destroy
                    && link
                        .resource_a
                        .spec
                        .get("values")
                        .and_then(|v| v.get(&var))
                        .is_some()
                {
                    staged.diagnostics.push(
                        Diagnostic::error(
                            "local.envfile-variable-taken",
                            format!(
                                "env file `{}` sets `{var}` in its own `values`, and the link to `{}` writes the same variable",
                                link.resource_a.name, link.resource_b.name
                            ),
                        )
                        .hint(format!(
                            "remove `{var}` from `values`, or set the annotation `{NAME_ANNOTATION}` on `{}`",
                            link.resource_b.name
                        )),
                    );
                }
                staged.owned_paths_a.push(owned_entry(&var));
            }
            Err(e) => staged.diagnostics.push(Diagnostic::error(
                "local.envfile-variable-invalid",
                e.message,
            )),
        }
        Ok(staged)
    }

    /// Adds (or replaces) B's line; with B's state absent (null or empty),
    /// removes it instead. A renamed variable (the annotation changed)
    /// replaces the one recorded in the link data.
    async fn update_resource_a(&self, ctx: &Context, link: &LinkRequest) -> Result<Value> {
        ctx.check_cancelled()?;
        let base = Base::from_ctx(ctx)?;
        let path = env_file_path(&base, &link.resource_a)?;
        let path_text = path_str(&path)?.to_owned();
        let recorded = link
            .link_data
            .get("variable")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let token = ctx.cancellation_token();
        if is_removal(link) {
            let mut vars: Vec<String> = recorded.into_iter().collect();
            if let Ok(v) = self.variable(link)
                && !vars.contains(&v)
            {
                vars.push(v);
            }
            let variable = vars.first().cloned();
            blocking(move || change(&path, Change::Remove(vars), &|| token.is_cancelled())).await?;
            tracing::info!(
                "env file {path_text}: line of `{}` removed",
                link.resource_b.name
            );
            return Ok(Value::map()
                .with("variable", variable)
                .with("path", path_text)
                .with("removed", true));
        }
        let var = self.variable(link)?;
        let value = self.value(&base, &link.resource_b)?;
        let header = link.resource_a.spec().opt_str("header")?.map(str::to_owned);
        let set = Change::Set {
            var: var.clone(),
            value,
            replaces: recorded,
            header,
        };
        blocking(move || change(&path, set, &|| token.is_cancelled())).await?;
        tracing::info!("env file {path_text}: {var} set");
        Ok(Value::map()
            .with("variable", var)
            .with("path", path_text)
            .with("removed", false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_entry_paths() {
        assert_eq!(owned_entry("FILE_A").to_string(), "values.FILE_A");
    }

    #[test]
    fn upper_snake_cases() {
        assert_eq!(upper_snake("dbPassword"), "DB_PASSWORD");
        assert_eq!(upper_snake("my-file.txt"), "MY_FILE_TXT");
        assert_eq!(upper_snake("HTTPServer"), "HTTP_SERVER");
        assert_eq!(upper_snake("config2"), "CONFIG2");
        assert_eq!(upper_snake("v2Config"), "V2_CONFIG");
        assert_eq!(upper_snake("__a__b__"), "A_B");
        assert_eq!(upper_snake("ALREADY_SNAKE"), "ALREADY_SNAKE");
        assert_eq!(upper_snake("--"), "");
    }
}
