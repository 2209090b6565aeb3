//! The intent log: fsync acknowledged by a log record, replayed after a crash.
//!
//! - A workload of small and large writes, each followed by fsync, on a mirror with a
//!   separate log device and on one without (the log then lives in a region of the pool),
//!   is cut at every device write and flush (and seeded variants that keep random unflushed
//!   writes or tear the last one). Txgs commit only when the log cannot take a commit, so
//!   what survives is the log's work: after import and replay the file must be exactly as
//!   the last acknowledged fsync left it, or as the one in flight.
//! - The log device pulled in the middle: commits fall back to txg syncs, then to the
//!   pool's region; nothing acknowledged is lost, and the pool imports without it.
//! - A log device missing at import with records on it: refused with a message naming
//!   `-m`; with `-m`, imported at the last committed txg.
//! - Large writes go to the pool with a pointer in the log (little log traffic).

mod posix_common;

use std::collections::HashMap;
use std::sync::Arc;

use posix_common::*;
use tank_dataset::posix::{Cred, Fs, ROOT_INO};
use tank_device::{BlockDevice, CrashMode, DeviceRef, SimDevice, SimFleet};
use tank_object::ObjectStore;
use tank_pool::{CreateOptions, ImportOptions, Pool};

const DEV_SIZE: u64 = 64 << 20;
const LOG_SIZE: u64 = 64 << 20;

fn log_pool(fleet: &SimFleet, slog: bool) -> (Vec<SimDevice>, Arc<Pool>, Arc<ObjectStore>) {
    let (n, size) = sim_devices(2, DEV_SIZE);
    let names: Vec<String> = (0..n).map(|i| format!("d{i}")).collect();
    let mut devs: Vec<SimDevice> = names.iter().map(|d| fleet.device(d, size)).collect();
    let mut text = sim_layout(&names);
    if slog {
        devs.push(fleet.device("s0", LOG_SIZE));
        text.push_str(" log s0");
    }
    let map: HashMap<String, DeviceRef> = devs
        .iter()
        .map(|d| (d.name().to_string(), Arc::new(d.clone()) as DeviceRef))
        .collect();
    let opts = CreateOptions {
        ashift: 12,
        force: false,
        tunables: manual_txgs(),
        ..Default::default()
    };
    let (pool, _) = Pool::create("zil", &spec(&text), &map, &opts).unwrap();
    let store = ObjectStore::open(pool.clone()).unwrap();
    gang_knob(&store);
    (devs, pool, store)
}

fn hooks() -> Arc<TestHooks> {
    let h = Arc::new(TestHooks::default());
    h.atime.store(false, std::sync::atomic::Ordering::Relaxed);
    h
}

/// Writes of step `i`: mostly small, every fourth a large one (by pointer in the log).
fn step_write(i: usize) -> (u64, Vec<u8>) {
    if i % 4 == 3 {
        ((i as u64) * 7000, pattern(i as u64 + 100, 300_000))
    } else {
        (
            (i as u64) * 5000 % 200_000,
            pattern(i as u64 + 1, 3000 + i * 17),
        )
    }
}

const STEPS: usize = 10;

/// What the crash tests' workload writes before each fsync.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Load {
    /// `step_write`: small writes logged with their bytes, every fourth a large one.
    Mixed,
    /// 60 KB writes, each logged with its bytes: more than the pool's 4 MiB log region
    /// holds before a txg, so the ring fills and a commit waits for a txg instead.
    FillsTheLog,
}

impl Load {
    fn steps(self) -> usize {
        match self {
            Load::Mixed => STEPS,
            Load::FillsTheLog => 150,
        }
    }

    fn write(self, i: usize) -> (u64, Vec<u8>) {
        match self {
            Load::Mixed => step_write(i),
            Load::FillsTheLog => ((i as u64) * 60_000, pattern(i as u64 + 500, 60_000)),
        }
    }
}

/// Incompressible bytes, different per seed.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The workload: the file's content after each acknowledged fsync (index 0: empty, before
/// the first), and how many were acknowledged.
fn workload(fs: &Fs, load: Load) -> (Vec<Vec<u8>>, usize) {
    let root = Cred::root();
    let mut model = vec![Vec::new()];
    let mut acked = 0;
    let _ = (|| -> Result<(), tank_dataset::Errno> {
        let f = fs
            .mknod(&root, ROOT_INO, os("f"), libc::S_IFREG | 0o644, 0)?
            .ino;
        // The file exists (empty) once this fsync returns.
        model.push(Vec::new());
        fs.fsync(f, false)?;
        acked = 1;
        let mut content = Vec::new();
        for i in 0..load.steps() {
            let (off, data) = load.write(i);
            fs.write(&root, f, off, &data, false)?;
            let end = off as usize + data.len();
            if content.len() < end {
                content.resize(end, 0);
            }
            content[off as usize..end].copy_from_slice(&data);
            model.push(content.clone());
            fs.fsync(f, false)?;
            acked = model.len() - 1;
        }
        Ok(())
    })();
    (model, acked)
}

/// Mounts the filesystem and creates the empty file "f" in its root.
fn mount_with_file(store: &Arc<ObjectStore>) -> (Arc<Fs>, u64) {
    let fs = mount(store, &hooks()).unwrap();
    let f = fs
        .mknod(&Cred::root(), ROOT_INO, os("f"), libc::S_IFREG | 0o644, 0)
        .unwrap()
        .ino;
    (fs, f)
}

/// Writes step `i` into file `f`, updates `content` to match, and fsyncs.
fn write_step(fs: &Fs, f: u64, i: usize, content: &mut Vec<u8>) {
    let (off, data) = step_write(i);
    fs.write(&Cred::root(), f, off, &data, false).unwrap();
    let end = off as usize + data.len();
    if content.len() < end {
        content.resize(end, 0);
    }
    content[off as usize..end].copy_from_slice(&data);
    fs.fsync(f, false)
        .unwrap_or_else(|e| panic!("fsync of step {i}: {e:?}"));
}

/// What the devices kept (only flushed writes), without the device `gone`.
fn images_without(fleet: &SimFleet, gone: &str) -> Vec<(String, Vec<u8>)> {
    fleet
        .crash_images(CrashMode::DropUnflushed)
        .into_iter()
        .filter(|(n, _)| n != gone)
        .collect()
}

struct Outcome {
    model: Vec<Vec<u8>>,
    acked: usize,
    ops: u64,
}

fn run(
    seed: u64,
    slog: bool,
    crash_at: Option<u64>,
    load: Load,
) -> (SimFleet, Outcome, tank_pool::LogStats) {
    let fleet = SimFleet::new(seed);
    let (_devs, pool, store) = log_pool(&fleet, slog);
    let base = fleet.ops();
    if let Some(k) = crash_at {
        fleet.set_crash_at(Some(base + k));
    }
    let (model, acked) = match mount(&store, &hooks()) {
        Ok(fs) => workload(&fs, load),
        Err(_) => (vec![Vec::new()], 0),
    };
    let ops = fleet.ops() - base;
    let stats = pool.zil.stats();
    drop(store);
    // No export: the process dies with the pool imported (txgs commit only when asked).
    // After the cut nothing reaches the devices, so a shutdown there changes no image; it
    // stops the pool's threads, which a dropped pool would keep.
    if crash_at.is_some() {
        let _ = pool.shutdown();
    }
    drop(pool);
    (fleet, Outcome { model, acked, ops }, stats)
}

/// Imports the crashed images, replays, and returns the file's content (None: no file).
fn recover(
    images: Vec<(String, Vec<u8>)>,
    ctx: &str,
) -> (Option<Vec<u8>>, Arc<Pool>, Arc<ObjectStore>, Arc<Fs>) {
    let (pool, store) = import_images(images).unwrap_or_else(|e| panic!("{ctx}: import: {e}"));
    let fs = mount(&store, &hooks()).unwrap_or_else(|e| panic!("{ctx}: mount: {e:?}"));
    fsck(&fs, &store).unwrap_or_else(|e| panic!("{ctx}: fsck: {e}"));
    let root = Cred::root();
    let content = fs.lookup(&root, ROOT_INO, os("f")).ok().map(|a| {
        let mut out = Vec::new();
        loop {
            let piece = fs
                .read(a.ino, out.len() as u64, 1 << 20)
                .unwrap_or_else(|e| panic!("{ctx}: read: {e:?}"));
            if piece.is_empty() {
                break out;
            }
            out.extend(piece);
        }
    });
    (content, pool, store, fs)
}

fn check(seed: u64, slog: bool, k: u64, mode: CrashMode, load: Load) {
    let ctx = format!("seed {seed:#x} slog {slog} {load:?} cut {k} {mode:?}");
    let (fleet, out, _) = run(seed, slog, Some(k), load);
    let (content, pool, store, fs) = recover(fleet.crash_images(mode), &ctx);
    // Phase 0 (before the first fsync) has no file; later phases have it.
    let phase_of = |c: &Option<Vec<u8>>| -> Vec<usize> {
        (0..out.model.len())
            .filter(|&p| match c {
                None => p == 0,
                Some(bytes) => p > 0 && out.model[p] == *bytes,
            })
            .collect()
    };
    let phases = phase_of(&content);
    assert!(
        phases.iter().any(|&p| p == out.acked || p == out.acked + 1),
        "{ctx}: the file matches phases {phases:?}, but fsync {} was acknowledged (len {:?})",
        out.acked,
        content.as_ref().map(Vec::len)
    );
    // Every allocated byte is reached from the pool, and every reached one is allocated.
    store.sync().unwrap_or_else(|e| panic!("{ctx}: sync: {e}"));
    posix_common::dsl::store_usage(&pool, &store).unwrap_or_else(|e| panic!("{ctx}: {e}"));
    // Writable afterwards, and its own fsyncs hold across another import.
    let root = Cred::root();
    let g = fs
        .mknod(&root, ROOT_INO, os("after"), libc::S_IFREG | 0o644, 0)
        .unwrap();
    fs.write(&root, g.ino, 0, b"after the crash", false)
        .unwrap();
    fs.fsync(g.ino, false).unwrap();
    drop(fs);
    drop(store);
    pool.shutdown().unwrap();
}

fn every_cut(seed: u64, slog: bool) {
    let (_, full, stats) = run(seed, slog, None, Load::Mixed);
    assert_eq!(full.acked, STEPS + 1, "the workload runs without a crash");
    // The log did the work: at most the first commit (which makes the pool's region)
    // waited for a txg.
    assert!(
        stats.commits >= STEPS as u64 && stats.fallbacks <= 1,
        "log stats {stats:?}"
    );
    let check = |seed, slog, k, mode| check(seed, slog, k, mode, Load::Mixed);
    if slog {
        assert!(stats.device.starts_with("log"), "{stats:?}");
    } else {
        assert!(stats.device.starts_with("pool"), "{stats:?}");
    }
    for k in 0..=full.ops {
        check(seed, slog, k, CrashMode::DropUnflushed);
        if k % 3 == 0 {
            check(seed, slog, k, CrashMode::TearLast { seed: seed ^ k });
            check(
                seed,
                slog,
                k,
                CrashMode::KeepRandomSubset { seed: seed ^ k },
            );
        }
    }
}

#[test]
fn fsync_survives_a_crash_at_every_write_with_a_log_device() {
    every_cut(seed(0x2170_0001), true);
}

#[test]
fn fsync_survives_a_crash_at_every_write_with_the_log_in_the_pool() {
    every_cut(seed(0x2170_0002), false);
}

/// The log in a raidz2 pool, with every block above 8 KiB a gang block (the large writes
/// the log points at included).
#[test]
fn fsync_survives_a_crash_at_every_write_on_raidz2_with_gang_blocks() {
    on_raidz2_with_gang_blocks(|| every_cut(seed(0x2170_0004), false));
}

/// The log region full: the pool's 4 MiB ring takes 60 KB fsyncs until a commit finds no
/// room and waits for a txg, which frees it; cut at every fifth write and flush (of about
/// 830).
#[test]
fn fsync_survives_a_crash_with_the_log_region_full() {
    let seed = seed(0x2170_0005);
    let (_, full, stats) = run(seed, false, None, Load::FillsTheLog);
    assert_eq!(full.acked, Load::FillsTheLog.steps() + 1, "{stats:?}");
    // The first commit waits for the txg that makes the region; later ones waited because
    // the ring was full.
    assert!(stats.fallbacks >= 2, "the log never filled: {stats:?}");
    for k in (0..=full.ops).step_by(5) {
        check(seed, false, k, CrashMode::DropUnflushed, Load::FillsTheLog);
    }
    eprintln!(
        "checked {} cut points; {} of {} commits found the log full",
        full.ops / 5 + 1,
        stats.fallbacks - 1,
        stats.commits
    );
}

#[test]
fn large_sync_writes_go_to_the_pool_with_a_pointer_in_the_log() {
    let fleet = SimFleet::new(seed(0x2170_0003));
    let (devs, pool, store) = log_pool(&fleet, true);
    let (fs, f) = mount_with_file(&store);
    fs.fsync(f, false).unwrap();
    let slog_before = devs[2].stats().bytes_written;
    let log_before = pool.zil.stats().bytes;
    let data = pattern(9, 8 << 20);
    fs.write(&Cred::root(), f, 0, &data, false).unwrap();
    fs.fsync(f, false).unwrap();
    let log_bytes = pool.zil.stats().bytes - log_before;
    let slog_bytes = devs[2].stats().bytes_written - slog_before;
    assert!(
        log_bytes < 256 << 10 && slog_bytes < 512 << 10,
        "8 MiB of sync writes put {log_bytes} bytes in the log ({slog_bytes} on the log device)"
    );
    drop(fs);
    drop(store);
    drop(pool);
    let (content, pool, _store, _fs) =
        recover(fleet.crash_images(CrashMode::DropUnflushed), "large");
    let got = content.unwrap_or_default();
    let first_diff = got.iter().zip(&data).position(|(a, b)| a != b);
    assert!(
        got == data,
        "the large write survives the crash: {} bytes read, first difference at {first_diff:?}",
        got.len()
    );
    drop(_fs);
    drop(_store);
    pool.shutdown().unwrap();
}

#[test]
fn log_device_pulled_mid_workload_loses_nothing_acknowledged() {
    let fleet = SimFleet::new(seed(0x2170_0004));
    let (devs, pool, store) = log_pool(&fleet, true);
    let (fs, f) = mount_with_file(&store);
    let mut content = Vec::new();
    for i in 0..12 {
        if i == 5 {
            devs[2].set_gone(true);
        }
        write_step(&fs, f, i, &mut content);
    }
    let stats = pool.zil.stats();
    assert!(stats.fallbacks >= 1, "{stats:?}");
    assert!(
        stats.device.starts_with("pool"),
        "the log moved to the pool: {stats:?}"
    );
    drop(fs);
    drop(store);
    drop(pool);
    // Without the dead log device: the committed header points into the pool.
    let images = images_without(&fleet, "s0");
    let (got, pool, _store, _fs) = recover(images, "pulled");
    assert!(
        got.as_deref() == Some(&content[..]),
        "acknowledged writes survive"
    );
    drop(_fs);
    drop(_store);
    pool.shutdown().unwrap();
}

#[test]
fn missing_log_device_at_import_needs_dash_m() {
    let fleet = SimFleet::new(seed(0x2170_0005));
    let (_devs, pool, store) = log_pool(&fleet, true);
    let (fs, f) = mount_with_file(&store);
    let root = Cred::root();
    fs.fsync(f, false).unwrap();
    store.sync().unwrap();
    fs.write(&root, f, 0, b"only in the log", false).unwrap();
    fs.fsync(f, false).unwrap();
    assert!(pool.zil.stats().commits >= 1);
    drop(fs);
    drop(store);
    drop(pool);
    let images = images_without(&fleet, "s0");
    let devs: Vec<DeviceRef> = images
        .iter()
        .map(|(n, b)| {
            Arc::new(tank_device::MemDevice::from_bytes(n.clone(), b.clone())) as DeviceRef
        })
        .collect();
    let opts = |m: bool| ImportOptions {
        missing_log: m,
        tunables: Some(manual_txgs()),
        ..Default::default()
    };
    let err = Pool::import(&devs, &opts(false)).unwrap_err().to_string();
    assert!(
        err.contains("-m") && err.contains("log"),
        "refused with a message naming -m: {err}"
    );
    let pool = Pool::import(&devs, &opts(true)).unwrap();
    assert!(
        pool.import_notes.iter().any(|n| n.contains("discarded")),
        "{:?}",
        pool.import_notes
    );
    let store = ObjectStore::open(pool.clone()).unwrap();
    assert_eq!(store.replay_log().unwrap(), 0);
    let fs = mount(&store, &hooks()).unwrap();
    fsck(&fs, &store).unwrap();
    let a = fs.lookup(&root, ROOT_INO, os("f")).unwrap();
    assert_eq!(a.size, 0, "the committed txg holds the empty file");
    drop(fs);
    drop(store);
    pool.shutdown().unwrap();
}

#[test]
fn log_device_removed_while_it_holds_records() {
    let fleet = SimFleet::new(seed(0x2170_0006));
    let (_devs, pool, store) = log_pool(&fleet, true);
    let (fs, f) = mount_with_file(&store);
    let mut content = Vec::new();
    for i in 0..4 {
        write_step(&fs, f, i, &mut content);
    }
    assert!(pool.zil.stats().device.starts_with("log"));
    assert!(
        pool.zil.stats().live_blocks > 0,
        "records on the log device"
    );
    // zpool remove of the log device: the ring moves off it first (txg commits).
    pool.remove("s0").unwrap();
    assert!(!pool.zil.stats().device.starts_with("log"));
    for i in 4..8 {
        write_step(&fs, f, i, &mut content);
    }
    assert!(pool.zil.stats().device.starts_with("pool"));
    drop(fs);
    drop(store);
    drop(pool);
    let images = images_without(&fleet, "s0");
    let (got, pool, _store, _fs) = recover(images, "removed");
    assert!(
        got.as_deref() == Some(&content[..]),
        "acknowledged writes survive"
    );
    drop(_fs);
    drop(_store);
    pool.shutdown().unwrap();
}

#[test]
fn a_mirrored_log_keeps_working_on_one_side() {
    let fleet = SimFleet::new(seed(0x2170_0007));
    let devs: Vec<SimDevice> = ["d0", "d1", "s0", "s1"]
        .iter()
        .map(|n| fleet.device(n, DEV_SIZE))
        .collect();
    let map: HashMap<String, DeviceRef> = devs
        .iter()
        .map(|d| (d.name().to_string(), Arc::new(d.clone()) as DeviceRef))
        .collect();
    let opts = CreateOptions {
        ashift: 12,
        force: false,
        tunables: manual_txgs(),
        ..Default::default()
    };
    let (pool, _) =
        Pool::create("zil", &spec("mirror d0 d1 log mirror s0 s1"), &map, &opts).unwrap();
    let store = ObjectStore::open(pool.clone()).unwrap();
    let (fs, f) = mount_with_file(&store);
    let mut content = Vec::new();
    for i in 0..8 {
        if i == 3 {
            devs[2].set_gone(true);
        }
        write_step(&fs, f, i, &mut content);
    }
    let stats = pool.zil.stats();
    // One side is enough: the log stays on the log mirror, no commit waits for a txg
    // (but the first, if the ring had no place yet).
    assert!(stats.device.starts_with("log"), "{stats:?}");
    assert!(stats.fallbacks <= 1, "{stats:?}");
    drop(fs);
    drop(store);
    drop(pool);
    let (got, pool, _store, _fs) = recover(images_without(&fleet, "s0"), "mirrored log");
    assert!(
        got.as_deref() == Some(&content[..]),
        "acknowledged writes survive"
    );
    drop(_fs);
    drop(_store);
    pool.shutdown().unwrap();
}

/// A build that does not know the intent log would import a crashed pool and lose what the
/// log holds (writes acknowledged to fsync). While the log may hold records the labels list
/// the `intent_log` feature, so such a build refuses the import naming it; once the pool is
/// closed cleanly the feature is gone and any build imports it.
#[test]
fn a_build_without_the_intent_log_refuses_a_pool_whose_log_holds_records() {
    let fleet = SimFleet::new(seed(0x2170_0016));
    let (_devs, pool, store) = log_pool(&fleet, false);
    let (fs, f) = mount_with_file(&store);
    let root = Cred::root();
    store.sync().unwrap();
    let features = |p: &Pool| p.config().features;
    assert!(
        !features(&pool).iter().any(|f| f == "intent_log"),
        "no log written yet: {:?}",
        features(&pool)
    );
    // The first fsync asks for the log's region in the pool, which its txg allocates.
    fs.write(&root, f, 0, b"committed by a txg", false).unwrap();
    fs.fsync(f, false).unwrap();
    assert_eq!(pool.zil.stats().commits, 0);
    fs.write(&root, f, 0, b"acknowledged by the log only", false)
        .unwrap();
    fs.fsync(f, false).unwrap();
    assert!(pool.zil.stats().commits >= 1);
    assert!(features(&pool).iter().any(|f| f == "intent_log"));
    drop(fs);
    drop(store);
    drop(pool);

    let images = fleet.crash_images(CrashMode::DropUnflushed);
    let devs = |images: &[(String, Vec<u8>)]| -> Vec<DeviceRef> {
        images
            .iter()
            .map(|(n, b)| {
                Arc::new(tank_device::MemDevice::from_bytes(n.clone(), b.clone())) as DeviceRef
            })
            .collect()
    };
    let older: &'static [&'static str] = &["spacemap_log", "cow_btree", "raidz_rs"];
    let as_older = ImportOptions {
        tunables: Some(manual_txgs()),
        supported_features: Some(older),
        ..Default::default()
    };
    let err = Pool::import(&devs(&images), &as_older)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("'intent_log'") && err.contains("replayed"),
        "refused naming the feature: {err}"
    );

    // This build imports it, replays the record and, closed cleanly, leaves no feature.
    let mem = devs(&images);
    let opts = ImportOptions {
        tunables: Some(manual_txgs()),
        ..Default::default()
    };
    let pool = Pool::import(&mem, &opts).unwrap();
    let store = ObjectStore::open(pool.clone()).unwrap();
    assert!(store.replay_log().unwrap() >= 1);
    let read_f = |store: &Arc<ObjectStore>| {
        let fs = mount(store, &hooks()).unwrap();
        fsck(&fs, store).unwrap();
        let a = fs.lookup(&root, ROOT_INO, os("f")).unwrap();
        fs.read(a.ino, 0, 1 << 10).unwrap()
    };
    assert_eq!(read_f(&store), b"acknowledged by the log only");
    drop(store);
    pool.shutdown().unwrap();
    assert!(!features(&pool).iter().any(|f| f == "intent_log"));
    drop(pool);
    let pool = Pool::import(&mem, &as_older)
        .unwrap_or_else(|e| panic!("a cleanly closed pool imports without the feature: {e}"));
    let store = ObjectStore::open(pool.clone()).unwrap();
    assert_eq!(read_f(&store), b"acknowledged by the log only");
    drop(store);
    pool.shutdown().unwrap();
}
