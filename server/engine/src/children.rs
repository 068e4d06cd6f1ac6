//! Child blueprints (`include`): where a child's document comes from. A child is deployed as
//! an instance of its own (`<parent>/<include name>`) by the parent's operation; see
//! `Engine::deploy_children`.

use std::path::{Path, PathBuf};

use super::remote::{self, IncludeUrl};

/// Includes nest at most this deep (the root blueprint is depth 0).
pub const MAX_DEPTH: usize = 8;

/// `a/./b/../c` → `a/c`; a leading `..` that would leave the root is kept (and then found
/// nowhere). A URL (`https://...`, already normalized when parsed) is returned as it is.
pub fn normalize(path: &str) -> String {
    if remote::is_remote(path) {
        return path.to_owned();
    }
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
/// request, an absolute path when the parent was read from the engine host, or the URL the
/// parent was fetched from).
///
/// - `https://` sources are handed to `fetch` (the engine's [`remote::RemoteIncludes`]: only
///   from allow-listed hosts, size-limited); `http://` is refused (not encrypted). The child's
///   file name is its URL without the query; a document of that name in `files` (fetched when
///   the change set was planned) is used instead of fetching again.
/// - In a child fetched over https, a relative path is relative to its URL (fetched the same
///   way); an absolute path is refused.
/// - Otherwise relative paths are relative to the parent's directory; the file must have been
///   sent with the request, or, for a parent read from disk, lie under an allowed root.
/// - Absolute paths (e.g. from `${cwd()}`) must lie under an allowed root.
pub fn resolve(
    parent: &str,
    path: &str,
    files: &[(String, Vec<u8>)],
    allowed_roots: &[PathBuf],
    max_input_size: usize,
    fetch: &dyn Fn(&IncludeUrl) -> Result<Vec<u8>, String>,
) -> Result<(String, Vec<u8>), String> {
    let url = if remote::is_remote(path) {
        Some(IncludeUrl::parse(path)?)
    } else if remote::is_remote(parent) {
        Some(IncludeUrl::parse(parent)?.join(path)?)
    } else {
        None
    };
    if let Some(url) = url {
        let name = url.to_string();
        // Fetched while planning: the change set holds the document, so execution deploys
        // exactly what was planned (and asks the server nothing).
        if let Some((_, content)) = files.iter().find(|(n, _)| *n == name) {
            return Ok((name, content.clone()));
        }
        let content = fetch(&url)?;
        return Ok((name, content));
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
    // As for path sources: the roots are checked before anything says whether the file
    // exists, so a refusal reveals nothing outside them.
    let (resolved, content) = super::paths::read_under_roots(
        Path::new(&key),
        Path::new(&key),
        allowed_roots,
        max_input_size,
    )
    .map_err(|refused| match refused {
        super::paths::Refused::Outside => {
            format!("`{key}` is not under a root the engine allows (--allow-path)")
        }
        super::paths::Refused::Invalid(e) => format!("`{key}`: {e}"),
    })?;
    Ok((resolved.display().to_string(), content))
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

    fn no_fetch(url: &IncludeUrl) -> Result<Vec<u8>, String> {
        panic!("{url} fetched")
    }

    #[test]
    fn children_resolve_relative_to_their_parent() {
        let resolve = |parent: &str, path: &str, files: &[(String, Vec<u8>)], roots: &[PathBuf]| {
            super::resolve(parent, path, files, roots, 1 << 20, &no_fetch)
        };
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
        let plain = resolve("app.yaml", "http://example.com/x.yaml", &files, &[]).unwrap_err();
        assert!(plain.contains("not encrypted"), "{plain}");
        // Absolute paths need an allowed root.
        let denied = resolve("app.yaml", "/etc/hostname", &files, &[]).unwrap_err();
        assert!(denied.contains("--allow-path"), "{denied}");
        // Outside the roots, a file that exists and one that does not get the same answer.
        let root = std::env::temp_dir().canonicalize().unwrap();
        let roots = [root.join("trellis-no-such-root")];
        let exists = resolve("app.yaml", "/etc/hostname", &files, &roots).unwrap_err();
        let absent = resolve("app.yaml", "/etc/no-such-file", &files, &roots).unwrap_err();
        assert_eq!(
            exists.replace("/etc/hostname", "X"),
            absent.replace("/etc/no-such-file", "X")
        );
    }

    #[test]
    fn remote_children_and_their_relative_includes_are_fetched() {
        let fetched = std::cell::RefCell::new(Vec::new());
        let fetch = |url: &IncludeUrl| {
            fetched.borrow_mut().push(url.to_string());
            Ok(format!("from {url}").into_bytes())
        };
        let files = vec![("child.yaml".to_owned(), b"local".to_vec())];
        let (name, content) = resolve(
            "app.yaml",
            "https://Bp.Example:8443/a/child.yaml?token=t",
            &files,
            &[],
            1 << 20,
            &fetch,
        )
        .unwrap();
        assert_eq!(name, "https://bp.example:8443/a/child.yaml");
        assert_eq!(content, b"from https://bp.example:8443/a/child.yaml");
        // Inside the fetched child, `child.yaml` is next to it on the server, never the
        // request's file of that name.
        let (name, _) = resolve(&name, "./child.yaml", &files, &[], 1 << 20, &fetch).unwrap();
        assert_eq!(name, "https://bp.example:8443/a/child.yaml");
        let (name, _) = resolve(&name, "../b/db.yaml", &files, &[], 1 << 20, &fetch).unwrap();
        assert_eq!(name, "https://bp.example:8443/b/db.yaml");
        let abs = resolve(&name, "/etc/passwd", &files, &[], 1 << 20, &fetch).unwrap_err();
        assert!(abs.contains("absolute"), "{abs}");
        assert_eq!(fetched.borrow().len(), 3);
        // The fetcher's refusal is the error.
        let refused = resolve(
            "app.yaml",
            "https://x.example/c.yaml",
            &files,
            &[],
            1 << 20,
            &|u| Err(format!("{u}: not allowed")),
        )
        .unwrap_err();
        assert_eq!(refused, "https://x.example/c.yaml: not allowed");
        assert_eq!(normalize("https://h/a/b.yaml"), "https://h/a/b.yaml");
    }
}
