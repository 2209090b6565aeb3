//! Resilver: a device that was offline or missing gets exactly the txgs it missed (its dirty
//! time log, from its own uberblocks), the pool is ONLINE again only after a verifying pass,
//! and a resilver cut off by a crash resumes; the refusals of `offline` and `online`.

mod common;

use std::time::{Duration, Instant};

use common::*;
use tank_device::{CrashMode, SimFleet};
use tank_object::{ObjectStore, ScanPhase, ScanStatus};

const DEV: u64 = 64 << 20;

fn wait_resilver(store: &ObjectStore) -> ScanStatus {
    store.scan_wait();
    store.sync().unwrap();
    let st = store.scan_status();
    assert_eq!(st.state.func, "resilver", "{st:?}");
    assert_eq!(st.state.phase, ScanPhase::Finished, "{st:?}");
    st
}

/// Reads everything with `gone` devices pulled: only whole redundancy on the rest allows it.
fn verify_without(devs: &[tank_device::SimDevice], gone: &[usize], model: &Model) {
    for &g in gone {
        devs[g].set_gone(true);
    }
    let (pool, store) = reimport(devs);
    verify(&store, model).unwrap_or_else(|e| panic!("without {gone:?}: {e}"));
    drop(store);
    pool.export().unwrap();
    for &g in gone {
        devs[g].set_gone(false);
    }
}

#[test]
fn offline_device_gets_only_the_txgs_it_missed_and_is_verified() {
    offline_device_gets_only_the_txgs_it_missed_and_is_verified_body();
}

/// The same with gang blocks: every block above 8 KiB is a header and its pieces.
#[test]
fn offline_device_gets_only_the_txgs_it_missed_and_is_verified_with_gang_blocks() {
    with_gang_blocks(
        8192,
        offline_device_gets_only_the_txgs_it_missed_and_is_verified_body,
    );
}

fn offline_device_gets_only_the_txgs_it_missed_and_is_verified_body() {
    let fleet = SimFleet::new(31);
    let (devs, pool, store) = sim_pool(&fleet, "raidz2", 6, DEV);
    let mut model = populate(&store, 4, 40);
    // Offlining beyond the redundancy is refused.
    pool.offline("d1", false).unwrap();
    pool.offline("d2", true).unwrap();
    let err = pool.offline("d3", false).unwrap_err().to_string();
    assert!(err.contains("no valid replicas"), "{err}");
    assert!(pool.offline("nosuch", false).is_err());
    assert_eq!(pool.state(), "DEGRADED");
    // Writes while two devices are away.
    let mut r = rng(8);
    for _ in 0..30 {
        random_step(&store, &mut model, &mut r, 200_000).unwrap();
    }
    store.sync().unwrap();
    let before = pool.space().allocated;
    // Back online: each lacks exactly the txgs since it left.
    let missed = pool.online("d1").unwrap().expect("d1 missed txgs");
    assert!(missed.0 > 1 && missed.1 >= missed.0, "{missed:?}");
    assert_eq!(pool.state(), "DEGRADED", "not ONLINE before the resilver");
    assert!(store.resilver_start().unwrap());
    let st = wait_resilver(&store);
    assert_eq!(st.state.errors, 0);
    assert!(st.state.rebuilt_repaired > 0, "{st:?}");
    assert_eq!(st.state.verify_repaired, 0, "{st:?}");
    assert!(st.state.verified > 0);
    // Only what was written while it was away, not the whole device.
    assert!(
        st.state.rebuilt_repaired < before / 6,
        "rebuilt {} of {} allocated",
        st.state.rebuilt_repaired,
        before
    );
    pool.online("d2").unwrap().expect("d2 missed txgs");
    assert!(store.resilver_start().unwrap());
    wait_resilver(&store);
    assert_eq!(pool.state(), "ONLINE");
    // No CKSUM errors were counted for the stale columns.
    assert!(
        cksum_errors(&pool).iter().all(|&c| c == 0),
        "{:?}",
        cksum_errors(&pool)
    );
    assert!(!store.resilver_start().unwrap(), "nothing left to resilver");
    drop(store);
    pool.export().unwrap();
    // The rebuilt devices carry the data: read it with two others gone.
    verify_without(&devs, &[0, 3], &model);
}

#[test]
fn device_missing_at_import_is_resilvered_when_it_returns() {
    let fleet = SimFleet::new(32);
    let (devs, pool, store) = sim_pool(&fleet, "raidz2", 5, DEV);
    let mut model = populate(&store, 4, 30);
    drop(store);
    pool.export().unwrap();
    devs[2].set_gone(true);
    let (pool, store) = reimport(&devs);
    assert_eq!(pool.state(), "DEGRADED");
    let mut r = rng(9);
    for _ in 0..3 {
        for _ in 0..10 {
            random_step(&store, &mut model, &mut r, 200_000).unwrap();
        }
        store.sync().unwrap();
    }
    drop(store);
    pool.export().unwrap();
    devs[2].set_gone(false);
    let (pool, store) = reimport(&devs);
    assert!(
        pool.import_notes
            .iter()
            .any(|n| n.contains("needs a resilver")),
        "{:?}",
        pool.import_notes
    );
    assert_eq!(pool.state(), "DEGRADED");
    // Reads of what it lacks do not touch it: no false CKSUM errors.
    verify(&store, &model).unwrap();
    assert_eq!(cksum_errors(&pool)[2], 0);
    store.scan_resume();
    let st = wait_resilver(&store);
    assert_eq!((st.state.errors, st.state.verify_repaired), (0, 0));
    assert_eq!(pool.state(), "ONLINE");
    drop(store);
    pool.export().unwrap();
    verify_without(&devs, &[0, 4], &model);
}

#[test]
fn resilver_cut_off_by_a_crash_resumes_where_it_was() {
    let fleet = SimFleet::new(33);
    let (_devs, pool, store) = sim_pool(&fleet, "raidz2", 6, DEV);
    let mut model = populate(&store, 5, 20);
    pool.offline("d4", false).unwrap();
    let mut r = rng(10);
    for _ in 0..60 {
        random_step(&store, &mut model, &mut r, 200_000).unwrap();
    }
    store.sync().unwrap();
    pool.online("d4").unwrap().expect("missed txgs");
    store.set_scan_region_budget(1);
    assert!(store.resilver_start().unwrap());
    let t = Instant::now();
    loop {
        store.sync().unwrap();
        let st = store.scan_status();
        assert_eq!(st.state.phase, ScanPhase::Scanning, "finished too soon");
        if st.state.cursor > (0, 0) && !st.state.verifying {
            store.sync().unwrap();
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(60));
    }
    let images = fleet.crash_images(CrashMode::DropUnflushed);
    store.scan_suspend();
    drop(store);
    drop(pool);
    let (pool, store) = import_images(images, false).unwrap();
    let st = store.scan_status();
    assert_eq!(
        (st.state.func.as_str(), st.state.phase),
        ("resilver", ScanPhase::Scanning)
    );
    assert!(st.state.cursor > (0, 0), "{st:?}");
    assert_eq!(
        pool.state(),
        "DEGRADED",
        "still resilvering after the crash"
    );
    // Its uberblocks are current, but the resilver's own record says what it lacks.
    let leaf = &pool.leaf_list()[4].1;
    assert!(leaf.is_resilvering() && leaf.dtl().is_some());
    store.scan_resume();
    let done = wait_resilver(&store);
    assert_eq!((done.state.errors, done.state.verify_repaired), (0, 0));
    assert_eq!(pool.state(), "ONLINE");
    verify(&store, &model).unwrap();
}

#[test]
fn replaced_device_is_rebuilt_while_a_writer_runs() {
    let fleet = SimFleet::new(34);
    let (mut devs, pool, store) = sim_pool(&fleet, "raidz2", 5, DEV);
    let mut model = populate(&store, 6, 40);
    drop(store);
    pool.export().unwrap();
    devs[1].set_gone(true);
    let (pool, store) = reimport(&devs);
    assert_eq!(pool.state(), "DEGRADED");
    // Bad replacements are refused with the reason.
    let small = fleet.device("small", DEV / 2);
    let err = pool
        .replace("d1", "small", std::sync::Arc::new(small), false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("too small"), "{err}");
    let member = devs[3].clone();
    let err = pool
        .replace("d1", "d3", std::sync::Arc::new(member), false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("already a device of this pool"), "{err}");
    // The missing device replaced by a new one, rebuilt while writes go on.
    let new = fleet.device("n1", DEV);
    let (first, last) = pool
        .replace("d1", "n1", std::sync::Arc::new(new.clone()), false)
        .unwrap();
    assert_eq!(first, 1);
    assert!(last >= 1);
    assert_eq!(pool.state(), "DEGRADED");
    store.set_scan_region_budget(4);
    assert!(store.resilver_start().unwrap());
    write_while_scanning(&store, &mut model, 11, 20, 150_000, 4);
    let st = wait_resilver(&store);
    assert_eq!(
        (st.state.errors, st.state.verify_repaired),
        (0, 0),
        "{st:?}"
    );
    assert!(st.state.rebuilt_repaired > 0);
    assert_eq!(
        pool.state(),
        "ONLINE",
        "{:?}",
        pool.leaf_list()
            .iter()
            .map(|(_, l)| (l.path(), l.state().name(), l.reason(), l.stats.snapshot()))
            .collect::<Vec<_>>()
    );
    verify(&store, &model).unwrap();
    drop(store);
    pool.export().unwrap();
    // The new device replaces the old one for good: with it and without two others.
    devs[1] = new;
    verify_without(&devs, &[0, 4], &model);
}

#[test]
fn ten_read_errors_fault_a_device_and_clear_brings_it_back_resilvered() {
    let fleet = SimFleet::new(35);
    let (devs, pool, store) = sim_pool(&fleet, "raidz2", 5, DEV);
    let mut model = populate(&store, 7, 40);
    drop(store);
    pool.export().unwrap();
    let (pool, store) = reimport(&devs);
    // Every read of d3 fails: after ten, ZFS's fault management rule faults it; the data
    // stays readable from the others.
    devs[3].fail_reads(Some(0..DEV));
    verify(&store, &model).unwrap();
    let d3 = pool.leaf_list()[3].1.clone();
    assert_eq!(d3.state().name(), "FAULTED");
    assert!(
        d3.reason().unwrap().contains("too many read errors"),
        "{:?}",
        d3.reason()
    );
    assert_eq!(pool.state(), "DEGRADED");
    let events = pool.events.since(0);
    assert!(events
        .iter()
        .any(|e| e.class == "resource.fs.zfs.statechange" && e.detail.contains("FAULTED")));
    // Written while faulted: d3 misses it.
    let mut r = rng(12);
    for _ in 0..2 {
        for _ in 0..10 {
            random_step(&store, &mut model, &mut r, 150_000).unwrap();
        }
        store.sync().unwrap();
    }
    // The disk is fixed; clear brings it back with what it missed, and a resilver.
    devs[3].fail_reads(None);
    let back = pool.clear(None).unwrap();
    assert_eq!(back.len(), 1, "{back:?}");
    assert!(store.resilver_start().unwrap());
    let st = wait_resilver(&store);
    assert_eq!((st.state.errors, st.state.verify_repaired), (0, 0));
    assert_eq!(pool.state(), "ONLINE");
    assert_eq!(
        d3.stats.snapshot().read_errors,
        0,
        "clear reset the counters"
    );
    drop(store);
    pool.export().unwrap();
    verify_without(&devs, &[0, 1], &model);
}

#[test]
fn hot_spare_stands_in_for_a_failed_device_until_it_is_replaced() {
    use std::collections::HashMap;
    use std::sync::Arc;
    use tank_device::DeviceRef;
    let fleet = SimFleet::new(36);
    let names = ["d0", "d1", "d2", "d3", "d4", "s0"];
    let mut devs: Vec<tank_device::SimDevice> =
        names.iter().map(|n| fleet.device(n, DEV)).collect();
    let map: HashMap<String, DeviceRef> = names
        .iter()
        .zip(&devs)
        .map(|(n, d)| (n.to_string(), Arc::new(d.clone()) as DeviceRef))
        .collect();
    let opts = tank_pool::CreateOptions {
        tunables: manual_txgs(),
        ..Default::default()
    };
    let (pool, _) =
        tank_pool::Pool::create("sp", &spec("raidz2 d0 d1 d2 d3 d4 spare s0"), &map, &opts)
            .unwrap();
    let store = ObjectStore::open(pool.clone()).unwrap();
    let mut model = populate(&store, 8, 40);
    let spare_state = |pool: &tank_pool::Pool| {
        let st = pool.status();
        st.sections
            .iter()
            .find(|(n, _)| n == "spares")
            .map(|(_, v)| v[0].state.clone())
            .unwrap()
    };
    assert_eq!(spare_state(&pool), "AVAIL");
    // d2 dies: every read fails, ten failures fault it, the next txg puts the spare in.
    devs[2].fail_reads(Some(0..DEV));
    devs[2].set_gone(true);
    verify(&store, &model).unwrap();
    let mut r = rng(13);
    random_step(&store, &mut model, &mut r, 100_000).unwrap();
    store.sync().unwrap();
    let t = Instant::now();
    loop {
        let st = store.scan_status();
        if st.state.func == "resilver" && st.state.phase == ScanPhase::Finished {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no resilver onto the spare: {st:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    store.scan_wait();
    assert_eq!(spare_state(&pool), "INUSE");
    assert_eq!(
        pool.state(),
        "DEGRADED",
        "a spare stands in: not healthy yet"
    );
    let events = pool.events.since(0);
    assert!(events
        .iter()
        .any(|e| e.class == "sysevent.fs.zfs.vdev_spare"));
    verify(&store, &model).unwrap();
    // In use across export and import.
    drop(store);
    pool.export().unwrap();
    let (pool, store) = reimport(&devs);
    assert_eq!(spare_state(&pool), "INUSE");
    verify(&store, &model).unwrap();
    // The failed device replaced (by its own name): the spare is AVAIL again.
    let new = fleet.device("n2", DEV);
    pool.replace("d2", "n2", Arc::new(new.clone()), false)
        .unwrap();
    assert_eq!(spare_state(&pool), "AVAIL");
    assert!(store.resilver_start().unwrap());
    let st = wait_resilver(&store);
    assert_eq!((st.state.errors, st.state.verify_repaired), (0, 0));
    assert_eq!(pool.state(), "ONLINE");
    drop(store);
    pool.export().unwrap();
    devs[2] = new;
    let (pool, store) = reimport(&devs);
    assert_eq!(spare_state(&pool), "AVAIL");
    verify(&store, &model).unwrap();
}

#[test]
fn attach_makes_a_mirror_and_detach_refuses_to_drop_the_last_valid_copy() {
    use std::sync::Arc;
    let fleet = SimFleet::new(37);
    let (mut devs, pool, store) = sim_pool(&fleet, "", 1, DEV);
    let model = populate(&store, 9, 30);
    let new = fleet.device("d1", DEV);
    pool.attach("d0", "d1", Arc::new(new.clone()), false)
        .unwrap();
    assert_eq!(
        pool.state(),
        "DEGRADED",
        "the new side lacks everything yet"
    );
    // Until it is rebuilt, d0 is the only valid copy.
    let err = pool.detach("d0").unwrap_err().to_string();
    assert!(err.contains("only valid copy"), "{err}");
    assert!(store.resilver_start().unwrap());
    let st = wait_resilver(&store);
    assert_eq!((st.state.errors, st.state.verify_repaired), (0, 0));
    assert_eq!(pool.state(), "ONLINE");
    assert_eq!(pool.tops()[0].1.type_name(), "mirror");
    // A third side, then back to a single disk: d1 alone holds everything.
    let third = fleet.device("d2", DEV);
    pool.attach("d1", "d2", Arc::new(third), false).unwrap();
    assert!(store.resilver_start().unwrap());
    wait_resilver(&store);
    pool.detach("d0").unwrap();
    pool.detach("d2").unwrap();
    assert_eq!(pool.tops()[0].1.type_name(), "disk");
    let err = pool.detach("d1").unwrap_err().to_string();
    assert!(err.contains("only a side of a mirror"), "{err}");
    store.sync().unwrap();
    drop(store);
    pool.export().unwrap();
    devs[0].set_gone(true);
    devs.push(new);
    let (_pool, store) = reimport(&devs);
    verify(&store, &model).unwrap();
}

#[test]
fn seeded_faults_during_scrub_and_resilver_lose_nothing() {
    seeded_faults_during_scrub_and_resilver_lose_nothing_body();
}

/// The same with gang blocks: every block above 8 KiB is a header and its pieces.
#[test]
fn seeded_faults_during_scrub_and_resilver_lose_nothing_with_gang_blocks() {
    with_gang_blocks(
        8192,
        seeded_faults_during_scrub_and_resilver_lose_nothing_body,
    );
}

fn seeded_faults_during_scrub_and_resilver_lose_nothing_body() {
    use std::sync::Arc;
    use tank_device::FaultConfig;
    let fleet = SimFleet::new(38);
    let (mut devs, pool, store) = sim_pool(&fleet, "raidz2", 6, DEV);
    let mut model = populate(&store, 7, 150);
    // While scrubbing: one device flips bits on reads, another fails some reads.
    devs[1].set_faults(FaultConfig {
        bitrot_on_read: 0.1,
        ..Default::default()
    });
    devs[4].set_faults(FaultConfig {
        read_error: 0.1,
        ..Default::default()
    });
    store.scrub_start().unwrap();
    store.scan_wait();
    let st = store.scan_status();
    assert_eq!(st.state.phase, ScanPhase::Finished, "{st:?}");
    assert_eq!(
        st.state.errors, 0,
        "faults within the parity are no permanent errors: {st:?}"
    );
    assert!(
        devs[1].stats().bitrot_injected > 0 && devs[4].stats().read_errors_injected > 0,
        "{st:?} {:?} {:?}",
        devs[1].stats(),
        devs[4].stats()
    );
    verify(&store, &model).unwrap();
    // Ten read errors faulted d4, ten flipped bits degraded d1. Fixed and cleared, d4 gets
    // the txgs it missed meanwhile.
    assert_eq!(pool.leaf_list()[4].1.state().name(), "FAULTED");
    devs[4].set_faults(FaultConfig::default());
    pool.clear(None).unwrap();
    if store.resilver_start().unwrap() {
        let st = wait_resilver(&store);
        assert_eq!(
            (st.state.errors, st.state.verify_repaired),
            (0, 0),
            "{st:?}"
        );
    }
    // While resilvering a replaced device (one erasure already): bits flipped on one other
    // device, the most raidz2 can take beside it.
    let new = fleet.device("n3", DEV);
    pool.replace("d3", "n3", Arc::new(new.clone()), false)
        .unwrap();
    assert!(store.resilver_start().unwrap());
    let mut r = rng(14);
    for _ in 0..10 {
        random_step(&store, &mut model, &mut r, 100_000).unwrap();
    }
    let st = wait_resilver(&store);
    assert_eq!(st.state.errors, 0, "{st:?}");
    assert_eq!(
        st.state.verify_repaired, 0,
        "the rebuilt device verified: {st:?}"
    );
    assert!(devs[1].stats().bitrot_injected > 0);
    devs[1].set_faults(FaultConfig::default());
    verify(&store, &model).unwrap();
    drop(store);
    pool.export().unwrap();
    devs[3] = new;
    // The rebuilt device carries its share: read with two others gone.
    verify_without(&devs, &[0, 5], &model);
}
