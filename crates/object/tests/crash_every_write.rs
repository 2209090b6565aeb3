//! Crash consistency: cut a multi-txg workload on a raidz2 pool at every write and flush.
//!
//! Method (redb's two-pass crash test and ztest's txg check): run the workload once on a
//! simulated fleet and count its device operations (writes and flushes) after pool creation.
//! Then, for every cut point k, run the same seeded workload again with the fleet set to lose
//! power at operation k; take the device images as they would be after the power loss (only
//! flushed writes, or seeded variants that keep a random subset of the unflushed writes, or
//! tear the last one), import, and check that the pool shows exactly the model state of the
//! txg it imported, and that this txg is not older than the last one whose sync returned.

mod common;

use std::collections::BTreeMap;

use common::*;
use tank_device::{CrashMode, SimFleet};

const DEV_SIZE: u64 = 64 << 20;
const STEPS_PER_TXG: usize = 4;
const TXGS: usize = 4;

struct Outcome {
    /// Model after each committed txg, by txg number.
    models: BTreeMap<u64, Model>,
    /// The last txg whose wait_synced returned Ok.
    acked: u64,
    ops_after_create: u64,
}

/// Runs the workload; with `crash_at` set (relative to the end of pool creation) the fleet
/// loses power there.
fn run(seed: u64, crash_at: Option<u64>) -> (SimFleet, Outcome) {
    let fleet = SimFleet::new(seed);
    let (_devs, pool, store) = sim_pool(&fleet, "raidz2", 7, DEV_SIZE);
    let base = fleet.ops();
    if let Some(k) = crash_at {
        fleet.set_crash_at(Some(base + k));
    }
    let mut models = BTreeMap::new();
    models.insert(pool.synced_txg(), Model::new());
    let mut model = Model::new();
    let mut acked = pool.synced_txg();
    let mut r = rng(seed);
    'outer: for _ in 0..TXGS {
        for _ in 0..STEPS_PER_TXG {
            if random_step(&store, &mut model, &mut r, 40_000).is_err() {
                break 'outer;
            }
        }
        let txg = pool.open_txg();
        match store.sync() {
            Ok(()) => {
                // A step that changed nothing commits no txg.
                let synced = pool.synced_txg();
                assert!(
                    synced == txg || models.get(&synced) == Some(&model),
                    "one step per txg"
                );
                models.insert(synced, model.clone());
                acked = synced;
            }
            Err(_) => {
                // The txg may or may not have reached the disk: both are valid outcomes.
                models.insert(txg, model.clone());
                break;
            }
        }
    }
    let ops_after_create = fleet.ops() - base;
    drop(store);
    let _ = pool.shutdown();
    drop(pool);
    (
        fleet,
        Outcome {
            models,
            acked,
            ops_after_create,
        },
    )
}

fn check(seed: u64, k: u64, mode: CrashMode) {
    let (fleet, out) = run(seed, Some(k));
    let images = fleet.crash_images(mode);
    let (pool, store) = import_images(images, false)
        .unwrap_or_else(|e| panic!("seed {seed} cut {k} {mode:?}: import failed: {e}"));
    let txg = pool.synced_txg();
    assert!(
        txg >= out.acked,
        "seed {seed} cut {k} {mode:?}: imported txg {txg} is older than the acknowledged txg {}",
        out.acked
    );
    let model = out.models.get(&txg).unwrap_or_else(|| {
        panic!(
            "seed {seed} cut {k} {mode:?}: imported txg {txg} was never committed by the workload"
        )
    });
    verify(&store, model).unwrap_or_else(|e| panic!("seed {seed} cut {k} {mode:?}: {e}"));
    // The imported pool is fully usable: write, sync, and the result survives another import.
    let os = store.objset(tank_object::ROOT_OBJSET).unwrap();
    let tx = store.begin(4096).unwrap();
    let id = os.create_object(&tx, 1, 4096).unwrap();
    os.write(&tx, id, 0, &[7u8; 5000]).unwrap();
    drop(tx);
    store.sync().unwrap();
    drop(store);
    pool.shutdown().unwrap();
}

#[test]
fn crash_at_every_write_and_flush() {
    let seed = 0x7a4b_0001;
    let (_, full) = run(seed, None);
    let n = full.ops_after_create;
    assert!(n > 100, "workload too small: {n} ops");
    assert!(
        full.acked >= TXGS as u64,
        "every txg synced without a crash"
    );
    for k in 0..=n {
        check(seed, k, CrashMode::DropUnflushed);
    }
    eprintln!("checked {} cut points", n + 1);
}

/// Every cut again with gang blocks: each block above 8 KiB is a header and its pieces, so a
/// cut can fall between a piece and its header, or between a header and its pointer.
#[test]
fn crash_at_every_write_and_flush_with_gang_blocks() {
    with_gang_blocks(8192, || {
        let seed = 0x7a4b_0003;
        let (_, full) = run(seed, None);
        let n = full.ops_after_create;
        for k in 0..=n {
            check(seed, k, CrashMode::DropUnflushed);
        }
        for k in (0..=n).step_by(5) {
            check(seed, k, CrashMode::KeepRandomSubset { seed: k });
        }
        eprintln!("checked {} cut points with gang blocks", n + 1);
    });
}

#[test]
fn crash_with_reordered_and_torn_unflushed_writes() {
    let seed = 0x7a4b_0002;
    let (_, full) = run(seed, None);
    let n = full.ops_after_create;
    let mut k = 0;
    let mut variant = 0u64;
    while k <= n {
        check(seed, k, CrashMode::KeepRandomSubset { seed: variant });
        check(seed, k, CrashMode::TearLast { seed: variant });
        check(seed, k, CrashMode::KeepAll);
        variant += 1;
        k += 3;
    }
}
