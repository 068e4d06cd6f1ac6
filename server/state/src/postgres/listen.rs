//! Notifications between replicas: every commit that appends events, and every cancel request,
//! sends a `NOTIFY` on the store's channel in its own transaction (so it is delivered exactly
//! when the commit is visible); each store keeps one connection `LISTEN`ing on that channel
//! and feeds what arrives into its in-process [`Notifier`]. The notifications only say "look
//! again": events are read from the tables, so a lost notification delays a watcher, never
//! makes it skip an event. When the listening connection is lost, every watcher is woken once
//! it is back (notifications sent meanwhile are gone), and the engine's heartbeat still sees
//! cancel requests.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_postgres::{AsyncMessage, Config, NoTls, Notification};

use crate::error::{Result, StateError};
use crate::notify::Notifier;

/// How often the listening connection is checked: a connection whose server vanished
/// without closing it would otherwise go unnoticed until TCP gives up.
const PING_EVERY: Duration = Duration::from_secs(15);
const RECONNECT_MIN: Duration = Duration::from_millis(250);
const RECONNECT_MAX: Duration = Duration::from_secs(10);

/// The channel of the store's schema: stores in other schemas of the same database (tests, or
/// two deployments sharing a server) do not hear each other. At most 63 bytes, like any
/// PostgreSQL identifier.
pub(super) fn channel(schema: Option<&str>) -> String {
    match schema {
        None => "trellis_state".to_owned(),
        Some(schema) => format!(
            "trellis_state_{}",
            &trellis_ids::digest(&[schema.as_bytes()])[..24]
        ),
    }
}

/// A notification's payload: new events up to a sequence number, or a cancel request.
#[derive(Debug, PartialEq)]
pub(super) enum Message<'a> {
    Events { instance_id: &'a str, last_seq: u64 },
    Cancel { operation_id: &'a str },
}

impl Message<'_> {
    pub(super) fn encode(&self) -> String {
        match self {
            Message::Events {
                instance_id,
                last_seq,
            } => format!("e {instance_id} {last_seq}"),
            Message::Cancel { operation_id } => format!("c {operation_id}"),
        }
    }

    pub(super) fn decode(payload: &str) -> Option<Message<'_>> {
        let mut parts = payload.split(' ');
        let message = match (parts.next()?, parts.next()?) {
            ("e", instance_id) => Message::Events {
                instance_id,
                last_seq: parts.next()?.parse().ok()?,
            },
            ("c", operation_id) => Message::Cancel { operation_id },
            _ => return None,
        };
        parts.next().is_none().then_some(message)
    }
}

/// Keeps a connection listening until dropped.
pub(super) struct Listener {
    _stop: oneshot::Sender<()>,
}

/// Connects and starts listening; returns once the first `LISTEN` is in place, so that a
/// watcher subscribing after the store opened hears every later commit.
pub(super) async fn start(
    config: Config,
    target: String,
    channel: String,
    notifier: Arc<Notifier>,
) -> Result<Listener> {
    let first = listen(&config, &channel)
        .await
        .map_err(|e| StateError::Db(format!("cannot LISTEN on PostgreSQL at {target}: {e}")))?;
    let (stop_tx, mut stop) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let mut conn = Some(first);
        let mut wait = RECONNECT_MIN;
        loop {
            let (client, mut messages) = match conn.take() {
                Some(c) => c,
                None => {
                    tokio::select! {
                        _ = &mut stop => return,
                        _ = tokio::time::sleep(wait) => {}
                    }
                    match listen(&config, &channel).await {
                        Ok(c) => {
                            tracing::info!(postgres = %target, "listening for other replicas' commits again");
                            // Whatever was sent while no one listened is lost: everyone looks.
                            notifier.notify_all();
                            wait = RECONNECT_MIN;
                            c
                        }
                        Err(e) => {
                            tracing::warn!(postgres = %target, error = %e, retry_in = ?wait, "cannot listen for other replicas' commits");
                            wait = (wait * 2).min(RECONNECT_MAX);
                            continue;
                        }
                    }
                }
            };
            let mut ping = tokio::time::interval(PING_EVERY);
            ping.tick().await;
            let lost = loop {
                tokio::select! {
                    _ = &mut stop => return,
                    m = messages.recv() => match m {
                        Some(n) => deliver(&notifier, &n),
                        None => break "the connection closed".to_owned(),
                    },
                    _ = ping.tick() => {
                        match tokio::time::timeout(PING_EVERY, client.simple_query("SELECT 1")).await {
                            Ok(Ok(_)) => {}
                            Ok(Err(e)) => break e.to_string(),
                            Err(_) => break "no answer to a ping".to_owned(),
                        }
                    }
                }
            };
            tracing::warn!(postgres = %target, error = %lost, "lost the connection listening for other replicas' commits; reconnecting");
            // Until it is back, a watcher here would wait for a wake-up that is not coming.
            notifier.notify_all();
        }
    });
    Ok(Listener { _stop: stop_tx })
}

fn deliver(notifier: &Notifier, n: &Notification) {
    match Message::decode(n.payload()) {
        Some(Message::Events {
            instance_id,
            last_seq,
        }) => notifier.notify(instance_id, last_seq),
        Some(Message::Cancel { operation_id }) => notifier.cancel(operation_id),
        None => {
            tracing::warn!(
                channel = n.channel(),
                payload = n.payload(),
                "ignoring a notification this engine does not understand"
            )
        }
    }
}

/// A connection with `LISTEN` in place, and the notifications it receives.
async fn listen(
    config: &Config,
    channel: &str,
) -> std::result::Result<
    (
        tokio_postgres::Client,
        mpsc::UnboundedReceiver<Notification>,
    ),
    String,
> {
    let (client, mut connection) = config.connect(NoTls).await.map_err(|e| e.to_string())?;
    let (tx, rx) = mpsc::unbounded_channel();
    // The connection does the socket I/O; its messages carry the notifications. It ends (and
    // closes `rx`) when the socket fails or the client is dropped.
    tokio::spawn(async move {
        while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    if tx.send(n).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "PostgreSQL listening connection failed");
                    return;
                }
            }
        }
    });
    client
        .batch_execute(&format!("LISTEN {}", super::quote_ident(channel)))
        .await
        .map_err(|e| e.to_string())?;
    Ok((client, rx))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_junk_is_refused() {
        for m in [
            Message::Events {
                instance_id: "inst-1",
                last_seq: 42,
            },
            Message::Cancel {
                operation_id: "op-9",
            },
        ] {
            assert_eq!(Message::decode(&m.encode()), Some(m));
        }
        for junk in ["", "e", "e i", "e i x", "e i 1 2", "x y", "c a b"] {
            assert_eq!(Message::decode(junk), None, "{junk:?}");
        }
    }

    #[test]
    fn channels_are_per_schema_and_valid_identifiers() {
        let a = channel(Some("a"));
        assert_ne!(a, channel(Some("b")));
        assert_ne!(a, channel(None));
        assert!(a.len() <= 63);
    }
}
