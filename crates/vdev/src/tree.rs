//! Top-level vdevs: a single disk, an n-way mirror, or RAID-Z1/2/3, and their self-healing reads.
//!
//! # Theory of operation
//! A pool stripes blocks over top-level vdevs; each top-level vdev has its own address space
//! (offsets in a DVA are in it). A disk maps it one to one onto its leaf's data area; a mirror
//! onto every side; RAID-Z through [`RaidzGeometry::map`] onto columns of its children, each block
//! its own full stripe (no read-modify-write, so no write hole).
//!
//! Reads take a `verify` function (the block checksum from the parent pointer). A read that
//! verifies is done. A read that fails verification, or a device error, is healed here:
//! - mirror: the other sides are tried; a good copy is written back over every bad side;
//! - RAID-Z: missing columns are rebuilt from parity, and when no device reported an error the
//!   combinations of columns are tried guided by the checksum (ZFS's combinatorial
//!   reconstruction); every column found wrong is rewritten and counted as a CKSUM error.
//!
//! Healthy RAID-Z reads read only the data columns.
//!
//! A scrub read ([`TopVdev::scrub_read`]) reads every copy: all sides of a mirror, all
//! columns of a RAID-Z block (parity included, recomputed and compared), in the scan I/O
//! class. It returns what must be rewritten ([`Fix`]) instead of writing it, so the block
//! layer can first make sure the block was not freed (and its space reused) meanwhile.
//!
//! # Failure model
//! A leaf whose write fails is FAULTED (see `leaf.rs`); a write batch succeeds as long as every
//! top-level vdev it touched can still be read in full ([`TopVdev::readable`]). Reads never
//! return data that failed verification.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::codec::{encode_map, encode_map_shared, reconstruct_verified, ParityCodec};
use crate::leaf::{IoBatch, IoClass, Leaf, VdevState};
use crate::raidz::RaidzGeometry;
use tank_device::IoRef;

#[derive(Debug, Clone)]
pub enum Layout {
    Disk,
    Mirror,
    Raidz(RaidzGeometry),
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VdevError {
    #[error("vdev {vdev}: block at {offset:#x} ({len} bytes) could not be read or reconstructed")]
    Unrecoverable { vdev: u32, offset: u64, len: u64 },
    #[error("vdev {vdev}: not enough healthy devices to read or write")]
    NotEnoughReplicas { vdev: u32 },
    #[error("vdev {vdev}: access [{offset:#x}, +{len:#x}) outside its space of {space:#x} bytes")]
    OutOfRange {
        vdev: u32,
        offset: u64,
        len: u64,
        space: u64,
    },
    #[error(
        "vdev {vdev}: access at {offset:#x} of {len} bytes is not whole {sector}-byte sectors"
    )]
    Misaligned {
        vdev: u32,
        offset: u64,
        len: u64,
        sector: u64,
    },
}

/// A read in flight (see [`TopVdev::submit_read`]).
pub struct PendingRead {
    parts: Vec<crossbeam_channel::Receiver<Result<Vec<u8>, tank_device::DeviceError>>>,
    len: u64,
    /// A degraded RAID-Z read: every column was submitted (`parts` in map order), to be
    /// rebuilt from the parity when finished.
    degraded: Option<(crate::raidz::RaidzMap, u64)>,
}

/// What a read found, for the scrub and the tests.
#[derive(Debug, Default, Clone)]
pub struct ReadReport {
    /// Columns or sides that returned wrong data or an error and were rewritten.
    pub repaired: usize,
    /// Reconstruction combinations tried (RAID-Z).
    pub combinations: usize,
}

/// A column or mirror side found wrong (or unreadable), and the bytes it must hold.
#[derive(Debug, Clone)]
pub struct Fix {
    /// Index of the leaf in [`TopVdev::leaves`].
    pub leaf: usize,
    /// Offset in the leaf's data area.
    pub offset: u64,
    pub data: IoRef,
    /// The device returned wrong bytes (a CKSUM error), rather than an error or nothing.
    pub cksum: bool,
}

/// What a verifying read of every copy of a block found (see [`TopVdev::scrub_read`]).
#[derive(Debug, Default)]
pub struct ScrubRead {
    /// The block's verified bytes.
    pub data: Vec<u8>,
    /// Bytes read from the devices (all sides, all columns).
    pub read_bytes: u64,
    /// What must be rewritten to restore full redundancy.
    pub fixes: Vec<Fix>,
    /// Reconstruction combinations tried (RAID-Z).
    pub combinations: usize,
}

#[derive(Debug)]
pub struct TopVdev {
    pub id: u32,
    pub guid: u64,
    pub layout: Layout,
    pub leaves: Vec<Arc<Leaf>>,
    pub ashift: u32,
    codec: Arc<ParityCodec>,
}

impl TopVdev {
    pub fn new(
        id: u32,
        guid: u64,
        layout: Layout,
        leaves: Vec<Arc<Leaf>>,
        ashift: u32,
        codec: Arc<ParityCodec>,
    ) -> Self {
        assert!(!leaves.is_empty());
        if let Layout::Raidz(g) = &layout {
            assert_eq!(g.children(), leaves.len());
        }
        Self {
            id,
            guid,
            layout,
            leaves,
            ashift,
            codec,
        }
    }

    /// The same vdev (id, guid, address space) with another shape: a disk that became a
    /// mirror, a mirror with a side more or less (`attach`, `detach`). Disks and mirrors
    /// map their address space one to one onto every leaf, so blocks stay where they are.
    pub fn reshaped(&self, layout: Layout, leaves: Vec<Arc<Leaf>>) -> TopVdev {
        assert!(!matches!(layout, Layout::Raidz(_)) && !matches!(self.layout, Layout::Raidz(_)));
        TopVdev::new(
            self.id,
            self.guid,
            layout,
            leaves,
            self.ashift,
            self.codec.clone(),
        )
    }

    pub fn sector(&self) -> u64 {
        1 << self.ashift
    }

    /// Usable bytes per leaf (the smallest member's data area, sector aligned).
    fn leaf_asize(&self) -> u64 {
        let min = self.leaves.iter().map(|l| l.asize).min().unwrap_or(0);
        min / self.sector() * self.sector()
    }

    /// Size of this vdev's address space.
    pub fn space(&self) -> u64 {
        match &self.layout {
            Layout::Disk | Layout::Mirror => self.leaf_asize(),
            Layout::Raidz(g) => g.vdev_space(self.leaf_asize()),
        }
    }

    /// Capacity for data: a RAID-Z vdev's space deflated as a 128 KiB block is (its parity
    /// and padding taken out, ZFS's vdev_deflate_ratio), the ratio by which the block layer
    /// charges datasets for what they allocate (`dsize`), so dataset sizes and this
    /// capacity are in the same units.
    pub fn capacity(&self) -> u64 {
        const REF: u64 = 128 << 10;
        match &self.layout {
            Layout::Disk | Layout::Mirror => self.space(),
            Layout::Raidz(_) => {
                (u128::from(self.space()) * u128::from(REF) / u128::from(self.asize(REF).max(1)))
                    as u64
            }
        }
    }

    /// Allocated size of a block of `psize` physical bytes.
    /// A zero `psize` (only ever from a damaged pointer) counts as one sector.
    pub fn asize(&self, psize: u64) -> u64 {
        let rounded = self.round(psize.max(1));
        match &self.layout {
            Layout::Disk | Layout::Mirror => rounded,
            Layout::Raidz(g) => g.asize(rounded),
        }
    }

    /// `psize` rounded up to whole sectors: what is written and read.
    pub fn round(&self, psize: u64) -> u64 {
        psize.div_ceil(self.sector()) * self.sector()
    }

    /// How many leaves may be lost while every block stays readable.
    pub fn redundancy(&self) -> usize {
        match &self.layout {
            Layout::Disk => 0,
            Layout::Mirror => self.leaves.len() - 1,
            Layout::Raidz(g) => g.parity(),
        }
    }

    fn unusable(&self) -> usize {
        self.leaves.iter().filter(|l| !l.is_usable()).count()
    }

    /// Whether every block stays readable without `leaf`: the other leaves that are
    /// unusable, lack txgs or are being rebuilt leave redundancy to spare.
    pub fn can_spare(&self, leaf: &Leaf) -> bool {
        let others_short = self
            .leaves
            .iter()
            .filter(|l| l.guid() != leaf.guid())
            .filter(|l| !l.is_usable() || l.dtl().is_some() || l.is_resilvering())
            .count();
        others_short < self.redundancy()
    }

    /// True when every block of this vdev can still be read.
    pub fn readable(&self) -> bool {
        self.unusable() <= self.redundancy()
    }

    /// ONLINE with full redundancy, DEGRADED with less (a leaf missing, or one that lacks
    /// txgs or is being resilvered), UNAVAIL when blocks cannot be read.
    pub fn state(&self) -> VdevState {
        let bad = self.unusable();
        if bad > self.redundancy() {
            VdevState::Unavail
        } else if bad > 0
            || self.leaves.iter().any(|l| {
                l.is_resilvering() || l.state() == VdevState::Degraded || l.spare_for().is_some()
            })
        {
            VdevState::Degraded
        } else {
            VdevState::Online
        }
    }

    /// Every access is checked here before it is mapped: offsets and lengths come from block
    /// pointers, which a damaged device can fill with anything, and the RAID-Z map takes
    /// only whole sectors.
    fn check_range(&self, offset: u64, len: u64) -> Result<(), VdevError> {
        let sector = self.sector();
        if len == 0 || !offset.is_multiple_of(sector) || !len.is_multiple_of(sector) {
            return Err(VdevError::Misaligned {
                vdev: self.id,
                offset,
                len,
                sector,
            });
        }
        let space = self.space();
        if offset.checked_add(len).is_none_or(|end| end > space) {
            return Err(VdevError::OutOfRange {
                vdev: self.id,
                offset,
                len,
                space,
            });
        }
        Ok(())
    }

    /// Queues the write of a block (`data.len()` a whole number of sectors) at `offset`,
    /// from an aligned copy of `data` (see [`TopVdev::write_buf`]).
    pub fn write(&self, offset: u64, data: &[u8], batch: &Arc<IoBatch>) -> Result<(), VdevError> {
        self.write_buf(offset, &IoRef::copy_of(data), batch)
    }

    /// Queues the write of a block (`data.len()` a whole number of sectors) at `offset`.
    /// Nothing copies the block's bytes: a mirror's sides share `data`, and a RAID-Z map's
    /// data columns are ranges of it beside parity columns of their own.
    pub fn write_buf(
        &self,
        offset: u64,
        data: &IoRef,
        batch: &Arc<IoBatch>,
    ) -> Result<(), VdevError> {
        debug_assert_eq!(data.len() as u64 % self.sector(), 0);
        self.check_range(offset, self.asize(data.len() as u64))?;
        match &self.layout {
            Layout::Disk | Layout::Mirror => {
                for leaf in &self.leaves {
                    leaf.write(offset, data.clone(), batch);
                }
            }
            Layout::Raidz(g) => {
                let map = g.map(offset, data.len() as u64);
                let cols = encode_map_shared(&self.codec, &map, data);
                for (col, buf) in map.cols.iter().zip(cols) {
                    self.leaves[col.child].write(col.offset, buf, batch);
                }
                for pad in g.padding(offset, data.len() as u64) {
                    self.leaves[pad.child].pad(pad.offset, pad.size);
                }
            }
        }
        Ok(())
    }

    /// Reads a block of `len` bytes (whole sectors) born in txg `birth`, and heals what is
    /// bad; see the module docs. Leaves that lack that txg are not read.
    pub fn read(
        &self,
        offset: u64,
        len: u64,
        birth: u64,
        verify: &dyn Fn(&[u8]) -> bool,
    ) -> Result<(Vec<u8>, ReadReport), VdevError> {
        self.check_range(offset, self.asize(len))?;
        match &self.layout {
            Layout::Disk | Layout::Mirror => self.read_mirror(offset, len, birth, verify),
            Layout::Raidz(g) => self.read_raidz(g, offset, len, birth, verify),
        }
    }

    fn read_mirror(
        &self,
        offset: u64,
        len: u64,
        birth: u64,
        verify: &dyn Fn(&[u8]) -> bool,
    ) -> Result<(Vec<u8>, ReadReport), VdevError> {
        let n = self.leaves.len();
        // Spread reads of a healthy mirror over its sides, one MiB region at a time.
        let start = ((offset >> 20) as usize) % n;
        let mut fixes = Vec::new();
        let mut good = None;
        for i in 0..n {
            let idx = (start + i) % n;
            let leaf = &self.leaves[idx];
            if !leaf.readable_for(birth) {
                continue;
            }
            match leaf.read(offset, len as usize) {
                Ok(buf) if verify(&buf) => {
                    good = Some(buf);
                    break;
                }
                Ok(_) => fixes.push((idx, true)),
                Err(_) => fixes.push((idx, false)),
            }
        }
        let Some(buf) = good else {
            for &(idx, cksum) in &fixes {
                if cksum {
                    self.leaves[idx].count_cksum_error(offset, len);
                }
            }
            return Err(self.unrecoverable(offset, len));
        };
        let shared = IoRef::copy_of(&buf);
        let fixes: Vec<Fix> = fixes
            .into_iter()
            .map(|(leaf, cksum)| Fix {
                leaf,
                offset,
                data: shared.clone(),
                cksum,
            })
            .collect();
        let report = ReadReport {
            repaired: self.heal(&fixes),
            combinations: 0,
        };
        Ok((buf, report))
    }

    fn unrecoverable(&self, offset: u64, len: u64) -> VdevError {
        VdevError::Unrecoverable {
            vdev: self.id,
            offset,
            len,
        }
    }

    /// Writes the fixes now and waits; returns how many were written.
    fn heal(&self, fixes: &[Fix]) -> usize {
        if fixes.is_empty() {
            return 0;
        }
        self.count_fix_errors(fixes);
        let batch = IoBatch::new();
        self.queue_fixes(fixes, &batch);
        let failed = batch.wait();
        self.count_repaired(fixes, &failed).0
    }

    /// Counts the CKSUM errors the fixes stand for (once the block is known to be live: a
    /// scan counts them only after checking the block was not freed under it).
    pub fn count_fix_errors(&self, fixes: &[Fix]) {
        for f in fixes.iter().filter(|f| f.cksum) {
            self.leaves[f.leaf].count_cksum_error(f.offset, f.data.len() as u64);
        }
    }

    /// Queues the writes of `fixes` (to the leaves that can take them).
    pub fn queue_fixes(&self, fixes: &[Fix], batch: &Arc<IoBatch>) {
        for f in fixes {
            let leaf = &self.leaves[f.leaf];
            if leaf.is_usable() {
                leaf.write(f.offset, f.data.clone(), batch);
            }
        }
    }

    /// Counts the fixes whose writes succeeded as repaired bytes; returns how many did and
    /// their bytes.
    pub fn count_repaired(
        &self,
        fixes: &[Fix],
        failed: &[(Arc<Leaf>, tank_device::DeviceError)],
    ) -> (usize, u64) {
        let (mut repaired, mut bytes) = (0, 0);
        for f in fixes {
            let leaf = &self.leaves[f.leaf];
            if leaf.is_usable() && !failed.iter().any(|(l, _)| Arc::ptr_eq(l, leaf)) {
                let len = f.data.len() as u64;
                leaf.stats.repaired_bytes.fetch_add(len, Ordering::Relaxed);
                repaired += 1;
                bytes += len;
            }
        }
        (repaired, bytes)
    }

    /// Queues the read of a column, or answers `None` at once for a leaf that cannot hold it.
    fn read_col(
        &self,
        c: &crate::raidz::RaidzCol,
        birth: u64,
        class: IoClass,
    ) -> crossbeam_channel::Receiver<Result<Vec<u8>, tank_device::DeviceError>> {
        let leaf = &self.leaves[c.child];
        if leaf.is_usable() && leaf.is_stale(birth) {
            let (tx, rx) = crossbeam_channel::bounded(1);
            let _ = tx.send(Err(tank_device::DeviceError::Invalid {
                dev: leaf.path(),
                what: "lacks the txg of this block (resilvering)".into(),
            }));
            return rx;
        }
        leaf.read_async_class(c.offset, c.size as usize, class)
    }

    fn read_raidz(
        &self,
        g: &RaidzGeometry,
        offset: u64,
        len: u64,
        birth: u64,
        verify: &dyn Fn(&[u8]) -> bool,
    ) -> Result<(Vec<u8>, ReadReport), VdevError> {
        let map = g.map(offset, len);
        let parity = map.parity;
        // First try: the data columns only.
        let mut cols: Vec<Option<Vec<u8>>> = vec![None; map.cols.len()];
        let pending: Vec<_> = map
            .cols
            .iter()
            .enumerate()
            .skip(parity)
            .map(|(i, c)| (i, self.read_col(c, birth, IoClass::Normal)))
            .collect();
        for (i, rx) in pending {
            cols[i] = rx.recv().ok().and_then(Result::ok);
        }
        if cols[parity..].iter().all(Option::is_some) {
            let mut data = Vec::with_capacity(len as usize);
            for c in &cols[parity..] {
                data.extend_from_slice(c.as_ref().expect("present"));
            }
            if verify(&data) {
                return Ok((data, ReadReport::default()));
            }
        }
        // Slow path: read the parity too and reconstruct.
        let pending: Vec<_> = map
            .cols
            .iter()
            .enumerate()
            .take(parity)
            .map(|(i, c)| (i, self.read_col(c, birth, IoClass::Normal)))
            .collect();
        for (i, rx) in pending {
            cols[i] = rx.recv().ok().and_then(Result::ok);
        }
        let (data, fixes, combinations) = self.reconstruct(&map, cols, offset, len, verify)?;
        let report = ReadReport {
            repaired: self.heal(&fixes),
            combinations,
        };
        Ok((data, report))
    }

    /// Rebuilds a RAID-Z block from its columns (`None`: unreadable), guided by the
    /// checksum; every column that differs from the block's true encoding becomes a fix
    /// (a CKSUM error when its device returned it without an error; counted by whoever
    /// applies the fixes).
    fn reconstruct(
        &self,
        map: &crate::raidz::RaidzMap,
        cols: Vec<Option<Vec<u8>>>,
        offset: u64,
        len: u64,
        verify: &dyn Fn(&[u8]) -> bool,
    ) -> Result<(Vec<u8>, Vec<Fix>, usize), VdevError> {
        let missing: Vec<bool> = cols.iter().map(Option::is_none).collect();
        let rec = reconstruct_verified(&self.codec, map, cols, verify)
            .map_err(|_| self.unrecoverable(offset, len))?;
        let mut fixes = Vec::new();
        if !rec.bad_cols.is_empty() {
            let good_cols = encode_map(&self.codec, map, &rec.data);
            for &i in &rec.bad_cols {
                let col = &map.cols[i];
                if self.leaves[col.child].is_usable() {
                    fixes.push(Fix {
                        leaf: col.child,
                        offset: col.offset,
                        data: IoRef::copy_of(&good_cols[i]),
                        cksum: !missing[i],
                    });
                }
            }
        }
        Ok((rec.data, fixes, rec.combinations_tried))
    }

    /// Reads every copy of a block in the scan I/O class and verifies each: every side of a
    /// mirror, every column of a RAID-Z block (the parity recomputed from the verified data
    /// and compared). Nothing is written: the fixes are returned (see the module docs).
    pub fn scrub_read(
        &self,
        offset: u64,
        len: u64,
        birth: u64,
        verify: &dyn Fn(&[u8]) -> bool,
    ) -> Result<ScrubRead, VdevError> {
        self.check_range(offset, self.asize(len))?;
        match &self.layout {
            Layout::Disk | Layout::Mirror => {
                // Sides that lack the block's txg are not read, only rewritten.
                let mut bad: Vec<(usize, bool)> = (0..self.leaves.len())
                    .filter(|&i| self.leaves[i].is_usable() && self.leaves[i].is_stale(birth))
                    .map(|i| (i, false))
                    .collect();
                let pending: Vec<_> = self
                    .leaves
                    .iter()
                    .enumerate()
                    .filter(|(_, l)| l.readable_for(birth))
                    .map(|(i, l)| (i, l.read_async_class(offset, len as usize, IoClass::Scan)))
                    .collect();
                let mut good = None;
                let mut read_bytes = 0;
                for (i, rx) in pending {
                    match rx.recv().ok().and_then(Result::ok) {
                        Some(buf) => {
                            read_bytes += len;
                            if verify(&buf) {
                                good.get_or_insert(buf);
                            } else {
                                bad.push((i, true));
                            }
                        }
                        None => bad.push((i, false)),
                    }
                }
                let data = good.ok_or_else(|| self.unrecoverable(offset, len))?;
                let shared = IoRef::copy_of(&data);
                Ok(ScrubRead {
                    data,
                    read_bytes,
                    fixes: bad
                        .into_iter()
                        .map(|(leaf, cksum)| Fix {
                            leaf,
                            offset,
                            data: shared.clone(),
                            cksum,
                        })
                        .collect(),
                    combinations: 0,
                })
            }
            Layout::Raidz(g) => {
                let map = g.map(offset, len);
                let pending: Vec<_> = map
                    .cols
                    .iter()
                    .map(|c| self.read_col(c, birth, IoClass::Scan))
                    .collect();
                let cols: Vec<Option<Vec<u8>>> = pending
                    .into_iter()
                    .map(|rx| rx.recv().ok().and_then(Result::ok))
                    .collect();
                let read_bytes = cols.iter().flatten().map(|c| c.len() as u64).sum();
                let (data, fixes, combinations) =
                    self.reconstruct(&map, cols, offset, len, verify)?;
                Ok(ScrubRead {
                    data,
                    read_bytes,
                    fixes,
                    combinations,
                })
            }
        }
    }

    /// Starts the fast path of a read (RAID-Z: the data columns; mirror: one side) without
    /// waiting; [`TopVdev::finish_read`] completes it. Lets a caller keep many blocks in flight.
    pub fn submit_read(&self, offset: u64, len: u64, birth: u64) -> Option<PendingRead> {
        self.check_range(offset, self.asize(len)).ok()?;
        match &self.layout {
            Layout::Disk | Layout::Mirror => {
                let n = self.leaves.len();
                let start = ((offset >> 20) as usize) % n;
                let leaf = (0..n)
                    .map(|i| &self.leaves[(start + i) % n])
                    .find(|l| l.readable_for(birth))?;
                Some(PendingRead {
                    parts: vec![leaf.read_async(offset, len as usize)],
                    len,
                    degraded: None,
                })
            }
            Layout::Raidz(g) => {
                let map = g.map(offset, len);
                let read = |c: &crate::raidz::RaidzCol| self.read_col(c, birth, IoClass::Normal);
                // A data column on a missing device: read the parity at once too, so a
                // degraded stream keeps many blocks in flight instead of rebuilding one at a
                // time in the slow path.
                if map
                    .data_cols()
                    .iter()
                    .any(|c| !self.leaves[c.child].readable_for(birth))
                {
                    return Some(PendingRead {
                        parts: map.cols.iter().map(read).collect(),
                        len,
                        degraded: Some((map, offset)),
                    });
                }
                Some(PendingRead {
                    parts: map.data_cols().iter().map(read).collect(),
                    len,
                    degraded: None,
                })
            }
        }
    }

    /// The data of a submitted read if it arrived whole and verifies; `None` sends the caller
    /// to [`TopVdev::read`], which heals.
    pub fn finish_read(
        &self,
        pending: PendingRead,
        verify: &dyn Fn(&[u8]) -> bool,
    ) -> Option<Vec<u8>> {
        if let Some((map, offset)) = pending.degraded {
            let cols: Vec<Option<Vec<u8>>> = pending
                .parts
                .into_iter()
                .map(|rx| rx.recv().ok().and_then(Result::ok))
                .collect();
            let (data, fixes, _) = self
                .reconstruct(&map, cols, offset, pending.len, verify)
                .ok()?;
            self.heal(&fixes);
            return Some(data);
        }
        let mut parts = pending.parts.into_iter();
        let mut data = parts.next()?.recv().ok()?.ok()?;
        if data.len() as u64 != pending.len {
            data.reserve(pending.len as usize - data.len());
        }
        for rx in parts {
            data.extend_from_slice(&rx.recv().ok()?.ok()?);
        }
        (data.len() as u64 == pending.len && verify(&data)).then_some(data)
    }

    /// Queues a flush of every usable leaf.
    pub fn flush(&self, batch: &Arc<IoBatch>) {
        for leaf in &self.leaves {
            if leaf.is_usable() {
                leaf.flush(batch);
            }
        }
    }

    pub fn type_name(&self) -> String {
        match &self.layout {
            Layout::Disk => "disk".into(),
            Layout::Mirror => "mirror".into(),
            Layout::Raidz(g) => format!("raidz{}", g.parity()),
        }
    }
}
