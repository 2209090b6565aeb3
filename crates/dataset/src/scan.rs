//! What the scrub needs from the dataset layer: the snapshot trees it walks besides the
//! objset table, and names for the trees of its error log.
//!
//! # Theory of operation
//! Snapshots are not in the objset table (only their root pointer, in their dataset record),
//! so the scrub asks [`SnapshotRoots`] for them. Only snapshots whose txg has committed are
//! listed: a newer snapshot's blocks may still be in flight, and a scrub skips blocks born
//! after it started anyway. Tree ids are the object set id for heads and
//! [`SNAPSHOT_TREE_BASE`] + dataset id for snapshots.

use std::sync::{Arc, Weak};

use tank_block::BlockPtr;
use tank_object::{ScanRoots, METADATA_OBJECT, POOL_META_ID};

use crate::dsl::{DatasetKind, Dsl};

/// Tree ids at and above this name snapshots (dataset id added).
pub const SNAPSHOT_TREE_BASE: u64 = 1 << 62;

/// The committed snapshot roots of a pool, for the scrub.
pub struct SnapshotRoots(Weak<Dsl>);

impl SnapshotRoots {
    pub fn new(dsl: &Arc<Dsl>) -> Arc<Self> {
        Arc::new(Self(Arc::downgrade(dsl)))
    }
}

impl ScanRoots for SnapshotRoots {
    fn scan_roots(&self) -> Vec<(u64, Option<BlockPtr>)> {
        let Some(dsl) = self.0.upgrade() else {
            return Vec::new();
        };
        let synced = dsl.store().pool().synced_txg();
        dsl.all_ids()
            .into_iter()
            .filter_map(|id| {
                let r = dsl.record(id).ok()?;
                if r.kind != DatasetKind::Snapshot || r.txg > synced {
                    return None;
                }
                let os = dsl.snapshot_objset(id).ok()?;
                Some((SNAPSHOT_TREE_BASE + id, os.root()))
            })
            .collect()
    }
}

/// How `status -v` names an entry of the error log, as zpool does: a file of a filesystem
/// by its path (`dataset:/dir/file`, a snapshot's as `dataset@snap:/dir/file`), other objects
/// as `dataset:<0xOBJECT>`, the pool's own metadata as `<metadata>:<0x0>`, a tree node (whose
/// objects are unknown) as `dataset:<metadata>`.
pub fn error_name(dsl: &Dsl, tree: u64, object: u64) -> String {
    let (dataset, id) = if tree == POOL_META_ID || tree == tank_object::META_OBJSET {
        ("<metadata>".to_string(), None)
    } else if tree >= SNAPSHOT_TREE_BASE {
        let id = tree - SNAPSHOT_TREE_BASE;
        (dsl.name_of(id), Some(id))
    } else {
        match dsl.all_ids().into_iter().find(|id| {
            dsl.record(*id)
                .is_ok_and(|r| r.kind != DatasetKind::Snapshot && r.objset == tree)
        }) {
            Some(id) => (dsl.name_of(id), Some(id)),
            None => (format!("<0x{tree:x}>"), None),
        }
    };
    if object == METADATA_OBJECT {
        return format!("{dataset}:<metadata>");
    }
    let path = id.and_then(|id| {
        let r = dsl.record(id).ok()?;
        let os = match r.kind {
            DatasetKind::Snapshot => dsl.snapshot_objset(id).ok()?,
            DatasetKind::Filesystem => dsl.objset(id).ok()?,
            DatasetKind::Volume => return None,
        };
        crate::posix::paths::path_of(&os, object)
    });
    match path {
        Some(p) => format!("{dataset}:{p}"),
        None => format!("{dataset}:<0x{object:x}>"),
    }
}
