//! Pool lifecycle at the pool layer alone: create, history commits, export, scan, import,
//! refusals of bad input, and rewind with `import -F`.

use std::collections::HashMap;
use std::sync::Arc;

use tank_device::{BlockDevice, DeviceRef, MemDevice};
use tank_pool::{CreateOptions, ImportOptions, Pool, PoolSpec};

fn devices(n: usize, size: u64) -> (Vec<Arc<MemDevice>>, HashMap<String, DeviceRef>) {
    let mems: Vec<Arc<MemDevice>> = (0..n)
        .map(|i| Arc::new(MemDevice::new(format!("d{i}"), size)))
        .collect();
    let map = mems
        .iter()
        .enumerate()
        .map(|(i, m)| (format!("d{i}"), m.clone() as DeviceRef))
        .collect();
    (mems, map)
}

fn spec(s: &str) -> PoolSpec {
    let toks: Vec<String> = s.split_whitespace().map(String::from).collect();
    PoolSpec::parse(&toks, false).unwrap()
}

fn reopen(mems: &[Arc<MemDevice>]) -> Vec<DeviceRef> {
    mems.iter()
        .map(|m| Arc::new(MemDevice::from_bytes(m.name().to_string(), m.snapshot())) as DeviceRef)
        .collect()
}

#[test]
fn create_export_import_keeps_history() {
    let (mems, map) = devices(7, 64 << 20);
    let (pool, warnings) = Pool::create(
        "tank",
        &spec("raidz2 d0 d1 d2 d3 d4 d5 d6"),
        &map,
        &CreateOptions::default(),
    )
    .unwrap();
    assert!(warnings.is_empty());
    assert_eq!(pool.state(), "ONLINE");
    for i in 0..20 {
        pool.log_history(&format!("command {i}"));
        pool.wait_synced().unwrap();
    }
    let space = pool.space();
    assert!(
        space.allocated > 0 && space.allocated < space.size / 100,
        "{space:?}"
    );
    pool.export().unwrap();
    drop(pool);

    let devs = reopen(&mems);
    let found = Pool::scan(&devs);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].name, "tank");
    assert_eq!(found[0].state, "EXPORTED");
    let pool = Pool::import(&devs, &ImportOptions::default()).unwrap();
    let hist = pool.history().unwrap();
    assert_eq!(hist.len(), 20);
    assert_eq!(hist[19].command, "command 19");
    // Deferred frees may have been released by the import's first txg; live data is equal.
    let after = pool.space();
    assert_eq!(
        after.allocated - after.deferred,
        space.allocated - space.deferred
    );
    pool.export().unwrap();
}

#[test]
fn refuses_bad_input() {
    let (_mems, map) = devices(3, 64 << 20);
    let err = Pool::create("1bad", &spec("d0"), &map, &CreateOptions::default()).unwrap_err();
    assert!(
        err.to_string().contains("must begin with a letter"),
        "{err}"
    );
    let err = Pool::create(
        "t",
        &spec("d0"),
        &map,
        &CreateOptions {
            ashift: 17,
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("ashift"), "{err}");
    let (pool, _) = Pool::create("t", &spec("d0"), &map, &CreateOptions::default()).unwrap();
    pool.export().unwrap();
    let err = Pool::create("u", &spec("d0 d1"), &map, &CreateOptions::default()).unwrap_err();
    assert!(
        err.to_string().contains("part of exported pool 't'"),
        "{err}"
    );
    // The refused create left d1 untouched: no label.
    assert!(Pool::scan(&[map["d1"].clone()]).is_empty());
    let (small, smap) = devices(1, 1 << 20);
    drop(small);
    let err = Pool::create("s", &spec("d0"), &smap, &CreateOptions::default()).unwrap_err();
    assert!(err.to_string().contains("too small"), "{err}");
}

#[test]
fn degraded_import_and_missing_beyond_parity() {
    let (mems, map) = devices(4, 64 << 20);
    let (pool, _) = Pool::create(
        "p",
        &spec("raidz1 d0 d1 d2 d3"),
        &map,
        &CreateOptions::default(),
    )
    .unwrap();
    pool.log_history("x");
    pool.export().unwrap();
    let devs = reopen(&mems);
    let pool = Pool::import(&devs[1..], &ImportOptions::default()).unwrap();
    assert_eq!(pool.state(), "DEGRADED");
    assert!(pool.import_notes.iter().any(|n| n.contains("d0")));
    assert_eq!(pool.history().unwrap().len(), 1);
    pool.export().unwrap();
    let devs = reopen(&mems);
    let err = Pool::import(&devs[2..], &ImportOptions::default()).unwrap_err();
    assert!(
        err.to_string().contains("too many unavailable devices"),
        "{err}"
    );
}

#[test]
fn damaged_newest_txg_needs_rewind() {
    let (mems, map) = devices(1, 64 << 20);
    let (pool, _) = Pool::create("r", &spec("d0"), &map, &CreateOptions::default()).unwrap();
    for i in 0..5 {
        pool.log_history(&format!("c{i}"));
        pool.wait_synced().unwrap();
    }
    let (root_bp, _) = pool.root();
    let root_bp = root_bp.unwrap();
    pool.shutdown().unwrap();
    drop(pool);
    // Rot every copy of the newest root block.
    let dev = MemDevice::from_bytes("d0", mems[0].snapshot());
    for dva in root_bp.dvas() {
        let off = tank_vdev::FRONT_RESERVE + dva.offset;
        let mut b = vec![0u8; 512];
        dev.read_at(&mut b, off).unwrap();
        b[3] ^= 0xff;
        dev.write_at(&b, off).unwrap();
    }
    let devs: Vec<DeviceRef> = vec![Arc::new(dev)];
    let err = Pool::import(&devs, &ImportOptions::default()).unwrap_err();
    assert!(err.to_string().contains("import -F"), "{err}");
    let pool = Pool::import(
        &devs,
        &ImportOptions {
            rewind: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(
        pool.import_notes.iter().any(|n| n.contains("rewound")),
        "{:?}",
        pool.import_notes
    );
    assert_eq!(pool.history().unwrap().len(), 4);
    pool.log_history("after");
    pool.wait_synced().unwrap();
    pool.export().unwrap();
    let pool = Pool::import(&devs, &ImportOptions::default()).unwrap();
    assert_eq!(pool.history().unwrap().len(), 5);
}

#[test]
fn pool_active_on_another_host_needs_force() {
    let (mems, map) = devices(2, 64 << 20);
    let (pool, _) =
        Pool::create("h", &spec("mirror d0 d1"), &map, &CreateOptions::default()).unwrap();
    let mut cfg = pool.config();
    pool.shutdown().unwrap();
    drop(pool);
    // Another machine imported it last and did not export it.
    cfg.hostname = "some-other-host".into();
    cfg.txg += 10;
    let devs = reopen(&mems);
    for (dev, (top, leaf)) in devs.iter().zip(cfg.leaves().collect::<Vec<_>>()) {
        tank_pool::label::write_labels(dev.as_ref(), &cfg, leaf.guid, top.guid, &[0, 1, 2, 3])
            .unwrap();
    }
    let err = Pool::import(&devs, &ImportOptions::default()).unwrap_err();
    assert!(
        err.to_string().contains("some-other-host") && err.to_string().contains("-f"),
        "{err}"
    );
    let pool = Pool::import(
        &devs,
        &ImportOptions {
            force: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(pool.config().hostname, tank_pool::config::hostname());
    pool.export().unwrap();
}
