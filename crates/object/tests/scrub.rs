//! The scrub: finds and repairs rot on every copy and every parity column, reports damage
//! beyond the redundancy as permanent errors by object (and forgets it once the damage is
//! gone), pauses, resumes, and survives export, import and a crash.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use rand::Rng;
use tank_device::{CrashMode, SimFleet};
use tank_object::{ObjectStore, ScanPhase, ScanStatus, ROOT_OBJSET};

const DEV: u64 = 64 << 20;

/// Runs a scrub to the end (pushing txgs, which the manual test tunables do not do).
fn scrub(store: &Arc<ObjectStore>) -> ScanStatus {
    store.scrub_start().unwrap();
    store.scan_wait();
    store.sync().unwrap();
    let st = store.scan_status();
    assert_eq!(st.state.phase, ScanPhase::Finished, "{st:?}");
    st
}

#[test]
fn scrub_repairs_every_copy_and_parity_and_a_second_scrub_finds_nothing() {
    scrub_repairs_every_copy_and_parity_and_a_second_scrub_finds_nothing_body();
}

/// The same with gang blocks: every block above 8 KiB is a header and its pieces.
#[test]
fn scrub_repairs_every_copy_and_parity_and_a_second_scrub_finds_nothing_with_gang_blocks() {
    with_gang_blocks(
        8192,
        scrub_repairs_every_copy_and_parity_and_a_second_scrub_finds_nothing_body,
    );
}

fn scrub_repairs_every_copy_and_parity_and_a_second_scrub_finds_nothing_body() {
    for (layout, n, bad, pull) in [
        ("raidz2", 7, vec![1usize, 4], vec![0usize, 6]),
        ("raidz1", 5, vec![2], vec![0]),
        ("mirror", 3, vec![0, 2], vec![1, 2]),
    ] {
        let fleet = SimFleet::new(21);
        let (devs, pool, store) = sim_pool(&fleet, layout, n, DEV);
        let model = populate(&store, 7, 40);
        drop(store);
        pool.export().unwrap();
        let mut flipped = 0;
        for &b in &bad {
            flipped += rot(&devs[b], 300 + b as u64, 0.5, 8 << 20);
        }
        assert!(flipped > 20, "{layout}: corrupted only {flipped} regions");
        let (pool, store) = reimport(&devs);
        let st = scrub(&store);
        assert!(st.state.repaired > 0, "{layout}: nothing repaired: {st:?}");
        assert_eq!(st.state.errors, 0, "{layout}: {st:?}");
        assert!(st.state.issued > 0 && st.state.blocks > 0);
        let errs = cksum_errors(&pool);
        for (i, e) in errs.iter().enumerate() {
            assert_eq!(
                *e > 0,
                bad.contains(&i),
                "{layout}: CKSUM counts {errs:?}, rotted children {bad:?}"
            );
        }
        // Each CKSUM error is an event naming its device; the scrub's start and end too.
        let events = pool.events.since(0);
        let classes: Vec<&str> = events.iter().map(|e| e.class.as_str()).collect();
        assert!(
            classes.contains(&"sysevent.fs.zfs.scrub_start"),
            "{classes:?}"
        );
        assert!(
            classes.contains(&"sysevent.fs.zfs.scrub_finish"),
            "{classes:?}"
        );
        let leaves = pool.leaf_list();
        for (i, (_, leaf)) in leaves.iter().enumerate() {
            let n = events
                .iter()
                .filter(|e| {
                    e.class == "ereport.fs.zfs.checksum"
                        && e.vdev.as_deref() == Some(leaf.path().as_str())
                })
                .count() as u64;
            assert_eq!(n, errs[i], "{layout}: checksum events of child {i}");
        }
        // Every copy is whole again: a second scrub repairs nothing and counts nothing.
        let before = cksum_errors(&pool);
        let again = scrub(&store);
        assert_eq!(again.state.repaired, 0, "{layout}: {again:?}");
        assert_eq!(cksum_errors(&pool), before, "{layout}");
        assert!(store.scan_errors().is_empty());
        // Parity was verified too: with other children pulled the data still reads.
        drop(store);
        pool.export().unwrap();
        for &p in &pull {
            devs[p].set_gone(true);
        }
        let (pool, store) = reimport(&devs);
        verify(&store, &model).unwrap_or_else(|e| panic!("{layout} degraded: {e}"));
        drop(store);
        pool.export().unwrap();
    }
}

#[test]
fn damage_beyond_parity_is_listed_by_object_until_it_is_gone() {
    let (devs, model, pool, store) = rotted_beyond_parity(22);
    let st = scrub(&store);
    assert!(st.state.errors > 0, "{st:?}");
    let listed = store.scan_errors();
    assert!(!listed.is_empty());
    let data_events = pool
        .events
        .since(0)
        .into_iter()
        .filter(|e| e.class == "ereport.fs.zfs.data")
        .count() as u64;
    assert_eq!(data_events, st.state.errors);
    // The objects listed are exactly the ones that cannot be read any more.
    let os = store.objset(ROOT_OBJSET).unwrap();
    let unreadable: Vec<u64> = model
        .iter()
        .filter(|(id, data)| os.read(**id, 0, data.len()).is_err())
        .map(|(id, _)| *id)
        .collect();
    let listed_objects: Vec<u64> = listed
        .iter()
        .filter(|(id, _)| *id == ROOT_OBJSET)
        .map(|(_, o)| *o)
        .collect();
    assert!(!unreadable.is_empty());
    assert_eq!(listed_objects, unreadable, "listed {listed:?}");
    // The list survives export and import.
    drop(os);
    drop(store);
    pool.export().unwrap();
    let (pool, store) = reimport(&devs);
    assert_eq!(store.scan_errors(), listed);
    // Deleting the damaged objects and scrubbing again clears it.
    let os = store.objset(ROOT_OBJSET).unwrap();
    {
        let tx = store.begin(0).unwrap();
        for id in &unreadable {
            os.free_object(&tx, *id).unwrap();
        }
    }
    store.sync().unwrap();
    let st = scrub(&store);
    assert_eq!(st.state.errors, 0, "{st:?}");
    assert!(store.scan_errors().is_empty(), "{:?}", store.scan_errors());
    drop(os);
    drop(store);
    pool.export().unwrap();
}

/// Waits until the scrub has issued something and its cursor has moved.
fn wait_progress(store: &ObjectStore) -> ScanStatus {
    let t = Instant::now();
    loop {
        let st = store.scan_status();
        assert_eq!(st.state.phase, ScanPhase::Scanning, "finished too soon");
        if st.state.cursor > (0, 0) && st.state.issued > 0 {
            return st;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "no progress: {st:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn scrub_pauses_resumes_and_survives_export_and_a_crash() {
    scrub_pauses_resumes_and_survives_export_and_a_crash_body();
}

/// The same with gang blocks: every block above 8 KiB is a header and its pieces.
#[test]
fn scrub_pauses_resumes_and_survives_export_and_a_crash_with_gang_blocks() {
    with_gang_blocks(
        8192,
        scrub_pauses_resumes_and_survives_export_and_a_crash_body,
    );
}

fn scrub_pauses_resumes_and_survives_export_and_a_crash_body() {
    let fleet = SimFleet::new(23);
    let (devs, pool, store) = sim_pool(&fleet, "raidz2", 6, DEV);
    let model = populate(&store, 11, 60);
    drop(store);
    pool.export().unwrap();
    // Rot far into the address space, so the end of the scrub has work to do.
    rot(&devs[3], 5, 0.5, 16 << 20);
    let (pool, store) = reimport(&devs);
    // One block per region: many regions, so the scrub is caught in the middle.
    store.set_scan_region_budget(1);
    store.scrub_start().unwrap();
    let seen = wait_progress(&store);
    store.scrub_pause().unwrap();
    let paused = store.scan_status();
    assert!(paused.state.paused && !paused.running, "{paused:?}");
    assert!(paused.state.cursor >= seen.state.cursor);
    assert!(
        store.scrub_pause().is_ok(),
        "pausing a paused scrub is allowed"
    );
    // Paused across export and import: nothing runs until it is resumed.
    drop(store);
    pool.export().unwrap();
    let (pool, store) = reimport(&devs);
    store.set_scan_region_budget(1);
    store.scan_resume();
    let st = store.scan_status();
    assert!(st.state.paused && !st.running, "{st:?}");
    assert_eq!(st.state.cursor, paused.state.cursor);
    // Resumed, then cut off by a crash after its progress reached a txg.
    store.scrub_start().unwrap();
    assert!(store.scrub_start().is_err(), "a second start is refused");
    let t = Instant::now();
    let before_crash = loop {
        store.sync().unwrap();
        let st = store.scan_status();
        assert_eq!(st.state.phase, ScanPhase::Scanning, "finished too soon");
        if st.state.cursor > paused.state.cursor {
            // Make that progress durable.
            store.sync().unwrap();
            break st;
        }
        assert!(t.elapsed() < Duration::from_secs(60));
    };
    let images = fleet.crash_images(CrashMode::DropUnflushed);
    store.scan_suspend();
    drop(store);
    drop(pool);
    let (pool, store) = import_images(images, false).unwrap();
    let st = store.scan_status();
    assert_eq!(st.state.phase, ScanPhase::Scanning);
    assert!(st.state.cursor >= before_crash.state.cursor, "{st:?}");
    store.set_scan_region_budget(1);
    store.scan_resume();
    store.scan_wait();
    store.sync().unwrap();
    let done = store.scan_status();
    assert_eq!(done.state.phase, ScanPhase::Finished, "{done:?}");
    assert_eq!(done.state.errors, 0);
    assert!(done.state.regions > 10, "{done:?}");
    // Everything the rot touched was repaired across the three runs: a new scrub finds
    // nothing and the data reads with two children gone.
    let again = scrub(&store);
    assert_eq!(again.state.repaired, 0, "{again:?}");
    verify(&store, &model).unwrap();
    drop(store);
    pool.export().unwrap();
}

#[test]
fn scrub_runs_beside_writers_and_deletes_with_correct_data() {
    let fleet = SimFleet::new(24);
    let (devs, pool, store) = sim_pool(&fleet, "raidz2", 6, DEV);
    let mut model = populate(&store, 13, 40);
    drop(store);
    pool.export().unwrap();
    rot(&devs[2], 6, 0.4, 8 << 20);
    let (pool, store) = reimport(&devs);
    store.set_scan_region_budget(4);
    store.scrub_start().unwrap();
    write_while_scanning(&store, &mut model, 77, 40, 200_000, 5);
    store.scan_wait();
    store.sync().unwrap();
    let st = store.scan_status();
    assert_eq!(st.state.phase, ScanPhase::Finished, "{st:?}");
    assert_eq!(st.state.errors, 0, "a freed block was reported: {st:?}");
    // Blocks freed and reused under the scan count as nothing: CKSUM errors only on the
    // rotted device.
    let errs = cksum_errors(&pool);
    for (i, e) in errs.iter().enumerate() {
        assert!(
            i == 2 || *e == 0,
            "CKSUM errors on healthy child {i}: {errs:?}"
        );
    }
    verify(&store, &model).unwrap();
    let again = scrub(&store);
    assert_eq!(again.state.errors, 0);
    drop(store);
    pool.export().unwrap();
    let (_pool, store) = reimport(&devs);
    verify(&store, &model).unwrap();
}

/// A scrub beside a writer that keeps freeing and reusing the space of a small pool: tree
/// nodes are written again and again where nodes freed under the scan were. Each is a new
/// node, not the freed one, and the old blocks below it are scrubbed too: afterwards every
/// block reads with the rotted device and without two others. (Taking such a node for the
/// freed one skipped its subtree, and a resilver then called a device whole that lacked
/// those blocks.)
#[test]
fn a_scrub_walks_nodes_written_in_space_freed_under_it() {
    let fleet = SimFleet::new(26);
    let (devs, pool, store) = sim_pool(&fleet, "raidz2", 5, DEV);
    let mut model = populate_small(&store, 14, 60, 40_000);
    // A large file fills most of the rest, so the writer below comes round to freed space
    // soon.
    let os = store.objset(ROOT_OBJSET).unwrap();
    let tx = store.begin(0).unwrap();
    let big = os.create_object(&tx, 1, 131072).unwrap();
    drop(tx);
    let chunk = bytes(&mut rng(15), 1 << 20, false);
    for i in 0..120u64 {
        let tx = store.begin(1 << 20).unwrap();
        os.write(&tx, big, i << 20, &chunk).unwrap();
        drop(tx);
        if i % 16 == 15 {
            store.sync().unwrap();
        }
    }
    store.sync().unwrap();
    drop(os);
    // Kept beside the model until the end, out of the random workload's reach.
    let mut big_data = chunk.repeat(120);
    drop(store);
    pool.export().unwrap();
    let rotted = rot(&devs[2], 7, 1.0, 4 << 20);
    assert!(rotted > 200, "{rotted}");
    let (pool, store) = reimport(&devs);
    let before = written_bytes(&pool);
    let free = pool.space().free;
    store.set_scan_region_budget(1);
    store.scrub_start().unwrap();
    // Many small txgs, each freeing what the one before wrote: the allocator comes round
    // to freed space again and again while the scan runs.
    let mut r = rng(78);
    let os = store.objset(ROOT_OBJSET).unwrap();
    let mut steps = 0;
    while store.scan_status().running || steps < 50 {
        // A block of the large file rewritten (its space freed, its tree path written
        // anew), and now and then a step of the random workload.
        let at = r.gen_range(0..120usize * 8) << 17;
        let data = bytes(&mut r, 1 << 17, false);
        let tx = store.begin(1 << 17).unwrap();
        os.write(&tx, big, at as u64, &data).unwrap();
        drop(tx);
        big_data[at..at + (1 << 17)].copy_from_slice(&data);
        if steps % 4 == 0 {
            random_step(&store, &mut model, &mut r, 20_000).unwrap();
        }
        store.sync().unwrap();
        steps += 1;
        assert!(steps < 100_000, "the scan never ended");
    }
    drop(os);
    model.insert(big, big_data);
    store.scan_wait();
    store.sync().unwrap();
    let st = store.scan_status();
    assert_eq!(st.state.phase, ScanPhase::Finished, "{st:?}");
    assert_eq!(st.state.errors, 0, "{st:?}");
    assert!(st.state.repaired > 0, "{st:?}");
    // More was written under the scan than there was free space: space freed under it
    // was written again.
    let written = written_bytes(&pool) - before;
    assert!(
        written > 2 * free,
        "{written} bytes written under the scan, {free} free"
    );
    drop(store);
    pool.export().unwrap();
    // Everything the scrub had to repair on the rotted device was repaired: it reads
    // without two of the other devices.
    for g in [0, 4] {
        devs[g].set_gone(true);
    }
    let (pool, store) = reimport(&devs);
    verify(&store, &model).unwrap();
    drop(store);
    pool.export().unwrap();
}

/// Bytes written to every leaf of the pool so far.
fn written_bytes(pool: &tank_pool::Pool) -> u64 {
    pool.leaf_list()
        .iter()
        .map(|(_, l)| l.stats.snapshot().write_bytes)
        .sum()
}

/// Fills the pool with the model workload, at most `max_len` bytes a step, and syncs.
fn populate_small(store: &ObjectStore, seed: u64, steps: usize, max_len: usize) -> Model {
    let mut model = Model::new();
    let mut r = rng(seed);
    for _ in 0..steps {
        random_step(store, &mut model, &mut r, max_len).unwrap();
    }
    store.sync().unwrap();
    model
}

#[test]
fn reads_that_find_no_good_copy_enter_the_error_log_too() {
    let (devs, model, pool, store) = rotted_beyond_parity(25);
    assert!(store.scan_errors().is_empty());
    let os = store.objset(ROOT_OBJSET).unwrap();
    let unreadable: Vec<u64> = model
        .iter()
        .filter(|(id, data)| os.read(**id, 0, data.len()).is_err())
        .map(|(id, _)| *id)
        .collect();
    assert!(!unreadable.is_empty());
    // No scrub ran: the reads themselves logged what they could not repair.
    let listed: Vec<u64> = store
        .scan_errors()
        .iter()
        .filter(|(t, _)| *t == ROOT_OBJSET)
        .map(|(_, o)| *o)
        .collect();
    assert_eq!(listed, unreadable);
    // And the log is persistent.
    drop(os);
    drop(store);
    pool.export().unwrap();
    let (_pool, store) = reimport(&devs);
    assert_eq!(store.scan_errors().len(), unreadable.len());
}
