//! Crashes during repair writes: a scrub repairing rot, and a resilver rebuilding what a
//! device missed, are cut at every device write and flush (as `crash_every_write.rs` cuts a
//! workload). A repair in flight must never damage what was good: after each cut the pool
//! imports, every object reads back exactly, and a scrub then finishes the repair with
//! nothing left that it cannot fix.

mod common;

use std::sync::Arc;

use common::*;
use tank_device::{CrashMode, SimDevice, SimFleet};
use tank_object::{ObjectStore, ScanPhase};
use tank_pool::Pool;

const DEV: u64 = 64 << 20;

/// What the repair has to do: rot on one child, or a child that missed txgs.
#[derive(Clone, Copy, Debug)]
enum Damage {
    Rot,
    Missed,
}

/// Builds the damaged pool (deterministic for `seed`) and returns it open with its model.
fn damaged(
    fleet: &SimFleet,
    seed: u64,
    damage: Damage,
) -> (Vec<SimDevice>, Arc<Pool>, Arc<ObjectStore>, Model) {
    let (devs, pool, store) = sim_pool(fleet, "raidz2", 5, DEV);
    let mut model = populate(&store, seed, 12);
    match damage {
        Damage::Rot => {
            drop(store);
            pool.export().unwrap();
            assert!(rot(&devs[2], seed, 0.5, 4 << 20) > 10);
            let (pool, store) = reimport(&devs);
            (devs, pool, store, model)
        }
        Damage::Missed => {
            let name = pool.leaf_list()[2].1.path();
            pool.offline(&name, false).unwrap();
            let mut r = rng(seed ^ 0x55);
            for _ in 0..6 {
                random_step(&store, &mut model, &mut r, 40_000).unwrap();
            }
            store.sync().unwrap();
            pool.online(&name).unwrap();
            (devs, pool, store, model)
        }
    }
}

/// Runs the repair; with `cut` set, the fleet loses power at that many device operations
/// into it. Returns the operations the repair took (uncut) and the model.
fn repair(seed: u64, damage: Damage, cut: Option<u64>) -> (SimFleet, u64, Model) {
    let fleet = SimFleet::new(seed);
    let (_devs, pool, store, model) = damaged(&fleet, seed, damage);
    let base = fleet.ops();
    if let Some(k) = cut {
        fleet.set_crash_at(Some(base + k));
    }
    let started = match damage {
        Damage::Rot => store.scrub_start().is_ok(),
        Damage::Missed => store.resilver_start().unwrap_or(false),
    };
    assert!(started || cut.is_some(), "{damage:?}: nothing to repair");
    store.scan_wait();
    let _ = store.sync();
    let ops = fleet.ops() - base;
    store.scan_suspend();
    drop(store);
    let _ = pool.shutdown();
    (fleet, ops, model)
}

fn check(seed: u64, damage: Damage, k: u64) {
    let (fleet, _, model) = repair(seed, damage, Some(k));
    let images = fleet.crash_images(CrashMode::DropUnflushed);
    let (pool, store) = import_images(images, false)
        .unwrap_or_else(|e| panic!("{damage:?} cut {k}: import failed: {e}"));
    verify(&store, &model).unwrap_or_else(|e| panic!("{damage:?} cut {k}: {e}"));
    // Whatever the cut left (an interrupted scan resumes at import), the resilver the pool
    // still wants, then a scrub, finish the repair, and the next scrub finds nothing.
    store.scan_wait();
    store.sync().unwrap();
    if store.resilver_start().unwrap() {
        store.scan_wait();
        store.sync().unwrap();
    }
    for pass in 0..2 {
        store.scrub_start().unwrap();
        store.scan_wait();
        store.sync().unwrap();
        let st = store.scan_status();
        assert_eq!(
            st.state.phase,
            ScanPhase::Finished,
            "{damage:?} cut {k}: {st:?}"
        );
        assert_eq!(st.state.errors, 0, "{damage:?} cut {k} pass {pass}: {st:?}");
        if pass == 1 {
            assert_eq!(st.state.repaired, 0, "{damage:?} cut {k}: {st:?}");
        }
    }
    verify(&store, &model).unwrap_or_else(|e| panic!("{damage:?} cut {k} after scrub: {e}"));
    drop(store);
    pool.shutdown().unwrap();
}

fn every_cut(seed: u64, damage: Damage) {
    let (_, n, _) = repair(seed, damage, None);
    assert!(
        n > 10,
        "{damage:?}: the repair wrote too little to cut: {n} operations"
    );
    for k in 0..=n {
        check(seed, damage, k);
    }
    eprintln!("{damage:?}: checked {} cut points", n + 1);
}

#[test]
fn a_scrub_cut_at_every_repair_write_never_harms_good_data() {
    every_cut(0x5c12_0001, Damage::Rot);
}

#[test]
fn a_resilver_cut_at_every_write_never_harms_good_data() {
    every_cut(0x5c12_0002, Damage::Missed);
}
