//! `local/envFile`: a dotenv file whose entries come from links (and from
//! the resource's own `values`).
//!
//! The file is the source of truth for its entries: every change (the
//! resource's own apply, or a link adding or removing a line) reads the
//! file, changes it, and writes it back atomically (mode 0600, it may hold
//! secrets), under an exclusive lock on its directory so that concurrent
//! link calls do not lose each other's lines. Read reports every entry in
//! the file in `values`; the entry a link writes is a field that link owns
//! (`values.<VARIABLE>`, declared by its StageLink), so only lines nobody
//! owns are drift. Layout:
//!
//! ```text
//! # Managed by Trellis (local/envFile): lines come from links; edits are overwritten.
//! # <header, one comment line per line>
//! DIR_DATA='/srv/app/data'
//! SECRET_DB_PASSWORD='Zq3...'
//! ```
//!
//! Entries are sorted by variable name. A value is written in single quotes
//! (taken literally by shells and dotenv parsers) unless it contains a
//! single quote or a line break; then it is written in double quotes with
//! `\\`, `\"`, `\$`, `` \` ``, `\n` and `\r` escaped.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use trellis_plugin_sdk::prelude::*;

use crate::existing_path;
use crate::fsutil::{DirLock, blocking, sync_dir, write_atomic};
use crate::paths::{Base, path_str};

/// The first line of every env file this provider writes.
pub const MARKER: &str =
    "# Managed by Trellis (local/envFile): lines come from links; edits are overwritten.";
/// Env files hold secrets: owner only.
const ENV_FILE_MODE: u32 = 0o600;

pub struct EnvFile;

/// The content of an env file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EnvDoc {
    pub header: Option<String>,
    pub entries: BTreeMap<String, String>,
}

/// An env file that exists but was not written by this provider.
#[derive(Debug)]
pub struct NotManaged;

impl EnvDoc {
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str(MARKER);
        out.push('\n');
        out.push_str(&render_header(self.header.as_deref()));
        for (k, v) in &self.entries {
            out.push_str(k);
            out.push('=');
            out.push_str(&quote(v));
            out.push('\n');
        }
        out
    }

    /// Parses a file this provider wrote; lines that are not `NAME=value`
    /// entries or comments are dropped (with a warning: the file is managed).
    pub fn parse(text: &str) -> std::result::Result<EnvDoc, NotManaged> {
        let mut lines = text.lines();
        if lines.next().map(str::trim_end) != Some(MARKER) {
            return Err(NotManaged);
        }
        let mut header: Vec<&str> = Vec::new();
        let mut in_header = true;
        let mut entries = BTreeMap::new();
        let mut dropped = 0usize;
        for line in lines {
            if let Some(comment) = line.strip_prefix('#') {
                if in_header {
                    header.push(comment.strip_prefix(' ').unwrap_or(comment));
                }
                continue;
            }
            in_header = false;
            if line.trim().is_empty() {
                continue;
            }
            match parse_entry(line) {
                Some((k, v)) => {
                    entries.insert(k, v);
                }
                None => dropped += 1,
            }
        }
        if dropped > 0 {
            tracing::warn!("{dropped} line(s) of an env file were not entries and are dropped");
        }
        Ok(EnvDoc {
            header: (!header.is_empty()).then(|| header.join("\n")),
            entries,
        })
    }
}

fn render_header(header: Option<&str>) -> String {
    let mut out = String::new();
    for line in header.unwrap_or("").lines() {
        let line = line.trim_end_matches('\r');
        if line.is_empty() {
            out.push_str("#\n");
        } else {
            out.push_str("# ");
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Whether two headers render to the same comment lines.
fn same_header(a: Option<&str>, b: Option<&str>) -> bool {
    render_header(a) == render_header(b)
}

/// A variable name: `[A-Za-z_][A-Za-z0-9_]*`.
pub fn is_var_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Quotes a value (see the module documentation).
pub fn quote(v: &str) -> String {
    if !v.contains(['\'', '\n', '\r']) {
        return format!("'{v}'");
    }
    let mut out = String::with_capacity(v.len() + 2);
    out.push('"');
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '$' => out.push_str("\\$"),
            '`' => out.push_str("\\`"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn parse_entry(line: &str) -> Option<(String, String)> {
    let line = line.trim_start();
    let line = line.strip_prefix("export ").unwrap_or(line);
    let (key, raw) = line.split_once('=')?;
    let key = key.trim();
    if !is_var_name(key) {
        return None;
    }
    let raw = raw.trim_end();
    let value = if let Some(rest) = raw.strip_prefix('\'') {
        let (v, after) = rest.split_once('\'')?;
        if !after.trim().is_empty() {
            return None;
        }
        v.to_owned()
    } else if let Some(rest) = raw.strip_prefix('"') {
        let mut v = String::new();
        let mut chars = rest.chars();
        let mut closed = false;
        while let Some(c) = chars.next() {
            match c {
                '"' => {
                    closed = true;
                    break;
                }
                '\\' => match chars.next()? {
                    'n' => v.push('\n'),
                    'r' => v.push('\r'),
                    c @ ('\\' | '"' | '$' | '`') => v.push(c),
                    c => {
                        v.push('\\');
                        v.push(c);
                    }
                },
                c => v.push(c),
            }
        }
        if !closed || !chars.as_str().trim().is_empty() {
            return None;
        }
        v
    } else {
        raw.trim().to_owned()
    };
    Some((key.to_owned(), value))
}

/// Reads the env file at `path`: None when it does not exist.
fn load(path: &Path) -> Result<Option<EnvDoc>> {
    match std::fs::read_to_string(path) {
        Ok(text) => EnvDoc::parse(&text).map(Some).map_err(|NotManaged| {
            PluginError::conflict(format!(
                "`{}` exists but was not written by trellis (its first line is not the local/envFile marker); it is not changed",
                path.display()
            ))
            .at("path")
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::InvalidData => Err(PluginError::conflict(format!(
            "`{}` exists but is not a text file trellis wrote; it is not changed",
            path.display()
        ))
        .at("path")),
        Err(e) => Err(PluginError::from(e).context(format!("reading `{}`", path.display()))),
    }
}

fn store(path: &Path, doc: &EnvDoc, before: Option<&EnvDoc>) -> Result<()> {
    if before == Some(doc) {
        return Ok(());
    }
    write_atomic(path, doc.render().as_bytes(), ENV_FILE_MODE)
        .context(format!("writing `{}`", path.display()))
}

fn lock_parent(path: &Path, cancelled: &dyn Fn() -> bool) -> Result<DirLock> {
    let parent = path
        .parent()
        .ok_or_else(|| PluginError::bad_input("the env file path has no directory").at("path"))?;
    if !parent.is_dir() {
        return Err(PluginError::not_found(format!(
            "the directory `{}` of the env file does not exist",
            parent.display()
        ))
        .at("path"));
    }
    DirLock::acquire(parent, cancelled)
}

/// One change to an env file, made under the directory lock.
pub enum Change {
    /// The resource's own apply: set the header and the static `values`,
    /// remove the static variables in `dropped` (set by the previous spec,
    /// not by this one); other entries (the links' lines) are kept.
    Own {
        header: Option<String>,
        values: BTreeMap<String, String>,
        dropped: Vec<String>,
    },
    /// Set `var` (removing `replaces` if it is another name); the header is
    /// used only when the file has to be created.
    Set {
        var: String,
        value: String,
        replaces: Option<String>,
        header: Option<String>,
    },
    /// Remove these variables; a missing file is left missing.
    Remove(Vec<String>),
}

/// Applies `change` to the env file at `path` (blocking).
pub fn change(path: &Path, change: Change, cancelled: &dyn Fn() -> bool) -> Result<()> {
    let _lock = lock_parent(path, cancelled)?;
    if std::fs::symlink_metadata(path).is_ok_and(|m| !m.is_file()) {
        return Err(PluginError::conflict(format!(
            "`{}` exists and is not a regular file",
            path.display()
        ))
        .at("path"));
    }
    let before = load(path)?;
    let mut doc = before.clone().unwrap_or_default();
    match change {
        Change::Own {
            header,
            values,
            dropped,
        } => {
            doc.header = header;
            for v in dropped {
                doc.entries.remove(&v);
            }
            doc.entries.extend(values);
        }
        Change::Set {
            var,
            value,
            replaces,
            header,
        } => {
            if before.is_none() {
                doc.header = header;
            }
            if let Some(old) = replaces.filter(|old| *old != var) {
                doc.entries.remove(&old);
            }
            doc.entries.insert(var, value);
        }
        Change::Remove(vars) => {
            if before.is_none() {
                return Ok(());
            }
            for v in vars {
                doc.entries.remove(&v);
            }
        }
    }
    store(path, &doc, before.as_ref())
}

fn header_of(spec: &Spec<'_>) -> Result<Option<String>> {
    Ok(spec.opt_str("header")?.map(str::to_owned))
}

/// The spec's static entries (`values`), with their names checked.
fn values_of(spec: &Spec<'_>) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let Some(map) = spec.opt_map("values")? else {
        return Ok(out);
    };
    for (k, v) in map {
        let at = spec.path_of("values").join(k);
        if !is_var_name(k) {
            return Err(PluginError::bad_input(format!(
                "`{k}` is not a variable name (letters, digits and `_`, not starting with a digit)"
            ))
            .at(at));
        }
        let text = v.as_str().ok_or_else(|| {
            PluginError::bad_input(format!("`{at}` must be a string, found {}", v.kind_name()))
                .at(at.clone())
        })?;
        out.insert(k.clone(), text.to_owned());
    }
    Ok(out)
}

/// The names in a spec's `values` (unchecked: a recorded spec).
fn value_names(spec: &Value) -> Vec<String> {
    spec.get("values")
        .and_then(Value::as_map)
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

/// The path of an env file resource, from its recorded state or spec.
pub fn env_file_path(base: &Base, resource: &ResourceState) -> Result<PathBuf> {
    existing_path(base, resource)
}

/// Writes the header and the static `values`; `previous` is the spec last
/// applied (an update), whose static variables that `spec` no longer sets
/// are removed.
async fn apply(ctx: &Context, spec: &Spec<'_>, previous: Option<&Value>) -> Result<Applied> {
    let base = Base::from_ctx(ctx)?;
    let path = base.resolve_attr(spec.get_str("path")?, "path")?;
    let header = header_of(spec)?;
    let values = values_of(spec)?;
    let dropped = previous
        .map(value_names)
        .unwrap_or_default()
        .into_iter()
        .filter(|k| !values.contains_key(k))
        .collect();
    let own = Change::Own {
        header,
        values,
        dropped,
    };
    let id = path_str(&path)?.to_owned();
    let token = ctx.cancellation_token();
    blocking(move || change(&path, own, &|| token.is_cancelled())).await?;
    Ok(Applied::new(id.clone(), Value::map().with("id", id)))
}

#[async_trait]
impl Resource for EnvFile {
    fn type_name(&self) -> &str {
        "local/envFile"
    }

    fn description(&self) -> &str {
        "A dotenv file (mode 0600) whose lines come from links to local/file, local/directory and local/randomSecret resources, and from its own `values`."
    }

    fn schema(&self) -> Schema {
        Schema::object()
            .describe("A dotenv file filled by links")
            .field(
                "path",
                Field::string()
                    .required()
                    .must_recreate()
                    .describe("The env file: absolute, or relative to the provider's `root` (or the plugin's working directory); its directory must exist"),
            )
            .field("header", Field::string().describe("A comment written at the top of the file"))
            .field(
                "values",
                Field::map(Schema::string()).describe(
                    "Static entries the resource itself writes, NAME -> value (NAME: letters, digits and `_`, not starting with a digit); links add their own lines. Read reports every entry of the file here: a line added or edited by hand is drift, except the line a link writes, which that link owns (`values.<VARIABLE>`)",
                ),
            )
            .field("id", Field::string().computed().describe("The absolute path of the env file"))
    }

    async fn validate(&self, ctx: &Context, req: &ValidateRequest) -> Result<Vec<Diagnostic>> {
        let spec = req.spec();
        let mut out = Vec::new();
        if let Ok(base) = Base::from_ctx(ctx)
            && let Some(p) = spec.get("path").and_then(Value::as_str)
        {
            out.extend(base.diagnose(p, "path"));
        }
        if let Some(map) = spec.get("values").and_then(Value::as_map) {
            for k in map.keys().filter(|k| !is_var_name(k)) {
                out.push(
                    Diagnostic::error(
                        "local.envfile-variable-invalid",
                        format!("`{k}` is not a variable name"),
                    )
                    .at(AttrPath::root().field("values").field(k.as_str()))
                    .hint("use letters, digits and `_`, not starting with a digit"),
                );
            }
        }
        Ok(out)
    }

    /// Writes the file with the static `values` (links add their lines).
    /// An env file this provider wrote before (a retried create) keeps its
    /// entries; any other file at the path is a CONFLICT.
    async fn create(&self, ctx: &Context, req: &CreateRequest) -> Result<Applied> {
        ctx.check_cancelled()?;
        apply(ctx, &req.spec(), None).await
    }

    /// Rewrites the header and the static `values` (removing the ones the
    /// new spec no longer sets), keeping the links' entries (a file deleted
    /// by hand is written again, without the link lines it had).
    async fn update(&self, ctx: &Context, req: &UpdateRequest) -> Result<Applied> {
        ctx.check_cancelled()?;
        apply(ctx, &req.spec(), Some(&req.current.spec)).await
    }

    /// Deletes the file if it is one this provider wrote.
    async fn destroy(&self, ctx: &Context, current: &ResourceState) -> Result<()> {
        ctx.check_cancelled()?;
        let base = Base::from_ctx(ctx)?;
        let path = env_file_path(&base, current)?;
        let token = ctx.cancellation_token();
        blocking(move || {
            let Some(parent) = path.parent().filter(|p| p.is_dir()) else {
                return Ok(());
            };
            let _lock = DirLock::acquire(parent, &|| token.is_cancelled())?;
            if load(&path)?.is_none() {
                return Ok(());
            }
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(
                        PluginError::from(e).context(format!("deleting `{}`", path.display()))
                    );
                }
            }
            sync_dir(parent);
            Ok(())
        })
        .await
    }

    fn supports_read(&self) -> bool {
        true
    }

    /// Gone when the file is missing or no longer one this provider wrote;
    /// otherwise the header and every entry (`values`) as they are now.
    async fn read(&self, ctx: &Context, current: &ResourceState) -> Result<Option<ReadState>> {
        let base = Base::from_ctx(ctx)?;
        let path = env_file_path(&base, current)?;
        let p = path.clone();
        let doc = blocking(move || match load(&p) {
            Ok(d) => Ok(d),
            Err(e) if e.class == ErrorClass::Conflict => Ok(None),
            Err(e) => Err(e),
        })
        .await?;
        let Some(doc) = doc else {
            return Ok(None);
        };
        let mut spec = current.spec.clone();
        let applied = header_of(&current.spec())?;
        if !same_header(applied.as_deref(), doc.header.as_deref()) {
            spec.insert("header", doc.header.map_or(Value::Null, Value::from));
        }
        spec.insert("values", observed_values(&current.spec, doc.entries));
        Ok(Some(ReadState {
            spec,
            state: Value::map().with("id", path_str(&path)?),
            external_id: Some(path_str(&path)?.to_owned()),
        }))
    }
}

/// The file's entries as `values`. An entry is reported sensitive unless it
/// is one of the spec's own values that is not: the others (a link's line, a
/// line added by hand) may hold a secret, and drift reports never show one.
fn observed_values(spec: &Value, entries: BTreeMap<String, String>) -> Value {
    let own = spec.get("values").and_then(Value::as_map);
    Value::Map(
        entries
            .into_iter()
            .map(|(k, v)| {
                let plain = own
                    .and_then(|m| m.get(&k))
                    .is_some_and(|x| !x.is_sensitive());
                let v = if plain {
                    Value::from(v)
                } else {
                    Value::sensitive(v)
                };
                (k, v)
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_round_trips() {
        for v in [
            "plain",
            "",
            "with space",
            "it's",
            "a\nb",
            "$HOME `x` \"q\" \\",
            "tab\there",
            "r\r\n'",
        ] {
            let line = format!("K={}", quote(v));
            assert_eq!(
                parse_entry(&line),
                Some(("K".to_owned(), v.to_owned())),
                "{line}"
            );
            assert!(!line.contains('\n'));
        }
        assert_eq!(quote("abc"), "'abc'");
        assert_eq!(quote("it's $x"), "\"it's \\$x\"");
    }

    #[test]
    fn documents_round_trip_sorted() {
        let mut doc = EnvDoc {
            header: Some("line one\n\nline three".to_owned()),
            ..EnvDoc::default()
        };
        doc.entries.insert("Z_LAST".into(), "z".into());
        doc.entries.insert("A_FIRST".into(), "it's".into());
        let text = doc.render();
        assert!(text.starts_with(MARKER));
        let a = text.find("A_FIRST").unwrap_or(usize::MAX);
        let z = text.find("Z_LAST").unwrap_or(0);
        assert!(a < z);
        let back = EnvDoc::parse(&text).expect("managed");
        assert_eq!(back, doc);
        assert!(EnvDoc::parse("FOO=bar\n").is_err());
    }

    #[test]
    fn observed_values_hide_what_the_spec_does_not_set_in_clear() {
        let spec = Value::map().with(
            "values",
            Value::map()
                .with("PORT", "8080")
                .with("TOKEN", Value::sensitive("t")),
        );
        let entries: BTreeMap<String, String> =
            [("PORT", "9090"), ("TOKEN", "t"), ("FILE_X", "/x")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
        let v = observed_values(&spec, entries);
        assert_eq!(v.get("PORT"), Some(&Value::from("9090")));
        assert!(v.get("TOKEN").is_some_and(Value::is_sensitive));
        assert!(v.get("FILE_X").is_some_and(Value::is_sensitive));
        assert_eq!(observed_values(&Value::Null, BTreeMap::new()), Value::map());
    }

    #[test]
    fn var_names() {
        assert!(is_var_name("FILE_A1"));
        assert!(is_var_name("_X"));
        assert!(!is_var_name("1X"));
        assert!(!is_var_name("A-B"));
        assert!(!is_var_name(""));
    }
}
