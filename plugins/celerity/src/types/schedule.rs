//! `celerity/schedule` → `aws/events/rule` of the same name, targeting the
//! functions of the handlers it selects (docs/celerity/schedule.md).
//!
//! The rule selects its handlers' functions by a label the transform adds to
//! each of them (`celerity.schedule.<schedule>: "true"`), so the AWS
//! provider's rule → function link makes the target and the invoke
//! permission. The schedule's own selector is not carried over: it may also
//! select resources a rule cannot link to (a `celerity/config`).

use crate::model::{Input, Out, Resource, add_label, metadata_map, serves};
use serde_json::{Map, Value as Json, json};
use trellis_plugin_sdk::prelude::*;

pub const TYPE: &str = "celerity/schedule";
pub const DESCRIPTION: &str = "A schedule that triggers handlers";

/// The rule annotation the AWS provider's rule → function link reads for the
/// target's input (a JSON text).
pub const INPUT_ANNOTATION: &str = "aws.events.rule.input";

pub fn schema() -> Schema {
    Schema::object()
        .describe(DESCRIPTION)
        .field(
            "schedule",
            Field::string().required().describe(
                "An EventBridge rate or cron expression: `rate(5 minutes)`, `cron(0 12 * * ? *)`",
            ),
        )
        .field(
            "input",
            Field::any().describe("A static JSON value delivered to the handler on every trigger"),
        )
}

/// The label by which `schedule`'s rule selects its handlers' functions.
pub fn label(schedule: &str) -> String {
    format!("celerity.schedule.{schedule}")
}

const RATE_UNITS: &[(&str, &str)] = &[("minute", "minutes"), ("hour", "hours"), ("day", "days")];

/// Why a literal schedule expression is not one EventBridge accepts, if it is not.
pub(crate) fn expression_problem(expr: &str) -> Option<String> {
    if let Some(body) = expr.strip_prefix("rate(").and_then(|r| r.strip_suffix(')')) {
        let mut parts = body.split_whitespace();
        let (Some(n), Some(unit), None) = (parts.next(), parts.next(), parts.next()) else {
            return Some("a rate is `rate(<value> <unit>)`".into());
        };
        let Ok(n) = n.parse::<u64>() else {
            return Some(format!("`{n}` is not a positive whole number"));
        };
        if n == 0 {
            return Some("a rate is at least 1".into());
        }
        let Some((one, many)) = RATE_UNITS.iter().find(|(o, m)| unit == *o || unit == *m) else {
            return Some(format!("`{unit}` is not minute(s), hour(s) or day(s)"));
        };
        let want = if n == 1 { one } else { many };
        if unit != *want {
            return Some(format!("with {n} the unit is `{want}`"));
        }
        return None;
    }
    if let Some(body) = expr.strip_prefix("cron(").and_then(|r| r.strip_suffix(')')) {
        let fields = body.split_whitespace().count();
        if fields != 6 {
            return Some(format!(
                "a cron expression has 6 fields (minutes hours day-of-month month day-of-week year), not {fields}"
            ));
        }
        return None;
    }
    Some("not a `rate(...)` or `cron(...)` expression".into())
}

pub fn emit(_input: &Input, r: &Resource, out: &mut Out) {
    let spec = r.spec();
    let mut rule = Map::new();
    match spec.get("schedule") {
        Some(Json::String(expr)) => {
            if !expr.contains("${")
                && let Some(why) = expression_problem(expr)
            {
                out.error(
                    "invalid-value",
                    format!("schedule `{expr}` of `{}`: {why}", r.name),
                    r.spec_at("schedule"),
                )
                .hint =
                    Some("e.g. `rate(5 minutes)`, `rate(1 hour)` or `cron(0 12 * * ? *)`".into());
            }
            rule.insert("scheduleExpression".into(), json!(expr));
        }
        Some(_) => {
            out.error(
                "invalid-value",
                format!("`schedule` of `{}` must be a string", r.name),
                r.spec_at("schedule"),
            );
        }
        None => {
            out.error(
                "missing-field",
                format!("schedule `{}` needs `schedule`", r.name),
                r.at().field("spec"),
            );
        }
    }
    if r.selector().is_none() {
        out.error(
            "no-handler",
            format!(
                "schedule `{}` has no linkSelector, so it triggers no handler",
                r.name
            ),
            r.at(),
        )
        .hint = Some("select the handlers to run with `linkSelector.byLabel`".into());
    }
    let def = out.emit(&r.name, r, "aws/events/rule", Json::Object(rule));
    def.insert(
        "linkSelector".into(),
        json!({ "byLabel": { label(&r.name): "true" } }),
    );
    if let Some(input) = spec.get("input") {
        // A string is delivered as the JSON string it is, like any other value.
        metadata_map(def, "annotations").insert(INPUT_ANNOTATION.into(), json!(input.to_string()));
    }
}

/// Each schedule's handlers carry the label its rule selects.
pub fn finish(input: &Input, out: &mut Out) {
    for s in input.of_type(TYPE) {
        if s.selector().is_none() {
            continue;
        }
        let mut targets = 0;
        for h in input.selected_by(s) {
            if h.ty != crate::types::handler::TYPE || !serves(h, "celerity.handler.schedule") {
                continue;
            }
            targets += 1;
            let Some(def) = out.get_mut(&h.name) else {
                continue;
            };
            // A fresh key per schedule: no other label can hold it.
            let _ = add_label(def, &label(&s.name), &json!("true"));
        }
        if targets == 0 {
            out.error(
                "no-handler",
                format!("schedule `{}` selects no handler", s.name),
                s.at().field("linkSelector"),
            )
            .hint = Some(
                "give a celerity/handler the selector's labels (a handler with `celerity.handler.*` markers needs `celerity.handler.schedule: true`)"
                    .into(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transform_doc;

    #[test]
    fn expressions() {
        for ok in [
            "rate(1 minute)",
            "rate(5 minutes)",
            "rate(2 days)",
            "cron(0 12 * * ? *)",
        ] {
            assert_eq!(expression_problem(ok), None, "{ok}");
        }
        for bad in [
            "rate(1 minutes)",
            "rate(5 minute)",
            "rate(0 hours)",
            "rate(5 weeks)",
            "cron(0 12 * * ?)",
            "every day",
            "rate(x hours)",
        ] {
            assert!(expression_problem(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn a_schedule_becomes_a_rule_selecting_its_handler() {
        let out = transform_doc(json!({
            "version": "2023-04-20",
            "transform": "celerity-2023-04-20",
            "resources": {
                "nightly": {
                    "type": "celerity/schedule",
                    "linkSelector": {"byLabel": {"job": "cleanup"}},
                    "spec": {"schedule": "cron(0 3 * * ? *)", "input": {"task": "cleanup", "batchSize": 100}}
                },
                "hourly": {
                    "type": "celerity/schedule",
                    "linkSelector": {"byLabel": {"job": "report"}},
                    "spec": {"schedule": "rate(1 hours)"}
                },
                "cleanup": {
                    "type": "celerity/handler",
                    "metadata": {"labels": {"job": "cleanup"}},
                    "spec": {"codeLocation": "./jobs", "handler": "cleanup.handler", "runtime": "python3.12"}
                }
            }
        }));
        insta::assert_json_snapshot!("schedule_rule", out.blueprint["resources"]);
        insta::assert_json_snapshot!(
            "schedule_diagnostics",
            crate::model::diagnostic_lines(&out.diagnostics)
        );
    }
}
