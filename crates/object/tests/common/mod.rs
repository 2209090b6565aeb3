//! Shared helpers for the engine tests: pools on simulated or in-memory devices, a workload
//! model, and verification against it.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tank_device::{DeviceRef, MemDevice, SimDevice, SimFleet};
use tank_object::{ObjectStore, ROOT_OBJSET};
use tank_pool::{CreateOptions, ImportOptions, Pool, PoolSpec, TxgTunables};

/// Tunables that make txgs commit only when a test asks (so a txg is exactly one step).
pub fn manual_txgs() -> TxgTunables {
    TxgTunables {
        dirty_max: 512 << 20,
        dirty_sync: u64::MAX / 2,
        timeout: Duration::from_secs(3600),
    }
}

thread_local! {
    /// Set by [`with_gang_blocks`]: pools this test thread makes or imports gang every block
    /// above this many bytes; their block stores are kept to count the gang blocks written.
    static FORCE_GANG: std::cell::RefCell<(Option<usize>, Vec<Arc<tank_block::BlockStore>>)> =
        const { std::cell::RefCell::new((None, Vec::new())) };
}

/// Runs `body` with every block above `above` bytes written as a gang block (a header and
/// its pieces) in the pools it makes or imports, so a test's crash, scrub, resilver or
/// corruption checks cover gang headers too. Panics if fewer than 20 gang blocks were
/// written: the variant would otherwise pass without testing what it is for.
pub fn with_gang_blocks<T>(above: usize, body: impl FnOnce() -> T) -> T {
    FORCE_GANG.with(|g| *g.borrow_mut() = (Some(above), Vec::new()));
    let out = body();
    let stores = FORCE_GANG.with(|g| std::mem::take(&mut *g.borrow_mut()).1);
    let ganged: u64 = stores.iter().map(|b| b.gang_writes()).sum();
    assert!(
        ganged >= 20,
        "only {ganged} gang blocks were written above {above} bytes"
    );
    eprintln!("{ganged} gang blocks written");
    out
}

fn apply_gang_knob(store: &ObjectStore) {
    FORCE_GANG.with(|g| {
        let mut g = g.borrow_mut();
        store.blocks().set_force_ganging(g.0);
        if g.0.is_some() {
            g.1.push(store.blocks().clone());
        }
    });
}

pub fn spec(s: &str) -> PoolSpec {
    let toks: Vec<String> = s.split_whitespace().map(String::from).collect();
    PoolSpec::parse(&toks, true).unwrap()
}

pub fn sim_pool(
    fleet: &SimFleet,
    layout: &str,
    n: usize,
    size: u64,
) -> (Vec<SimDevice>, Arc<Pool>, Arc<ObjectStore>) {
    let devs: Vec<SimDevice> = (0..n)
        .map(|i| fleet.device(&format!("d{i}"), size))
        .collect();
    let map: HashMap<String, DeviceRef> = devs
        .iter()
        .enumerate()
        .map(|(i, d)| (format!("d{i}"), Arc::new(d.clone()) as DeviceRef))
        .collect();
    let names: Vec<String> = (0..n).map(|i| format!("d{i}")).collect();
    let spec_text = if layout.is_empty() {
        names.join(" ")
    } else if layout == "mirror2" {
        names
            .chunks(2)
            .map(|c| format!("mirror {}", c.join(" ")))
            .collect::<Vec<_>>()
            .join(" ")
    } else {
        format!("{layout} {}", names.join(" "))
    };
    let opts = CreateOptions {
        ashift: 12,
        force: false,
        tunables: manual_txgs(),
        ..Default::default()
    };
    let (pool, _) = Pool::create("sim", &spec(&spec_text), &map, &opts).unwrap();
    let store = ObjectStore::open(pool.clone()).unwrap();
    apply_gang_knob(&store);
    (devs, pool, store)
}

pub fn import_images(
    images: Vec<(String, Vec<u8>)>,
    rewind: bool,
) -> Result<(Arc<Pool>, Arc<ObjectStore>), String> {
    let devs: Vec<DeviceRef> = images
        .into_iter()
        .map(|(n, b)| Arc::new(MemDevice::from_bytes(n, b)) as DeviceRef)
        .collect();
    import_devs(&devs, rewind)
}

pub fn import_devs(
    devs: &[DeviceRef],
    rewind: bool,
) -> Result<(Arc<Pool>, Arc<ObjectStore>), String> {
    let pool = Pool::import(
        devs,
        &ImportOptions {
            name: None,
            rewind,
            force: false,
            missing_log: false,
            tunables: Some(manual_txgs()),
            supported_features: None,
            ..Default::default()
        },
    )
    .map_err(|e| e.to_string())?;
    let store = ObjectStore::open(pool.clone()).map_err(|e| e.to_string())?;
    apply_gang_knob(&store);
    Ok((pool, store))
}

/// The model: object id → contents.
pub type Model = BTreeMap<u64, Vec<u8>>;

/// Deterministic pseudo-random bytes (compressible or not).
pub fn bytes(rng: &mut ChaCha8Rng, len: usize, compressible: bool) -> Vec<u8> {
    let mut v = vec![0u8; len];
    if compressible {
        let word: u8 = rng.gen();
        for (i, b) in v.iter_mut().enumerate() {
            *b = word.wrapping_add((i / 97) as u8);
        }
    } else {
        rng.fill(&mut v[..]);
    }
    v
}

/// One step of a random workload against the root object set, mirrored in `model`.
/// Returns an error string when the engine refused (e.g. after a crash).
pub fn random_step(
    store: &ObjectStore,
    model: &mut Model,
    rng: &mut ChaCha8Rng,
    max_len: usize,
) -> Result<(), String> {
    let os = store.objset(ROOT_OBJSET).map_err(|e| e.to_string())?;
    let op = rng.gen_range(0..10);
    let ids: Vec<u64> = model.keys().copied().collect();
    match op {
        0..=2 if !ids.is_empty() || op == 0 => {
            let bs = [512u32, 4096, 16384, 131072][rng.gen_range(0..4)];
            let tx = store.begin(0).map_err(|e| e.to_string())?;
            let id = os.create_object(&tx, 1, bs).map_err(|e| e.to_string())?;
            let len = rng.gen_range(0..max_len);
            let c = rng.gen_bool(0.5);
            let data = bytes(rng, len, c);
            drop(tx);
            let tx = store.begin(len as u64).map_err(|e| e.to_string())?;
            os.write(&tx, id, 0, &data).map_err(|e| e.to_string())?;
            model.insert(id, data);
        }
        3..=6 if !ids.is_empty() => {
            let id = ids[rng.gen_range(0..ids.len())];
            let cur = model.get_mut(&id).expect("id");
            let off = rng.gen_range(0..=cur.len() + 4096);
            let len = rng.gen_range(1..max_len.max(2));
            let c = rng.gen_bool(0.3);
            let data = bytes(rng, len, c);
            let tx = store.begin(len as u64).map_err(|e| e.to_string())?;
            os.write(&tx, id, off as u64, &data)
                .map_err(|e| e.to_string())?;
            if cur.len() < off + len {
                cur.resize(off + len, 0);
            }
            cur[off..off + len].copy_from_slice(&data);
        }
        7 | 8 if !ids.is_empty() => {
            let id = ids[rng.gen_range(0..ids.len())];
            let cur = model.get_mut(&id).expect("id");
            let size = rng.gen_range(0..=cur.len() + 10000);
            let tx = store.begin(0).map_err(|e| e.to_string())?;
            os.truncate(&tx, id, size as u64)
                .map_err(|e| e.to_string())?;
            cur.resize(size, 0);
        }
        9 if !ids.is_empty() => {
            let id = ids[rng.gen_range(0..ids.len())];
            let tx = store.begin(0).map_err(|e| e.to_string())?;
            os.free_object(&tx, id).map_err(|e| e.to_string())?;
            model.remove(&id);
        }
        _ => {}
    }
    Ok(())
}

/// Checks every object of the model and that no other object exists.
pub fn verify(store: &ObjectStore, model: &Model) -> Result<(), String> {
    let os = store.objset(ROOT_OBJSET).map_err(|e| e.to_string())?;
    let listed = os.list_objects(1, usize::MAX).map_err(|e| e.to_string())?;
    let expected: Vec<u64> = model.keys().copied().collect();
    if listed != expected {
        return Err(format!("objects {listed:?}, expected {expected:?}"));
    }
    for (id, data) in model {
        let info = os.stat(*id).map_err(|e| e.to_string())?;
        if info.size != data.len() as u64 {
            return Err(format!(
                "object {id}: size {} expected {}",
                info.size,
                data.len()
            ));
        }
        let got = os
            .read(*id, 0, data.len() + 10)
            .map_err(|e| format!("object {id}: {e}"))?;
        if got != *data {
            let at = got.iter().zip(data.iter()).position(|(a, b)| a != b);
            return Err(format!("object {id}: content differs (first at {at:?})"));
        }
    }
    Ok(())
}

pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// Fills the pool with a model workload and syncs.
pub fn populate(store: &ObjectStore, seed: u64, steps: usize) -> Model {
    let mut model = Model::new();
    let mut r = rng(seed);
    for _ in 0..steps {
        random_step(store, &mut model, &mut r, 300_000).unwrap();
    }
    store.sync().unwrap();
    model
}

/// Flips bytes in 16 KiB regions of the first `span` bytes of the data area (where the
/// allocator put the data), each region with probability `p`; returns how many.
pub fn rot(dev: &SimDevice, seed: u64, p: f64, span: u64) -> usize {
    let mut r = rng(seed);
    let mut n = 0;
    let mut off = tank_vdev::FRONT_RESERVE;
    while off < tank_vdev::FRONT_RESERVE + span {
        if r.gen_bool(p) {
            dev.corrupt(off + r.gen_range(0..12000), r.gen_range(1..3000))
                .unwrap();
            n += 1;
        }
        off += 16384;
    }
    n
}

/// CKSUM counts of every leaf, in pool order.
pub fn cksum_errors(pool: &Pool) -> Vec<u64> {
    pool.leaf_list()
        .iter()
        .map(|(_, l)| l.stats.snapshot().cksum_errors)
        .collect()
}

/// Imports the pool from the simulated devices again.
pub fn reimport(devs: &[SimDevice]) -> (Arc<Pool>, Arc<ObjectStore>) {
    let refs: Vec<DeviceRef> = devs
        .iter()
        .map(|d| Arc::new(d.clone()) as DeviceRef)
        .collect();
    import_devs(&refs, false).unwrap()
}

/// Bytes of data `write_while_scanning` keeps the model within.
const WRITE_WHILE_SCANNING_MAX: usize = 24 << 20;

/// Runs the random workload while the pool's scan (scrub or resilver) runs, at least
/// `min_steps` steps, syncing every `sync_every`.
pub fn write_while_scanning(
    store: &ObjectStore,
    model: &mut Model,
    seed: u64,
    min_steps: usize,
    max_len: usize,
    sync_every: usize,
) {
    let mut r = rng(seed);
    let mut steps = 0;
    while store.scan_status().running || steps < min_steps {
        // However long the scan takes, the data stays within a bound: past it an object
        // is removed instead of a step taken.
        if model.values().map(Vec::len).sum::<usize>() > WRITE_WHILE_SCANNING_MAX {
            let ids: Vec<u64> = model.keys().copied().collect();
            let id = ids[r.gen_range(0..ids.len())];
            let os = store.objset(ROOT_OBJSET).unwrap();
            let tx = store.begin(0).unwrap();
            os.free_object(&tx, id).unwrap();
            model.remove(&id);
        } else {
            random_step(store, model, &mut r, max_len).unwrap();
        }
        steps += 1;
        if steps % sync_every == 0 {
            store.sync().unwrap();
        }
        assert!(steps < 100_000, "the scan never ended");
    }
}

/// A raidz1 pool of 4 simulated devices with a workload, two of its devices rotted beyond
/// the parity, imported again.
pub fn rotted_beyond_parity(seed: u64) -> (Vec<SimDevice>, Model, Arc<Pool>, Arc<ObjectStore>) {
    let fleet = SimFleet::new(seed);
    let (devs, pool, store) = sim_pool(&fleet, "raidz1", 4, 64 << 20);
    let model = populate(&store, 7, 40);
    drop(store);
    pool.export().unwrap();
    rot(&devs[0], 1, 0.6, 8 << 20);
    rot(&devs[1], 2, 0.6, 8 << 20);
    let (pool, store) = reimport(&devs);
    (devs, model, pool, store)
}
