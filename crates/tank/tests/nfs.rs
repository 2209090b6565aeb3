//! The NFS server as real clients use it: libnfs' command-line tools (nfs-cp, nfs-cat,
//! nfs-ls) against `tank serve --nfs` on 127.0.0.1, with AUTH_SYS identities given in the
//! URL. The same dataset is also mounted by the daemon with FUSE, where the tests set up
//! owners and modes and check that both views agree.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

struct Daemon {
    child: Child,
    nfs: String,
}

impl Daemon {
    /// Kills the daemon with SIGKILL: nothing is synced, unmounted or exported.
    fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        common::stop(&mut self.child);
    }
}

/// Starts `tank serve` with NFS on a free port of 127.0.0.1; returns when it listens.
fn serve(data: &Path) -> Daemon {
    serve_at(data, "127.0.0.1:0").0
}

/// Starts `tank serve` with NFS on `addr`; returns when it listens, with the lines it
/// printed.
fn serve_at(data: &Path, addr: &str) -> (Daemon, Vec<String>) {
    let (child, nfs, lines) =
        common::serve_until_listening(data, &["serve", "--no-api", "--nfs", addr], "nfs: ");
    (Daemon { child, nfs }, lines)
}

fn tank(data: &Path, args: &[&str]) -> String {
    common::tank(data, args, None)
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
        // A change through NFS is what the next read through the mount sees at once (the
        // mount drops the kernel's cached pages and entries of what NFS changed), and the
        // other way round. (Not yet the size of a file the mount has cached: with its
        // writeback cache the kernel keeps its own; docs/NFS.md.)
        std::fs::write(mnt.join("shared"), b"AAAA").unwrap();
        assert_eq!(std::fs::read(mnt.join("shared")).unwrap(), b"AAAA");
        let mut rc = Rpc::connect(&d.nfs).unwrap();
        let pub_root = rc.mount("/pub").unwrap();
        let shared = rc.lookup(&pub_root, "shared").unwrap();
        rc.write(&shared, 0, b"BBBB", stable_how::UNSTABLE).unwrap();
        assert_eq!(std::fs::read(mnt.join("shared")).unwrap(), b"BBBB");
        // Names too: a file made through NFS is there, one removed is gone.
        assert!(!mnt.join("made-remotely").exists());
        rc.create(
            &pub_root,
            "made-remotely",
            createhow3::UNCHECKED(sattr3::default()),
        )
        .unwrap();
        assert!(mnt.join("made-remotely").exists());
        rc.remove(&pub_root, "made-remotely").unwrap();
        assert!(!mnt.join("made-remotely").exists());
        std::fs::write(mnt.join("shared"), b"local").unwrap();
        assert_eq!(rc.read(&shared, 0, 100).unwrap().0, b"local");
        drop(rc);
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

use nfs3_server::nfs3_types::nfs3::{
    self as nfs, createhow3, createverf3, nfsstat3, sattr3, stable_how,
};
use tank_bench::nfs_client::{Reply, Rpc};

/// A share of a new dataset `tank/NAME`, read-write, root not squashed, for 127.0.0.1.
fn open_share(data: &Path, name: &str) {
    tank(data, &["dataset", "create", &format!("tank/{name}")]);
    tank(
        data,
        &[
            "share",
            "add",
            "nfs",
            name,
            &format!("tank/{name}"),
            "-o",
            "clients=127.0.0.1",
            "-o",
            "squash=none",
        ],
    );
}

/// File handles stay valid across a kill -9 and a restart; what COMMIT and a FILE_SYNC
/// WRITE acknowledged is there after it; the write verifier changes with the restart (so a
/// client resends what it had not committed); a removed file's handle is stale, a forged
/// one refused; exclusive CREATE is idempotent for its verifier; FSSTAT tells real space.
#[test]
fn nfs_handles_and_committed_writes_outlive_kill_9() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let d = serve(&data);
    open_share(&data, "h");
    let mut c = Rpc::connect(&d.nfs).unwrap();
    let root = c.mount("/h").unwrap();
    let f = c
        .create(&root, "f", createhow3::UNCHECKED(sattr3::default()))
        .unwrap();
    let body = pattern(4 << 20, 9);
    let mut verf = None;
    for (i, chunk) in body.chunks(1 << 20).enumerate() {
        let w = c
            .write(&f, (i as u64) << 20, chunk, stable_how::UNSTABLE)
            .unwrap();
        assert_eq!(w.count as usize, chunk.len());
        assert_eq!(w.committed, stable_how::UNSTABLE);
        assert_eq!(
            *verf.get_or_insert(w.verf),
            w.verf,
            "one verifier per start"
        );
    }
    assert_eq!(c.commit(&f).unwrap(), verf.unwrap());
    let tail = pattern(4096, 10);
    let w = c.write(&f, 4 << 20, &tail, stable_how::FILE_SYNC).unwrap();
    assert_eq!(w.committed, stable_how::FILE_SYNC);

    // A removed file's handle is stale, and stays so when its inode is used again.
    let g = c
        .create(&root, "g", createhow3::UNCHECKED(sattr3::default()))
        .unwrap();
    c.remove(&root, "g").unwrap();
    assert_eq!(c.getattr(&g).unwrap_err(), nfsstat3::NFS3ERR_STALE);
    for i in 0..20 {
        c.create(
            &root,
            &format!("n{i}"),
            createhow3::UNCHECKED(sattr3::default()),
        )
        .unwrap();
    }
    assert_eq!(c.getattr(&g).unwrap_err(), nfsstat3::NFS3ERR_STALE);
    // Forged handles: another length, or f's with its inode number changed.
    let short = nfs::nfs_fh3 {
        data: f.data.to_vec()[..20].to_vec().into(),
    };
    assert_eq!(c.getattr(&short).unwrap_err(), nfsstat3::NFS3ERR_BADHANDLE);
    let mut bytes = f.data.to_vec();
    let last = bytes.len() - 9; // the inode's low byte
    bytes[last] ^= 0x5a;
    let forged = nfs::nfs_fh3 { data: bytes.into() };
    let e = c.read(&forged, 0, 4096).unwrap_err();
    assert!(
        e == nfsstat3::NFS3ERR_STALE || e == nfsstat3::NFS3ERR_BADHANDLE,
        "{e:?}"
    );
    // FSSTAT: the default pool's real space (about 18 GB), not a made-up terabyte.
    let st = c.fsstat(&root).unwrap();
    assert!(st.tbytes > 10 << 30 && st.tbytes < 30 << 30, "{st:?}");
    assert!(st.abytes <= st.fbytes && st.fbytes <= st.tbytes, "{st:?}");
    // Exclusive CREATE: the same verifier finds its own file again; another is EXIST.
    let v = createverf3([1, 2, 3, 4, 5, 6, 7, 8]);
    let x1 = c.create(&root, "x", createhow3::EXCLUSIVE(v)).unwrap();
    let x2 = c.create(&root, "x", createhow3::EXCLUSIVE(v)).unwrap();
    assert_eq!(x1.data.to_vec(), x2.data.to_vec());
    let other = createverf3([9; 8]);
    assert_eq!(
        c.create(&root, "x", createhow3::EXCLUSIVE(other))
            .unwrap_err(),
        nfsstat3::NFS3ERR_EXIST
    );

    // kill -9: nothing synced, unmounted or exported. The restart imports the pool and
    // replays the intent log.
    drop(c);
    d.kill9();
    let d = serve(&data);
    let mut c = Rpc::connect(&d.nfs).unwrap();
    let a = c.getattr(&f).unwrap();
    assert_eq!(a.size, (4 << 20) + 4096);
    let mut back = Vec::new();
    loop {
        let (chunk, eof) = c.read(&f, back.len() as u64, 1 << 20).unwrap();
        back.extend_from_slice(&chunk);
        if eof {
            break;
        }
        assert!(!chunk.is_empty());
    }
    assert!(
        back[..4 << 20] == body[..],
        "committed data differs after kill -9"
    );
    assert!(
        back[4 << 20..] == tail[..],
        "the FILE_SYNC write differs after kill -9"
    );
    let w = c.write(&f, 0, &body[..4096], stable_how::UNSTABLE).unwrap();
    assert_ne!(w.verf, verf.unwrap(), "a new start has a new verifier");
    assert_eq!(c.getattr(&g).unwrap_err(), nfsstat3::NFS3ERR_STALE);
    assert!(c.lookup(&root, "x").is_ok());
}

/// A pool that goes SUSPENDED under an export (its one device on a file system that fills)
/// and is then cleared (`tank pool clear`) once the device has room: the daemon runs on, the
/// pool is opened again from its devices, what COMMIT acknowledged before is there, and the
/// write verifier has changed, so that a client sends its uncommitted writes again instead
/// of taking a later COMMIT as covering them.
#[test]
fn nfs_a_suspended_pool_cleared_changes_the_write_verifier() {
    const NAME: &str = "nfs_a_suspended_pool_cleared_changes_the_write_verifier";
    let tmp = tempfile::tempdir().unwrap();
    let tiny = tmp.path().join("tiny");
    // The device's file system: a 40 MiB tmpfs, which a 64 MiB write fills.
    let Some(tiny_fs) = common::Tmpfs::mount(NAME, &tiny, "40M") else {
        return;
    };
    let data = tmp.path().join("data");
    let d = serve(&data);
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
    );
    tank(&data, &["dataset", "create", "p2/v"]);
    tank(
        &data,
        &[
            "share",
            "add",
            "nfs",
            "v",
            "p2/v",
            "-o",
            "clients=127.0.0.1",
            "-o",
            "squash=none",
        ],
    );
    let mut c = Rpc::connect(&d.nfs).unwrap();
    let root = c.mount("/v").unwrap();
    let f = c
        .create(&root, "f", createhow3::UNCHECKED(sattr3::default()))
        .unwrap();
    let body = pattern(1 << 20, 21);
    let w = c.write(&f, 0, &body, stable_how::UNSTABLE).unwrap();
    let before = w.verf;
    assert_eq!(c.commit(&f).unwrap(), before);

    // More than the device's file system holds, unstable: the pool suspends when its txg
    // is written. Writes may start failing once it has.
    let g = c
        .create(&root, "g", createhow3::UNCHECKED(sattr3::default()))
        .unwrap();
    let chunk = pattern(1 << 20, 22);
    for i in 0..64u64 {
        if c.write(&g, i << 20, &chunk, stable_how::UNSTABLE).is_err() {
            break;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = tank(&data, &["pool", "status", "p2"]);
        if status.contains("SUSPENDED") {
            assert!(status.contains("tank pool clear p2"), "{status}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the pool never suspended: {status}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        c.commit(&g).is_err(),
        "a COMMIT on a suspended pool succeeded"
    );

    // The device gets room; `pool clear` opens the pool again in the running daemon.
    tiny_fs.resize("512M");
    let out = Command::new(env!("CARGO_BIN_EXE_tank"))
        .args(["pool", "clear", "p2"])
        .env("TANK_DATA_DIR", &data)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && said.contains("opened again"),
        "{said}"
    );
    let status = tank(&data, &["pool", "status", "p2"]);
    assert!(
        status.contains("ONLINE") && !status.contains("SUSPENDED"),
        "{status}"
    );

    let mut c = Rpc::connect(&d.nfs).unwrap();
    let after = c.commit(&f).unwrap();
    assert_ne!(
        after, before,
        "the verifier did not change, though uncommitted writes were dropped"
    );
    let (back, _) = c.read(&f, 0, 1 << 20).unwrap();
    assert!(back == body, "committed data differs after the clear");
    // The export writes and commits again.
    let w = c.write(&g, 0, &chunk, stable_how::UNSTABLE).unwrap();
    assert_eq!(c.commit(&g).unwrap(), w.verf);

    // An exported pool is no longer served (as `zpool export` unshares); imported again,
    // it is, from the imported pool.
    tank(&data, &["pool", "export", "p2"]);
    assert!(
        c.read(&f, 0, 4096).is_err(),
        "an exported pool is still served"
    );
    tank(
        &data,
        &["pool", "import", "-d", &tiny.to_string_lossy(), "p2"],
    );
    let (back, _) = c.read(&f, 0, 1 << 20).unwrap();
    assert!(
        back == body,
        "committed data differs after export and import"
    );
    let (back, _) = c.read(&g, 0, 1 << 20).unwrap();
    assert!(
        back == chunk,
        "the write after the clear differs after export and import"
    );
}

/// Malformed records and calls get the RPC error they deserve or a closed connection;
/// nothing panics, the daemon keeps serving, and a bounded run of random calls changes
/// nothing of what is there.
#[test]
fn nfs_answers_bad_input_with_errors_and_keeps_serving() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut d = serve(&data);
    open_share(&data, "b");
    let mut c = Rpc::connect(&d.nfs).unwrap();
    let root = c.mount("/b").unwrap();
    let f = c
        .create(&root, "keep", createhow3::UNCHECKED(sattr3::default()))
        .unwrap();
    let kept = pattern(100_000, 3);
    c.write(&f, 0, &kept, stable_how::FILE_SYNC).unwrap();

    let refused = |r: std::io::Result<Reply>, what: &str| match r.unwrap() {
        Reply::Refused(why) | Reply::Denied(why) => assert!(why.contains(what), "{why}"),
        Reply::Success(_) => panic!("accepted, expected {what}"),
    };
    refused(c.call_raw(100_099, 1, 0, &[]), "PROG_UNAVAIL");
    refused(c.call_raw(nfs::PROGRAM, 2, 0, &[]), "PROG_MISMATCH");
    refused(c.call_raw(nfs::PROGRAM, 3, 99, &[]), "PROC_UNAVAIL");
    refused(c.call_raw(nfs::PROGRAM, 3, 1, &[1, 2, 3]), "GARBAGE_ARGS");
    // Trailing bytes after a GETATTR's handle.
    let mut args = Vec::new();
    use nfs3_server::nfs3_types::xdr_codec::Pack;
    nfs::GETATTR3args { object: f.clone() }
        .pack(&mut args)
        .unwrap();
    args.extend_from_slice(&[0, 0, 0, 7]);
    refused(c.call_raw(nfs::PROGRAM, 3, 1, &args), "GARBAGE_ARGS");
    // The connection still serves.
    assert!(c.getattr(&f).is_ok());

    let closed = |c: &mut Rpc| {
        // The server closes the connection: a read ends (or fails) soon.
        let t = Instant::now();
        assert!(c.read_record().is_err(), "the connection stayed open");
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "closed only after {:?}",
            t.elapsed()
        );
    };
    // A record that is not an RPC call.
    let mut c2 = Rpc::connect(&d.nfs).unwrap();
    c2.send_record(&pattern(64, 5)).unwrap();
    closed(&mut c2);
    // A record header announcing 2 GiB: refused before anything is read or allocated.
    let mut c3 = Rpc::connect(&d.nfs).unwrap();
    c3.send_raw(&0xffff_fff0u32.to_be_bytes()).unwrap();
    closed(&mut c3);
    // Many fragments adding up past the limit.
    let mut c4 = Rpc::connect(&d.nfs).unwrap();
    let frag = vec![0u8; 512 << 10];
    let mut cut = false;
    for _ in 0..8 {
        let h = (frag.len() as u32).to_be_bytes();
        if c4.send_raw(&h).is_err() || c4.send_raw(&frag).is_err() {
            cut = true;
            break;
        }
    }
    if !cut {
        closed(&mut c4);
    }
    // A truncated record, then the client goes away.
    let mut c5 = Rpc::connect(&d.nfs).unwrap();
    c5.send_raw(&(1000u32 | 0x8000_0000).to_be_bytes()).unwrap();
    c5.send_raw(&[0u8; 10]).unwrap();
    drop(c5);

    // A bounded run of random calls: random procedures of NFS and MOUNT with random
    // arguments, some starting with a real handle.
    let mut x = 0x1234_5678_9abc_def1u64;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut c6 = Rpc::connect(&d.nfs).unwrap();
    for i in 0..2000 {
        let prog = if i % 5 == 0 {
            nfs3_server::nfs3_types::mount::PROGRAM
        } else {
            nfs::PROGRAM
        };
        let proc_ = (rnd() % 23) as u32;
        let len = (rnd() % 200) as usize;
        let mut args: Vec<u8> = (0..len).map(|_| rnd() as u8).collect();
        if i % 2 == 0 {
            let mut a = Vec::new();
            f.pack(&mut a).unwrap();
            a.extend_from_slice(&args);
            args = a;
        }
        // Writes through the random bytes would be legitimate changes: keep 'keep' as it
        // is by never sending procedures that change things with its real handle.
        if i % 2 == 0
            && prog == nfs::PROGRAM
            && matches!(proc_, 2 | 7 | 8 | 9 | 10 | 11 | 12 | 13 | 14 | 15 | 21)
        {
            continue;
        }
        let t = Instant::now();
        match c6.call_raw(prog, 3, proc_, &args) {
            Ok(_) => {}
            Err(_) => c6 = Rpc::connect(&d.nfs).unwrap(),
        }
        // Each is answered (or its connection closed) at once.
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "call {i} (program {prog}, procedure {proc_}, {} bytes) took {:?}",
            args.len(),
            t.elapsed()
        );
    }
    assert!(d.alive(), "the daemon died");
    let mut c7 = Rpc::connect(&d.nfs).unwrap();
    assert!(matches!(
        c7.call_raw(nfs::PROGRAM, 3, 0, &[]).unwrap(),
        Reply::Success(_)
    ));
    let (back, eof) = c7.read(&f, 0, 200_000).unwrap();
    assert!(eof && back == kept, "the file changed");
}

/// One operation of the permission matrix, on paths relative to a tree's root.
#[derive(Debug, Clone)]
enum Op {
    Read(String),
    List(String),
    Stat(String),
    Append(String),
    Truncate(String),
    Create(String),
    Mkdir(String),
    Symlink(String),
    Rename(String, String),
    Remove(String),
    Rmdir(String),
    Chmod(String),
    Chown(String),
    Chgrp(String),
    SetMtime(String),
    TouchNow(String),
}

/// The operation through the local mount, as `uid` with `groups` (the first is the
/// primary group): a shell command under setpriv. Whether it succeeded.
fn local_op(tree: &Path, op: &Op, uid: u32, groups: &[u32]) -> bool {
    let p = |s: &str| tree.join(s).to_string_lossy().into_owned();
    let (script, args): (&str, Vec<String>) = match op {
        Op::Read(a) => ("cat -- \"$1\" > /dev/null", vec![p(a)]),
        Op::List(a) => ("ls -- \"$1\" > /dev/null", vec![p(a)]),
        Op::Stat(a) => ("stat -- \"$1\" > /dev/null", vec![p(a)]),
        Op::Append(a) => ("[ -e \"$1\" ] && printf x >> \"$1\"", vec![p(a)]),
        Op::Truncate(a) => ("truncate -c -s 0 -- \"$1\"", vec![p(a)]),
        Op::Create(a) => ("set -C; : > \"$1\"", vec![p(a)]),
        Op::Mkdir(a) => ("mkdir -m 755 -- \"$1\"", vec![p(a)]),
        Op::Symlink(a) => ("ln -s target -- \"$1\"", vec![p(a)]),
        Op::Rename(a, b) => ("mv -T -- \"$1\" \"$2\"", vec![p(a), p(b)]),
        Op::Remove(a) => ("rm -- \"$1\"", vec![p(a)]),
        Op::Rmdir(a) => ("rmdir -- \"$1\"", vec![p(a)]),
        Op::Chmod(a) => ("chmod 640 -- \"$1\"", vec![p(a)]),
        Op::Chown(a) => ("chown 1002 -- \"$1\"", vec![p(a)]),
        Op::Chgrp(a) => ("chgrp 1000 -- \"$1\"", vec![p(a)]),
        Op::SetMtime(a) => ("touch -c -m -d @1000000 -- \"$1\"", vec![p(a)]),
        Op::TouchNow(a) => ("[ -e \"$1\" ] && touch -c -m -- \"$1\"", vec![p(a)]),
    };
    let groups: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
    let out = Command::new("setpriv")
        .args([
            "--reuid",
            &uid.to_string(),
            "--regid",
            &groups[0],
            "--groups",
            &groups.join(","),
            "--",
            "sh",
            "-c",
            script,
            "sh",
        ])
        .args(&args)
        .current_dir("/")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    out.status.success()
}

/// The same operation through NFS, as a client sends it.
fn nfs_op(c: &mut Rpc, root: &nfs::nfs_fh3, op: &Op) -> bool {
    let split = |s: &str| -> (String, String) {
        match s.rsplit_once('/') {
            Some((d, n)) => (d.to_string(), n.to_string()),
            None => (String::new(), s.to_string()),
        }
    };
    let set = |f: &dyn Fn(&mut sattr3)| {
        let mut s = sattr3::default();
        f(&mut s);
        s
    };
    let r: Result<(), nfsstat3> = (|| match op {
        Op::Read(a) => {
            let fh = c.walk(root, a)?;
            c.read(&fh, 0, 1 << 20).map(|_| ())
        }
        Op::List(a) => {
            let fh = c.walk(root, a)?;
            c.readdir(&fh).map(|_| ())
        }
        Op::Stat(a) => {
            let fh = c.walk(root, a)?;
            c.getattr(&fh).map(|_| ())
        }
        Op::Append(a) => {
            let fh = c.walk(root, a)?;
            let size = c.getattr(&fh)?.size;
            c.write(&fh, size, b"x", stable_how::FILE_SYNC).map(|_| ())
        }
        Op::Truncate(a) => {
            let fh = c.walk(root, a)?;
            c.setattr(&fh, set(&|s| s.size = nfs::Nfs3Option::Some(0)))
        }
        Op::Create(a) => {
            let (d, n) = split(a);
            let dir = c.walk(root, &d)?;
            let attrs = set(&|s| s.mode = nfs::Nfs3Option::Some(0o644));
            c.create(&dir, &n, createhow3::GUARDED(attrs)).map(|_| ())
        }
        Op::Mkdir(a) => {
            let (d, n) = split(a);
            let dir = c.walk(root, &d)?;
            c.mkdir(&dir, &n, 0o755).map(|_| ())
        }
        Op::Symlink(a) => {
            let (d, n) = split(a);
            let dir = c.walk(root, &d)?;
            c.symlink(&dir, &n, "target")
        }
        Op::Rename(a, b) => {
            let ((fd, fname), (td, tname)) = (split(a), split(b));
            let from = c.walk(root, &fd)?;
            let to = c.walk(root, &td)?;
            c.rename(&from, &fname, &to, &tname)
        }
        Op::Remove(a) => {
            let (d, n) = split(a);
            let dir = c.walk(root, &d)?;
            c.remove(&dir, &n)
        }
        Op::Rmdir(a) => {
            let (d, n) = split(a);
            let dir = c.walk(root, &d)?;
            c.rmdir(&dir, &n)
        }
        Op::Chmod(a) => {
            let fh = c.walk(root, a)?;
            c.setattr(&fh, set(&|s| s.mode = nfs::Nfs3Option::Some(0o640)))
        }
        Op::Chown(a) => {
            let fh = c.walk(root, a)?;
            c.setattr(&fh, set(&|s| s.uid = nfs::Nfs3Option::Some(1002)))
        }
        Op::Chgrp(a) => {
            let fh = c.walk(root, a)?;
            c.setattr(&fh, set(&|s| s.gid = nfs::Nfs3Option::Some(1000)))
        }
        Op::SetMtime(a) => {
            let fh = c.walk(root, a)?;
            c.setattr(
                &fh,
                set(&|s| {
                    s.mtime = nfs::set_mtime::SET_TO_CLIENT_TIME(nfs::nfstime3 {
                        seconds: 1_000_000,
                        nseconds: 0,
                    })
                }),
            )
        }
        Op::TouchNow(a) => {
            let fh = c.walk(root, a)?;
            c.setattr(&fh, set(&|s| s.mtime = nfs::set_mtime::SET_TO_SERVER_TIME))
        }
    })();
    r.is_ok()
}

/// Every operation, as three users, through NFS and through the local mount (where the
/// kernel checks each access, `default_permissions`), on two identical trees: the outcome
/// is the same every time. The trees hold the cases that matter: private files, a group
/// directory, a sticky directory with others' files, a directory one may read but not
/// search, one one may search but not read.
#[test]
fn nfs_permissions_are_the_local_ones_for_every_operation() {
    const NAME: &str = "nfs_permissions_are_the_local_ones_for_every_operation";
    if let Some(why) = common::fuse_missing() {
        common::skip(NAME, &format!("the local side needs the FUSE mount: {why}"));
        return;
    }
    if !Path::new("/usr/bin/setpriv").exists() && !Path::new("/bin/setpriv").exists() {
        common::skip(NAME, "setpriv (util-linux) is not installed");
        return;
    }
    let uid0 = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1)?.parse::<u32>().ok());
    if uid0 != Some(0) {
        common::skip(NAME, "needs root to act as other users");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let data = tmp.path().join("data");
    let d = serve(&data);
    open_share(&data, "perm");
    let mnt = data.join("mnt/tank/perm");
    assert!(mnt.is_dir(), "the dataset is not mounted");
    // Every directory from / down must be searchable by the users.
    for dir in mnt.ancestors() {
        if dir.starts_with(tmp.path()) {
            let mode = std::fs::metadata(dir).unwrap().permissions().mode();
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | 0o755)).unwrap();
        }
    }
    let build = |t: &Path| {
        let mk = |p: &str, uid: u32, gid: u32, mode: u32, dir: bool| {
            let path = t.join(p);
            if dir {
                std::fs::create_dir(&path).unwrap();
            } else {
                std::fs::write(&path, b"content").unwrap();
            }
            std::os::unix::fs::chown(&path, Some(uid), Some(gid)).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        std::fs::create_dir(t).unwrap();
        mk("open", 0, 0, 0o755, true);
        for (f, m) in [
            ("f644", 0o644),
            ("f600", 0o600),
            ("f640", 0o640),
            ("f666", 0o666),
            ("ro444", 0o444),
        ] {
            mk(&format!("open/{f}"), 1000, 1000, m, false);
        }
        mk("own", 1000, 1000, 0o755, true);
        mk("own/x", 1000, 1000, 0o644, false);
        std::fs::set_permissions(t.join("own"), std::fs::Permissions::from_mode(0o700)).unwrap();
        mk("grp", 1000, 1000, 0o770, true);
        mk("grp/y", 1000, 1000, 0o664, false);
        mk("gdir", 1000, 1000, 0o775, true);
        mk("sticky", 0, 0, 0o1777, true);
        for (f, u) in [("a", 1000), ("b", 1001), ("c", 1002)] {
            mk(&format!("sticky/{f}"), u, u, 0o644, false);
        }
        mk("nosearch", 1000, 1000, 0o755, true);
        mk("nosearch/w", 1000, 1000, 0o644, false);
        std::fs::set_permissions(t.join("nosearch"), std::fs::Permissions::from_mode(0o744))
            .unwrap();
        mk("noread", 1000, 1000, 0o755, true);
        mk("noread/z", 1000, 1000, 0o644, false);
        std::fs::set_permissions(t.join("noread"), std::fs::Permissions::from_mode(0o311)).unwrap();
    };
    build(&mnt.join("L"));
    build(&mnt.join("N"));

    let mut c = Rpc::connect(&d.nfs).unwrap();
    let export = c.mount("/perm").unwrap();
    let n_root = c.lookup(&export, "N").unwrap();
    // Others first, then the group member, then the owner: a denied attempt comes before
    // the one that may do it.
    let users: [(u32, Vec<u32>); 3] = [
        (1002, vec![1002]),
        (1001, vec![1001, 1000]),
        (1000, vec![1000]),
    ];
    let (mut allowed, mut denied) = (0, 0);
    for (uid, groups) in &users {
        let u = uid.to_string();
        let s = |x: &str| x.to_string();
        let ops = vec![
            Op::Read(s("open/f644")),
            Op::Read(s("open/f600")),
            Op::Read(s("open/f640")),
            Op::Read(s("own/x")),
            Op::Read(s("grp/y")),
            Op::Read(s("nosearch/w")),
            Op::Read(s("noread/z")),
            Op::List(s("open")),
            Op::List(s("own")),
            Op::List(s("noread")),
            Op::Stat(s("own/x")),
            Op::Stat(s("nosearch/w")),
            Op::Stat(s("noread/z")),
            Op::Append(s("open/f644")),
            Op::Append(s("open/f666")),
            Op::Append(s("open/ro444")),
            Op::Append(s("grp/y")),
            Op::Truncate(s("open/f640")),
            Op::Create(format!("open/new.{u}")),
            Op::Create(format!("grp/new.{u}")),
            Op::Create(format!("own/new.{u}")),
            Op::Create(format!("sticky/new.{u}")),
            Op::Create(format!("gdir/new.{u}")),
            Op::Create(format!("noread/new.{u}")),
            Op::Create(format!("nosearch/new.{u}")),
            Op::Mkdir(format!("grp/d.{u}")),
            Op::Mkdir(format!("open/d.{u}")),
            Op::Symlink(format!("grp/s.{u}")),
            Op::Symlink(format!("gdir/s.{u}")),
            Op::Rename(format!("grp/new.{u}"), format!("grp/ren.{u}")),
            Op::Rename(s("sticky/b"), format!("sticky/b.{u}")),
            Op::Rename(format!("sticky/new.{u}"), format!("sticky/mine.{u}")),
            Op::Remove(s("sticky/c")),
            Op::Remove(s("sticky/a")),
            Op::Remove(format!("gdir/s.{u}")),
            Op::Remove(s("grp/y")),
            Op::Rmdir(format!("grp/d.{u}")),
            Op::Chmod(s("open/f644")),
            Op::Chown(s("open/f666")),
            Op::Chgrp(s("own/x")),
            Op::Chgrp(s("open/f600")),
            Op::SetMtime(s("open/f666")),
            Op::TouchNow(s("open/f666")),
            Op::TouchNow(s("open/f600")),
        ];
        c.auth = Some((*uid, groups[0]));
        c.groups = groups.clone();
        for op in ops {
            let local = local_op(&mnt.join("L"), &op, *uid, groups);
            let remote = nfs_op(&mut c, &n_root, &op);
            assert_eq!(
                remote,
                local,
                "{op:?} as uid {uid} (groups {groups:?}): NFS {} but the local mount {}",
                if remote { "allowed it" } else { "refused it" },
                if local { "allows it" } else { "refuses it" }
            );
            if local {
                allowed += 1;
            } else {
                denied += 1;
            }
        }
    }
    // The matrix has both outcomes in number.
    assert!(
        allowed > 30 && denied > 30,
        "allowed {allowed}, denied {denied}"
    );
}

/// Why the kernel's NFS client cannot be used here, if it cannot.
fn kernel_client_missing() -> Option<String> {
    let uid0 = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1)?.parse::<u32>().ok());
    if uid0 != Some(0) {
        return Some("mounting needs root".into());
    }
    let has_nfs = || {
        std::fs::read_to_string("/proc/filesystems")
            .unwrap_or_default()
            .lines()
            .any(|l| l.split_whitespace().last() == Some("nfs"))
    };
    if !has_nfs() {
        // A module that is there but not loaded yet.
        let _ = Command::new("modprobe")
            .arg("nfs")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    if !has_nfs() {
        return Some("the kernel has no NFS client ('nfs' is not in /proc/filesystems)".into());
    }
    let helper = ["/sbin/mount.nfs", "/usr/sbin/mount.nfs"];
    if !helper.iter().any(|h| Path::new(h).exists()) {
        return Some("mount.nfs is not installed (Debian: nfs-common)".into());
    }
    None
}

/// A real `mount -t nfs -o vers=3,nolock` of a share, with a small workload through it:
/// files written, listed, read back and removed, and seen through NFS as the local mount
/// sees them.
#[test]
fn a_kernel_nfs_mount_serves_a_small_workload() {
    const NAME: &str = "a_kernel_nfs_mount_serves_a_small_workload";
    if let Some(why) = kernel_client_missing() {
        if std::env::var_os("CI").is_some() {
            println!("{NAME}: not run: {why}");
        }
        common::skip(NAME, &why);
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let d = serve(&data);
    open_share(&data, "k");
    let port = d.nfs.rsplit(':').next().unwrap().to_string();
    let dir = tmp.path().join("nfsmnt");
    std::fs::create_dir(&dir).unwrap();
    let out = Command::new("mount")
        .args([
            "-t",
            "nfs",
            "-o",
            &format!("vers=3,proto=tcp,nolock,port={port},mountport={port},mountproto=tcp"),
            "127.0.0.1:/k",
        ])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mount: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result = std::panic::catch_unwind(|| {
        for i in 0..20 {
            let body = pattern(100_000 + i * 777, i as u64);
            std::fs::write(dir.join(format!("f{i}")), &body).unwrap();
            assert!(std::fs::read(dir.join(format!("f{i}"))).unwrap() == body);
        }
        std::fs::create_dir(dir.join("sub")).unwrap();
        std::fs::rename(dir.join("f0"), dir.join("sub/f0")).unwrap();
        let names = std::fs::read_dir(&dir).unwrap().count();
        assert_eq!(names, 20);
        std::fs::remove_file(dir.join("sub/f0")).unwrap();
        std::fs::remove_dir(dir.join("sub")).unwrap();
    });
    let _ = Command::new("umount").arg(&dir).status();
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

/// Snapshots are served read-only under `.tank/snapshot` of each filesystem, and a child
/// dataset is reached through its parent's export (crossmnt), each with its own fsid; a
/// destroyed snapshot's handles are stale; rename and link do not cross datasets.
#[test]
fn nfs_serves_snapshots_read_only_and_child_datasets() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let d = serve(&data);
    open_share(&data, "s");
    let mut c = Rpc::connect(&d.nfs).unwrap();
    let root = c.mount("/s").unwrap();
    let f = c
        .create(&root, "f", createhow3::UNCHECKED(sattr3::default()))
        .unwrap();
    c.write(&f, 0, b"before", stable_how::FILE_SYNC).unwrap();
    tank(&data, &["snapshot", "tank/s@one"]);
    c.write(&f, 0, b"after!", stable_how::FILE_SYNC).unwrap();

    // `.tank` is found by name (not listed, like ZFS's hidden .zfs).
    assert!(!c.readdir(&root).unwrap().iter().any(|n| n == ".tank"));
    let snapdir = c.walk(&root, ".tank/snapshot").unwrap();
    assert_eq!(c.readdir(&snapdir).unwrap(), ["one"]);
    let old = c.walk(&root, ".tank/snapshot/one/f").unwrap();
    assert_eq!(c.read(&old, 0, 100).unwrap().0, b"before");
    assert_eq!(c.read(&f, 0, 100).unwrap().0, b"after!");
    // Read-only, every way in.
    assert_eq!(
        c.write(&old, 0, b"x", stable_how::FILE_SYNC).unwrap_err(),
        nfsstat3::NFS3ERR_ROFS
    );
    let sroot = c.walk(&root, ".tank/snapshot/one").unwrap();
    for dir in [&sroot, &snapdir] {
        assert_eq!(
            c.create(dir, "new", createhow3::UNCHECKED(sattr3::default()))
                .unwrap_err(),
            nfsstat3::NFS3ERR_ROFS
        );
    }
    assert_eq!(c.remove(&sroot, "f").unwrap_err(), nfsstat3::NFS3ERR_ROFS);
    let live = c.getattr(&root).unwrap();
    assert_ne!(c.getattr(&sroot).unwrap().fsid, live.fsid);
    // Up from the snapshot's root: `.tank/snapshot` again.
    let up = c.lookup(&sroot, "..").unwrap();
    assert_eq!(up.data.to_vec(), snapdir.data.to_vec());

    // A child dataset, reached through the parent's export.
    tank(&data, &["dataset", "create", "tank/s/child"]);
    let child = c.lookup(&root, "child").unwrap();
    assert_ne!(c.getattr(&child).unwrap().fsid, live.fsid);
    let cf = c
        .create(&child, "in-child", createhow3::UNCHECKED(sattr3::default()))
        .unwrap();
    c.write(&cf, 0, b"child data", stable_how::FILE_SYNC)
        .unwrap();
    let back_up = c.lookup(&child, "..").unwrap();
    assert_eq!(back_up.data.to_vec(), root.data.to_vec());
    // The file is the child dataset's: its own share shows it.
    tank(
        &data,
        &[
            "share",
            "add",
            "nfs",
            "kid",
            "tank/s/child",
            "-o",
            "clients=127.0.0.1",
            "-o",
            "squash=none",
        ],
    );
    let kid = c.mount("/kid").unwrap();
    let via_kid = c.lookup(&kid, "in-child").unwrap();
    assert_eq!(c.read(&via_kid, 0, 100).unwrap().0, b"child data");
    // No rename or link across datasets.
    assert_eq!(
        c.rename(&root, "f", &child, "f").unwrap_err(),
        nfsstat3::NFS3ERR_XDEV
    );
    assert_eq!(c.link(&f, &child, "f").unwrap_err(), nfsstat3::NFS3ERR_XDEV);

    // A child with a mountpoint of its own deeper in the parent's tree is reached at that
    // path, not at its name; `..` from its root is the directory that holds it.
    let smp = tank(&data, &["dataset", "get", "-H", "mountpoint", "tank/s"]);
    let smp = smp.split('\t').nth(2).unwrap().trim().to_string();
    assert!(smp.starts_with('/'), "{smp}");
    let x = c.mkdir(&root, "x", 0o755).unwrap();
    tank(
        &data,
        &[
            "dataset",
            "create",
            "-o",
            &format!("mountpoint={smp}/x/deep"),
            "tank/s/deep",
        ],
    );
    let deep = c.walk(&root, "x/deep").unwrap();
    let deep_fsid = c.getattr(&deep).unwrap().fsid;
    assert_ne!(deep_fsid, live.fsid);
    assert_ne!(deep_fsid, c.getattr(&child).unwrap().fsid);
    let df = c
        .create(&deep, "in-deep", createhow3::UNCHECKED(sattr3::default()))
        .unwrap();
    c.write(&df, 0, b"deep data", stable_how::FILE_SYNC)
        .unwrap();
    assert_eq!(
        c.lookup(&deep, "..").unwrap().data.to_vec(),
        x.data.to_vec()
    );
    assert_eq!(
        c.lookup(&root, "deep").unwrap_err(),
        nfsstat3::NFS3ERR_NOENT
    );
    // A child mounted outside the parent's tree is not reached through it.
    let away = tmp.path().join("away");
    tank(
        &data,
        &[
            "dataset",
            "create",
            "-o",
            &format!("mountpoint={}", away.display()),
            "tank/s/away",
        ],
    );
    assert_eq!(
        c.lookup(&root, "away").unwrap_err(),
        nfsstat3::NFS3ERR_NOENT
    );

    // A destroyed snapshot: its handles are stale, its name gone.
    tank(&data, &["dataset", "destroy", "tank/s@one"]);
    assert_eq!(c.read(&old, 0, 10).unwrap_err(), nfsstat3::NFS3ERR_STALE);
    assert!(c.readdir(&snapdir).unwrap().is_empty());
    assert_eq!(
        c.lookup(&snapdir, "one").unwrap_err(),
        nfsstat3::NFS3ERR_NOENT
    );
}

/// Why the standard ports cannot be used here, if they cannot.
fn standard_ports_missing() -> Option<String> {
    let uid = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1)?.parse::<u32>().ok());
    if uid != Some(0) {
        return Some("binding ports 2049 and 111 needs root".into());
    }
    if std::net::TcpListener::bind("127.0.0.1:2049").is_err() {
        return Some("port 2049 of 127.0.0.1 is taken by another server".into());
    }
    None
}

/// Whether a system rpcbind answers on its local socket.
fn rpcbind_runs() -> bool {
    ["/run/rpcbind.sock", "/var/run/rpcbind.sock"]
        .iter()
        .any(|p| std::os::unix::net::UnixStream::connect(p).is_ok())
}

/// PMAPPROC_GETPORT over UDP to 127.0.0.1:111: the port of `prog` version `vers` over TCP.
fn pmap_getport(prog: u32, vers: u32) -> u32 {
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut call = Vec::new();
    for w in [
        0x7a11_0001u32,
        0,
        2,
        100_000,
        2,
        3,
        0,
        0,
        0,
        0,
        prog,
        vers,
        6,
        0,
    ] {
        call.extend_from_slice(&w.to_be_bytes());
    }
    sock.send_to(&call, "127.0.0.1:111").unwrap();
    let mut buf = [0u8; 512];
    let n = sock.recv(&mut buf).expect("the portmapper answers");
    assert!(n >= 28, "a short reply: {n} bytes");
    let w = |i: usize| u32::from_be_bytes(buf[i * 4..i * 4 + 4].try_into().unwrap());
    assert_eq!((w(0), w(1), w(2), w(5)), (0x7a11_0001, 1, 0, 0), "accepted");
    w(6)
}

/// On the standard port a stock client finds the server through the portmapper, without
/// being told any port: tank registers with the system's rpcbind where one runs, and
/// answers port 111 itself where none does. Only what is served is told (no NLM); a
/// registration is taken back at the stop.
#[test]
fn nfs_is_found_through_the_portmapper_on_the_standard_port() {
    const NAME: &str = "nfs_is_found_through_the_portmapper_on_the_standard_port";
    if let Some(why) = missing_tools().or_else(standard_ports_missing) {
        if std::env::var_os("CI").is_some() {
            println!("{NAME}: not run: {why}");
        }
        common::skip(NAME, &why);
        return;
    }
    let system = rpcbind_runs();
    if !system && std::net::TcpListener::bind("127.0.0.1:111").is_err() {
        let why = "port 111 is taken by a portmapper that has no local socket".to_string();
        common::skip(NAME, &why);
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let (d, lines) = serve_at(&data, "127.0.0.1:2049");
    let said = lines
        .iter()
        .find_map(|l| l.strip_prefix("nfs portmapper: "))
        .unwrap_or_else(|| panic!("no portmapper line in {lines:?}"))
        .to_string();
    if system {
        assert!(
            said.starts_with("registered with the system's rpcbind"),
            "{said}"
        );
    } else {
        assert_eq!(said, "answered by tank on 127.0.0.1:111");
        assert_eq!(pmap_getport(100_021, 4), 0, "NLM is not served");
        assert_eq!(pmap_getport(100_003, 4), 0, "NFSv4 is not served");
    }
    assert_eq!(pmap_getport(100_003, 3), 2049);
    assert_eq!(pmap_getport(100_005, 3), 2049);
    open_share(&data, "p");
    let body = pattern(300_000, 77);
    let src = tmp.path().join("src");
    std::fs::write(&src, &body).unwrap();
    // No port in the URLs: libnfs asks the portmapper on port 111.
    ok(
        "nfs-cp",
        &[src.to_str().unwrap(), "nfs://127.0.0.1/p/f?version=3"],
    );
    let back = ok("nfs-cat", &["nfs://127.0.0.1/p/f?version=3"]);
    assert!(back == body, "read back differs");
    let ls = String::from_utf8(ok("nfs-ls", &["nfs://127.0.0.1/p?version=3"])).unwrap();
    assert!(ls.contains(" f\n") || ls.ends_with(" f"), "{ls}");
    drop(d);
    if system {
        assert_eq!(
            pmap_getport(100_003, 3),
            0,
            "the registration outlived the stop"
        );
    }
}

/// kill -9 while a client writes: a writer sends 256 KiB UNSTABLE writes and a COMMIT
/// after every fourth, until the daemon dies under it, at three moments (just after its
/// first answered COMMIT, and after 16 and 48 MiB, each with answered writes not yet
/// committed). After the restart every byte of every
/// answered COMMIT is there; the writer's next COMMIT shows a new verifier, so it resends
/// everything since its last answered COMMIT, as a client does, and the file is then
/// whole.
#[test]
fn nfs_commits_answered_before_a_kill_9_mid_write_are_kept() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    const CHUNK: usize = 256 << 10;
    const MAX_CHUNKS: usize = 4096; // 1 GiB: the kill comes well before
    let chunk = |i: usize| pattern(CHUNK, 1000 + i as u64);
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut d = serve(&data);
    open_share(&data, "w");
    for (round, kill_after) in [1usize << 20, 16 << 20, 48 << 20].into_iter().enumerate() {
        let name = format!("f{round}");
        let mut c = Rpc::connect(&d.nfs).unwrap();
        let root = c.mount("/w").unwrap();
        let f = c
            .create(&root, &name, createhow3::UNCHECKED(sattr3::default()))
            .unwrap();
        let committed = Arc::new(AtomicU64::new(0));
        let progress = Arc::new(AtomicU64::new(0));
        let writer = {
            let (committed, progress, f) = (committed.clone(), progress.clone(), f.clone());
            std::thread::spawn(move || {
                // How many chunks were sent, and the verifier of the last COMMIT.
                let mut sent = 0;
                let mut verf = None;
                while sent < MAX_CHUNKS {
                    let Ok(w) = c.write(
                        &f,
                        (sent * CHUNK) as u64,
                        &chunk(sent),
                        stable_how::UNSTABLE,
                    ) else {
                        break;
                    };
                    assert_eq!(w.count as usize, CHUNK);
                    sent += 1;
                    progress.store(sent as u64, Ordering::SeqCst);
                    if sent % 4 == 0 {
                        let Ok(v) = c.commit(&f) else { break };
                        verf = Some(v);
                        committed.store((sent * CHUNK) as u64, Ordering::SeqCst);
                    }
                }
                (sent, verf)
            })
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        // Killed with 2 or 3 answered UNSTABLE writes not yet committed.
        let kill_at = (kill_after / CHUNK + 2 + round % 2) as u64;
        while progress.load(Ordering::SeqCst) < kill_at {
            assert!(
                Instant::now() < deadline,
                "round {round}: the writer is stuck"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
        d.kill9();
        let (sent, verf) = writer.join().unwrap();
        let acked = committed.load(Ordering::SeqCst) as usize;
        assert!(
            sent < MAX_CHUNKS,
            "round {round}: the writer finished before the kill"
        );
        eprintln!("round {round}: killed with {acked} bytes committed, {sent} chunks sent");
        d = serve(&data);
        let mut c = Rpc::connect(&d.nfs).unwrap();
        let size = c.getattr(&f).unwrap().size as usize;
        assert!(
            size >= acked,
            "round {round}: {size} bytes, {acked} were committed"
        );
        let read_all = |c: &mut Rpc, upto: usize| {
            let mut back = Vec::with_capacity(upto.min(64 << 20));
            loop {
                let (got, eof) = c.read(&f, back.len() as u64, 1 << 20).unwrap();
                back.extend_from_slice(&got);
                if eof || got.is_empty() || back.len() >= upto {
                    break;
                }
            }
            back
        };
        let back = read_all(&mut c, acked);
        for i in 0..acked / CHUNK {
            assert!(
                back[i * CHUNK..(i + 1) * CHUNK] == chunk(i)[..],
                "round {round}: committed chunk {i} differs after kill -9 ({acked} bytes committed)"
            );
        }
        // The client's recovery: a COMMIT whose verifier changed means resend.
        let v = c.commit(&f).unwrap();
        assert_ne!(
            Some(v),
            verf,
            "round {round}: the verifier outlived the restart"
        );
        for i in acked / CHUNK..sent {
            c.write(&f, (i * CHUNK) as u64, &chunk(i), stable_how::UNSTABLE)
                .unwrap();
        }
        assert_eq!(
            c.commit(&f).unwrap(),
            v,
            "round {round}: no restart between"
        );
        let back = read_all(&mut c, usize::MAX);
        // A write whose reply the kill cut off may have landed too (whole, in a txg that
        // synced): one chunk more.
        let whole = sent * CHUNK;
        assert!(
            back.len() == whole || back.len() == whole + CHUNK,
            "round {round}: {} bytes, {whole} were sent",
            back.len()
        );
        for (i, got) in back.chunks(CHUNK).enumerate() {
            assert!(
                got == chunk(i),
                "round {round}: chunk {i} of the resent file differs"
            );
        }
    }
}
/// Why the libnfs C workout cannot be built here, if it cannot.
fn libnfs_dev_missing() -> Option<String> {
    if !Path::new("/usr/include/nfsc/libnfs.h").exists() {
        return Some(
            "libnfs' headers are not installed (Debian: apt-get install libnfs-dev)".into(),
        );
    }
    if Command::new("cc").arg("--version").output().is_err() {
        return Some("no C compiler (Debian: apt-get install build-essential)".into());
    }
    None
}

/// libnfs' own C API (tests/libnfs_workout.c, built here with the system's compiler):
/// statvfs, mkdir, creat, odd-sized pwrites and preads of 3 MiB, fsync, fstat, a hole,
/// ftruncate, chmod, utimes to the microsecond, symlink and readlink, link, rename,
/// access, 300 files listed over several READDIRPLUS pages, unlink and rmdir, each result
/// and error checked; what it leaves is then read through the server by another client.
#[test]
fn libnfs_c_api_workout() {
    const NAME: &str = "libnfs_c_api_workout";
    if let Some(why) = missing_tools().or_else(libnfs_dev_missing) {
        if std::env::var_os("CI").is_some() {
            println!("{NAME}: not run: {why}");
        }
        common::skip(NAME, &why);
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let exe = tmp.path().join("libnfs_workout");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/libnfs_workout.c");
    let out = Command::new("cc")
        .args(["-Wall", "-Werror", "-O1", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg("-lnfs")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let data = tmp.path().join("data");
    let d = serve(&data);
    open_share(&data, "c");
    let said = String::from_utf8(ok(exe.to_str().unwrap(), &[&url(&d, "c", None)])).unwrap();
    let n: u32 = said
        .trim()
        .strip_prefix("libnfs workout: ")
        .and_then(|s| s.strip_suffix(" checks passed"))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("unexpected output: {said}"));
    assert!(n > 4000, "only {n} checks ran");
    let a = ok("nfs-cat", &[&url(&d, "c/final/a", None)]);
    assert_eq!(a, b"hello from libnfs\n");
    let ls = String::from_utf8(ok("nfs-ls", &[&url(&d, "c", None)])).unwrap();
    assert!(!ls.contains(" d\n"), "d was removed: {ls}");
}
