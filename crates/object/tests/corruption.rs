//! Corruption and loss: bit rot, misdirected and lost writes, failing and pulled devices, on up
//! to `parity` children (every read correct, counters show the repairs) and beyond it (an
//! error, never wrong data); a full pool; fail-stop after an unrepairable write failure.

mod common;

use std::sync::Arc;

use common::*;
use rand::Rng;
use tank_device::{DeviceRef, FaultConfig, SimFleet};
use tank_object::ROOT_OBJSET;
use tank_vdev::FRONT_RESERVE;

const DEV: u64 = 64 << 20;

#[test]
fn bit_rot_on_parity_children_is_repaired_and_counted() {
    bit_rot_on_parity_children_is_repaired_and_counted_body();
}

/// The same with gang blocks: every block above 8 KiB is a header and its pieces.
#[test]
fn bit_rot_on_parity_children_is_repaired_and_counted_with_gang_blocks() {
    with_gang_blocks(
        8192,
        bit_rot_on_parity_children_is_repaired_and_counted_body,
    );
}

fn bit_rot_on_parity_children_is_repaired_and_counted_body() {
    for (layout, n, bad) in [
        ("raidz2", 7, vec![1usize, 4]),
        ("raidz1", 5, vec![2]),
        ("raidz3", 8, vec![0, 3, 7]),
    ] {
        let fleet = SimFleet::new(11);
        let (devs, pool, store) = sim_pool(&fleet, layout, n, DEV);
        let model = populate(&store, 5, 40);
        drop(store);
        pool.export().unwrap();
        let mut flipped = 0;
        for &b in &bad {
            flipped += rot(&devs[b], 100 + b as u64, 0.5, 8 << 20);
        }
        assert!(flipped > 20, "{layout}: corrupted only {flipped} regions");
        let (pool, store) = reimport(&devs);
        verify(&store, &model).unwrap_or_else(|e| panic!("{layout}: {e}"));
        let errs = cksum_errors(&pool);
        for (i, e) in errs.iter().enumerate() {
            if bad.contains(&i) {
                assert!(
                    *e > 0,
                    "{layout}: no CKSUM errors counted on rotted child {i}: {errs:?}"
                );
            } else {
                assert_eq!(
                    *e, 0,
                    "{layout}: CKSUM errors on healthy child {i}: {errs:?}"
                );
            }
        }
        // The repairs were written back: a second pass finds nothing to fix.
        let before = cksum_errors(&pool);
        verify(&store, &model).unwrap();
        assert_eq!(
            cksum_errors(&pool),
            before,
            "{layout}: second read still found damage"
        );
        // That many checksum errors make a device DEGRADED (as ZFS's fault management does)
        // until the administrator clears them.
        for (i, (_, leaf)) in pool.leaf_list().iter().enumerate() {
            let expected = if errs[i] >= 10 { "DEGRADED" } else { "ONLINE" };
            assert_eq!(
                leaf.state().name(),
                expected,
                "{layout}: child {i}, {errs:?}"
            );
        }
        assert_eq!(pool.state(), "DEGRADED");
        pool.clear(None).unwrap();
        assert_eq!(pool.state(), "ONLINE");
        drop(store);
        pool.export().unwrap();
    }
}

#[test]
fn damage_beyond_parity_is_an_error_never_wrong_data() {
    let fleet = SimFleet::new(12);
    let (devs, pool, store) = sim_pool(&fleet, "raidz1", 4, DEV);
    let model = populate(&store, 6, 30);
    drop(store);
    pool.export().unwrap();
    // The same regions on two children of a raidz1: some blocks lose two columns.
    for d in [&devs[0], &devs[1]] {
        let mut off = FRONT_RESERVE + 8192;
        while off < FRONT_RESERVE + (24 << 20) {
            d.corrupt(off, 2048).unwrap();
            off += 3 * 65536;
        }
    }
    let (_pool, store) = reimport(&devs);
    let os = store.objset(ROOT_OBJSET).unwrap();
    let mut errors = 0;
    for (id, data) in &model {
        match os.read(*id, 0, data.len()) {
            Ok(got) => assert_eq!(&got, data, "object {id}: wrong data returned"),
            Err(_) => errors += 1,
        }
    }
    assert!(errors > 0, "the damage beyond parity was not detected");
}

#[test]
fn misdirected_and_lost_writes_on_parity_children() {
    misdirected_and_lost_writes_on_parity_children_body();
}

/// The same with gang blocks: every block above 8 KiB is a header and its pieces.
#[test]
fn misdirected_and_lost_writes_on_parity_children_with_gang_blocks() {
    with_gang_blocks(8192, misdirected_and_lost_writes_on_parity_children_body);
}

fn misdirected_and_lost_writes_on_parity_children_body() {
    let fleet = SimFleet::new(13);
    let (devs, pool, store) = sim_pool(&fleet, "raidz2", 7, DEV);
    for d in [&devs[2], &devs[5]] {
        d.set_faults(FaultConfig {
            misdirect_write: 0.05,
            lost_write: 0.05,
            ..Default::default()
        });
    }
    let model = populate(&store, 7, 40);
    for d in &devs {
        d.set_faults(FaultConfig::default());
    }
    let s = devs[2].stats();
    assert!(
        s.misdirected_writes + s.lost_writes > 0,
        "no faults were injected: {s:?}"
    );
    drop(store);
    pool.export().unwrap();
    let (pool, store) = reimport(&devs);
    verify(&store, &model).unwrap();
    let errs = cksum_errors(&pool);
    assert!(errs[2] + errs[5] > 0, "repairs not counted: {errs:?}");
}

#[test]
fn pulled_devices_degraded_reads_and_import() {
    let fleet = SimFleet::new(14);
    let (devs, pool, store) = sim_pool(&fleet, "raidz2", 7, DEV);
    let model = populate(&store, 8, 30);
    // Two disks vanish while the pool runs: reads reconstruct.
    devs[0].set_gone(true);
    devs[6].set_gone(true);
    verify(&store, &model).unwrap();
    drop(store);
    pool.shutdown().unwrap();
    devs[0].set_gone(false);
    devs[6].set_gone(false);
    // Imported with two devices missing: DEGRADED, every object readable, still writable.
    let present: Vec<DeviceRef> = devs[1..6]
        .iter()
        .map(|d| Arc::new(d.clone()) as DeviceRef)
        .collect();
    let (pool, store) = import_devs(&present, false).unwrap();
    assert_eq!(pool.state(), "DEGRADED");
    verify(&store, &model).unwrap();
    let os = store.objset(ROOT_OBJSET).unwrap();
    let tx = store.begin(100_000).unwrap();
    let id = os.create_object(&tx, 1, 131072).unwrap();
    os.write(&tx, id, 0, &vec![9u8; 100_000]).unwrap();
    drop(tx);
    store.sync().unwrap();
    drop(store);
    pool.export().unwrap();
    // Three missing: refused with the names of the missing devices.
    let present: Vec<DeviceRef> = devs[3..]
        .iter()
        .map(|d| Arc::new(d.clone()) as DeviceRef)
        .collect();
    let err = import_devs(&present, false).unwrap_err();
    assert!(
        err.contains("too many unavailable devices") && err.contains("d0"),
        "{err}"
    );
}

#[test]
fn mirror_survives_all_but_one_side() {
    let fleet = SimFleet::new(15);
    let (devs, pool, store) = sim_pool(&fleet, "mirror", 3, DEV);
    let model = populate(&store, 9, 30);
    drop(store);
    pool.export().unwrap();
    rot(&devs[0], 1, 0.6, 8 << 20);
    rot(&devs[1], 2, 0.6, 8 << 20);
    let (pool, store) = reimport(&devs);
    verify(&store, &model).unwrap();
    // Reads spread over the sides: the rotted ones were read (and repaired) where chosen.
    let errs = cksum_errors(&pool);
    assert!(errs[0] + errs[1] > 0 && errs[2] == 0, "{errs:?}");
}

#[test]
fn ditto_copies_heal_metadata_on_a_single_disk() {
    let fleet = SimFleet::new(16);
    let (devs, pool, store) = sim_pool(&fleet, "", 1, DEV);
    let model = populate(&store, 10, 20);
    let (root_bp, _) = pool.root();
    drop(store);
    pool.export().unwrap();
    // Rot the first copy of the root block: the second copy serves it and repairs the first.
    let dva = root_bp.unwrap().dvas[0];
    devs[0].corrupt(FRONT_RESERVE + dva.offset, 64).unwrap();
    let (pool, store) = reimport(&devs);
    verify(&store, &model).unwrap();
    assert!(pool.status().healed_blocks >= 1);
}

#[test]
fn write_failure_within_redundancy_faults_the_device_and_continues() {
    let fleet = SimFleet::new(17);
    let (devs, pool, store) = sim_pool(&fleet, "raidz2", 7, DEV);
    let mut model = populate(&store, 11, 10);
    devs[3].set_faults(FaultConfig {
        write_error: 1.0,
        ..Default::default()
    });
    // A 2 MiB object: full stripes, so every child gets columns.
    let os = store.objset(ROOT_OBJSET).unwrap();
    let data: Vec<u8> = bytes(&mut rng(99), 2 << 20, false);
    let tx = store.begin(data.len() as u64).unwrap();
    let id = os.create_object(&tx, 1, 131072).unwrap();
    os.write(&tx, id, 0, &data).unwrap();
    drop(tx);
    model.insert(id, data);
    store.sync().unwrap();
    assert_eq!(
        pool.state(),
        "DEGRADED",
        "{:?}",
        devs.iter().map(|d| d.stats().writes).collect::<Vec<_>>()
    );
    let leaf = &pool.leaf_list()[3].1;
    assert_eq!(leaf.state(), tank_vdev::VdevState::Faulted);
    assert!(leaf.stats.snapshot().write_errors > 0);
    verify(&store, &model).unwrap();
}

#[test]
fn unrepairable_write_failure_suspends_the_pool() {
    let fleet = SimFleet::new(18);
    let (devs, pool, store) = sim_pool(&fleet, "", 1, DEV);
    let model = populate(&store, 12, 10);
    let committed = pool.synced_txg();
    devs[0].set_faults(FaultConfig {
        write_error: 1.0,
        ..Default::default()
    });
    let os = store.objset(ROOT_OBJSET).unwrap();
    {
        let tx = store.begin(10_000).unwrap();
        let id = os.create_object(&tx, 1, 4096).unwrap();
        os.write(&tx, id, 0, &[1u8; 10_000]).unwrap();
    }
    let err = store.sync().unwrap_err();
    assert!(err.to_string().contains("suspended"), "{err}");
    assert!(
        store.begin(1).is_err(),
        "a suspended pool must refuse new transactions"
    );
    assert_eq!(pool.state(), "SUSPENDED");
    drop(store);
    let _ = pool.shutdown();
    drop(pool);
    devs[0].set_faults(FaultConfig::default());
    let (pool, store) = reimport(&devs);
    assert_eq!(pool.synced_txg(), committed);
    verify(&store, &model).unwrap();
}

#[test]
fn full_pool_gives_no_space_and_stays_usable() {
    full_pool_gives_no_space_and_stays_usable_body();
}

/// Small overwrites of large blocks on a nearly full pool: each 4 KiB write is admitted
/// for 4 KiB and then holds (and at its sync allocates) a whole new 1 MiB block. The
/// admission keeps room for that, so every admitted txg commits and the pool ends with a
/// clean refusal, never a failed sync.
#[test]
fn small_writes_into_large_blocks_never_fail_a_sync_on_a_full_pool() {
    let fleet = SimFleet::new(23);
    let (_devs, _pool, store) = sim_pool(&fleet, "", 1, DEV);
    let os = store.objset(ROOT_OBJSET).unwrap();
    let mut r = rng(23);
    // Objects of four 1 MiB blocks until the pool refuses one.
    let mut ids = Vec::new();
    loop {
        let data: Vec<u8> = (0..4 << 20).map(|_| r.gen()).collect();
        let Ok(tx) = store.begin(data.len() as u64) else {
            break;
        };
        let id = os.create_object(&tx, 1, 1 << 20).unwrap();
        os.write(&tx, id, 0, &data).unwrap();
        drop(tx);
        ids.push(id);
        store.sync().unwrap();
    }
    assert!(ids.len() > 8, "only {} objects fit", ids.len());
    // 4 KiB into the middle of each block in turn, a txg each, until refused.
    let mut refused = false;
    'outer: for round in 0..2 {
        for &id in &ids {
            for block in 0..4u64 {
                let patch: Vec<u8> = (0..4096).map(|_| r.gen()).collect();
                let at = block * (1 << 20) + 4096 * (1 + round);
                match store.begin(patch.len() as u64) {
                    Ok(tx) => {
                        os.write(&tx, id, at, &patch).unwrap();
                        drop(tx);
                        store
                            .sync()
                            .unwrap_or_else(|e| panic!("an admitted txg failed its sync: {e}"));
                        assert_eq!(os.read(id, at, patch.len()).unwrap(), patch);
                    }
                    Err(e) => {
                        assert_eq!(e.errno(), 28, "expected ENOSPC, got {e}");
                        refused = true;
                        break 'outer;
                    }
                }
            }
        }
    }
    assert!(refused, "the overwrites never filled the pool");
    // Still usable: a free, and a write into the space it gives back.
    let tx = store.begin(0).unwrap();
    os.free_object(&tx, ids[0]).unwrap();
    drop(tx);
    let tx = store.begin(4096).unwrap();
    os.write(&tx, ids[1], 0, &[7u8; 4096]).unwrap();
    drop(tx);
    store.sync().unwrap();
}

/// The same with gang blocks: every block above 8 KiB is a header and its pieces.
#[test]
fn full_pool_gives_no_space_and_stays_usable_with_gang_blocks() {
    with_gang_blocks(8192, full_pool_gives_no_space_and_stays_usable_body);
}

fn full_pool_gives_no_space_and_stays_usable_body() {
    let fleet = SimFleet::new(19);
    let (_devs, pool, store) = sim_pool(&fleet, "", 1, DEV);
    let os = store.objset(ROOT_OBJSET).unwrap();
    let chunk = vec![0x5au8; 1 << 20];
    let mut r = rng(1);
    let mut ids = Vec::new();
    let mut full = false;
    for _ in 0..200 {
        let data: Vec<u8> = chunk.iter().map(|_| r.gen()).collect();
        let tx = match store.begin(data.len() as u64) {
            Ok(tx) => tx,
            Err(e) => {
                assert_eq!(e.errno(), 28, "expected ENOSPC, got {e}");
                full = true;
                break;
            }
        };
        let id = os.create_object(&tx, 1, 131072).unwrap();
        os.write(&tx, id, 0, &data).unwrap();
        drop(tx);
        ids.push(id);
        store
            .sync()
            .unwrap_or_else(|e| panic!("{e}: {:?}", pool.space()));
    }
    assert!(full, "a 64 MiB pool took 200 MiB");
    // Refused again at once: nothing in flight could make room.
    let synced = pool.synced_txg();
    assert_eq!(store.begin(1 << 20).err().map(|e| e.errno()), Some(28));
    assert_eq!(
        pool.synced_txg(),
        synced,
        "a refusal with nothing in flight synced"
    );
    // Delete: space comes back after the deferral window, and the next write waits for it
    // (the txgs that run it out are committed for it, with nothing else to write).
    for id in ids.drain(..10) {
        let tx = store.begin(0).unwrap();
        os.free_object(&tx, id).unwrap();
    }
    let tx = store.begin(1 << 20).unwrap();
    assert!(
        pool.synced_txg() > synced + tank_block::DEFER_TXGS,
        "the write went in before the frees' deferral ran out (txg {} after {synced})",
        pool.synced_txg()
    );
    let id = os.create_object(&tx, 1, 131072).unwrap();
    os.write(&tx, id, 0, &chunk).unwrap();
    drop(tx);
    store.sync().unwrap();
    assert_eq!(os.read(id, 0, chunk.len()).unwrap(), chunk);
}

#[test]
fn truncated_device_file_is_unavailable_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let paths: Vec<_> = (0..3).map(|i| dir.path().join(format!("f{i}"))).collect();
    let opts = tank_device::FileDeviceOptions {
        create_size: Some(DEV),
        ..Default::default()
    };
    let map: std::collections::HashMap<String, DeviceRef> = paths
        .iter()
        .enumerate()
        .map(|(i, p)| {
            (
                format!("f{i}"),
                Arc::new(tank_device::FileDevice::open(p, &opts).unwrap()) as DeviceRef,
            )
        })
        .collect();
    let (pool, _) =
        tank_pool::Pool::create("t", &spec("raidz1 f0 f1 f2"), &map, &Default::default()).unwrap();
    let store = tank_object::ObjectStore::open(pool.clone()).unwrap();
    let model = populate(&store, 20, 10);
    drop(store);
    pool.export().unwrap();
    drop(pool);
    drop(map);
    // Cut one file in half.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&paths[1])
        .unwrap();
    f.set_len(DEV / 2).unwrap();
    drop(f);
    let devs: Vec<DeviceRef> = paths
        .iter()
        .map(|p| {
            Arc::new(tank_device::FileDevice::open(p, &Default::default()).unwrap()) as DeviceRef
        })
        .collect();
    assert!(devs[1].size() < DEV);
    let (pool, store) = import_devs(&devs, false).unwrap();
    assert_eq!(pool.state(), "DEGRADED");
    verify(&store, &model).unwrap();
}
