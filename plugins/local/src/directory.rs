//! `local/directory`: a directory on disk.
//!
//! Ownership rule: the resource records what it created (`created`, and
//! `createdParents` for missing parent directories it had to make). Destroy
//! removes only those, innermost first, and only while they are empty: a
//! directory that still holds anything (the user's files, or things other
//! resources made) is left in place, with a warning in the plugin log, and
//! destroy still succeeds. A directory that already existed is adopted
//! (`created: false`) and never removed.

use std::io;
use std::path::{Path, PathBuf};

use trellis_plugin_sdk::prelude::*;

use crate::fsutil::{blocking, format_mode, mode_of, parse_mode, sync_dir};
use crate::paths::{Base, path_str};
use crate::{existing_path, mode_diagnostic};

pub struct Directory;

/// What ensuring a directory did.
struct Ensured {
    created: bool,
    parents: Vec<PathBuf>,
}

fn spec_mode(spec: &Spec<'_>) -> Result<Option<u32>> {
    match spec.opt_str("mode")? {
        None => Ok(None),
        Some(m) => parse_mode(m).map(Some).ok_or_else(|| {
            spec.error(
                "mode",
                "must be an octal mode of 3 or 4 digits, like \"0755\"",
            )
        }),
    }
}

fn chmod(path: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// Removes what `ensure` created, innermost first; the first failure is
/// returned (with what is left).
fn roll_back(path: &Path, created: bool, parents: &[PathBuf]) -> Vec<PathBuf> {
    let mut left = Vec::new();
    let mut todo: Vec<&Path> = parents.iter().map(PathBuf::as_path).collect();
    if created {
        todo.push(path);
    }
    while let Some(p) = todo.pop() {
        if std::fs::remove_dir(p).is_err() {
            left.push(p.to_path_buf());
            left.extend(todo.drain(..).rev().map(Path::to_path_buf));
        }
    }
    left
}

/// Makes sure `path` is a directory (creating it and missing parents), with
/// `mode` when given. On failure, removes what it created first.
fn ensure(path: &Path, mode: Option<u32>) -> Result<Ensured> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => {
            if let Some(mode) = mode {
                chmod(path, mode).context(format!("setting the mode of `{}`", path.display()))?;
            }
            return Ok(Ensured {
                created: false,
                parents: Vec::new(),
            });
        }
        Ok(_) => {
            return Err(PluginError::conflict(format!(
                "`{}` exists and is not a directory",
                path.display()
            ))
            .at("path"));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(PluginError::from(e).context(format!("inspecting `{}`", path.display())));
        }
    }
    let mut missing = Vec::new();
    let mut cur = path.parent();
    while let Some(p) = cur {
        if std::fs::symlink_metadata(p).is_ok() {
            break;
        }
        missing.push(p.to_path_buf());
        cur = p.parent();
    }
    missing.reverse();
    let mut parents = Vec::new();
    let mut created = false;
    let result = (|| -> io::Result<()> {
        for p in &missing {
            match std::fs::create_dir(p) {
                Ok(()) => parents.push(p.clone()),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && p.is_dir() => {}
                Err(e) => return Err(e),
            }
        }
        match std::fs::create_dir(path) {
            Ok(()) => created = true,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && path.is_dir() => {}
            Err(e) => return Err(e),
        }
        if let Some(mode) = mode {
            chmod(path, mode)?;
        }
        if let Some(parent) = path.parent() {
            sync_dir(parent);
        }
        Ok(())
    })();
    match result {
        Ok(()) => Ok(Ensured { created, parents }),
        Err(e) => {
            let err = PluginError::from(e).context(format!("creating `{}`", path.display()));
            let left = roll_back(path, created, &parents);
            if left.is_empty() {
                Err(err)
            } else {
                // Something could not be removed: report it so it is not orphaned.
                let state = Value::map()
                    .with("id", path.to_string_lossy().into_owned())
                    .with("created", created && left.iter().any(|l| l == path))
                    .with(
                        "createdParents",
                        left.iter()
                            .filter(|l| l.as_path() != path)
                            .map(|l| l.to_string_lossy().into_owned())
                            .collect::<Vec<_>>(),
                    );
                Err(err.with_partial(path.to_string_lossy().into_owned(), state))
            }
        }
    }
}

fn state(path: &str, created: bool, parents: &[String]) -> Value {
    Value::map()
        .with("id", path)
        .with("created", created)
        .with("createdParents", parents.to_vec())
}

fn recorded_parents(current: &ResourceState) -> Vec<String> {
    current
        .state
        .get("createdParents")
        .and_then(Value::as_list)
        .map(|l| {
            l.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// The metadata of the directory at `path`; `None` when nothing or something else is there.
async fn directory_at(path: PathBuf) -> Result<Option<std::fs::Metadata>> {
    let meta = blocking(move || match std::fs::metadata(&path) {
        Ok(m) => Ok(Some(m)),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(PluginError::from(e).context(format!("inspecting `{}`", path.display()))),
    })
    .await?;
    Ok(meta.filter(std::fs::Metadata::is_dir))
}

#[async_trait]
impl Resource for Directory {
    fn type_name(&self) -> &str {
        "local/directory"
    }

    fn description(&self) -> &str {
        "A directory on the local machine. Destroy removes it only if this resource created it and it is empty."
    }

    fn schema(&self) -> Schema {
        Schema::object()
            .describe("A directory on the local machine")
            .field(
                "path",
                Field::string()
                    .required()
                    .must_recreate()
                    .describe("The directory: absolute, or relative to the provider's `root` (or the plugin's working directory)"),
            )
            .field(
                "mode",
                Field::string().describe("Permission bits in octal, like \"0755\"; when not set the directory keeps the mode it was created with (umask)"),
            )
            .field("id", Field::string().computed().describe("The absolute path, after resolving `..` and symlinks"))
            .field(
                "created",
                Field::boolean()
                    .computed()
                    .describe("Whether this resource created the directory (false when it existed already); only then does destroy remove it"),
            )
            .field(
                "createdParents",
                Field::array(Schema::string())
                    .computed()
                    .describe("Missing parent directories this resource created, outermost first; destroy removes them when they are empty"),
            )
    }

    async fn validate(&self, ctx: &Context, req: &ValidateRequest) -> Result<Vec<Diagnostic>> {
        let spec = req.spec();
        let mut out = Vec::new();
        if let Ok(base) = Base::from_ctx(ctx)
            && let Some(p) = spec.get("path").and_then(Value::as_str)
        {
            out.extend(base.diagnose(p, "path"));
        }
        out.extend(mode_diagnostic(&spec, "mode"));
        Ok(out)
    }

    async fn create(&self, ctx: &Context, req: &CreateRequest) -> Result<Applied> {
        ctx.check_cancelled()?;
        let spec = req.spec();
        let base = Base::from_ctx(ctx)?;
        let path = base.resolve_attr(spec.get_str("path")?, "path")?;
        let mode = spec_mode(&spec)?;
        let p = path.clone();
        let ensured = blocking(move || ensure(&p, mode)).await?;
        let id = path_str(&path)?;
        let parents: Vec<String> = ensured
            .parents
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        tracing::info!(created = ensured.created, "directory {id} ready");
        Ok(Applied::new(id, state(id, ensured.created, &parents)))
    }

    async fn update(&self, ctx: &Context, req: &UpdateRequest) -> Result<Applied> {
        ctx.check_cancelled()?;
        let spec = req.spec();
        let base = Base::from_ctx(ctx)?;
        let path = base.resolve_attr(spec.get_str("path")?, "path")?;
        let mode = spec_mode(&spec)?;
        let was_created = req
            .current
            .state
            .get("created")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let mut parents = recorded_parents(&req.current);
        let p = path.clone();
        let ensured = blocking(move || ensure(&p, mode)).await?;
        let id = path_str(&path)?;
        // A directory that had vanished and was made again is ours now.
        let created = was_created || ensured.created;
        for p in &ensured.parents {
            let p = p.to_string_lossy().into_owned();
            if !parents.contains(&p) {
                parents.push(p);
            }
        }
        parents.sort_by_key(|p| Path::new(p).components().count());
        Ok(Applied::new(id, state(id, created, &parents)))
    }

    async fn destroy(&self, ctx: &Context, current: &ResourceState) -> Result<()> {
        ctx.check_cancelled()?;
        let base = Base::from_ctx(ctx)?;
        let path = existing_path(&base, current)?;
        let created = current
            .state
            .get("created")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        if !created {
            tracing::info!(
                "directory {} was not created by trellis; left in place",
                path.display()
            );
            return Ok(());
        }
        let mut parents: Vec<PathBuf> = Vec::new();
        for p in recorded_parents(current) {
            // Parents are removed only where the root still allows it.
            if let Ok(resolved) = base.recorded(&p, "path") {
                parents.push(resolved);
            }
        }
        blocking(move || {
            match std::fs::remove_dir(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::DirectoryNotEmpty
                            | io::ErrorKind::AlreadyExists
                            | io::ErrorKind::NotADirectory
                    ) =>
                {
                    tracing::warn!(
                        "directory {} is not empty (or no longer a directory); left in place",
                        path.display()
                    );
                    return Ok(());
                }
                Err(e) => {
                    return Err(
                        PluginError::from(e).context(format!("removing `{}`", path.display()))
                    );
                }
            }
            for p in parents.iter().rev() {
                match std::fs::remove_dir(p) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(_) => {
                        tracing::info!(
                            "parent directory {} is not empty; left in place",
                            p.display()
                        );
                        break;
                    }
                }
            }
            if let Some(parent) = parents.first().unwrap_or(&path).parent() {
                sync_dir(parent);
            }
            Ok(())
        })
        .await
    }

    fn supports_read(&self) -> bool {
        true
    }

    async fn read(&self, ctx: &Context, current: &ResourceState) -> Result<Option<ReadState>> {
        let base = Base::from_ctx(ctx)?;
        let path = existing_path(&base, current)?;
        let Some(meta) = directory_at(path.clone()).await? else {
            return Ok(None);
        };
        let mut spec = current.spec.clone();
        if let Some(want) = current.spec.get("mode").and_then(Value::as_str) {
            let actual = mode_of(&meta);
            if parse_mode(want) != Some(actual) {
                spec.insert("mode", format_mode(actual));
            }
        }
        let id = path_str(&path)?;
        let created = current
            .state
            .get("created")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        Ok(Some(ReadState {
            spec,
            state: state(id, created, &recorded_parents(current)),
            external_id: Some(id.to_owned()),
        }))
    }

    fn supports_import(&self) -> bool {
        true
    }

    /// The id is the directory's path (absolute, or relative to `root`), kept as given in
    /// `path`. Adopting it makes it trellis's (`created`), so destroy removes it when empty.
    async fn import(&self, ctx: &Context, req: &ImportRequest) -> Result<Option<ReadState>> {
        let base = Base::from_ctx(ctx)?;
        let path = base.resolve_attr(&req.external_id, "path")?;
        let Some(meta) = directory_at(path.clone()).await? else {
            return Ok(None);
        };
        let id = path_str(&path)?;
        let spec = Value::map()
            .with("path", req.external_id.as_str())
            .with("mode", format_mode(mode_of(&meta)));
        Ok(Some(
            ReadState::new(spec, state(id, true, &[])).with_external_id(id),
        ))
    }
}
