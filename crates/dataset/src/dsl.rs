//! The dataset directory (ZFS's dsl): datasets in a tree with inherited properties,
//! snapshots, clones, rollback, and exact space accounting.
//!
//! # Theory of operation
//! Every dataset, snapshot included, is a `Record` in the meta object set (docs/FORMAT.md
//! §"Dataset directory"). A filesystem or volume owns an object set; a snapshot owns only
//! the root pointer of its dataset's tree as of the txg it was taken in.
//!
//! Every change to the directory is a *sync task*: the caller queues it under a transaction
//! (which binds it to the open txg), waits for that txg to sync, and gets the result. The
//! tasks run in syncing context (`SyncHook::sync`) after the datasets' trees were written,
//! so a snapshot sees exactly the committed state of its txg and every change of a task
//! commits atomically with it. A task validates everything before it changes anything: a
//! refused task leaves the directory as it was.
//!
//! **Block lifetimes** follow ZFS's birth-time scheme. A head dataset's object set knows
//! `prev_snap_txg` (its latest snapshot's txg) and `origin_txg` (a clone's origin). A block
//! it kills is freed when born after `prev_snap_txg`, goes to the head's *deadlist* when a
//! snapshot still references it, and is left to the origin when born at or before
//! `origin_txg`. Taking a snapshot hands the head's deadlist to the snapshot. Destroying a
//! snapshot S (previous P, next N) frees the entries of N's deadlist born after P and moves
//! S's deadlist into N's. Rollback frees what the head's tree holds born after the
//! snapshot and empties the head's deadlist (its blocks are live again). So a block is
//! freed exactly when nothing references it, and `usedbysnapshots` is the sum of the
//! deadlists: the bytes only snapshots hold.
//!
//! **Accounting.** Each sync's `SyncReport` per object set updates the head's counters:
//! `referenced` (every block of its tree), `unique` (those born after its origin, i.e.
//! `usedbydataset`), `written` (born since the latest snapshot), and the deadlist totals.
//! A snapshot keeps the `written` it was taken with (born since the one before it);
//! destroying it adds that to its successor's, less what the destroy freed.
//! Sizes are `dsize`: allocated bytes deflated by parity, the units of usable capacity.
//!
//! # Concurrency
//! `state` is one mutex: open-context readers take it briefly; the sync hook holds it
//! while it accounts and runs tasks. Tasks wait for their txg without holding it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{mpsc, Arc};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tank_block::blkptr::hex;
use tank_block::BlockPtr;
use tank_object::cache::CachePolicy;
use tank_object::{
    HookContext, ObjectError, ObjectSet, ObjectStore, Space, SyncHook, SyncReport, WritePolicy,
    META_OBJSET, ROOT_OBJSET,
};
use tank_pool::config::now_secs;
use tank_pool::PoolError;

use crate::props::{self, PropDef};

mod sendrecv;
pub use sendrecv::RecvBegin;

/// The dataset directory lives in these items of the meta object set.
pub const DIR_OBJ: u64 = 1;
pub const KIND_DIR_HEADER: u8 = 16;
pub const KIND_DIR_RECORD: u8 = 17;
pub const KIND_DEADLIST_HEADER: u8 = 18;
pub const KIND_DEADLIST_ENTRIES: u8 = 19;
/// Deadlist `n`'s entries are items of object `DEADLIST_OBJ_BASE + n`.
pub const DEADLIST_OBJ_BASE: u64 = 1 << 40;
/// Block pointers per deadlist item (24 x 128 bytes fits an inline item).
const BPS_PER_ITEM: usize = 24;
pub const DIR_VERSION: u32 = 1;
/// Longest full dataset name (pool/a/b@snap), as ZFS's ZFS_MAX_DATASET_NAME_LEN - 1.
pub const NAME_MAX: usize = 255;
pub const ROOT_ID: u64 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DatasetKind {
    Filesystem,
    Volume,
    Snapshot,
}

impl DatasetKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::Filesystem => "filesystem",
            Self::Volume => "volume",
            Self::Snapshot => "snapshot",
        }
    }
}

/// One dataset as stored (JSON in an item of the meta object set).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    pub id: u64,
    /// The parent dataset (for a snapshot: its dataset); 0 for the root.
    pub parent: u64,
    /// The last component of the name ("" for the root, whose name is the pool's).
    pub name: String,
    pub kind: DatasetKind,
    /// The object set of a filesystem or volume; 0 for a snapshot.
    pub objset: u64,
    /// A snapshot's tree root (hex of the 128-byte block pointer; absent for empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
    /// Creation txg (for a snapshot: the txg whose state it holds).
    pub txg: u64,
    /// Creation time, seconds since 1970.
    pub creation: u64,
    /// Head: its latest snapshot; snapshot: the one before it; 0 for none.
    pub prev_snap: u64,
    /// A clone's origin snapshot, and that snapshot's txg; 0 otherwise.
    pub origin: u64,
    pub origin_txg: u64,
    pub deadlist: u64,
    /// Local property values, normalized.
    pub props: BTreeMap<String, String>,
    /// Space of every block of the tree (dsize and logical).
    pub referenced: u64,
    pub lreferenced: u64,
    /// Space of the blocks born after the origin (usedbydataset).
    pub unique: u64,
    pub lunique: u64,
    /// Space of the blocks of the tree born after the previous snapshot (a head's latest
    /// one, a snapshot's previous one, else the origin).
    pub written: u64,
    /// A snapshot's clones.
    #[serde(default)]
    pub clones: Vec<u64>,
    /// How a filesystem or volume is shared (`tank share`): kept with the dataset, as ZFS
    /// keeps `sharenfs` and `sharesmb`, so shares move with the pool. Never on a snapshot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shares: Vec<Share>,
    /// A globally unique id: a snapshot keeps it on every pool a stream carries it to, so
    /// an incremental stream names its base by it. Records written before guids have none
    /// stored; `load` derives a stable one.
    #[serde(default)]
    pub guid: u64,
    /// A head's bookmarks: an incremental base that outlives its snapshot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bookmarks: Vec<Bookmark>,
    /// A receive into this head that has not finished (the dataset is inconsistent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recv: Option<RecvState>,
    /// Snapshots the daemon takes and prunes on its own (`tank schedule`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<crate::autosnap::Schedule>,
}

/// A bookmark (`POOL/DS#NAME`): the guid and txg of a snapshot, enough to be the base of an
/// incremental stream (which is found from birth times alone) after the snapshot is gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bookmark {
    pub name: String,
    pub guid: u64,
    pub txg: u64,
    pub creation: u64,
}

/// A receive in progress (`recv.rs`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecvState {
    /// The stream's base guid (0: a full stream) and the snapshot it carries.
    pub from_guid: u64,
    pub to_guid: u64,
    pub to_name: String,
    pub snapshot: String,
    pub creation: u64,
    /// The receive created this dataset (an abort destroys it rather than rolling back).
    pub created: bool,
    /// `receive -s`: an interrupted receive is kept and publishes a resume token.
    pub resumable: bool,
    pub compressed: bool,
    /// The replication stream (`send -R`) this receive is part of, and its place there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicate: Option<crate::stream::Replicate>,
    #[serde(default)]
    pub part: u64,
}

/// One share of a dataset: a protocol, a name unique among the shares of every pool, and the
/// protocol's options (who may use it among them). The service layer checks them; this layer
/// keeps them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Share {
    pub protocol: String,
    pub name: String,
    #[serde(default)]
    pub options: BTreeMap<String, String>,
}

impl Record {
    fn root_bp(&self) -> Result<Option<BlockPtr>, DslError> {
        match &self.root {
            None => Ok(None),
            Some(h) => {
                let raw = unhex(h).ok_or_else(|| DslError::Corrupt("snapshot root".into()))?;
                BlockPtr::decode(&raw).map_err(|e| DslError::Corrupt(e.to_string()))
            }
        }
    }
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
struct DirHeader {
    version: u32,
    next_id: u64,
    next_deadlist: u64,
}

/// A deadlist's totals (32 bytes LE: next_seq, count, dsize, lsize).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct DeadlistHeader {
    next_seq: u64,
    count: u64,
    dsize: u64,
    lsize: u64,
}

/// For the fuzz target: the dataset directory's records (its header, a dataset record, a
/// deadlist header) from arbitrary bytes.
pub(crate) fn fuzz_records(data: &[u8]) {
    let _ = serde_json::from_slice::<DirHeader>(data);
    let _ = serde_json::from_slice::<Record>(data);
    let _ = DeadlistHeader::decode(data);
}

impl DeadlistHeader {
    fn encode(&self) -> Vec<u8> {
        [self.next_seq, self.count, self.dsize, self.lsize]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect()
    }

    fn decode(b: &[u8]) -> Result<Self, DslError> {
        if b.len() != 32 {
            return Err(DslError::Corrupt("deadlist header".into()));
        }
        let at = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8"));
        Ok(Self {
            next_seq: at(0),
            count: at(1),
            dsize: at(2),
            lsize: at(3),
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DslError {
    #[error("dataset '{0}' does not exist")]
    NotFound(String),
    #[error("dataset '{0}' already exists")]
    Exists(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Busy(String),
    #[error("{0}")]
    NoSpace(String),
    #[error("{0}")]
    CrossPool(String),
    #[error("corrupt dataset directory: {0}")]
    Corrupt(String),
    #[error(transparent)]
    Object(#[from] ObjectError),
    #[error(transparent)]
    Pool(#[from] PoolError),
}

impl DslError {
    pub fn errno(&self) -> i32 {
        match self {
            Self::NotFound(_) => libc::ENOENT,
            Self::Exists(_) => libc::EEXIST,
            Self::Invalid(_) => libc::EINVAL,
            Self::Busy(_) => libc::EBUSY,
            Self::NoSpace(_) => libc::ENOSPC,
            Self::CrossPool(_) => libc::EXDEV,
            Self::Corrupt(_) => libc::EIO,
            Self::Object(e) => e.errno(),
            Self::Pool(e) => e.errno(),
        }
    }
}

type Res<T> = Result<T, DslError>;

/// A fresh random guid (never 0).
pub fn new_guid() -> u64 {
    use rand::Rng;
    rand::thread_rng().gen_range(1..u64::MAX)
}

/// The guid of a record stored before guids existed: stable, as it depends only on what the
/// record and its pool hold.
fn derived_guid(pool_guid: u64, r: &Record) -> u64 {
    let mut b = Vec::with_capacity(32);
    for v in [pool_guid, r.id, r.txg, r.creation] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    xxhash_rust::xxh3::xxh3_64(&b).max(1)
}

/// A change to the directory, run in syncing context.
#[derive(Debug, Clone)]
pub enum Op {
    Init,
    Create {
        name: String,
        kind: DatasetKind,
        props: Vec<(String, String)>,
        parents: bool,
    },
    Destroy {
        name: String,
        /// A dataset's children and snapshots too; for a snapshot, the snapshot of the
        /// same name of every descendant.
        recursive: bool,
        dependents: bool,
    },
    Snapshot {
        names: Vec<String>,
        recursive: bool,
    },
    Rollback {
        snapshot: String,
        destroy_later: bool,
    },
    Clone {
        snapshot: String,
        target: String,
        props: Vec<(String, String)>,
    },
    Rename {
        from: String,
        to: String,
    },
    /// `None` inherits (removes the local value).
    SetProps {
        name: String,
        props: Vec<(String, Option<String>)>,
    },
    /// Replaces the shares of a filesystem or volume.
    SetShares {
        name: String,
        shares: Vec<Share>,
    },
    /// `POOL/DS@SNAP` → `POOL/DS#MARK`.
    Bookmark {
        snapshot: String,
        bookmark: String,
    },
    DestroyBookmark {
        bookmark: String,
    },
    /// The start, end and abandonment of a receive (`dsl/sendrecv.rs`).
    RecvBegin(Box<RecvBegin>),
    RecvEnd {
        name: String,
    },
    RecvAbort {
        name: String,
    },
    /// Sets (or, with `None`, removes) a filesystem's or volume's snapshot schedule.
    SetSchedule {
        name: String,
        schedule: Option<crate::autosnap::Schedule>,
    },
}

struct Task {
    txg: u64,
    op: Op,
    reply: mpsc::SyncSender<Res<Vec<u64>>>,
}

#[derive(Default)]
struct State {
    header: DirHeader,
    records: BTreeMap<u64, Record>,
    deadlists: HashMap<u64, DeadlistHeader>,
    dirty_records: BTreeSet<u64>,
    removed_records: BTreeSet<u64>,
    dirty_deadlists: BTreeSet<u64>,
    removed_deadlists: BTreeSet<u64>,
    header_dirty: bool,
}

/// The datasets of one pool. See the module documentation.
pub struct Dsl {
    store: Arc<ObjectStore>,
    state: Mutex<State>,
    queued: Mutex<Vec<Task>>,
    frozen: Mutex<Vec<Task>>,
    /// Datasets in use (mounted, or a volume open), with what holds them.
    holds: Mutex<HashMap<u64, String>>,
    /// Snapshot `used` by (snapshot, next's deadlist, its entry count, the previous
    /// snapshot's txg), computed on demand. An entry goes when its deadlist is cleared
    /// (the count alone cannot tell a refilled list from the old one).
    snap_used_cache: Mutex<HashMap<(u64, u64, u64, u64), u64>>,
}

impl std::fmt::Debug for Dsl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dsl").finish_non_exhaustive()
    }
}

/// A name split into dataset path and optional snapshot.
struct Name<'a> {
    pool: &'a str,
    path: Vec<&'a str>,
    snap: Option<&'a str>,
}

fn valid_component(c: &str) -> bool {
    !c.is_empty()
        && c.chars()
            .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '_' | '-' | ':' | '.' | ' '))
        && c != "."
        && c != ".."
}

/// Checks a full dataset or snapshot name's syntax.
pub fn validate_name(name: &str, allow_snapshot: bool) -> Res<()> {
    if name.len() > NAME_MAX {
        return Err(DslError::Invalid(format!(
            "name '{}…' is too long ({} bytes, the limit is {NAME_MAX})",
            &name[..32.min(name.len())],
            name.len()
        )));
    }
    let (ds, snap) = match name.split_once('@') {
        Some((d, s)) => (d, Some(s)),
        None => (name, None),
    };
    if snap.is_some() && !allow_snapshot {
        return Err(DslError::Invalid(format!(
            "'{name}': a snapshot name is not allowed here"
        )));
    }
    for c in ds.split('/') {
        if !valid_component(c) {
            return Err(DslError::Invalid(format!(
                "invalid dataset name '{name}': components may use letters, digits, '_', '-', ':', '.' and space, and may not be empty"
            )));
        }
    }
    if let Some(s) = snap {
        if !valid_component(s) || s.contains('@') {
            return Err(DslError::Invalid(format!("invalid snapshot name '{name}'")));
        }
    }
    Ok(())
}

fn split_name(name: &str) -> Name<'_> {
    let (ds, snap) = match name.split_once('@') {
        Some((d, s)) => (d, Some(s)),
        None => (name, None),
    };
    let mut parts = ds.split('/');
    let pool = parts.next().unwrap_or("");
    Name {
        pool,
        path: parts.collect(),
        snap,
    }
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// A tree root about to be walked in syncing context (`blocks_born_after` reads its nodes
/// from the devices): when this txg wrote it, its new nodes may still be queued, so the
/// txg's writes are waited for first. (A write that failed faults its leaf, which the sync
/// checks after the hook.)
fn settled(ctx: &HookContext<'_>, root: Option<BlockPtr>) -> Option<BlockPtr> {
    if root.is_some_and(|bp| bp.birth_txg == ctx.txg) {
        let _ = ctx.batch.wait();
    }
    root
}

/// Every item of one object and kind, in offset order, read in batches.
fn all_items(meta: &ObjectSet, obj: u64, kind: u8) -> Res<Vec<(u64, Vec<u8>)>> {
    let mut out = Vec::new();
    let mut from = 0;
    loop {
        let items = meta.items(obj, kind, from, u64::MAX, 1024)?;
        let Some(last) = items.last().map(|(k, _)| *k) else {
            return Ok(out);
        };
        out.extend(items);
        from = last + 1;
    }
}

impl State {
    fn rec(&self, id: u64) -> Res<&Record> {
        self.records
            .get(&id)
            .ok_or_else(|| DslError::Corrupt(format!("dataset {id} missing")))
    }

    fn rec_mut(&mut self, id: u64) -> Res<&mut Record> {
        self.dirty_records.insert(id);
        self.records
            .get_mut(&id)
            .ok_or_else(|| DslError::Corrupt(format!("dataset {id} missing")))
    }

    fn child(&self, parent: u64, name: &str, snapshot: bool) -> Option<u64> {
        self.records
            .values()
            .find(|r| {
                r.parent == parent
                    && r.name == name
                    && (r.kind == DatasetKind::Snapshot) == snapshot
            })
            .map(|r| r.id)
    }

    fn children(&self, parent: u64) -> Vec<u64> {
        self.records
            .values()
            .filter(|r| r.parent == parent && r.kind != DatasetKind::Snapshot)
            .map(|r| r.id)
            .collect()
    }

    /// Snapshots of a dataset, oldest first.
    fn snapshots(&self, head: u64) -> Vec<u64> {
        let mut out = Vec::new();
        let mut cur = self.records.get(&head).map_or(0, |r| r.prev_snap);
        while cur != 0 {
            out.push(cur);
            cur = self.records.get(&cur).map_or(0, |r| r.prev_snap);
        }
        out.reverse();
        out
    }

    fn full_name(&self, pool: &str, id: u64) -> String {
        let mut parts = Vec::new();
        let mut cur = id;
        let mut snap = None;
        while let Some(r) = self.records.get(&cur) {
            if r.kind == DatasetKind::Snapshot {
                snap = Some(r.name.clone());
            } else if r.parent != 0 {
                parts.push(r.name.clone());
            }
            cur = r.parent;
        }
        parts.push(pool.to_string());
        parts.reverse();
        let mut s = parts.join("/");
        if let Some(sn) = snap {
            s.push('@');
            s.push_str(&sn);
        }
        s
    }

    fn resolve(&self, pool: &str, name: &str) -> Res<u64> {
        let n = split_name(name);
        if n.pool != pool {
            return Err(DslError::NotFound(name.to_string()));
        }
        let mut cur = ROOT_ID;
        for c in &n.path {
            cur = self
                .child(cur, c, false)
                .ok_or_else(|| DslError::NotFound(name.to_string()))?;
        }
        if let Some(s) = n.snap {
            cur = self
                .child(cur, s, true)
                .ok_or_else(|| DslError::NotFound(name.to_string()))?;
        }
        Ok(cur)
    }

    /// The snapshot txg below which a head's blocks are shared (its latest snapshot's, or
    /// its origin's).
    fn prev_snap_txg(&self, rec: &Record) -> u64 {
        if rec.prev_snap != 0 {
            self.records
                .get(&rec.prev_snap)
                .map_or(rec.origin_txg, |s| s.txg)
        } else {
            rec.origin_txg
        }
    }

    /// The effective value of a property and where it comes from.
    fn effective(&self, pool: &str, id: u64, def: &PropDef) -> (String, String) {
        if def.name == "mountpoint" {
            // Inherited mountpoints extend the ancestor's path with the rest of the name.
            return self.inherited_mountpoint(pool, id);
        }
        let mut cur = id;
        let mut first = true;
        // A snapshot shows its dataset's inheritable values.
        if let Some(r) = self.records.get(&id) {
            if r.kind == DatasetKind::Snapshot {
                cur = r.parent;
                first = false;
            }
        }
        while let Some(r) = self.records.get(&cur) {
            if let Some(v) = r.props.get(def.name) {
                let source = if first {
                    "local".to_string()
                } else {
                    format!("inherited from {}", self.full_name(pool, cur))
                };
                return (v.clone(), source);
            }
            if !def.inherit {
                break;
            }
            first = false;
            cur = r.parent;
        }
        (def.default.to_string(), "default".to_string())
    }

    fn inherited_mountpoint(&self, pool: &str, id: u64) -> (String, String) {
        let mut suffix: Vec<String> = Vec::new();
        let mut cur = id;
        while let Some(r) = self.records.get(&cur) {
            if let Some(v) = r.props.get("mountpoint") {
                if cur == id {
                    return (v.clone(), "local".into());
                }
                if v == "none" || v == "legacy" {
                    return (
                        v.clone(),
                        format!("inherited from {}", self.full_name(pool, cur)),
                    );
                }
                suffix.reverse();
                let mut path = v.trim_end_matches('/').to_string();
                for s in suffix {
                    path.push('/');
                    path.push_str(&s);
                }
                return (
                    path,
                    format!("inherited from {}", self.full_name(pool, cur)),
                );
            }
            if r.kind != DatasetKind::Snapshot && r.parent != 0 {
                suffix.push(r.name.clone());
            }
            cur = r.parent;
        }
        ("none".into(), "default".into())
    }

    fn deadlist_space(&self, id: u64) -> (u64, u64) {
        self.deadlists
            .get(&id)
            .map_or((0, 0), |h| (h.dsize, h.lsize))
    }

    fn usedbysnapshots(&self, head: &Record) -> (u64, u64) {
        let mut d = self.deadlist_space(head.deadlist);
        for s in self.snapshots(head.id) {
            if let Some(r) = self.records.get(&s) {
                let x = self.deadlist_space(r.deadlist);
                d.0 += x.0;
                d.1 += x.1;
            }
        }
        d
    }

    fn prop_u64(&self, id: u64, name: &str) -> u64 {
        self.records
            .get(&id)
            .and_then(|r| r.props.get(name))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    /// used, logicalused and the parts of used, of a head dataset.
    fn used(&self, id: u64) -> Used {
        let Some(r) = self.records.get(&id) else {
            return Used::default();
        };
        let snaps = self.usedbysnapshots(r);
        let mut children = 0;
        let mut lchildren = 0;
        for c in self.children(id) {
            let u = self.used(c);
            children += u.total().max(self.prop_u64(c, "reservation"));
            lchildren += u.logical;
        }
        let refres = self.prop_u64(id, "refreservation").saturating_sub(r.unique);
        Used {
            dataset: r.unique,
            snapshots: snaps.0,
            children,
            refreservation: refres,
            logical: r.lunique + snaps.1 + lchildren,
        }
    }

    /// Reserved but not yet used bytes of every dataset outside `except` (the dataset
    /// asking and its ancestors, whose reservations it may use).
    fn unused_reservations(&self, except: &BTreeSet<u64>) -> u64 {
        self.records
            .values()
            .filter(|r| r.kind != DatasetKind::Snapshot && !except.contains(&r.id))
            // Without either reservation a dataset holds nothing back (and its used
            // space, a walk of its subtree, need not be summed).
            .filter(|r| {
                self.prop_u64(r.id, "reservation") > 0 || self.prop_u64(r.id, "refreservation") > 0
            })
            .map(|r| {
                let u = self.used(r.id);
                let resv = self.prop_u64(r.id, "reservation");
                // refreservation's unused part is counted in used already, and is not
                // allocated: it is held back from others too.
                resv.saturating_sub(u.total()).max(u.refreservation)
            })
            .sum()
    }

    fn ancestors_and_self(&self, id: u64) -> Vec<u64> {
        let mut out = Vec::new();
        let mut cur = id;
        while let Some(r) = self.records.get(&cur) {
            if r.kind != DatasetKind::Snapshot {
                out.push(cur);
            }
            cur = r.parent;
        }
        out
    }

    fn mark_deadlist(&mut self, id: u64) {
        self.dirty_deadlists.insert(id);
    }

    fn new_deadlist(&mut self) -> u64 {
        let id = self.header.next_deadlist;
        self.header.next_deadlist += 1;
        self.header_dirty = true;
        self.deadlists.insert(id, DeadlistHeader::default());
        self.mark_deadlist(id);
        id
    }

    fn new_id(&mut self) -> u64 {
        let id = self.header.next_id;
        self.header.next_id += 1;
        self.header_dirty = true;
        id
    }
}

/// The parts of a dataset's `used`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Used {
    pub dataset: u64,
    pub snapshots: u64,
    pub children: u64,
    pub refreservation: u64,
    pub logical: u64,
}

impl Used {
    pub fn total(&self) -> u64 {
        self.dataset + self.snapshots + self.children + self.refreservation
    }
}

/// A dataset as listed: identity and every property's value and source.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DatasetInfo {
    pub id: u64,
    pub name: String,
    pub kind: DatasetKind,
    pub objset: u64,
    /// (property, value in exact form, source).
    pub props: Vec<(String, String, String)>,
}

impl DatasetInfo {
    pub fn prop(&self, name: &str) -> Option<&str> {
        self.props
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, v, _)| v.as_str())
    }
}

impl Dsl {
    /// Opens the dataset directory of a store (creating the root dataset's record in a
    /// pool that has none) and installs the sync hook. Every user of an object store must
    /// open it before changing any dataset, so killed blocks respect snapshots.
    pub fn open(store: Arc<ObjectStore>) -> Res<Arc<Dsl>> {
        let dsl = Arc::new(Dsl {
            store: store.clone(),
            state: Mutex::new(State::default()),
            queued: Mutex::new(Vec::new()),
            frozen: Mutex::new(Vec::new()),
            holds: Mutex::new(HashMap::new()),
            snap_used_cache: Mutex::new(HashMap::new()),
        });
        dsl.load()?;
        store.set_hook(dsl.clone());
        if dsl.state.lock().records.is_empty() {
            dsl.run(Op::Init)?;
        }
        dsl.apply_policies()?;
        // What fsync acknowledged after the last committed txg, before a crash.
        let replayed = store.replay_log()?;
        if replayed > 0 {
            dsl.store.pool().events.post(
                "sysevent.fs.zfs.zil_replay",
                None,
                format!("records={replayed}"),
            );
        }
        dsl.abort_interrupted_receives()?;
        Ok(dsl)
    }

    pub fn store(&self) -> &Arc<ObjectStore> {
        &self.store
    }

    pub fn pool_name(&self) -> String {
        self.store.pool().name()
    }

    fn load(&self) -> Res<()> {
        let meta = self.store.objset(META_OBJSET)?;
        let mut st = self.state.lock();
        let Some(h) = meta.get_item(DIR_OBJ, KIND_DIR_HEADER, 0)? else {
            return Ok(());
        };
        st.header =
            serde_json::from_slice(&h).map_err(|e| DslError::Corrupt(format!("header: {e}")))?;
        if st.header.version != DIR_VERSION {
            return Err(DslError::Corrupt(format!(
                "dataset directory version {} (this build reads {DIR_VERSION})",
                st.header.version
            )));
        }
        for (id, v) in all_items(&meta, DIR_OBJ, KIND_DIR_RECORD)? {
            let mut r: Record = serde_json::from_slice(&v)
                .map_err(|e| DslError::Corrupt(format!("dataset {id}: {e}")))?;
            if r.guid == 0 {
                r.guid = derived_guid(self.store.pool().guid(), &r);
            }
            st.records.insert(id, r);
        }
        for (id, v) in all_items(&meta, DIR_OBJ, KIND_DEADLIST_HEADER)? {
            st.deadlists.insert(id, DeadlistHeader::decode(&v)?);
        }
        Ok(())
    }

    /// Sets every head's write policy and snapshot txgs from the directory.
    fn apply_policies(&self) -> Res<()> {
        let st = self.state.lock();
        let pool = self.pool_name();
        for r in st.records.values() {
            if r.kind == DatasetKind::Snapshot {
                continue;
            }
            let os = self.store.objset(r.objset)?;
            os.set_snapshot_txgs(st.prev_snap_txg(r), r.origin_txg)?;
            Self::apply_policy(&os, &st, &pool, r.id);
        }
        Ok(())
    }

    /// Sets how an object set writes and caches its blocks from its effective properties.
    fn apply_policy(os: &ObjectSet, st: &State, pool: &str, id: u64) {
        os.set_policy(Self::policy_of(st, pool, id));
        let cache = st
            .effective(
                pool,
                id,
                props::lookup("primarycache").expect("known property"),
            )
            .0;
        os.set_primarycache(CachePolicy::parse(&cache).unwrap_or_default());
    }

    fn policy_of(st: &State, pool: &str, id: u64) -> WritePolicy {
        let get = |n: &str| {
            st.effective(pool, id, props::lookup(n).expect("known property"))
                .0
        };
        WritePolicy {
            checksum: props::checksum_of(&get("checksum")),
            compression: props::compression_of(&get("compression")),
            copies: get("copies").parse().unwrap_or(1),
        }
    }

    /// Queues `op` for the open txg, waits for its sync and returns the ids it touched.
    pub fn run(&self, op: Op) -> Res<Vec<u64>> {
        let (tx_reply, rx_reply) = mpsc::sync_channel(1);
        {
            let tx = self.store.begin(0)?;
            self.queued.lock().push(Task {
                txg: tx.txg,
                op,
                reply: tx_reply,
            });
        }
        loop {
            self.store.sync()?;
            match rx_reply.try_recv() {
                Ok(r) => return r,
                Err(mpsc::TryRecvError::Empty) => continue,
                Err(mpsc::TryRecvError::Disconnected) => {
                    return Err(DslError::Corrupt("sync task dropped".into()))
                }
            }
        }
    }

    // ---- queries ----

    pub fn resolve(&self, name: &str) -> Res<u64> {
        self.state.lock().resolve(&self.pool_name(), name)
    }

    pub fn record(&self, id: u64) -> Res<Record> {
        self.state.lock().rec(id).cloned()
    }

    pub fn name_of(&self, id: u64) -> String {
        self.state.lock().full_name(&self.pool_name(), id)
    }

    /// The effective value of a property.
    pub fn prop(&self, id: u64, name: &str) -> Res<String> {
        let def = props::lookup(name)
            .ok_or_else(|| DslError::Invalid(format!("invalid property '{name}'")))?;
        Ok(self.state.lock().effective(&self.pool_name(), id, def).0)
    }

    /// Every dataset id in name order: each dataset followed by its snapshots, then its
    /// children.
    pub fn all_ids(&self) -> Vec<u64> {
        let st = self.state.lock();
        let mut out = Vec::new();
        fn walk(st: &State, pool: &str, id: u64, out: &mut Vec<u64>) {
            out.push(id);
            out.extend(st.snapshots(id));
            let mut kids = st.children(id);
            kids.sort_by_key(|k| st.full_name(pool, *k));
            for k in kids {
                walk(st, pool, k, out);
            }
        }
        if st.records.contains_key(&ROOT_ID) {
            walk(&st, &self.pool_name(), ROOT_ID, &mut out);
        }
        out
    }

    /// A dataset's snapshots, oldest first.
    pub fn snapshots(&self, head: u64) -> Vec<u64> {
        self.state.lock().snapshots(head)
    }

    /// Whether `id` has child datasets (snapshots are not children).
    pub fn has_children(&self, id: u64) -> bool {
        !self.state.lock().children(id).is_empty()
    }

    /// `id` and everything below it (children, their snapshots), in listing order.
    pub fn subtree(&self, id: u64) -> Vec<u64> {
        let all = self.all_ids();
        let st = self.state.lock();
        all.into_iter()
            .filter(|x| {
                let mut cur = *x;
                loop {
                    if cur == id {
                        return true;
                    }
                    match st.records.get(&cur) {
                        Some(r) if r.parent != 0 => cur = r.parent,
                        _ => return false,
                    }
                }
            })
            .collect()
    }

    /// The pool's free space less its slop (1/32, kept for metadata), in usable bytes
    /// (parity deflated, as dataset sizes are).
    fn usable_free(&self) -> u64 {
        let (size, free, usable) = self.store.pool().free_space();
        if size == 0 {
            return 0;
        }
        let free = free.saturating_sub(size / 32);
        ((u128::from(free) * u128::from(usable)) / u128::from(size)) as u64
    }

    /// Bytes available to a head dataset: the pool's free usable space less others'
    /// unused reservations, limited by quotas up the tree and its refquota.
    pub fn available(&self, id: u64) -> u64 {
        let usable_free = self.usable_free();
        let st = self.state.lock();
        let head = match st.records.get(&id) {
            Some(r) if r.kind == DatasetKind::Snapshot => r.parent,
            Some(_) => id,
            None => return 0,
        };
        let chain = st.ancestors_and_self(head);
        let except: BTreeSet<u64> = chain.iter().copied().collect();
        let mut avail = usable_free.saturating_sub(st.unused_reservations(&except));
        // Its own and its ancestors' unused reservations are its to use.
        for a in &chain {
            let u = st.used(*a);
            avail += st.prop_u64(*a, "reservation").saturating_sub(u.total());
        }
        for a in &chain {
            let quota = st.prop_u64(*a, "quota");
            if quota > 0 {
                avail = avail.min(quota.saturating_sub(st.used(*a).total()));
            }
        }
        let refquota = st.prop_u64(head, "refquota");
        if refquota > 0 {
            let referenced = st.records.get(&head).map_or(0, |r| r.referenced);
            avail = avail.min(refquota.saturating_sub(referenced));
        }
        avail
    }

    /// Whether `bytes` more (plus what is dirty) fit under the quotas and reservations of
    /// `id`: Err(EDQUOT) past a quota, Err(ENOSPC) when the pool has no room for it.
    pub fn check_space(&self, id: u64, bytes: u64) -> Result<(), i32> {
        // Called before every write: one lock, and the expensive sums only where a quota
        // or a reservation asks for them.
        let st = self.state.lock();
        let Some(rec) = st.records.get(&id) else {
            return Ok(());
        };
        let own_pending = self.store.objset(rec.objset).map_or(0, |o| o.dirty_bytes());
        let need = bytes + own_pending;
        for a in st.ancestors_and_self(id) {
            let quota = st.prop_u64(a, "quota");
            if quota > 0 && st.used(a).total() + need > quota {
                return Err(libc::EDQUOT);
            }
        }
        let refquota = st.prop_u64(id, "refquota");
        if refquota > 0 && rec.referenced + need > refquota {
            return Err(libc::EDQUOT);
        }
        // Without reservations anywhere, the pool's own check at the start of every
        // transaction decides ENOSPC.
        let reserved = st
            .records
            .keys()
            .any(|r| st.prop_u64(*r, "reservation") > 0 || st.prop_u64(*r, "refreservation") > 0);
        drop(st);
        if reserved && need > self.available(id) {
            return Err(libc::ENOSPC);
        }
        Ok(())
    }

    /// Space only this snapshot holds (what destroying it would free).
    fn snapshot_used(&self, st: &State, snap: &Record) -> Res<u64> {
        let head = st.rec(snap.parent)?;
        let next_deadlist = if head.prev_snap == snap.id {
            head.deadlist
        } else {
            match st
                .records
                .values()
                .find(|r| r.kind == DatasetKind::Snapshot && r.prev_snap == snap.id)
            {
                Some(n) => n.deadlist,
                None => return Ok(0),
            }
        };
        let prev_txg = if snap.prev_snap != 0 {
            st.rec(snap.prev_snap)?.txg
        } else {
            head.origin_txg
        };
        let count = st.deadlists.get(&next_deadlist).map_or(0, |h| h.count);
        let key = (snap.id, next_deadlist, count, prev_txg);
        if let Some(v) = self.snap_used_cache.lock().get(&key) {
            return Ok(*v);
        }
        let mut used = 0;
        for bp in self.deadlist_entries(next_deadlist)? {
            if bp.birth_txg > prev_txg {
                used += self.store.blocks().dsize(&bp);
            }
        }
        self.snap_used_cache.lock().insert(key, used);
        Ok(used)
    }

    /// Every property of a dataset with its value (exact) and source.
    pub fn info(&self, id: u64) -> Res<DatasetInfo> {
        let pool = self.pool_name();
        // A snapshot shows no available space ("-"): its head's is not worked out.
        let is_snapshot = self
            .state
            .lock()
            .records
            .get(&id)
            .is_some_and(|r| r.kind == DatasetKind::Snapshot);
        let avail = if is_snapshot { 0 } else { self.available(id) };
        let mounted = self.holds.lock().get(&id).cloned();
        // Only a head with an unfinished receive has a token (and reads its progress item).
        let receiving = self
            .state
            .lock()
            .records
            .get(&id)
            .is_some_and(|r| r.recv.is_some());
        let token = receiving
            .then(|| crate::recv::resume_token(self, id).ok().flatten())
            .flatten();
        let st = self.state.lock();
        let r = st.rec(id)?.clone();
        let mut out = Vec::new();
        let ratio = |l: u64, d: u64| {
            if d == 0 {
                "1.00x".to_string()
            } else {
                format!("{:.2}x", l as f64 / d as f64)
            }
        };
        let used = if r.kind == DatasetKind::Snapshot {
            Used {
                dataset: self.snapshot_used(&st, &r)?,
                ..Used::default()
            }
        } else {
            st.used(id)
        };
        for def in props::PROPS {
            let applies = def.applies_to(r.kind);
            if !applies {
                continue;
            }
            if r.kind == DatasetKind::Snapshot
                && !def.readonly
                && !matches!(
                    def.name,
                    "checksum" | "compression" | "copies" | "primarycache"
                )
            {
                continue;
            }
            let computed = |v: u64| (v.to_string(), "-".to_string());
            let (value, source) = match def.name {
                "type" => (r.kind.name().to_string(), "-".into()),
                "creation" => computed(r.creation),
                "used" => computed(used.total()),
                "available" => {
                    if r.kind == DatasetKind::Snapshot {
                        ("-".into(), "-".into())
                    } else {
                        computed(avail)
                    }
                }
                "referenced" => computed(r.referenced),
                "compressratio" => {
                    if r.kind == DatasetKind::Snapshot {
                        (ratio(r.lreferenced, r.referenced), "-".into())
                    } else {
                        (
                            ratio(used.logical, used.total() - used.refreservation),
                            "-".into(),
                        )
                    }
                }
                "refcompressratio" => (ratio(r.lreferenced, r.referenced), "-".into()),
                "usedbysnapshots" => computed(used.snapshots),
                "usedbydataset" => computed(used.dataset),
                "usedbychildren" => computed(used.children),
                "usedbyrefreservation" => computed(used.refreservation),
                "logicalused" => computed(if r.kind == DatasetKind::Snapshot {
                    0
                } else {
                    used.logical
                }),
                "logicalreferenced" => computed(r.lreferenced),
                "written" => computed(r.written),
                "guid" => computed(r.guid),
                "receive_resume_token" => match &token {
                    Some(t) => (t.clone(), "-".into()),
                    None => ("-".into(), "-".into()),
                },
                "origin" => {
                    if r.origin != 0 {
                        (st.full_name(&pool, r.origin), "-".into())
                    } else {
                        ("-".into(), "-".into())
                    }
                }
                "mounted" => {
                    if r.kind == DatasetKind::Snapshot {
                        continue;
                    }
                    (
                        mounted.clone().map_or("no".into(), |_| "yes".into()),
                        "-".into(),
                    )
                }
                _ => st.effective(&pool, id, def),
            };
            out.push((def.name.to_string(), value, source));
        }
        Ok(DatasetInfo {
            id,
            name: st.full_name(&pool, id),
            kind: r.kind,
            objset: r.objset,
            props: out,
        })
    }

    // ---- holds (mounts, open volumes) ----

    /// Marks a dataset in use (destroy and rollback refuse while held).
    pub fn hold(&self, id: u64, what: &str) -> Res<()> {
        let name = self.name_of(id);
        let mut h = self.holds.lock();
        if let Some(w) = h.get(&id) {
            return Err(DslError::Busy(format!("dataset '{name}' is busy: {w}")));
        }
        h.insert(id, what.to_string());
        Ok(())
    }

    pub fn release(&self, id: u64) {
        self.holds.lock().remove(&id);
    }

    pub fn held(&self, id: u64) -> Option<String> {
        self.holds.lock().get(&id).cloned()
    }

    /// The object set of a filesystem or volume.
    pub fn objset(&self, id: u64) -> Res<Arc<ObjectSet>> {
        let r = self.record(id)?;
        if r.kind == DatasetKind::Snapshot {
            return Err(DslError::Invalid(format!(
                "'{}' is a snapshot",
                self.name_of(id)
            )));
        }
        Ok(self.store.objset(r.objset)?)
    }

    /// A read-only object set over a snapshot's tree.
    pub fn snapshot_objset(&self, id: u64) -> Res<Arc<ObjectSet>> {
        let r = self.record(id)?;
        if r.kind != DatasetKind::Snapshot {
            return Err(DslError::Invalid(format!(
                "'{}' is not a snapshot",
                self.name_of(id)
            )));
        }
        Ok(self.store.open_snapshot(u64::MAX - id, r.root_bp()?))
    }

    // ---- deadlists ----

    fn deadlist_entries(&self, dl: u64) -> Res<Vec<BlockPtr>> {
        let meta = self.store.objset(META_OBJSET)?;
        let mut out = Vec::new();
        let mut from = 0;
        loop {
            let items = meta.items(
                DEADLIST_OBJ_BASE + dl,
                KIND_DEADLIST_ENTRIES,
                from,
                u64::MAX,
                256,
            )?;
            let Some(last) = items.last().map(|(k, _)| *k) else {
                break;
            };
            for (_, v) in items {
                for chunk in v.chunks(tank_block::BLKPTR_SIZE) {
                    match BlockPtr::decode(chunk) {
                        Ok(Some(bp)) => out.push(bp),
                        _ => return Err(DslError::Corrupt(format!("deadlist {dl} entry"))),
                    }
                }
            }
            from = last + 1;
        }
        Ok(out)
    }

    /// Appends block pointers to a deadlist (syncing context), filling its last item first.
    fn deadlist_append(&self, st: &mut State, dl: u64, bps: &[BlockPtr]) -> Res<()> {
        if bps.is_empty() {
            return Ok(());
        }
        let meta = self.store.objset(META_OBJSET)?;
        let obj = DEADLIST_OBJ_BASE + dl;
        let mut h = st.deadlists.get(&dl).copied().unwrap_or_default();
        let mut pending: Vec<u8> = Vec::new();
        let mut seq = h.next_seq;
        if h.next_seq > 0 {
            if let Some(last) = meta.get_item(obj, KIND_DEADLIST_ENTRIES, h.next_seq - 1)? {
                if last.len() < BPS_PER_ITEM * tank_block::BLKPTR_SIZE {
                    pending = last;
                    seq = h.next_seq - 1;
                }
            }
        }
        for bp in bps {
            let d = self.store.blocks().dsize(bp);
            h.count += 1;
            h.dsize += d;
            h.lsize += u64::from(bp.lsize);
            pending.extend_from_slice(&bp.encode());
            if pending.len() == BPS_PER_ITEM * tank_block::BLKPTR_SIZE {
                meta.put_item_syncing(obj, KIND_DEADLIST_ENTRIES, seq, &pending)?;
                pending.clear();
                seq += 1;
            }
        }
        if !pending.is_empty() {
            meta.put_item_syncing(obj, KIND_DEADLIST_ENTRIES, seq, &pending)?;
            seq += 1;
        }
        h.next_seq = seq;
        st.deadlists.insert(dl, h);
        st.mark_deadlist(dl);
        Ok(())
    }

    /// Removes every entry of a deadlist (syncing context), keeping the list.
    fn deadlist_clear(&self, st: &mut State, dl: u64) -> Res<()> {
        let meta = self.store.objset(META_OBJSET)?;
        let h = st.deadlists.get(&dl).copied().unwrap_or_default();
        for seq in 0..h.next_seq {
            meta.remove_item_syncing(DEADLIST_OBJ_BASE + dl, KIND_DEADLIST_ENTRIES, seq)?;
        }
        st.deadlists.insert(dl, DeadlistHeader::default());
        st.mark_deadlist(dl);
        self.snap_used_cache
            .lock()
            .retain(|(_, next_dl, _, _), _| *next_dl != dl);
        Ok(())
    }

    fn deadlist_remove(&self, st: &mut State, dl: u64) -> Res<()> {
        self.deadlist_clear(st, dl)?;
        st.deadlists.remove(&dl);
        st.dirty_deadlists.remove(&dl);
        st.removed_deadlists.insert(dl);
        Ok(())
    }

    // ---- syncing context ----

    fn account(&self, st: &mut State, ctx: &HookContext<'_>) -> Res<()> {
        let by_objset: HashMap<u64, u64> = st
            .records
            .values()
            .filter(|r| r.kind != DatasetKind::Snapshot)
            .map(|r| (r.objset, r.id))
            .collect();
        for (osid, report) in &ctx.reports {
            let Some(&id) = by_objset.get(osid) else {
                continue;
            };
            let SyncReport {
                born,
                freed,
                dead,
                dropped,
                ..
            } = report;
            if born.dsize == 0 && freed.dsize == 0 && dead.is_empty() && dropped.dsize == 0 {
                continue;
            }
            let mut dead_space = Space::default();
            for bp in dead {
                dead_space.add(Space::of(ctx.blocks, bp));
            }
            let dl = st.rec(id)?.deadlist;
            self.deadlist_append(st, dl, dead)?;
            let r = st.rec_mut(id)?;
            let killed = freed.dsize + dead_space.dsize + dropped.dsize;
            let lkilled = freed.lsize + dead_space.lsize + dropped.lsize;
            r.referenced = (r.referenced + born.dsize).saturating_sub(killed);
            r.lreferenced = (r.lreferenced + born.lsize).saturating_sub(lkilled);
            r.unique = (r.unique + born.dsize).saturating_sub(freed.dsize + dead_space.dsize);
            r.lunique = (r.lunique + born.lsize).saturating_sub(freed.lsize + dead_space.lsize);
            r.written = (r.written + born.dsize).saturating_sub(freed.dsize);
        }
        Ok(())
    }

    fn persist(&self, st: &mut State) -> Res<()> {
        let meta = self.store.objset(META_OBJSET)?;
        if st.header_dirty {
            let h = serde_json::to_vec(&st.header).expect("header serializes");
            meta.put_item_syncing(DIR_OBJ, KIND_DIR_HEADER, 0, &h)?;
            st.header_dirty = false;
        }
        for id in std::mem::take(&mut st.removed_records) {
            meta.remove_item_syncing(DIR_OBJ, KIND_DIR_RECORD, id)?;
        }
        for id in std::mem::take(&mut st.dirty_records) {
            if let Some(r) = st.records.get(&id) {
                let v = serde_json::to_vec(r).expect("record serializes");
                meta.put_item_syncing(DIR_OBJ, KIND_DIR_RECORD, id, &v)?;
            }
        }
        for dl in std::mem::take(&mut st.removed_deadlists) {
            meta.remove_item_syncing(DIR_OBJ, KIND_DEADLIST_HEADER, dl)?;
        }
        for dl in std::mem::take(&mut st.dirty_deadlists) {
            if let Some(h) = st.deadlists.get(&dl) {
                meta.put_item_syncing(DIR_OBJ, KIND_DEADLIST_HEADER, dl, &h.encode())?;
            }
        }
        Ok(())
    }

    fn apply(&self, st: &mut State, ctx: &HookContext<'_>, op: &Op) -> Res<Vec<u64>> {
        match op {
            Op::Init => self.op_init(st, ctx),
            Op::Create {
                name,
                kind,
                props,
                parents,
            } => self.op_create(st, ctx, name, *kind, props, *parents),
            Op::Destroy {
                name,
                recursive,
                dependents,
            } => self.op_destroy(st, ctx, name, *recursive, *dependents),
            Op::Snapshot { names, recursive } => self.op_snapshot(st, ctx, names, *recursive),
            Op::Rollback {
                snapshot,
                destroy_later,
            } => self.op_rollback(st, ctx, snapshot, *destroy_later),
            Op::Clone {
                snapshot,
                target,
                props,
            } => self.op_clone(st, ctx, snapshot, target, props),
            Op::Rename { from, to } => self.op_rename(st, from, to),
            Op::SetProps { name, props } => self.op_set(st, name, props),
            Op::SetShares { name, shares } => self.op_set_shares(st, name, shares),
            Op::Bookmark { snapshot, bookmark } => self.op_bookmark(st, snapshot, bookmark),
            Op::DestroyBookmark { bookmark } => self.op_destroy_bookmark(st, bookmark),
            Op::RecvBegin(b) => self.op_recv_begin(st, ctx, b),
            Op::RecvEnd { name } => self.op_recv_end(st, ctx, name),
            Op::RecvAbort { name } => self.op_recv_abort(st, ctx, name),
            Op::SetSchedule { name, schedule } => {
                let id = st.resolve(&self.pool_name(), name)?;
                if st.rec(id)?.kind == DatasetKind::Snapshot {
                    return Err(DslError::Invalid(format!(
                        "'{name}' is a snapshot: a schedule is a filesystem's or volume's"
                    )));
                }
                st.rec_mut(id)?.schedule = schedule.filter(|s| !s.is_empty());
                Ok(vec![id])
            }
        }
    }

    fn op_init(&self, st: &mut State, ctx: &HookContext<'_>) -> Res<Vec<u64>> {
        if !st.records.is_empty() {
            return Ok(vec![]);
        }
        st.header = DirHeader {
            version: DIR_VERSION,
            next_id: ROOT_ID + 1,
            next_deadlist: 1,
        };
        st.header_dirty = true;
        let dl = st.new_deadlist();
        // A pool written before it had datasets: account what its root object set holds.
        let root = settled(ctx, ctx.store.objset(ROOT_OBJSET)?.root());
        let mut space = Space::default();
        for bp in ctx.store.blocks_born_after(root, 0)? {
            space.add(Space::of(ctx.blocks, &bp));
        }
        let rec = Record {
            id: ROOT_ID,
            parent: 0,
            name: String::new(),
            kind: DatasetKind::Filesystem,
            objset: ROOT_OBJSET,
            root: None,
            txg: ctx.txg,
            creation: now_secs(),
            prev_snap: 0,
            origin: 0,
            origin_txg: 0,
            deadlist: dl,
            props: BTreeMap::new(),
            referenced: space.dsize,
            lreferenced: space.lsize,
            unique: space.dsize,
            lunique: space.lsize,
            written: space.dsize,
            clones: vec![],
            shares: vec![],
            guid: new_guid(),
            bookmarks: vec![],
            recv: None,
            schedule: None,
        };
        st.records.insert(ROOT_ID, rec);
        st.dirty_records.insert(ROOT_ID);
        Ok(vec![ROOT_ID])
    }

    /// Validates `props` for a new dataset of `kind` (normalized).
    fn check_new_props(
        kind: DatasetKind,
        props: &[(String, String)],
    ) -> Res<BTreeMap<String, String>> {
        let mut out = BTreeMap::new();
        for (k, v) in props {
            let def = props::lookup(k)
                .ok_or_else(|| DslError::Invalid(format!("invalid property '{k}'")))?;
            let applies = def.applies_to(kind);
            if !applies {
                return Err(DslError::Invalid(format!(
                    "property '{k}' does not apply to a {}",
                    kind.name()
                )));
            }
            out.insert(k.clone(), props::parse(def, v).map_err(DslError::Invalid)?);
        }
        if kind == DatasetKind::Volume {
            let vs: u64 = out
                .get("volsize")
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| DslError::Invalid("a volume needs a size (-V SIZE)".into()))?;
            let bs: u64 = out
                .entry("volblocksize".to_string())
                .or_insert_with(|| "16384".to_string())
                .parse()
                .unwrap_or(16384);
            if !vs.is_multiple_of(bs) {
                return Err(DslError::Invalid(format!(
                    "volsize {vs} must be a multiple of volblocksize {bs}"
                )));
            }
        }
        Ok(out)
    }

    fn new_head(
        &self,
        st: &mut State,
        ctx: &HookContext<'_>,
        parent: u64,
        name: &str,
        kind: DatasetKind,
        props: BTreeMap<String, String>,
    ) -> Res<u64> {
        let id = st.new_id();
        let dl = st.new_deadlist();
        let os = ctx.store.create_objset_syncing(None, 0, 0)?;
        let rec = Record {
            id,
            parent,
            name: name.to_string(),
            kind,
            objset: os.id,
            root: None,
            txg: ctx.txg,
            creation: now_secs(),
            prev_snap: 0,
            origin: 0,
            origin_txg: 0,
            deadlist: dl,
            props,
            referenced: 0,
            lreferenced: 0,
            unique: 0,
            lunique: 0,
            written: 0,
            clones: vec![],
            shares: vec![],
            guid: new_guid(),
            bookmarks: vec![],
            recv: None,
            schedule: None,
        };
        st.records.insert(id, rec);
        st.dirty_records.insert(id);
        Self::apply_policy(&os, st, &self.pool_name(), id);
        Ok(id)
    }

    fn check_parent(&self, st: &State, name: &str, parents: bool) -> Res<u64> {
        let pool = self.pool_name();
        let n = split_name(name);
        if n.pool != pool {
            return Err(DslError::NotFound(format!(
                "{name}: no such pool '{}'",
                n.pool
            )));
        }
        if n.path.is_empty() {
            return Err(DslError::Exists(name.to_string()));
        }
        let mut cur = ROOT_ID;
        for (i, c) in n.path[..n.path.len() - 1].iter().enumerate() {
            match st.child(cur, c, false) {
                Some(x) => cur = x,
                None if parents => return Ok(0),
                None => {
                    let missing = format!("{}/{}", pool, n.path[..=i].join("/"));
                    return Err(DslError::NotFound(format!(
                        "{name}: parent '{missing}' does not exist (use -p to create it)"
                    )));
                }
            }
        }
        if st.rec(cur)?.kind != DatasetKind::Filesystem {
            return Err(DslError::Invalid(format!(
                "{name}: parent '{}' is not a filesystem",
                st.full_name(&pool, cur)
            )));
        }
        Ok(cur)
    }

    fn op_create(
        &self,
        st: &mut State,
        ctx: &HookContext<'_>,
        name: &str,
        kind: DatasetKind,
        props: &[(String, String)],
        parents: bool,
    ) -> Res<Vec<u64>> {
        validate_name(name, false)?;
        if st.resolve(&self.pool_name(), name).is_ok() {
            return Err(DslError::Exists(name.to_string()));
        }
        let local = Self::check_new_props(kind, props)?;
        self.check_parent(st, name, parents)?;
        let resv: u64 = ["reservation", "refreservation"]
            .iter()
            .filter_map(|k| local.get(*k).and_then(|v| v.parse::<u64>().ok()))
            .sum();
        if resv > 0 {
            self.check_reservation(st, 0, resv, name)?;
        }
        let n = split_name(name);
        let mut cur = ROOT_ID;
        let mut created = Vec::new();
        for (i, c) in n.path.iter().enumerate() {
            let last = i + 1 == n.path.len();
            match st.child(cur, c, false) {
                Some(x) if !last => {
                    if st.rec(x)?.kind != DatasetKind::Filesystem {
                        return Err(DslError::Invalid(format!(
                            "{name}: a parent is not a filesystem"
                        )));
                    }
                    cur = x
                }
                Some(_) => return Err(DslError::Exists(name.to_string())),
                None if !last => {
                    cur =
                        self.new_head(st, ctx, cur, c, DatasetKind::Filesystem, BTreeMap::new())?;
                    created.push(cur);
                }
                None => {
                    cur = self.new_head(st, ctx, cur, c, kind, local.clone())?;
                    created.push(cur);
                }
            }
        }
        Ok(created)
    }

    fn op_snapshot(
        &self,
        st: &mut State,
        ctx: &HookContext<'_>,
        names: &[String],
        recursive: bool,
    ) -> Res<Vec<u64>> {
        let pool = self.pool_name();
        // Validate every name first: all are taken, or none.
        let mut targets: Vec<(u64, String)> = Vec::new();
        for name in names {
            validate_name(name, true)?;
            let Some((ds, snap)) = name.split_once('@') else {
                return Err(DslError::Invalid(format!(
                    "'{name}' is not a snapshot name (dataset@name)"
                )));
            };
            let head = st.resolve(&pool, ds)?;
            let heads = if recursive {
                self.subtree_locked(st, head)
            } else {
                vec![head]
            };
            for h in heads {
                if st.child(h, snap, true).is_some() {
                    return Err(DslError::Exists(format!(
                        "{}@{snap}",
                        st.full_name(&pool, h)
                    )));
                }
                if !targets.iter().any(|(x, s)| *x == h && s == snap) {
                    targets.push((h, snap.to_string()));
                }
            }
        }
        let mut out = Vec::new();
        for (h, snap) in targets {
            let head = st.rec(h)?.clone();
            let os = ctx.store.objset(head.objset)?;
            let root = os.root();
            let id = st.new_id();
            let dl = st.new_deadlist();
            let rec = Record {
                id,
                parent: h,
                name: snap,
                kind: DatasetKind::Snapshot,
                objset: 0,
                root: root.map(|bp| hex(&bp.encode())),
                txg: ctx.txg,
                creation: now_secs(),
                prev_snap: head.prev_snap,
                origin: 0,
                origin_txg: head.origin_txg,
                // The head's deadlist now belongs to the snapshot; the head starts anew.
                deadlist: head.deadlist,
                props: BTreeMap::new(),
                referenced: head.referenced,
                lreferenced: head.lreferenced,
                unique: head.unique,
                lunique: head.lunique,
                written: head.written,
                clones: vec![],
                shares: vec![],
                guid: new_guid(),
                bookmarks: vec![],
                recv: None,
                schedule: None,
            };
            st.records.insert(id, rec);
            st.dirty_records.insert(id);
            let r = st.rec_mut(h)?;
            r.prev_snap = id;
            r.deadlist = dl;
            r.written = 0;
            let origin_txg = r.origin_txg;
            os.set_snapshot_txgs(ctx.txg, origin_txg)?;
            out.push(id);
        }
        Ok(out)
    }

    fn subtree_locked(&self, st: &State, id: u64) -> Vec<u64> {
        let mut out = vec![id];
        let mut i = 0;
        while i < out.len() {
            out.extend(st.children(out[i]));
            i += 1;
        }
        out
    }

    fn op_destroy(
        &self,
        st: &mut State,
        ctx: &HookContext<'_>,
        name: &str,
        recursive: bool,
        dependents: bool,
    ) -> Res<Vec<u64>> {
        let pool = self.pool_name();
        let id = st.resolve(&pool, name)?;
        if id == ROOT_ID {
            return Err(DslError::Invalid(format!(
                "cannot destroy '{name}': the root dataset goes with its pool (use 'tank pool destroy')"
            )));
        }
        // Plan: every dataset to destroy, checked before anything changes.
        let mut heads: Vec<u64> = Vec::new();
        let mut snaps: Vec<u64> = Vec::new();
        let r = st.rec(id)?.clone();
        if r.kind == DatasetKind::Snapshot {
            snaps.push(id);
            if recursive {
                // As zfs destroy -r: the snapshot of that name of every descendant too.
                for h in self.subtree_locked(st, r.parent).into_iter().skip(1) {
                    snaps.extend(st.child(h, &r.name, true));
                }
            }
        } else {
            let tree = self.subtree_locked(st, id);
            if tree.len() > 1 && !recursive {
                let kids: Vec<String> = tree[1..].iter().map(|k| st.full_name(&pool, *k)).collect();
                return Err(DslError::Busy(format!(
                    "cannot destroy '{name}': it has children: {} (use -r)",
                    kids.join(", ")
                )));
            }
            for h in &tree {
                let s = st.snapshots(*h);
                if !s.is_empty() && !recursive {
                    let names: Vec<String> = s.iter().map(|x| st.full_name(&pool, *x)).collect();
                    return Err(DslError::Busy(format!(
                        "cannot destroy '{name}': it has snapshots: {} (use -r)",
                        names.join(", ")
                    )));
                }
                snaps.extend(s);
            }
            heads = tree;
        }
        // Clones of those snapshots outside the plan.
        let mut i = 0;
        while i < snaps.len() {
            let clones = st.rec(snaps[i])?.clones.clone();
            for c in clones {
                if heads.contains(&c) {
                    continue;
                }
                if !dependents {
                    return Err(DslError::Busy(format!(
                        "cannot destroy '{}': it has dependent clones: {} (use -R)",
                        st.full_name(&pool, snaps[i]),
                        st.full_name(&pool, c)
                    )));
                }
                for h in self.subtree_locked(st, c) {
                    if !heads.contains(&h) {
                        heads.push(h);
                        for s in st.snapshots(h) {
                            if !snaps.contains(&s) {
                                snaps.push(s);
                            }
                        }
                    }
                }
            }
            i += 1;
        }
        for h in &heads {
            if let Some(w) = self.holds.lock().get(h) {
                return Err(DslError::Busy(format!(
                    "cannot destroy '{}': dataset is busy ({w})",
                    st.full_name(&pool, *h)
                )));
            }
        }
        // Snapshots destroyed on their own (their dataset stays).
        let lone: Vec<u64> = snaps
            .iter()
            .copied()
            .filter(|s| {
                st.records
                    .get(s)
                    .is_some_and(|r| !heads.contains(&r.parent))
            })
            .collect();
        // Execute: a head goes once none of its children and no clone of its snapshots
        // remains (each head's snapshots newest-first, then the head); then the snapshots
        // destroyed alone, whose clones went with the heads.
        let mut destroyed = Vec::new();
        let mut remaining = heads;
        while !remaining.is_empty() {
            let ready = remaining.iter().position(|h| {
                let child_left = remaining
                    .iter()
                    .any(|x| x != h && st.records.get(x).is_some_and(|r| r.parent == *h));
                let clone_left = st.snapshots(*h).iter().any(|s| {
                    st.records
                        .get(s)
                        .is_some_and(|r| r.clones.iter().any(|c| st.records.contains_key(c)))
                });
                !child_left && !clone_left
            });
            let Some(pos) = ready else {
                return Err(DslError::Corrupt(
                    "datasets and clones depend on each other in a cycle".into(),
                ));
            };
            let h = remaining.remove(pos);
            for s in st.snapshots(h).into_iter().rev() {
                self.destroy_snapshot(st, ctx, s)?;
                destroyed.push(s);
            }
            self.destroy_head(st, ctx, h)?;
            destroyed.push(h);
        }
        for s in lone {
            self.destroy_snapshot(st, ctx, s)?;
            destroyed.push(s);
        }
        Ok(destroyed)
    }

    fn destroy_snapshot(&self, st: &mut State, ctx: &HookContext<'_>, sid: u64) -> Res<()> {
        let s = st.rec(sid)?.clone();
        let clones: Vec<u64> = s
            .clones
            .iter()
            .copied()
            .filter(|c| st.records.contains_key(c))
            .collect();
        if !clones.is_empty() {
            return Err(DslError::Busy(format!(
                "snapshot {} still has clones",
                st.full_name(&self.pool_name(), sid)
            )));
        }
        let head = st.rec(s.parent)?.clone();
        let next = if head.prev_snap == sid {
            head.id
        } else {
            st.records
                .values()
                .find(|r| r.kind == DatasetKind::Snapshot && r.prev_snap == sid)
                .map(|r| r.id)
                .ok_or_else(|| DslError::Corrupt(format!("snapshot {sid} has no successor")))?
        };
        let prev_txg = if s.prev_snap != 0 {
            st.rec(s.prev_snap)?.txg
        } else {
            head.origin_txg
        };
        let next_dl = st.rec(next)?.deadlist;
        // Entries of next's deadlist born after prev: only this snapshot held them.
        let entries = self.deadlist_entries(next_dl)?;
        let mut keep = Vec::new();
        let mut freed = 0;
        for bp in entries {
            if bp.birth_txg > prev_txg {
                freed += ctx.blocks.dsize(&bp);
                ctx.blocks.free(&bp, ctx.txg).map_err(ObjectError::from)?;
            } else {
                keep.push(bp);
            }
        }
        keep.extend(self.deadlist_entries(s.deadlist)?);
        self.deadlist_clear(st, next_dl)?;
        self.deadlist_append(st, next_dl, &keep)?;
        self.deadlist_remove(st, s.deadlist)?;
        let n = st.rec_mut(next)?;
        n.prev_snap = s.prev_snap;
        // Next's `written` now counts from prev: what this snapshot's tree had born after
        // prev (its `written`), less what of it next no longer holds (just freed).
        n.written = (n.written + s.written).saturating_sub(freed);
        if next == head.id {
            let os = ctx.store.objset(head.objset)?;
            os.set_snapshot_txgs(prev_txg, head.origin_txg)?;
        }
        st.records.remove(&sid);
        st.dirty_records.remove(&sid);
        st.removed_records.insert(sid);
        Ok(())
    }

    fn destroy_head(&self, st: &mut State, ctx: &HookContext<'_>, id: u64) -> Res<()> {
        let r = st.rec(id)?.clone();
        assert_eq!(r.prev_snap, 0, "head destroyed before its snapshots");
        let root = ctx.store.remove_objset_syncing(r.objset, ctx.txg)?;
        ctx.store
            .free_born_after(settled(ctx, root), r.origin_txg, ctx.txg)?;
        for bp in self.deadlist_entries(r.deadlist)? {
            if bp.birth_txg > r.origin_txg {
                ctx.blocks.free(&bp, ctx.txg).map_err(ObjectError::from)?;
            }
        }
        self.deadlist_remove(st, r.deadlist)?;
        if r.origin != 0 {
            if let Ok(o) = st.rec_mut(r.origin) {
                o.clones.retain(|c| *c != id);
            }
        }
        st.records.remove(&id);
        st.dirty_records.remove(&id);
        st.removed_records.insert(id);
        Ok(())
    }

    fn op_rollback(
        &self,
        st: &mut State,
        ctx: &HookContext<'_>,
        snapshot: &str,
        destroy_later: bool,
    ) -> Res<Vec<u64>> {
        let pool = self.pool_name();
        if !snapshot.contains('@') {
            return Err(DslError::Invalid(format!(
                "'{snapshot}' is not a snapshot name (dataset@name)"
            )));
        }
        let sid = st.resolve(&pool, snapshot)?;
        let s = st.rec(sid)?.clone();
        let head = st.rec(s.parent)?.clone();
        if let Some(w) = self.holds.lock().get(&head.id) {
            return Err(DslError::Busy(format!(
                "cannot roll back '{}': dataset is busy ({w})",
                st.full_name(&pool, head.id)
            )));
        }
        let all = st.snapshots(head.id);
        let pos = all.iter().position(|x| *x == sid).ok_or_else(|| {
            DslError::Corrupt(format!(
                "'{snapshot}' is not among the snapshots of its dataset"
            ))
        })?;
        let later: Vec<u64> = all[pos + 1..].to_vec();
        if !later.is_empty() {
            if !destroy_later {
                let names: Vec<String> = later.iter().map(|x| st.full_name(&pool, *x)).collect();
                return Err(DslError::Busy(format!(
                    "cannot roll back to '{snapshot}': more recent snapshots exist: {} (use -r to destroy them)",
                    names.join(", ")
                )));
            }
            for l in &later {
                if let Some(c) = st.rec(*l)?.clones.first() {
                    return Err(DslError::Busy(format!(
                        "cannot roll back to '{snapshot}': {} has clone {}",
                        st.full_name(&pool, *l),
                        st.full_name(&pool, *c)
                    )));
                }
            }
        }
        for l in later.iter().rev() {
            self.destroy_snapshot(st, ctx, *l)?;
        }
        let os = ctx.store.objset(head.objset)?;
        ctx.store
            .free_born_after(settled(ctx, os.root()), s.txg, ctx.txg)?;
        // The head's deadlist holds blocks the snapshot references: live again.
        let dl = st.rec(head.id)?.deadlist;
        self.deadlist_clear(st, dl)?;
        ctx.store
            .reset_objset_syncing(head.objset, s.root_bp()?, ctx.txg)?;
        os.set_snapshot_txgs(s.txg, head.origin_txg)?;
        let r = st.rec_mut(head.id)?;
        r.referenced = s.referenced;
        r.lreferenced = s.lreferenced;
        r.unique = s.unique;
        r.lunique = s.lunique;
        r.written = 0;
        // A bookmark made after the snapshot names a state the head no longer descends
        // from: an increment from it would be wrong.
        r.bookmarks.retain(|b| b.txg <= s.txg);
        let mut out = later;
        out.push(head.id);
        Ok(out)
    }

    fn op_clone(
        &self,
        st: &mut State,
        ctx: &HookContext<'_>,
        snapshot: &str,
        target: &str,
        props: &[(String, String)],
    ) -> Res<Vec<u64>> {
        let pool = self.pool_name();
        let sid = st.resolve(&pool, snapshot)?;
        let s = st.rec(sid)?.clone();
        if s.kind != DatasetKind::Snapshot {
            return Err(DslError::Invalid(format!("'{snapshot}' is not a snapshot")));
        }
        validate_name(target, false)?;
        if split_name(target).pool != pool {
            return Err(DslError::CrossPool(format!(
                "cannot clone '{snapshot}' to '{target}': a clone stays in its snapshot's pool"
            )));
        }
        if st.resolve(&pool, target).is_ok() {
            return Err(DslError::Exists(target.to_string()));
        }
        let parent = self.check_parent(st, target, false)?;
        let kind = st.rec(s.parent)?.kind;
        let mut local = BTreeMap::new();
        for (k, v) in props {
            let def = props::lookup(k)
                .ok_or_else(|| DslError::Invalid(format!("invalid property '{k}'")))?;
            local.insert(k.clone(), props::parse(def, v).map_err(DslError::Invalid)?);
        }
        if kind == DatasetKind::Volume {
            // A volume clone keeps its origin's size and block size.
            let head = st.rec(s.parent)?;
            for k in ["volsize", "volblocksize"] {
                if let Some(v) = head.props.get(k) {
                    local.entry(k.to_string()).or_insert_with(|| v.clone());
                }
            }
        }
        let name = split_name(target)
            .path
            .last()
            .copied()
            .unwrap_or("")
            .to_string();
        let id = st.new_id();
        let dl = st.new_deadlist();
        let os = ctx
            .store
            .create_objset_syncing(s.root_bp()?, s.txg, s.txg)?;
        let rec = Record {
            id,
            parent,
            name,
            kind,
            objset: os.id,
            root: None,
            txg: ctx.txg,
            creation: now_secs(),
            prev_snap: 0,
            origin: sid,
            origin_txg: s.txg,
            deadlist: dl,
            props: local,
            referenced: s.referenced,
            lreferenced: s.lreferenced,
            unique: 0,
            lunique: 0,
            written: 0,
            clones: vec![],
            shares: vec![],
            guid: new_guid(),
            bookmarks: vec![],
            recv: None,
            schedule: None,
        };
        st.records.insert(id, rec);
        st.dirty_records.insert(id);
        st.rec_mut(sid)?.clones.push(id);
        Self::apply_policy(&os, st, &pool, id);
        Ok(vec![id])
    }

    fn op_rename(&self, st: &mut State, from: &str, to: &str) -> Res<Vec<u64>> {
        let pool = self.pool_name();
        let id = st.resolve(&pool, from)?;
        let r = st.rec(id)?.clone();
        let tn = split_name(to);
        if tn.pool != pool {
            return Err(DslError::CrossPool(format!(
                "cannot rename '{from}' to '{to}': datasets cannot move to another pool"
            )));
        }
        if id == ROOT_ID {
            return Err(DslError::Invalid(
                "cannot rename the root dataset (export and import the pool under a new name)"
                    .into(),
            ));
        }
        if r.kind == DatasetKind::Snapshot {
            validate_name(to, true)?;
            let (fds, _) = from.split_once('@').expect("snapshot name");
            let Some((tds, tsnap)) = to.split_once('@') else {
                return Err(DslError::Invalid(format!(
                    "cannot rename snapshot '{from}' to '{to}': the new name must be a snapshot of the same dataset"
                )));
            };
            if st.resolve(&pool, tds).ok() != st.resolve(&pool, fds).ok() {
                return Err(DslError::Invalid(format!(
                    "cannot rename snapshot '{from}' to '{to}': snapshots stay with their dataset"
                )));
            }
            if st.child(r.parent, tsnap, true).is_some() {
                return Err(DslError::Exists(to.to_string()));
            }
            st.rec_mut(id)?.name = tsnap.to_string();
            return Ok(vec![id]);
        }
        validate_name(to, false)?;
        if st.resolve(&pool, to).is_ok() {
            return Err(DslError::Exists(to.to_string()));
        }
        let parent = self.check_parent(st, to, false)?;
        if self.subtree_locked(st, id).contains(&parent) {
            return Err(DslError::Invalid(format!(
                "cannot rename '{from}' to '{to}': a dataset cannot move below itself"
            )));
        }
        let rec = st.rec_mut(id)?;
        rec.parent = parent;
        rec.name = tn.path.last().copied().unwrap_or("").to_string();
        // Below another parent, it and its descendants may inherit other values.
        self.refresh_policies(st, id)?;
        Ok(vec![id])
    }

    /// Refuses a reservation growth of `grow` bytes the pool's free space (less others'
    /// unused reservations) cannot back.
    fn check_reservation(&self, st: &State, id: u64, grow: u64, name: &str) -> Res<()> {
        let except: BTreeSet<u64> = [id].into_iter().collect();
        if grow
            > self
                .usable_free()
                .saturating_sub(st.unused_reservations(&except))
        {
            return Err(DslError::NoSpace(format!(
                "cannot reserve {} for '{name}': not enough free space in the pool",
                props::human(grow)
            )));
        }
        Ok(())
    }

    fn op_set_shares(&self, st: &mut State, name: &str, shares: &[Share]) -> Res<Vec<u64>> {
        let id = st.resolve(&self.pool_name(), name)?;
        if st.rec(id)?.kind == DatasetKind::Snapshot {
            return Err(DslError::Invalid(format!(
                "'{name}' is a snapshot: snapshots are shared through their dataset"
            )));
        }
        st.rec_mut(id)?.shares = shares.to_vec();
        Ok(vec![id])
    }

    fn op_set(
        &self,
        st: &mut State,
        name: &str,
        changes: &[(String, Option<String>)],
    ) -> Res<Vec<u64>> {
        let pool = self.pool_name();
        let id = st.resolve(&pool, name)?;
        let r = st.rec(id)?.clone();
        let mut new_props = r.props.clone();
        for (k, v) in changes {
            let def = props::lookup(k)
                .ok_or_else(|| DslError::Invalid(format!("invalid property '{k}'")))?;
            if def.readonly {
                return Err(DslError::Invalid(format!("property '{k}' is read-only")));
            }
            let applies = def.applies_to(r.kind);
            if !applies || (r.kind == DatasetKind::Snapshot) {
                return Err(DslError::Invalid(format!(
                    "property '{k}' cannot be set on a {}",
                    r.kind.name()
                )));
            }
            if def.create_only {
                return Err(DslError::Invalid(format!(
                    "property '{k}' can only be set when the dataset is created"
                )));
            }
            match v {
                None => {
                    if !def.inherit {
                        return Err(DslError::Invalid(format!(
                            "property '{k}' cannot be inherited"
                        )));
                    }
                    new_props.remove(k);
                }
                Some(v) => {
                    let norm = props::parse(def, v).map_err(DslError::Invalid)?;
                    new_props.insert(k.clone(), norm);
                }
            }
        }
        // Limits that must hold after the change.
        let used = st.used(id);
        let get = |k: &str| -> u64 { new_props.get(k).and_then(|v| v.parse().ok()).unwrap_or(0) };
        if get("quota") > 0 && get("quota") < used.total() {
            return Err(DslError::NoSpace(format!(
                "cannot set quota on '{name}': {} is less than the space used ({})",
                props::human(get("quota")),
                props::human(used.total())
            )));
        }
        if get("refquota") > 0 && get("refquota") < r.referenced {
            return Err(DslError::NoSpace(format!(
                "cannot set refquota on '{name}': {} is less than the space referenced ({})",
                props::human(get("refquota")),
                props::human(r.referenced)
            )));
        }
        if r.kind == DatasetKind::Volume {
            let bs = get("volblocksize").max(512);
            if !get("volsize").is_multiple_of(bs) || get("volsize") == 0 {
                return Err(DslError::Invalid(format!(
                    "volsize must be a non-zero multiple of volblocksize {bs}"
                )));
            }
        }
        let grow_resv = get("reservation").saturating_sub(st.prop_u64(id, "reservation"))
            + get("refreservation").saturating_sub(st.prop_u64(id, "refreservation"));
        if grow_resv > 0 {
            self.check_reservation(st, id, grow_resv, name)?;
        }
        st.rec_mut(id)?.props = new_props;
        self.refresh_policies(st, id)?;
        Ok(vec![id])
    }

    /// Sets the write policies of a dataset and of its descendants from their effective
    /// properties (after a change to what they inherit).
    fn refresh_policies(&self, st: &State, id: u64) -> Res<()> {
        let pool = self.pool_name();
        for d in self.subtree_locked(st, id) {
            if let Ok(os) = self.store.objset(st.rec(d)?.objset) {
                Self::apply_policy(&os, st, &pool, d);
            }
        }
        Ok(())
    }
}

impl SyncHook for Dsl {
    fn quiesce(&self, txg: u64) {
        let mut q = self.queued.lock();
        let (now, later): (Vec<Task>, Vec<Task>) = q.drain(..).partition(|t| t.txg <= txg);
        *q = later;
        self.frozen.lock().extend(now);
    }

    fn sync(&self, ctx: &HookContext<'_>) -> Result<(), PoolError> {
        let tasks = std::mem::take(&mut *self.frozen.lock());
        let mut st = self.state.lock();
        let fail = |e: DslError| PoolError::Corrupt(format!("dataset directory: {e}"));
        self.account(&mut st, ctx).map_err(fail)?;
        for t in tasks {
            let result = self.apply(&mut st, ctx, &t.op);
            // A task that failed validation changed nothing; one that failed on I/O
            // suspends the pool below.
            let io_failure = matches!(&result, Err(DslError::Object(_) | DslError::Pool(_)));
            if io_failure {
                let msg = result
                    .as_ref()
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default();
                let _ = t.reply.send(result);
                return Err(PoolError::Corrupt(format!("dataset directory: {msg}")));
            }
            let _ = t.reply.send(result);
        }
        self.persist(&mut st).map_err(fail)?;
        self.snap_used_cache
            .lock()
            .retain(|(s, _, _, _), _| st.records.contains_key(s));
        Ok(())
    }

    fn is_dirty(&self) -> bool {
        !self.queued.lock().is_empty() || !self.frozen.lock().is_empty()
    }
}
