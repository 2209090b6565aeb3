//! The ARC and the L2ARC on a pool: what the ARC evicts is served from the cache device,
//! verified; a corrupt or missing cache device costs speed, never data; the L2ARC survives
//! export and import; cache devices come and go while the pool runs.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use common::{bytes, manual_txgs, spec};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tank_device::{DeviceRef, MemDevice};
use tank_object::arc::{AdaptiveCache, ARC_MIN};
use tank_object::cache::CachePolicy;
use tank_object::{ObjectStore, ROOT_OBJSET};
use tank_pool::{CreateOptions, ImportOptions, Pool, PoolSpec};

const OBJECTS: u64 = 6;

fn reimport(devs: &[DeviceRef]) -> Arc<Pool> {
    Pool::import(
        devs,
        &ImportOptions {
            name: None,
            rewind: false,
            force: false,
            missing_log: false,
            tunables: Some(manual_txgs()),
            supported_features: None,
            ..Default::default()
        },
    )
    .unwrap()
}
const OBJ_SIZE: usize = 8 << 20;

struct Rig {
    devs: HashMap<String, DeviceRef>,
    pool: Arc<Pool>,
    store: Arc<ObjectStore>,
    arc: Arc<AdaptiveCache>,
    model: Vec<(u64, Vec<u8>)>,
}

fn mem(name: &str, size: u64) -> (String, DeviceRef) {
    (
        name.to_string(),
        Arc::new(MemDevice::new(name, size)) as DeviceRef,
    )
}

/// A raidz1 of 4 x 256 MiB with (or without) a 128 MiB cache device, a 32 MiB ARC of its
/// own, and 48 MiB of incompressible data in 6 objects of 128 KiB blocks.
fn rig(with_cache: bool) -> Rig {
    let mut devs: HashMap<String, DeviceRef> =
        (0..4).map(|i| mem(&format!("d{i}"), 256 << 20)).collect();
    let mut text = "raidz1 d0 d1 d2 d3".to_string();
    if with_cache {
        let (n, d) = mem("c0", 128 << 20);
        devs.insert(n, d);
        text.push_str(" cache c0");
    }
    let opts = CreateOptions {
        ashift: 12,
        force: false,
        tunables: manual_txgs(),
        ..Default::default()
    };
    let (pool, _) = Pool::create("fast", &spec(&text), &devs, &opts).unwrap();
    let arc = Arc::new(AdaptiveCache::new(ARC_MIN));
    let store = ObjectStore::open_with_arc(pool.clone(), arc.clone()).unwrap();
    let os = store.objset(ROOT_OBJSET).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut model = Vec::new();
    for _ in 0..OBJECTS {
        let tx = store.begin(0).unwrap();
        let id = os.create_object(&tx, 1, 128 << 10).unwrap();
        drop(tx);
        let data = bytes(&mut rng, OBJ_SIZE, false);
        for (i, chunk) in data.chunks(1 << 20).enumerate() {
            let tx = store.begin(chunk.len() as u64).unwrap();
            os.write(&tx, id, (i << 20) as u64, chunk).unwrap();
        }
        model.push((id, data));
    }
    store.sync().unwrap();
    Rig {
        devs,
        pool,
        store,
        arc,
        model,
    }
}

/// Reads every object in 128 KiB pieces at scattered offsets (no sequential prefetch) and
/// checks the bytes; after each object, one L2ARC feed round when `feed`.
fn read_all(r: &Rig, feed: bool) {
    let os = r.store.objset(ROOT_OBJSET).unwrap();
    for (id, want) in &r.model {
        let pieces = OBJ_SIZE / (128 << 10);
        for k in 0..pieces {
            // A stride coprime with the count visits every piece out of order.
            let p = (k * 7) % pieces;
            let off = p * (128 << 10);
            let got = os.read(*id, off as u64, 128 << 10).unwrap();
            assert_eq!(
                &got[..],
                &want[off..off + (128 << 10)],
                "object {id} at {off}"
            );
        }
        if feed {
            r.store.cache().l2().feed(&r.arc, r.store.cache().spa());
        }
    }
}

fn set_feed_size() {
    let t = tank_object::l2arc::tunables();
    t.write_max
        .store(16 << 20, std::sync::atomic::Ordering::Relaxed);
}

#[test]
fn arc_hits_promote_and_the_budget_holds_on_a_pool() {
    let r = rig(false);
    let os = r.store.objset(ROOT_OBJSET).unwrap();
    let (id, want) = &r.model[0];
    // Twice the same 1 MiB: the second read is all hits, and the blocks move to the MFU.
    for _ in 0..2 {
        assert_eq!(&os.read(*id, 0, 1 << 20).unwrap()[..], &want[..1 << 20]);
    }
    let s = r.arc.stats();
    assert!(s.demand_data_hits >= 8, "{s:?}");
    assert!(s.mfu_size >= 1 << 20, "{s:?}");
    // 48 MiB through a 32 MiB cache: never over budget, and it evicts.
    read_all(&r, false);
    let s = r.arc.stats();
    assert!(s.size <= ARC_MIN, "ARC over budget: {s:?}");
    assert!(s.evict_count > 0, "{s:?}");
    // primarycache=none: reads of data no longer enter the ARC.
    os.set_primarycache(CachePolicy::None);
    r.arc.set_max(ARC_MIN).unwrap();
    let before = r.arc.stats().data_size;
    let (id, want) = &r.model[5];
    assert_eq!(&os.read(*id, 0, 4 << 20).unwrap()[..], &want[..4 << 20]);
    assert!(r.arc.stats().data_size <= before);
    r.pool.export().unwrap();
}

/// An empty raidz1 of 4 x 256 MiB with a 32 MiB ARC of its own.
fn empty_rig(name: &str) -> (Arc<Pool>, Arc<AdaptiveCache>, Arc<ObjectStore>) {
    let devs: HashMap<String, DeviceRef> =
        (0..4).map(|i| mem(&format!("d{i}"), 256 << 20)).collect();
    let opts = CreateOptions {
        ashift: 12,
        force: false,
        tunables: manual_txgs(),
        ..Default::default()
    };
    let (pool, _) = Pool::create(name, &spec("raidz1 d0 d1 d2 d3"), &devs, &opts).unwrap();
    let arc = Arc::new(AdaptiveCache::new(ARC_MIN));
    let store = ObjectStore::open_with_arc(pool.clone(), arc.clone()).unwrap();
    (pool, arc, store)
}

/// A block just written stays in the ARC as stored, compressed or not: reading it back (a
/// volume's 4 KiB write reads the rest of its 16K block) is a hit, never a device read, and
/// a compressed block is held at its compressed size.
#[test]
fn blocks_just_written_stay_in_the_arc_compressed_or_not() {
    let (pool, arc, store) = empty_rig("kept");
    let os = store.objset(ROOT_OBJSET).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let size = 1usize << 20;
    let mut objects = Vec::new();
    for compressible in [true, false] {
        let tx = store.begin(0).unwrap();
        let id = os.create_object(&tx, 1, 16 << 10).unwrap();
        drop(tx);
        let data = bytes(&mut rng, size, compressible);
        let tx = store.begin(size as u64).unwrap();
        os.write(&tx, id, 0, &data).unwrap();
        drop(tx);
        objects.push((id, data));
    }
    store.sync().unwrap();
    let s = arc.stats();
    assert_eq!(s.demand_data_misses, 0, "{s:?}");
    // Both objects are held: the incompressible one whole, the compressible one in less.
    assert!(s.data_size > size as u64, "{s:?}");
    assert!(
        s.data_size < 2 * size as u64,
        "compressed blocks held whole: {s:?}"
    );
    for (id, want) in &objects {
        for off in (0..size).step_by(16 << 10) {
            let got = os.read(*id, off as u64 + 4096, 4096).unwrap();
            assert_eq!(
                &got[..],
                &want[off + 4096..off + 8192],
                "object {id} at {off}"
            );
        }
    }
    let s = arc.stats();
    assert_eq!(
        s.demand_data_misses, 0,
        "a block just written was read again: {s:?}"
    );
    assert!(s.demand_data_hits >= 2 * 64, "{s:?}");
    pool.export().unwrap();
}

/// A block overwritten leaves the ARC when it is replaced, unless a snapshot holds it: the
/// cache never holds a block's old and new version at once for the live tree.
#[test]
fn an_overwritten_block_leaves_the_arc_unless_a_snapshot_holds_it() {
    let (pool, arc, store) = empty_rig("over");
    let os = store.objset(ROOT_OBJSET).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let (size, block) = (1usize << 20, 16usize << 10);
    let tx = store.begin(0).unwrap();
    let id = os.create_object(&tx, 1, block as u32).unwrap();
    drop(tx);
    let mut want = bytes(&mut rng, size, false);
    let tx = store.begin(size as u64).unwrap();
    os.write(&tx, id, 0, &want).unwrap();
    drop(tx);
    store.sync().unwrap();
    let held = arc.stats().data_size;
    assert!(held >= size as u64, "{held}");
    // 4 KiB into each of the first 16 blocks: their old versions leave the ARC at once.
    let patch = bytes(&mut rng, 4096, false);
    let overwrite = |want: &mut Vec<u8>, first: usize| {
        for b in first..first + 16 {
            let off = b * block + 4096;
            let tx = store.begin(4096).unwrap();
            os.write(&tx, id, off as u64, &patch).unwrap();
            drop(tx);
            want[off..off + 4096].copy_from_slice(&patch);
        }
    };
    overwrite(&mut want, 0);
    let s = arc.stats();
    assert_eq!(s.data_size, held - 16 * block as u64, "{s:?}");
    assert_eq!(&os.read(id, 0, size).unwrap()[..], &want[..]);
    // The sync keeps the new versions.
    store.sync().unwrap();
    assert_eq!(arc.stats().data_size, held);
    // With a snapshot holding every block written so far, an overwrite keeps the old ones.
    os.set_snapshot_txgs(pool.synced_txg(), 0).unwrap();
    overwrite(&mut want, 32);
    assert_eq!(arc.stats().data_size, held);
    assert_eq!(&os.read(id, 0, size).unwrap()[..], &want[..]);
    // No dataset layer here keeps the snapshot's blocks: the sync frees them.
    os.set_snapshot_txgs(0, 0).unwrap();
    store.sync().unwrap();
    pool.export().unwrap();
}

#[test]
fn direct_reads_use_cached_blocks_and_keep_only_those_they_read_in_part() {
    let r = rig(false);
    r.pool.export().unwrap();
    let devs: Vec<DeviceRef> = r.devs.values().cloned().collect();
    let pool = reimport(&devs);
    let arc = Arc::new(AdaptiveCache::new(ARC_MIN));
    let store = ObjectStore::open_with_arc(pool.clone(), arc.clone()).unwrap();
    let os = store.objset(ROOT_OBJSET).unwrap();
    assert_eq!(os.primarycache(), CachePolicy::All);
    let (id, want) = &r.model[0];
    // A whole object read direct, in 1 MiB requests (sequential: prefetch runs too).
    for off in (0..OBJ_SIZE).step_by(1 << 20) {
        let got = os.read_direct(*id, off as u64, 1 << 20).unwrap();
        assert_eq!(&got[..], &want[off..off + (1 << 20)], "at {off}");
    }
    let s = arc.stats();
    assert_eq!(s.data_size, 0, "a direct read kept data: {s:?}");
    assert!(s.demand_data_misses >= 8, "{s:?}");
    // The same range read as usual is kept...
    assert_eq!(&os.read(*id, 0, 1 << 20).unwrap()[..], &want[..1 << 20]);
    let kept = arc.stats().data_size;
    assert!(kept >= 1 << 20, "a plain read kept {kept} bytes");
    // ...and a direct read then uses the cached copies.
    let hits = arc.stats().demand_data_hits;
    assert_eq!(
        &os.read_direct(*id, 0, 1 << 20).unwrap()[..],
        &want[..1 << 20]
    );
    let s = arc.stats();
    assert!(s.demand_data_hits >= hits + 8, "{s:?}");
    assert_eq!(s.data_size, kept);
    // A direct read of part of a block keeps it, so reading the rest costs no pool read.
    let (id, want) = &r.model[1];
    let got = os.read_direct(*id, 4096, 4096).unwrap();
    assert_eq!(&got[..], &want[4096..8192]);
    let s = arc.stats();
    assert_eq!(s.data_size, kept + (128 << 10), "{s:?}");
    let hits = s.demand_data_hits;
    let got = os.read_direct(*id, 8192, 4096).unwrap();
    assert_eq!(&got[..], &want[8192..12288]);
    assert_eq!(arc.stats().demand_data_hits, hits + 1);
    pool.export().unwrap();
}

#[test]
fn l2arc_serves_evicted_blocks_verified_and_survives_import() {
    set_feed_size();
    let r = rig(true);
    read_all(&r, true);
    read_all(&r, true);
    let s = r.store.cache().l2().stats();
    assert_eq!(s.l2_devices, 1);
    assert!(
        s.l2_size >= 16 << 20,
        "little fed to the cache device: {s:?}"
    );
    assert!(s.l2_hdr_size > 0);
    // Reading again: what the 32 MiB ARC lost comes back from the cache device.
    let before = r.store.cache().l2().stats().l2_hits;
    read_all(&r, false);
    let s = r.store.cache().l2().stats();
    assert!(s.l2_hits > before, "no L2ARC hits: {s:?}");
    assert_eq!(s.l2_cksum_bad, 0);

    // Export and import: the headers are rebuilt from the device's log blocks.
    r.pool.export().unwrap();
    let devs: Vec<DeviceRef> = r.devs.values().cloned().collect();
    let pool = reimport(&devs);
    let arc = Arc::new(AdaptiveCache::new(ARC_MIN));
    let store = ObjectStore::open_with_arc(pool.clone(), arc.clone()).unwrap();
    let s = store.cache().l2().stats();
    assert_eq!(s.l2_rebuild_success, 1, "{s:?}");
    assert!(s.l2_rebuild_bufs > 64, "{s:?}");
    let r2 = Rig {
        devs: r.devs.clone(),
        pool,
        store,
        arc,
        model: r.model.clone(),
    };
    read_all(&r2, false);
    let s = r2.store.cache().l2().stats();
    assert!(
        s.l2_hits > 64,
        "a fresh ARC was not filled from the L2ARC: {s:?}"
    );

    // Rot the whole ring of the cache device: every read is still right, the bad copies
    // are counted and dropped, and nothing is healed from them.
    let cache_dev = &r2.devs["c0"];
    let junk = vec![0x5au8; 1 << 20];
    let start = tank_vdev::FRONT_RESERVE + (64 << 10);
    let mut off = start;
    while off + (1 << 20) < cache_dev.size() - (1 << 20) {
        cache_dev.write_at(&junk, off).unwrap();
        off += 1 << 20;
    }
    // Emptied, the ARC sends every read to the (rotted) L2ARC first.
    r2.arc.remove_spa(r2.store.cache().spa());
    read_all(&r2, false);
    let s = r2.store.cache().l2().stats();
    assert!(s.l2_cksum_bad > 0, "rot not detected: {s:?}");
    r2.pool.export().unwrap();

    // Without its cache device the pool imports and reads as before.
    let devs: Vec<DeviceRef> = r
        .devs
        .iter()
        .filter(|(n, _)| n.as_str() != "c0")
        .map(|(_, d)| d.clone())
        .collect();
    let pool = reimport(&devs);
    let arc = Arc::new(AdaptiveCache::new(ARC_MIN));
    let store = ObjectStore::open_with_arc(pool.clone(), arc.clone()).unwrap();
    let r3 = Rig {
        devs: r.devs.clone(),
        pool,
        store,
        arc,
        model: r.model.clone(),
    };
    read_all(&r3, true);
    assert_eq!(r3.store.cache().l2().stats().l2_hits, 0);
    r3.pool.export().unwrap();
}

#[test]
fn cache_and_log_devices_are_added_and_removed_while_running() {
    let r = rig(false);
    let add = |text: &str, devs: &HashMap<String, DeviceRef>| {
        let toks: Vec<String> = text.split_whitespace().map(String::from).collect();
        let spec = PoolSpec::parse_add(&toks, false)?;
        r.pool.add(&spec, devs, false)
    };
    let mut new: HashMap<String, DeviceRef> = HashMap::new();
    for (n, size) in [
        ("c1", 96u64 << 20),
        ("l1", 64 << 20),
        ("l2", 64 << 20),
        ("tiny", 70 << 20),
    ] {
        let (n, d) = mem(n, size);
        new.insert(n, d);
    }
    add("cache c1", &new).unwrap();
    add("log mirror l1 l2", &new).unwrap();
    r.store.cache_devices_changed();
    assert_eq!(r.store.cache().l2().device_guids().len(), 1);
    let st = r.pool.status();
    let text = format!("{st:?}");
    assert!(text.contains("c1") && text.contains("l1"), "{text}");
    // Cache and log devices are used at their own (smaller) size.
    let c = r.pool.config();
    let cache_top = c.vdevs.iter().find(|t| t.children[0].path == "c1").unwrap();
    assert!(cache_top.asize > 0 && cache_top.asize < c.leaf_asize);
    // A data vdev smaller than the pool's devices is refused; so is a replication mismatch.
    let err = add("tiny", &new).unwrap_err().to_string();
    assert!(
        err.contains("too small") || err.contains("mismatched"),
        "{err}"
    );
    // Data devices cannot be removed; a side of a mirrored log only by detach.
    let err = r.pool.remove("d1").unwrap_err().to_string();
    assert!(err.contains("only cache, log and spare"), "{err}");
    let err = r.pool.remove("l1").unwrap_err().to_string();
    assert!(err.contains("mirrored"), "{err}");
    r.pool.remove("c1").unwrap();
    r.store.cache_devices_changed();
    assert!(r.store.cache().l2().device_guids().is_empty());
    assert!(tank_pool::label::best_label(new["c1"].as_ref()).is_none());
    r.pool.export().unwrap();
    // The configuration after the change imports, and the data is intact.
    let mut devs: Vec<DeviceRef> = r.devs.values().cloned().collect();
    devs.push(new["l1"].clone());
    devs.push(new["l2"].clone());
    let pool = reimport(&devs);
    assert_eq!(pool.state(), "ONLINE");
    let store = ObjectStore::open(pool.clone()).unwrap();
    let os = store.objset(ROOT_OBJSET).unwrap();
    for (id, want) in &r.model {
        assert_eq!(&os.read(*id, 0, OBJ_SIZE).unwrap(), want);
    }
    pool.export().unwrap();
}

/// A small write into a larger block is charged to the write throttle as the whole block the
/// first time the txg dirties it (ZFS charges a buffer's size when first dirtied), so the
/// dirty-data limit bounds the memory really held: a volume's 4 KiB writes into its 16 KiB
/// blocks hold 16 KiB each. A write into a block the txg already holds adds only its bytes.
#[test]
fn a_write_into_part_of_a_block_is_charged_the_whole_block_once_per_txg() {
    let (pool, _arc, store) = empty_rig("charged");
    let os = store.objset(ROOT_OBJSET).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    const K: u64 = 1024;
    let tx = store.begin(0).unwrap();
    let id = os.create_object(&tx, 1, 16 << 10).unwrap();
    drop(tx);
    let mut model = bytes(&mut rng, 64 << 10, false);
    let tx = store.begin(model.len() as u64).unwrap();
    os.write(&tx, id, 0, &model).unwrap();
    drop(tx);
    store.sync().unwrap();
    assert_eq!(pool.dirty_bytes(), 0);

    let mut write = |model: &mut Vec<u8>, offset: u64| {
        let data = bytes(&mut rng, 4 << 10, false);
        let tx = store.begin(data.len() as u64).unwrap();
        os.write(&tx, id, offset, &data).unwrap();
        drop(tx);
        model[offset as usize..offset as usize + data.len()].copy_from_slice(&data);
        pool.dirty_bytes()
    };
    // First write into block 0: the whole 16 KiB block.
    assert_eq!(write(&mut model, 0), 16 * K);
    // Again into block 0: what was asked for, no more.
    assert_eq!(write(&mut model, 4 * K), 20 * K);
    assert_eq!(write(&mut model, 12 * K), 24 * K);
    // Into block 2: another whole block.
    assert_eq!(write(&mut model, 40 * K), 40 * K);
    store.sync().unwrap();
    assert_eq!(pool.dirty_bytes(), 0);
    assert_eq!(os.read(id, 0, model.len()).unwrap(), model);
    // After the sync, block 0 is clean again: charged whole once more.
    assert_eq!(write(&mut model, 8 * K), 16 * K);
    store.sync().unwrap();
    assert_eq!(os.read(id, 0, model.len()).unwrap(), model);
}
