//! The `tank` command as a user runs it: every command in a temporary data directory with
//! file devices, checking output, exit codes and the clear refusals of bad input.

mod common;

use std::process::{Command, Output};

use common::Env;

fn devs(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

#[test]
fn pool_lifecycle_and_objects() {
    let env = Env::new();
    let d = devs("disks/d", 7);
    let mut args = vec!["pool", "create", "--size", "128M", "tank", "raidz2"];
    args.extend(d.iter().map(String::as_str));
    args.extend(["log", "disks/s1", "cache", "disks/s2"]);
    let out = env.ok(&args);
    assert!(out.contains("created pool 'tank'"), "{out}");

    let out = env.ok(&["pool", "status", "tank"]);
    for want in ["raidz2-0", "ONLINE", "logs", "cache", "CKSUM", "d6"] {
        assert!(out.contains(want), "status lacks {want}: {out}");
    }
    let out = env.ok(&["pool", "list", "-H", "-o", "name,health"]);
    assert_eq!(out.trim(), "tank\tONLINE");
    // -s: each device's slow I/Os (none here); "-" on the vdevs above the devices.
    let out = env.ok(&["pool", "status", "-s", "tank"]);
    let d0 = out
        .lines()
        .find(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|n| n.ends_with("d0"))
        })
        .unwrap_or("");
    assert!(
        out.contains("SLOW") && d0.split_whitespace().nth(5) == Some("0"),
        "{out}"
    );
    let top = out.lines().find(|l| l.contains("raidz2-0")).unwrap_or("");
    assert_eq!(top.split_whitespace().nth(5), Some("-"), "{out}");

    // A file through the engine and back, byte for byte.
    let payload: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(env.path("in.bin"), &payload).unwrap();
    let out = env.ok(&["debug", "object", "write", "tank", "in.bin"]);
    let id = out.lines().last().unwrap().trim().to_string();
    assert!(id.parse::<u64>().is_ok(), "last line is not an id: {out}");
    let out = Command::new(env!("CARGO_BIN_EXE_tank"))
        .args(["debug", "object", "read", "tank", &id])
        .env("TANK_DATA_DIR", env.path("data"))
        .current_dir(env.dir.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(out.stdout == payload, "read back differs");
    let list = env.ok(&["debug", "object", "list", "tank", "--json"]);
    assert!(list.contains("3000000"), "{list}");
    env.ok(&["debug", "object", "rm", "tank", &id]);
    env.fails(&["debug", "object", "read", "tank", &id], "does not exist");

    let out = env.ok(&["debug", "label", "disks/d0"]);
    assert!(
        out.contains("LABEL 3") && out.contains("uberblocks"),
        "{out}"
    );
    let out = env.ok(&["debug", "tree", "tank"]);
    assert!(out.contains("space map log"), "{out}");
    let out = env.ok(&["pool", "iostat", "-v", "tank"]);
    assert!(out.contains("raidz2-0"), "{out}");
    let hist = env.ok(&["pool", "history", "tank"]);
    assert!(
        hist.contains("pool create") && hist.contains("object rm"),
        "{hist}"
    );

    // Export, list importable pools, import from the directory, and the data is there.
    env.ok(&["pool", "export", "tank"]);
    env.fails(&["pool", "status", "tank"], "no such pool");
    let out = env.ok(&["pool", "import", "-d", "disks"]);
    assert!(
        out.contains("pool: tank") && out.contains("EXPORTED"),
        "{out}"
    );
    env.ok(&["pool", "import", "-d", "disks", "tank"]);
    let st = env.ok(&["pool", "status", "--json", "tank"]);
    assert!(st.contains("\"state\": \"ONLINE\""), "{st}");

    // Bad input, each refused clearly.
    env.fails(
        &[
            "pool", "create", "--size", "128M", "t2", "raidz2", "x1", "x2",
        ],
        "at least 3",
    );
    env.fails(
        &["pool", "create", "--size", "128M", "t2", "x1", "x1"],
        "more than once",
    );
    env.fails(
        &["pool", "create", "--size", "128M", "t2", "disks/d0"],
        "part of active pool 'tank'",
    );
    env.fails(&["pool", "create", "t2", "nonexistent"], "no such device");
    env.fails(
        &[
            "pool",
            "create",
            "--size",
            "128M",
            "-o",
            "ashift=20",
            "t2",
            "x9",
        ],
        "ashift",
    );
    env.fails(
        &["pool", "create", "--size", "128M", "mirror", "x1", "x2"],
        "reserved",
    );
    env.fails(&["pool", "status", "nosuch"], "no such pool");
    // Nothing of the refused creates was left behind as a pool.
    let out = env.ok(&["pool", "list", "-H", "-o", "name"]);
    assert_eq!(out.trim(), "tank");

    // Two devices missing: imported DEGRADED; three: refused naming them.
    env.ok(&["pool", "export", "tank"]);
    std::fs::create_dir(env.path("some")).unwrap();
    std::fs::create_dir(env.path("away")).unwrap();
    for i in 0..2 {
        std::fs::rename(
            env.path(&format!("disks/d{i}")),
            env.path(&format!("away/d{i}")),
        )
        .unwrap();
    }
    for i in 2..7 {
        std::fs::rename(
            env.path(&format!("disks/d{i}")),
            env.path(&format!("some/d{i}")),
        )
        .unwrap();
    }
    std::fs::rename(env.path("disks/s1"), env.path("some/s1")).unwrap();
    std::fs::rename(env.path("disks/s2"), env.path("some/s2")).unwrap();
    let out = env.run(&["pool", "import", "-d", "some", "tank"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st = env.ok(&["pool", "status", "tank"]);
    assert!(st.contains("DEGRADED") && st.contains("UNAVAIL"), "{st}");
    env.ok(&["pool", "export", "tank"]);
    std::fs::rename(env.path("some/d2"), env.path("disks/d2")).unwrap();
    env.fails(
        &["pool", "import", "-d", "some", "tank"],
        "too many unavailable devices",
    );

    // Destroy: the devices can be reused without -f.
    std::fs::rename(env.path("disks/d2"), env.path("some/d2")).unwrap();
    env.ok(&["pool", "import", "-d", "some", "tank"]);
    env.ok(&["pool", "destroy", "tank"]);
    env.ok(&["pool", "create", "t3", "some/d2"]);
}

#[test]
fn demo_runs_on_a_fresh_data_dir() {
    let env = Env::new();
    let out = env.ok(&["demo", "--size", "16M"]);
    assert!(
        out.contains("created pool 'tank'") && out.contains("verified every byte"),
        "{out}"
    );
    let out = env.ok(&["demo", "--size", "4M"]);
    assert!(out.contains("using pool 'tank'"), "{out}");
    // The default devices are sparse: far less on disk than their size.
    let dev = env.path("data/devices/disk0");
    let meta = std::fs::metadata(&dev).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert!(meta.len() >= 4 << 30);
    assert!(meta.blocks() * 512 < 256 << 20, "device file is not sparse");
}

/// The default pool is made all or nothing: a set-up that fails after the pool was created
/// (here: the cache file cannot be written) removes the device files it made, so the next
/// start begins afresh instead of finding half a pool.
#[test]
fn a_failed_default_setup_leaves_nothing_behind() {
    let env = Env::new();
    let data = env.path("data");
    std::fs::create_dir_all(data.join("pools.json.tmp")).unwrap();
    let err = env.fails(&["demo", "--size", "1M"], "");
    assert!(err.contains("pools.json.tmp"), "{err}");
    let devices = data.join("devices");
    let left: Vec<_> = std::fs::read_dir(&devices)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "device files left behind: {left:?}");
    std::fs::remove_dir(data.join("pools.json.tmp")).unwrap();
    let out = env.ok(&["demo", "--size", "1M"]);
    assert!(out.contains("created pool 'tank'"), "{out}");
    let got = env.ok(&["dataset", "get", "-H", "mountpoint", "tank"]);
    let fields: Vec<&str> = got.trim().split('\t').collect();
    assert_eq!(
        fields,
        [
            "tank",
            "mountpoint",
            &*data.join("mnt/tank").to_string_lossy(),
            "local"
        ],
        "the default pool's root has its mountpoint from the start"
    );
}

#[test]
fn plan_recommends_and_refuses_nonsense() {
    let env = Env::new();
    let out = env.ok(&[
        "plan",
        "--disks",
        "7x4TB",
        "--workload",
        "seq",
        "--ssd",
        "1x512GB",
    ]);
    assert!(
        out.contains("recommended for seq work: 1 x raidz2 of 7"),
        "{out}"
    );
    assert!(out.contains("L2ARC") && out.contains("SLOG"), "{out}");
    let json = env.ok(&[
        "plan",
        "--disks",
        "12x4TB",
        "--workload",
        "random",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(
        v["recommended"].as_str().unwrap().contains("mirror"),
        "{json}"
    );
    assert!(v["layouts"].as_array().unwrap().len() > 5);
    env.fails(&["plan", "--disks", "0x4TB"], "disks");
    env.fails(&["plan", "--disks", "seven"], "COUNTxSIZE");
    env.fails(
        &["plan", "--disks", "7x4TB", "--disk-type", "hdd:rpm=0"],
        "rpm",
    );
    env.fails(
        &["plan", "--disks", "7x4TB", "--recordsize", "3000"],
        "power of two",
    );
    env.fails(
        &["plan", "--disks", "7x4TB", "--workload", "bursty"],
        "workload",
    );
}

#[test]
fn bench_measures_a_directory_keeps_history_and_cleans_up() {
    let env = Env::new();
    std::fs::create_dir(env.path("target")).unwrap();
    std::fs::write(env.path("target/keep"), b"user data").unwrap();
    let args = [
        "bench",
        "target",
        "--size",
        "8M",
        "--files",
        "100",
        "--tree-files",
        "20",
        "--runs",
        "1",
        "--label",
        "first",
        "--chart",
        "chart.svg",
        "--json",
    ];
    let out = env.ok(&args);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(
        v["summary"]["median"]["seq_output_block_mb_s"]
            .as_f64()
            .unwrap()
            > 0.0,
        "{out}"
    );
    assert!(std::fs::read_to_string(env.path("chart.svg"))
        .unwrap()
        .starts_with("<svg"));
    let left: Vec<_> = std::fs::read_dir(env.path("target"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("keep")]);
    env.ok(&[
        "bench",
        "target",
        "--size",
        "8M",
        "--files",
        "100",
        "--tree-files",
        "20",
        "--runs",
        "1",
        "--label",
        "second",
    ]);
    let cmp = env.ok(&["bench", "--compare"]);
    assert!(
        cmp.contains("first") && cmp.contains("second") && cmp.contains("Random seeks"),
        "{cmp}"
    );
    env.fails(&["bench", "target/keep", "--size", "8M"], "not a directory");
    env.fails(&["bench", "target", "--size", "1P"], "free");
}

/// Whether this process can mount FUSE filesystems.
fn fuse_mountable() -> bool {
    common::fuse_missing().is_none()
}

/// Nothing of an emulated pool is left in the data directory.
fn no_emulated_leftovers(env: &Env) {
    let data = env.path("data");
    let left: Vec<_> = std::fs::read_dir(&data)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        left.iter()
            .all(|n| !n.to_string_lossy().starts_with("emulate-")),
        "{left:?}"
    );
}

#[test]
fn an_interrupted_bench_removes_what_it_made() {
    let env = Env::new();
    std::fs::create_dir(env.path("target")).unwrap();
    std::fs::write(env.path("target/keep"), b"user data").unwrap();
    // Slow enough to be caught in the middle: a gigabit link, an emulated HDD, and (where
    // FUSE mounts) an emulated SSD's filesystem with the benchmark's files open on it.
    let mut cases = vec![
        (
            vec![
                "bench", "target", "--size", "256M", "--link", "1gbe", "--runs", "1",
            ],
            env.path("target"),
        ),
        (
            vec![
                "bench",
                "--emulate",
                "1x hdd",
                "--engine",
                "--size",
                "1G",
                "--runs",
                "1",
            ],
            env.path("data"),
        ),
    ];
    if fuse_mountable() {
        cases.push((
            vec![
                "bench",
                "--emulate",
                "1x ssd",
                "--size",
                "512M",
                "--runs",
                "1",
            ],
            env.path("data"),
        ));
    }
    for (args, inside) in cases {
        let child = Command::new(env!("CARGO_BIN_EXE_tank"))
            .args(&args)
            .env("TANK_DATA_DIR", env.path("data"))
            .current_dir(env.dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let made = |p: &std::path::Path| {
            std::fs::read_dir(p)
                .map(|d| {
                    d.flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .filter(|n| n.starts_with(".tank-bench-") || n.starts_with("emulate-"))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default()
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while made(&inside).is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "{args:?} made nothing"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
        let killed = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was not interrupted: {err}");
        assert!(err.contains("interrupted"), "{err}");
        assert!(
            made(&inside).is_empty(),
            "{args:?} left {:?}",
            made(&inside)
        );
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
        let here = env.dir.path().to_string_lossy().into_owned();
        assert!(
            !mounts.lines().any(|l| l.contains(&here)),
            "{args:?} left a mount: {mounts}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(env.path("target/keep")).unwrap(),
        "user data"
    );
    let left: Vec<_> = std::fs::read_dir(env.path("target"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("keep")]);
}

#[test]
fn bench_emulates_a_planned_build_at_the_engine_level() {
    let env = Env::new();
    let out = env.ok(&[
        "bench",
        "--emulate",
        "3x nvme raidz1 + ssd log",
        "--engine",
        "--size",
        "16M",
        "--recordsize",
        "1M",
        "--runs",
        "1",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let read = v["median"]["seq_input_block_mb_s"].as_f64().unwrap();
    // Two data devices of an emulated NVMe (3500 MB/s each) cannot read faster than both together.
    assert!(read > 0.0 && read < 2.0 * 3500.0 * 1.1, "{out}");
    env.fails(
        &["bench", "--emulate", "2x hdd raidz2"],
        "raidz2 vdev of 2 devices",
    );
    env.fails(&["bench", "--emulate", "7x tape"], "unknown device profile");
    env.fails(&["bench", "--engine"], "give --emulate");
    env.fails(
        &["bench", "--emulate", "1x hdd", "--link", "2gbe"],
        "unknown link",
    );
    no_emulated_leftovers(&env);
}

#[test]
fn one_emulated_hdd_measures_within_ten_percent_of_its_profile() {
    let env = Env::new();
    let out = env.ok(&[
        "bench",
        "--emulate",
        "1x hdd",
        "--engine",
        "--size",
        "64M",
        "--runs",
        "3",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let margin = v["host_margin"].as_f64().unwrap();
    let bound: Vec<&str> = v["host_bound"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    for figure in [
        "seq_output_block_mb_s",
        "seq_input_block_mb_s",
        "random_seeks_per_s",
    ] {
        let device = v["raw_device"][figure].as_f64().unwrap();
        let profile = v["profile"][figure].as_f64().unwrap();
        let host = v["host_file"][figure].as_f64().unwrap();
        // The model never lets the device run ahead of its profile.
        assert!(
            device < profile * 1.10,
            "{figure}: the emulated device measured {device:.1}, above its profile's {profile:.1}\n{out}"
        );
        assert_eq!(
            bound.contains(&figure),
            host < margin * profile,
            "{figure}: host_bound does not match the host file's {host:.1}\n{out}"
        );
        if host < margin * profile {
            // A host too slow for the profile bounds the emulation; the output says so.
            eprintln!("{figure}: the bare host file ran at {host:.1}, under {margin}x the profile's {profile:.1}: only the upper bound is checked");
            continue;
        }
        assert!(
            (device - profile).abs() / profile < 0.10,
            "{figure}: the emulated device measured {device:.1}, its profile says {profile:.1}\n{out}"
        );
    }
    no_emulated_leftovers(&env);
}

#[test]
fn bench_runs_every_phase_on_an_emulated_build_behind_a_link() {
    if let Some(why) = common::fuse_missing() {
        common::skip(
            "bench_runs_every_phase_on_an_emulated_build_behind_a_link",
            why,
        );
        return;
    }
    let env = Env::new();
    let out = env.ok(&[
        "bench",
        "--emulate",
        "3x ssd raidz1",
        "--link",
        "1gbe",
        "--size",
        "32M",
        "--files",
        "200",
        "--tree-files",
        "40",
        "--runs",
        "1",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let median = &v["summary"]["median"];
    for figure in tank_bench::fsbench::FIGURE_NAMES {
        let x = median[figure].as_f64().unwrap();
        assert!(x > 0.0 && x.is_finite(), "{figure}: {out}");
    }
    // The gigabit link (111 MB/s of payload) caps every stream.
    for figure in [
        "seq_output_block_mb_s",
        "seq_input_block_mb_s",
        "tree_copy_in_mb_s",
    ] {
        let x = median[figure].as_f64().unwrap();
        assert!(x <= 111.0 * 1.01, "{figure} {x} above the link: {out}");
    }
    assert!(v["label"].as_str().unwrap().contains("via 1gbe"), "{out}");
    let cmp = env.ok(&["bench", "--compare"]);
    assert!(cmp.contains("emulated 3x ssd raidz1"), "{cmp}");
    no_emulated_leftovers(&env);
}

#[test]
fn datasets_snapshots_and_clones_from_the_command_line() {
    let env = Env::new();
    let d = devs("m", 3);
    let mut args = vec!["pool", "create", "--size", "256M", "p", "raidz1"];
    args.extend(d.iter().map(String::as_str));
    env.ok(&args);
    env.ok(&["dataset", "create", "-o", "compression=zstd", "p/home"]);
    env.ok(&["dataset", "create", "-p", "p/a/b/c"]);
    env.ok(&["dataset", "create", "-V", "32M", "p/vol"]);
    env.ok(&["snapshot", "-r", "p@one"]);
    let list = env.ok(&["dataset", "list", "-t", "all", "-H", "-o", "name"]);
    for name in ["p", "p@one", "p/home@one", "p/a/b/c@one", "p/vol@one"] {
        assert!(
            list.lines().any(|l| l == name),
            "{name} missing from:\n{list}"
        );
    }
    let got = env.ok(&["dataset", "get", "-H", "compression", "p/home"]);
    assert_eq!(got.trim(), "p/home\tcompression\tzstd\tlocal");
    let got = env.ok(&["dataset", "get", "-H", "-p", "used,volsize", "p/vol"]);
    assert!(got.contains("volsize\t33554432"), "{got}");
    // The volume reserves its size: the parent's used shows it.
    let used: u64 = env
        .ok(&["dataset", "list", "-H", "-p", "-o", "used", "p"])
        .trim()
        .parse()
        .unwrap();
    assert!(used >= 32 << 20, "used {used}");
    env.ok(&["dataset", "set", "atime=off", "recordsize=1M", "p/home"]);
    env.ok(&["dataset", "inherit", "recordsize", "p/home"]);
    let got = env.ok(&["dataset", "get", "-H", "atime,recordsize", "p/home"]);
    assert!(got.contains("atime\toff\tlocal"), "{got}");
    assert!(got.contains("recordsize\t128K\tdefault"), "{got}");
    env.ok(&["clone", "p/home@one", "p/copy"]);
    let got = env.ok(&["dataset", "get", "-H", "origin", "p/copy"]);
    assert!(got.contains("p/home@one"), "{got}");
    env.ok(&["dataset", "rename", "p/a", "p/home/a"]);
    env.ok(&["rollback", "p/home@one"]);
    let json = env.ok(&["dataset", "list", "-r", "--json", "p/home"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(v.as_array().unwrap().len() >= 4, "{json}");

    // Refusals, each clear and changing nothing.
    env.fails(&["dataset", "create", "p/bad!name"], "invalid dataset name");
    env.fails(&["dataset", "create", "p/x/y"], "use -p");
    env.fails(
        &["dataset", "set", "recordsize=3K", "p/home"],
        "power of two",
    );
    env.fails(&["dataset", "set", "checksum=off", "p/home"], "never");
    env.fails(&["dataset", "set", "used=1", "p/home"], "read-only");
    env.fails(&["dataset", "destroy", "p/home"], "use -r");
    env.fails(&["dataset", "destroy", "p/home@one"], "clones");
    env.fails(&["dataset", "rename", "p/home", "q/home"], "another pool");
    env.fails(
        &["dataset", "create", "-V", "100G", "p/big"],
        "not enough free space",
    );
    env.fails(&["rollback", "p/home"], "not a snapshot");
    env.ok(&["dataset", "destroy", "-R", "p/home"]);
    let list = env.ok(&["dataset", "list", "-t", "all", "-H", "-o", "name"]);
    assert!(
        !list.contains("p/home") && !list.contains("p/copy"),
        "{list}"
    );
    let hist = env.ok(&["pool", "history", "p"]);
    assert!(hist.contains("tank snapshot -r p@one"), "{hist}");
}

/// Stops a daemon on drop, so a failed test leaves nothing mounted or running.
struct Daemon(std::process::Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn serve_creates_mounts_and_answers_the_cli() {
    if let Some(why) = common::fuse_missing() {
        common::skip("serve_creates_mounts_and_answers_the_cli", why);
        return;
    }
    let env = Env::new();
    let start = || serve(&env);
    let mnt = env.path("data/mnt/tank");
    {
        let _d = start();
        // The default pool, its root filesystem mounted under the data directory.
        let list = env.ok(&["pool", "list", "-H"]);
        assert!(list.contains("tank"), "{list}");
        std::fs::write(mnt.join("hello.txt"), b"kept across restarts").unwrap();
        // Commands go through the daemon (the pool is held by it).
        env.ok(&["dataset", "create", "tank/docs"]);
        assert!(mnt.join("docs").is_dir(), "new filesystem mounted");
        std::fs::write(mnt.join("docs/a"), b"A").unwrap();
        env.ok(&["snapshot", "-r", "tank@s"]);
        std::fs::remove_file(mnt.join("docs/a")).unwrap();
        assert_eq!(
            std::fs::read(mnt.join("docs/.tank/snapshot/s/a")).unwrap(),
            b"A"
        );
        env.ok(&["rollback", "tank/docs@s"]);
        assert_eq!(std::fs::read(mnt.join("docs/a")).unwrap(), b"A");
        let hist = env.ok(&["pool", "history", "tank"]);
        assert!(hist.contains("tank rollback tank/docs@s"), "{hist}");
        // A scrub runs in the daemon; status follows it to the end.
        let out = env.ok(&["pool", "scrub", "tank"]);
        assert!(out.contains("started"), "{out}");
        let events = env.ok(&["pool", "events", "tank"]);
        assert!(events.contains("sysevent.fs.zfs.scrub_start"), "{events}");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let st = env.ok(&["pool", "status", "tank"]);
            if st.contains("scan: scrub repaired") {
                assert!(st.contains("with 0 errors"), "{st}");
                break;
            }
            assert!(st.contains("scrub in progress"), "{st}");
            assert!(std::time::Instant::now() < deadline, "scrub did not finish");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
    // SIGTERM unmounted and exported; a second start brings everything back.
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(
        !mounts.contains(&mnt.to_string_lossy().to_string()),
        "{mounts}"
    );
    let mut d = start();
    assert_eq!(
        std::fs::read(mnt.join("hello.txt")).unwrap(),
        b"kept across restarts"
    );
    assert_eq!(std::fs::read(mnt.join("docs/a")).unwrap(), b"A");

    // kill -9 leaves the mounts behind, their server gone; a daemon started at once (the
    // root's attributes still cached by the kernel) detaches them and mounts again.
    let _ = d.0.kill();
    let _ = d.0.wait();
    std::fs::remove_file(env.path("data/tank.sock")).unwrap();
    let d = start();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::fs::read(mnt.join("docs/a")).ok().as_deref() != Some(b"A") {
        assert!(
            std::time::Instant::now() < deadline,
            "the restarted daemon did not mount again over its dead mounts"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(
        std::fs::read(mnt.join("hello.txt")).unwrap(),
        b"kept across restarts"
    );
    drop(d);
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    let root = env.dir.path().to_string_lossy().to_string();
    assert!(
        !mounts.contains(&root),
        "mounts left after the stop: {mounts}"
    );
}

/// Damages `n` runs of `run` bytes (at most 64 KiB), one every 64 KiB from `at` bytes into
/// each named device file.
fn damage(env: &Env, names: &[&str], at: u64, n: u64, run: usize) {
    use std::os::unix::fs::FileExt;
    assert!(run <= 65536);
    for (k, name) in names.iter().enumerate() {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(env.path(name))
            .unwrap();
        for i in 0..n {
            let junk = vec![0x5a ^ (k as u8) ^ (i as u8); run];
            f.write_all_at(&junk, at + i * 65536).unwrap();
        }
    }
}

#[test]
fn scrub_repairs_reports_permanent_errors_and_refuses_bad_requests() {
    let env = Env::new();
    let names = devs("s", 5);
    let mut args = vec!["pool", "create", "--size", "128M", "sp", "raidz2"];
    args.extend(names.iter().map(String::as_str));
    env.ok(&args);
    let data: Vec<u8> = (0..24u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(env.path("blob"), &data).unwrap();
    env.ok(&["debug", "object", "write", "sp", "blob"]);
    env.fails(&["pool", "scrub", "-p", "sp"], "no active scrub");
    env.fails(&["pool", "scrub", "-s", "sp"], "no active scrub");
    env.fails(&["pool", "scrub", "nosuch"], "no such pool");
    let out = env.ok(&["pool", "scrub", "sp"]);
    assert!(out.contains("scrub repaired 0B in"), "{out}");
    assert!(out.contains("with 0 errors"), "{out}");

    // Two damaged devices of a raidz2: everything is repaired.
    env.ok(&["pool", "export", "sp"]);
    damage(&env, &["s1", "s3"], 4 << 20, 100, 4096);
    let import = ["pool", "import", "-d", ".", "sp"];
    env.ok(&import);
    let out = env.ok(&["pool", "scrub", "sp"]);
    assert!(!out.contains("repaired 0B in"), "{out}");
    assert!(out.contains("with 0 errors"), "{out}");
    let status = env.ok(&["pool", "status", "sp"]);
    assert!(status.contains("scan: scrub repaired"), "{status}");
    assert!(status.contains("errors: No known data errors"), "{status}");
    let again = env.ok(&["pool", "scrub", "sp"]);
    assert!(again.contains("scrub repaired 0B in"), "{again}");

    // Three: the damaged blocks are permanent errors, named by object.
    env.ok(&["pool", "export", "sp"]);
    // The whole region on three devices, so that every block in it (whatever the layout
    // the allocator chose) has more damaged columns than raidz2 can rebuild.
    damage(&env, &["s0", "s2", "s4"], 4 << 20, 100, 65536);
    env.ok(&import);
    let out = env.ok(&["pool", "scrub", "sp"]);
    assert!(!out.contains("with 0 errors"), "{out}");
    let status = env.ok(&["pool", "status", "sp"]);
    assert!(
        status.contains("data errors, use '-v' for a list"),
        "{status}"
    );
    let verbose = env.ok(&["pool", "status", "-v", "sp"]);
    assert!(verbose.contains("Permanent errors"), "{verbose}");
    assert!(verbose.contains("sp:<0x1>"), "{verbose}");
    let json = env.ok(&["pool", "status", "--json", "sp"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v[0]["scan"]["phase"], "finished");
    assert!(v[0]["scan"]["errors"].as_u64().unwrap() > 0);
    assert_eq!(v[0]["errors"][0], "sp:<0x1>");
    env.fails(&["debug", "object", "read", "sp", "1"], "");

    // Without the daemon, the events are those kept with the pool: the scrubs' of the
    // earlier commands; following them needs the daemon.
    let out = env.ok(&["pool", "events", "sp"]);
    assert!(out.contains("sysevent.fs.zfs.scrub_start"), "{out}");
    assert!(out.contains("ereport.fs.zfs.checksum"), "{out}");
    env.fails(
        &["pool", "events", "-f", "sp"],
        "start it with 'tank serve'",
    );
    let json = env.ok(&["pool", "events", "--json", "sp"]);
    assert!(serde_json::from_str::<serde_json::Value>(&json)
        .unwrap()
        .is_array());

    // Once the damaged object is gone, the next scrub clears the list.
    env.ok(&["debug", "object", "rm", "sp", "1"]);
    let out = env.ok(&["pool", "scrub", "sp"]);
    assert!(out.contains("with 0 errors"), "{out}");
    let status = env.ok(&["pool", "status", "sp"]);
    assert!(status.contains("errors: No known data errors"), "{status}");
}

#[test]
fn offline_online_and_clear_resilver_what_was_missed() {
    let env = Env::new();
    let names = devs("o", 5);
    let mut args = vec!["pool", "create", "--size", "128M", "op", "raidz2"];
    args.extend(names.iter().map(String::as_str));
    env.ok(&args);
    let blob: Vec<u8> = (0..8u32 << 20).map(|i| (i >> 7) as u8 ^ 0x3c).collect();
    std::fs::write(env.path("blob"), &blob).unwrap();
    env.ok(&["debug", "object", "write", "op", "blob"]);
    let out = env.ok(&["pool", "offline", "op", "o1"]);
    assert!(out.contains("offline"), "{out}");
    env.ok(&["pool", "offline", "op", "o2"]);
    env.fails(&["pool", "offline", "op", "o3"], "no valid replicas");
    env.fails(&["pool", "offline", "op", "nosuch"], "no such device");
    // Offline stays offline across commands (it is in the pool's configuration).
    let status = env.ok(&["pool", "status", "op"]);
    assert!(status.contains("DEGRADED"), "{status}");
    assert!(status.contains("offlined by the administrator"), "{status}");
    env.ok(&["debug", "object", "write", "op", "blob"]);
    let out = env.ok(&["pool", "online", "op", "o1"]);
    assert!(out.contains("missed txgs"), "{out}");
    assert!(out.contains("resilvered"), "{out}");
    assert!(out.contains("0B rewritten by verification"), "{out}");
    env.ok(&["pool", "online", "op", "o2"]);
    let status = env.ok(&["pool", "status", "op"]);
    assert!(status.contains("state: ONLINE"), "{status}");
    assert!(status.contains("scan: resilvered"), "{status}");
    let out = env.ok(&["pool", "clear", "op"]);
    assert!(!out.contains("missed"), "{out}");
    let back = env.run(&["debug", "object", "read", "op", "2"]);
    assert!(back.status.success());
    assert!(back.stdout == blob, "object 2 reads back different");
    let hist = env.ok(&["pool", "history", "op"]);
    assert!(hist.contains("resilver done"), "{hist}");
}

#[test]
fn attach_and_detach_reshape_mirrors() {
    let env = Env::new();
    env.ok(&["pool", "create", "--size", "96M", "ap", "a0"]);
    let blob: Vec<u8> = (0..4u32 << 20).map(|i| ((i * 7) >> 5) as u8).collect();
    std::fs::write(env.path("blob"), &blob).unwrap();
    env.ok(&["debug", "object", "write", "ap", "blob"]);
    let out = env.ok(&["pool", "attach", "--size", "96M", "ap", "a0", "a1"]);
    assert!(
        out.contains("attached") && out.contains("resilvered"),
        "{out}"
    );
    let status = env.ok(&["pool", "status", "ap"]);
    assert!(
        status.contains("mirror-0") && status.contains("state: ONLINE"),
        "{status}"
    );
    env.fails(
        &["pool", "attach", "ap", "a0", "a1"],
        "already a device of this pool",
    );
    env.ok(&["pool", "detach", "ap", "a0"]);
    env.fails(&["pool", "detach", "ap", "a1"], "only a side of a mirror");
    let back = env.run(&["debug", "object", "read", "ap", "1"]);
    assert!(back.status.success() && back.stdout == blob);
    let mut args = vec!["pool", "create", "--size", "96M", "rp", "raidz1"];
    args.extend(["r0", "r1", "r2"]);
    env.ok(&args);
    env.fails(
        &["pool", "attach", "--size", "96M", "rp", "r0", "r3"],
        "can only attach to mirrors and top-level disks",
    );
}

#[test]
fn autoreplace_puts_a_blank_disk_in_place_of_a_missing_one() {
    let env = Env::new();
    let mut args = vec!["pool", "create", "--size", "96M", "ar", "raidz1"];
    args.extend(["x0", "x1", "x2"]);
    env.ok(&args);
    let blob: Vec<u8> = (0..4u32 << 20).map(|i| (i >> 3) as u8).collect();
    std::fs::write(env.path("blob"), &blob).unwrap();
    env.ok(&["debug", "object", "write", "ar", "blob"]);
    let get = env.ok(&["pool", "get", "autoreplace", "ar"]);
    assert!(get.contains("autoreplace") && get.contains("off"), "{get}");
    env.fails(&["pool", "set", "autoreplace=maybe", "ar"], "on or off");
    env.fails(&["pool", "set", "ashift=9", "ar"], "cannot set 'ashift'");
    // Off: a blank disk where x1 was is left alone.
    env.ok(&["pool", "export", "ar"]);
    let blank = |name: &str| {
        let f = std::fs::File::create(env.path(name)).unwrap();
        f.set_len(96 << 20).unwrap();
    };
    blank("x1");
    let import = ["pool", "import", "-d", ".", "ar"];
    let out = env.run(&import);
    assert!(out.status.success());
    assert!(!String::from_utf8_lossy(&out.stderr).contains("autoreplace"));
    let status = env.ok(&["pool", "status", "ar"]);
    assert!(status.contains("DEGRADED"), "{status}");
    // On: the next time the pool is opened the blank disk takes the missing one's place
    // (lacking everything, recorded in the labels); a resilver makes the pool whole.
    env.ok(&["pool", "set", "autoreplace=on", "ar"]);
    let out = env.run(&["pool", "get", "all", "--json", "ar"]);
    assert!(out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("autoreplace: the blank device"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["autoreplace"]["value"], "on");
    let status = env.ok(&["pool", "status", "ar"]);
    assert!(status.contains("resilvering: lacks txgs"), "{status}");
    let out = env.ok(&["pool", "resilver", "ar"]);
    assert!(out.contains("resilvered"), "{out}");
    let status = env.ok(&["pool", "status", "ar"]);
    assert!(status.contains("state: ONLINE"), "{status}");
    let back = env.run(&["debug", "object", "read", "ar", "1"]);
    assert!(back.status.success() && back.stdout == blob);
}

#[test]
fn cache_and_log_devices_arcstat_and_params() {
    let env = Env::new();
    env.ok(&[
        "pool", "create", "--size", "96M", "fast", "raidz1", "y0", "y1", "y2",
    ]);
    // Cache and log devices are added at their own size, shown in status, and removed.
    let out = env.ok(&[
        "pool", "add", "--size", "80M", "fast", "cache", "ssd0", "log", "ssd1",
    ]);
    assert!(out.contains("added") && out.contains("ssd0"), "{out}");
    let status = env.ok(&["pool", "status", "fast"]);
    assert!(
        status.contains("cache") && status.contains("logs"),
        "{status}"
    );
    assert!(
        status.contains("ssd0") && status.contains("ssd1"),
        "{status}"
    );
    env.fails(
        &["pool", "add", "fast", "cache", "ssd0"],
        "already a device",
    );
    env.fails(
        &["pool", "add", "--size", "96M", "fast", "z9"],
        "mismatched replication",
    );
    env.fails(&["pool", "add", "fast"], "required");
    env.fails(
        &["pool", "remove", "fast", "y1"],
        "only cache, log and spare",
    );
    env.fails(&["pool", "remove", "fast", "nosuch"], "nosuch");
    let out = env.ok(&["pool", "remove", "fast", "ssd0", "ssd1"]);
    assert!(out.contains("removed cache device ssd0"), "{out}");
    let status = env.ok(&["pool", "status", "fast"]);
    assert!(
        !status.contains("ssd0") && !status.contains("logs"),
        "{status}"
    );
    // The pool imports after the change.
    env.ok(&["pool", "export", "fast"]);
    env.ok(&["pool", "import", "-d", ".", "fast"]);
    // arcstat: a summary, and the counters as JSON.
    let out = env.ok(&["arcstat"]);
    assert!(out.contains("ARC size") && out.contains("hits"), "{out}");
    let out = env.ok(&["arcstat", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["arc"]["c_max"].as_u64().unwrap() >= 32 << 20, "{v}");
    let out = env.ok(&["arcstat", "0.2", "2"]);
    assert_eq!(out.lines().count(), 3, "{out}");
    env.fails(&["arcstat", "0"], "invalid interval");
    // param: list, set, refuse nonsense.
    let out = env.ok(&["param"]);
    assert!(
        out.contains("arc_max") && out.contains("l2arc_write_max"),
        "{out}"
    );
    env.ok(&["param", "l2arc_noprefetch=0"]);
    env.fails(&["param", "arc_max=1M"], "below the minimum");
    env.fails(&["param", "arc_max=100000T"], "more than this machine");
    env.fails(&["param", "l2arc_feed_secs=0"], "1 to 60");
    env.fails(&["param", "nosuch=1"], "unknown parameter");
}

/// The error counters of the leaves of `pool status --json`: (name, read, write, cksum).
fn counters(status_json: &str) -> Vec<(String, u64, u64, u64)> {
    let v: serde_json::Value = serde_json::from_str(status_json).unwrap();
    let mut out = Vec::new();
    fn walk(v: &serde_json::Value, out: &mut Vec<(String, u64, u64, u64)>) {
        let kids = v["children"].as_array().cloned().unwrap_or_default();
        if kids.is_empty() {
            out.push((
                v["name"].as_str().unwrap_or("").to_string(),
                v["read_errors"].as_u64().unwrap(),
                v["write_errors"].as_u64().unwrap(),
                v["cksum_errors"].as_u64().unwrap(),
            ));
        }
        for k in &kids {
            walk(k, out);
        }
    }
    for vdev in v[0]["config"].as_array().unwrap() {
        walk(vdev, &mut out);
    }
    out
}

/// `pool events --json`, as (seq, class, vdev) of each event.
fn event_list(events_json: &str) -> Vec<(u64, String, String)> {
    let v: serde_json::Value = serde_json::from_str(events_json).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["seq"].as_u64().unwrap(),
                e["class"].as_str().unwrap().to_string(),
                e["vdev"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// One truth about a pool whichever process asks: the CKSUM errors a read repaired, and the
/// events it posted, are kept with the pool, and `pool status`, `pool events` and their
/// `--json` give the same answer from a CLI process without a daemon, after an export and
/// import, from the daemon, and after it stopped; until `pool clear`.
#[test]
fn counters_and_events_are_kept_with_the_pool() {
    let env = Env::new();
    env.ok(&[
        "pool", "create", "--size", "128M", "hp", "mirror", "m0", "m1",
    ]);
    let data: Vec<u8> = (0..4u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(env.path("blob"), &data).unwrap();
    let id = env.ok(&["debug", "object", "write", "hp", "blob"]);
    let id = id.trim().lines().last().unwrap().to_string();
    env.ok(&["pool", "export", "hp"]);
    damage(&env, &["m1"], 4 << 20, 64, 4096);
    env.ok(&["pool", "import", "-d", ".", "hp"]);
    let clean = counters(&env.ok(&["pool", "status", "--json", "hp"]));
    assert!(clean.iter().all(|c| c.3 == 0), "{clean:?}");

    // A scrub in one process finds and repairs the damage on m1 (reads of a mirror may
    // never pick the damaged side; a scrub reads both)...
    let out = env.ok(&["pool", "scrub", "hp"]);
    assert!(
        out.contains("with 0 errors") && !out.contains("repaired 0B"),
        "{out}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_tank"))
        .args(["debug", "object", "read", "hp", &id])
        .env("TANK_DATA_DIR", env.path("data"))
        .current_dir(env.dir.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(out.stdout == data, "the read returned good data");

    // ...and every later process sees what it counted and posted.
    let status = env.ok(&["pool", "status", "--json", "hp"]);
    let seen = counters(&status);
    let m1 = seen.iter().find(|c| c.0.ends_with("m1")).unwrap().clone();
    assert!(m1.3 > 0, "CKSUM errors on m1: {seen:?}");
    let events = event_list(&env.ok(&["pool", "events", "--json", "hp"]));
    let cksum: Vec<_> = events
        .iter()
        .filter(|e| e.1 == "ereport.fs.zfs.checksum")
        .cloned()
        .collect();
    assert!(!cksum.is_empty(), "{events:?}");
    assert!(cksum.iter().all(|e| e.2.ends_with("m1")), "{cksum:?}");
    let human = env.ok(&["pool", "status", "hp"]);
    let row = human
        .lines()
        .find(|l| l.trim_start().starts_with(&m1.0) || l.contains("m1 "))
        .unwrap_or_else(|| panic!("{human}"))
        .to_string();
    assert!(row.contains(&m1.3.to_string()), "{row}");
    let human_events = env.ok(&["pool", "events", "hp"]);
    assert!(
        human_events.contains("ereport.fs.zfs.checksum"),
        "{human_events}"
    );

    // Across export and import.
    env.ok(&["pool", "export", "hp"]);
    env.ok(&["pool", "import", "-d", ".", "hp"]);
    assert_eq!(counters(&env.ok(&["pool", "status", "--json", "hp"])), seen);
    let after_import = event_list(&env.ok(&["pool", "events", "--json", "hp"]));
    for e in &cksum {
        assert!(after_import.contains(e), "{e:?} lost: {after_import:?}");
    }

    // The daemon gives the same answer (it needs no mount: the pool's root has none).
    {
        let _d = serve(&env);
        assert_eq!(counters(&env.ok(&["pool", "status", "--json", "hp"])), seen);
        let from_daemon = event_list(&env.ok(&["pool", "events", "--json", "hp"]));
        for e in &cksum {
            assert!(
                from_daemon.contains(e),
                "{e:?} not in the daemon's: {from_daemon:?}"
            );
        }
        let human = env.ok(&["pool", "status", "hp"]);
        assert!(human.contains(&row), "{human}");
    }
    // After the daemon stopped, a CLI process again.
    assert_eq!(counters(&env.ok(&["pool", "status", "--json", "hp"])), seen);
    let after_daemon = event_list(&env.ok(&["pool", "events", "--json", "hp"]));
    for e in &cksum {
        assert!(after_daemon.contains(e), "{e:?} lost: {after_daemon:?}");
    }

    // Until cleared: counters to zero, kept so; `events -c` empties the kept list.
    env.ok(&["pool", "clear", "hp"]);
    let cleared = counters(&env.ok(&["pool", "status", "--json", "hp"]));
    assert!(cleared.iter().all(|c| c.1 + c.2 + c.3 == 0), "{cleared:?}");
    env.ok(&["pool", "events", "-c", "hp"]);
    let left = event_list(&env.ok(&["pool", "events", "--json", "hp"]));
    assert!(
        !left.iter().any(|e| e.1 == "ereport.fs.zfs.checksum"),
        "{left:?}"
    );
}

/// A hot spare that took a missing device's place at import is resilvered by whichever
/// process holds the pool; while none does, status says so and names the command, never
/// "in progress".
#[test]
fn background_work_runs_in_whichever_process_holds_the_pool() {
    let env = Env::new();
    env.ok(&[
        "pool", "create", "--size", "128M", "bw", "mirror", "b0", "b1", "spare", "b2",
    ]);
    let data: Vec<u8> = (0..16u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 11) as u8)
        .collect();
    std::fs::write(env.path("blob"), &data).unwrap();
    env.ok(&["debug", "object", "write", "bw", "blob"]);
    env.ok(&["pool", "export", "bw"]);
    std::fs::remove_file(env.path("b1")).unwrap();
    env.ok(&["pool", "import", "-d", ".", "bw"]);
    // Each command's process works on the resilver while it holds the pool; between them
    // nobody does, and status says so.
    let mut finished = false;
    for _ in 0..20 {
        let st = env.ok(&["pool", "status", "bw"]);
        assert!(!st.contains("in progress"), "{st}");
        assert!(st.contains("b2"), "{st}");
        if st.contains("scan: resilvered") {
            finished = true;
            break;
        }
        assert!(
            st.contains("resilver waiting since")
                && st.contains("no process is running it")
                && st.contains("'tank pool resilver -w bw'"),
            "{st}"
        );
        let json: serde_json::Value =
            serde_json::from_str(&env.ok(&["pool", "status", "--json", "bw"])).unwrap();
        let scan = &json[0]["scan"];
        if scan["phase"] == "scanning" {
            assert_eq!(scan["runner"], "none", "{scan}");
        }
    }
    if !finished {
        let out = env.ok(&["pool", "resilver", "-w", "bw"]);
        assert!(out.contains("resilvered"), "{out}");
    }
    let st = env.ok(&["pool", "status", "bw"]);
    assert!(st.contains("scan: resilvered"), "{st}");
    assert!(!st.contains("waiting"), "{st}");
}

/// Runs tank as another uid (and gid), with `stdin` on its standard input.
fn run_as(env: &Env, uid: u32, args: &[&str], stdin: &str) -> Output {
    use std::io::Write as _;
    use std::os::unix::process::CommandExt;
    // Another uid may not reach the build's directory: a copy in the test's own.
    let exe = env.path("tank-exe");
    if !exe.exists() {
        std::fs::copy(env!("CARGO_BIN_EXE_tank"), &exe).unwrap();
    }
    let mut child = Command::new(&exe)
        .args(args)
        .env("TANK_DATA_DIR", env.path("data"))
        .current_dir("/")
        .uid(uid)
        .gid(uid)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// Starts `tank serve` on the environment's data directory and waits for its socket.
fn serve(env: &Env) -> Daemon {
    let child = Command::new(env!("CARGO_BIN_EXE_tank"))
        .args(["serve", "--api", "127.0.0.1:0"])
        .env("TANK_DATA_DIR", env.path("data"))
        .current_dir(env.dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let d = Daemon(child);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !env.path("data/tank.sock").exists() {
        assert!(std::time::Instant::now() < deadline, "daemon did not start");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    d
}

/// Accounts, and every request on the local socket authorized for the uid the kernel names:
/// root and administrators may do everything, a user may read the state and manage its own
/// account, a uid without an account nothing; the store survives a restart, and exports
/// and imports whole.
#[test]
fn accounts_and_the_local_socket_authorize_each_caller() {
    if effective_uid() != 0 {
        common::skip(
            "accounts_and_the_local_socket_authorize_each_caller",
            "needs root to run commands as other uids",
        );
        return;
    }
    let env = Env::new();
    // Other uids must reach the socket inside the test's directory.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(env.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let stdin_ok = |args: &[&str], stdin: &str| {
        let out = run_as(&env, 0, args, stdin);
        assert!(
            out.status.success(),
            "tank {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let mut d = Some(serve(&env));
    env.ok(&["group", "add", "staff", "--gid", "3000"]);
    let out = stdin_ok(
        &["user", "add", "alice", "--uid", "1501", "--group", "staff"],
        "alice's password\n",
    );
    assert!(
        out.contains("added user 'alice' (uid 1501, gid 3000)"),
        "{out}"
    );
    std::fs::write(env.path("pw"), "bob's password\n").unwrap();
    let pwfile = env.path("pw").to_string_lossy().into_owned();
    env.ok(&[
        "user",
        "add",
        "bob",
        "--uid",
        "1502",
        "--admin",
        "--password-file",
        &pwfile,
    ]);
    env.fails(&["user", "add", "carol"], "no password given");
    env.fails(
        &["user", "add", "Bad", "--password-file", &pwfile],
        "invalid user name",
    );
    let users: serde_json::Value =
        serde_json::from_str(&env.ok(&["user", "list", "--json"])).unwrap();
    assert_eq!(users.as_array().unwrap().len(), 2, "{users}");
    assert_eq!(users[0]["groups"][0], "staff");
    assert!(
        !users.to_string().contains("argon2"),
        "no hash in a listing: {users}"
    );
    let store = std::fs::read(env.path("data/accounts.redb")).unwrap();
    assert!(!String::from_utf8_lossy(&store).contains("alice's password"));
    assert!(String::from_utf8_lossy(&store).contains("$argon2id$"));

    let key = env.ok(&["key", "add", "alice"]);
    let access = key
        .lines()
        .find_map(|l| l.strip_prefix("access_key: "))
        .unwrap()
        .to_string();
    assert!(key.contains("secret_key: "), "{key}");
    let token = env.ok(&["token", "add", "bob"]);
    assert!(token.starts_with("token: tank_"), "{token}");

    // Alice, a user: reads, and manages her own account only.
    let as_alice = |args: &[&str], stdin: &str| run_as(&env, 1501, args, stdin);
    let ok = |o: &Output| {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    let denied = |o: &Output, why: &str| {
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(77), "{err}");
        assert!(err.contains(why), "expected '{why}' in: {err}");
    };
    ok(&as_alice(&["pool", "list"], ""));
    ok(&as_alice(&["user", "passwd", "alice"], "a new password\n"));
    ok(&as_alice(&["key", "list", "alice"], ""));
    ok(&as_alice(&["key", "remove", &access], ""));
    denied(
        &as_alice(&["user", "passwd", "bob"], "hijacked!!\n"),
        "only its own account",
    );
    denied(
        &as_alice(&["user", "list"], ""),
        "'alice' is not an administrator",
    );
    denied(
        &as_alice(&["token", "add", "bob"], ""),
        "only its own account",
    );
    denied(
        &as_alice(&["pool", "create", "--size", "64M", "p", "/tmp/x1"], ""),
        "not an administrator",
    );
    denied(
        &as_alice(&["user", "set", "alice", "admin=on"], ""),
        "not an administrator",
    );
    // Bob, an administrator by his account.
    ok(&run_as(&env, 1502, &["user", "list"], ""));
    // A uid without an account.
    denied(
        &run_as(&env, 1600, &["pool", "list"], ""),
        "uid 1600 has no tank account",
    );

    // The store survives a restart of the daemon, and a backup restores it whole.
    drop(d.take());
    let _d = serve(&env);
    let listed = env.ok(&["user", "list"]);
    assert!(
        listed.contains("alice") && listed.contains("bob"),
        "{listed}"
    );
    let backup = env.path("accounts.json").to_string_lossy().into_owned();
    env.ok(&["user", "export", &backup]);
    env.ok(&["user", "remove", "alice"]);
    assert!(!env.ok(&["user", "list"]).contains("alice"));
    env.fails(&["user", "export", &backup], "must not exist");
    let out = env.ok(&["user", "import", &backup]);
    assert!(out.contains("2 users, 1 groups"), "{out}");
    ok(&as_alice(&["pool", "list"], ""));
}

fn effective_uid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(u32::MAX)
}

/// `tank share`: shares checked per protocol with clear refusals, kept with their datasets
/// across export and import, listed the same through the daemon.
#[test]
fn shares_from_the_command_line() {
    let env = Env::new();
    env.ok(&[
        "pool", "create", "--size", "128M", "sh", "mirror", "h0", "h1",
    ]);
    env.ok(&["dataset", "create", "sh/media"]);
    env.ok(&["dataset", "create", "-V", "16M", "sh/vm1"]);
    let out = env.ok(&[
        "share",
        "add",
        "smb",
        "media",
        "sh/media",
        "-o",
        "timemachine=on",
        "-o",
        "timemachine_quota=100G",
    ]);
    assert!(out.contains("smb share 'media' of sh/media added"), "{out}");
    env.ok(&[
        "share",
        "add",
        "nfs",
        "media-nfs",
        "sh/media",
        "-o",
        "hosts=127.0.0.1,::1",
    ]);
    env.ok(&["share", "add", "iscsi", "vm1", "sh/vm1"]);
    env.fails(
        &[
            "share",
            "add",
            "nfs",
            "n2",
            "sh/media",
            "-o",
            "hosts=10.0.0.0/33",
        ],
        "prefix length",
    );
    env.fails(
        &["share", "add", "smb", "media", "sh/media"],
        "share 'media' exists",
    );
    env.fails(
        &["share", "add", "iscsi", "v", "sh/media"],
        "serves volumes",
    );
    env.fails(
        &["share", "add", "afp", "m", "sh/media"],
        "unknown protocol 'afp'",
    );
    env.fails(
        &["share", "add", "smb", "m", "sh/media", "-o", "users=ghost"],
        "no such user 'ghost'",
    );
    env.fails(
        &["share", "add", "smb", "m", "sh/media", "-o", "color=red"],
        "unknown smb share option 'color'",
    );
    env.fails(&["share", "set", "nosuch", "readonly=on"], "no such share");
    env.ok(&[
        "share",
        "set",
        "media-nfs",
        "readonly=on",
        "squash=all_squash",
    ]);
    let list = |env: &Env| -> serde_json::Value {
        serde_json::from_str(&env.ok(&["share", "list", "--json"])).unwrap()
    };
    let shares = list(&env);
    assert_eq!(shares.as_array().unwrap().len(), 3, "{shares}");
    assert_eq!(shares[1]["name"], "media-nfs");
    assert_eq!(shares[1]["options"]["readonly"], "on");
    assert_eq!(shares[1]["options"]["squash"], "all_squash");
    assert_eq!(shares[2]["options"]["iqn"], "iqn.2026-11.org.tank:sh.vm1");
    env.ok(&["share", "remove", "vm1"]);
    // Kept with the datasets: an export and import bring them back.
    env.ok(&["pool", "export", "sh"]);
    env.ok(&["pool", "import", "-d", ".", "sh"]);
    let after = list(&env);
    assert_eq!(after.as_array().unwrap().len(), 2, "{after}");
    assert_eq!(after[1], shares[1]);
    let _d = serve(&env);
    assert_eq!(list(&env), after, "the daemon lists the same");
    let human = env.ok(&["share", "list"]);
    assert!(
        human.contains("media-nfs") && human.contains("nfs"),
        "{human}"
    );
}

/// Relative paths of a command that the daemon runs are the client's: a pool created from
/// another directory with relative device names has its devices there, and a file the
/// command writes lands there too (the story: the daemon used to resolve them against its
/// own working directory).
#[test]
fn the_daemon_resolves_paths_against_the_clients_directory() {
    let env = Env::new();
    let _d = serve(&env);
    let client = env.path("client");
    std::fs::create_dir(&client).unwrap();
    let run_here = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_tank"))
            .args(args)
            .env("TANK_DATA_DIR", env.path("data"))
            .current_dir(&client)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "tank {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    run_here(&[
        "pool", "create", "--size", "64M", "rel", "mirror", "a0", "a1",
    ]);
    assert!(client.join("a0").is_file() && client.join("a1").is_file());
    assert!(!env.path("a0").exists(), "not in the daemon's directory");
    let status = run_here(&["pool", "status", "rel"]);
    assert!(
        status.contains(&*client.join("a0").to_string_lossy()),
        "{status}"
    );
    run_here(&["user", "export", "accounts.json"]);
    assert!(client.join("accounts.json").is_file());
    run_here(&["debug", "label", "a0"]);
}

/// The daemon's local API is typed and strict: a line that is not JSON, a misspelt field,
/// a wrong type, an unknown request or another API version each get a clear error of the
/// `bad_request` kind and change nothing; the same connection then goes on serving.
#[test]
fn the_local_api_refuses_malformed_requests_and_changes_nothing() {
    use std::io::{BufRead, BufReader, Write};
    let env = Env::new();
    let _d = serve(&env);
    let stream = std::os::unix::net::UnixStream::connect(env.path("data/tank.sock")).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    let mut ask = |line: &str| -> serde_json::Value {
        writer.write_all(format!("{line}\n").as_bytes()).unwrap();
        let mut reply = String::new();
        reader.read_line(&mut reply).unwrap();
        serde_json::from_str(&reply).unwrap_or_else(|e| panic!("{e}: {reply}"))
    };
    let refused = |v: &serde_json::Value, words: &str| {
        assert_eq!(v["error"]["kind"], "bad_request", "{v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(words), "expected '{words}' in: {msg}");
    };
    refused(&ask("this is not json"), "malformed request");
    refused(
        &ask(r#"{"version": 1, "request": {"op": "pool_destroy", "name": "tank", "now": true}}"#),
        "unknown field",
    );
    refused(
        &ask(r#"{"version": 1, "request": {"op": "pool_export", "name": 7}}"#),
        "invalid type",
    );
    refused(
        &ask(r#"{"version": 1, "request": {"op": "pool_explode", "name": "tank"}}"#),
        "unknown variant",
    );
    refused(
        &ask(r#"{"version": 2, "request": {"op": "pool_teleport"}}"#),
        "API version 2",
    );
    refused(
        &ask(r#"{"version": 2, "request": {"op": "hello"}}"#),
        "API version 2",
    );
    // Nothing changed, and the connection still serves.
    let hello = ask(r#"{"version": 1, "request": {"op": "hello"}}"#);
    assert_eq!(hello["ok"]["response"]["type"], "hello", "{hello}");
    assert_eq!(hello["ok"]["response"]["data"]["api_version"], 1, "{hello}");
    assert_eq!(hello["ok"]["response"]["data"]["daemon"], true, "{hello}");
    let pools = ask(r#"{"version": 1, "request": {"op": "pool_list"}}"#);
    let list = pools["ok"]["response"]["data"].as_array().unwrap();
    assert_eq!(list.len(), 1, "{pools}");
    assert_eq!(list[0]["name"], "tank", "{pools}");
    assert_eq!(list[0]["health"], "ONLINE", "{pools}");
    // A request for something that is not there: its own kind, mapped for every client.
    let missing = ask(r#"{"version": 1, "request": {"op": "pool_status", "name": "nosuch"}}"#);
    assert_eq!(missing["error"]["kind"], "not_found", "{missing}");
    let out = env.fails(&["pool", "status", "nosuch"], "no such pool");
    assert!(out.contains("tank: cannot open 'nosuch'"), "{out}");
}

/// A short benchmark run's options, figures as JSON.
const SMALL_BENCH: [&str; 7] = [
    "--runs",
    "1",
    "--files",
    "200",
    "--tree-files",
    "40",
    "--json",
];

/// `tank bench --dataset`: the benchmark of a mounted filesystem runs in the daemon as a
/// job; the command follows its progress, records and prints its figures, and Ctrl-C
/// cancels it, its files removed; while it runs its dataset cannot be destroyed.
#[test]
fn a_dataset_bench_is_a_daemon_job_with_progress_that_ctrl_c_cancels() {
    if let Some(why) = common::fuse_missing() {
        common::skip(
            "a_dataset_bench_is_a_daemon_job_with_progress_that_ctrl_c_cancels",
            why,
        );
        return;
    }
    let env = Env::new();
    // Without a daemon there is nothing to run the job.
    env.fails(
        &["bench", "--dataset", "tank/bench"],
        "is a job of the daemon: start it (tank serve)",
    );
    let _d = serve(&env);
    env.ok(&["dataset", "create", "tank/bench"]);
    let mnt = env.path("data/mnt/tank/bench");
    std::fs::write(mnt.join("keep"), b"user data").unwrap();
    let entries = || -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&mnt)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    env.fails(
        &["bench", "--dataset", "tank/nosuch", "--size", "16M"],
        "does not exist",
    );

    let args = ["bench", "--dataset", "tank/bench", "--size", "16M"];
    let out = env.ok(&[&args[..], &SMALL_BENCH].concat());
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["label"], "tank/bench", "{v}");
    assert_eq!(v["size"], 16 << 20, "{v}");
    for fig in [
        "seq_output_block_mb_s",
        "rewrite_mb_s",
        "seq_input_block_mb_s",
        "random_seeks_per_s",
        "seq_create_per_s",
        "seq_stat_per_s",
        "seq_delete_per_s",
        "tree_copy_in_mb_s",
        "tree_copy_out_mb_s",
        "tree_delete_files_per_s",
    ] {
        let x = v["summary"]["median"][fig].as_f64().unwrap();
        assert!(x > 0.0 && x.is_finite(), "{fig}: {v}");
    }
    let history = env.ok(&["bench", "--compare"]);
    assert!(history.contains("tank/bench"), "{history}");
    assert_eq!(entries(), ["keep"], "the benchmark's files are gone");

    // A long one, followed, then stopped with Ctrl-C.
    let mut child = Command::new(env!("CARGO_BIN_EXE_tank"))
        .args([
            "bench",
            "--dataset",
            "tank/bench",
            "--size",
            "1G",
            "--runs",
            "3",
        ])
        .env("TANK_DATA_DIR", env.path("data"))
        .current_dir(env.dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !seen.iter().any(|l: &String| l.contains(" moved at ")) {
        assert!(
            std::time::Instant::now() < deadline,
            "no progress: {seen:?}"
        );
        if let Ok(l) = rx.recv_timeout(std::time::Duration::from_millis(200)) {
            seen.push(l);
        }
    }
    assert!(
        seen[0].contains("benchmarking 'tank/bench' in the background: job"),
        "{seen:?}"
    );
    let progress = seen.iter().find(|l| l.contains(" moved at ")).unwrap();
    assert!(progress.contains("% done"), "{progress}");
    // Held by the job: a destroy is refused, and the dataset stays mounted.
    env.fails(&["dataset", "destroy", "tank/bench"], "busy");
    assert!(mnt.join("keep").exists());
    let _ = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    // The reader thread may still hold the last lines: take them until the pipe closes.
    let mut rest = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        match rx.recv_timeout(std::time::Duration::from_millis(200)) {
            Ok(l) => rest.push(l),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    assert!(rest.iter().any(|l| l.contains("canceling job")), "{rest:?}");
    assert!(rest.iter().any(|l| l.contains("canceled")), "{rest:?}");
    assert_eq!(
        entries(),
        ["keep"],
        "a canceled benchmark removes its files"
    );
    assert_eq!(std::fs::read(mnt.join("keep")).unwrap(), b"user data");
    // The dataset is free again.
    env.ok(&["dataset", "destroy", "tank/bench"]);

    // An emulated build, measured by the daemon on a pool it makes and removes.
    env.fails(
        &["bench", "--emulate", "4x floppy raidz1", "--daemon"],
        "cannot benchmark '4x floppy raidz1'",
    );
    let args = [
        "bench",
        "--emulate",
        "4x ssd raidz1",
        "--daemon",
        "--size",
        "32M",
    ];
    let out = env.ok(&[&args[..], &SMALL_BENCH].concat());
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["label"], "emulated 4x ssd raidz1", "{v}");
    assert_eq!(v["size"], 32 << 20, "{v}");
    let write = v["summary"]["median"]["seq_output_block_mb_s"]
        .as_f64()
        .unwrap();
    assert!(write > 0.0 && write.is_finite(), "{v}");
    let left: Vec<String> = std::fs::read_dir(env.path("data"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("emulate"))
        .collect();
    assert!(left.is_empty(), "the emulated pool's files stay: {left:?}");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let prefix = format!("{}/emulate-", env.path("data").display());
    assert!(
        !mounts.contains(&prefix),
        "the emulated filesystem stays mounted: {mounts}"
    );
    let history = env.ok(&["bench", "--compare"]);
    assert!(history.contains("emulated 4x ssd raidz1"), "{history}");
}
