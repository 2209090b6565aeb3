//! The engine end to end across layouts and sector sizes: objects written in transactions,
//! read back after export and import (the pool is self-contained), with damaged labels,
//! devices of different sizes, wide RAID-Z, and every checksum and compression setting.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use common::*;
use tank_block::{ChecksumKind, Compression};
use tank_device::{BlockDevice, DeviceRef, MemDevice, SimFleet};
use tank_object::cache::CachePolicy;
use tank_object::{ObjectSet, ObjectStore, WritePolicy, ROOT_OBJSET};
use tank_pool::{CreateOptions, Pool};

const DEV: u64 = 64 << 20;

fn mem_devices(n: usize, size: u64) -> (Vec<Arc<MemDevice>>, HashMap<String, DeviceRef>) {
    let mems: Vec<Arc<MemDevice>> = (0..n)
        .map(|i| Arc::new(MemDevice::new(format!("m{i}"), size)))
        .collect();
    let map = mems
        .iter()
        .enumerate()
        .map(|(i, m)| (format!("m{i}"), m.clone() as DeviceRef))
        .collect();
    (mems, map)
}

fn as_refs(mems: &[Arc<MemDevice>]) -> Vec<DeviceRef> {
    mems.iter().map(|m| m.clone() as DeviceRef).collect()
}

fn create(
    spec_text: &str,
    map: &HashMap<String, DeviceRef>,
    ashift: u32,
) -> (Arc<Pool>, Arc<ObjectStore>) {
    let opts = CreateOptions {
        ashift,
        force: true,
        tunables: manual_txgs(),
        ..Default::default()
    };
    let (pool, _) = Pool::create("e", &spec(spec_text), map, &opts).unwrap();
    let store = ObjectStore::open(pool.clone()).unwrap();
    (pool, store)
}

fn populate(store: &ObjectStore, seed: u64, steps: usize, max_len: usize) -> Model {
    let mut model = Model::new();
    let mut r = rng(seed);
    for i in 0..steps {
        random_step(store, &mut model, &mut r, max_len).unwrap();
        if i % 7 == 6 {
            store.sync().unwrap();
        }
    }
    store.sync().unwrap();
    model
}

#[test]
fn every_ashift_and_layout_round_trips_through_export_and_import() {
    for ashift in [9u32, 12, 16] {
        for layout in [
            "m0",
            "mirror m0 m1 m2",
            "raidz1 m0 m1 m2",
            "raidz2 m0 m1 m2 m3 m4",
            "raidz3 m0 m1 m2 m3 m4 m5",
            "m0 m1 m2",
        ] {
            let (mems, map) = mem_devices(6, DEV);
            let (pool, store) = create(layout, &map, ashift);
            let model = populate(
                &store,
                u64::from(ashift) * 100 + layout.len() as u64,
                30,
                200_000,
            );
            verify(&store, &model).unwrap_or_else(|e| panic!("ashift {ashift} {layout}: {e}"));
            drop(store);
            pool.export().unwrap();
            drop(pool);
            drop(map);
            // Copies of the device images are a complete pool (invariant 1).
            let copies: Vec<DeviceRef> = mems
                .iter()
                .map(|m| {
                    Arc::new(MemDevice::from_bytes(m.name().to_string(), m.snapshot())) as DeviceRef
                })
                .collect();
            let (pool, store) = import_devs(&copies, false).unwrap();
            assert_eq!(pool.ashift(), ashift);
            verify(&store, &model)
                .unwrap_or_else(|e| panic!("ashift {ashift} {layout} after import: {e}"));
        }
    }
}

#[test]
fn wide_raidz3_of_24_devices() {
    let fleet = SimFleet::new(24);
    let (devs, pool, store) = sim_pool(&fleet, "raidz3", 24, DEV);
    let model = populate(&store, 3, 30, 2_000_000);
    drop(store);
    pool.export().unwrap();
    for d in [&devs[1], &devs[9], &devs[20]] {
        d.set_gone(true);
    }
    let present: Vec<DeviceRef> = devs
        .iter()
        .map(|d| Arc::new(d.clone()) as DeviceRef)
        .collect();
    let (pool, store) = import_devs(&present, false).unwrap();
    assert_eq!(pool.state(), "DEGRADED");
    verify(&store, &model).unwrap();
}

#[test]
fn damaged_labels_fall_back_to_the_other_copies() {
    let (mems, map) = mem_devices(3, DEV);
    let (pool, store) = create("raidz1 m0 m1 m2", &map, 12);
    let model = populate(&store, 9, 20, 100_000);
    drop(store);
    pool.export().unwrap();
    let offs = tank_vdev::label_offsets(DEV);
    // m0 loses its front labels (L0, L1): L2 and L3 still identify it.
    for off in &offs[..2] {
        mems[0].write_at(&vec![0xAB; 4096], *off).unwrap();
    }
    // m1 loses all four labels: it is not recognised, the pool imports DEGRADED.
    for off in offs {
        mems[1].write_at(&vec![0x00; 8192], off).unwrap();
    }
    let (pool, store) = import_devs(&as_refs(&mems), false).unwrap();
    assert_eq!(pool.state(), "DEGRADED");
    let leaves = pool.leaf_list();
    assert!(
        leaves[0].1.is_usable(),
        "m0 must be found by its back labels"
    );
    assert!(!leaves[1].1.is_usable());
    verify(&store, &model).unwrap();
}

#[test]
fn devices_of_different_sizes_use_the_smallest() {
    let sizes = [DEV, DEV + (32 << 20), DEV + (64 << 20)];
    let mems: Vec<Arc<MemDevice>> = sizes
        .iter()
        .enumerate()
        .map(|(i, s)| Arc::new(MemDevice::new(format!("m{i}"), *s)))
        .collect();
    let map: HashMap<String, DeviceRef> = mems
        .iter()
        .enumerate()
        .map(|(i, m)| (format!("m{i}"), m.clone() as DeviceRef))
        .collect();
    let (pool, warnings) = Pool::create(
        "w",
        &spec("mirror m0 m1 m2"),
        &map,
        &CreateOptions::default(),
    )
    .unwrap();
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("differ in size") && w.contains("m0")),
        "{warnings:?}"
    );
    let leaf_size = pool.config().leaf_asize;
    assert_eq!(leaf_size, tank_vdev::usable_size(DEV) / 4096 * 4096);
    pool.export().unwrap();
}

#[test]
fn every_checksum_and_compression_setting() {
    let settings = [
        (ChecksumKind::Blake3, Compression::Lz4),
        (ChecksumKind::Xxh128, Compression::Zstd(1)),
        (ChecksumKind::Sha256, Compression::Zstd(19)),
        (ChecksumKind::Blake3, Compression::Off),
    ];
    for (checksum, compression) in settings {
        for copies in [1u8, 2, 3] {
            let (mems, map) = mem_devices(2, DEV);
            let (pool, store) = create("m0 m1", &map, 12);
            store.objset(ROOT_OBJSET).unwrap().set_policy(WritePolicy {
                checksum,
                compression,
                copies,
            });
            let model = populate(&store, 77, 12, 150_000);
            drop(store);
            pool.export().unwrap();
            let (_pool, store) = import_devs(&as_refs(&mems), false).unwrap();
            verify(&store, &model)
                .unwrap_or_else(|e| panic!("{checksum:?} {compression:?} copies {copies}: {e}"));
        }
    }
}

#[test]
fn file_larger_than_the_dirty_limit_streams_through_txgs() {
    // 96 MiB written in 8 MiB transactions with a 32 MiB dirty limit: writers are throttled
    // and txgs commit on their own (no explicit sync until the end).
    let fleet = SimFleet::new(31);
    let devs: Vec<_> = (0..3)
        .map(|i| fleet.device(&format!("d{i}"), 128 << 20))
        .collect();
    let map: HashMap<String, DeviceRef> = devs
        .iter()
        .enumerate()
        .map(|(i, d)| (format!("d{i}"), Arc::new(d.clone()) as DeviceRef))
        .collect();
    let opts = CreateOptions {
        ashift: 12,
        force: false,
        tunables: tank_pool::TxgTunables {
            dirty_max: 32 << 20,
            dirty_sync: 8 << 20,
            timeout: std::time::Duration::from_secs(5),
        },
        ..Default::default()
    };
    let (pool, _) = Pool::create("big", &spec("raidz1 d0 d1 d2"), &map, &opts).unwrap();
    let store = ObjectStore::open(pool.clone()).unwrap();
    let os = store.objset(ROOT_OBJSET).unwrap();
    let id = {
        let tx = store.begin(0).unwrap();
        os.create_object(&tx, 1, 1 << 20).unwrap()
    };
    let chunk = bytes(&mut rng(5), 8 << 20, false);
    let start_txg = pool.synced_txg();
    for i in 0..12u64 {
        let tx = store.begin(chunk.len() as u64).unwrap();
        os.write(&tx, id, i * chunk.len() as u64, &chunk).unwrap();
    }
    store.sync().unwrap();
    assert!(
        pool.synced_txg() > start_txg + 2,
        "the dirty limit forced several txgs"
    );
    assert_eq!(os.stat(id).unwrap().size, 96 << 20);
    for i in 0..12u64 {
        assert_eq!(
            os.read(id, i * chunk.len() as u64, chunk.len()).unwrap(),
            chunk
        );
    }
    // Sparse: a write far past the end leaves a hole that reads as zeros and costs nothing.
    let tx = store.begin(4096).unwrap();
    os.write(&tx, id, 1 << 40, &[1u8; 4096]).unwrap();
    drop(tx);
    store.sync().unwrap();
    assert_eq!(os.read(id, 1 << 39, 8192).unwrap(), vec![0u8; 8192]);
    assert_eq!(os.stat(id).unwrap().size, (1 << 40) + 4096);
}

/// A new object of `data` with records of `recordsize`, committed.
fn synced_object(
    store: &Arc<ObjectStore>,
    os: &Arc<ObjectSet>,
    data: &[u8],
    recordsize: u32,
) -> u64 {
    let id = {
        let tx = store.begin(0).unwrap();
        os.create_object(&tx, 1, recordsize).unwrap()
    };
    {
        let tx = store.begin(data.len() as u64).unwrap();
        os.write(&tx, id, 0, data).unwrap();
    }
    store.sync().unwrap();
    id
}

/// `synced_object`, written past the ARC (a block just written is kept there otherwise),
/// so that reads of it go to the devices and read ahead.
fn synced_past_the_arc(
    store: &Arc<ObjectStore>,
    os: &Arc<ObjectSet>,
    data: &[u8],
    recordsize: u32,
) -> u64 {
    os.set_primarycache(CachePolicy::Metadata);
    let id = synced_object(store, os, data, recordsize);
    os.set_primarycache(CachePolicy::All);
    id
}

#[test]
fn a_stream_read_slightly_out_of_order_is_still_read_ahead() {
    let (_mems, map) = mem_devices(3, DEV);
    let (_pool, store) = create("raidz1 m0 m1 m2", &map, 12);
    let os = store.objset(ROOT_OBJSET).unwrap();
    let mib = 1usize << 20;
    let data = bytes(&mut rng(11), 24 * mib, false);
    let id = synced_past_the_arc(&store, &os, &data, mib as u32);
    // The first read starts no stream; the next starts a little past where it ended (a
    // reader with several requests in flight), and still continues it.
    assert_eq!(os.read(id, 0, 2 * mib).unwrap(), data[..2 * mib]);
    assert_eq!(os.prefetched_blocks(), 0);
    assert_eq!(
        os.read(id, 3 * mib as u64, mib).unwrap(),
        data[3 * mib..4 * mib]
    );
    assert!(os.prefetched_blocks() > 0, "no read-ahead for the stream");
    // The block skipped over comes in late and is served correctly.
    assert_eq!(
        os.read(id, 2 * mib as u64, mib).unwrap(),
        data[2 * mib..3 * mib]
    );
}

/// A stream of small blocks read by a caller with several requests in flight (a volume
/// of 16K blocks read in 1 MiB requests): each read issues only the blocks its window
/// newly covers, the window never drops its own reads in flight, and nearly every block
/// read ahead is used.
#[test]
fn a_stream_of_small_blocks_uses_what_it_reads_ahead() {
    let (_mems, map) = mem_devices(3, DEV);
    let (_pool, store) = create("raidz1 m0 m1 m2", &map, 12);
    let os = store.objset(ROOT_OBJSET).unwrap();
    let mib = 1usize << 20;
    let data = bytes(&mut rng(12), 48 * mib, false);
    let id = synced_past_the_arc(&store, &os, &data, 16 << 10);
    let before = store.cache().arc().stats();
    // Four readers take the stream's 1 MiB pieces in turn, so reads arrive a little out
    // of order and overlap, as a target's queue of commands delivers them.
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if i >= 48 {
                    break;
                }
                let got = os.read(id, (i * mib) as u64, mib).unwrap();
                assert!(got == data[i * mib..(i + 1) * mib], "piece {i}");
            });
        }
    });
    let after = store.cache().arc().stats();
    let issued = after.prefetch_issued - before.prefetch_issued;
    let used = after.prefetch_hits - before.prefetch_hits;
    let blocks = (48 * mib / (16 << 10)) as u64;
    assert!(
        issued > blocks / 2,
        "only {issued} of {blocks} blocks read ahead"
    );
    // What is still in flight past the end, and blocks a demand read took first, are the
    // only ones read ahead and not used.
    assert!(
        issued - used <= issued / 10 + os.prefetched_blocks() as u64,
        "{issued} blocks read ahead, {used} used, {} held",
        os.prefetched_blocks()
    );
}

#[test]
fn prefetch_never_serves_stale_blocks() {
    let (_mems, map) = mem_devices(3, DEV);
    let (_pool, store) = create("raidz1 m0 m1 m2", &map, 12);
    let os = store.objset(ROOT_OBJSET).unwrap();
    let mib = 1usize << 20;
    let mut data = bytes(&mut rng(8), 24 * mib, false);
    let id = synced_object(&store, &os, &data, mib as u32);
    // Two sequential reads start a stream: blocks 4.. are read ahead.
    assert_eq!(os.read(id, 0, 2 * mib).unwrap(), data[..2 * mib]);
    assert_eq!(
        os.read(id, 2 * mib as u64, 2 * mib).unwrap(),
        data[2 * mib..4 * mib]
    );
    // Block 6 is rewritten and committed, block 9 rewritten and still dirty.
    let new6 = bytes(&mut rng(9), mib, false);
    let new9 = bytes(&mut rng(10), mib, false);
    {
        let tx = store.begin(mib as u64).unwrap();
        os.write(&tx, id, 6 * mib as u64, &new6).unwrap();
    }
    store.sync().unwrap();
    {
        let tx = store.begin(mib as u64).unwrap();
        os.write(&tx, id, 9 * mib as u64, &new9).unwrap();
    }
    data[6 * mib..7 * mib].copy_from_slice(&new6);
    data[9 * mib..10 * mib].copy_from_slice(&new9);
    let mut off = 4 * mib;
    while off < data.len() {
        let got = os.read(id, off as u64, 2 * mib).unwrap();
        assert!(got == data[off..off + 2 * mib], "stale data at {off}");
        off += 2 * mib;
    }
}

#[test]
fn data_bytes_count_what_the_blocks_hold_through_writes_holes_truncates_and_import() {
    let (mems, map) = mem_devices(3, DEV);
    let (pool, store) = create("raidz1 m0 m1 m2", &map, 12);
    let os = store.objset(ROOT_OBJSET).unwrap();
    let k = 1u64 << 10;
    let write = |id: u64, off: u64, data: &[u8]| {
        let tx = store.begin(data.len() as u64).unwrap();
        os.write(&tx, id, off, data).unwrap();
    };
    let held = |id: u64| os.stat(id).unwrap().data_bytes.unwrap();
    let id = {
        let tx = store.begin(0).unwrap();
        os.create_object(&tx, 1, 128 * k as u32).unwrap()
    };
    assert_eq!(held(id), 0);
    // 100 bytes at 1 MiB: one block of 512 (rounded up), the megabyte before it a hole.
    write(id, 1 << 20, &[9u8; 100]);
    assert_eq!(held(id), 512);
    // A whole block far away, then a partial block whose tail is zeros.
    write(id, 8 << 20, &vec![3u8; 128 * k as usize]);
    let mut tail = vec![5u8; 1000];
    tail.extend_from_slice(&[0u8; 3000]);
    write(id, 4 << 20, &tail);
    assert_eq!(held(id), 512 + 128 * k + 1024);
    store.sync().unwrap();
    // Written blocks count the same as dirty ones: rewriting one of them changes nothing.
    write(id, 8 << 20, &vec![4u8; 128 * k as usize]);
    assert_eq!(held(id), 512 + 128 * k + 1024);
    // Zeros over a whole block punch it out.
    write(id, 8 << 20, &vec![0u8; 128 * k as usize]);
    assert_eq!(held(id), 512 + 1024);
    // Truncation drops the blocks past the end and trims the last one.
    {
        let tx = store.begin(0).unwrap();
        os.truncate(&tx, id, (4 << 20) + 600).unwrap();
    }
    assert_eq!(held(id), 512 + 1024);
    {
        let tx = store.begin(0).unwrap();
        os.truncate(&tx, id, (4 << 20) + 300).unwrap();
    }
    assert_eq!(held(id), 512 + 512);
    store.sync().unwrap();
    drop(os);
    drop(store);
    pool.export().unwrap();
    drop(pool);
    drop(map);
    let (_pool, store) = import_devs(&as_refs(&mems), false).unwrap();
    let os = store.objset(ROOT_OBJSET).unwrap();
    assert_eq!(os.stat(id).unwrap().data_bytes, Some(1024));
}
