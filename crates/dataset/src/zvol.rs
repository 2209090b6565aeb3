//! Volumes (ZFS's zvol): a fixed-size array of bytes in one object of its own object set,
//! written in `volblocksize` blocks, for block front ends (iSCSI).
//!
//! # Theory of operation
//! A volume's object set holds object 1, created on first open with the volume's block
//! size; its byte size is the `volsize` property (reads past the object's written end but
//! inside the volume are zeros). Reads and writes must stay inside the volume (EINVAL
//! otherwise, as a block device gives for I/O past its end). `flush` makes everything
//! written durable, unless `sync=disabled`; with `sync=always` every write is durable when
//! it returns.
//!
//! `unmap` deallocates a range (whole blocks freed, partial ones zeroed; SCSI UNMAP), and
//! `block_status` tells mapped blocks from holes. `compare_and_write` (SCSI's ATS lock) takes
//! the volume's I/O lock exclusively, so no other write of the volume lands between its
//! compare and its write; reads and writes take it shared.

use std::sync::Arc;

use parking_lot::RwLock;

use tank_object::ObjectSet;

use crate::dsl::{DatasetKind, Dsl, DslError};
use crate::errno::Errno;
use crate::posix::SyncMode;
use crate::props;

/// The object that holds a volume's bytes.
pub const VOLUME_OBJECT: u64 = 1;
const VOLUME_OBJECT_TYPE: u8 = 64;
/// Blocks `block_status` looks at in one call.
const STATUS_LOOKAHEAD: u64 = 4096;
/// Largest write under one transaction (keeps the dirty-data throttle effective).
const WRITE_CHUNK: usize = 4 << 20;

pub struct Volume {
    dsl: Arc<Dsl>,
    id: u64,
    objset: Arc<ObjectSet>,
    readonly: bool,
    /// Taken shared by reads and writes, exclusively by a compare-and-write, so that no
    /// write lands between its compare and its write.
    io: RwLock<()>,
}

impl Volume {
    /// Opens a volume (or, read-only, a volume's snapshot).
    pub fn open(dsl: Arc<Dsl>, name: &str) -> Result<Volume, DslError> {
        let id = dsl.resolve(name)?;
        let rec = dsl.record(id)?;
        let (objset, readonly) = match rec.kind {
            DatasetKind::Volume => (dsl.objset(id)?, false),
            DatasetKind::Snapshot if dsl.record(rec.parent)?.kind == DatasetKind::Volume => {
                (dsl.snapshot_objset(id)?, true)
            }
            _ => {
                return Err(DslError::Invalid(format!("'{name}' is not a volume")));
            }
        };
        if !readonly && objset.stat(VOLUME_OBJECT).is_err() {
            let bs: u32 = dsl.prop(id, "volblocksize")?.parse().unwrap_or(16384);
            let tx = dsl.store().begin(0)?;
            let obj = objset.create_object(&tx, VOLUME_OBJECT_TYPE, bs)?;
            assert_eq!(obj, VOLUME_OBJECT, "a new volume's first object");
        }
        Ok(Volume {
            dsl,
            id,
            objset,
            readonly,
            io: RwLock::new(()),
        })
    }

    pub fn size(&self) -> u64 {
        let id = self.volume_id();
        self.dsl
            .prop(id, "volsize")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    pub fn block_size(&self) -> u32 {
        self.objset
            .stat(VOLUME_OBJECT)
            .map(|i| i.block_size)
            .unwrap_or(16384)
    }

    fn check_range(&self, offset: u64, len: usize) -> Result<(), Errno> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.size() => Ok(()),
            _ => Err(Errno::EINVAL),
        }
    }

    pub fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, Errno> {
        let _io = self.io.read();
        self.read_unlocked(offset, len)
    }

    fn read_unlocked(&self, offset: u64, len: usize) -> Result<Vec<u8>, Errno> {
        self.check_range(offset, len)?;
        let mut out = match self.objset.stat(VOLUME_OBJECT) {
            Ok(_) => self.objset.read(VOLUME_OBJECT, offset, len)?,
            Err(_) => Vec::new(),
        };
        out.resize(len, 0);
        Ok(out)
    }

    /// Writes `data` at `offset`; durable when it returns if `sync=always`.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), Errno> {
        let _io = self.io.read();
        self.write_locked(offset, data)?;
        if self.sync_mode() == SyncMode::Always {
            self.dsl.store().log_commit(&self.objset)?;
        }
        Ok(())
    }

    /// A write that is durable when it returns (SCSI's FUA, or any write when the
    /// initiator turned the write cache off), unless `sync=disabled`.
    pub fn write_durable(&self, offset: u64, data: &[u8]) -> Result<(), Errno> {
        self.write(offset, data)?;
        self.flush()
    }

    fn check_writable(&self) -> Result<(), Errno> {
        if self.is_readonly() {
            return Err(Errno::EROFS);
        }
        Ok(())
    }

    /// Read-only: a snapshot, or `readonly=on`.
    pub fn is_readonly(&self) -> bool {
        self.readonly || self.dsl.prop(self.id, "readonly").ok().as_deref() == Some("on")
    }

    /// Sparse (thin): no `refreservation` of the whole size, as `zfs create -s -V`.
    pub fn is_sparse(&self) -> bool {
        let id = self.volume_id();
        let resv: u64 = self
            .dsl
            .prop(id, "refreservation")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        resv < self.size()
    }

    fn volume_id(&self) -> u64 {
        match self.dsl.record(self.id) {
            Ok(r) if r.kind == DatasetKind::Snapshot => r.parent,
            _ => self.id,
        }
    }

    fn write_locked(&self, offset: u64, data: &[u8]) -> Result<(), Errno> {
        self.check_writable()?;
        self.check_range(offset, data.len())?;
        for (i, chunk) in data.chunks(WRITE_CHUNK).enumerate() {
            self.dsl
                .check_space(self.id, chunk.len() as u64)
                .map_err(Errno)?;
            let tx = self.dsl.store().begin(chunk.len() as u64)?;
            self.objset
                .write(&tx, VOLUME_OBJECT, offset + (i * WRITE_CHUNK) as u64, chunk)?;
        }
        Ok(())
    }

    /// Deallocates `len` bytes at `offset` (SCSI UNMAP, WRITE SAME with UNMAP): they read
    /// as zeros after, and the blocks wholly inside are freed (`used` goes down unless a
    /// snapshot holds them). Durable like a write.
    pub fn unmap(&self, offset: u64, len: u64) -> Result<(), Errno> {
        let _io = self.io.read();
        self.check_writable()?;
        self.check_range(offset, usize::try_from(len).map_err(|_| Errno::EINVAL)?)?;
        if self.objset.stat(VOLUME_OBJECT).is_err() || len == 0 {
            return Ok(());
        }
        // Bounded transactions, as writes are.
        let step = (WRITE_CHUNK as u64) * 16;
        let mut pos = offset;
        let end = offset + len;
        while pos < end {
            let n = step.min(end - pos);
            let tx = self.dsl.store().begin(0)?;
            self.objset.free_range(&tx, VOLUME_OBJECT, pos, n)?;
            pos += n;
        }
        if self.sync_mode() == SyncMode::Always {
            self.dsl.store().log_commit(&self.objset)?;
        }
        Ok(())
    }

    /// Atomically compares the bytes at `offset` with `expect` and, only if they are equal,
    /// writes `data` (of the same length) there (SCSI COMPARE AND WRITE, VMware's ATS
    /// lock). No other write of this volume runs in between. Returns the offset of the
    /// first byte that differed, if one did (nothing is written then).
    pub fn compare_and_write(
        &self,
        offset: u64,
        expect: &[u8],
        data: &[u8],
        durable: bool,
    ) -> Result<Option<usize>, Errno> {
        if expect.len() != data.len() {
            return Err(Errno::EINVAL);
        }
        {
            let _io = self.io.write();
            self.check_writable()?;
            let now = self.read_unlocked(offset, expect.len())?;
            if let Some(i) = now.iter().zip(expect).position(|(a, b)| a != b) {
                return Ok(Some(i));
            }
            self.write_locked(offset, data)?;
        }
        if durable || self.sync_mode() == SyncMode::Always {
            self.flush()?;
        }
        Ok(None)
    }

    /// Writes `data` with no other read or write of the volume in between (SCSI WRITE
    /// ATOMIC).
    pub fn write_atomic(&self, offset: u64, data: &[u8], durable: bool) -> Result<(), Errno> {
        {
            let _io = self.io.write();
            self.write_locked(offset, data)?;
        }
        if durable || self.sync_mode() == SyncMode::Always {
            self.flush()?;
        }
        Ok(())
    }

    /// ORs `data` into the bytes at `offset`, atomically (SCSI ORWRITE).
    pub fn or_write(&self, offset: u64, data: &[u8], durable: bool) -> Result<(), Errno> {
        {
            let _io = self.io.write();
            self.check_writable()?;
            let mut now = self.read_unlocked(offset, data.len())?;
            for (a, b) in now.iter_mut().zip(data) {
                *a |= b;
            }
            self.write_locked(offset, &now)?;
        }
        if durable || self.sync_mode() == SyncMode::Always {
            self.flush()?;
        }
        Ok(())
    }

    /// Whether the data at `offset` is mapped (written) or deallocated (a hole, reading as
    /// zeros), and for how many bytes from `offset` that stays so, looking at most `max`
    /// bytes ahead (SCSI GET LBA STATUS). Counted in volume blocks.
    pub fn block_status(&self, offset: u64, max: u64) -> Result<(bool, u64), Errno> {
        self.check_range(offset, 0)?;
        let bs = u64::from(self.block_size());
        let end = offset.saturating_add(max).min(self.size());
        if offset >= end {
            return Ok((false, 0));
        }
        let first = offset / bs;
        // At most STATUS_LOOKAHEAD blocks per call: a run longer than that is reported in
        // pieces rather than read whole from the tree.
        let count = ((end - 1) / bs - first + 1).min(STATUS_LOOKAHEAD);
        let mapped = match self.objset.stat(VOLUME_OBJECT) {
            Ok(_) => self.objset.mapped_blocks(VOLUME_OBJECT, first, count)?,
            Err(_) => Vec::new(),
        };
        let is_mapped = mapped.first() == Some(&first);
        // The run of blocks from `first` with the same status.
        let run = if is_mapped {
            mapped
                .iter()
                .enumerate()
                .take_while(|(i, b)| **b == first + *i as u64)
                .count() as u64
        } else {
            mapped.first().map_or(count, |b| b - first)
        };
        let run_end = ((first + run) * bs).min(end);
        debug_assert!(run_end > offset);
        Ok((is_mapped, run_end - offset))
    }
    fn sync_mode(&self) -> SyncMode {
        props::sync_of(&self.dsl.prop(self.id, "sync").unwrap_or_default())
    }

    /// Makes every write so far durable (SYNCHRONIZE CACHE).
    pub fn flush(&self) -> Result<(), Errno> {
        if self.readonly || self.sync_mode() == SyncMode::Disabled {
            return Ok(());
        }
        Ok(self.dsl.store().log_commit(&self.objset)?)
    }
}
