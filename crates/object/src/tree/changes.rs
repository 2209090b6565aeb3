//! What changed in a tree since a txg, found from birth times alone (for send streams).
//!
//! # Theory of operation
//! A version of the tree is described to a receiver that holds the same tree as of an
//! earlier txg `base` (nothing, for `base` = 0) as a sequence of [`Change`]s in key order
//! whose ranges cover the whole key space exactly once:
//!
//! - A subtree whose node was born at or before `base` is unchanged since then: it was part
//!   of the tree at `base` (a node, once dropped from a tree, is freed and never referenced
//!   again), so the receiver holds exactly its items between its first and last key. Only
//!   the gaps of its range before its first key and after its last key may hold items the
//!   receiver must drop: [`Change::Unchanged`] names the range and the two keys. Nothing
//!   below is read but the rightmost path (for the last key).
//! - A leaf born after `base` is described whole: [`Change::Leaf`] lists every key of its
//!   range (the receiver drops any other key there) and carries the items that may differ:
//!   every inline item (a leaf is at most 16 KiB) and every block item born after `base`.
//!   A block item born at or before `base` is unchanged under the same key, since the layers
//!   above never move a data block from one key to another.
//! - An internal node born after `base` is descended; its children split its range at their
//!   entry keys.
//!
//! So the cost follows the nodes born after `base` (and their direct children), never the
//! size of the tree, and no data is compared. Ranges are fixed by the tree's shape, so the
//! same version always gives the same ranges: a receiver that stopped after range `[lo, hi)`
//! resumes with `from = hi` and gets exactly the rest.
//!
//! The caller must make sure the receiver's tree really is the tree at `base` of the same
//! lineage (a snapshot guid check): a tree rolled back past `base` holds old nodes the
//! receiver never had.

use std::sync::Arc;

use super::node::{Body, Expect, MAX_LEVEL};
use super::{load, Key, NodeRef, NodeStore, TreeError, Value};

/// One piece of the description (see the module documentation). `hi = None` is the end of
/// the key space.
#[derive(Debug)]
pub enum Change {
    /// The receiver drops every item with `lo <= key < hi` (an empty tree).
    Clear { lo: Key, hi: Option<Key> },
    /// The receiver's items with `first <= key <= last` are unchanged (and it holds both
    /// keys); it drops the others with `lo <= key < hi`.
    Unchanged {
        lo: Key,
        hi: Option<Key>,
        first: Key,
        last: Key,
    },
    /// The receiver's items with `lo <= key < hi` become exactly `keys`; `items` (a subset)
    /// are new or changed, every other key of `keys` the receiver already holds unchanged.
    Leaf {
        lo: Key,
        hi: Option<Key>,
        keys: Vec<Key>,
        items: Vec<(Key, Value)>,
    },
}

impl Change {
    /// The end of the range this change covers.
    pub fn hi(&self) -> Option<Key> {
        match self {
            Change::Clear { hi, .. } | Change::Unchanged { hi, .. } | Change::Leaf { hi, .. } => {
                *hi
            }
        }
    }
}

/// The change description of the tree under `root` since `base`, from the range that holds
/// `from` on (`Key::MIN` for all of it). `visit` may stop the walk with an error.
pub(super) fn changes_since(
    store: &dyn NodeStore,
    root: Option<&Arc<NodeRef>>,
    base: u64,
    from: Key,
    visit: &mut dyn FnMut(Change) -> Result<(), TreeError>,
) -> Result<(), TreeError> {
    match root {
        None => visit(Change::Clear { lo: from, hi: None }),
        Some(root) => below(
            store,
            root,
            &Expect::ROOT,
            Key::MIN,
            None,
            base,
            from,
            visit,
        ),
    }
}

#[allow(clippy::too_many_arguments)]
fn below(
    store: &dyn NodeStore,
    nref: &NodeRef,
    expect: &Expect,
    lo: Key,
    hi: Option<Key>,
    base: u64,
    from: Key,
    visit: &mut dyn FnMut(Change) -> Result<(), TreeError>,
) -> Result<(), TreeError> {
    // Ranges wholly before the resume point were applied already.
    if hi.is_some_and(|h| h <= from) {
        return Ok(());
    }
    let node = load(store, nref, expect)?;
    let unchanged = nref.bp().is_some_and(|bp| bp.birth_txg <= base);
    if unchanged {
        let first = node
            .first_key()
            .ok_or_else(|| TreeError::Corrupt("empty tree node".into()))?;
        let last = last_key(store, nref, expect)?;
        return visit(Change::Unchanged {
            lo,
            hi,
            first,
            last,
        });
    }
    match &node.body {
        Body::Leaf(entries) => {
            let keys = entries.iter().map(|(k, _)| *k).collect();
            let items = entries
                .iter()
                .filter(|(_, v)| match v {
                    Value::Inline(_) => true,
                    Value::Block(r) => r.bp().is_none_or(|bp| bp.birth_txg > base),
                })
                .cloned()
                .collect();
            visit(Change::Leaf {
                lo,
                hi,
                keys,
                items,
            })
        }
        Body::Internal(children) => {
            for (index, (key, child)) in children.iter().enumerate() {
                let child_lo = if index == 0 { lo } else { *key };
                let child_hi = children.get(index + 1).map(|(k, _)| *k).or(hi);
                let child_expect = Expect::child(&node, index, expect.upper);
                below(
                    store,
                    child,
                    &child_expect,
                    child_lo,
                    child_hi,
                    base,
                    from,
                    visit,
                )?;
            }
            Ok(())
        }
    }
}

/// The last key of the subtree under `nref` (down its rightmost path).
fn last_key(store: &dyn NodeStore, nref: &NodeRef, expect: &Expect) -> Result<Key, TreeError> {
    let mut node = load(store, nref, expect)?;
    let mut upper = expect.upper;
    for _ in 0..=MAX_LEVEL {
        let next = match &node.body {
            Body::Leaf(entries) => {
                return entries
                    .last()
                    .map(|(k, _)| *k)
                    .ok_or_else(|| TreeError::Corrupt("empty tree leaf".into()))
            }
            Body::Internal(children) => {
                let index = children
                    .len()
                    .checked_sub(1)
                    .ok_or_else(|| TreeError::Corrupt("empty internal node".into()))?;
                let child_expect = Expect::child(&node, index, upper);
                upper = child_expect.upper;
                load(store, &children[index].1, &child_expect)?
            }
        };
        node = next;
    }
    Err(TreeError::Corrupt("tree deeper than MAX_LEVEL".into()))
}
