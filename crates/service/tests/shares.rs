//! Shares kept with their datasets: added, changed and removed through the registry, every
//! committed change told to the watchers (the protocol servers' seam, here a recording
//! double), kept across export and import, carried by a rename, refused on snapshots and
//! for names that exist.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tank_dataset::{DatasetKind, Dsl, Op};
use tank_device::{DeviceRef, MemDevice};
use tank_object::ObjectStore;
use tank_pool::{CreateOptions, ImportOptions, Pool, PoolSpec, TxgTunables};
use tank_service::shares::{Registry, ShareChange, ShareWatcher};
use tank_service::ServiceError;

fn tunables() -> TxgTunables {
    TxgTunables {
        dirty_max: 256 << 20,
        dirty_sync: u64::MAX / 2,
        timeout: Duration::from_secs(3600),
    }
}

fn open(devs: &[DeviceRef]) -> (Arc<Pool>, Arc<Dsl>) {
    let pool = Pool::import(
        devs,
        &ImportOptions {
            tunables: Some(tunables()),
            ..Default::default()
        },
    )
    .unwrap();
    let store = ObjectStore::open(pool.clone()).unwrap();
    (pool, Dsl::open(store).unwrap())
}

#[derive(Default)]
struct Recorder(Mutex<Vec<ShareChange>>);

impl ShareWatcher for Recorder {
    fn share_changed(&self, change: &ShareChange) {
        self.0.lock().push(change.clone());
    }
}

fn opts(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn shares_live_with_their_datasets() {
    let names: Vec<String> = (0..2).map(|i| format!("m{i}")).collect();
    let devs: Vec<DeviceRef> = names
        .iter()
        .map(|n| Arc::new(MemDevice::new(n.clone(), 128 << 20)) as DeviceRef)
        .collect();
    let map = names.iter().cloned().zip(devs.iter().cloned()).collect();
    let toks: Vec<String> = ["mirror", "m0", "m1"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let opts_create = CreateOptions {
        ashift: 12,
        force: false,
        tunables: tunables(),
        ..Default::default()
    };
    let (pool, _) = Pool::create(
        "tank",
        &PoolSpec::parse(&toks, true).unwrap(),
        &map,
        &opts_create,
    )
    .unwrap();
    let store = ObjectStore::open(pool.clone()).unwrap();
    let dsl = Dsl::open(store).unwrap();
    for (name, kind) in [
        ("tank/media", DatasetKind::Filesystem),
        ("tank/vm1", DatasetKind::Volume),
    ] {
        let props = if kind == DatasetKind::Volume {
            vec![("volsize".to_string(), "16M".to_string())]
        } else {
            vec![]
        };
        dsl.run(Op::Create {
            name: name.into(),
            kind,
            props,
            parents: false,
        })
        .unwrap();
    }
    dsl.run(Op::Snapshot {
        names: vec!["tank/media@s".into()],
        recursive: false,
    })
    .unwrap();

    let registry = Registry::new();
    let recorder = Arc::new(Recorder::default());
    registry.watch(recorder.clone());
    let pools = vec![dsl.clone()];
    let smb = registry
        .add(
            &pools,
            "smb",
            "media",
            "tank/media",
            &opts(&[("timemachine", "on")]),
            None,
        )
        .unwrap();
    assert_eq!(smb.options["timemachine"], "on");
    registry
        .add(
            &pools,
            "nfs",
            "media-nfs",
            "tank/media",
            &opts(&[("hosts", "127.0.0.1")]),
            None,
        )
        .unwrap();
    registry
        .add(&pools, "iscsi", "vm1", "tank/vm1", &BTreeMap::new(), None)
        .unwrap();
    // Refusals change nothing.
    let refused = [
        registry.add(&pools, "nfs", "media", "tank/media", &BTreeMap::new(), None),
        registry.add(
            &pools,
            "smb",
            "snap",
            "tank/media@s",
            &BTreeMap::new(),
            None,
        ),
        registry.add(&pools, "smb", "x", "tank/nosuch", &BTreeMap::new(), None),
        registry.add(&pools, "smb", "x", "other/fs", &BTreeMap::new(), None),
        registry.add(&pools, "iscsi", "y", "tank/media", &BTreeMap::new(), None),
    ];
    assert!(
        matches!(refused[0], Err(ServiceError::Exists(_))),
        "{:?}",
        refused[0]
    );
    assert!(refused[1]
        .as_ref()
        .unwrap_err()
        .to_string()
        .contains("snapshots"));
    assert!(matches!(refused[2], Err(ServiceError::NotFound(_))));
    assert!(matches!(refused[3], Err(ServiceError::NotFound(_))));
    assert!(refused[4]
        .as_ref()
        .unwrap_err()
        .to_string()
        .contains("serves volumes"));
    assert_eq!(registry.list(&pools).len(), 3);

    let changed = registry
        .set(
            &pools,
            "media-nfs",
            &[("readonly".into(), "on".into())],
            None,
        )
        .unwrap();
    assert_eq!(changed.options["readonly"], "on");
    assert!(registry
        .set(
            &pools,
            "media-nfs",
            &[("squash".into(), "bogus".into())],
            None
        )
        .is_err());
    assert_eq!(
        registry
            .list(&pools)
            .iter()
            .find(|s| s.name == "media-nfs")
            .unwrap()
            .options["squash"],
        "root_squash"
    );
    registry.remove(&pools, "vm1").unwrap();
    assert!(matches!(
        registry.remove(&pools, "vm1"),
        Err(ServiceError::NotFound(_))
    ));
    let events = recorder.0.lock().clone();
    assert_eq!(events.len(), 5, "{events:?}");
    assert!(matches!(&events[3], ShareChange::Changed { before, after }
        if before.options["readonly"] == "off" && after.options["readonly"] == "on"));
    assert!(matches!(&events[4], ShareChange::Removed(s) if s.name == "vm1"));

    // A rename carries the shares; export and import keep them.
    dsl.run(Op::Rename {
        from: "tank/media".into(),
        to: "tank/library".into(),
    })
    .unwrap();
    let before = registry.list(&pools);
    assert!(
        before.iter().all(|s| s.dataset == "tank/library"),
        "{before:?}"
    );
    pool.export().unwrap();
    drop(dsl);
    drop(pools);
    drop(pool);
    let (_pool, dsl) = open(&devs);
    assert_eq!(registry.list(&[dsl]), before);
}
