//! Environment files (`--env FILE`) and variable files (`--var-file FILE`), read by the CLI on
//! the caller's machine and sent to the engine as structured fields.
//!
//! An environment file (YAML, or JSON by extension) holds:
//!
//! ```yaml
//! name: dev                 # optional; default: the file stem
//! variables:                # name -> scalar, or a secret reference
//!   region: eu-west-1
//!   dbPassword: { fromEnv: DB_PASSWORD }
//!   apiKey: { fromFile: secrets/api-key }
//! providers:                # provider namespace -> configuration (references at any depth)
//!   local:
//!     token: { fromEnv: LOCAL_TOKEN }
//! injectors:                # resource type -> defaults for spec fields (literal, no secrets)
//!   local/file:
//!     mode: "0600"
//! ```
//!
//! A reference is a mapping with exactly one key, `fromEnv` (the CLI's own environment) or
//! `fromFile` (relative to the environment file's directory, one trailing line break trimmed).
//! What a reference resolves to is a secret: variables are flagged `secret`, provider
//! configuration gets the engine's `{"$sensitive": value}` wrapper. Secret values never appear
//! in error messages or in `Debug` output. Values are literal: a `${` in provider configuration
//! or injectors is refused rather than left for someone to expect it to be substituted.
//!
//! Errors are one line each, `FILE:LINE:COL: message`; every problem found is reported, one
//! per line.

use std::fmt;
use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use serde_json::{Map, Value as Json};
use trellis_engine::state_values::mark_secret;
use trellis_lang::diag::{Diagnostics, codes, did_you_mean};
use trellis_lang::document::{Format, Key, Node, NodeKind, load_bytes, parse};
use trellis_lang::source::{SourceMap, Span};

/// The largest environment file, variable file or `fromFile` secret read.
pub const MAX_FILE_BYTES: usize = 1024 * 1024;

/// The keys an environment file may have at the top level.
const SECTIONS: [&str; 4] = ["name", "variables", "providers", "injectors"];
const FROM_ENV: &str = "fromEnv";
const FROM_FILE: &str = "fromFile";
/// How a secret is shown in `Debug` output.
/// How a secret value shows in Debug output: as everywhere else, `(sensitive)`.
const SECRET_SHOWN: &str = "(sensitive)";

/// One variable from an environment file: its text as `--var NAME=VALUE` would take it.
#[derive(Clone, Default, PartialEq)]
pub struct EnvVariable {
    pub name: String,
    pub value: String,
    /// Resolved from `fromEnv` or `fromFile`.
    pub secret: bool,
}

impl fmt::Debug for EnvVariable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("EnvVariable");
        d.field("name", &self.name);
        if self.secret {
            d.field("value", &format_args!("{SECRET_SHOWN}"));
        } else {
            d.field("value", &self.value);
        }
        d.field("secret", &self.secret).finish()
    }
}

/// An environment file, resolved.
#[derive(Clone, Default, PartialEq)]
pub struct EnvironmentFile {
    pub name: String,
    /// "sha256:<hex>" of the file's bytes as read (the file holds references, not secret
    /// values).
    pub digest: String,
    /// In file order.
    pub variables: Vec<EnvVariable>,
    /// Provider namespace -> configuration merged over the engine's; resolved references are
    /// wrapped as `{"$sensitive": value}`.
    pub providers: IndexMap<String, Map<String, Json>>,
    /// Resource type -> defaults for its spec fields (always a JSON object).
    pub injectors: IndexMap<String, Json>,
}

impl fmt::Debug for EnvironmentFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Masked<'a>(&'a Json);
        impl fmt::Debug for Masked<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", crate::engine::state_values::masked(self.0))
            }
        }
        struct Providers<'a>(&'a IndexMap<String, Map<String, Json>>);
        impl fmt::Debug for Providers<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let mut m = f.debug_map();
                for (ns, config) in self.0 {
                    // A clone, only for display: the masked copy holds no secret.
                    m.entry(ns, &Masked(&Json::Object(config.clone())));
                }
                m.finish()
            }
        }
        struct Injectors<'a>(&'a IndexMap<String, Json>);
        impl fmt::Debug for Injectors<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let mut m = f.debug_map();
                for (ty, defaults) in self.0 {
                    m.entry(ty, &Masked(defaults));
                }
                m.finish()
            }
        }
        f.debug_struct("EnvironmentFile")
            .field("name", &self.name)
            .field("digest", &self.digest)
            .field("variables", &self.variables)
            .field("providers", &Providers(&self.providers))
            .field("injectors", &Injectors(&self.injectors))
            .finish()
    }
}

/// Reads and resolves an environment file, with `fromEnv` read from this process's
/// environment.
pub fn load_environment(path: &Path) -> Result<EnvironmentFile, String> {
    load_environment_with(path, &|name| std::env::var(name).ok())
}

/// [`load_environment`] with the environment lookup injected.
pub fn load_environment_with(
    path: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<EnvironmentFile, String> {
    let bytes = read_file(path)?;
    let digest = format!("sha256:{}", trellis_ids::sha256_hex(&bytes));
    let (sources, root) = parse_file(path, bytes)?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut cx = Reader {
        sources: &sources,
        dir,
        env,
        errors: Vec::new(),
    };
    let mut out = EnvironmentFile {
        name: path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default(),
        digest,
        ..EnvironmentFile::default()
    };
    match &root.kind {
        // A file of only comments: nothing set, the defaults stand.
        NodeKind::Null => {}
        NodeKind::Map(entries) => {
            for (key, value) in entries {
                match key.name.as_str() {
                    "name" => {
                        if let Some(name) = cx.env_name(value) {
                            out.name = name;
                        }
                    }
                    "variables" => out.variables = cx.variables(value),
                    "providers" => out.providers = cx.providers(value),
                    "injectors" => out.injectors = cx.injectors(value),
                    other => {
                        let mut msg = format!(
                            "unknown key `{other}` in an environment file (allowed: {})",
                            SECTIONS.join(", ")
                        );
                        if let Some(s) = did_you_mean(other, SECTIONS) {
                            msg.push_str(&format!("; did you mean `{s}`?"));
                        }
                        cx.error(key.span, msg);
                    }
                }
            }
        }
        _ => cx.error(
            root.span,
            format!(
                "an environment file must be a mapping ({}), not {}",
                SECTIONS.join(", "),
                article(&root)
            ),
        ),
    }
    if out.name.is_empty() {
        cx.errors.push(format!(
            "{}: the environment has no name; add `name:` to the file",
            path.display()
        ));
    }
    cx.finish()?;
    Ok(out)
}

/// Reads a `--var-file`: a mapping of variable name -> scalar (string, number or boolean), as
/// `--var NAME=VALUE` pairs in file order. References are not allowed here.
pub fn load_var_file(path: &Path) -> Result<Vec<(String, String)>, String> {
    let bytes = read_file(path)?;
    let (sources, root) = parse_file(path, bytes)?;
    let no_env = |_: &str| None;
    let mut cx = Reader {
        sources: &sources,
        dir: PathBuf::new(),
        env: &no_env,
        errors: Vec::new(),
    };
    let mut out = Vec::new();
    match &root.kind {
        NodeKind::Null => {}
        NodeKind::Map(entries) => {
            for (key, value) in entries {
                if key.name.is_empty() {
                    cx.error(key.span, "a variable name must not be empty");
                    continue;
                }
                let what = format!("variable `{}`", key.name);
                match &value.kind {
                    NodeKind::Map(m)
                        if m.iter()
                            .any(|(k, _)| k.name == FROM_ENV || k.name == FROM_FILE) =>
                    {
                        cx.error(
                            value.span,
                            format!(
                                "{what}: `{FROM_ENV}`/`{FROM_FILE}` references are not allowed in a \
                                 variable file; put them in an environment file (--env)"
                            ),
                        );
                    }
                    _ => {
                        if let Some(text) = cx.scalar_text(value, &what) {
                            out.push((key.name.clone(), text));
                        }
                    }
                }
            }
        }
        _ => cx.error(
            root.span,
            format!(
                "a variable file must be a mapping of variable names to values, not {}",
                article(&root)
            ),
        ),
    }
    cx.finish()?;
    Ok(out)
}

/// The bytes of a file, refused when larger than [`MAX_FILE_BYTES`] or a directory.
fn read_file(path: &Path) -> Result<Vec<u8>, String> {
    read_limited(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

pub(crate) fn read_limited(path: &Path) -> Result<Vec<u8>, String> {
    let buf = crate::cli::read_limited(path, MAX_FILE_BYTES).map_err(|e| e.to_string())?;
    if buf.len() > MAX_FILE_BYTES {
        return Err(format!(
            "the file is larger than the limit of {MAX_FILE_BYTES} bytes (1 MiB)"
        ));
    }
    Ok(buf)
}

/// Parses a YAML or JSON file (by extension) into a node tree; a file of only whitespace is
/// an empty (null) document.
pub(crate) fn parse_file(path: &Path, bytes: Vec<u8>) -> Result<(SourceMap, Node), String> {
    let name = path.display().to_string();
    let mut sources = SourceMap::new();
    let mut diags = Diagnostics::default();
    let Some(file) = load_bytes(&mut sources, &name, bytes, MAX_FILE_BYTES, &mut diags) else {
        return Err(render_diags(&sources, &diags));
    };
    if sources.get(file).text.trim().is_empty() {
        return Ok((
            sources,
            Node {
                kind: NodeKind::Null,
                span: Span::new(file, 0, 0),
            },
        ));
    }
    let root = parse(&sources, file, Format::from_path(&name), &mut diags);
    match root {
        Some(root) if !diags.has_errors() => Ok((sources, root)),
        // Only comments: an empty document, not a mistake.
        None if diags.items.len() == 1 && diags.items[0].code.id == codes::EMPTY_DOCUMENT.id => {
            Ok((
                sources,
                Node {
                    kind: NodeKind::Null,
                    span: Span::new(file, 0, 0),
                },
            ))
        }
        _ => Err(render_diags(&sources, &diags)),
    }
}

/// The errors among lang diagnostics, one `FILE:LINE:COL: message` line each.
fn render_diags(sources: &SourceMap, diags: &Diagnostics) -> String {
    let lines: Vec<String> = diags
        .items
        .iter()
        .filter(|d| d.is_error())
        .map(|d| {
            let mut line = located(sources, d.span, &d.message);
            if let Some(hint) = &d.hint {
                line.push_str(&format!(" ({hint})"));
            }
            line
        })
        .collect();
    if lines.is_empty() {
        "the file could not be read".to_owned()
    } else {
        lines.join("\n")
    }
}

fn located(sources: &SourceMap, span: Span, message: &str) -> String {
    let (start, _) = sources.resolve(span);
    format!(
        "{}:{}:{}: {message}",
        sources.get(span.file).name,
        start.line,
        start.column
    )
}

/// "a mapping", "an array", .. for messages (never the value itself).
fn article(n: &Node) -> &'static str {
    match n.kind {
        NodeKind::Null => "null",
        NodeKind::Bool(_) => "a boolean",
        NodeKind::Int(_) => "an integer",
        NodeKind::Float(_) => "a float",
        NodeKind::Str(..) => "a string",
        NodeKind::List(_) => "an array",
        NodeKind::Map(_) => "a mapping",
    }
}

/// A secret reference found in the file.
enum Reference<'n> {
    Env(&'n str),
    File(&'n str),
}

/// Walks a parsed file, collecting every problem.
struct Reader<'a> {
    sources: &'a SourceMap,
    /// The environment file's directory, for `fromFile`.
    dir: PathBuf,
    env: &'a dyn Fn(&str) -> Option<String>,
    errors: Vec<String>,
}

impl Reader<'_> {
    fn error(&mut self, span: Span, message: impl AsRef<str>) {
        let line = located(self.sources, span, message.as_ref());
        self.errors.push(line);
    }

    fn finish(self) -> Result<(), String> {
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(self.errors.join("\n"))
        }
    }

    fn env_name(&mut self, n: &Node) -> Option<String> {
        match n.as_str() {
            Some(s) if !s.trim().is_empty() && !s.chars().any(char::is_control) => {
                Some(s.to_owned())
            }
            Some(_) => {
                self.error(
                    n.span,
                    "`name` must be a non-empty string without control characters",
                );
                None
            }
            None => {
                self.error(
                    n.span,
                    format!("`name` must be a string, not {}", article(n)),
                );
                None
            }
        }
    }

    /// The entries of an optional section: nothing (`variables:` alone, or null) is empty,
    /// anything but a mapping an error.
    fn section<'n>(&mut self, n: &'n Node, what: &str, expect: &str) -> &'n [(Key, Node)] {
        match &n.kind {
            NodeKind::Null => &[],
            NodeKind::Str(s, _) if s.is_empty() => &[],
            NodeKind::Map(entries) => entries,
            _ => {
                self.error(
                    n.span,
                    format!("`{what}` must be a mapping of {expect}, not {}", article(n)),
                );
                &[]
            }
        }
    }

    fn variables(&mut self, n: &Node) -> Vec<EnvVariable> {
        let mut out = Vec::new();
        for (key, value) in self.section(n, "variables", "variable names to values") {
            if key.name.is_empty() {
                self.error(key.span, "a variable name must not be empty");
                continue;
            }
            let what = format!("`variables.{}`", key.name);
            let resolved = match self.reference(value, &what) {
                Some(Ok(r)) => self.resolve(&r, value.span, &what).map(|v| (v, true)),
                Some(Err(())) => None,
                None => self.scalar_text(value, &what).map(|v| (v, false)),
            };
            if let Some((value, secret)) = resolved {
                out.push(EnvVariable {
                    name: key.name.clone(),
                    value,
                    secret,
                });
            }
        }
        out
    }

    fn providers(&mut self, n: &Node) -> IndexMap<String, Map<String, Json>> {
        let mut out = IndexMap::new();
        for (key, value) in self.section(n, "providers", "provider namespaces to configuration") {
            let what = format!("`providers.{}`", key.name);
            self.literal_key(key.span, &key.name, &what);
            let Some(fields) = self.fields(value, &what, "provider configuration") else {
                continue;
            };
            if let Some(config) = self.json_fields(fields, &format!("providers.{}", key.name), true)
            {
                out.insert(key.name.clone(), config);
            }
        }
        out
    }

    fn injectors(&mut self, n: &Node) -> IndexMap<String, Json> {
        let mut out = IndexMap::new();
        for (key, value) in self.section(n, "injectors", "resource types to spec defaults") {
            let what = format!("`injectors.{}`", key.name);
            self.literal_key(key.span, &key.name, &what);
            let Some(fields) = self.fields(value, &what, "spec fields to default values") else {
                continue;
            };
            if let Some(defaults) =
                self.json_fields(fields, &format!("injectors.{}", key.name), false)
            {
                out.insert(key.name.clone(), Json::Object(defaults));
            }
        }
        out
    }

    /// Whether a mapping is a secret reference: `None` when it has neither `fromEnv` nor
    /// `fromFile`, `Some(Err)` (reported) when it has one but is not a well-formed reference.
    fn reference<'n>(&mut self, n: &'n Node, what: &str) -> Option<Result<Reference<'n>, ()>> {
        let entries = n.as_map()?;
        let (key, value) = entries
            .iter()
            .find(|(k, _)| k.name == FROM_ENV || k.name == FROM_FILE)?;
        if entries.len() != 1 {
            let others: Vec<String> = entries
                .iter()
                .filter(|(k, _)| k.name != key.name)
                .map(|(k, _)| format!("`{}`", k.name))
                .collect();
            self.error(
                n.span,
                format!(
                    "{what}: a `{FROM_ENV}` or `{FROM_FILE}` reference must be the only key of \
                     its mapping (found also {})",
                    others.join(", ")
                ),
            );
            return Some(Err(()));
        }
        let Some(target) = value.as_str() else {
            self.error(
                value.span,
                format!(
                    "{what}: `{}` must be a string, not {}",
                    key.name,
                    article(value)
                ),
            );
            return Some(Err(()));
        };
        if key.name == FROM_ENV {
            if target.is_empty() || target.contains(['=', '\0']) {
                self.error(
                    value.span,
                    format!(
                        "{what}: `{FROM_ENV}` must name an environment variable (not empty, \
                         without `=` or NUL)"
                    ),
                );
                return Some(Err(()));
            }
            Some(Ok(Reference::Env(target)))
        } else {
            if target.is_empty() || target.contains('\0') {
                self.error(
                    value.span,
                    format!("{what}: `{FROM_FILE}` must be a file path (not empty)"),
                );
                return Some(Err(()));
            }
            Some(Ok(Reference::File(target)))
        }
    }

    /// The secret a reference names. Errors name the reference, never a value.
    fn resolve(&mut self, r: &Reference<'_>, span: Span, what: &str) -> Option<String> {
        match *r {
            Reference::Env(name) => match (self.env)(name) {
                Some(v) => Some(v),
                None => {
                    self.error(
                        span,
                        format!("{what}: the environment variable `{name}` is not set"),
                    );
                    None
                }
            },
            Reference::File(rel) => {
                let path = self.dir.join(rel);
                let text = read_limited(&path).and_then(|bytes| {
                    String::from_utf8(bytes).map_err(|_| "the file is not valid UTF-8".to_owned())
                });
                match text {
                    Ok(text) => Some(crate::engine::settings::secret_file_text(text)),
                    Err(e) => {
                        self.error(
                            span,
                            format!(
                                "{what}: cannot read `{FROM_FILE}: {rel}` ({}): {e}",
                                path.display()
                            ),
                        );
                        None
                    }
                }
            }
        }
    }

    /// A scalar as `--var NAME=VALUE` would take it: strings as they are, booleans as
    /// `true`/`false`, numbers as written.
    fn scalar_text(&mut self, n: &Node, what: &str) -> Option<String> {
        let sources = self.sources;
        let written = || {
            let text = &sources.get(n.span.file).text;
            text.get(n.span.start as usize..n.span.end as usize)
                .map(str::trim)
                .unwrap_or_default()
                .to_owned()
        };
        match &n.kind {
            NodeKind::Str(s, _) => Some(s.clone()),
            NodeKind::Bool(b) => Some(b.to_string()),
            NodeKind::Int(i) => {
                let w = written();
                Some(if w.parse::<i64>().ok() == Some(*i) {
                    w
                } else {
                    i.to_string()
                })
            }
            NodeKind::Float(f) => {
                let w = written();
                Some(
                    if w.parse::<f64>().ok().map(f64::to_bits) == Some(f.to_bits()) {
                        w
                    } else {
                        f.to_string()
                    },
                )
            }
            NodeKind::Null => {
                self.error(
                    n.span,
                    format!(
                        "{what} has no value (null); give a string, number or boolean, or a \
                         `{FROM_ENV}`/`{FROM_FILE}` reference"
                    ),
                );
                None
            }
            NodeKind::List(_) | NodeKind::Map(_) => {
                self.error(
                    n.span,
                    format!(
                        "{what} is {}; a variable's value must be a string, number or boolean",
                        article(n)
                    ),
                );
                None
            }
        }
    }

    /// Refuses `${` in a key of provider configuration or injectors.
    fn literal_key(&mut self, span: Span, key: &str, what: &str) {
        if key.contains("${") {
            self.error(
                span,
                format!(
                    "{what}: `${{` is not allowed in an environment file's keys or values: they \
                     are literal, nothing is substituted"
                ),
            );
        }
    }

    /// Provider configuration or injector defaults as JSON. With `secrets`, references resolve
    /// to `{"$sensitive": value}`; without, they are refused. `path` names the node.
    fn json(&mut self, n: &Node, path: &str, secrets: bool) -> Option<Json> {
        let what = format!("`{path}`");
        match &n.kind {
            NodeKind::Null => Some(Json::Null),
            NodeKind::Bool(b) => Some(Json::Bool(*b)),
            NodeKind::Int(i) => Some(Json::from(*i)),
            NodeKind::Float(f) => match serde_json::Number::from_f64(*f) {
                Some(x) => Some(Json::Number(x)),
                None => {
                    self.error(n.span, format!("{what}: the number must be finite"));
                    None
                }
            },
            NodeKind::Str(s, _) => {
                if s.contains("${") {
                    self.error(
                        n.span,
                        format!(
                            "{what}: `${{` is not allowed here: values in an environment file \
                             are literal, nothing is substituted"
                        ),
                    );
                    return None;
                }
                Some(Json::String(s.clone()))
            }
            NodeKind::List(items) => {
                let mut out = Vec::with_capacity(items.len());
                let mut ok = true;
                for (i, item) in items.iter().enumerate() {
                    match self.json(item, &format!("{path}[{i}]"), secrets) {
                        Some(v) => out.push(v),
                        None => ok = false,
                    }
                }
                ok.then_some(Json::Array(out))
            }
            NodeKind::Map(entries) => {
                if !secrets {
                    if let Some((k, _)) = entries
                        .iter()
                        .find(|(k, _)| k.name == FROM_ENV || k.name == FROM_FILE)
                    {
                        self.error(
                            k.span,
                            format!(
                                "{what}: `{}` is not allowed in injectors: injected values are \
                                 shown in plans, and secrets do not belong there (use a \
                                 variable or provider configuration)",
                                k.name
                            ),
                        );
                        return None;
                    }
                } else if let Some(r) = self.reference(n, &what) {
                    let value = self.resolve(&r.ok()?, n.span, &what)?;
                    return Some(mark_secret(Json::String(value)));
                }
                self.json_fields(entries, path, secrets).map(Json::Object)
            }
        }
    }

    /// The entries of a mapping of fields (provider configuration, injector defaults): a
    /// mapping that is not itself a reference.
    fn fields<'n>(&mut self, n: &'n Node, what: &str, expect: &str) -> Option<&'n [(Key, Node)]> {
        match &n.kind {
            NodeKind::Map(entries)
                if !entries
                    .iter()
                    .any(|(k, _)| k.name == FROM_ENV || k.name == FROM_FILE) =>
            {
                Some(entries)
            }
            NodeKind::Map(_) => {
                self.error(
                    n.span,
                    format!(
                        "{what} must be a mapping of {expect}, not a `{FROM_ENV}`/`{FROM_FILE}` \
                         reference"
                    ),
                );
                None
            }
            _ => {
                self.error(
                    n.span,
                    format!("{what} must be a mapping of {expect}, not {}", article(n)),
                );
                None
            }
        }
    }

    /// The fields of a mapping as a JSON object (see [`Reader::json`]).
    fn json_fields(
        &mut self,
        entries: &[(Key, Node)],
        path: &str,
        secrets: bool,
    ) -> Option<Map<String, Json>> {
        let mut out = Map::new();
        let mut ok = true;
        for (k, v) in entries {
            let child = format!("{path}.{}", k.name);
            self.literal_key(k.span, &k.name, &format!("`{child}`"));
            match self.json(v, &child, secrets) {
                Some(v) => {
                    out.insert(k.name.clone(), v);
                }
                None => ok = false,
            }
        }
        ok.then_some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_dir::TestDir;
    use serde_json::json;

    fn write(dir: &Path, rel: &str, text: &str) -> PathBuf {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&path, text).unwrap();
        path
    }

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        }
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn var(name: &str, value: &str, secret: bool) -> EnvVariable {
        EnvVariable {
            name: name.to_owned(),
            value: value.to_owned(),
            secret,
        }
    }

    const FULL: &str = "\
name: staging
variables:
  region: eu-west-1
  count: 3
  ratio: 1.50
  enabled: true
  off: false
  dbPassword: { fromEnv: DB_PASSWORD }
  apiKey: { fromFile: secrets/api-key }
providers:
  local:
    root: ./out
    retries: 2
    token: { fromEnv: LOCAL_TOKEN }
    nested:
      list: [a, { fromFile: secrets/api-key }]
  aws:
    region: eu-west-1
injectors:
  local/file:
    mode: \"0600\"
    tags: [x, y]
  aws/s3/bucket:
    versioning: true
";

    #[test]
    fn full_file_resolves_every_shape() {
        let dir = TestDir::new("env-full");
        write(&dir, "secrets/api-key", "k-123\n");
        let path = write(&dir, "dev.yaml", FULL);
        let env = env_of(&[("DB_PASSWORD", "pw-456"), ("LOCAL_TOKEN", "tok-789")]);
        let e = load_environment_with(&path, &env).unwrap();
        assert_eq!(e.name, "staging");
        assert_eq!(
            e.variables,
            vec![
                var("region", "eu-west-1", false),
                var("count", "3", false),
                var("ratio", "1.50", false),
                var("enabled", "true", false),
                var("off", "false", false),
                var("dbPassword", "pw-456", true),
                var("apiKey", "k-123", true),
            ]
        );
        // Providers and injectors keep file order.
        let namespaces: Vec<&str> = e.providers.keys().map(String::as_str).collect();
        assert_eq!(namespaces, ["local", "aws"]);
        assert_eq!(
            Json::Object(e.providers["aws"].clone()),
            json!({"region": "eu-west-1"})
        );
        assert_eq!(
            Json::Object(e.providers["local"].clone()),
            json!({
                "root": "./out",
                "retries": 2,
                "token": {"$sensitive": "tok-789"},
                "nested": {"list": ["a", {"$sensitive": "k-123"}]},
            })
        );
        // File order is kept inside a configuration.
        let keys: Vec<&str> = e.providers["local"].keys().map(String::as_str).collect();
        assert_eq!(keys, ["root", "retries", "token", "nested"]);
        let types: Vec<&str> = e.injectors.keys().map(String::as_str).collect();
        assert_eq!(types, ["local/file", "aws/s3/bucket"]);
        assert_eq!(e.injectors["aws/s3/bucket"], json!({"versioning": true}));
        assert_eq!(
            e.injectors["local/file"],
            json!({"mode": "0600", "tags": ["x", "y"]})
        );
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(
            e.digest,
            format!("sha256:{}", trellis_ids::sha256_hex(&bytes))
        );
        assert_eq!(e.digest.len(), "sha256:".len() + 64);
    }

    #[test]
    fn json_files_are_read_too() {
        let dir = TestDir::new("env-json");
        let path = write(
            &dir,
            "prod.json",
            r#"{"variables": {"n": 10, "s": "x"}, "providers": {"p": {"k": {"fromEnv": "K"}}}}"#,
        );
        let e = load_environment_with(&path, &env_of(&[("K", "v")])).unwrap();
        assert_eq!(e.name, "prod");
        assert_eq!(
            e.variables,
            vec![var("n", "10", false), var("s", "x", false)]
        );
        assert_eq!(
            Json::Object(e.providers["p"].clone()),
            json!({"k": {"$sensitive": "v"}})
        );
    }

    #[test]
    fn name_defaults_to_the_file_stem() {
        let dir = TestDir::new("env-stem");
        let path = write(&dir, "envs/dev.yaml", "variables:\n  a: b\n");
        let e = load_environment_with(&path, &no_env).unwrap();
        assert_eq!(e.name, "dev");
        assert_eq!(e.variables, vec![var("a", "b", false)]);
        assert!(e.providers.is_empty() && e.injectors.is_empty());
        // A file of only a comment (or nothing) is an environment with nothing set.
        let path = write(&dir, "envs/qa.yml", "# nothing yet\n");
        let e = load_environment_with(&path, &no_env).unwrap();
        assert_eq!(e.name, "qa");
        assert!(e.variables.is_empty());
        let path = write(&dir, "envs/empty.yaml", "");
        assert_eq!(load_environment_with(&path, &no_env).unwrap().name, "empty");
        // Sections given with nothing under them are empty too.
        let path = write(
            &dir,
            "envs/bare.yaml",
            "variables:\nproviders:\ninjectors:\n",
        );
        let e = load_environment_with(&path, &no_env).unwrap();
        assert_eq!(e.name, "bare");
        assert!(e.variables.is_empty());
        // A variable with nothing after it is null (YAML 1.2 core schema, decision 0001), not
        // "": an error at its line (`""` is the empty string).
        let path = write(&dir, "envs/blank.yaml", "variables:\n  blank:\n");
        let e = load_environment_with(&path, &no_env).unwrap_err();
        assert!(
            e.contains("blank.yaml:2:") && e.contains("`variables.blank` has no value"),
            "{e}"
        );
        let path = write(&dir, "envs/quoted.yaml", "variables:\n  blank: \"\"\n");
        let e = load_environment_with(&path, &no_env).unwrap();
        assert_eq!(e.variables, vec![var("blank", "", false)]);
    }

    #[test]
    fn from_file_is_relative_to_the_environment_file() {
        let dir = TestDir::new("env-rel");
        write(&dir, "envs/secrets/key", "line1\nline2\r\n");
        write(&dir, "envs/secrets/two", "abc\n\n");
        write(&dir, "envs/secrets/none", "raw");
        let path = write(
            &dir,
            "envs/dev.yaml",
            "variables:\n  a: { fromFile: secrets/key }\n  b: { fromFile: secrets/two }\n  \
             c: { fromFile: secrets/none }\n",
        );
        // The working directory is not the environment file's directory.
        assert_ne!(std::env::current_dir().unwrap(), dir.join("envs"));
        let e = load_environment_with(&path, &no_env).unwrap();
        assert_eq!(
            e.variables,
            vec![
                var("a", "line1\nline2", true),
                var("b", "abc\n", true),
                var("c", "raw", true),
            ]
        );
        // An absolute path is used as it is.
        let abs = dir.join("envs/secrets/none");
        let path = write(
            &dir,
            "other/x.yaml",
            &format!(
                "variables:\n  a: {{ fromFile: {:?} }}\n",
                abs.display().to_string()
            ),
        );
        let e = load_environment_with(&path, &no_env).unwrap();
        assert_eq!(e.variables, vec![var("a", "raw", true)]);
    }

    #[test]
    fn unreadable_from_file_is_an_error_with_location() {
        let dir = TestDir::new("env-nofile");
        let path = write(
            &dir,
            "dev.yaml",
            "variables:\n  apiKey: { fromFile: missing/key }\n",
        );
        let err = load_environment_with(&path, &no_env).unwrap_err();
        assert!(
            err.starts_with(&format!("{}:2:11: ", path.display())),
            "{err}"
        );
        assert!(err.contains("`variables.apiKey`"), "{err}");
        assert!(err.contains("missing/key"), "{err}");
    }

    #[test]
    fn missing_environment_variable_names_the_variable_and_the_key() {
        let dir = TestDir::new("env-missing");
        let path = write(
            &dir,
            "dev.yaml",
            "variables:\n  present: { fromEnv: SET_ONE }\n  dbPassword: { fromEnv: DB_PASSWORD }\n\
             providers:\n  local:\n    token: { fromEnv: LOCAL_TOKEN }\n",
        );
        let env = env_of(&[("SET_ONE", "very-secret-value")]);
        let err = load_environment_with(&path, &env).unwrap_err();
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 2, "{err}");
        assert!(
            lines[0].starts_with(&format!("{}:3:15: ", path.display())),
            "{err}"
        );
        assert!(lines[0].contains("`DB_PASSWORD`"), "{err}");
        assert!(lines[0].contains("`variables.dbPassword`"), "{err}");
        assert!(lines[1].contains("`LOCAL_TOKEN`"), "{err}");
        assert!(lines[1].contains("`providers.local.token`"), "{err}");
        assert!(!err.contains("very-secret-value"), "{err}");
    }

    #[test]
    fn unknown_top_level_key_is_an_error() {
        let dir = TestDir::new("env-unknown");
        let path = write(&dir, "dev.yaml", "name: dev\nvariable:\n  a: b\n");
        let err = load_environment_with(&path, &no_env).unwrap_err();
        assert!(
            err.starts_with(&format!("{}:2:1: unknown key `variable`", path.display())),
            "{err}"
        );
        assert!(
            err.contains("allowed: name, variables, providers, injectors"),
            "{err}"
        );
        assert!(err.contains("did you mean `variables`?"), "{err}");
        // A document that is not a mapping.
        let path = write(&dir, "list.yaml", "- a\n- b\n");
        let err = load_environment_with(&path, &no_env).unwrap_err();
        assert!(err.contains("must be a mapping"), "{err}");
    }

    #[test]
    fn list_or_mapping_as_variable_value_is_an_error() {
        let dir = TestDir::new("env-list");
        let path = write(
            &dir,
            "dev.yaml",
            "variables:\n  ok: 1\n  zones: [a, b]\n  obj: { a: 1 }\n  nothing: ~\n",
        );
        let err = load_environment_with(&path, &no_env).unwrap_err();
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 3, "{err}");
        let file = path.display().to_string();
        assert!(
            lines[0].starts_with(&format!("{file}:3:10: `variables.zones` is an array")),
            "{err}"
        );
        assert!(
            lines[1].starts_with(&format!("{file}:4:8: `variables.obj` is a mapping")),
            "{err}"
        );
        assert!(
            lines[2].contains("`variables.nothing` has no value"),
            "{err}"
        );
    }

    #[test]
    fn malformed_references_are_errors() {
        let dir = TestDir::new("env-badref");
        let path = write(
            &dir,
            "dev.yaml",
            "variables:\n  a: { fromEnv: A, default: x }\n  b: { fromEnv: 3 }\n  c: { fromEnv: '' }\n\
             providers:\n  p:\n    k: { fromFile: f, fromEnv: B }\n",
        );
        let err = load_environment_with(&path, &env_of(&[("A", "1"), ("B", "2")])).unwrap_err();
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 4, "{err}");
        assert!(
            lines[0].contains("`variables.a`") && lines[0].contains("found also `default`"),
            "{err}"
        );
        assert!(lines[1].contains("`fromEnv` must be a string"), "{err}");
        assert!(
            lines[2].contains("must name an environment variable"),
            "{err}"
        );
        assert!(
            lines[3].contains("`providers.p.k`") && lines[3].contains("only key"),
            "{err}"
        );
    }

    #[test]
    fn substitutions_are_refused_in_providers_and_injectors() {
        let dir = TestDir::new("env-subst");
        let path = write(
            &dir,
            "dev.yaml",
            "variables:\n  v: '${kept.as.text}'\nproviders:\n  local:\n    root: '${variables.root}'\n\
             injectors:\n  local/file:\n    tags: [ok, 'a-${x}']\n",
        );
        let err = load_environment_with(&path, &no_env).unwrap_err();
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 2, "{err}");
        let file = path.display().to_string();
        assert!(
            lines[0].starts_with(&format!("{file}:5:11: `providers.local.root`: `${{`")),
            "{err}"
        );
        assert!(
            lines[1].starts_with(&format!(
                "{file}:8:16: `injectors.local/file.tags[1]`: `${{`"
            )),
            "{err}"
        );
    }

    #[test]
    fn injectors_refuse_secrets_and_non_mappings() {
        let dir = TestDir::new("env-inj");
        let path = write(
            &dir,
            "dev.yaml",
            "injectors:\n  local/file:\n    mode: { fromEnv: MODE }\n  other/type: plain\n",
        );
        let err = load_environment_with(&path, &env_of(&[("MODE", "0600")])).unwrap_err();
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 2, "{err}");
        assert!(
            lines[0].contains("`injectors.local/file.mode`")
                && lines[0].contains("`fromEnv` is not allowed in injectors"),
            "{err}"
        );
        assert!(
            lines[1].contains("`injectors.other/type` must be a mapping"),
            "{err}"
        );
        let path = write(&dir, "p.yaml", "providers:\n  local: [a]\n");
        let err = load_environment_with(&path, &no_env).unwrap_err();
        assert!(err.contains("`providers.local` must be a mapping"), "{err}");
    }

    #[test]
    fn debug_output_never_shows_secret_values() {
        let dir = TestDir::new("env-debug");
        write(&dir, "secrets/api-key", "file-secret-aaa\n");
        let path = write(&dir, "dev.yaml", FULL);
        let env = env_of(&[
            ("DB_PASSWORD", "env-secret-bbb"),
            ("LOCAL_TOKEN", "env-secret-ccc"),
        ]);
        let e = load_environment_with(&path, &env).unwrap();
        for shown in [
            format!("{e:?}"),
            format!("{e:#?}"),
            format!("{:?}", e.variables),
        ] {
            for secret in ["file-secret-aaa", "env-secret-bbb", "env-secret-ccc"] {
                assert!(!shown.contains(secret), "{secret} in {shown}");
            }
            assert!(
                shown.contains("dbPassword") && shown.contains("(sensitive)"),
                "{shown}"
            );
            assert!(shown.contains("eu-west-1"), "{shown}");
        }
        let shown = format!("{e:?}");
        assert!(
            shown.contains("token") && shown.contains("./out"),
            "{shown}"
        );
        assert!(shown.contains("0600"), "{shown}");
    }

    #[test]
    fn digest_follows_the_file_bytes() {
        let dir = TestDir::new("env-digest");
        let path = write(&dir, "dev.yaml", "variables:\n  a: { fromEnv: A }\n");
        let first = load_environment_with(&path, &env_of(&[("A", "1")])).unwrap();
        // A different secret value does not change the digest: the file holds the reference.
        let same = load_environment_with(&path, &env_of(&[("A", "2")])).unwrap();
        assert_eq!(first.digest, same.digest);
        write(&dir, "dev.yaml", "variables:\n  a: { fromEnv: B }\n");
        let changed = load_environment_with(&path, &env_of(&[("B", "1")])).unwrap();
        assert_ne!(first.digest, changed.digest);
        assert!(changed.digest.starts_with("sha256:"));
    }

    #[test]
    fn unreadable_oversize_and_malformed_files_are_errors() {
        let dir = TestDir::new("env-bad");
        let missing = dir.join("nope.yaml");
        let err = load_environment_with(&missing, &no_env).unwrap_err();
        assert!(
            err.starts_with(&format!("cannot read {}", missing.display())),
            "{err}"
        );
        let big = write(&dir, "big.yaml", &"#".repeat(MAX_FILE_BYTES + 1));
        let err = load_environment_with(&big, &no_env).unwrap_err();
        assert!(err.contains("larger than the limit"), "{err}");
        let bad = write(&dir, "bad.yaml", "variables:\n  a: [1, 2\n");
        let err = load_environment_with(&bad, &no_env).unwrap_err();
        assert!(err.starts_with(&format!("{}:", bad.display())), "{err}");
        let dup = write(&dir, "dup.yaml", "variables:\n  a: 1\n  a: 2\n");
        let err = load_environment_with(&dup, &no_env).unwrap_err();
        assert!(
            err.starts_with(&format!("{}:3:3: duplicate key `a`", dup.display())),
            "{err}"
        );
    }

    #[test]
    fn load_environment_reads_the_process_environment() {
        let dir = TestDir::new("env-proc");
        // PATH is set wherever tests run; nothing is set by the test.
        let path = write(&dir, "dev.yaml", "variables:\n  p: { fromEnv: PATH }\n");
        let e = load_environment(&path).unwrap();
        assert_eq!(e.variables.len(), 1);
        assert_eq!(
            Some(e.variables[0].value.clone()),
            std::env::var("PATH").ok()
        );
        assert!(e.variables[0].secret);
    }

    #[test]
    fn var_file_reads_scalars_in_order() {
        let dir = TestDir::new("varfile");
        let path = write(
            &dir,
            "vars.yaml",
            "region: eu-west-1\nreplicas: 3\nratio: 0.50\nenabled: true\nquoted: \"42\"\n",
        );
        assert_eq!(
            load_var_file(&path).unwrap(),
            vec![
                ("region".to_owned(), "eu-west-1".to_owned()),
                ("replicas".to_owned(), "3".to_owned()),
                ("ratio".to_owned(), "0.50".to_owned()),
                ("enabled".to_owned(), "true".to_owned()),
                ("quoted".to_owned(), "42".to_owned()),
            ]
        );
        let path = write(&dir, "vars.json", r#"{"a": "x", "b": -7}"#);
        assert_eq!(
            load_var_file(&path).unwrap(),
            vec![
                ("a".to_owned(), "x".to_owned()),
                ("b".to_owned(), "-7".to_owned())
            ]
        );
    }

    #[test]
    fn var_file_refuses_nested_values_and_references() {
        let dir = TestDir::new("varfile-bad");
        let path = write(
            &dir,
            "vars.yaml",
            "region: eu-west-1\nzones:\n  - a\n  - b\nsecret: { fromEnv: HOME }\n",
        );
        let err = load_var_file(&path).unwrap_err();
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 2, "{err}");
        let file = path.display().to_string();
        assert!(
            lines[0].starts_with(&format!("{file}:3:3: variable `zones` is an array")),
            "{err}"
        );
        assert!(
            lines[1].starts_with(&format!("{file}:5:9: variable `secret`"))
                && lines[1].contains("not allowed in a variable file"),
            "{err}"
        );
        let path = write(&dir, "list.yaml", "[a, b]\n");
        let err = load_var_file(&path).unwrap_err();
        assert!(err.contains("must be a mapping"), "{err}");
    }
}
