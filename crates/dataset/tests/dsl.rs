//! The dataset directory: names, properties and inheritance, snapshots, clones, rollback,
//! destroy, and exact space accounting, checked against the pool's own allocator.

use std::sync::Arc;
use std::time::Duration;

use tank_dataset::posix::{DatasetHooks, DirectMode};
use tank_dataset::{DatasetKind, DsHooks, Dsl, Op};
use tank_device::{DeviceRef, MemDevice};
use tank_object::ObjectStore;
use tank_pool::{CreateOptions, ImportOptions, Pool, PoolSpec, TxgTunables};

fn tunables() -> TxgTunables {
    TxgTunables {
        dirty_max: 256 << 20,
        dirty_sync: u64::MAX / 2,
        timeout: Duration::from_secs(3600),
    }
}

struct Fixture {
    devs: Vec<DeviceRef>,
    pool: Arc<Pool>,
    store: Arc<ObjectStore>,
    dsl: Arc<Dsl>,
}

fn fixture(layout: &str) -> Fixture {
    let names: Vec<String> = (0..4).map(|i| format!("m{i}")).collect();
    let devs: Vec<DeviceRef> = names
        .iter()
        .map(|n| Arc::new(MemDevice::new(n.clone(), 256 << 20)) as DeviceRef)
        .collect();
    let map = names.iter().cloned().zip(devs.iter().cloned()).collect();
    let mut toks: Vec<String> = layout.split_whitespace().map(String::from).collect();
    toks.extend(names.iter().cloned());
    let spec = PoolSpec::parse(&toks, true).unwrap();
    let opts = CreateOptions {
        ashift: 12,
        force: false,
        tunables: tunables(),
        ..Default::default()
    };
    let (pool, _) = Pool::create("tank", &spec, &map, &opts).unwrap();
    let store = ObjectStore::open(pool.clone()).unwrap();
    let dsl = Dsl::open(store.clone()).unwrap();
    Fixture {
        devs,
        pool,
        store,
        dsl,
    }
}

fn reopen(f: Fixture) -> Fixture {
    f.pool.export().unwrap();
    drop(f.dsl);
    drop(f.store);
    let pool = Pool::import(
        &f.devs,
        &ImportOptions {
            name: None,
            rewind: false,
            force: false,
            missing_log: false,
            tunables: Some(tunables()),
            supported_features: None,
            ..Default::default()
        },
    )
    .unwrap();
    let store = ObjectStore::open(pool.clone()).unwrap();
    let dsl = Dsl::open(store.clone()).unwrap();
    Fixture {
        devs: f.devs,
        pool,
        store,
        dsl,
    }
}

fn create(dsl: &Dsl, name: &str, props: &[(&str, &str)]) {
    dsl.run(Op::Create {
        name: name.into(),
        kind: DatasetKind::Filesystem,
        props: props
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        parents: false,
    })
    .unwrap_or_else(|e| panic!("create {name}: {e}"));
}

fn snapshot(dsl: &Dsl, name: &str) {
    dsl.run(Op::Snapshot {
        names: vec![name.into()],
        recursive: false,
    })
    .unwrap_or_else(|e| panic!("snapshot {name}: {e}"));
}

fn destroy(dsl: &Dsl, name: &str, recursive: bool) -> Result<Vec<u64>, String> {
    dsl.run(Op::Destroy {
        name: name.into(),
        recursive,
        dependents: false,
    })
    .map_err(|e| e.to_string())
}

fn prop(dsl: &Dsl, name: &str, p: &str) -> String {
    let id = dsl.resolve(name).unwrap();
    dsl.info(id).unwrap().prop(p).unwrap().to_string()
}

fn prop_u64(dsl: &Dsl, name: &str, p: &str) -> u64 {
    prop(dsl, name, p)
        .parse()
        .unwrap_or_else(|_| panic!("{name} {p} = {}", prop(dsl, name, p)))
}

/// Bytes of `seed`-derived incompressible data.
fn data(seed: u8, len: usize) -> Vec<u8> {
    let mut x = u64::from(seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Writes `bytes` as object contents (creating object `obj` if needed) and syncs.
fn write(f: &Fixture, ds: &str, obj: Option<u64>, bytes: &[u8]) -> u64 {
    let id = f.dsl.resolve(ds).unwrap();
    let os = f.dsl.objset(id).unwrap();
    let tx = f.store.begin(bytes.len() as u64).unwrap();
    let obj = match obj {
        Some(o) => o,
        None => os.create_object(&tx, 1, 128 << 10).unwrap(),
    };
    os.write(&tx, obj, 0, bytes).unwrap();
    drop(tx);
    f.store.sync().unwrap();
    obj
}

/// Allocated bytes not waiting in the deferred-free queue.
fn live_allocated(pool: &Pool) -> u64 {
    let s = pool.space();
    s.allocated - s.deferred
}

#[test]
fn names_properties_and_inheritance() {
    let f = fixture("");
    let d = &f.dsl;
    create(
        d,
        "tank/home",
        &[("compression", "zstd"), ("recordsize", "1M")],
    );
    create(d, "tank/home/alice", &[]);
    assert_eq!(prop(d, "tank/home/alice", "compression"), "zstd");
    let alice = d.info(d.resolve("tank/home/alice").unwrap()).unwrap();
    let src = alice
        .props
        .iter()
        .find(|(n, _, _)| n == "recordsize")
        .unwrap();
    assert_eq!(src.1, "1048576");
    assert_eq!(src.2, "inherited from tank/home");
    assert_eq!(prop(d, "tank", "compression"), "lz4");

    // Mountpoints extend the inherited path.
    d.run(Op::SetProps {
        name: "tank".into(),
        props: vec![("mountpoint".into(), Some("/srv/tank".into()))],
    })
    .unwrap();
    assert_eq!(
        prop(d, "tank/home/alice", "mountpoint"),
        "/srv/tank/home/alice"
    );

    // Inherit removes the local value.
    d.run(Op::SetProps {
        name: "tank/home".into(),
        props: vec![("compression".into(), None)],
    })
    .unwrap();
    assert_eq!(prop(d, "tank/home/alice", "compression"), "lz4");

    // `direct` is inherited, and a filesystem's hooks follow a `set` at once.
    let hooks = DsHooks {
        dsl: f.dsl.clone(),
        id: alice.id,
        snapshot: false,
    };
    assert_eq!(hooks.direct(), DirectMode::Standard);
    d.run(Op::SetProps {
        name: "tank/home".into(),
        props: vec![("direct".into(), Some("always".into()))],
    })
    .unwrap();
    assert_eq!(prop(d, "tank/home/alice", "direct"), "always");
    assert_eq!(hooks.direct(), DirectMode::Always);
    d.run(Op::SetProps {
        name: "tank/home/alice".into(),
        props: vec![("direct".into(), Some("disabled".into()))],
    })
    .unwrap();
    assert_eq!(hooks.direct(), DirectMode::Disabled);
    let err = d
        .run(Op::SetProps {
            name: "tank/home".into(),
            props: vec![("direct".into(), Some("on".into()))],
        })
        .unwrap_err()
        .to_string();
    assert!(err.contains("always"), "{err}");
    assert_eq!(prop(d, "tank/home", "direct"), "always");

    // Bad input: clear errors, nothing changed.
    let bad = |op: Op| d.run(op).unwrap_err().to_string();
    assert!(bad(Op::Create {
        name: "tank/a b/c!".into(),
        kind: DatasetKind::Filesystem,
        props: vec![],
        parents: false
    })
    .contains("invalid dataset name"));
    assert!(bad(Op::Create {
        name: format!("tank/{}", "x".repeat(300)),
        kind: DatasetKind::Filesystem,
        props: vec![],
        parents: false
    })
    .contains("too long"));
    assert!(bad(Op::Create {
        name: "tank/x/y".into(),
        kind: DatasetKind::Filesystem,
        props: vec![],
        parents: false
    })
    .contains("use -p"));
    assert!(bad(Op::Create {
        name: "tank/home".into(),
        kind: DatasetKind::Filesystem,
        props: vec![],
        parents: false
    })
    .contains("already exists"));
    assert!(bad(Op::SetProps {
        name: "tank/home".into(),
        props: vec![("recordsize".into(), Some("3K".into()))]
    })
    .contains("power of two"));
    assert!(bad(Op::SetProps {
        name: "tank/home".into(),
        props: vec![("used".into(), Some("1".into()))]
    })
    .contains("read-only"));
    assert!(bad(Op::Rename {
        from: "tank/home".into(),
        to: "other/home".into()
    })
    .contains("another pool"));
    assert!(bad(Op::Rename {
        from: "tank/home".into(),
        to: "tank/home/alice/x".into()
    })
    .contains("below itself"));
    assert!(destroy(d, "tank/home", false)
        .unwrap_err()
        .contains("children"));
    assert!(d.resolve("tank/home/alice").is_ok());

    // -p creates the parents; rename moves a subtree; destroy -r removes it.
    d.run(Op::Create {
        name: "tank/a/b/c".into(),
        kind: DatasetKind::Filesystem,
        props: vec![],
        parents: true,
    })
    .unwrap();
    d.run(Op::Rename {
        from: "tank/a".into(),
        to: "tank/home/a".into(),
    })
    .unwrap();
    assert!(d.resolve("tank/home/a/b/c").is_ok());
    destroy(d, "tank/home", true).unwrap();
    assert!(d.resolve("tank/home/a/b/c").is_err());

    // Everything survives export and import.
    create(d, "tank/keep", &[("copies", "2")]);
    let f = reopen(f);
    assert_eq!(prop(&f.dsl, "tank/keep", "copies"), "2");
    assert_eq!(prop(&f.dsl, "tank/keep", "mountpoint"), "/srv/tank/keep");
    assert!(f.dsl.resolve("tank/home").is_err());
}

#[test]
fn snapshots_hold_exactly_what_they_reference() {
    let f = fixture("");
    create(&f.dsl, "tank/fs", &[("compression", "off")]);
    let base = live_allocated(&f.pool);
    let v1 = data(1, 4 << 20);
    let obj = write(&f, "tank/fs", None, &v1);
    let referenced = prop_u64(&f.dsl, "tank/fs", "referenced");
    assert!(referenced >= 4 << 20, "referenced {referenced}");
    assert_eq!(prop_u64(&f.dsl, "tank/fs", "usedbysnapshots"), 0);

    snapshot(&f.dsl, "tank/fs@one");
    assert_eq!(prop_u64(&f.dsl, "tank/fs@one", "referenced"), referenced);
    assert_eq!(prop_u64(&f.dsl, "tank/fs", "written"), 0);

    // Overwrite everything: the snapshot now holds the old data alone.
    let v2 = data(2, 4 << 20);
    write(&f, "tank/fs", Some(obj), &v2);
    let by_snaps = prop_u64(&f.dsl, "tank/fs", "usedbysnapshots");
    assert!(
        ((4 << 20)..(5 << 20)).contains(&by_snaps),
        "usedbysnapshots {by_snaps}"
    );
    assert_eq!(prop_u64(&f.dsl, "tank/fs@one", "used"), by_snaps);
    let used = prop_u64(&f.dsl, "tank/fs", "used");
    assert_eq!(
        used,
        prop_u64(&f.dsl, "tank/fs", "usedbydataset") + by_snaps
    );

    // The snapshot reads the old bytes, the head the new.
    let sid = f.dsl.resolve("tank/fs@one").unwrap();
    let snap_os = f.dsl.snapshot_objset(sid).unwrap();
    assert_eq!(snap_os.read(obj, 0, v1.len()).unwrap(), v1);
    let head_os = f.dsl.objset(f.dsl.resolve("tank/fs").unwrap()).unwrap();
    assert_eq!(head_os.read(obj, 0, v2.len()).unwrap(), v2);
    assert!(snap_os
        .write(&f.store.begin(0).unwrap(), obj, 0, b"x")
        .is_err());

    // A second snapshot, an overwrite, then destroy the middle one: blocks only it
    // held are freed, those the first still needs are kept.
    snapshot(&f.dsl, "tank/fs@two");
    let v3 = data(3, 4 << 20);
    write(&f, "tank/fs", Some(obj), &v3);
    destroy(&f.dsl, "tank/fs@two", false).unwrap();
    assert_eq!(snap_os.read(obj, 0, v1.len()).unwrap(), v1);
    let by_snaps = prop_u64(&f.dsl, "tank/fs", "usedbysnapshots");
    assert!(by_snaps < (5 << 20), "usedbysnapshots {by_snaps}");

    // Survives export and import.
    let f = reopen(f);
    assert_eq!(prop_u64(&f.dsl, "tank/fs", "usedbysnapshots"), by_snaps);
    let sid = f.dsl.resolve("tank/fs@one").unwrap();
    assert_eq!(
        f.dsl
            .snapshot_objset(sid)
            .unwrap()
            .read(obj, 0, v1.len())
            .unwrap(),
        v1
    );

    // Destroying the dataset (with -r) gives every byte back.
    assert!(destroy(&f.dsl, "tank/fs", false)
        .unwrap_err()
        .contains("snapshots"));
    destroy(&f.dsl, "tank/fs", true).unwrap();
    f.store.sync().unwrap();
    let after = live_allocated(&f.pool);
    // The meta object set changes size a little; the data (12 MiB written) is gone.
    assert!(
        after < base + (256 << 10),
        "allocated {after} vs {base} before any data"
    );
}

#[test]
fn rollback_and_clones() {
    let f = fixture("raidz1");
    create(&f.dsl, "tank/fs", &[("compression", "off")]);
    let v1 = data(1, 2 << 20);
    let obj = write(&f, "tank/fs", None, &v1);
    snapshot(&f.dsl, "tank/fs@a");
    let ref_a = prop_u64(&f.dsl, "tank/fs@a", "referenced");
    write(&f, "tank/fs", Some(obj), &data(2, 3 << 20));
    snapshot(&f.dsl, "tank/fs@b");
    write(&f, "tank/fs", Some(obj), &data(3, 3 << 20));

    // Rollback past a later snapshot needs -r.
    let e = f
        .dsl
        .run(Op::Rollback {
            snapshot: "tank/fs@a".into(),
            destroy_later: false,
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("more recent snapshots"), "{e}");
    // A held (mounted) dataset refuses.
    let id = f.dsl.resolve("tank/fs").unwrap();
    f.dsl.hold(id, "mounted at /mnt").unwrap();
    assert!(f
        .dsl
        .run(Op::Rollback {
            snapshot: "tank/fs@b".into(),
            destroy_later: false,
        })
        .unwrap_err()
        .to_string()
        .contains("busy"));
    f.dsl.release(id);
    f.dsl
        .run(Op::Rollback {
            snapshot: "tank/fs@a".into(),
            destroy_later: true,
        })
        .unwrap();
    assert!(f.dsl.resolve("tank/fs@b").is_err());
    let os = f.dsl.objset(id).unwrap();
    assert_eq!(os.read(obj, 0, 4 << 20).unwrap(), v1);
    assert_eq!(prop_u64(&f.dsl, "tank/fs", "referenced"), ref_a);
    assert_eq!(prop_u64(&f.dsl, "tank/fs", "usedbysnapshots"), 0);

    // A clone shares the snapshot's blocks, diverges on write, and pins its origin.
    let before_clone = live_allocated(&f.pool);
    f.dsl
        .run(Op::Clone {
            snapshot: "tank/fs@a".into(),
            target: "tank/copy".into(),
            props: vec![],
        })
        .unwrap();
    assert_eq!(prop(&f.dsl, "tank/copy", "origin"), "tank/fs@a");
    assert_eq!(prop_u64(&f.dsl, "tank/copy", "usedbydataset"), 0);
    assert_eq!(prop_u64(&f.dsl, "tank/copy", "referenced"), ref_a);
    let cid = f.dsl.resolve("tank/copy").unwrap();
    let cos = f.dsl.objset(cid).unwrap();
    assert_eq!(cos.read(obj, 0, 4 << 20).unwrap(), v1);
    let v9 = data(9, 1 << 20);
    write(&f, "tank/copy", Some(obj), &v9);
    let mut expect = v1.clone();
    expect[..v9.len()].copy_from_slice(&v9);
    assert_eq!(cos.read(obj, 0, 4 << 20).unwrap(), expect);
    assert_eq!(os.read(obj, 0, 4 << 20).unwrap(), v1);
    assert!(prop_u64(&f.dsl, "tank/copy", "usedbydataset") >= 1 << 20);

    let e = destroy(&f.dsl, "tank/fs@a", false).unwrap_err();
    assert!(e.contains("clones"), "{e}");
    let e = destroy(&f.dsl, "tank/fs", true).unwrap_err();
    assert!(e.contains("-R"), "{e}");
    destroy(&f.dsl, "tank/copy", false).unwrap();
    f.store.sync().unwrap();
    let after = live_allocated(&f.pool);
    assert!(
        after < before_clone + (256 << 10),
        "clone's blocks freed: {after} vs {before_clone}"
    );
    assert_eq!(os.read(obj, 0, 4 << 20).unwrap(), v1);
    destroy(&f.dsl, "tank/fs@a", false).unwrap();
    assert_eq!(os.read(obj, 0, 4 << 20).unwrap(), v1);
}

#[test]
fn quotas_and_reservations() {
    let f = fixture("");
    create(&f.dsl, "tank/q", &[("quota", "8M"), ("compression", "off")]);
    create(&f.dsl, "tank/q/child", &[]);
    let child = f.dsl.resolve("tank/q/child").unwrap();
    assert!(f.dsl.check_space(child, 1 << 20).is_ok());
    assert_eq!(f.dsl.check_space(child, 9 << 20), Err(libc::EDQUOT));
    write(&f, "tank/q/child", None, &data(4, 6 << 20));
    assert_eq!(f.dsl.check_space(child, 3 << 20), Err(libc::EDQUOT));
    assert!(prop_u64(&f.dsl, "tank/q", "available") <= 2 << 20);
    assert!(prop_u64(&f.dsl, "tank/q", "usedbychildren") >= 6 << 20);
    // A quota below what is used is refused.
    let e = f
        .dsl
        .run(Op::SetProps {
            name: "tank/q".into(),
            props: vec![("quota".into(), Some("1M".into()))],
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("less than"), "{e}");

    // A reservation is taken from everyone else's available space.
    let avail_before = prop_u64(&f.dsl, "tank", "available");
    create(&f.dsl, "tank/r", &[("reservation", "64M")]);
    let avail_after = prop_u64(&f.dsl, "tank/q", "available");
    assert!(avail_after <= 2 << 20);
    let root_after = prop_u64(&f.dsl, "tank", "available");
    assert!(
        avail_before - root_after >= 60 << 20,
        "root available {avail_before} -> {root_after}"
    );
    let e = f
        .dsl
        .run(Op::SetProps {
            name: "tank/r".into(),
            props: vec![("reservation".into(), Some("100G".into()))],
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("not enough"), "{e}");
}
