//! Pool health kept with the pool: every device's READ/WRITE/CKSUM error counters and the
//! newest events, so that they survive export, import, restarts of the daemon and reboots
//! until `pool clear` (zpool keeps neither across a reboot), and every process that opens
//! the pool tells the same story. The data-error log is the scrub's (`scan.rs`), kept the
//! same way.
//!
//! # Persistence (docs/FORMAT.md §10)
//! In the meta object set, object 2 (items are at most `tree::MAX_INLINE` bytes):
//! - `(2, 24, 0)`: the event log's last number, u64;
//! - `(2, 24, 1 + i)`: up to [`COUNTERS_PER_ITEM`] records of 32 bytes: leaf guid, read,
//!   write and checksum errors, u64 each, by guid;
//! - `(2, 25, i)`: JSON arrays of events (`seq`, `time`, `class`, `vdev`, `detail`), oldest
//!   first, filled up to the item size: the newest [`KEPT_EVENTS`] of the event log.
//!
//! # When they are written
//! A [`Mark`] (every leaf's counters and the event log's last number and length) is taken
//! when the sync thread asks whether anything is dirty; when it differs from the mark last
//! written, the txg being synced writes both items. Counting an error or posting an event
//! therefore reaches the disk with the next txg (within the txg timeout), and a pool whose
//! health did not change writes nothing. Counts made while the pool was being imported
//! (before `load`) are added to the kept ones.

use parking_lot::Mutex;
use tank_vdev::Event;

use crate::scan::SCAN_OBJ;
use crate::store::{ObjectStore, META_OBJSET};
use crate::ObjectError;

pub const KIND_HEALTH: u8 = 24;
pub const KIND_EVENTS: u8 = 25;
/// Events kept with the pool (the event log in memory holds more while imported).
pub const KEPT_EVENTS: usize = 1_000;
/// Counter records per item.
pub const COUNTERS_PER_ITEM: usize = 64;

/// What the health looked like: counters per leaf (guid, read, write, cksum), the event
/// log's last number and length.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Mark {
    counters: Vec<(u64, u64, u64, u64)>,
    events: (u64, usize),
}

#[derive(Debug, Default)]
pub(crate) struct Health {
    /// The mark of what the meta object set holds.
    written: Mutex<Mark>,
}

fn mark_of(store: &ObjectStore) -> Mark {
    let pool = store.pool();
    let mut counters: Vec<(u64, u64, u64, u64)> = pool
        .leaf_list()
        .iter()
        .map(|(_, l)| {
            let s = l.stats.snapshot();
            (l.guid(), s.read_errors, s.write_errors, s.cksum_errors)
        })
        .collect();
    counters.sort_unstable();
    counters.dedup_by_key(|c| c.0);
    let events = pool.events.mark();
    // Only as many events as are kept count: a log past KEPT_EVENTS is written whole anyway.
    Mark {
        counters,
        events: (events.0, events.1.min(KEPT_EVENTS)),
    }
}

impl Health {
    /// Reads the kept counters and events and merges them into the pool's (at open).
    pub(crate) fn load(&self, store: &ObjectStore) -> Result<(), ObjectError> {
        let meta = store.objset(META_OBJSET)?;
        let corrupt = |what: &str, e: serde_json::Error| {
            ObjectError::Corrupt(format!("pool health ({what}): {e}"))
        };
        let mut last_seq = 0;
        let mut counters: Vec<(u64, u64, u64, u64)> = Vec::new();
        for (offset, raw) in meta.items(SCAN_OBJ, KIND_HEALTH, 0, u64::MAX, usize::MAX)? {
            let word =
                |b: &[u8], i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8"));
            if offset == 0 {
                if raw.len() != 8 {
                    return Err(ObjectError::Corrupt(format!(
                        "pool health: event number of {} bytes",
                        raw.len()
                    )));
                }
                last_seq = word(&raw, 0);
            } else if raw.len() % 32 != 0 {
                return Err(ObjectError::Corrupt(format!(
                    "pool health: counters item {offset} of {} bytes",
                    raw.len()
                )));
            } else {
                counters.extend(
                    raw.chunks_exact(32)
                        .map(|r| (word(r, 0), word(r, 1), word(r, 2), word(r, 3))),
                );
            }
        }
        let mut events: Vec<Event> = Vec::new();
        for (_, raw) in meta.items(SCAN_OBJ, KIND_EVENTS, 0, u64::MAX, usize::MAX)? {
            let chunk: Vec<Event> =
                serde_json::from_slice(&raw).map_err(|e| corrupt("events", e))?;
            events.extend(chunk);
        }
        let pool = store.pool();
        let mut disk_counters = Vec::new();
        for (_, leaf) in pool.leaf_list() {
            let (read, write, cksum) = counters
                .iter()
                .find(|c| c.0 == leaf.guid())
                .map_or((0, 0, 0), |c| (c.1, c.2, c.3));
            let add = |counter: &std::sync::atomic::AtomicU64, n: u64| {
                counter.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            };
            add(&leaf.stats.read_errors, read);
            add(&leaf.stats.write_errors, write);
            add(&leaf.stats.cksum_errors, cksum);
            disk_counters.push((leaf.guid(), read, write, cksum));
        }
        disk_counters.sort_unstable();
        disk_counters.dedup_by_key(|c| c.0);
        let restored = pool.events.restore(events, last_seq);
        *self.written.lock() = Mark {
            counters: disk_counters,
            events: restored,
        };
        Ok(())
    }

    pub(crate) fn is_dirty(&self, store: &ObjectStore) -> bool {
        *self.written.lock() != mark_of(store)
    }

    /// Writes the counters and the newest events into the meta object set when they
    /// changed (syncing context).
    pub(crate) fn sync(&self, store: &ObjectStore) -> Result<(), ObjectError> {
        let mark = mark_of(store);
        let mut written = self.written.lock();
        if *written == mark {
            return Ok(());
        }
        let meta = store.objset(META_OBJSET)?;
        let mut items: Vec<Vec<u8>> = vec![mark.events.0.to_le_bytes().to_vec()];
        for chunk in mark.counters.chunks(COUNTERS_PER_ITEM) {
            let mut raw = Vec::with_capacity(chunk.len() * 32);
            for c in chunk {
                for w in [c.0, c.1, c.2, c.3] {
                    raw.extend_from_slice(&w.to_le_bytes());
                }
            }
            items.push(raw);
        }
        replace_items(&meta, KIND_HEALTH, items)?;
        let events = store.pool().events.newest(KEPT_EVENTS);
        replace_items(&meta, KIND_EVENTS, pack_events(&events))?;
        *written = mark;
        Ok(())
    }
}

/// Writes `items` as `(2, kind, 0..)` and removes the ones after them.
fn replace_items(
    meta: &crate::ObjectSet,
    kind: u8,
    items: Vec<Vec<u8>>,
) -> Result<(), ObjectError> {
    let old = meta.items(SCAN_OBJ, kind, 0, u64::MAX, usize::MAX)?.len();
    let count = items.len();
    for (i, raw) in items.into_iter().enumerate() {
        meta.put_item_syncing(SCAN_OBJ, kind, i as u64, &raw)?;
    }
    for i in count..old {
        meta.remove_item_syncing(SCAN_OBJ, kind, i as u64)?;
    }
    Ok(())
}

/// Events as JSON arrays of at most `MAX_INLINE` bytes each; an event too long for an item
/// alone keeps the start of its detail.
fn pack_events(events: &[Event]) -> Vec<Vec<u8>> {
    let limit = crate::tree::MAX_INLINE;
    let mut items = Vec::new();
    let mut current: Vec<Vec<u8>> = Vec::new();
    let mut size = 2;
    for e in events {
        let mut json = serde_json::to_vec(e).expect("serializable");
        if json.len() + 2 > limit {
            let mut short = e.clone();
            let keep = short
                .detail
                .len()
                .saturating_sub(json.len() + 2 - limit + 16);
            let mut cut = keep;
            while !short.detail.is_char_boundary(cut) {
                cut -= 1;
            }
            short.detail.truncate(cut);
            short.detail.push_str(" ...");
            json = serde_json::to_vec(&short).expect("serializable");
        }
        if size + json.len() + 1 > limit && !current.is_empty() {
            items.push(join(&current));
            current.clear();
            size = 2;
        }
        size += json.len() + 1;
        current.push(json);
    }
    if !current.is_empty() {
        items.push(join(&current));
    }
    items
}

fn join(events: &[Vec<u8>]) -> Vec<u8> {
    let mut out = vec![b'['];
    for (i, e) in events.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(e);
    }
    out.push(b']');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_pack_into_items_that_fit_and_decode() {
        let events: Vec<Event> = (0..300)
            .map(|i| Event {
                seq: i + 1,
                time: i as f64,
                class: "ereport.fs.zfs.checksum".into(),
                vdev: Some(format!("/dev/disk{i}")),
                detail: if i == 7 {
                    "x".repeat(10_000)
                } else {
                    format!("offset={} size=4096", i * 4096)
                },
            })
            .collect();
        let items = pack_events(&events);
        assert!(items.len() > 1);
        let mut back = Vec::new();
        for raw in &items {
            assert!(raw.len() <= crate::tree::MAX_INLINE, "{}", raw.len());
            let chunk: Vec<Event> = serde_json::from_slice(raw).unwrap();
            back.extend(chunk);
        }
        assert_eq!(back.len(), events.len());
        assert!(back[7].detail.ends_with(" ..."));
        assert_eq!(back[8], events[8]);
        assert_eq!(back[299], events[299]);
    }
}
