//! Data source `local/file`: regular files under the provider's `root` (or
//! the plugin's working directory), returned as candidates for the engine's
//! filter.
//!
//! Bounds: the base directory and its immediate subdirectories (two levels);
//! symlinks are skipped (they could lead outside the root); at most
//! [`MAX_ENTRIES`] directory entries are examined in all; `content` is read
//! only for UTF-8 files of at most [`MAX_CONTENT_BYTES`], and only while the
//! contents returned stay under [`MAX_TOTAL_CONTENT_BYTES`] in total.
//!
//! `json` is the content parsed as JSON when it is a JSON object (a mapping,
//! for filters such as `json has key name`); absent otherwise.

use std::path::{Path, PathBuf};

use trellis_plugin_sdk::prelude::*;

use crate::fsutil::blocking;
use crate::paths::Base;

pub const MAX_ENTRIES: usize = 10_000;
pub const MAX_CONTENT_BYTES: u64 = 1024 * 1024;
pub const MAX_TOTAL_CONTENT_BYTES: u64 = 32 * 1024 * 1024;

pub struct FileDataSource;

/// A candidate file.
struct Found {
    rel: String,
    name: String,
    abs: PathBuf,
    size: u64,
}

/// A conservative pre-filter with the engine's semantics, used only when the
/// data source has exactly one filter (so nothing that could match is lost).
struct Prefilter {
    field: String,
    operator: String,
    search: Value,
}

impl Prefilter {
    fn from(filters: &[Filter]) -> Option<Prefilter> {
        match filters {
            [f] => Some(Prefilter {
                field: f.field.clone(),
                operator: f.operator.clone(),
                search: f.search.revealed().clone(),
            }),
            _ => None,
        }
    }

    /// False only when the engine's filter certainly rejects the file.
    fn may_match(&self, f: &Found) -> bool {
        let text = match self.field.as_str() {
            "path" => f.rel.as_str(),
            "name" => f.name.as_str(),
            "size" => {
                return match (self.operator.as_str(), self.search.as_i64()) {
                    ("=", Some(n)) => i64::try_from(f.size).is_ok_and(|s| s == n),
                    _ => true,
                };
            }
            _ => return true,
        };
        let Some(search) = self.search.as_str() else {
            return true;
        };
        match self.operator.as_str() {
            "=" => text == search,
            "!=" => text != search,
            "starts with" => text.starts_with(search),
            "ends with" => text.ends_with(search),
            "contains" => text.contains(search),
            _ => true,
        }
    }
}

/// Lists a directory's entries, sorted by name, names that are not UTF-8
/// left out; `budget` counts entries examined.
fn entries(dir: &Path, budget: &mut usize) -> std::io::Result<Vec<(String, std::fs::FileType)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        if *budget == 0 {
            tracing::warn!("data source local/file: stopped after {MAX_ENTRIES} entries");
            break;
        }
        *budget -= 1;
        let entry = entry?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        out.push((name, entry.file_type()?));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

fn walk(base: &Path, cancelled: &dyn Fn() -> bool) -> Result<Vec<Found>> {
    let mut budget = MAX_ENTRIES;
    let mut found = Vec::new();
    let top = entries(base, &mut budget).context(format!("listing `{}`", base.display()))?;
    for (name, ty) in top {
        if cancelled() {
            return Err(PluginError::cancelled());
        }
        if ty.is_file() {
            found.push((name.clone(), name, base.to_path_buf()));
        } else if ty.is_dir() {
            let sub = base.join(&name);
            match entries(&sub, &mut budget) {
                Ok(list) => {
                    for (child, ty) in list {
                        if ty.is_file() {
                            found.push((format!("{name}/{child}"), child, sub.clone()));
                        }
                    }
                }
                Err(e) => tracing::debug!("skipping `{}`: {e}", sub.display()),
            }
        }
    }
    let mut out = Vec::with_capacity(found.len());
    for (rel, name, dir) in found {
        let abs = dir.join(&name);
        // A file removed since it was listed is simply not a candidate.
        let Ok(meta) = std::fs::symlink_metadata(&abs) else {
            continue;
        };
        out.push(Found {
            rel,
            name,
            abs,
            size: meta.len(),
        });
    }
    out.sort_by(|a, b| a.rel.cmp(&b.rel));
    Ok(out)
}

fn items(
    files: Vec<Found>,
    pre: Option<&Prefilter>,
    cancelled: &dyn Fn() -> bool,
) -> Result<Vec<Value>> {
    let mut budget = MAX_TOTAL_CONTENT_BYTES;
    let mut out = Vec::new();
    for f in files {
        if cancelled() {
            return Err(PluginError::cancelled());
        }
        if pre.is_some_and(|p| !p.may_match(&f)) {
            continue;
        }
        let mut item = Value::map()
            .with("path", f.rel.as_str())
            .with("name", f.name.as_str())
            .with("size", f.size)
            .with("absolutePath", f.abs.to_string_lossy().into_owned());
        if f.size <= MAX_CONTENT_BYTES
            && f.size <= budget
            && let Ok(bytes) = std::fs::read(&f.abs)
        {
            let len = bytes.len() as u64;
            if let (Ok(text), true) = (String::from_utf8(bytes), len <= budget) {
                budget -= len;
                if let Some(object) = json_object(&text) {
                    item.insert("json", object);
                }
                item.insert("content", text);
            }
        }
        out.push(item);
    }
    Ok(out)
}

/// The text parsed as JSON when it is a JSON object.
fn json_object(text: &str) -> Option<Value> {
    // Cheap test first: most files are not JSON objects.
    if !text.trim_start().starts_with('{') {
        return None;
    }
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(v @ serde_json::Value::Object(_)) => Some(Value::from_json(v)),
        _ => None,
    }
}

#[async_trait]
impl DataSource for FileDataSource {
    fn type_name(&self) -> &str {
        "local/file"
    }

    fn description(&self) -> &str {
        "Regular files in the provider's root (or the plugin's working directory) and its immediate subdirectories."
    }

    fn filter_fields(&self) -> Schema {
        Schema::object()
            .field(
                "path",
                Field::string()
                    .describe("Path relative to the root, with `/` separators: `conf/app.env`"),
            )
            .field("name", Field::string().describe("File name: `app.env`"))
            .field("size", Field::integer().describe("Size in bytes"))
            .field(
                "json",
                Field::map(Schema::any()).describe("The content parsed as JSON when it is a JSON object (filter with `has key` / `not has key`); absent for other files and whenever `content` is"),
            )
    }

    fn exports(&self) -> Schema {
        Schema::object()
            .field("path", Field::string().describe("Path relative to the root, with `/` separators"))
            .field("name", Field::string().describe("File name"))
            .field(
                "content",
                Field::string().describe("The file's text; absent for files over 1 MiB, files that are not UTF-8, or beyond 32 MiB of content in one fetch"),
            )
            .field("size", Field::integer().describe("Size in bytes"))
            .field("absolutePath", Field::string().describe("The file's absolute path"))
    }

    async fn fetch(&self, ctx: &Context, filters: &[Filter]) -> Result<Vec<Value>> {
        let base = Base::from_ctx(ctx)?;
        let dir = base.base_dir().to_path_buf();
        let pre = Prefilter::from(filters);
        let token = ctx.cancellation_token();
        blocking(move || {
            let cancelled = || token.is_cancelled();
            let files = walk(&dir, &cancelled)?;
            items(files, pre.as_ref(), &cancelled)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_objects_only() {
        assert_eq!(
            json_object(r#" {"a": {"b": [1]}}"#),
            Some(Value::map().with("a", Value::map().with("b", vec![1])))
        );
        assert_eq!(json_object("{}"), Some(Value::map()));
        assert_eq!(json_object("[1]"), None);
        assert_eq!(json_object("\"{}\""), None);
        assert_eq!(json_object("{oops"), None);
        assert_eq!(json_object("plain"), None);
    }
}
