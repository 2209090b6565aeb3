//! SMB as a real client uses it: smbclient against `tank serve --smb` on 127.0.0.1, which
//! runs Samba's smbd with the configuration and user files tank writes.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

struct Daemon {
    child: Child,
    port: u16,
    lines: mpsc::Receiver<String>,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        common::stop(&mut self.child);
    }
}

/// Starts `tank serve --smb 127.0.0.1:0`; returns once it listens, with smbd's port.
fn serve(data: &Path) -> Daemon {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tank"))
        .args(["serve", "--no-api", "--smb", "127.0.0.1:0"])
        .env("TANK_DATA_DIR", data)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    for out in [
        Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
    }
    let mut port = None;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("the daemon did not start");
        if let Some(a) = line.strip_prefix("smb: 127.0.0.1:") {
            port = a.trim().parse().ok();
        }
        assert!(!line.starts_with("warning: cannot serve SMB"), "{line}");
        if line.starts_with("listening on ") {
            break;
        }
    }
    Daemon {
        child,
        port: port.expect("the daemon printed its SMB address"),
        lines: rx,
    }
}

use common::tank;

/// smbclient on `share` as `user` (`None`: a guest) running `commands` in `dir`: its exit
/// status and its output.
fn smbclient(
    port: u16,
    share: &str,
    user: Option<(&str, &str)>,
    dir: &Path,
    commands: &str,
) -> (bool, String) {
    let mut cmd = Command::new("timeout");
    cmd.args([
        "60",
        "smbclient",
        "-s",
        "/dev/null",
        "-p",
        &port.to_string(),
        "-m",
        "SMB3",
    ])
    .arg(format!("//127.0.0.1/{share}"))
    .current_dir(dir);
    match user {
        Some((u, p)) => cmd.arg("-U").arg(format!("{u}%{p}")),
        None => cmd.arg("-N"),
    };
    let out = cmd.args(["-c", commands]).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // smbclient exits 0 after a command that failed: its NT_STATUS says so.
    (out.status.success() && !text.contains("NT_STATUS_"), text)
}

/// Waits (20 s at most) until `share` answers `user` on `port`: a share reaches smbd
/// within a second of its change.
fn wait_for_share(port: u16, share: &str, user: Option<(&str, &str)>, dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (ok, out) = smbclient(port, share, user, dir, "ls");
        if ok {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "share {share} never came on port {port}: {out}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// Why this test cannot run here, if it cannot.
fn missing() -> Option<String> {
    if let Some(why) = tank_smb::missing() {
        return Some(why);
    }
    if Command::new("smbclient").arg("--version").output().is_err() {
        return Some("smbclient is not installed (apt-get install smbclient)".into());
    }
    if let Some(why) = common::fuse_missing() {
        return Some(format!("SMB serves the datasets' FUSE mounts: {why}"));
    }
    if !nix::unistd::geteuid().is_root() {
        return Some("smbd serves each user as its uid: the test must run as root".into());
    }
    None
}

/// The start of a test: `None` (the test recorded as skipped, with why) where SMB cannot
/// be served here; else a temporary directory holding tank's data directory and a work
/// directory for smbclient's files, and the daemon serving SMB on that data directory.
fn start(name: &str) -> Option<(tempfile::TempDir, PathBuf, PathBuf, Daemon)> {
    if let Some(why) = missing() {
        common::skip(name, &why);
        return None;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let work = tmp.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let d = serve(&data);
    Some((tmp, data, work, d))
}

/// The smbclient workout: accounts and their passwords, users and groups of a share,
/// guests, read-only shares, large files both ways, the same files through the local
/// mount, a password change and a share change taking effect live, smbd killed and
/// started again by tank.
#[test]
fn smbclient_workout() {
    const NAME: &str = "smbclient_workout";
    let Some((_tmp, data, work, d)) = start(NAME) else {
        return;
    };
    tank(&data, &["group", "add", "staff"], None);
    tank(
        &data,
        &["user", "add", "alice", "--group", "staff"],
        Some("alice-pass-1\n"),
    );
    tank(&data, &["user", "add", "bob"], Some("bob-pass-11\n"));
    for ds in ["tank/docs", "tank/ro", "tank/pub"] {
        tank(&data, &["dataset", "create", ds], None);
    }
    tank(
        &data,
        &[
            "share",
            "add",
            "smb",
            "docs",
            "tank/docs",
            "-o",
            "users=alice",
        ],
        None,
    );
    tank(
        &data,
        &[
            "share",
            "add",
            "smb",
            "ro",
            "tank/ro",
            "-o",
            "groups=staff",
            "-o",
            "ro=on",
        ],
        None,
    );
    tank(
        &data,
        &["share", "add", "smb", "pub", "tank/pub", "-o", "guest=on"],
        None,
    );
    // The share's directory is alice's (a new dataset's root is root's, mode 0755, and
    // SMB writes as the account: its owner is the administrator's to give).
    let mount = data.join("mnt/tank/docs");
    std::os::unix::fs::chown(&mount, Some(1000), Some(1000)).unwrap();
    let alice = Some(("alice", "alice-pass-1"));
    wait_for_share(d.port, "docs", alice, &work);

    // Put, list, get, rename, mkdir, delete.
    std::fs::write(work.join("hello.txt"), b"hello over SMB\n").unwrap();
    let (ok, out) = smbclient(
        d.port,
        "docs",
        alice,
        &work,
        "put hello.txt; mkdir sub; put hello.txt sub/copy.txt; rename hello.txt renamed.txt; ls; get renamed.txt back.txt",
    );
    assert!(ok, "{out}");
    assert!(out.contains("renamed.txt") && out.contains("sub"), "{out}");
    assert_eq!(
        std::fs::read(work.join("back.txt")).unwrap(),
        b"hello over SMB\n"
    );
    let meta = std::fs::metadata(mount.join("renamed.txt")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(meta.uid(), 1000, "a file written over SMB is alice's");
    let (ok, out) = smbclient(
        d.port,
        "docs",
        alice,
        &work,
        "del sub/copy.txt; rmdir sub; ls",
    );
    assert!(ok && !out.contains(" sub "), "{out}");
    assert!(!mount.join("sub").exists());

    // The local mount's files are the share's, and the other way round.
    std::fs::write(mount.join("from-mount.txt"), b"written locally").unwrap();
    let (ok, out) = smbclient(d.port, "docs", alice, &work, "get from-mount.txt fm.txt");
    assert!(ok, "{out}");
    assert_eq!(
        std::fs::read(work.join("fm.txt")).unwrap(),
        b"written locally"
    );

    // 48 MiB both ways, compared.
    let big = work.join("big.bin");
    random_file(&big, 48, 0x9e37_79b9_7f4a_7c15);
    let (ok, out) = smbclient(
        d.port,
        "docs",
        alice,
        &work,
        "put big.bin; get big.bin big-back.bin",
    );
    assert!(ok, "{out}");
    assert_eq!(sha256(&big), sha256(&work.join("big-back.bin")));
    assert_eq!(
        sha256(&big),
        sha256(&mount.join("big.bin")),
        "the same bytes in the mount"
    );

    // Refusals: a wrong password, a user not of the share, a guest where none is allowed,
    // a write to a read-only share.
    let (ok, out) = smbclient(d.port, "docs", Some(("alice", "wrong-pass")), &work, "ls");
    assert!(!ok && out.contains("NT_STATUS_LOGON_FAILURE"), "{out}");
    let (ok, out) = smbclient(d.port, "docs", Some(("bob", "bob-pass-11")), &work, "ls");
    assert!(!ok && out.contains("NT_STATUS_ACCESS_DENIED"), "{out}");
    let (ok, out) = smbclient(d.port, "docs", None, &work, "ls");
    assert!(!ok, "a guest on a share without guests: {out}");
    let (ok, out) = smbclient(d.port, "pub", None, &work, "ls");
    assert!(ok, "a guest where guests are allowed: {out}");
    let (ok, out) = smbclient(d.port, "ro", alice, &work, "ls");
    assert!(ok, "alice is of staff: {out}");
    let (ok, out) = smbclient(d.port, "ro", alice, &work, "put hello.txt");
    assert!(
        !ok && (out.contains("NT_STATUS_ACCESS_DENIED")
            || out.contains("NT_STATUS_MEDIA_WRITE_PROTECTED")),
        "{out}"
    );
    let (ok, out) = smbclient(d.port, "ro", Some(("bob", "bob-pass-11")), &work, "ls");
    assert!(!ok, "bob is not of staff: {out}");

    // A snapshot named by its time is a Previous Version of the files it holds.
    tank(
        &data,
        &["snapshot", "tank/docs@GMT-2026.11.27-10.00.00"],
        None,
    );
    std::fs::write(mount.join("renamed.txt"), b"changed after the snapshot").unwrap();
    let (ok, out) = smbclient(d.port, "docs", alice, &work, "allinfo renamed.txt");
    assert!(ok && out.contains("@GMT-2026.11.27-10.00.00"), "{out}");
    let (ok, out) = smbclient(
        d.port,
        "docs",
        alice,
        &work,
        "get @GMT-2026.11.27-10.00.00/renamed.txt old.txt",
    );
    assert!(ok, "{out}");
    assert_eq!(
        std::fs::read(work.join("old.txt")).unwrap(),
        b"hello over SMB\n"
    );

    // A snapshot schedule: one is taken at once (none yet this hour), and the oldest of
    // the Previous Versions form beyond the two kept go; other snapshots stay.
    for snap in ["tank/docs@GMT-2026.11.26-10.00.00", "tank/docs@manual"] {
        tank(&data, &["snapshot", snap], None);
    }
    tank(
        &data,
        &["share", "set", "docs", "snapshot_schedule=hourly:2"],
        None,
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let list = tank(
            &data,
            &[
                "dataset",
                "list",
                "-r",
                "-t",
                "snapshot",
                "-H",
                "-o",
                "name",
                "tank/docs",
            ],
            None,
        );
        let names: Vec<&str> = list.lines().map(str::trim).collect();
        let scheduled = names
            .iter()
            .filter(|n| {
                n.starts_with("tank/docs@GMT-")
                    && !n.ends_with("2026.11.26-10.00.00")
                    && !n.ends_with("2026.11.27-10.00.00")
            })
            .count();
        if scheduled == 1
            && !names.contains(&"tank/docs@GMT-2026.11.26-10.00.00")
            && names.contains(&"tank/docs@GMT-2026.11.27-10.00.00")
            && names.contains(&"tank/docs@manual")
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the schedule did not run: {list}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let bad = Command::new(env!("CARGO_BIN_EXE_tank"))
        .args(["share", "set", "docs", "snapshot_schedule=minutely"])
        .env("TANK_DATA_DIR", &data)
        .output()
        .unwrap();
    assert!(
        !bad.status.success()
            && String::from_utf8_lossy(&bad.stderr).contains("15min, hourly, daily or weekly"),
        "{bad:?}"
    );
    tank(
        &data,
        &["share", "set", "docs", "snapshot_schedule=off"],
        None,
    );

    // Each share's state: served, or not and why.
    tank(
        &data,
        &["dataset", "create", "-o", "mountpoint=none", "tank/nomount"],
        None,
    );
    tank(
        &data,
        &["share", "add", "smb", "nomount", "tank/nomount"],
        None,
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let list: serde_json::Value =
            serde_json::from_str(&tank(&data, &["share", "list", "--json"], None)).unwrap();
        let state = |n: &str| {
            list.as_array()
                .unwrap()
                .iter()
                .find(|s| s["name"] == n)
                .and_then(|s| s["state"].as_str())
                .unwrap_or_default()
                .to_string()
        };
        if state("docs") == "served" && state("nomount").contains("not mounted") {
            break;
        }
        assert!(Instant::now() < deadline, "states: {list}");
        std::thread::sleep(Duration::from_millis(300));
    }

    // A Time Machine share without a size of its own is told its dataset's quota.
    tank(
        &data,
        &["dataset", "create", "-o", "quota=64M", "tank/tm"],
        None,
    );
    tank(
        &data,
        &[
            "share",
            "add",
            "smb",
            "tm",
            "tank/tm",
            "-o",
            "timemachine=on",
        ],
        None,
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let conf = std::fs::read_to_string(data.join("smb/smb.conf")).unwrap_or_default();
        if conf.contains("[tm]") && conf.contains("fruit:time machine max size = 67108864") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the quota never reached smb.conf: {conf}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }

    // A password change counts at the next login.
    tank(&data, &["user", "passwd", "alice"], Some("alice-pass-2\n"));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (ok_new, _) = smbclient(d.port, "docs", Some(("alice", "alice-pass-2")), &work, "ls");
        let (ok_old, _) = smbclient(d.port, "docs", alice, &work, "ls");
        if ok_new && !ok_old {
            break;
        }
        assert!(Instant::now() < deadline, "the new password never took");
        std::thread::sleep(Duration::from_millis(300));
    }
    let alice = Some(("alice", "alice-pass-2"));

    // A share change counts at once: docs made read-only refuses the next write.
    tank(&data, &["share", "set", "docs", "ro=on"], None);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (ok, _) = smbclient(d.port, "docs", alice, &work, "put hello.txt after-ro.txt");
        if !ok {
            break;
        }
        assert!(Instant::now() < deadline, "docs never became read-only");
        std::thread::sleep(Duration::from_millis(300));
    }
    tank(&data, &["share", "set", "docs", "ro=off"], None);

    // smbd killed: tank starts it again, and the share serves on.
    let conf = data.join("smb/smb.conf");
    let killed = Command::new("pkill")
        .args(["-KILL", "-f", &format!("smbd.*{}", conf.display())])
        .status()
        .unwrap();
    assert!(killed.success(), "no smbd of ours to kill");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (ok, _) = smbclient(d.port, "docs", alice, &work, "ls");
        if ok {
            break;
        }
        assert!(Instant::now() < deadline, "smbd was not started again");
        std::thread::sleep(Duration::from_millis(300));
    }
    let mut restarted = false;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !restarted && Instant::now() < deadline {
        if let Ok(l) = d.lines.recv_timeout(Duration::from_millis(200)) {
            restarted = l.contains("starting it again");
        }
    }
    assert!(restarted, "tank said nothing of the restart");
    let events = tank(&data, &["pool", "events", "tank"], None);
    assert!(
        events.contains("smb.restart") && events.contains("started again"),
        "the restart is not among the pool's events: {events}"
    );
    // A dataset renamed while shared: the share follows it to its new mount.
    tank(
        &data,
        &["dataset", "rename", "tank/docs", "tank/papers"],
        None,
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (ok, out) = smbclient(
            d.port,
            "docs",
            alice,
            &work,
            "get renamed.txt after-rename.txt",
        );
        if ok {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the share did not follow the rename: {out}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(
        std::fs::read(work.join("after-rename.txt")).unwrap(),
        b"changed after the snapshot"
    );

    // Nothing of Samba's outside the data directory.
    assert!(data.join("smb/private/smbpasswd").exists());
    let text = std::fs::read_to_string(&conf).unwrap();
    assert!(!text.contains("/etc/samba"), "{text}");
}

/// smbtorture's suites against `port`: each test's outcome by (suite, test).
fn torture(port: u16, suites: &[(&str, &str)]) -> BTreeMap<(String, String), String> {
    let mut out = BTreeMap::new();
    for (share, suite) in suites {
        let run = Command::new("timeout")
            .args(["300", "smbtorture"])
            .arg(format!("//127.0.0.1/{share}"))
            .args(["-p", &port.to_string(), "-U", "alice%alice-pass-1", suite])
            .output()
            .unwrap();
        for line in String::from_utf8_lossy(&run.stdout).lines() {
            let Some((outcome, rest)) = line.split_once(": ") else {
                continue;
            };
            if matches!(outcome, "success" | "failure" | "error" | "skip") {
                let test = rest.split_whitespace().next().unwrap_or_default();
                out.insert((suite.to_string(), test.to_string()), outcome.to_string());
            }
        }
    }
    out
}

/// Samba's smbd on tank's generated configuration, its shares' paths moved to plain
/// directories under `dir` (the host's file system), on `port`: the peer tank is held to.
fn peer_smbd(data: &Path, dir: &Path, port: u16) -> Daemonless {
    let peer = dir.join("peer-smb");
    let mnt = data.join("mnt/tank");
    let shares = dir.join("peer-shares");
    tank_bench::run::smb::make_peer(&data.join("smb"), &peer, port, |path| {
        let rel = Path::new(path)
            .strip_prefix(&mnt)
            .expect("a share of a dataset under tank");
        let d = shares.join(rel);
        std::fs::create_dir_all(&d).unwrap();
        std::os::unix::fs::chown(&d, Some(1000), Some(100)).unwrap();
        d
    })
    .unwrap();
    let child = tank_smb::plain_smbd(&peer)
        .unwrap()
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Daemonless(child)
}

/// A process stopped with its process group when dropped.
struct Daemonless(Child);

impl Drop for Daemonless {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", "--", &format!("-{}", self.0.id())])
            .status();
        let _ = self.0.wait();
    }
}

/// Tests that pass on Samba over the host's file system and not on tank, and why: FUSE
/// offers no SEEK_DATA/SEEK_HOLE here (the kernel's writeback cache may hold data the
/// server has not seen, so tank does not answer them), so allocated ranges are the whole
/// file; a copy-on-write file system reserves no blocks ahead, so a file's allocation
/// size is what it holds.
const BEHIND_THE_PEER: &[(&str, &str)] = &[
    ("smb2.ioctl", "sparse_punch"),
    ("smb2.ioctl", "sparse_qar_ob1"),
    ("smb2.ioctl", "sparse_copy_chunk"),
    ("smb2.durable-open", "alloc-size"),
];

/// The smbtorture suites run against tank's shares and against Samba serving plain
/// directories of the host's file system with the same configuration (docs/SMB.md has the
/// counts): macOS' (vfs.fruit, its file ids, Time Machine's volume size on a Time Machine
/// share) and the SMB2 basics (locks, reads and writes, creates, information, directories,
/// renames, streams, delete-on-close, ioctls, durable handles, ACLs, compounds, share
/// modes, file ids, timestamps). Every test the peer passes must pass on tank, but for the
/// few listed with their reason.
#[test]
fn smbtorture_subset() {
    const NAME: &str = "smbtorture_subset";
    if Command::new("smbtorture")
        .arg("--version")
        .output()
        .is_err()
    {
        return common::skip(
            NAME,
            "smbtorture is not installed (apt-get install samba-testsuite)",
        );
    }
    let Some((tmp, data, work, d)) = start(NAME) else {
        return;
    };
    tank(&data, &["user", "add", "alice"], Some("alice-pass-1\n"));
    for (ds, share, extra) in [
        ("tank/t", "t", vec![]),
        (
            "tank/tm",
            "tm",
            vec!["-o", "timemachine=on", "-o", "timemachine_quota=32K"],
        ),
    ] {
        tank(&data, &["dataset", "create", ds], None);
        let dir = data.join("mnt").join(ds);
        std::os::unix::fs::chown(&dir, Some(1000), Some(100)).unwrap();
        let mut args = vec!["share", "add", "smb", share, ds, "-o", "users=alice"];
        args.extend(extra);
        tank(&data, &args, None);
    }
    let work = work.as_path();
    wait_for_share(d.port, "tm", Some(("alice", "alice-pass-1")), work);
    let suites: &[(&str, &str)] = &[
        ("t", "vfs.fruit"),
        ("t", "vfs.fruit_file_id"),
        ("tm", "vfs.fruit_timemachine"),
        ("t", "smb2.lock"),
        ("t", "smb2.read"),
        ("t", "smb2.rw"),
        ("t", "smb2.create"),
        ("t", "smb2.getinfo"),
        ("t", "smb2.dir"),
        ("t", "smb2.rename"),
        ("t", "smb2.streams"),
        ("t", "smb2.delete-on-close-perms"),
        ("t", "smb2.ioctl"),
        ("t", "smb2.durable-open"),
        ("t", "smb2.durable-v2-open"),
        ("t", "smb2.acls"),
        ("t", "smb2.compound"),
        ("t", "smb2.sharemode"),
        ("t", "smb2.fileid"),
        ("t", "smb2.timestamps"),
    ];
    let ours = torture(d.port, suites);
    let peer_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let theirs = {
        let _peer = peer_smbd(&data, tmp.path(), peer_port);
        wait_for_share(peer_port, "tm", Some(("alice", "alice-pass-1")), work);
        torture(peer_port, suites)
    };
    let mut report = String::new();
    let count = |m: &BTreeMap<(String, String), String>, suite: &str| {
        let of = |o: &str| {
            m.iter()
                .filter(|((s, _), v)| s == suite && v.as_str() == o)
                .count()
        };
        (of("success"), of("failure") + of("error"))
    };
    for (_, suite) in suites {
        let (p, f) = count(&ours, suite);
        let (pp, pf) = count(&theirs, suite);
        report.push_str(&format!(
            "{suite}: tank {p} passed, {f} failed; Samba on the host file system {pp} passed, {pf} failed\n"
        ));
    }
    let passed = |m: &BTreeMap<(String, String), String>| {
        m.values().filter(|v| v.as_str() == "success").count()
    };
    let behind: Vec<String> = theirs
        .iter()
        .filter(|(k, v)| {
            v.as_str() == "success"
                && ours.get(*k).map(String::as_str) != Some("success")
                && !BEHIND_THE_PEER.contains(&(k.0.as_str(), k.1.as_str()))
        })
        .map(|((s, t), _)| {
            format!(
                "{s} {t}: {}",
                ours.get(&(s.clone(), t.clone()))
                    .map_or("not run", String::as_str)
            )
        })
        .collect();
    eprintln!(
        "{report}smbtorture: tank {} passed, Samba on the host file system {} passed",
        passed(&ours),
        passed(&theirs)
    );
    assert!(
        passed(&theirs) > 0 && passed(&ours) >= 200,
        "too few smbtorture tests pass:\n{report}"
    );
    assert!(
        behind.is_empty(),
        "tests that pass on Samba over the host file system fail on tank:\n{}\n{report}",
        behind.join("\n")
    );
}

/// Asserts that two files hold the same bytes (by SHA-256).
fn assert_same(a: &Path, b: &Path) {
    assert_eq!(
        sha256(a),
        sha256(b),
        "{} and {} differ",
        a.display(),
        b.display()
    );
}

/// Writes `mib` MiB of pseudo-random bytes (seeded) to `path`.
fn random_file(path: &Path, mib: usize, seed: u64) {
    let mut f = std::fs::File::create(path).unwrap();
    let mut x: u64 = seed | 1;
    let mut buf = vec![0u8; 1 << 20];
    for _ in 0..mib {
        for b in buf.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        f.write_all(&buf).unwrap();
    }
}

/// Faults under a share, each answered with a clean error and no acknowledged data lost:
/// a write past the dataset's quota, a client gone mid-write, a pool that lost a disk
/// (DEGRADED), and a dataset destroyed while a client is connected.
#[test]
fn smb_faults() {
    const NAME: &str = "smb_faults";
    let Some((_tmp, data, work, d)) = start(NAME) else {
        return;
    };
    tank(&data, &["user", "add", "alice"], Some("alice-pass-1\n"));
    tank(
        &data,
        &["dataset", "create", "-o", "quota=8M", "tank/q"],
        None,
    );
    tank(&data, &["dataset", "create", "tank/gone"], None);
    for (ds, share) in [("tank/q", "q"), ("tank/gone", "gone")] {
        std::os::unix::fs::chown(data.join("mnt").join(ds), Some(1000), Some(100)).unwrap();
        tank(
            &data,
            &["share", "add", "smb", share, ds, "-o", "users=alice"],
            None,
        );
    }
    let alice = Some(("alice", "alice-pass-1"));
    let mount = data.join("mnt/tank/q");
    wait_for_share(d.port, "gone", alice, &work);
    random_file(&work.join("keep.bin"), 2, 1);
    random_file(&work.join("big.bin"), 24, 2);
    let (ok, out) = smbclient(d.port, "q", alice, &work, "put keep.bin");
    assert!(ok, "{out}");

    // Past the quota: the client is told the disk is full; what it was told was written
    // before is intact, and the share serves on.
    let (ok, out) = smbclient(d.port, "q", alice, &work, "put big.bin");
    assert!(
        !ok && out.contains("NT_STATUS_DISK_FULL"),
        "a write past the quota: {out}"
    );
    let written = std::fs::metadata(mount.join("big.bin")).unwrap().len();
    assert!(written <= 8 << 20, "{written} bytes past an 8M quota");
    assert_same(&work.join("keep.bin"), &mount.join("keep.bin"));
    // Room again once the partial file is gone (its blocks are free a txg later).
    let (ok, out) = smbclient(d.port, "q", alice, &work, "del big.bin");
    assert!(ok, "{out}");
    random_file(&work.join("fits.bin"), 3, 3);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (ok, out) = smbclient(d.port, "q", alice, &work, "put fits.bin");
        if ok {
            break;
        }
        assert!(
            out.contains("NT_STATUS_DISK_FULL") && Instant::now() < deadline,
            "{out}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let (ok, out) = smbclient(d.port, "q", alice, &work, "get fits.bin fits-back.bin");
    assert!(ok, "{out}");
    assert_same(&work.join("fits.bin"), &work.join("fits-back.bin"));

    // A client gone mid-write: the server serves on, the other files are intact, and the
    // file can be written whole again.
    tank(&data, &["dataset", "set", "quota=none", "tank/q"], None);
    random_file(&work.join("huge.bin"), 256, 4);
    let mut client = Command::new("smbclient")
        .args(["-s", "/dev/null", "-p", &d.port.to_string(), "-m", "SMB3"])
        .arg("//127.0.0.1/q")
        .args(["-U", "alice%alice-pass-1", "-c", "put huge.bin"])
        .current_dir(&work)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::metadata(mount.join("huge.bin")).map_or(0, |m| m.len()) < 8 << 20 {
        assert!(Instant::now() < deadline, "the upload never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    client.kill().unwrap();
    client.wait().unwrap();
    assert_same(&work.join("keep.bin"), &mount.join("keep.bin"));
    let (ok, out) = smbclient(
        d.port,
        "q",
        alice,
        &work,
        "put huge.bin; get huge.bin huge-back.bin",
    );
    assert!(ok, "{out}");
    assert_same(&work.join("huge.bin"), &work.join("huge-back.bin"));
    assert_same(&work.join("huge.bin"), &mount.join("huge.bin"));

    // A disk lost: the pool is DEGRADED and the share serves on, reads and writes whole.
    let disk = data.join("devices/disk5");
    tank(
        &data,
        &["pool", "offline", "tank", &disk.to_string_lossy()],
        None,
    );
    let status = tank(&data, &["pool", "status", "tank"], None);
    assert!(status.contains("DEGRADED"), "{status}");
    random_file(&work.join("degraded.bin"), 16, 5);
    let (ok, out) = smbclient(
        d.port,
        "q",
        alice,
        &work,
        "put degraded.bin; get huge.bin huge-degraded.bin",
    );
    assert!(ok, "{out}");
    assert_same(&work.join("huge.bin"), &work.join("huge-degraded.bin"));
    assert_same(&work.join("degraded.bin"), &mount.join("degraded.bin"));
    tank(
        &data,
        &["pool", "online", "tank", &disk.to_string_lossy()],
        None,
    );

    // A dataset destroyed while a client is connected: the client's next requests fail
    // cleanly, the share says why it is not served, and the other share serves on.
    let mut session = Command::new("smbclient")
        .args(["-s", "/dev/null", "-p", &d.port.to_string(), "-m", "SMB3"])
        .arg("//127.0.0.1/gone")
        .args(["-U", "alice%alice-pass-1"])
        .current_dir(&work)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = session.stdin.take().unwrap();
    writeln!(stdin, "put keep.bin").unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !data.join("mnt/tank/gone/keep.bin").exists() {
        assert!(Instant::now() < deadline, "the session's put never landed");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Refused while in use, as zfs destroy refuses a busy dataset; forced, it goes.
    let destroy = |force: bool| {
        let mut args = vec!["dataset", "destroy"];
        if force {
            args.push("-f");
        }
        args.push("tank/gone");
        let out = Command::new(env!("CARGO_BIN_EXE_tank"))
            .args(&args)
            .env("TANK_DATA_DIR", &data)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let (ok, out) = destroy(false);
    assert!(!ok && out.contains("busy"), "destroyed while in use: {out}");
    let (ok, out) = destroy(true);
    assert!(ok, "a forced destroy: {out}");
    assert!(
        !data.join("mnt/tank/gone").exists(),
        "the destroyed dataset's mountpoint is left behind"
    );
    writeln!(stdin, "put keep.bin again.bin").unwrap();
    writeln!(stdin, "ls").unwrap();
    writeln!(stdin, "exit").unwrap();
    drop(stdin);
    let session = session.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&session.stdout),
        String::from_utf8_lossy(&session.stderr)
    );
    assert!(
        text.contains("NT_STATUS_") && !text.contains("as \\again.bin"),
        "the connected client after its dataset was destroyed: {text}"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (ok, out) = smbclient(d.port, "gone", alice, &work, "ls");
        assert!(!ok, "{out}");
        let list = tank(&data, &["share", "list"], None);
        // The share goes with its dataset.
        let shared = list
            .lines()
            .any(|l| l.split_whitespace().next() == Some("gone"));
        if out.contains("NT_STATUS_BAD_NETWORK_NAME") && !shared {
            break;
        }
        assert!(Instant::now() < deadline, "{out}\n{list}");
        std::thread::sleep(Duration::from_millis(300));
    }
    let (ok, out) = smbclient(d.port, "q", alice, &work, "get keep.bin keep-after.bin");
    assert!(ok, "{out}");
    assert_same(&work.join("keep.bin"), &work.join("keep-after.bin"));
}

/// A pool that goes SUSPENDED under a share (its one device on a file system that fills
/// up): the client's requests fail cleanly, and once the device has room again the pool
/// is exported and imported, and what was committed before is served whole.
#[test]
fn smb_pool_suspended() {
    const NAME: &str = "smb_pool_suspended";
    let Some((tmp, data, work, d)) = start(NAME) else {
        return;
    };
    let tiny = tmp.path().join("tiny");
    // The device's file system: a 40 MiB tmpfs, which a 64 MiB write fills.
    let Some(tiny_fs) = common::Tmpfs::mount(NAME, &tiny, "40M") else {
        return;
    };
    tank(&data, &["user", "add", "alice"], Some("alice-pass-1\n"));
    let device = tiny.join("d0");
    tank(
        &data,
        &[
            "pool",
            "create",
            "--size",
            "256M",
            "p2",
            &device.to_string_lossy(),
        ],
        None,
    );
    let mount = data.join("mnt/p2s");
    let mountpoint = format!("mountpoint={}", mount.display());
    tank(
        &data,
        &["dataset", "create", "-o", &mountpoint, "p2/s"],
        None,
    );
    if !mount.join(".tank").exists() {
        tank(&data, &["mount", "p2/s"], None);
    }
    std::os::unix::fs::chown(&mount, Some(1000), Some(100)).unwrap();
    tank(
        &data,
        &["share", "add", "smb", "s", "p2/s", "-o", "users=alice"],
        None,
    );
    let alice = Some(("alice", "alice-pass-1"));
    wait_for_share(d.port, "s", alice, &work);
    random_file(&work.join("small.bin"), 8, 7);
    random_file(&work.join("big.bin"), 64, 8);
    let (ok, out) = smbclient(d.port, "s", alice, &work, "put small.bin");
    assert!(ok, "{out}");
    // Committed: an fsync through the local mount.
    std::fs::File::open(mount.join("small.bin"))
        .unwrap()
        .sync_all()
        .unwrap();

    // More than the device's file system holds: the pool suspends when its txg is written.
    let _ = smbclient(d.port, "s", alice, &work, "put big.bin");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = tank(&data, &["pool", "status", "p2"], None);
        if status.contains("SUSPENDED") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the pool never suspended: {status}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let (ok, out) = smbclient(d.port, "s", alice, &work, "get small.bin s1.bin");
    assert!(
        !ok && out.contains("NT_STATUS_IO_DEVICE_ERROR"),
        "a read from a suspended pool: {out}"
    );
    let (ok, out) = smbclient(d.port, "s", alice, &work, "put small.bin again.bin");
    assert!(
        !ok && out.contains("NT_STATUS_"),
        "a write to a suspended pool: {out}"
    );

    // The device gets room; the pool is exported and imported, and serves again.
    tiny_fs.resize("512M");
    let out = tank(&data, &["pool", "export", "p2"], None);
    assert!(out.contains("suspended"), "{out}");
    tank(
        &data,
        &["pool", "import", "-d", &tiny.to_string_lossy(), "p2"],
        None,
    );
    let status = tank(&data, &["pool", "status", "p2"], None);
    assert!(status.contains("ONLINE"), "{status}");
    if !mount.join(".tank").exists() {
        tank(&data, &["mount", "p2/s"], None);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (ok, out) = smbclient(d.port, "s", alice, &work, "get small.bin back.bin");
        if ok {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the share never came back: {out}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_same(&work.join("small.bin"), &work.join("back.bin"));
    let (ok, out) = smbclient(
        d.port,
        "s",
        alice,
        &work,
        "put small.bin after.bin; get after.bin after-back.bin",
    );
    assert!(ok, "{out}");
    assert_same(&work.join("small.bin"), &work.join("after-back.bin"));
}
