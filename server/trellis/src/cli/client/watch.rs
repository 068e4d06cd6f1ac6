//! Following an operation or an instance: the event stream, resumed after a dropped
//! connection, and the live progress line.

use std::fmt::Write as _;

use futures_util::FutureExt as _;

use super::*;

pub(crate) enum WatchTarget {
    Operation(String),
    Instance { name: String, follow: bool },
}

/// `op` as its terminal event (`operation.finished` or `operation.interrupted`) says it ended.
pub(crate) fn ended_as(op: &pb::Operation, last: &pb::Event) -> pb::Operation {
    let p = payload(last);
    let status = match (last.kind.as_str(), p.get("status").and_then(Json::as_str)) {
        ("operation.interrupted", _) => pb::OperationStatus::Interrupted,
        (_, Some("succeeded")) => pb::OperationStatus::Succeeded,
        (_, Some("cancelled")) => pb::OperationStatus::Cancelled,
        (_, Some("interrupted")) => pb::OperationStatus::Interrupted,
        _ => pb::OperationStatus::Failed,
    };
    pb::Operation {
        status: status as i32,
        error: p
            .get("error")
            .and_then(Json::as_str)
            .unwrap_or_default()
            .to_owned(),
        ..op.clone()
    }
}

/// What a watch does with what it receives.
pub(crate) trait WatchSink {
    fn event(&mut self, event: &pb::Event) -> Result<(), Failure>;
    /// Called on heartbeats and every second: time passes on the progress line.
    fn refresh(&mut self) {}
    /// Called when the stream has nothing more ready, and when the watch ends: what the sink
    /// holds back goes out now. A busy stream brings thousands of events a second; written
    /// one at a time they cost a system call each (and a terminal a redraw each).
    fn idle(&mut self) -> Result<(), Failure> {
        Ok(())
    }
}

/// Follows a watch stream until it ends (an operation's last event, or an
/// instance's events so far unless following), reconnecting after transport errors and
/// resuming after the last sequence number seen: the engine promises nothing is missed or
/// repeated. Returns an operation's terminal event when the stream ended on it.
pub(crate) async fn watch(
    client: &mut Client,
    target: &WatchTarget,
    after: u64,
    sink: &mut dyn WatchSink,
) -> Result<Option<pb::Event>, Failure> {
    let result = watch_stream(client, target, after, sink).await;
    let flushed = sink.idle();
    let last = result?;
    flushed.map(|()| last)
}

async fn watch_stream(
    client: &mut Client,
    target: &WatchTarget,
    after: u64,
    sink: &mut dyn WatchSink,
) -> Result<Option<pb::Event>, Failure> {
    let mut after = after;
    let mut attempt = 0u32;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        let opened = match target {
            WatchTarget::Operation(id) => {
                let request = pb::WatchOperationRequest {
                    operation_id: id.clone(),
                    after_seq: after,
                };
                client.api.watch_operation(request).await
            }
            WatchTarget::Instance { name, follow } => {
                let request = pb::WatchInstanceRequest {
                    instance: name.clone(),
                    after_seq: after,
                    follow: *follow,
                };
                client.api.watch_instance(request).await
            }
        };
        let broken = match opened {
            Ok(response) => {
                let mut stream = response.into_inner();
                let mut heard = Instant::now();
                loop {
                    // Only a stream with nothing ready is waited on; the sink writes out
                    // what it held back first.
                    let ready = stream.message().now_or_never();
                    let item = match ready {
                        Some(item) => item,
                        None => {
                            sink.idle()?;
                            tokio::select! {
                                item = stream.message() => item,
                                _ = tick.tick() => {
                                    if heard.elapsed() > WATCH_IDLE_TIMEOUT {
                                        break tonic::Status::unavailable(
                                            "no heartbeat from the engine",
                                        );
                                    }
                                    sink.refresh();
                                    continue;
                                }
                                _ = &mut ctrl_c => return interrupted(target),
                            }
                        }
                    };
                    match item {
                        Ok(Some(response)) => {
                            heard = Instant::now();
                            attempt = 0;
                            match response.item {
                                Some(pb::watch_response::Item::Event(event)) => {
                                    after = after.max(event.seq);
                                    sink.event(&event)?;
                                    if matches!(target, WatchTarget::Operation(_))
                                        && is_last_event(&event.kind)
                                    {
                                        return Ok(Some(event));
                                    }
                                }
                                Some(pb::watch_response::Item::Heartbeat(_)) | None => {
                                    sink.refresh()
                                }
                            }
                        }
                        Ok(None) => match target {
                            WatchTarget::Instance { follow: false, .. } => return Ok(None),
                            // An operation's stream ends after `operation.finished`; ending
                            // before it (the engine shutting down) means: look, then resume.
                            WatchTarget::Operation(id) => {
                                if operation_ended(client, id).await? {
                                    return Ok(None);
                                }
                                break tonic::Status::unavailable("the stream ended early");
                            }
                            WatchTarget::Instance { follow: true, .. } => {
                                break tonic::Status::unavailable("the stream ended");
                            }
                        },
                        Err(status) => break status,
                    }
                }
            }
            Err(status) => status,
        };
        if !retryable(broken.code()) || attempt >= WATCH_RETRIES {
            return Err(client.fail(broken));
        }
        // Backoff 0.25 s, 0.5 s, ... capped at 8 s.
        let delay = Duration::from_millis(250 << attempt.min(5));
        attempt += 1;
        sink.refresh();
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = &mut ctrl_c => return interrupted(target),
        }
    }
}

/// Ctrl-C: the normal end of `events --follow`; for an operation, a note that it goes on.
pub(crate) fn interrupted(target: &WatchTarget) -> Result<Option<pb::Event>, Failure> {
    match target {
        WatchTarget::Operation(id) => Err(Failure::new(
            130,
            "INTERRUPTED",
            format!(
                "stopped watching; operation {id} goes on in the engine (`trellis cancel {id}` \
                 stops it)"
            ),
        )),
        WatchTarget::Instance { .. } => Ok(None),
    }
}

async fn operation_ended(client: &mut Client, id: &str) -> Result<bool, Failure> {
    let request = pb::GetOperationRequest {
        operation_id: id.to_owned(),
    };
    match client.api.get_operation(request).await {
        Ok(r) => Ok(is_terminal(r.into_inner().status())),
        // Unreachable right now: the watch retry decides.
        Err(s) if retryable(s.code()) => Ok(false),
        Err(s) => Err(client.fail(s)),
    }
}

/// The event after which an operation's stream ends.
fn is_last_event(kind: &str) -> bool {
    matches!(kind, "operation.finished" | "operation.interrupted")
}

/// Errors a watch recovers from by reconnecting (the connection, not the request, failed).
pub(crate) fn retryable(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable
            | Code::Unknown
            | Code::Internal
            | Code::Cancelled
            | Code::DeadlineExceeded
    )
}

pub(crate) fn is_terminal(status: pb::OperationStatus) -> bool {
    use pb::OperationStatus as S;
    matches!(
        status,
        S::Succeeded | S::Failed | S::Cancelled | S::Interrupted
    )
}

/// `trellis events`: every event to stdout.
pub(crate) struct EventPrinter {
    pub(crate) format: OutputFormat,
    pub(crate) names: EventNames,
    /// Lines not written yet: they go out when the stream pauses (`--follow` is read live,
    /// through pipes too) or when [`HELD_BACK`] bytes are held.
    pending: String,
}

impl EventPrinter {
    pub(crate) fn new(format: OutputFormat) -> Self {
        Self {
            format,
            names: EventNames::default(),
            pending: String::new(),
        }
    }
}

/// How much a sink holds back before writing it out anyway.
pub(crate) const HELD_BACK: usize = 16 * 1024;

/// How often a terminal's status line is redrawn while events keep coming.
const REDRAW_EVERY: Duration = Duration::from_millis(100);

/// Writes `pending` to `out` in one go and empties it.
fn write_out(out: &mut impl Write, pending: &mut String) -> std::io::Result<()> {
    if pending.is_empty() {
        return Ok(());
    }
    let r = out.write_all(pending.as_bytes()).and_then(|()| out.flush());
    pending.clear();
    r
}

impl WatchSink for EventPrinter {
    fn event(&mut self, event: &pb::Event) -> Result<(), Failure> {
        let payload = payload(event);
        self.names.learn(&payload);
        match self.format {
            OutputFormat::Json => self
                .pending
                .push_str(&event_json(event, payload).to_string()),
            OutputFormat::Text => {
                let line = event_line(event, &payload, &self.names.types);
                let at = rfc3339(event.at_unix_ms, false);
                let _ = write!(self.pending, "{:>6}  {at}  {line}", event.seq);
            }
        }
        self.pending.push('\n');
        if self.pending.len() >= HELD_BACK {
            self.idle()?;
        }
        Ok(())
    }

    fn idle(&mut self) -> Result<(), Failure> {
        write_out(&mut std::io::stdout().lock(), &mut self.pending).map_err(Failure::output)
    }
}

/// Resource types seen in a change set or in earlier events: not every event repeats them.
#[derive(Default)]
pub(crate) struct EventNames {
    pub(crate) types: HashMap<String, String>,
}

impl EventNames {
    /// Learns from an event's payload.
    pub(crate) fn learn(&mut self, payload: &Json) {
        if let (Some(name), Some(ty)) = (resource_of(payload), str_field(payload, "type")) {
            self.types.insert(name.to_owned(), ty.to_owned());
        }
    }

    pub(crate) fn learn_types(&mut self, cs: &pb::ChangeSet) {
        for r in &cs.resources {
            self.types.insert(r.name.clone(), r.resource_type.clone());
        }
    }
}

/// Where a resource event leaves its resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Started,
    Done,
    Failed,
}

/// Classifies `resource.*` event kinds by their verb (docs/engine-api.md lists them), so new
/// kinds count without a list to keep in sync with the engine: `*_requested` starts a resource;
/// `created`, `accepted`, `forgotten`... finish it.
fn resource_phase(kind: &str) -> Option<Phase> {
    let verb = kind.strip_prefix("resource.")?;
    if verb.contains("fail") {
        Some(Phase::Failed)
    } else if verb.ends_with("_requested") || verb.ends_with("ing") || verb == "started" {
        Some(Phase::Started)
    } else if verb.ends_with("ed") || verb.ends_with("en") {
        Some(Phase::Done)
    } else {
        None
    }
}

/// The state of an operation as its events tell it: what the progress line shows.
pub(crate) struct Progress {
    pub(crate) verb: &'static str,
    pub(crate) instance: String,
    pub(crate) total: Option<usize>,
    pub(crate) active: HashSet<String>,
    pub(crate) done: HashSet<String>,
    pub(crate) failed: HashSet<String>,
    /// The newest progress message of a resource still in progress: (resource, text).
    pub(crate) latest: Option<(String, String)>,
    pub(crate) events: usize,
    pub(crate) names: EventNames,
}

impl Progress {
    pub(crate) fn new(kind: &str, instance: &str, total: Option<usize>) -> Self {
        let verb = match kind {
            "destroy" => "destroying",
            "reconcile" => "reconciling",
            "import" => "importing into",
            _ => "deploying",
        };
        Self {
            verb,
            instance: instance.to_owned(),
            total,
            active: HashSet::new(),
            done: HashSet::new(),
            failed: HashSet::new(),
            latest: None,
            events: 0,
            names: EventNames::default(),
        }
    }

    /// Takes an event into account; returns its line and whether it finished a resource.
    pub(crate) fn observe(&mut self, event: &pb::Event) -> (String, bool) {
        self.events += 1;
        let payload = payload(event);
        self.names.learn(&payload);
        // The engine may announce how many resources the operation touches.
        if event.kind == "operation.started"
            && let Some(n) = payload.get("total").and_then(Json::as_u64)
        {
            self.total = Some(n as usize);
        }
        if event.kind == "resource.progress"
            && let (Some(name), Some(text)) = (resource_of(&payload), progress_text(&payload))
        {
            self.latest = Some((name.to_owned(), text));
        }
        let mut finished = false;
        if let (Some(phase), Some(name)) = (resource_phase(&event.kind), resource_of(&payload)) {
            if matches!(phase, Phase::Done | Phase::Failed)
                && self.latest.as_ref().is_some_and(|(r, _)| r == name)
            {
                self.latest = None;
            }
            let name = name.to_owned();
            match phase {
                Phase::Started => {
                    self.done.remove(&name);
                    self.failed.remove(&name);
                    self.active.insert(name);
                }
                Phase::Done => {
                    self.active.remove(&name);
                    self.done.insert(name);
                    finished = true;
                }
                Phase::Failed => {
                    self.active.remove(&name);
                    self.failed.insert(name);
                    finished = true;
                }
            }
        }
        (event_line(event, &payload, &self.names.types), finished)
    }

    /// `deploying app: 12/40 resources done, 3 in progress [00:04]`.
    pub(crate) fn status_line(&self, elapsed: Duration) -> String {
        let done = match self.total {
            Some(total) => format!("{}/{total}", self.done.len()),
            None => self.done.len().to_string(),
        };
        let noun = if self.total.unwrap_or(self.done.len()) == 1 {
            "resource"
        } else {
            "resources"
        };
        let mut line = format!(
            "{} {}: {done} {noun} done, {} in progress",
            self.verb,
            self.instance,
            self.active.len()
        );
        if !self.failed.is_empty() {
            line.push_str(&format!(", {} failed", self.failed.len()));
        }
        line.push_str(&format!(" [{}]", clock(elapsed)));
        if let Some((resource, text)) = &self.latest {
            line.push_str(&format!(" {resource}: {text}"));
        }
        line
    }
}

/// Progress on stderr: a live status line on a terminal, one line per event otherwise.
pub(crate) struct LiveDisplay {
    pub(crate) progress: Progress,
    pub(crate) tty: bool,
    pub(crate) started: Instant,
    pub(crate) shown: bool,
    pub(crate) width: usize,
    /// Lines not written yet (see [`WatchSink::idle`]).
    pending: String,
    /// When the status line was last drawn: while events keep coming it is redrawn a few
    /// times a second rather than once per event.
    drawn: Instant,
    redraw_every: Duration,
    /// Standard error (another writer in tests).
    out: Box<dyn Write + Send>,
}

impl LiveDisplay {
    pub(crate) fn new(progress: Progress) -> Self {
        let tty =
            std::io::stderr().is_terminal() && std::env::var("TERM").map_or(true, |t| t != "dumb");
        let width = std::env::var("COLUMNS")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(80usize);
        Self {
            progress,
            tty,
            started: Instant::now(),
            shown: false,
            width,
            pending: String::new(),
            drawn: Instant::now(),
            redraw_every: REDRAW_EVERY,
            out: Box::new(std::io::stderr()),
        }
    }

    /// The display writing to `out` as if to a terminal (`tty`) or not, redrawing only
    /// when idle (tests see the same writes however slow the machine is).
    #[cfg(test)]
    pub(crate) fn writing_to(progress: Progress, tty: bool, out: Box<dyn Write + Send>) -> Self {
        Self {
            tty,
            out,
            redraw_every: Duration::MAX,
            ..Self::new(progress)
        }
    }

    /// Writes the lines held back and, on a terminal, the status line after them.
    fn flush_held(&mut self) {
        if self.tty {
            self.draw();
        } else {
            let _ = write_out(&mut self.out, &mut self.pending);
        }
    }

    /// The lines held back, then the status line in their place at the bottom.
    fn draw(&mut self) {
        // A line longer than the terminal wraps, and `\r` would then redraw only its tail.
        let line: String = self
            .progress
            .status_line(self.started.elapsed())
            .chars()
            .take(self.width.saturating_sub(1).max(1))
            .collect();
        let _ = write!(self.pending, "\r\x1b[2K{line}");
        let _ = write_out(&mut self.out, &mut self.pending);
        self.shown = true;
        self.drawn = Instant::now();
    }

    /// Writes what is held back and removes the status line.
    pub(crate) fn clear(&mut self) {
        if self.tty && self.shown {
            self.pending.push_str("\r\x1b[2K");
            self.shown = false;
        }
        let _ = write_out(&mut self.out, &mut self.pending);
    }
}

impl WatchSink for LiveDisplay {
    fn event(&mut self, event: &pb::Event) -> Result<(), Failure> {
        let (line, finished) = self.progress.observe(event);
        if self.tty {
            if finished {
                let _ = writeln!(self.pending, "\r\x1b[2K{line}");
            }
            if self.drawn.elapsed() >= self.redraw_every {
                self.flush_held();
            }
        } else {
            let _ = writeln!(self.pending, "{line}");
            if self.pending.len() >= HELD_BACK {
                self.flush_held();
            }
        }
        Ok(())
    }

    fn refresh(&mut self) {
        if self.tty {
            self.flush_held();
        }
    }

    fn idle(&mut self) -> Result<(), Failure> {
        self.flush_held();
        Ok(())
    }
}
