//! Resolving the paths of a blueprint against the provider's `root`.
//!
//! A path is joined to the base directory (`root`, or the plugin's working
//! directory without one), normalised lexically (`.` dropped, `..` removes
//! the previous component), and then the longest part of it that exists is
//! canonicalised (symlinks resolved). With a `root`, the result must be the
//! root or lie inside it. Every operation then works on the resolved path,
//! so what is checked is what is touched.

use std::ffi::OsString;
use std::io;
use std::path::{Component, Path, PathBuf};

use trellis_plugin_sdk::prelude::*;

/// Diagnostic code of a path outside the configured root.
pub const PATH_OUTSIDE_ROOT: &str = "local.path-outside-root";
/// Diagnostic code of a path that cannot be resolved.
pub const PATH_INVALID: &str = "local.path-invalid";
/// Diagnostic code of a `root` that is unusable.
pub const ROOT_INVALID: &str = "local.root-invalid";

/// The base directory paths are resolved against, from the provider config.
#[derive(Clone, Debug)]
pub struct Base {
    /// The canonical root, when the config sets one.
    root: Option<PathBuf>,
    /// Where relative paths start: the root, or the working directory.
    base: PathBuf,
}

/// Why a path does not resolve.
#[derive(Debug)]
pub enum PathProblem {
    Empty,
    Nul,
    Outside { resolved: PathBuf, root: PathBuf },
    NotUtf8(PathBuf),
    Io(io::Error),
}

impl PathProblem {
    /// The problem as an error about attribute `attr`, naming `given` (the
    /// path as written).
    pub fn into_error(self, given: &str, attr: &str) -> PluginError {
        let e = match self {
            PathProblem::Empty => PluginError::bad_input(format!("`{attr}` must not be empty")),
            PathProblem::Nul => {
                PluginError::bad_input(format!("`{attr}` must not contain a NUL character"))
            }
            PathProblem::Outside { resolved, root } => PluginError::bad_input(format!(
                "`{attr}` is `{given}`, which resolves to `{}`, outside the provider's root `{}`",
                resolved.display(),
                root.display()
            )),
            PathProblem::NotUtf8(p) => PluginError::bad_input(format!(
                "`{attr}` (`{given}`) resolves to `{}`, which is not valid UTF-8",
                p.display()
            )),
            PathProblem::Io(e) => {
                PluginError::from(e).context(format!("resolving `{attr}` (`{given}`)"))
            }
        };
        e.at(attr)
    }

    /// The problem as a validation diagnostic about attribute `attr`.
    pub fn into_diagnostic(self, given: &str, attr: &str) -> Diagnostic {
        let outside = matches!(self, PathProblem::Outside { .. });
        let message = self.into_error(given, attr).message;
        if outside {
            Diagnostic::error(PATH_OUTSIDE_ROOT, message)
                .at(attr)
                .hint("use a path inside `root`, or change the provider's `root`")
        } else {
            Diagnostic::error(PATH_INVALID, message).at(attr)
        }
    }
}

impl Base {
    /// From the provider configuration of this call.
    pub fn from_ctx(ctx: &Context) -> Result<Base> {
        let root = ctx.config_spec().opt_str("root")?;
        Base::new(root)
    }

    /// With `root` (relative to the working directory when relative), or none.
    pub fn new(root: Option<&str>) -> Result<Base> {
        let cwd = std::env::current_dir().context("reading the plugin's working directory")?;
        let Some(root) = root else {
            return Ok(Base {
                root: None,
                base: cwd,
            });
        };
        if root.is_empty() {
            return Err(PluginError::bad_input("`root` must not be empty").at("root"));
        }
        if root.contains('\0') {
            return Err(
                PluginError::bad_input("`root` must not contain a NUL character").at("root"),
            );
        }
        let joined = normalize(&cwd.join(root));
        let canon = std::fs::canonicalize(&joined).map_err(|e| {
            PluginError::from(e)
                .context(format!("the provider's `root` (`{root}`) cannot be used"))
                .at("root")
        })?;
        if !canon.is_dir() {
            return Err(PluginError::bad_input(format!(
                "the provider's `root` (`{root}`) is not a directory"
            ))
            .at("root"));
        }
        Ok(Base {
            root: Some(canon.clone()),
            base: canon,
        })
    }

    /// The canonical root, if configured.
    pub fn root(&self) -> Option<&Path> {
        self.root.as_deref()
    }

    /// Where relative paths start.
    pub fn base_dir(&self) -> &Path {
        &self.base
    }

    /// Resolves `path` (see the module documentation).
    pub fn resolve(&self, path: &str) -> std::result::Result<PathBuf, PathProblem> {
        if path.is_empty() {
            return Err(PathProblem::Empty);
        }
        if path.contains('\0') {
            return Err(PathProblem::Nul);
        }
        let normalized = normalize(&self.base.join(path));
        let resolved = canonicalize_existing_prefix(&normalized).map_err(PathProblem::Io)?;
        self.check_inside(&resolved)?;
        if resolved.to_str().is_none() {
            return Err(PathProblem::NotUtf8(resolved));
        }
        Ok(resolved)
    }

    /// Fails when `resolved` (already canonical) is outside the root.
    pub fn check_inside(&self, resolved: &Path) -> std::result::Result<(), PathProblem> {
        match &self.root {
            Some(root) if !resolved.starts_with(root) => Err(PathProblem::Outside {
                resolved: resolved.to_path_buf(),
                root: root.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// Resolves `path`, the value of attribute `attr`; errors are BAD_INPUT
    /// (or the I/O error's class) at `attr`.
    pub fn resolve_attr(&self, path: &str, attr: &str) -> Result<PathBuf> {
        self.resolve(path).map_err(|p| p.into_error(path, attr))
    }

    /// A path recorded earlier (an external id or a computed `id`): absolute,
    /// re-resolved so that a root changed since is still enforced.
    pub fn recorded(&self, recorded: &str, attr: &str) -> Result<PathBuf> {
        if !Path::new(recorded).is_absolute() {
            return Err(PluginError::internal(format!(
                "the recorded path `{recorded}` is not absolute"
            )));
        }
        self.resolve_attr(recorded, attr)
    }

    /// A validation diagnostic for `path` at `attr`, if it does not resolve.
    pub fn diagnose(&self, path: &str, attr: &str) -> Option<Diagnostic> {
        self.resolve(path)
            .err()
            .map(|p| p.into_diagnostic(path, attr))
    }
}

/// The resolved path as a string (resolve guarantees UTF-8).
pub fn path_str(p: &Path) -> Result<&str> {
    p.to_str()
        .ok_or_else(|| PluginError::internal(format!("`{}` is not valid UTF-8", p.display())))
}

/// Lexical normalisation: drops `.`, and `..` removes the previous component
/// (never going above `/`).
pub fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Prefix(_) | Component::RootDir => out.push(c.as_os_str()),
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
        }
    }
    out
}

/// Canonicalises the longest prefix of `p` that exists and appends the rest.
/// `p` must be absolute and normalised.
fn canonicalize_existing_prefix(p: &Path) -> io::Result<PathBuf> {
    let mut existing = p.to_path_buf();
    let mut rest: Vec<OsString> = Vec::new();
    loop {
        match std::fs::symlink_metadata(&existing) {
            Ok(_) => break,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                ) =>
            {
                match existing.file_name() {
                    Some(name) => rest.push(name.to_os_string()),
                    None => return Err(e),
                }
                if !existing.pop() {
                    return Err(e);
                }
            }
            Err(e) => return Err(e),
        }
    }
    let mut out = std::fs::canonicalize(&existing).map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "`{}` is a symbolic link whose target does not exist",
                    existing.display()
                ),
            )
        } else {
            e
        }
    })?;
    for name in rest.iter().rev() {
        out.push(name);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_lexically() {
        assert_eq!(normalize(Path::new("/a/./b/../c")), PathBuf::from("/a/c"));
        assert_eq!(normalize(Path::new("/../../x")), PathBuf::from("/x"));
        assert_eq!(normalize(Path::new("/a/b/")), PathBuf::from("/a/b"));
    }

    #[test]
    fn rejects_empty_and_nul() {
        let base = Base::new(None).expect("cwd");
        assert!(matches!(base.resolve(""), Err(PathProblem::Empty)));
        assert!(matches!(base.resolve("a\0b"), Err(PathProblem::Nul)));
    }
}
