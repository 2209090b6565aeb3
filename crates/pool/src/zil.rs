//! The intent log (ZFS's zil): what fsync, O_SYNC and `sync=always` wait for instead of a txg.
//!
//! # Theory of operation
//! The layer above hands [`IntentLog::write`] a list of entries (an object set id, the txg of
//! the change, opaque bytes). They go to stable storage as one *commit*: one or more log
//! blocks, each checksummed over itself (its parent cannot hold its checksum: it is written
//! before anything points at it), chained by sequence number, the last marked as the end of
//! the commit; then the log devices it was written to are flushed. Replay applies entries
//! only up to the last complete commit.
//!
//! Blocks are written into a *ring*: the whole of a `log` vdev when the pool has one (a
//! mirrored log vdev mirrors every block), otherwise a region of a normal vdev allocated
//! once, at the first commit, and kept (as OpenZFS's embedded log class keeps a metaslab per
//! vdev). Where OpenZFS allocates every log block from the space maps and claims them at
//! import, a ring needs no claiming and never leaks: what may be overwritten is decided by
//! the txgs alone.
//!
//! The chain's head (the oldest block that may hold entries newer than the committed txg,
//! with the sequence number and size it must have) is in the root block of every txg, so it
//! commits atomically with the state the log continues. A block with entries of txg `t` is
//! *live* until txg `t` commits; the ring refuses (`Full`) a block that would overwrite a
//! live one, and the caller falls back to waiting for a txg. Every block says where the next
//! one goes and its size, so stale blocks of an earlier lap never pass (their sequence
//! number is lower) and a torn block ends the chain.
//!
//! When the log cannot take a commit (no ring yet, the ring full, a log device failed, the
//! ring moving to another device), `write` returns an error and the caller waits for a txg
//! sync instead: slower, never less safe. The ring moves only when no block is live, at a
//! txg commit, so a chain never spans two places.
//!
//! At import the chain is read from the head; entries of txgs after the committed one are
//! handed to the layer above ([`IntentLog::take_replay`]), and the blocks stay live until
//! the txg that holds the replayed changes commits ([`IntentLog::replayed`]). Arithmetic on
//! what the chain says (sizes, offsets, sequence numbers) is checked
//! (`clippy::arithmetic_side_effects` is denied here).
//!
//! # Concurrency
//! `writer` serializes commits (one chain, written in order); `state` guards the ring and is
//! never held across I/O.

#![deny(clippy::arithmetic_side_effects)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use serde::Serialize;
use tank_vdev::{IoBatch, TopVdev};

pub const LOG_MAGIC: &[u8; 8] = b"TANKZLOG";
pub const LOG_VERSION: u32 = 1;
/// Bytes before a block's entries.
pub const BLOCK_HEADER: usize = 96;
/// Bytes before an entry's data.
pub const ENTRY_HEADER: usize = 24;
/// Largest log block; larger commits take several.
pub const MAX_BLOCK: u64 = 256 << 10;
/// Most bytes of entries a block holds.
const MAX_PAYLOAD: usize = MAX_BLOCK as usize - BLOCK_HEADER;
/// Smallest pool region (and the part of the normal class it takes at most: 1/128, up to
/// `MAX_REGION`).
pub const MIN_REGION: u64 = 4 << 20;
pub const MAX_REGION: u64 = 256 << 20;
const FLAG_COMMIT_END: u32 = 1;

/// One change the layer above logged: its object set, its txg and its encoding. `seq` is the
/// sequence number of the block it was read from (replay only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    pub objset: u64,
    pub txg: u64,
    pub seq: u64,
    pub data: Vec<u8>,
}

/// Why a commit did not go to the log (the caller waits for a txg instead).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogError {
    #[error("the pool has no intent log space yet")]
    NoRegion,
    #[error("the intent log is full until the next txg commits")]
    Full,
    #[error("the intent log is moving to another device")]
    Moving,
    #[error("intent log write failed: {0}")]
    Io(String),
    #[error("log entry of {0} bytes is larger than a log block")]
    TooLarge(usize),
}

/// Where the ring lives: `[start, end)` of top-level vdev `vdev`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Region {
    pub vdev: u32,
    pub start: u64,
    pub end: u64,
}

/// The chain's head as the root block of a txg records it (FORMAT.md, root block 424..480).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogHeader {
    pub guid: u64,
    pub head_vdev: u32,
    pub head_offset: u64,
    pub head_seq: u64,
    pub head_size: u32,
    /// The normal-class region, once allocated.
    pub region: Option<Region>,
}

impl LogHeader {
    pub const OFFSET: usize = 424;
    pub const SIZE: usize = 56;

    pub fn encode(&self, b: &mut [u8]) {
        let b = &mut b[..Self::SIZE];
        b.fill(0);
        if self.guid == 0 {
            return;
        }
        b[0..4].copy_from_slice(&LOG_VERSION.to_le_bytes());
        b[4..8].copy_from_slice(&self.head_vdev.to_le_bytes());
        b[8..16].copy_from_slice(&self.guid.to_le_bytes());
        b[16..24].copy_from_slice(&self.head_seq.to_le_bytes());
        b[24..32].copy_from_slice(&self.head_offset.to_le_bytes());
        b[32..36].copy_from_slice(&self.head_size.to_le_bytes());
        if let Some(r) = self.region {
            b[36..40].copy_from_slice(&r.vdev.to_le_bytes());
            b[40..48].copy_from_slice(&r.start.to_le_bytes());
            // An empty (or inverted) region is recorded as none.
            b[48..56].copy_from_slice(&r.end.saturating_sub(r.start).to_le_bytes());
        }
    }

    pub fn decode(b: &[u8]) -> Result<Self, String> {
        let b = b
            .get(..Self::SIZE)
            .ok_or_else(|| format!("intent log header: {} bytes, not {}", b.len(), Self::SIZE))?;
        let u32_at = |o: usize| u32_le(&b[o..]);
        let u64_at = |o: usize| u64_le(&b[o..]);
        match u32_at(0) {
            0 => return Ok(Self::default()),
            LOG_VERSION => {}
            v => return Err(format!("intent log header: unsupported version {v}")),
        }
        let len = u64_at(48);
        let head_size = u32_at(32);
        if !valid_block_size(head_size) {
            return Err(format!("intent log header: bad block size {head_size}"));
        }
        let start = u64_at(40);
        let region = match (len > 0).then(|| start.checked_add(len)) {
            None => None,
            Some(Some(end)) => Some(Region {
                vdev: u32_at(36),
                start,
                end,
            }),
            Some(None) => {
                return Err(format!(
                    "intent log header: region [{start:#x}, +{len:#x}) past any vdev"
                ))
            }
        };
        Ok(Self {
            guid: u64_at(8),
            head_vdev: u32_at(4),
            head_seq: u64_at(16),
            head_offset: u64_at(24),
            head_size,
            region,
        })
    }
}

/// A log block as written (FORMAT.md §13).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Block {
    guid: u64,
    seq: u64,
    commit_end: bool,
    next_vdev: u32,
    next_offset: u64,
    next_size: u32,
    entries: Vec<LogEntry>,
}

/// Whether a block size read from the device is possible: 0 (no chain to read: the log never
/// had a place), or whole 512-byte sectors up to `MAX_BLOCK`.
fn valid_block_size(size: u32) -> bool {
    size == 0 || ((512..=MAX_BLOCK as u32).contains(&size) && size.is_multiple_of(512))
}

/// The little-endian u32 at the start of `b`.
fn u32_le(b: &[u8]) -> u32 {
    u32::from_le_bytes(b[..4].try_into().expect("4"))
}

/// The little-endian u64 at the start of `b`.
fn u64_le(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().expect("8"))
}

/// Bytes an entry takes in a block: its header, and its data padded to 8 bytes.
#[allow(clippy::arithmetic_side_effects)] // A Vec's length is at most isize::MAX: no overflow.
fn entry_bytes(e: &LogEntry) -> usize {
    ENTRY_HEADER + e.data.len().div_ceil(8) * 8
}

impl Block {
    fn encode(&self, size: usize) -> Vec<u8> {
        let mut b = vec![0u8; size];
        b[0..8].copy_from_slice(LOG_MAGIC);
        b[8..12].copy_from_slice(&LOG_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&u32::from(self.commit_end).to_le_bytes());
        b[16..24].copy_from_slice(&self.guid.to_le_bytes());
        b[24..32].copy_from_slice(&self.seq.to_le_bytes());
        b[36..40].copy_from_slice(&(self.entries.len() as u32).to_le_bytes());
        b[40..44].copy_from_slice(&self.next_vdev.to_le_bytes());
        b[44..48].copy_from_slice(&self.next_size.to_le_bytes());
        b[48..56].copy_from_slice(&self.next_offset.to_le_bytes());
        let mut rest = &mut b[BLOCK_HEADER..];
        for e in &self.entries {
            let (entry, after) = std::mem::take(&mut rest).split_at_mut(entry_bytes(e));
            entry[0..8].copy_from_slice(&e.objset.to_le_bytes());
            entry[8..16].copy_from_slice(&e.txg.to_le_bytes());
            entry[16..20].copy_from_slice(&(e.data.len() as u32).to_le_bytes());
            entry[ENTRY_HEADER..][..e.data.len()].copy_from_slice(&e.data);
            rest = after;
        }
        let payload: usize = self.entries.iter().map(entry_bytes).sum();
        b[32..36].copy_from_slice(&(payload as u32).to_le_bytes());
        let sum = blake3::hash(&b);
        b[64..96].copy_from_slice(sum.as_bytes());
        b
    }

    /// Decodes and verifies a block that must be sequence `seq` of chain `guid`.
    fn decode(b: &[u8], guid: u64, seq: u64) -> Option<Block> {
        if b.len() < BLOCK_HEADER || &b[0..8] != LOG_MAGIC {
            return None;
        }
        let u32_at = |o: usize| u32_le(&b[o..]);
        let u64_at = |o: usize| u64_le(&b[o..]);
        if u32_at(8) != LOG_VERSION || u64_at(16) != guid || u64_at(24) != seq {
            return None;
        }
        let mut copy = b.to_vec();
        copy[64..96].fill(0);
        if blake3::hash(&copy).as_bytes() != &b[64..96] {
            return None;
        }
        let next_size = u32_at(44);
        if !valid_block_size(next_size) {
            return None;
        }
        let payload = usize::try_from(u32_at(32)).ok()?;
        let count = usize::try_from(u32_at(36)).ok()?;
        // The entries not read yet; each must lie wholly in the payload.
        let mut rest = b[BLOCK_HEADER..].get(..payload)?;
        let mut entries = Vec::with_capacity(count.min(4096));
        for _ in 0..count {
            let header = rest.get(..ENTRY_HEADER)?;
            let len = usize::try_from(u32_le(&header[16..])).ok()?;
            let e = LogEntry {
                objset: u64_le(header),
                txg: u64_le(&header[8..]),
                seq,
                data: rest[ENTRY_HEADER..].get(..len)?.to_vec(),
            };
            // The last entry's padding may reach past the payload.
            rest = rest.get(entry_bytes(&e)..).unwrap_or_default();
            entries.push(e);
        }
        Some(Block {
            guid,
            seq,
            commit_end: u32_at(12) & FLAG_COMMIT_END != 0,
            next_vdev: u32_at(40),
            next_size,
            next_offset: u64_at(48),
            entries,
        })
    }
}

/// A written block that may still be needed: until txg `max_txg` commits.
#[derive(Debug, Clone, Copy)]
struct Live {
    vdev: u32,
    offset: u64,
    seq: u64,
    size: u32,
    asize: u64,
    max_txg: u64,
}

/// Counters for `tank pool iostat -l`-style reporting and the tests.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LogStats {
    pub commits: u64,
    pub blocks: u64,
    pub bytes: u64,
    /// Commits that waited for a txg instead (no region, full, moving, a failed device).
    pub fallbacks: u64,
    pub write_errors: u64,
    /// Where the ring is now ("none" before the first commit).
    pub device: String,
    pub live_blocks: usize,
    pub replayed_entries: u64,
}

#[derive(Debug, Default)]
struct State {
    guid: u64,
    /// Where blocks go now, and the next one's position, sequence number and size.
    ring: Option<Region>,
    pos: u64,
    seq: u64,
    size: u32,
    /// The normal-class region (allocated at a commit once a log write wanted it).
    pool_region: Option<Region>,
    want_region: bool,
    live: VecDeque<Live>,
    /// A commit failed half-way or a device failed: no writes until the ring is empty and
    /// the next txg commit restarts it (possibly elsewhere).
    broken: bool,
    /// Log vdevs that failed a write; not used again by this import.
    failed: Vec<u32>,
    replay: Vec<LogEntry>,
    stats: LogStats,
}

/// The pool's intent log. See the module documentation.
#[derive(Debug, Default)]
pub struct IntentLog {
    state: Mutex<State>,
    writer: Mutex<()>,
    /// Entries written (for the tests' and benchmarks' counters).
    entries: AtomicU64,
    /// How long each commit took, from its first write to its flush.
    pub latency: tank_vdev::LatencyHistogram,
}

/// The size class of a block holding `bytes` of entries.
fn block_size(bytes: usize, sector: u64) -> u32 {
    let need = u64::try_from(BLOCK_HEADER.saturating_add(bytes)).unwrap_or(u64::MAX);
    // Capped before rounding up: MAX_BLOCK is a power of two, so the result is the same.
    need.min(MAX_BLOCK)
        .next_power_of_two()
        .clamp(sector.max(4096), MAX_BLOCK)
        .div_ceil(sector)
        .saturating_mul(sector) as u32
}

impl IntentLog {
    /// A log for a pool whose last committed root block says `header` (`None`: new pool).
    pub fn new(header: Option<LogHeader>) -> Self {
        let h = header.unwrap_or_default();
        let guid = if h.guid != 0 { h.guid } else { rand_guid() };
        let st = State {
            guid,
            pool_region: h.region,
            seq: h.head_seq.max(1),
            size: if h.guid != 0 { h.head_size } else { 0 },
            pos: h.head_offset,
            ..State::default()
        };
        Self {
            state: Mutex::new(st),
            writer: Mutex::new(()),
            entries: AtomicU64::new(0),
            latency: Default::default(),
        }
    }

    pub fn stats(&self) -> LogStats {
        let st = self.state.lock();
        let mut s = st.stats.clone();
        s.live_blocks = st.live.len();
        s.device = match st.ring {
            Some(r) if Some(r) == st.pool_region => format!("pool (vdev {})", r.vdev),
            Some(r) => format!("log vdev {}", r.vdev),
            None => "none".into(),
        };
        s
    }

    pub fn entries_written(&self) -> u64 {
        self.entries.load(Ordering::Relaxed)
    }

    /// The normal-class region, if one was allocated.
    pub fn pool_region(&self) -> Option<Region> {
        self.state.lock().pool_region
    }

    /// Whether a commit asked for a pool region that is not there yet.
    pub(crate) fn wants_region(&self) -> bool {
        let st = self.state.lock();
        st.want_region && st.pool_region.is_none()
    }

    pub(crate) fn set_pool_region(&self, region: Region) {
        let mut st = self.state.lock();
        st.pool_region = Some(region);
        st.want_region = false;
    }

    /// Reads the chain from the header of the committed root block at import, and keeps the
    /// entries of txgs after `synced` for `take_replay`. Returns an error when the head block
    /// is on a device that cannot be read (the caller decides: refuse, or `-m`).
    pub(crate) fn load(
        &self,
        header: &LogHeader,
        synced: u64,
        top: &dyn Fn(u32) -> Option<Arc<TopVdev>>,
        region_of: &dyn Fn(u32) -> Option<Region>,
    ) -> Result<(), String> {
        let mut st = self.state.lock();
        if header.guid == 0 || header.head_size == 0 {
            return Ok(());
        }
        let (mut vdev, mut offset, mut seq, mut size) = (
            header.head_vdev,
            header.head_offset,
            header.head_seq,
            header.head_size,
        );
        let mut complete = Vec::new();
        let mut pending = Vec::new();
        let mut live = Vec::new();
        loop {
            let t = match top(vdev) {
                Some(t) if t.readable() => t,
                Some(_) if seq == header.head_seq => {
                    return Err(format!("log vdev {vdev} cannot be read"));
                }
                None if seq == header.head_seq => {
                    return Err(format!("log vdev {vdev} is missing"));
                }
                _ => break,
            };
            let Some(block) = read_block(&t, offset, size, st.guid, seq) else {
                break;
            };
            live.push(Live {
                vdev,
                offset,
                seq,
                size,
                asize: t.asize(u64::from(size)),
                max_txg: u64::MAX,
            });
            pending.extend(block.entries.into_iter().filter(|e| e.txg > synced));
            if block.commit_end {
                complete.append(&mut pending);
            }
            let Some(next_seq) = seq.checked_add(1) else {
                return Err(format!(
                    "intent log block at {vdev}:{offset:#x}: sequence number {seq} overflows"
                ));
            };
            (vdev, offset, seq, size) = (
                block.next_vdev,
                block.next_offset,
                next_seq,
                block.next_size,
            );
        }
        // The ring continues where the chain ends (a torn or stale block there is rewritten);
        // a chain whose end lies outside its ring (damaged, or crafted) starts the ring over.
        st.ring = region_of(vdev);
        st.pos = match st.ring {
            Some(r) if (r.start..r.end).contains(&offset) => offset,
            Some(r) => r.start,
            None => offset,
        };
        st.seq = seq;
        st.size = size;
        st.live = live.into();
        st.stats.replayed_entries = complete.len() as u64;
        st.replay = complete;
        Ok(())
    }

    /// Forgets the chain (`import -m` without its log device, or a rewind): the next commit
    /// of the pool starts a new one.
    pub(crate) fn discard(&self) {
        let mut st = self.state.lock();
        st.live.clear();
        st.replay.clear();
        st.ring = None;
        st.guid = rand_guid();
        st.seq = 1;
    }

    /// The entries to replay (once): complete commits of txgs after the committed one.
    pub fn take_replay(&self) -> Vec<LogEntry> {
        std::mem::take(&mut self.state.lock().replay)
    }

    /// The replayed changes are in txg `txg`: the chain read at import is needed until then.
    pub fn replayed(&self, txg: u64) {
        for l in self.state.lock().live.iter_mut() {
            if l.max_txg == u64::MAX {
                l.max_txg = txg;
            }
        }
    }

    /// The header for the root block of `txg`, and with it the ring's move to `preferred`
    /// (the log vdev to use, or the pool region) when no block is live after `txg`.
    pub(crate) fn header_for(&self, txg: u64, preferred: Option<Region>) -> LogHeader {
        let mut st = self.state.lock();
        let after: Vec<Live> = st
            .live
            .iter()
            .filter(|l| l.max_txg > txg)
            .copied()
            .collect();
        if after.is_empty() && (st.broken || st.ring != preferred) {
            // Nothing newer than this txg is in the ring: it may restart, elsewhere too.
            if st.ring != preferred {
                st.ring = preferred;
                st.pos = preferred.map_or(0, |r| r.start);
            }
            st.broken = false;
            st.size = 0;
        }
        if st.size == 0 {
            st.size = 4096;
        }
        let (vdev, offset, seq, head_size) = match (after.first(), st.ring) {
            (Some(l), _) => (l.vdev, l.offset, l.seq, l.size),
            (None, Some(r)) => (r.vdev, st.pos, st.seq, st.size),
            (None, None) => (0, 0, st.seq, 0),
        };
        LogHeader {
            guid: st.guid,
            head_vdev: vdev,
            head_offset: offset,
            head_seq: seq,
            head_size,
            region: st.pool_region,
        }
    }

    /// Txg `txg` is durable: blocks with nothing newer are free for the ring again.
    pub(crate) fn committed(&self, txg: u64) {
        let mut st = self.state.lock();
        while st.live.front().is_some_and(|l| l.max_txg <= txg) {
            st.live.pop_front();
        }
    }

    /// Counts a commit that waited for a txg instead.
    pub fn count_fallback(&self) {
        let mut st = self.state.lock();
        st.stats.fallbacks = st.stats.fallbacks.saturating_add(1);
    }

    /// Writes `entries` as one commit and flushes; see the module documentation.
    pub(crate) fn write(
        &self,
        entries: Vec<LogEntry>,
        top: &dyn Fn(u32) -> Option<Arc<TopVdev>>,
    ) -> Result<(), LogError> {
        let _w = self.writer.lock();
        let started = std::time::Instant::now();
        let (ring, vdev) = {
            let mut st = self.state.lock();
            if st.broken {
                return Err(LogError::Moving);
            }
            let Some(ring) = st.ring else {
                if st.pool_region.is_none() {
                    st.want_region = true;
                    return Err(LogError::NoRegion);
                }
                return Err(LogError::Moving);
            };
            match top(ring.vdev) {
                Some(t) if t.readable() && !st.failed.contains(&ring.vdev) => (ring, t),
                _ => {
                    st.broken = true;
                    return Err(LogError::Moving);
                }
            }
        };
        let sector = vdev.sector();
        if let Some(e) = entries.iter().find(|e| entry_bytes(e) > MAX_PAYLOAD) {
            return Err(LogError::TooLarge(e.data.len()));
        }
        let total: usize = entries.iter().map(entry_bytes).sum();
        // Cut the commit into blocks: each as large as the size its predecessor promised.
        let batch = IoBatch::new();
        let mut written = Vec::new();
        let mut rest: VecDeque<LogEntry> = entries.into();
        let n = rest.len();
        let mut st = self.state.lock();
        if st.size == 0 {
            st.size = block_size(total, sector);
        }
        let max_txg = rest.iter().map(|e| e.txg).max().unwrap_or(0);
        loop {
            let size = st.size;
            // Every block size is at least 512 bytes (see `valid_block_size`, `block_size`).
            let mut free = (size as usize).saturating_sub(BLOCK_HEADER);
            let mut here = Vec::new();
            while let Some(e) = rest.front() {
                let Some(after) = free.checked_sub(entry_bytes(e)) else {
                    break;
                };
                free = after;
                here.push(rest.pop_front().expect("front"));
            }
            let left: usize = rest.iter().map(entry_bytes).sum();
            let next_size = if left > 0 {
                block_size(left, sector)
            } else {
                block_size(total, sector)
            };
            let asize = vdev.asize(u64::from(size));
            let pos = st.pos;
            // Room in the ring, over no live block, and a sequence number after this one (the
            // position and the sequence number may come from the chain read at import).
            let placed = pos
                .checked_add(asize)
                .filter(|&end| pos >= ring.start && end <= ring.end)
                .filter(|_| !st.live.iter().any(|l| overlaps(l, ring.vdev, pos, asize)))
                .zip(st.seq.checked_add(1));
            let Some((mut next, next_seq)) = placed else {
                st.broken = !written.is_empty();
                return Err(LogError::Full);
            };
            if next
                .checked_add(vdev.asize(u64::from(next_size)))
                .is_none_or(|end| end > ring.end)
            {
                next = ring.start;
            }
            let block = Block {
                guid: st.guid,
                seq: st.seq,
                commit_end: rest.is_empty(),
                next_vdev: ring.vdev,
                next_offset: next,
                next_size,
                entries: here,
            };
            let raw = block.encode(size as usize);
            if let Err(e) = vdev.write(pos, &raw, &batch) {
                st.broken = true;
                return Err(LogError::Io(e.to_string()));
            }
            let live = Live {
                vdev: ring.vdev,
                offset: pos,
                seq: st.seq,
                size,
                asize,
                max_txg,
            };
            st.live.push_back(live);
            written.push(live);
            st.seq = next_seq;
            st.pos = next;
            st.size = next_size;
            st.stats.blocks = st.stats.blocks.saturating_add(1);
            st.stats.bytes = st.stats.bytes.saturating_add(u64::from(size));
            if rest.is_empty() {
                break;
            }
        }
        drop(st);
        // Only the leaves the commit wrote to: a small block on RAID-Z is on some of the
        // children, and flushing the others would make it no safer. Each flush is queued
        // behind its leaf's write at once (a leaf's queue runs a flush only after the writes
        // before it finished), so the commit waits once for writes and flushes together
        // instead of twice: one wake-up per leaf fewer.
        let flush = IoBatch::new();
        batch.flush_written(&flush);
        let errors = batch.wait();
        let flush_errors = flush.wait();
        if !errors.is_empty() || !flush_errors.is_empty() {
            let mut st = self.state.lock();
            let failures = errors.len().saturating_add(flush_errors.len());
            let failures = u64::try_from(failures).unwrap_or(u64::MAX);
            st.stats.write_errors = st.stats.write_errors.saturating_add(failures);
            // The blocks are on stable storage only if the leaves whose write or flush failed,
            // with those not in use, are no more than the vdev's redundancy (a mirror needs
            // one side written and flushed, RAID-Z all but `parity` children). Otherwise the
            // commit is not acknowledged: the caller waits for a txg that holds the changes,
            // and the ring moves once nothing is live.
            let mut failed: Vec<*const tank_vdev::Leaf> = errors
                .iter()
                .chain(&flush_errors)
                .map(|(l, _)| Arc::as_ptr(l))
                .chain(
                    vdev.leaves
                        .iter()
                        .filter(|l| !l.is_usable())
                        .map(Arc::as_ptr),
                )
                .collect();
            failed.sort();
            failed.dedup();
            if failed.len() > vdev.redundancy() {
                st.broken = true;
                if !vdev.readable() && Some(ring) != st.pool_region {
                    st.failed.push(ring.vdev);
                }
                return Err(LogError::Io(
                    errors
                        .first()
                        .or(flush_errors.first())
                        .map(|(l, e)| format!("{}: {e}", l.path()))
                        .unwrap_or_default(),
                ));
            }
        }
        let mut st = self.state.lock();
        st.stats.commits = st.stats.commits.saturating_add(1);
        self.latency.record(started.elapsed());
        self.entries.fetch_add(n as u64, Ordering::Relaxed);
        Ok(())
    }

    /// The sequence number of the next block, read while no commit is writing: records
    /// logged before this call are all in blocks with lower numbers.
    pub fn floor(&self) -> u64 {
        let _w = self.writer.lock();
        self.state.lock().seq
    }

    /// Marks log vdev `vdev` as not to be used (it is being removed); the ring moves at the
    /// next txg commit with nothing live.
    pub(crate) fn avoid(&self, vdev: u32) {
        let mut st = self.state.lock();
        if !st.failed.contains(&vdev) {
            st.failed.push(vdev);
        }
        if st.ring.is_some_and(|r| r.vdev == vdev) {
            st.broken = true;
        }
    }

    /// Whether log vdev `vdev` holds live blocks.
    pub(crate) fn uses(&self, vdev: u32) -> bool {
        let st = self.state.lock();
        st.live.iter().any(|l| l.vdev == vdev) || st.ring.is_some_and(|r| r.vdev == vdev)
    }

    /// Log vdevs not to use (failed or being removed).
    pub(crate) fn avoided(&self) -> Vec<u32> {
        self.state.lock().failed.clone()
    }
}

/// Reads the log block that must be sequence `seq` at `offset` of `t`. The end of a chain
/// is always a block that does not verify (stale or never written), so this does not go
/// through a mirror's healing read, which would count it as a checksum error: each side is
/// read until one verifies. RAID-Z's fast path (the data columns) is tried first, then the
/// reconstruction from parity, which counts and heals only when a combination verifies as
/// this chain's block: a block whose data column was lost (a crash during the commit's
/// flushes, with the rest within the parity) is still found.
fn read_block(t: &TopVdev, offset: u64, size: u32, guid: u64, seq: u64) -> Option<Block> {
    let len = u64::from(size);
    match t.layout {
        tank_vdev::Layout::Disk | tank_vdev::Layout::Mirror => {
            t.leaves.iter().filter(|l| l.is_usable()).find_map(|l| {
                let b = l.read_async(offset, len as usize).recv().ok()?.ok()?;
                Block::decode(&b, guid, seq)
            })
        }
        _ => {
            let fast = t.submit_read(offset, len, 0)?;
            if let Some(b) = t.finish_read(fast, &|b| Block::decode(b, guid, seq).is_some()) {
                return Block::decode(&b, guid, seq);
            }
            let (b, _) = t
                .read(offset, len, 0, &|b| Block::decode(b, guid, seq).is_some())
                .ok()?;
            Block::decode(&b, guid, seq)
        }
    }
}

/// For the fuzz target: `data` as a log block whose magic, version and checksum match
/// (the chain and sequence are its own), decoded.
pub(crate) fn fuzz_block(data: &[u8]) {
    let mut b = data.to_vec();
    b.resize(b.len().max(BLOCK_HEADER), 0);
    b[0..8].copy_from_slice(LOG_MAGIC);
    b[8..12].copy_from_slice(&LOG_VERSION.to_le_bytes());
    b[64..96].fill(0);
    let sum = blake3::hash(&b);
    b[64..96].copy_from_slice(sum.as_bytes());
    let guid = u64::from_le_bytes(b[16..24].try_into().expect("8"));
    let seq = u64::from_le_bytes(b[24..32].try_into().expect("8"));
    let _ = Block::decode(&b, guid, seq);
}

/// Whether live block `l` overlaps `[pos, +asize)` of `vdev` (an extent that would pass the
/// end of the address space ends there).
fn overlaps(l: &Live, vdev: u32, pos: u64, asize: u64) -> bool {
    l.vdev == vdev && l.offset < pos.saturating_add(asize) && pos < l.offset.saturating_add(l.asize)
}

fn rand_guid() -> u64 {
    loop {
        let g: u64 = rand::random();
        if g != 0 {
            return g;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::arithmetic_side_effects)] // Test arithmetic on constants.

    use super::*;
    use tank_device::{BlockDevice, MemDevice};
    use tank_vdev::{Layout, Leaf, ParityCodec, FRONT_RESERVE};

    const RING: Region = Region {
        vdev: 0,
        start: 1 << 20,
        end: 2 << 20,
    };

    fn disk() -> (Arc<MemDevice>, Arc<TopVdev>) {
        let dev = Arc::new(MemDevice::new("d0", 64 << 20));
        let leaf = Leaf::new(1, "d0".into(), 32 << 20, Some(dev.clone()));
        let top = TopVdev::new(
            0,
            2,
            Layout::Disk,
            vec![leaf],
            12,
            Arc::new(ParityCodec::new()),
        );
        (dev, Arc::new(top))
    }

    fn entry() -> LogEntry {
        LogEntry {
            objset: 1,
            txg: 5,
            seq: 0,
            data: vec![7; 100],
        }
    }

    /// Bytes of the device before the ring (where a misplaced write would land).
    fn before_ring(dev: &MemDevice) -> Vec<u8> {
        let mut b = vec![0u8; RING.start as usize];
        dev.read_at(&mut b, FRONT_RESERVE).unwrap();
        b
    }

    #[test]
    fn a_chain_that_ends_outside_its_ring_never_moves_a_write_out_of_it() {
        let (dev, top) = disk();
        let t = top.clone();
        let lookup = move |id: u32| (id == 0).then(|| t.clone());
        // A chain whose one block (valid, checksummed) says the next goes at offset 0:
        // before the ring, over whatever the pool keeps there.
        let guid = 99;
        let block = Block {
            guid,
            seq: 1,
            commit_end: true,
            next_vdev: 0,
            next_offset: 0,
            next_size: 4096,
            entries: vec![entry()],
        };
        let batch = IoBatch::new();
        top.write(RING.start, &block.encode(4096), &batch).unwrap();
        assert!(batch.wait().is_empty());
        let header = LogHeader {
            guid,
            head_vdev: 0,
            head_offset: RING.start,
            head_seq: 1,
            head_size: 4096,
            region: Some(RING),
        };
        let log = IntentLog::new(Some(header));
        log.load(&header, 0, &lookup, &|_| Some(RING)).unwrap();
        assert_eq!(log.take_replay().len(), 1, "the chain was read");
        let pos = log.state.lock().pos;
        assert!(
            (RING.start..RING.end).contains(&pos),
            "the ring goes on at {pos:#x}, outside {RING:?}"
        );
        // Once the chain's txg is committed, commits go into the ring, never before it.
        log.replayed(5);
        log.committed(5);
        let untouched = before_ring(&dev);
        for _ in 0..300 {
            log.write(vec![entry()], &lookup).unwrap();
            log.committed(u64::MAX - 1);
        }
        assert!(
            before_ring(&dev) == untouched,
            "a log write landed before the ring"
        );
    }

    #[test]
    fn a_write_position_before_the_ring_is_refused() {
        let (dev, top) = disk();
        let lookup = move |id: u32| (id == 0).then(|| top.clone());
        let log = IntentLog::new(None);
        {
            let mut st = log.state.lock();
            st.ring = Some(RING);
            st.pool_region = Some(RING);
            st.pos = RING.start - 4096;
        }
        let untouched = before_ring(&dev);
        assert_eq!(log.write(vec![entry()], &lookup), Err(LogError::Full));
        assert!(before_ring(&dev) == untouched);
    }
}
