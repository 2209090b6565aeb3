//! The object store: a pool's object sets, and the [`Syncer`] that writes them each txg.
//!
//! # Theory of operation
//! `ObjectStore::open` registers itself with the pool as its syncer and opens every object set
//! in the pool's objset table. Object set 0 is the meta object set: the pool's own metadata
//! (the dataset directory, deadlists), changed only in syncing context. Object set 1 is
//! created with the pool as the root dataset's.
//!
//! A txg's sync runs in this order (ZFS's spa_sync, simplified):
//! 1. every dataset object set writes the tree it froze at quiesce and reports what it did
//!    to its space (`SyncReport`: born, freed, deadlisted, dropped blocks);
//! 2. the sync hook (the dataset layer) accounts those reports, appends deadlists and runs
//!    the sync tasks of the txg (create, destroy, snapshot, clone, rollback), changing the
//!    meta object set and the objset table;
//! 3. the meta object set freezes and writes last, so everything the hook changed commits
//!    in this same txg;
//! 4. the objset table goes to the pool's commit.
//!
//! # Concurrency
//! `objsets` is read-locked by readers and the sync, write-locked only to add or remove an
//! object set (in syncing context, or by `create_objset` under a transaction).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use tank_block::{BlockPtr, BlockStore};
use tank_pool::{Pool, PoolError, SyncContext, Syncer, Tx, VdevClass};
use tank_vdev::{IoBatch, TopVdev};

use crate::cache::{BlockCache, CachePolicy};
use crate::objset::{ObjectSet, ObjsetMap, ObjsetMode, ReadStore, Space, SyncReport};
use crate::tree::CowTree;
use crate::ObjectError;

pub const META_OBJSET: u64 = 0;
pub const ROOT_OBJSET: u64 = 1;

/// The layer above's part of every sync (see the module documentation, step 2).
pub trait SyncHook: Send + Sync {
    /// Called at quiesce of `txg` (cheap: take the work queued for it).
    fn quiesce(&self, txg: u64);
    /// Called in syncing context after the dataset object sets wrote their trees.
    fn sync(&self, ctx: &HookContext<'_>) -> Result<(), PoolError>;
    /// Whether the hook has work queued (a sync must happen).
    fn is_dirty(&self) -> bool;
}

/// What the sync hook gets: the txg, the store, and each object set's report.
pub struct HookContext<'a> {
    pub txg: u64,
    pub blocks: &'a BlockStore,
    pub batch: &'a Arc<IoBatch>,
    pub store: &'a ObjectStore,
    pub reports: BTreeMap<u64, SyncReport>,
}

pub struct ObjectStore {
    pool: Arc<Pool>,
    /// This pool instance's reads through the process's ARC and the pool's L2ARC.
    cache: Arc<BlockCache>,
    objsets: RwLock<ObjsetMap>,
    /// Object sets created or removed since the last sync: the table must be committed.
    dirty_table: AtomicBool,
    hook: Mutex<Option<Arc<dyn SyncHook>>>,
    /// The L2ARC feed thread runs (while the pool has cache devices).
    feeding: AtomicBool,
    pub(crate) scanner: crate::scan::Scanner,
    /// The devices' error counters and the newest events, kept with the pool (`health.rs`).
    health: crate::health::Health,
    /// Itself, for work the sync thread hands to a thread of its own (a resilver).
    me: std::sync::OnceLock<std::sync::Weak<ObjectStore>>,
    /// Serializes intent log commits (`zil.rs`).
    pub(crate) log_lock: Mutex<()>,
    /// Object set id → the first log block sequence number whose records apply to it (set
    /// when it is rolled back or created), and whether the meta object set must be told.
    floors: Mutex<(BTreeMap<u64, u64>, bool)>,
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
        Self::open_with_arc(pool, crate::arc::global().clone())
    }

    /// Opens with reads through `arc` instead of the process's ARC (tests and benchmarks
    /// that need a cache of their own size).
    pub fn open_with_arc(
        pool: Arc<Pool>,
        arc: Arc<crate::arc::AdaptiveCache>,
    ) -> Result<Arc<Self>, ObjectError> {
        let mode = |id| {
            if id == META_OBJSET {
                ObjsetMode::SyncOnly
            } else {
                ObjsetMode::Normal
            }
        };
        let cache = Arc::new(BlockCache::new(pool.blocks.clone(), arc));
        let mut map = ObjsetMap::new();
        for (id, root) in pool.objsets() {
            map.insert(
                id,
                Arc::new(ObjectSet::open(id, cache.clone(), root, mode(id))),
            );
        }
        let fresh = map.is_empty();
        for id in [META_OBJSET, ROOT_OBJSET] {
            map.entry(id)
                .or_insert_with(|| Arc::new(ObjectSet::open(id, cache.clone(), None, mode(id))));
        }
        let store = Arc::new(Self {
            pool: pool.clone(),
            cache,
            objsets: RwLock::new(map),
            dirty_table: AtomicBool::new(fresh),
            hook: Mutex::new(None),
            feeding: AtomicBool::new(false),
            scanner: crate::scan::Scanner::new(),
            health: crate::health::Health::default(),
            me: std::sync::OnceLock::new(),
            log_lock: Mutex::new(()),
            floors: Mutex::new((BTreeMap::new(), false)),
        });
        let _ = store.me.set(Arc::downgrade(&store));
        for os in store.objsets.read().values() {
            store.watch_errors(os);
        }
        store.scanner.load(&store)?;
        store.health.load(&store)?;
        store.load_floors()?;
        pool.set_syncer(store.clone());
        if fresh {
            pool.wait_synced()?;
        }
        store.cache_devices_changed();
        Ok(store)
    }

    /// Matches the L2ARC's devices with the pool's cache vdevs (at open, and after a cache
    /// device was added or removed), and runs the feed while there are any.
    pub fn cache_devices_changed(self: &Arc<Self>) {
        let l2 = self.cache.l2();
        l2.set_pool_guid(self.pool.guid());
        let tops: Vec<Arc<TopVdev>> = self
            .pool
            .tops()
            .into_iter()
            .filter(|(c, _)| *c == VdevClass::Cache)
            .map(|(_, t)| t)
            .collect();
        let have = l2.device_guids();
        for g in &have {
            if !tops.iter().any(|t| t.guid == *g) {
                l2.remove_device(*g);
            }
        }
        for t in tops {
            if !have.contains(&t.guid) {
                l2.add_device(t);
            }
        }
        if l2.device_guids().is_empty() || self.feeding.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("l2arc_feed".into())
            .spawn(move || Self::feed_thread(weak));
        if spawned.is_err() {
            self.feeding.store(false, Ordering::Release);
        }
    }

    /// Every `l2arc_feed_secs`, one feed round; ends with the pool or its last cache device.
    fn feed_thread(weak: std::sync::Weak<ObjectStore>) {
        loop {
            let secs = crate::l2arc::tunables()
                .feed_secs
                .load(Ordering::Relaxed)
                .clamp(1, 60);
            for _ in 0..secs * 10 {
                std::thread::sleep(std::time::Duration::from_millis(100));
                match weak.upgrade() {
                    Some(s) if !s.pool.is_closed() => {}
                    _ => return,
                }
            }
            let Some(store) = weak.upgrade() else {
                return;
            };
            let l2 = store.cache.l2();
            if l2.device_guids().is_empty() {
                store.feeding.store(false, Ordering::Release);
                return;
            }
            l2.feed(store.cache.arc(), store.cache.spa());
        }
    }

    /// Routes an object set's unrecoverable reads into the pool's error log.
    fn watch_errors(&self, os: &ObjectSet) {
        let me = self.me.get().cloned().unwrap_or_default();
        os.set_error_sink(Arc::new(move |objset, object| {
            if let Some(store) = me.upgrade() {
                store.record_read_error(objset, object);
            }
        }));
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    pub fn blocks(&self) -> &Arc<BlockStore> {
        &self.pool.blocks
    }

    /// Cached reads of this pool's blocks (ARC and L2ARC).
    pub fn cache(&self) -> &Arc<BlockCache> {
        &self.cache
    }

    /// Installs the layer above's sync hook (once, before its first sync task).
    pub fn set_hook(&self, hook: Arc<dyn SyncHook>) {
        *self.hook.lock() = Some(hook);
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

    fn next_id(map: &ObjsetMap) -> u64 {
        map.keys()
            .next_back()
            .map(|k| k + 1)
            .unwrap_or(ROOT_OBJSET + 1)
    }

    /// Creates a new, empty object set (committed with the open txg).
    pub fn create_objset(&self, _tx: &Tx<'_>) -> Result<Arc<ObjectSet>, ObjectError> {
        let mut map = self.objsets.write();
        let id = Self::next_id(&map);
        let os = Arc::new(ObjectSet::open(
            id,
            self.cache.clone(),
            None,
            ObjsetMode::Normal,
        ));
        map.insert(id, os.clone());
        self.dirty_table.store(true, Ordering::Release);
        self.watch_errors(&os);
        self.set_floor(id);
        Ok(os)
    }

    /// Creates an object set in syncing context, empty or sharing the committed tree at
    /// `root` (a clone), with its snapshot txgs set.
    pub fn create_objset_syncing(
        &self,
        root: Option<BlockPtr>,
        prev_snap_txg: u64,
        origin_txg: u64,
    ) -> Result<Arc<ObjectSet>, ObjectError> {
        let mut map = self.objsets.write();
        let id = Self::next_id(&map);
        let os = Arc::new(ObjectSet::open(
            id,
            self.cache.clone(),
            root,
            ObjsetMode::Normal,
        ));
        os.set_snapshot_txgs(prev_snap_txg, origin_txg)?;
        map.insert(id, os.clone());
        self.dirty_table.store(true, Ordering::Release);
        self.watch_errors(&os);
        self.set_floor(id);
        Ok(os)
    }

    /// Removes an object set from the table in syncing context; the caller frees its
    /// blocks (`free_born_after`). Its root as of this txg's sync is returned.
    /// Blocks the intent log wrote for changes of the open txg that are discarded (`txg`
    /// is the one syncing) are freed here.
    pub fn remove_objset_syncing(
        &self,
        id: u64,
        txg: u64,
    ) -> Result<Option<BlockPtr>, ObjectError> {
        assert!(id != META_OBJSET, "the meta object set cannot be removed");
        let os = self
            .objsets
            .write()
            .remove(&id)
            .ok_or(ObjectError::NoSuchObjset(id))?;
        self.dirty_table.store(true, Ordering::Release);
        self.free_orphans(os.unsynced_log_blocks(), txg)?;
        Ok(os.root())
    }

    /// Rolls an object set back to the committed tree at `root` in syncing context (of
    /// `txg`); blocks the intent log wrote for the discarded changes are freed.
    pub fn reset_objset_syncing(
        &self,
        id: u64,
        root: Option<BlockPtr>,
        txg: u64,
    ) -> Result<(), ObjectError> {
        let orphans = self.objset(id)?.reset_to(root);
        self.free_orphans(orphans, txg)?;
        self.dirty_table.store(true, Ordering::Release);
        self.set_floor(id);
        Ok(())
    }

    fn free_orphans(&self, blocks: Vec<BlockPtr>, txg: u64) -> Result<(), ObjectError> {
        for bp in blocks {
            self.pool.blocks.free(&bp, txg)?;
            self.cache.forget(&bp);
        }
        Ok(())
    }

    /// Records of object set `id` logged before now never apply again (it was rolled back
    /// or created anew); committed with the txg being synced or opened.
    fn set_floor(&self, id: u64) {
        let seq = self.pool.zil.floor();
        let mut f = self.floors.lock();
        f.0.insert(id, seq);
        f.1 = true;
    }

    pub(crate) fn log_floors(&self) -> BTreeMap<u64, u64> {
        self.floors.lock().0.clone()
    }

    fn load_floors(&self) -> Result<(), ObjectError> {
        let meta = self.objset(META_OBJSET)?;
        let mut f = self.floors.lock();
        for (id, v) in meta.items(
            crate::zil::ZIL_OBJ,
            crate::zil::KIND_ZIL_FLOOR,
            0,
            u64::MAX,
            usize::MAX,
        )? {
            if v.len() >= 8 {
                f.0.insert(id, u64::from_le_bytes(v[..8].try_into().expect("8")));
            }
        }
        Ok(())
    }

    /// Writes changed floors into the meta object set (syncing context); floors of object
    /// sets that are gone are dropped.
    fn sync_floors(&self) -> Result<(), ObjectError> {
        let (floors, dirty) = {
            let mut f = self.floors.lock();
            let ids = self.objsets.read();
            let before = f.0.len();
            f.0.retain(|id, _| ids.contains_key(id));
            let changed = f.1 || f.0.len() != before;
            f.1 = false;
            (f.0.clone(), changed)
        };
        if !dirty {
            return Ok(());
        }
        let meta = self.objset(META_OBJSET)?;
        let old = meta.items(
            crate::zil::ZIL_OBJ,
            crate::zil::KIND_ZIL_FLOOR,
            0,
            u64::MAX,
            usize::MAX,
        )?;
        for (id, _) in old {
            if !floors.contains_key(&id) {
                meta.remove_item_syncing(crate::zil::ZIL_OBJ, crate::zil::KIND_ZIL_FLOOR, id)?;
            }
        }
        for (id, seq) in floors {
            meta.put_item_syncing(
                crate::zil::ZIL_OBJ,
                crate::zil::KIND_ZIL_FLOOR,
                id,
                &seq.to_le_bytes(),
            )?;
        }
        Ok(())
    }

    /// A read-only object set over the committed tree at `root` (a snapshot), outside the
    /// table: it is never synced.
    pub fn open_snapshot(&self, id: u64, root: Option<BlockPtr>) -> Arc<ObjectSet> {
        Arc::new(ObjectSet::open(
            id,
            self.cache.clone(),
            root,
            ObjsetMode::ReadOnly,
        ))
    }

    /// Every block of the committed tree at `root` born after `min_txg` (nodes and data).
    pub fn blocks_born_after(
        &self,
        root: Option<BlockPtr>,
        min_txg: u64,
    ) -> Result<Vec<BlockPtr>, ObjectError> {
        let mut found = Vec::new();
        let store = self.read_store();
        CowTree::open(root).walk_born_after(&store, min_txg, &mut |bp, _| found.push(*bp))?;
        Ok(found)
    }

    /// Frees, in `txg`, every block of the committed tree at `root` born after `min_txg`
    /// (what no snapshot or origin shares), and returns the space freed.
    pub fn free_born_after(
        &self,
        root: Option<BlockPtr>,
        min_txg: u64,
        txg: u64,
    ) -> Result<Space, ObjectError> {
        let blocks = &self.pool.blocks;
        let mut space = Space::default();
        for bp in self.blocks_born_after(root, min_txg)? {
            space.add(Space::of(blocks, &bp));
            blocks.free(&bp, txg)?;
            self.cache.forget(&bp);
        }
        Ok(space)
    }

    /// Reads of committed trees outside any object set: their nodes are cached as metadata.
    pub(crate) fn read_store(&self) -> ReadStore<'_> {
        ReadStore {
            cache: &self.cache,
            policy: CachePolicy::Metadata,
        }
    }

    /// Starts a transaction charged with `bytes` of new data.
    pub fn begin(&self, bytes: u64) -> Result<Tx<'_>, ObjectError> {
        Ok(self.pool.begin_tx(bytes)?)
    }

    /// Waits until everything done so far is durable (a txg sync).
    pub fn sync(&self) -> Result<(), ObjectError> {
        Ok(self.pool.wait_synced()?)
    }

    fn hook(&self) -> Option<Arc<dyn SyncHook>> {
        self.hook.lock().clone()
    }
}

impl Syncer for ObjectStore {
    fn quiesce(&self, txg: u64) {
        for os in self.objsets.read().values() {
            // The meta object set freezes at the end of the sync (see the module docs).
            if os.id != META_OBJSET {
                os.quiesce(txg);
            }
        }
        if let Some(hook) = self.hook() {
            hook.quiesce(txg);
        }
    }

    fn sync(&self, ctx: &SyncContext<'_>) -> Result<Vec<(u64, Option<BlockPtr>)>, PoolError> {
        self.dirty_table.store(false, Ordering::Release);
        let objsets: Vec<Arc<ObjectSet>> = self
            .objsets
            .read()
            .values()
            .filter(|o| o.id != META_OBJSET)
            .cloned()
            .collect();
        let mut reports = BTreeMap::new();
        for os in &objsets {
            reports.insert(os.id, os.sync(ctx.blocks, ctx.txg, ctx.batch)?);
        }
        if let Some(hook) = self.hook() {
            hook.sync(&HookContext {
                txg: ctx.txg,
                blocks: ctx.blocks,
                batch: ctx.batch,
                store: self,
                reports,
            })?;
        } else {
            // No dataset layer: killed blocks a snapshot would keep cannot exist.
            debug_assert!(reports.values().all(|r| r.dead.is_empty()));
        }
        let meta = self
            .objset(META_OBJSET)
            .map_err(|e| PoolError::Corrupt(e.to_string()))?;
        self.scanner
            .sync(self)
            .map_err(|e| PoolError::Corrupt(e.to_string()))?;
        self.sync_floors()
            .map_err(|e| PoolError::Corrupt(e.to_string()))?;
        self.health
            .sync(self)
            .map_err(|e| PoolError::Corrupt(e.to_string()))?;
        meta.quiesce(ctx.txg);
        meta.sync(ctx.blocks, ctx.txg, ctx.batch)?;
        let all: Vec<Arc<ObjectSet>> = self.objsets.read().values().cloned().collect();
        let table = all.iter().map(|os| (os.id, os.root())).collect();
        // Wait for the writes (the pool checks the failures), then let go of the bytes.
        let _ = ctx.batch.wait();
        ctx.blocks.check_writable()?;
        for os in &all {
            os.writes_completed();
        }
        Ok(table)
    }

    fn closing(&self) {
        self.scan_suspend();
        self.cache.arc().remove_spa(self.cache.spa());
    }

    fn devices_changed(&self) {
        if let Some(me) = self.me.get().and_then(std::sync::Weak::upgrade) {
            // Not on the sync thread: the resilver waits for the scan thread it replaces.
            std::thread::spawn(move || {
                let _ = me.resilver_start();
            });
        }
    }

    fn is_dirty(&self) -> bool {
        self.dirty_table.load(Ordering::Acquire)
            || self.objsets.read().values().any(|o| o.is_dirty())
            || self.hook().is_some_and(|h| h.is_dirty())
            || self.scanner.is_dirty()
            || self.floors.lock().1
            || self.health.is_dirty(self)
    }
}
