//! Helpers for tests of the dataset directory with filesystems on its datasets: pools opened
//! with their `Dsl`, datasets mounted as `Fs` (held, as a mount holds them), snapshots opened
//! read-only, a path-keyed view of a filesystem, and two checks that recompute what the
//! dataset directory says from the trees themselves:
//!
//! - `check_accounting`: `referenced`, `usedbydataset`, `written`, `usedbysnapshots`, each
//!   snapshot's `used`, `referenced` and `written`, and `used` as the sum of its parts
//!   (`usedbychildren` included), from the blocks
//!   each head's and snapshot's tree reaches (birth txgs say who owns what);
//! - `pool_usage`: the pool's allocated space (deferred frees aside) is exactly the space of
//!   the distinct blocks reachable from the pool's root: its own metadata, the meta object
//!   set, every dataset's and every snapshot's tree (nothing leaked, nothing freed early).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use tank_block::BlockPtr;
use tank_dataset::posix::{Fs, ROOT_INO};
use tank_dataset::{DatasetKind, DsHooks, Dsl, DslError, Op};
use tank_device::DeviceRef;
use tank_object::{ObjectSet, ObjectStore, META_OBJSET};
use tank_pool::Pool;

use super::{fsck_objset, import_devs, Content, Image};

/// What a path of a filesystem holds (contents only: the dataset tests model no metadata).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    Dir,
    File(Vec<u8>),
}

/// A filesystem as paths ("a", "d/b") to what they hold.
pub type Tree = BTreeMap<String, Entry>;

/// The filesystem's tree by path, after `fsck` (consistency of every inode) passed. Only
/// directories and regular files are expected.
pub fn tree_of(fs: &Fs, objset: &ObjectSet) -> Result<Tree, String> {
    let image = fsck_objset(fs, objset, false)?;
    tree_of_image(&image)
}

fn tree_of_image(image: &Image) -> Result<Tree, String> {
    let mut out = Tree::new();
    let mut stack = vec![(ROOT_INO, String::new())];
    while let Some((ino, path)) = stack.pop() {
        let Content::Dir(entries) = &image[&ino].content else {
            return Err(format!("{path}: not a directory"));
        };
        for (name, child) in entries {
            let name = String::from_utf8(name.clone()).map_err(|e| e.to_string())?;
            let p = if path.is_empty() {
                name
            } else {
                format!("{path}/{name}")
            };
            match &image[child].content {
                Content::Dir(_) => {
                    out.insert(p.clone(), Entry::Dir);
                    stack.push((*child, p));
                }
                Content::File(d) => {
                    out.insert(p, Entry::File(d.clone()));
                }
                other => return Err(format!("{p}: unexpected {other:?}")),
            }
        }
    }
    Ok(out)
}

/// The differences between two trees, briefly (for failure messages).
pub fn diff_trees(want: &Tree, got: &Tree) -> String {
    let show = |e: Option<&Entry>| match e {
        None => "nothing".to_string(),
        Some(Entry::Dir) => "a directory".to_string(),
        Some(Entry::File(d)) => format!("a file of {} bytes", d.len()),
    };
    let mut out = Vec::new();
    let paths: std::collections::BTreeSet<&String> = want.keys().chain(got.keys()).collect();
    for p in paths {
        let (w, g) = (want.get(p), got.get(p));
        if w == g {
            continue;
        }
        let mut line = format!("{p}: want {} got {}", show(w), show(g));
        if let (Some(Entry::File(a)), Some(Entry::File(b))) = (w, g) {
            if let Some(i) = a.iter().zip(b.iter()).position(|(x, y)| x != y) {
                line.push_str(&format!(", first difference at byte {i}"));
            }
        }
        out.push(line);
    }
    out.truncate(8);
    out.join("; ")
}

/// A pool with its dataset directory open.
pub struct DsPool {
    pub devs: Vec<DeviceRef>,
    pub pool: Arc<Pool>,
    pub store: Arc<ObjectStore>,
    pub dsl: Arc<Dsl>,
}

impl DsPool {
    /// Opens the dataset directory of a pool just created or imported.
    pub fn new(devs: Vec<DeviceRef>, pool: Arc<Pool>, store: Arc<ObjectStore>) -> DsPool {
        let dsl = Dsl::open(store.clone()).expect("open the dataset directory");
        DsPool {
            devs,
            pool,
            store,
            dsl,
        }
    }

    /// A new pool on one simulated device of `size` bytes.
    pub fn on_sim(fleet: &tank_device::SimFleet, size: u64) -> DsPool {
        let (devs, pool, store) = super::sim_pool(fleet, 1, size);
        let devs = devs.into_iter().map(|d| Arc::new(d) as DeviceRef).collect();
        DsPool::new(devs, pool, store)
    }

    /// Imports the pool on `devs` and opens its dataset directory.
    pub fn import(devs: Vec<DeviceRef>) -> Result<DsPool, String> {
        let (pool, store) = import_devs(&devs, false)?;
        let dsl = Dsl::open(store.clone()).map_err(|e| format!("open the directory: {e}"))?;
        Ok(DsPool {
            devs,
            pool,
            store,
            dsl,
        })
    }

    /// Exports the pool; its devices, to import again.
    pub fn export(self) -> Vec<DeviceRef> {
        let DsPool {
            devs,
            pool,
            store,
            dsl,
        } = self;
        drop(dsl);
        drop(store);
        pool.export().expect("export");
        devs
    }

    pub fn id(&self, name: &str) -> u64 {
        self.dsl
            .resolve(name)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    /// A numeric property as `info` shows it.
    pub fn prop(&self, name: &str, prop: &str) -> u64 {
        prop_of(&self.dsl, self.id(name), prop)
    }

    /// Mounts a filesystem dataset (holding it, as a mount does).
    pub fn mount(&self, name: &str) -> Result<Mounted, String> {
        let id = self.dsl.resolve(name).map_err(|e| e.to_string())?;
        self.dsl.hold(id, "mounted").map_err(|e| e.to_string())?;
        let objset = self.dsl.objset(id).map_err(|e| e.to_string())?;
        let hooks = Arc::new(DsHooks {
            dsl: self.dsl.clone(),
            id,
            snapshot: false,
        });
        match Fs::mount(self.store.clone(), objset.clone(), hooks, (0, 0)) {
            Ok(fs) => Ok(Mounted { id, fs, objset }),
            Err(e) => {
                self.dsl.release(id);
                Err(format!("mount {name}: {e:?}"))
            }
        }
    }

    pub fn unmount(&self, m: Mounted) {
        self.dsl.release(m.id);
    }

    /// The tree of snapshot `id`, through the POSIX layer on its read-only object set (an
    /// object set never mounted, and so never formatted, is an empty tree).
    pub fn snapshot_tree(&self, id: u64) -> Result<Tree, String> {
        let objset = self.dsl.snapshot_objset(id).map_err(|e| e.to_string())?;
        if never_mounted(&objset)? {
            return Ok(Tree::new());
        }
        let hooks = Arc::new(DsHooks {
            dsl: self.dsl.clone(),
            id,
            snapshot: true,
        });
        let fs = Fs::mount(self.store.clone(), objset.clone(), hooks, (0, 0))
            .map_err(|e| format!("mount snapshot {}: {e:?}", self.dsl.name_of(id)))?;
        tree_of(&fs, &objset)
    }

    /// The tree of a filesystem dataset, mounted for the walk (unless it was never
    /// mounted: the walk must not change it by formatting it).
    pub fn dataset_tree(&self, name: &str) -> Result<Tree, String> {
        let id = self.dsl.resolve(name).map_err(|e| e.to_string())?;
        let objset = self.dsl.objset(id).map_err(|e| e.to_string())?;
        if never_mounted(&objset)? {
            return Ok(Tree::new());
        }
        let m = self.mount(name)?;
        let t = tree_of(&m.fs, &m.objset);
        self.unmount(m);
        t
    }

    /// Every dataset and snapshot by full name, for comparing whole directories.
    pub fn names(&self) -> Vec<String> {
        self.dsl
            .all_ids()
            .into_iter()
            .map(|id| self.dsl.name_of(id))
            .collect()
    }
}

/// An object set without objects: the POSIX layer has not formatted it yet.
fn never_mounted(objset: &ObjectSet) -> Result<bool, String> {
    Ok(objset
        .list_objects(1, 1)
        .map_err(|e| e.to_string())?
        .is_empty())
}

/// A mounted filesystem dataset.
pub struct Mounted {
    pub id: u64,
    pub fs: Arc<Fs>,
    pub objset: Arc<ObjectSet>,
}

pub fn prop_of(dsl: &Dsl, id: u64, prop: &str) -> u64 {
    let info = dsl.info(id).unwrap_or_else(|e| panic!("info {id}: {e}"));
    let v = info
        .prop(prop)
        .unwrap_or_else(|| panic!("{}: no property {prop}", info.name));
    v.parse()
        .unwrap_or_else(|_| panic!("{} {prop} = {v}", info.name))
}

// ---- sync tasks ----

pub fn create_op(name: &str) -> Op {
    Op::Create {
        name: name.into(),
        kind: DatasetKind::Filesystem,
        props: vec![],
        parents: false,
    }
}

pub fn snapshot_op(name: &str, recursive: bool) -> Op {
    Op::Snapshot {
        names: vec![name.into()],
        recursive,
    }
}

pub fn destroy_op(name: &str, recursive: bool) -> Op {
    Op::Destroy {
        name: name.into(),
        recursive,
        dependents: false,
    }
}

pub fn rollback_op(snapshot: &str, destroy_later: bool) -> Op {
    Op::Rollback {
        snapshot: snapshot.into(),
        destroy_later,
    }
}

pub fn clone_op(snapshot: &str, target: &str) -> Op {
    Op::Clone {
        snapshot: snapshot.into(),
        target: target.into(),
        props: vec![],
    }
}

pub fn rename_op(from: &str, to: &str) -> Op {
    Op::Rename {
        from: from.into(),
        to: to.into(),
    }
}

// ---- accounting ----

/// A block's identity: where its first copy is.
fn block_key(bp: &BlockPtr) -> (u32, u64) {
    (bp.dvas[0].vdev, bp.dvas[0].offset)
}

/// The blocks of a committed tree (nodes and data).
fn tree_blocks(store: &ObjectStore, root: Option<BlockPtr>) -> Result<Vec<BlockPtr>, String> {
    store.blocks_born_after(root, 0).map_err(|e| e.to_string())
}

struct TreeSpace {
    keys: HashSet<(u32, u64)>,
    blocks: Vec<BlockPtr>,
}

impl TreeSpace {
    fn of(store: &ObjectStore, root: Option<BlockPtr>) -> Result<TreeSpace, String> {
        let blocks = tree_blocks(store, root)?;
        Ok(TreeSpace {
            keys: blocks.iter().map(block_key).collect(),
            blocks,
        })
    }

    /// dsize of the blocks born after `txg` (logical size too).
    fn born_after(&self, store: &ObjectStore, txg: u64) -> (u64, u64) {
        self.blocks
            .iter()
            .filter(|b| b.birth_txg > txg)
            .fold((0, 0), |(d, l), b| {
                (d + store.blocks().dsize(b), l + u64::from(b.lsize))
            })
    }
}

/// Recomputes every head's and snapshot's space from the trees and compares it with what
/// the dataset directory says. The pool must be synced (no change in flight).
pub fn check_accounting(dsl: &Dsl, store: &ObjectStore) -> Result<(), String> {
    let ids = dsl.all_ids();
    let err = |e: DslError| e.to_string();
    let mut used_of: HashMap<u64, u64> = HashMap::new();
    // Children before parents: a parent's usedbychildren sums its children's used.
    for &id in ids.iter().rev() {
        let r = dsl.record(id).map_err(err)?;
        if r.kind == DatasetKind::Snapshot {
            continue;
        }
        let name = dsl.name_of(id);
        let p = |prop: &str| prop_of(dsl, id, prop);
        let bad = |what: &str, said: u64, real: u64| {
            Err(format!(
                "{name}: {what} is {said} but its blocks say {real}"
            ))
        };
        let head = TreeSpace::of(store, dsl.objset(id).map_err(err)?.root())?;
        let (referenced, lreferenced) = head.born_after(store, 0);
        if r.referenced != referenced || p("referenced") != referenced {
            return bad("referenced", r.referenced, referenced);
        }
        if p("logicalreferenced") != lreferenced {
            return bad("logicalreferenced", p("logicalreferenced"), lreferenced);
        }
        let (unique, _) = head.born_after(store, r.origin_txg);
        if p("usedbydataset") != unique {
            return bad("usedbydataset", p("usedbydataset"), unique);
        }
        let snaps = dsl.snapshots(id);
        let mut trees = Vec::new();
        for &s in &snaps {
            let root = dsl.snapshot_objset(s).map_err(err)?.root();
            trees.push((s, TreeSpace::of(store, root)?));
        }
        let prev_txg = match snaps.last() {
            Some(s) => dsl.record(*s).map_err(err)?.txg,
            None => r.origin_txg,
        };
        let (written, _) = head.born_after(store, prev_txg);
        if p("written") != written {
            return bad("written", p("written"), written);
        }
        // Snapshots: referenced, and used = what only this one holds.
        let mut only_snaps: HashMap<(u32, u64), u64> = HashMap::new();
        for (i, (s, t)) in trees.iter().enumerate() {
            let sname = dsl.name_of(*s);
            let sr = dsl.record(*s).map_err(err)?;
            let (sref, _) = t.born_after(store, 0);
            if sr.referenced != sref || prop_of(dsl, *s, "referenced") != sref {
                return Err(format!(
                    "{sname}: referenced is {} but its blocks say {sref}",
                    sr.referenced
                ));
            }
            let prev_txg = match i {
                0 => r.origin_txg,
                _ => dsl.record(trees[i - 1].0).map_err(err)?.txg,
            };
            let (swritten, _) = t.born_after(store, prev_txg);
            if prop_of(dsl, *s, "written") != swritten {
                return Err(format!(
                    "{sname}: written is {} but its blocks say {swritten}",
                    prop_of(dsl, *s, "written")
                ));
            }
            let prev = if i > 0 { Some(&trees[i - 1].1) } else { None };
            let next = trees.get(i + 1).map_or(&head, |(_, t)| t);
            let mut own = 0;
            for b in t.blocks.iter().filter(|b| b.birth_txg > r.origin_txg) {
                let k = block_key(b);
                if !head.keys.contains(&k) {
                    only_snaps.insert(k, store.blocks().dsize(b));
                }
                if !next.keys.contains(&k) && !prev.is_some_and(|p| p.keys.contains(&k)) {
                    own += store.blocks().dsize(b);
                }
            }
            let said = prop_of(dsl, *s, "used");
            if said != own {
                return Err(format!(
                    "{sname}: used is {said} but only it holds {own} bytes"
                ));
            }
        }
        let by_snaps: u64 = only_snaps.values().sum();
        if p("usedbysnapshots") != by_snaps {
            return bad("usedbysnapshots", p("usedbysnapshots"), by_snaps);
        }
        let mut children = 0;
        for &c in &ids {
            let cr = dsl.record(c).map_err(err)?;
            if cr.parent == id && cr.kind != DatasetKind::Snapshot {
                let resv = prop_of(dsl, c, "reservation");
                children += used_of[&c].max(resv);
            }
        }
        if p("usedbychildren") != children {
            return bad("usedbychildren", p("usedbychildren"), children);
        }
        let used = p("used");
        let parts = unique + by_snaps + children + p("usedbyrefreservation");
        if used != parts {
            return Err(format!(
                "{name}: used {used} is not the sum of its parts {parts}"
            ));
        }
        used_of.insert(id, used);
    }
    Ok(())
}

/// Every head's object set writes as its effective properties say (inherited values
/// included, e.g. after a rename moved it below another parent).
pub fn check_policies(dsl: &Dsl) -> Result<(), String> {
    use tank_dataset::props;
    for id in dsl.all_ids() {
        let r = dsl.record(id).map_err(|e| e.to_string())?;
        if r.kind == DatasetKind::Snapshot {
            continue;
        }
        let get = |p: &str| dsl.prop(id, p).map_err(|e| e.to_string());
        let want = tank_object::WritePolicy {
            checksum: props::checksum_of(&get("checksum")?),
            compression: props::compression_of(&get("compression")?),
            copies: get("copies")?.parse().map_err(|_| "copies".to_string())?,
        };
        let got = dsl.objset(id).map_err(|e| e.to_string())?.policy();
        if got != want {
            return Err(format!(
                "{}: writes with {got:?}, its properties say {want:?}",
                dsl.name_of(id)
            ));
        }
    }
    Ok(())
}

/// The pool's allocated space, and where it goes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolUsage {
    /// Allocated, less frees waiting to be reusable.
    pub live: u64,
    /// Distinct blocks of every head's and snapshot's tree.
    pub datasets: u64,
    /// The meta object set's tree (dataset directory and deadlists).
    pub meta: u64,
    /// Root block, objset table, space map log and history.
    pub pool: u64,
}

/// Accounts for every allocated byte of the pool (see the module documentation); Err when
/// the allocator holds more or less than the pool reaches. The pool must be synced.
pub fn pool_usage(pool: &Pool, store: &ObjectStore, dsl: &Dsl) -> Result<PoolUsage, String> {
    let mut snapshots = Vec::new();
    for id in dsl.all_ids() {
        if dsl.record(id).map_err(|e| e.to_string())?.kind == DatasetKind::Snapshot {
            snapshots.push(dsl.snapshot_objset(id).map_err(|e| e.to_string())?.root());
        }
    }
    usage_with(pool, store, snapshots)
}

/// [`pool_usage`] of a pool used without a dataset directory (the POSIX layer on the root
/// object set, as the POSIX and intent-log tests mount it): no snapshots.
pub fn store_usage(pool: &Pool, store: &ObjectStore) -> Result<PoolUsage, String> {
    usage_with(pool, store, Vec::new())
}

fn usage_with(
    pool: &Pool,
    store: &ObjectStore,
    snapshots: Vec<Option<BlockPtr>>,
) -> Result<PoolUsage, String> {
    let mut seen: HashSet<(u32, u64)> = HashSet::new();
    let blocks = store.blocks().clone();
    // A block's copies, and for a gang block its header's copies and (through the header)
    // every piece's, each counted once.
    let mut add = |bp: &BlockPtr| -> Result<u64, String> {
        let mut todo = vec![*bp];
        let mut sum = 0;
        while let Some(bp) = todo.pop() {
            sum += bp
                .dvas()
                .filter(|d| seen.insert((d.vdev, d.offset)))
                .map(|d| d.asize)
                .sum::<u64>();
            if bp.gang {
                todo.extend(blocks.gang_pieces(&bp).map_err(|e| e.to_string())?);
            }
        }
        Ok(sum)
    };
    let mut usage = PoolUsage::default();
    let (root_bp, info) = pool.root();
    let info = info.ok_or("no root block")?;
    let mut pool_blocks: Vec<BlockPtr> = root_bp.into_iter().collect();
    pool_blocks.extend(info.objset_table);
    pool_blocks.extend(pool.spacemap_chain());
    let mut hist = info.history_head;
    while let Some(bp) = hist {
        pool_blocks.push(bp);
        let raw = store.blocks().read(&bp).map_err(|e| e.to_string())?;
        hist =
            BlockPtr::decode(&raw[16..16 + tank_block::BLKPTR_SIZE]).map_err(|e| e.to_string())?;
    }
    for bp in &pool_blocks {
        usage.pool += add(bp)?;
    }
    let meta = store.objset(META_OBJSET).map_err(|e| e.to_string())?;
    for bp in tree_blocks(store, meta.root())? {
        usage.meta += add(&bp)?;
    }
    let mut roots = Vec::new();
    for id in store.objset_ids() {
        if id != META_OBJSET {
            roots.push(store.objset(id).map_err(|e| e.to_string())?.root());
        }
    }
    roots.extend(snapshots);
    for root in roots {
        for bp in tree_blocks(store, root)? {
            usage.datasets += add(&bp)?;
        }
    }
    let space = pool.space();
    usage.live = space.allocated - space.deferred;
    // The intent log's region in the pool (allocated once, referenced by the root block).
    if let Some(r) = pool.zil.pool_region() {
        usage.pool += r.end - r.start;
    }
    let reached = usage.datasets + usage.meta + usage.pool;
    if usage.live != reached {
        return Err(format!(
            "the pool holds {} allocated bytes but reaches {reached} ({usage:?}): {}",
            usage.live,
            if usage.live > reached {
                "space leaked"
            } else {
                "blocks in use were freed"
            }
        ));
    }
    Ok(usage)
}

// ---- a model of the datasets ----

/// A snapshot as the model freezes it.
#[derive(Debug, Clone, PartialEq)]
pub struct Snap {
    pub name: String,
    pub tree: Tree,
}

/// A filesystem dataset as the model sees it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Ds {
    pub tree: Tree,
    /// Oldest first.
    pub snaps: Vec<Snap>,
    /// A clone's origin snapshot (full name).
    pub origin: Option<String>,
}

/// Every filesystem dataset below the pool's root dataset, by full name.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Model {
    pub ds: BTreeMap<String, Ds>,
}

impl Model {
    /// Datasets that are `name` or below it.
    pub fn subtree(&self, name: &str) -> Vec<String> {
        let below = format!("{name}/");
        self.ds
            .keys()
            .filter(|k| *k == name || k.starts_with(&below))
            .cloned()
            .collect()
    }

    /// Every clone.
    pub fn clones(&self) -> Vec<String> {
        self.ds
            .iter()
            .filter(|(_, d)| d.origin.is_some())
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Every snapshot as (dataset, snapshot name).
    pub fn snapshots(&self) -> Vec<(String, String)> {
        self.ds
            .iter()
            .flat_map(|(k, d)| d.snaps.iter().map(move |s| (k.clone(), s.name.clone())))
            .collect()
    }

    pub fn clones_of(&self, snap: &str) -> Vec<String> {
        self.ds
            .iter()
            .filter(|(_, d)| d.origin.as_deref() == Some(snap))
            .map(|(k, _)| k.clone())
            .collect()
    }

    pub fn has_clones(&self, ds: &str, snaps: &[Snap]) -> bool {
        snaps
            .iter()
            .any(|s| !self.clones_of(&format!("{ds}@{}", s.name)).is_empty())
    }

    /// Freezes the current tree of `ds` as snapshot `name`.
    pub fn snapshot(&mut self, ds: &str, name: &str) {
        let d = self.ds.get_mut(ds).expect("dataset in the model");
        let tree = d.tree.clone();
        d.snaps.push(Snap {
            name: name.to_string(),
            tree,
        });
    }

    /// A new clone `target` of snapshot `origin` (dataset@name), with its contents.
    pub fn add_clone(&mut self, origin: &str, target: &str) {
        let tree = self.snapshot_tree(origin).clone();
        self.ds.insert(
            target.to_string(),
            Ds {
                tree,
                snaps: vec![],
                origin: Some(origin.to_string()),
            },
        );
    }

    /// The frozen tree of snapshot `full` (dataset@name).
    pub fn snapshot_tree(&self, full: &str) -> &Tree {
        let (ds, snap) = full.split_once('@').expect("a snapshot name");
        &self.ds[ds]
            .snaps
            .iter()
            .find(|s| s.name == snap)
            .expect("snapshot in the model")
            .tree
    }
}

/// Whether the pool shows the model: the same datasets, snapshots (in order) and origins,
/// every dataset's tree (through its mount in `mounts`, or mounted for the walk) and every
/// snapshot's (read-only).
pub fn matches(p: &DsPool, m: &Model, mounts: &BTreeMap<String, Mounted>) -> Result<(), String> {
    let root = p.dsl.name_of(tank_dataset::dsl::ROOT_ID);
    let mut want: Vec<String> = vec![root];
    for (k, d) in &m.ds {
        want.push(k.clone());
        want.extend(d.snaps.iter().map(|s| format!("{k}@{}", s.name)));
    }
    want.sort();
    let mut got = p.names();
    got.sort();
    if got != want {
        return Err(format!("datasets {got:?}, model {want:?}"));
    }
    for (k, d) in &m.ds {
        let id = p.id(k);
        let info = p.dsl.info(id).map_err(|e| e.to_string())?;
        let origin = info.prop("origin").unwrap_or("-");
        if origin != d.origin.as_deref().unwrap_or("-") {
            return Err(format!("{k}: origin {origin}, model {:?}", d.origin));
        }
        let mut snaps = Vec::new();
        for s in p.dsl.snapshots(id) {
            snaps.push(p.dsl.record(s).map_err(|e| e.to_string())?.name);
        }
        let model: Vec<String> = d.snaps.iter().map(|s| s.name.clone()).collect();
        if snaps != model {
            return Err(format!("{k}: snapshots {snaps:?}, model {model:?}"));
        }
        let tree = match mounts.get(k) {
            Some(mt) => tree_of(&mt.fs, &mt.objset)?,
            None => p.dataset_tree(k)?,
        };
        if tree != d.tree {
            return Err(format!("{k}: {}", diff_trees(&d.tree, &tree)));
        }
        for s in &d.snaps {
            let sname = format!("{k}@{}", s.name);
            let t = p.snapshot_tree(p.id(&sname))?;
            if t != s.tree {
                return Err(format!("{sname}: {}", diff_trees(&s.tree, &t)));
            }
        }
    }
    Ok(())
}

// ---- paths ----

pub fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

/// (parent directory, last component) of a path.
pub fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or(("", path))
}

/// The inode at `path` ("" is the root).
pub fn lookup(fs: &Fs, path: &str) -> Result<tank_dataset::posix::Ino, tank_dataset::Errno> {
    let root = tank_dataset::posix::Cred::root();
    let mut ino = ROOT_INO;
    for c in path.split('/').filter(|c| !c.is_empty()) {
        ino = fs.lookup(&root, ino, super::os(c))?.ino;
    }
    Ok(ino)
}

/// What a write of `data` at `off` does to the file at `path` (created if missing).
pub fn apply_write(tree: &mut Tree, path: &str, off: usize, data: &[u8]) {
    let e = tree
        .entry(path.to_string())
        .or_insert(Entry::File(Vec::new()));
    let Entry::File(d) = e else {
        panic!("{path} is a directory")
    };
    if d.len() < off + data.len() {
        d.resize(off + data.len(), 0);
    }
    d[off..off + data.len()].copy_from_slice(data);
}
