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
//! `inner` (a mutex) guards the counters; `cv` signals every change of `synced`, of the dirty
//! totals and of the sync requests.

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

#[derive(Debug, Default)]
pub(crate) struct TxgInner {
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
    pub cv: Condvar,
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
        inner.dirty_open += bytes;
        if inner.dirty_open >= self.txgs.tunables.dirty_sync {
            self.txgs.cv.notify_all();
        }
    }
}

impl TxgManager {
    pub fn new(open: u64, tunables: TxgTunables) -> Self {
        Self {
            gate: RwLock::new(()),
            inner: Mutex::new(TxgInner {
                open,
                synced: open - 1,
                ..Default::default()
            }),
            cv: Condvar::new(),
            tunables,
        }
    }

    /// Throttles, then enters the open txg charging `bytes` of dirty data.
    pub fn begin(&self, bytes: u64) -> Result<Tx<'_>, String> {
        let t = self.tunables;
        {
            let mut inner = self.inner.lock();
            loop {
                if let Some(f) = &inner.failed {
                    return Err(f.clone());
                }
                let dirty = inner.dirty_open + inner.dirty_syncing;
                if dirty + bytes <= t.dirty_max || dirty == 0 {
                    break;
                }
                inner.want = inner.want.max(inner.open);
                self.cv.notify_all();
                self.cv.wait_for(&mut inner, Duration::from_millis(100));
            }
            let dirty = inner.dirty_open + inner.dirty_syncing;
            let delay_from = t.dirty_max / 10 * 6;
            if dirty > delay_from {
                // Progressive delay between 60 % and 100 % of dirty_max (ZFS's write throttle).
                let frac = (dirty - delay_from) as f64 / (t.dirty_max - delay_from).max(1) as f64;
                let us = (frac * frac * 2000.0) as u64;
                drop(inner);
                std::thread::sleep(Duration::from_micros(us));
            }
        }
        let gate = self.gate.read();
        let mut inner = self.inner.lock();
        inner.dirty_open += bytes;
        inner.tx_seq += 1;
        if inner.dirty_open >= t.dirty_sync {
            self.cv.notify_all();
        }
        Ok(Tx {
            txg: inner.open,
            _gate: gate,
            txgs: self,
        })
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
