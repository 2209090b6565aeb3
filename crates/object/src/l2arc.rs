//! The L2ARC: a second-level block cache on the pool's cache devices (ZFS's l2arc).
//!
//! # Theory of operation
//! **Feed.** Every `l2arc_feed_secs` the feed takes blocks from the LRU ends of the ARC's
//! MRU and MFU (the next to be evicted, `AdaptiveCache::l2_candidates`), up to
//! `l2arc_write_max` bytes per device and round (plus `l2arc_write_boost` while the ARC has
//! not evicted anything yet: it is warming up and nothing competes for the device), skipping
//! prefetched blocks when `l2arc_noprefetch` is set. They are written one after another at
//! the device's write hand, each padded to a sector, as one sequential write: a cache device
//! is a ring. Before the hand passes over a region, the headers of what it held are dropped.
//!
//! **Headers in RAM.** A block on a cache device is found through a header keyed by its
//! identity in the pool (first DVA and birth txg): the device, address and size. Each costs
//! `L2_HDR_BYTES` of RAM, reported as `l2_hdr_size`.
//!
//! **Reads are verified.** An L2ARC read is checked against the block pointer's checksum
//! (and zero padding) before use. A failed read or a mismatch drops the header, counts
//! `l2_io_error` or `l2_cksum_bad`, and the read goes to the pool: a bad or missing cache
//! device costs speed, never data.
//!
//! **Persistence** (ZFS's persistent L2ARC). After its blocks, each feed round writes a log
//! block listing them (see `docs/FORMAT.md` §12), chained to the previous one by address,
//! length and checksum, then rewrites the device header (first 4 KiB of the data area)
//! with the write hand and a pointer to the newest log block. At import the chain is walked
//! from the newest log block back, and the headers are rebuilt for every entry whose space
//! no newer write has reused. A torn header or log block ends the walk: the cache is
//! smaller, never wrong (every read is verified anyway).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use serde::Serialize;
use tank_block::{BlockPtr, ChecksumKind};
use tank_vdev::{IoBatch, TopVdev};

use crate::arc::{AdaptiveCache, ArcKey};

/// RAM per block held on a cache device: the map slot, key, header and the address index.
pub const L2_HDR_BYTES: u64 = 96;
/// The device header: the first 4 KiB of a cache device's data area.
const HEADER_SIZE: u64 = 4096;
const HEADER_MAGIC: &[u8; 8] = b"TANKL2H1";
const LOG_MAGIC: &[u8; 8] = b"TANKL2L1";
/// A log block's fixed part: magic, previous log pointer (address, length, checksum),
/// entry count, pool guid.
const LOG_HEAD: usize = 8 + 8 + 4 + 32 + 4 + 8;
/// One log entry: DVA vdev u32, DVA offset u64, birth u64, device address u64, psize u32,
/// flags u32 (bit 0: metadata).
const LOG_ENTRY: usize = 4 + 8 + 8 + 8 + 4 + 4;

/// The L2ARC tunables (ZFS's module parameters of the same names); process-wide.
#[derive(Debug)]
pub struct L2Tunables {
    pub write_max: AtomicU64,
    pub write_boost: AtomicU64,
    pub noprefetch: AtomicBool,
    pub feed_secs: AtomicU64,
}

/// The process's L2ARC tunables, with ZFS's defaults (8 MiB per round, 8 MiB more while
/// warming up, prefetched blocks skipped, one round a second).
pub fn tunables() -> &'static L2Tunables {
    static T: L2Tunables = L2Tunables {
        write_max: AtomicU64::new(8 << 20),
        write_boost: AtomicU64::new(8 << 20),
        noprefetch: AtomicBool::new(true),
        feed_secs: AtomicU64::new(1),
    };
    &T
}

/// A block's identity in its pool (an `ArcKey` without the instance).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct BlockId {
    vdev: u32,
    offset: u64,
    birth: u64,
}

impl From<&ArcKey> for BlockId {
    fn from(k: &ArcKey) -> Self {
        Self {
            vdev: k.vdev,
            offset: k.offset,
            birth: k.birth,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Hdr {
    dev: u64,
    daddr: u64,
    psize: u32,
    meta: bool,
}

/// Where a log block is: address, length, checksum (blake3).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct LogPtr {
    daddr: u64,
    len: u32,
    cksum: [u8; 32],
}

impl LogPtr {
    fn encode(&self, b: &mut Vec<u8>) {
        b.extend_from_slice(&self.daddr.to_le_bytes());
        b.extend_from_slice(&self.len.to_le_bytes());
        b.extend_from_slice(&self.cksum);
    }

    fn decode(b: &[u8]) -> Self {
        Self {
            daddr: u64::from_le_bytes(b[0..8].try_into().expect("8")),
            len: u32::from_le_bytes(b[8..12].try_into().expect("4")),
            cksum: b[12..44].try_into().expect("32"),
        }
    }
}

/// One cache device.
#[derive(Debug)]
struct Dev {
    top: Arc<TopVdev>,
    guid: u64,
    /// The ring: [start, end) of the vdev's address space (after the device header).
    start: u64,
    end: u64,
    hand: u64,
    newest_log: Option<LogPtr>,
    /// Device address → block, to drop headers as the hand passes.
    by_addr: BTreeMap<u64, BlockId>,
    bytes: u64,
    /// The device failed a write: the feed leaves it alone (reads still verify).
    failed: bool,
}

impl Dev {
    fn sector(&self) -> u64 {
        self.top.sector()
    }

    fn round(&self, n: u64) -> u64 {
        n.div_ceil(self.sector()) * self.sector()
    }
}

/// L2ARC counters, named as arcstat names them.
#[derive(Debug, Clone, Default, Serialize)]
pub struct L2Stats {
    pub l2_devices: u64,
    pub l2_size: u64,
    pub l2_asize: u64,
    pub l2_hdr_size: u64,
    pub l2_buffers: u64,
    pub l2_hits: u64,
    pub l2_misses: u64,
    pub l2_feeds: u64,
    pub l2_writes_sent: u64,
    pub l2_write_bytes: u64,
    pub l2_writes_error: u64,
    pub l2_evict_reading: u64,
    pub l2_cksum_bad: u64,
    pub l2_io_error: u64,
    pub l2_rebuild_success: u64,
    pub l2_rebuild_log_blks: u64,
    pub l2_rebuild_bufs: u64,
}

#[derive(Debug, Default)]
struct Inner {
    devs: Vec<Dev>,
    hdrs: HashMap<BlockId, Hdr>,
    rotor: usize,
    stats: L2Stats,
}

/// A pool instance's L2ARC.
#[derive(Debug, Default)]
pub struct L2Arc {
    inner: Mutex<Inner>,
    pool_guid: AtomicU64,
    /// One feed round at a time (the feed thread, or a caller warming the cache).
    feed_lock: Mutex<()>,
}

impl L2Arc {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn set_pool_guid(&self, guid: u64) {
        self.pool_guid.store(guid, Ordering::Release);
    }

    /// Device guids in use.
    pub fn device_guids(&self) -> Vec<u64> {
        self.inner.lock().devs.iter().map(|d| d.guid).collect()
    }

    /// Takes a cache device into use: its persisted contents are rebuilt when its header
    /// belongs to this pool, else it starts empty.
    pub fn add_device(&self, top: Arc<TopVdev>) {
        let guid = top.guid;
        if self.inner.lock().devs.iter().any(|d| d.guid == guid) {
            return;
        }
        let space = top.space();
        let mut dev = Dev {
            start: HEADER_SIZE.max(top.sector()),
            end: space,
            hand: HEADER_SIZE.max(top.sector()),
            newest_log: None,
            by_addr: BTreeMap::new(),
            bytes: 0,
            failed: false,
            guid,
            top,
        };
        let rebuilt = self.rebuild(&mut dev);
        let mut g = self.inner.lock();
        if let Some((entries, logs)) = rebuilt {
            g.stats.l2_rebuild_success += 1;
            g.stats.l2_rebuild_log_blks += logs;
            for (id, hdr) in entries {
                dev.by_addr.insert(hdr.daddr, id);
                dev.bytes += u64::from(hdr.psize);
                g.stats.l2_rebuild_bufs += 1;
                g.hdrs.insert(id, hdr);
            }
        }
        g.devs.push(dev);
    }

    /// Stops using a cache device and forgets what it held.
    pub fn remove_device(&self, guid: u64) {
        let mut g = self.inner.lock();
        g.devs.retain(|d| d.guid != guid);
        g.hdrs.retain(|_, h| h.dev != guid);
    }

    /// A verified copy of a block from a cache device, if one holds it.
    pub fn read(&self, key: &ArcKey, bp: &BlockPtr) -> Option<Arc<Vec<u8>>> {
        let id = BlockId::from(key);
        let (hdr, top) = {
            let mut g = self.inner.lock();
            if g.devs.is_empty() {
                return None;
            }
            let Some(hdr) = g.hdrs.get(&id).copied() else {
                g.stats.l2_misses += 1;
                return None;
            };
            let top = g.devs.iter().find(|d| d.guid == hdr.dev)?.top.clone();
            (hdr, top)
        };
        let psize = bp.psize as usize;
        let ok = |buf: &[u8]| {
            buf.len() >= psize
                && hdr.psize as usize == psize
                && buf[psize..].iter().all(|&b| b == 0)
                && bp.checksum_kind.compute(&buf[..psize]) == bp.checksum
        };
        let len = top.round(u64::from(hdr.psize));
        let result = top.leaves[0].read(hdr.daddr, len as usize);
        let mut g = self.inner.lock();
        match result {
            Ok(mut buf) if ok(&buf) => {
                g.stats.l2_hits += 1;
                buf.truncate(psize);
                Some(Arc::new(buf))
            }
            other => {
                if other.is_ok() {
                    g.stats.l2_cksum_bad += 1;
                } else {
                    g.stats.l2_io_error += 1;
                }
                g.stats.l2_misses += 1;
                Self::drop_hdr(&mut g, &id);
                None
            }
        }
    }

    fn drop_hdr(g: &mut Inner, id: &BlockId) {
        if let Some(h) = g.hdrs.remove(id) {
            if let Some(d) = g.devs.iter_mut().find(|d| d.guid == h.dev) {
                d.by_addr.remove(&h.daddr);
                d.bytes -= u64::from(h.psize);
            }
        }
    }

    /// Forgets a freed block.
    pub fn forget(&self, key: &ArcKey) {
        let mut g = self.inner.lock();
        if !g.devs.is_empty() {
            Self::drop_hdr(&mut g, &BlockId::from(key));
        }
    }

    pub fn stats(&self) -> L2Stats {
        let g = self.inner.lock();
        let mut s = g.stats.clone();
        s.l2_devices = g.devs.len() as u64;
        s.l2_buffers = g.hdrs.len() as u64;
        s.l2_size = g.devs.iter().map(|d| d.bytes).sum();
        s.l2_asize = g.devs.iter().map(|d| d.end - d.start).sum();
        s.l2_hdr_size = s.l2_buffers * L2_HDR_BYTES;
        s
    }

    /// One feed round (see the module documentation) for pool instance `spa`: writes to
    /// the next device in turn. Returns the bytes written.
    pub fn feed(&self, arc: &AdaptiveCache, spa: u64) -> u64 {
        let _one = self.feed_lock.lock();
        let t = tunables();
        let (top, mut hand, start, end, sector, guid, prev) = {
            let mut g = self.inner.lock();
            let n = g.devs.len();
            if n == 0 {
                return 0;
            }
            let Some(i) = (0..n)
                .map(|k| (g.rotor + k) % n)
                .find(|&i| !g.devs[i].failed && g.devs[i].top.readable())
            else {
                return 0;
            };
            g.rotor = i + 1;
            let d = &g.devs[i];
            (
                d.top.clone(),
                d.hand,
                d.start,
                d.end,
                d.sector(),
                d.guid,
                d.newest_log,
            )
        };
        let warm = arc.stats().evict_count > 0;
        let mut budget = t.write_max.load(Ordering::Relaxed);
        if !warm {
            budget += t.write_boost.load(Ordering::Relaxed);
        }
        // A round never takes more than a quarter of the ring.
        budget = budget.min((end - start) / 4);
        let round = |n: u64| n.div_ceil(sector) * sector;
        let mut picked = arc.l2_candidates(spa, budget, t.noprefetch.load(Ordering::Relaxed));
        picked.retain(|(_, data, _)| round(data.len() as u64) <= budget);
        if picked.is_empty() {
            return 0;
        }
        let data_len: u64 = picked.iter().map(|(_, d, _)| round(d.len() as u64)).sum();
        let log_len = round((LOG_HEAD + LOG_ENTRY * picked.len() + 32) as u64);
        let total = data_len + log_len;
        if hand + total > end {
            hand = start;
        }
        // Drop the headers of what the hand is about to overwrite.
        {
            let mut g = self.inner.lock();
            let Some(d) = g.devs.iter_mut().find(|d| d.guid == guid) else {
                return 0;
            };
            let doomed: Vec<(u64, BlockId)> = d
                .by_addr
                .range(hand..hand + total)
                .map(|(a, id)| (*a, *id))
                .collect();
            // A block that starts before the region may reach into it.
            let straddler = d.by_addr.range(..hand).next_back().map(|(a, id)| (*a, *id));
            let mut gone = doomed;
            if let Some((a, id)) = straddler {
                if g.hdrs
                    .get(&id)
                    .is_some_and(|h| a + u64::from(h.psize) > hand)
                {
                    gone.push((a, id));
                }
            }
            for (_, id) in &gone {
                Self::drop_hdr(&mut g, id);
            }
            g.stats.l2_evict_reading += gone.len() as u64;
        }
        // Lay the blocks out and build the log block.
        let mut buf = Vec::with_capacity(total as usize);
        let mut entries = Vec::with_capacity(picked.len());
        for (key, data, meta) in &picked {
            let daddr = hand + buf.len() as u64;
            buf.extend_from_slice(data);
            buf.resize(round(buf.len() as u64) as usize, 0);
            entries.push((
                BlockId::from(key),
                Hdr {
                    dev: guid,
                    daddr,
                    psize: data.len() as u32,
                    meta: *meta,
                },
            ));
        }
        let log_daddr = hand + buf.len() as u64;
        let log = self.encode_log(prev, &entries, log_len as usize);
        let log_ptr = LogPtr {
            daddr: log_daddr,
            len: log.len() as u32,
            cksum: ChecksumKind::Blake3.compute(&log),
        };
        buf.extend_from_slice(&log);
        let new_hand = hand + buf.len() as u64;
        let header = self.encode_header(guid, start, end, new_hand, &log_ptr, sector);
        let batch = IoBatch::new();
        let mut failed = top.write(hand, &buf, &batch).is_err();
        failed |= !batch.wait().is_empty();
        if !failed {
            top.flush(&batch);
            failed |= !batch.wait().is_empty();
        }
        if !failed {
            failed |= top.write(0, &header, &batch).is_err();
            top.flush(&batch);
            failed |= !batch.wait().is_empty();
        }
        let mut g = self.inner.lock();
        g.stats.l2_feeds += 1;
        if failed {
            g.stats.l2_writes_error += 1;
            if let Some(d) = g.devs.iter_mut().find(|d| d.guid == guid) {
                d.failed = true;
            }
            for (key, _, _) in &picked {
                arc.l2_forget(key);
            }
            return 0;
        }
        g.stats.l2_writes_sent += 1;
        g.stats.l2_write_bytes += buf.len() as u64;
        let Some(d) = g.devs.iter_mut().find(|d| d.guid == guid) else {
            return 0;
        };
        d.hand = new_hand;
        d.newest_log = Some(log_ptr);
        for (id, hdr) in &entries {
            d.by_addr.insert(hdr.daddr, *id);
            d.bytes += u64::from(hdr.psize);
        }
        for (id, hdr) in entries {
            if let Some(old) = g.hdrs.insert(id, hdr) {
                // Fed again (after an eviction and a re-read): the older copy is unused.
                if let Some(d) = g.devs.iter_mut().find(|d| d.guid == old.dev) {
                    if old.daddr != hdr.daddr {
                        d.by_addr.remove(&old.daddr);
                        d.bytes -= u64::from(old.psize);
                    }
                }
            }
        }
        buf.len() as u64
    }

    fn encode_log(&self, prev: Option<LogPtr>, entries: &[(BlockId, Hdr)], len: usize) -> Vec<u8> {
        let mut b = Vec::with_capacity(len);
        b.extend_from_slice(LOG_MAGIC);
        prev.unwrap_or_default().encode(&mut b);
        b.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        b.extend_from_slice(&self.pool_guid.load(Ordering::Acquire).to_le_bytes());
        for (id, h) in entries {
            b.extend_from_slice(&id.vdev.to_le_bytes());
            b.extend_from_slice(&id.offset.to_le_bytes());
            b.extend_from_slice(&id.birth.to_le_bytes());
            b.extend_from_slice(&h.daddr.to_le_bytes());
            b.extend_from_slice(&h.psize.to_le_bytes());
            b.extend_from_slice(&u32::from(h.meta).to_le_bytes());
        }
        b.resize(len, 0);
        b
    }

    fn encode_header(
        &self,
        guid: u64,
        start: u64,
        end: u64,
        hand: u64,
        newest: &LogPtr,
        sector: u64,
    ) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEADER_SIZE as usize);
        b.extend_from_slice(HEADER_MAGIC);
        b.extend_from_slice(&self.pool_guid.load(Ordering::Acquire).to_le_bytes());
        b.extend_from_slice(&guid.to_le_bytes());
        b.extend_from_slice(&start.to_le_bytes());
        b.extend_from_slice(&end.to_le_bytes());
        b.extend_from_slice(&hand.to_le_bytes());
        newest.encode(&mut b);
        let ck = ChecksumKind::Blake3.compute(&b);
        b.extend_from_slice(&ck);
        b.resize(HEADER_SIZE.max(sector) as usize, 0);
        b
    }

    /// Reads a device's header and walks its log chain; None when the device holds no
    /// L2ARC of this pool (new, another pool's, or a torn header).
    fn rebuild(&self, dev: &mut Dev) -> Option<(Vec<(BlockId, Hdr)>, u64)> {
        let pool = self.pool_guid.load(Ordering::Acquire);
        let hdr_len = dev.round(HEADER_SIZE) as usize;
        let h = dev.top.leaves[0].read(0, hdr_len).ok()?;
        let body = 8 + 8 * 5 + 44;
        // Addresses and lengths below come from the device: every one is checked before it
        // is used (a torn or foreign device ends the walk, never the process).
        if h.len() < body + 32
            || &h[..8] != HEADER_MAGIC
            || ChecksumKind::Blake3.compute(&h[..body])[..] != h[body..body + 32]
        {
            return None;
        }
        let u = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().expect("8"));
        if u(8) != pool || u(16) != dev.guid || u(24) != dev.start || u(32) != dev.end {
            return None;
        }
        let hand = u(40);
        if hand < dev.start || hand > dev.end {
            return None;
        }
        dev.hand = hand;
        let mut next = Some(LogPtr::decode(&h[48..92])).filter(|p| p.len > 0);
        dev.newest_log = next;
        let mut out: Vec<(BlockId, Hdr)> = Vec::new();
        // Space claimed by newer writes, walking back: [lo, hi) per claimed range.
        let mut claimed: Vec<(u64, u64)> = Vec::new();
        let mut seen_ids = std::collections::HashSet::new();
        let mut logs = 0;
        let overlaps = |claimed: &[(u64, u64)], a: u64, b: u64| {
            claimed.iter().any(|&(lo, hi)| a < hi && lo < b)
        };
        let mut walked = 0u64;
        while let Some(p) = next.take() {
            let plen = u64::from(p.len);
            let Some(pend) = p.daddr.checked_add(plen) else {
                break;
            };
            if p.daddr < dev.start
                || pend > dev.end
                || (p.len as usize) < LOG_HEAD
                || overlaps(&claimed, p.daddr, pend)
                || walked > dev.end - dev.start
            {
                break;
            }
            let Ok(b) = dev.top.leaves[0].read(p.daddr, p.len as usize) else {
                break;
            };
            if b.len() < LOG_HEAD
                || ChecksumKind::Blake3.compute(&b) != p.cksum
                || &b[..8] != LOG_MAGIC
                || u64::from_le_bytes(b[56..64].try_into().expect("8")) != pool
            {
                break;
            }
            logs += 1;
            walked += plen;
            claimed.push((p.daddr, pend));
            let count = u32::from_le_bytes(b[52..56].try_into().expect("4")) as usize;
            if count
                .checked_mul(LOG_ENTRY)
                .and_then(|n| n.checked_add(LOG_HEAD))
                .is_none_or(|n| n > b.len())
            {
                break;
            }
            let mut lo = u64::MAX;
            for i in 0..count {
                let e = &b[LOG_HEAD + i * LOG_ENTRY..LOG_HEAD + (i + 1) * LOG_ENTRY];
                let id = BlockId {
                    vdev: u32::from_le_bytes(e[0..4].try_into().expect("4")),
                    offset: u64::from_le_bytes(e[4..12].try_into().expect("8")),
                    birth: u64::from_le_bytes(e[12..20].try_into().expect("8")),
                };
                let hdr = Hdr {
                    dev: dev.guid,
                    daddr: u64::from_le_bytes(e[20..28].try_into().expect("8")),
                    psize: u32::from_le_bytes(e[28..32].try_into().expect("4")),
                    meta: e[32] & 1 != 0,
                };
                let a = hdr.daddr;
                let Some(z) = a.checked_add(u64::from(hdr.psize)) else {
                    continue;
                };
                if a < dev.start || z > dev.end {
                    continue;
                }
                lo = lo.min(a);
                if overlaps(&claimed, a, z) {
                    continue;
                }
                if seen_ids.insert(id) {
                    out.push((id, hdr));
                }
            }
            if lo != u64::MAX {
                claimed.push((lo, p.daddr));
            }
            next = Some(LogPtr::decode(&b[8..52])).filter(|p| p.len > 0);
        }
        Some((out, logs))
    }
}
