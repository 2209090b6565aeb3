//! Space allocation: free-range trees per top-level vdev, deferred frees, and the records the
//! pool writes to its space map log each transaction group.
//!
//! # Theory of operation
//! Each top-level vdev's address space is a [`RangeTree`] of free extents. Allocation is
//! first-fit from a moving cursor, so a stream of writes lands contiguously (what makes
//! streaming fast on platters), and wraps to the start when the tail is used up.
//! New blocks are spread over top-level vdevs in proportion to their free space: each
//! allocation goes to the vdev with the smallest `allocated_this_txg / free` ratio, so striping
//! more vdevs adds throughput and a fuller vdev receives less.
//!
//! Frees are deferred: a block freed in txg `t` stays allocated until txg `t + DEFER_TXGS`
//! begins, so every uberblock import may still choose (the newest `DEFER_TXGS`) references only
//! blocks that have not been reused (invariant 2 of DESIGN.md).
//!
//! Every change is also appended to `pending` as a [`SpaceRecord`]; the pool writes those records
//! to the space map log when it commits the txg and replays them on import.
//!
//! Space map records come from a device: arithmetic on them, and on everything derived from
//! them, is checked (`clippy::arithmetic_side_effects` is denied here).
//!
//! # Space reservation
//! `slop` bytes (1/32 of the pool, at least 16 MiB where the pool is big enough) are kept back
//! from new writes by the pool's admission of transactions (`Pool::begin_tx`). Here, data
//! allocations may not use the last half of it (`data_reserve`), so a full pool still has
//! room to commit the txgs that delete data; the first half lets a txg commit whose data
//! came out larger than the admission's estimate (a write into part of a block is charged
//! the whole block only inside its transaction, after it was admitted) instead of failing
//! its sync.

#![deny(clippy::arithmetic_side_effects)]

use std::collections::BTreeMap;

use crate::BlockError;

/// Txgs a freed block stays allocated; also how far `import -F` may rewind.
pub const DEFER_TXGS: u64 = 8;

/// Fragmentation of a free extent by its size class (log2 of the size, from 512 B):
/// the share of it, in percent, that counts as fragmented (none past the end of the table).
const FRAG_TABLE: [u8; 17] = [
    100, 100, 98, 95, 90, 80, 70, 60, 50, 40, 30, 20, 15, 10, 5, 0, 0,
];

/// Free-space fragmentation of free extents of the given lengths, weighted by length.
fn frag_of(lengths: impl Iterator<Item = u64>) -> Option<u64> {
    // A sum of u64 lengths weighted by at most 100 would need 2^57 extents to saturate.
    let (mut weighted, mut total) = (0u128, 0u128);
    for len in lengths.filter(|l| *l > 0) {
        let class = usize::try_from(len.ilog2().saturating_sub(9)).unwrap_or(usize::MAX);
        let share = FRAG_TABLE.get(class).copied().unwrap_or(0);
        weighted = weighted.saturating_add(u128::from(len).saturating_mul(u128::from(share)));
        total = total.saturating_add(u128::from(len));
    }
    // At most 100; None when nothing is free.
    weighted
        .checked_div(total)
        .and_then(|f| u64::try_from(f).ok())
}

/// A set of disjoint, non-adjacent extents `[start, end)`.
#[derive(Debug, Clone, Default)]
pub struct RangeTree {
    ranges: BTreeMap<u64, u64>,
    bytes: u64,
}

impl RangeTree {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Free-space fragmentation in percent, as zpool reports it: each free extent weighs
    /// by its size, and counts as 100 % fragmented at 512 B or 1 KiB, falling to 0 % at
    /// 16 MiB and more (OpenZFS' table of metaslab fragmentation by segment size).
    /// None when there is no free space.
    pub fn fragmentation(&self) -> Option<u64> {
        frag_of(self.lengths())
    }

    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.ranges.iter().map(|(&s, &e)| (s, e))
    }

    /// The length of each extent.
    #[allow(clippy::arithmetic_side_effects)] // `add` and `remove` keep only `start < end`.
    fn lengths(&self) -> impl Iterator<Item = u64> + '_ {
        self.ranges.iter().map(|(&s, &e)| e - s)
    }

    /// True when `[start, end)` lies wholly inside one extent.
    pub fn contains(&self, start: u64, end: u64) -> bool {
        match self.ranges.range(..=start).next_back() {
            Some((_, &e)) => e >= end,
            None => false,
        }
    }

    /// True when any byte of `[start, end)` is in the tree.
    pub fn overlaps(&self, start: u64, end: u64) -> bool {
        if let Some((_, &e)) = self.ranges.range(..=start).next_back() {
            if e > start {
                return true;
            }
        }
        self.ranges.range(start..end).next().is_some()
    }

    /// Adds `[start, end)`, which must not overlap the tree; merges with neighbours.
    pub fn add(&mut self, start: u64, end: u64) -> Result<(), BlockError> {
        let Some(len) = end.checked_sub(start).filter(|&len| len > 0) else {
            return Ok(());
        };
        if self.overlaps(start, end) {
            return Err(BlockError::SpaceMap(format!(
                "range [{start:#x}, {end:#x}) is already in the tree"
            )));
        }
        let bytes = self.bytes.checked_add(len).ok_or_else(|| {
            BlockError::SpaceMap(format!(
                "range [{start:#x}, {end:#x}) overflows the tree's byte count"
            ))
        })?;
        let mut new_start = start;
        let mut new_end = end;
        if let Some((&s, &e)) = self.ranges.range(..start).next_back() {
            if e == start {
                new_start = s;
                self.ranges.remove(&s);
            }
        }
        if let Some(&e) = self.ranges.get(&end) {
            new_end = e;
            self.ranges.remove(&end);
        }
        self.ranges.insert(new_start, new_end);
        self.bytes = bytes;
        Ok(())
    }

    /// Removes `[start, end)`, which must lie wholly inside one extent.
    pub fn remove(&mut self, start: u64, end: u64) -> Result<(), BlockError> {
        let Some(len) = end.checked_sub(start).filter(|&len| len > 0) else {
            return Ok(());
        };
        let not_in_tree = || {
            BlockError::SpaceMap(format!(
                "range [{start:#x}, {end:#x}) is not wholly in the tree"
            ))
        };
        let (s, e) = match self.ranges.range(..=start).next_back() {
            Some((&s, &e)) if e >= end => (s, e),
            _ => return Err(not_in_tree()),
        };
        let bytes = self.bytes.checked_sub(len).ok_or_else(not_in_tree)?;
        self.ranges.remove(&s);
        if s < start {
            self.ranges.insert(s, start);
        }
        if end < e {
            self.ranges.insert(end, e);
        }
        self.bytes = bytes;
        Ok(())
    }

    /// First extent at or after `cursor` (wrapping) with room for `size` bytes at `align`:
    /// the room's `[start, end)`.
    pub fn find(&self, cursor: u64, size: u64, align: u64) -> Option<(u64, u64)> {
        let fits = |s: u64, e: u64| {
            let a = s.checked_next_multiple_of(align)?;
            a.checked_add(size).filter(|&z| z <= e).map(|z| (a, z))
        };
        // The extent containing the cursor, then everything after it, then from the start.
        if let Some((&s, &e)) = self.ranges.range(..=cursor).next_back() {
            if e > cursor {
                if let Some(a) = fits(cursor.max(s), e) {
                    return Some(a);
                }
            }
        }
        for (&s, &e) in self.ranges.range(cursor..) {
            if let Some(a) = fits(s, e) {
                return Some(a);
            }
        }
        for (&s, &e) in self.ranges.range(..cursor) {
            if let Some(a) = fits(s, e) {
                return Some(a);
            }
        }
        None
    }
}

/// One change to the allocation state, as written to the space map log (32 bytes on disk).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpaceRecord {
    pub vdev: u32,
    pub op: SpaceOp,
    pub offset: u64,
    pub len: u64,
    /// For `Free`: the txg of the free (the extent becomes usable at `txg + DEFER_TXGS`).
    pub txg: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum SpaceOp {
    Alloc = 1,
    Free = 2,
}

pub const SPACE_RECORD_SIZE: usize = 32;

impl SpaceRecord {
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.vdev.to_le_bytes());
        out.extend_from_slice(&(self.op as u32).to_le_bytes());
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&self.txg.to_le_bytes());
    }

    pub fn decode(raw: &[u8]) -> Result<Self, BlockError> {
        if raw.len() < SPACE_RECORD_SIZE {
            return Err(BlockError::Decode("short space map record".into()));
        }
        let u64_at = |o: usize| u64::from_le_bytes(raw[o..][..8].try_into().expect("8 bytes"));
        let op = match u32::from_le_bytes(raw[4..8].try_into().expect("4 bytes")) {
            1 => SpaceOp::Alloc,
            2 => SpaceOp::Free,
            other => return Err(BlockError::Decode(format!("space map op {other}"))),
        };
        Ok(Self {
            vdev: u32::from_le_bytes(raw[0..4].try_into().expect("4 bytes")),
            op,
            offset: u64_at(8),
            len: u64_at(16),
            txg: u64_at(24),
        })
    }
}

/// The end of extent `[offset, +len)` of `vdev`, checked: not empty, no overflow, inside
/// the vdev's `size`. Extents come from block pointers and space map records, which a
/// damaged device can fill with anything.
fn extent_end(vdev: u32, offset: u64, len: u64, size: u64, what: &str) -> Result<u64, BlockError> {
    offset
        .checked_add(len)
        .filter(|&end| len > 0 && end <= size)
        .ok_or_else(|| {
            BlockError::SpaceMap(format!(
                "{what} outside vdev {vdev}: [{offset:#x}, +{len:#x}) of {size:#x} bytes"
            ))
        })
}

/// The txg whose start makes a free in `txg` reusable; Err for a txg no pool reaches.
fn release_txg(txg: u64) -> Result<u64, BlockError> {
    txg.checked_add(DEFER_TXGS)
        .ok_or_else(|| BlockError::SpaceMap(format!("free in impossible txg {txg}")))
}

/// `n` rounded down to a multiple of `align`; 0 for no alignment (a vdev without space).
fn align_down(n: u64, align: u64) -> u64 {
    n.checked_rem(align)
        .and_then(|r| n.checked_sub(r))
        .unwrap_or(0)
}

/// Allocation state of one top-level vdev.
#[derive(Debug, Clone)]
pub struct VdevSpace {
    pub free: RangeTree,
    /// Size of the vdev's address space.
    pub size: u64,
    /// Allocation alignment (the sector size).
    pub align: u64,
    cursor: u64,
    allocated_this_txg: u64,
    /// A vdev that cannot take new blocks (log and cache devices, or one being removed).
    pub allocatable: bool,
}

impl VdevSpace {
    pub fn allocated(&self) -> u64 {
        // Free space is inside the vdev: never more than its size.
        self.size.saturating_sub(self.free.bytes())
    }
}

/// Who asks for space: user data may not use the last half of the slop; metadata may.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocClass {
    Data,
    Metadata,
}

/// The pool-wide allocator. See the module documentation.
#[derive(Debug, Default)]
pub struct SpaceAllocator {
    vdevs: Vec<Option<VdevSpace>>,
    /// Extents freed but not yet reusable, by the txg at which they become free.
    deferred: BTreeMap<u64, Vec<(u32, u64, u64)>>,
    pending: Vec<SpaceRecord>,
    /// While a scan runs: the (vdev, offset) of every extent freed since it started, with
    /// the last txg it was freed in, so the scan neither reports nor "repairs" a block whose
    /// space was freed (and maybe reused). The txg tells that block from a later one at the
    /// same offset: a block is freed in a txg no earlier than its birth, and its space is
    /// reused only `DEFER_TXGS` later, so a block born after the free is a new one.
    scan_freed: Option<std::collections::HashMap<(u32, u64), u64>>,
}

impl SpaceAllocator {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers top-level vdev `id` with an address space of `size` bytes, all free.
    pub fn add_vdev(&mut self, id: u32, size: u64, align: u64, allocatable: bool) {
        let idx = id as usize;
        while self.vdevs.len() <= idx {
            self.vdevs.push(None);
        }
        let mut free = RangeTree::new();
        let size = align_down(size, align);
        free.add(0, size).expect("fresh tree");
        self.vdevs[idx] = Some(VdevSpace {
            free,
            size,
            align,
            cursor: 0,
            allocated_this_txg: 0,
            allocatable,
        });
    }

    /// Forgets a vdev that holds no blocks (a removed log or cache device).
    pub fn remove_vdev(&mut self, id: u32) {
        if let Some(slot) = self.vdevs.get_mut(id as usize) {
            *slot = None;
        }
    }

    pub fn vdev(&self, id: u32) -> Option<&VdevSpace> {
        self.vdevs.get(id as usize).and_then(|v| v.as_ref())
    }

    pub fn vdev_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.vdevs
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.as_ref().map(|_| i as u32))
    }

    /// Total size of allocatable vdevs.
    pub fn size(&self) -> u64 {
        self.spaces().map(|v| v.size).sum()
    }

    /// Free bytes on allocatable vdevs (deferred frees are not free yet).
    pub fn free_bytes(&self) -> u64 {
        self.spaces().map(|v| v.free.bytes()).sum()
    }

    /// Free-space fragmentation of the allocatable vdevs, in percent (see
    /// `RangeTree::fragmentation`); None when nothing is free.
    pub fn fragmentation(&self) -> Option<u64> {
        frag_of(self.spaces().flat_map(|v| v.free.lengths()))
    }

    pub fn deferred_bytes(&self) -> u64 {
        self.deferred
            .values()
            .flatten()
            .map(|&(_, _, len)| len)
            .sum()
    }

    /// The reserve new writes are not admitted into: 1/32 of the pool, as ZFS's
    /// spa_slop_shift.
    pub fn slop(&self) -> u64 {
        self.size() / 32
    }

    /// The part of the slop only metadata may use (see the module documentation).
    pub fn data_reserve(&self) -> u64 {
        self.slop() / 2
    }

    fn spaces(&self) -> impl Iterator<Item = &VdevSpace> {
        self.vdevs.iter().flatten().filter(|v| v.allocatable)
    }

    /// Allocates `asize_of(vdev)` bytes on one vdev not in `avoid`. `asize_of` maps a vdev id
    /// to the allocated size a block needs there (parity differs between vdevs).
    pub fn alloc(
        &mut self,
        asize_of: &dyn Fn(u32) -> u64,
        avoid: &[u32],
        class: AllocClass,
        txg: u64,
    ) -> Result<(u32, u64, u64), BlockError> {
        self.alloc_inner(asize_of, avoid, class, txg, false)
    }

    fn alloc_inner(
        &mut self,
        asize_of: &dyn Fn(u32) -> u64,
        avoid: &[u32],
        class: AllocClass,
        txg: u64,
        far: bool,
    ) -> Result<(u32, u64, u64), BlockError> {
        let reserve = match class {
            AllocClass::Data => self.data_reserve(),
            AllocClass::Metadata => 0,
        };
        let mut candidates: Vec<(u32, f64)> = self
            .vdevs
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.as_ref().map(|v| (i as u32, v)))
            .filter(|(i, v)| v.allocatable && !avoid.contains(i) && v.free.bytes() > 0)
            .map(|(i, v)| (i, v.allocated_this_txg as f64 / v.free.bytes() as f64))
            .collect();
        if candidates.is_empty() && !avoid.is_empty() {
            // Not enough vdevs for distinct copies: another copy on a vdev that has one
            // already, placed a quarter of the vdev away from the cursor (ZFS ditto spacing).
            return self.alloc_inner(asize_of, &[], class, txg, true);
        }
        candidates.sort_by(|a, b| a.1.total_cmp(&b.1));
        let total_free = self.free_bytes();
        for (id, _) in candidates {
            let asize = asize_of(id);
            if total_free < asize.saturating_add(reserve) {
                break;
            }
            let space = self.vdevs[id as usize].as_mut().expect("candidate exists");
            let start = if far {
                let ahead = space.cursor.saturating_add(space.size / 4);
                align_down(ahead.checked_rem(space.size).unwrap_or(0), space.align)
            } else {
                space.cursor
            };
            if let Some((offset, end)) = space.free.find(start, asize, space.align) {
                space.free.remove(offset, end)?;
                if !far {
                    space.cursor = end;
                }
                space.allocated_this_txg = space.allocated_this_txg.saturating_add(asize);
                self.pending.push(SpaceRecord {
                    vdev: id,
                    op: SpaceOp::Alloc,
                    offset,
                    len: asize,
                    txg,
                });
                return Ok((id, offset, asize));
            }
        }
        Err(BlockError::NoSpace)
    }

    /// Takes back an allocation made in the current txg that was never written or referenced.
    pub fn undo_alloc(&mut self, vdev: u32, offset: u64, len: u64) -> Result<(), BlockError> {
        let pos = self
            .pending
            .iter()
            .rposition(|r| r.op == SpaceOp::Alloc && r.vdev == vdev && r.offset == offset)
            .ok_or_else(|| BlockError::SpaceMap("undo of an unknown allocation".into()))?;
        let space = self.vdevs[vdev as usize].as_mut().expect("known vdev");
        let end = extent_end(vdev, offset, len, space.size, "undone allocation")?;
        self.pending.remove(pos);
        space.allocated_this_txg = space.allocated_this_txg.saturating_sub(len);
        space.free.add(offset, end)
    }

    /// Makes sure an extent written outside a sync (by the intent log, before a crash) is
    /// allocated: allocated in `txg` when free, left alone when already allocated (its txg
    /// committed before the crash); a partly free extent is an error.
    pub fn claim(&mut self, vdev: u32, offset: u64, len: u64, txg: u64) -> Result<(), BlockError> {
        let space = self
            .vdevs
            .get_mut(vdev as usize)
            .and_then(|v| v.as_mut())
            .ok_or_else(|| BlockError::SpaceMap(format!("claim on unknown vdev {vdev}")))?;
        let end = extent_end(vdev, offset, len, space.size, "claim")?;
        if space.free.contains(offset, end) {
            space.free.remove(offset, end)?;
            self.pending.push(SpaceRecord {
                vdev,
                op: SpaceOp::Alloc,
                offset,
                len,
                txg,
            });
            Ok(())
        } else if space.free.overlaps(offset, end) {
            Err(BlockError::SpaceMap(format!(
                "claim of a partly free extent: vdev {vdev} [{offset:#x}, +{len:#x})"
            )))
        } else {
            Ok(())
        }
    }

    /// Frees an extent in `txg`; it becomes reusable when txg `txg + DEFER_TXGS` begins.
    pub fn free(&mut self, vdev: u32, offset: u64, len: u64, txg: u64) -> Result<(), BlockError> {
        let space = self
            .vdevs
            .get(vdev as usize)
            .and_then(|v| v.as_ref())
            .ok_or_else(|| BlockError::SpaceMap(format!("free on unknown vdev {vdev}")))?;
        let end = extent_end(vdev, offset, len, space.size, "free")?;
        if space.free.overlaps(offset, end) {
            return Err(BlockError::SpaceMap(format!(
                "double free: vdev {vdev} [{offset:#x}, +{len:#x})"
            )));
        }
        self.deferred
            .entry(release_txg(txg)?)
            .or_default()
            .push((vdev, offset, len));
        if let Some(watch) = &mut self.scan_freed {
            let last = watch.entry((vdev, offset)).or_insert(txg);
            *last = (*last).max(txg);
        }
        self.pending.push(SpaceRecord {
            vdev,
            op: SpaceOp::Free,
            offset,
            len,
            txg,
        });
        Ok(())
    }

    /// Called when txg `txg` starts syncing: releases deferred frees that are now safe and
    /// resets the per-txg spreading counters.
    pub fn begin_txg(&mut self, txg: u64) -> Result<(), BlockError> {
        let ready: Vec<u64> = self.deferred.range(..=txg).map(|(&t, _)| t).collect();
        for t in ready {
            for (vdev, offset, len) in self.deferred.remove(&t).unwrap_or_default() {
                let space = self.vdevs[vdev as usize].as_mut().expect("known vdev");
                let end = extent_end(vdev, offset, len, space.size, "deferred free")?;
                space.free.add(offset, end)?;
            }
        }
        for v in self.vdevs.iter_mut().flatten() {
            v.allocated_this_txg = 0;
        }
        Ok(())
    }

    /// The records accumulated since the last call.
    pub fn take_pending(&mut self) -> Vec<SpaceRecord> {
        std::mem::take(&mut self.pending)
    }

    /// Replaces the pending records (import queues the allocations the next txg must record).
    pub fn set_pending(&mut self, records: Vec<SpaceRecord>) {
        self.pending = records;
    }

    /// Re-applies a logged record on import (no new pending record is produced).
    pub fn replay(&mut self, rec: &SpaceRecord) -> Result<(), BlockError> {
        let space = self
            .vdevs
            .get_mut(rec.vdev as usize)
            .and_then(|v| v.as_mut())
            .ok_or_else(|| BlockError::SpaceMap(format!("record for unknown vdev {}", rec.vdev)))?;
        let end = extent_end(
            rec.vdev,
            rec.offset,
            rec.len,
            space.size,
            "space map record",
        )?;
        match rec.op {
            SpaceOp::Alloc => space.free.remove(rec.offset, end),
            SpaceOp::Free => {
                if space.free.overlaps(rec.offset, end) {
                    return Err(BlockError::SpaceMap(format!(
                        "replayed free of a free extent on vdev {}",
                        rec.vdev
                    )));
                }
                self.deferred
                    .entry(release_txg(rec.txg)?)
                    .or_default()
                    .push((rec.vdev, rec.offset, rec.len));
                Ok(())
            }
        }
    }

    /// A condensed description of the whole state: every allocated extent (deferred frees
    /// included, as they are still allocated) followed by the deferred frees with their txg.
    pub fn condensed(&self) -> Vec<SpaceRecord> {
        let mut out = Vec::new();
        for (id, space) in self.vdevs.iter().enumerate() {
            let Some(space) = space else { continue };
            let mut pos = 0;
            for (s, e) in space.free.iter() {
                if let Some(len) = s.checked_sub(pos).filter(|&len| len > 0) {
                    out.push(SpaceRecord {
                        vdev: id as u32,
                        op: SpaceOp::Alloc,
                        offset: pos,
                        len,
                        txg: 0,
                    });
                }
                pos = e;
            }
            if let Some(len) = space.size.checked_sub(pos).filter(|&len| len > 0) {
                out.push(SpaceRecord {
                    vdev: id as u32,
                    op: SpaceOp::Alloc,
                    offset: pos,
                    len,
                    txg: 0,
                });
            }
        }
        for (&release, extents) in &self.deferred {
            for &(vdev, offset, len) in extents {
                out.push(SpaceRecord {
                    vdev,
                    op: SpaceOp::Free,
                    offset,
                    len,
                    // Keys are `release_txg` values: DEFER_TXGS or more.
                    txg: release.saturating_sub(DEFER_TXGS),
                });
            }
        }
        out
    }

    /// Number of pending records a condensed description would need.
    pub fn condensed_len(&self) -> usize {
        let allocated = self
            .vdevs
            .iter()
            .flatten()
            .map(|v| v.free.len().saturating_add(1));
        allocated.chain(self.deferred.values().map(Vec::len)).sum()
    }

    /// True when `[offset, offset+len)` on `vdev` is allocated (used by verification).
    pub fn is_allocated(&self, vdev: u32, offset: u64, len: u64) -> bool {
        self.vdev(vdev)
            .zip(offset.checked_add(len))
            .is_some_and(|(v, end)| end <= v.size && !v.free.overlaps(offset, end))
    }

    /// Starts (or restarts) remembering freed extents for a scan.
    pub fn watch_frees(&mut self) {
        self.scan_freed = Some(Default::default());
    }

    /// Stops remembering freed extents.
    pub fn unwatch_frees(&mut self) {
        self.scan_freed = None;
    }

    /// Whether the block born in txg `birth` at `(vdev, offset)` was freed since
    /// [`Self::watch_frees`] (always true when no scan watches: nothing vouches for the block
    /// then). A block born after the last free at its offset is a new block in reused space,
    /// not the one freed: it is live, and a scan walks the tree below it.
    pub fn freed_since_watch(&self, vdev: u32, offset: u64, birth: u64) -> bool {
        self.scan_freed
            .as_ref()
            .is_none_or(|w| w.get(&(vdev, offset)).is_some_and(|&freed| freed >= birth))
    }

    /// Forget pending records (after a failed sync the in-memory state is discarded anyway).
    pub fn clear_pending(&mut self) {
        self.pending.clear();
    }
}

#[cfg(test)]
mod frag_tests {
    use super::*;

    #[test]
    fn fragmentation_weighs_free_extents_by_size() {
        let mut t = RangeTree::new();
        assert_eq!(t.fragmentation(), None);
        t.add(0, 64 << 20).unwrap();
        assert_eq!(t.fragmentation(), Some(0));
        // Only 4 KiB holes: 95 % as zpool counts them.
        let mut t = RangeTree::new();
        for i in 0..100u64 {
            t.add(i * 8192, i * 8192 + 4096).unwrap();
        }
        assert_eq!(t.fragmentation(), Some(95));
        // Half the free space in one big extent, half in 128 KiB pieces (50 %): 25 %.
        let mut t = RangeTree::new();
        t.add(1 << 40, (1 << 40) + (16 << 20)).unwrap();
        for i in 0..128u64 {
            t.add(i << 18, (i << 18) + (128 << 10)).unwrap();
        }
        assert_eq!(t.fragmentation(), Some(25));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn range_tree_merges_and_splits() {
        let mut t = RangeTree::new();
        t.add(0, 100).unwrap();
        t.add(200, 300).unwrap();
        t.add(100, 200).unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(t.bytes(), 300);
        t.remove(50, 60).unwrap();
        assert_eq!(t.len(), 2);
        assert!(t.add(55, 70).is_err());
        assert!(t.remove(40, 70).is_err());
        assert_eq!(t.find(0, 50, 1), Some((0, 50)));
        assert_eq!(t.find(0, 60, 1), Some((60, 120)));
        assert_eq!(t.find(61, 1000, 1), None);
    }

    #[test]
    fn allocator_defers_frees_and_reserves_slop() {
        let mut a = SpaceAllocator::new();
        a.add_vdev(0, 64 << 20, 4096, true);
        let (v, off, len) = a.alloc(&|_| 1 << 20, &[], AllocClass::Data, 5).unwrap();
        assert_eq!((v, len), (0, 1 << 20));
        a.free(v, off, len, 6).unwrap();
        a.begin_txg(6 + DEFER_TXGS - 1).unwrap();
        assert!(
            a.is_allocated(0, off, len),
            "still allocated while deferred"
        );
        a.begin_txg(6 + DEFER_TXGS).unwrap();
        assert!(!a.is_allocated(0, off, len), "released after the deferral");
        assert!(
            a.free(v, off, len, 20).is_err(),
            "freeing a free extent is refused"
        );
    }

    /// A scan must tell a block freed under it from a new block in the same reused space:
    /// taking the new one for the freed one skipped every tree below a node written there.
    #[test]
    fn a_block_born_in_reused_space_is_not_taken_for_the_freed_one() {
        let mut a = SpaceAllocator::new();
        a.add_vdev(0, 64 << 20, 4096, true);
        assert!(
            a.freed_since_watch(0, 0, 1),
            "nothing vouches without a watch"
        );
        let (_, old, len) = a.alloc(&|_| 1 << 20, &[], AllocClass::Data, 5).unwrap();
        a.watch_frees();
        assert!(!a.freed_since_watch(0, old, 5));
        a.free(0, old, len, 9).unwrap();
        assert!(
            a.freed_since_watch(0, old, 5),
            "the block freed under the scan"
        );
        // The space comes back after the deferral and is allocated again, at the same offset.
        let txg = 9 + DEFER_TXGS;
        a.begin_txg(txg).unwrap();
        assert!(!a.is_allocated(0, old, len));
        a.claim(0, old, len, txg).unwrap();
        assert!(a.is_allocated(0, old, len));
        assert!(a.freed_since_watch(0, old, 5), "the old block stays freed");
        assert!(!a.freed_since_watch(0, old, txg), "the new block is live");
        // Freed in its turn, it is freed too.
        a.free(0, old, len, txg + 1).unwrap();
        assert!(a.freed_since_watch(0, old, txg));
        a.unwatch_frees();
        assert!(a.freed_since_watch(0, old, txg));
    }

    #[test]
    fn full_pool_is_no_space_and_metadata_uses_slop() {
        let mut a = SpaceAllocator::new();
        a.add_vdev(0, 32 << 20, 4096, true);
        let mut n = 0;
        while a.alloc(&|_| 256 << 10, &[], AllocClass::Data, 1).is_ok() {
            n += 1;
        }
        assert_eq!(n, 126, "half of the slop (1/64 of the pool) stays reserved");
        assert!(matches!(
            a.alloc(&|_| 256 << 10, &[], AllocClass::Data, 1),
            Err(BlockError::NoSpace)
        ));
        assert!(a.alloc(&|_| 4096, &[], AllocClass::Metadata, 1).is_ok());
    }

    #[test]
    fn spreads_over_vdevs_by_free_space() {
        let mut a = SpaceAllocator::new();
        a.add_vdev(0, 1 << 30, 4096, true);
        a.add_vdev(1, 1 << 30, 4096, true);
        a.add_vdev(2, 1 << 29, 4096, true);
        let mut per = [0u64; 3];
        for _ in 0..1000 {
            let (v, _, len) = a.alloc(&|_| 128 << 10, &[], AllocClass::Data, 1).unwrap();
            per[v as usize] += len;
        }
        assert!(per[0] > per[2] && per[1] > per[2], "{per:?}");
        let ratio = per[0] as f64 / per[1] as f64;
        assert!((0.9..1.1).contains(&ratio), "{per:?}");
    }

    proptest! {
        #[test]
        fn replaying_records_reproduces_state(ops in proptest::collection::vec((1u8..64, any::<bool>()), 1..200)) {
            let mut a = SpaceAllocator::new();
            a.add_vdev(0, 16 << 20, 512, true);
            a.add_vdev(1, 8 << 20, 512, true);
            let mut live = Vec::new();
            let mut log: Vec<(u64, Vec<SpaceRecord>)> = Vec::new();
            for (txg, (sectors, free)) in (1u64..).zip(ops) {
                a.begin_txg(txg).unwrap();
                if free && !live.is_empty() {
                    let (v, o, l) = live.remove(0);
                    a.free(v, o, l, txg).unwrap();
                } else if let Ok(x) = a.alloc(&|_| u64::from(sectors) * 512, &[], AllocClass::Metadata, txg) {
                    live.push(x);
                }
                log.push((txg, a.take_pending()));
            }
            let last_txg = log.last().map(|l| l.0).unwrap_or(0);
            // Replay the whole log, and separately the condensed form: both match `a`.
            let mut b = SpaceAllocator::new();
            b.add_vdev(0, 16 << 20, 512, true);
            b.add_vdev(1, 8 << 20, 512, true);
            for (txg, recs) in &log {
                b.begin_txg(*txg).unwrap();
                for r in recs { b.replay(r).unwrap(); }
            }
            let mut c = SpaceAllocator::new();
            c.add_vdev(0, 16 << 20, 512, true);
            c.add_vdev(1, 8 << 20, 512, true);
            for r in &a.condensed() { c.replay(r).unwrap(); }
            c.begin_txg(last_txg).unwrap();
            for x in [&b, &c] {
                prop_assert_eq!(x.free_bytes(), a.free_bytes());
                prop_assert_eq!(x.deferred_bytes(), a.deferred_bytes());
                prop_assert_eq!(x.condensed(), a.condensed());
            }
            let allocated: u64 = live.iter().map(|x| x.2).sum();
            prop_assert_eq!(
                a.size().checked_sub(a.free_bytes()),
                allocated.checked_add(a.deferred_bytes())
            );
        }
    }
}
