//! Tree nodes in memory, their size accounting, split/merge arithmetic, and their on-disk
//! encoding (the byte table is in the header of `tree.rs`).
//!
//! A [`Node`] never touches the store: the caller hands it loaded children (as `NodeRef`s) and
//! written data blocks, and gets bytes back. Everything in here is pure, so the decoder can be
//! fed garbage by property tests.
//!
//! Nodes come from devices: decoding one never panics, and arithmetic on decoded values is
//! checked (`clippy::arithmetic_side_effects` is denied here). A decoded node's size is the
//! length of its bytes; the size accounting of nodes in memory checks its own consistency.

#![deny(clippy::arithmetic_side_effects)]

use std::ops::Range;
use std::sync::Arc;

use tank_block::{BlockPtr, BLKPTR_SIZE};

use super::{BlockRef, Key, NodeRef, TreeError, Value, MAX_INLINE};

/// "TREE" read as a little-endian u32.
pub(crate) const NODE_MAGIC: u32 = 0x5452_4545;
/// Bumped on any change to the byte layout below.
pub(crate) const NODE_VERSION: u8 = 1;
/// Largest serialized node. 16 KiB keeps a leaf of small items (20 + value bytes each) at a few
/// hundred items and gives internal nodes a fan-out of 112, so 3 levels index ~1.4 M leaves.
pub const NODE_MAX: usize = 16 * 1024;
/// A non-root node that falls below this many bytes is merged with or rebalanced against a
/// sibling (a quarter of `NODE_MAX`, so deletes keep the tree within 4x of its ideal size).
pub const NODE_MIN: usize = NODE_MAX / 4;
/// Deepest tree accepted: levels 0..=MAX_LEVEL. Bounds every recursion over the tree; a
/// fan-out of at least 2 already makes 2^16 leaves, and real fan-outs are > 28.
pub const MAX_LEVEL: u8 = 16;

pub(crate) const HEADER_SIZE: usize = 8;
pub(crate) const KEY_SIZE: usize = 17;
/// Internal node entry: first key of the child subtree + the child's block pointer.
pub(crate) const ENTRY_SIZE: usize = KEY_SIZE + BLKPTR_SIZE;
/// Leaf item with an inline value: key, type byte, u16 length, then the bytes.
pub(crate) const ITEM_INLINE_OVERHEAD: usize = KEY_SIZE + 1 + 2;
/// Leaf item that references a data block: key, type byte, block pointer.
pub(crate) const ITEM_BLOCK_SIZE: usize = KEY_SIZE + 1 + BLKPTR_SIZE;
pub(crate) const ITEM_SIZE_MAX: usize = ITEM_INLINE_OVERHEAD + MAX_INLINE;

const VALUE_INLINE: u8 = 0;
const VALUE_BLOCK: u8 = 1;

// A node that overflowed by one item splits into two halves that each fit: the larger half is
// at most (NODE_MAX + ITEM_SIZE_MAX) / 2 + ITEM_SIZE_MAX bytes.
const _: () = assert!(3 * ITEM_SIZE_MAX + HEADER_SIZE <= NODE_MAX);
// A rebalance of two nodes that do not fit in one leaves both halves above NODE_MIN.
const _: () = assert!((NODE_MAX - HEADER_SIZE - ITEM_SIZE_MAX) / 2 + HEADER_SIZE >= NODE_MIN);
// Internal nodes: a split of MAX+1 entries leaves both halves above NODE_MIN.
const _: () = assert!(((NODE_MAX - HEADER_SIZE) / ENTRY_SIZE).div_ceil(2) * ENTRY_SIZE >= NODE_MIN);
// The item count fits the u16 header field even for empty inline values.
const _: () = assert!((NODE_MAX - HEADER_SIZE) / ITEM_INLINE_OVERHEAD <= u16::MAX as usize);
const _: () = assert!(MAX_INLINE <= u16::MAX as usize);
const _: () = assert!(ITEM_BLOCK_SIZE <= ITEM_SIZE_MAX);

/// One node of the tree. `size_bytes` is always the exact serialized size.
#[derive(Clone, Debug)]
pub(crate) struct Node {
    level: u8,
    size_bytes: usize,
    pub(crate) body: Body,
}

#[derive(Clone, Debug)]
pub(crate) enum Body {
    /// Level 0: items in strictly increasing key order.
    Leaf(Vec<(Key, Value)>),
    /// Level >= 1: (first key of the child subtree, child), strictly increasing keys.
    Internal(Vec<(Key, Arc<NodeRef>)>),
}

/// Serialized size of a leaf item holding `value`.
#[allow(clippy::arithmetic_side_effects)] // A slice's length is at most isize::MAX: no overflow.
pub(crate) fn item_size(value: &Value) -> usize {
    match value {
        Value::Inline(bytes) => ITEM_INLINE_OVERHEAD + bytes.len(),
        Value::Block(_) => ITEM_BLOCK_SIZE,
    }
}

/// Serialized size of a node whose entries take `sizes` bytes each (a size that saturates is
/// far above `NODE_MAX`, too large all the same).
fn node_size(sizes: impl IntoIterator<Item = usize>) -> usize {
    sizes.into_iter().fold(HEADER_SIZE, usize::saturating_add)
}

/// Serialized size of an internal node of `count` entries.
fn internal_size(count: usize) -> usize {
    count.saturating_mul(ENTRY_SIZE).saturating_add(HEADER_SIZE)
}

/// Index of the child whose subtree may hold `key`: the last entry with first key <= `key`,
/// or 0 when `key` sorts before every entry (inserts then go to the leftmost child).
pub(crate) fn child_index(children: &[(Key, Arc<NodeRef>)], key: &Key) -> usize {
    children
        .partition_point(|(k, _)| k <= key)
        .saturating_sub(1)
}

impl Node {
    pub(crate) fn new_leaf(items: Vec<(Key, Value)>) -> Node {
        let size_bytes = node_size(items.iter().map(|(_, v)| item_size(v)));
        Node {
            level: 0,
            size_bytes,
            body: Body::Leaf(items),
        }
    }

    pub(crate) fn new_internal(level: u8, children: Vec<(Key, Arc<NodeRef>)>) -> Node {
        assert!((1..=MAX_LEVEL).contains(&level), "internal level {level}");
        let size_bytes = internal_size(children.len());
        Node {
            level,
            size_bytes,
            body: Body::Internal(children),
        }
    }

    pub(crate) fn level(&self) -> u8 {
        self.level
    }

    pub(crate) fn size_bytes(&self) -> usize {
        self.size_bytes
    }

    pub(crate) fn len(&self) -> usize {
        match &self.body {
            Body::Leaf(items) => items.len(),
            Body::Internal(children) => children.len(),
        }
    }

    pub(crate) fn first_key(&self) -> Option<Key> {
        match &self.body {
            Body::Leaf(items) => items.first().map(|(k, _)| *k),
            Body::Internal(children) => children.first().map(|(k, _)| *k),
        }
    }

    pub(crate) fn last_key(&self) -> Option<Key> {
        match &self.body {
            Body::Leaf(items) => items.last().map(|(k, _)| *k),
            Body::Internal(children) => children.last().map(|(k, _)| *k),
        }
    }

    /// Size recomputed from the entries; equal to `size_bytes` unless a mutator has a bug.
    pub(crate) fn computed_size(&self) -> usize {
        match &self.body {
            Body::Leaf(items) => node_size(items.iter().map(|(_, v)| item_size(v))),
            Body::Internal(children) => internal_size(children.len()),
        }
    }

    pub(crate) fn keys_strictly_increasing(&self) -> bool {
        match &self.body {
            Body::Leaf(items) => items.windows(2).all(|w| w[0].0 < w[1].0),
            Body::Internal(children) => children.windows(2).all(|w| w[0].0 < w[1].0),
        }
    }

    /// Accounts for entries of `added` bytes put in and `removed` bytes taken out.
    fn adjust_size(&mut self, added: usize, removed: usize) {
        self.size_bytes = self
            .size_bytes
            .checked_add(added)
            .and_then(|size| size.checked_sub(removed))
            .filter(|&size| size >= HEADER_SIZE)
            .expect("the size counts the node's entries");
    }

    fn leaf_items_mut(&mut self) -> &mut Vec<(Key, Value)> {
        match &mut self.body {
            Body::Leaf(items) => items,
            Body::Internal(_) => panic!("leaf operation on an internal node"),
        }
    }

    pub(crate) fn leaf_insert(&mut self, index: usize, key: Key, value: Value) {
        let size = item_size(&value);
        let items = self.leaf_items_mut();
        let (before, after) = items.split_at(index);
        assert!(before.last().is_none_or(|(k, _)| *k < key));
        assert!(after.first().is_none_or(|(k, _)| key < *k));
        items.insert(index, (key, value));
        self.adjust_size(size, 0);
    }

    /// Replaces the value at `index`, returning the old one.
    pub(crate) fn leaf_set(&mut self, index: usize, value: Value) -> Value {
        let size_new = item_size(&value);
        let items = self.leaf_items_mut();
        let old = std::mem::replace(&mut items[index].1, value);
        self.adjust_size(size_new, item_size(&old));
        old
    }

    pub(crate) fn leaf_remove(&mut self, index: usize) -> (Key, Value) {
        let (key, value) = self.leaf_items_mut().remove(index);
        self.adjust_size(0, item_size(&value));
        (key, value)
    }

    /// Replaces the child entries in `range` by `entries`.
    pub(crate) fn splice_children(
        &mut self,
        range: Range<usize>,
        entries: Vec<(Key, Arc<NodeRef>)>,
    ) {
        let Body::Internal(children) = &mut self.body else {
            panic!("child operation on a leaf");
        };
        children.splice(range, entries);
        self.size_bytes = internal_size(children.len());
        debug_assert!(self.keys_strictly_increasing());
    }

    /// Moves every entry of `right` (whose keys all sort after ours) to the end of this node.
    pub(crate) fn append(&mut self, right: Node) {
        assert_eq!(self.level, right.level);
        if let (Some(last), Some(first)) = (self.last_key(), right.first_key()) {
            assert!(last < first, "merge of overlapping nodes");
        }
        match (&mut self.body, right.body) {
            (Body::Leaf(a), Body::Leaf(b)) => a.extend(b),
            (Body::Internal(a), Body::Internal(b)) => a.extend(b),
            _ => unreachable!("same level implies same kind"),
        }
        self.adjust_size(right.size_bytes, HEADER_SIZE);
    }

    /// Splits this node in two, keeping the left part and returning the right part.
    ///
    /// `append` says the node is the rightmost of its level and grew at its end (sequential
    /// inserts): the left part then keeps everything but the last entry, so a stream of
    /// ascending keys leaves full nodes behind instead of half-full ones.
    pub(crate) fn split(&mut self, append: bool) -> Node {
        let count = self.len();
        assert!(count >= 2, "split of a node with {count} entries");
        let sizes: Vec<usize> = match &self.body {
            Body::Leaf(items) => items.iter().map(|(_, v)| item_size(v)).collect(),
            Body::Internal(children) => vec![ENTRY_SIZE; children.len()],
        };
        // Every entry but the last: what an append split keeps.
        let (_, all_but_last) = sizes.split_last().expect("two entries or more");
        let index = if append && node_size(all_but_last.iter().copied()) <= NODE_MAX {
            all_but_last.len()
        } else {
            split_index(&sizes)
        };
        let (left_sizes, right_sizes) = sizes.split_at(index.clamp(1, all_but_last.len()));
        let right_body = match &mut self.body {
            Body::Leaf(items) => Body::Leaf(items.split_off(left_sizes.len())),
            Body::Internal(children) => Body::Internal(children.split_off(left_sizes.len())),
        };
        self.size_bytes = node_size(left_sizes.iter().copied());
        let right = Node {
            level: self.level,
            size_bytes: node_size(right_sizes.iter().copied()),
            body: right_body,
        };
        assert!(
            self.size_bytes <= NODE_MAX,
            "left half of a split does not fit"
        );
        assert!(
            right.size_bytes <= NODE_MAX,
            "right half of a split does not fit"
        );
        right
    }

    /// Serializes the node. Every child and every data block must already be written: the sync
    /// writes bottom-up, so this is a programmer error, not a data error.
    pub(crate) fn encode(&self) -> Vec<u8> {
        assert!(self.size_bytes <= NODE_MAX, "encoding an oversized node");
        let count = self.len();
        assert!(count >= 1, "encoding an empty node");
        let mut out = Vec::with_capacity(self.size_bytes);
        out.extend_from_slice(&NODE_MAGIC.to_le_bytes());
        out.push(NODE_VERSION);
        out.push(self.level);
        out.extend_from_slice(&u16::try_from(count).expect("count fits u16").to_le_bytes());
        match &self.body {
            Body::Leaf(items) => {
                for (key, value) in items {
                    out.extend_from_slice(&key.encode());
                    match value {
                        Value::Inline(bytes) => {
                            out.push(VALUE_INLINE);
                            let len = u16::try_from(bytes.len()).expect("inline value fits u16");
                            out.extend_from_slice(&len.to_le_bytes());
                            out.extend_from_slice(bytes);
                        }
                        Value::Block(block) => {
                            out.push(VALUE_BLOCK);
                            let bp = block.bp().expect("data block written before its leaf");
                            out.extend_from_slice(&bp.encode());
                        }
                    }
                }
            }
            Body::Internal(children) => {
                for (key, child) in children {
                    out.extend_from_slice(&key.encode());
                    let bp = child.bp().expect("child written before its parent");
                    out.extend_from_slice(&bp.encode());
                }
            }
        }
        assert_eq!(out.len(), self.size_bytes);
        out
    }

    /// Parses untrusted bytes. Never panics; every inconsistency is `TreeError::Corrupt`.
    /// Zero bytes after the last entry (sector padding) are accepted, anything else is not.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Node, TreeError> {
        let mut reader = Reader { bytes, offset: 0 };
        let magic = reader.u32()?;
        if magic != NODE_MAGIC {
            return Err(corrupt(format!("bad node magic {magic:#010x}")));
        }
        let version = reader.u8()?;
        if version != NODE_VERSION {
            return Err(corrupt(format!("unknown node version {version}")));
        }
        let level = reader.u8()?;
        if level > MAX_LEVEL {
            return Err(corrupt(format!("node level {level} above {MAX_LEVEL}")));
        }
        let count = usize::from(reader.u16()?);
        if count == 0 {
            return Err(corrupt("node with no entries".into()));
        }
        // Never trust `count` for an allocation larger than the bytes could describe.
        let capacity = count.min(bytes.len() / ITEM_INLINE_OVERHEAD);
        let node = if level == 0 {
            let mut items: Vec<(Key, Value)> = Vec::with_capacity(capacity);
            for _ in 0..count {
                let key = reader.key()?;
                if let Some((prev, _)) = items.last() {
                    if *prev >= key {
                        return Err(corrupt(format!("leaf keys out of order at {key:?}")));
                    }
                }
                let value = match reader.u8()? {
                    VALUE_INLINE => {
                        let len = usize::from(reader.u16()?);
                        if len > MAX_INLINE {
                            return Err(corrupt(format!("inline value of {len} bytes")));
                        }
                        Value::Inline(Arc::from(reader.take(len)?))
                    }
                    VALUE_BLOCK => Value::Block(BlockRef::new_written(reader.bp()?)),
                    other => return Err(corrupt(format!("unknown value type {other}"))),
                };
                items.push((key, value));
            }
            Node::new_leaf(items)
        } else {
            let mut children: Vec<(Key, Arc<NodeRef>)> = Vec::with_capacity(capacity);
            for _ in 0..count {
                let key = reader.key()?;
                if let Some((prev, _)) = children.last() {
                    if *prev >= key {
                        return Err(corrupt(format!("internal keys out of order at {key:?}")));
                    }
                }
                children.push((key, Arc::new(NodeRef::written(reader.bp()?))));
            }
            Node::new_internal(level, children)
        };
        if reader.bytes[reader.offset..].iter().any(|&b| b != 0) {
            return Err(corrupt("trailing bytes after the last node entry".into()));
        }
        if node.size_bytes > NODE_MAX {
            return Err(corrupt(format!(
                "node of {} bytes above {NODE_MAX}",
                node.size_bytes
            )));
        }
        debug_assert_eq!(node.size_bytes, reader.offset);
        Ok(node)
    }
}

/// The index that cuts `sizes` closest to two equal halves (the later cut on a tie).
fn split_index(sizes: &[usize]) -> usize {
    let half = sizes.iter().copied().fold(0, usize::saturating_add) / 2;
    let mut before = 0usize;
    for (index, &size) in sizes.iter().enumerate() {
        let after = before.saturating_add(size);
        if after >= half {
            // Cut before or after this entry, whichever is nearer the middle.
            return if after.abs_diff(half) <= half.abs_diff(before) {
                index.saturating_add(1)
            } else {
                index
            };
        }
        before = after;
    }
    sizes.len()
}

fn corrupt(message: String) -> TreeError {
    TreeError::Corrupt(message)
}

/// What a parent (or the caller, for a root) knows about a child before loading it; checked
/// against every node read from the store.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Expect {
    pub(crate) level: Option<u8>,
    /// The child's first key (the parent's entry key).
    pub(crate) first: Option<Key>,
    /// Every key of the child sorts before this (the next entry key of some ancestor).
    pub(crate) upper: Option<Key>,
}

impl Expect {
    pub(crate) const ROOT: Expect = Expect {
        level: None,
        first: None,
        upper: None,
    };

    /// What entry `index` of internal node `parent` (bounded above by `parent_upper`) must hold.
    pub(crate) fn child(parent: &Node, index: usize, parent_upper: Option<Key>) -> Expect {
        let Body::Internal(children) = &parent.body else {
            panic!("child expectation of a leaf");
        };
        let [(first, _), rest @ ..] = &children[index..] else {
            panic!("child {index} of a node of {} entries", children.len());
        };
        Expect {
            // An internal node is at level 1 or above.
            level: Some(parent.level.saturating_sub(1)),
            first: Some(*first),
            upper: rest.first().map(|(k, _)| *k).or(parent_upper),
        }
    }

    pub(crate) fn check(&self, node: &Node) -> Result<(), TreeError> {
        if let Some(level) = self.level {
            if node.level != level {
                return Err(corrupt(format!(
                    "node at level {} where {level} expected",
                    node.level
                )));
            }
        }
        if let Some(first) = self.first {
            if node.first_key() != Some(first) {
                return Err(corrupt(format!(
                    "node starts at {:?} but its parent says {first:?}",
                    node.first_key()
                )));
            }
        }
        if let (Some(upper), Some(last)) = (self.upper, node.last_key()) {
            if last >= upper {
                return Err(corrupt(format!(
                    "node key {last:?} not below its bound {upper:?}"
                )));
            }
        }
        Ok(())
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    offset: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, len: usize) -> Result<&'a [u8], TreeError> {
        let end = self
            .offset
            .checked_add(len)
            .filter(|&end| end <= self.bytes.len());
        let end = end.ok_or_else(|| corrupt("node truncated".into()))?;
        let out = &self.bytes[self.offset..end];
        self.offset = end;
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, TreeError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, TreeError> {
        let raw = self.take(2)?;
        Ok(u16::from_le_bytes([raw[0], raw[1]]))
    }

    fn u32(&mut self) -> Result<u32, TreeError> {
        let raw = self.take(4)?;
        Ok(u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]))
    }

    fn key(&mut self) -> Result<Key, TreeError> {
        let raw: &[u8; KEY_SIZE] = self
            .take(KEY_SIZE)?
            .try_into()
            .expect("took KEY_SIZE bytes");
        Ok(Key::decode(raw))
    }

    /// A non-hole block pointer.
    fn bp(&mut self) -> Result<BlockPtr, TreeError> {
        let raw = self.take(BLKPTR_SIZE)?;
        match BlockPtr::decode(raw) {
            Ok(Some(bp)) => Ok(bp),
            Ok(None) => Err(corrupt("hole block pointer in a tree node".into())),
            Err(e) => Err(corrupt(format!("bad block pointer in a tree node: {e}"))),
        }
    }
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)] // Tests, the property tests too, use small known values.
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tank_block::{BlockKind, ChecksumKind, Compression, Dva};

    fn bp(offset: u64) -> BlockPtr {
        BlockPtr {
            dvas: [
                Dva {
                    vdev: 0,
                    asize: 512,
                    offset,
                },
                Dva::default(),
                Dva::default(),
            ],
            kind: BlockKind::TreeNode,
            level: 0,
            checksum_kind: ChecksumKind::Blake3,
            compression: Compression::Off,
            lsize: 512,
            psize: 512,
            birth_txg: 3,
            fill: 1,
            checksum: [offset as u8; 32],
            gang: false,
        }
    }

    fn key(obj: u64, offset: u64) -> Key {
        Key {
            obj,
            kind: 1,
            offset,
        }
    }

    fn inline(len: usize) -> Value {
        Value::Inline(vec![len as u8; len].into())
    }

    fn same_value(a: &Value, b: &Value) -> bool {
        match (a, b) {
            (Value::Inline(x), Value::Inline(y)) => x == y,
            (Value::Block(x), Value::Block(y)) => x.bp() == y.bp(),
            _ => false,
        }
    }

    #[test]
    fn key_order_and_encoding() {
        let a = Key {
            obj: 1,
            kind: 9,
            offset: u64::MAX,
        };
        let b = Key {
            obj: 2,
            kind: 0,
            offset: 0,
        };
        let c = Key {
            obj: 2,
            kind: 1,
            offset: 0,
        };
        assert!(a < b && b < c);
        for k in [a, b, c, Key::MIN, Key::MAX] {
            assert_eq!(Key::decode(&k.encode()), k);
        }
        assert_eq!(&a.encode()[..8], &1u64.to_le_bytes());
        assert_eq!(a.encode()[8], 9);
    }

    #[test]
    fn leaf_round_trip() {
        let items = vec![
            (key(1, 0), inline(0)),
            (key(1, 5), inline(3072)),
            (key(2, 0), Value::Block(BlockRef::new_written(bp(4096)))),
            (key(3, 7), inline(17)),
        ];
        let node = Node::new_leaf(items.clone());
        let bytes = node.encode();
        assert_eq!(bytes.len(), node.size_bytes());
        assert_eq!(&bytes[..4], b"EERT");
        let back = Node::decode(&bytes).unwrap();
        assert_eq!(back.level(), 0);
        assert_eq!(back.size_bytes(), node.size_bytes());
        let Body::Leaf(decoded) = &back.body else {
            panic!("not a leaf")
        };
        assert_eq!(decoded.len(), items.len());
        for ((k1, v1), (k2, v2)) in decoded.iter().zip(&items) {
            assert_eq!(k1, k2);
            assert!(same_value(v1, v2));
        }
        // Sector padding is accepted, other trailing bytes are not.
        let mut padded = bytes.clone();
        padded.resize(bytes.len().next_multiple_of(512), 0);
        assert!(Node::decode(&padded).is_ok());
        padded.push(1);
        assert!(Node::decode(&padded).is_err());
    }

    #[test]
    fn internal_round_trip() {
        let children: Vec<_> = (0..5)
            .map(|i| {
                (
                    key(i * 10, i),
                    Arc::new(NodeRef::written(bp(512 * (i + 1)))),
                )
            })
            .collect();
        let node = Node::new_internal(2, children);
        let bytes = node.encode();
        assert_eq!(bytes.len(), HEADER_SIZE + 5 * ENTRY_SIZE);
        let back = Node::decode(&bytes).unwrap();
        assert_eq!(back.level(), 2);
        let Body::Internal(decoded) = &back.body else {
            panic!("not internal")
        };
        for (i, (k, child)) in decoded.iter().enumerate() {
            assert_eq!(*k, key(i as u64 * 10, i as u64));
            assert_eq!(child.bp(), Some(bp(512 * (i as u64 + 1))));
        }
    }

    #[test]
    fn decode_rejects_inconsistencies() {
        let node = Node::new_leaf(vec![(key(1, 0), inline(4)), (key(1, 1), inline(4))]);
        let good = node.encode();
        let mut bad = good.clone();
        bad[0] ^= 1;
        assert!(matches!(Node::decode(&bad), Err(TreeError::Corrupt(_))));
        let mut bad = good.clone();
        bad[4] = 2; // version
        assert!(Node::decode(&bad).is_err());
        let mut bad = good.clone();
        bad[5] = MAX_LEVEL + 1;
        assert!(Node::decode(&bad).is_err());
        let mut bad = good.clone();
        bad[6] = 3; // count larger than the entries present
        assert!(Node::decode(&bad).is_err());
        let mut bad = good.clone();
        bad[6] = 0; // count zero
        assert!(Node::decode(&bad).is_err());
        // Second key equal to the first: not strictly increasing.
        let mut bad = good.clone();
        let second = HEADER_SIZE + ITEM_INLINE_OVERHEAD + 4;
        bad[second + 9] = 0;
        assert!(Node::decode(&bad).is_err());
        // Unknown value type.
        let mut bad = good.clone();
        bad[HEADER_SIZE + KEY_SIZE] = 7;
        assert!(Node::decode(&bad).is_err());
        // Inline length beyond MAX_INLINE.
        let mut bad = good.clone();
        bad[HEADER_SIZE + KEY_SIZE + 1..HEADER_SIZE + KEY_SIZE + 3]
            .copy_from_slice(&(MAX_INLINE as u16 + 1).to_le_bytes());
        assert!(Node::decode(&bad).is_err());
        assert!(Node::decode(&good[..good.len() - 1]).is_err());
        assert!(Node::decode(&[]).is_err());
        // A hole where a child pointer should be.
        let mut internal =
            Node::new_internal(1, vec![(key(1, 0), Arc::new(NodeRef::written(bp(512))))]).encode();
        internal[HEADER_SIZE + KEY_SIZE..].fill(0);
        assert!(Node::decode(&internal).is_err());
    }

    #[test]
    fn decode_rejects_oversized_node() {
        // Six maximal inline items fit the u16 count but not NODE_MAX.
        let items: Vec<_> = (0..6).map(|i| (key(1, i), inline(MAX_INLINE))).collect();
        let node = Node::new_leaf(items);
        assert!(node.size_bytes() > NODE_MAX);
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&NODE_MAGIC.to_le_bytes());
        bytes.extend_from_slice(&[NODE_VERSION, 0, 6, 0]);
        let Body::Leaf(items) = &node.body else {
            unreachable!()
        };
        for (k, v) in items {
            bytes.extend_from_slice(&k.encode());
            let Value::Inline(data) = v else {
                unreachable!()
            };
            bytes.push(VALUE_INLINE);
            bytes.extend_from_slice(&(data.len() as u16).to_le_bytes());
            bytes.extend_from_slice(data);
        }
        assert!(matches!(Node::decode(&bytes), Err(TreeError::Corrupt(_))));
    }

    #[test]
    fn expect_checks_level_and_bounds() {
        let node = Node::new_leaf(vec![(key(1, 0), inline(1)), (key(5, 0), inline(1))]);
        assert!(Expect::ROOT.check(&node).is_ok());
        let ok = Expect {
            level: Some(0),
            first: Some(key(1, 0)),
            upper: Some(key(5, 1)),
        };
        assert!(ok.check(&node).is_ok());
        assert!(Expect {
            level: Some(1),
            ..ok
        }
        .check(&node)
        .is_err());
        assert!(Expect {
            first: Some(key(0, 0)),
            ..ok
        }
        .check(&node)
        .is_err());
        assert!(Expect {
            upper: Some(key(5, 0)),
            ..ok
        }
        .check(&node)
        .is_err());
    }

    #[test]
    fn split_thresholds() {
        // A leaf of maximal items just past NODE_MAX splits into two halves that both fit and
        // both stay above NODE_MIN.
        let mut items = Vec::new();
        let mut node = Node::new_leaf(Vec::new());
        let mut i = 0;
        while node.size_bytes() <= NODE_MAX {
            items.push((key(1, i), inline(MAX_INLINE)));
            node = Node::new_leaf(items.clone());
            i += 1;
        }
        let total = node.size_bytes();
        let right = node.split(false);
        assert!(node.size_bytes() <= NODE_MAX && right.size_bytes() <= NODE_MAX);
        assert!(node.size_bytes() >= NODE_MIN && right.size_bytes() >= NODE_MIN);
        assert_eq!(node.size_bytes() + right.size_bytes() - HEADER_SIZE, total);
        assert_eq!(node.computed_size(), node.size_bytes());
        assert_eq!(right.computed_size(), right.size_bytes());
        assert!(node.last_key() < right.first_key());

        // Small items: an even split by bytes.
        let items: Vec<_> = (0..900).map(|i| (key(1, i), inline(0))).collect();
        let mut node = Node::new_leaf(items);
        assert!(node.size_bytes() > NODE_MAX);
        let right = node.split(false);
        assert_eq!(node.len(), 450);
        assert_eq!(right.len(), 450);

        // Append mode keeps the left node full and moves only the newest entry...
        let count = (NODE_MAX - HEADER_SIZE) / ITEM_INLINE_OVERHEAD + 1;
        let items: Vec<_> = (0..count as u64).map(|i| (key(1, i), inline(0))).collect();
        let mut node = Node::new_leaf(items);
        assert!(node.size_bytes() > NODE_MAX);
        let right = node.split(true);
        assert_eq!(right.len(), 1);
        assert!(node.size_bytes() <= NODE_MAX && node.size_bytes() > NODE_MAX - ITEM_SIZE_MAX);
        // ...but falls back to an even split when the rest would not fit.
        let items: Vec<_> = (0..900).map(|i| (key(1, i), inline(0))).collect();
        let mut node = Node::new_leaf(items);
        let right = node.split(true);
        assert_eq!(right.len(), 450);

        // Internal nodes hold at most this many entries before splitting.
        let max_entries = (NODE_MAX - HEADER_SIZE) / ENTRY_SIZE;
        assert_eq!(max_entries, 112);
        let children: Vec<_> = (0..=max_entries as u64)
            .map(|i| (key(i, 0), Arc::new(NodeRef::written(bp(512 * (i + 1))))))
            .collect();
        let mut node = Node::new_internal(1, children);
        assert!(node.size_bytes() > NODE_MAX);
        let right = node.split(false);
        assert!(node.size_bytes() >= NODE_MIN && right.size_bytes() >= NODE_MIN);
        assert_eq!(node.len() + right.len(), max_entries + 1);
    }

    #[test]
    fn merge_thresholds() {
        // Two underfull leaves merge into one that fits.
        let mut left = Node::new_leaf((0..50).map(|i| (key(1, i), inline(40))).collect());
        let right = Node::new_leaf((50..100).map(|i| (key(1, i), inline(40))).collect());
        assert!(left.size_bytes() < NODE_MIN);
        let combined = left.size_bytes() + right.size_bytes() - HEADER_SIZE;
        left.append(right);
        assert_eq!(left.size_bytes(), combined);
        assert_eq!(left.computed_size(), combined);
        assert_eq!(left.len(), 100);

        // A merge that would not fit is a rebalance: append then split evenly, and both sides
        // end above NODE_MIN.
        let mut left = Node::new_leaf((0..60).map(|i| (key(1, i), inline(40))).collect());
        let right = Node::new_leaf((60..400).map(|i| (key(1, i), inline(40))).collect());
        assert!(left.size_bytes() < NODE_MIN);
        assert!(left.size_bytes() + right.size_bytes() - HEADER_SIZE > NODE_MAX);
        left.append(right);
        let right = left.split(false);
        assert!(left.size_bytes() >= NODE_MIN && right.size_bytes() >= NODE_MIN);
        assert_eq!(left.len() + right.len(), 400);
    }

    proptest! {
        #[test]
        fn decode_garbage_never_panics(raw in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = Node::decode(&raw);
        }

        #[test]
        fn decode_mutated_node_never_panics(
            flips in proptest::collection::vec((0usize..4096, any::<u8>()), 1..8),
            cut in 0usize..4096,
        ) {
            let items: Vec<_> = (0..20u64)
                .map(|i| {
                    let value = if i % 3 == 0 {
                        Value::Block(BlockRef::new_written(bp(512 * (i + 1))))
                    } else {
                        inline(i as usize * 7)
                    };
                    (key(i / 4, i), value)
                })
                .collect();
            let mut bytes = Node::new_leaf(items).encode();
            for (at, byte) in flips {
                let len = bytes.len();
                bytes[at % len] ^= byte;
            }
            let _ = Node::decode(&bytes);
            let _ = Node::decode(&bytes[..cut.min(bytes.len())]);
        }

        #[test]
        fn leaf_encoding_round_trips(
            entries in proptest::collection::btree_map(
                (any::<u64>(), any::<u8>(), any::<u64>()),
                proptest::collection::vec(any::<u8>(), 0..200),
                1..40,
            )
        ) {
            let items: Vec<(Key, Value)> = entries
                .iter()
                .map(|(&(obj, kind, offset), v)| {
                    (Key { obj, kind, offset }, Value::Inline(v.clone().into()))
                })
                .collect();
            let node = Node::new_leaf(items.clone());
            prop_assume!(node.size_bytes() <= NODE_MAX);
            let back = Node::decode(&node.encode()).unwrap();
            let Body::Leaf(decoded) = &back.body else { panic!("not a leaf") };
            prop_assert_eq!(decoded.len(), items.len());
            for ((k1, v1), (k2, v2)) in decoded.iter().zip(&items) {
                prop_assert_eq!(k1, k2);
                prop_assert!(same_value(v1, v2));
            }
        }
    }
}
