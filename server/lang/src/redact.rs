//! Cutting secrets out of text that leaves the engine: provider error messages (stored as
//! failure reasons, operation errors and events, printed by the CLI) and plugin log lines.
//!
//! Two sets of secrets apply. A provider call's own inputs (what it was sent, marked
//! sensitive) are passed to [`redact`] by the caller. Beyond those, an operation registers the
//! secret strings it works with ([`hold`]: the values of secret variables and what derives
//! from them, the recorded secrets of the instance) for as long as it runs, because a provider
//! may quote a secret inside a longer text of its own (an absolute path, a URL it built) that
//! no sensitive input equals, and its log lines are forwarded to the engine's log. [`scrub`]
//! applies the registered ones; [`redact`] applies both.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Mutex;

/// Secrets shorter than this are not cut out of a message but withhold it whole: replacing
/// every `a` or `42` would garble the text and show where the secret was.
pub const SHORTEST_REDACTED: usize = 6;

/// What a message withheld for quoting a short secret says instead.
pub const WITHHELD: &str =
    "(the provider's message is withheld: it quotes a value marked sensitive)";

/// The secrets of the operations running now, each with how many of them hold it.
static LIVE: Mutex<Option<HashMap<String, usize>>> = Mutex::new(None);

fn live<T>(f: impl FnOnce(&mut HashMap<String, usize>) -> T) -> T {
    let mut guard = LIVE.lock().unwrap_or_else(|p| p.into_inner());
    f(guard.get_or_insert_with(HashMap::new))
}

/// The registration of one operation's secrets; dropping it forgets them (unless another
/// operation holds the same text).
#[must_use = "the secrets are forgotten when this is dropped"]
#[derive(Debug)]
pub struct Held {
    secrets: Vec<String>,
}

/// Registers secret strings for as long as the returned value lives. Texts shorter than
/// [`SHORTEST_REDACTED`] are left out: an operation-wide secret of two characters (or a
/// number, a boolean) would withhold every message that happens to contain them.
pub fn hold(secrets: impl IntoIterator<Item = String>) -> Held {
    let mut secrets: Vec<String> = secrets
        .into_iter()
        .filter(|s| s.chars().count() >= SHORTEST_REDACTED)
        .collect();
    secrets.sort();
    secrets.dedup();
    if !secrets.is_empty() {
        live(|m| {
            for s in &secrets {
                *m.entry(s.clone()).or_default() += 1;
            }
        });
    }
    Held { secrets }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.secrets.is_empty() {
            return;
        }
        live(|m| {
            for s in &self.secrets {
                if let Some(n) = m.get_mut(s) {
                    *n -= 1;
                    if *n == 0 {
                        m.remove(s);
                    }
                }
            }
        });
    }
}

/// Whether an operation registered any secret.
pub fn any_held() -> bool {
    live(|m| !m.is_empty())
}

/// The registered secrets that occur in `text`.
fn live_in(text: &str) -> Vec<String> {
    live(|m| {
        m.keys()
            .filter(|s| text.contains(s.as_str()))
            .cloned()
            .collect()
    })
}

/// Whether `text` holds one of `secrets` or a registered secret (texts shorter than
/// [`SHORTEST_REDACTED`] do not count: they occur by chance).
pub fn mentions_secret(text: &str, secrets: &[String]) -> bool {
    secrets
        .iter()
        .any(|s| s.chars().count() >= SHORTEST_REDACTED && text.contains(s.as_str()))
        || live(|m| m.keys().any(|s| text.contains(s.as_str())))
}

/// `text` with every registered secret replaced by the sensitive marker (log lines, messages
/// that did not come from one provider call).
pub fn scrub(text: &str) -> Cow<'_, str> {
    let found = live_in(text);
    if found.is_empty() {
        Cow::Borrowed(text)
    } else {
        Cow::Owned(cut(text, found.iter().map(String::as_str).collect()))
    }
}

/// `message` with every occurrence of `secrets` and of the registered secrets replaced by the
/// sensitive marker (longest first, so a secret containing another is cut whole), or withheld
/// whole when it holds one of `secrets` too short to cut out.
pub fn redact(message: &str, secrets: &[String]) -> String {
    let present: Vec<&str> = secrets
        .iter()
        .map(String::as_str)
        .filter(|s| !s.is_empty() && message.contains(s))
        .collect();
    if present
        .iter()
        .any(|s| s.chars().count() < SHORTEST_REDACTED)
    {
        return WITHHELD.to_owned();
    }
    let registered = live_in(message);
    let mut all = present;
    all.extend(registered.iter().map(String::as_str));
    cut(message, all)
}

fn cut(text: &str, mut secrets: Vec<&str>) -> String {
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let mut out = text.to_owned();
    for s in secrets {
        out = out.replace(s, crate::eval::render::SENSITIVE_TEXT);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_secrets_are_cut_while_held() {
        let text = "cannot create /srv/app/q3Vx-secret-7/f.txt";
        assert_eq!(scrub(text), text);
        let held = hold(["q3Vx-secret-7".to_owned(), "ab".to_owned()]);
        // The same text held twice stays until both let go.
        let again = hold(["q3Vx-secret-7".to_owned()]);
        assert_eq!(scrub(text), "cannot create /srv/app/(sensitive)/f.txt");
        assert_eq!(
            redact(text, &[]),
            "cannot create /srv/app/(sensitive)/f.txt"
        );
        // A short text is not registered: it would withhold every message holding `ab`.
        assert_eq!(scrub("abc"), "abc");
        drop(held);
        assert_eq!(scrub(text), "cannot create /srv/app/(sensitive)/f.txt");
        drop(again);
        assert_eq!(scrub(text), text);
    }

    /// A data source's provider that fails quoting the secret it was sent inside a longer
    /// text: the diagnostic the plan shows does not hold it.
    #[test]
    fn data_source_failures_never_quote_a_secret() {
        use crate::diag::Diagnostics;
        use crate::eval::blueprint::{DataSourceFetcher, evaluate_with};
        use crate::eval::functions::Env;
        use crate::eval::value::Value;

        struct Quoting;
        impl DataSourceFetcher for Quoting {
            fn fetch(
                &self,
                _: &str,
                filters: &[crate::datasource::filter::Filter],
            ) -> Result<Vec<Value>, String> {
                let Value::Str(s) = &filters[0].search else {
                    return Err("not a string".into());
                };
                Err(format!("cannot list `/abs/{}`", s.trim_start_matches("./")))
            }
        }
        let yaml = "version: 2023-04-20\nvariables:\n  dir:\n    type: string\n    secret: true\n\
                    datasources:\n  files:\n    type: local/file\n    filter:\n      field: path\n      \
                    operator: \"=\"\n      search: \"./data/${variables.dir}\"\n    exports:\n      \
                    path:\n        type: string\nresources:\n  r:\n    type: sim/resource\n    spec:\n      \
                    payload: ${datasources.files.path}\n";
        let vars = [("dir".to_owned(), "Qm4-secret-dir".to_owned())];
        let mut sources = crate::source::SourceMap::new();
        let mut diags = Diagnostics::default();
        let file = crate::document::load_bytes(
            &mut sources,
            "ds.yaml",
            yaml.as_bytes().to_vec(),
            1 << 20,
            &mut diags,
        )
        .unwrap();
        let root = crate::document::parse(
            &sources,
            file,
            crate::document::Format::from_path("ds.yaml"),
            &mut diags,
        )
        .unwrap();
        let src = sources.get(file);
        let bp = crate::blueprint::load(&root, src, file, &mut diags);
        let opts = crate::validate::Options {
            variables: &vars,
            ..Default::default()
        };
        let graph = crate::validate::validate(&bp, src, &opts, &mut diags);
        assert!(!diags.has_errors(), "{:?}", diags.items);
        let env = Env {
            cwd: "/work",
            now_unix_nanos: 0,
            link: &|_, _| Value::Unknown,
        };
        evaluate_with(
            &bp,
            &graph,
            &vars,
            &env,
            None,
            Some(&Quoting),
            Default::default(),
            &mut diags,
        );
        let messages: Vec<&str> = diags.items.iter().map(|d| d.message.as_str()).collect();
        assert!(
            messages
                .iter()
                .any(|m| m.contains("cannot list `/abs/data/(sensitive)`")),
            "{messages:?}"
        );
        assert!(
            !messages.iter().any(|m| m.contains("Qm4-secret-dir")),
            "{messages:?}"
        );
    }

    #[test]
    fn short_call_secrets_withhold_the_message() {
        let secrets = vec!["4242".to_owned(), "longer-secret".to_owned()];
        assert_eq!(redact("pin 4242 refused", &secrets), WITHHELD);
        assert_eq!(
            redact("bad longer-secret", &secrets),
            "bad (sensitive)".to_owned()
        );
        assert_eq!(redact("nothing here", &secrets), "nothing here");
    }
}
