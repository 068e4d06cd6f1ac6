//! Block YAML for what the CLI prints as blueprint text (`validate --show-transformed`,
//! `import`): the subset a blueprint reader reads back as the same document.

use serde_json::Value as Json;

/// `name:` with the name plain when YAML reads it back as the same string.
pub(crate) fn key(name: &str, out: &mut String) {
    string(name, out);
    out.push(':');
}

/// A value after `key:` (or `-`): on the same line when it is a scalar or empty, otherwise
/// on the next lines at `indent`.
pub(crate) fn nested(v: &Json, indent: usize, out: &mut String) {
    match v {
        Json::Object(m) if !m.is_empty() => {
            out.push('\n');
            block(v, indent, out);
        }
        Json::Array(l) if !l.is_empty() => {
            out.push('\n');
            block(v, indent, out);
        }
        _ => {
            out.push(' ');
            scalar(v, out);
            out.push('\n');
        }
    }
}

/// A non-empty mapping or list as block YAML, every line at `indent`.
fn block(v: &Json, indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    match v {
        Json::Object(m) => {
            for (k, value) in m {
                out.push_str(&pad);
                key(k, out);
                nested(value, indent + 2, out);
            }
        }
        Json::Array(items) => {
            for item in items {
                out.push_str(&pad);
                out.push('-');
                match item {
                    // `- key: value` with the rest of the mapping under the first key.
                    Json::Object(m) if !m.is_empty() => {
                        let mut inner = String::new();
                        block(item, indent + 2, &mut inner);
                        out.push(' ');
                        out.push_str(&inner[indent + 2..]);
                    }
                    _ => nested(item, indent + 2, out),
                }
            }
        }
        _ => {
            out.push_str(&pad);
            scalar(v, out);
            out.push('\n');
        }
    }
}

/// A scalar (or an empty collection) on one line.
pub(crate) fn scalar(v: &Json, out: &mut String) {
    match v {
        Json::String(s) => string(s, out),
        Json::Object(_) => out.push_str("{}"),
        Json::Array(_) => out.push_str("[]"),
        other => out.push_str(&other.to_string()),
    }
}

/// A string plain when it cannot read as anything else, otherwise double-quoted (JSON's
/// escapes are YAML's).
fn string(s: &str, out: &mut String) {
    let plain = s
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'))
        && !matches!(
            s.to_ascii_lowercase().as_str(),
            "true" | "false" | "null" | "yes" | "no" | "on" | "off" | "y" | "n"
        );
    if plain {
        out.push_str(s);
    } else {
        out.push_str(&Json::String(s.to_owned()).to_string());
    }
}
