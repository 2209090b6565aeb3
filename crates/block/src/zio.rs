//! The block I/O pipeline (ZFS's zio): write = compress → checksum → allocate → queue;
//! read = read → verify → heal → decompress.
//!
//! # Theory of operation
//! [`BlockStore`] holds the top-level vdevs and the allocator. Writes are queued on an
//! [`IoBatch`]; the caller (the txg sync) waits for the batch, then checks with
//! [`BlockStore::check_writable`] that every top-level vdev can still be read in full before it
//! commits anything that points at the new blocks.
//!
//! Copies: a block with `copies = n` gets n DVAs, on distinct top-level vdevs when the pool
//! has enough, otherwise at distinct offsets of the same vdev (far apart, so on RAID-Z they
//! start on different children). A read tries the DVAs in order; a copy that fails (after the
//! vdev's own healing) is rewritten from a good one.
//!
//! Gang blocks: a block no free extent can hold is written as pieces listed by a gang
//! header; the header's format, seal and checks are in `gang.rs`.
//!
//! # Concurrency
//! `read` may run on any thread. `write` and `free` take the allocator lock briefly.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use tank_device::{IoBuf, IoRef};
use tank_vdev::{IoBatch, TopVdev};

use crate::alloc::{AllocClass, SpaceAllocator};
use crate::blkptr::{BlockKind, BlockPtr, Dva, MAX_DVAS};
use crate::checksum::ChecksumKind;
use crate::compress::Compression;
use crate::gang::{decode_gang, encode_gang, gang_verify, GANG_CHILDREN};
use crate::BlockError;

pub use crate::gang::GANG_HEADER_SIZE;

/// How to write one block.
#[derive(Debug, Clone, Copy)]
pub struct WriteProps {
    pub kind: BlockKind,
    pub level: u8,
    pub checksum: ChecksumKind,
    pub compression: Compression,
    pub copies: u8,
    pub class: AllocClass,
}

impl WriteProps {
    /// Pool-critical metadata: three copies, lz4, blake3.
    pub fn critical(kind: BlockKind) -> Self {
        Self {
            kind,
            level: 0,
            checksum: ChecksumKind::Blake3,
            compression: Compression::Lz4,
            copies: 3,
            class: AllocClass::Metadata,
        }
    }
}

/// A block read in flight (see [`BlockStore::submit`]).
pub struct PendingBlock {
    bp: BlockPtr,
    pending: Option<(Arc<TopVdev>, tank_vdev::PendingRead)>,
}

impl PendingBlock {
    /// The block being read.
    pub fn bp(&self) -> &BlockPtr {
        &self.bp
    }
}

/// Counters of what reads had to do.
#[derive(Debug, Default, Clone, Copy)]
pub struct ReadStats {
    pub healed_copies: u64,
    pub healed_in_vdev: u64,
    /// Gang blocks freed whose header could not be read: their pieces' space leaked.
    pub leaked_gangs: u64,
}

/// What scrubbing one block found (see [`BlockStore::scrub`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ScrubOutcome {
    /// Bytes read from the devices (every copy, every column).
    pub read_bytes: u64,
    /// Bytes rewritten to restore full redundancy.
    pub repaired_bytes: u64,
    /// No copy could be read or rebuilt: a permanent error.
    pub unrecoverable: bool,
    /// The block was freed while the scan looked at it: nothing was reported or written.
    pub freed: bool,
}

impl ScrubOutcome {
    fn add(&mut self, other: ScrubOutcome) {
        self.read_bytes += other.read_bytes;
        self.repaired_bytes += other.repaired_bytes;
        self.unrecoverable |= other.unrecoverable;
        self.freed |= other.freed;
    }
}

/// Blocks at or below this size are never ganged (they fit in any free sector run).
const GANG_MIN_PIECE: usize = 4096;

/// Whether a pointer's physical size is one a block can have (a damaged pointer's may not
/// be): checked before anything is read or allocated for it.
fn psize_in_range(bp: &BlockPtr) -> bool {
    (1..=crate::MAX_BLOCK_BYTES).contains(&(bp.psize as usize))
}

pub struct BlockStore {
    vdevs: RwLock<Vec<Option<Arc<TopVdev>>>>,
    pub alloc: Mutex<SpaceAllocator>,
    stats: Mutex<ReadStats>,
    /// Blocks larger than this many bytes are ganged even when an extent would fit them
    /// (0: off). A test knob, as ZFS's metaslab_force_ganging, to put gang blocks through the
    /// crash, scrub, resilver and corruption tests.
    force_gang: AtomicUsize,
    /// Gang headers written.
    gang_writes: AtomicU64,
}

impl std::fmt::Debug for BlockStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockStore").finish_non_exhaustive()
    }
}

impl BlockStore {
    pub fn new(vdevs: Vec<Option<Arc<TopVdev>>>, alloc: SpaceAllocator) -> Self {
        Self {
            vdevs: RwLock::new(vdevs),
            alloc: Mutex::new(alloc),
            stats: Mutex::new(ReadStats::default()),
            force_gang: AtomicUsize::new(0),
            gang_writes: AtomicU64::new(0),
        }
    }

    /// Gang headers this store has written (blocks split for want of a large enough extent,
    /// or forced by [`Self::set_force_ganging`]).
    pub fn gang_writes(&self) -> u64 {
        self.gang_writes.load(Ordering::Relaxed)
    }

    /// Gangs every block larger than `above` bytes (at least 4 KiB), or stops doing so
    /// (`None`); see the field `force_gang`.
    pub fn set_force_ganging(&self, above: Option<usize>) {
        let v = above.map_or(0, |a| a.max(GANG_MIN_PIECE));
        self.force_gang.store(v, Ordering::Relaxed);
    }

    pub fn vdev(&self, id: u32) -> Result<Arc<TopVdev>, BlockError> {
        self.vdevs
            .read()
            .get(id as usize)
            .and_then(|v| v.clone())
            .ok_or(BlockError::UnknownVdev(id))
    }

    /// Space a block is charged in dataset accounting: each copy's allocated size deflated by
    /// its vdev's parity overhead for a 128 KiB block (ZFS's vdev_deflate_ratio), so `used`
    /// is in the same units as the pool's usable capacity. An unknown vdev counts in full.
    pub fn dsize(&self, bp: &BlockPtr) -> u64 {
        const REF: u64 = 128 << 10;
        bp.dvas()
            .map(|d| match self.vdev(d.vdev) {
                Ok(v) => {
                    let inflated = v.asize(REF).max(1);
                    ((u128::from(d.asize) * u128::from(REF)) / u128::from(inflated)) as u64
                }
                Err(_) => d.asize,
            })
            .sum()
    }

    /// Puts a reshaped vdev in the place of the one with its id (`attach`, `detach`).
    /// Sets a vdev by its id (replacing a reshaped one, or adding one).
    pub fn set_vdev(&self, top: Arc<TopVdev>) {
        let mut vdevs = self.vdevs.write();
        let id = top.id as usize;
        if vdevs.len() <= id {
            vdevs.resize(id + 1, None);
        }
        vdevs[id] = Some(top);
    }

    /// Forgets a removed vdev (its id stays unused).
    pub fn remove_vdev(&self, id: u32) {
        if let Some(slot) = self.vdevs.write().get_mut(id as usize) {
            *slot = None;
        }
    }

    pub fn vdevs(&self) -> Vec<Arc<TopVdev>> {
        self.vdevs.read().iter().flatten().cloned().collect()
    }

    pub fn read_stats(&self) -> ReadStats {
        *self.stats.lock()
    }

    /// Compresses, checksums, allocates and queues `data` as a new block born in `txg`.
    pub fn write(
        &self,
        data: &[u8],
        props: &WriteProps,
        txg: u64,
        fill: u64,
        batch: &Arc<IoBatch>,
    ) -> Result<BlockPtr, BlockError> {
        self.write_inner(data, None, props, txg, fill, batch)
            .map(|(bp, _)| bp)
    }

    /// [`BlockStore::write`] of bytes the caller shares and never changes again (an object's
    /// dirty block): when they are stored as they are (not compressed, a whole number of
    /// sectors, aligned in memory) the devices write them without a copy. When they are
    /// stored compressed, the compressed bytes (the block's physical bytes, `psize` long)
    /// come back too, for the caller to cache.
    pub fn write_shared(
        &self,
        data: &Arc<Vec<u8>>,
        props: &WriteProps,
        txg: u64,
        fill: u64,
        batch: &Arc<IoBatch>,
    ) -> Result<(BlockPtr, Option<Vec<u8>>), BlockError> {
        self.write_inner(data, Some(data), props, txg, fill, batch)
    }

    fn write_inner(
        &self,
        data: &[u8],
        shared: Option<&Arc<Vec<u8>>>,
        props: &WriteProps,
        txg: u64,
        fill: u64,
        batch: &Arc<IoBatch>,
    ) -> Result<(BlockPtr, Option<Vec<u8>>), BlockError> {
        assert!(!data.is_empty(), "empty blocks are holes, not written");
        if data.len() > crate::MAX_BLOCK_BYTES {
            return Err(BlockError::InvalidProperty(format!(
                "a block of {} bytes is over the {} byte maximum",
                data.len(),
                crate::MAX_BLOCK_BYTES
            )));
        }
        let compressed = props.compression.compress(data);
        let (compression, physical, shared): (Compression, &[u8], _) = match &compressed {
            Some(c) => (props.compression, c, None),
            None => (Compression::Off, data, shared),
        };
        let mut bp = self.write_physical(physical, shared, props, txg, batch)?;
        bp.compression = compression;
        bp.lsize = data.len() as u32;
        bp.fill = fill;
        Ok((bp, compressed))
    }

    /// Allocates and queues physical bytes; gangs the block (splits it into pieces listed by
    /// a gang header, ZFS's answer to fragmented free space) when no extent is large enough.
    fn write_physical(
        &self,
        physical: &[u8],
        shared: Option<&Arc<Vec<u8>>>,
        props: &WriteProps,
        txg: u64,
        batch: &Arc<IoBatch>,
    ) -> Result<BlockPtr, BlockError> {
        let checksum = props.checksum.compute(physical);
        let mut bp = BlockPtr {
            dvas: [Dva::default(); MAX_DVAS],
            kind: props.kind,
            level: props.level,
            checksum_kind: props.checksum,
            compression: Compression::Off,
            lsize: physical.len() as u32,
            psize: physical.len() as u32,
            birth_txg: txg,
            fill: 1,
            checksum,
            gang: false,
        };
        let forced = self.force_gang.load(Ordering::Relaxed);
        let gang = if forced > 0 && physical.len() > forced {
            Err(BlockError::NoSpace)
        } else {
            self.allocate(physical.len(), props, txg)
        };
        match gang {
            Ok(dvas) => {
                bp.dvas = dvas;
                self.queue_copies(&dvas, physical, shared, batch)?;
                Ok(bp)
            }
            Err(BlockError::NoSpace) if physical.len() > GANG_MIN_PIECE => {
                let piece = physical.len().div_ceil(GANG_CHILDREN).div_ceil(512) * 512;
                let child_props = WriteProps {
                    kind: BlockKind::Data,
                    compression: Compression::Off,
                    ..*props
                };
                let mut children = Vec::new();
                for chunk in physical.chunks(piece) {
                    match self.write_physical(chunk, None, &child_props, txg, batch) {
                        Ok(c) => children.push(c),
                        Err(e) => {
                            self.undo(&children)?;
                            return Err(e);
                        }
                    }
                }
                let header_props = WriteProps {
                    class: AllocClass::Metadata,
                    ..*props
                };
                // The header's DVAs are known before it is encoded: its seal names the first.
                match self.allocate(GANG_HEADER_SIZE, &header_props, txg) {
                    Ok(dvas) => {
                        bp.dvas = dvas;
                        bp.gang = true;
                        let header = encode_gang(&children, &bp);
                        self.queue_copies(&dvas, &header, None, batch)?;
                        self.gang_writes.fetch_add(1, Ordering::Relaxed);
                        Ok(bp)
                    }
                    Err(e) => {
                        self.undo(&children)?;
                        Err(e)
                    }
                }
            }
            Err(e) => Err(e),
        }
    }

    /// Gives back the allocations of pieces written in this txg but never referenced.
    fn undo(&self, children: &[BlockPtr]) -> Result<(), BlockError> {
        let mut alloc = self.alloc.lock();
        for c in children {
            for d in c.dvas() {
                alloc.undo_alloc(d.vdev, d.offset, d.asize)?;
            }
        }
        Ok(())
    }

    /// Allocates one DVA per copy for `len` physical bytes.
    fn allocate(
        &self,
        len: usize,
        props: &WriteProps,
        txg: u64,
    ) -> Result<[Dva; MAX_DVAS], BlockError> {
        let copies = usize::from(props.copies.clamp(1, MAX_DVAS as u8));
        let vdevs = self.vdevs();
        let asize_of = |id: u32| -> u64 {
            vdevs
                .iter()
                .find(|v| v.id == id)
                .map(|v| v.asize(len as u64))
                .unwrap_or(u64::MAX / 4)
        };
        let mut dvas = [Dva::default(); MAX_DVAS];
        let mut alloc = self.alloc.lock();
        let mut used: Vec<u32> = Vec::new();
        for i in 0..copies {
            match alloc.alloc(&asize_of, &used, props.class, txg) {
                Ok((vdev, offset, asize)) => {
                    dvas[i] = Dva {
                        vdev,
                        asize,
                        offset,
                    };
                    used.push(vdev);
                }
                Err(e) => {
                    // Give back what this block took (never written, never referenced).
                    for d in dvas.iter().take(i) {
                        alloc.undo_alloc(d.vdev, d.offset, d.asize)?;
                    }
                    return Err(e);
                }
            }
        }
        Ok(dvas)
    }

    /// Queues `physical`, padded with zeros to whole sectors, at every DVA.
    fn queue_copies(
        &self,
        dvas: &[Dva; MAX_DVAS],
        physical: &[u8],
        shared: Option<&Arc<Vec<u8>>>,
        batch: &Arc<IoBatch>,
    ) -> Result<(), BlockError> {
        // One aligned copy, padded to the sector, serves every copy on vdevs of that
        // sector size (or the caller's own bytes, where they need no padding and are
        // aligned); the vdev layer below copies nothing.
        let mut made: Option<IoRef> = None;
        for dva in dvas.iter().filter(|d| !d.is_empty()) {
            let vdev = self.vdev(dva.vdev)?;
            let rounded = vdev.round(physical.len() as u64) as usize;
            let buf = match &made {
                Some(b) if b.len() == rounded => b.clone(),
                _ => made
                    .insert(match shared {
                        Some(bytes) if bytes.len() == rounded => IoRef::share_or_copy(bytes),
                        _ => IoRef::whole(IoBuf::copy_padded(physical, rounded)),
                    })
                    .clone(),
            };
            vdev.write_buf(dva.offset, &buf, batch)?;
        }
        Ok(())
    }

    /// True when every top-level vdev can still be read in full (after a write batch).
    pub fn check_writable(&self) -> Result<(), BlockError> {
        // Vdevs that hold no blocks (hot spares, cache devices) do not count.
        let holding: Vec<u32> = {
            let alloc = self.alloc.lock();
            alloc
                .vdev_ids()
                .filter(|id| alloc.vdev(*id).is_some_and(|v| v.allocatable))
                .collect()
        };
        for v in self.vdevs() {
            if holding.contains(&v.id) && !v.readable() {
                return Err(BlockError::WriteFailed(v.id));
            }
        }
        Ok(())
    }

    /// Reads the physical bytes of a block, verified, healing bad copies.
    pub fn read_physical(&self, bp: &BlockPtr) -> Result<Vec<u8>, BlockError> {
        let psize = bp.psize as usize;
        if !psize_in_range(bp) {
            return Err(BlockError::Decode(format!(
                "{}: physical size {psize} out of range",
                bp.describe()
            )));
        }
        if bp.gang {
            let (_, data) = self.read_gang(bp, true)?;
            return data.ok_or_else(|| BlockError::Checksum { bp: bp.describe() });
        }
        // The sector padding after `psize` was written as zeros and must read back so:
        // otherwise rotted padding would leak into reconstructed parity.
        let verify = |buf: &[u8]| {
            buf.len() >= psize
                && buf[psize..].iter().all(|&b| b == 0)
                && bp.checksum_kind.compute(&buf[..psize]) == bp.checksum
        };
        let mut buf = self.read_dvas(bp, psize, &verify)?;
        buf.truncate(psize);
        Ok(buf)
    }

    /// Reads a gang block's header from the first copy that verifies as this pointer's, then
    /// (with `data`, or always for a version 0 header, whose pieces only the assembled data
    /// can prove) reads its pieces and checks them against the pointer's checksum. A copy
    /// whose pieces fail is passed over for the next one.
    fn read_gang(
        &self,
        bp: &BlockPtr,
        data: bool,
    ) -> Result<(Vec<BlockPtr>, Option<Vec<u8>>), BlockError> {
        let psize = bp.psize as usize;
        let verify = |buf: &[u8]| gang_verify(buf, bp);
        let (_, out) = self.read_dvas_then(bp, GANG_HEADER_SIZE, &verify, |raw| {
            let header = decode_gang(raw, bp)?;
            if header.sealed && !data {
                return Ok((header.pieces, None));
            }
            let mut out = Vec::with_capacity(psize);
            for c in &header.pieces {
                out.extend_from_slice(&self.read_physical(c)?);
            }
            if out.len() != psize || bp.checksum_kind.compute(&out) != bp.checksum {
                return Err(BlockError::Checksum { bp: bp.describe() });
            }
            Ok((header.pieces, Some(out)))
        })?;
        Ok(out)
    }

    /// The pieces a gang block's header lists, once the header is proven to be this
    /// pointer's; Err for a block that is not ganged.
    pub fn gang_pieces(&self, bp: &BlockPtr) -> Result<Vec<BlockPtr>, BlockError> {
        if !bp.gang {
            return Err(BlockError::Decode(format!(
                "{} is not a gang block",
                bp.describe()
            )));
        }
        Ok(self.read_gang(bp, false)?.0)
    }

    /// Reads `len` bytes from the first DVA that verifies; rewrites the copies that failed.
    fn read_dvas(
        &self,
        bp: &BlockPtr,
        len: usize,
        verify: &dyn Fn(&[u8]) -> bool,
    ) -> Result<Vec<u8>, BlockError> {
        Ok(self.read_dvas_then(bp, len, verify, |_| Ok(()))?.0)
    }

    /// As [`Self::read_dvas`], but a copy that verifies must also pass `accept`, or the next
    /// copy is tried; returns the copy's bytes and what `accept` made of them.
    fn read_dvas_then<T>(
        &self,
        bp: &BlockPtr,
        len: usize,
        verify: &dyn Fn(&[u8]) -> bool,
        mut accept: impl FnMut(&[u8]) -> Result<T, BlockError>,
    ) -> Result<(Vec<u8>, T), BlockError> {
        let mut failed: Vec<Dva> = Vec::new();
        let mut good: Option<(Vec<u8>, T)> = None;
        let mut refused: Option<BlockError> = None;
        for dva in bp.dvas() {
            let Ok(vdev) = self.vdev(dva.vdev) else {
                failed.push(*dva);
                continue;
            };
            let rounded = vdev.round(len as u64);
            if dva.asize < vdev.asize(len as u64) {
                failed.push(*dva);
                continue;
            }
            match vdev.read(dva.offset, rounded, bp.birth_txg, verify) {
                Ok((buf, report)) => {
                    if report.repaired > 0 {
                        self.stats.lock().healed_in_vdev += 1;
                    }
                    match accept(&buf) {
                        Ok(t) => {
                            good = Some((buf, t));
                            break;
                        }
                        // Verified but unusable: not rewritten, the next copy is tried.
                        Err(e) => refused = Some(e),
                    }
                }
                Err(_) => failed.push(*dva),
            }
        }
        let Some((buf, t)) = good else {
            return Err(refused.unwrap_or_else(|| BlockError::Checksum { bp: bp.describe() }));
        };
        // Rewrite copies that could not be read, in place: their space is this block's.
        let bad: Vec<Dva> = failed
            .into_iter()
            .filter(|d| self.vdev(d.vdev).is_ok())
            .collect();
        if !bad.is_empty() {
            let batch = IoBatch::new();
            for dva in &bad {
                let vdev = self.vdev(dva.vdev)?;
                if vdev.readable() {
                    let _ = vdev.write(dva.offset, &buf, &batch);
                }
            }
            if batch.wait().is_empty() {
                self.stats.lock().healed_copies += bad.len() as u64;
            }
        }
        Ok((buf, t))
    }

    /// Scrubs a block: reads and verifies every copy (every DVA; every side of a mirror; every
    /// column of a RAID-Z block, parity recomputed and compared), rewrites what is wrong, and
    /// returns the verified physical bytes. Only for a running scan: the rewrites are queued
    /// under the allocator lock after checking that no copy was freed since the scan's
    /// [`SpaceAllocator::watch_frees`], so a block whose space was freed (and maybe reused)
    /// is neither reported nor written (`freed`). Its bytes are still returned when a copy
    /// verified against the pointer's checksum (its space not yet overwritten): a scan walks
    /// a tree node freed under it by a sync as well as a live one. Without a watch every
    /// block counts as freed.
    pub fn scrub(&self, bp: &BlockPtr) -> (ScrubOutcome, Option<Vec<u8>>) {
        let psize = bp.psize as usize;
        if !psize_in_range(bp) {
            let out = ScrubOutcome {
                unrecoverable: true,
                ..Default::default()
            };
            return (out, None);
        }
        if bp.gang {
            let verify = |buf: &[u8]| gang_verify(buf, bp);
            let (mut out, header) = self.scrub_dvas(bp, GANG_HEADER_SIZE, &verify);
            let Some(children) = header.and_then(|h| decode_gang(&h, bp).ok()) else {
                return (out, None);
            };
            let children = children.pieces;
            let mut data = Some(Vec::with_capacity(psize));
            for c in &children {
                let (o, piece) = self.scrub(c);
                out.add(o);
                match (piece, data.as_mut()) {
                    (Some(piece), Some(d)) => d.extend_from_slice(&piece),
                    _ => data = None,
                }
            }
            let data =
                data.filter(|d| d.len() == psize && bp.checksum_kind.compute(d) == bp.checksum);
            out.unrecoverable |= data.is_none() && !out.freed;
            return (out, data);
        }
        let verify = |buf: &[u8]| {
            buf.len() >= psize
                && buf[psize..].iter().all(|&b| b == 0)
                && bp.checksum_kind.compute(&buf[..psize]) == bp.checksum
        };
        let (out, data) = self.scrub_dvas(bp, psize, &verify);
        (
            out,
            data.map(|mut d| {
                d.truncate(psize);
                d
            }),
        )
    }

    fn scrub_dvas(
        &self,
        bp: &BlockPtr,
        len: usize,
        verify: &dyn Fn(&[u8]) -> bool,
    ) -> (ScrubOutcome, Option<Vec<u8>>) {
        let mut out = ScrubOutcome::default();
        let mut reads = Vec::new();
        for dva in bp.dvas() {
            let Ok(vdev) = self.vdev(dva.vdev) else {
                continue;
            };
            let read = (dva.asize >= vdev.asize(len as u64))
                .then(|| {
                    vdev.scrub_read(dva.offset, vdev.round(len as u64), bp.birth_txg, verify)
                        .ok()
                })
                .flatten();
            out.read_bytes += read.as_ref().map_or(0, |r| r.read_bytes);
            reads.push((vdev, *dva, read));
        }
        let good = reads
            .iter()
            .find_map(|(_, _, r)| r.as_ref().map(|r| r.data.clone()));
        let batch = IoBatch::new();
        let mut rewritten: Vec<Arc<TopVdev>> = Vec::new();
        {
            let alloc = self.alloc.lock();
            if bp
                .dvas()
                .any(|d| alloc.freed_since_watch(d.vdev, d.offset, bp.birth_txg))
            {
                // Nothing rewritten or counted; what verified is still the block's bytes.
                out.freed = true;
                return (out, good);
            }
            for (vdev, dva, read) in &reads {
                match (read.as_ref(), &good) {
                    (Some(r), _) => {
                        // Live: what the devices returned wrong counts now.
                        vdev.count_fix_errors(&r.fixes);
                        vdev.queue_fixes(&r.fixes, &batch)
                    }
                    // A copy that could not be read at all is rewritten from a good one.
                    (None, Some(good))
                        if vdev.readable() && vdev.write(dva.offset, good, &batch).is_ok() =>
                    {
                        rewritten.push(vdev.clone());
                    }
                    _ => {}
                }
            }
        }
        let failed = batch.wait();
        for (vdev, _, read) in &reads {
            if let Some(r) = read {
                out.repaired_bytes += vdev.count_repaired(&r.fixes, &failed).1;
            }
        }
        for vdev in rewritten {
            let vdev_failed = failed
                .iter()
                .any(|(l, _)| vdev.leaves.iter().any(|v| Arc::ptr_eq(v, l)));
            if !vdev_failed {
                out.repaired_bytes += good.as_ref().map_or(0, |g| g.len() as u64);
            }
        }
        out.unrecoverable = good.is_none();
        (out, good)
    }

    /// Starts reading a block without waiting (the first copy's fast path), so a caller can
    /// keep many blocks in flight; [`BlockStore::complete`] finishes it.
    pub fn submit(&self, bp: &BlockPtr) -> PendingBlock {
        let pending = if bp.gang || !psize_in_range(bp) {
            None
        } else {
            bp.dvas().next().and_then(|d| {
                let vdev = self.vdev(d.vdev).ok()?;
                let len = vdev.round(u64::from(bp.psize));
                let p = vdev.submit_read(d.offset, len, bp.birth_txg)?;
                Some((vdev, p))
            })
        };
        PendingBlock { bp: *bp, pending }
    }

    /// Finishes a submitted read: verified and decompressed, or through the full read path
    /// (other copies, reconstruction, healing) when the fast path did not verify.
    pub fn complete(&self, p: PendingBlock) -> Result<Vec<u8>, BlockError> {
        let bp = p.bp;
        let physical = self.complete_physical(p)?;
        bp.compression.decompress_owned(physical, bp.lsize as usize)
    }

    /// Finishes a submitted read with the verified physical (stored) bytes.
    pub fn complete_physical(&self, p: PendingBlock) -> Result<Vec<u8>, BlockError> {
        let bp = p.bp;
        if let Some((vdev, pending)) = p.pending {
            let psize = bp.psize as usize;
            let verify = |buf: &[u8]| {
                buf.len() >= psize
                    && buf[psize..].iter().all(|&b| b == 0)
                    && bp.checksum_kind.compute(&buf[..psize]) == bp.checksum
            };
            if let Some(mut buf) = vdev.finish_read(pending, &verify) {
                buf.truncate(psize);
                return Ok(buf);
            }
        }
        self.read_physical(&bp)
    }

    /// Reads a block and returns its logical bytes.
    pub fn read(&self, bp: &BlockPtr) -> Result<Vec<u8>, BlockError> {
        let physical = self.read_physical(bp)?;
        bp.compression.decompress_owned(physical, bp.lsize as usize)
    }

    /// Frees every copy of a block in `txg` (deferred, see `alloc.rs`). A gang block's
    /// pieces are found through its header.
    pub fn free(&self, bp: &BlockPtr, txg: u64) -> Result<(), BlockError> {
        if bp.gang {
            // Only pieces of a header proven to be this pointer's are freed. When no copy of
            // the header can be read, the pieces leak (as ZFS does) rather than fail the txg.
            match self.read_gang(bp, false) {
                Ok((pieces, _)) => {
                    for c in pieces {
                        self.free(&c, txg)?;
                    }
                }
                Err(_) => self.stats.lock().leaked_gangs += 1,
            }
        }
        let mut alloc = self.alloc.lock();
        for dva in bp.dvas() {
            alloc.free(dva.vdev, dva.offset, dva.asize, txg)?;
        }
        Ok(())
    }

    /// Claims every copy of a block the intent log wrote (and its gang pieces) in `txg`:
    /// see `SpaceAllocator::claim`.
    pub fn claim(&self, bp: &BlockPtr, txg: u64) -> Result<(), BlockError> {
        {
            let mut alloc = self.alloc.lock();
            for dva in bp.dvas() {
                alloc.claim(dva.vdev, dva.offset, dva.asize, txg)?;
            }
        }
        if bp.gang {
            for c in self.read_gang(bp, false)?.0 {
                self.claim(&c, txg)?;
            }
        }
        Ok(())
    }

    /// Queues a flush of every device.
    pub fn flush_all(&self, batch: &Arc<IoBatch>) {
        for v in self.vdevs() {
            v.flush(batch);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gang::GANG_MAGIC;
    use tank_device::MemDevice;
    use tank_vdev::{Layout, Leaf, ParityCodec, TopVdev};

    fn store() -> BlockStore {
        let dev = Arc::new(MemDevice::new("m", 64 << 20));
        let leaf = Leaf::new(1, "m".into(), tank_vdev::usable_size(64 << 20), Some(dev));
        let top = Arc::new(TopVdev::new(
            0,
            2,
            Layout::Disk,
            vec![leaf],
            12,
            Arc::new(ParityCodec::new()),
        ));
        let mut alloc = SpaceAllocator::new();
        alloc.add_vdev(0, top.space(), 4096, true);
        BlockStore::new(vec![Some(top)], alloc)
    }

    fn data_props(copies: u8) -> WriteProps {
        WriteProps {
            kind: BlockKind::Data,
            level: 0,
            checksum: ChecksumKind::Blake3,
            compression: Compression::Off,
            copies,
            class: AllocClass::Metadata,
        }
    }

    fn pattern(len: u32, salt: u32) -> Vec<u8> {
        (0..len).map(|i| ((i * 7919 + salt) >> 5) as u8).collect()
    }

    #[test]
    fn a_header_read_through_a_stale_pointer_frees_nothing() {
        let bs = store();
        bs.set_force_ganging(Some(8192));
        let data = pattern(65536, 1);
        let batch = IoBatch::new();
        let bp = bs.write(&data, &data_props(1), 20, 1, &batch).unwrap();
        assert!(batch.wait().is_empty());
        assert!(bp.gang);
        let pieces = bs.gang_pieces(&bp).unwrap();
        assert_eq!(pieces.len(), 3);
        let allocated = bs.alloc.lock().free_bytes();
        // The same DVAs as a pointer of another txg (a stale pointer to since-reused space):
        // the header is not its, nothing is read and no piece is freed.
        let stale = BlockPtr {
            birth_txg: 19,
            ..bp
        };
        assert!(bs.read(&stale).is_err());
        bs.free(&stale, 21).unwrap();
        bs.alloc.lock().begin_txg(21 + crate::DEFER_TXGS).unwrap();
        let header_asize: u64 = bp.dvas().map(|d| d.asize).sum();
        assert_eq!(
            bs.alloc.lock().free_bytes(),
            allocated + header_asize,
            "only the stale pointer's own DVAs were freed, not the pieces its header names"
        );
        assert_eq!(bs.read_stats().leaked_gangs, 1);
        for p in &pieces {
            assert!(bs.read(p).is_ok(), "a live piece survived");
        }
    }

    #[test]
    fn a_header_copy_whose_pieces_fail_gives_way_to_the_next() {
        let bs = store();
        bs.set_force_ganging(Some(8192));
        let data = pattern(65536, 2);
        let batch = IoBatch::new();
        let bp = bs.write(&data, &data_props(2), 30, 1, &batch).unwrap();
        assert!(batch.wait().is_empty());
        assert_eq!(bp.copies(), 2);
        // The first copy becomes a self-consistent version 0 header listing other pieces of
        // the right sizes: it verifies, but the assembled data does not.
        let pieces = bs.gang_pieces(&bp).unwrap();
        let decoys: Vec<BlockPtr> = pieces
            .iter()
            .map(|p| BlockPtr {
                checksum: [9; 32],
                ..*p
            })
            .collect();
        let mut legacy = vec![0u8; GANG_HEADER_SIZE];
        legacy[..8].copy_from_slice(GANG_MAGIC);
        legacy[8..12].copy_from_slice(&(decoys.len() as u32).to_le_bytes());
        for (i, c) in decoys.iter().enumerate() {
            legacy[16 + i * 128..16 + (i + 1) * 128].copy_from_slice(&c.encode());
        }
        let sum = blake3::hash(&legacy[..480]);
        legacy[480..].copy_from_slice(sum.as_bytes());
        let vdev = bs.vdev(0).unwrap();
        let b = IoBatch::new();
        let mut sector = legacy.clone();
        sector.resize(vdev.round(legacy.len() as u64) as usize, 0);
        vdev.write(bp.dvas[0].offset, &sector, &b).unwrap();
        assert!(b.wait().is_empty());
        assert!(decode_gang(&legacy, &bp).is_ok_and(|h| !h.sealed));
        assert_eq!(
            bs.read(&bp).unwrap(),
            data,
            "the second header copy was used"
        );
    }

    fn raidz_store() -> BlockStore {
        let leaves: Vec<_> = (0..5)
            .map(|i| {
                let dev = Arc::new(MemDevice::new(format!("r{i}"), 64 << 20));
                Leaf::new(
                    10 + i,
                    format!("r{i}"),
                    tank_vdev::usable_size(64 << 20),
                    Some(dev),
                )
            })
            .collect();
        let g = tank_vdev::RaidzGeometry::new(5, 2, 12).unwrap();
        let top = Arc::new(TopVdev::new(
            0,
            3,
            Layout::Raidz(g),
            leaves,
            12,
            Arc::new(ParityCodec::new()),
        ));
        let mut alloc = SpaceAllocator::new();
        alloc.add_vdev(0, top.space(), 4096, true);
        BlockStore::new(vec![Some(top)], alloc)
    }

    /// Pointers a damaged (or hostile) device could hold: every read, scrub, free and claim
    /// of them is an error naming the block, never a panic or a huge allocation.
    #[test]
    fn damaged_pointers_are_errors_not_panics() {
        for bs in [store(), raidz_store()] {
            let batch = IoBatch::new();
            let good = bs
                .write(&pattern(20000, 3), &data_props(1), 5, 1, &batch)
                .unwrap();
            assert!(batch.wait().is_empty());
            let d = good.dvas[0];
            let damaged = [
                // An offset inside a sector.
                BlockPtr {
                    dvas: [
                        Dva {
                            offset: d.offset + 512,
                            ..d
                        },
                        Dva::default(),
                        Dva::default(),
                    ],
                    ..good
                },
                // Past the end of the vdev, and where offset + size overflows.
                BlockPtr {
                    dvas: [
                        Dva {
                            offset: u64::MAX - 4095,
                            ..d
                        },
                        Dva::default(),
                        Dva::default(),
                    ],
                    ..good
                },
                // No bytes, and more than any block.
                BlockPtr { psize: 0, ..good },
                BlockPtr {
                    psize: u32::MAX,
                    ..good
                },
                BlockPtr {
                    lsize: u32::MAX,
                    compression: Compression::Lz4,
                    ..good
                },
                // A gang flag on a block that is not one, and a gang block of no size.
                BlockPtr { gang: true, ..good },
                BlockPtr {
                    gang: true,
                    psize: 0,
                    ..good
                },
                // A vdev that does not exist.
                BlockPtr {
                    dvas: [Dva { vdev: 7, ..d }, Dva::default(), Dva::default()],
                    ..good
                },
            ];
            for bp in damaged {
                assert!(bs.read(&bp).is_err(), "{bp:?} read");
                let (out, data) = bs.scrub(&bp);
                match data {
                    // Only bytes that verify come back: a pointer damaged beyond its physical
                    // block (a wrong logical size) still names good physical bytes.
                    Some(d) => assert!(
                        d.len() == bp.psize as usize && bp.checksum_kind.compute(&d) == bp.checksum,
                        "{bp:?} scrub"
                    ),
                    None => assert!(out.unrecoverable || out.freed, "{bp:?} scrub"),
                }
                let p = bs.submit(&bp);
                assert!(bs.complete(p).is_err(), "{bp:?} submitted");
                let _ = bs.free(&bp, 6);
                let _ = bs.claim(&bp, 6);
            }
            let err = bs
                .read(&BlockPtr { psize: 0, ..good })
                .unwrap_err()
                .to_string();
            assert!(err.contains("physical size 0 out of range"), "{err}");
            assert_eq!(
                bs.read(&good).unwrap(),
                pattern(20000, 3),
                "the good block is intact"
            );
        }
    }

    #[test]
    fn fragmented_space_gangs_and_reads_back() {
        let bs = store();
        // Fill the vdev with 8 KiB pieces, then free every other one: no 16 KiB extent left.
        let mut pieces = Vec::new();
        {
            let mut a = bs.alloc.lock();
            while let Ok(x) = a.alloc(&|_| 8192, &[], AllocClass::Metadata, 1) {
                pieces.push(x);
            }
            for (i, (v, o, l)) in pieces.iter().enumerate() {
                if i % 2 == 0 {
                    a.free(*v, *o, *l, 1).unwrap();
                }
            }
            a.begin_txg(1 + crate::DEFER_TXGS).unwrap();
        }
        let data: Vec<u8> = (0..65536u32).map(|i| ((i * 7919) >> 5) as u8).collect();
        let props = WriteProps {
            kind: BlockKind::Data,
            level: 0,
            checksum: ChecksumKind::Blake3,
            compression: Compression::Off,
            copies: 1,
            class: AllocClass::Metadata,
        };
        let free_before = bs.alloc.lock().free_bytes();
        let batch = IoBatch::new();
        let bp = bs.write(&data, &props, 20, 1, &batch).unwrap();
        assert!(batch.wait().is_empty());
        assert!(bp.gang, "64 KiB in 8 KiB holes must gang");
        let raw = BlockPtr::decode(&bp.encode()).unwrap().unwrap();
        assert_eq!(bs.read(&raw).unwrap(), data);
        bs.free(&raw, 21).unwrap();
        let mut a = bs.alloc.lock();
        a.begin_txg(21 + crate::DEFER_TXGS).unwrap();
        assert_eq!(
            a.free_bytes(),
            free_before,
            "every piece and header was freed"
        );
    }
}
