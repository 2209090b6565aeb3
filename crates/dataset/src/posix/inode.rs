//! In-memory inodes: one [`Node`] per inode in use, with its locks, its cached inode record
//! and its open count.
//!
//! # Theory of operation
//! The tree is the truth: a `Slot` holds a copy of the inode item, loaded on first use and
//! changed only together with the item, under the slot's mutex and inside the transaction
//! that writes the item. When an operation fails after it began changing items, it
//! invalidates the slots it holds (they reload from the tree).
//!
//! Nodes live in a sharded map. A node nobody refers to (the map holds the only `Arc`) and
//! that is not open is evicted when a shard grows past its bound; it reloads from the tree
//! when needed again. The open count lives only here: an inode that is open is never
//! evicted, and an inode unlinked while open is freed by the last `release` (the persistent
//! unlinked set covers a crash in between).
//!
//! # Concurrency
//! Each node has two locks: `data` (a read-write lock: readers of the file's bytes share it,
//! writers, truncation and freeing take it exclusively) and `meta` (the slot). Lock order:
//! the filesystem's namespace lock, then `data` locks, then `meta` locks in increasing inode
//! number, then a transaction. Namespace operations take `data` locks only with `try_write`
//! (never waiting), so a long write never holds up the namespace.
//!
//! # Data versions
//! Every change of a file's bytes or size takes its `data` lock exclusively through
//! [`Node::change_data`], which gives the node a new data version from one process-wide
//! counter. A node made anew (first use, or after an eviction) gets a new version too, so
//! a version names one state of a file's data and is never seen again for another. A
//! front end that caches file data (the FUSE mount's kernel pages) keeps the version its
//! cache holds, and keeps the cache only while the version is unchanged.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock, RwLockWriteGuard};

use super::format::Inode;
use super::types::Ino;

const SHARDS: usize = 16;
/// Nodes a shard keeps before it evicts unused ones (16 × 4096 = 65536 inodes, a few MiB).
const SHARD_NODES_MAX: usize = 4096;

/// The cached state of one inode, behind `Node::meta`.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    /// The inode record as in the tree; None until loaded (or after an invalidation).
    pub inode: Option<Inode>,
    /// The inode was freed: every later use answers ENOENT.
    pub gone: bool,
    /// Opens not yet released.
    pub open: u32,
}

impl Slot {
    /// The loaded record (callers load it first).
    pub fn inode(&self) -> &Inode {
        self.inode.as_ref().expect("inode record loaded")
    }

    pub fn inode_mut(&mut self) -> &mut Inode {
        self.inode.as_mut().expect("inode record loaded")
    }
}

#[derive(Debug)]
pub(crate) struct Node {
    pub ino: Ino,
    pub data: RwLock<()>,
    pub meta: Mutex<Slot>,
    /// The version of the file's data (module documentation), changed only under `data`
    /// held exclusively.
    data_version: AtomicU64,
}

/// The next data version (never 0, never repeated).
fn next_data_version() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The `data` lock of a node held for a change of its data: the version it had and the
/// one it has once the change is done.
pub(crate) struct DataChange<'a> {
    _lock: RwLockWriteGuard<'a, ()>,
    pub before: u64,
    pub after: u64,
}

impl Node {
    /// Takes the `data` lock for a change of the file's bytes or size, and gives the node
    /// its next data version.
    pub fn change_data(&self) -> DataChange<'_> {
        let lock = self.data.write();
        let after = next_data_version();
        let before = self.data_version.swap(after, Ordering::AcqRel);
        DataChange {
            _lock: lock,
            before,
            after,
        }
    }

    /// The version of the data as no change is under way.
    pub fn data_version(&self) -> u64 {
        let _r = self.data.read();
        self.data_version.load(Ordering::Acquire)
    }
}

struct Shard {
    nodes: HashMap<Ino, Arc<Node>>,
    /// Size at which the next eviction pass runs.
    evict_at: usize,
}

/// The map of nodes. See the module documentation.
pub(crate) struct InodeCache {
    shards: Vec<Mutex<Shard>>,
}

impl InodeCache {
    pub fn new() -> Self {
        Self {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        nodes: HashMap::new(),
                        evict_at: SHARD_NODES_MAX,
                    })
                })
                .collect(),
        }
    }

    fn shard(&self, ino: Ino) -> &Mutex<Shard> {
        &self.shards[(ino % SHARDS as u64) as usize]
    }

    /// The node of `ino` (created empty when absent; it loads on first lock).
    pub fn node(&self, ino: Ino) -> Arc<Node> {
        let mut shard = self.shard(ino).lock();
        if let Some(n) = shard.nodes.get(&ino) {
            return n.clone();
        }
        Self::maybe_evict(&mut shard);
        let n = Arc::new(Node {
            ino,
            data: RwLock::new(()),
            meta: Mutex::new(Slot::default()),
            data_version: AtomicU64::new(next_data_version()),
        });
        shard.nodes.insert(ino, n.clone());
        n
    }

    /// Adds the node of a new inode (already in the tree) with its record and opens. A node
    /// left in the map by a lookup of the number before the inode existed is reused, so
    /// there is never more than one node per inode.
    pub fn insert_new(&self, ino: Ino, inode: Inode, open: u32) -> Arc<Node> {
        let node = self.node(ino);
        let mut slot = node.meta.lock();
        assert!(!slot.gone, "inode {ino} created after it was freed");
        slot.inode = Some(inode);
        slot.open += open;
        drop(slot);
        node
    }

    /// Drops the node of a freed inode from the map (holders see `gone`).
    pub fn forget(&self, ino: Ino) {
        self.shard(ino).lock().nodes.remove(&ino);
    }

    /// Evicts nodes nobody holds and nobody has open, once the shard passed its bound; the
    /// bound then doubles past what remains, so a shard of open inodes is not rescanned on
    /// every insertion.
    fn maybe_evict(shard: &mut Shard) {
        if shard.nodes.len() < shard.evict_at {
            return;
        }
        shard.nodes.retain(|_, n| {
            // The map's Arc is the only one: nobody else can be locking the node now, and
            // nobody can get it without the shard lock we hold.
            Arc::strong_count(n) > 1 || n.meta.try_lock().is_none_or(|s| s.open > 0)
        });
        shard.evict_at = (shard.nodes.len() * 2).max(SHARD_NODES_MAX);
    }

    /// Nodes in the map (for tests of the bound).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().nodes.len()).sum()
    }
}
