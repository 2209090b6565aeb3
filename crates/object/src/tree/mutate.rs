//! Insert and remove: path copying, splits, merges and rebalancing.
//!
//! Every mutation runs in two phases, so that a store error can never leave the live tree half
//! changed:
//! 1. *Load*: descend from the root to the leaf, keeping the path, and, if the leaf may fall
//!    below `NODE_MIN`, load the sibling that each level up may need for a merge. Only this
//!    phase reads from the store and can fail.
//! 2. *Apply*: change the leaf, then walk the path back up. Each level turns its changed child
//!    into "pieces" (0 to 2 nodes) that replace the child's entry in the parent: 2 after a
//!    split, 1 merged or rebalanced with the preloaded sibling when underfull, 0 when a child
//!    without siblings became empty. Private nodes are changed in place; shared ones are copied
//!    and the originals go on the obsolete list. The walk stops early at the first level whose
//!    entry did not change (the common case for a private leaf whose first key stayed).

use std::ops::Range;
use std::sync::Arc;

use super::node::{
    child_index, item_size, Body, Expect, Node, ENTRY_SIZE, MAX_LEVEL, NODE_MAX, NODE_MIN,
};
use super::{load, CowTree, Key, NodeRef, NodeStore, TreeError, Value, MAX_INLINE};

/// One internal node on the way from the root to a leaf.
struct PathStep {
    nref: Arc<NodeRef>,
    node: Arc<Node>,
    /// The child we descended into.
    index: usize,
    /// Upper bound of this node's keys; `None` for the rightmost node of its level.
    upper: Option<Key>,
    /// A neighbour of child `index` (at the given index), loaded in case the child underflows.
    sibling: Option<(usize, Arc<Node>)>,
}

struct Descent {
    path: Vec<PathStep>,
    leaf_ref: Arc<NodeRef>,
    leaf: Arc<Node>,
    upper: Option<Key>,
}

/// A node that replaces (part of) a child entry: its first key (`None` if empty), level and size.
struct Piece {
    first: Option<Key>,
    level: u8,
    size_bytes: usize,
    /// Lost bytes in this operation. Only a node that shrank below `NODE_MIN` is merged: a
    /// small rightmost node that grows (sequential appends) is left to fill up.
    shrank: bool,
    nref: Arc<NodeRef>,
}

impl CowTree {
    /// Inserts or replaces an item; returns the old value.
    pub fn insert(
        &mut self,
        store: &dyn NodeStore,
        key: Key,
        value: Value,
    ) -> Result<Option<Value>, TreeError> {
        if let Value::Inline(bytes) = &value {
            if bytes.len() > MAX_INLINE {
                return Err(TreeError::InlineTooLarge {
                    len: bytes.len(),
                    max: MAX_INLINE,
                });
            }
        }
        let Some(root) = self.root.clone() else {
            let leaf = Node::new_leaf(vec![(key, value)]);
            self.root = Some(self.new_ref(leaf));
            self.dirty = true;
            return Ok(None);
        };
        let mut descent = self.descend(store, root, &key)?;
        let Body::Leaf(items) = &descent.leaf.body else {
            unreachable!("descent ends at a leaf")
        };
        let position = items.binary_search_by(|(k, _)| k.cmp(&key));
        let size_bytes_new = match position {
            Ok(index) => descent.leaf.size_bytes() - item_size(&items[index].1) + item_size(&value),
            Err(_) => descent.leaf.size_bytes() + item_size(&value),
        };
        let append = descent.upper.is_none() && position == Err(items.len());
        let shrank = size_bytes_new < descent.leaf.size_bytes();
        if shrank && size_bytes_new < NODE_MIN {
            // Replacing a value by a smaller one can underflow the leaf.
            self.load_siblings(store, &mut descent.path)?;
        }

        // Apply: nothing below can fail.
        let mut leaf = self.take_owned(&descent.leaf_ref, descent.leaf);
        let old = match position {
            Ok(index) => Some(leaf.leaf_set(index, value)),
            Err(index) => {
                leaf.leaf_insert(index, key, value);
                None
            }
        };
        assert_eq!(leaf.size_bytes(), size_bytes_new);
        self.dirty = true;
        let pieces = self.install_split(&descent.leaf_ref, leaf, append, shrank);
        self.propagate(descent.path, pieces);
        Ok(old)
    }

    /// Removes an item; returns its value, or `None` (and changes nothing) if it was absent.
    pub fn remove(&mut self, store: &dyn NodeStore, key: &Key) -> Result<Option<Value>, TreeError> {
        let Some(root) = self.root.clone() else {
            return Ok(None);
        };
        let mut descent = self.descend(store, root, key)?;
        let Body::Leaf(items) = &descent.leaf.body else {
            unreachable!("descent ends at a leaf")
        };
        let Ok(index) = items.binary_search_by(|(k, _)| k.cmp(key)) else {
            return Ok(None);
        };
        if descent.leaf.size_bytes() - item_size(&items[index].1) < NODE_MIN {
            self.load_siblings(store, &mut descent.path)?;
        }

        // Apply: nothing below can fail.
        let mut leaf = self.take_owned(&descent.leaf_ref, descent.leaf);
        let (removed_key, old) = leaf.leaf_remove(index);
        assert_eq!(removed_key, *key);
        self.dirty = true;
        let pieces = self.install_split(&descent.leaf_ref, leaf, false, true);
        assert_eq!(pieces.len(), 1, "a removal never splits");
        self.propagate(descent.path, pieces);
        Ok(Some(old))
    }

    fn descend(
        &self,
        store: &dyn NodeStore,
        root: Arc<NodeRef>,
        key: &Key,
    ) -> Result<Descent, TreeError> {
        let mut path = Vec::new();
        let mut current = root;
        let mut expect = Expect::ROOT;
        loop {
            let node = load(store, &current, &expect)?;
            let Body::Internal(children) = &node.body else {
                return Ok(Descent {
                    path,
                    leaf_ref: current,
                    leaf: node,
                    upper: expect.upper,
                });
            };
            // `load` checked each level against its parent, so this holds for any tree.
            assert!(path.len() < usize::from(MAX_LEVEL));
            let index = child_index(children, key);
            let next = children[index].1.clone();
            let upper = expect.upper;
            expect = Expect::child(&node, index, upper);
            path.push(PathStep {
                nref: current,
                node,
                index,
                upper,
                sibling: None,
            });
            current = next;
        }
    }

    /// Loads, bottom-up, the sibling each level needs if the level below underflows, for as
    /// long as a merge there could in turn underflow the level above.
    fn load_siblings(&self, store: &dyn NodeStore, path: &mut [PathStep]) -> Result<(), TreeError> {
        for depth in (0..path.len()).rev() {
            let step = &mut path[depth];
            let Body::Internal(children) = &step.node.body else {
                unreachable!("the path holds internal nodes")
            };
            if children.len() > 1 {
                let index = if step.index > 0 {
                    step.index - 1
                } else {
                    step.index + 1
                };
                let expect = Expect::child(&step.node, index, step.upper);
                let sibling = load(store, &children[index].1, &expect)?;
                step.sibling = Some((index, sibling));
            }
            // A merge below removes at most one entry from this node.
            let may_underflow = step.node.size_bytes() - ENTRY_SIZE < NODE_MIN;
            if depth == 0 || !may_underflow {
                break;
            }
        }
        Ok(())
    }

    /// Carries the pieces that replace the changed child up the path, then sets the root.
    fn propagate(&mut self, mut path: Vec<PathStep>, mut pieces: Vec<Piece>) {
        while let Some(step) = path.pop() {
            match self.apply_level(step, pieces) {
                Some(next) => pieces = next,
                None => return,
            }
        }
        self.set_root(pieces);
    }

    /// Replaces child `step.index` of `step.node` by `pieces`, merging or rebalancing an
    /// underfull piece with the preloaded sibling. Returns the pieces that replace `step.node`
    /// itself, or `None` if its entry in its own parent stays exactly as it was.
    fn apply_level(&mut self, step: PathStep, mut pieces: Vec<Piece>) -> Option<Vec<Piece>> {
        let PathStep {
            nref,
            node,
            index,
            upper,
            sibling,
        } = step;
        let Body::Internal(children) = &node.body else {
            unreachable!("the path holds internal nodes")
        };
        let count_before = children.len();
        let underfull = pieces.len() == 1 && pieces[0].shrank && pieces[0].size_bytes < NODE_MIN;
        let (range, entries): (Range<usize>, Vec<(Key, Arc<NodeRef>)>) = match sibling {
            Some((sibling_index, sibling_node)) if underfull => {
                let sibling_ref = children[sibling_index].1.clone();
                let piece = pieces.pop().expect("one piece");
                self.merge_or_rebalance(index, piece, sibling_index, sibling_ref, sibling_node)
            }
            _ if pieces.len() == 1 && pieces[0].first.is_none() => {
                // An empty child without a sibling to merge with: drop its entry.
                let piece = pieces.pop().expect("one piece");
                self.discard(&piece.nref);
                (index..index + 1, Vec::new())
            }
            _ => {
                let (key, child) = &children[index];
                if pieces.len() == 1
                    && pieces[0].first == Some(*key)
                    && Arc::ptr_eq(&pieces[0].nref, child)
                {
                    return None;
                }
                let entries = pieces
                    .into_iter()
                    .map(|p| (p.first.expect("only a lone piece can be empty"), p.nref))
                    .collect();
                (index..index + 1, entries)
            }
        };
        let append = upper.is_none() && range.end == count_before && entries.len() > range.len();
        let shrank = entries.len() < range.len();
        let mut parent = self.take_owned(&nref, node);
        parent.splice_children(range, entries);
        Some(self.install_split(&nref, parent, append, shrank))
    }

    /// Joins the underfull `piece` (at `index`) with its sibling: into one node if both fit,
    /// else into two balanced ones. Returns the parent range to replace and its new entries.
    fn merge_or_rebalance(
        &mut self,
        index: usize,
        piece: Piece,
        sibling_index: usize,
        sibling_ref: Arc<NodeRef>,
        sibling_node: Arc<Node>,
    ) -> (Range<usize>, Vec<(Key, Arc<NodeRef>)>) {
        assert_eq!(index.abs_diff(sibling_index), 1);
        let piece_node = self.take_private(&piece.nref);
        let sibling = self.take_owned(&sibling_ref, sibling_node);
        assert_eq!(piece_node.level(), sibling.level());
        let (low, left_ref, mut left, right_ref, right) = if sibling_index < index {
            (sibling_index, sibling_ref, sibling, piece.nref, piece_node)
        } else {
            (index, piece.nref, piece_node, sibling_ref, sibling)
        };
        let fits = left.size_bytes() + right.size_bytes() - super::node::HEADER_SIZE <= NODE_MAX;
        left.append(right);
        if fits {
            let first = left.first_key().expect("the sibling is not empty");
            let merged = self.install(&left_ref, left);
            self.discard(&right_ref);
            (low..low + 2, vec![(first, merged)])
        } else {
            let right = left.split(false);
            assert!(left.size_bytes() >= NODE_MIN && right.size_bytes() >= NODE_MIN);
            let left_first = left.first_key().expect("non-empty half");
            let right_first = right.first_key().expect("non-empty half");
            let left_new = self.install(&left_ref, left);
            let right_new = self.install(&right_ref, right);
            (
                low..low + 2,
                vec![(left_first, left_new), (right_first, right_new)],
            )
        }
    }

    /// Makes `pieces` (what replaces the old root) the root: grows a level after a split,
    /// empties the tree, or collapses internal roots with a single child.
    fn set_root(&mut self, mut pieces: Vec<Piece>) {
        match pieces.len() {
            1 => {
                let piece = pieces.pop().expect("one piece");
                if piece.first.is_none() {
                    self.discard(&piece.nref);
                    self.root = None;
                    return;
                }
                self.root = Some(piece.nref);
                self.collapse_root();
            }
            2 => {
                let level = pieces[0].level + 1;
                assert!(level <= MAX_LEVEL, "tree taller than MAX_LEVEL");
                let entries = pieces
                    .into_iter()
                    .map(|p| (p.first.expect("split halves are not empty"), p.nref))
                    .collect();
                self.root = Some(self.new_ref(Node::new_internal(level, entries)));
            }
            count => unreachable!("{count} pieces for the root"),
        }
    }

    fn collapse_root(&mut self) {
        for _ in 0..=MAX_LEVEL {
            let Some(root) = self.root.clone() else {
                return;
            };
            let node = root.node.read().clone();
            let Some(node) = node else { return };
            let Body::Internal(children) = &node.body else {
                return;
            };
            match children.len() {
                0 => self.root = None,
                1 => self.root = Some(children[0].1.clone()),
                _ => return,
            }
            self.discard(&root);
        }
    }

    /// Whether `nref` belongs to the live tree alone (and may change in place).
    fn is_private(&self, nref: &NodeRef) -> bool {
        let private = nref.generation == self.generation;
        assert!(
            !private || nref.bp.get().is_none(),
            "private node with a bp"
        );
        private
    }

    fn new_ref(&self, node: Node) -> Arc<NodeRef> {
        Arc::new(NodeRef::dirty(node, self.generation))
    }

    /// Moves the contents out of a private node; `install` puts them back.
    fn take_private(&self, nref: &NodeRef) -> Node {
        assert!(self.is_private(nref));
        let node = nref.node.write().take().expect("private node is in memory");
        Arc::unwrap_or_clone(node)
    }

    /// An owned copy of the contents to change: moved out of a private node (free), cloned
    /// from a shared one (which stays untouched).
    fn take_owned(&self, nref: &NodeRef, node: Arc<Node>) -> Node {
        if self.is_private(nref) {
            drop(node);
            self.take_private(nref)
        } else {
            Arc::unwrap_or_clone(node)
        }
    }

    /// Stores the new contents of `nref`: in place if private, else in a new private node,
    /// with `nref` put on the obsolete list.
    fn install(&mut self, nref: &Arc<NodeRef>, node: Node) -> Arc<NodeRef> {
        if self.is_private(nref) {
            let mut slot = nref.node.write();
            assert!(slot.is_none(), "install without take");
            *slot = Some(Arc::new(node));
            nref.clone()
        } else {
            self.obsolete.push(nref.clone());
            self.new_ref(node)
        }
    }

    /// `install`, splitting first if the node outgrew `NODE_MAX`.
    fn install_split(
        &mut self,
        nref: &Arc<NodeRef>,
        mut node: Node,
        append: bool,
        shrank: bool,
    ) -> Vec<Piece> {
        let right = (node.size_bytes() > NODE_MAX).then(|| node.split(append));
        assert!(
            right.is_none() || !shrank,
            "a node that shrank cannot overflow"
        );
        let mut pieces = vec![Piece {
            first: node.first_key(),
            level: node.level(),
            size_bytes: node.size_bytes(),
            shrank,
            nref: self.install(nref, node),
        }];
        if let Some(right) = right {
            pieces.push(Piece {
                first: right.first_key(),
                level: right.level(),
                size_bytes: right.size_bytes(),
                shrank: false,
                nref: self.new_ref(right),
            });
        }
        pieces
    }

    /// `nref` leaves the tree: shared nodes become obsolete, private ones just go away.
    fn discard(&mut self, nref: &Arc<NodeRef>) {
        if !self.is_private(nref) {
            self.obsolete.push(nref.clone());
        }
    }
}
