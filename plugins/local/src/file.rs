//! `local/file`: a text file on disk, written atomically.
//!
//! Ownership rule: create refuses to replace a file it did not write (a file
//! already at the path with different content is a CONFLICT; one with the
//! same content is taken over, which is also how a retried create finds the
//! first attempt's file). Update rewrites the file, undoing edits made by
//! hand. Destroy deletes the file only while its content is still what
//! trellis wrote (its SHA-256 matches `sha256` in the state); a file edited
//! since is a CONFLICT and is left in place.

use std::io::{self, Read};
use std::path::{Path, PathBuf};

use trellis_plugin_sdk::prelude::*;

use crate::existing_path;
use crate::fsutil::{
    blocking, format_mode, hash_file, mode_of, parse_mode, sha256_hex, sync_dir, write_atomic,
};
use crate::paths::{Base, path_str};

/// The modes a file may have.
pub const FILE_MODES: [&str; 7] = ["0600", "0640", "0644", "0664", "0700", "0750", "0755"];
const DEFAULT_MODE: &str = "0644";
/// Larger files are not read back into `content` by ReadResource.
pub const MAX_READ_BYTES: u64 = 16 * 1024 * 1024;
/// What ReadResource reports as `content` for a file above [`MAX_READ_BYTES`].
pub const TOO_LARGE: &str = "(file larger than 16 MiB: content not read)";

pub struct File;

struct Desired {
    path: PathBuf,
    content: String,
    sensitive: bool,
    mode: u32,
}

fn desired(ctx: &Context, spec: &Spec<'_>) -> Result<Desired> {
    let base = Base::from_ctx(ctx)?;
    let path = base.resolve_attr(spec.get_str("path")?, "path")?;
    let content = spec.opt_str("content")?.unwrap_or("").to_owned();
    let sensitive = spec.get("content").is_some_and(Value::is_sensitive);
    let mode_text = spec.opt_str("mode")?.unwrap_or(DEFAULT_MODE);
    let mode = FILE_MODES
        .contains(&mode_text)
        .then(|| parse_mode(mode_text))
        .flatten()
        .ok_or_else(|| spec.error("mode", format!("must be one of {}", FILE_MODES.join(", "))))?;
    Ok(Desired {
        path,
        content,
        sensitive,
        mode,
    })
}

/// Computed fields; derived from the content, so sensitive when it is.
fn state(sha: String, size: u64, sensitive: bool) -> Value {
    let mark = |v: Value| if sensitive { Value::sensitive(v) } else { v };
    Value::map()
        .with("sha256", mark(sha.into()))
        .with("size", mark(size.into()))
}

fn check_parent(path: &Path) -> Result<()> {
    match path.parent() {
        Some(parent) if parent.is_dir() => Ok(()),
        Some(parent) => Err(PluginError::not_found(format!(
            "the parent directory `{}` does not exist (declare a local/directory and link the file to it)",
            parent.display()
        ))
        .at("path")),
        None => Err(PluginError::bad_input(format!("`{}` is not a file path", path.display())).at("path")),
    }
}

/// Writes the desired file; `replace_other` says whether an existing file with
/// other content may be replaced (update) or is a conflict (create).
fn write(d: &Desired, replace_other: bool) -> Result<()> {
    match std::fs::symlink_metadata(&d.path) {
        Ok(m) if m.is_file() => {
            if !replace_other {
                let existing =
                    std::fs::read(&d.path).context(format!("reading `{}`", d.path.display()))?;
                if existing != d.content.as_bytes() {
                    return Err(PluginError::conflict(format!(
                        "`{}` already exists with other content; trellis does not replace files it did not write",
                        d.path.display()
                    ))
                    .at("path"));
                }
            }
        }
        Ok(_) => {
            return Err(PluginError::conflict(format!(
                "`{}` exists and is not a regular file",
                d.path.display()
            ))
            .at("path"));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(PluginError::from(e).context(format!("inspecting `{}`", d.path.display())));
        }
    }
    check_parent(&d.path)?;
    write_atomic(&d.path, d.content.as_bytes(), d.mode)
        .context(format!("writing `{}`", d.path.display()))
}

async fn apply(d: Desired, replace_other: bool) -> Result<Applied> {
    let sha = sha256_hex(d.content.as_bytes());
    let size = d.content.len() as u64;
    let sensitive = d.sensitive;
    let id = path_str(&d.path)?.to_owned();
    blocking(move || write(&d, replace_other)).await?;
    tracing::info!(size, "file {id} written");
    Ok(Applied::new(id, state(sha, size, sensitive)))
}

/// What is on disk now.
struct OnDisk {
    content: String,
    sha: String,
    size: u64,
    mode: u32,
}

fn read_disk(path: &Path) -> Result<Option<OnDisk>> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_file() => m,
        Ok(_) => return Ok(None),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
            ) =>
        {
            return Ok(None);
        }
        Err(e) => {
            return Err(PluginError::from(e).context(format!("inspecting `{}`", path.display())));
        }
    };
    let mode = mode_of(&meta);
    if meta.len() > MAX_READ_BYTES {
        let (sha, size) = hash_file(path).context(format!("reading `{}`", path.display()))?;
        return Ok(Some(OnDisk {
            content: TOO_LARGE.to_owned(),
            sha,
            size,
            mode,
        }));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_READ_BYTES + 1).read_to_end(&mut bytes))
        .context(format!("reading `{}`", path.display()))?;
    let sha = sha256_hex(&bytes);
    let size = bytes.len() as u64;
    let content = match String::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    };
    Ok(Some(OnDisk {
        content,
        sha,
        size,
        mode,
    }))
}

#[async_trait]
impl Resource for File {
    fn type_name(&self) -> &str {
        "local/file"
    }

    fn description(&self) -> &str {
        "A text file on the local machine, written atomically. Destroy deletes it only while its content is what trellis wrote."
    }

    fn schema(&self) -> Schema {
        Schema::object()
            .describe("A text file on the local machine")
            .field(
                "path",
                Field::string()
                    .required()
                    .must_recreate()
                    .describe("The file: absolute, or relative to the provider's `root` (or the plugin's working directory); its directory must exist"),
            )
            .field("content", Field::string().default("").describe("The file's content (UTF-8 text)"))
            .field(
                "mode",
                Field::string()
                    .default(DEFAULT_MODE)
                    .allowed(FILE_MODES)
                    .describe("Permission bits in octal"),
            )
            .field("sha256", Field::string().computed().describe("Hex SHA-256 of the content written"))
            .field("size", Field::integer().computed().describe("Size of the content written, in bytes"))
    }

    async fn validate(&self, ctx: &Context, req: &ValidateRequest) -> Result<Vec<Diagnostic>> {
        let spec = req.spec();
        let mut out = Vec::new();
        if let Ok(base) = Base::from_ctx(ctx)
            && let Some(p) = spec.get("path").and_then(Value::as_str)
        {
            out.extend(base.diagnose(p, "path"));
        }
        Ok(out)
    }

    async fn create(&self, ctx: &Context, req: &CreateRequest) -> Result<Applied> {
        ctx.check_cancelled()?;
        apply(desired(ctx, &req.spec())?, false).await
    }

    async fn update(&self, ctx: &Context, req: &UpdateRequest) -> Result<Applied> {
        ctx.check_cancelled()?;
        apply(desired(ctx, &req.spec())?, true).await
    }

    async fn destroy(&self, ctx: &Context, current: &ResourceState) -> Result<()> {
        ctx.check_cancelled()?;
        let base = Base::from_ctx(ctx)?;
        let path = existing_path(&base, current)?;
        let expected = match current.state.get("sha256").and_then(Value::as_str) {
            Some(s) => s.to_owned(),
            None => sha256_hex(current.spec().opt_str("content")?.unwrap_or("").as_bytes()),
        };
        blocking(move || {
            match std::fs::symlink_metadata(&path) {
                Ok(m) if m.is_file() => {}
                Ok(_) => {
                    return Err(PluginError::conflict(format!(
                        "`{}` is no longer a regular file; left in place",
                        path.display()
                    )));
                }
                Err(e) if matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::NotADirectory) => {
                    return Ok(());
                }
                Err(e) => return Err(PluginError::from(e).context(format!("inspecting `{}`", path.display()))),
            }
            let (sha, _) = hash_file(&path).context(format!("reading `{}`", path.display()))?;
            if sha != expected {
                return Err(PluginError::conflict(format!(
                    "`{}` was changed since trellis wrote it; it is left in place: restore its content (apply again) or delete it by hand, then destroy again",
                    path.display()
                )));
            }
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(PluginError::from(e).context(format!("deleting `{}`", path.display()))),
            }
            if let Some(parent) = path.parent() {
                sync_dir(parent);
            }
            tracing::info!("file {} deleted", path.display());
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
        let id = path_str(&path)?.to_owned();
        let Some(disk) = blocking(move || read_disk(&path)).await? else {
            return Ok(None);
        };
        let applied = current.spec();
        let sensitive = current.spec.get("content").is_some_and(Value::is_sensitive);
        let mut spec = current.spec.clone();
        if applied.opt_str("content")?.unwrap_or("") != disk.content {
            let content = Value::from(disk.content);
            spec.insert(
                "content",
                if sensitive {
                    Value::sensitive(content)
                } else {
                    content
                },
            );
        }
        let want_mode = applied.opt_str("mode")?.unwrap_or(DEFAULT_MODE);
        if parse_mode(want_mode) != Some(disk.mode) {
            spec.insert("mode", format_mode(disk.mode));
        }
        Ok(Some(ReadState {
            spec,
            state: state(disk.sha, disk.size, sensitive),
            external_id: Some(id),
        }))
    }

    fn supports_import(&self) -> bool {
        true
    }

    /// The id is the file's path (absolute, or relative to `root`), kept as given in `path`.
    /// Adopted, the file is trellis's: destroy deletes it while its content is unchanged.
    async fn import(&self, ctx: &Context, req: &ImportRequest) -> Result<Option<ReadState>> {
        let base = Base::from_ctx(ctx)?;
        let path = base.resolve_attr(&req.external_id, "path")?;
        let id = path_str(&path)?.to_owned();
        let shown = path.clone();
        let Some(disk) = blocking(move || read_disk(&path)).await? else {
            return Ok(None);
        };
        // A blueprint carries text: content that would not be written back byte for byte
        // (too large to read, or not UTF-8) cannot be declared, so it cannot be adopted.
        if disk.content == TOO_LARGE || sha256_hex(disk.content.as_bytes()) != disk.sha {
            return Err(PluginError::bad_input(format!(
                "`{}` cannot be imported: local/file holds UTF-8 text of at most 16 MiB",
                shown.display()
            )));
        }
        let spec = Value::map()
            .with("path", req.external_id.as_str())
            .with("content", disk.content)
            .with("mode", format_mode(disk.mode));
        Ok(Some(
            ReadState::new(spec, state(disk.sha, disk.size, false)).with_external_id(id),
        ))
    }
}
