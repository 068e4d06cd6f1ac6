//! A Lambda function's code package, from its `codeUri`.
//!
//! - `s3://bucket/key` (optionally `?versionId=...`): a package already in S3;
//! - a local `.zip` file: sent as is;
//! - a local directory: packed into a zip that depends on the files alone (entries sorted
//!   by path, every timestamp 1980-01-01, file modes kept, paths relative to the
//!   directory), so unchanged code has the same sha256 and is not uploaded again;
//! - `deployed://<CodeSha256>`: the code an existing function has now, kept as it is and
//!   never uploaded. Import reports it, as Lambda keeps no trace of where code came from;
//!   a new function, or new code, needs one of the forms above.
//!
//! `codeUri` is a `local_asset` field: under the engine, a path the blueprint writes reaches
//! the provider as `asset:sha256:<hex>/<name>`, with the path of the engine's copy of the
//! content (sent by the client, relative to the blueprint) in the call's context. A plain
//! path is read as given only when the provider is called directly (tests, another host); a
//! `file://` URI is refused, so a request can never name a file on the engine's host.

use std::fs;
use std::io::{Cursor, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use trellis_plugin_sdk::prelude::*;
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, DateTime, System, ZipWriter};

/// The largest zip Lambda takes in a request (larger packages go through S3).
pub const MAX_ZIP_BYTES: usize = 50 * 1024 * 1024;
/// The largest unzipped package Lambda runs.
pub const MAX_UNZIPPED_BYTES: u64 = 250 * 1024 * 1024;

/// Where a package is in S3.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3Location {
    pub bucket: String,
    pub key: String,
    pub version: Option<String>,
}

/// What a `codeUri` naming the code a function has now starts with.
pub const DEPLOYED: &str = "deployed://";

/// The `codeUri` that keeps the code whose sha256 (base64, Lambda's `CodeSha256`) is `sha`.
pub fn deployed_uri(sha: &str) -> String {
    format!("{DEPLOYED}{sha}")
}

#[derive(Clone, PartialEq, Eq)]
pub enum Package {
    /// The zip's bytes, to send with the request.
    Zip(Vec<u8>),
    S3(S3Location),
    /// The code a function has now, by its sha256: nothing to send.
    Deployed(String),
}

/// A code package and its sha256.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Code {
    pub package: Package,
    /// The package's sha256, base64 (what Lambda reports as `CodeSha256`); None for a
    /// package in S3 until it is read ([`s3_sha256`]).
    pub sha256: Option<String>,
}

impl std::fmt::Debug for Package {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Package::Zip(b) => write!(f, "Zip({} bytes)", b.len()),
            Package::S3(l) => write!(f, "S3({l:?})"),
            Package::Deployed(sha) => write!(f, "Deployed({sha})"),
        }
    }
}

/// The package `uri` names (`ctx` holds the local assets the engine sent). Errors are
/// BAD_INPUT (the caller puts them at its field).
pub async fn load(ctx: &Context, uri: &str) -> Result<Code> {
    if let Some(sha) = uri.strip_prefix(DEPLOYED) {
        if sha.is_empty() {
            return Err(PluginError::bad_input(format!(
                "`{uri}`: write {DEPLOYED}<CodeSha256> (the sha256 Lambda reports for the code)"
            )));
        }
        return Ok(Code {
            package: Package::Deployed(sha.to_owned()),
            sha256: Some(sha.to_owned()),
        });
    }
    if let Some(rest) = uri.strip_prefix("s3://") {
        return Ok(Code {
            package: Package::S3(parse_s3(rest).ok_or_else(|| {
                PluginError::bad_input(format!(
                    "`{uri}` is not an S3 object: write s3://bucket/key (with ?versionId=... for one version)"
                ))
            })?),
            sha256: None,
        });
    }
    let path = if uri.starts_with("asset:") {
        ctx.local_asset(uri).map(Path::to_path_buf).ok_or_else(|| {
            PluginError::bad_input(format!(
                "the engine sent no content for `{uri}`; plan the change again"
            ))
        })?
    } else if uri.contains("://") {
        return Err(PluginError::bad_input(format!(
            "`{uri}`: write s3://bucket/key, a path relative to the blueprint (the client sends its content), or {DEPLOYED}<CodeSha256> for the code a function has"
        )));
    } else {
        PathBuf::from(uri)
    };
    let uri = uri.to_owned();
    tokio::task::spawn_blocking(move || load_local(&uri, &path))
        .await
        .map_err(|e| PluginError::internal(format!("reading the code package: {e}")))?
}

/// `bucket/key?versionId=v` → its parts.
pub fn parse_s3(rest: &str) -> Option<S3Location> {
    let (path, version) = match rest.rsplit_once("?versionId=") {
        Some((p, v)) if !v.is_empty() => (p, Some(v.to_owned())),
        Some(_) => return None,
        None => (rest, None),
    };
    let (bucket, key) = path.split_once('/')?;
    if bucket.is_empty() || key.is_empty() {
        return None;
    }
    Some(S3Location {
        bucket: bucket.to_owned(),
        key: key.to_owned(),
        version,
    })
}

/// The base64 sha256 of `bytes`, as Lambda reports `CodeSha256`.
pub fn sha256_base64(bytes: &[u8]) -> String {
    aws_smithy_types::base64::encode(Sha256::digest(bytes))
}

/// The base64 sha256 of a package in S3, read in chunks.
pub async fn s3_sha256(s3: &aws_sdk_s3::Client, at: &S3Location) -> Result<String> {
    let what = format!("reading s3://{}/{}", at.bucket, at.key);
    let out = s3
        .get_object()
        .bucket(&at.bucket)
        .key(&at.key)
        .set_version_id(at.version.clone())
        .send()
        .await
        .map_err(|e| crate::error::sdk(&what, e))?;
    let mut body = out.body;
    let mut hash = Sha256::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| PluginError::transient(format!("{what}: {e}")))?;
        hash.update(&chunk);
    }
    Ok(aws_smithy_types::base64::encode(hash.finalize()))
}

fn load_local(uri: &str, path: &Path) -> Result<Code> {
    let bad = |why: String| PluginError::bad_input(format!("codeUri `{uri}`: {why}"));
    let meta = fs::metadata(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
    let bytes = if meta.is_dir() {
        pack_dir(path).map_err(|e| bad(e.to_string()))?
    } else if path
        .extension()
        .is_some_and(|x| x.eq_ignore_ascii_case("zip"))
    {
        if meta.len() > MAX_ZIP_BYTES as u64 {
            return Err(too_big(uri, meta.len()));
        }
        let bytes = fs::read(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
        if !bytes.starts_with(b"PK\x03\x04") && !bytes.starts_with(b"PK\x05\x06") {
            return Err(bad("not a zip file".to_owned()));
        }
        bytes
    } else {
        return Err(bad(
            "must be s3://bucket/key, a .zip file or a directory".to_owned()
        ));
    };
    if bytes.len() > MAX_ZIP_BYTES {
        return Err(too_big(uri, bytes.len() as u64));
    }
    Ok(Code {
        sha256: Some(sha256_base64(&bytes)),
        package: Package::Zip(bytes),
    })
}

fn too_big(uri: &str, n: u64) -> PluginError {
    PluginError::bad_input(format!(
        "codeUri `{uri}`: the zip is {n} bytes, over Lambda's {MAX_ZIP_BYTES} for a direct upload; upload it to S3 and use s3://bucket/key"
    ))
}

/// A file to pack: its path in the zip (`/`-separated), where it is, its mode.
struct Entry {
    name: String,
    path: PathBuf,
    mode: u32,
}

/// `dir` as a zip whose bytes depend only on the files' paths, contents and modes.
pub fn pack_dir(dir: &Path) -> std::io::Result<Vec<u8>> {
    let mut entries = Vec::new();
    let mut total = 0;
    walk(dir, "", &mut entries, &mut Vec::new(), &mut total)?;
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    let mut zip = ZipWriter::new(Cursor::new(Vec::new()));
    let mut buf = Vec::new();
    for e in &entries {
        let options = SimpleFileOptions::default()
            .compression_method(CompressionMethod::Deflated)
            .last_modified_time(DateTime::DEFAULT)
            .system(System::Unix)
            .unix_permissions(e.mode);
        zip.start_file(e.name.as_str(), options)
            .map_err(std::io::Error::other)?;
        buf.clear();
        fs::File::open(&e.path)?.read_to_end(&mut buf)?;
        zip.write_all(&buf)?;
    }
    Ok(zip.finish().map_err(std::io::Error::other)?.into_inner())
}

fn walk(
    dir: &Path,
    prefix: &str,
    out: &mut Vec<Entry>,
    ancestors: &mut Vec<PathBuf>,
    total: &mut u64,
) -> std::io::Result<()> {
    // Symbolic links are followed; one back to a directory being walked would never end.
    let canonical = fs::canonicalize(dir)?;
    if ancestors.contains(&canonical) {
        return Err(std::io::Error::other(format!(
            "{} links back to a directory that contains it",
            dir.display()
        )));
    }
    ancestors.push(canonical);
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let file_name = entry.file_name();
        let Some(name) = file_name.to_str() else {
            return Err(std::io::Error::other(format!(
                "{}: the name is not UTF-8",
                entry.path().display()
            )));
        };
        let name = if prefix.is_empty() {
            name.to_owned()
        } else {
            format!("{prefix}/{name}")
        };
        let path = entry.path();
        let meta = fs::metadata(&path)
            .map_err(|e| std::io::Error::other(format!("{}: {e}", path.display())))?;
        if meta.is_dir() {
            walk(&path, &name, out, ancestors, total)?;
        } else if meta.is_file() {
            *total += meta.len();
            if *total > MAX_UNZIPPED_BYTES {
                return Err(std::io::Error::other(format!(
                    "the files add up to more than Lambda's {MAX_UNZIPPED_BYTES} bytes unzipped"
                )));
            }
            out.push(Entry {
                name,
                path,
                mode: mode(&meta),
            });
        }
        // Sockets, FIFOs and devices are not code: left out.
    }
    ancestors.pop();
    Ok(())
}

#[cfg(unix)]
fn mode(meta: &fs::Metadata) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    meta.permissions().mode() & 0o777
}

#[cfg(not(unix))]
fn mode(_meta: &fs::Metadata) -> u32 {
    0o644
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    fn temp_dir(tag: &str) -> PathBuf {
        static N: AtomicU64 = AtomicU64::new(0);
        let d = std::env::temp_dir().join(format!(
            "trellis-code-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(&d).expect("temp dir");
        d
    }

    fn write(path: &Path, body: &str) {
        if let Some(p) = path.parent() {
            fs::create_dir_all(p).expect("dirs");
        }
        fs::write(path, body).expect("write");
    }

    #[test]
    fn s3_uris() {
        assert_eq!(
            parse_s3("b/k/x.zip?versionId=v1"),
            Some(S3Location {
                bucket: "b".to_owned(),
                key: "k/x.zip".to_owned(),
                version: Some("v1".to_owned())
            })
        );
        assert_eq!(parse_s3("b/k").map(|l| l.version), Some(None));
        assert_eq!(parse_s3("b"), None);
        assert_eq!(parse_s3("b/"), None);
        assert_eq!(parse_s3("/k"), None);
        assert_eq!(parse_s3("b/k?versionId="), None);
    }

    #[tokio::test]
    async fn directories_pack_the_same_whatever_the_order_and_times() {
        let a = temp_dir("a");
        let b = temp_dir("b");
        // The same files, written in different orders at different times.
        write(&a.join("z.py"), "z = 1\n");
        write(&a.join("lib/util.py"), "u = 2\n");
        write(&a.join("handler.py"), "def handler(e, c):\n    return 1\n");
        std::thread::sleep(std::time::Duration::from_millis(20));
        write(&b.join("handler.py"), "def handler(e, c):\n    return 1\n");
        write(&b.join("lib/util.py"), "u = 2\n");
        write(&b.join("z.py"), "z = 1\n");
        #[cfg(unix)]
        for d in [&a, &b] {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(d.join("z.py"), fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        let ca = load(&Context::new(Value::Null), a.to_str().expect("utf-8"))
            .await
            .expect("packed");
        let cb = load(&Context::new(Value::Null), b.to_str().expect("utf-8"))
            .await
            .expect("packed");
        assert_eq!(ca, cb);
        let Package::Zip(bytes) = &ca.package else {
            panic!("a zip")
        };
        assert_eq!(ca.sha256.as_deref(), Some(sha256_base64(bytes).as_str()));

        let mut z = zip::ZipArchive::new(Cursor::new(bytes.clone())).expect("a zip");
        let names: Vec<String> = (0..z.len())
            .map(|i| {
                z.by_index(i)
                    .expect("entry")
                    .name()
                    .expect("name")
                    .into_owned()
            })
            .collect();
        assert_eq!(names, ["handler.py", "lib/util.py", "z.py"]);
        let mut f = z.by_name("z.py").expect("z.py");
        #[cfg(unix)]
        assert_eq!(f.unix_mode().map(|m| m & 0o777), Some(0o755));
        assert_eq!(f.last_modified(), Some(DateTime::DEFAULT));
        let mut body = String::new();
        f.read_to_string(&mut body).expect("read");
        assert_eq!(body, "z = 1\n");
        drop(f);

        // A change to one file changes the sha256.
        write(&b.join("z.py"), "z = 2\n");
        let cb2 = load(&Context::new(Value::Null), b.to_str().expect("utf-8"))
            .await
            .expect("packed");
        assert_ne!(ca.sha256, cb2.sha256);
        let _ = fs::remove_dir_all(&a);
        let _ = fs::remove_dir_all(&b);
    }

    #[tokio::test]
    async fn zip_files_are_sent_as_they_are_and_other_files_refused() {
        let d = temp_dir("zip");
        write(&d.join("src/h.py"), "x = 1\n");
        let bytes = pack_dir(&d.join("src")).expect("packed");
        fs::write(d.join("code.zip"), &bytes).expect("write");
        let code = load(
            &Context::new(Value::Null),
            d.join("code.zip").to_str().expect("utf-8"),
        )
        .await
        .expect("loaded");
        assert_eq!(code.package, Package::Zip(bytes.clone()));
        assert_eq!(code.sha256, Some(sha256_base64(&bytes)));

        write(&d.join("fake.zip"), "not a zip");
        let e = load(
            &Context::new(Value::Null),
            d.join("fake.zip").to_str().expect("utf-8"),
        )
        .await
        .expect_err("not a zip");
        assert_eq!(e.class, ErrorClass::BadInput);
        assert!(e.message.contains("not a zip"), "{}", e.message);
        let e = load(
            &Context::new(Value::Null),
            d.join("src/h.py").to_str().expect("utf-8"),
        )
        .await
        .expect_err("not a package");
        assert!(
            e.message.contains("a .zip file or a directory"),
            "{}",
            e.message
        );
        let e = load(
            &Context::new(Value::Null),
            d.join("missing").to_str().expect("utf-8"),
        )
        .await
        .expect_err("missing");
        assert_eq!(e.class, ErrorClass::BadInput);
        let s3 = load(
            &Context::new(Value::Null),
            "s3://bucket/code/fn.zip?versionId=3",
        )
        .await
        .expect("s3");
        assert_eq!(s3.sha256, None);
        assert!(
            load(&Context::new(Value::Null), "s3://bucket")
                .await
                .is_err()
        );
        let _ = fs::remove_dir_all(&d);
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn a_link_back_up_is_refused_not_followed_forever() {
        let d = temp_dir("loop");
        write(&d.join("h.py"), "x = 1\n");
        std::os::unix::fs::symlink(&d, d.join("up")).expect("symlink");
        let e = load(&Context::new(Value::Null), d.to_str().expect("utf-8"))
            .await
            .expect_err("a loop");
        assert!(e.message.contains("links back"), "{}", e.message);
        let _ = fs::remove_dir_all(&d);
    }
}
