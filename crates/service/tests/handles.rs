//! Datasets shared by many front ends: one open filesystem per dataset, held by several
//! holders at once, each told of renames, rollbacks, property changes and a forced destroy.

use std::ffi::OsStr;
use std::sync::Arc;

use parking_lot::Mutex;
use tank_dataset::posix::{Cred, ROOT_INO};
use tank_service::api::{Request, Response};
use tank_service::handles::{DatasetEvent, Hold, Holder};
use tank_service::{Caller, Mode, Service, ServiceError};

/// A front end double: records what it is told, and lets go of the filesystem when asked.
#[derive(Default)]
struct Recorder {
    events: Mutex<Vec<DatasetEvent>>,
}

impl Holder for Recorder {
    fn notify(&self, event: &DatasetEvent) {
        self.events.lock().push(event.clone());
    }
}

fn admin() -> Caller {
    Caller::Admin {
        name: "root".into(),
    }
}

fn ok(svc: &Service, req: Request) -> Response {
    let op = req.op();
    svc.handle(&admin(), req, None)
        .0
        .unwrap_or_else(|e| panic!("{op}: {e}"))
}

/// A command's service on a data directory in `dir`, with pool `p`: a mirror of two file
/// devices of 256 MiB there.
fn mirror_pool(dir: &std::path::Path) -> Service {
    let svc = Service::new(&dir.join("data"), Mode::Command);
    let mut spec = vec!["mirror".to_string()];
    spec.extend((0..2).map(|i| dir.join(format!("d{i}")).to_string_lossy().into_owned()));
    ok(
        &svc,
        Request::PoolCreate {
            name: "p".into(),
            spec,
            size: Some(256 << 20),
            force: false,
            ashift: None,
        },
    );
    svc
}

fn read_file(hold: &Hold, name: &str) -> Vec<u8> {
    let fs = hold.fs().expect("the filesystem is open");
    let a = fs
        .lookup(&Cred::root(), ROOT_INO, OsStr::new(name))
        .unwrap();
    fs.read(a.ino, 0, 1 << 20).unwrap()
}

#[test]
fn two_holders_share_a_dataset_while_a_third_renames_and_rolls_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let svc = mirror_pool(dir.path());
    ok(
        &svc,
        Request::DatasetCreate {
            name: "p/share".into(),
            kind: tank_dataset::DatasetKind::Filesystem,
            props: vec![],
            parents: false,
        },
    );

    // Two front ends hold the same dataset: one filesystem, one namespace.
    let (nfs, smb) = (Arc::new(Recorder::default()), Arc::new(Recorder::default()));
    let a = svc
        .hold("p/share", "nfs export share", nfs.clone())
        .unwrap();
    let b = svc.hold("p/share", "smb share share", smb.clone()).unwrap();
    assert!(Arc::ptr_eq(&a.fs().unwrap(), &b.fs().unwrap()));
    let fs = a.fs().unwrap();
    let f = fs
        .create(
            &Cred::root(),
            ROOT_INO,
            OsStr::new("doc"),
            0o644,
            libc::O_RDWR,
        )
        .unwrap();
    fs.write(&Cred::root(), f.ino, 0, b"first draft", false)
        .unwrap();
    fs.release(f.ino).unwrap();
    drop(fs);
    // What one front end wrote, the other reads at once.
    assert_eq!(read_file(&b, "doc"), b"first draft");
    ok(
        &svc,
        Request::Snapshot {
            names: vec!["p/share@before".into()],
            recursive: false,
        },
    );
    let fs = b.fs().unwrap();
    let f = fs
        .lookup(&Cred::root(), ROOT_INO, OsStr::new("doc"))
        .unwrap();
    fs.open(&Cred::root(), f.ino, libc::O_RDWR).unwrap();
    fs.write(&Cred::root(), f.ino, 0, b"second", false).unwrap();
    fs.release(f.ino).unwrap();
    drop(fs);
    assert_eq!(read_file(&a, "doc"), b"seconddraft");

    // A third party renames it: both holders are told, and the handle goes by the new name.
    ok(
        &svc,
        Request::DatasetRename {
            from: "p/share".into(),
            to: "p/shared".into(),
        },
    );
    let renamed = DatasetEvent::Renamed {
        from: "p/share".into(),
        to: "p/shared".into(),
    };
    assert_eq!(nfs.events.lock().last(), Some(&renamed));
    assert_eq!(smb.events.lock().last(), Some(&renamed));
    assert_eq!(a.handle().name(), "p/shared");

    // A property change reaches both.
    ok(
        &svc,
        Request::DatasetSet {
            name: "p/shared".into(),
            props: vec![("atime".into(), "off".into())],
        },
    );
    let props = DatasetEvent::PropertiesChanged {
        names: vec!["atime".into()],
    };
    assert_eq!(nfs.events.lock().last(), Some(&props));

    // And rolls it back: both are told before and after, and both then read the rolled
    // back filesystem through their holds.
    ok(
        &svc,
        Request::Rollback {
            snapshot: "p/shared@before".into(),
            destroy_later: false,
        },
    );
    for r in [&nfs, &smb] {
        let ev = r.events.lock();
        let n = ev.len();
        assert!(
            matches!(&ev[n - 2], DatasetEvent::Suspending { why } if why.contains("rollback")),
            "{ev:?}"
        );
        assert_eq!(ev[n - 1], DatasetEvent::Resumed);
    }
    assert_eq!(read_file(&a, "doc"), b"first draft");
    assert_eq!(read_file(&b, "doc"), b"first draft");
    assert!(Arc::ptr_eq(&a.fs().unwrap(), &b.fs().unwrap()));

    // Destroy while held: refused, naming who holds it; nothing changed.
    let e = svc
        .handle(
            &admin(),
            Request::DatasetDestroy {
                name: "p/shared".into(),
                recursive: true,
                dependents: false,
                force: false,
                background: false,
            },
            None,
        )
        .0
        .unwrap_err();
    assert!(matches!(e, ServiceError::Busy(_)), "{e}");
    assert!(e.to_string().contains("nfs export share"), "{e}");
    assert_eq!(e.http_status(), 409);
    assert_eq!(read_file(&a, "doc"), b"first draft");

    // One holder lets go; the other still serves; forced, the destroy tells it and goes on.
    drop(b);
    assert_eq!(read_file(&a, "doc"), b"first draft");
    ok(
        &svc,
        Request::DatasetDestroy {
            name: "p/shared".into(),
            recursive: true,
            dependents: false,
            force: true,
            background: false,
        },
    );
    assert_eq!(nfs.events.lock().last(), Some(&DatasetEvent::Destroying));
    assert!(a.fs().is_none());
    drop(a);
    let Response::Datasets { datasets: left } = ok(
        &svc,
        Request::DatasetList {
            names: vec![],
            recursive: true,
            types: Vec::new(),
        },
    ) else {
        panic!()
    };
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(svc.shutdown(false).is_empty());
}

/// A recursive destroy in the background: a job that counts the bytes of each dataset it
/// destroys (children first), ends `finished`, and leaves nothing behind.
#[test]
fn a_background_destroy_is_a_job_with_progress() {
    let dir = tempfile::tempdir().unwrap();
    let svc = mirror_pool(dir.path());
    for name in ["p/big", "p/big/a", "p/big/b", "p/big/a/x"] {
        ok(
            &svc,
            Request::DatasetCreate {
                name: name.into(),
                kind: tank_dataset::DatasetKind::Filesystem,
                props: vec![],
                parents: false,
            },
        );
    }
    {
        let hold = svc
            .hold("p/big/a/x", "a writer", Arc::new(Recorder::default()))
            .unwrap();
        let fs = hold.fs().unwrap();
        let f = fs
            .create(
                &Cred::root(),
                ROOT_INO,
                OsStr::new("data"),
                0o644,
                libc::O_RDWR,
            )
            .unwrap();
        // Incompressible bytes (a xorshift stream), so the dataset holds what was written.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..8u64 {
            let chunk: Vec<u8> = (0..1 << 20)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            fs.write(&Cred::root(), f.ino, i << 20, &chunk, false)
                .unwrap();
        }
        fs.release(f.ino).unwrap();
        fs.sync_all().unwrap();
    }
    ok(
        &svc,
        Request::Snapshot {
            names: vec!["p/big@s".into()],
            recursive: true,
        },
    );
    // Without recursion it is refused before any job starts.
    let e = svc
        .handle(
            &admin(),
            Request::DatasetDestroy {
                name: "p/big".into(),
                recursive: false,
                dependents: false,
                force: false,
                background: true,
            },
            None,
        )
        .0
        .unwrap_err();
    assert!(e.to_string().contains("has children"), "{e}");
    let Response::JobStarted { job, message } = ok(
        &svc,
        Request::DatasetDestroy {
            name: "p/big".into(),
            recursive: true,
            dependents: false,
            force: false,
            background: true,
        },
    ) else {
        panic!()
    };
    assert!(message.contains(&format!("job {job}")), "{message}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let j = loop {
        let Response::Job(j) = ok(&svc, Request::JobGet { id: job }) else {
            panic!()
        };
        if j.state != "running" {
            break j;
        }
        assert!(std::time::Instant::now() < deadline, "{j:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(j.state, "finished", "{j:?}");
    assert_eq!(j.kind, "destroy");
    assert_eq!(j.target, "p/big");
    assert!(j.total_bytes >= 8 << 20, "{j:?}");
    assert_eq!(j.done_bytes, j.total_bytes, "{j:?}");
    // 4 datasets and their 4 snapshots.
    assert!(
        j.detail.contains("destroyed 8 datasets and snapshots"),
        "{j:?}"
    );
    let Response::Jobs(all) = ok(&svc, Request::JobList) else {
        panic!()
    };
    assert!(all.iter().any(|x| x.id == job && x.kind == "destroy"));
    let Response::Datasets { datasets } = ok(
        &svc,
        Request::DatasetList {
            names: vec![],
            recursive: true,
            types: Vec::new(),
        },
    ) else {
        panic!()
    };
    let names: Vec<&str> = datasets.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["p"]);
    assert!(svc.shutdown(false).is_empty());
}

/// A mount double: the filesystem "served" at a directory (nothing reaches it from the
/// kernel; the benchmark double writes through the filesystem itself).
struct FakeMounter {
    mounted: Mutex<Vec<(std::path::PathBuf, Arc<tank_dataset::posix::Fs>)>>,
}

struct FakeMount;

impl tank_service::mounts::MountedFs for FakeMount {
    fn unmount(&mut self) -> anyhow::Result<()> {
        Ok(())
    }
    fn wait(&mut self) -> anyhow::Result<()> {
        Ok(())
    }
    fn unmounter(&self) -> Box<dyn Fn() + Send> {
        Box::new(|| {})
    }
}

impl tank_service::mounts::Mounter for FakeMounter {
    fn mount(
        &self,
        req: tank_service::mounts::MountRequest,
    ) -> anyhow::Result<Box<dyn tank_service::mounts::MountedFs>> {
        self.mounted.lock().push((req.dir, req.fs));
        Ok(Box::new(FakeMount))
    }
}

/// A benchmark double: writes 1 MiB at a time into the mounted filesystem until it has
/// written its `size` or is canceled, counting the bytes as progress, then removes its
/// file (as the real one removes its work directory).
struct Writer {
    mounter: Arc<FakeMounter>,
}

impl tank_service::jobs::Benchmark for Writer {
    fn run(
        &self,
        dir: &std::path::Path,
        params: &tank_service::api::BenchParams,
        progress: &tank_service::jobs::Progress,
    ) -> Result<(String, serde_json::Value), String> {
        let fs = self
            .mounter
            .mounted
            .lock()
            .iter()
            .find(|(d, _)| d == dir)
            .map(|(_, fs)| fs.clone())
            .ok_or("not mounted here")?;
        let size = params.size.unwrap_or(1 << 30);
        progress.set_total(size);
        let f = fs
            .create(
                &Cred::root(),
                ROOT_INO,
                OsStr::new("bench"),
                0o644,
                libc::O_RDWR,
            )
            .map_err(|e| e.to_string())?;
        let start = std::time::Instant::now();
        let chunk = vec![7u8; 1 << 20];
        let mut done = 0;
        let mut r = Ok(());
        while done < size {
            if progress.canceled() {
                r = Err("canceled".to_string());
                break;
            }
            fs.write(&Cred::root(), f.ino, done, &chunk, false)
                .map_err(|e| e.to_string())?;
            done += chunk.len() as u64;
            progress.advance(done, start.elapsed(), "writing".into());
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        fs.release(f.ino).map_err(|e| e.to_string())?;
        fs.unlink(&Cred::root(), ROOT_INO, OsStr::new("bench"))
            .map_err(|e| e.to_string())?;
        r?;
        Ok((
            format!("wrote {done} bytes"),
            serde_json::json!({ "bytes": done }),
        ))
    }

    fn check_build(&self, build: &str) -> Result<(), String> {
        Err(format!(
            "this runner measures no emulated build such as '{build}'"
        ))
    }

    fn run_emulated(
        &self,
        _: &std::path::Path,
        build: &str,
        _: &tank_service::api::BenchParams,
        _: &tank_service::jobs::Progress,
    ) -> Result<(String, serde_json::Value), String> {
        self.check_build(build).map(|()| Default::default())
    }
}

fn wait_job(svc: &Service, job: u64) -> tank_service::api::Job {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let Response::Job(j) = ok(svc, Request::JobGet { id: job }) else {
            panic!()
        };
        if j.state != "running" && j.state != "canceling" {
            return j;
        }
        assert!(std::time::Instant::now() < deadline, "{j:?}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[test]
fn a_benchmark_is_a_job_that_holds_its_dataset_and_can_be_canceled() {
    let dir = tempfile::tempdir().unwrap();
    let svc = mirror_pool(dir.path());
    let mounter = Arc::new(FakeMounter {
        mounted: Mutex::new(Vec::new()),
    });
    svc.mounts.set_mounter(mounter.clone());
    svc.set_benchmark(Arc::new(Writer {
        mounter: mounter.clone(),
    }));
    let bench = |size: u64| Request::DatasetBench {
        dataset: "p/fs".into(),
        params: tank_service::api::BenchParams {
            size: Some(size),
            ..Default::default()
        },
    };
    ok(
        &svc,
        Request::DatasetCreate {
            name: "p/fs".into(),
            kind: tank_dataset::DatasetKind::Filesystem,
            props: vec![],
            parents: false,
        },
    );
    // Refused with the reason: not mounted, no such dataset, a volume.
    let e = svc.handle(&admin(), bench(1 << 20), None).0.unwrap_err();
    assert!(matches!(e, ServiceError::Invalid(_)), "{e}");
    assert!(e.to_string().contains("not mounted"), "{e}");
    let e = svc
        .handle(
            &admin(),
            Request::DatasetBench {
                dataset: "p/nosuch".into(),
                params: Default::default(),
            },
            None,
        )
        .0
        .unwrap_err();
    assert!(matches!(e, ServiceError::NotFound(_)), "{e}");
    ok(
        &svc,
        Request::DatasetCreate {
            name: "p/vol".into(),
            kind: tank_dataset::DatasetKind::Volume,
            props: vec![("volsize".into(), "8M".into())],
            parents: false,
        },
    );
    let e = svc
        .handle(
            &admin(),
            Request::DatasetBench {
                dataset: "p/vol".into(),
                params: Default::default(),
            },
            None,
        )
        .0
        .unwrap_err();
    assert!(e.to_string().contains("only a mounted filesystem"), "{e}");

    let mnt = dir.path().join("mnt");
    ok(
        &svc,
        Request::Mount {
            dataset: "p/fs".into(),
            dir: Some(mnt.clone()),
        },
    );
    // A short one runs to its end, its result kept with the job.
    let Response::JobStarted { job, .. } = ok(&svc, bench(8 << 20)) else {
        panic!()
    };
    let j = wait_job(&svc, job);
    assert_eq!(
        (j.state.as_str(), j.kind.as_str()),
        ("finished", "benchmark"),
        "{j:?}"
    );
    assert_eq!((j.done_bytes, j.total_bytes), (8 << 20, 8 << 20), "{j:?}");
    // Named by the dataset, and kept in the benchmark history.
    assert_eq!(
        j.result,
        Some(serde_json::json!({ "bytes": 8 << 20, "label": "p/fs" }))
    );
    let Response::BenchHistory { runs } = ok(&svc, Request::BenchHistory { limit: None }) else {
        panic!()
    };
    assert_eq!(runs, vec![j.result.clone().unwrap()]);
    let e = svc
        .handle(&admin(), Request::JobCancel { id: job }, None)
        .0
        .unwrap_err();
    assert!(e.to_string().contains("is not running: finished"), "{e}");

    // A long one: seen running with progress, its dataset held (a destroy is refused and
    // leaves the dataset mounted), then canceled.
    let Response::JobStarted { job, .. } = ok(&svc, bench(1 << 40)) else {
        panic!()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let Response::Job(j) = ok(&svc, Request::JobGet { id: job }) else {
            panic!()
        };
        assert_eq!(j.state, "running", "{j:?}");
        if j.done_bytes >= 4 << 20 {
            assert!(j.rate > 0.0 && j.eta_secs.is_some(), "{j:?}");
            assert_eq!(j.detail, "writing");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{j:?}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let e = svc
        .handle(
            &admin(),
            Request::DatasetDestroy {
                name: "p/fs".into(),
                recursive: false,
                dependents: false,
                force: false,
                background: false,
            },
            None,
        )
        .0
        .unwrap_err();
    assert!(matches!(e, ServiceError::Busy(_)), "{e}");
    assert!(e.to_string().contains("benchmark"), "{e}");
    let Response::Mounts(m) = ok(&svc, Request::MountList) else {
        panic!()
    };
    assert!(m.iter().any(|m| m.dataset == "p/fs"), "{m:?}");
    let Response::Job(j) = ok(&svc, Request::JobCancel { id: job }) else {
        panic!()
    };
    assert!(j.state == "canceling" || j.state == "canceled", "{j:?}");
    let j = wait_job(&svc, job);
    assert_eq!(j.state, "canceled", "{j:?}");
    assert!(j.detail.contains("canceled"), "{j:?}");
    assert!(j.result.is_none());
    // Its hold is gone with it: the destroy goes through now.
    ok(
        &svc,
        Request::DatasetDestroy {
            name: "p/fs".into(),
            recursive: false,
            dependents: false,
            force: false,
            background: false,
        },
    );

    // A shutdown stops a running benchmark before it closes the pool under it.
    ok(
        &svc,
        Request::DatasetCreate {
            name: "p/fs2".into(),
            kind: tank_dataset::DatasetKind::Filesystem,
            props: vec![],
            parents: false,
        },
    );
    ok(
        &svc,
        Request::Mount {
            dataset: "p/fs2".into(),
            dir: Some(dir.path().join("mnt2")),
        },
    );
    let Response::JobStarted { job, .. } = ok(
        &svc,
        Request::DatasetBench {
            dataset: "p/fs2".into(),
            params: tank_service::api::BenchParams {
                size: Some(1 << 40),
                ..Default::default()
            },
        },
    ) else {
        panic!()
    };
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(svc.shutdown(false).is_empty());
    let j = svc
        .jobs
        .list(&svc)
        .into_iter()
        .find(|j| j.id == job)
        .unwrap();
    assert_eq!(j.state, "canceled", "{j:?}");
}
