//! The NFS server as real clients use it: libnfs' command-line tools (nfs-cp, nfs-cat,
//! nfs-ls) against `tank serve --nfs` on 127.0.0.1, with AUTH_SYS identities given in the
//! URL. The same dataset is also mounted by the daemon with FUSE, where the tests set up
//! owners and modes and check that both views agree.

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

struct Daemon {
    child: Child,
    nfs: String,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `tank serve` with NFS on a free port of 127.0.0.1; returns when it listens.
fn serve(data: &Path) -> Daemon {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tank"))
        .args(["serve", "--no-api", "--nfs", "127.0.0.1:0"])
        .env("TANK_DATA_DIR", data)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let out = BufReader::new(child.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut nfs = None;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("the daemon did not start");
        if let Some(a) = line.strip_prefix("nfs: ") {
            nfs = Some(a.to_string());
        }
        if line.starts_with("listening on ") {
            break;
        }
    }
    Daemon {
        child,
        nfs: nfs.expect("the daemon printed its NFS address"),
    }
}

fn tank(data: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tank"))
        .args(args)
        .env("TANK_DATA_DIR", data)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "tank {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A libnfs URL of `path` in the share, as `uid`:`gid` (None: root).
fn url(d: &Daemon, share_path: &str, id: Option<(u32, u32)>) -> String {
    let port = d.nfs.rsplit(':').next().unwrap();
    let mut u = format!("nfs://127.0.0.1/{share_path}?version=3&nfsport={port}&mountport={port}");
    if let Some((uid, gid)) = id {
        u += &format!("&uid={uid}&gid={gid}");
    }
    u
}

/// Runs a libnfs tool with a time limit.
fn nfs_tool(tool: &str, args: &[&str]) -> Output {
    let child = Command::new(tool)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let id = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &id.to_string()]).status();
            panic!("{tool} {args:?} did not finish in 120 s");
        }
    }
}

fn ok(tool: &str, args: &[&str]) -> Vec<u8> {
    let out = nfs_tool(tool, args);
    assert!(
        out.status.success(),
        "{tool} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The tool fails, and says `expect`.
fn refused(tool: &str, args: &[&str], expect: &str) {
    let out = nfs_tool(tool, args);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{tool} {args:?} should fail: {said}");
    assert!(
        said.contains(expect),
        "{tool} {args:?}: expected '{expect}' in: {said}"
    );
}

fn missing_tools() -> Option<String> {
    for t in ["nfs-cp", "nfs-cat", "nfs-ls"] {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(t).is_file()))
            .unwrap_or(false);
        if !found {
            return Some(format!(
                "{t} not installed (Debian: apt-get install libnfs-utils)"
            ));
        }
    }
    None
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Files written through NFS are whole when read back through NFS and through the local
/// mount, and the other way round; each share's rules hold: its clients, read-only,
/// squashing; a share changed or removed applies at the next request; everything is still
/// there after a restart.
#[test]
fn nfs_shares_serve_files_with_their_rules() {
    const NAME: &str = "nfs_shares_serve_files_with_their_rules";
    if let Some(why) = missing_tools() {
        common::skip(NAME, &why);
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let d = serve(&data);
    tank(&data, &["dataset", "create", "tank/exp"]);
    tank(
        &data,
        &[
            "share",
            "add",
            "nfs",
            "pub",
            "tank/exp",
            "-o",
            "clients=127.0.0.1/32",
            "-o",
            "squash=none",
        ],
    );
    tank(
        &data,
        &[
            "share",
            "add",
            "nfs",
            "ro",
            "tank/exp",
            "-o",
            "clients=127.0.0.1",
            "-o",
            "ro=on",
            "-o",
            "squash=none",
        ],
    );
    tank(
        &data,
        &[
            "share",
            "add",
            "nfs",
            "sq",
            "tank/exp",
            "-o",
            "clients=127.0.0.0/8",
        ],
    );
    tank(
        &data,
        &[
            "share",
            "add",
            "nfs",
            "far",
            "tank/exp",
            "-o",
            "clients=10.0.0.0/8,fd00::/64",
        ],
    );

    // 8 MiB and an odd size, in and out, compared byte for byte.
    let local = tmp.path().join("local");
    std::fs::create_dir(&local).unwrap();
    for (name, len) in [("big", 8 << 20), ("odd", 1_234_567)] {
        let src = local.join(name);
        std::fs::write(&src, pattern(len, len as u64)).unwrap();
        ok(
            "nfs-cp",
            &[
                src.to_str().unwrap(),
                &url(&d, &format!("pub/{name}"), None),
            ],
        );
        let back = local.join(format!("{name}.back"));
        ok(
            "nfs-cp",
            &[
                &url(&d, &format!("pub/{name}"), None),
                back.to_str().unwrap(),
            ],
        );
        assert!(
            std::fs::read(&back).unwrap() == pattern(len, len as u64),
            "{name} came back different"
        );
        let cat = ok("nfs-cat", &[&url(&d, &format!("pub/{name}"), None)]);
        assert!(cat == pattern(len, len as u64), "nfs-cat {name} differs");
    }
    let ls = String::from_utf8(ok("nfs-ls", &[&url(&d, "pub", None)])).unwrap();
    assert!(ls.contains("big") && ls.contains("odd"), "{ls}");
    assert!(ls.contains("8388608"), "{ls}");

    // The read-only share refuses writes; a client outside the share's networks cannot
    // even mount it.
    let src = local.join("odd");
    refused(
        "nfs-cp",
        &[src.to_str().unwrap(), &url(&d, "ro/new", None)],
        "NFS3ERR_ROFS",
    );
    let ls = String::from_utf8(ok("nfs-ls", &[&url(&d, "ro", None)])).unwrap();
    assert!(ls.contains("big"), "{ls}");
    refused("nfs-ls", &[&url(&d, "far", None)], "MNT3ERR_ACCES");
    refused("nfs-ls", &[&url(&d, "nosuch", None)], "MNT3ERR_NOENT");
    // root is squashed to nobody on 'sq': the root directory (root's, 0755) is closed to it.
    refused(
        "nfs-cp",
        &[src.to_str().unwrap(), &url(&d, "sq/new", None)],
        "NFS3ERR_ACCES",
    );

    // Identities and modes, set up through the local mount (root only).
    let mnt: PathBuf = data.join("mnt/tank/exp");
    let fuse = common::fuse_missing().is_none() && mnt.join("big").exists();
    if !fuse {
        common::skip(
            &format!("{NAME} (the part through the local mount)"),
            common::fuse_missing().unwrap_or("the dataset is not mounted"),
        );
    } else {
        // Both views agree.
        assert!(std::fs::read(mnt.join("odd")).unwrap() == pattern(1_234_567, 1_234_567));
        std::fs::write(mnt.join("from-local"), b"written through the mount").unwrap();
        assert_eq!(
            ok("nfs-cat", &[&url(&d, "pub/from-local", None)]),
            b"written through the mount"
        );
        // alice (1000) has a private file and a private directory; bob (1001) does not.
        let chown = |p: &Path, uid: u32, mode: u32| {
            std::os::unix::fs::chown(p, Some(uid), Some(uid)).unwrap();
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        std::fs::write(mnt.join("alice.txt"), b"alice's").unwrap();
        chown(&mnt.join("alice.txt"), 1000, 0o600);
        std::fs::create_dir(mnt.join("alice")).unwrap();
        std::fs::write(
            mnt.join("alice/open.txt"),
            b"open file in a closed directory",
        )
        .unwrap();
        chown(&mnt.join("alice/open.txt"), 1000, 0o644);
        chown(&mnt.join("alice"), 1000, 0o700);
        std::fs::create_dir(mnt.join("drop")).unwrap();
        chown(&mnt.join("drop"), 0, 0o1777);
        let alice = Some((1000, 1000));
        let bob = Some((1001, 1001));
        assert_eq!(
            ok("nfs-cat", &[&url(&d, "pub/alice.txt", alice)]),
            b"alice's"
        );
        refused(
            "nfs-cat",
            &[&url(&d, "pub/alice.txt", bob)],
            "ACCESS denied",
        );
        assert_eq!(
            ok("nfs-cat", &[&url(&d, "pub/alice/open.txt", alice)]),
            b"open file in a closed directory"
        );
        // No search permission on the directory: bob cannot reach the open file in it.
        refused("nfs-cat", &[&url(&d, "pub/alice/open.txt", bob)], "failed");
        refused("nfs-ls", &[&url(&d, "pub/alice", bob)], "failed");
        // Squashed root is nobody: alice's file is closed to it too.
        refused(
            "nfs-cat",
            &[&url(&d, "sq/alice.txt", None)],
            "ACCESS denied",
        );
        // What bob creates is bob's, as the local mount shows; he cannot create in alice's
        // closed directory.
        ok(
            "nfs-cp",
            &[src.to_str().unwrap(), &url(&d, "pub/drop/bobs", bob)],
        );
        let m = std::fs::metadata(mnt.join("drop/bobs")).unwrap();
        assert_eq!((m.uid(), m.gid(), m.len()), (1001, 1001, 1_234_567));
        refused(
            "nfs-cp",
            &[src.to_str().unwrap(), &url(&d, "pub/alice/intruder", bob)],
            "failed",
        );
        assert!(!mnt.join("alice/intruder").exists());
    }

    // Share changes apply to the next request: 'pub' read-only now, then gone.
    tank(&data, &["share", "set", "pub", "readonly=on"]);
    refused(
        "nfs-cp",
        &[src.to_str().unwrap(), &url(&d, "pub/after", None)],
        "NFS3ERR_ROFS",
    );
    tank(&data, &["share", "remove", "pub"]);
    refused("nfs-ls", &[&url(&d, "pub", None)], "MNT3ERR_NOENT");

    // After a restart every file is there, and the shares are served again.
    drop(d);
    let d = serve(&data);
    assert!(
        ok("nfs-cat", &[&url(&d, "ro/big", None)]) == pattern(8 << 20, 8 << 20),
        "big differs after a restart"
    );
}
