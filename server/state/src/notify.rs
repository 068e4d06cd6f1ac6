//! "Something changed" notifications, so watchers and running operations wait instead of
//! polling.
//!
//! One `tokio::sync::watch` channel per instance carries the newest sequence number. It only
//! says "look again": the events themselves are always read from the store with
//! `events_since`, which is what makes a watch resumable and gap-free. A broadcast channel
//! carries the ids of operations someone asked to cancel. The SQLite store feeds both from its
//! own commits; the PostgreSQL store also from `LISTEN`, so they reach every replica.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::{broadcast, watch};

/// Cancel requests not yet taken by a slow receiver; older ones are dropped (a lagging
/// receiver is told so, and the heartbeat's check catches what it missed).
const CANCEL_BACKLOG: usize = 256;

#[derive(Debug)]
pub struct Notifier {
    channels: Mutex<HashMap<String, watch::Sender<u64>>>,
    cancels: broadcast::Sender<String>,
}

impl Default for Notifier {
    fn default() -> Self {
        Notifier {
            channels: Mutex::default(),
            cancels: broadcast::channel(CANCEL_BACKLOG).0,
        }
    }
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
        if let Some(sender) = channels.get(instance_id) {
            // Notifications from several sources (this process, other replicas) may arrive
            // out of order: the newest number wins, and every one still wakes the watchers.
            let newest = last_seq.max(*sender.borrow());
            if sender.send(newest).is_err() {
                // Nobody listens any more: drop the channel so the map does not grow forever.
                channels.remove(instance_id);
            }
        }
    }

    /// Wakes every watcher: used when notifications may have been missed (the connection
    /// that delivers them was lost), so each reads the store again.
    pub fn notify_all(&self) {
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        channels.retain(|_, sender| {
            let newest = *sender.borrow();
            sender.send(newest).is_ok()
        });
    }

    /// Tells this process's engine that `operation_id` is to be cancelled.
    pub fn cancel(&self, operation_id: &str) {
        // No receiver is fine: no engine runs operations on this store in this process.
        let _ = self.cancels.send(operation_id.to_owned());
    }

    pub fn cancel_requests(&self) -> broadcast::Receiver<String> {
        self.cancels.subscribe()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_older_number_still_wakes_but_does_not_go_back() {
        let n = Notifier::default();
        let mut sub = n.subscribe("i");
        n.notify("i", 5);
        assert_eq!(sub.changed().await, Some(5));
        n.notify("i", 3);
        assert_eq!(sub.changed().await, Some(5));
        n.notify_all();
        assert_eq!(sub.changed().await, Some(5));
    }

    #[tokio::test]
    async fn cancels_reach_every_receiver() {
        let n = Notifier::default();
        let (mut a, mut b) = (n.cancel_requests(), n.cancel_requests());
        n.cancel("op-1");
        assert_eq!(a.recv().await.unwrap(), "op-1");
        assert_eq!(b.recv().await.unwrap(), "op-1");
    }
}
