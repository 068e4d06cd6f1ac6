//! `--wait[=DURATION]` of deploy and destroy: wait for the operation holding the instance
//! instead of failing at once, and say so while waiting.

use std::time::{Duration, Instant};

use trellis_proto::engine::v1 as pb;

use super::Api;

/// How long `--wait` may wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitFor {
    /// Bare `--wait`: until its turn.
    Forever,
    Up(Duration),
}

/// What bare `--wait` stands for (clap's missing value).
pub(super) const FOREVER: &str = "forever";

/// `--wait` values: a whole number with an optional unit, `ms`, `s` (the default), `m` or `h`,
/// as the engine's own duration settings.
pub(super) fn parse(text: &str) -> Result<WaitFor, String> {
    let text = text.trim();
    if text == FOREVER {
        return Ok(WaitFor::Forever);
    }
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let invalid = || format!("`{text}` is not a duration (like 90s, 10m, 1h)");
    let n: u64 = digits.parse().map_err(|_| invalid())?;
    let factor: u64 = match unit {
        "ms" => return Ok(WaitFor::Up(Duration::from_millis(n))),
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        _ => return Err(invalid()),
    };
    let secs = n
        .checked_mul(factor)
        .ok_or_else(|| format!("`{text}` is too long a duration"))?;
    if secs == 0 {
        return Err("--wait=0 would not wait: leave --wait out instead".to_owned());
    }
    Ok(WaitFor::Up(Duration::from_secs(secs)))
}

/// What is left of `wait` after `since`; `None` when it is used up.
pub(super) fn remaining(wait: WaitFor, since: Instant) -> Option<pb::Wait> {
    match wait {
        WaitFor::Forever => Some(pb::Wait { timeout_ms: 0 }),
        WaitFor::Up(d) => {
            let left = d.checked_sub(since.elapsed())?;
            let ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
            (ms > 0).then_some(pb::Wait { timeout_ms: ms })
        }
    }
}

/// While a waiting request has not started: tells, once, where it stands in the instance's
/// queue (`instance` is learnt from the change set when not known). Never returns before it
/// printed; the caller drops it when the request answers.
pub(super) async fn announce(
    mut api: Api,
    instance: Option<String>,
    change_set_id: Option<String>,
    request_id: String,
) {
    // A request that starts at once (the instance was free) says nothing.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let instance = match (instance, change_set_id) {
        (Some(name), _) => name,
        (None, Some(id)) => match api
            .get_change_set(pb::GetChangeSetRequest { change_set_id: id })
            .await
        {
            Ok(r) => r.into_inner().instance,
            Err(_) => return std::future::pending().await,
        },
        (None, None) => return std::future::pending().await,
    };
    let request = pb::GetInstanceRequest {
        instance: instance.clone(),
        reveal_secrets: false,
    };
    if let Ok(r) = api.get_instance(request).await {
        let inst = r.into_inner();
        if let Some(i) = inst.queued.iter().position(|q| q.request_id == request_id) {
            let running = api
                .list_operations(pb::ListOperationsRequest {
                    instance: instance.clone(),
                })
                .await
                .ok()
                .and_then(|r| {
                    r.into_inner()
                        .operations
                        .into_iter()
                        .rev()
                        .find(|o| o.status() == pb::OperationStatus::Running)
                })
                .map_or_else(String::new, |o| format!(" behind operation {}", o.id));
            eprintln!(
                "waiting for instance {instance}{running} (position {} of {} in the queue)",
                i + 1,
                inst.queued.len()
            );
        }
    }
    std::future::pending().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_values() {
        assert_eq!(parse("forever"), Ok(WaitFor::Forever));
        assert_eq!(parse("90"), Ok(WaitFor::Up(Duration::from_secs(90))));
        assert_eq!(parse("90s"), Ok(WaitFor::Up(Duration::from_secs(90))));
        assert_eq!(parse("10m"), Ok(WaitFor::Up(Duration::from_secs(600))));
        assert_eq!(parse("1h"), Ok(WaitFor::Up(Duration::from_secs(3600))));
        assert_eq!(parse("250ms"), Ok(WaitFor::Up(Duration::from_millis(250))));
        assert!(parse("10 minutes").is_err());
        assert!(parse("m").is_err());
        assert!(parse("0").is_err());
        assert!(parse("99999999999999999h").is_err());
    }

    #[test]
    fn what_is_left() {
        let now = Instant::now();
        assert_eq!(
            remaining(WaitFor::Forever, now),
            Some(pb::Wait { timeout_ms: 0 })
        );
        let left = remaining(WaitFor::Up(Duration::from_secs(3600)), now).unwrap();
        assert!(left.timeout_ms > 0 && left.timeout_ms <= 3_600_000);
        assert_eq!(remaining(WaitFor::Up(Duration::ZERO), now), None);
    }
}
