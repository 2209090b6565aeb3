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
//! # Concurrency
//! `read` may run on any thread. `write` and `free` take the allocator lock briefly.

use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use tank_vdev::{IoBatch, TopVdev};

use crate::alloc::{AllocClass, SpaceAllocator};
use crate::blkptr::{BlockKind, BlockPtr, Dva, MAX_DVAS};
use crate::checksum::ChecksumKind;
use crate::compress::Compression;
use crate::BlockError;

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

/// Counters of what reads had to do.
#[derive(Debug, Default, Clone, Copy)]
pub struct ReadStats {
    pub healed_copies: u64,
    pub healed_in_vdev: u64,
}

pub struct BlockStore {
    vdevs: RwLock<Vec<Option<Arc<TopVdev>>>>,
    pub alloc: Mutex<SpaceAllocator>,
    stats: Mutex<ReadStats>,
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
        }
    }

    pub fn vdev(&self, id: u32) -> Result<Arc<TopVdev>, BlockError> {
        self.vdevs
            .read()
            .get(id as usize)
            .and_then(|v| v.clone())
            .ok_or(BlockError::UnknownVdev(id))
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
        assert!(!data.is_empty(), "empty blocks are holes, not written");
        assert!(data.len() <= u32::MAX as usize);
        let compressed = props.compression.compress(data);
        let (compression, physical): (Compression, &[u8]) = match &compressed {
            Some(c) => (props.compression, c),
            None => (Compression::Off, data),
        };
        let checksum = props.checksum.compute(physical);
        let copies = usize::from(props.copies.clamp(1, MAX_DVAS as u8));
        let vdevs = self.vdevs();
        let asize_of = |id: u32| -> u64 {
            vdevs
                .iter()
                .find(|v| v.id == id)
                .map(|v| v.asize(physical.len() as u64))
                .unwrap_or(u64::MAX / 4)
        };
        let mut dvas = [Dva::default(); MAX_DVAS];
        {
            let mut alloc = self.alloc.lock();
            let mut used: Vec<u32> = Vec::new();
            for (i, slot) in dvas.iter_mut().enumerate().take(copies) {
                let result = alloc.alloc(&asize_of, &used, props.class, txg);
                match result {
                    Ok((vdev, offset, asize)) => {
                        *slot = Dva {
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
        }
        for dva in dvas.iter().filter(|d| !d.is_empty()) {
            let vdev = self.vdev(dva.vdev)?;
            let rounded = vdev.round(physical.len() as u64) as usize;
            let mut buf = physical.to_vec();
            buf.resize(rounded, 0);
            vdev.write(dva.offset, &buf, batch)?;
        }
        Ok(BlockPtr {
            dvas,
            kind: props.kind,
            level: props.level,
            checksum_kind: props.checksum,
            compression,
            lsize: data.len() as u32,
            psize: physical.len() as u32,
            birth_txg: txg,
            fill,
            checksum,
        })
    }

    /// True when every top-level vdev can still be read in full (after a write batch).
    pub fn check_writable(&self) -> Result<(), BlockError> {
        for v in self.vdevs() {
            if !v.readable() {
                return Err(BlockError::WriteFailed(v.id));
            }
        }
        Ok(())
    }

    /// Reads the physical bytes of a block, verified, healing bad copies.
    pub fn read_physical(&self, bp: &BlockPtr) -> Result<Vec<u8>, BlockError> {
        let psize = bp.psize as usize;
        let verify = |buf: &[u8]| {
            buf.len() >= psize && bp.checksum_kind.compute(&buf[..psize]) == bp.checksum
        };
        let mut failed: Vec<Dva> = Vec::new();
        let mut good: Option<(Vec<u8>, u64)> = None;
        for dva in bp.dvas() {
            let Ok(vdev) = self.vdev(dva.vdev) else {
                failed.push(*dva);
                continue;
            };
            let len = vdev.round(psize as u64);
            if dva.asize < vdev.asize(psize as u64) {
                failed.push(*dva);
                continue;
            }
            match vdev.read(dva.offset, len, &verify) {
                Ok((buf, report)) => {
                    if report.repaired > 0 {
                        self.stats.lock().healed_in_vdev += 1;
                    }
                    good = Some((buf, len));
                    break;
                }
                Err(_) => failed.push(*dva),
            }
        }
        let Some((buf, _)) = good else {
            return Err(BlockError::Checksum { bp: bp.describe() });
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
        let mut buf = buf;
        buf.truncate(psize);
        Ok(buf)
    }

    /// Reads a block and returns its logical bytes.
    pub fn read(&self, bp: &BlockPtr) -> Result<Vec<u8>, BlockError> {
        let physical = self.read_physical(bp)?;
        bp.compression.decompress(&physical, bp.lsize as usize)
    }

    /// Frees every copy of a block in `txg` (deferred, see `alloc.rs`).
    pub fn free(&self, bp: &BlockPtr, txg: u64) -> Result<(), BlockError> {
        let mut alloc = self.alloc.lock();
        for dva in bp.dvas() {
            alloc.free(dva.vdev, dva.offset, dva.asize, txg)?;
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
