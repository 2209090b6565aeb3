//! The object store: a pool's object sets, and the [`Syncer`] that writes them each txg.
//!
//! # Theory of operation
//! `ObjectStore::open` registers itself with the pool as its syncer and opens every object set
//! in the pool's objset table (object set 0 is reserved for pool metadata such as the
//! dataset directory; object set 1 is created with the pool as the root dataset's).
//! At quiesce each dirty object set freezes its tree; at sync each writes its frozen tree and
//! the store returns the objset table for the commit.

use std::sync::Arc;

use parking_lot::RwLock;
use tank_block::BlockPtr;
use tank_pool::{Pool, PoolError, SyncContext, Syncer, Tx};

use crate::objset::{ObjectSet, ObjsetMap};
use crate::ObjectError;

pub const META_OBJSET: u64 = 0;
pub const ROOT_OBJSET: u64 = 1;

pub struct ObjectStore {
    pool: Arc<Pool>,
    objsets: RwLock<ObjsetMap>,
    /// Object sets created in the open txg that have no root yet still belong in the table.
    dirty_table: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for ObjectStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectStore").finish_non_exhaustive()
    }
}

impl ObjectStore {
    /// Opens the object sets of `pool` and becomes its syncer. A pool without object sets
    /// (just created) gets the meta and root object sets.
    pub fn open(pool: Arc<Pool>) -> Result<Arc<Self>, ObjectError> {
        let mut map = ObjsetMap::new();
        for (id, root) in pool.objsets() {
            map.insert(id, Arc::new(ObjectSet::open(id, pool.blocks.clone(), root)));
        }
        let fresh = map.is_empty();
        for id in [META_OBJSET, ROOT_OBJSET] {
            map.entry(id)
                .or_insert_with(|| Arc::new(ObjectSet::open(id, pool.blocks.clone(), None)));
        }
        let store = Arc::new(Self {
            pool: pool.clone(),
            objsets: RwLock::new(map),
            dirty_table: std::sync::atomic::AtomicBool::new(fresh),
        });
        pool.set_syncer(store.clone());
        if fresh {
            pool.wait_synced()?;
        }
        Ok(store)
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    pub fn objset(&self, id: u64) -> Result<Arc<ObjectSet>, ObjectError> {
        self.objsets
            .read()
            .get(&id)
            .cloned()
            .ok_or(ObjectError::NoSuchObjset(id))
    }

    pub fn objset_ids(&self) -> Vec<u64> {
        self.objsets.read().keys().copied().collect()
    }

    /// Creates a new, empty object set (committed with the open txg).
    pub fn create_objset(&self, _tx: &Tx<'_>) -> Result<Arc<ObjectSet>, ObjectError> {
        let mut map = self.objsets.write();
        let id = map
            .keys()
            .next_back()
            .map(|k| k + 1)
            .unwrap_or(ROOT_OBJSET + 1);
        let os = Arc::new(ObjectSet::open(id, self.pool.blocks.clone(), None));
        map.insert(id, os.clone());
        self.dirty_table
            .store(true, std::sync::atomic::Ordering::Release);
        Ok(os)
    }

    /// Starts a transaction charged with `bytes` of new data.
    pub fn begin(&self, bytes: u64) -> Result<Tx<'_>, ObjectError> {
        Ok(self.pool.begin_tx(bytes)?)
    }

    /// Waits until everything done so far is durable (a txg sync).
    pub fn sync(&self) -> Result<(), ObjectError> {
        Ok(self.pool.wait_synced()?)
    }
}

impl Syncer for ObjectStore {
    fn quiesce(&self, txg: u64) {
        for os in self.objsets.read().values() {
            os.quiesce(txg);
        }
    }

    fn sync(&self, ctx: &SyncContext<'_>) -> Result<Vec<(u64, Option<BlockPtr>)>, PoolError> {
        self.dirty_table
            .store(false, std::sync::atomic::Ordering::Release);
        let objsets: Vec<Arc<ObjectSet>> = self.objsets.read().values().cloned().collect();
        let mut table = Vec::with_capacity(objsets.len());
        for os in &objsets {
            let root = os.sync(ctx.blocks, ctx.txg, ctx.batch)?;
            table.push((os.id, root));
        }
        // Wait for the writes (the pool checks the failures), then let go of the bytes.
        let _ = ctx.batch.wait();
        ctx.blocks.check_writable()?;
        for os in &objsets {
            os.writes_completed();
        }
        Ok(table)
    }

    fn is_dirty(&self) -> bool {
        self.dirty_table.load(std::sync::atomic::Ordering::Acquire)
            || self.objsets.read().values().any(|o| o.is_dirty())
    }
}
