//! The pool's event log (ZFS's zevents, what `zpool events` shows): checksum and I/O errors,
//! device state changes, scrub start and finish.
//!
//! # Theory of operation
//! An in-memory ring of the newest [`MAX_EVENTS`] events, each numbered; readers ask for the
//! events after a number, so `events -f` follows by asking again. Unlike ZFS's, the newest
//! of them are kept with the pool (the object layer writes them into the meta object set
//! with each txg after they changed, and gives them back with `restore` at import), so
//! every process that opens the pool, and every restart, sees the same events.

use std::collections::VecDeque;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// Events kept; older ones are dropped first.
pub const MAX_EVENTS: usize = 10_000;

/// One event.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Event {
    /// 1, 2, ... in the order posted.
    pub seq: u64,
    /// Seconds since 1970, with fractions.
    pub time: f64,
    /// ZFS's class names: `ereport.fs.zfs.checksum`, `ereport.fs.zfs.io`,
    /// `resource.fs.zfs.statechange`, `sysevent.fs.zfs.scrub_start`, ...
    pub class: String,
    /// The device concerned, if one is.
    pub vdev: Option<String>,
    /// What else is known (offsets, states, figures), as `key=value` words.
    pub detail: String,
}

#[derive(Debug, Default)]
pub struct EventLog {
    ring: Mutex<(u64, VecDeque<Event>)>,
}

impl EventLog {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn post(&self, class: &str, vdev: Option<&str>, detail: String) {
        let time = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let mut ring = self.ring.lock();
        ring.0 += 1;
        let seq = ring.0;
        if ring.1.len() == MAX_EVENTS {
            ring.1.pop_front();
        }
        ring.1.push_back(Event {
            seq,
            time,
            class: class.to_string(),
            vdev: vdev.map(str::to_string),
            detail,
        });
    }

    /// The events numbered after `seq`, oldest first.
    pub fn since(&self, seq: u64) -> Vec<Event> {
        self.ring
            .lock()
            .1
            .iter()
            .filter(|e| e.seq > seq)
            .cloned()
            .collect()
    }

    /// Where the log stands: (the last number given, the events held). It changes with every
    /// post and every clear.
    pub fn mark(&self) -> (u64, usize) {
        let ring = self.ring.lock();
        (ring.0, ring.1.len())
    }

    /// The newest `count` events, oldest first.
    pub fn newest(&self, count: usize) -> Vec<Event> {
        let ring = self.ring.lock();
        ring.1
            .iter()
            .skip(ring.1.len().saturating_sub(count))
            .cloned()
            .collect()
    }

    /// Puts `older` (events kept from earlier imports, oldest first, numbered) before the
    /// events posted so far in this process, which are numbered on after them. Returns the
    /// mark the log had with `older` alone.
    /// A state change posted again by the import that says what the kept events already
    /// said of its device (every import sets each device's state afresh) is dropped.
    pub fn restore(&self, older: Vec<Event>, last_seq: u64) -> (u64, usize) {
        let mut ring = self.ring.lock();
        let base = older.iter().map(|e| e.seq).max().unwrap_or(0).max(last_seq);
        let restored = (base, older.len());
        let mut fresh: Vec<Event> = ring.1.drain(..).collect();
        fresh.retain(|e| !repeats_known_state(e, &older));
        for (i, e) in fresh.iter_mut().enumerate() {
            e.seq = base + 1 + i as u64;
        }
        ring.0 = base + fresh.len() as u64;
        ring.1.extend(older);
        ring.1.extend(fresh);
        let excess = ring.1.len().saturating_sub(MAX_EVENTS);
        ring.1.drain(..excess);
        restored
    }

    /// Forgets every event (`events -c`); numbering continues.
    pub fn clear(&self) {
        self.ring.lock().1.clear();
    }
}

const STATECHANGE: &str = "resource.fs.zfs.statechange";

/// The `to=STATE` word of a state change's detail.
fn new_state(e: &Event) -> Option<&str> {
    e.detail
        .split_whitespace()
        .find_map(|w| w.strip_prefix("to="))
}

/// Whether `e` is a state change of a device whose last state change in `older` already
/// went to the same state.
fn repeats_known_state(e: &Event, older: &[Event]) -> bool {
    if e.class != STATECHANGE || e.vdev.is_none() {
        return false;
    }
    older
        .iter()
        .rev()
        .find(|o| o.class == STATECHANGE && o.vdev == e.vdev)
        .is_some_and(|o| new_state(o).is_some() && new_state(o) == new_state(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restored_events_come_first_and_numbering_goes_on() {
        let log = EventLog::new();
        log.post(
            "resource.fs.zfs.statechange",
            Some("d1"),
            "state=UNAVAIL".into(),
        );
        let checksum = Event {
            seq: 41,
            time: 1.0,
            class: "ereport.fs.zfs.checksum".into(),
            vdev: Some("d0".into()),
            detail: String::new(),
        };
        // The import said again that d1 is UNAVAIL: not news.
        let known = Event {
            seq: 40,
            time: 0.5,
            class: STATECHANGE.into(),
            vdev: Some("d1".into()),
            detail: "from=ONLINE to=UNAVAIL reason=\"cannot open\"".into(),
        };
        log.post(STATECHANGE, Some("d1"), "to=UNAVAIL".into());
        let older = vec![known, checksum];
        assert_eq!(log.restore(older, 42), (42, 2));
        let all = log.since(0);
        assert_eq!(all.len(), 3);
        assert_eq!((all[0].seq, all[1].seq, all[2].seq), (40, 41, 43));
        assert_eq!(all[2].detail, "state=UNAVAIL");
        assert_eq!(log.mark(), (43, 3));
        assert_eq!(log.newest(1), vec![all[2].clone()]);
    }

    #[test]
    fn numbered_bounded_and_followable() {
        let log = EventLog::new();
        for i in 0..MAX_EVENTS + 5 {
            log.post("ereport.fs.zfs.io", Some("d0"), format!("n={i}"));
        }
        let all = log.since(0);
        assert_eq!(all.len(), MAX_EVENTS);
        assert_eq!(all[0].seq, 6);
        assert_eq!(all.last().unwrap().detail, format!("n={}", MAX_EVENTS + 4));
        let last = all.last().unwrap().seq;
        assert!(log.since(last).is_empty());
        log.post("sysevent.fs.zfs.scrub_start", None, String::new());
        assert_eq!(log.since(last).len(), 1);
        log.clear();
        assert!(log.since(0).is_empty());
        log.post("x", None, String::new());
        assert_eq!(log.since(0)[0].seq, last + 2);
    }
}
