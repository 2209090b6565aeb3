//! Transaction groups: open → quiescing → syncing, with dirty-data accounting and throttling.
//!
//! # Theory of operation
//! A transaction holds the `gate` for reading while it changes in-memory state, and is
//! charged to the open txg. To quiesce, the sync thread takes the gate for writing, which
//! waits for every running transaction to finish (the quiescing state), advances the open txg
//! and freezes the old one; then it releases the gate and syncs the frozen txg while new
//! transactions fill the next one. At most one txg syncs at a time.
//!
//! Dirty data is bounded: a sync starts once the open txg holds `dirty_sync` bytes (or after
//! `timeout`), writers are delayed progressively above 60 % of `dirty_max` and wait at
//! `dirty_max` (invariant 10: writers are throttled, the process is never killed).
//! `dirty_max` is a tenth of memory (64 MiB to 1 GiB), memory being the container's limit
//! where that is less than the host's ([`physical_memory`]).
//!
//! # Concurrency
//! `inner` (a mutex) guards the counters. Two condition variables wait on it:
//! - `sync_cv` wakes the sync thread, and only it: a sync was asked for (a waiter for a txg, a
//!   writer at `dirty_max`, the open txg crossing `dirty_sync`), or the pool is closing;
//! - `cv` wakes those waiting for a sync to finish (`synced`, the dirty totals going down, a
//!   failure): waiters for a txg and writers held by the throttle.
//!
//! They are apart so that asking for a sync never wakes the other waiters. When they were one,
//! each writer held at `dirty_max` woke every other one each time it asked for a sync, and
//! each of those asked again: under a steady stream of writes the writers spent the sync's
//! whole duration waking each other.

use std::time::Duration;

use parking_lot::{Condvar, Mutex, RwLock, RwLockReadGuard};

#[derive(Debug, Clone, Copy)]
pub struct TxgTunables {
    /// Dirty bytes (open + syncing) at which writers wait.
    pub dirty_max: u64,
    /// Dirty bytes in the open txg that start a sync.
    pub dirty_sync: u64,
    /// Longest time a txg stays open while dirty.
    pub timeout: Duration,
}

impl Default for TxgTunables {
    fn default() -> Self {
        // ZFS: zfs_dirty_data_max = 10 % of RAM capped at 4 GiB; we cap lower, since our
        // sync path holds the dirty data in memory until written. RAM is the container's
        // memory limit where that is less than the host's, as the ARC's budget takes it: a
        // tenth of a 64 GiB host is half of a 2 GiB container.
        let dirty_max = (physical_memory() / 10).clamp(64 << 20, 1 << 30);
        Self {
            dirty_max,
            dirty_sync: dirty_max / 4,
            timeout: Duration::from_secs(5),
        }
    }
}

/// Physical memory of this host or container (the smaller of /proc/meminfo's MemTotal and
/// the cgroup's memory.max), or 4 GiB when neither can be read.
pub fn physical_memory() -> u64 {
    memory_limit(meminfo_bytes("MemTotal"), cgroup_bytes("memory.max"))
}

/// A field of /proc/meminfo (such as `MemTotal` or `MemAvailable`), in bytes.
pub fn meminfo_bytes(field: &str) -> Option<u64> {
    std::fs::read_to_string("/proc/meminfo")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map(|kib| kib.saturating_mul(1024))
}

/// A byte count of this process's cgroup (`memory.max`, `memory.current`); None where it is
/// not there or says "max".
pub fn cgroup_bytes(file: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/sys/fs/cgroup/{file}"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The smaller of the host's memory and the cgroup's limit, whichever are known ("max", no
/// limit, reads as unknown); 4 GiB when neither is.
fn memory_limit(meminfo: Option<u64>, cgroup: Option<u64>) -> u64 {
    match (meminfo, cgroup) {
        (Some(m), Some(c)) => m.min(c),
        (Some(m), None) => m,
        (None, Some(c)) => c,
        (None, None) => 4 << 30,
    }
}

/// Why [`TxgManager::begin_if`] did not enter.
#[derive(Debug)]
pub(crate) enum Refused {
    /// The pool failed (the reason).
    Failed(String),
    /// `room` did not grant the charge.
    NoRoom,
}

#[derive(Debug, Default)]
pub(crate) struct TxgInner {
    /// Writers delayed between 60 % and 100 % of `dirty_max` (ZFS's `dmu_tx_delay`).
    pub throttle_delays: u64,
    /// Times a writer went to sleep at `dirty_max` (ZFS's `dmu_tx_dirty_over_max`).
    pub throttle_waits: u64,
    /// Transactions running (entered and not yet dropped).
    pub active: u64,
    /// The largest charge one transaction made beyond what it was admitted with (a write
    /// into part of its first and last blocks holds both whole): the room the space check
    /// keeps for each running transaction. Starts at two 128 KiB blocks.
    pub max_extra: u64,
    pub open: u64,
    pub synced: u64,
    pub dirty_open: u64,
    pub dirty_syncing: u64,
    /// Highest txg a caller is waiting to see synced.
    pub want: u64,
    /// Transactions started so far.
    pub tx_seq: u64,
    /// `tx_seq` when the sync thread last found nothing dirty (with no transaction running):
    /// every transaction counted up to it is durable.
    pub idle_seq: u64,
    /// `tx_seq` of the newest waiter.
    pub want_seq: u64,
    pub shutdown: bool,
    pub failed: Option<String>,
}

#[derive(Debug)]
pub(crate) struct TxgManager {
    pub gate: RwLock<()>,
    pub inner: Mutex<TxgInner>,
    /// Signals the end of a sync (or a failure) to waiters for a txg and throttled writers.
    pub cv: Condvar,
    /// Signals the sync thread that a sync is wanted.
    pub sync_cv: Condvar,
    pub tunables: TxgTunables,
}

/// A running transaction: the open txg it belongs to. Changes made while it lives are
/// committed with that txg.
pub struct Tx<'a> {
    pub txg: u64,
    _gate: RwLockReadGuard<'a, ()>,
    txgs: &'a TxgManager,
}

impl Tx<'_> {
    /// Charges `bytes` more dirty data to this transaction's txg: memory the change holds
    /// beyond what [`TxgManager::begin`] was told, as a 4 KiB write into a 16 KiB block
    /// holds the whole block (ZFS charges a buffer's whole size when it is first dirtied in
    /// a txg). Never waits: the throttle applies at the next `begin`, and a sync starts
    /// once the open txg holds `dirty_sync`.
    pub fn charge(&self, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let mut inner = self.txgs.inner.lock();
        self.txgs.add_dirty(&mut inner, bytes);
        inner.max_extra = inner.max_extra.max(bytes);
    }
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        self.txgs.inner.lock().active -= 1;
    }
}

impl TxgManager {
    pub fn new(open: u64, tunables: TxgTunables) -> Self {
        Self {
            gate: RwLock::new(()),
            inner: Mutex::new(TxgInner {
                open,
                synced: open - 1,
                max_extra: 256 << 10,
                ..Default::default()
            }),
            cv: Condvar::new(),
            sync_cv: Condvar::new(),
            tunables,
        }
    }

    /// Throttles, then enters the open txg charging `bytes` of dirty data.
    pub fn begin(&self, bytes: u64) -> Result<Tx<'_>, String> {
        self.begin_if(bytes, |_| true).map_err(|e| match e {
            Refused::Failed(f) => f,
            Refused::NoRoom => unreachable!("room is always granted"),
        })
    }

    /// As `begin`, but enters only if `room` grants the charge. `room` sees the counters
    /// under the same lock that charges `bytes`, so writers that check at once cannot all
    /// take the same room.
    pub fn begin_if(
        &self,
        bytes: u64,
        room: impl FnOnce(&TxgInner) -> bool,
    ) -> Result<Tx<'_>, Refused> {
        let t = self.tunables;
        {
            let mut inner = self.inner.lock();
            loop {
                if let Some(f) = &inner.failed {
                    return Err(Refused::Failed(f.clone()));
                }
                let dirty = inner.dirty_open + inner.dirty_syncing;
                if dirty + bytes <= t.dirty_max || dirty == 0 {
                    break;
                }
                inner.want = inner.want.max(inner.open);
                inner.throttle_waits += 1;
                self.sync_cv.notify_one();
                self.cv.wait_for(&mut inner, Duration::from_millis(100));
            }
            let dirty = inner.dirty_open + inner.dirty_syncing;
            let delay_from = t.dirty_max / 10 * 6;
            if dirty > delay_from {
                // Progressive delay between 60 % and 100 % of dirty_max (ZFS's write throttle).
                let frac = (dirty - delay_from) as f64 / (t.dirty_max - delay_from).max(1) as f64;
                let us = (frac * frac * 2000.0) as u64;
                inner.throttle_delays += 1;
                drop(inner);
                std::thread::sleep(Duration::from_micros(us));
            }
        }
        let gate = self.gate.read();
        let mut inner = self.inner.lock();
        if !room(&inner) {
            return Err(Refused::NoRoom);
        }
        self.add_dirty(&mut inner, bytes);
        inner.tx_seq += 1;
        inner.active += 1;
        Ok(Tx {
            txg: inner.open,
            _gate: gate,
            txgs: self,
        })
    }

    /// Charges `bytes` to the open txg, and wakes the sync thread when they take it to
    /// `dirty_sync`. Only the crossing wakes it: while a sync runs the open txg may stay over
    /// the mark, and the sync thread looks at it again before it next waits.
    fn add_dirty(&self, inner: &mut TxgInner, bytes: u64) {
        let before = inner.dirty_open;
        inner.dirty_open += bytes;
        let mark = self.tunables.dirty_sync;
        if before < mark && inner.dirty_open >= mark {
            self.sync_cv.notify_one();
        }
    }

    /// Wakes everyone: the sync thread and every waiter (closing, a failure, a change of
    /// state both may look at).
    pub fn wake_all(&self) {
        self.sync_cv.notify_one();
        self.cv.notify_all();
    }

    pub fn open_txg(&self) -> u64 {
        self.inner.lock().open
    }

    pub fn synced_txg(&self) -> u64 {
        self.inner.lock().synced
    }
}

impl TxgInner {
    /// Whether a waiter still needs a sync.
    pub fn wanted(&self) -> bool {
        self.want > self.synced && self.want_seq > self.idle_seq
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_charge_counts_toward_the_throttle_and_starts_a_sync() {
        let txgs = TxgManager::new(
            5,
            TxgTunables {
                dirty_max: 64 << 10,
                dirty_sync: 32 << 10,
                timeout: Duration::from_secs(5),
            },
        );
        {
            let tx = txgs.begin(4 << 10).unwrap();
            // A 4 KiB write that dirtied a 64 KiB block.
            tx.charge(60 << 10);
            assert_eq!(txgs.inner.lock().dirty_open, 64 << 10);
        }
        let txgs = &txgs;
        std::thread::scope(|s| {
            let (sent, got) = std::sync::mpsc::channel();
            s.spawn(move || {
                let tx = txgs.begin(4 << 10).unwrap();
                sent.send(tx.txg).unwrap();
            });
            // The next writer waits for the sync the charge asked for...
            assert!(got.recv_timeout(Duration::from_millis(200)).is_err());
            assert!(txgs.inner.lock().want >= 5, "no sync asked for");
            // ...and goes on once the sync has released the dirty data.
            {
                let mut inner = txgs.inner.lock();
                inner.open = 6;
                inner.synced = 5;
                inner.dirty_open = 0;
                txgs.cv.notify_all();
            }
            assert_eq!(got.recv_timeout(Duration::from_secs(10)).unwrap(), 6);
        });
    }

    /// Writers held at `dirty_max` sleep until a sync makes room. Asking for that sync wakes
    /// the sync thread alone: when it woke every waiter, each woken writer asked again and
    /// woke the others, and eight held writers went round thousands of times a second.
    #[test]
    fn writers_held_at_the_limit_do_not_wake_each_other() {
        let txgs = TxgManager::new(
            5,
            TxgTunables {
                dirty_max: 64 << 10,
                dirty_sync: 32 << 10,
                timeout: Duration::from_secs(5),
            },
        );
        drop(txgs.begin(64 << 10).unwrap());
        let txgs = &txgs;
        const WRITERS: u64 = 8;
        const HELD: Duration = Duration::from_millis(500);
        std::thread::scope(|s| {
            let (sent, got) = std::sync::mpsc::channel();
            for _ in 0..WRITERS {
                let sent = sent.clone();
                s.spawn(move || {
                    let tx = txgs.begin(4 << 10).unwrap();
                    sent.send(tx.txg).unwrap();
                });
            }
            std::thread::sleep(HELD);
            assert!(got.try_recv().is_err(), "a writer went past dirty_max");
            let waits = txgs.inner.lock().throttle_waits;
            // Each writer sleeps once, then once per 100 ms timeout: about 5 each here.
            assert!(
                (WRITERS..=WRITERS * 8).contains(&waits),
                "{WRITERS} writers held for {HELD:?} slept {waits} times"
            );
            // The sync frees the dirty data: every writer goes on, in the next txg.
            {
                let mut inner = txgs.inner.lock();
                inner.open = 6;
                inner.synced = 5;
                inner.dirty_open = 0;
                txgs.cv.notify_all();
            }
            for _ in 0..WRITERS {
                assert_eq!(got.recv_timeout(Duration::from_secs(10)).unwrap(), 6);
            }
        });
    }

    #[test]
    fn memory_is_the_smaller_of_the_host_and_the_container_limit() {
        const G: u64 = 1 << 30;
        assert_eq!(memory_limit(Some(64 * G), Some(2 * G)), 2 * G);
        assert_eq!(memory_limit(Some(8 * G), Some(16 * G)), 8 * G);
        assert_eq!(memory_limit(Some(8 * G), None), 8 * G);
        assert_eq!(memory_limit(None, Some(G)), G);
        assert_eq!(memory_limit(None, None), 4 * G);
    }
}
