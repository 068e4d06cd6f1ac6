//! Finding plugin executables.
//!
//! A provider is an executable named `trellis-provider-<namespace>`, a
//! transformer one named `trellis-transformer-<name>`. Directories are
//! searched in the order given (the configured plugin directories, then the
//! directory of the running `trellis` executable); within a directory, names
//! are taken in byte order. The first executable found for a kind and name
//! wins; later ones are reported at debug level and ignored. Directories,
//! non-executable files and names with characters outside
//! `[A-Za-z0-9_-]` (such as cargo's `trellis-provider-sim.d`) are ignored.

use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use trellis_proto::plugin::v1 as pb;

pub const PROVIDER_PREFIX: &str = "trellis-provider-";
pub const TRANSFORMER_PREFIX: &str = "trellis-transformer-";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PluginKind {
    Provider,
    Transformer,
}

impl PluginKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PluginKind::Provider => "provider",
            PluginKind::Transformer => "transformer",
        }
    }

    pub fn file_name(self, name: &str) -> String {
        match self {
            PluginKind::Provider => format!("{PROVIDER_PREFIX}{name}"),
            PluginKind::Transformer => format!("{TRANSFORMER_PREFIX}{name}"),
        }
    }

    pub(crate) fn to_proto(self) -> pb::PluginKind {
        match self {
            PluginKind::Provider => pb::PluginKind::Provider,
            PluginKind::Transformer => pb::PluginKind::Transformer,
        }
    }
}

impl fmt::Display for PluginKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A discovered plugin executable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginBinary {
    pub kind: PluginKind,
    /// The provider namespace or the transformer name, from the file name.
    pub name: String,
    pub path: PathBuf,
}

/// Parses a file name into a kind and a name.
pub fn parse_file_name(file_name: &str) -> Option<(PluginKind, &str)> {
    let (kind, name) = if let Some(rest) = file_name.strip_prefix(PROVIDER_PREFIX) {
        (PluginKind::Provider, rest)
    } else if let Some(rest) = file_name.strip_prefix(TRANSFORMER_PREFIX) {
        (PluginKind::Transformer, rest)
    } else {
        return None;
    };
    let valid = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    valid.then_some((kind, name))
}

fn is_executable_file(path: &Path) -> bool {
    // Follows symlinks: a link to an executable is a plugin.
    match std::fs::metadata(path) {
        Ok(m) => m.is_file() && m.permissions().mode() & 0o111 != 0,
        Err(_) => false,
    }
}

/// The directories searched, in order, without duplicates.
pub fn search_dirs(plugin_dirs: &[PathBuf], search_exe_dir: bool) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut push = |d: PathBuf| {
        let canon = std::fs::canonicalize(&d).unwrap_or_else(|_| d.clone());
        let dup = dirs
            .iter()
            .any(|e| std::fs::canonicalize(e).unwrap_or_else(|_| e.clone()) == canon);
        if !dup {
            dirs.push(d);
        }
    };
    for d in plugin_dirs {
        push(d.clone());
    }
    if search_exe_dir
        && let Some(dir) = std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf))
    {
        push(dir);
    }
    dirs
}

/// Every plugin in `dirs`, first match wins, in search order.
pub fn discover(dirs: &[PathBuf]) -> Vec<PluginBinary> {
    let mut found: Vec<PluginBinary> = Vec::new();
    for dir in dirs {
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) => {
                tracing::debug!(dir = %dir.display(), error = %e, "plugin directory not readable");
                continue;
            }
        };
        let mut names: Vec<(String, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path())))
            .collect();
        names.sort();
        for (file_name, path) in names {
            let Some((kind, name)) = parse_file_name(&file_name) else {
                continue;
            };
            if !is_executable_file(&path) {
                tracing::debug!(path = %path.display(), "ignored: not an executable file");
                continue;
            }
            if let Some(first) = found.iter().find(|p| p.kind == kind && p.name == name) {
                tracing::debug!(
                    path = %path.display(),
                    winner = %first.path.display(),
                    "ignored: shadowed by an earlier plugin of the same name"
                );
                continue;
            }
            found.push(PluginBinary {
                kind,
                name: name.to_owned(),
                path,
            });
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names() {
        assert_eq!(
            parse_file_name("trellis-provider-sim"),
            Some((PluginKind::Provider, "sim"))
        );
        assert_eq!(
            parse_file_name("trellis-transformer-celerity-2023-04-20"),
            Some((PluginKind::Transformer, "celerity-2023-04-20"))
        );
        assert_eq!(parse_file_name("trellis-provider-sim.d"), None);
        assert_eq!(parse_file_name("trellis-provider-"), None);
        assert_eq!(parse_file_name("trellis"), None);
    }
}
