//! Read paths shared by the live tree and its snapshots (lookups, ranges, the invariant check,
//! eviction) and the post-order writer used by the sync.
//!
//! Every walk descends by level and a loaded child's level is checked to be its parent's
//! level - 1, so recursion depth is bounded by `MAX_LEVEL` even for hostile on-disk trees.

use std::sync::Arc;

use tank_block::BlockPtr;

use super::node::{child_index, Body, Expect, Node, MAX_LEVEL, NODE_MAX, NODE_MIN};
use super::{load, BlockUse, Key, NodeRef, NodeStore, TreeError, TreeStats, Value, WriteKind};

pub(super) fn get(
    store: &dyn NodeStore,
    root: Option<&Arc<NodeRef>>,
    key: &Key,
) -> Result<Option<Value>, TreeError> {
    let Some(root) = root else { return Ok(None) };
    let mut current = root.clone();
    let mut expect = Expect::ROOT;
    for _ in 0..=MAX_LEVEL {
        let node = load(store, &current, &expect)?;
        match &node.body {
            Body::Leaf(items) => {
                return Ok(items
                    .binary_search_by(|(k, _)| k.cmp(key))
                    .ok()
                    .map(|index| items[index].1.clone()));
            }
            Body::Internal(children) => {
                if children.first().is_none_or(|(first, _)| key < first) {
                    return Ok(None);
                }
                let index = child_index(children, key);
                expect = Expect::child(&node, index, expect.upper);
                current = children[index].1.clone();
            }
        }
    }
    Err(TreeError::Corrupt("tree deeper than MAX_LEVEL".into()))
}

pub(super) fn range(
    store: &dyn NodeStore,
    root: Option<&Arc<NodeRef>>,
    start: &Key,
    end: &Key,
    limit: usize,
) -> Result<Vec<(Key, Value)>, TreeError> {
    let mut out = Vec::new();
    if let Some(root) = root {
        if start < end && limit > 0 {
            range_below(store, root, &Expect::ROOT, start, end, limit, &mut out)?;
        }
    }
    assert!(out.len() <= limit);
    Ok(out)
}

fn range_below(
    store: &dyn NodeStore,
    nref: &NodeRef,
    expect: &Expect,
    start: &Key,
    end: &Key,
    limit: usize,
    out: &mut Vec<(Key, Value)>,
) -> Result<(), TreeError> {
    let node = load(store, nref, expect)?;
    match &node.body {
        Body::Leaf(items) => {
            let first = items.partition_point(|(k, _)| k < start);
            for (key, value) in &items[first..] {
                if key >= end || out.len() >= limit {
                    break;
                }
                out.push((*key, value.clone()));
            }
        }
        Body::Internal(children) => {
            let first = child_index(children, start);
            for (index, (key, child)) in children.iter().enumerate().skip(first) {
                if out.len() >= limit || key >= end {
                    break;
                }
                let child_expect = Expect::child(&node, index, expect.upper);
                range_below(store, child, &child_expect, start, end, limit, out)?;
            }
        }
    }
    Ok(())
}

pub(super) fn last_before(
    store: &dyn NodeStore,
    root: Option<&Arc<NodeRef>>,
    before: &Key,
) -> Result<Option<(Key, Value)>, TreeError> {
    match root {
        None => Ok(None),
        Some(root) => last_before_below(store, root, &Expect::ROOT, before),
    }
}

fn last_before_below(
    store: &dyn NodeStore,
    nref: &NodeRef,
    expect: &Expect,
    before: &Key,
) -> Result<Option<(Key, Value)>, TreeError> {
    let node = load(store, nref, expect)?;
    match &node.body {
        Body::Leaf(items) => {
            let count = items.partition_point(|(k, _)| k < before);
            Ok(count.checked_sub(1).map(|index| items[index].clone()))
        }
        Body::Internal(children) => {
            // Every child starts with its entry key, so the last child starting before
            // `before` holds the answer; checking earlier ones too only matters for trees that
            // violate that invariant, and costs nothing otherwise.
            let count = children.partition_point(|(k, _)| k < before);
            for index in (0..count).rev() {
                let child_expect = Expect::child(&node, index, expect.upper);
                if let Some(found) =
                    last_before_below(store, &children[index].1, &child_expect, before)?
                {
                    return Ok(Some(found));
                }
            }
            Ok(None)
        }
    }
}

/// Drops the contents of every written node below `nref`. A written node's subtree is all
/// written, so the whole subtree goes with it; unwritten nodes are walked into.
pub(super) fn evict_below(nref: &NodeRef) {
    let node = nref.node.read().clone();
    let Some(node) = node else { return };
    if let Body::Internal(children) = &node.body {
        for (_, child) in children {
            if child.bp.get().is_some() {
                *child.node.write() = None;
            } else {
                evict_below(child);
            }
        }
    }
}

pub(super) fn cached_below(nref: &NodeRef) -> usize {
    let node = nref.node.read().clone();
    let Some(node) = node else { return 0 };
    match &node.body {
        Body::Leaf(_) => 1,
        Body::Internal(children) => {
            1 + children.iter().map(|(_, c)| cached_below(c)).sum::<usize>()
        }
    }
}

/// The contents of a node that has no bp yet (None once it has one); `depth` counts the
/// levels above, for the recursion bound.
fn unwritten(nref: &NodeRef, depth: usize) -> Option<Arc<Node>> {
    if nref.bp.get().is_some() {
        return None;
    }
    assert!(
        depth <= usize::from(MAX_LEVEL),
        "unwritten tree deeper than MAX_LEVEL"
    );
    // A node without a bp is never evicted, so its contents are here.
    Some(
        nref.node
            .read()
            .clone()
            .expect("unwritten node is in memory"),
    )
}

/// Writes the dirty data blocks of every unwritten leaf at or below `nref`, in key order,
/// before any node is written ([`write_node`] then finds them written). A txg's data thus
/// reaches each disk as one ascending run, and its tree nodes (metadata, allocated apart
/// and in more copies) follow as a run of their own, instead of a node after each leaf's
/// data, each a seek away from it and back on a disk with one actuator.
pub(super) fn write_data_below(
    store: &dyn NodeStore,
    nref: &NodeRef,
    depth: usize,
) -> Result<(), TreeError> {
    let Some(node) = unwritten(nref, depth) else {
        return Ok(());
    };
    match &node.body {
        Body::Leaf(items) => {
            for (_, value) in items {
                if let Value::Block(block) = value {
                    block.write_if_dirty(store)?;
                }
            }
            Ok(())
        }
        Body::Internal(children) => children
            .iter()
            .try_for_each(|(_, child)| write_data_below(store, child, depth + 1)),
    }
}

/// Writes `nref` and every node below it that has no bp yet, children first, once
/// [`write_data_below`] has written their data blocks. `depth` counts the levels above,
/// for the recursion bound.
pub(super) fn write_node(
    store: &dyn NodeStore,
    nref: &NodeRef,
    depth: usize,
) -> Result<BlockPtr, TreeError> {
    let Some(node) = unwritten(nref, depth) else {
        return Ok(*nref
            .bp
            .get()
            .expect("a node without contents to write has a bp"));
    };
    match &node.body {
        Body::Leaf(items) => {
            debug_assert!(
                items.iter().all(|(_, v)| match v {
                    Value::Block(block) => block.bp().is_some(),
                    Value::Inline(_) => true,
                }),
                "a leaf's data blocks are written before the leaf"
            );
        }
        Body::Internal(children) => {
            for (_, child) in children {
                let child_bp = write_node(store, child, depth + 1)?;
                assert!(child.bp.get() == Some(&child_bp));
            }
        }
    }
    let bytes = node.encode();
    // Pair assertion: what we write must read back (the read side checks it again).
    debug_assert!(Node::decode(&bytes).is_ok(), "encoded node does not decode");
    let bp = store.write_block(
        &bytes,
        WriteKind::Node {
            level: node.level(),
        },
    )?;
    assert!(nref.bp.set(bp).is_ok(), "tree node written twice");
    Ok(bp)
}

pub(super) fn check(
    store: &dyn NodeStore,
    root: Option<&Arc<NodeRef>>,
    visit: &mut dyn FnMut(&BlockPtr, BlockUse),
) -> Result<TreeStats, TreeError> {
    let mut stats = TreeStats::default();
    if let Some(root) = root {
        let place = Place {
            root: true,
            rightmost: true,
            parent_written: false,
        };
        check_below(store, root, &Expect::ROOT, place, &mut stats, visit)?;
    }
    Ok(stats)
}

/// Visits every written node and data block born after `min_txg`, skipping whole subtrees
/// whose node was born at or before it: copy-on-write means nothing below an old node is
/// newer (ZFS's traverse with a minimum birth txg). Used to free what only one dataset owns.
pub(super) fn walk_born_after(
    store: &dyn NodeStore,
    root: Option<&Arc<NodeRef>>,
    min_txg: u64,
    visit: &mut dyn FnMut(&BlockPtr, BlockUse),
) -> Result<(), TreeError> {
    if let Some(root) = root {
        walk_below(store, root, &Expect::ROOT, min_txg, visit)?;
    }
    Ok(())
}

fn walk_below(
    store: &dyn NodeStore,
    nref: &NodeRef,
    expect: &Expect,
    min_txg: u64,
    visit: &mut dyn FnMut(&BlockPtr, BlockUse),
) -> Result<(), TreeError> {
    if let Some(bp) = nref.bp.get() {
        if bp.birth_txg <= min_txg {
            return Ok(());
        }
    }
    let node = load(store, nref, expect)?;
    if let Some(bp) = nref.bp.get() {
        visit(
            bp,
            BlockUse::Node {
                level: node.level(),
            },
        );
    }
    match &node.body {
        Body::Leaf(items) => {
            for (_, value) in items {
                if let Value::Block(block) = value {
                    if let Some(bp) = block.bp() {
                        if bp.birth_txg > min_txg {
                            visit(&bp, BlockUse::Data);
                        }
                    }
                }
            }
        }
        Body::Internal(children) => {
            for (index, (_, child)) in children.iter().enumerate() {
                let child_expect = Expect::child(&node, index, expect.upper);
                walk_below(store, child, &child_expect, min_txg, visit)?;
            }
        }
    }
    Ok(())
}

/// Receives what [`walk_scan`] finds.
pub trait ScanVisitor {
    /// A written node, before it is read: `false` skips it and its subtree (seen already
    /// under another root, or freed meanwhile).
    fn enter(&mut self, bp: &BlockPtr) -> bool;
    /// A data block, referenced by the item `key`.
    fn data(&mut self, key: &Key, bp: &BlockPtr);
    /// A node that could not be read or decoded; its subtree is skipped.
    fn unreadable(&mut self, bp: &BlockPtr, err: &TreeError);
}

/// Visits every written node and data block of a committed tree, for the scrub. Unlike the
/// other walks it keeps nothing it loads (memory stays bounded by the tree's depth) and an
/// unreadable node skips its subtree instead of ending the walk.
pub(super) fn walk_scan(
    store: &dyn NodeStore,
    root: Option<&Arc<NodeRef>>,
    visit: &mut dyn ScanVisitor,
) {
    if let Some(root) = root {
        scan_below(store, root, &Expect::ROOT, visit);
    }
}

fn scan_below(store: &dyn NodeStore, nref: &NodeRef, expect: &Expect, visit: &mut dyn ScanVisitor) {
    let cached = nref.node.read().clone();
    let node = match (cached, nref.bp.get()) {
        (Some(node), _) => node,
        (None, Some(bp)) => {
            if !visit.enter(bp) {
                return;
            }
            let loaded = store.read_block(bp).and_then(|bytes| {
                let node = Node::decode(&bytes)?;
                expect.check(&node)?;
                Ok(Arc::new(node))
            });
            match loaded {
                Ok(node) => node,
                Err(e) => {
                    visit.unreadable(bp, &e);
                    return;
                }
            }
        }
        (None, None) => return,
    };
    match &node.body {
        Body::Leaf(items) => {
            for (key, value) in items {
                if let Value::Block(block) = value {
                    if let Some(bp) = block.bp() {
                        visit.data(key, &bp);
                    }
                }
            }
        }
        Body::Internal(children) => {
            for (index, (_, child)) in children.iter().enumerate() {
                let child_expect = Expect::child(&node, index, expect.upper);
                scan_below(store, child, &child_expect, visit);
            }
        }
    }
}

#[derive(Clone, Copy)]
struct Place {
    root: bool,
    /// Last node of its level.
    rightmost: bool,
    parent_written: bool,
}

fn check_below(
    store: &dyn NodeStore,
    nref: &NodeRef,
    expect: &Expect,
    place: Place,
    stats: &mut TreeStats,
    visit: &mut dyn FnMut(&BlockPtr, BlockUse),
) -> Result<(), TreeError> {
    let fail = |what: String| Err(TreeError::Corrupt(what));
    let node = load(store, nref, expect)?;
    // Nodes that were already in memory were not checked by `load`.
    expect.check(&node)?;
    let written = nref.bp.get().is_some();
    if place.parent_written && !written {
        return fail("unwritten node below a written one".into());
    }
    if place.root {
        stats.depth = usize::from(node.level()) + 1;
    }
    if node.len() == 0 {
        return fail("empty node".into());
    }
    if node.computed_size() != node.size_bytes() {
        return fail(format!(
            "node size {} recorded as {}",
            node.computed_size(),
            node.size_bytes()
        ));
    }
    if node.size_bytes() > NODE_MAX {
        return fail(format!("node of {} bytes", node.size_bytes()));
    }
    if !place.root && !place.rightmost && node.size_bytes() < NODE_MIN {
        return fail(format!("underfull node of {} bytes", node.size_bytes()));
    }
    if !node.keys_strictly_increasing() {
        return fail("keys out of order".into());
    }
    if let Some(bp) = nref.bp.get() {
        visit(
            bp,
            BlockUse::Node {
                level: node.level(),
            },
        );
    }
    stats.nodes += 1;
    stats.bytes += node.size_bytes();
    match &node.body {
        Body::Leaf(items) => {
            stats.leaves += 1;
            stats.items += items.len();
            for (_, value) in items {
                if let Value::Block(block) = value {
                    match block.bp() {
                        Some(bp) => visit(&bp, BlockUse::Data),
                        None if written => {
                            return fail("unwritten data block in a written leaf".into())
                        }
                        None => {}
                    }
                }
            }
        }
        Body::Internal(children) => {
            if place.root && children.len() < 2 {
                return fail("internal root with a single child".into());
            }
            for index in 0..children.len() {
                let child_place = Place {
                    root: false,
                    rightmost: place.rightmost && index + 1 == children.len(),
                    parent_written: written,
                };
                let child_expect = Expect::child(&node, index, expect.upper);
                check_below(
                    store,
                    &children[index].1,
                    &child_expect,
                    child_place,
                    stats,
                    visit,
                )?;
            }
        }
    }
    Ok(())
}
