//! Bounds on evaluation, so that a small hostile blueprint cannot make the engine build huge
//! values or spend unbounded time (docs/eval.md, "Limits").
//!
//! - the size of each value an expression produces ([`Limits::max_value_bytes`]): checked
//!   where values are built (interpolation, functions), before building when the size can be
//!   known in advance (`join`, `split`, `replace`, `jsondecode`, the higher-order functions);
//! - the resources a blueprint expands to after `each` ([`Limits::max_resources`]);
//! - the total bytes one evaluation produces ([`Limits::max_eval_bytes`]): every value built or
//!   copied (a reference copies what it reads) is charged to a [`Budget`] that lives as long as
//!   the evaluation (one plan, one deploy's execution, one `trellis eval`).
//!
//! Sizes are measured by [`measure`]: roughly the memory a value takes (a string's bytes, plus
//! a fixed cost per value and per object entry), so the limits bound memory, not just text.

use std::sync::atomic::{AtomicU64, Ordering};

use super::value::{Func, Value};
use crate::diag::{Code, codes};

pub const DEFAULT_MAX_VALUE_BYTES: u64 = 8 * 1024 * 1024;
pub const DEFAULT_MAX_RESOURCES: usize = 20_000;
pub const DEFAULT_MAX_EVAL_BYTES: u64 = 256 * 1024 * 1024;

/// What every value counts besides its contents: the size of a [`Value`].
pub const VALUE_BYTES: u64 = std::mem::size_of::<Value>() as u64;
/// What an object entry counts besides its key's bytes and its value: the key's `String`, its
/// hash and index.
const ENTRY_BYTES: u64 = 40;

/// The limits of one evaluation (`trellis serve` settings; flags of `trellis eval`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest value one expression may produce, as [`measure`]d.
    pub max_value_bytes: u64,
    /// Most resources a blueprint may have after `each` expansion.
    pub max_resources: usize,
    /// Most bytes one evaluation may produce in total, as [`measure`]d.
    pub max_eval_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_value_bytes: DEFAULT_MAX_VALUE_BYTES,
            max_resources: DEFAULT_MAX_RESOURCES,
            max_eval_bytes: DEFAULT_MAX_EVAL_BYTES,
        }
    }
}

/// Which limit a value or an evaluation ran into.
#[derive(Clone, Debug, PartialEq)]
pub enum LimitError {
    /// `what` (e.g. "a string") would be `bytes` large.
    ValueTooLarge {
        what: String,
        bytes: u64,
        limit: u64,
    },
    /// The evaluation has produced `used` bytes in total.
    Budget { used: u64, limit: u64 },
}

impl LimitError {
    pub fn code(&self) -> &'static Code {
        match self {
            LimitError::ValueTooLarge { .. } => &codes::VALUE_TOO_LARGE,
            LimitError::Budget { .. } => &codes::EVALUATION_BUDGET,
        }
    }
}

impl std::fmt::Display for LimitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LimitError::ValueTooLarge { what, bytes, limit } => write!(
                f,
                "{what} would be {}, more than the limit of {} per value (max-value-bytes)",
                bytes_text(*bytes),
                bytes_text(*limit)
            ),
            LimitError::Budget { used, limit } => write!(
                f,
                "evaluation stopped here: it has produced {} of values in total, more than the \
                 budget of {} per evaluation (max-eval-bytes)",
                bytes_text(*used),
                bytes_text(*limit)
            ),
        }
    }
}

/// How to raise the limit behind `code`, for a diagnostic's hint; `None` for other codes.
pub fn hint(code: &Code) -> Option<&'static str> {
    Some(if code == &codes::VALUE_TOO_LARGE {
        "values are bounded to protect the engine; to raise the limit set \
         `trellis serve --max-value-bytes BYTES` (TRELLIS_MAX_VALUE_BYTES, `max-value-bytes` in \
         its config file), or `trellis eval --max-value-bytes BYTES`"
    } else if code == &codes::TOO_MANY_RESOURCES {
        "to raise the limit set `trellis serve --max-resources N` (TRELLIS_MAX_RESOURCES, \
         `max-resources` in its config file), or `trellis eval --max-resources N`"
    } else if code == &codes::EVALUATION_BUDGET {
        "to raise the budget set `trellis serve --max-eval-bytes BYTES` \
         (TRELLIS_MAX_EVAL_BYTES, `max-eval-bytes` in its config file), or \
         `trellis eval --max-eval-bytes BYTES`"
    } else {
        return None;
    })
}

/// `8388608 bytes (8.0 MiB)`.
pub fn bytes_text(n: u64) -> String {
    if n < 1024 {
        return format!("{n} bytes");
    }
    let (unit, div) = if n >= 1 << 30 {
        ("GiB", (1u64 << 30) as f64)
    } else if n >= 1 << 20 {
        ("MiB", (1u64 << 20) as f64)
    } else {
        ("KiB", 1024.0)
    };
    format!("{n} bytes ({:.1} {unit})", n as f64 / div)
}

/// The size of `v` as the limits count it, or a number above `cap` as soon as it exceeds
/// `cap` (so measuring a huge value costs no more than the limit it breaks).
pub fn measure_capped(v: &Value, cap: u64) -> u64 {
    fn walk(v: &Value, total: &mut u64, cap: u64) {
        *total = total.saturating_add(VALUE_BYTES);
        if *total > cap {
            return;
        }
        match v {
            Value::Str(s) => *total = total.saturating_add(s.len() as u64),
            Value::List(items) => {
                for item in items {
                    walk(item, total, cap);
                    if *total > cap {
                        return;
                    }
                }
            }
            Value::Map(map) => {
                for (k, item) in map {
                    *total = total.saturating_add(ENTRY_BYTES + k.len() as u64);
                    walk(item, total, cap);
                    if *total > cap {
                        return;
                    }
                }
            }
            Value::Func(f) => walk_func(f, total, cap),
            Value::Null | Value::Bool(_) | Value::Int(_) | Value::Float(_) | Value::Unknown => {}
        }
    }
    fn walk_func(f: &Func, total: &mut u64, cap: u64) {
        match f {
            Func::Core(_) => {}
            Func::Partial { args, .. } => {
                for a in args {
                    walk(a, total, cap);
                }
            }
            Func::Compose(fs) | Func::Pipe(fs) => {
                for f in fs {
                    walk_func(f, total, cap);
                }
            }
        }
    }
    let mut total = 0;
    walk(v, &mut total, cap);
    total
}

/// The size of `v` as the limits count it.
pub fn measure(v: &Value) -> u64 {
    measure_capped(v, u64::MAX)
}

/// The size of a string of `len` bytes.
pub fn string_bytes(len: usize) -> u64 {
    VALUE_BYTES + len as u64
}

/// "a string", "an array of 3 elements", "an object of 2 entries".
pub fn describe(v: &Value) -> String {
    match v {
        Value::Str(_) => "a string".to_owned(),
        Value::List(items) => format!("an array of {} elements", items.len()),
        Value::Map(map) => format!("an object of {} entries", map.len()),
        other => crate::blueprint::article_of(other.type_name()),
    }
}

/// The running total of one evaluation against its [`Limits`]. Shared by every scope of the
/// evaluation; atomic so an evaluation can be kept by structures shared between threads.
#[derive(Debug, Default)]
pub struct Budget {
    limits: Limits,
    used: AtomicU64,
}

impl Budget {
    pub fn new(limits: Limits) -> Budget {
        Budget {
            limits,
            used: AtomicU64::new(0),
        }
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Bytes produced so far.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Whether the evaluation has run out of budget.
    pub fn exhausted(&self) -> bool {
        self.used() > self.limits.max_eval_bytes
    }

    /// Charges `bytes` of work; fails once the total is over the budget.
    pub fn charge(&self, bytes: u64) -> Result<(), LimitError> {
        let used = self
            .used
            .fetch_add(bytes, Ordering::Relaxed)
            .saturating_add(bytes);
        if used > self.limits.max_eval_bytes {
            return Err(LimitError::Budget {
                used,
                limit: self.limits.max_eval_bytes,
            });
        }
        Ok(())
    }

    /// Checks a size about to be built, before building it: `what` names it ("a string").
    pub fn check_size(&self, bytes: u64, what: impl FnOnce() -> String) -> Result<(), LimitError> {
        if bytes > self.limits.max_value_bytes {
            return Err(LimitError::ValueTooLarge {
                what: what(),
                bytes,
                limit: self.limits.max_value_bytes,
            });
        }
        Ok(())
    }

    /// Checks a value just built against the size limit and charges it.
    pub fn produced(&self, v: &Value) -> Result<(), LimitError> {
        let bytes = measure_capped(v, self.limits.max_value_bytes);
        self.check_size(bytes, || describe(v))?;
        self.charge(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diag::Diagnostic;
    use crate::eval::console::Console;
    use crate::eval::functions::{Env, call_in};
    use indexmap::IndexMap;

    fn no_link(_: &str, _: &str) -> Value {
        Value::Unknown
    }

    const ENV: Env<'static> = Env {
        cwd: "/work",
        now_unix_nanos: 0,
        link: &no_link,
    };

    /// Loads, validates and evaluates `yaml` under `limits`, as `trellis eval` and the engine do.
    fn evaluate(yaml: &str, limits: Limits) -> Console<'static> {
        Console::with_limits(
            Some(("limits.yaml", yaml.as_bytes().to_vec())),
            &[],
            &ENV,
            64 << 20,
            None,
            limits,
        )
    }

    fn with_code<'d>(c: &'d Console<'_>, code: &Code) -> Vec<&'d Diagnostic> {
        c.diags.items.iter().filter(|d| d.code == code).collect()
    }

    /// Forty values, each its predecessor twice over: 64 bytes times 2^40 at the end.
    fn doubling(n: usize) -> String {
        let mut y = String::from("version: 2023-04-20\nvalues:\n  v0:\n    type: string\n");
        y.push_str(&format!("    value: \"{}\"\n", "x".repeat(64)));
        for i in 1..=n {
            y.push_str(&format!(
                "  v{i}:\n    type: string\n    value: \"${{values.v{p}}}${{values.v{p}}}\"\n",
                p = i - 1
            ));
        }
        y.push_str(&format!(
            "resources:\n  r:\n    type: sim/resource\n    spec:\n      payload: ${{values.v{n}}}\n"
        ));
        y
    }

    #[test]
    fn doubling_strings_stop_at_the_value_limit_once() {
        let c = evaluate(&doubling(40), Limits::default());
        let found = with_code(&c, &codes::VALUE_TOO_LARGE);
        assert_eq!(found.len(), 1, "{:?}", c.diags.items);
        // 64 * 2^17 bytes is the first string over 8 MiB.
        let span = found[0].span;
        let text = &c.sources.get(span.file).text[span.start as usize..span.end as usize];
        assert!(text.contains("values.v16"), "{text}");
        assert!(
            found[0].message.contains("8388608 bytes"),
            "{}",
            found[0].message
        );
        assert!(
            found[0]
                .hint
                .as_deref()
                .is_some_and(|h| h.contains("--max-value-bytes")),
            "{:?}",
            found[0].hint
        );
        // Nothing else is reported: what reads the refused value is left unknown.
        assert_eq!(c.diags.items.len(), 1, "{:?}", c.diags.items);
        assert_eq!(c.evaluation.values["v17"], Value::Unknown);
        assert_eq!(c.evaluation.values["v40"], Value::Unknown);
        // Only the values under the limit were built (about 16 MiB in all).
        assert!(
            c.evaluation.budget.used() < 32 << 20,
            "{}",
            c.evaluation.budget.used()
        );
    }

    #[test]
    fn the_value_limit_is_a_setting() {
        let small = Limits {
            max_value_bytes: 4096,
            ..Limits::default()
        };
        let c = evaluate(&doubling(10), small);
        assert_eq!(with_code(&c, &codes::VALUE_TOO_LARGE).len(), 1);
        // 64 * 2^6 = 4096 bytes of text is over 4096 bytes with its value's own cost.
        assert!(matches!(&c.evaluation.values["v5"], Value::Str(s) if s.len() == 2048));
        assert_eq!(c.evaluation.values["v6"], Value::Unknown);
    }

    fn each_over(list: &str) -> String {
        format!(
            "version: 2023-04-20\nvariables:\n  names:\n    type: string\n    default: \"{list}\"\n\
             resources:\n  f:\n    type: sim/resource\n    each: ${{split(variables.names, \",\")}}\n\
             \x20   spec:\n      payload: ${{elem}}\n"
        )
    }

    #[test]
    fn a_big_each_is_refused_before_any_element_is_expanded() {
        let names: Vec<String> = (0..30_000).map(|i| format!("n{i}")).collect();
        let c = evaluate(&each_over(&names.join(",")), Limits::default());
        let found = with_code(&c, &codes::TOO_MANY_RESOURCES);
        assert_eq!(found.len(), 1, "{:?}", c.diags.items);
        assert!(
            found[0].message.contains("yields 30000 elements")
                && found[0].message.contains("limit of 20000"),
            "{}",
            found[0].message
        );
        assert!(c.evaluation.resources.is_empty());

        // Under the limit, the same blueprint expands.
        let c = evaluate(
            &each_over(&names[..100].join(",")),
            Limits {
                max_resources: 100,
                ..Limits::default()
            },
        );
        assert!(c.ready(), "{:?}", c.diags.items);
        assert_eq!(c.evaluation.resources.len(), 100);
    }

    #[test]
    fn resources_past_the_limit_are_refused_with_or_without_each() {
        let mut y = String::from("version: 2023-04-20\nresources:\n");
        for i in 0..5 {
            y.push_str(&format!(
                "  r{i}:\n    type: sim/resource\n    spec:\n      n: {i}\n"
            ));
        }
        let c = evaluate(
            &y,
            Limits {
                max_resources: 3,
                ..Limits::default()
            },
        );
        let found = with_code(&c, &codes::TOO_MANY_RESOURCES);
        assert_eq!(found.len(), 1, "{:?}", c.diags.items);
        assert!(
            found[0]
                .message
                .contains("resource `r3` would be resource number 4")
        );
        assert_eq!(c.evaluation.resources.len(), 3);
    }

    #[test]
    fn a_megabyte_each_list_is_refused_as_too_large_a_value() {
        // One element per character: a million values.
        let y = format!(
            "version: 2023-04-20\nvariables:\n  names:\n    type: string\n    default: \"{}\"\n\
             resources:\n  f:\n    type: sim/resource\n    each: ${{split(variables.names, \"\")}}\n\
             \x20   spec:\n      payload: ${{elem}}\n",
            "a".repeat(1_000_000)
        );
        let c = evaluate(&y, Limits::default());
        let found = with_code(&c, &codes::VALUE_TOO_LARGE);
        assert_eq!(found.len(), 1, "{:?}", c.diags.items);
        assert!(
            found[0]
                .message
                .contains("split: an array of 1000000 elements would be 73000072 bytes"),
            "{}",
            found[0].message
        );
        assert!(c.evaluation.resources.is_empty());
    }

    #[test]
    fn the_total_budget_stops_the_evaluation_and_is_reported_once() {
        // Each resource copies a 1 MiB value: 200 MiB in all, against a budget of 64 MiB.
        let mut y = format!(
            "version: 2023-04-20\nvariables:\n  big:\n    type: string\n    default: \"{}\"\nresources:\n",
            "b".repeat(1 << 20)
        );
        for i in 0..200 {
            y.push_str(&format!(
                "  r{i}:\n    type: sim/resource\n    spec:\n      payload: ${{variables.big}}\n"
            ));
        }
        let budget = 64 << 20;
        let c = evaluate(
            &y,
            Limits {
                max_eval_bytes: budget,
                ..Limits::default()
            },
        );
        let found = with_code(&c, &codes::EVALUATION_BUDGET);
        assert_eq!(found.len(), 1, "{:?}", c.diags.items);
        assert_eq!(c.diags.items.len(), 1, "{:?}", c.diags.items);
        assert!(
            found[0].message.contains("budget of 67108864 bytes"),
            "{}",
            found[0].message
        );
        // Evaluation stopped soon after the budget ran out.
        assert!(
            c.evaluation.resources.len() < 70,
            "{}",
            c.evaluation.resources.len()
        );
        assert!(c.evaluation.budget.used() < budget + (2 << 20));
        // The same blueprint within a budget large enough evaluates.
        let c = evaluate(&y, Limits::default());
        assert!(c.ready(), "{:?}", c.diags.items);
        assert_eq!(c.evaluation.resources.len(), 200);
    }

    #[test]
    fn an_expression_evaluated_later_charges_the_same_budget() {
        let y = format!(
            "version: 2023-04-20\nvariables:\n  big:\n    type: string\n    default: \"{}\"\n\
             resources:\n  r:\n    type: sim/resource\n    spec:\n      n: 1\n",
            "b".repeat(1 << 20)
        );
        let mut c = evaluate(
            &y,
            Limits {
                max_eval_bytes: 8 << 20,
                ..Limits::default()
            },
        );
        assert!(c.ready());
        let mut outcomes = Vec::new();
        for _ in 0..10 {
            outcomes.push(c.eval("${variables.big}", &ENV));
        }
        assert!(matches!(
            outcomes[0],
            crate::eval::console::Outcome::Value(_)
        ));
        assert_eq!(outcomes[9], crate::eval::console::Outcome::Failed);
        assert!(!with_code(&c, &codes::EVALUATION_BUDGET).is_empty());
    }

    fn small() -> Budget {
        Budget::new(Limits {
            max_value_bytes: 1000,
            ..Limits::default()
        })
    }

    fn refused(name: &str, args: Vec<Value>) -> LimitError {
        match call_in(name, args, Vec::new(), &ENV, &small()) {
            Err(e) => match e.limit {
                Some(limit) => limit,
                None => panic!("{name}: not a limit: {}", e.message),
            },
            Ok(v) => panic!("{name}: built {}", describe(&v)),
        }
    }

    #[test]
    fn functions_refuse_results_over_the_limit_before_building_them() {
        let s = |t: &str| Value::from(t);
        let long = "x".repeat(500);
        // Each of these would be a few KiB or more.
        for (name, args) in [
            ("replace", vec![s(&long), s("x"), s("yyyy")]),
            ("replace", vec![s(&long), s(""), s("yy")]),
            (
                "join",
                vec![Value::List(vec![s(&long), s(&long)]), s(&long)],
            ),
            ("split", vec![s(&long), s("")]),
            ("jsondecode", vec![s(&format!("[{}0]", "0,".repeat(300)))]),
            (
                "fromjson",
                vec![s(&format!("{{\"a\":[{}0]}}", "0,".repeat(300))), s("/a")],
            ),
            ("to_upper", vec![s(&"ab".repeat(600))]),
        ] {
            let e = refused(name, args);
            assert!(
                matches!(e, LimitError::ValueTooLarge { limit: 1000, .. }),
                "{name}: {e}"
            );
        }
        // Within the limit they work as before.
        let ok = call_in(
            "replace",
            vec![s("abc"), s("b"), s("xx")],
            Vec::new(),
            &ENV,
            &small(),
        );
        assert_eq!(ok, Ok(s("axxc")));
        let ok = call_in(
            "jsondecode",
            vec![s(r#"{"a":"[,,,]"}"#)],
            Vec::new(),
            &ENV,
            &small(),
        );
        assert!(ok.is_ok(), "{ok:?}");
    }

    #[test]
    fn higher_order_functions_check_what_they_build_as_they_go() {
        use crate::eval::value::Func;
        // Twenty one-letter strings, each padded to 100 letters: 20 small results, too many.
        let items = Value::List(vec![Value::from("a"); 20]);
        let pad = Value::Func(Func::Partial {
            name: "replace_g",
            args: vec![Value::from("a"), Value::from("z".repeat(100))],
        });
        let e = refused("map", vec![items, pad.clone()]);
        assert!(
            e.to_string()
                .starts_with("the array built so far (6 elements) would be"),
            "{e}"
        );
        let flat = Value::Func(Func::Compose(vec![
            Func::Core("list"),
            match pad {
                Value::Func(f) => f,
                _ => unreachable!(),
            },
        ]));
        let e = refused(
            "flatmap",
            vec![Value::List(vec![Value::from("a"); 20]), flat],
        );
        assert!(matches!(e, LimitError::ValueTooLarge { .. }), "{e}");
        let few = Value::List(vec![Value::from("a"); 5]);
        let wrap = Value::Func(Func::Core("list"));
        let nested = call_in("map", vec![few, wrap], Vec::new(), &ENV, &small());
        assert!(nested.is_ok(), "{nested:?}");
    }

    #[test]
    fn a_value_measures_its_text_and_a_cost_per_value() {
        assert_eq!(measure(&Value::Int(1)), VALUE_BYTES);
        assert_eq!(measure(&Value::from("abc")), VALUE_BYTES + 3);
        let list = Value::List(vec![Value::from("ab"), Value::Null]);
        assert_eq!(measure(&list), 3 * VALUE_BYTES + 2);
        let mut map = IndexMap::new();
        map.insert("key".to_owned(), Value::from("v"));
        assert_eq!(
            measure(&Value::Map(map)),
            2 * VALUE_BYTES + ENTRY_BYTES + 3 + 1
        );
    }

    #[test]
    fn measuring_stops_soon_after_the_cap() {
        let big = Value::List(vec![Value::from("x"); 100_000]);
        let capped = measure_capped(&big, 1000);
        assert!(capped > 1000 && capped < 1000 + 2 * VALUE_BYTES + 2);
    }

    #[test]
    fn the_budget_fails_once_used_up_and_stays_exhausted() {
        let budget = Budget::new(Limits {
            max_eval_bytes: 100,
            ..Limits::default()
        });
        assert!(budget.charge(60).is_ok());
        assert!(!budget.exhausted());
        assert_eq!(
            budget.charge(60),
            Err(LimitError::Budget {
                used: 120,
                limit: 100
            })
        );
        assert!(budget.exhausted());
        assert!(budget.charge(1).is_err());
    }

    #[test]
    fn a_value_over_the_size_limit_is_refused_naming_its_size() {
        let budget = Budget::new(Limits {
            max_value_bytes: 100,
            ..Limits::default()
        });
        let e = budget.produced(&Value::from("x".repeat(200))).unwrap_err();
        assert_eq!(e.code(), &codes::VALUE_TOO_LARGE);
        let text = e.to_string();
        assert!(text.starts_with("a string would be 272 bytes"), "{text}");
        assert!(text.contains("limit of 100 bytes"), "{text}");
        // Nothing was charged for the refused value.
        assert_eq!(budget.used(), 0);
    }
}
