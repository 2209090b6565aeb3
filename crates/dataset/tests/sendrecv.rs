//! Send and receive between two pools: full, incremental, `-I` chains and bookmarks, every
//! file attribute compared by a walker that reads both sides; damaged, cut, misdirected and
//! out-of-order streams refused with the target unchanged; `-F`; resumable receives cut at
//! random offsets and finished with `send -t`; volumes.

mod posix_common;

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use posix_common::dsl::*;
use posix_common::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tank_dataset::posix::{Attr, Cred, FileKind, Fs, Ino, SetAttr, XattrMode, ROOT_INO};
use tank_dataset::recv::{self, RecvOptions};
use tank_dataset::send::{self, SendOptions};
use tank_dataset::{DatasetKind, DsHooks, Op};

fn pool() -> DsPool {
    let (mems, pool, store) = mem_pool(1, 512 << 20, bulk_txgs());
    let devs = mems
        .into_iter()
        .map(|m| m as tank_device::DeviceRef)
        .collect();
    DsPool::new(devs, pool, store)
}

fn run(p: &DsPool, op: Op) {
    p.dsl.run(op).unwrap();
}

fn n(s: &str) -> &OsStr {
    OsStr::from_bytes(s.as_bytes())
}

/// Everything a walker can see of one path: the attributes (inode number, kind, mode,
/// owner, links, size, blocks, all four times), the extended attributes, and the contents
/// (bytes of a file, target of a symlink).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    attr: Attr,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    content: Vec<u8>,
}

type Walk = BTreeMap<String, Seen>;

/// A mounted head: its access times change as it is read, so they are left out.
fn walk_live(fs: &Fs) -> Walk {
    let mut w = walk_fs(fs);
    for seen in w.values_mut() {
        seen.attr.atime = Default::default();
    }
    w
}

fn walk_fs(fs: &Fs) -> Walk {
    let cred = Cred::root();
    let mut out = Walk::new();
    let mut stack: Vec<(Ino, String)> = vec![(ROOT_INO, String::new())];
    while let Some((dir, path)) = stack.pop() {
        let mut cookie = 0;
        loop {
            let entries = fs.readdir(&cred, dir, cookie, 256).unwrap();
            let Some(last) = entries.last() else { break };
            cookie = last.cookie;
            for e in entries {
                if e.name == b"." || e.name == b".." {
                    continue;
                }
                let p = format!("{path}/{}", String::from_utf8_lossy(&e.name));
                let attr = fs.getattr(e.ino).unwrap();
                let mut xattrs = BTreeMap::new();
                for name in fs.listxattr(&cred, e.ino).unwrap() {
                    let v = fs.getxattr(&cred, e.ino, OsStr::from_bytes(&name)).unwrap();
                    xattrs.insert(name, v);
                }
                let content = match attr.kind {
                    FileKind::File => {
                        let mut data = Vec::new();
                        while (data.len() as u64) < attr.size {
                            let chunk = fs.read(e.ino, data.len() as u64, 1 << 20).unwrap();
                            assert!(!chunk.is_empty(), "{p}: short read");
                            data.extend_from_slice(&chunk);
                        }
                        data
                    }
                    FileKind::Symlink => fs.readlink(e.ino).unwrap(),
                    FileKind::Dir => {
                        stack.push((e.ino, p.clone()));
                        Vec::new()
                    }
                    _ => Vec::new(),
                };
                out.insert(
                    p,
                    Seen {
                        attr,
                        xattrs,
                        content,
                    },
                );
            }
        }
    }
    let root = fs.getattr(ROOT_INO).unwrap();
    out.insert(
        "/".into(),
        Seen {
            attr: root,
            xattrs: BTreeMap::new(),
            content: Vec::new(),
        },
    );
    out
}

/// A head walked read-only (a read-write mount would change access times, and a changed
/// target refuses an increment without -F, as ZFS's does).
fn walk_head(p: &DsPool, name: &str) -> Walk {
    let id = p.id(name);
    walk_read_only(p, id, p.dsl.objset(id).unwrap())
}

/// A snapshot walked read-only (so nothing, not even an access time, changes).
fn walk_snapshot(p: &DsPool, name: &str) -> Walk {
    let id = p.id(name);
    walk_read_only(p, id, p.dsl.snapshot_objset(id).unwrap())
}

fn walk_read_only(p: &DsPool, id: u64, objset: Arc<tank_object::ObjectSet>) -> Walk {
    let hooks = Arc::new(DsHooks {
        dsl: p.dsl.clone(),
        id,
        snapshot: true,
    });
    let fs = Fs::mount(p.store.clone(), objset, hooks, (0, 0)).unwrap();
    walk_fs(&fs)
}

/// As `assert_same`, access times aside (`got` is a mounted head).
fn assert_same_live(want: &Walk, got: &Walk, what: &str) {
    let mut want = want.clone();
    for seen in want.values_mut() {
        seen.attr.atime = Default::default();
    }
    assert_same(&want, got, what)
}

fn assert_same(want: &Walk, got: &Walk, what: &str) {
    let keys: std::collections::BTreeSet<&String> = want.keys().chain(got.keys()).collect();
    for k in keys {
        match (want.get(k), got.get(k)) {
            (Some(a), Some(b)) => {
                assert_eq!(a.attr, b.attr, "{what}: {k}: attributes differ");
                assert_eq!(a.xattrs, b.xattrs, "{what}: {k}: xattrs differ");
                assert!(a.content == b.content, "{what}: {k}: contents differ");
            }
            (a, b) => panic!(
                "{what}: {k}: source has {}, target {}",
                a.is_some(),
                b.is_some()
            ),
        }
    }
}

fn send_bytes(p: &DsPool, snap: &str, opts: &SendOptions) -> Vec<u8> {
    let mut out = Vec::new();
    send::send(&p.dsl, snap, opts, &mut out, &mut |_| {}).unwrap();
    out
}

fn receive(
    p: &DsPool,
    target: &str,
    stream: &[u8],
    opts: &RecvOptions,
) -> Result<recv::RecvSummary, String> {
    let mut input = stream;
    recv::receive(&p.dsl, target, &mut input, opts, &mut |_| {}).map_err(|e| e.to_string())
}

fn data(rng: &mut ChaCha8Rng, len: usize) -> Vec<u8> {
    // Half random, half repeated text: some blocks compress, some do not.
    let mut v = vec![0u8; len];
    rng.fill(&mut v[..len / 2]);
    for (i, b) in v[len / 2..].iter_mut().enumerate() {
        *b = b"tank send stream "[i % 17];
    }
    v
}

/// A filesystem with every kind of thing a stream must carry.
fn populate(fs: &Fs, rng: &mut ChaCha8Rng) {
    let c = Cred::root();
    let d = fs.mkdir(&c, ROOT_INO, n("docs"), 0o750).unwrap();
    for i in 0..40 {
        let f = fs
            .create(&c, d.ino, n(&format!("note{i}.txt")), 0o644, 0)
            .unwrap();
        fs.write(&c, f.ino, 0, &data(rng, 100 + i * 97), false)
            .unwrap();
        fs.release(f.ino).unwrap();
    }
    let big = fs.create(&c, ROOT_INO, n("big.bin"), 0o600, 0).unwrap();
    fs.write(&c, big.ino, 0, &data(rng, 3 << 20), false)
        .unwrap();
    // A hole between 3 MiB and 10 MiB, then more data.
    fs.write(&c, big.ino, 10 << 20, &data(rng, 200_000), false)
        .unwrap();
    fs.release(big.ino).unwrap();
    fs.symlink(&c, ROOT_INO, n("link"), n("docs/note1.txt"))
        .unwrap();
    let note = fs.lookup(&c, d.ino, n("note2.txt")).unwrap();
    fs.link(&c, note.ino, ROOT_INO, n("hardlink")).unwrap();
    fs.setxattr(&c, note.ino, n("user.colour"), b"blue", XattrMode::Any)
        .unwrap();
    fs.setxattr(&c, d.ino, n("user.big"), &vec![7u8; 2000], XattrMode::Any)
        .unwrap();
    fs.mknod(&c, ROOT_INO, n("fifo"), libc::S_IFIFO | 0o600, 0)
        .unwrap();
    let owned = fs.create(&c, ROOT_INO, n("owned"), 0o640, 0).unwrap();
    fs.release(owned.ino).unwrap();
    fs.setattr(
        &c,
        owned.ino,
        &SetAttr {
            uid: Some(1234),
            gid: Some(5678),
            ..Default::default()
        },
    )
    .unwrap();
}

/// Changes of every kind: removals (a whole large file among them), overwrites in the middle,
/// appends, renames, a new directory big enough to split leaves, attributes and xattrs.
fn change(fs: &Fs, rng: &mut ChaCha8Rng, round: usize) {
    let c = Cred::root();
    let docs = fs.lookup(&c, ROOT_INO, n("docs")).unwrap();
    for i in (round..40).step_by(7) {
        let _ = fs.unlink(&c, docs.ino, n(&format!("note{i}.txt")));
    }
    if let Ok(big) = fs.lookup(&c, ROOT_INO, n("big.bin")) {
        if round.is_multiple_of(2) {
            fs.write(&c, big.ino, 1 << 20, &data(rng, 5000), false)
                .unwrap();
        } else {
            fs.unlink(&c, ROOT_INO, n("big.bin")).unwrap();
        }
    }
    let dir = fs
        .mkdir(&c, ROOT_INO, n(&format!("round{round}")), 0o755)
        .unwrap();
    for i in 0..300 {
        let f = fs
            .create(&c, dir.ino, n(&format!("f{i:04}")), 0o644, 0)
            .unwrap();
        fs.write(&c, f.ino, 0, &data(rng, 50 + (i % 13) * 11), false)
            .unwrap();
        fs.release(f.ino).unwrap();
    }
    let _ = fs.rename(
        &c,
        ROOT_INO,
        n("owned"),
        dir.ino,
        n("owned-moved"),
        Default::default(),
    );
    if let Ok(note) = fs.lookup(&c, docs.ino, n("note2.txt")) {
        let _ = fs.removexattr(&c, note.ino, n("user.colour"));
        fs.setattr(
            &c,
            note.ino,
            &SetAttr {
                mode: Some(0o600),
                ..Default::default()
            },
        )
        .unwrap();
    }
}

fn snapshot(p: &DsPool, name: &str) {
    run(p, snapshot_op(name, false));
}

fn snapshots(p: &DsPool, ds: &str) -> Vec<(String, u64)> {
    let id = p.id(ds);
    p.dsl
        .snapshots(id)
        .into_iter()
        .map(|s| (p.dsl.name_of(s), p.dsl.record(s).unwrap().guid))
        .collect()
}

/// Two pools; on the first, `ptest/src` populated and snapshotted `@1`, then changed and
/// snapshotted once per round up to `@last`. The source stays mounted.
fn source(seed_default: u64, last: usize) -> (DsPool, DsPool, Mounted, ChaCha8Rng) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed(seed_default));
    let a = pool();
    let b = pool();
    run(&a, create_op("ptest/src"));
    let m = a.mount("ptest/src").unwrap();
    populate(&m.fs, &mut rng);
    m.fs.sync_all().unwrap();
    snapshot(&a, "ptest/src@1");
    for round in 2..=last {
        change(&m.fs, &mut rng, round);
        m.fs.sync_all().unwrap();
        snapshot(&a, &format!("ptest/src@{round}"));
    }
    (a, b, m, rng)
}

/// The increment of `ptest/src` from `@from` to `@to`.
fn increment(a: &DsPool, from: usize, to: usize) -> Vec<u8> {
    send_bytes(
        a,
        &format!("ptest/src@{to}"),
        &SendOptions {
            from: Some(format!("@{from}")),
            ..Default::default()
        },
    )
}

#[test]
fn full_incremental_chains_and_bookmarks_round_trip() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed(11));
    let a = pool();
    let b = pool();
    run(&a, create_op("ptest/src"));
    let m = a.mount("ptest/src").unwrap();
    populate(&m.fs, &mut rng);
    m.fs.sync_all().unwrap();
    snapshot(&a, "ptest/src@1");

    // Full.
    let full = send_bytes(&a, "ptest/src@1", &SendOptions::default());
    let got = receive(&b, "ptest/dst", &full, &RecvOptions::default()).unwrap();
    assert_eq!(got.snapshots, vec!["ptest/dst@1".to_string()]);
    assert_same(
        &walk_snapshot(&a, "ptest/src@1"),
        &walk_snapshot(&b, "ptest/dst@1"),
        "full",
    );
    assert_eq!(
        a.dsl.record(a.id("ptest/src@1")).unwrap().guid,
        b.dsl.record(b.id("ptest/dst@1")).unwrap().guid,
        "a received snapshot keeps its guid"
    );
    // The estimate (send -n) is the stream's size but for the BEGIN record's JSON.
    let est = send::estimate(&a.dsl, "ptest/src@1", &SendOptions::default()).unwrap();
    assert!(
        est.bytes.abs_diff(full.len() as u64) < 512,
        "estimate {} for {}",
        est.bytes,
        full.len()
    );
    // Compressed: the same result from a smaller stream.
    let compressed = send_bytes(
        &a,
        "ptest/src@1",
        &SendOptions {
            compressed: true,
            ..Default::default()
        },
    );
    assert!(
        compressed.len() < full.len(),
        "-c {} vs {}",
        compressed.len(),
        full.len()
    );
    receive(&b, "ptest/dstc", &compressed, &RecvOptions::default()).unwrap();
    assert_same(
        &walk_snapshot(&a, "ptest/src@1"),
        &walk_snapshot(&b, "ptest/dstc@1"),
        "-c",
    );

    // Incremental.
    change(&m.fs, &mut rng, 2);
    m.fs.sync_all().unwrap();
    snapshot(&a, "ptest/src@2");
    let inc = increment(&a, 1, 2);
    assert!(
        inc.len() < full.len() / 2,
        "increment {} vs full {}",
        inc.len(),
        full.len()
    );
    let est = send::estimate(
        &a.dsl,
        "ptest/src@2",
        &SendOptions {
            from: Some("@1".into()),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(
        est.bytes.abs_diff(inc.len() as u64) < 512,
        "estimate {} for {}",
        est.bytes,
        inc.len()
    );
    receive(&b, "ptest/dst", &inc, &RecvOptions::default()).unwrap();
    assert_same(
        &walk_snapshot(&a, "ptest/src@2"),
        &walk_snapshot(&b, "ptest/dst@2"),
        "-i",
    );
    assert_same(
        &walk_snapshot(&a, "ptest/src@1"),
        &walk_snapshot(&b, "ptest/dst@1"),
        "@1 kept",
    );

    // A bookmark outlives its snapshot and is still a base.
    run(
        &a,
        Op::Bookmark {
            snapshot: "ptest/src@2".into(),
            bookmark: "ptest/src#b2".into(),
        },
    );
    change(&m.fs, &mut rng, 3);
    m.fs.sync_all().unwrap();
    snapshot(&a, "ptest/src@3");
    run(&a, destroy_op("ptest/src@2", false));
    let inc = send_bytes(
        &a,
        "ptest/src@3",
        &SendOptions {
            from: Some("#b2".into()),
            ..Default::default()
        },
    );
    receive(&b, "ptest/dst", &inc, &RecvOptions::default()).unwrap();
    assert_same(
        &walk_snapshot(&a, "ptest/src@3"),
        &walk_snapshot(&b, "ptest/dst@3"),
        "bookmark",
    );

    // -I: every snapshot in between.
    for round in 4..7 {
        change(&m.fs, &mut rng, round);
        m.fs.sync_all().unwrap();
        snapshot(&a, &format!("ptest/src@{round}"));
    }
    let chain = send_bytes(
        &a,
        "ptest/src@6",
        &SendOptions {
            from: Some("ptest/src@3".into()),
            intermediates: true,
            ..Default::default()
        },
    );
    let got = receive(&b, "ptest/dst", &chain, &RecvOptions::default()).unwrap();
    assert_eq!(got.snapshots.len(), 3);
    for round in 4..7 {
        assert_same(
            &walk_snapshot(&a, &format!("ptest/src@{round}")),
            &walk_snapshot(&b, &format!("ptest/dst@{round}")),
            "-I",
        );
    }
    let guids =
        |p: &DsPool, ds: &str| -> Vec<u64> { snapshots(p, ds).into_iter().map(|s| s.1).collect() };
    assert_eq!(guids(&a, "ptest/src")[1..], guids(&b, "ptest/dst")[2..]);
    // The received head is the last snapshot, and the dataset mounts and reads.
    assert_same(
        &walk_snapshot(&a, "ptest/src@6"),
        &walk_head(&b, "ptest/dst"),
        "head",
    );
    let t = b.mount("ptest/dst").unwrap();
    assert_same_live(
        &walk_snapshot(&a, "ptest/src@6"),
        &walk_live(&t.fs),
        "mounted head",
    );
    b.unmount(t);
    a.unmount(m);
}

#[test]
fn damaged_misdirected_and_modified_targets_are_refused_unchanged() {
    let (a, b, m, mut rng) = source(12, 3);
    let full = send_bytes(&a, "ptest/src@1", &SendOptions::default());
    let inc12 = increment(&a, 1, 2);
    let inc23 = increment(&a, 2, 3);

    // Damaged full streams create nothing.
    for i in 0..12 {
        let mut bad = full.clone();
        let at = rng.gen_range(0..bad.len());
        bad[at] ^= 1 << rng.gen_range(0..8);
        let e = receive(&b, "ptest/dst", &bad, &RecvOptions::default()).unwrap_err();
        assert!(e.contains("stream"), "flip {i} at {at}: {e}");
        assert!(
            b.dsl.resolve("ptest/dst").is_err(),
            "flip {i} at {at} left a dataset"
        );
    }
    receive(&b, "ptest/dst", &full, &RecvOptions::default()).unwrap();
    let before = walk_snapshot(&b, "ptest/dst@1");
    let before_snaps = snapshots(&b, "ptest/dst");

    let unchanged = |why: &str| {
        assert_eq!(
            snapshots(&b, "ptest/dst"),
            before_snaps,
            "{why}: snapshots changed"
        );
        assert_same(&before, &walk_head(&b, "ptest/dst"), why);
        assert!(
            b.dsl.record(b.id("ptest/dst")).unwrap().recv.is_none(),
            "{why}"
        );
    };
    // Flipped bits, cuts, and records out of order in the increment.
    for i in 0..10 {
        let mut bad = inc12.clone();
        let at = rng.gen_range(0..bad.len());
        bad[at] ^= 1 << rng.gen_range(0..8);
        let e = receive(&b, "ptest/dst", &bad, &RecvOptions::default()).unwrap_err();
        assert!(e.contains("stream"), "flip {i}: {e}");
        unchanged(&format!("flip {i} at {at}"));
    }
    for i in 0..10 {
        let cut = rng.gen_range(1..inc12.len());
        let e = receive(&b, "ptest/dst", &inc12[..cut], &RecvOptions::default()).unwrap_err();
        assert!(e.contains("cut short"), "cut {i} at {cut}: {e}");
        unchanged(&format!("cut {i} at {cut}"));
    }
    // A stream for another base.
    let e = receive(&b, "ptest/dst", &inc23, &RecvOptions::default()).unwrap_err();
    assert!(e.contains("base"), "{e}");
    unchanged("another base");
    // Two substreams spliced: the second's records after the first's BEGIN.
    let mut spliced = inc12[..200.min(inc12.len())].to_vec();
    spliced.extend_from_slice(&inc23[200.min(inc23.len())..]);
    assert!(receive(&b, "ptest/dst", &spliced, &RecvOptions::default()).is_err());
    unchanged("spliced");

    // A target changed since its latest snapshot: refused, then rolled back with -F.
    let t = b.mount("ptest/dst").unwrap();
    let f =
        t.fs.create(&Cred::root(), ROOT_INO, n("local-change"), 0o644, 0)
            .unwrap();
    t.fs.write(&Cred::root(), f.ino, 0, b"mine", false).unwrap();
    t.fs.release(f.ino).unwrap();
    t.fs.sync_all().unwrap();
    b.unmount(t);
    b.store.sync().unwrap();
    let e = receive(&b, "ptest/dst", &inc12, &RecvOptions::default()).unwrap_err();
    assert!(e.contains("modified") && e.contains("-F"), "{e}");
    let got = receive(
        &b,
        "ptest/dst",
        &inc12,
        &RecvOptions {
            force: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(got.rolled_back, vec!["ptest/dst@1".to_string()]);
    assert_same(
        &walk_snapshot(&a, "ptest/src@2"),
        &walk_snapshot(&b, "ptest/dst@2"),
        "-F",
    );
    // A full stream onto an existing dataset.
    let e = receive(&b, "ptest/dst", &full, &RecvOptions::default()).unwrap_err();
    assert!(e.contains("exists"), "{e}");
    a.unmount(m);
}

#[test]
fn resumable_receives_cut_anywhere_finish_with_the_token() {
    let (a, b, m, mut rng) = source(13, 2);
    let resumable = RecvOptions {
        resumable: true,
        ..Default::default()
    };
    let full = send_bytes(&a, "ptest/src@1", &SendOptions::default());
    let inc = increment(&a, 1, 2);
    for (round, (stream, target_snap, source_snap)) in [
        (&full, "ptest/dst@1", "ptest/src@1"),
        (&inc, "ptest/dst@2", "ptest/src@2"),
    ]
    .into_iter()
    .enumerate()
    {
        // Cut it up to three times, resuming each time from the token.
        let mut next: Vec<u8> = stream.clone();
        let mut cuts = 0;
        loop {
            let cut = if cuts < 3 {
                rng.gen_range(1..next.len())
            } else {
                next.len()
            };
            match receive(&b, "ptest/dst", &next[..cut], &resumable) {
                Ok(_) => break,
                Err(e) => {
                    assert!(e.contains("cut short"), "round {round}: {e}");
                    let id = b.id("ptest/dst");
                    assert!(b.dsl.record(id).unwrap().recv.is_some());
                    let token = recv::resume_token(&b.dsl, id).unwrap().expect("a token");
                    // A damaged token is refused.
                    let mut bad = token.clone();
                    bad.pop();
                    bad.push('0');
                    let mut sink = Vec::new();
                    if bad != token {
                        assert!(send::send_resume(&a.dsl, &bad, &mut sink, &mut |_| {}).is_err());
                    }
                    next.clear();
                    send::send_resume(&a.dsl, &token, &mut next, &mut |_| {}).unwrap();
                    cuts += 1;
                }
            }
        }
        assert_same(
            &walk_snapshot(&a, source_snap),
            &walk_snapshot(&b, target_snap),
            "resumed",
        );
    }
    // A cut receive abandoned with -A goes back to where it was.
    change(&m.fs, &mut rng, 3);
    m.fs.sync_all().unwrap();
    snapshot(&a, "ptest/src@3");
    let inc3 = increment(&a, 2, 3);
    assert!(receive(&b, "ptest/dst", &inc3[..inc3.len() / 2], &resumable).is_err());
    recv::abort(&b.dsl, "ptest/dst").unwrap();
    assert!(b.dsl.record(b.id("ptest/dst")).unwrap().recv.is_none());
    assert_same(
        &walk_snapshot(&a, "ptest/src@2"),
        &walk_head(&b, "ptest/dst"),
        "-A",
    );
    a.unmount(m);
}

/// A reader that panics at byte `at`.
struct PanicReader<'a> {
    data: &'a [u8],
    at: usize,
}

impl std::io::Read for PanicReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        assert!(self.at > 0, "the process dies here");
        let n = buf.len().min(self.at).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        self.at -= n;
        Ok(n)
    }
}

#[test]
fn a_pool_opened_after_an_interrupted_receive_is_as_before_it() {
    let (a, b, m, _) = source(14, 2);
    let full = send_bytes(&a, "ptest/src@1", &SendOptions::default());
    let inc = increment(&a, 1, 2);
    receive(&b, "ptest/dst", &full, &RecvOptions::default()).unwrap();
    // Half an increment applied, then the receiving process dies (the reader panics where
    // a kill would stop it): nothing cleans up but the next open.
    for (target, stream) in [("ptest/dst", &inc), ("ptest/new", &full)] {
        let mut input = PanicReader {
            data: stream,
            at: stream.len() / 2,
        };
        let died = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = recv::receive(
                &b.dsl,
                target,
                &mut input,
                &RecvOptions::default(),
                &mut |_| {},
            );
        }));
        assert!(died.is_err(), "{target}: the receive did not stop");
        assert!(b.dsl.record(b.id(target)).unwrap().recv.is_some());
    }
    b.store.sync().unwrap();
    let devs = b.export();
    let b = DsPool::import(devs).unwrap();
    assert!(
        b.dsl.resolve("ptest/new").is_err(),
        "a half-received new dataset is gone"
    );
    assert!(b.dsl.record(b.id("ptest/dst")).unwrap().recv.is_none());
    assert_same(
        &walk_snapshot(&a, "ptest/src@1"),
        &walk_head(&b, "ptest/dst"),
        "after the interrupted receive",
    );
    // And the increment still applies.
    receive(&b, "ptest/dst", &inc, &RecvOptions::default()).unwrap();
    assert_same(
        &walk_snapshot(&a, "ptest/src@2"),
        &walk_snapshot(&b, "ptest/dst@2"),
        "after",
    );
    a.unmount(m);
}

#[test]
fn volumes_round_trip_with_holes() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed(15));
    let a = pool();
    let b = pool();
    run(
        &a,
        Op::Create {
            name: "ptest/vol".into(),
            kind: DatasetKind::Volume,
            props: vec![
                ("volsize".into(), "64M".into()),
                ("volblocksize".into(), "16K".into()),
            ],
            parents: false,
        },
    );
    let vol = tank_dataset::Volume::open(a.dsl.clone(), "ptest/vol").unwrap();
    let mut image = vec![0u8; 64 << 20];
    for _ in 0..50 {
        let at = rng.gen_range(0..(64 << 20) - 70_000) / 512 * 512;
        let d = data(&mut rng, 65_536);
        vol.write(at, &d).unwrap();
        image[at as usize..at as usize + d.len()].copy_from_slice(&d);
    }
    a.store.sync().unwrap();
    snapshot(&a, "ptest/vol@1");
    let full = send_bytes(&a, "ptest/vol@1", &SendOptions::default());
    receive(&b, "ptest/vol2", &full, &RecvOptions::default()).unwrap();
    assert_eq!(
        b.dsl.prop(b.id("ptest/vol2"), "volsize").unwrap(),
        a.dsl.prop(a.id("ptest/vol"), "volsize").unwrap()
    );
    let vol2 = tank_dataset::Volume::open(b.dsl.clone(), "ptest/vol2").unwrap();
    let got = vol2.read(0, 64 << 20).unwrap();
    assert!(got == image, "volume contents differ");
}

/// Where each substream of a stream ends (the byte after its END).
fn substream_ends(stream: &[u8]) -> Vec<usize> {
    let mut input = stream;
    let mut r = tank_dataset::stream::Reader::new(&mut input);
    let mut ends = Vec::new();
    while let Some(rec) = r.next_record().unwrap() {
        if matches!(rec, tank_dataset::stream::Record::End { .. }) {
            ends.push(r.offset as usize);
        }
    }
    ends
}

#[test]
fn replication_streams_carry_descendants_and_every_snapshot() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed(16));
    let a = pool();
    let b = pool();
    for ds in ["ptest/top", "ptest/top/child", "ptest/top/child/grand"] {
        run(&a, create_op(ds));
        let m = a.mount(ds).unwrap();
        populate(&m.fs, &mut rng);
        m.fs.sync_all().unwrap();
        a.unmount(m);
    }
    run(&a, snapshot_op("ptest/top@1", true));
    let m = a.mount("ptest/top/child").unwrap();
    change(&m.fs, &mut rng, 2);
    m.fs.sync_all().unwrap();
    a.unmount(m);
    run(&a, snapshot_op("ptest/top@2", true));
    let full = send_bytes(
        &a,
        "ptest/top@2",
        &SendOptions {
            replicate: true,
            ..Default::default()
        },
    );
    let got = receive(&b, "ptest/copy", &full, &RecvOptions::default()).unwrap();
    assert_eq!(got.snapshots.len(), 6, "{:?}", got.snapshots);
    for (src, dst) in [
        ("ptest/top", "ptest/copy"),
        ("ptest/top/child", "ptest/copy/child"),
        ("ptest/top/child/grand", "ptest/copy/child/grand"),
    ] {
        for s in ["1", "2"] {
            assert_same(
                &walk_snapshot(&a, &format!("{src}@{s}")),
                &walk_snapshot(&b, &format!("{dst}@{s}")),
                &format!("-R {src}@{s}"),
            );
        }
    }
    // An increment of the tree: a new child comes whole, the others as increments.
    run(&a, create_op("ptest/top/new"));
    let m = a.mount("ptest/top/new").unwrap();
    populate(&m.fs, &mut rng);
    m.fs.sync_all().unwrap();
    a.unmount(m);
    run(&a, snapshot_op("ptest/top@3", true));
    let inc = send_bytes(
        &a,
        "ptest/top@3",
        &SendOptions {
            replicate: true,
            from: Some("@2".into()),
            ..Default::default()
        },
    );
    // Cut between two substreams: what came is whole, and the cut is reported.
    let ends = substream_ends(&inc);
    assert_eq!(ends.len(), 4);
    let e = receive(&b, "ptest/copy", &inc[..ends[1]], &RecvOptions::default()).unwrap_err();
    assert!(e.contains("2 of the stream's 4"), "{e}");
    // Sent again, the stream skips what is there and brings the rest.
    let got = receive(&b, "ptest/copy", &inc, &RecvOptions::default()).unwrap();
    assert_eq!(got.skipped.len(), 2, "{got:?}");
    assert_eq!(got.snapshots.len(), 2, "{got:?}");
    for (src, dst) in [
        ("ptest/top", "ptest/copy"),
        ("ptest/top/child", "ptest/copy/child"),
        ("ptest/top/child/grand", "ptest/copy/child/grand"),
        ("ptest/top/new", "ptest/copy/new"),
    ] {
        assert_same(
            &walk_snapshot(&a, &format!("{src}@3")),
            &walk_snapshot(&b, &format!("{dst}@3")),
            &format!("-R -i {src}"),
        );
    }

    // A replication stream cut inside a substream resumes with the token, and the rest of
    // the stream follows.
    for round in [4, 5] {
        let m = a.mount("ptest/top/child/grand").unwrap();
        change(&m.fs, &mut rng, round);
        m.fs.sync_all().unwrap();
        a.unmount(m);
        run(&a, snapshot_op(&format!("ptest/top@{round}"), true));
    }
    let inc = send_bytes(
        &a,
        "ptest/top@5",
        &SendOptions {
            replicate: true,
            from: Some("@3".into()),
            intermediates: true,
            ..Default::default()
        },
    );
    // Substreams: top@4 top@5 child@4 child@5 grand@4 grand@5 new@4 new@5; cut in grand@4.
    let ends = substream_ends(&inc);
    assert_eq!(ends.len(), 8);
    let cut = (ends[3] + ends[4]) / 2;
    let resumable = RecvOptions {
        resumable: true,
        ..Default::default()
    };
    assert!(receive(&b, "ptest/copy", &inc[..cut], &resumable).is_err());
    let grand = b.id("ptest/copy/child/grand");
    let token = recv::resume_token(&b.dsl, grand).unwrap().expect("a token");
    let mut rest = Vec::new();
    let sent = send::send_resume(&a.dsl, &token, &mut rest, &mut |_| {}).unwrap();
    assert_eq!(sent.snapshots.len(), 4, "{:?}", sent.snapshots);
    let got = receive(&b, "ptest/copy", &rest, &resumable).unwrap();
    assert_eq!(got.snapshots.len(), 4, "{got:?}");
    for (src, dst) in [
        ("ptest/top/child/grand", "ptest/copy/child/grand"),
        ("ptest/top/new", "ptest/copy/new"),
    ] {
        for s in ["4", "5"] {
            assert_same(
                &walk_snapshot(&a, &format!("{src}@{s}")),
                &walk_snapshot(&b, &format!("{dst}@{s}")),
                &format!("-R resumed {src}@{s}"),
            );
        }
    }
}
