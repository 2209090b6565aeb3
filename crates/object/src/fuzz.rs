//! Entry points for the fuzz targets (`fuzz/`, see docs/FUZZING.md): the object layer's
//! decoders fed arbitrary bytes. Each may refuse anything; none may panic, loop or allocate
//! beyond its input.

/// A node of an object set's tree (its checksum is in the parent pointer, which the
/// fuzzer does not need to pass).
pub fn tree_node(data: &[u8]) {
    crate::tree::fuzz_node(data);
}

/// An object's header item.
pub fn object_header(data: &[u8]) {
    let _ = crate::objset::ObjectInfo::decode(7, data);
}

/// An intent log record of an object set (create, write, truncate, free, set).
pub fn log_record(data: &[u8]) {
    crate::zil::fuzz_record(data);
}

/// An L2ARC log block, its magic and checksum made to match (the checksum is in the pointer
/// that leads to it), with the entries it lists.
pub fn l2arc_log_block(data: &[u8]) {
    crate::l2arc::fuzz_log_block(data);
}

/// A whole small pool, damaged: a raidz1 of three 64 MiB memory devices holding a few
/// objects is made once; each input is read as changes of four bytes (device, region,
/// place, bits) applied to a copy of the images, where the labels, uberblocks and the first
/// blocks are; the copy is then imported, every object read, and a scrub run. Import may
/// refuse, reads may fail; nothing may panic or hang.
pub fn pool_image(data: &[u8]) {
    use std::collections::HashMap;
    use std::sync::{Arc, OnceLock};
    use tank_device::{DeviceRef, MemDevice};
    use tank_pool::{CreateOptions, ImportOptions, Pool, PoolSpec};

    const DEV: u64 = 64 << 20;
    /// Where the data area starts (FORMAT.md §1), and with it a new pool's blocks.
    const DATA_START: usize = 4 << 20;
    static IMAGES: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    let images = IMAGES.get_or_init(|| {
        let devs: Vec<Arc<MemDevice>> = (0..3)
            .map(|i| Arc::new(MemDevice::new(format!("f{i}"), DEV)))
            .collect();
        let map: HashMap<String, DeviceRef> = devs
            .iter()
            .enumerate()
            .map(|(i, d)| (format!("f{i}"), d.clone() as DeviceRef))
            .collect();
        let names: Vec<String> = ["raidz1", "f0", "f1", "f2"].map(String::from).to_vec();
        let spec = PoolSpec::parse(&names, true).expect("spec");
        let opts = CreateOptions {
            ashift: 12,
            force: false,
            tunables: Default::default(),
            ..Default::default()
        };
        let (pool, _) = Pool::create("fuzz", &spec, &map, &opts).expect("create");
        let store = crate::ObjectStore::open(pool.clone()).expect("open");
        let os = store.objset(crate::ROOT_OBJSET).expect("root");
        for i in 0..8u64 {
            let tx = store.begin(0).expect("tx");
            let id = os.create_object(&tx, 1, 16384).expect("create object");
            let len = 3000 + i as usize * 9000;
            let bytes: Vec<u8> = (0..len).map(|j| (j as u64 * 31 + i) as u8).collect();
            os.write(&tx, id, 0, &bytes).expect("write");
        }
        store.sync().expect("sync");
        drop(os);
        drop(store);
        pool.export().expect("export");
        devs.iter().map(|d| d.snapshot()).collect()
    });
    let mut copies = images.clone();
    // Four bytes a change: the device, the region (the first two labels with their
    // uberblock rings, or the first 2 MiB of the data area) and the place in it, the bits.
    for m in data.chunks_exact(4) {
        let dev = usize::from(m[0]) % copies.len();
        let idx = usize::from(u16::from_le_bytes([m[1] & 0x7f, m[2]]));
        let at = if m[1] & 0x80 == 0 {
            idx * 16
        } else {
            DATA_START + idx * 64
        };
        copies[dev][at] ^= m[3] | 1;
    }
    let devs: Vec<DeviceRef> = copies
        .into_iter()
        .enumerate()
        .map(|(i, b)| Arc::new(MemDevice::from_bytes(format!("f{i}"), b)) as DeviceRef)
        .collect();
    let opts = ImportOptions {
        name: None,
        rewind: false,
        force: false,
        missing_log: false,
        tunables: None,
        supported_features: None,
        ..Default::default()
    };
    let Ok(pool) = Pool::import(&devs, &opts) else {
        return;
    };
    if let Ok(store) = crate::ObjectStore::open(pool.clone()) {
        for id in store.objset_ids() {
            let Ok(os) = store.objset(id) else { continue };
            for obj in os.list_objects(0, 64).unwrap_or_default() {
                let _ = os.read(obj, 0, 1 << 20);
            }
        }
        if store.scrub_start().is_ok() {
            store.scan_wait();
        }
    }
    let _ = pool.shutdown();
}
