//! Cached block reads: the path every object-layer read takes (ZFS's arc_read).
//!
//! # Theory of operation
//! A [`BlockCache`] is one pool instance's view of the process-wide ARC (`arc.rs`): the
//! block store plus the instance id that keys its entries. A read looks the block up in the
//! ARC, then in the L2ARC (`l2arc.rs`, when the pool has cache devices), and only then reads
//! the pool; what the pool returns is verified (by the block layer) before it is cached, and
//! what the L2ARC returns is verified against the block pointer's checksum before use, so
//! a cache never returns bytes the pointer does not vouch for.
//!
//! Reads come in two phases so a caller can keep many blocks in flight: [`submit`] answers
//! a hit at once or starts the device read, [`complete`] finishes it and caches the result.
//! Whether a block is cached follows the dataset's `primarycache` ([`CachePolicy`]): all
//! blocks, metadata (tree nodes) only, or none.
//!
//! [`submit`]: BlockCache::submit
//! [`complete`]: BlockCache::complete

use std::sync::Arc;

use tank_block::{BlockError, BlockPtr, BlockStore, Compression, PendingBlock};

use crate::arc::{AdaptiveCache, ArcKey, PrefetchCharge};
use crate::l2arc::L2Arc;

/// The `primarycache` property: what of a dataset's blocks the ARC keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CachePolicy {
    #[default]
    All,
    Metadata,
    None,
}

impl CachePolicy {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "all" => Self::All,
            "metadata" => Self::Metadata,
            "none" => Self::None,
            _ => return None,
        })
    }

    pub fn to_u8(self) -> u8 {
        self as u8
    }

    pub fn from_u8(v: u8) -> Self {
        match v {
            1 => Self::Metadata,
            2 => Self::None,
            _ => Self::All,
        }
    }

    /// Whether a block of this kind is kept.
    pub fn keeps(self, meta: bool) -> bool {
        match self {
            Self::All => true,
            Self::Metadata => meta,
            Self::None => false,
        }
    }
}

/// A block's logical bytes: its own buffer, or the ARC's when the block is stored
/// uncompressed (then nothing is copied).
#[derive(Debug)]
pub enum BlockData {
    Owned(Vec<u8>),
    Shared(Arc<Vec<u8>>),
}

impl std::ops::Deref for BlockData {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Self::Owned(v) => v,
            Self::Shared(v) => v,
        }
    }
}

impl BlockData {
    pub fn into_vec(self) -> Vec<u8> {
        match self {
            Self::Owned(v) => v,
            Self::Shared(v) => Arc::try_unwrap(v).unwrap_or_else(|v| v.as_ref().clone()),
        }
    }
}

/// A read started by [`BlockCache::submit`].
pub enum CachedRead {
    /// Answered by the ARC: the verified physical bytes.
    Hit(BlockPtr, Arc<Vec<u8>>),
    /// Answered by the L2ARC (verified): goes back into the ARC.
    L2Hit(BlockPtr, Arc<Vec<u8>>),
    /// In flight from the pool (holding a share of the prefetch budget when read ahead).
    Pending(PendingBlock, Option<PrefetchCharge>),
}

impl std::fmt::Debug for CachedRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Hit(bp, _) => write!(f, "Hit({})", bp.describe()),
            Self::L2Hit(bp, _) => write!(f, "L2Hit({})", bp.describe()),
            Self::Pending(p, _) => write!(f, "Pending({})", p.bp().describe()),
        }
    }
}

/// A block not read ahead because the reads ahead in flight hold the prefetch budget.
#[derive(Debug)]
pub struct OverBudget;

/// One pool instance's cached reads (see the module documentation).
#[derive(Debug)]
pub struct BlockCache {
    blocks: Arc<BlockStore>,
    arc: Arc<AdaptiveCache>,
    spa: u64,
    l2: Arc<L2Arc>,
}

impl BlockCache {
    pub fn new(blocks: Arc<BlockStore>, arc: Arc<AdaptiveCache>) -> Self {
        Self {
            blocks,
            arc,
            spa: crate::arc::next_spa_id(),
            l2: Arc::new(L2Arc::new()),
        }
    }

    pub fn blocks(&self) -> &Arc<BlockStore> {
        &self.blocks
    }

    pub fn arc(&self) -> &Arc<AdaptiveCache> {
        &self.arc
    }

    pub fn l2(&self) -> &Arc<L2Arc> {
        &self.l2
    }

    /// The instance id keying this pool's entries.
    pub fn spa(&self) -> u64 {
        self.spa
    }

    fn key(&self, bp: &BlockPtr) -> Option<ArcKey> {
        ArcKey::of(self.spa, bp)
    }

    /// The logical bytes of a cached physical buffer (shared when stored uncompressed).
    fn logical(bp: &BlockPtr, physical: Arc<Vec<u8>>) -> Result<BlockData, BlockError> {
        if bp.compression == Compression::Off && physical.len() == bp.lsize as usize {
            return Ok(BlockData::Shared(physical));
        }
        Ok(BlockData::Owned(
            bp.compression.decompress(&physical, bp.lsize as usize)?,
        ))
    }

    /// A demand read of a block's logical bytes.
    pub fn read(
        &self,
        bp: &BlockPtr,
        meta: bool,
        policy: CachePolicy,
    ) -> Result<BlockData, BlockError> {
        let r = self.submit(bp, meta);
        self.complete(r, meta, policy)
    }

    /// Starts a demand read: a hit is answered now; a miss starts the pool read.
    pub fn submit(&self, bp: &BlockPtr, meta: bool) -> CachedRead {
        if let Some(key) = self.key(bp) {
            if let Some(data) = self.arc.get(&key, meta) {
                return CachedRead::Hit(*bp, data);
            }
            if let Some(data) = self.l2.read(&key, bp) {
                return CachedRead::L2Hit(*bp, data);
            }
        }
        CachedRead::Pending(self.blocks.submit(bp), None)
    }

    /// Starts reading a block ahead of a sequential stream: `Ok(None)` when it is in the
    /// ARC already (or is no block on disk), `OverBudget` when the reads ahead in flight
    /// hold the prefetch budget.
    pub fn prefetch(&self, bp: &BlockPtr) -> Result<Option<CachedRead>, OverBudget> {
        let Some(key) = self.key(bp) else {
            return Ok(None);
        };
        if self.arc.contains(&key) {
            return Ok(None);
        }
        let charge = self
            .arc
            .prefetch_reserve(u64::from(bp.psize))
            .ok_or(OverBudget)?;
        self.arc.count_prefetch_issued();
        Ok(Some(CachedRead::Pending(
            self.blocks.submit(bp),
            Some(charge),
        )))
    }

    /// Finishes a read: the logical bytes, cached as `policy` says.
    pub fn complete(
        &self,
        r: CachedRead,
        meta: bool,
        policy: CachePolicy,
    ) -> Result<BlockData, BlockError> {
        match r {
            CachedRead::Hit(bp, data) => Self::logical(&bp, data),
            CachedRead::L2Hit(bp, data) => {
                if let Some(key) = self.key(&bp).filter(|_| policy.keeps(meta)) {
                    self.arc.insert_from_l2(key, data.clone(), meta);
                }
                Self::logical(&bp, data)
            }
            CachedRead::Pending(p, charge) => {
                let bp = *p.bp();
                let physical = self.blocks.complete_physical(p)?;
                if charge.is_some() {
                    // Read ahead and now used by a demand read.
                    self.arc.count_prefetch_hit(meta);
                }
                drop(charge);
                let key = self.key(&bp).filter(|_| policy.keeps(meta));
                let Some(key) = key else {
                    return Ok(BlockData::Owned(
                        bp.compression
                            .decompress_owned(physical, bp.lsize as usize)?,
                    ));
                };
                let physical = Arc::new(physical);
                self.arc.insert(key, physical.clone(), meta, false);
                Self::logical(&bp, physical)
            }
        }
    }

    /// Keeps a data block just written in the ARC, as ZFS keeps the buffers it writes: a
    /// read soon after the write (a file copied and then read back, a client that re-reads
    /// what it saved, a volume's 4 KiB write that reads the rest of its block) is a hit
    /// instead of a device read and a checksum. The ARC holds blocks as stored: a block
    /// stored uncompressed is kept as its logical bytes (`data`, shared), a compressed one as
    /// the compressed bytes the sync wrote (`stored`, `psize` long).
    pub fn keep_written(&self, bp: &BlockPtr, data: Arc<Vec<u8>>, stored: Option<Vec<u8>>) {
        let physical = if bp.compression == Compression::Off {
            if data.len() != bp.lsize as usize {
                return;
            }
            data
        } else {
            match stored {
                Some(mut c) if c.len() == bp.psize as usize => {
                    c.shrink_to_fit();
                    Arc::new(c)
                }
                _ => return,
            }
        };
        if let Some(key) = self.key(bp) {
            self.arc.insert(key, physical, false, false);
        }
    }

    /// Forgets a block being freed (its space will be reused under another birth txg).
    pub fn forget(&self, bp: &BlockPtr) {
        if let Some(key) = self.key(bp) {
            self.arc.remove(&key);
            self.l2.forget(&key);
        }
    }
}

impl Drop for BlockCache {
    fn drop(&mut self) {
        self.arc.remove_spa(self.spa);
    }
}
