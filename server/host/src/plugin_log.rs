//! Plugin log lines that are JSON objects (`{"level":"INFO","message":"…",…}`, what the plugin
//! SDK writes when the engine launched it) become log events with the plugin's level, message
//! and target as their own fields, instead of a text line nested in the engine's.
//!
//! A tracing event's field names are fixed where it is written, so the plugin's other fields
//! (they differ per line) travel together in one `fields` value, in `key=value` form.

use serde_json::{Map, Value};

/// A plugin's structured log line.
#[derive(Debug, PartialEq)]
pub(crate) struct Structured {
    pub level: tracing::Level,
    pub message: String,
    /// The plugin's module path, when it sent one.
    pub target: String,
    /// The line's other fields (its span's included), `key=value` separated by spaces.
    pub fields: String,
}

impl Structured {
    /// The line as a structured one, if it is a JSON object with a level and a message.
    pub(crate) fn parse(line: &str) -> Option<Structured> {
        let line = line.trim();
        if !line.starts_with('{') {
            return None;
        }
        let mut object: Map<String, Value> = serde_json::from_str(line).ok()?;
        let level = match object.remove("level")? {
            Value::String(l) => level_of(&l)?,
            _ => return None,
        };
        // Flattened (the SDK's form) or under `fields`, as tracing-subscriber nests it.
        let mut fields = match object.remove("fields") {
            Some(Value::Object(f)) => f,
            _ => Map::new(),
        };
        let message = match object
            .remove("message")
            .or_else(|| fields.remove("message"))?
        {
            Value::String(m) => m,
            other => other.to_string(),
        };
        let target = match object.remove("target") {
            Some(Value::String(t)) => t,
            _ => String::new(),
        };
        // The engine stamps its own time; span lists repeat the current span.
        for noise in ["timestamp", "time", "spans", "threadName", "threadId"] {
            object.remove(noise);
        }
        let span = match object.remove("span") {
            Some(Value::Object(s)) => s,
            _ => Map::new(),
        };
        let mut rest: Vec<(String, Value)> = span
            .into_iter()
            .filter(|(k, _)| k != "name")
            .chain(fields)
            .chain(object)
            .collect();
        rest.sort_by(|a, b| a.0.cmp(&b.0));
        let fields = rest
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) if !s.is_empty() && !s.contains([' ', '"', '=']) => {
                    format!("{k}={s}")
                }
                other => format!("{k}={other}"),
            })
            .collect::<Vec<_>>()
            .join(" ");
        Some(Structured {
            level,
            message,
            target,
            fields,
        })
    }

    /// As a person reads it (the stderr tail in error messages).
    pub(crate) fn readable(&self) -> String {
        let mut s = format!("{} {}", self.level, self.message);
        if !self.fields.is_empty() {
            s.push(' ');
            s.push_str(&self.fields);
        }
        s
    }

    /// One event under target `trellis::plugin`.
    pub(crate) fn emit(&self, plugin: &str, stream: &'static str) {
        let (message, plugin_target, fields) = (&self.message, &self.target, &self.fields);
        macro_rules! at {
            ($m:ident) => {
                tracing::$m!(target: "trellis::plugin", plugin = %plugin, stream,
                    plugin_target = %plugin_target, fields = %fields, "{message}")
            };
        }
        match self.level {
            tracing::Level::ERROR => at!(error),
            tracing::Level::WARN => at!(warn),
            tracing::Level::INFO => at!(info),
            tracing::Level::DEBUG => at!(debug),
            tracing::Level::TRACE => at!(trace),
        }
    }
}

fn level_of(s: &str) -> Option<tracing::Level> {
    Some(match s.to_ascii_uppercase().as_str() {
        "ERROR" | "FATAL" | "CRITICAL" => tracing::Level::ERROR,
        "WARN" | "WARNING" => tracing::Level::WARN,
        "INFO" => tracing::Level::INFO,
        "DEBUG" => tracing::Level::DEBUG,
        "TRACE" => tracing::Level::TRACE,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sdks_flattened_line() {
        let s = Structured::parse(
            r#"{"level":"WARN","message":"throttled, retrying","target":"trellis_provider_aws::retry","ms":120,"class":"throttling","span":{"name":"call","call_id":"c_1"}}"#,
        )
        .unwrap();
        assert_eq!(s.level, tracing::Level::WARN);
        assert_eq!(s.message, "throttled, retrying");
        assert_eq!(s.target, "trellis_provider_aws::retry");
        assert_eq!(s.fields, "call_id=c_1 class=throttling ms=120");
        assert_eq!(
            s.readable(),
            "WARN throttled, retrying call_id=c_1 class=throttling ms=120"
        );
    }

    #[test]
    fn tracing_subscribers_nested_form() {
        let s = Structured::parse(
            r#"{"timestamp":"2026-11-28T04:00:00Z","level":"INFO","fields":{"message":"listening","socket":"/run/p/plugin.sock","note":"two words"},"target":"sdk"}"#,
        )
        .unwrap();
        assert_eq!(s.level, tracing::Level::INFO);
        assert_eq!(s.message, "listening");
        assert_eq!(s.fields, r#"note="two words" socket=/run/p/plugin.sock"#);
    }

    #[test]
    fn other_lines_are_text() {
        for line in [
            "INFO pyecho: listening",
            "{not json",
            r#"{"message":"no level"}"#,
            r#"{"level":"LOUD","message":"unknown level"}"#,
            r#"{"level":"INFO"}"#,
            r#"["level","INFO"]"#,
        ] {
            assert_eq!(Structured::parse(line), None, "{line}");
        }
    }
}
