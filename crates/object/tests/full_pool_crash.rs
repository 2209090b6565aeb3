//! Crashes near a full pool: a 64 MiB disk filled until writes are refused with ENOSPC,
//! then a workload of frees, writes refused for want of space, and writes into the space the
//! frees give back once their deferral window has passed, cut at every fifth device write
//! and flush. A write that does not fit while space is in flight waits for the syncs that
//! bring it back (the sync of its frees, then the empty txgs that run out their deferral);
//! one that could not fit even then is refused. After each cut the pool imports at a
//! committed txg no older than the last acknowledged one, with exactly that txg's objects,
//! and still takes a free and a write. (The deferral window, the slop kept back and the
//! space map log are what is at stake here: a free reused too early, or a space map that
//! lost an allocation, shows as wrong bytes after the cut.)

mod common;

use std::collections::BTreeMap;

use common::*;
use tank_device::{CrashMode, SimDevice, SimFleet};
use tank_object::{ObjectStore, ROOT_OBJSET};

const DEV: u64 = 64 << 20;
/// Each round syncs about ten txgs (its frees', the empty ones that run out their
/// deferral, its own), and every cut point replays the rounds up to it.
const ROUNDS: usize = 4;
const CUT_STEP: usize = 5;
const ENOSPC: i32 = 28;

/// The device image of a filled pool (exported) and its objects.
fn filled(seed: u64) -> (Vec<(String, Vec<u8>)>, Model) {
    let fleet = SimFleet::new(seed);
    let (_devs, pool, store) = sim_pool(&fleet, "", 1, DEV);
    let os = store.objset(ROOT_OBJSET).unwrap();
    let mut model = Model::new();
    let mut r = rng(seed);
    loop {
        let data = bytes(&mut r, 1 << 20, false);
        let tx = match store.begin(data.len() as u64) {
            Ok(tx) => tx,
            Err(e) => {
                assert_eq!(e.errno(), ENOSPC, "{e}");
                break;
            }
        };
        let id = os.create_object(&tx, 1, 131072).unwrap();
        os.write(&tx, id, 0, &data).unwrap();
        drop(tx);
        model.insert(id, data);
        store.sync().unwrap();
    }
    assert!(model.len() > 20, "only {} MiB fit", model.len());
    drop(store);
    pool.export().unwrap();
    (fleet.crash_images(CrashMode::DropUnflushed), model)
}

struct Outcome {
    /// The objects after each committed txg.
    models: BTreeMap<u64, Model>,
    acked: u64,
    /// Rounds whose sync was acknowledged.
    rounds: usize,
    ops: u64,
    refused: usize,
    written: usize,
}

/// Tries one change; `Ok(false)` when refused for want of space (nothing changed). The
/// txgs a write commits while it waits for space hold the objects as they were before it:
/// they go into `out.models`, and so does the txg whose sync a cut broke.
fn attempt(
    store: &ObjectStore,
    model: &Model,
    out: &mut Outcome,
    f: impl FnOnce() -> Result<(), tank_object::ObjectError>,
) -> Result<bool, String> {
    let pool = store.pool();
    let before = pool.synced_txg();
    let r = f();
    let after = pool.synced_txg();
    for txg in before + 1..=after {
        out.models.insert(txg, model.clone());
    }
    match r {
        Ok(()) => Ok(true),
        Err(e) if e.errno() == ENOSPC => Ok(false),
        Err(e) => {
            out.models.entry(after + 1).or_insert_with(|| model.clone());
            Err(e.to_string())
        }
    }
}

/// One round: free the oldest object; try a new object of 4 MiB (more than any free gives
/// back here: refused), then one of 1 MiB (it waits for the free's space), then overwrite
/// 64 KiB of another (copy-on-write: it needs new space too).
fn round(
    store: &ObjectStore,
    model: &mut Model,
    r: &mut rand_chacha::ChaCha8Rng,
    out: &mut Outcome,
) -> Result<(), String> {
    let os = store.objset(ROOT_OBJSET).map_err(|e| e.to_string())?;
    if let Some(&id) = model.keys().next() {
        let freed = attempt(store, model, out, || {
            let tx = store.begin(0)?;
            os.free_object(&tx, id)
        })?;
        assert!(freed, "a free is never refused for want of space");
        model.remove(&id);
    }
    for size in [4 << 20, 1 << 20] {
        let data = bytes(r, size, false);
        let mut new_id = None;
        let made = attempt(store, model, out, || {
            let tx = store.begin(data.len() as u64)?;
            let id = os.create_object(&tx, 1, 131072)?;
            os.write(&tx, id, 0, &data)?;
            new_id = Some(id);
            Ok(())
        })?;
        if made {
            model.insert(new_id.expect("made"), data);
            out.written += 1;
        } else {
            out.refused += 1;
        }
    }
    if let Some((&id, _)) = model.iter().nth(model.len() / 2) {
        let patch = bytes(r, 64 << 10, false);
        if attempt(store, model, out, || {
            let tx = store.begin(patch.len() as u64)?;
            os.write(&tx, id, 4096, &patch)
        })? {
            model.get_mut(&id).expect("id")[4096..4096 + patch.len()].copy_from_slice(&patch);
            out.written += 1;
        } else {
            out.refused += 1;
        }
    }
    Ok(())
}

/// The pool of `image`, imported from a fresh fleet's devices.
fn open_image(
    seed: u64,
    image: &[(String, Vec<u8>)],
) -> (
    SimFleet,
    std::sync::Arc<tank_pool::Pool>,
    std::sync::Arc<ObjectStore>,
) {
    let fleet = SimFleet::new(seed);
    let devs: Vec<SimDevice> = image
        .iter()
        .map(|(n, b)| fleet.device_from_image(n, b.clone()))
        .collect();
    let (pool, store) = reimport(&devs);
    (fleet, pool, store)
}

/// Imports the filled image on a fresh fleet and runs the rounds; with `cut`, the fleet
/// loses power that many operations in.
fn run(
    seed: u64,
    image: &[(String, Vec<u8>)],
    start: &Model,
    cut: Option<u64>,
) -> (SimFleet, Outcome) {
    let (fleet, pool, store) = open_image(seed, image);
    let base = fleet.ops();
    if let Some(k) = cut {
        fleet.set_crash_at(Some(base + k));
    }
    let mut model = start.clone();
    let mut out = Outcome {
        models: BTreeMap::from([(pool.synced_txg(), model.clone())]),
        acked: pool.synced_txg(),
        rounds: 0,
        ops: 0,
        refused: 0,
        written: 0,
    };
    let mut r = rng(seed ^ 0xf011);
    for _ in 0..ROUNDS {
        if round(&store, &mut model, &mut r, &mut out).is_err() {
            // Cut in the middle of the round: the txg whose sync it broke is recorded.
            break;
        }
        let txg = pool.open_txg();
        match store.sync() {
            Ok(()) => {
                out.rounds += 1;
                out.acked = pool.synced_txg();
                out.models.insert(out.acked, model.clone());
            }
            Err(_) => {
                out.models.insert(txg, model.clone());
                break;
            }
        }
    }
    out.ops = fleet.ops() - base;
    drop(store);
    let _ = pool.shutdown();
    (fleet, out)
}

fn check(seed: u64, image: &[(String, Vec<u8>)], start: &Model, k: u64) {
    let (fleet, out) = run(seed, image, start, Some(k));
    let (pool, store) = import_images(fleet.crash_images(CrashMode::DropUnflushed), false)
        .unwrap_or_else(|e| panic!("cut {k}: import failed: {e}"));
    let txg = pool.synced_txg();
    assert!(
        txg >= out.acked,
        "cut {k}: imported txg {txg}, older than the acknowledged {}",
        out.acked
    );
    let model = out
        .models
        .get(&txg)
        .unwrap_or_else(|| panic!("cut {k}: txg {txg} was never committed"));
    verify(&store, model).unwrap_or_else(|e| panic!("cut {k}: {e}"));
    // Still usable: a free, then a small write (refused only for want of space).
    let os = store.objset(ROOT_OBJSET).unwrap();
    if let Some(&id) = model.keys().next() {
        let tx = store.begin(0).unwrap();
        os.free_object(&tx, id).unwrap();
    }
    let wrote = match (|| {
        let tx = store.begin(4096)?;
        let id = os.create_object(&tx, 1, 4096)?;
        os.write(&tx, id, 0, &[9u8; 4096])
    })() {
        Ok(()) => true,
        Err(e) if e.errno() == ENOSPC => false,
        Err(e) => panic!("cut {k}: {e}"),
    };
    store
        .sync()
        .unwrap_or_else(|e| panic!("cut {k}: sync after the crash (wrote: {wrote}): {e}"));
    drop(store);
    pool.shutdown().unwrap();
}

fn store_is_full(store: &ObjectStore) -> bool {
    store.begin(1 << 20).is_err()
}

#[test]
fn a_crash_near_a_full_pool_loses_nothing_committed() {
    let seed = 0xf011_0001;
    let (image, start) = filled(seed);
    {
        // The filled image refuses a 1 MiB write: the rounds start at the edge.
        let (_fleet, pool, store) = open_image(seed, image.as_slice());
        assert!(store_is_full(&store));
        drop(store);
        pool.shutdown().unwrap();
    }
    let (_, full) = run(seed, &image, &start, None);
    assert_eq!(full.rounds, ROUNDS, "every round committed");
    assert!(full.refused > 0, "no write was refused for want of space");
    assert!(full.written > 0, "no write went into freed space");
    for k in (0..=full.ops).step_by(CUT_STEP) {
        check(seed, &image, &start, k);
    }
    eprintln!(
        "checked {} cut points; {} writes refused, {} written",
        full.ops / CUT_STEP as u64 + 1,
        full.refused,
        full.written
    );
}
