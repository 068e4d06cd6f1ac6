//! In-process "new events" notification, so watchers wait instead of polling.
//!
//! One `tokio::sync::watch` channel per instance carries the newest sequence number. It only
//! says "look again": the events themselves are always read from the store with
//! `events_since`, which is what makes a watch resumable and gap-free. This reaches watchers in
//! the same process only; with several engine replicas the PostgreSQL store will feed the same
//! [`Notifier`] from `LISTEN`/`NOTIFY`.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::watch;

#[derive(Debug, Default)]
pub struct Notifier {
    channels: Mutex<HashMap<String, watch::Sender<u64>>>,
}

impl Notifier {
    /// Subscribe before reading with `events_since`: a commit that lands after the subscription
    /// wakes [`EventSubscription::changed`] even if the read already saw nothing.
    pub fn subscribe(&self, instance_id: &str) -> EventSubscription {
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        let sender = channels
            .entry(instance_id.to_owned())
            .or_insert_with(|| watch::channel(0).0);
        EventSubscription {
            rx: sender.subscribe(),
        }
    }

    /// Called after a commit that appended events up to `last_seq`.
    pub fn notify(&self, instance_id: &str, last_seq: u64) {
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(sender) = channels.get(instance_id)
            && sender.send(last_seq).is_err()
        {
            // Nobody listens any more: drop the channel so the map does not grow forever.
            channels.remove(instance_id);
        }
    }
}

/// Wakes when an instance gets new events.
#[derive(Debug)]
pub struct EventSubscription {
    rx: watch::Receiver<u64>,
}

impl EventSubscription {
    /// Waits for the next commit with events on the instance. Returns the newest sequence
    /// number, or `None` when the store is gone.
    pub async fn changed(&mut self) -> Option<u64> {
        self.rx.changed().await.ok()?;
        Some(*self.rx.borrow_and_update())
    }
}
