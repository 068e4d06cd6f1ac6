//! The newest events of recently written instances, kept in memory so a watcher following an
//! operation reads what was just committed without a database read and a JSON parse per event
//! (serving a 10,000-resource destroy's watch was a tenth of the engine's CPU).
//!
//! It holds only what this store committed, in sequence order and without gaps: the writer
//! adds a batch's events after its commit and before it notifies watchers, so a watcher woken
//! by a notification finds them here. A read it cannot answer exactly (events older than it
//! holds, an instance it does not hold) goes to the database, which stays the record.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, PoisonError};

use crate::model::Event;

/// Events kept per instance: a watcher reads 512 at a time and is rarely further behind.
/// With `INSTANCES`, at most 16,384 events (a few MB) are held.
const PER_INSTANCE: usize = 2048;
/// Instances kept: the ones written to most recently.
const INSTANCES: usize = 8;

#[derive(Default)]
pub(crate) struct EventTail {
    inner: Mutex<Tails>,
}

#[derive(Default)]
struct Tails {
    by_instance: HashMap<String, Tail>,
    /// Bumped on every append: the instance with the smallest `touched` goes first.
    clock: u64,
}

struct Tail {
    events: VecDeque<Event>,
    touched: u64,
}

impl EventTail {
    /// Adds committed events of one instance (consecutive sequence numbers). A batch that does
    /// not follow what is held replaces it, so what is held never has a gap.
    pub(crate) fn extend(&self, instance_id: &str, events: Vec<Event>) {
        let Some(first) = events.first().map(|e| e.seq) else {
            return;
        };
        let mut tails = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        tails.clock += 1;
        let touched = tails.clock;
        if !tails.by_instance.contains_key(instance_id) && tails.by_instance.len() >= INSTANCES {
            let oldest = tails
                .by_instance
                .iter()
                .min_by_key(|(_, t)| t.touched)
                .map(|(id, _)| id.clone());
            if let Some(id) = oldest {
                tails.by_instance.remove(&id);
            }
        }
        let tail = tails
            .by_instance
            .entry(instance_id.to_owned())
            .or_insert_with(|| Tail {
                events: VecDeque::new(),
                touched,
            });
        tail.touched = touched;
        if tail.events.back().is_some_and(|e| e.seq + 1 != first) {
            tail.events.clear();
        }
        tail.events.extend(events);
        let excess = tail.events.len().saturating_sub(PER_INSTANCE);
        tail.events.drain(..excess);
    }

    /// Up to `limit` events after `after_seq`, if what is held answers exactly: `None` when
    /// the events right after `after_seq` are not held (read the database instead).
    pub(crate) fn since(
        &self,
        instance_id: &str,
        after_seq: u64,
        limit: usize,
    ) -> Option<Vec<Event>> {
        let tails = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let events = &tails.by_instance.get(instance_id)?.events;
        let (first, last) = (events.front()?.seq, events.back()?.seq);
        if after_seq.checked_add(1)? < first || after_seq > last {
            return None;
        }
        // Consecutive numbers: the event after `after_seq` is at a known index.
        let start = usize::try_from(after_seq + 1 - first).ok()?;
        Some(events.iter().skip(start).take(limit).cloned().collect())
    }

    /// Forgets an instance's events (its oldest were pruned from the database).
    pub(crate) fn forget(&self, instance_id: &str) {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .by_instance
            .remove(instance_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Timestamp;
    use serde_json::json;

    fn events(instance: &str, seqs: std::ops::RangeInclusive<u64>) -> Vec<Event> {
        seqs.map(|seq| Event {
            instance_id: instance.to_owned(),
            seq,
            kind: "k".into(),
            payload: json!({ "n": seq }),
            at: Timestamp::from_millis(0),
        })
        .collect()
    }

    fn seqs(v: Option<Vec<Event>>) -> Option<Vec<u64>> {
        v.map(|v| v.iter().map(|e| e.seq).collect())
    }

    #[test]
    fn answers_only_reads_it_holds_exactly() {
        let tail = EventTail::default();
        assert_eq!(seqs(tail.since("i", 0, 10)), None);
        tail.extend("i", events("i", 5..=8));
        assert_eq!(seqs(tail.since("i", 4, 10)), Some(vec![5, 6, 7, 8]));
        assert_eq!(seqs(tail.since("i", 6, 1)), Some(vec![7]));
        assert_eq!(seqs(tail.since("i", 8, 10)), Some(vec![]));
        // Before what is held, or past what was committed here: the database answers.
        assert_eq!(seqs(tail.since("i", 3, 10)), None);
        assert_eq!(seqs(tail.since("i", 9, 10)), None);
        assert_eq!(seqs(tail.since("other", 0, 10)), None);
    }

    #[test]
    fn a_gap_replaces_what_is_held_and_old_events_go() {
        let tail = EventTail::default();
        tail.extend("i", events("i", 1..=3));
        tail.extend("i", events("i", 10..=11));
        assert_eq!(seqs(tail.since("i", 3, 10)), None);
        assert_eq!(seqs(tail.since("i", 9, 10)), Some(vec![10, 11]));
        tail.extend("i", events("i", 12..=(11 + PER_INSTANCE as u64)));
        assert_eq!(seqs(tail.since("i", 11, 1)), Some(vec![12]));
        assert_eq!(seqs(tail.since("i", 10, 1)), None);
        tail.forget("i");
        assert_eq!(seqs(tail.since("i", 11, 1)), None);
    }

    #[test]
    fn the_least_recently_written_instance_goes_first() {
        let tail = EventTail::default();
        for i in 0..INSTANCES {
            tail.extend(&format!("i{i}"), events(&format!("i{i}"), 1..=1));
        }
        tail.extend("i0", events("i0", 2..=2));
        tail.extend("new", events("new", 1..=1));
        assert!(tail.since("i1", 0, 1).is_none());
        assert!(tail.since("i0", 0, 1).is_some());
        assert!(tail.since("new", 0, 1).is_some());
    }
}
