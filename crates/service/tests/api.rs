//! The service's one entry point, as every front end calls it: typed requests on a pool of
//! file devices, each authorized for its caller.

use std::path::Path;

use tank_service::api::{Request, Response};
use tank_service::{Caller, Mode, NewUser, Service, ServiceError};

fn devices(dir: &Path, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| dir.join(format!("d{i}")).to_string_lossy().into_owned())
        .collect()
}

/// Two plain accounts: alice (uid 1500) and bob (1501).
fn add_alice_and_bob(a: &tank_service::accounts::Accounts) {
    for (name, uid) in [("alice", 1500), ("bob", 1501)] {
        a.add_user(NewUser {
            name: name.into(),
            uid: Some(uid),
            ..NewUser::default()
        })
        .unwrap();
    }
}

/// Pool `p` of one 256 MiB file in `dir`.
fn one_device_pool(svc: &Service, dir: &Path) {
    svc.handle(
        &admin(),
        Request::PoolCreate {
            name: "p".into(),
            spec: devices(dir, 1),
            size: Some(256 << 20),
            force: false,
            ashift: None,
        },
        None,
    )
    .0
    .unwrap();
}

fn admin() -> Caller {
    Caller::Admin {
        name: "root".into(),
    }
}

#[test]
fn requests_run_and_every_family_is_authorized() {
    let dir = tempfile::tempdir().unwrap();
    let svc = Service::new(&dir.path().join("data"), Mode::Command);
    let run = |caller: &Caller, req: Request| svc.handle(caller, req, None).0;
    let mut spec = vec!["mirror".to_string()];
    spec.extend(devices(dir.path(), 2));
    let st = match run(
        &admin(),
        Request::PoolCreate {
            name: "p".into(),
            spec,
            size: Some(256 << 20),
            force: false,
            ashift: None,
        },
    )
    .unwrap()
    {
        Response::PoolCreated { status: st } => st,
        r => panic!("{r:?}"),
    };
    assert_eq!(st.state, "ONLINE");
    run(
        &admin(),
        Request::DatasetCreate {
            name: "p/a".into(),
            kind: tank_dataset::DatasetKind::Filesystem,
            props: vec![("quota".into(), "1G".into())],
            parents: false,
        },
    )
    .unwrap();
    run(
        &admin(),
        Request::Snapshot {
            names: vec!["p/a@s".into()],
            recursive: false,
        },
    )
    .unwrap();
    let Response::Datasets { datasets: list } = run(
        &admin(),
        Request::DatasetList {
            names: vec!["p".into()],
            recursive: true,
            types: Vec::new(),
        },
    )
    .unwrap() else {
        panic!()
    };
    let names: Vec<&str> = list.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["p", "p/a", "p/a@s"]);
    assert_eq!(list[1].prop("quota"), Some("1073741824"));

    // A second create of the same pool: its own kind of error, nothing changed.
    let e = run(
        &admin(),
        Request::PoolCreate {
            name: "p".into(),
            spec: devices(dir.path(), 1),
            size: None,
            force: false,
            ashift: None,
        },
    )
    .unwrap_err();
    assert!(matches!(e, ServiceError::Exists(_)), "{e}");
    assert_eq!(e.http_status(), 409);
    let e = run(
        &admin(),
        Request::DatasetDestroy {
            name: "p/nosuch".into(),
            recursive: false,
            dependents: false,
            force: false,
            background: false,
        },
    )
    .unwrap_err();
    assert!(matches!(e, ServiceError::NotFound(_)), "{e}");
    assert_eq!((e.http_status(), e.errno(), e.exit_code()), (404, 2, 1));

    // The roles: a user reads, manages its own account, and nothing else; anonymous
    // callers get nothing.
    let a = svc.accounts().unwrap();
    add_alice_and_bob(a);
    let alice = svc.local_caller(1500).unwrap();
    let bobs_key = a.add_key("bob").unwrap().access_key;
    let reads = [
        Request::Hello,
        Request::PoolList { names: vec![] },
        Request::PoolStatus { name: None },
        Request::PoolHistory { name: None },
        Request::PoolEvents {
            name: None,
            since: 0,
        },
        Request::PoolGet { name: "p".into() },
        Request::DatasetList {
            names: vec![],
            recursive: false,
            types: Vec::new(),
        },
        Request::ShareList,
        Request::JobList,
        Request::CacheStats,
        Request::ParamList,
    ];
    let own = [
        Request::UserPasswd {
            name: "alice".into(),
            password: "a new one".into(),
        },
        Request::KeyAdd {
            user: "alice".into(),
        },
        Request::KeyList {
            user: Some("alice".into()),
        },
        Request::TokenAdd {
            user: "alice".into(),
        },
    ];
    let admin_only = [
        Request::PoolScrub {
            name: "p".into(),
            action: tank_service::api::ScrubAction::Start,
        },
        Request::PoolDestroy { name: "p".into() },
        Request::PoolEventsClear { name: None },
        Request::DatasetCreate {
            name: "p/b".into(),
            kind: tank_dataset::DatasetKind::Filesystem,
            props: vec![],
            parents: false,
        },
        Request::Rollback {
            snapshot: "p/a@s".into(),
            destroy_later: false,
        },
        Request::DatasetDestroy {
            name: "p/a".into(),
            recursive: true,
            dependents: false,
            force: true,
            background: false,
        },
        Request::UserList,
        Request::KeyList { user: None },
        Request::KeyRemove {
            access_key: bobs_key.clone(),
        },
        Request::KeyAdd { user: "bob".into() },
        Request::ShareAdd {
            protocol: "smb".into(),
            name: "s".into(),
            dataset: "p/b".into(),
            options: Default::default(),
        },
        Request::ParamSet {
            name: "l2arc_feed_secs".into(),
            value: "2".into(),
        },
        Request::DebugObjectList {
            pool: "p".into(),
            objset: 0,
        },
        Request::DatasetBench {
            dataset: "p/a".into(),
            params: Default::default(),
        },
        Request::JobCancel { id: 1 },
        Request::UserRemove { name: "bob".into() },
    ];
    for req in reads.iter().chain(own.iter()) {
        let r = run(&alice, req.clone());
        assert!(r.is_ok(), "alice {}: {r:?}", req.op());
    }
    for req in &admin_only {
        let e = run(&alice, req.clone()).unwrap_err();
        assert!(
            matches!(e, ServiceError::Denied(_)),
            "alice {}: {e}",
            req.op()
        );
        assert_eq!(e.exit_code(), 77);
    }
    for req in reads.iter().chain(own.iter()).chain(admin_only.iter()) {
        let e = run(&Caller::Anonymous, req.clone()).unwrap_err();
        assert!(
            matches!(e, ServiceError::Unauthenticated(_)),
            "anonymous {}: {e}",
            req.op()
        );
        assert_eq!(e.http_status(), 401);
    }
    // Nothing the refusals touched changed: the dataset, its snapshot and bob's key are
    // there.
    let Response::Datasets { datasets: after } = run(
        &admin(),
        Request::DatasetList {
            names: vec!["p".into()],
            recursive: true,
            types: Vec::new(),
        },
    )
    .unwrap() else {
        panic!()
    };
    assert_eq!(after.len(), 3);
    assert!(a.key(&bobs_key).unwrap().is_some());
    // The administrator may do all of it.
    for req in admin_only {
        let op = req.op();
        if op == "pool_destroy" || op == "pool_scrub" {
            continue;
        }
        let r = run(&admin(), req);
        // Allowed, and refused for what they name: no runner is installed in this
        // service (nothing is mounted), and there is no job 1.
        if op == "dataset_bench" {
            assert!(
                matches!(r, Err(ServiceError::Invalid(_))),
                "admin {op}: {r:?}"
            );
            continue;
        }
        if op == "job_cancel" {
            assert!(
                matches!(r, Err(ServiceError::NotFound(_))),
                "admin {op}: {r:?}"
            );
            continue;
        }
        assert!(r.is_ok(), "admin {op}: {r:?}");
    }
    assert!(svc.shutdown(false).is_empty());
}

#[test]
fn a_user_lists_only_the_shares_it_may_use() {
    let dir = tempfile::tempdir().unwrap();
    let svc = Service::new(&dir.path().join("data"), Mode::Command);
    let run = |caller: &Caller, req: Request| svc.handle(caller, req, None).0;
    one_device_pool(&svc, dir.path());
    let a = svc.accounts().unwrap();
    add_alice_and_bob(a);
    a.add_group("staff", None).unwrap();
    a.set_member("staff", "bob", true).unwrap();
    type Share<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)]);
    let shares: [Share; 6] = [
        ("smb", "everyone", &[]),
        ("smb", "alices", &[("users", "alice")]),
        ("smb", "staffs", &[("groups", "staff")]),
        ("nfs", "export", &[("clients", "127.0.0.1")]),
        ("s3", "bobs-bucket", &[("users", "bob")]),
        ("s3", "public-bucket", &[("public", "read")]),
    ];
    for (protocol, name, options) in shares {
        let dataset = format!("p/{name}");
        run(
            &admin(),
            Request::DatasetCreate {
                name: dataset.clone(),
                kind: tank_dataset::DatasetKind::Filesystem,
                props: vec![],
                parents: false,
            },
        )
        .unwrap();
        run(
            &admin(),
            Request::ShareAdd {
                protocol: protocol.into(),
                name: name.into(),
                dataset,
                options: options
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            },
        )
        .unwrap();
    }
    let listed = |caller: &Caller| -> Vec<String> {
        match run(caller, Request::ShareList).unwrap() {
            Response::Shares(list) => list.into_iter().map(|s| s.name).collect(),
            r => panic!("{r:?}"),
        }
    };
    assert_eq!(listed(&admin()).len(), 6);
    let alice = svc.local_caller(1500).unwrap();
    let bob = svc.local_caller(1501).unwrap();
    assert_eq!(listed(&alice), ["alices", "everyone", "public-bucket"]);
    assert_eq!(
        listed(&bob),
        ["bobs-bucket", "everyone", "public-bucket", "staffs"]
    );
}

#[test]
fn the_io_history_outlives_the_service() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let svc = Service::new(&data, Mode::Daemon);
    one_device_pool(&svc, dir.path());
    for _ in 0..3 {
        svc.sample_io();
        std::thread::sleep(std::time::Duration::from_millis(1100));
    }
    let before = svc.io_history.history(Some("p"));
    assert_eq!(before.len(), 1);
    assert!(before[0].seconds.len() >= 2, "{before:?}");
    assert!(svc.shutdown(true).is_empty());
    drop(svc);

    // The next service finds the pool in its cache file, opened as a request needs it.
    let again = Service::new(&data, Mode::Daemon);
    again
        .handle(
            &admin(),
            Request::PoolStatus {
                name: Some("p".into()),
            },
            None,
        )
        .0
        .unwrap();
    again.sample_io();
    assert_eq!(again.io_history.history(Some("p")), before);
}
