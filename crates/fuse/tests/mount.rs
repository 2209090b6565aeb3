//! Mount lifecycle and the snapshot directory, through the kernel: errors of `mount`, how
//! `mount` and `df` show the filesystem, unmount (busy, lazy on drop, by another party),
//! the sync at unmount, and `.tank/snapshot` served from other `Fs` instances.

mod common;

use std::fs::{self, File};
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use libc::{EACCES, ENOENT, EROFS};
use tank_dataset::posix::{Cred, ROOT_INO};
use tank_fuse::{MountError, MountOptions, SnapshotSource};

fn mounted_at(path: &std::path::Path) -> bool {
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(path.to_str().unwrap()))
}

#[test]
fn mount_errors_are_clear() {
    require_fuse!();
    let m = mounted();
    let opts = MountOptions::new("fusetest/again");

    let missing = m.pool.dir.path().join("missing");
    let err = tank_fuse::mount(m.fs.clone(), None, &missing, &opts).unwrap_err();
    assert!(matches!(err, MountError::MountPointMissing(_)), "{err:?}");
    assert!(err.to_string().contains("no such directory"), "{err}");

    let file = m.pool.dir.path().join("file");
    fs::write(&file, b"x").unwrap();
    let err = tank_fuse::mount(m.fs.clone(), None, &file, &opts).unwrap_err();
    assert!(matches!(err, MountError::NotADirectory(_)), "{err:?}");

    let err = tank_fuse::mount(m.fs.clone(), None, &m.path, &opts).unwrap_err();
    assert!(matches!(err, MountError::AlreadyMounted { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("already mounted") && msg.contains("tank:fusetest/fs"),
        "{msg}"
    );
}

/// Writes, reads back, renames and removes files through `m`, large and small.
fn exercise(m: &Mounted) {
    let big: Vec<u8> = (0..3 << 20).map(|i: u32| (i % 251) as u8).collect();
    fs::write(m.p("big"), &big).unwrap();
    fs::create_dir(m.p("d")).unwrap();
    for i in 0..200 {
        fs::write(m.p(&format!("d/f{i}")), vec![i as u8; i * 7]).unwrap();
    }
    assert_eq!(fs::read_dir(m.p("d")).unwrap().count(), 200);
    for i in 0..200 {
        assert_eq!(
            fs::read(m.p(&format!("d/f{i}"))).unwrap(),
            vec![i as u8; i * 7]
        );
        fs::remove_file(m.p(&format!("d/f{i}"))).unwrap();
    }
    fs::remove_dir(m.p("d")).unwrap();
    fs::rename(m.p("big"), m.p("big2")).unwrap();
    let f = File::open(m.p("big2")).unwrap();
    f.sync_all().unwrap();
    // With the file's pages dropped the reads reach the server, in 1 MiB requests (over
    // io_uring, served by the workers).
    nix::fcntl::posix_fadvise(
        &f,
        0,
        0,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    )
    .unwrap();
    assert_eq!(fs::read(m.p("big2")).unwrap(), big);
    assert_errno(fs::read(m.p("big")), ENOENT);
    // Fsyncs (served aside over io_uring) beside creates and stats on the same CPU: every
    // request is answered, and each file holds what was written.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let syncer = {
        let (path, stop) = (m.p("synced"), stop.clone());
        std::thread::spawn(move || {
            pin_to_cpu0();
            let mut f = File::create(&path).unwrap();
            let mut n = 0u32;
            while n < 20 || !stop.load(Ordering::Relaxed) {
                std::io::Write::write_all(&mut f, &n.to_le_bytes()).unwrap();
                f.sync_data().unwrap();
                n += 1;
            }
            n
        })
    };
    pin_to_cpu0();
    fs::create_dir(m.p("e")).unwrap();
    for i in 0..100u32 {
        fs::write(m.p(&format!("e/{i}")), i.to_le_bytes()).unwrap();
        assert_eq!(fs::metadata(m.p(&format!("e/{i}"))).unwrap().len(), 4);
    }
    stop.store(true, Ordering::Relaxed);
    let n = syncer.join().unwrap();
    let synced = fs::read(m.p("synced")).unwrap();
    assert_eq!(synced.len(), 4 * n as usize);
    assert!(synced
        .chunks(4)
        .enumerate()
        .all(|(i, c)| c == (i as u32).to_le_bytes()));
    for i in 0..100u32 {
        assert_eq!(fs::read(m.p(&format!("e/{i}"))).unwrap(), i.to_le_bytes());
    }
}

#[test]
fn requests_come_over_io_uring_where_the_kernel_offers_it_and_dev_fuse_otherwise() {
    require_fuse!();
    // The default: the kernel's io_uring queues when it offers them.
    let m = mounted();
    let handle = m.handle.as_ref().unwrap();
    assert_eq!(handle.io_uring(), tank_fuse::io_uring_offered());
    if !handle.io_uring() {
        eprintln!("the kernel does not offer FUSE over io_uring here: /dev/fuse only");
    }
    exercise(&m);
    drop(m);
    // Asked not to: /dev/fuse, whatever the kernel offers.
    let mut setup = Setup::default();
    setup.opts.io_uring = false;
    let m = setup.mount();
    assert!(!m.handle.as_ref().unwrap().io_uring());
    exercise(&m);
}

#[test]
fn unmount_waits_for_open_files_and_syncs() {
    require_fuse!();
    let mut m = mounted();
    fs::write(m.p("kept"), b"durable").unwrap();
    let open = File::open(m.p("kept")).unwrap();
    let handle = m.handle.as_mut().unwrap();
    let err = handle.unmount().unwrap_err();
    assert!(matches!(err, MountError::Busy(_)), "{err:?}");
    assert!(handle.is_mounted());
    assert!(mounted_at(&m.path));
    drop(open);
    m.handle.as_mut().unwrap().unmount().unwrap();
    assert!(!mounted_at(&m.path));
    assert!(!m.handle.as_ref().unwrap().is_mounted());
    // A second unmount is a no-op.
    m.handle.as_mut().unwrap().unmount().unwrap();
    // The data is in the filesystem, seen through its API.
    let attr =
        m.fs.lookup(&Cred::root(), ROOT_INO, "kept".as_ref())
            .unwrap();
    assert_eq!(m.fs.read(attr.ino, 0, 100).unwrap(), b"durable");
}

#[test]
fn remount_after_unmount_sees_the_files() {
    require_fuse!();
    let mut m = mounted();
    fs::create_dir(m.p("dir")).unwrap();
    fs::write(m.p("dir/f"), noise(200_000, 1)).unwrap();
    m.unmount();
    let again = tank_fuse::mount(
        m.fs.clone(),
        None,
        &m.path,
        &MountOptions::new("fusetest/fs"),
    )
    .unwrap();
    assert_eq!(fs::read(m.p("dir/f")).unwrap(), noise(200_000, 1));
    drop(again);
    assert!(!mounted_at(&m.path));
}

#[test]
fn drop_detaches_a_busy_mount() {
    require_fuse!();
    let _caches = kernel_caches();
    let mut m = mounted();
    fs::write(m.p("f"), b"still readable").unwrap();
    let mut open = File::open(m.p("f")).unwrap();
    m.handle.take();
    // Gone from the namespace at once ...
    assert!(!mounted_at(&m.path));
    // ... while the open file is still served.
    let mut s = String::new();
    open.read_to_string(&mut s).unwrap();
    assert_eq!(s, "still readable");
}

#[test]
fn unmount_by_another_party_ends_the_session() {
    require_fuse!();
    let mut m = mounted();
    fs::write(m.p("f"), b"x").unwrap();
    let waiter = {
        let mut handle = m.handle.take().unwrap();
        std::thread::spawn(move || handle.wait())
    };
    tank_fuse::unmount(&m.path).unwrap();
    waiter.join().unwrap().unwrap();
    assert!(!mounted_at(&m.path));
    let err = tank_fuse::unmount(&m.path).unwrap_err();
    assert!(matches!(err, MountError::NotMounted(_)), "{err:?}");
}

#[test]
fn busy_mount_of_another_party_is_detached() {
    require_fuse!();
    let _caches = kernel_caches();
    let mut m = mounted();
    fs::write(m.p("f"), b"open while unmounted").unwrap();
    let mut open = File::open(m.p("f")).unwrap();
    let mut handle = m.handle.take().unwrap();
    tank_fuse::unmount(&m.path).unwrap();
    assert!(!mounted_at(&m.path));
    // The session goes on for the open file, and ends (synced) when it is closed.
    assert!(handle.is_mounted());
    let mut s = String::new();
    open.read_to_string(&mut s).unwrap();
    assert_eq!(s, "open while unmounted");
    drop(open);
    handle.wait().unwrap();
    assert!(!handle.is_mounted());
}

#[test]
fn unmounter_from_another_thread() {
    require_fuse!();
    let mut m = mounted();
    let unmounter = m.handle.as_ref().unwrap().unmounter();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        unmounter.unmount()
    });
    m.handle.as_mut().unwrap().wait().unwrap();
    t.join().unwrap().unwrap();
    assert!(!mounted_at(&m.path));
}

/// A live filesystem with a snapshot source holding a second, read-only `Fs`.
fn with_snapshot() -> (Mounted, Arc<TestSnapshots>) {
    let pool = Arc::new(TestPool::new(256 << 20));
    let hooks = Arc::new(TestHooks::new(pool.bytes));
    let live = pool.root_fs(hooks.clone());

    let snap_hooks = Arc::new(TestHooks::new(pool.bytes));
    let snap = pool.new_fs(snap_hooks.clone());
    let root = Cred::root();
    let dir = snap.mkdir(&root, ROOT_INO, "docs".as_ref(), 0o755).unwrap();
    let f = snap
        .mknod(&root, dir.ino, "a.txt".as_ref(), libc::S_IFREG | 0o640, 0)
        .unwrap();
    snap.open(&root, f.ino, libc::O_WRONLY).unwrap();
    snap.write(&root, f.ino, 0, b"from the snapshot", false)
        .unwrap();
    snap.release(f.ino).unwrap();
    snap.sync_all().unwrap();
    snap_hooks.readonly.store(true, Ordering::Release);

    let source = Arc::new(TestSnapshots::default());
    source.snaps.lock().push(("monday".into(), snap));
    let mut opts = MountOptions::new("fusetest/live");
    // Short, so a destroyed snapshot's entry expires within the test; long enough that a
    // busy machine does not see the live one expire (and looked up again) mid-test.
    opts.attr_ttl = SNAPSHOT_TEST_TTL;
    let m = mount_on(
        pool,
        live,
        hooks,
        Some(source.clone() as Arc<dyn SnapshotSource>),
        &opts,
    );
    (m, source)
}

/// Held by the test that drops the kernel's dentry caches (system-wide, so it makes every
/// other mount forget its nodes) and by the tests that count how often nodes are looked up.
static KERNEL_CACHES: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn kernel_caches() -> std::sync::MutexGuard<'static, ()> {
    KERNEL_CACHES.lock().unwrap_or_else(|e| e.into_inner())
}

/// The entry and attribute TTL of the snapshot tests' mounts.
const SNAPSHOT_TEST_TTL: Duration = Duration::from_secs(1);

#[test]
fn snapshot_directory_serves_snapshots_read_only() {
    require_fuse!();
    let _caches = kernel_caches();
    let (m, source) = with_snapshot();
    fs::create_dir(m.p("docs")).unwrap();
    fs::write(m.p("docs/a.txt"), b"live").unwrap();

    let names = |p: &std::path::Path| -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(&m.path), vec!["docs"]);
    assert_eq!(names(&m.p(".tank")), vec!["snapshot"]);
    assert_eq!(names(&m.p(".tank/snapshot")), vec!["monday"]);
    let snap = m.p(".tank/snapshot/monday");
    assert_eq!(names(&snap), vec!["docs"]);
    assert_eq!(
        fs::read(snap.join("docs/a.txt")).unwrap(),
        b"from the snapshot"
    );
    assert_eq!(fs::read(m.p("docs/a.txt")).unwrap(), b"live");

    // One inode space: the snapshot's inodes differ from the live ones, one device.
    let (live_root, snap_root) = (fs::metadata(&m.path).unwrap(), fs::metadata(&snap).unwrap());
    assert_eq!(live_root.ino(), 1);
    assert_ne!(snap_root.ino(), 1);
    assert_eq!(live_root.dev(), snap_root.dev());
    assert_ne!(
        fs::metadata(snap.join("docs/a.txt")).unwrap().ino(),
        fs::metadata(m.p("docs/a.txt")).unwrap().ino()
    );
    assert_eq!(
        fs::metadata(snap.join("..")).unwrap().ino(),
        fs::metadata(m.p(".tank/snapshot")).unwrap().ino()
    );

    // Read-only, every way.
    assert_errno(fs::write(snap.join("docs/a.txt"), b"x"), EROFS);
    assert_errno(fs::write(snap.join("new"), b"x"), EROFS);
    assert_errno(fs::create_dir(snap.join("d")), EROFS);
    assert_errno(fs::remove_file(snap.join("docs/a.txt")), EROFS);
    assert_errno(fs::rename(snap.join("docs"), snap.join("x")), EROFS);
    assert_errno(setxattr(&snap.join("docs"), "user.a", b"v", 0), EROFS);
    // The kernel answers access(2) itself under default_permissions, from the mode bits:
    // root is told it may write, and any write then fails with EROFS as above. ZFS mounts
    // each snapshot read-only on its own, where access(W_OK) says EROFS; a mount per
    // snapshot would give that here too (not done yet).
    access(&snap.join("docs/a.txt"), libc::W_OK).unwrap();
    assert_errno(fs::create_dir(m.p(".tank/snapshot/tuesday")), EROFS);
    assert_errno(fs::rename(m.p("docs"), snap.join("docs2")), EROFS);
    assert_errno(fs::hard_link(m.p("docs/a.txt"), snap.join("l")), EROFS);
    assert_errno(fs::metadata(m.p(".tank/snapshot/nosuch")), ENOENT);
    assert_errno(fs::metadata(m.p(".tank/nosuch")), ENOENT);

    // Permissions apply inside snapshots.
    as_user(40_001, 41_001, &[], || {
        assert_errno(File::open(snap.join("docs/a.txt")), EACCES);
    });

    // Opened once, however often it is used.
    for _ in 0..5 {
        fs::metadata(snap.join("docs")).unwrap();
    }
    assert_eq!(source.opens.load(Ordering::Acquire), 1);

    // Everyone may look into the snapshot directory.
    as_user(40_001, 41_001, &[], || {
        assert_eq!(names(&m.p(".tank/snapshot")), vec!["monday"]);
        assert_eq!(names(&snap), vec!["docs"]);
    });

    // A destroyed snapshot disappears (within the entry TTL).
    source.snaps.lock().clear();
    std::thread::sleep(SNAPSHOT_TEST_TTL * 2);
    assert_eq!(names(&m.p(".tank/snapshot")), Vec::<String>::new());
    assert_errno(fs::metadata(m.p(".tank/snapshot/monday")), ENOENT);
}

#[test]
fn snapshot_of_the_live_object_set() {
    require_fuse!();
    let pool = Arc::new(TestPool::new(256 << 20));
    let hooks = Arc::new(TestHooks::new(pool.bytes));
    let live = pool.root_fs(hooks.clone());
    let source = Arc::new(TestSnapshots::default());
    let m = mount_on(
        pool.clone(),
        live.clone(),
        hooks,
        Some(source.clone() as Arc<dyn SnapshotSource>),
        &MountOptions::new("fusetest/live"),
    );
    fs::write(m.p("f"), b"before").unwrap();
    File::open(m.p("f")).unwrap().sync_all().unwrap();
    live.sync_all().unwrap();

    // The committed tree of the live object set, opened read-only.
    let os = pool.store.objset(tank_object::ROOT_OBJSET).unwrap();
    let snap_os = pool.store.open_snapshot(os.id, os.root());
    let snap_hooks = Arc::new(TestHooks::new(pool.bytes));
    snap_hooks.readonly.store(true, Ordering::Release);
    let snap = tank_dataset::posix::Fs::mount(pool.store.clone(), snap_os, snap_hooks, (0, 0))
        .expect("Fs on a snapshot");
    source.snaps.lock().push(("s1".into(), snap));

    fs::write(m.p("f"), b"after").unwrap();
    assert_eq!(fs::read(m.p("f")).unwrap(), b"after");
    assert_eq!(fs::read(m.p(".tank/snapshot/s1/f")).unwrap(), b"before");
    let kind = fs::metadata(m.p(".tank/snapshot/s1")).unwrap();
    assert!(kind.is_dir());
}

#[test]
fn snapshot_is_closed_when_the_kernel_forgets_it() {
    require_fuse!();
    let _caches = kernel_caches();
    let (m, source) = with_snapshot();
    let file = m.p(".tank/snapshot/monday/docs/a.txt");
    assert_eq!(fs::read(&file).unwrap(), b"from the snapshot");
    assert_eq!(source.opens.load(Ordering::Acquire), 1);
    // Make the kernel drop its unused dentries and inodes: it forgets every node of the
    // snapshot, the slot is freed, and the next use opens the snapshot again.
    let mut reopened = false;
    for _ in 0..50 {
        fs::write("/proc/sys/vm/drop_caches", "2").expect("drop_caches (tests run as root)");
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(fs::read(&file).unwrap(), b"from the snapshot");
        if source.opens.load(Ordering::Acquire) > 1 {
            reopened = true;
            break;
        }
    }
    assert!(
        reopened,
        "the snapshot stayed open after the kernel forgot it"
    );
}

/// Counts the read requests that reach the server.
#[derive(Debug, Default)]
struct ReadCounter(std::sync::atomic::AtomicU64);

impl tank_fuse::RequestObserver for ReadCounter {
    fn observe(&self, op: &'static str, _took: Duration, _failed: bool) {
        if op == "read" {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl ReadCounter {
    fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

#[test]
fn a_live_files_pages_stay_cached_across_opens_until_it_changes() {
    require_fuse!();
    // Nothing may drop the kernel's caches while this test counts.
    let _caches = kernel_caches();
    let reads = Arc::new(ReadCounter::default());
    let mut opts = MountOptions::new("fusetest/fs");
    opts.observer = Some(reads.clone());
    let m = Setup {
        opts,
        ..Setup::default()
    }
    .mount();
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i % 253) as u8).collect();
    fs::write(m.p("f"), &data).unwrap();
    assert!(fs::read(m.p("f")).unwrap() == data, "bytes differ");

    // Opened again and again, unchanged: read from the kernel's pages.
    let before = reads.get();
    for _ in 0..3 {
        assert!(fs::read(m.p("f")).unwrap() == data, "bytes differ");
    }
    assert_eq!(
        reads.get(),
        before,
        "an unchanged file was read from the server again"
    );

    // Changed past the mount, with nobody telling the kernel: the next open drops the
    // pages and reads the new bytes.
    let ino =
        m.fs.lookup(&Cred::root(), ROOT_INO, std::ffi::OsStr::new("f"))
            .unwrap()
            .ino;
    m.fs.write(&Cred::root(), ino, 4096, b"changed past the mount", false)
        .unwrap();
    let mut want = data.clone();
    want[4096..4096 + 22].copy_from_slice(b"changed past the mount");
    assert!(fs::read(m.p("f")).unwrap() == want, "bytes differ");
    assert!(reads.get() > before, "the changed file was not read again");

    // Changed through the mount (its pages change with it): seen at once, and kept.
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut f = fs::OpenOptions::new().write(true).open(m.p("f")).unwrap();
        f.seek(SeekFrom::Start(100)).unwrap();
        f.write_all(b"through the mount").unwrap();
        f.sync_all().unwrap();
    }
    want[100..117].copy_from_slice(b"through the mount");
    assert!(fs::read(m.p("f")).unwrap() == want, "bytes differ");
    let settled = reads.get();
    assert!(fs::read(m.p("f")).unwrap() == want, "bytes differ");
    assert_eq!(
        reads.get(),
        settled,
        "pages written through the mount were dropped"
    );
}
