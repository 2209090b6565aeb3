//! Object sets and objects (ZFS's dmu): files of bytes with copy-on-write block trees,
//! created, written, read, truncated and freed in transactions.
//!
//! # Theory of operation
//! An object set is one copy-on-write B+tree (`tree.rs`) keyed by (object, kind, offset):
//! - `(0, META, 0)`: the object set's header (next object id);
//! - `(obj, HEADER, 0)`: an object's header (type, block size, size in bytes, txgs);
//! - `(obj, DATA, blkid)`: block `blkid` of the object, a separately stored block (or, when it
//!   is at most `INLINE_MAX` bytes, inline in the tree leaf). A missing key is a hole: zeros.
//! - kinds from `FIRST_USER_KIND` up are for the layers above (directories, attributes).
//!
//! A block holds at most `block_size` bytes and is stored trimmed to the object's size, so a
//! small file costs a small block. All-zero blocks are not stored (holes), as ZFS does with
//! compression on.
//!
//! Changes go into the live tree under a pool transaction; at quiesce the tree is frozen
//! (`CowTree::snapshot`, O(1)) and the sync writes the frozen version while the next txg
//! changes the live one. Data blocks replaced in txg N are freed by the sync of txg N (the
//! allocator defers their reuse).
//!
//! # Concurrency
//! The live tree is behind a mutex; block reads happen outside it. One object set may be
//! written by many threads, each change under its own transaction.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use tank_block::{
    AllocClass, BlockKind, BlockPtr, BlockStore, ChecksumKind, Compression, WriteProps,
};
use tank_pool::{PoolError, Tx};
use tank_vdev::IoBatch;

use crate::cache::{BlockCache, BlockData, CachePolicy, CachedRead, OverBudget};
use crate::tree::{
    BlockRef, Change, CowTree, Key, NodeRef, NodeStore, TreeError, TreeSnapshot, Value, WriteKind,
};
use crate::ObjectError;

pub const KIND_META: u8 = 0;
pub const KIND_HEADER: u8 = 1;
pub const KIND_DATA: u8 = 2;
/// `(0, KIND_RECV, 0)`: where a receive into this object set has got to (`recv_progress`);
/// never part of a send stream.
pub const KIND_RECV: u8 = 3;
pub const FIRST_USER_KIND: u8 = 16;
/// Data blocks up to this size live inline in tree leaves.
pub const INLINE_MAX: usize = 1024;
pub const MIN_BLOCK_SIZE: u32 = 512;
/// 16 MiB, as ZFS with large_blocks: large records make large device requests for streams.
pub const MAX_BLOCK_SIZE: u32 = 16 << 20;
/// Tree nodes an object set keeps in memory before it evicts the clean ones (16 KiB each at
/// most, so about 256 MiB); metadata of files far larger than RAM stays bounded.
const NODE_CACHE_MAX: usize = 16384;
/// How far a sequential stream reads ahead of the caller (ZFS's zfetch_max_distance is
/// 8 MiB; larger here since our device queues are shallow), at least `PREFETCH_MIN_BLOCKS`.
const PREFETCH_BYTES: u64 = 16 << 20;
const PREFETCH_MIN_BLOCKS: u64 = 16;
/// Prefetched blocks an object set holds at most (when reached, the ones held are dropped:
/// those left behind by streams that stopped).
const PREFETCH_MAX: usize = 1024;
/// Streams an object set follows at once.
const PREFETCH_STREAMS: usize = 64;
/// How far from where a stream has got to a read may start and still continue it.
const STREAM_SLACK: u64 = 4 << 20;
/// Blocks one read call keeps in flight.
const READ_PARALLEL: usize = 32;
/// Items removed per tree operation batch while truncating.
const TRUNCATE_BATCH: usize = 4096;

/// How an object set may be changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjsetMode {
    /// By transactions in open context (a dataset).
    Normal,
    /// Only by the pool itself in syncing context (the meta object set).
    SyncOnly,
    /// Never (a snapshot).
    ReadOnly,
}

/// Space in dataset accounting units: `dsize` is allocated bytes deflated by parity
/// (`BlockStore::dsize`), `lsize` logical bytes before compression.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Space {
    pub dsize: u64,
    pub lsize: u64,
}

impl Space {
    pub fn of(blocks: &BlockStore, bp: &BlockPtr) -> Space {
        Space {
            dsize: blocks.dsize(bp),
            lsize: u64::from(bp.lsize),
        }
    }

    pub fn add(&mut self, other: Space) {
        self.dsize += other.dsize;
        self.lsize += other.lsize;
    }
}

/// What one sync did to an object set's space, for the dataset layer's accounting.
/// A block "killed" (replaced or removed) is freed when it was born after the latest
/// snapshot, kept on the deadlist when a snapshot still references it, and dropped (left
/// alone) when the origin snapshot of a clone owns it (ZFS's dsl_dataset_block_kill).
#[derive(Debug, Clone, Default)]
pub struct SyncReport {
    pub root: Option<BlockPtr>,
    pub born: Space,
    pub freed: Space,
    pub dead: Vec<BlockPtr>,
    pub dropped: Space,
}

/// Properties that decide how the blocks of an object set are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WritePolicy {
    pub checksum: ChecksumKind,
    pub compression: Compression,
    pub copies: u8,
}

impl Default for WritePolicy {
    fn default() -> Self {
        Self {
            checksum: ChecksumKind::Blake3,
            compression: Compression::Lz4,
            copies: 1,
        }
    }
}

impl WritePolicy {
    fn tag(&self) -> u32 {
        u32::from(self.compression.to_u8())
            | (u32::from(self.checksum as u8) << 8)
            | (u32::from(self.copies) << 16)
    }

    /// How a data block written under the policy of `tag` is stored.
    pub(crate) fn data_props(tag: u32) -> WriteProps {
        let p = Self::from_tag(tag);
        WriteProps {
            kind: BlockKind::Data,
            level: 0,
            checksum: p.checksum,
            compression: p.compression,
            copies: p.copies,
            class: AllocClass::Data,
        }
    }

    fn from_tag(tag: u32) -> Self {
        Self {
            compression: Compression::from_u8(tag as u8).unwrap_or(Compression::Lz4),
            checksum: ChecksumKind::from_u8((tag >> 8) as u8).unwrap_or(ChecksumKind::Blake3),
            copies: ((tag >> 16) as u8).clamp(1, 3),
        }
    }
}

/// An object's header as stored at `(obj, HEADER, 0)` (40 bytes, LE): type u8, flags u8,
/// 2 zero bytes, block_size u32, size u64, created_txg u64, modified_txg u64, data_bytes u64
/// (meaningful when flag `HEADER_DATA_BYTES` is set; zero otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ObjectInfo {
    pub id: u64,
    pub obj_type: u8,
    pub block_size: u32,
    pub size: u64,
    pub created_txg: u64,
    pub modified_txg: u64,
    /// Bytes the object's data blocks hold, before compression: each block counts its
    /// length trimmed of trailing zeros and rounded up to 512; holes count nothing. `None`
    /// for an object whose header predates the count (it is not known without a walk).
    pub data_bytes: Option<u64>,
}

/// Header flag: `data_bytes` is kept.
const HEADER_DATA_BYTES: u8 = 1;

impl ObjectInfo {
    fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; 40];
        b[0] = self.obj_type;
        b[4..8].copy_from_slice(&self.block_size.to_le_bytes());
        b[8..16].copy_from_slice(&self.size.to_le_bytes());
        b[16..24].copy_from_slice(&self.created_txg.to_le_bytes());
        b[24..32].copy_from_slice(&self.modified_txg.to_le_bytes());
        if let Some(n) = self.data_bytes {
            b[1] = HEADER_DATA_BYTES;
            b[32..40].copy_from_slice(&n.to_le_bytes());
        }
        b
    }

    pub(crate) fn decode(id: u64, b: &[u8]) -> Result<Self, ObjectError> {
        if b.len() < 40 {
            return Err(ObjectError::Corrupt(format!("object {id}: short header")));
        }
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8"));
        let block_size = u32::from_le_bytes(b[4..8].try_into().expect("4"));
        if !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&block_size) || !block_size.is_power_of_two()
        {
            return Err(ObjectError::Corrupt(format!(
                "object {id}: invalid block size {block_size}"
            )));
        }
        Ok(Self {
            id,
            obj_type: b[0],
            block_size,
            size: u64_at(8),
            created_txg: u64_at(16),
            modified_txg: u64_at(24),
            data_bytes: (b[1] & HEADER_DATA_BYTES != 0).then(|| u64_at(32)),
        })
    }

    /// Adds a change of the data blocks' bytes (from `put_block` or a removal).
    fn count_data(&mut self, delta: i64) {
        if let Some(n) = self.data_bytes.as_mut() {
            *n = n.saturating_add_signed(delta);
        }
    }
}

fn key(obj: u64, kind: u8, offset: u64) -> Key {
    Key { obj, kind, offset }
}

fn read_node(cache: &BlockCache, bp: &BlockPtr, policy: CachePolicy) -> Result<Vec<u8>, TreeError> {
    cache
        .read(bp, true, policy)
        .map(BlockData::into_vec)
        .map_err(|e| TreeError::Store(e.to_string()))
}

/// Reads blocks for the live tree (writes happen only in a sync), through the ARC as the
/// object set's `primarycache` says.
pub(crate) struct ReadStore<'a> {
    pub cache: &'a BlockCache,
    pub policy: CachePolicy,
}

impl NodeStore for ReadStore<'_> {
    fn read_block(&self, bp: &BlockPtr) -> Result<Vec<u8>, TreeError> {
        read_node(self.cache, bp, self.policy)
    }
    fn write_block(&self, _data: &[u8], _kind: WriteKind) -> Result<BlockPtr, TreeError> {
        Err(TreeError::Store("write outside of a sync".into()))
    }
    fn free_block(&self, _bp: &BlockPtr) -> Result<(), TreeError> {
        Err(TreeError::Store("free outside of a sync".into()))
    }
}

/// The store a sync writes through: the txg, its batch, the node write policy, where killed
/// blocks go (see `SyncReport`) and what the sync did to the object set's space.
struct SyncStore<'a> {
    blocks: &'a BlockStore,
    cache: &'a BlockCache,
    cache_policy: CachePolicy,
    txg: u64,
    batch: &'a Arc<IoBatch>,
    node_policy: WritePolicy,
    prev_snap_txg: u64,
    origin_txg: u64,
    report: Mutex<SyncReport>,
}

impl SyncStore<'_> {
    /// Writes a block, from the caller's shared bytes where it gives them; with them, the
    /// compressed bytes come back when the block was stored compressed.
    fn write_either(
        &self,
        data: &[u8],
        shared: Option<&Arc<Vec<u8>>>,
        kind: WriteKind,
    ) -> Result<(BlockPtr, Option<Vec<u8>>), TreeError> {
        let props = match kind {
            WriteKind::Node { level } => WriteProps {
                kind: BlockKind::TreeNode,
                level,
                checksum: self.node_policy.checksum,
                compression: Compression::Lz4,
                // Metadata is kept in one more copy than data (ditto blocks).
                copies: (self.node_policy.copies + 1).min(3),
                class: AllocClass::Metadata,
            },
            WriteKind::Data { tag } => WritePolicy::data_props(tag),
        };
        let written = match shared {
            Some(bytes) => self
                .blocks
                .write_shared(bytes, &props, self.txg, 1, self.batch),
            None => self
                .blocks
                .write(data, &props, self.txg, 1, self.batch)
                .map(|bp| (bp, None)),
        };
        let (bp, stored) = written.map_err(|e| TreeError::Store(e.to_string()))?;
        self.report.lock().born.add(Space::of(self.blocks, &bp));
        Ok((bp, stored))
    }

    fn kill(&self, bp: &BlockPtr) -> Result<(), PoolError> {
        let space = Space::of(self.blocks, bp);
        let mut report = self.report.lock();
        if bp.birth_txg > self.prev_snap_txg {
            self.blocks.free(bp, self.txg)?;
            self.cache.forget(bp);
            report.freed.add(space);
        } else if bp.birth_txg > self.origin_txg {
            report.dead.push(*bp);
        } else {
            report.dropped.add(space);
        }
        Ok(())
    }
}

impl NodeStore for SyncStore<'_> {
    fn read_block(&self, bp: &BlockPtr) -> Result<Vec<u8>, TreeError> {
        read_node(self.cache, bp, self.cache_policy)
    }
    fn write_block(&self, data: &[u8], kind: WriteKind) -> Result<BlockPtr, TreeError> {
        self.write_either(data, None, kind).map(|(bp, _)| bp)
    }
    fn write_block_shared(
        &self,
        data: &Arc<Vec<u8>>,
        kind: WriteKind,
    ) -> Result<(BlockPtr, Option<Vec<u8>>), TreeError> {
        self.write_either(data, Some(data), kind)
    }
    fn free_block(&self, bp: &BlockPtr) -> Result<(), TreeError> {
        self.kill(bp).map_err(|e| TreeError::Store(e.to_string()))
    }
    fn prewritten(&self, bp: &BlockPtr) {
        self.report.lock().born.add(Space::of(self.blocks, bp));
    }
}

/// What replacing a tree item let go of.
struct Retired {
    /// The old value's logical length.
    len: u64,
    /// Bytes of an unwritten block of the open txg that left memory with it.
    released: u64,
}

/// A data block put into the tree.
struct PutBlock {
    value: Option<Value>,
    /// Change of the object's logical data bytes.
    delta: i64,
    /// Change of the dirty bytes held in memory.
    held: i64,
}

struct Frozen {
    txg: u64,
    snapshot: TreeSnapshot,
    obsolete: Vec<Arc<NodeRef>>,
    frees: Vec<Arc<BlockRef>>,
    created: Vec<Arc<BlockRef>>,
}

/// One object set. See the module documentation.
/// Where an object set reports an object it found damaged beyond repair: (objset, object).
pub type ErrorSink = Arc<dyn Fn(u64, u64) + Send + Sync>;

pub struct ObjectSet {
    pub id: u64,
    cache: Arc<BlockCache>,
    /// The `primarycache` property (`CachePolicy` as u8).
    primarycache: AtomicU8,
    /// Told of every read that failed for want of a good copy (the pool's error log).
    error_sink: std::sync::OnceLock<ErrorSink>,
    tree: Mutex<CowTree>,
    /// Data blocks replaced or removed in the open txg that an earlier sync wrote, the txg
    /// now syncing will write, or the intent log wrote: the open txg's sync frees them.
    open_frees: Mutex<Vec<Arc<BlockRef>>>,
    /// Data blocks the open txg created and then replaced or removed before anything wrote
    /// them: nothing to free, and their bytes leave memory at once, unless the intent log
    /// still holds one (a large write's record) and writes it before the sync.
    open_dropped: Mutex<Vec<Weak<BlockRef>>>,
    /// Data blocks created in the open txg, one per key: the latest version (their bytes are
    /// released after their sync).
    open_created: Mutex<HashMap<Key, Arc<BlockRef>>>,
    /// Blocks written by the last sync, released once its writes completed.
    written: Mutex<Vec<Arc<BlockRef>>>,
    frozen: Mutex<Option<Frozen>>,
    root: Mutex<Option<BlockPtr>>,
    policy: Mutex<WritePolicy>,
    dirty: AtomicBool,
    /// Serializes whole-object operations (writes, truncates) against each other.
    write_lock: Mutex<()>,
    prefetch: Mutex<Prefetch>,
    mode: ObjsetMode,
    /// Blocks born at or before this txg are still referenced by a snapshot.
    prev_snap_txg: AtomicU64,
    /// Blocks born at or before this txg belong to the origin snapshot (clones).
    origin_txg: AtomicU64,
    /// Bytes of data written in open context since the last quiesce, and those of the txg
    /// being synced (for quota checks, until the sync's report is accounted).
    dirty_bytes: AtomicU64,
    syncing_bytes: AtomicU64,
    /// Changes not yet in a committed txg, for the intent log (`zil.rs`).
    log: Mutex<ObjsetLog>,
    /// Replaying the intent log: its changes are not logged again.
    replaying: AtomicBool,
}

/// The changes of an object set not yet known committed, in the order they were made
/// (every change is logged while the locks that order it against conflicting changes are
/// held). `durable`: changes with a lower sequence number are on stable storage.
#[derive(Default)]
struct ObjsetLog {
    records: std::collections::VecDeque<crate::zil::Itx>,
    next: u64,
    durable: u64,
}

/// A sequential stream of reads of one object.
#[derive(Clone, Copy)]
struct Stream {
    /// Where its reads have got to (a byte offset).
    reached: u64,
    /// The first block not yet looked at for read-ahead: each read looks at the blocks its
    /// window newly covers only, as zfetch issues from its stream's prefetch end.
    ahead_from: u64,
}

/// Sequential streams being read and the blocks read ahead for them.
#[derive(Default)]
struct Prefetch {
    /// Object → its stream.
    streams: HashMap<u64, Stream>,
    /// (object, block id) → the pointer it was read for and the read in flight.
    blocks: HashMap<(u64, u64), (BlockPtr, CachedRead)>,
}

impl std::fmt::Debug for ObjectSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectSet").field("id", &self.id).finish()
    }
}

impl ObjectSet {
    pub(crate) fn open(
        id: u64,
        cache: Arc<BlockCache>,
        root: Option<BlockPtr>,
        mode: ObjsetMode,
    ) -> Self {
        Self {
            id,
            cache,
            primarycache: AtomicU8::new(CachePolicy::All.to_u8()),
            error_sink: std::sync::OnceLock::new(),
            tree: Mutex::new(CowTree::open(root)),
            open_frees: Mutex::new(Vec::new()),
            open_dropped: Mutex::new(Vec::new()),
            open_created: Mutex::new(HashMap::new()),
            written: Mutex::new(Vec::new()),
            frozen: Mutex::new(None),
            root: Mutex::new(root),
            policy: Mutex::new(WritePolicy::default()),
            dirty: AtomicBool::new(false),
            write_lock: Mutex::new(()),
            prefetch: Mutex::new(Prefetch::default()),
            mode,
            prev_snap_txg: AtomicU64::new(0),
            origin_txg: AtomicU64::new(0),
            dirty_bytes: AtomicU64::new(0),
            syncing_bytes: AtomicU64::new(0),
            log: Mutex::new(ObjsetLog::default()),
            replaying: AtomicBool::new(false),
        }
    }

    // ---- the intent log's records ----

    /// Records a change made in txg `txg` (object sets changed in open context only).
    fn log(&self, txg: u64, op: crate::zil::LogOp) {
        if self.mode != ObjsetMode::Normal || self.replaying.load(Ordering::Acquire) {
            return;
        }
        let mut l = self.log.lock();
        let seq = l.next;
        l.next += 1;
        l.records.push_back(crate::zil::Itx { seq, txg, op });
    }

    /// The sequence number the next change will get.
    pub(crate) fn log_end(&self) -> u64 {
        self.log.lock().next
    }

    /// Changes with sequence numbers in `[durable, end)` of txgs after `synced`.
    pub(crate) fn log_pending(&self, end: u64, synced: u64) -> Vec<crate::zil::Itx> {
        let l = self.log.lock();
        l.records
            .iter()
            .filter(|r| r.seq >= l.durable && r.seq < end && r.txg > synced)
            .cloned()
            .collect()
    }

    /// Changes before `end` are on stable storage.
    pub(crate) fn log_durable_to(&self, end: u64) {
        let mut l = self.log.lock();
        l.durable = l.durable.max(end);
    }

    pub(crate) fn log_durable(&self) -> u64 {
        self.log.lock().durable
    }

    /// Replay of a `Set` record: the tree item set to `value`, or removed.
    pub(crate) fn replay_set(&self, k: Key, value: Option<Value>) -> Result<(), ObjectError> {
        let _w = self.write_lock.lock();
        match value {
            None => self.tree_remove(&k).map(drop),
            Some(Value::Block(r)) => {
                if let Some(bp) = r.bp() {
                    self.dirty_bytes
                        .fetch_add(u64::from(bp.lsize), Ordering::AcqRel);
                }
                self.insert_created(k, r).map(drop)
            }
            Some(v) => self.tree_insert(k, v).map(drop),
        }
    }

    pub(crate) fn set_replaying(&self, on: bool) {
        self.replaying.store(on, Ordering::Release);
    }

    /// Changes recorded and not yet committed (for tests and `zil` statistics).
    pub fn log_records(&self) -> usize {
        self.log.lock().records.len()
    }

    pub fn mode(&self) -> ObjsetMode {
        self.mode
    }

    /// Where blocks killed from now on go (see `SyncReport`): kept for snapshots when born at
    /// or before `prev_snap_txg`, left to the origin when born at or before `origin_txg`.
    /// Err (nothing set) when the origin is after the latest snapshot: dataset records that
    /// say so are damaged.
    pub fn set_snapshot_txgs(
        &self,
        prev_snap_txg: u64,
        origin_txg: u64,
    ) -> Result<(), ObjectError> {
        if origin_txg > prev_snap_txg {
            return Err(ObjectError::Corrupt(format!(
                "object set {}: origin txg {origin_txg} after its latest snapshot's txg {prev_snap_txg}",
                self.id
            )));
        }
        self.prev_snap_txg.store(prev_snap_txg, Ordering::Release);
        self.origin_txg.store(origin_txg, Ordering::Release);
        Ok(())
    }

    pub fn prev_snap_txg(&self) -> u64 {
        self.prev_snap_txg.load(Ordering::Acquire)
    }

    /// Data bytes written that no sync report has accounted for yet.
    pub fn dirty_bytes(&self) -> u64 {
        self.dirty_bytes.load(Ordering::Acquire) + self.syncing_bytes.load(Ordering::Acquire)
    }

    /// Refuses changes in open context to the meta object set and to snapshots.
    fn open_context(&self) -> Result<(), ObjectError> {
        match self.mode {
            ObjsetMode::Normal => Ok(()),
            ObjsetMode::SyncOnly => Err(ObjectError::Invalid(format!(
                "object set {} is changed only by the pool itself",
                self.id
            ))),
            ObjsetMode::ReadOnly => Err(ObjectError::ReadOnly),
        }
    }

    fn syncing_context(&self) {
        assert_eq!(
            self.mode,
            ObjsetMode::SyncOnly,
            "syncing-context change to object set {}",
            self.id
        );
    }

    /// Sets an item of the meta object set (syncing context only).
    pub fn put_item_syncing(
        &self,
        obj: u64,
        kind: u8,
        offset: u64,
        value: &[u8],
    ) -> Result<(), ObjectError> {
        self.syncing_context();
        Self::check_item(kind, value)?;
        self.tree_insert(key(obj, kind, offset), Self::inline(value))
            .map(drop)
    }

    /// Removes an item of the meta object set (syncing context only).
    pub fn remove_item_syncing(&self, obj: u64, kind: u8, offset: u64) -> Result<(), ObjectError> {
        self.syncing_context();
        self.tree_remove(&key(obj, kind, offset)).map(drop)
    }

    fn check_item(kind: u8, value: &[u8]) -> Result<(), ObjectError> {
        if kind < FIRST_USER_KIND {
            return Err(ObjectError::Invalid(format!(
                "item kind {kind} is reserved"
            )));
        }
        if value.len() > crate::tree::MAX_INLINE {
            return Err(ObjectError::Invalid(format!(
                "item of {} bytes is too large",
                value.len()
            )));
        }
        Ok(())
    }

    pub fn set_policy(&self, policy: WritePolicy) {
        *self.policy.lock() = policy;
    }

    pub fn policy(&self) -> WritePolicy {
        *self.policy.lock()
    }

    /// Sets what of this object set's blocks the ARC keeps (`primarycache`).
    pub fn set_primarycache(&self, policy: CachePolicy) {
        self.primarycache.store(policy.to_u8(), Ordering::Release);
    }

    pub fn primarycache(&self) -> CachePolicy {
        CachePolicy::from_u8(self.primarycache.load(Ordering::Acquire))
    }

    /// The committed root of the tree (as of the last sync).
    pub fn root(&self) -> Option<BlockPtr> {
        *self.root.lock()
    }

    fn store(&self) -> ReadStore<'_> {
        ReadStore {
            cache: &self.cache,
            policy: self.primarycache(),
        }
    }

    fn tree_get(&self, k: &Key) -> Result<Option<Value>, ObjectError> {
        Ok(self.tree.lock().get(&self.store(), k)?)
    }

    /// Inserts or replaces; returns the logical length of the value replaced (0 if none).
    fn tree_insert(&self, k: Key, v: Value) -> Result<u64, ObjectError> {
        Ok(self.tree_replace(k, v)?.len)
    }

    fn tree_replace(&self, k: Key, v: Value) -> Result<Retired, ObjectError> {
        let old = self.tree.lock().insert(&self.store(), k, v)?;
        self.dirty.store(true, Ordering::Release);
        Ok(self.retire(&k, old))
    }

    /// Puts a data block the open txg created at `k`, and records it as the open txg's
    /// version of `k` (after the old value is retired, which looks the old version up).
    fn insert_created(&self, k: Key, r: Arc<BlockRef>) -> Result<Retired, ObjectError> {
        let old = self.tree_replace(k, Value::Block(r.clone()))?;
        self.open_created.lock().insert(k, r);
        Ok(old)
    }

    /// Removes; returns the logical length of the value removed (0 if none).
    fn tree_remove(&self, k: &Key) -> Result<u64, ObjectError> {
        let old = self.tree.lock().remove(&self.store(), k)?;
        self.dirty.store(true, Ordering::Release);
        Ok(self.retire(k, old).len)
    }

    /// A replaced data block is freed by the sync of the open txg (if it was ever written).
    ///
    /// A block no snapshot holds leaves the ARC now rather than at that sync, as ZFS releases
    /// a dirtied buffer from the ARC: nothing reads it through the live tree again, and
    /// overwrites would otherwise hold the old and the new version of every block they
    /// touch until the sync (a volume's random writes: the volume twice over). A reader that
    /// found the old pointer before the change still reads it, from the devices.
    ///
    /// A block the open txg itself created and nothing wrote is dropped at once, as ZFS
    /// frees a dirty record it overwrites in the same txg: repeated writes into one block
    /// (a volume's 4 KiB writes into its 16 KiB blocks, small appends) hold one version of
    /// it, not one per write.
    fn retire(&self, k: &Key, old: Option<Value>) -> Retired {
        let len = old.as_ref().map_or(0, Value::logical_len);
        let mut released = 0;
        if let Some(Value::Block(r)) = old {
            let mine = {
                let mut created = self.open_created.lock();
                let mine = created.get(k).is_some_and(|c| Arc::ptr_eq(c, &r));
                if mine {
                    created.remove(k);
                }
                mine
            };
            match r.bp() {
                Some(bp) => {
                    if bp.birth_txg > self.prev_snap_txg() {
                        self.cache.forget(&bp);
                    }
                    self.open_frees.lock().push(r);
                }
                None if mine => {
                    released = r.dirty_data().map_or(0, |d| d.len() as u64);
                    self.open_dropped.lock().push(Arc::downgrade(&r));
                }
                // Created by the txg now syncing, which writes it: this txg frees it.
                None => self.open_frees.lock().push(r),
            }
        }
        Retired { len, released }
    }

    /// Replaced blocks the open txg's sync must look at: those known written, and those
    /// dropped unwritten that something (the intent log) still holds and may have written.
    fn open_frees(&self) -> Vec<Arc<BlockRef>> {
        let mut frees = std::mem::take(&mut *self.open_frees.lock());
        frees.extend(
            std::mem::take(&mut *self.open_dropped.lock())
                .iter()
                .filter_map(Weak::upgrade),
        );
        frees
    }

    fn inline(bytes: &[u8]) -> Value {
        Value::Inline(Arc::from(bytes))
    }

    // ---- generic items, for the layers above ----

    pub fn get_item(
        &self,
        obj: u64,
        kind: u8,
        offset: u64,
    ) -> Result<Option<Vec<u8>>, ObjectError> {
        match self.tree_get(&key(obj, kind, offset))? {
            None => Ok(None),
            Some(v) => Ok(Some(self.value_bytes(&v, kind != KIND_DATA)?.into_vec())),
        }
    }

    pub fn put_item(
        &self,
        tx: &Tx<'_>,
        obj: u64,
        kind: u8,
        offset: u64,
        value: &[u8],
    ) -> Result<(), ObjectError> {
        self.open_context()?;
        Self::check_item(kind, value)?;
        let k = key(obj, kind, offset);
        let v = Self::inline(value);
        self.tree_insert(k, v.clone())?;
        self.log(
            tx.txg,
            crate::zil::LogOp::Set {
                key: k,
                value: Some(v),
            },
        );
        Ok(())
    }

    pub fn remove_item(
        &self,
        tx: &Tx<'_>,
        obj: u64,
        kind: u8,
        offset: u64,
    ) -> Result<(), ObjectError> {
        self.open_context()?;
        let k = key(obj, kind, offset);
        self.tree_remove(&k)?;
        self.log(
            tx.txg,
            crate::zil::LogOp::Set {
                key: k,
                value: None,
            },
        );
        Ok(())
    }

    /// Items of one object and kind with offsets in `[start, end)`, at most `limit`.
    pub fn items(
        &self,
        obj: u64,
        kind: u8,
        start: u64,
        end: u64,
        limit: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>, ObjectError> {
        let items = self.tree.lock().range(
            &self.store(),
            &key(obj, kind, start),
            &key(obj, kind, end),
            limit,
        )?;
        items
            .into_iter()
            .map(|(k, v)| Ok((k.offset, self.value_bytes(&v, true)?.into_vec())))
            .collect()
    }

    /// The bytes of a value; `meta` says whether a stored block counts as metadata for the
    /// ARC (everything but file data does).
    fn value_bytes(&self, v: &Value, meta: bool) -> Result<BlockData, ObjectError> {
        match v {
            Value::Inline(b) => Ok(BlockData::Owned(b.to_vec())),
            Value::Block(r) => {
                if let Some(d) = r.dirty_data() {
                    return Ok(BlockData::Shared(d));
                }
                let bp = r
                    .bp()
                    .ok_or_else(|| ObjectError::Corrupt("block reference without data".into()))?;
                Ok(self.cache.read(&bp, meta, self.primarycache())?)
            }
        }
    }

    // ---- objects ----

    fn next_object(&self) -> Result<u64, ObjectError> {
        Ok(match self.tree_get(&key(0, KIND_META, 0))? {
            Some(Value::Inline(b)) if b.len() >= 8 => {
                u64::from_le_bytes(b[..8].try_into().expect("8"))
            }
            Some(_) => return Err(ObjectError::Corrupt("object set header".into())),
            None => 1,
        })
    }

    /// Creates an object with the given block size (a power of two, 512 B to 16 MiB).
    pub fn create_object(
        &self,
        tx: &Tx<'_>,
        obj_type: u8,
        block_size: u32,
    ) -> Result<u64, ObjectError> {
        if !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&block_size) || !block_size.is_power_of_two()
        {
            return Err(ObjectError::Invalid(format!(
                "block size {block_size} is not a power of two from 512 B to 16 MiB"
            )));
        }
        self.open_context()?;
        let _w = self.write_lock.lock();
        let id = self.next_object()?;
        self.tree_insert(key(0, KIND_META, 0), Self::inline(&(id + 1).to_le_bytes()))?;
        let info = ObjectInfo {
            id,
            obj_type,
            block_size,
            size: 0,
            created_txg: tx.txg,
            modified_txg: tx.txg,
            data_bytes: Some(0),
        };
        self.tree_insert(key(id, KIND_HEADER, 0), Self::inline(&info.encode()))?;
        self.log(
            tx.txg,
            crate::zil::LogOp::Create {
                obj: id,
                obj_type,
                block_size,
            },
        );
        Ok(id)
    }

    pub fn stat(&self, obj: u64) -> Result<ObjectInfo, ObjectError> {
        match self.tree_get(&key(obj, KIND_HEADER, 0))? {
            Some(Value::Inline(b)) => ObjectInfo::decode(obj, &b),
            Some(_) => Err(ObjectError::Corrupt(format!(
                "object {obj}: header is not inline"
            ))),
            None => Err(ObjectError::NoSuchObject(obj)),
        }
    }

    fn put_info(&self, info: &ObjectInfo) -> Result<(), ObjectError> {
        self.tree_insert(key(info.id, KIND_HEADER, 0), Self::inline(&info.encode()))
            .map(drop)
    }

    /// Object ids in use, in order, starting at `from`, at most `limit`.
    pub fn list_objects(&self, from: u64, limit: usize) -> Result<Vec<u64>, ObjectError> {
        let mut out = Vec::new();
        let mut cursor = from.max(1);
        let tree = self.tree.lock();
        while out.len() < limit {
            // Find the next header at or after the cursor.
            let items = tree.range(
                &self.store(),
                &key(cursor, KIND_HEADER, 0),
                &key(u64::MAX, 0, 0),
                1,
            )?;
            let Some((k, _)) = items.into_iter().next() else {
                break;
            };
            if k.kind == KIND_HEADER && k.offset == 0 {
                out.push(k.obj);
            }
            if k.obj == u64::MAX {
                break;
            }
            cursor = k.obj + 1;
        }
        Ok(out)
    }

    /// The bytes of block `blkid` (trimmed; may be shorter than the block size), or None for a hole.
    fn read_block(&self, obj: u64, blkid: u64) -> Result<Option<Vec<u8>>, ObjectError> {
        match self.tree_get(&key(obj, KIND_DATA, blkid))? {
            None => Ok(None),
            Some(v) => Ok(Some(self.value_bytes(&v, false)?.into_vec())),
        }
    }

    /// Stores block `blkid` with `data` (already trimmed to the object size; a hole when all
    /// zeros); returns what the tree now holds there, the change of the object's
    /// `data_bytes` and the change of the dirty bytes held in memory.
    fn put_block(&self, obj: u64, blkid: u64, mut data: Vec<u8>) -> Result<PutBlock, ObjectError> {
        let k = key(obj, KIND_DATA, blkid);
        while data.last() == Some(&0) {
            data.pop();
        }
        if data.is_empty() {
            let old = self.tree_remove(&k)?;
            return Ok(PutBlock {
                value: None,
                delta: -(old as i64),
                held: 0,
            });
        }
        // Pad to a whole 512-byte unit so compression and sector rounding see the same size.
        let padded = data.len().div_ceil(512) * 512;
        data.resize(padded, 0);
        if data.len() <= INLINE_MAX {
            let v = Self::inline(&data);
            let old = self.tree_replace(k, v.clone())?;
            return Ok(PutBlock {
                value: Some(v),
                delta: padded as i64 - old.len as i64,
                held: -(old.released as i64),
            });
        }
        let r = BlockRef::new_dirty(Arc::new(data), self.policy().tag());
        let v = Value::Block(r.clone());
        let old = self.insert_created(k, r)?;
        Ok(PutBlock {
            value: Some(v),
            delta: padded as i64 - old.len as i64,
            held: padded as i64 - old.released as i64,
        })
    }

    /// Sets where reads report objects damaged beyond repair (once).
    pub fn set_error_sink(&self, sink: ErrorSink) {
        let _ = self.error_sink.set(sink);
    }

    /// Reads up to `len` bytes at `offset`; short at the end of the object. The blocks of a
    /// large read are kept in flight together (up to `READ_PARALLEL`), so every device works
    /// while a single caller streams.
    pub fn read(&self, obj: u64, offset: u64, len: usize) -> Result<Vec<u8>, ObjectError> {
        self.read_as(obj, offset, len, false)
    }

    /// A direct read (the `direct` property): blocks already in the ARC are used, but a
    /// data block the read covers whole is not kept there, whatever `primarycache` says.
    /// A block it reads only part of is kept as usual: the rest of it is likely read next,
    /// and every read of a part reads and verifies the whole block.
    pub fn read_direct(&self, obj: u64, offset: u64, len: usize) -> Result<Vec<u8>, ObjectError> {
        self.read_as(obj, offset, len, true)
    }

    fn read_as(
        &self,
        obj: u64,
        offset: u64,
        len: usize,
        direct: bool,
    ) -> Result<Vec<u8>, ObjectError> {
        let r = self.read_inner(obj, offset, len, direct);
        if let Err(ObjectError::Block(tank_block::BlockError::Checksum { .. })) = &r {
            if let Some(sink) = self.error_sink.get() {
                sink(self.id, obj);
            }
        }
        r
    }

    fn read_inner(
        &self,
        obj: u64,
        offset: u64,
        len: usize,
        direct: bool,
    ) -> Result<Vec<u8>, ObjectError> {
        let info = self.stat(obj)?;
        if offset >= info.size || len == 0 {
            return Ok(Vec::new());
        }
        let end = info.size.min(offset + len as u64);
        let bs = u64::from(info.block_size);
        let first = offset / bs;
        let last = (end - 1) / bs;
        let items = self.tree.lock().range(
            &self.store(),
            &key(obj, KIND_DATA, first),
            &key(obj, KIND_DATA, last + 1),
            (last - first + 1) as usize,
        )?;
        let mut blocks: Vec<(u64, BlockData)> = Vec::with_capacity(items.len());
        let mut on_disk: Vec<(u64, BlockPtr)> = Vec::new();
        for (k, v) in items {
            match &v {
                Value::Block(r) if r.dirty_data().is_none() => match r.bp() {
                    Some(bp) => on_disk.push((k.offset, bp)),
                    None => blocks.push((k.offset, self.value_bytes(&v, false)?)),
                },
                _ => blocks.push((k.offset, self.value_bytes(&v, false)?)),
            }
        }
        let policy = self.primarycache();
        // What a direct read does with a block it covers whole (`read_direct`).
        let whole_policy = match policy {
            CachePolicy::All if direct => CachePolicy::Metadata,
            p => p,
        };
        let covers = |blkid: u64| {
            let start = blkid * bs;
            start >= offset && (start + bs <= end || end == info.size)
        };
        // Keep up to READ_PARALLEL blocks in flight; verify and copy them in order.
        // Blocks a sequential stream prefetched for us, if they are still the current ones.
        let mut prefetched: HashMap<u64, CachedRead> = {
            let mut pf = self.prefetch.lock();
            on_disk
                .iter()
                .filter_map(|(blkid, bp)| match pf.blocks.remove(&(obj, *blkid)) {
                    Some((pbp, pending)) if pbp == *bp => Some((*blkid, pending)),
                    _ => None,
                })
                .collect()
        };
        let mut queue = std::collections::VecDeque::new();
        let mut next = on_disk.into_iter();
        loop {
            while queue.len() < READ_PARALLEL {
                match next.next() {
                    Some((blkid, bp)) => {
                        let pending = prefetched
                            .remove(&blkid)
                            .unwrap_or_else(|| self.cache.submit(&bp, false));
                        queue.push_back((blkid, pending));
                    }
                    None => break,
                }
            }
            let Some((blkid, pending)) = queue.pop_front() else {
                break;
            };
            let policy = if covers(blkid) { whole_policy } else { policy };
            blocks.push((blkid, self.cache.complete(pending, false, policy)?));
        }
        self.prefetch_after(obj, bs, offset, end, last)?;
        // Built in block order, so that each byte is written once: holes as zeros, blocks
        // copied (a stable sort keeps a later entry for the same block winning).
        blocks.sort_by_key(|(blkid, _)| *blkid);
        let total = (end - offset) as usize;
        let mut out = Vec::with_capacity(total);
        for (blkid, block) in blocks {
            let block_start = blkid * bs;
            let from = offset.max(block_start);
            let to = end.min(block_start + block.len() as u64);
            if from < to {
                let src = (from - block_start) as usize;
                let dst = (from - offset) as usize;
                let n = (to - from) as usize;
                if dst >= out.len() {
                    out.resize(dst, 0);
                    out.extend_from_slice(&block[src..src + n]);
                } else {
                    let overlap = (out.len() - dst).min(n);
                    out[dst..dst + overlap].copy_from_slice(&block[src..src + overlap]);
                    out.extend_from_slice(&block[src + overlap..src + n]);
                }
            }
        }
        out.resize(total, 0);
        Ok(out)
    }

    /// Blocks read ahead by sequential-stream prefetch and not used yet (for tests and
    /// diagnostics).
    pub fn prefetched_blocks(&self) -> usize {
        self.prefetch.lock().blocks.len()
    }

    /// Sequential-stream prefetch (ZFS's zfetch, simplified): a read that starts where the
    /// previous reads of the object got to (within `STREAM_SLACK`, as zfetch accepts reads
    /// within a stream's window) reads ahead up to `PREFETCH_BYTES` (and half of
    /// `PREFETCH_MAX` blocks) past its end, so the devices stay busy between the caller's
    /// requests. Each read issues only the blocks its window newly covers. Prefetched reads
    /// are matched by block pointer when used, so a block rewritten since is never served
    /// stale.
    fn prefetch_after(
        &self,
        obj: u64,
        bs: u64,
        offset: u64,
        end: u64,
        last: u64,
    ) -> Result<(), ObjectError> {
        // The window stays within half of what may be held, so that a window's blocks in
        // flight are never dropped to make room for the same window's next ones.
        let ahead = (PREFETCH_BYTES / bs)
            .min(PREFETCH_MAX as u64 / 2)
            .max(PREFETCH_MIN_BLOCKS);
        let window = {
            let mut pf = self.prefetch.lock();
            let previous = pf.streams.get(&obj).copied();
            // A read near where the stream has got to continues it: readers that keep
            // several requests in flight (the kernel's readahead through FUSE, parallel
            // jobs) deliver a stream's reads slightly out of order.
            let seq = previous.filter(|p| {
                offset <= p.reached.saturating_add(STREAM_SLACK)
                    && offset.saturating_add(STREAM_SLACK) >= p.reached
            });
            if pf.streams.len() >= PREFETCH_STREAMS && previous.is_none() {
                pf.streams.clear();
            }
            let stop = (last + 1).saturating_add(ahead);
            let (stream, window) = match seq {
                Some(p) => {
                    let from = p.ahead_from.max(last + 1);
                    let stream = Stream {
                        reached: p.reached.max(end),
                        ahead_from: p.ahead_from.max(stop),
                    };
                    (stream, (from < stop).then_some((from, stop)))
                }
                None => (
                    Stream {
                        reached: end,
                        ahead_from: 0,
                    },
                    None,
                ),
            };
            pf.streams.insert(obj, stream);
            window
        };
        let Some((from, stop)) = window else {
            return Ok(());
        };
        let items = self.tree.lock().range(
            &self.store(),
            &key(obj, KIND_DATA, from),
            &key(obj, KIND_DATA, stop),
            (stop - from) as usize,
        )?;
        let mut pf = self.prefetch.lock();
        for (k, v) in items {
            if let Value::Block(r) = v {
                if r.dirty_data().is_some() || pf.blocks.contains_key(&(obj, k.offset)) {
                    continue;
                }
                if let Some(bp) = r.bp() {
                    if pf.blocks.len() >= PREFETCH_MAX {
                        // Left behind by streams that stopped before using them.
                        pf.blocks.clear();
                    }
                    match self.cache.prefetch(&bp) {
                        Ok(Some(read)) => {
                            pf.blocks.insert((obj, k.offset), (bp, read));
                        }
                        Ok(None) => {}
                        Err(OverBudget) => {
                            // The stream's next read looks from here again.
                            if let Some(s) = pf.streams.get_mut(&obj) {
                                s.ahead_from = s.ahead_from.min(k.offset);
                            }
                            break;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Writes `data` at `offset`, extending the object as needed.
    pub fn write(
        &self,
        tx: &Tx<'_>,
        obj: u64,
        offset: u64,
        data: &[u8],
    ) -> Result<(), ObjectError> {
        self.open_context()?;
        let _w = self.write_lock.lock();
        let mut info = self.stat(obj)?;
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or_else(|| ObjectError::Invalid("write past the largest offset".into()))?;
        let bs = u64::from(info.block_size);
        let new_size = info.size.max(end);
        let mut pos = offset;
        // A large write is logged as the blocks it leaves (written to the pool by the log's
        // commit, a pointer in the log); a small one as the bytes written.
        let large = data.len() > crate::zil::IMMEDIATE_MAX;
        let mut blocks = Vec::new();
        // Bytes of dirty blocks this write adds to memory.
        let mut held = 0i64;
        while pos < end {
            let blkid = pos / bs;
            let block_start = blkid * bs;
            let in_block = (pos - block_start) as usize;
            let n = ((bs - in_block as u64).min(end - pos)) as usize;
            // Valid bytes of this block once the write is done.
            let valid = (new_size - block_start).min(bs) as usize;
            let src = (pos - offset) as usize;
            let buf = if in_block == 0 && n >= valid {
                // The whole block is new: copied once, never zero-filled first.
                data[src..src + valid].to_vec()
            } else {
                let mut buf = self.read_block(obj, blkid)?.unwrap_or_default();
                buf.resize(valid, 0);
                buf[in_block..in_block + n].copy_from_slice(&data[src..src + n]);
                buf
            };
            let put = self.put_block(obj, blkid, buf)?;
            info.count_data(put.delta);
            held += put.held;
            if large {
                blocks.push((blkid, put.value));
            }
            pos += n as u64;
        }
        // The transaction was charged the bytes written; a write into part of a block holds
        // the whole block.
        tx.charge(u64::try_from(held - data.len() as i64).unwrap_or(0));
        info.size = new_size;
        info.modified_txg = tx.txg;
        self.dirty_bytes
            .fetch_add(data.len() as u64, Ordering::AcqRel);
        self.put_info(&info)?;
        if large {
            for (blkid, value) in blocks {
                let key = key(obj, KIND_DATA, blkid);
                self.log(tx.txg, crate::zil::LogOp::Set { key, value });
            }
            let value = Some(Self::inline(&info.encode()));
            let key = key(obj, KIND_HEADER, 0);
            self.log(tx.txg, crate::zil::LogOp::Set { key, value });
        } else {
            self.log(
                tx.txg,
                crate::zil::LogOp::Write {
                    obj,
                    offset,
                    data: Arc::from(data),
                },
            );
        }
        Ok(())
    }

    /// Sets the object's size; blocks past it are freed, the last one trimmed.
    pub fn truncate(&self, tx: &Tx<'_>, obj: u64, size: u64) -> Result<(), ObjectError> {
        self.open_context()?;
        let _w = self.write_lock.lock();
        let mut info = self.stat(obj)?;
        let bs = u64::from(info.block_size);
        if size < info.size {
            let first_gone = size.div_ceil(bs);
            let removed = self.remove_data_from(obj, first_gone)?;
            info.count_data(-(removed as i64));
            if !size.is_multiple_of(bs) {
                let blkid = size / bs;
                if let Some(mut b) = self.read_block(obj, blkid)? {
                    b.truncate((size % bs) as usize);
                    let put = self.put_block(obj, blkid, b)?;
                    info.count_data(put.delta);
                    tx.charge(u64::try_from(put.held).unwrap_or(0));
                }
            }
        }
        info.size = size;
        info.modified_txg = tx.txg;
        self.put_info(&info)?;
        self.log(tx.txg, crate::zil::LogOp::Truncate { obj, size });
        Ok(())
    }

    /// Deallocates `len` bytes at `offset` (a hole punch; SCSI UNMAP): the blocks wholly
    /// inside are freed, the parts of the blocks at either end are zeroed. The object's size
    /// does not change; the range is clipped to it. Logged as the blocks it removes, so an
    /// intent-log commit makes it durable like a write.
    pub fn free_range(
        &self,
        tx: &Tx<'_>,
        obj: u64,
        offset: u64,
        len: u64,
    ) -> Result<(), ObjectError> {
        self.open_context()?;
        let _w = self.write_lock.lock();
        let mut info = self.stat(obj)?;
        let bs = u64::from(info.block_size);
        let end = offset.saturating_add(len).min(info.size);
        if offset >= end {
            return Ok(());
        }
        let first_whole = offset.div_ceil(bs);
        let end_whole = end / bs;
        // The partial blocks at the ends (one block if the range is inside one).
        let mut edges = Vec::new();
        if first_whole > end_whole {
            edges.push((offset, end));
        } else {
            if !offset.is_multiple_of(bs) {
                edges.push((offset, first_whole * bs));
            }
            if !end.is_multiple_of(bs) && end_whole >= first_whole {
                edges.push((end_whole * bs, end));
            }
        }
        for (from, to) in edges {
            let blkid = from / bs;
            let Some(mut b) = self.read_block(obj, blkid)? else {
                continue;
            };
            let lo = (from - blkid * bs) as usize;
            let hi = ((to - blkid * bs) as usize).min(b.len());
            if lo < hi {
                b[lo..hi].fill(0);
                let put = self.put_block(obj, blkid, b)?;
                info.count_data(put.delta);
                tx.charge(u64::try_from(put.held).unwrap_or(0));
                let key = key(obj, KIND_DATA, blkid);
                self.log(
                    tx.txg,
                    crate::zil::LogOp::Set {
                        key,
                        value: put.value,
                    },
                );
            }
        }
        if first_whole < end_whole {
            let start = key(obj, KIND_DATA, first_whole);
            let stop = key(obj, KIND_DATA, end_whole);
            loop {
                let items = self
                    .tree
                    .lock()
                    .range(&self.store(), &start, &stop, TRUNCATE_BATCH)?;
                if items.is_empty() {
                    break;
                }
                for (k, _) in items {
                    let removed = self.tree_remove(&k)?;
                    info.count_data(-(removed as i64));
                    self.log(
                        tx.txg,
                        crate::zil::LogOp::Set {
                            key: k,
                            value: None,
                        },
                    );
                }
            }
        }
        info.modified_txg = tx.txg;
        self.put_info(&info)?;
        let value = Some(Self::inline(&info.encode()));
        self.log(
            tx.txg,
            crate::zil::LogOp::Set {
                key: key(obj, KIND_HEADER, 0),
                value,
            },
        );
        Ok(())
    }

    /// Which of the blocks `first..first + count` of an object hold data (the others are
    /// holes), in order.
    pub fn mapped_blocks(&self, obj: u64, first: u64, count: u64) -> Result<Vec<u64>, ObjectError> {
        let start = key(obj, KIND_DATA, first);
        let stop = key(obj, KIND_DATA, first.saturating_add(count));
        let items = self
            .tree
            .lock()
            .range(&self.store(), &start, &stop, count as usize)?;
        Ok(items.into_iter().map(|(k, _)| k.offset).collect())
    }

    /// Removes the data blocks from `first` on; returns the bytes they held.
    fn remove_data_from(&self, obj: u64, first: u64) -> Result<u64, ObjectError> {
        self.remove_range(key(obj, KIND_DATA, first), key(obj, KIND_DATA + 1, 0))
    }

    /// Removes every item with `start <= key < end` but those `keep` says to keep, in
    /// batches; returns the logical bytes they held.
    fn remove_range_but(
        &self,
        start: Key,
        end: Key,
        keep: &dyn Fn(&Key) -> bool,
    ) -> Result<u64, ObjectError> {
        let mut start = start;
        let mut removed = 0;
        loop {
            let items = self
                .tree
                .lock()
                .range(&self.store(), &start, &end, TRUNCATE_BATCH)?;
            let Some(next) = items.last().map(|(k, _)| k.successor()) else {
                return Ok(removed);
            };
            for (k, _) in items {
                if !keep(&k) {
                    removed += self.tree_remove(&k)?;
                }
            }
            match next {
                Some(n) => start = n,
                None => return Ok(removed),
            }
        }
    }

    /// Removes every item with `start <= key < end`; returns the logical bytes they held.
    fn remove_range(&self, start: Key, end: Key) -> Result<u64, ObjectError> {
        self.remove_range_but(start, end, &|_| false)
    }

    /// Frees an object and all its blocks and items.
    pub fn free_object(&self, tx: &Tx<'_>, obj: u64) -> Result<(), ObjectError> {
        self.open_context()?;
        let _w = self.write_lock.lock();
        self.stat(obj)?;
        let end = match obj.checked_add(1) {
            Some(next) => key(next, 0, 0),
            None => Key::MAX,
        };
        self.remove_range(key(obj, 0, 0), end)?;
        self.log(tx.txg, crate::zil::LogOp::Free { obj });
        Ok(())
    }

    // ---- send and receive (docs/FORMAT.md §"Send stream") ----

    /// The changes of this object set's tree since txg `base`, from the range holding `from`
    /// on, in key order (see `tree/changes.rs`). Receive progress items are left out.
    pub fn changes_since(
        &self,
        base: u64,
        from: Key,
        visit: &mut dyn FnMut(Change) -> Result<(), TreeError>,
    ) -> Result<(), ObjectError> {
        let tree = self.tree.lock();
        tree.changes_since(&self.store(), base, from, &mut |change| {
            visit(match change {
                Change::Leaf {
                    lo,
                    hi,
                    mut keys,
                    mut items,
                } => {
                    keys.retain(|k| k.kind != KIND_RECV || k.obj != 0);
                    items.retain(|(k, _)| k.kind != KIND_RECV || k.obj != 0);
                    Change::Leaf {
                        lo,
                        hi,
                        keys,
                        items,
                    }
                }
                clear => clear,
            })
        })?;
        Ok(())
    }

    /// The bytes of a value for a stream: logical, or (`raw`) as stored with the compression
    /// that was applied (`Compression::Off` for inline values and uncompressed blocks).
    pub fn send_bytes(&self, v: &Value, raw: bool) -> Result<(Compression, Vec<u8>), ObjectError> {
        if let (true, Value::Block(r)) = (raw, v) {
            if let Some(bp) = r.bp() {
                if bp.compression != Compression::Off {
                    let physical = self.cache.blocks().read_physical(&bp)?;
                    return Ok((bp.compression, physical));
                }
            }
        }
        let meta = !matches!(v, Value::Block(_));
        Ok((Compression::Off, self.value_bytes(v, meta)?.into_vec()))
    }

    /// `send_bytes` of many values at once: every device read is started before the first
    /// is waited for, so a cold stream keeps every device busy (a leaf's blocks at a time).
    pub fn send_bytes_many(
        &self,
        values: &[Value],
        raw: bool,
    ) -> Result<Vec<(Compression, Vec<u8>)>, ObjectError> {
        enum Started {
            Done(Compression, Vec<u8>),
            Raw(tank_block::PendingBlock),
            Logical(CachedRead),
        }
        let blocks = self.cache.blocks();
        let started: Vec<Started> = values
            .iter()
            .map(|v| {
                let Value::Block(r) = v else {
                    let (c, b) = self.send_bytes(v, raw)?;
                    return Ok(Started::Done(c, b));
                };
                match r.bp() {
                    Some(bp) if r.dirty_data().is_none() => {
                        if raw && bp.compression != Compression::Off {
                            Ok(Started::Raw(blocks.submit(&bp)))
                        } else {
                            Ok(Started::Logical(self.cache.submit(&bp, false)))
                        }
                    }
                    _ => {
                        let (c, b) = self.send_bytes(v, raw)?;
                        Ok(Started::Done(c, b))
                    }
                }
            })
            .collect::<Result<_, ObjectError>>()?;
        started
            .into_iter()
            .map(|s| {
                Ok(match s {
                    Started::Done(c, b) => (c, b),
                    Started::Raw(p) => {
                        let c = p.bp().compression;
                        (c, blocks.complete_physical(p)?)
                    }
                    // A stream reads each block once: kept out of the ARC (its buffers are
                    // then reused at once, rather than a stream's worth of new memory).
                    Started::Logical(r) => (
                        Compression::Off,
                        self.cache
                            .complete(r, false, CachePolicy::Metadata)?
                            .into_vec(),
                    ),
                })
            })
            .collect()
    }

    /// Receive: removes every item with `lo <= key < hi` (`None`: to the end) but those in
    /// `keep` (sorted) and the receive progress. Not logged:
    /// a receive is durable when its txgs commit.
    pub fn recv_clear(
        &self,
        _tx: &Tx<'_>,
        lo: Key,
        hi: Option<Key>,
        keep: &[Key],
    ) -> Result<(), ObjectError> {
        self.open_context()?;
        let _w = self.write_lock.lock();
        let progress = key(0, KIND_RECV, 0);
        self.remove_range_but(lo, hi.unwrap_or(Key::MAX), &|k| {
            *k == progress || keep.binary_search(k).is_ok()
        })?;
        Ok(())
    }

    /// Receive: sets an item to inline bytes, or to a data block holding `data` (written by
    /// the next sync with this object set's write policy). Not logged.
    pub fn recv_set(
        &self,
        _tx: &Tx<'_>,
        k: Key,
        data: Vec<u8>,
        block: bool,
    ) -> Result<(), ObjectError> {
        self.open_context()?;
        if k.obj == 0 && k.kind == KIND_RECV {
            return Err(ObjectError::Invalid(
                "a stream may not set receive progress".into(),
            ));
        }
        let _w = self.write_lock.lock();
        let v = if block {
            if data.is_empty() || data.len() > MAX_BLOCK_SIZE as usize {
                return Err(ObjectError::Invalid(format!(
                    "data block of {} bytes",
                    data.len()
                )));
            }
            self.dirty_bytes
                .fetch_add(data.len() as u64, Ordering::AcqRel);
            let r = BlockRef::new_dirty(Arc::new(data), self.policy().tag());
            return self.insert_created(k, r).map(drop);
        } else {
            if data.len() > crate::tree::MAX_INLINE {
                return Err(ObjectError::Invalid(format!(
                    "inline item of {} bytes",
                    data.len()
                )));
            }
            Self::inline(&data)
        };
        self.tree_insert(k, v)?;
        Ok(())
    }

    /// Receive: whether an item exists (a stream's unchanged keys must).
    pub fn has_item(&self, k: &Key) -> Result<bool, ObjectError> {
        Ok(self.tree_get(k)?.is_some())
    }

    /// Receive progress: the stored bytes at `(0, KIND_RECV, 0)`, if any.
    pub fn recv_progress(&self) -> Result<Option<Vec<u8>>, ObjectError> {
        match self.tree_get(&key(0, KIND_RECV, 0))? {
            Some(v) => Ok(Some(self.value_bytes(&v, true)?.into_vec())),
            None => Ok(None),
        }
    }

    /// Sets (or, with `None`, removes) the receive progress, in the transaction of the
    /// changes it accounts for.
    pub fn set_recv_progress(&self, _tx: &Tx<'_>, value: Option<&[u8]>) -> Result<(), ObjectError> {
        self.open_context()?;
        let k = key(0, KIND_RECV, 0);
        match value {
            Some(v) => self.tree_insert(k, Self::inline(v)).map(drop),
            None => self.tree_remove(&k).map(drop),
        }
    }

    // ---- sync ----

    pub(crate) fn is_dirty(&self) -> bool {
        self.dirty.load(Ordering::Acquire)
    }

    pub(crate) fn quiesce(&self, txg: u64) {
        // Txgs sync one at a time: every txg before this one is committed.
        {
            let mut l = self.log.lock();
            while l.records.front().is_some_and(|r| r.txg < txg) {
                l.records.pop_front();
            }
        }
        if !self.dirty.swap(false, Ordering::AcqRel) {
            return;
        }
        self.syncing_bytes.store(
            self.dirty_bytes.swap(0, Ordering::AcqRel),
            Ordering::Release,
        );
        let (snapshot, obsolete) = self.tree.lock().snapshot();
        let frees = self.open_frees();
        let created = std::mem::take(&mut *self.open_created.lock())
            .into_values()
            .collect();
        *self.frozen.lock() = Some(Frozen {
            txg,
            snapshot,
            obsolete,
            frees,
            created,
        });
    }

    pub(crate) fn sync(
        &self,
        blocks: &BlockStore,
        txg: u64,
        batch: &Arc<IoBatch>,
    ) -> Result<SyncReport, PoolError> {
        let Some(frozen) = self.frozen.lock().take() else {
            return Ok(SyncReport {
                root: self.root(),
                ..SyncReport::default()
            });
        };
        assert_eq!(
            frozen.txg, txg,
            "object set {} frozen for another txg",
            self.id
        );
        let store = SyncStore {
            blocks,
            cache: &self.cache,
            cache_policy: self.primarycache(),
            txg,
            batch,
            node_policy: self.policy(),
            prev_snap_txg: self.prev_snap_txg(),
            origin_txg: self.origin_txg.load(Ordering::Acquire),
            report: Mutex::new(SyncReport::default()),
        };
        let root = frozen
            .snapshot
            .sync(&store, frozen.obsolete)
            .map_err(|e| PoolError::Corrupt(format!("object set {}: {e}", self.id)))?;
        for r in frozen.frees {
            if let Some(bp) = r.bp() {
                if r.take_prewritten() {
                    // Written by the intent log and replaced before a sync referenced it.
                    store.prewritten(&bp);
                }
                store.kill(&bp)?;
            }
        }
        *self.written.lock() = frozen.created;
        *self.root.lock() = root;
        let mut report = store.report.into_inner();
        report.root = root;
        self.syncing_bytes.store(0, Ordering::Release);
        Ok(report)
    }

    /// Replaces the whole live tree with the committed tree at `root` (rollback, in syncing
    /// context after this object set's own sync). Changes of the open txg are discarded; the
    /// caller frees what only the discarded version referenced.
    /// Returns the blocks the intent log wrote for the discarded changes (to be freed).
    pub(crate) fn reset_to(&self, root: Option<BlockPtr>) -> Vec<BlockPtr> {
        assert!(
            self.frozen.lock().is_none(),
            "object set {} reset before its sync",
            self.id
        );
        let _w = self.write_lock.lock();
        let orphans = self.unsynced_log_blocks();
        *self.tree.lock() = CowTree::open(root);
        self.open_frees.lock().clear();
        self.open_dropped.lock().clear();
        self.open_created.lock().clear();
        {
            let mut l = self.log.lock();
            l.records.clear();
            l.durable = l.next;
        }
        *self.prefetch.lock() = Prefetch::default();
        *self.root.lock() = root;
        self.dirty.store(false, Ordering::Release);
        self.dirty_bytes.store(0, Ordering::Release);
        orphans
    }

    /// Blocks the intent log wrote (or replayed) for changes of the open txg that no sync
    /// has referenced: allocated, but only the open txg's tree knows them. When those
    /// changes are discarded (rollback, destroy) the caller frees them.
    pub(crate) fn unsynced_log_blocks(&self) -> Vec<BlockPtr> {
        let mut refs: Vec<Arc<BlockRef>> = self.open_created.lock().values().cloned().collect();
        refs.extend(self.open_frees.lock().iter().cloned());
        refs.extend(self.open_dropped.lock().iter().filter_map(Weak::upgrade));
        refs.iter()
            .filter(|r| r.take_prewritten())
            .filter_map(|r| r.bp())
            .collect()
    }

    /// Called once the writes of the last sync completed: data blocks can now be read from
    /// the devices, so their bytes leave memory; clean tree nodes beyond the cache bound too.
    /// Data blocks the `primarycache` policy keeps stay in the ARC (`BlockCache::keep_written`).
    pub(crate) fn writes_completed(&self) {
        let keep = self.primarycache().keeps(false);
        for r in std::mem::take(&mut *self.written.lock()) {
            if keep {
                if let (Some(bp), Some(data)) = (r.bp(), r.dirty_data()) {
                    self.cache.keep_written(&bp, data, r.take_stored());
                }
            }
            r.release_data();
        }
        let tree = self.tree.lock();
        if tree.cached_nodes() > NODE_CACHE_MAX {
            tree.evict_clean();
        }
    }

    /// Drops cached clean tree nodes (memory bound).
    pub fn evict_clean(&self) {
        self.tree.lock().evict_clean();
    }

    pub fn cached_nodes(&self) -> usize {
        self.tree.lock().cached_nodes()
    }

    /// Every block pointer reachable from the committed root, by walking the tree (for `debug`).
    pub fn dump(&self, limit: usize) -> Result<Vec<(Key, String)>, ObjectError> {
        let items = self.tree.lock().range(
            &self.store(),
            &key(0, 0, 0),
            &key(u64::MAX, u8::MAX, u64::MAX),
            limit,
        )?;
        Ok(items
            .into_iter()
            .map(|(k, v)| {
                let desc = match &v {
                    Value::Inline(b) => format!("inline {} bytes", b.len()),
                    Value::Block(r) => match r.bp() {
                        Some(bp) => bp.describe(),
                        None => "dirty (not yet written)".into(),
                    },
                };
                (k, desc)
            })
            .collect())
    }
}

/// The object sets of a pool, keyed by id (used by the store).
pub(crate) type ObjsetMap = BTreeMap<u64, Arc<ObjectSet>>;
