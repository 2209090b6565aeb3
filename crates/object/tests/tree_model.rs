//! The copy-on-write tree against a `BTreeMap` model, on an in-memory store that checks the
//! space accounting after every sync.
//!
//! `MemStore` fabricates block pointers (one 512-byte-aligned extent per block, BLAKE3
//! checksums verified on every read) and tracks the live blocks, so each sync can assert that
//! the live set is exactly what the new root reaches: no leaked node, no node freed twice or
//! freed while still reachable. The tests play the object layer's part for data blocks: a
//! data block replaced or removed during a generation is freed at that generation's sync.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tank_block::{BlockKind, BlockPtr, ChecksumKind, Compression, Dva};
use tank_object::tree::{
    BlockRef, BlockUse, CowTree, Key, NodeRef, NodeStore, TreeError, TreeSnapshot, TreeStats,
    Value, WriteKind, MAX_INLINE,
};

// ---- the store ----

#[derive(Default)]
struct MemState {
    blocks: HashMap<u64, Vec<u8>>,
    next_offset: u64,
    birth_txg: u64,
    writes: u64,
    frees: u64,
    fail_reads: bool,
}

#[derive(Default)]
struct MemStore {
    state: Mutex<MemState>,
    /// Slows every write down, so a sync overlaps with work on other threads.
    write_delay: Option<Duration>,
}

impl MemStore {
    fn slow(write_delay: Duration) -> MemStore {
        MemStore {
            write_delay: Some(write_delay),
            ..MemStore::default()
        }
    }

    fn live_offsets(&self) -> BTreeSet<u64> {
        self.state.lock().unwrap().blocks.keys().copied().collect()
    }

    fn set_fail_reads(&self, fail: bool) {
        self.state.lock().unwrap().fail_reads = fail;
    }

    fn counts(&self) -> (u64, u64) {
        let state = self.state.lock().unwrap();
        (state.writes, state.frees)
    }
}

impl NodeStore for MemStore {
    fn read_block(&self, bp: &BlockPtr) -> Result<Vec<u8>, TreeError> {
        let state = self.state.lock().unwrap();
        if state.fail_reads {
            return Err(TreeError::Store("injected read failure".into()));
        }
        let offset = bp.dvas[0].offset;
        let data = state
            .blocks
            .get(&offset)
            .ok_or_else(|| TreeError::Store(format!("read of free block {offset:#x}")))?;
        if data.len() != bp.psize as usize || bp.checksum_kind.compute(data) != bp.checksum {
            return Err(TreeError::Store(format!(
                "checksum mismatch at {offset:#x}"
            )));
        }
        Ok(data.clone())
    }

    fn write_block(&self, data: &[u8], kind: WriteKind) -> Result<BlockPtr, TreeError> {
        if let Some(delay) = self.write_delay {
            std::thread::sleep(delay);
        }
        if data.is_empty() {
            return Err(TreeError::Store("empty block".into()));
        }
        let mut state = self.state.lock().unwrap();
        let asize = (data.len() as u64).next_multiple_of(512);
        let offset = state.next_offset;
        state.next_offset += asize;
        state.birth_txg += 1;
        state.writes += 1;
        let (block_kind, level) = match kind {
            WriteKind::Node { level } => (BlockKind::TreeNode, level),
            WriteKind::Data { .. } => (BlockKind::Data, 0),
        };
        let bp = BlockPtr {
            dvas: [
                Dva {
                    vdev: 0,
                    asize,
                    offset,
                },
                Dva::default(),
                Dva::default(),
            ],
            kind: block_kind,
            level,
            checksum_kind: ChecksumKind::Blake3,
            compression: Compression::Off,
            lsize: data.len() as u32,
            psize: data.len() as u32,
            birth_txg: state.birth_txg,
            fill: 1,
            checksum: ChecksumKind::Blake3.compute(data),
            gang: false,
        };
        state.blocks.insert(offset, data.to_vec());
        Ok(bp)
    }

    fn free_block(&self, bp: &BlockPtr) -> Result<(), TreeError> {
        let mut state = self.state.lock().unwrap();
        let offset = bp.dvas[0].offset;
        if state.blocks.remove(&offset).is_none() {
            return Err(TreeError::Store(format!(
                "free of unknown block {offset:#x}"
            )));
        }
        state.frees += 1;
        Ok(())
    }
}

/// Every written block the tree rooted at `root` reaches, checking the tree's invariants.
fn reachable(store: &MemStore, root: Option<BlockPtr>) -> (BTreeSet<u64>, TreeStats) {
    let tree = CowTree::open(root);
    let mut offsets = BTreeSet::new();
    let stats = tree
        .check(store, &mut |bp, _| {
            assert!(offsets.insert(bp.dvas[0].offset), "block reached twice");
        })
        .expect("tree check");
    (offsets, stats)
}

/// No leak, no double free: the live blocks are exactly those the root reaches.
fn assert_accounting(store: &MemStore, root: Option<BlockPtr>) -> TreeStats {
    let (reached, stats) = reachable(store, root);
    let live = store.live_offsets();
    let leaked: Vec<_> = live.difference(&reached).collect();
    let missing: Vec<_> = reached.difference(&live).collect();
    assert!(leaked.is_empty(), "leaked blocks {leaked:?}");
    assert!(missing.is_empty(), "reachable but freed {missing:?}");
    stats
}

// ---- values ----

fn bytes_for(key: &Key, len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (key.obj as u8) ^ (key.offset as u8).rotate_left(3) ^ seed ^ (i as u8).wrapping_mul(31)
        })
        .collect()
}

fn value_bytes(store: &dyn NodeStore, value: &Value) -> Vec<u8> {
    match value {
        Value::Inline(bytes) => bytes.to_vec(),
        Value::Block(block) => match block.dirty_data() {
            Some(data) => data.to_vec(),
            None => store
                .read_block(&block.bp().expect("written"))
                .expect("data block read"),
        },
    }
}

fn make_value(key: &Key, len: usize, seed: u8, block: bool) -> (Value, Vec<u8>) {
    let bytes = bytes_for(key, len, seed);
    let value = if block {
        Value::Block(BlockRef::new_dirty(Arc::new(bytes.clone()), seed.into()))
    } else {
        Value::Inline(bytes.clone().into())
    };
    (value, bytes)
}

// ---- the harness: tree + model + the object layer's data-block bookkeeping ----

struct Harness {
    store: MemStore,
    tree: CowTree,
    model: BTreeMap<Key, Vec<u8>>,
    /// Data blocks that left the tree this generation; freed by its sync.
    dead_blocks: Vec<Arc<BlockRef>>,
    max_depth: usize,
    syncs: usize,
}

impl Harness {
    fn new() -> Harness {
        Harness {
            store: MemStore::default(),
            tree: CowTree::new_empty(),
            model: BTreeMap::new(),
            dead_blocks: Vec::new(),
            max_depth: 0,
            syncs: 0,
        }
    }

    fn retire(&mut self, old: Option<Value>) {
        if let Some(Value::Block(block)) = old {
            self.dead_blocks.push(block);
        }
    }

    fn insert(&mut self, key: Key, len: usize, seed: u8, block: bool) {
        let (value, bytes) = make_value(&key, len, seed, block);
        let old = self.tree.insert(&self.store, key, value).expect("insert");
        let model_old = self.model.insert(key, bytes);
        assert_eq!(old.as_ref().map(|v| value_bytes(&self.store, v)), model_old);
        self.retire(old);
    }

    fn remove(&mut self, key: &Key) {
        let old = self.tree.remove(&self.store, key).expect("remove");
        let model_old = self.model.remove(key);
        assert_eq!(old.as_ref().map(|v| value_bytes(&self.store, v)), model_old);
        self.retire(old);
    }

    fn check_get(&self, key: &Key) {
        let got = self.tree.get(&self.store, key).expect("get");
        assert_eq!(
            got.map(|v| value_bytes(&self.store, &v)),
            self.model.get(key).cloned()
        );
    }

    fn check_range(&self, start: &Key, end: &Key, limit: usize) {
        let got = self
            .tree
            .range(&self.store, start, end, limit)
            .expect("range");
        let got: Vec<_> = got
            .iter()
            .map(|(k, v)| (*k, value_bytes(&self.store, v)))
            .collect();
        let want: Vec<_> = if start < end {
            self.model
                .range(start..end)
                .take(limit)
                .map(|(k, v)| (*k, v.clone()))
                .collect()
        } else {
            Vec::new()
        };
        assert_eq!(got, want);
    }

    fn check_last_before(&self, before: &Key) {
        let got = self
            .tree
            .last_before(&self.store, before)
            .expect("last_before");
        let got = got.map(|(k, v)| (k, value_bytes(&self.store, &v)));
        let want = self
            .model
            .range(..before)
            .next_back()
            .map(|(k, v)| (*k, v.clone()));
        assert_eq!(got, want);
    }

    fn check_all(&self) {
        self.check_range(&Key::MIN, &Key::MAX, usize::MAX);
        let stats = self.tree.check(&self.store, &mut |_, _| {}).expect("check");
        assert_eq!(stats.items, self.model.len());
        assert_eq!(self.tree.is_empty(), self.model.is_empty());
    }

    /// Snapshot + sync, free the generation's dead data blocks, check the accounting.
    fn sync(&mut self) -> Option<BlockPtr> {
        let dirty = self.tree.is_dirty();
        let (snapshot, obsolete) = self.tree.snapshot();
        assert!(!self.tree.is_dirty());
        if !dirty {
            assert!(obsolete.is_empty());
        }
        let root = snapshot.sync(&self.store, obsolete).expect("sync");
        for block in self.dead_blocks.drain(..) {
            if let Some(bp) = block.bp() {
                self.store
                    .free_block(&bp)
                    .expect("free of a dead data block");
            }
        }
        assert_eq!(self.tree.root_bp(), root);
        assert_eq!(snapshot.root_bp(), root);
        let stats = assert_accounting(&self.store, root);
        self.max_depth = self.max_depth.max(stats.depth);
        self.syncs += 1;
        root
    }

    fn sync_reopen(&mut self) {
        let root = self.sync();
        self.tree = CowTree::open(root);
        assert_eq!(self.tree.cached_nodes(), 0);
        self.check_all();
    }

    fn sync_evict(&mut self) {
        self.sync();
        self.tree.evict_clean();
        assert!(self.tree.cached_nodes() <= 1);
        self.check_all();
    }
}

// ---- model test: random operations ----

#[derive(Debug, Clone)]
enum Op {
    Insert {
        key: Key,
        len: usize,
        seed: u8,
        block: bool,
    },
    RemoveExisting(prop::sample::Index),
    Remove(Key),
    Get(Key),
    GetExisting(prop::sample::Index),
    Range {
        start: Key,
        end: Key,
        limit: usize,
    },
    LastBefore(Key),
    Sync,
    SyncReopen,
    SyncEvict,
}

fn key_strategy() -> impl Strategy<Value = Key> {
    (0u64..24, 0u8..3, 0u64..64).prop_map(|(obj, kind, offset)| Key { obj, kind, offset })
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        40 => (key_strategy(), 0usize..300, any::<u8>())
            .prop_map(|(key, len, seed)| Op::Insert { key, len, seed, block: false }),
        6 => (key_strategy(), 1usize..5000, any::<u8>())
            .prop_map(|(key, len, seed)| Op::Insert { key, len, seed, block: true }),
        20 => any::<prop::sample::Index>().prop_map(Op::RemoveExisting),
        4 => key_strategy().prop_map(Op::Remove),
        6 => key_strategy().prop_map(Op::Get),
        6 => any::<prop::sample::Index>().prop_map(Op::GetExisting),
        4 => (key_strategy(), key_strategy(), 0usize..200)
            .prop_map(|(start, end, limit)| Op::Range { start, end, limit }),
        4 => key_strategy().prop_map(Op::LastBefore),
        3 => Just(Op::Sync),
        1 => Just(Op::SyncReopen),
        1 => Just(Op::SyncEvict),
    ]
}

fn nth_key(model: &BTreeMap<Key, Vec<u8>>, index: &prop::sample::Index) -> Option<Key> {
    (!model.is_empty()).then(|| {
        *model
            .keys()
            .nth(index.index(model.len()))
            .expect("in range")
    })
}

fn run_ops(ops: &[Op]) {
    let mut h = Harness::new();
    for op in ops {
        match op {
            Op::Insert {
                key,
                len,
                seed,
                block,
            } => h.insert(*key, *len, *seed, *block),
            Op::RemoveExisting(index) => {
                if let Some(key) = nth_key(&h.model, index) {
                    h.remove(&key);
                }
            }
            Op::Remove(key) => h.remove(key),
            Op::Get(key) => h.check_get(key),
            Op::GetExisting(index) => {
                if let Some(key) = nth_key(&h.model, index) {
                    h.check_get(&key);
                }
            }
            Op::Range { start, end, limit } => h.check_range(start, end, *limit),
            Op::LastBefore(key) => h.check_last_before(key),
            Op::Sync => {
                h.sync();
            }
            Op::SyncReopen => h.sync_reopen(),
            Op::SyncEvict => h.sync_evict(),
        }
    }
    h.check_all();
    h.sync_reopen();
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 96,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "tests/tree_model.proptest-regressions",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn tree_matches_model(ops in proptest::collection::vec(op_strategy(), 1..600)) {
        run_ops(&ops);
    }
}

// ---- deep trees: thousands of keys, 3+ levels, then mostly deleted ----

/// A seeded workload big enough for 3 levels (large values: a handful of items per leaf),
/// then deletes of most keys so that merges and rebalances cascade.
fn deep_workload(seed: u64, keys: usize) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut h = Harness::new();
    let random_key = |rng: &mut ChaCha8Rng| Key {
        obj: rng.gen_range(0..400),
        kind: rng.gen_range(0..2),
        offset: rng.gen_range(0..1000) * 4096,
    };
    let mut step = 0usize;
    let maybe_sync = |h: &mut Harness, rng: &mut ChaCha8Rng, step: &mut usize| {
        *step += 1;
        if step.is_multiple_of(250) {
            match rng.gen_range(0..4) {
                0 => h.sync_reopen(),
                1 => h.sync_evict(),
                _ => {
                    h.sync();
                }
            }
        }
    };
    while h.model.len() < keys {
        let key = random_key(&mut rng);
        let block = rng.gen_ratio(1, 10);
        let len = if block {
            rng.gen_range(1..9000)
        } else {
            rng.gen_range(400..=MAX_INLINE)
        };
        h.insert(key, len, rng.gen(), block);
        if rng.gen_ratio(1, 8) {
            let probe = random_key(&mut rng);
            h.check_get(&probe);
        }
        maybe_sync(&mut h, &mut rng, &mut step);
    }
    h.sync();
    h.check_all();
    assert!(h.max_depth >= 3, "only {} levels", h.max_depth);
    let peak = h.tree.check(&h.store, &mut |_, _| {}).expect("check");

    // Delete all but ~3 %, with overwrites by smaller values mixed in (which also shrink
    // leaves), checking reads against the model as we go.
    let mut victims: Vec<Key> = h.model.keys().copied().collect();
    for i in (1..victims.len()).rev() {
        victims.swap(i, rng.gen_range(0..=i));
    }
    victims.truncate(keys * 97 / 100);
    for (i, key) in victims.iter().enumerate() {
        if i % 7 == 0 {
            if let Some(other) = nth_existing(&h.model, &mut rng) {
                h.insert(other, rng.gen_range(0..32), rng.gen(), false);
            }
        }
        h.remove(key);
        if i % 16 == 0 {
            h.check_get(key);
            let start = random_key(&mut rng);
            h.check_range(&start, &Key::MAX, 20);
            h.check_last_before(&start);
        }
        maybe_sync(&mut h, &mut rng, &mut step);
    }
    h.sync();
    h.check_all();
    let end = h.tree.check(&h.store, &mut |_, _| {}).expect("check");
    assert!(end.depth <= peak.depth);
    assert!(
        end.nodes < peak.nodes / 10,
        "tree did not shrink: {peak:?} -> {end:?}"
    );
    eprintln!(
        "deep workload {seed:#x}: {} syncs, peak {peak:?}, after deletes {end:?}",
        h.syncs
    );

    // And then to nothing: an empty tree has no root and no blocks.
    let rest: Vec<Key> = h.model.keys().copied().collect();
    for key in rest {
        h.remove(&key);
    }
    assert!(h.tree.is_empty());
    assert_eq!(h.sync(), None);
    assert!(h.store.live_offsets().is_empty());
}

fn nth_existing(model: &BTreeMap<Key, Vec<u8>>, rng: &mut ChaCha8Rng) -> Option<Key> {
    (!model.is_empty()).then(|| {
        *model
            .keys()
            .nth(rng.gen_range(0..model.len()))
            .expect("in range")
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 4,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "tests/tree_model.proptest-regressions",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn deep_tree_grows_and_shrinks(seed in any::<u64>()) {
        deep_workload(seed, 3000);
    }
}

/// Small values: hundreds of items per leaf, so the deep structure comes from many keys.
#[test]
fn many_small_items_then_delete_most() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut h = Harness::new();
    for i in 0..30_000u64 {
        let key = Key {
            obj: rng.gen_range(0..5000),
            kind: 1,
            offset: i,
        };
        h.insert(key, rng.gen_range(0..40), 1, false);
        if i % 5000 == 4999 {
            h.sync();
        }
    }
    h.sync_evict();
    let keys: Vec<Key> = h.model.keys().copied().collect();
    for (i, key) in keys.iter().enumerate() {
        if i % 50 != 0 {
            h.remove(key);
        }
        if i % 7000 == 0 {
            h.sync_reopen();
        }
    }
    h.sync();
    h.check_all();
}

/// Deletes clustered under one internal node, next to full siblings: the internal node
/// underflows and is rebalanced with (not merged into) its neighbour.
#[test]
fn clustered_deletes_rebalance_internal_nodes() {
    let mut h = Harness::new();
    // 120-byte items: ~136 per leaf; appends leave full leaves and full internal nodes.
    for i in 0..40_000u64 {
        h.insert(Key::new(9, 1, i), 100, 5, false);
    }
    let root = h.sync();
    let before = assert_accounting(&h.store, root);
    assert_eq!(before.depth, 3);
    for i in 500..14_000u64 {
        h.remove(&Key::new(9, 1, i));
        if i % 3000 == 0 {
            h.sync();
        }
    }
    h.sync_evict();
    let after = h.tree.check(&h.store, &mut |_, _| {}).expect("check");
    assert_eq!(after.depth, 3);
    assert!(after.leaves < before.leaves);
    h.check_range(&Key::new(9, 1, 400), &Key::new(9, 1, 20_000), 1000);
    h.check_last_before(&Key::new(9, 1, 13_000));
}

// ---- the next txg fills while the previous one syncs ----

fn assert_version(store: &MemStore, root: Option<BlockPtr>, model: &BTreeMap<Key, Vec<u8>>) {
    let tree = CowTree::open(root);
    let all = tree
        .range(store, &Key::MIN, &Key::MAX, usize::MAX)
        .expect("range");
    assert_eq!(all.len(), model.len());
    for ((k, v), (mk, mv)) in all.iter().zip(model) {
        assert_eq!(k, mk);
        assert_eq!(&value_bytes(store, v), mv);
    }
}

#[test]
fn live_tree_changes_while_previous_snapshot_syncs() {
    let store = MemStore::slow(Duration::from_micros(50));
    let mut tree = CowTree::new_empty();
    let mut model: BTreeMap<Key, Vec<u8>> = BTreeMap::new();
    let mut dead: Vec<Arc<BlockRef>> = Vec::new();
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed);

    fn mutate(
        tree: &mut CowTree,
        store: &MemStore,
        model: &mut BTreeMap<Key, Vec<u8>>,
        dead: &mut Vec<Arc<BlockRef>>,
        rng: &mut ChaCha8Rng,
        count: usize,
    ) {
        for _ in 0..count {
            let key = Key {
                obj: rng.gen_range(0..60),
                kind: 0,
                offset: rng.gen_range(0..50),
            };
            let old = if rng.gen_ratio(2, 3) {
                let block = rng.gen_ratio(1, 6);
                let len = if block {
                    rng.gen_range(1..3000)
                } else {
                    rng.gen_range(0..600)
                };
                let (value, bytes) = make_value(&key, len, rng.gen(), block);
                model.insert(key, bytes);
                tree.insert(store, key, value).expect("insert")
            } else {
                model.remove(&key);
                tree.remove(store, &key).expect("remove")
            };
            if let Some(Value::Block(block)) = old {
                dead.push(block);
            }
            let probe = Key {
                obj: rng.gen_range(0..60),
                kind: 0,
                offset: rng.gen_range(0..50),
            };
            let got = tree.get(store, &probe).expect("get");
            assert_eq!(
                got.map(|v| value_bytes(store, &v)),
                model.get(&probe).cloned()
            );
        }
    }

    mutate(&mut tree, &store, &mut model, &mut dead, &mut rng, 3000);
    let mut dead_syncing = std::mem::take(&mut dead);
    for round in 0..6 {
        let (snapshot, obsolete): (TreeSnapshot, Vec<Arc<NodeRef>>) = tree.snapshot();
        let frozen = model.clone();
        let root = std::thread::scope(|scope| {
            let syncer = scope.spawn(|| snapshot.sync(&store, obsolete));
            // Readers of the frozen version, concurrent with its sync.
            let reader = scope.spawn(|| {
                let mut rng = ChaCha8Rng::seed_from_u64(round);
                for _ in 0..2000 {
                    let key = Key {
                        obj: rng.gen_range(0..60),
                        kind: 0,
                        offset: rng.gen_range(0..50),
                    };
                    let got = snapshot.get(&store, &key).expect("snapshot get");
                    assert_eq!(
                        got.map(|v| value_bytes(&store, &v)),
                        frozen.get(&key).cloned()
                    );
                }
            });
            // The next generation fills meanwhile, including in the very nodes being written,
            // and evicts what the sync has already written.
            mutate(&mut tree, &store, &mut model, &mut dead, &mut rng, 1500);
            tree.evict_clean();
            reader.join().expect("reader");
            syncer.join().expect("syncer").expect("sync")
        });
        // The object layer frees the data blocks that died in the synced generation.
        for block in dead_syncing.drain(..) {
            if let Some(bp) = block.bp() {
                store.free_block(&bp).expect("free dead data block");
            }
        }
        dead_syncing = std::mem::take(&mut dead);
        // Both versions read back: the synced one from disk, the live one from memory.
        assert_accounting(&store, root);
        assert_version(&store, root, &frozen);
        let all = tree
            .range(&store, &Key::MIN, &Key::MAX, usize::MAX)
            .expect("live range");
        assert_eq!(all.len(), model.len());
        for ((k, v), (mk, mv)) in all.iter().zip(&model) {
            assert_eq!(k, mk);
            assert_eq!(&value_bytes(&store, v), mv);
        }
    }
    let (snapshot, obsolete) = tree.snapshot();
    let root = snapshot.sync(&store, obsolete).expect("final sync");
    for block in dead_syncing.drain(..) {
        if let Some(bp) = block.bp() {
            store.free_block(&bp).expect("free dead data block");
        }
    }
    assert_accounting(&store, root);
    assert_version(&store, root, &model);
}

// ---- scale ----

#[test]
fn sequential_200k_keys() {
    let store = MemStore::default();
    let mut tree = CowTree::new_empty();
    let started = Instant::now();
    let mut root = None;
    for i in 0..200_000u64 {
        let key = Key {
            obj: 1,
            kind: 1,
            offset: i,
        };
        tree.insert(&store, key, Value::inline(&i.to_le_bytes()))
            .expect("insert");
        if i % 20_000 == 19_999 {
            let (snapshot, obsolete) = tree.snapshot();
            root = snapshot.sync(&store, obsolete).expect("sync");
        }
    }
    let elapsed = started.elapsed();
    let stats = assert_accounting(&store, root);
    let (writes, frees) = store.counts();
    eprintln!(
        "200k sequential inserts + 10 syncs: {elapsed:?}; {stats:?}; {writes} writes, {frees} frees"
    );
    assert_eq!(stats.items, 200_000);
    assert_eq!(stats.depth, 3);
    // Appends leave full leaves behind: 28-byte items, about 584 per 16 KiB leaf.
    assert!(stats.leaves <= 200_000 / 550 + 1, "{} leaves", stats.leaves);
    tree.evict_clean();
    assert_eq!(tree.cached_nodes(), 1);
    let tree = CowTree::open(root);
    for i in (0..200_000u64).step_by(997) {
        let got = tree
            .get(
                &store,
                &Key {
                    obj: 1,
                    kind: 1,
                    offset: i,
                },
            )
            .expect("get");
        assert_eq!(value_bytes(&store, &got.expect("present")), i.to_le_bytes());
    }
    let last = tree
        .last_before(
            &store,
            &Key {
                obj: 2,
                kind: 0,
                offset: 0,
            },
        )
        .expect("last");
    assert_eq!(last.expect("present").0.offset, 199_999);
}

// ---- errors ----

#[test]
fn store_errors_leave_the_tree_unchanged() {
    let mut h = Harness::new();
    for i in 0..3000u64 {
        h.insert(
            Key {
                obj: i % 97,
                kind: 0,
                offset: i,
            },
            200,
            3,
            false,
        );
    }
    h.sync_reopen();
    let keys: Vec<Key> = h.model.keys().copied().collect();
    // With every read failing, mutations that need an unloaded node fail cleanly.
    h.tree.evict_clean();
    h.store.set_fail_reads(true);
    let mut failed = 0;
    for key in keys.iter().step_by(13) {
        match h.tree.remove(&h.store, key) {
            Ok(old) => {
                assert_eq!(old.map(|v| value_bytes(&h.store, &v)), h.model.remove(key));
            }
            Err(TreeError::Store(_)) => failed += 1,
            Err(e) => panic!("unexpected error {e}"),
        }
        let (value, bytes) = make_value(key, 10, 9, false);
        match h.tree.insert(&h.store, *key, value) {
            Ok(_) => {
                h.model.insert(*key, bytes);
            }
            Err(TreeError::Store(_)) => failed += 1,
            Err(e) => panic!("unexpected error {e}"),
        }
    }
    assert!(failed > 0);
    h.store.set_fail_reads(false);
    h.check_all();
    h.sync_reopen();
}

#[test]
fn inline_values_are_bounded() {
    let store = MemStore::default();
    let mut tree = CowTree::new_empty();
    let key = Key::new(1, 0, 0);
    let err = tree.insert(&store, key, Value::Inline(vec![0; MAX_INLINE + 1].into()));
    assert!(matches!(
        err,
        Err(TreeError::InlineTooLarge { len, max }) if len == MAX_INLINE + 1 && max == MAX_INLINE
    ));
    assert!(!tree.is_dirty());
    tree.insert(&store, key, Value::Inline(vec![0; MAX_INLINE].into()))
        .expect("max fits");
    assert!(tree.is_dirty());
}

#[test]
fn corrupt_or_foreign_blocks_are_errors() {
    let store = MemStore::default();
    // A data block is not a tree node.
    let data_bp = store
        .write_block(&[7u8; 100], WriteKind::Data { tag: 0 })
        .expect("write");
    let tree = CowTree::open(Some(data_bp));
    assert!(matches!(
        tree.get(&store, &Key::MIN),
        Err(TreeError::Corrupt(_))
    ));
    // A real leaf used where its parent expects level 1 fails the level check.
    let mut small = CowTree::new_empty();
    small
        .insert(&store, Key::new(5, 0, 0), Value::inline(b"x"))
        .expect("insert");
    let (snapshot, obsolete) = small.snapshot();
    let leaf_bp = snapshot
        .sync(&store, obsolete)
        .expect("sync")
        .expect("root");
    let mut fake_parent = Vec::new();
    fake_parent.extend_from_slice(&0x5452_4545u32.to_le_bytes());
    fake_parent.extend_from_slice(&[1, 2, 1, 0]); // version 1, level 2, one entry
    fake_parent.extend_from_slice(&Key::new(5, 0, 0).encode());
    fake_parent.extend_from_slice(&leaf_bp.encode());
    let parent_bp = store
        .write_block(&fake_parent, WriteKind::Node { level: 2 })
        .expect("write");
    let tree = CowTree::open(Some(parent_bp));
    assert!(matches!(
        tree.get(&store, &Key::new(5, 0, 0)),
        Err(TreeError::Corrupt(_))
    ));
    // The parent's first key must match the child's.
    fake_parent[5] = 1;
    fake_parent[8] = 4;
    let parent_bp = store
        .write_block(&fake_parent, WriteKind::Node { level: 1 })
        .expect("write");
    let tree = CowTree::open(Some(parent_bp));
    assert!(matches!(
        tree.get(&store, &Key::new(5, 0, 0)),
        Err(TreeError::Corrupt(_))
    ));
    // A missing block is the store's error, passed through.
    let tree = CowTree::open(Some(BlockPtr {
        dvas: [Dva {
            vdev: 0,
            asize: 512,
            offset: 1 << 40,
        }; 3],
        ..leaf_bp
    }));
    assert!(matches!(
        tree.get(&store, &Key::MIN),
        Err(TreeError::Store(_))
    ));
}

#[test]
fn mem_store_refuses_unknown_frees() {
    let store = MemStore::default();
    let bp = store
        .write_block(b"abc", WriteKind::Data { tag: 1 })
        .expect("write");
    store.free_block(&bp).expect("first free");
    assert!(store.free_block(&bp).is_err());
    assert!(store.read_block(&bp).is_err());
}

#[test]
fn syncs_run_in_generation_order() {
    let store = MemStore::default();
    let mut tree = CowTree::new_empty();
    tree.insert(&store, Key::new(1, 0, 0), Value::inline(b"a"))
        .expect("insert");
    let (first, first_obsolete) = tree.snapshot();
    tree.insert(&store, Key::new(2, 0, 0), Value::inline(b"b"))
        .expect("insert");
    let (second, second_obsolete) = tree.snapshot();
    second.sync(&store, second_obsolete).expect("newer sync");
    assert!(matches!(
        first.sync(&store, first_obsolete),
        Err(TreeError::SyncOrder {
            generation: 1,
            synced: 2
        })
    ));
    assert!(matches!(
        second.sync(&store, Vec::new()),
        Err(TreeError::SyncOrder { .. })
    ));
    assert!(!tree.is_dirty());
    assert_eq!(tree.root_bp(), second.root_bp());
}

#[test]
fn block_values_are_written_once_and_released_after_the_write() {
    let store = MemStore::default();
    let mut tree = CowTree::new_empty();
    let block = BlockRef::new_dirty(Arc::new(vec![9u8; 4096]), 42);
    tree.insert(&store, Key::new(3, 1, 0), Value::Block(block.clone()))
        .expect("insert");
    assert!(block.dirty_data().is_some() && block.bp().is_none());
    let (snapshot, obsolete) = tree.snapshot();
    let root = snapshot.sync(&store, obsolete).expect("sync");
    // Written, but the bytes stay until the owner knows the write reached the device.
    assert!(block.dirty_data().is_some());
    let bp = block.bp().expect("written");
    block.release_data();
    assert!(block.dirty_data().is_none());
    assert_eq!(bp.kind, BlockKind::Data);
    assert_eq!(block.tag(), 42);
    // The leaf now records the data block's pointer.
    let reopened = CowTree::open(root);
    let Some(Value::Block(found)) = reopened.get(&store, &Key::new(3, 1, 0)).expect("get") else {
        panic!("expected a block value");
    };
    assert_eq!(found.bp(), Some(bp));
    let mut seen = Vec::new();
    reopened
        .check(&store, &mut |bp, kind| seen.push((bp.dvas[0].offset, kind)))
        .expect("check");
    assert!(seen.contains(&(bp.dvas[0].offset, BlockUse::Data)));
    assert!(seen
        .iter()
        .any(|(_, kind)| *kind == BlockUse::Node { level: 0 }));
}
