//! `tank send` and `tank receive` as a user runs them: between two hosts' data directories
//! (each with its daemon), through a pipe and over SSH (the system's sshd, started here on
//! 127.0.0.1), compared by a walker over both mounted filesystems; and receives killed with
//! SIGKILL midway (the receiving command, then the daemon), after which the target is as it
//! was before.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn tank(data: &Path, args: &[&str]) -> String {
    common::tank(data, args, None)
}

fn tank_fails(data: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tank"))
        .args(args)
        .env("TANK_DATA_DIR", data)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success(), "tank {args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        common::stop(&mut self.0);
    }
}

fn serve(data: &Path) -> Daemon {
    let (child, _, lines) =
        common::serve_until_listening(data, &["serve", "--api", "127.0.0.1:0"], "api: ");
    eprintln!("{}", lines.join("\n"));
    Daemon(child)
}

fn kill9(d: Daemon) {
    let mut d = std::mem::ManuallyDrop::new(d);
    let _ = d.0.kill();
    let _ = d.0.wait();
}

/// `tank send ARGS` on `from` piped into `tank receive ARGS` on `to`; both must succeed.
/// Returns the receive's standard output and error.
fn pipe(from: &Path, send: &[&str], to: &Path, receive: &[&str]) -> (String, String) {
    let mut s = Command::new(env!("CARGO_BIN_EXE_tank"))
        .args(send)
        .env("TANK_DATA_DIR", from)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let r = Command::new(env!("CARGO_BIN_EXE_tank"))
        .args(receive)
        .env("TANK_DATA_DIR", to)
        .stdin(s.stdout.take().unwrap())
        .output()
        .unwrap();
    let sent = s.wait_with_output().unwrap();
    assert!(
        sent.status.success(),
        "tank {send:?}: {}",
        String::from_utf8_lossy(&sent.stderr)
    );
    let (out, err) = (
        String::from_utf8_lossy(&r.stdout).into_owned(),
        String::from_utf8_lossy(&r.stderr).into_owned(),
    );
    assert!(r.status.success(), "tank {receive:?}: {out}{err}");
    (out, err)
}

/// What a walker sees of one path: kind and permission bits, owner, links, size, blocks,
/// modification time, symlink target, extended attributes and a hash of the contents.
type Walk = BTreeMap<String, String>;

fn xattrs(p: &Path) -> String {
    let out = Command::new("getfattr")
        .args(["-h", "-d", "-m", "-", "--absolute-names"])
        .arg(p)
        .output()
        .expect("getfattr (Debian's attr) runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .collect::<Vec<_>>()
        .join(",")
}

fn walk(root: &Path) -> Walk {
    let mut out = Walk::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        for name in names {
            if rel.as_os_str().is_empty() && name == ".tank" {
                continue;
            }
            let r = rel.join(&name);
            let p = root.join(&r);
            let m = std::fs::symlink_metadata(&p).unwrap();
            let mut what = format!(
                "mode={:o} uid={} gid={} nlink={} size={} blocks={} mtime={}.{} xattrs=[{}]",
                m.mode(),
                m.uid(),
                m.gid(),
                m.nlink(),
                if m.is_dir() { 0 } else { m.size() },
                if m.is_file() { m.blocks() } else { 0 },
                m.mtime(),
                m.mtime_nsec(),
                xattrs(&p)
            );
            if m.file_type().is_symlink() {
                what += &format!(" -> {}", std::fs::read_link(&p).unwrap().display());
            } else if m.is_file() {
                let data = std::fs::read(&p).unwrap();
                what += &format!(" data={:016x}", xxhash(&data));
            } else if m.is_dir() {
                stack.push(r.clone());
            }
            out.insert(r.display().to_string(), what);
        }
    }
    out
}

/// FNV-1a over the bytes (enough to tell contents apart in a comparison).
fn xxhash(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in data {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn assert_same(a: &Walk, b: &Walk, what: &str) {
    assert!(!a.is_empty(), "{what}: nothing to compare");
    for (k, v) in a {
        assert_eq!(Some(v), b.get(k), "{what}: {k}");
    }
    for k in b.keys() {
        assert!(a.contains_key(k), "{what}: {k} only on the target");
    }
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|i| {
            if i % 4096 < 2048 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            } else {
                b"tank"[i % 4]
            }
        })
        .collect()
}

fn populate(dir: &Path, round: u64) {
    let d = dir.join(format!("round{round}"));
    std::fs::create_dir_all(d.join("deep/er")).unwrap();
    for i in 0..30u64 {
        std::fs::write(
            d.join(format!("f{i}")),
            pattern(round * 100 + i, 1000 + i as usize * 3000),
        )
        .unwrap();
    }
    std::fs::write(d.join("deep/er/big"), pattern(round, 6 << 20)).unwrap();
    // A sparse file: data, a 20 MiB hole, data.
    let mut f = std::fs::File::create(d.join("sparse")).unwrap();
    f.write_all(&pattern(round + 7, 100_000)).unwrap();
    f.set_len(20 << 20).unwrap();
    use std::io::Seek;
    f.seek(std::io::SeekFrom::End(0)).unwrap();
    f.write_all(&pattern(round + 8, 50_000)).unwrap();
    drop(f);
    std::os::unix::fs::symlink("deep/er/big", d.join("link")).unwrap();
    std::fs::hard_link(d.join("f1"), d.join("hard")).unwrap();
    std::fs::set_permissions(d.join("f2"), std::fs::Permissions::from_mode(0o4750)).unwrap();
    std::os::unix::fs::chown(d.join("f3"), Some(1234), Some(5678)).unwrap();
    let st = Command::new("setfattr")
        .args(["-n", "user.colour", "-v", "blue"])
        .arg(d.join("f4"))
        .status()
        .expect("setfattr (Debian's attr) runs");
    assert!(st.success());
}

fn change(dir: &Path, round: u64) {
    let prev = dir.join(format!("round{}", round - 1));
    std::fs::remove_file(prev.join("deep/er/big")).unwrap();
    std::fs::write(prev.join("f5"), b"rewritten").unwrap();
    std::fs::rename(prev.join("f6"), prev.join("f6-renamed")).unwrap();
    populate(dir, round);
}

/// A snapshot as its dataset's mount shows it: the state that was sent. (The live
/// directory may show times the kernel has not handed to the daemon yet.)
fn snap_dir(mount: &Path, snap: &str) -> PathBuf {
    mount.join(".tank/snapshot").join(snap)
}

/// Two hosts' data directories under `dir`, with pools `pa` and `pb` of one 1 GiB disk.
fn two_hosts(dir: &Path) -> (PathBuf, PathBuf) {
    let (a, b) = (dir.join("host-a"), dir.join("host-b"));
    for (data, pool) in [(&a, "pa"), (&b, "pb")] {
        std::fs::create_dir_all(data).unwrap();
        let dev = data.join("disk0");
        std::fs::File::create(&dev)
            .unwrap()
            .set_len(1 << 30)
            .unwrap();
        tank(data, &["pool", "create", pool, dev.to_str().unwrap()]);
    }
    (a, b)
}

/// Creates filesystem `ds` on `data` mounted at `dir`, and waits for the mount.
fn create_mounted(data: &Path, ds: &str, dir: &Path) {
    let mp = format!("mountpoint={}", dir.display());
    tank(data, &["dataset", "create", "-o", &mp, ds]);
    wait_for(&format!("{ds} to mount"), || {
        dir.read_dir().is_ok_and(|mut d| d.next().is_none()) || dir.join(".tank").exists()
    });
}

fn snapshot(data: &Path, name: &str) {
    tank(data, &["snapshot", name]);
}

/// An sshd of our own on 127.0.0.1, with a key pair made here; `None` (and why) when the
/// machine has no sshd.
struct Sshd {
    child: Child,
    port: u16,
    key: PathBuf,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_sshd(dir: &Path) -> Result<Sshd, String> {
    let sshd = Path::new("/usr/sbin/sshd");
    if !sshd.exists() {
        return Err("no /usr/sbin/sshd (Debian's openssh-server)".into());
    }
    if !Path::new("/run/sshd").is_dir() {
        return Err("sshd's privilege separation directory /run/sshd is missing".into());
    }
    if nix::unistd::getuid().as_raw() != 0 {
        return Err("sshd needs root to start".into());
    }
    std::fs::create_dir_all(dir).unwrap();
    for (k, t) in [("host", "ed25519"), ("client", "ed25519")] {
        let st = Command::new("ssh-keygen")
            .args(["-q", "-t", t, "-N", "", "-f"])
            .arg(dir.join(k))
            .status()
            .map_err(|e| format!("ssh-keygen: {e}"))?;
        assert!(st.success());
    }
    std::fs::copy(dir.join("client.pub"), dir.join("authorized_keys")).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = format!(
        "Port {port}\nListenAddress 127.0.0.1\nHostKey {}\nAuthorizedKeysFile {}\nPidFile {}\nPermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nMaxStartups 4\nLoginGraceTime 30\n",
        dir.join("host").display(),
        dir.join("authorized_keys").display(),
        dir.join("sshd.pid").display()
    );
    std::fs::write(dir.join("sshd_config"), config).unwrap();
    let child = Command::new(sshd)
        .args(["-D", "-e", "-f"])
        .arg(dir.join("sshd_config"))
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("sshd: {e}"))?;
    wait_for("sshd to listen", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    Ok(Sshd {
        child,
        port,
        key: dir.join("client"),
    })
}

/// `tank send ARGS` on `data` into a file; returns the stream's bytes.
fn send_to_file(data: &Path, args: &[&str], file: &Path) -> Vec<u8> {
    let st = Command::new(env!("CARGO_BIN_EXE_tank"))
        .arg("send")
        .args(args)
        .env("TANK_DATA_DIR", data)
        .stdout(std::fs::File::create(file).unwrap())
        .status()
        .unwrap();
    assert!(st.success(), "tank send {args:?}");
    std::fs::read(file).unwrap()
}

/// `tank receive ARGS` on `data`, fed the first half of `stream`; returns the running
/// command and its input (still open) two seconds later, for a kill.
fn receive_half(data: &Path, args: &[&str], stream: &[u8]) -> (Child, std::process::ChildStdin) {
    let mut r = Command::new(env!("CARGO_BIN_EXE_tank"))
        .arg("receive")
        .args(args)
        .env("TANK_DATA_DIR", data)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut input = r.stdin.take().unwrap();
    input.write_all(&stream[..stream.len() / 2]).unwrap();
    input.flush().unwrap();
    std::thread::sleep(Duration::from_secs(2));
    (r, input)
}

#[test]
fn send_and_receive_between_hosts_through_pipes_and_ssh() {
    if let Some(why) = common::fuse_missing() {
        common::skip("send_and_receive_between_hosts_through_pipes_and_ssh", why);
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (a, b) = two_hosts(t.path());
    let (ma, mb) = (t.path().join("ma"), t.path().join("mb"));
    let da = serve(&a);
    let db = serve(&b);
    let mp_a = format!("mountpoint={}", ma.display());
    tank(&a, &["dataset", "create", "-o", &mp_a, "pa/src"]);
    wait_for("pa/src to mount", || {
        ma.join(".tank").exists() || ma.read_dir().is_ok_and(|mut d| d.next().is_none())
    });
    populate(&ma, 1);
    snapshot(&a, "pa/src@1");

    // Full, through a pipe between the two daemons; received with properties of its own.
    let mp_b = format!("mountpoint={}", mb.display());
    let (out, _) = pipe(
        &a,
        &["send", "pa/src@1"],
        &b,
        &["receive", "-o", &mp_b, "-o", "atime=off", "pb/dst"],
    );
    assert!(out.contains("received pb/dst@1"), "{out}");
    wait_for("pb/dst to mount", || mb.join("round1").exists());
    assert_same(&walk(&snap_dir(&ma, "1")), &walk(&mb), "full");
    let guid = |data: &Path, name: &str| -> String {
        tank(data, &["dataset", "get", "-H", "guid", name])
            .split('\t')
            .nth(2)
            .unwrap()
            .to_string()
    };
    assert_eq!(guid(&a, "pa/src@1"), guid(&b, "pb/dst@1"));

    // Incremental, compressed, into the mounted target (unmounted and mounted again).
    change(&ma, 2);
    snapshot(&a, "pa/src@2");
    pipe(
        &a,
        &["send", "-c", "-i", "@1", "pa/src@2"],
        &b,
        &["receive", "pb/dst"],
    );
    wait_for("pb/dst to mount again", || mb.join("round2").exists());
    assert_same(&walk(&snap_dir(&ma, "2")), &walk(&mb), "incremental");

    // A stream for another base is refused, and the target is unchanged.
    let stream = t.path().join("s12");
    let bytes = send_to_file(&a, &["-i", "@1", "pa/src@2"], &stream);
    // The dry run's estimate is the stream's size but for the BEGIN record's JSON.
    let est = tank(&a, &["send", "-n", "-P", "-i", "@1", "pa/src@2"]);
    let size: u64 = est
        .lines()
        .find_map(|l| l.strip_prefix("size\t"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no size in {est}"));
    assert!(
        size.abs_diff(bytes.len() as u64) < 512,
        "estimate {size} for {}",
        bytes.len()
    );
    assert!(est.contains("snapshot\tpa/src@2"), "{est}");
    let r = Command::new(env!("CARGO_BIN_EXE_tank"))
        .args(["receive", "pb/dst"])
        .env("TANK_DATA_DIR", &b)
        .stdin(std::fs::File::open(&stream).unwrap())
        .output()
        .unwrap();
    assert!(!r.status.success());
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(err.contains("exists") || err.contains("base"), "{err}");
    assert_same(
        &walk(&snap_dir(&ma, "2")),
        &walk(&mb),
        "after a refused stream",
    );

    // Over SSH: tank send | ssh host tank receive.
    change(&ma, 3);
    snapshot(&a, "pa/src@3");
    match start_sshd(&t.path().join("ssh")) {
        Err(why) => common::skip(
            "send_and_receive_between_hosts_through_pipes_and_ssh (ssh part)",
            &why,
        ),
        Ok(sshd) => {
            let remote = format!(
                "TANK_DATA_DIR='{}' '{}' receive pb/dst",
                b.display(),
                env!("CARGO_BIN_EXE_tank")
            );
            let port = sshd.port.to_string();
            let key = sshd.key.to_str().unwrap().to_string();
            let ssh = [
                "ssh",
                "-p",
                port.as_str(),
                "-i",
                key.as_str(),
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
                "-o",
                "BatchMode=yes",
                "-o",
                "LogLevel=ERROR",
                "root@127.0.0.1",
                remote.as_str(),
            ];
            let mut s = Command::new(env!("CARGO_BIN_EXE_tank"))
                .args(["send", "-i", "@2", "pa/src@3"])
                .env("TANK_DATA_DIR", &a)
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let r = Command::new(ssh[0])
                .args(&ssh[1..])
                .stdin(s.stdout.take().unwrap())
                .output()
                .unwrap();
            assert!(s.wait().unwrap().success());
            assert!(
                r.status.success(),
                "over ssh: {}{}",
                String::from_utf8_lossy(&r.stdout),
                String::from_utf8_lossy(&r.stderr)
            );
            wait_for("pb/dst to mount after the ssh receive", || {
                mb.join("round3").exists()
            });
            assert_same(&walk(&snap_dir(&ma, "3")), &walk(&mb), "over ssh");
        }
    }

    // Killed midway: the receiving daemon, with SIGKILL, half a stream in.
    change(&ma, 4);
    snapshot(&a, "pa/src@4");
    let s34 = t.path().join("s34");
    let bytes = send_to_file(&a, &["-i", "@3", "pa/src@4"], &s34);
    let before = walk(&mb);
    let (mut r, input) = receive_half(&b, &["pb/dst"], &bytes);
    kill9(db);
    drop(input);
    let _ = r.wait();
    let db = serve(&b);
    let mounted = {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if mb.join("round3").exists() {
                break true;
            }
            if Instant::now() > deadline {
                break false;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    if !mounted {
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        panic!(
            "pb/dst not mounted after the restart: {}\n{}\n{}",
            tank(&b, &["dataset", "list", "-t", "all"]),
            tank(
                &b,
                &[
                    "dataset",
                    "get",
                    "mountpoint,receive_resume_token,mounted",
                    "pb/dst"
                ]
            ),
            mounts
                .lines()
                .filter(|l| l.contains("mb"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    assert_same(&before, &walk(&mb), "after a daemon killed mid-receive");
    let snaps = tank(
        &b,
        &["dataset", "list", "-H", "-t", "snapshot", "-o", "name"],
    );
    assert!(!snaps.contains("pb/dst@4"), "{snaps}");
    // The same stream whole then applies.
    let r = Command::new(env!("CARGO_BIN_EXE_tank"))
        .args(["receive", "pb/dst"])
        .env("TANK_DATA_DIR", &b)
        .stdin(std::fs::File::open(&s34).unwrap())
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    wait_for("pb/dst to mount", || mb.join("round4").exists());
    assert_same(
        &walk(&snap_dir(&ma, "4")),
        &walk(&mb),
        "after the kill, received whole",
    );

    // Killed midway without a daemon: the receiving command itself.
    drop(db);
    let full = t.path().join("full");
    let bytes = send_to_file(&a, &["pa/src@4"], &full);
    let (mut r, input) = receive_half(&b, &["-u", "pb/half"], &bytes);
    let _ = r.kill();
    let _ = r.wait();
    drop(input);
    let list = tank(&b, &["dataset", "list", "-H", "-t", "all", "-o", "name"]);
    assert!(
        !list.contains("pb/half"),
        "a half-received dataset is left: {list}"
    );
    assert!(list.contains("pb/dst@4"), "{list}");
    let err = tank_fails(&b, &["receive", "-A", "pb/dst"]);
    assert!(err.contains("no unfinished receive"), "{err}");
    drop(da);
}

/// The daemon of `data` with snapshot schedules and replication tasks checked every second.
fn serve_fast(data: &Path) -> (Daemon, String) {
    let (child, api, _) = common::serve_until_listening(
        data,
        &["serve", "--api", "127.0.0.1:0", "--schedule-hour", "8"],
        "api: ",
    );
    let url = api
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string();
    (Daemon(child), url)
}

/// The replication tasks of `data` as `tank replicate list --json` gives them.
fn tasks(data: &Path) -> serde_json::Value {
    serde_json::from_str(&tank(data, &["replicate", "list", "--json"])).unwrap()
}

/// The snapshots of `ds` on `data` as (short name, guid), oldest first.
fn snapshots_of(data: &Path, ds: &str) -> Vec<(String, String)> {
    tank(
        data,
        &[
            "dataset",
            "list",
            "-H",
            "-p",
            "-r",
            "-t",
            "snapshot",
            "-o",
            "name,guid",
            ds,
        ],
    )
    .lines()
    .filter_map(|l| {
        let (n, g) = l.split_once('\t')?;
        let short = n.strip_prefix(&format!("{ds}@"))?;
        Some((short.to_string(), g.to_string()))
    })
    .collect()
}

/// A replication task between two daemons over SSH, as a user sets one up: the first run
/// sends everything, the daemon then sends each new snapshot on its own, a bandwidth limit
/// holds, a run cut midway is resumed by the next, the source pruning every snapshot the
/// two had in common is bridged by the task's bookmark, the target is pruned to the source's
/// retention without losing the common snapshot, and a failing task raises an alert (its
/// state, an ereport event, the metrics).
#[test]
fn replication_tasks_over_ssh() {
    if let Some(why) = common::fuse_missing() {
        common::skip("replication_tasks_over_ssh", why);
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let sshd = match start_sshd(&t.path().join("ssh")) {
        Ok(s) => s,
        Err(why) => {
            common::skip("replication_tasks_over_ssh", &why);
            return;
        }
    };
    let (a, b) = two_hosts(t.path());
    let (ma, mb) = (t.path().join("ma"), t.path().join("mb"));
    let (da, api) = serve_fast(&a);
    let _db = serve(&b);
    create_mounted(&a, "pa/src", &ma);
    let snap = |n: u64| format!("autosnap_2026-11-28_{n:02}:00:00_hourly");
    populate(&ma, 1);
    snapshot(&a, &format!("pa/src@{}", snap(1)));
    change(&ma, 2);
    snapshot(&a, &format!("pa/src@{}", snap(2)));

    let remote = format!(
        "TANK_DATA_DIR='{}' '{}'",
        b.display(),
        env!("CARGO_BIN_EXE_tank")
    );
    let target = format!("ssh://root@127.0.0.1:{}/pb/dst", sshd.port);
    let add = |extra: &[&str]| {
        let mut args = vec![
            "replicate",
            "add",
            "r1",
            "pa/src",
            target.as_str(),
            "--identity",
            sshd.key.to_str().unwrap(),
            "--ssh-option",
            "StrictHostKeyChecking=no",
            "--ssh-option",
            "UserKnownHostsFile=/dev/null",
            "--remote-tank",
            remote.as_str(),
        ];
        args.extend_from_slice(extra);
        tank(&a, &args)
    };
    // Bad targets are refused before anything runs.
    for bad in [
        "ssh://-oProxyCommand=x/pb/d",
        "nas2:/pb/dst",
        "ssh://h/pb/d@s",
    ] {
        let err = tank_fails(&a, &["replicate", "add", "x", "pa/src", bad]);
        assert!(err.contains("bad target"), "{err}");
    }
    // Run on request only, to begin with.
    add(&["--manual"]);
    let l = tasks(&a);
    assert_eq!(l[0]["status"], "never run", "{l}");
    assert_eq!(l[0]["pending"], 2, "{l}");

    // The first run: the oldest snapshot whole, then the rest as an increment.
    let out = tank(&a, &["replicate", "run", "r1"]);
    assert!(out.contains(&format!("pa/src@{}", snap(2))), "{out}");
    assert_eq!(snapshots_of(&a, "pa/src"), snapshots_of(&b, "pb/dst"));
    tank(&b, &["mount", "pb/dst", mb.to_str().unwrap()]);
    wait_for("pb/dst to mount", || mb.join("round2").exists());
    assert_same(
        &walk(&snap_dir(&ma, &snap(2))),
        &walk(&mb),
        "replicated in full",
    );
    let l = tasks(&a);
    assert_eq!(l[0]["status"], "ok", "{l}");
    assert_eq!(l[0]["pending"], 0, "{l}");
    assert!(
        l[0]["state"]["bytes_total"].as_u64().unwrap() > 1 << 20,
        "{l}"
    );
    // A run with nothing new sends nothing.
    let out = tank(&a, &["replicate", "run", "r1"]);
    assert!(out.contains("up to date"), "{out}");

    // A new snapshot: the daemon sends it on its own.
    add(&[]);
    change(&ma, 3);
    snapshot(&a, &format!("pa/src@{}", snap(3)));
    wait_for("the daemon to replicate snapshot 3", || {
        tasks(&a)[0]["state"]["last_snapshot"] == format!("pa/src@{}", snap(3))
    });
    wait_for("pb/dst to mount again", || mb.join("round3").exists());
    assert_same(
        &walk(&snap_dir(&ma, &snap(3))),
        &walk(&mb),
        "replicated by the daemon",
    );

    // A bandwidth limit holds: 1 MiB/s, and the run is cut midway (the receiving command
    // killed, as a dropped connection would end it).
    add(&["--bwlimit", "1M", "--manual"]);
    change(&ma, 4);
    snapshot(&a, &format!("pa/src@{}", snap(4)));
    let est: u64 = tank(
        &a,
        &[
            "send",
            "-n",
            "-P",
            "-c",
            "-i",
            &format!("@{}", snap(3)),
            &format!("pa/src@{}", snap(4)),
        ],
    )
    .lines()
    .find_map(|l| l.strip_prefix("size\t")?.parse().ok())
    .unwrap();
    assert!(est > 3 << 20, "a stream of {est} bytes is too small to cut");
    let run = Command::new(env!("CARGO_BIN_EXE_tank"))
        .args(["replicate", "run", "r1"])
        .env("TANK_DATA_DIR", &a)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Cut once the target has begun (its token shows while it receives).
    wait_for("the receive to begin", || {
        tank(
            &b,
            &["dataset", "get", "-H", "receive_resume_token", "pb/dst"],
        )
        .contains("\t1-")
    });
    let killed = Command::new("pkill")
        .args(["-9", "-f", "receive -s -F pb/dst"])
        .status()
        .unwrap();
    assert!(killed.success(), "no receive to cut");
    let cut = run.wait_with_output().unwrap();
    assert!(!cut.status.success(), "a cut run succeeded");
    let err = String::from_utf8_lossy(&cut.stderr).into_owned();
    assert!(err.contains("receive on 127.0.0.1 failed"), "{err}");
    // The receiving daemon sees the cut when it next reads; then the token is there.
    wait_for("a resume token after the cut", || {
        tank(
            &b,
            &["dataset", "get", "-H", "receive_resume_token", "pb/dst"],
        )
        .contains("\t1-")
    });
    // The daemon tries a failed task again a schedule minute later, and goes on from the
    // token, at the limit.
    add(&["--bwlimit", "1M"]);
    wait_for("the daemon to resume the cut run", || {
        let l = tasks(&a);
        l[0]["status"] == "ok" && l[0]["state"]["last_snapshot"] == format!("pa/src@{}", snap(4))
    });
    let l = tasks(&a);
    assert_eq!(l[0]["state"]["failures"], 1, "{l}");
    let resumed = l[0]["state"]["last_bytes"].as_u64().unwrap();
    assert!(
        resumed < est,
        "the resumed run sent {resumed} bytes of a {est}-byte stream"
    );
    let secs = l[0]["state"]["last_success"].as_u64().unwrap()
        - l[0]["state"]["last_run"].as_u64().unwrap()
        + 1;
    assert!(
        secs as f64 >= resumed as f64 / (1 << 20) as f64 * 0.8,
        "{resumed} bytes in {secs} s at a 1 MiB/s limit"
    );
    wait_for("pb/dst to mount after the resumed run", || {
        mb.join("round4").exists()
    });
    assert_same(
        &walk(&snap_dir(&ma, &snap(4))),
        &walk(&mb),
        "after a cut and a resume",
    );
    add(&["--prune", "--manual"]);

    // The source prunes every snapshot the target has; the task's bookmark is the base.
    for n in 1..=4 {
        tank(&a, &["dataset", "destroy", &format!("pa/src@{}", snap(n))]);
    }
    change(&ma, 5);
    snapshot(&a, &format!("pa/src@{}", snap(5)));
    let out = tank(&a, &["replicate", "run", "r1"]);
    assert!(out.contains(&format!("sent pa/src@{}", snap(5))), "{out}");
    // Pruned to the source's retention: the four the source destroyed.
    for n in 1..=4 {
        assert!(
            out.contains(&format!("pb/dst@{}", snap(n))),
            "{n} not pruned: {out}"
        );
    }
    assert_eq!(snapshots_of(&a, "pa/src"), snapshots_of(&b, "pb/dst"));
    wait_for("pb/dst to mount after the bookmark run", || {
        mb.join("round5").exists()
    });
    assert_same(
        &walk(&snap_dir(&ma, &snap(5))),
        &walk(&mb),
        "from the task's bookmark",
    );

    // The only common snapshot is never pruned, even when the source has destroyed it.
    tank(&a, &["dataset", "destroy", &format!("pa/src@{}", snap(5))]);
    snapshot(&a, "pa/src@manual");
    let out = tank(&a, &["replicate", "run", "r1"]);
    assert!(out.contains("sent pa/src@manual"), "{out}");
    let on_b = snapshots_of(&b, "pb/dst");
    assert!(on_b.iter().any(|s| s.0 == "manual"), "{on_b:?}");

    // A failing task: the target's host is gone. Its state, an ereport and the metrics.
    drop(sshd);
    change(&ma, 6);
    snapshot(&a, "pa/src@after");
    let err = tank_fails(&a, &["replicate", "run", "r1"]);
    assert!(err.contains("cannot list the target"), "{err}");
    let l = tasks(&a);
    assert_eq!(l[0]["status"], "failing", "{l}");
    assert_eq!(l[0]["pending"], 1, "{l}");
    assert!(l[0]["state"]["last_error"].as_str().is_some(), "{l}");
    let events = tank(&a, &["pool", "events", "pa"]);
    assert!(
        events.contains("ereport.fs.tank.replication_failed"),
        "{events}"
    );
    assert!(events.contains("sysevent.fs.tank.replication"), "{events}");
    common::tank(
        &a,
        &["user", "add", "boss", "--admin"],
        Some("the boss's password\n"),
    );
    let token = tank(&a, &["token", "add", "boss"]);
    let token = token
        .lines()
        .find_map(|l| l.strip_prefix("token: "))
        .unwrap_or_else(|| panic!("no token in {token}"))
        .trim()
        .to_string();
    let m = Command::new("curl")
        .args(["-sSk", "-H", &format!("Authorization: Bearer {token}")])
        .arg(format!("{api}/metrics"))
        .output()
        .unwrap();
    let m = String::from_utf8_lossy(&m.stdout);
    for want in [
        "tank_replication_failing{task=\"r1\"",
        "tank_replication_last_success_timestamp_seconds{task=\"r1\"",
        "tank_replication_lag_seconds{task=\"r1\"",
        "tank_replication_pending_snapshots{task=\"r1\"",
        "tank_replication_sent_bytes_total{task=\"r1\"",
    ] {
        assert!(m.contains(want), "no {want} in the metrics:\n{m}");
    }
    let failing = m
        .lines()
        .find(|l| l.starts_with("tank_replication_failing{"))
        .unwrap();
    let value: f64 = failing.rsplit(' ').next().unwrap().parse().unwrap();
    assert_eq!(value, 1.0, "{failing}");
    tank(&a, &["replicate", "remove", "r1"]);
    assert_eq!(tasks(&a), serde_json::json!([]));
    drop(da);
}

/// MinIO (`go install github.com/minio/minio@...`), on the PATH or in Go's bin directory.
fn minio_binary() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Ok(out) = Command::new("go").args(["env", "GOPATH"]).output() {
        let gopath = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !gopath.is_empty() {
            dirs.push(Path::new(&gopath).join("bin"));
        }
    }
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(Path::new(&home).join("go/bin"));
    }
    dirs.into_iter()
        .map(|d| d.join("minio"))
        .find(|p| p.is_file())
}

struct Minio {
    child: Child,
    port: u16,
}

impl Drop for Minio {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const MINIO_USER: &str = "tankbackup";
const MINIO_PASSWORD: &str = "tank-backup-secret";

fn start_minio(bin: &Path, dir: &Path) -> Minio {
    std::fs::create_dir_all(dir).unwrap();
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let (port, console) = (free(), free());
    let child = Command::new(bin)
        .args(["server", "--quiet", "--address"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--console-address")
        .arg(format!("127.0.0.1:{console}"))
        .arg(dir)
        .env("MINIO_ROOT_USER", MINIO_USER)
        .env("MINIO_ROOT_PASSWORD", MINIO_PASSWORD)
        .env("MINIO_BROWSER", "off")
        .env("HOME", dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let m = Minio { child, port };
    wait_for("minio to answer", || {
        Command::new("curl")
            .args(["-sf", "-o", "/dev/null"])
            .arg(format!("http://127.0.0.1:{port}/minio/health/live"))
            .status()
            .is_ok_and(|s| s.success())
    });
    m
}

/// An S3 request to MinIO with curl's own SigV4 signing; the body it answered with.
fn s3_curl(port: u16, method: &str, path: &str, upload: Option<&Path>) -> Vec<u8> {
    let mut c = Command::new("curl");
    c.args(["-sSf", "--aws-sigv4", "aws:amz:us-east-1:s3", "-u"])
        .arg(format!("{MINIO_USER}:{MINIO_PASSWORD}"))
        .args(["-X", method]);
    if let Some(f) = upload {
        c.arg("--upload-file").arg(f);
    }
    let out = c
        .arg(format!("http://127.0.0.1:{port}{path}"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "curl {method} {path}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A TCP relay that passes `budget` bytes from its clients to the server, then cuts every
/// connection (a network that drops midway); a budget of `u64::MAX` passes everything.
struct Relay {
    port: u16,
    budget: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

fn relay(to: u16) -> Relay {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let budget = Arc::new(AtomicU64::new(u64::MAX));
    let b = budget.clone();
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            let Ok(s) = std::net::TcpStream::connect(("127.0.0.1", to)) else {
                continue;
            };
            let (mut c2, mut s2) = (c.try_clone().unwrap(), s.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut s2, &mut c2);
                let _ = c2.shutdown(std::net::Shutdown::Both);
            });
            let b = b.clone();
            std::thread::spawn(move || {
                use std::io::Read;
                let (mut c, mut s) = (c, s);
                let mut buf = vec![0u8; 64 << 10];
                loop {
                    let n = match c.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n as u64,
                    };
                    let left = b.load(Ordering::SeqCst);
                    if left < n {
                        break;
                    }
                    if left != u64::MAX {
                        b.fetch_sub(n, Ordering::SeqCst);
                    }
                    if s.write_all(&buf[..n as usize]).is_err() {
                        break;
                    }
                }
                let _ = s.shutdown(std::net::Shutdown::Both);
                let _ = c.shutdown(std::net::Shutdown::Both);
            });
        }
    });
    Relay { port, budget }
}

/// Backups to a real S3 server (MinIO, started here on 127.0.0.1): a chain of a full and
/// two incremental streams, encrypted client-side, one upload cut by the network and
/// resumed (only the missing parts sent), restored to a fresh pool on another host and
/// compared by the walker; restores with no key, the wrong key, and a damaged object
/// refused with the target unchanged; an incremental restore onto what is there.
#[test]
fn backups_to_s3_are_restored_to_a_fresh_pool() {
    if let Some(why) = common::fuse_missing() {
        common::skip("backups_to_s3_are_restored_to_a_fresh_pool", why);
        return;
    }
    let Some(bin) = minio_binary() else {
        common::skip(
            "backups_to_s3_are_restored_to_a_fresh_pool",
            "no minio binary (go install github.com/minio/minio@latest)",
        );
        return;
    };
    let t = tempfile::tempdir().unwrap();
    let minio = start_minio(&bin, &t.path().join("minio"));
    s3_curl(minio.port, "PUT", "/backups", None);
    let net = relay(minio.port);
    let (a, b) = two_hosts(t.path());
    let (ma, mb) = (t.path().join("ma"), t.path().join("mb"));
    let (_da, _) = serve_fast(&a);
    let _db = serve(&b);
    create_mounted(&a, "pa/src", &ma);
    let endpoint = format!("http://127.0.0.1:{}", net.port);
    let added = tank(
        &a,
        &[
            "remote",
            "add",
            "store",
            "--endpoint",
            &endpoint,
            "--access-key",
            MINIO_USER,
            "--secret-key",
            MINIO_PASSWORD,
            "--encrypt",
        ],
    );
    let key = added
        .lines()
        .find(|l| l.len() == 64 && l.chars().all(|c| c.is_ascii_hexdigit()))
        .unwrap_or_else(|| panic!("no key shown: {added}"))
        .to_string();
    let remotes = tank(&a, &["remote", "list", "--json"]);
    assert!(!remotes.contains(&key), "the key is shown again: {remotes}");
    assert!(!remotes.contains(MINIO_PASSWORD), "{remotes}");
    let url = "s3://backups/hosts/a/src";
    let backup = |args: &[&str]| {
        let mut v = vec!["send"];
        v.extend_from_slice(args);
        v.extend_from_slice(&["--to", url, "--remote", "store"]);
        common::tank(&a, &v, None)
    };

    populate(&ma, 1);
    snapshot(&a, "pa/src@1");
    backup(&["pa/src@1"]);
    change(&ma, 2);
    snapshot(&a, "pa/src@2");
    backup(&["-i", "@1", "pa/src@2"]);
    // Storing the same stream again stores nothing.
    let again = Command::new(env!("CARGO_BIN_EXE_tank"))
        .args([
            "send", "-i", "@1", "pa/src@2", "--to", url, "--remote", "store",
        ])
        .env("TANK_DATA_DIR", &a)
        .output()
        .unwrap();
    assert!(again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("stored there already"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );

    // A stream of several parts, cut by the network after two of them; the same command
    // again sends only what the store lacks.
    change(&ma, 3);
    let mut big = std::fs::File::create(ma.join("round3/incompressible")).unwrap();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..(40 << 20) / 8 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        big.write_all(&x.to_le_bytes()).unwrap();
    }
    drop(big);
    snapshot(&a, "pa/src@3");
    net.budget
        .store(20 << 20, std::sync::atomic::Ordering::SeqCst);
    let cut = Command::new(env!("CARGO_BIN_EXE_tank"))
        .args([
            "send", "-i", "@2", "pa/src@3", "--to", url, "--remote", "store",
        ])
        .env("TANK_DATA_DIR", &a)
        .output()
        .unwrap();
    assert!(
        !cut.status.success(),
        "an upload through a cut network succeeded"
    );
    let err = String::from_utf8_lossy(&cut.stderr).into_owned();
    assert!(err.contains("the same command again resumes it"), "{err}");
    let events = tank(&a, &["pool", "events", "pa"]);
    assert!(events.contains("ereport.fs.tank.backup_failed"), "{events}");
    // The network back (what is left of the budget may be nothing): the cut upload is
    // not listed as a backup.
    net.budget
        .store(u64::MAX, std::sync::atomic::Ordering::SeqCst);
    let listing = tank(&a, &["remote", "list-backups", "store", url]);
    assert!(!listing.contains("pa/src@3"), "{listing}");
    let resumed = Command::new(env!("CARGO_BIN_EXE_tank"))
        .args([
            "send", "-i", "@2", "pa/src@3", "--to", url, "--remote", "store",
        ])
        .env("TANK_DATA_DIR", &a)
        .output()
        .unwrap();
    let note = String::from_utf8_lossy(&resumed.stderr).into_owned();
    assert!(resumed.status.success(), "{note}");
    let parts_there: u64 = note
        .split("resumed: ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not resumed: {note}"));
    assert!(parts_there >= 1, "{note}");
    assert!(note.contains("encrypted"), "{note}");

    let listing: serde_json::Value = serde_json::from_str(&tank(
        &a,
        &["remote", "list-backups", "store", url, "--json"],
    ))
    .unwrap();
    let stored = listing["backups"].as_array().unwrap();
    assert_eq!(stored.len(), 3, "{listing}");
    assert_eq!(listing["unfinished"], serde_json::json!([]), "{listing}");
    assert!(stored.iter().all(|m| m["key_id"].is_string()), "{listing}");
    // The store never sees the plain stream: a file's bytes are not in any object.
    let plain = std::fs::read(ma.join("round1/f7")).unwrap();
    for m in stored {
        let object = s3_curl(
            minio.port,
            "GET",
            &format!("/backups/{}", m["object"].as_str().unwrap()),
            None,
        );
        assert!(object.starts_with(b"TANKENC1"));
        assert!(
            !object.windows(64).any(|w| w == &plain[100..164]),
            "plain data in {}",
            m["object"]
        );
    }

    // Restore on another host: without the key, with another key, then with it.
    let restore = |data: &Path, ds: &str| {
        Command::new(env!("CARGO_BIN_EXE_tank"))
            .args(["receive", "-u", ds, "--from", url, "--remote", "store"])
            .env("TANK_DATA_DIR", data)
            .output()
            .unwrap()
    };
    let remote_b = |key: Option<&str>| {
        let mut args = vec![
            "remote",
            "add",
            "store",
            "--endpoint",
            endpoint.as_str(),
            "--access-key",
            MINIO_USER,
            "--secret-key",
            MINIO_PASSWORD,
        ];
        if let Some(k) = key {
            args.extend_from_slice(&["--encryption-key", k]);
        }
        tank(&b, &args);
    };
    let names = |data: &Path| tank(data, &["dataset", "list", "-H", "-t", "all", "-o", "name"]);
    remote_b(None);
    let r = restore(&b, "pb/restored");
    assert!(!r.status.success());
    assert!(
        String::from_utf8_lossy(&r.stderr).contains("is encrypted"),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
    remote_b(Some(&"0f".repeat(32)));
    let r = restore(&b, "pb/restored");
    assert!(!r.status.success());
    assert!(
        String::from_utf8_lossy(&r.stderr).contains("not this remote's"),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
    assert!(!names(&b).contains("pb/restored"), "{}", names(&b));
    remote_b(Some(&key));
    let r = restore(&b, "pb/restored");
    let out = String::from_utf8_lossy(&r.stdout).into_owned();
    assert!(
        r.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&r.stderr)
    );
    for s in ["pb/restored@1", "pb/restored@2", "pb/restored@3"] {
        assert!(out.contains(&format!("received {s}")), "{out}");
    }
    let guids = |data: &Path, ds: &str| {
        snapshots_of(data, ds)
            .into_iter()
            .map(|(_, g)| g)
            .collect::<Vec<_>>()
    };
    assert_eq!(guids(&a, "pa/src"), guids(&b, "pb/restored"));
    tank(&b, &["mount", "pb/restored", mb.to_str().unwrap()]);
    wait_for("pb/restored to mount", || mb.join("round3").exists());
    assert_same(
        &walk(&snap_dir(&ma, "3")),
        &walk(&mb),
        "restored from the store",
    );

    // One more backup; the restore onto what is there takes just that one (-F: the
    // mounted copy was read, which changes access times).
    change(&ma, 4);
    snapshot(&a, "pa/src@4");
    backup(&["-i", "@3", "pa/src@4"]);
    let r = Command::new(env!("CARGO_BIN_EXE_tank"))
        .args([
            "receive",
            "-F",
            "pb/restored",
            "--from",
            url,
            "--remote",
            "store",
        ])
        .env("TANK_DATA_DIR", &b)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&r.stdout).into_owned();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(out.trim().ends_with("received pb/restored@4"), "{out}");
    assert_eq!(out.matches("received").count(), 1, "{out}");
    wait_for("pb/restored to mount again", || mb.join("round4").exists());
    assert_same(
        &walk(&snap_dir(&ma, "4")),
        &walk(&mb),
        "restored incrementally",
    );

    // A damaged object (one bit flipped in the store) is refused; nothing is made.
    let first = stored[0]["object"].as_str().unwrap().to_string();
    let mut bytes = s3_curl(minio.port, "GET", &format!("/backups/{first}"), None);
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x04;
    let damaged = t.path().join("damaged");
    std::fs::write(&damaged, &bytes).unwrap();
    s3_curl(
        minio.port,
        "PUT",
        &format!("/backups/{first}"),
        Some(&damaged),
    );
    let r = restore(&b, "pb/again");
    assert!(!r.status.success());
    let err = String::from_utf8_lossy(&r.stderr).into_owned();
    assert!(err.contains("does not authenticate"), "{err}");
    assert!(!names(&b).contains("pb/again"), "{}", names(&b));

    // A replication task to the store: the daemon stores each new snapshot, a new chain
    // after two streams, and with --prune deletes the chains the source has pruned.
    let task_url = "s3://backups/task";
    let s3_task = |extra: &[&str]| {
        let mut args = vec![
            "replicate",
            "add",
            "s3bk",
            "pa/src",
            task_url,
            "--remote",
            "store",
            "--full-every",
            "2",
            "--prune",
        ];
        args.extend_from_slice(extra);
        tank(&a, &args);
    };
    s3_task(&[]);
    let stored_up_to = |snap: &str| {
        let want = format!("pa/src@{snap}");
        let a = a.clone();
        move || {
            let l = tasks(&a);
            l[0]["status"] == "ok" && l[0]["state"]["last_snapshot"] == want.as_str()
        }
    };
    wait_for("the task to store @4", stored_up_to("4"));
    snapshot(&a, "pa/src@5");
    wait_for("the task to store @5", stored_up_to("5"));
    for n in 1..=4 {
        tank(&a, &["dataset", "destroy", &format!("pa/src@{n}")]);
    }
    // At most 2 MiB/s from here on.
    s3_task(&["--bwlimit", "2M"]);
    change(&ma, 5);
    snapshot(&a, "pa/src@6");
    wait_for("the task to store @6", stored_up_to("6"));
    let l = tasks(&a);
    let (bytes, secs) = (
        l[0]["state"]["last_bytes"].as_u64().unwrap(),
        l[0]["state"]["last_success"].as_u64().unwrap()
            - l[0]["state"]["last_run"].as_u64().unwrap()
            + 1,
    );
    assert!(bytes > 3 << 20, "{l}");
    assert!(
        secs as f64 >= bytes as f64 / (2 << 20) as f64 * 0.8,
        "{bytes} bytes in {secs} s at 2 MiB/s"
    );
    let listing: serde_json::Value = serde_json::from_str(&tank(
        &a,
        &["remote", "list-backups", "store", task_url, "--json"],
    ))
    .unwrap();
    let kept: Vec<(String, Option<String>)> = listing["backups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["snapshot"].as_str().unwrap().to_string(),
                m["from"].as_str().map(String::from),
            )
        })
        .collect();
    assert_eq!(
        kept,
        [
            ("5".to_string(), None),
            ("6".to_string(), Some("5".to_string()))
        ],
        "{listing}"
    );
    let r = Command::new(env!("CARGO_BIN_EXE_tank"))
        .args(["receive", "-u", "pb/fromtask", "--from", task_url])
        .args(["--remote", "store"])
        .env("TANK_DATA_DIR", &b)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&r.stdout).into_owned();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(out.contains("received pb/fromtask@6"), "{out}");
    let mc = t.path().join("mc");
    tank(&b, &["mount", "pb/fromtask", mc.to_str().unwrap()]);
    wait_for("pb/fromtask to mount", || mc.join("round5").exists());
    assert_same(
        &walk(&snap_dir(&ma, "6")),
        &walk(&mc),
        "restored from the task's backups",
    );
    drop(minio);
}
