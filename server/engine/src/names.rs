//! The rule for instance names. Only a plan creates instances (`Engine::create_change_set`
//! checks it); the other calls find existing ones by name, so an instance created before the
//! rule can still be read and destroyed.

/// Longest instance name, in characters (a child's is `<parent>/<include>`, so there is room).
pub const MAX_INSTANCE_NAME_CHARS: usize = 200;

/// Why `name` cannot name a new instance, if it cannot. Names are shown in tables, logs and
/// terminals: characters that move the cursor, break lines or reorder text (control and
/// bidirectional-formatting characters), invisible ones, and edge whitespace could make one
/// name pass for another or forge rows.
pub fn instance_name_problem(name: &str) -> Option<String> {
    let shown = format!("{:?}", name.chars().take(60).collect::<String>());
    let count = name.chars().count();
    if name.is_empty() {
        return Some("an instance name is required".into());
    }
    if count > MAX_INSTANCE_NAME_CHARS {
        return Some(format!(
            "instance name {shown}... is {count} characters long; at most \
             {MAX_INSTANCE_NAME_CHARS} are allowed"
        ));
    }
    if let Some(c) = name.chars().find(|&c| unprintable(c)) {
        return Some(format!(
            "instance name {shown} contains {:?} (U+{:04X}): control, line-breaking, invisible \
             and text-direction characters are not allowed in instance names",
            c, c as u32
        ));
    }
    if name.starts_with(char::is_whitespace) || name.ends_with(char::is_whitespace) {
        return Some(format!(
            "instance name {shown} starts or ends with whitespace, which is not allowed"
        ));
    }
    None
}

/// Control characters (C0, DEL, C1: newline, tab, ESC...), line and paragraph separators,
/// zero-width and bidirectional formatting characters, and the byte-order mark.
fn unprintable(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{200B}'..='\u{200F}'   // zero-width space/joiners, LRM, RLM
            | '\u{2028}'..='\u{202E}' // line/paragraph separators, bidi embeddings/overrides
            | '\u{2060}'..='\u{2069}' // word joiner, invisible operators, bidi isolates
            | '\u{FEFF}'
            | '\u{061C}'              // Arabic letter mark
            | '\u{00AD}'              // soft hyphen
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_names() {
        for ok in ["app", "app-prod_2", "team/app", "ünïcode 名前", "a b"] {
            assert_eq!(instance_name_problem(ok), None, "{ok:?}");
        }
        for (bad, why) in [
            ("", "required"),
            ("app\nfake DEPLOYED", "'\\n' (U+000A)"),
            ("app\tx", "'\\t' (U+0009)"),
            ("\u{1b}[31mred", "'\\u{1b}' (U+001B)"),
            ("app\u{7f}", "(U+007F)"),
            ("app\u{85}", "(U+0085)"),
            ("evil\u{202E}gpj", "(U+202E)"),
            ("a\u{200B}pp", "(U+200B)"),
            ("app\u{2028}x", "(U+2028)"),
            (" app", "whitespace"),
            ("app ", "whitespace"),
        ] {
            let problem = instance_name_problem(bad).unwrap_or_default();
            assert!(problem.contains(why), "{bad:?}: {problem}");
            // The message never carries the raw character to a terminal.
            assert!(
                !problem.contains(['\n', '\t', '\u{1b}', '\u{202E}']),
                "{problem}"
            );
        }
        let long = "a".repeat(MAX_INSTANCE_NAME_CHARS + 1);
        let problem = instance_name_problem(&long).unwrap();
        assert!(problem.contains("at most 200"), "{problem}");
        assert!(
            problem.len() < 200,
            "the message shows a prefix of the name"
        );
        assert_eq!(
            instance_name_problem(&"a".repeat(MAX_INSTANCE_NAME_CHARS)),
            None
        );
    }
}
