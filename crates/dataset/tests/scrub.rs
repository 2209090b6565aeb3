//! The scrub through the dataset layer: blocks only a snapshot still references are
//! scrubbed too, and damage to them is reported under the snapshot's name.

use std::sync::Arc;
use std::time::Duration;

use tank_dataset::posix::{Cred, Fs};
use tank_dataset::{DsHooks, Dsl, Op, SnapshotRoots};
use tank_device::{DeviceRef, MemDevice};
use tank_object::{ObjectStore, ScanPhase};
use tank_pool::{CreateOptions, Pool, PoolSpec, TxgTunables};

const DATA: usize = 8 << 20;

/// Incompressible bytes (xorshift), so the blocks take their full size.
fn noise(len: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A raidz1 pool of four memory devices with its root dataset.
fn raidz1_pool() -> (Vec<DeviceRef>, Arc<ObjectStore>, Arc<Dsl>) {
    let names: Vec<String> = (0..4).map(|i| format!("m{i}")).collect();
    let devs: Vec<DeviceRef> = names
        .iter()
        .map(|n| Arc::new(MemDevice::new(n.clone(), 128 << 20)) as DeviceRef)
        .collect();
    let map = names.iter().cloned().zip(devs.iter().cloned()).collect();
    let mut toks = vec!["raidz1".to_string()];
    toks.extend(names.iter().cloned());
    let opts = CreateOptions {
        ashift: 12,
        force: false,
        tunables: TxgTunables {
            dirty_max: 256 << 20,
            dirty_sync: u64::MAX / 2,
            timeout: Duration::from_secs(3600),
        },
        ..Default::default()
    };
    let (pool, _) =
        Pool::create("tank", &PoolSpec::parse(&toks, true).unwrap(), &map, &opts).unwrap();
    let store = ObjectStore::open(pool).unwrap();
    let dsl = Dsl::open(store.clone()).unwrap();
    (devs, store, dsl)
}

/// The pool of `raidz1_pool` whose root filesystem wrote `DATA` bytes into an object, took
/// snapshot `tank@s1`, then deleted the object: only the snapshot keeps it.
fn snapshot_only_data() -> (Vec<DeviceRef>, Arc<ObjectStore>, Arc<Dsl>) {
    let (devs, store, dsl) = raidz1_pool();
    let os = dsl.objset(dsl.resolve("tank").unwrap()).unwrap();
    let data = noise(DATA);
    let obj = {
        let tx = store.begin(DATA as u64).unwrap();
        let obj = os.create_object(&tx, 100, 128 << 10).unwrap();
        os.write(&tx, obj, 0, &data).unwrap();
        obj
    };
    store.sync().unwrap();
    dsl.run(Op::Snapshot {
        names: vec!["tank@s1".into()],
        recursive: false,
    })
    .unwrap();
    {
        let tx = store.begin(0).unwrap();
        os.free_object(&tx, obj).unwrap();
    }
    store.sync().unwrap();
    store.sync().unwrap();
    (devs, store, dsl)
}

fn scrub(store: &Arc<ObjectStore>) -> tank_object::ScanStatus {
    store.scrub_start().unwrap();
    store.scan_wait();
    store.sync().unwrap();
    let st = store.scan_status();
    assert_eq!(st.state.phase, ScanPhase::Finished, "{st:?}");
    st
}

#[test]
fn blocks_only_a_snapshot_holds_are_scrubbed_and_named_after_it() {
    let (devs, store, dsl) = snapshot_only_data();
    // Without the snapshot roots the scrub sees only the live trees...
    let heads_only = scrub(&store);
    assert!(heads_only.state.issued < DATA as u64 / 2, "{heads_only:?}");
    // ...with them, the snapshot's blocks too.
    store.set_scan_roots(SnapshotRoots::new(&dsl));
    let all = scrub(&store);
    assert!(
        all.state.issued >= heads_only.state.issued + DATA as u64,
        "with snapshots {all:?}, without {heads_only:?}"
    );
    assert_eq!(all.state.errors, 0);
    // Damage beyond raidz1's parity (two devices) in the snapshot's data: reported under
    // the snapshot's name.
    let junk = vec![0xa5u8; 1 << 20];
    for dev in &devs[..2] {
        for mib in 4..12u64 {
            dev.write_at(&junk, mib << 20).unwrap();
        }
    }
    let damaged = scrub(&store);
    assert!(damaged.state.errors > 0, "{damaged:?}");
    let names: Vec<String> = store
        .scan_errors()
        .into_iter()
        .map(|(tree, obj)| tank_dataset::error_name(&dsl, tree, obj))
        .collect();
    assert!(
        names.iter().any(|n| n.starts_with("tank@s1:<0x")),
        "{names:?}"
    );
    // Destroying the snapshot removes the damage; the next scrub clears the list.
    dsl.run(Op::Destroy {
        name: "tank@s1".into(),
        recursive: false,
        dependents: false,
    })
    .unwrap();
    store.sync().unwrap();
    let clean = scrub(&store);
    assert_eq!(clean.state.errors, 0, "{clean:?}");
    assert!(store.scan_errors().is_empty(), "{:?}", store.scan_errors());
}

#[test]
fn damaged_files_are_named_by_their_path() {
    let (devs, store, dsl) = raidz1_pool();
    let id = dsl.resolve("tank").unwrap();
    let hooks = Arc::new(DsHooks {
        dsl: dsl.clone(),
        id,
        snapshot: false,
    });
    let fs = Fs::mount(store.clone(), dsl.objset(id).unwrap(), hooks, (0, 0)).unwrap();
    let root = Cred::root();
    let dir = fs
        .mkdir(&root, tank_dataset::posix::ROOT_INO, "docs".as_ref(), 0o755)
        .unwrap();
    let sub = fs.mkdir(&root, dir.ino, "2026".as_ref(), 0o755).unwrap();
    // O_RDWR, as the kernel passes it.
    let file = fs
        .create(&root, sub.ino, "report.bin".as_ref(), 0o644, 2)
        .unwrap();
    fs.write(&root, file.ino, 0, &noise(DATA), false).unwrap();
    fs.release(file.ino).unwrap();
    fs.sync_all().unwrap();
    store.sync().unwrap();
    // Beyond raidz1's parity: the file's blocks are lost.
    let junk = vec![0x3cu8; 1 << 20];
    for dev in &devs[1..3] {
        for mib in 4..12u64 {
            dev.write_at(&junk, mib << 20).unwrap();
        }
    }
    let st = scrub(&store);
    assert!(st.state.errors > 0, "{st:?}");
    let names: Vec<String> = store
        .scan_errors()
        .into_iter()
        .map(|(tree, obj)| tank_dataset::error_name(&dsl, tree, obj))
        .collect();
    assert!(
        names.iter().any(|n| n == "tank:/docs/2026/report.bin"),
        "{names:?}"
    );
}
