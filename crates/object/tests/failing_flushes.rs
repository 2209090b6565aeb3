//! Failing flushes ("fsyncgate"): a device whose flush fails has lost the writes the flush
//! covered, and a later flush that succeeds does not bring them back. The pool must never
//! acknowledge those writes: on a single disk the txg fails and the pool suspends (an import
//! finds the last committed txg whole); on a mirror or RAID-Z the device is FAULTED, the txg
//! commits on the others, and a resilver after `clear` rewrites everything the device missed,
//! the txg of the failed flush included. Also: a device that fails every I/O from a point
//! on, or that becomes very slow (a sick disk, seconds per I/O), is faulted while the pool
//! serves from redundancy and says so in its status; a slow device the vdev cannot spare is
//! kept in use, DEGRADED.

mod common;

use common::*;
use std::time::{Duration, Instant};

use tank_device::{FaultConfig, SimDevice, SimFleet};
use tank_object::{ObjectStore, ScanPhase, ROOT_OBJSET};
use tank_pool::{Pool, SlowIoPolicy};
use tank_vdev::{Leaf, VdevState};

const DEV: u64 = 64 << 20;

fn flushes_fail(dev: &SimDevice) {
    dev.set_faults(FaultConfig {
        flush_error: 1.0,
        ..Default::default()
    });
}

/// Writes a 1 MiB object (full stripes: every child gets columns) and returns its id.
fn write_object(store: &ObjectStore, model: &mut Model, seed: u64) -> u64 {
    let os = store.objset(ROOT_OBJSET).unwrap();
    let data = bytes(&mut rng(seed), 1 << 20, false);
    let tx = store.begin(data.len() as u64).unwrap();
    let id = os.create_object(&tx, 1, 131072).unwrap();
    os.write(&tx, id, 0, &data).unwrap();
    drop(tx);
    model.insert(id, data);
    id
}

#[test]
fn a_failed_flush_on_a_single_disk_is_never_acknowledged() {
    let fleet = SimFleet::new(41);
    let (devs, pool, store) = sim_pool(&fleet, "", 1, DEV);
    let model = populate(&store, 41, 20);
    let committed = pool.synced_txg();
    flushes_fail(&devs[0]);
    let mut unacked = model.clone();
    write_object(&store, &mut unacked, 1);
    let err = store.sync().unwrap_err();
    assert!(err.to_string().contains("suspended"), "{err}");
    assert_eq!(pool.state(), "SUSPENDED");
    assert!(
        devs[0].stats().writes_lost_by_flush > 0,
        "no write was lost"
    );
    assert!(
        store.begin(1).is_err(),
        "a suspended pool takes no transaction"
    );
    drop(store);
    let _ = pool.shutdown();
    drop(pool);
    // The disk is healthy again, and a flush now succeeds: the lost writes stay lost, and
    // the pool shows the last txg whose flushes all succeeded, whole.
    devs[0].set_faults(FaultConfig::default());
    let (pool, store) = reimport(&devs);
    assert_eq!(pool.synced_txg(), committed);
    verify(&store, &model).unwrap();
    // And it goes on: the same write now commits.
    let mut model = model;
    write_object(&store, &mut model, 1);
    store.sync().unwrap();
    verify(&store, &model).unwrap();
    drop(store);
    pool.export().unwrap();
}

/// One device of a redundant vdev fails its flushes: FAULTED, the txg commits on the
/// others, and after `clear` the resilver rewrites what the device lost, so that the data
/// reads with the other devices gone.
fn redundant_case(layout: &str, n: usize, bad: usize, others: &[usize]) {
    let fleet = SimFleet::new(42);
    let (devs, pool, store) = sim_pool(&fleet, layout, n, DEV);
    let mut model = populate(&store, 42, 20);
    flushes_fail(&devs[bad]);
    write_object(&store, &mut model, 2);
    store
        .sync()
        .unwrap_or_else(|e| panic!("{layout}: the txg fails with redundancy left: {e}"));
    let (_, leaf) = &pool.leaf_list()[bad];
    assert_eq!(leaf.state(), VdevState::Faulted, "{layout}");
    assert!(leaf.stats.snapshot().write_errors > 0, "{layout}");
    assert_eq!(pool.state(), "DEGRADED", "{layout}");
    let status = pool.status();
    assert!(
        status.status.as_deref().is_some_and(|s| !s.is_empty()),
        "{layout}: status says nothing: {status:?}"
    );
    assert!(devs[bad].stats().writes_lost_by_flush > 0, "{layout}");
    verify(&store, &model).unwrap_or_else(|e| panic!("{layout}: {e}"));
    // More writes while it is faulted, then the device recovers and is cleared.
    write_object(&store, &mut model, 3);
    store.sync().unwrap();
    devs[bad].set_faults(FaultConfig::default());
    pool.clear(None).unwrap();
    if store.resilver_start().unwrap() {
        store.scan_wait();
        store.sync().unwrap();
    }
    let st = store.scan_status();
    assert_eq!(st.state.phase, ScanPhase::Finished, "{layout}: {st:?}");
    assert_eq!(st.state.errors, 0, "{layout}: {st:?}");
    assert_eq!(pool.state(), "ONLINE", "{layout}");
    drop(store);
    pool.export().unwrap();
    // What the device lost to the failed flush was rewritten: it reads without the others.
    for &o in others {
        devs[o].set_gone(true);
    }
    let (pool, store) = reimport(&devs);
    verify(&store, &model).unwrap_or_else(|e| panic!("{layout} without {others:?}: {e}"));
    drop(store);
    pool.export().unwrap();
}

#[test]
fn a_failed_flush_on_a_mirror_side_faults_it_and_the_resilver_rewrites_it() {
    redundant_case("mirror", 2, 1, &[0]);
}

#[test]
fn a_failed_flush_on_a_raidz_child_faults_it_and_the_resilver_rewrites_it() {
    redundant_case("raidz2", 6, 2, &[0, 4]);
}

#[test]
fn a_device_failing_every_io_is_faulted_and_the_pool_serves_from_parity() {
    let fleet = SimFleet::new(43);
    let (devs, pool, store) = sim_pool(&fleet, "raidz2", 6, DEV);
    let mut model = populate(&store, 43, 20);
    // From here on, every read, write and flush of d3 fails.
    devs[3].set_faults(FaultConfig {
        read_error: 1.0,
        write_error: 1.0,
        flush_error: 1.0,
        ..Default::default()
    });
    verify(&store, &model).unwrap();
    write_object(&store, &mut model, 4);
    store.sync().unwrap();
    verify(&store, &model).unwrap();
    let (_, leaf) = &pool.leaf_list()[3];
    assert_eq!(leaf.state(), VdevState::Faulted);
    assert_eq!(pool.state(), "DEGRADED");
    let status = pool.status();
    let text = format!("{status:?}");
    assert!(
        text.contains("FAULTED"),
        "the status names the faulted device: {text}"
    );
    drop(store);
    pool.export().unwrap();
    let (_pool, store) = reimport(&devs);
    verify(&store, &model).unwrap();
}

/// Sickness scaled down for a test: "slow" is 100 ms instead of 3 s, and 4 slow I/Os in a
/// minute make a verdict instead of 10; the sick device takes 250 ms per read or write.
fn make_sick(pool: &Pool, dev: &SimDevice) {
    pool.set_slow_io_policy(SlowIoPolicy {
        threshold: Duration::from_millis(100),
        count: 4,
        window: Duration::from_secs(60),
    });
    dev.set_faults(FaultConfig {
        delay: Duration::from_millis(250),
        ..Default::default()
    });
}

/// Writes objects, a txg each, until `leaf` leaves ONLINE (at most 20 txgs or 60 s).
fn write_until_judged(store: &ObjectStore, model: &mut Model, pool: &Pool, leaf: &Leaf) {
    let deadline = Instant::now() + Duration::from_secs(60);
    for seed in 100..120 {
        if leaf.state() != VdevState::Online || Instant::now() > deadline {
            break;
        }
        write_object(store, model, seed);
        store.sync().unwrap();
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_ne!(leaf.state(), VdevState::Online, "{:?}", pool.status());
}

#[test]
fn a_sick_device_taking_seconds_per_io_is_faulted_and_the_pool_serves_from_parity() {
    let fleet = SimFleet::new(44);
    let (devs, pool, store) = sim_pool(&fleet, "raidz2", 6, DEV);
    let mut model = populate(&store, 44, 20);
    make_sick(&pool, &devs[3]);
    let (_, leaf) = &pool.leaf_list()[3];
    write_until_judged(&store, &mut model, &pool, leaf);
    assert_eq!(leaf.state(), VdevState::Faulted);
    let reason = leaf.reason().unwrap_or_default();
    assert!(reason.contains("too many slow I/Os"), "{reason}");
    assert!(leaf.stats.snapshot().slow_ios >= 4);
    assert_eq!(pool.state(), "DEGRADED");
    let events = pool.events.newest(500);
    assert!(events.iter().any(|e| e.class == "ereport.fs.zfs.delay"));
    assert!(format!("{:?}", pool.status()).contains("FAULTED"));
    // From now on the sick device gets no I/O; the pool writes and reads on the others.
    let touched = devs[3].stats();
    for seed in 200..203 {
        write_object(&store, &mut model, seed);
    }
    store.sync().unwrap();
    verify(&store, &model).unwrap();
    let after = devs[3].stats();
    assert_eq!(
        (after.reads, after.writes),
        (touched.reads, touched.writes),
        "I/O was sent to the faulted device"
    );
    // The disk is replaced by a healthy one in the same place (here: it recovers); after
    // clear, the resilver rewrites what it missed, and it reads without two others.
    devs[3].set_faults(FaultConfig::default());
    pool.clear(None).unwrap();
    if store.resilver_start().unwrap() {
        store.scan_wait();
        store.sync().unwrap();
    }
    assert_eq!(pool.state(), "ONLINE");
    drop(store);
    pool.export().unwrap();
    devs[0].set_gone(true);
    devs[4].set_gone(true);
    let (pool, store) = reimport(&devs);
    verify(&store, &model).unwrap();
    drop(store);
    pool.export().unwrap();
}

#[test]
fn a_sick_device_its_vdev_cannot_spare_stays_in_use_degraded() {
    let fleet = SimFleet::new(45);
    let (devs, pool, store) = sim_pool(&fleet, "", 1, DEV);
    let mut model = populate(&store, 45, 10);
    make_sick(&pool, &devs[0]);
    let (_, leaf) = &pool.leaf_list()[0];
    write_until_judged(&store, &mut model, &pool, leaf);
    assert_eq!(leaf.state(), VdevState::Degraded);
    let reason = leaf.reason().unwrap_or_default();
    assert!(reason.contains("no redundancy to spare"), "{reason}");
    assert_eq!(pool.state(), "DEGRADED");
    // Slow, but everything still works and nothing is lost.
    write_object(&store, &mut model, 300);
    store.sync().unwrap();
    verify(&store, &model).unwrap();
    devs[0].set_faults(FaultConfig::default());
    pool.clear(None).unwrap();
    assert_eq!(pool.state(), "ONLINE");
    drop(store);
    pool.export().unwrap();
}
