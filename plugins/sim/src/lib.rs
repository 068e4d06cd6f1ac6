//! Provider `sim`: simulated resources with latency, failure and crash knobs.
//!
//! A load and chaos testing tool for the Trellis engine, never a stand-in
//! for a real provider: nothing is created anywhere, and failure counters
//! live in the plugin process only (a restart resets them). See README.md.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use trellis_plugin_sdk::prelude::*;

/// The resource type.
pub const RESOURCE_TYPE: &str = "sim/resource";

/// Longest latency a spec may ask for (one hour).
pub const MAX_LATENCY_MS: i64 = 3_600_000;

/// The exit code of a `crashOn` crash.
pub const CRASH_EXIT_CODE: i32 = 101;

/// The `sim` provider.
#[derive(Clone, Default)]
pub struct Sim {
    failures: Failures,
}

impl Sim {
    pub fn new() -> Sim {
        Sim::default()
    }
}

impl Provider for Sim {
    fn namespace(&self) -> &str {
        "sim"
    }

    fn version(&self) -> &str {
        env!("CARGO_PKG_VERSION")
    }

    /// A few quick retries, so `failTimes` up to 3 succeeds within one apply.
    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(1),
            multiplier: 2.0,
        }
    }

    fn resources(&self) -> Vec<Box<dyn Resource>> {
        vec![Box::new(SimResource {
            failures: self.failures.clone(),
        })]
    }

    fn functions(&self) -> Vec<Box<dyn Function>> {
        vec![Box::new(Echo)]
    }
}

/// An operation a knob can target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Create,
    Update,
    Destroy,
}

impl Op {
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Create => "create",
            Op::Update => "update",
            Op::Destroy => "destroy",
        }
    }

    fn parse(s: &str) -> Option<Op> {
        match s {
            "create" => Some(Op::Create),
            "update" => Some(Op::Update),
            "destroy" => Some(Op::Destroy),
            _ => None,
        }
    }
}

const OPS: [&str; 3] = ["create", "update", "destroy"];
const CLASSES: [&str; 6] = [
    "transient",
    "badInput",
    "conflict",
    "notFound",
    "permission",
    "internal",
];

/// Failures injected so far, per resource name and operation.
#[derive(Clone, Default)]
struct Failures(Arc<Mutex<HashMap<(String, Op), u64>>>);

impl Failures {
    /// Whether this call should fail: always without a limit, else while
    /// fewer than `times` failures were injected (and counts this one).
    fn should_fail(&self, name: &str, op: Op, times: Option<u64>) -> (bool, u64) {
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let count = map.entry((name.to_owned(), op)).or_insert(0);
        match times {
            Some(t) if *count >= t => (false, *count),
            _ => {
                *count += 1;
                (true, *count)
            }
        }
    }
}

/// The knobs of a spec.
struct Knobs {
    latency: Duration,
    fail_on: Option<Op>,
    fail_times: Option<u64>,
    fail_class: ErrorClass,
    fail_partial: bool,
    crash_on: Option<Op>,
    crash_after: Option<Op>,
}

fn op_field(spec: &Spec<'_>, key: &str) -> Result<Option<Op>> {
    match spec.opt_str(key)? {
        None => Ok(None),
        Some(s) => Op::parse(s)
            .map(Some)
            .ok_or_else(|| spec.error(key, format!("must be one of {}", OPS.join(", ")))),
    }
}

fn class_field(spec: &Spec<'_>) -> Result<ErrorClass> {
    Ok(match spec.opt_str("failClass")? {
        None | Some("transient") => ErrorClass::Transient,
        Some("badInput") => ErrorClass::BadInput,
        Some("conflict") => ErrorClass::Conflict,
        Some("notFound") => ErrorClass::NotFound,
        Some("permission") => ErrorClass::Permission,
        Some("internal") => ErrorClass::Internal,
        Some(_) => {
            return Err(spec.error(
                "failClass",
                format!("must be one of {}", CLASSES.join(", ")),
            ));
        }
    })
}

impl Knobs {
    fn read(spec: &Spec<'_>) -> Result<Knobs> {
        let latency = spec.opt_i64("latencyMs")?.unwrap_or(0);
        if !(0..=MAX_LATENCY_MS).contains(&latency) {
            return Err(spec.error(
                "latencyMs",
                format!("must be between 0 and {MAX_LATENCY_MS}"),
            ));
        }
        Ok(Knobs {
            latency: Duration::from_millis(latency.unsigned_abs()),
            fail_on: op_field(spec, "failOn")?,
            fail_times: spec.opt_u64("failTimes")?,
            fail_class: class_field(spec)?,
            fail_partial: spec.opt_bool("failPartial")?.unwrap_or(false),
            crash_on: op_field(spec, "crashOn")?,
            crash_after: op_field(spec, "crashAfter")?,
        })
    }
}

/// The id of a resource: stable per resource name (FNV-1a, 64 bits).
pub fn sim_id(name: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("sim-{h:016x}")
}

fn state_of(name: &str, spec: &Value) -> Value {
    let state = Value::map().with("id", sim_id(name));
    match spec.get("payload") {
        Some(p) => state.with("payload", p.clone()),
        None => state,
    }
}

struct SimResource {
    failures: Failures,
}

impl SimResource {
    /// Latency, then the crash and failure knobs, for `op` on `name`.
    async fn simulate(&self, ctx: &Context, name: &str, op: Op, spec: &Value) -> Result<()> {
        let knobs = Knobs::read(&Spec::new(spec))?;
        if !knobs.latency.is_zero() {
            ctx.progress(
                format!(
                    "{} {name}: waiting {} ms",
                    op.as_str(),
                    knobs.latency.as_millis()
                ),
                None,
            );
            ctx.sleep(knobs.latency).await?;
        }
        if knobs.crash_on == Some(op) {
            eprintln!(
                "sim: crashOn={} for resource `{name}`: exiting abruptly with code {CRASH_EXIT_CODE}",
                op.as_str()
            );
            std::process::exit(CRASH_EXIT_CODE);
        }
        if knobs.fail_on == Some(op) {
            let (fail, n) = self.failures.should_fail(name, op, knobs.fail_times);
            if fail {
                tracing::info!(
                    resource = name,
                    op = op.as_str(),
                    failure = n,
                    "injecting a failure"
                );
                let limit = knobs
                    .fail_times
                    .map_or("always".to_owned(), |t| format!("of {t}"));
                let err = PluginError::new(
                    knobs.fail_class,
                    format!(
                        "sim: injected {} failure {n} {limit} for `{name}`",
                        op.as_str()
                    ),
                );
                return Err(if knobs.fail_partial && op == Op::Create {
                    err.with_partial(sim_id(name), state_of(name, spec))
                } else {
                    err
                });
            }
        }
        Ok(())
    }
}

#[async_trait]
impl Resource for SimResource {
    fn type_name(&self) -> &str {
        RESOURCE_TYPE
    }

    fn description(&self) -> &str {
        "A simulated resource for load and chaos testing: nothing is created anywhere."
    }

    fn schema(&self) -> Schema {
        Schema::object()
            .describe(self.description())
            .field(
                "latencyMs",
                Field::integer()
                    .default(0)
                    .describe("Milliseconds every call on this resource takes (create, update, destroy, read)."),
            )
            .field(
                "failOn",
                Field::string()
                    .allowed(OPS)
                    .describe("The operation that fails (every time, or `failTimes` times)."),
            )
            .field(
                "failTimes",
                Field::integer().describe(
                    "Fail this many times, then succeed. Counted per resource name and operation in the \
                     plugin process: a restart resets the count. Without it, `failOn` fails every time.",
                ),
            )
            .field(
                "failClass",
                Field::string()
                    .allowed(CLASSES)
                    .default("transient")
                    .describe("The error class of injected failures."),
            )
            .field(
                "failPartial",
                Field::boolean()
                    .default(false)
                    .describe("A failed create reports the resource as partially created (partial state)."),
            )
            .field(
                "crashOn",
                Field::string()
                    .allowed(OPS)
                    .describe("The operation during which the plugin process exits abruptly (code 101)."),
            )
            .field(
                "crashAfter",
                Field::string().allowed(OPS).describe(
                    "The operation after which the plugin process exits abruptly (code 101): \
                     the operation happened (and is journaled) but is never answered.",
                ),
            )
            .field(
                "recreateOn",
                Field::array(Schema::string()).describe(
                    "Fields whose change replaces the resource, as the plugin's plan says \
                     (PlanResource): a provider-side `must_recreate`.",
                ),
            )
            .field(
                "planWarning",
                Field::string().describe("A warning the plugin's plan (PlanResource) reports about the change."),
            )
            .field("payload", Field::any().describe("Any value; echoed in the state."))
            .field("id", Field::string().computed().describe("Stable per resource name."))
    }

    /// The plan states what sim knows before it acts: the id (from the name) and the payload
    /// (where it is known), plus the `recreateOn` and `planWarning` knobs.
    fn supports_plan(&self) -> bool {
        true
    }

    async fn plan(&self, _ctx: &Context, req: &PlanRequest) -> Result<Plan> {
        let spec = req.spec();
        let recreate_paths = spec
            .opt_str_list("recreateOn")?
            .unwrap_or_default()
            .into_iter()
            .map(|field| AttrPath::root().field(field))
            .collect();
        let diagnostics = spec
            .opt_str("planWarning")?
            .map(|w| vec![Diagnostic::warning("sim.plan", w).at("planWarning")])
            .unwrap_or_default();
        Ok(Plan {
            recreate_paths,
            planned_state: state_of(&req.name, &req.desired),
            diagnostics,
        })
    }

    async fn validate(&self, _ctx: &Context, req: &ValidateRequest) -> Result<Vec<Diagnostic>> {
        let spec = req.spec();
        let mut out = Vec::new();
        let mut check = |r: Result<()>| {
            if let Err(e) = r {
                out.push(Diagnostic::from(e));
            }
        };
        let known = |k: &str| !spec.is_unknown(k);
        if known("latencyMs") {
            check(spec.opt_i64("latencyMs").and_then(|l| match l {
                Some(l) if !(0..=MAX_LATENCY_MS).contains(&l) => Err(spec.error(
                    "latencyMs",
                    format!("must be between 0 and {MAX_LATENCY_MS}"),
                )),
                _ => Ok(()),
            }));
        }
        if known("failTimes") {
            check(spec.opt_u64("failTimes").map(drop));
        }
        for key in ["failOn", "crashOn", "crashAfter"] {
            if known(key) {
                check(op_field(&spec, key).map(drop));
            }
        }
        if known("failClass") {
            check(class_field(&spec).map(drop));
        }
        if spec.get("failTimes").is_some() && spec.get("failOn").is_none() {
            out.push(
                Diagnostic::warning(
                    "sim.fail-times-without-fail-on",
                    "`failTimes` has no effect without `failOn`",
                )
                .at("failTimes"),
            );
        }
        if let Some(op) = spec.get("crashOn").and_then(Value::as_str) {
            out.push(
                Diagnostic::warning(
                    "sim.crash",
                    format!(
                        "the sim plugin process will exit during {op} of `{}`",
                        req.name
                    ),
                )
                .at("crashOn"),
            );
        }
        if let Some(op) = spec.get("crashAfter").and_then(Value::as_str) {
            out.push(
                Diagnostic::warning(
                    "sim.crash",
                    format!(
                        "the sim plugin process will exit after {op} of `{}`",
                        req.name
                    ),
                )
                .at("crashAfter"),
            );
        }
        Ok(out)
    }

    async fn create(&self, ctx: &Context, req: &CreateRequest) -> Result<Applied> {
        let key = ctx.idempotency_key();
        // Idempotency as a provider with request tokens has it: a create asked again with
        // the key of one that happened returns that one instead of acting twice.
        if !key.is_empty() && created_with(&req.name) == Some(key.to_owned()) {
            tracing::info!(resource = %req.name, "create already done with this key");
        } else {
            self.simulate(ctx, &req.name, Op::Create, &req.spec).await?;
            journal("created", &req.name, key);
            crash_after(&req.spec, Op::Create, &req.name)?;
        }
        Ok(Applied::new(
            sim_id(&req.name),
            state_of(&req.name, &req.spec),
        ))
    }

    async fn update(&self, ctx: &Context, req: &UpdateRequest) -> Result<Applied> {
        self.simulate(ctx, &req.name, Op::Update, &req.spec).await?;
        crash_after(&req.spec, Op::Update, &req.name)?;
        Ok(Applied::new(
            sim_id(&req.name),
            state_of(&req.name, &req.spec),
        ))
    }

    async fn destroy(&self, ctx: &Context, current: &ResourceState) -> Result<()> {
        self.simulate(ctx, &current.name, Op::Destroy, &current.spec)
            .await?;
        journal("destroyed", &current.name, ctx.idempotency_key());
        crash_after(&current.spec, Op::Destroy, &current.name)?;
        Ok(())
    }

    fn supports_read(&self) -> bool {
        true
    }

    /// Sim resources never drift: the state is what was applied. With a journal, a resource
    /// it does not show as created (a create that never ran, or one destroyed) is missing.
    async fn read(&self, ctx: &Context, current: &ResourceState) -> Result<Option<ReadState>> {
        let knobs = Knobs::read(&current.spec())?;
        ctx.sleep(knobs.latency).await?;
        if journaled(&current.name) == Some(false) {
            return Ok(None);
        }
        Ok(Some(ReadState {
            spec: current.spec.clone(),
            state: state_of(&current.name, &current.spec),
            external_id: Some(sim_id(&current.name)),
        }))
    }
}

/// With `crashAfter: <op>`, exits the process once `op` is done, before it is answered.
fn crash_after(spec: &Value, op: Op, name: &str) -> Result<()> {
    if Knobs::read(&Spec::new(spec))?.crash_after == Some(op) {
        eprintln!(
            "sim: crashAfter={} for resource `{name}`: exiting abruptly with code {CRASH_EXIT_CODE}",
            op.as_str()
        );
        std::process::exit(CRASH_EXIT_CODE);
    }
    Ok(())
}

/// Appends `created <name> <key>` or `destroyed <name> <key>` (the call's idempotency key,
/// when it has one) to the file named by `TRELLIS_SIM_JOURNAL`, when set: what the plugin did,
/// independent of the engine's state, so crash tests can check that the engine recorded
/// everything (see README.md).
fn journal(what: &str, name: &str, key: &str) {
    use std::io::Write;
    let Some(path) = std::env::var_os("TRELLIS_SIM_JOURNAL") else {
        return;
    };
    // One write per line with O_APPEND: lines from concurrent calls never interleave.
    let line = if key.is_empty() {
        format!("{what} {name}\n")
    } else {
        format!("{what} {name} {key}\n")
    };
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        eprintln!(
            "sim: cannot append to the journal {}: {e}",
            path.to_string_lossy()
        );
    }
}

/// Whether the journal shows `name` as existing (its last entry is `created`); `None` without
/// a journal. A journal that cannot be read shows nothing as existing.
fn journaled(name: &str) -> Option<bool> {
    let last = last_entry(name)?;
    Some(last.is_some_and(|(what, _)| what == "created"))
}

/// The key `name` was created with, when the journal shows it existing.
fn created_with(name: &str) -> Option<String> {
    match last_entry(name)?? {
        (what, key) if what == "created" => key,
        _ => None,
    }
}

/// The last journal entry of `name` (what, and the key when one was written); `None` without
/// a journal.
#[allow(clippy::type_complexity)]
fn last_entry(name: &str) -> Option<Option<(String, Option<String>)>> {
    let path = std::env::var_os("TRELLIS_SIM_JOURNAL")?;
    let text = std::fs::read_to_string(path).unwrap_or_default();
    Some(text.lines().rev().find_map(|l| {
        let mut words = l.split(' ');
        let (what, n) = (words.next()?, words.next()?);
        (n == name).then(|| (what.to_owned(), words.next().map(str::to_owned)))
    }))
}

/// `echo(value)`: returns its argument, for call round-trip benchmarks.
struct Echo;

#[async_trait]
impl Function for Echo {
    fn signature(&self) -> Signature {
        Signature::new("echo")
            .describe("Returns its argument unchanged (for call round-trip benchmarks).")
            .param(Param::new("value", SchemaType::Any))
            .returns(SchemaType::Any)
    }

    async fn call(&self, _ctx: &Context, mut args: Vec<Value>) -> Result<Value> {
        Ok(if args.is_empty() {
            Value::Null
        } else {
            args.swap_remove(0)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_and_distinct() {
        assert_eq!(sim_id("a"), sim_id("a"));
        assert_ne!(sim_id("a"), sim_id("b"));
        assert_eq!(sim_id(""), "sim-cbf29ce484222325");
        assert_eq!(sim_id("a").len(), 20);
    }

    #[test]
    fn failures_count_per_name_and_operation() {
        let f = Failures::default();
        assert_eq!(f.should_fail("a", Op::Create, Some(2)), (true, 1));
        assert_eq!(f.should_fail("a", Op::Create, Some(2)), (true, 2));
        assert_eq!(f.should_fail("a", Op::Create, Some(2)), (false, 2));
        assert_eq!(f.should_fail("a", Op::Update, Some(1)), (true, 1));
        assert_eq!(f.should_fail("b", Op::Create, Some(1)), (true, 1));
        assert_eq!(f.should_fail("c", Op::Create, Some(0)), (false, 0));
        assert!(f.should_fail("d", Op::Destroy, None).0);
        assert!(f.should_fail("d", Op::Destroy, None).0);
    }
}
