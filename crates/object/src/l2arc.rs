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
//! smaller, never wrong (every read is verified anyway). Arithmetic on what the header and
//! the log blocks say is checked (`clippy::arithmetic_side_effects` is denied here).

#![deny(clippy::arithmetic_side_effects)]

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
/// The device header's checksummed part: magic, pool guid, device guid, ring start and end,
/// write hand, newest log pointer.
const HEADER_BODY: usize = 8 + 8 * 5 + 44;
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Hdr {
    dev: u64,
    daddr: u64,
    psize: u32,
    meta: bool,
}

impl Hdr {
    /// The end of the block's space on the device (it lies in the ring: nothing saturates).
    fn end(&self) -> u64 {
        self.daddr.saturating_add(u64::from(self.psize))
    }
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
            g.stats.l2_rebuild_success = g.stats.l2_rebuild_success.saturating_add(1);
            g.stats.l2_rebuild_log_blks = g.stats.l2_rebuild_log_blks.saturating_add(logs);
            for (id, hdr) in entries {
                dev.by_addr.insert(hdr.daddr, id);
                dev.bytes = dev.bytes.saturating_add(u64::from(hdr.psize));
                g.stats.l2_rebuild_bufs = g.stats.l2_rebuild_bufs.saturating_add(1);
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
                g.stats.l2_misses = g.stats.l2_misses.saturating_add(1);
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
                g.stats.l2_hits = g.stats.l2_hits.saturating_add(1);
                buf.truncate(psize);
                Some(Arc::new(buf))
            }
            other => {
                if other.is_ok() {
                    g.stats.l2_cksum_bad = g.stats.l2_cksum_bad.saturating_add(1);
                } else {
                    g.stats.l2_io_error = g.stats.l2_io_error.saturating_add(1);
                }
                g.stats.l2_misses = g.stats.l2_misses.saturating_add(1);
                Self::drop_hdr(&mut g, &id);
                None
            }
        }
    }

    fn drop_hdr(g: &mut Inner, id: &BlockId) {
        if let Some(h) = g.hdrs.remove(id) {
            if let Some(d) = g.devs.iter_mut().find(|d| d.guid == h.dev) {
                d.by_addr.remove(&h.daddr);
                d.bytes = d.bytes.saturating_sub(u64::from(h.psize));
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
        s.l2_asize = g.devs.iter().map(|d| d.end.saturating_sub(d.start)).sum();
        s.l2_hdr_size = s.l2_buffers.saturating_mul(L2_HDR_BYTES);
        s
    }

    /// One feed round (see the module documentation) for pool instance `spa`: writes to
    /// the next device in turn. Returns the bytes written.
    pub fn feed(&self, arc: &AdaptiveCache, spa: u64) -> u64 {
        let _one = self.feed_lock.lock();
        let t = tunables();
        let (top, hand, start, end, sector, guid, prev) = {
            let mut g = self.inner.lock();
            let n = g.devs.len();
            if n == 0 {
                return 0;
            }
            let first = g.rotor.checked_rem(n).unwrap_or(0);
            let Some(i) = (first..n)
                .chain(0..first)
                .find(|&i| !g.devs[i].failed && g.devs[i].top.readable())
            else {
                return 0;
            };
            // An index into `devs`: far below usize::MAX.
            g.rotor = i.saturating_add(1);
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
            budget = budget.saturating_add(t.write_boost.load(Ordering::Relaxed));
        }
        // A round never takes more than a quarter of the ring.
        budget = budget.min(end.saturating_sub(start) / 4);
        // Whole sectors (a length too large to round is larger than any budget).
        let round = |n: usize| {
            u64::try_from(n)
                .ok()
                .and_then(|n| n.checked_next_multiple_of(sector))
                .unwrap_or(u64::MAX)
        };
        let mut picked = arc.l2_candidates(spa, budget, t.noprefetch.load(Ordering::Relaxed));
        picked.retain(|(_, data, _)| round(data.len()) <= budget);
        if picked.is_empty() {
            return 0;
        }
        let data_len: u64 = picked.iter().map(|(_, d, _)| round(d.len())).sum();
        let log_len = round(
            LOG_ENTRY
                .saturating_mul(picked.len())
                .saturating_add(LOG_HEAD + 32),
        );
        let total = data_len.saturating_add(log_len);
        // The round goes at the hand, or at the ring start when it would pass the end (and
        // nowhere when it is larger than the ring).
        let placed = [hand, start]
            .into_iter()
            .find_map(|at| at.checked_add(total).filter(|&z| z <= end).map(|z| (at, z)));
        let Some((hand, round_end)) = placed else {
            for (key, _, _) in &picked {
                arc.l2_forget(key);
            }
            return 0;
        };
        // Where `buf`'s byte `at` goes: `buf` holds `total` bytes, and `hand + total` fits.
        #[allow(clippy::arithmetic_side_effects)]
        let daddr_of = |at: usize| hand + at as u64;
        // Drop the headers of what the hand is about to overwrite.
        {
            let mut g = self.inner.lock();
            let Some(d) = g.devs.iter_mut().find(|d| d.guid == guid) else {
                return 0;
            };
            let doomed: Vec<(u64, BlockId)> = d
                .by_addr
                .range(hand..round_end)
                .map(|(a, id)| (*a, *id))
                .collect();
            // A block that starts before the region may reach into it.
            let straddler = d.by_addr.range(..hand).next_back().map(|(a, id)| (*a, *id));
            let mut gone = doomed;
            if let Some((a, id)) = straddler {
                if g.hdrs.get(&id).is_some_and(|h| h.end() > hand) {
                    gone.push((a, id));
                }
            }
            for (_, id) in &gone {
                Self::drop_hdr(&mut g, id);
            }
            let evicted = u64::try_from(gone.len()).unwrap_or(u64::MAX);
            g.stats.l2_evict_reading = g.stats.l2_evict_reading.saturating_add(evicted);
        }
        // Lay the blocks out and build the log block.
        let mut buf = Vec::with_capacity(total as usize);
        let mut entries = Vec::with_capacity(picked.len());
        for (key, data, meta) in &picked {
            let daddr = daddr_of(buf.len());
            buf.extend_from_slice(data);
            buf.resize(round(buf.len()) as usize, 0);
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
        let log_daddr = daddr_of(buf.len());
        let log = self.encode_log(prev, &entries, log_len as usize);
        let log_ptr = LogPtr {
            daddr: log_daddr,
            len: log.len() as u32,
            cksum: ChecksumKind::Blake3.compute(&log),
        };
        buf.extend_from_slice(&log);
        let new_hand = daddr_of(buf.len());
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
        g.stats.l2_feeds = g.stats.l2_feeds.saturating_add(1);
        if failed {
            g.stats.l2_writes_error = g.stats.l2_writes_error.saturating_add(1);
            if let Some(d) = g.devs.iter_mut().find(|d| d.guid == guid) {
                d.failed = true;
            }
            for (key, _, _) in &picked {
                arc.l2_forget(key);
            }
            return 0;
        }
        g.stats.l2_writes_sent = g.stats.l2_writes_sent.saturating_add(1);
        g.stats.l2_write_bytes = g.stats.l2_write_bytes.saturating_add(buf.len() as u64);
        let Some(d) = g.devs.iter_mut().find(|d| d.guid == guid) else {
            return 0;
        };
        d.hand = new_hand;
        d.newest_log = Some(log_ptr);
        for (id, hdr) in &entries {
            d.by_addr.insert(hdr.daddr, *id);
            d.bytes = d.bytes.saturating_add(u64::from(hdr.psize));
        }
        for (id, hdr) in entries {
            if let Some(old) = g.hdrs.insert(id, hdr) {
                // Fed again (after an eviction and a re-read): the older copy is unused.
                if let Some(d) = g.devs.iter_mut().find(|d| d.guid == old.dev) {
                    if old.daddr != hdr.daddr {
                        d.by_addr.remove(&old.daddr);
                        d.bytes = d.bytes.saturating_sub(u64::from(old.psize));
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
        let hdr_len = HEADER_SIZE.checked_next_multiple_of(dev.sector())?;
        let h = dev.top.leaves[0]
            .read(0, usize::try_from(hdr_len).ok()?)
            .ok()?;
        // Addresses and lengths below come from the device: every one is checked before it
        // is used (a torn or foreign device ends the walk, never the process).
        if h.len() < HEADER_BODY + 32
            || &h[..8] != HEADER_MAGIC
            || ChecksumKind::Blake3.compute(&h[..HEADER_BODY])[..] != h[HEADER_BODY..][..32]
        {
            return None;
        }
        let u = |o: usize| u64::from_le_bytes(h[o..][..8].try_into().expect("8"));
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
        let ring = dev.end.saturating_sub(dev.start);
        let mut out: Vec<(BlockId, Hdr)> = Vec::new();
        // Space claimed by newer writes, walking back: [lo, hi) per claimed range.
        let mut claimed: Vec<(u64, u64)> = Vec::new();
        let mut seen_ids = std::collections::HashSet::new();
        let mut logs = 0u64;
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
                || walked > ring
            {
                break;
            }
            let Ok(b) = dev.top.leaves[0].read(p.daddr, p.len as usize) else {
                break;
            };
            let Ok(block) = decode_log_block(&b, &p.cksum, pool, dev.guid, dev.start, dev.end)
            else {
                break;
            };
            logs = logs.saturating_add(1);
            walked = walked.saturating_add(plen);
            claimed.push((p.daddr, pend));
            let lo = block.entries.iter().map(|(_, hdr)| hdr.daddr).min();
            for (id, hdr) in block.entries {
                if !overlaps(&claimed, hdr.daddr, hdr.end()) && seen_ids.insert(id) {
                    out.push((id, hdr));
                }
            }
            if let Some(lo) = lo {
                claimed.push((lo, p.daddr));
            }
            next = block.prev;
        }
        Some((out, logs))
    }
}

/// A log block read back from a cache device.
#[derive(Debug)]
struct LogBlock {
    /// The blocks it lists that lie in the ring, in its order.
    entries: Vec<(BlockId, Hdr)>,
    /// The log block written before it, if any.
    prev: Option<LogPtr>,
}

/// Decodes log block `b` of cache device `dev` (its guid), whose ring is `[start, end)`:
/// `b` must match `cksum` (from the pointer that led to it), carry the magic and `pool`'s
/// guid, and hold every entry it counts. An entry whose block does not lie in the ring is
/// skipped. Everything here comes from the device.
fn decode_log_block(
    b: &[u8],
    cksum: &[u8; 32],
    pool: u64,
    dev: u64,
    start: u64,
    end: u64,
) -> Result<LogBlock, String> {
    if b.len() < LOG_HEAD {
        return Err(format!(
            "L2ARC log block: {} bytes, shorter than its head",
            b.len()
        ));
    }
    if ChecksumKind::Blake3.compute(b) != *cksum {
        return Err("L2ARC log block: checksum mismatch".into());
    }
    if &b[..8] != LOG_MAGIC {
        return Err("L2ARC log block: bad magic".into());
    }
    let owner = u64::from_le_bytes(b[56..64].try_into().expect("8"));
    if owner != pool {
        return Err(format!("L2ARC log block: of pool {owner:#x}, not this one"));
    }
    let count = u32::from_le_bytes(b[52..56].try_into().expect("4"));
    let listed = b[LOG_HEAD..].chunks_exact(LOG_ENTRY);
    let n = usize::try_from(count)
        .ok()
        .filter(|&n| n <= listed.len())
        .ok_or_else(|| {
            format!(
                "L2ARC log block: {count} entries counted, room for {}",
                listed.len()
            )
        })?;
    let entries = listed
        .take(n)
        .filter_map(|e| {
            let id = BlockId {
                vdev: u32::from_le_bytes(e[0..4].try_into().expect("4")),
                offset: u64::from_le_bytes(e[4..12].try_into().expect("8")),
                birth: u64::from_le_bytes(e[12..20].try_into().expect("8")),
            };
            let hdr = Hdr {
                dev,
                daddr: u64::from_le_bytes(e[20..28].try_into().expect("8")),
                psize: u32::from_le_bytes(e[28..32].try_into().expect("4")),
                meta: e[32] & 1 != 0,
            };
            let z = hdr.daddr.checked_add(u64::from(hdr.psize))?;
            (hdr.daddr >= start && z <= end).then_some((id, hdr))
        })
        .collect();
    Ok(LogBlock {
        entries,
        prev: Some(LogPtr::decode(&b[8..52])).filter(|p| p.len > 0),
    })
}

/// For the fuzz target: `data` as a log block whose magic and checksum match (its pool is
/// its own), of a ring from 4 KiB to 1 TiB.
pub(crate) fn fuzz_log_block(data: &[u8]) {
    let mut b = data.to_vec();
    b.resize(b.len().max(LOG_HEAD), 0);
    b[..8].copy_from_slice(LOG_MAGIC);
    let pool = u64::from_le_bytes(b[56..64].try_into().expect("8"));
    let cksum = ChecksumKind::Blake3.compute(&b);
    let _ = decode_log_block(&b, &cksum, pool, 1, HEADER_SIZE, 1 << 40);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(offset: u64, daddr: u64) -> (BlockId, Hdr) {
        let id = BlockId {
            vdev: 0,
            offset,
            birth: 7,
        };
        let hdr = Hdr {
            dev: 9,
            daddr,
            psize: 4096,
            meta: offset == 0,
        };
        (id, hdr)
    }

    #[test]
    fn a_log_block_decodes_to_the_entries_that_lie_in_the_ring() {
        let l2 = L2Arc::new();
        l2.set_pool_guid(5);
        let prev = LogPtr {
            daddr: 1 << 20,
            len: 512,
            cksum: [3; 32],
        };
        let entries = [entry(0, 8192), entry(1, 1 << 30), entry(2, 12288)];
        let b = l2.encode_log(Some(prev), &entries, 512);
        let cksum = ChecksumKind::Blake3.compute(&b);
        let ring = (4096, 1 << 20);
        let block = decode_log_block(&b, &cksum, 5, 9, ring.0, ring.1).unwrap();
        assert_eq!(block.entries, [entries[0], entries[2]]);
        assert_eq!(block.prev, Some(prev));
        // Another pool's, or not the block its pointer says: refused.
        assert!(decode_log_block(&b, &cksum, 6, 9, ring.0, ring.1).is_err());
        assert!(decode_log_block(&b, &[0; 32], 5, 9, ring.0, ring.1).is_err());
        // More entries counted than the block holds: refused.
        let mut b = b;
        b[52..56].copy_from_slice(&100u32.to_le_bytes());
        let cksum = ChecksumKind::Blake3.compute(&b);
        assert!(decode_log_block(&b, &cksum, 5, 9, ring.0, ring.1).is_err());
        // The first log block of a device points at none.
        let b = l2.encode_log(None, &[], 512);
        let cksum = ChecksumKind::Blake3.compute(&b);
        let block = decode_log_block(&b, &cksum, 5, 9, ring.0, ring.1).unwrap();
        assert!(block.entries.is_empty() && block.prev.is_none());
    }
}
