//! Local assets for a plan (docs/assets.md): the files and directories the engine asks for
//! (`ChangeSet.missing_assets`), read on this machine and sent with the request.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use trellis_proto::engine::v1 as pb;

use super::Failure;
use crate::engine::assets::{MAX_FILES, MAX_REQUEST_BYTES};

/// The asset at `path` (a key as the engine names it: relative to this command's working
/// directory, or absolute). `used` is what the request's assets hold already, in bytes.
pub(super) fn read(path: &str, used: &mut usize) -> Result<pb::Asset, Failure> {
    let fail = |why: String| Failure::usage(format!("cannot send the local asset `{path}`: {why}"));
    let at = Path::new(path);
    let meta = fs::metadata(at).map_err(|e| fail(e.to_string()))?;
    let mut files = Vec::new();
    if meta.is_dir() {
        walk(at, "", &mut Vec::new(), &mut files, used).map_err(fail)?;
    } else if meta.is_file() {
        files.push(file(at, String::new(), &meta, used).map_err(fail)?);
    } else {
        return Err(fail("not a file or a directory".to_owned()));
    }
    Ok(pb::Asset {
        path: path.to_owned(),
        directory: meta.is_dir(),
        files,
    })
}

fn file(
    at: &Path,
    rel: String,
    meta: &fs::Metadata,
    used: &mut usize,
) -> Result<pb::AssetFile, String> {
    let len = usize::try_from(meta.len()).unwrap_or(usize::MAX);
    if used.saturating_add(len) > MAX_REQUEST_BYTES {
        return Err(format!(
            "the plan's assets would exceed {} MiB; put larger packages in object storage (an `s3://` URI) instead",
            MAX_REQUEST_BYTES >> 20
        ));
    }
    let content = fs::read(at).map_err(|e| format!("{}: {e}", at.display()))?;
    *used += content.len();
    Ok(pb::AssetFile {
        path: rel,
        content,
        executable: meta.permissions().mode() & 0o100 != 0,
    })
}

/// Regular files under `dir`, by path relative to the asset. Symbolic links are followed, as
/// a package would include what they point at; one back to a directory being walked is refused.
fn walk(
    dir: &Path,
    prefix: &str,
    ancestors: &mut Vec<PathBuf>,
    out: &mut Vec<pb::AssetFile>,
    used: &mut usize,
) -> Result<(), String> {
    let canonical = fs::canonicalize(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if ancestors.contains(&canonical) {
        return Err(format!(
            "{} links back to a directory that contains it",
            dir.display()
        ));
    }
    ancestors.push(canonical);
    let mut entries: Vec<_> = fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name();
        let Some(name) = name.to_str() else {
            return Err(format!(
                "{}: a file name that is not UTF-8",
                e.path().display()
            ));
        };
        let rel = if prefix.is_empty() {
            name.to_owned()
        } else {
            format!("{prefix}/{name}")
        };
        let meta = fs::metadata(e.path()).map_err(|err| format!("{rel}: {err}"))?;
        if meta.is_dir() {
            walk(&e.path(), &rel, ancestors, out, used)?;
        } else if meta.is_file() {
            if out.len() >= MAX_FILES {
                return Err(format!("more than {MAX_FILES} files"));
            }
            out.push(file(&e.path(), rel, &meta, used)?);
        }
        // Sockets, FIFOs and devices are not part of a package.
    }
    ancestors.pop();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_is_sent_with_relative_paths_and_execute_bits() {
        let dir = std::env::temp_dir().join(format!("trellis-cli-asset-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("code/lib")).unwrap();
        fs::write(dir.join("code/main.py"), "print(1)").unwrap();
        fs::write(dir.join("code/lib/run.sh"), "#!/bin/sh").unwrap();
        fs::set_permissions(
            dir.join("code/lib/run.sh"),
            fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        std::os::unix::fs::symlink(dir.join("code"), dir.join("code/lib/loop")).unwrap();
        let mut used = 0;
        let looped = read(dir.join("code").to_str().unwrap(), &mut used).unwrap_err();
        assert!(looped.message.contains("links back"), "{}", looped.message);
        fs::remove_file(dir.join("code/lib/loop")).unwrap();
        let mut used = 0;
        let a = read(dir.join("code").to_str().unwrap(), &mut used).unwrap();
        assert!(a.directory);
        let files: Vec<(&str, bool)> = a
            .files
            .iter()
            .map(|f| (f.path.as_str(), f.executable))
            .collect();
        assert_eq!(files, [("lib/run.sh", true), ("main.py", false)]);
        assert_eq!(used, "print(1)".len() + "#!/bin/sh".len());
        let one = read(dir.join("code/main.py").to_str().unwrap(), &mut used).unwrap();
        assert!(!one.directory && one.files.len() == 1 && one.files[0].path.is_empty());
        let gone = read(dir.join("nope").to_str().unwrap(), &mut used).unwrap_err();
        assert!(gone.message.contains("nope"), "{}", gone.message);
        fs::remove_dir_all(&dir).unwrap();
    }
}
