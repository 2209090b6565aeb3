//! Multihost protection (`mmp.rs`): two hosts that reach the same devices never both import
//! the pool. "Hosts" here are two imports in one process over the same in-memory devices,
//! with different host identities, and no device lock between them (as two machines on a
//! shared disk shelf have none).

use std::collections::HashMap;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use tank_device::{DeviceRef, MemDevice, SimFleet};
use tank_pool::mmp::read_heartbeats;
use tank_pool::{CreateOptions, HostIdentity, ImportOptions, MmpTunables, Pool, PoolSpec};

fn host(name: &str, hostid: u32) -> HostIdentity {
    HostIdentity {
        hostname: name.into(),
        hostid,
        instance: u64::from(hostid) << 8,
    }
}

/// Fast timing for tests: a heartbeat every 40 ms, suspend after 4 silent intervals, an
/// import of a pool active elsewhere watches 8.
fn fast() -> MmpTunables {
    MmpTunables {
        interval: Duration::from_millis(40),
        fail_intervals: 4,
        import_intervals: 8,
    }
}

fn shared_disks(n: usize) -> (Vec<DeviceRef>, HashMap<String, DeviceRef>) {
    let devs: Vec<DeviceRef> = (0..n)
        .map(|i| Arc::new(MemDevice::new(format!("d{i}"), 64 << 20)) as DeviceRef)
        .collect();
    let map = devs
        .iter()
        .enumerate()
        .map(|(i, d)| (format!("d{i}"), d.clone()))
        .collect();
    (devs, map)
}

fn spec(s: &str) -> PoolSpec {
    let toks: Vec<String> = s.split_whitespace().map(String::from).collect();
    PoolSpec::parse(&toks, false).unwrap()
}

fn create_on(map: &HashMap<String, DeviceRef>, who: &HostIdentity) -> Arc<Pool> {
    let (pool, _) = Pool::create(
        "shared",
        &spec("raidz1 d0 d1 d2"),
        map,
        &CreateOptions {
            host: who.clone(),
            mmp: fast(),
            ..Default::default()
        },
    )
    .unwrap();
    pool
}

fn import_as(devs: &[DeviceRef], who: &HostIdentity, force: bool) -> Result<Arc<Pool>, String> {
    Pool::import(
        devs,
        &ImportOptions {
            name: Some("shared".into()),
            force,
            host: who.clone(),
            mmp: fast(),
            ..Default::default()
        },
    )
    .map_err(|e| e.to_string())
}

#[test]
fn a_pool_in_use_is_refused_to_another_host_even_with_force() {
    let (devs, map) = shared_disks(3);
    let a = host("nas-a", 0xa);
    let b = host("nas-b", 0xb);
    let pool = create_on(&map, &a);
    pool.set_multihost(true).unwrap();
    assert!(pool.heartbeat_running());
    std::thread::sleep(Duration::from_millis(200));
    // Every device carries heartbeats of host A.
    for d in &devs {
        let seen: Vec<_> = read_heartbeats(d.as_ref(), 12)
            .into_iter()
            .flatten()
            .flatten()
            .collect();
        assert!(
            seen.iter().any(|h| h.hostname == "nas-a" && h.seq > 0),
            "{}: {seen:?}",
            d.name()
        );
    }
    let err = import_as(&devs, &b, false).unwrap_err();
    assert!(
        err.contains("in use from another system") && err.contains("nas-a"),
        "{err}"
    );
    let started = Instant::now();
    let err = import_as(&devs, &b, true).unwrap_err();
    assert!(
        err.contains("imported on host 'nas-a'") && err.contains("-f does not override"),
        "{err}"
    );
    // It noticed within a few heartbeats, without watching the whole delay.
    assert!(
        started.elapsed() < Duration::from_millis(320),
        "{:?}",
        started.elapsed()
    );
    // Host A goes on writing, unharmed.
    for i in 0..5 {
        pool.log_history(&format!("still mine {i}"));
        pool.wait_synced().unwrap();
    }
    assert_eq!(pool.state(), "ONLINE");
    pool.export().unwrap();
    assert!(!pool.heartbeat_running());
    drop(pool);
    // Exported: host B imports it without -f, after a short watch.
    let started = Instant::now();
    let pool = import_as(&devs, &b, false).unwrap();
    assert!(started.elapsed() >= Duration::from_millis(80));
    assert_eq!(pool.config().hostname, "nas-b");
    assert_eq!(pool.config().hostid, 0xb);
    assert!(pool.heartbeat_running(), "multihost stays on across export");
    let hist = pool.history().unwrap();
    assert_eq!(
        hist.iter()
            .filter(|h| h.command.starts_with("still mine"))
            .count(),
        5
    );
    pool.export().unwrap();
}

#[test]
fn a_silent_owner_is_taken_over_with_force_after_the_full_watch() {
    let (devs, map) = shared_disks(3);
    let a = host("nas-a", 0xa);
    let b = host("nas-b", 0xb);
    let pool = create_on(&map, &a);
    pool.set_multihost(true).unwrap();
    pool.log_history("written by a");
    pool.wait_synced().unwrap();
    // Host A stops without exporting (as a crash or power loss leaves it).
    pool.shutdown().unwrap();
    drop(pool);
    let err = import_as(&devs, &b, false).unwrap_err();
    assert!(err.contains("nas-a") && err.contains("-f"), "{err}");
    let started = Instant::now();
    let pool = import_as(&devs, &b, true).unwrap();
    let watched = started.elapsed();
    // 8 intervals of 40 ms: longer than host A's 4-interval fail-stop delay.
    assert!(watched >= Duration::from_millis(320), "{watched:?}");
    assert!(pool
        .history()
        .unwrap()
        .iter()
        .any(|h| h.command == "written by a"));
    pool.export().unwrap();
}

#[test]
fn a_host_whose_heartbeat_cannot_reach_the_devices_suspends() {
    let fleet = SimFleet::new(7);
    let sims: Vec<_> = (0..3)
        .map(|i| fleet.device(&format!("d{i}"), 64 << 20))
        .collect();
    let map: HashMap<String, DeviceRef> = sims
        .iter()
        .enumerate()
        .map(|(i, d)| (format!("d{i}"), Arc::new(d.clone()) as DeviceRef))
        .collect();
    let pool = create_on(&map, &host("nas-a", 0xa));
    pool.set_multihost(true).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(pool.state(), "ONLINE");
    // The path to the shelf is cut: no write reaches any device.
    for s in &sims {
        s.set_gone(true);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while pool.state() != "SUSPENDED" && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let status = pool.status();
    assert_eq!(status.state, "SUSPENDED");
    let reason = status.suspended.unwrap_or_default();
    assert!(
        reason.contains("multihost") && reason.contains("heartbeat"),
        "{reason}"
    );
    // Nothing more is written: a change fails instead of being acknowledged.
    assert!(pool.begin_tx(4096).is_err());
    assert!(pool
        .events
        .newest(50)
        .iter()
        .any(|e| e.class == "ereport.fs.zfs.mmp_fail"));
    assert!(pool.abandon().unwrap());
}

#[test]
fn two_hosts_racing_to_import_never_both_win() {
    let (devs, map) = shared_disks(3);
    let pool = create_on(&map, &host("nas-a", 0xa));
    pool.set_multihost(true).unwrap();
    pool.export().unwrap();
    drop(pool);
    let mut winners = 0;
    let rounds = 8;
    for round in 0..rounds {
        let gate = Arc::new(Barrier::new(2));
        let racers: Vec<_> = [host("nas-b", 0xb), host("nas-c", 0xc)]
            .into_iter()
            .enumerate()
            .map(|(i, who)| {
                let devs = devs.clone();
                let gate = gate.clone();
                std::thread::spawn(move || {
                    gate.wait();
                    // Staggered by 0 to 35 ms: at once, and one just inside the other's watch.
                    std::thread::sleep(Duration::from_millis((round * 5 * i) as u64));
                    import_as(&devs, &who, false)
                })
            })
            .collect();
        let results: Vec<Result<Arc<Pool>, String>> =
            racers.into_iter().map(|r| r.join().unwrap()).collect();
        let won: Vec<&Arc<Pool>> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert!(
            won.len() <= 1,
            "round {round}: both hosts imported the pool"
        );
        for r in &results {
            if let Err(e) = r {
                assert!(
                    e.contains("being imported by") || e.contains("imported on"),
                    "round {round}: {e}"
                );
            }
        }
        if let Some(p) = won.first() {
            winners += 1;
            p.log_history(&format!("round {round}"));
            p.export().unwrap();
        }
    }
    eprintln!("{winners} of {rounds} races had a winner (the others: both backed off)");
    // Uncontended, the pool imports at once.
    let pool = import_as(&devs, &host("nas-b", 0xb), false).unwrap();
    let rounds_logged = pool
        .history()
        .unwrap()
        .iter()
        .filter(|h| h.command.starts_with("round "))
        .count();
    assert_eq!(rounds_logged, winners);
    pool.export().unwrap();
}

#[test]
fn another_instance_on_the_same_host_needs_force() {
    let (devs, map) = shared_disks(3);
    let here = HostIdentity::this_host();
    let first = HostIdentity {
        instance: 1,
        ..here.clone()
    };
    let second = HostIdentity {
        instance: 2,
        ..here
    };
    let pool = create_on(&map, &first);
    pool.shutdown().unwrap();
    drop(pool);
    let err = import_as(&devs, &second, false).unwrap_err();
    assert!(
        err.contains("another tank instance on this host") && err.contains("-f"),
        "{err}"
    );
    // Its own instance reopens it (a restart), and -f takes it over.
    import_as(&devs, &first, false).unwrap().shutdown().unwrap();
    let pool = import_as(&devs, &second, true).unwrap();
    assert_eq!(pool.config().instance, 2);
    pool.export().unwrap();
}
