//! The ARC: the adaptive replacement cache of blocks in RAM (ZFS's arc.c, simplified).
//!
//! # Theory of operation
//! Blocks are cached as they are stored: the verified physical bytes (compressed), keyed by
//! the identity of the block, not of the file: (pool instance, first DVA, birth txg). A DVA
//! is reused only after its block was freed and the free is past its deferral, by a block of
//! a later birth txg, so a key never names two contents. A hit decompresses (lz4 runs at GB/s).
//!
//! Four lists, each in least-recently-used order (Megiddo and Modha's ARC with byte weights,
//! as ZFS does):
//! - **MRU** holds blocks used once, **MFU** blocks used at least twice;
//! - **MRU ghost** and **MFU ghost** remember the keys (no data) of blocks recently evicted
//!   from each. A miss that hits a ghost list says that list was too small: the target size
//!   `p` of the MRU grows (MRU ghost hit) or shrinks (MFU ghost hit) by the missed block's
//!   size, scaled by the ratio of the ghost lists (ZFS's arc_adapt).
//!
//! Eviction runs when an insert takes the cache past its target `c` (= `arc_max`): it takes
//! the LRU end of the MRU when the MRU is over `p`, else of the MFU, and moves the key to
//! the matching ghost list. Ghost lists together hold at most `c` bytes worth of keys.
//!
//! **The budget is hard and counts headers.** Every resident block is charged its bytes
//! plus `HDR_BYTES` (the map slot, list links, the entry and its reference count), every
//! ghost `GHOST_BYTES`, so `size` is what the cache holds in the allocator, not what its
//! data would be. `arc_max` can change at any time; lowering it evicts at once.
//!
//! A block read ahead by a sequential stream enters the MRU marked as a prefetch; the
//! first demand read of it counts as a prefetch hit and does not promote it (so one pass
//! over a large file does not flush the MFU), as in ZFS. Bytes in flight for prefetch are
//! bounded by `prefetch_budget`.
//!
//! The L2ARC (`l2arc.rs`) feeds from the LRU ends of both lists (the blocks about to be
//! evicted) and keeps its own headers; a miss here asks it before the pool.
//!
//! # Concurrency
//! One mutex guards the lists; it is held for map operations only. Data is shared as
//! `Arc<Vec<u8>>` (the read's own buffer, never copied in), so copying and decompressing
//! happen outside it.
//!
//! This is hand-written: the cache crates available (LRU, W-TinyLFU, S3-FIFO) neither adapt
//! as ARC does nor expose the ghost lists, the byte-weighted target and the eviction-order
//! scan the L2ARC feed needs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use hashlink::LinkedHashMap;
use parking_lot::Mutex;
use serde::Serialize;
use tank_block::BlockPtr;

/// RAM charged per resident block beyond its data: the map slot and list links (~80 B with
/// the key), the entry (~40 B) and the shared buffer's reference counts and length (~40 B).
pub const HDR_BYTES: u64 = 160;
/// RAM charged per ghost key: the map slot, links, key and size.
pub const GHOST_BYTES: u64 = 96;
/// The smallest `arc_max` accepted.
pub const ARC_MIN: u64 = 32 << 20;
/// At most this share of `arc_max` may be in flight for sequential prefetch (and 64 MiB).
const PREFETCH_SHARE: u64 = 8;
const PREFETCH_MAX_BYTES: u64 = 64 << 20;

/// Which block a cached buffer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ArcKey {
    /// The pool instance (`ObjectStore`), unique in the process, so two imports of copies of
    /// one pool never share entries.
    pub spa: u64,
    pub vdev: u32,
    pub offset: u64,
    pub birth: u64,
}

impl ArcKey {
    /// The key of a stored block (None for a pointer without a DVA).
    pub fn of(spa: u64, bp: &BlockPtr) -> Option<Self> {
        let d = bp.dvas().next()?;
        Some(Self {
            spa,
            vdev: d.vdev,
            offset: d.offset,
            birth: bp.birth_txg,
        })
    }
}

/// A cache-list name, for statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum List {
    Mru,
    Mfu,
}

#[derive(Debug)]
struct Entry {
    data: Arc<Vec<u8>>,
    meta: bool,
    /// Read ahead and not yet used by a demand read.
    prefetch: bool,
    /// A copy has been written to an L2ARC device.
    on_l2: bool,
}

impl Entry {
    /// What the buffer holds in the allocator: its capacity, not its length.
    fn bytes(&self) -> u64 {
        self.data.capacity() as u64
    }

    fn charge(&self) -> u64 {
        self.bytes() + HDR_BYTES
    }
}

/// Counters and sizes, named as `arcstat`/kstat names them.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ArcStats {
    /// Bytes charged now (data + headers + ghost keys).
    pub size: u64,
    /// The target size (`c`).
    pub c: u64,
    /// The MRU's share of the target (`p`).
    pub p: u64,
    pub c_max: u64,
    pub c_min: u64,
    pub data_size: u64,
    pub metadata_size: u64,
    pub hdr_size: u64,
    pub mru_size: u64,
    pub mfu_size: u64,
    pub mru_ghost_size: u64,
    pub mfu_ghost_size: u64,
    pub buffers: u64,
    pub hits: u64,
    pub misses: u64,
    pub demand_data_hits: u64,
    pub demand_data_misses: u64,
    pub demand_metadata_hits: u64,
    pub demand_metadata_misses: u64,
    pub mru_hits: u64,
    pub mfu_hits: u64,
    pub mru_ghost_hits: u64,
    pub mfu_ghost_hits: u64,
    pub prefetch_issued: u64,
    pub prefetch_hits: u64,
    pub prefetch_bytes_in_flight: u64,
    pub evict_count: u64,
    pub evicted_bytes: u64,
    pub evict_skip_freed: u64,
}

#[derive(Debug, Default)]
struct Inner {
    mru: LinkedHashMap<ArcKey, Entry>,
    mfu: LinkedHashMap<ArcKey, Entry>,
    mru_ghost: LinkedHashMap<ArcKey, u64>,
    mfu_ghost: LinkedHashMap<ArcKey, u64>,
    mru_bytes: u64,
    mfu_bytes: u64,
    mru_ghost_bytes: u64,
    mfu_ghost_bytes: u64,
    data_bytes: u64,
    meta_bytes: u64,
    c: u64,
    p: u64,
    stats: ArcStats,
}

/// The adaptive replacement cache (see the module documentation).
#[derive(Debug)]
pub struct AdaptiveCache {
    inner: Mutex<Inner>,
    prefetch_in_flight: AtomicU64,
}

/// What [`AdaptiveCache::prefetch_reserve`] lent; returned when dropped.
#[derive(Debug)]
pub struct PrefetchCharge {
    arc: Arc<AdaptiveCache>,
    bytes: u64,
}

impl Drop for PrefetchCharge {
    fn drop(&mut self) {
        self.arc
            .prefetch_in_flight
            .fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

pub use tank_pool::txg::physical_memory;

/// The default `arc_max`: a quarter of physical memory (tank shares its host with the
/// clients it serves and the kernel's page cache), at least `ARC_MIN`.
pub fn default_arc_max() -> u64 {
    (physical_memory() / 4).max(ARC_MIN)
}

/// The process's cache, shared by every pool it opens (as the kernel's ARC is), of
/// `default_arc_max` until the program sets another limit (`AdaptiveCache::set_max`).
pub fn global() -> &'static Arc<AdaptiveCache> {
    static GLOBAL: OnceLock<Arc<AdaptiveCache>> = OnceLock::new();
    GLOBAL.get_or_init(|| Arc::new(AdaptiveCache::new(default_arc_max())))
}

/// Unique ids for pool instances (`ArcKey::spa`).
pub fn next_spa_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl AdaptiveCache {
    /// A cache with target and hard limit `max` bytes.
    pub fn new(max: u64) -> Self {
        let inner = Inner {
            c: max,
            p: max / 2,
            stats: ArcStats {
                c_max: max,
                c_min: ARC_MIN.min(max),
                ..ArcStats::default()
            },
            ..Inner::default()
        };
        Self {
            inner: Mutex::new(inner),
            prefetch_in_flight: AtomicU64::new(0),
        }
    }

    pub fn max(&self) -> u64 {
        self.inner.lock().stats.c_max
    }

    /// Changes `arc_max` (at once: a lower limit evicts before this returns). Refused below
    /// `ARC_MIN` or above physical memory.
    pub fn set_max(&self, max: u64) -> Result<(), String> {
        if max < ARC_MIN {
            return Err(format!(
                "arc_max {max} is below the minimum of {} MiB",
                ARC_MIN >> 20
            ));
        }
        let ram = physical_memory();
        if max > ram {
            return Err(format!(
                "arc_max {} MiB is more than this machine's {} MiB of memory",
                max >> 20,
                ram >> 20
            ));
        }
        let mut g = self.inner.lock();
        g.stats.c_max = max;
        g.c = max;
        g.p = g.p.min(max);
        g.evict();
        Ok(())
    }

    /// Looks a block up for a demand read. A hit moves it to the MFU (or, for a block read
    /// ahead and not used yet, counts a prefetch hit and keeps it in the MRU).
    pub fn get(&self, key: &ArcKey, meta: bool) -> Option<Arc<Vec<u8>>> {
        let mut g = self.inner.lock();
        let g = &mut *g;
        let found = if let Some(e) = g.mru.get_mut(key) {
            if e.prefetch {
                e.prefetch = false;
                g.stats.prefetch_hits += 1;
                let data = e.data.clone();
                g.mru.to_back(key);
                Some((data, List::Mru))
            } else {
                let e = g.mru.remove(key).expect("present");
                let n = e.charge();
                g.mru_bytes -= n;
                g.mfu_bytes += n;
                let data = e.data.clone();
                g.mfu.insert(*key, e);
                Some((data, List::Mru))
            }
        } else if let Some(e) = g.mfu.get(key) {
            let data = e.data.clone();
            g.mfu.to_back(key);
            Some((data, List::Mfu))
        } else {
            None
        };
        let s = &mut g.stats;
        match (&found, meta) {
            (Some(_), true) => s.demand_metadata_hits += 1,
            (Some(_), false) => s.demand_data_hits += 1,
            (None, true) => s.demand_metadata_misses += 1,
            (None, false) => s.demand_data_misses += 1,
        }
        match found {
            Some((data, list)) => {
                s.hits += 1;
                match list {
                    List::Mru => s.mru_hits += 1,
                    List::Mfu => s.mfu_hits += 1,
                }
                Some(data)
            }
            None => {
                s.misses += 1;
                None
            }
        }
    }

    /// Counts a demand read served by a block read ahead for it (still in flight or just
    /// landed), as a hit.
    pub fn count_prefetch_hit(&self, meta: bool) {
        let mut g = self.inner.lock();
        let s = &mut g.stats;
        s.hits += 1;
        s.prefetch_hits += 1;
        if meta {
            s.demand_metadata_hits += 1;
        } else {
            s.demand_data_hits += 1;
        }
    }

    /// Counts a block read ahead.
    pub fn count_prefetch_issued(&self) {
        self.inner.lock().stats.prefetch_issued += 1;
    }

    /// Whether a block is resident (no statistics, no reordering).
    pub fn contains(&self, key: &ArcKey) -> bool {
        let g = self.inner.lock();
        g.mru.contains_key(key) || g.mfu.contains_key(key)
    }

    /// Adds a block just read (verified physical bytes). A key in a ghost list adapts `p`
    /// and enters the MFU; a new key enters the MRU. Evicts down to the target.
    pub fn insert(&self, key: ArcKey, data: Arc<Vec<u8>>, meta: bool, prefetch: bool) {
        self.insert_entry(key, data, meta, prefetch, false);
    }

    /// Adds a block read back from an L2ARC device (which still holds it: not fed again).
    pub fn insert_from_l2(&self, key: ArcKey, data: Arc<Vec<u8>>, meta: bool) {
        self.insert_entry(key, data, meta, false, true);
    }

    fn insert_entry(
        &self,
        key: ArcKey,
        data: Arc<Vec<u8>>,
        meta: bool,
        prefetch: bool,
        on_l2: bool,
    ) {
        let mut g = self.inner.lock();
        if g.mru.contains_key(&key) || g.mfu.contains_key(&key) {
            return;
        }
        let entry = Entry {
            data,
            meta,
            prefetch,
            on_l2,
        };
        let n = entry.charge();
        // A single block larger than the whole cache is not kept.
        if n > g.c / 2 {
            return;
        }
        if meta {
            g.meta_bytes += entry.bytes();
        } else {
            g.data_bytes += entry.bytes();
        }
        if let Some(size) = g.mru_ghost.remove(&key) {
            g.mru_ghost_bytes -= GHOST_BYTES;
            g.stats.mru_ghost_hits += 1;
            let ratio = (g.mfu_ghost_bytes / g.mru_ghost_bytes.max(1)).max(1);
            g.p = (g.p + ratio * size).min(g.c);
            g.mfu_bytes += n;
            g.mfu.insert(key, entry);
        } else if let Some(size) = g.mfu_ghost.remove(&key) {
            g.mfu_ghost_bytes -= GHOST_BYTES;
            g.stats.mfu_ghost_hits += 1;
            let ratio = (g.mru_ghost_bytes / g.mfu_ghost_bytes.max(1)).max(1);
            g.p = g.p.saturating_sub(ratio * size);
            g.mfu_bytes += n;
            g.mfu.insert(key, entry);
        } else {
            g.mru_bytes += n;
            g.mru.insert(key, entry);
        }
        g.evict();
    }

    /// Drops a block that was freed (its DVA may be reused later under another birth).
    pub fn remove(&self, key: &ArcKey) {
        let mut g = self.inner.lock();
        if let Some(e) = g.mru.remove(key) {
            g.mru_bytes -= e.charge();
            g.uncount(&e);
            g.stats.evict_skip_freed += 1;
        } else if let Some(e) = g.mfu.remove(key) {
            g.mfu_bytes -= e.charge();
            g.uncount(&e);
            g.stats.evict_skip_freed += 1;
        }
        if g.mru_ghost.remove(key).is_some() {
            g.mru_ghost_bytes -= GHOST_BYTES;
        }
        if g.mfu_ghost.remove(key).is_some() {
            g.mfu_ghost_bytes -= GHOST_BYTES;
        }
    }

    /// Drops every entry of one pool instance (at export).
    pub fn remove_spa(&self, spa: u64) {
        let mut g = self.inner.lock();
        let g = &mut *g;
        let keys: Vec<ArcKey> = g
            .mru
            .keys()
            .chain(g.mfu.keys())
            .filter(|k| k.spa == spa)
            .copied()
            .collect();
        for k in keys {
            if let Some(e) = g.mru.remove(&k) {
                g.mru_bytes -= e.charge();
                g.uncount(&e);
            } else if let Some(e) = g.mfu.remove(&k) {
                g.mfu_bytes -= e.charge();
                g.uncount(&e);
            }
        }
        let ghosts: Vec<ArcKey> = g
            .mru_ghost
            .keys()
            .chain(g.mfu_ghost.keys())
            .filter(|k| k.spa == spa)
            .copied()
            .collect();
        for k in ghosts {
            if g.mru_ghost.remove(&k).is_some() {
                g.mru_ghost_bytes -= GHOST_BYTES;
            }
            if g.mfu_ghost.remove(&k).is_some() {
                g.mfu_ghost_bytes -= GHOST_BYTES;
            }
        }
    }

    /// Takes a share of the prefetch budget for `bytes` about to be read ahead, or None when
    /// the budget is spent (the prefetch is skipped).
    pub fn prefetch_reserve(self: &Arc<Self>, bytes: u64) -> Option<PrefetchCharge> {
        let limit = (self.max() / PREFETCH_SHARE).min(PREFETCH_MAX_BYTES);
        let mut cur = self.prefetch_in_flight.load(Ordering::Acquire);
        loop {
            if cur + bytes > limit {
                return None;
            }
            match self.prefetch_in_flight.compare_exchange_weak(
                cur,
                cur + bytes,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    return Some(PrefetchCharge {
                        arc: self.clone(),
                        bytes,
                    })
                }
                Err(now) => cur = now,
            }
        }
    }

    /// Up to `max_bytes` of blocks from the LRU ends of the MRU and MFU (the next to be
    /// evicted) that have no L2ARC copy yet, for pool instance `spa`; they are marked as
    /// having one. Prefetched-and-unused blocks are skipped when `noprefetch`.
    pub fn l2_candidates(
        &self,
        spa: u64,
        max_bytes: u64,
        noprefetch: bool,
    ) -> Vec<(ArcKey, Arc<Vec<u8>>, bool)> {
        let mut g = self.inner.lock();
        let g = &mut *g;
        let mut out = Vec::new();
        let mut total = 0u64;
        for list in [&mut g.mru, &mut g.mfu] {
            // The LRU end is the front; scan only the colder half of the list, as the
            // L2ARC's headroom: hotter blocks will not be evicted soon.
            let scan = list.len().div_ceil(2);
            for (k, e) in list.iter_mut().take(scan) {
                if total >= max_bytes {
                    break;
                }
                if k.spa != spa || e.on_l2 || (noprefetch && e.prefetch) {
                    continue;
                }
                e.on_l2 = true;
                total += e.bytes();
                out.push((*k, e.data.clone(), e.meta));
            }
        }
        out
    }

    /// Marks that a block's L2ARC copy is gone (its device region was overwritten).
    pub fn l2_forget(&self, key: &ArcKey) {
        let mut g = self.inner.lock();
        if let Some(e) = g.mru.get_mut(key) {
            e.on_l2 = false;
        } else if let Some(e) = g.mfu.get_mut(key) {
            e.on_l2 = false;
        }
    }

    pub fn stats(&self) -> ArcStats {
        let g = self.inner.lock();
        let mut s = g.stats.clone();
        s.c = g.c;
        s.p = g.p;
        s.mru_size = g.mru_bytes;
        s.mfu_size = g.mfu_bytes;
        s.mru_ghost_size = g.mru_ghost_bytes;
        s.mfu_ghost_size = g.mfu_ghost_bytes;
        s.data_size = g.data_bytes;
        s.metadata_size = g.meta_bytes;
        s.buffers = (g.mru.len() + g.mfu.len()) as u64;
        s.hdr_size = s.buffers * HDR_BYTES + g.mru_ghost_bytes + g.mfu_ghost_bytes;
        s.size = g.size();
        s.prefetch_bytes_in_flight = self.prefetch_in_flight.load(Ordering::Acquire);
        s
    }
}

impl Inner {
    fn size(&self) -> u64 {
        self.mru_bytes + self.mfu_bytes + self.mru_ghost_bytes + self.mfu_ghost_bytes
    }

    fn uncount(&mut self, e: &Entry) {
        if e.meta {
            self.meta_bytes -= e.bytes();
        } else {
            self.data_bytes -= e.bytes();
        }
    }

    /// Evicts to the target (see the module documentation). Ghost keys count against the
    /// budget too, and go first when they are what holds the cache over it; they never take
    /// more than an eighth of it.
    fn evict(&mut self) {
        let ghost_limit = self.c / 8;
        loop {
            let resident = self.mru_bytes + self.mfu_bytes;
            let ghosts = self.mru_ghost_bytes + self.mfu_ghost_bytes;
            let ghosts_first =
                ghosts > ghost_limit || (resident + ghosts > self.c && resident <= self.c);
            if ghosts_first && self.trim_ghosts_one() {
                continue;
            }
            if resident + ghosts <= self.c {
                break;
            }
            let from_mru = !self.mru.is_empty() && (self.mru_bytes > self.p || self.mfu.is_empty());
            let (list, ghost) = if from_mru {
                (&mut self.mru, &mut self.mru_ghost)
            } else {
                (&mut self.mfu, &mut self.mfu_ghost)
            };
            let Some((k, e)) = list.pop_front() else {
                break;
            };
            let n = e.charge();
            ghost.insert(k, e.bytes());
            if from_mru {
                self.mru_bytes -= n;
                self.mru_ghost_bytes += GHOST_BYTES;
            } else {
                self.mfu_bytes -= n;
                self.mfu_ghost_bytes += GHOST_BYTES;
            }
            self.uncount(&e);
            self.stats.evict_count += 1;
            self.stats.evicted_bytes += e.bytes();
        }
    }

    /// Drops the oldest key of the larger ghost list; false when both are empty.
    fn trim_ghosts_one(&mut self) -> bool {
        if self.mru_ghost_bytes >= self.mfu_ghost_bytes && self.mru_ghost.pop_front().is_some() {
            self.mru_ghost_bytes -= GHOST_BYTES;
            return true;
        }
        if self.mfu_ghost.pop_front().is_some() {
            self.mfu_ghost_bytes -= GHOST_BYTES;
            return true;
        }
        if self.mru_ghost.pop_front().is_some() {
            self.mru_ghost_bytes -= GHOST_BYTES;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u64) -> ArcKey {
        ArcKey {
            spa: 1,
            vdev: 0,
            offset: i << 20,
            birth: 1,
        }
    }

    fn buf(n: usize) -> Arc<Vec<u8>> {
        Arc::new(vec![7u8; n])
    }

    #[test]
    fn hits_promote_and_budget_holds() {
        let arc = AdaptiveCache::new(ARC_MIN);
        let bs = 64 << 10;
        arc.insert(key(0), buf(bs), false, false);
        assert!(arc.get(&key(0), false).is_some());
        let s = arc.stats();
        assert_eq!(s.mru_size, 0);
        assert_eq!(s.mfu_size, bs as u64 + HDR_BYTES);
        // Fill far past the budget: it is never exceeded, headers included.
        for i in 1..2000 {
            arc.insert(key(i), buf(bs), false, false);
            assert!(arc.stats().size <= ARC_MIN, "over budget at {i}");
        }
        let s = arc.stats();
        assert!(s.evict_count > 1000);
        assert!(s.size > ARC_MIN * 3 / 4, "cache mostly empty: {s:?}");
        // The block used twice is still there: the one-time blocks went first.
        assert!(arc.contains(&key(0)));
    }

    #[test]
    fn ghost_hits_adapt_p() {
        let arc = AdaptiveCache::new(ARC_MIN);
        let bs = 1 << 20;
        let p0 = arc.stats().p;
        for i in 0..64 {
            arc.insert(key(i), buf(bs), false, false);
        }
        // The first ones were evicted to the MRU ghost list; reading them again grows p.
        assert!(!arc.contains(&key(0)));
        arc.get(&key(0), false);
        arc.insert(key(0), buf(bs), false, false);
        let s = arc.stats();
        assert_eq!(s.mru_ghost_hits, 1);
        assert!(s.p > p0, "p {} did not grow from {p0}", s.p);
        assert!(arc.contains(&key(0)));
        assert!(s.mfu_size >= bs as u64);
    }

    #[test]
    fn prefetch_hit_does_not_promote() {
        let arc = AdaptiveCache::new(ARC_MIN);
        arc.insert(key(1), buf(4096), false, true);
        assert!(arc.get(&key(1), false).is_some());
        let s = arc.stats();
        assert_eq!(s.prefetch_hits, 1);
        assert_eq!(s.mfu_size, 0);
        assert!(arc.get(&key(1), false).is_some());
        assert_eq!(arc.stats().mfu_size, 4096 + HDR_BYTES);
    }

    #[test]
    fn lowering_the_limit_evicts_at_once() {
        let arc = AdaptiveCache::new(4 * ARC_MIN);
        for i in 0..100 {
            arc.insert(key(i), buf(1 << 20), true, false);
        }
        assert!(arc.stats().size > 2 * ARC_MIN);
        arc.set_max(ARC_MIN).unwrap();
        assert!(arc.stats().size <= ARC_MIN);
        assert!(arc.set_max(ARC_MIN - 1).is_err());
        assert!(arc.set_max(physical_memory() + 1).is_err());
    }

    #[test]
    fn frees_and_export_drop_entries() {
        let arc = AdaptiveCache::new(ARC_MIN);
        arc.insert(key(1), buf(4096), false, false);
        arc.remove(&key(1));
        assert!(!arc.contains(&key(1)));
        let mut other = key(2);
        other.spa = 2;
        arc.insert(key(3), buf(4096), false, false);
        arc.insert(other, buf(4096), true, false);
        arc.remove_spa(1);
        let s = arc.stats();
        assert_eq!(s.buffers, 1);
        assert_eq!(s.data_size, 0);
        assert_eq!(s.metadata_size, 4096);
    }

    #[test]
    fn l2_candidates_come_from_the_cold_end_once() {
        let arc = AdaptiveCache::new(ARC_MIN);
        for i in 0..10 {
            arc.insert(key(i), buf(4096), false, i % 2 == 0);
        }
        let c = arc.l2_candidates(1, u64::MAX, true);
        let got: Vec<u64> = c.iter().map(|(k, _, _)| k.offset >> 20).collect();
        assert_eq!(got, vec![1, 3]);
        // Already fed: not offered again; another pool's feed gets nothing.
        assert!(arc.l2_candidates(1, u64::MAX, true).is_empty());
        assert!(arc.l2_candidates(9, u64::MAX, false).is_empty());
    }

    #[test]
    fn prefetch_budget_is_bounded() {
        let arc = Arc::new(AdaptiveCache::new(ARC_MIN));
        let limit = ARC_MIN / PREFETCH_SHARE;
        let a = arc.prefetch_reserve(limit).unwrap();
        assert!(arc.prefetch_reserve(1).is_none());
        drop(a);
        assert!(arc.prefetch_reserve(1).is_some());
    }
}
