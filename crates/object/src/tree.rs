//! The copy-on-write B+tree: one per object set, keyed by (object id, item kind, offset).
//!
//! # Theory of operation
//! Every object set (a dataset's objects, or the pool's meta object set) is ONE tree, in the
//! style of btrfs: an object's attributes, its small data and its references to data blocks are
//! all items of the same tree, ordered by [`Key`] = (obj, kind, offset). Leaves hold the items;
//! internal nodes hold, per child, the first key of the child's subtree and the child itself.
//!
//! The tree lives in memory as a *persistent* (path-copying) structure of [`NodeRef`]s:
//!
//! - [`CowTree`] is the live version, changed by the open txg.
//! - [`CowTree::snapshot`] freezes it in O(1) into a [`TreeSnapshot`] and starts a new
//!   *generation*. The snapshot shares every node with the live tree.
//! - A node created in the current generation is *private* to the live tree and is changed in
//!   place. Any older node is shared with a snapshot (or already on disk) and is never changed:
//!   the live tree copies it (and, in turn, its ancestors up to the root) and puts the old
//!   `NodeRef` on the current generation's *obsolete* list.
//! - [`TreeSnapshot::sync`] writes every node that has no block pointer yet, children first
//!   (and, for a leaf, its not-yet-written data blocks first), sets each node's `bp`, frees the
//!   obsolete nodes of its generation that were ever written, and returns the new root pointer.
//!
//! So the sync of txg N can run on one thread while txg N+1 changes the live tree on another:
//! the sync only writes nodes of snapshot N, which the live tree never changes in place; when
//! the live tree shares such a node it sees the `bp` appear and will never write it again.
//!
//! Nodes are read lazily from the [`NodeStore`] on first use and cached in their `NodeRef`;
//! [`CowTree::evict_clean`] drops cached copies of written nodes so memory stays bounded. A node
//! holds at most [`NODE_MAX`] serialized bytes: it splits when an insert makes it larger, and a
//! non-root node that falls below [`NODE_MIN`] merges with a sibling (or, if both would not fit
//! in one node, the two are rebalanced). An internal root with one child is replaced by the
//! child, and an empty tree has no root at all.
//!
//! Freeing data blocks is not the tree's business: the object layer knows when a data block
//! stops being referenced. Freeing replaced tree *nodes* is, through the obsolete list. The
//! list is handed to the caller by [`CowTree::snapshot`], so a layer that keeps old roots alive
//! (dataset snapshots) can filter it, e.g. by `birth_txg`, before passing it to `sync`.
//!
//! # Invariants
//! - Keys are strictly increasing within a node; an internal entry's key is exactly the first
//!   key of its child's subtree, and every key of child `i` sorts before entry `i + 1`'s key
//!   (and before the bound inherited from the ancestors).
//! - A child's level is its parent's level - 1; leaves are level 0, so all leaves are at the
//!   same depth, and no level exceeds [`MAX_LEVEL`].
//! - Every node serializes to at most [`NODE_MAX`] bytes and holds at least one entry; the
//!   tree is empty iff it has no root.
//! - Every non-root node that is not the rightmost of its level serializes to at least
//!   [`NODE_MIN`] bytes. (The rightmost nodes are exempt because sequential appends split them
//!   so that the left part stays full; the next appends fill the right part.)
//! - An internal root has at least two children.
//! - `bp` set implies: the node's contents never change again, every child has a `bp`, and
//!   every data block of the leaf has a `bp`.
//! - `generation == the live tree's generation` implies: no `bp`, reachable only from the live
//!   tree (never from a snapshot), free to change in place.
//! - A `NodeRef` is put on the obsolete list at most once, exactly when it stops being
//!   reachable from the live root, and only if it was not private.
//! - Syncs of one tree run one at a time, in generation order (enforced: an older or repeated
//!   snapshot is refused with [`TreeError::SyncOrder`]).
//!
//! # Concurrency
//! - Mutations (`insert`, `remove`, `snapshot`) take `&mut CowTree`; reads (`get`, `range`,
//!   `last_before`, `evict_clean`, ...) take `&self` and may run concurrently with each other
//!   and with reads of, and the sync of, any [`TreeSnapshot`] (which is `Send + Sync`).
//! - `NodeRef::node` (an `RwLock`) is only held to load, install or evict a node's contents;
//!   readers clone the `Arc<Node>` out of it and work lock-free on the immutable node.
//! - `NodeRef::bp` is a `OnceLock`: set exactly once, by the sync that wrote the node. Nodes
//!   without a `bp` are never evicted, so the sync always finds the contents it must write.
//! - A data block's `BlockRef` is written under its own mutex, which is also what
//!   [`BlockRef::dirty_data`] takes: a reader sees either the in-memory bytes or the `bp`.
//! - The snapshot's sync holds the tree's sync lock for its whole run.
//! - The obsolete list of generation N+1 may only be passed to the sync of snapshot N+1, after
//!   the sync of snapshot N finished: that is what guarantees that every obsolete node that was
//!   ever going to be written has its `bp` by then (nodes without one were never written).
//!
//! # On-disk format (docs/FORMAT.md §"Tree node")
//! A node is one block of at most 16 KiB, little-endian:
//! ```text
//! offset  size  field
//!      0     4  magic: u32 0x5452_4545 ("TREE" read as a big-endian word; bytes 45 45 52 54)
//!      4     1  version: 1
//!      5     1  level: 0 for a leaf, child level + 1 for an internal node, at most 16
//!      6     2  count: number of entries, >= 1
//!      8     -  count entries, back to back
//!
//! key (17 bytes), shared by both entry kinds:
//!      0     8  obj: u64 object id
//!      8     1  kind: u8 item kind
//!      9     8  offset: u64
//!   Keys order by (obj, kind, offset) and are strictly increasing within a node.
//!
//! leaf entry (level 0):
//!      0    17  key
//!     17     1  value type: 0 = inline, 1 = block
//!  inline:
//!     18     2  len: u16, at most 3072
//!     20   len  the value bytes
//!  block:
//!     18   128  block pointer of the data block (never a hole)
//!
//! internal entry (level >= 1), 145 bytes:
//!      0    17  key: the first key of the child's subtree
//!     17   128  block pointer of the child node (never a hole)
//! ```
//! Bytes after the last entry must be zero (sector padding). A reader checks the magic, the
//! version, that every count and length fits the block, that keys are strictly increasing,
//! that the node is at most 16 KiB, and, against the parent entry, the child's level, first key
//! and upper bound; any failure is [`TreeError::Corrupt`].

mod changes;
mod mutate;
mod node;

/// For the fuzz target: a tree node from arbitrary bytes.
pub(crate) fn fuzz_node(bytes: &[u8]) {
    let _ = node::Node::decode(bytes);
}
mod read;

use std::fmt;
use std::sync::{Arc, OnceLock};

use parking_lot::{Mutex, RwLock};
use tank_block::BlockPtr;

pub use changes::Change;
use node::{Expect, Node};
pub use node::{MAX_LEVEL, NODE_MAX, NODE_MIN};
pub use read::ScanVisitor;

/// Largest inline value; bigger values go to a data block ([`Value::Block`]).
pub const MAX_INLINE: usize = 3072;

/// The storage seam: where nodes and data blocks come from and go to.
pub trait NodeStore: Send + Sync {
    /// Verified, decompressed bytes of a block.
    fn read_block(&self, bp: &BlockPtr) -> Result<Vec<u8>, TreeError>;
    /// Writes a block during a sync; `kind` tells the store what it is.
    fn write_block(&self, data: &[u8], kind: WriteKind) -> Result<BlockPtr, TreeError>;
    /// `write_block` of bytes nothing changes again (a dirty data block), which a store may
    /// hand to the devices without a copy. A store that compressed them may give back the
    /// compressed bytes (the block's physical bytes), which the block keeps until its write
    /// has completed, for the cache.
    fn write_block_shared(
        &self,
        data: &Arc<Vec<u8>>,
        kind: WriteKind,
    ) -> Result<(BlockPtr, Option<Vec<u8>>), TreeError> {
        Ok((self.write_block(data, kind)?, None))
    }
    /// Frees a block during a sync (the store defers reuse).
    fn free_block(&self, bp: &BlockPtr) -> Result<(), TreeError>;
    /// A data block the intent log wrote before this sync (see [`BlockRef::write_now`]) is
    /// referenced by the tree for the first time: the store counts it as born.
    fn prewritten(&self, _bp: &BlockPtr) {}
}

/// What a block written by the tree holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WriteKind {
    /// A tree node at `level` (0 = leaf).
    Node { level: u8 },
    /// A data block referenced by a leaf item; `tag` is the one given to [`BlockRef::new_dirty`].
    Data { tag: u32 },
}

/// What a block reached by [`CowTree::check`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockUse {
    Node { level: u8 },
    Data,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TreeError {
    #[error("corrupt tree node: {0}")]
    Corrupt(String),
    #[error("{0}")]
    Store(String),
    #[error("inline value of {len} bytes is larger than {max}")]
    InlineTooLarge { len: usize, max: usize },
    #[error("snapshot of generation {generation} synced after generation {synced}")]
    SyncOrder { generation: u64, synced: u64 },
}

/// An item's key. Ordered by (obj, kind, offset); encoded in 17 bytes, little-endian.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    pub obj: u64,
    pub kind: u8,
    pub offset: u64,
}

impl Key {
    pub const SIZE: usize = 17;
    pub const MIN: Key = Key {
        obj: 0,
        kind: 0,
        offset: 0,
    };
    pub const MAX: Key = Key {
        obj: u64::MAX,
        kind: u8::MAX,
        offset: u64::MAX,
    };

    pub fn new(obj: u64, kind: u8, offset: u64) -> Key {
        Key { obj, kind, offset }
    }

    pub fn encode(&self) -> [u8; Key::SIZE] {
        let mut out = [0u8; Key::SIZE];
        out[..8].copy_from_slice(&self.obj.to_le_bytes());
        out[8] = self.kind;
        out[9..].copy_from_slice(&self.offset.to_le_bytes());
        out
    }

    /// The next key in order; `None` after `Key::MAX`.
    pub fn successor(&self) -> Option<Key> {
        if let Some(offset) = self.offset.checked_add(1) {
            return Some(Key { offset, ..*self });
        }
        if let Some(kind) = self.kind.checked_add(1) {
            return Some(Key::new(self.obj, kind, 0));
        }
        self.obj.checked_add(1).map(|obj| Key::new(obj, 0, 0))
    }

    pub fn decode(raw: &[u8; Key::SIZE]) -> Key {
        let obj = u64::from_le_bytes(raw[..8].try_into().expect("8 bytes"));
        let offset = u64::from_le_bytes(raw[9..].try_into().expect("8 bytes"));
        Key {
            obj,
            kind: raw[8],
            offset,
        }
    }
}

/// An item's value: small bytes stored in the leaf, or a reference to a data block.
#[derive(Clone, Debug)]
pub enum Value {
    Inline(Arc<[u8]>),
    Block(Arc<BlockRef>),
}

impl Value {
    pub fn inline(bytes: &[u8]) -> Value {
        Value::Inline(Arc::from(bytes))
    }

    /// Bytes the value holds before compression.
    pub fn logical_len(&self) -> u64 {
        match self {
            Value::Inline(b) => b.len() as u64,
            Value::Block(r) => r.logical_len(),
        }
    }
}

/// A reference to a separately stored data block: either not yet written (bytes in memory) or
/// written (`bp` set). The sync writes it when it writes the first leaf that holds it.
pub struct BlockRef {
    bp: OnceLock<BlockPtr>,
    data: Mutex<Option<Arc<Vec<u8>>>>,
    /// The bytes as stored, when the sync compressed them: kept with `data` until the write
    /// has completed, for the ARC (which holds blocks as stored).
    stored: Mutex<Option<Vec<u8>>>,
    tag: u32,
    /// Written outside a sync (by the intent log, or replayed from it) and not yet counted
    /// as born by a sync.
    prewritten: std::sync::atomic::AtomicBool,
    /// Written by the intent log (on stable storage once its commit returned); stays set.
    by_log: std::sync::atomic::AtomicBool,
}

impl BlockRef {
    /// A block to be written by the next sync that writes a leaf holding it; `tag` is handed
    /// to the store in [`WriteKind::Data`].
    pub fn new_dirty(data: Arc<Vec<u8>>, tag: u32) -> Arc<Self> {
        Arc::new(BlockRef {
            bp: OnceLock::new(),
            data: Mutex::new(Some(data)),
            stored: Mutex::new(None),
            tag,
            prewritten: Default::default(),
            by_log: Default::default(),
        })
    }

    /// A block already on disk (as decoded from a leaf); its tag is 0, as tags are not stored.
    pub fn new_written(bp: BlockPtr) -> Arc<Self> {
        let cell = OnceLock::new();
        cell.set(bp).expect("fresh OnceLock");
        Arc::new(BlockRef {
            bp: cell,
            data: Mutex::new(None),
            stored: Mutex::new(None),
            tag: 0,
            prewritten: Default::default(),
            by_log: Default::default(),
        })
    }

    /// A block written outside a sync (replayed from the intent log): on disk already, but
    /// counted as born by the sync that first references it.
    pub fn new_prewritten(bp: BlockPtr, tag: u32) -> Arc<Self> {
        let cell = OnceLock::new();
        cell.set(bp).expect("fresh OnceLock");
        Arc::new(BlockRef {
            bp: cell,
            data: Mutex::new(None),
            stored: Mutex::new(None),
            tag,
            prewritten: std::sync::atomic::AtomicBool::new(true),
            by_log: std::sync::atomic::AtomicBool::new(true),
        })
    }

    /// Writes the block now (the intent log's indirect writes) with `write`, unless it was
    /// written already; returns its pointer and whether this call wrote it.
    pub fn write_now(
        &self,
        write: impl FnOnce(&[u8], u32) -> Result<BlockPtr, TreeError>,
    ) -> Result<(BlockPtr, bool), TreeError> {
        let data = self.data.lock();
        if let Some(bp) = self.bp.get() {
            return Ok((*bp, false));
        }
        let bytes = data
            .as_ref()
            .ok_or_else(|| TreeError::Corrupt("data block neither written nor in memory".into()))?;
        let bp = write(bytes, self.tag)?;
        assert!(self.bp.set(bp).is_ok(), "data block bp set twice");
        self.prewritten
            .store(true, std::sync::atomic::Ordering::Release);
        self.by_log
            .store(true, std::sync::atomic::Ordering::Release);
        Ok((bp, true))
    }

    /// Whether the intent log wrote this block (and a sync has not counted it yet); clears
    /// the mark.
    pub fn take_prewritten(&self) -> bool {
        self.prewritten
            .swap(false, std::sync::atomic::Ordering::AcqRel)
    }

    /// Whether the intent log wrote this block (the mark stays).
    pub fn by_log(&self) -> bool {
        self.by_log.load(std::sync::atomic::Ordering::Acquire)
    }

    pub fn bp(&self) -> Option<BlockPtr> {
        self.bp.get().copied()
    }

    /// Bytes the block holds before compression. The pointer is looked at first: once set
    /// it never changes, and the in-memory bytes are released only after it is set.
    pub fn logical_len(&self) -> u64 {
        match self.bp.get() {
            Some(bp) => u64::from(bp.lsize),
            None => self.data.lock().as_ref().map_or(0, |d| d.len() as u64),
        }
    }

    /// In-memory bytes if not yet written, or written but not yet released (see
    /// [`BlockRef::release_data`]). Check this FIRST, then `bp`: one of the two is always there.
    pub fn dirty_data(&self) -> Option<Arc<Vec<u8>>> {
        self.data.lock().clone()
    }

    pub fn tag(&self) -> u32 {
        self.tag
    }

    /// Writes the block if it has not been written yet; returns its pointer.
    fn write_if_dirty(&self, store: &dyn NodeStore) -> Result<BlockPtr, TreeError> {
        // Held across the write, so two syncs can never both write it and a reader of
        // `dirty_data` waits for the `bp` rather than seeing neither.
        let data = self.data.lock();
        if let Some(bp) = self.bp.get() {
            if self.take_prewritten() {
                store.prewritten(bp);
            }
            return Ok(*bp);
        }
        let bytes = data
            .as_ref()
            .ok_or_else(|| TreeError::Corrupt("data block neither written nor in memory".into()))?;
        let (bp, stored) = store.write_block_shared(bytes, WriteKind::Data { tag: self.tag })?;
        assert!(self.bp.set(bp).is_ok(), "data block bp set twice");
        *self.stored.lock() = stored;
        // The bytes stay in memory until the write is known to be on the devices: a reader
        // must not go to a device before the queued write has reached it.
        Ok(bp)
    }

    /// The bytes as stored, when the sync that wrote the block compressed them; taken, so
    /// they are handed on once.
    pub fn take_stored(&self) -> Option<Vec<u8>> {
        self.stored.lock().take()
    }

    /// Drops the in-memory bytes of a written block, once its write has completed.
    pub fn release_data(&self) {
        let mut data = self.data.lock();
        if self.bp.get().is_some() {
            *data = None;
            *self.stored.lock() = None;
        }
    }
}

impl fmt::Debug for BlockRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dirty_len = self.data.lock().as_ref().map(|d| d.len());
        f.debug_struct("BlockRef")
            .field("bp", &self.bp.get().map(BlockPtr::describe))
            .field("dirty_len", &dirty_len)
            .field("tag", &self.tag)
            .finish()
    }
}

/// A node slot: the node's block pointer once written, and its contents while in memory.
pub struct NodeRef {
    bp: OnceLock<BlockPtr>,
    node: RwLock<Option<Arc<Node>>>,
    /// The live tree generation that created it; 0 for nodes read from the store.
    generation: u64,
}

impl NodeRef {
    fn written(bp: BlockPtr) -> NodeRef {
        let cell = OnceLock::new();
        cell.set(bp).expect("fresh OnceLock");
        NodeRef {
            bp: cell,
            node: RwLock::new(None),
            generation: 0,
        }
    }

    fn dirty(node: Node, generation: u64) -> NodeRef {
        NodeRef {
            bp: OnceLock::new(),
            node: RwLock::new(Some(Arc::new(node))),
            generation,
        }
    }

    /// The node's block pointer, once a sync wrote it.
    pub fn bp(&self) -> Option<BlockPtr> {
        self.bp.get().copied()
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether the contents are in memory.
    pub fn is_cached(&self) -> bool {
        self.node.read().is_some()
    }
}

impl fmt::Debug for NodeRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeRef")
            .field("bp", &self.bp.get().map(BlockPtr::describe))
            .field("generation", &self.generation)
            .field("cached", &self.is_cached())
            .finish()
    }
}

/// Returns the contents of `nref`, reading and checking them if they are not in memory.
fn load(store: &dyn NodeStore, nref: &NodeRef, expect: &Expect) -> Result<Arc<Node>, TreeError> {
    if let Some(node) = nref.node.read().as_ref() {
        return Ok(node.clone());
    }
    let bp = nref
        .bp
        .get()
        .ok_or_else(|| TreeError::Corrupt("tree node neither in memory nor written".into()))?;
    let bytes = store.read_block(bp)?;
    let node = Node::decode(&bytes)?;
    expect.check(&node)?;
    let node = Arc::new(node);
    let mut slot = nref.node.write();
    if let Some(raced) = slot.as_ref() {
        // Another reader loaded it meanwhile; keep one copy.
        return Ok(raced.clone());
    }
    *slot = Some(node.clone());
    Ok(node)
}

/// Shape of a tree, as measured by [`CowTree::check`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TreeStats {
    /// Levels including the leaves; 0 for an empty tree.
    pub depth: usize,
    pub nodes: usize,
    pub leaves: usize,
    pub items: usize,
    /// Serialized bytes of all nodes.
    pub bytes: usize,
}

/// The live (open-txg) version of the tree.
pub struct CowTree {
    root: Option<Arc<NodeRef>>,
    /// Nodes created now are private; starts at 1 so that nodes read from disk (0) never are.
    generation: u64,
    /// Shared nodes replaced or removed during this generation.
    obsolete: Vec<Arc<NodeRef>>,
    dirty: bool,
    /// The generation of the last snapshot synced; held while a sync runs.
    synced: Arc<Mutex<u64>>,
}

impl Default for CowTree {
    fn default() -> Self {
        CowTree::new_empty()
    }
}

impl CowTree {
    pub fn new_empty() -> Self {
        CowTree::open(None)
    }

    /// A tree whose root is on disk at `root`; nodes are read through the store when needed.
    pub fn open(root: Option<BlockPtr>) -> Self {
        CowTree {
            root: root.map(|bp| Arc::new(NodeRef::written(bp))),
            generation: 1,
            obsolete: Vec::new(),
            dirty: false,
            synced: Arc::new(Mutex::new(0)),
        }
    }

    pub fn get(&self, store: &dyn NodeStore, key: &Key) -> Result<Option<Value>, TreeError> {
        read::get(store, self.root.as_ref(), key)
    }

    /// Items with `start <= key < end`, in order, at most `limit` of them.
    pub fn range(
        &self,
        store: &dyn NodeStore,
        start: &Key,
        end: &Key,
        limit: usize,
    ) -> Result<Vec<(Key, Value)>, TreeError> {
        read::range(store, self.root.as_ref(), start, end, limit)
    }

    /// The last item with key < `before` (for "highest offset of object X").
    pub fn last_before(
        &self,
        store: &dyn NodeStore,
        before: &Key,
    ) -> Result<Option<(Key, Value)>, TreeError> {
        read::last_before(store, self.root.as_ref(), before)
    }

    /// O(1): freezes the current version for a sync and starts a new generation. Returns the
    /// snapshot and the nodes that became obsolete (replaced or removed) during the generation
    /// that just ended; pass them to that snapshot's [`TreeSnapshot::sync`] (dropping the list
    /// instead leaks the blocks of the written nodes on it).
    pub fn snapshot(&mut self) -> (TreeSnapshot, Vec<Arc<NodeRef>>) {
        let snapshot = TreeSnapshot {
            root: self.root.clone(),
            generation: self.generation,
            synced: self.synced.clone(),
        };
        self.generation += 1;
        self.dirty = false;
        (snapshot, std::mem::take(&mut self.obsolete))
    }

    /// Whether anything changed since the last snapshot.
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// The root's bp if the current root is clean (written); `None` for a dirty or empty tree.
    pub fn root_bp(&self) -> Option<BlockPtr> {
        self.root.as_ref().and_then(|root| root.bp())
    }

    pub fn is_empty(&self) -> bool {
        self.root.is_none()
    }

    /// The generation that changes made now belong to.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Drops the in-memory copies of clean (written) nodes below the root so memory stays
    /// bounded; safe at any time, including while a snapshot syncs.
    pub fn evict_clean(&self) {
        if let Some(root) = &self.root {
            read::evict_below(root);
        }
    }

    /// Nodes currently held in memory.
    pub fn cached_nodes(&self) -> usize {
        self.root
            .as_ref()
            .map_or(0, |root| read::cached_below(root))
    }

    /// Reads the whole tree and checks every invariant of the module header that can be seen
    /// from the tree itself; `visit` is called for every written node and data block.
    pub fn check(
        &self,
        store: &dyn NodeStore,
        visit: &mut dyn FnMut(&BlockPtr, BlockUse),
    ) -> Result<TreeStats, TreeError> {
        read::check(store, self.root.as_ref(), visit)
    }
}

impl CowTree {
    /// Visits every written node and data block for the scrub (see `read::walk_scan`).
    pub fn walk_scan(&self, store: &dyn NodeStore, visit: &mut dyn ScanVisitor) {
        read::walk_scan(store, self.root.as_ref(), visit)
    }

    /// The description of this version for a receiver holding it as of txg `base`, from the
    /// range holding `from` on (see `changes.rs`).
    pub fn changes_since(
        &self,
        store: &dyn NodeStore,
        base: u64,
        from: Key,
        visit: &mut dyn FnMut(Change) -> Result<(), TreeError>,
    ) -> Result<(), TreeError> {
        changes::changes_since(store, self.root.as_ref(), base, from, visit)
    }

    /// Visits every written node and data block born after `min_txg` (see
    /// `read::walk_born_after`); unwritten parts of a live tree are not visited.
    pub fn walk_born_after(
        &self,
        store: &dyn NodeStore,
        min_txg: u64,
        visit: &mut dyn FnMut(&BlockPtr, BlockUse),
    ) -> Result<(), TreeError> {
        read::walk_born_after(store, self.root.as_ref(), min_txg, visit)
    }
}

impl fmt::Debug for CowTree {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CowTree")
            .field("root", &self.root)
            .field("generation", &self.generation)
            .field("obsolete", &self.obsolete.len())
            .field("dirty", &self.dirty)
            .finish()
    }
}

/// A frozen version of the tree, to be written by [`TreeSnapshot::sync`]. `Send + Sync`.
pub struct TreeSnapshot {
    root: Option<Arc<NodeRef>>,
    generation: u64,
    synced: Arc<Mutex<u64>>,
}

impl TreeSnapshot {
    /// Writes every dirty data block of the unwritten leaves first (all of them, in key
    /// order: `read::write_data_below`), then every unwritten node (post-order: children first),
    /// frees the obsolete nodes that have a bp, and returns the root bp (None for an empty
    /// tree). A failed sync must not be retried with the same obsolete list (some frees may
    /// have been done); the pool suspends instead (DESIGN.md §3.8).
    pub fn sync(
        &self,
        store: &dyn NodeStore,
        obsolete: Vec<Arc<NodeRef>>,
    ) -> Result<Option<BlockPtr>, TreeError> {
        let mut synced = self.synced.lock();
        if self.generation <= *synced {
            return Err(TreeError::SyncOrder {
                generation: self.generation,
                synced: *synced,
            });
        }
        let root_bp = match &self.root {
            None => None,
            Some(root) => {
                read::write_data_below(store, root, 0)?;
                Some(read::write_node(store, root, 0)?)
            }
        };
        for nref in &obsolete {
            if let Some(root) = &self.root {
                assert!(
                    !Arc::ptr_eq(root, nref),
                    "the snapshot root is on the obsolete list"
                );
            }
            if let Some(bp) = nref.bp() {
                store.free_block(&bp)?;
            }
        }
        *synced = self.generation;
        Ok(root_bp)
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The root's bp once synced; `None` before the sync or for an empty tree.
    pub fn root_bp(&self) -> Option<BlockPtr> {
        self.root.as_ref().and_then(|root| root.bp())
    }

    pub fn get(&self, store: &dyn NodeStore, key: &Key) -> Result<Option<Value>, TreeError> {
        read::get(store, self.root.as_ref(), key)
    }

    pub fn range(
        &self,
        store: &dyn NodeStore,
        start: &Key,
        end: &Key,
        limit: usize,
    ) -> Result<Vec<(Key, Value)>, TreeError> {
        read::range(store, self.root.as_ref(), start, end, limit)
    }

    pub fn last_before(
        &self,
        store: &dyn NodeStore,
        before: &Key,
    ) -> Result<Option<(Key, Value)>, TreeError> {
        read::last_before(store, self.root.as_ref(), before)
    }

    /// As [`CowTree::check`], for this version.
    pub fn check(
        &self,
        store: &dyn NodeStore,
        visit: &mut dyn FnMut(&BlockPtr, BlockUse),
    ) -> Result<TreeStats, TreeError> {
        read::check(store, self.root.as_ref(), visit)
    }
}

impl fmt::Debug for TreeSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TreeSnapshot")
            .field("root", &self.root)
            .field("generation", &self.generation)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn shared_types_are_send_and_sync() {
        assert_send_sync::<TreeSnapshot>();
        assert_send_sync::<CowTree>();
        assert_send_sync::<NodeRef>();
        assert_send_sync::<Value>();
    }
}
