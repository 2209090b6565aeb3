//! The pool's event log (ZFS's zevents, what `zpool events` shows): checksum and I/O errors,
//! device state changes, scrub start and finish.
//!
//! # Theory of operation
//! An in-memory ring of the newest [`MAX_EVENTS`] events, each numbered; readers ask for the
//! events after a number, so `events -f` follows by asking again. Like ZFS's, the log lives
//! as long as the pool is imported in this process (the daemon); the persistent record of
//! what happened is the pool history and the scrub's error log.

use std::collections::VecDeque;

use parking_lot::Mutex;
use serde::Serialize;

/// Events kept; older ones are dropped first.
pub const MAX_EVENTS: usize = 10_000;

/// One event.
#[derive(Debug, Clone, Serialize, PartialEq)]
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

    /// Forgets every event (`events -c`); numbering continues.
    pub fn clear(&self) {
        self.ring.lock().1.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
