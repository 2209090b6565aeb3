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

use std::sync::Arc;

use tank_object::ObjectSet;

use crate::dsl::{DatasetKind, Dsl, DslError};
use crate::errno::Errno;
use crate::posix::SyncMode;
use crate::props;

/// The object that holds a volume's bytes.
pub const VOLUME_OBJECT: u64 = 1;
const VOLUME_OBJECT_TYPE: u8 = 64;
/// Largest write under one transaction (keeps the dirty-data throttle effective).
const WRITE_CHUNK: usize = 4 << 20;

pub struct Volume {
    dsl: Arc<Dsl>,
    id: u64,
    objset: Arc<ObjectSet>,
    readonly: bool,
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
        })
    }

    pub fn size(&self) -> u64 {
        let id = match self.dsl.record(self.id) {
            Ok(r) if r.kind == DatasetKind::Snapshot => r.parent,
            _ => self.id,
        };
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
        self.check_range(offset, len)?;
        let mut out = match self.objset.stat(VOLUME_OBJECT) {
            Ok(_) => self.objset.read(VOLUME_OBJECT, offset, len)?,
            Err(_) => Vec::new(),
        };
        out.resize(len, 0);
        Ok(out)
    }

    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), Errno> {
        if self.readonly || self.dsl.prop(self.id, "readonly").ok().as_deref() == Some("on") {
            return Err(Errno::EROFS);
        }
        self.check_range(offset, data.len())?;
        for (i, chunk) in data.chunks(WRITE_CHUNK).enumerate() {
            self.dsl
                .check_space(self.id, chunk.len() as u64)
                .map_err(Errno)?;
            let tx = self.dsl.store().begin(chunk.len() as u64)?;
            self.objset
                .write(&tx, VOLUME_OBJECT, offset + (i * WRITE_CHUNK) as u64, chunk)?;
        }
        if self.sync_mode() == SyncMode::Always {
            self.dsl.store().log_commit(&self.objset)?;
        }
        Ok(())
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
