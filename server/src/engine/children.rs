//! Child blueprints (`include`): where a child's document comes from. A child is deployed as
//! an instance of its own (`<parent>/<include name>`) by the parent's operation; see
//! `Engine::deploy_children`.

use std::path::{Path, PathBuf};

/// Includes nest at most this deep (the root blueprint is depth 0).
pub const MAX_DEPTH: usize = 8;

/// `a/./b/../c` → `a/c`; a leading `..` that would leave the root is kept (and then found
/// nowhere).
pub fn normalize(path: &str) -> String {
    let absolute = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for p in path.split('/') {
        match p {
            "" | "." => {}
            ".." if parts.last().is_some_and(|l| *l != "..") => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    let joined = parts.join("/");
    if absolute {
        format!("/{joined}")
    } else {
        joined
    }
}

/// The directory part of a file key (`""` for a file at the top).
fn dir_of(file: &str) -> &str {
    file.rfind('/').map_or("", |i| &file[..i])
}

/// Finds a child's document: `path` as written in the include of `parent` (a file key of the
/// request, or an absolute path when the parent was read from the engine host).
///
/// - `https://` and `http://` sources are refused: this engine fetches nothing from the
///   network (no host is allow-listed).
/// - Relative paths are relative to the parent's directory; the file must have been sent with
///   the request, or, for a parent read from disk, lie under an allowed root.
/// - Absolute paths (e.g. from `${cwd()}`) must lie under an allowed root.
pub fn resolve(
    parent: &str,
    path: &str,
    files: &[(String, Vec<u8>)],
    allowed_roots: &[PathBuf],
) -> Result<(String, Vec<u8>), String> {
    if path.starts_with("https://") || path.starts_with("http://") {
        return Err(format!(
            "`{path}`: remote includes are not fetched (no host is allow-listed on this engine); \
             send the file with the request instead"
        ));
    }
    let key = match (path.starts_with('/'), dir_of(parent)) {
        (true, _) | (false, "") => normalize(path),
        (false, dir) => normalize(&format!("{dir}/{path}")),
    };
    if let Some((name, content)) = files.iter().find(|(name, _)| normalize(name) == key) {
        return Ok((name.clone(), content.clone()));
    }
    if !key.starts_with('/') {
        return Err(format!(
            "`{path}` (resolved to `{key}`) was not sent with the blueprint; `trellis plan` and \
             `trellis deploy` send local includes whose path is written literally"
        ));
    }
    let canonical = Path::new(&key)
        .canonicalize()
        .map_err(|e| format!("`{key}`: {e}"))?;
    if !allowed_roots.iter().any(|r| canonical.starts_with(r)) {
        return Err(format!(
            "`{key}` is not under a root the engine allows (--allow-path)"
        ));
    }
    let content = std::fs::read(&canonical).map_err(|e| format!("`{key}`: {e}"))?;
    Ok((canonical.display().to_string(), content))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_normalize() {
        assert_eq!(normalize("a/./b/../c.yaml"), "a/c.yaml");
        assert_eq!(normalize("./c.yaml"), "c.yaml");
        assert_eq!(normalize("/x/y/../z"), "/x/z");
        assert_eq!(normalize("../up.yaml"), "../up.yaml");
    }

    #[test]
    fn children_resolve_relative_to_their_parent() {
        let files = vec![
            ("app.yaml".to_owned(), b"root".to_vec()),
            ("children/a.yaml".to_owned(), b"a".to_vec()),
            ("children/b.yaml".to_owned(), b"b".to_vec()),
        ];
        // A parent at the top: no leading `/` sneaks in.
        let (name, content) = resolve("app.yaml", "./children/a.yaml", &files, &[]).unwrap();
        assert_eq!(
            (name.as_str(), content.as_slice()),
            ("children/a.yaml", &b"a"[..])
        );
        // From a child, siblings are relative to the child's directory.
        let (name, _) = resolve("children/a.yaml", "b.yaml", &files, &[]).unwrap();
        assert_eq!(name, "children/b.yaml");
        let missing = resolve("app.yaml", "nope.yaml", &files, &[]).unwrap_err();
        assert!(missing.contains("not sent"), "{missing}");
        let remote = resolve("app.yaml", "https://example.com/x.yaml", &files, &[]).unwrap_err();
        assert!(remote.contains("remote includes"), "{remote}");
        // Absolute paths need an allowed root.
        let denied = resolve("app.yaml", "/etc/hostname", &files, &[]).unwrap_err();
        assert!(denied.contains("--allow-path"), "{denied}");
    }
}
