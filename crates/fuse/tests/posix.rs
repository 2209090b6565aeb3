//! POSIX conformance through the kernel: a pool on file devices, its `Fs` mounted with
//! FUSE, exercised with std::fs and libc calls as a real program would. Every error path
//! asserts its errno; permissions are checked as other users (threads with their own
//! fsuid/fsgid/groups, see `common::as_user`).

// libc calls (utimensat, renameat2, xattrs, statvfs, fallocate) need `unsafe`.
#![allow(unsafe_code)]

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{symlink, FileTypeExt};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};

use common::*;
use libc::{
    EACCES, EDQUOT, EEXIST, EINVAL, EISDIR, ELOOP, ENAMETOOLONG, ENODATA, ENOENT, ENOSPC, ENOTDIR,
    ENOTEMPTY, EPERM, ERANGE, EROFS, EXDEV,
};
use tank_dataset::posix::DirectMode;
use tank_fuse::{MountOptions, WritebackCache};

const USER: u32 = 40_001;
const OTHER: u32 = 40_002;
const GROUP: u32 = 41_001;
const SHARED: u32 = 41_500;

fn chmod(path: &std::path::Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).expect("chmod");
}

#[test]
fn files_and_directories_round_trip() {
    require_fuse!();
    let m = mounted();
    fs::create_dir(m.p("d")).unwrap();
    fs::write(m.p("d/a.txt"), b"hello world").unwrap();
    assert_eq!(fs::read(m.p("d/a.txt")).unwrap(), b"hello world");
    let meta = fs::metadata(m.p("d/a.txt")).unwrap();
    assert!(meta.is_file());
    assert_eq!(meta.len(), 11);
    assert_eq!(meta.uid(), 0);
    let root = fs::metadata(&m.path).unwrap();
    assert!(root.is_dir());
    assert_eq!(root.ino(), 1);
    let names: Vec<String> = fs::read_dir(m.p("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, vec!["a.txt".to_string()]);
}

#[test]
fn eexist() {
    require_fuse!();
    let m = mounted();
    fs::create_dir(m.p("d")).unwrap();
    fs::write(m.p("f"), b"x").unwrap();
    assert_errno(fs::create_dir(m.p("d")), EEXIST);
    assert_errno(fs::create_dir(m.p("f")), EEXIST);
    assert_errno(
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(m.p("f")),
        EEXIST,
    );
    assert_errno(fs::hard_link(m.p("f"), m.p("d")), EEXIST);
    assert_errno(symlink("target", m.p("f")), EEXIST);
    fs::write(m.p("g"), b"y").unwrap();
    assert_errno(
        renameat2(&m.p("f"), &m.p("g"), libc::RENAME_NOREPLACE),
        EEXIST,
    );
    assert_eq!(fs::read(m.p("g")).unwrap(), b"y");
    assert_errno(mkfifo(&m.p("d"), 0o644), EEXIST);
}

#[test]
fn enoent() {
    require_fuse!();
    let m = mounted();
    assert_errno(File::open(m.p("missing")), ENOENT);
    assert_errno(fs::metadata(m.p("missing")), ENOENT);
    assert_errno(fs::remove_file(m.p("missing")), ENOENT);
    assert_errno(fs::remove_dir(m.p("missing")), ENOENT);
    assert_errno(fs::rename(m.p("missing"), m.p("x")), ENOENT);
    assert_errno(fs::write(m.p("nodir/f"), b"x"), ENOENT);
    assert_errno(fs::read_link(m.p("missing")), ENOENT);
    assert_errno(fs::hard_link(m.p("missing"), m.p("x")), ENOENT);
    assert_errno(getxattr(&m.p("missing"), "user.a", 0), ENOENT);
}

#[test]
fn enotempty() {
    require_fuse!();
    let m = mounted();
    fs::create_dir_all(m.p("a/sub")).unwrap();
    fs::create_dir(m.p("b")).unwrap();
    fs::write(m.p("b/f"), b"x").unwrap();
    assert_errno(fs::remove_dir(m.p("a")), ENOTEMPTY);
    assert_errno(fs::rename(m.p("a"), m.p("b")), ENOTEMPTY);
    assert!(m.p("b/f").exists());
    fs::remove_dir(m.p("a/sub")).unwrap();
    fs::remove_dir(m.p("a")).unwrap();
}

#[test]
fn eisdir_and_enotdir() {
    require_fuse!();
    let m = mounted();
    fs::create_dir(m.p("d")).unwrap();
    fs::write(m.p("f"), b"x").unwrap();
    assert_errno(OpenOptions::new().write(true).open(m.p("d")), EISDIR);
    assert_errno(fs::remove_file(m.p("d")), EISDIR);
    assert_errno(fs::rename(m.p("f"), m.p("d")), EISDIR);
    assert_errno(fs::create_dir(m.p("f/x")), ENOTDIR);
    assert_errno(fs::remove_dir(m.p("f")), ENOTDIR);
    assert_errno(fs::rename(m.p("d"), m.p("f")), ENOTDIR);
    assert_errno(File::open(m.p("f/")), ENOTDIR);
    assert_errno(fs::read_dir(m.p("f")), ENOTDIR);
}

#[test]
fn enametoolong() {
    require_fuse!();
    let m = mounted();
    let longest = "n".repeat(255);
    fs::write(m.p(&longest), b"x").unwrap();
    assert_eq!(fs::read(m.p(&longest)).unwrap(), b"x");
    let too_long = "n".repeat(256);
    assert_errno(fs::write(m.p(&too_long), b"x"), ENAMETOOLONG);
    assert_errno(fs::create_dir(m.p(&too_long)), ENAMETOOLONG);
    assert_errno(fs::rename(m.p(&longest), m.p(&too_long)), ENAMETOOLONG);
}

#[test]
fn eloop() {
    require_fuse!();
    let m = mounted();
    symlink("b", m.p("a")).unwrap();
    symlink("a", m.p("b")).unwrap();
    assert_errno(File::open(m.p("a")), ELOOP);
    assert_errno(fs::metadata(m.p("a")), ELOOP);
    fs::write(m.p("target"), b"t").unwrap();
    symlink("target", m.p("link")).unwrap();
    assert_errno(
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(m.p("link")),
        ELOOP,
    );
    assert_eq!(fs::read(m.p("link")).unwrap(), b"t");
    assert_eq!(fs::read_link(m.p("link")).unwrap().to_str(), Some("target"));
    assert!(fs::symlink_metadata(m.p("link"))
        .unwrap()
        .file_type()
        .is_symlink());
}

#[test]
fn exdev_between_mounts() {
    require_fuse!();
    let a = mounted();
    let b = mounted();
    fs::write(a.p("f"), b"x").unwrap();
    assert_errno(fs::rename(a.p("f"), b.p("f")), EXDEV);
    assert_errno(fs::hard_link(a.p("f"), b.p("f")), EXDEV);
    assert!(a.p("f").exists());
}

/// Writes `total` bytes in 128 KiB pieces, then fsyncs; the first error.
fn fill(path: &std::path::Path, total: usize) -> std::io::Result<()> {
    let mut f = File::create(path)?;
    let chunk = noise(128 << 10, 7);
    let mut written = 0;
    while written < total {
        f.write_all(&chunk)?;
        written += chunk.len();
    }
    f.sync_all()
}

#[test]
fn edquot_past_the_quota() {
    require_fuse!();
    for writeback in [WritebackCache::Off, WritebackCache::On] {
        let mut opts = MountOptions::new("fusetest/quota");
        opts.writeback_cache = writeback;
        let m = Setup {
            opts,
            ..Setup::default()
        }
        .mount();
        m.hooks.quota.store(
            m.hooks.charged.load(std::sync::atomic::Ordering::Acquire) + (1 << 20),
            std::sync::atomic::Ordering::Release,
        );
        // Without the writeback cache write(2) itself fails; with it, the error comes back
        // at fsync (the kernel writes the pages later).
        assert_errno(fill(&m.p("big"), 4 << 20), EDQUOT);
    }
}

#[test]
fn enospc_on_a_small_pool() {
    require_fuse!();
    let m = Setup {
        device_bytes: 64 << 20,
        ..Setup::default()
    }
    .mount();
    assert_errno(fill(&m.p("big"), 160 << 20), ENOSPC);
    // Space comes back: the filesystem keeps working after the error. The refused write's
    // data is not synced yet; the write after the remove waits for that sync, which
    // settles the dirty data's estimate, rather than being refused.
    fs::remove_file(m.p("big")).unwrap();
    fs::write(m.p("small"), b"ok").unwrap();
    assert_eq!(fs::read(m.p("small")).unwrap(), b"ok");

    // Full with every byte on the disks: what a remove frees is deferred for DEFER_TXGS
    // txgs, and the next write waits for them to pass instead of failing while nothing
    // else is written.
    assert_errno(fill(&m.p("big"), 160 << 20), ENOSPC);
    m.fs.sync_all().unwrap();
    assert_errno(fill(&m.p("big2"), 160 << 20), ENOSPC);
    m.fs.sync_all().unwrap();
    assert_errno(fill(&m.p("refused"), 4 << 20), ENOSPC);
    fs::remove_file(m.p("big")).unwrap();
    fs::remove_file(m.p("big2")).unwrap();
    let after = noise(16 << 20, 9);
    let mut f = File::create(m.p("after")).unwrap();
    f.write_all(&after).unwrap();
    // With the writeback cache, a refused write shows here.
    f.sync_all().unwrap();
    drop(f);
    assert!(fs::read(m.p("after")).unwrap() == after);
}

#[test]
fn erofs_when_readonly() {
    require_fuse!();
    let m = mounted();
    fs::write(m.p("f"), b"x").unwrap();
    fs::create_dir(m.p("d")).unwrap();
    m.hooks
        .readonly
        .store(true, std::sync::atomic::Ordering::Release);
    assert_errno(OpenOptions::new().write(true).open(m.p("f")), EROFS);
    assert_errno(fs::write(m.p("new"), b"x"), EROFS);
    assert_errno(fs::create_dir(m.p("d2")), EROFS);
    assert_errno(fs::remove_file(m.p("f")), EROFS);
    assert_errno(fs::remove_dir(m.p("d")), EROFS);
    assert_errno(fs::rename(m.p("f"), m.p("g")), EROFS);
    assert_errno(setxattr(&m.p("f"), "user.a", b"v", 0), EROFS);
    assert_eq!(fs::read(m.p("f")).unwrap(), b"x");

    // The `readonly` mount option: the kernel refuses by itself.
    let mut opts = MountOptions::new("fusetest/ro");
    opts.read_only = true;
    let ro = Setup {
        opts,
        ..Setup::default()
    }
    .mount();
    assert_errno(fs::write(ro.p("new"), b"x"), EROFS);
    assert_errno(fs::create_dir(ro.p("d")), EROFS);
    assert_errno(access(&ro.path, libc::W_OK), EROFS);
}

#[test]
fn permissions_of_other_users() {
    require_fuse!();
    let m = mounted();
    fs::create_dir(m.p("private")).unwrap();
    chmod(&m.p("private"), 0o700);
    fs::write(m.p("private/f"), b"secret").unwrap();
    fs::write(m.p("root-only"), b"r").unwrap();
    chmod(&m.p("root-only"), 0o600);
    fs::write(m.p("group-read"), b"g").unwrap();
    std::os::unix::fs::chown(m.p("group-read"), Some(0), Some(SHARED)).unwrap();
    chmod(&m.p("group-read"), 0o640);
    fs::write(m.p("world-read"), b"w").unwrap();
    chmod(&m.p("world-read"), 0o604);
    fs::create_dir(m.p("closed")).unwrap();
    chmod(&m.p("closed"), 0o755);
    fs::create_dir(m.p("open")).unwrap();
    chmod(&m.p("open"), 0o777);

    as_user(USER, GROUP, &[], || {
        assert_errno(fs::read_dir(m.p("private")), EACCES);
        assert_errno(File::open(m.p("private/f")), EACCES);
        assert_errno(File::open(m.p("root-only")), EACCES);
        assert_errno(File::open(m.p("group-read")), EACCES);
        assert_eq!(fs::read(m.p("world-read")).unwrap(), b"w");
        assert_errno(
            OpenOptions::new().write(true).open(m.p("world-read")),
            EACCES,
        );
        assert_errno(fs::write(m.p("closed/new"), b"x"), EACCES);
        assert_errno(fs::create_dir(m.p("closed/new")), EACCES);
        assert_errno(access(&m.p("root-only"), libc::R_OK), EACCES);
        assert_errno(access(&m.p("world-read"), libc::W_OK), EACCES);
        access(&m.p("world-read"), libc::R_OK).unwrap();
        // Only the owner may chmod, chown or set times explicitly.
        assert_errno(
            fs::set_permissions(m.p("world-read"), fs::Permissions::from_mode(0o777)),
            EPERM,
        );
        assert_errno(
            std::os::unix::fs::chown(m.p("world-read"), Some(USER), None),
            EPERM,
        );
        assert_errno(utimens(&m.p("world-read"), (1, 0), (1, 0)), EPERM);
        // A file of one's own in a world-writable directory.
        fs::write(m.p("open/mine"), b"m").unwrap();
        let meta = fs::metadata(m.p("open/mine")).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (USER, GROUP));
        chmod(&m.p("open/mine"), 0o600);
        assert_errno(
            std::os::unix::fs::chown(m.p("open/mine"), Some(OTHER), None),
            EPERM,
        );
    });
    // Supplementary groups count.
    as_user(USER, GROUP, &[SHARED], || {
        assert_eq!(fs::read(m.p("group-read")).unwrap(), b"g");
    });
    // Another user cannot read the first one's 0600 file; root can.
    as_user(OTHER, GROUP, &[], || {
        assert_errno(File::open(m.p("open/mine")), EACCES);
    });
    assert_eq!(fs::read(m.p("open/mine")).unwrap(), b"m");
}

#[test]
fn sticky_directory_protects_other_users_files() {
    require_fuse!();
    let m = mounted();
    fs::create_dir(m.p("tmp")).unwrap();
    chmod(&m.p("tmp"), 0o1777);
    as_user(USER, GROUP, &[], || fs::write(m.p("tmp/a"), b"a").unwrap());
    as_user(OTHER, GROUP, &[], || {
        assert_errno(fs::remove_file(m.p("tmp/a")), EPERM);
        assert_errno(fs::rename(m.p("tmp/a"), m.p("tmp/b")), EPERM);
        fs::write(m.p("tmp/mine"), b"x").unwrap();
        fs::remove_file(m.p("tmp/mine")).unwrap();
    });
    as_user(USER, GROUP, &[], || fs::remove_file(m.p("tmp/a")).unwrap());
}

#[test]
fn creator_may_open_what_it_creates_read_only() {
    require_fuse!();
    let m = mounted();
    fs::create_dir(m.p("open")).unwrap();
    chmod(&m.p("open"), 0o777);
    as_user(USER, GROUP, &[], || {
        let mut f = open_raw(&m.p("open/ro"), libc::O_CREAT | libc::O_RDWR, 0o444).unwrap();
        f.write_all(b"written through the creating descriptor")
            .unwrap();
        drop(f);
        assert_errno(OpenOptions::new().write(true).open(m.p("open/ro")), EACCES);
        assert_eq!(fs::metadata(m.p("open/ro")).unwrap().mode() & 0o777, 0o444);
    });
}

#[test]
fn umask_is_applied() {
    require_fuse!();
    let m = mounted();
    with_umask(0o027, || {
        fs::write(m.p("f"), b"x").unwrap();
        fs::create_dir(m.p("d")).unwrap();
        mkfifo(&m.p("p"), 0o666).unwrap();
        let mut f = open_raw(&m.p("g"), libc::O_CREAT | libc::O_WRONLY, 0o777).unwrap();
        f.write_all(b"y").unwrap();
    });
    let mode = |n: &str| fs::metadata(m.p(n)).unwrap().mode() & 0o7777;
    assert_eq!(mode("f"), 0o640);
    assert_eq!(mode("d"), 0o750);
    assert_eq!(mode("p"), 0o640);
    assert_eq!(mode("g"), 0o750);
    with_umask(0, || fs::create_dir(m.p("d0")).unwrap());
    assert_eq!(mode("d0"), 0o777);
}

#[test]
fn setuid_cleared_on_write_by_non_owner() {
    require_fuse!();
    for writeback in [WritebackCache::On, WritebackCache::Off] {
        let mut opts = MountOptions::new("fusetest/suid");
        opts.writeback_cache = writeback;
        let m = Setup {
            opts,
            ..Setup::default()
        }
        .mount();
        for name in ["suid", "sgid", "sgid-noexec", "root-writes", "truncated"] {
            fs::write(m.p(name), b"original").unwrap();
        }
        chmod(&m.p("suid"), 0o4777);
        chmod(&m.p("sgid"), 0o2777);
        chmod(&m.p("sgid-noexec"), 0o2767);
        chmod(&m.p("root-writes"), 0o6777);
        chmod(&m.p("truncated"), 0o4777);
        as_user(USER, GROUP, &[], || {
            for name in ["suid", "sgid", "sgid-noexec"] {
                let mut f = OpenOptions::new().write(true).open(m.p(name)).unwrap();
                f.write_all(b"changed").unwrap();
            }
            OpenOptions::new()
                .write(true)
                .open(m.p("truncated"))
                .unwrap()
                .set_len(2)
                .unwrap();
        });
        OpenOptions::new()
            .write(true)
            .open(m.p("root-writes"))
            .unwrap()
            .write_all(b"root")
            .unwrap();
        let mode = |n: &str| fs::metadata(m.p(n)).unwrap().mode() & 0o7777;
        assert_eq!(mode("suid"), 0o777, "{writeback:?}");
        assert_eq!(mode("sgid"), 0o777, "{writeback:?}");
        // Without group-execute, set-gid means mandatory locking: kept.
        assert_eq!(mode("sgid-noexec"), 0o2767, "{writeback:?}");
        assert_eq!(mode("root-writes"), 0o6777, "{writeback:?}");
        assert_eq!(mode("truncated"), 0o777, "{writeback:?}");
        assert_eq!(fs::read(m.p("suid")).unwrap(), b"changedl");
        // chown clears set-uid too.
        chmod(&m.p("root-writes"), 0o4755);
        std::os::unix::fs::chown(m.p("root-writes"), Some(USER), None).unwrap();
        assert_eq!(mode("root-writes"), 0o755, "{writeback:?}");
    }
}

#[test]
fn hard_links_and_nlink() {
    require_fuse!();
    let m = mounted();
    fs::write(m.p("f"), b"shared").unwrap();
    fs::create_dir(m.p("d")).unwrap();
    fs::hard_link(m.p("f"), m.p("d/g")).unwrap();
    let (a, b) = (
        fs::metadata(m.p("f")).unwrap(),
        fs::metadata(m.p("d/g")).unwrap(),
    );
    assert_eq!(a.ino(), b.ino());
    assert_eq!((a.nlink(), b.nlink()), (2, 2));
    fs::remove_file(m.p("f")).unwrap();
    assert_eq!(fs::metadata(m.p("d/g")).unwrap().nlink(), 1);
    assert_eq!(fs::read(m.p("d/g")).unwrap(), b"shared");
    // Directories: 2 + subdirectories.
    assert_eq!(fs::metadata(m.p("d")).unwrap().nlink(), 2);
    fs::create_dir(m.p("d/s1")).unwrap();
    fs::create_dir(m.p("d/s2")).unwrap();
    assert_eq!(fs::metadata(m.p("d")).unwrap().nlink(), 4);
    fs::remove_dir(m.p("d/s1")).unwrap();
    assert_eq!(fs::metadata(m.p("d")).unwrap().nlink(), 3);
    assert_errno(fs::hard_link(m.p("d"), m.p("dlink")), EPERM);
}

#[test]
fn renames() {
    require_fuse!();
    let m = mounted();
    fs::write(m.p("a"), b"aaa").unwrap();
    fs::write(m.p("b"), b"bbb").unwrap();
    let b_ino = fs::metadata(m.p("b")).unwrap().ino();
    // Over an existing file: the target is replaced.
    fs::rename(m.p("a"), m.p("b")).unwrap();
    assert_eq!(fs::read(m.p("b")).unwrap(), b"aaa");
    assert_ne!(fs::metadata(m.p("b")).unwrap().ino(), b_ino);
    assert_errno(fs::metadata(m.p("a")), ENOENT);
    // Directories: over an empty one, across parents (".." and link counts follow).
    fs::create_dir_all(m.p("src/inner")).unwrap();
    fs::write(m.p("src/inner/f"), b"f").unwrap();
    fs::create_dir(m.p("dst")).unwrap();
    fs::create_dir(m.p("dst/empty")).unwrap();
    fs::rename(m.p("src/inner"), m.p("dst/empty")).unwrap();
    assert_eq!(fs::read(m.p("dst/empty/f")).unwrap(), b"f");
    assert_eq!(fs::metadata(m.p("src")).unwrap().nlink(), 2);
    assert_eq!(fs::metadata(m.p("dst")).unwrap().nlink(), 3);
    assert_eq!(
        fs::metadata(m.p("dst/empty/..")).unwrap().ino(),
        fs::metadata(m.p("dst")).unwrap().ino()
    );
    // Into its own subtree.
    assert_errno(fs::rename(m.p("dst"), m.p("dst/empty/x")), EINVAL);
    // renameat2: exchange swaps, noreplace refuses.
    fs::write(m.p("x"), b"x").unwrap();
    fs::write(m.p("y"), b"y").unwrap();
    renameat2(&m.p("x"), &m.p("y"), libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(fs::read(m.p("x")).unwrap(), b"y");
    assert_eq!(fs::read(m.p("y")).unwrap(), b"x");
    renameat2(&m.p("x"), &m.p("z"), libc::RENAME_NOREPLACE).unwrap();
    assert_eq!(fs::read(m.p("z")).unwrap(), b"y");
    renameat2(&m.p("z"), &m.p("dst"), libc::RENAME_EXCHANGE).unwrap();
    assert!(fs::metadata(m.p("z")).unwrap().is_dir());
    assert_eq!(fs::read(m.p("dst")).unwrap(), b"y");
    assert_errno(
        renameat2(&m.p("dst"), &m.p("y"), libc::RENAME_WHITEOUT),
        EINVAL,
    );
    // A rename to itself does nothing.
    fs::rename(m.p("y"), m.p("y")).unwrap();
    assert_eq!(fs::read(m.p("y")).unwrap(), b"x");
}

#[test]
fn o_append() {
    require_fuse!();
    for writeback in [WritebackCache::On, WritebackCache::Off] {
        let mut opts = MountOptions::new("fusetest/append");
        opts.writeback_cache = writeback;
        let m = Setup {
            opts,
            ..Setup::default()
        }
        .mount();
        fs::write(m.p("log"), b"start;").unwrap();
        let mut a = OpenOptions::new().append(true).open(m.p("log")).unwrap();
        let mut b = OpenOptions::new().append(true).open(m.p("log")).unwrap();
        a.write_all(b"a1;").unwrap();
        b.write_all(b"b1;").unwrap();
        a.write_all(b"a2;").unwrap();
        // pwrite on an O_APPEND descriptor appends too (Linux).
        a.seek(SeekFrom::Start(0)).unwrap();
        a.write_all(b"a3;").unwrap();
        drop((a, b));
        assert_eq!(
            fs::read(m.p("log")).unwrap(),
            b"start;a1;b1;a2;a3;",
            "{writeback:?}"
        );
    }
}

#[test]
fn truncate_and_o_trunc() {
    require_fuse!();
    let m = mounted();
    fs::write(m.p("f"), b"0123456789").unwrap();
    let f = OpenOptions::new().write(true).open(m.p("f")).unwrap();
    f.set_len(4).unwrap();
    assert_eq!(fs::read(m.p("f")).unwrap(), b"0123");
    f.set_len(8).unwrap();
    assert_eq!(fs::read(m.p("f")).unwrap(), b"0123\0\0\0\0");
    drop(f);
    let mut f = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(m.p("f"))
        .unwrap();
    assert_eq!(fs::metadata(m.p("f")).unwrap().len(), 0);
    f.write_all(b"new").unwrap();
    drop(f);
    assert_eq!(fs::read(m.p("f")).unwrap(), b"new");
    // truncate(2) by path.
    let p = cstr(&m.p("f"));
    check(unsafe { libc::truncate(p.as_ptr(), 1) }).unwrap();
    assert_eq!(fs::read(m.p("f")).unwrap(), b"n");
    // Truncating needs write permission.
    chmod(&m.p("f"), 0o644);
    as_user(USER, GROUP, &[], || {
        assert_errno(
            OpenOptions::new().write(true).truncate(true).open(m.p("f")),
            EACCES,
        );
        assert_errno(check(unsafe { libc::truncate(p.as_ptr(), 0) }), EACCES);
    });
    assert_eq!(fs::read(m.p("f")).unwrap(), b"n");
}

#[test]
fn the_mount_may_hold_more_dirty_pages_than_the_kernels_fuse_default() {
    require_fuse!();
    let m = mounted();
    let dev = fs::metadata(m.p("")).unwrap().dev();
    let bdi = format!(
        "/sys/class/bdi/{}:{}",
        libc::major(dev as libc::dev_t),
        libc::minor(dev as libc::dev_t)
    );
    let max_bytes = std::path::Path::new(&bdi).join("max_bytes");
    // Only where the kernel has the setting (6.2+) and sysfs is writable (not in every
    // container): there the mount must have raised it from the kernel's 1 % (tens of MB).
    // Writing the value back tells whether this process could have set it.
    const NAME: &str = "the_mount_may_hold_more_dirty_pages_than_the_kernels_fuse_default";
    let Ok(text) = fs::read_to_string(&max_bytes) else {
        common::skip(
            NAME,
            &format!("{} absent (Linux 6.2+)", max_bytes.display()),
        );
        return;
    };
    if fs::write(&max_bytes, text.trim()).is_err() {
        common::skip(NAME, &format!("{} not writable here", max_bytes.display()));
        return;
    }
    let v: u64 = text.trim().parse().unwrap();
    assert!(v >= 60 << 20, "max_bytes {v}");
    let ra: u64 = fs::read_to_string(format!("{bdi}/read_ahead_kb"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(ra, u64::from(tank_fuse::READAHEAD_KB));
}

#[test]
fn sparse_files() {
    require_fuse!();
    let m = mounted();
    m.fs.sync_all().unwrap();
    let allocated_before = m.pool.pool.space().allocated;
    let mut f = File::create(m.p("sparse")).unwrap();
    let far = 64u64 << 20;
    f.seek(SeekFrom::Start(far)).unwrap();
    f.write_all(&[7u8; 4096]).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let meta = fs::metadata(m.p("sparse")).unwrap();
    assert_eq!(meta.len(), far + 4096);
    // The hole takes no space in the pool.
    m.fs.sync_all().unwrap();
    // The first fsync of a pool without a log device allocates the intent log's region.
    let region = m.pool.pool.zil.pool_region().map_or(0, |r| r.end - r.start);
    let grown = m.pool.pool.space().allocated - allocated_before - region;
    assert!(grown < 4 << 20, "{grown} bytes allocated for a 4 KiB write");
    // st_blocks counts what the data blocks hold: the one 4 KiB block, not the hole.
    assert_eq!(meta.blocks(), 8);
    let f = File::open(m.p("sparse")).unwrap();
    let mut buf = vec![1u8; 8192];
    f.read_exact_at(&mut buf, far / 2).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
    f.read_exact_at(&mut buf[..4096], far).unwrap();
    assert!(buf[..4096].iter().all(|&b| b == 7));
}

#[test]
fn timestamps_keep_nanoseconds_and_pass_2038() {
    require_fuse!();
    let m = mounted();
    fs::write(m.p("f"), b"x").unwrap();
    let year_2100 = 4_102_444_800i64;
    utimens(
        &m.p("f"),
        (year_2100, 123_456_789),
        (year_2100 + 1, 987_654_321),
    )
    .unwrap();
    let meta = fs::metadata(m.p("f")).unwrap();
    assert_eq!((meta.atime(), meta.atime_nsec()), (year_2100, 123_456_789));
    assert_eq!(
        (meta.mtime(), meta.mtime_nsec()),
        (year_2100 + 1, 987_654_321)
    );
    // Before 1970, with nanoseconds.
    utimens(&m.p("f"), (-86_400, 5), (-1, 999_999_999)).unwrap();
    let meta = fs::metadata(m.p("f")).unwrap();
    assert_eq!((meta.atime(), meta.atime_nsec()), (-86_400, 5));
    assert_eq!((meta.mtime(), meta.mtime_nsec()), (-1, 999_999_999));
    // A write moves mtime and ctime to now. With the writeback cache the
    // kernel stamps the times from its coarse clock, which may trail the
    // clock read here by up to a tick: allow 50 ms of it.
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i128
        - 50_000_000;
    let ns = |s: i64, n: i64| s as i128 * 1_000_000_000 + n as i128;
    OpenOptions::new()
        .write(true)
        .open(m.p("f"))
        .unwrap()
        .write_all(b"y")
        .unwrap();
    let meta = fs::metadata(m.p("f")).unwrap();
    let (mtime, ctime) = (
        ns(meta.mtime(), meta.mtime_nsec()),
        ns(meta.ctime(), meta.ctime_nsec()),
    );
    assert!(mtime >= before, "mtime {mtime} < {before}");
    assert!(ctime >= before, "ctime {ctime} < {before}");
    // UTIME_NOW by a non-owner with write permission is allowed.
    chmod(&m.p("f"), 0o666);
    as_user(USER, GROUP, &[], || {
        let p = cstr(&m.p("f"));
        check(unsafe { libc::utimensat(libc::AT_FDCWD, p.as_ptr(), std::ptr::null(), 0) }).unwrap();
    });
}

#[test]
fn extended_attributes() {
    require_fuse!();
    let m = mounted();
    let f = m.p("f");
    fs::write(&f, b"x").unwrap();
    setxattr(&f, "user.greeting", b"hello", 0).unwrap();
    setxattr(&f, "trusted.secret", b"root only", 0).unwrap();
    // Size probe, exact buffer, too small.
    assert_eq!(getxattr(&f, "user.greeting", 0).unwrap().0, 5);
    assert_eq!(getxattr(&f, "user.greeting", 5).unwrap().1, b"hello");
    assert_errno(getxattr(&f, "user.greeting", 4), ERANGE);
    assert_eq!(getxattr(&f, "trusted.secret", 64).unwrap().1, b"root only");
    let (size, _) = listxattr(&f, 0).unwrap();
    let (_, list) = listxattr(&f, size).unwrap();
    let mut names: Vec<&[u8]> = list.split(|&b| b == 0).filter(|n| !n.is_empty()).collect();
    names.sort();
    assert_eq!(names, vec![&b"trusted.secret"[..], &b"user.greeting"[..]]);
    assert_errno(listxattr(&f, size - 1), ERANGE);
    // Create/replace flags.
    assert_errno(
        setxattr(&f, "user.greeting", b"again", libc::XATTR_CREATE),
        EEXIST,
    );
    assert_errno(
        setxattr(&f, "user.missing", b"v", libc::XATTR_REPLACE),
        ENODATA,
    );
    setxattr(&f, "user.greeting", b"bye", libc::XATTR_REPLACE).unwrap();
    assert_eq!(getxattr(&f, "user.greeting", 16).unwrap().1, b"bye");
    // An empty value is a value.
    setxattr(&f, "user.empty", b"", 0).unwrap();
    assert_eq!(getxattr(&f, "user.empty", 0).unwrap().0, 0);
    removexattr(&f, "user.greeting").unwrap();
    assert_errno(getxattr(&f, "user.greeting", 16), ENODATA);
    assert_errno(removexattr(&f, "user.greeting"), ENODATA);
    // A large value passes.
    let big = noise(60_000, 3);
    setxattr(&f, "user.big", &big, 0).unwrap();
    assert_eq!(getxattr(&f, "user.big", 65536).unwrap().1, big);
    // On directories too.
    fs::create_dir(m.p("d")).unwrap();
    setxattr(&m.p("d"), "user.dir", b"d", 0).unwrap();
    assert_eq!(getxattr(&m.p("d"), "user.dir", 8).unwrap().1, b"d");
}

#[test]
fn statfs_and_mount_table() {
    require_fuse!();
    let m = mounted();
    let st = statvfs(&m.path).unwrap();
    assert!(st.f_bsize > 0);
    assert!(st.f_blocks > 0);
    assert!(st.f_bavail <= st.f_bfree && st.f_bfree <= st.f_blocks);
    assert_eq!(st.f_namemax, 255);
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = mountinfo
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(m.path.to_str().unwrap()))
        .expect("mount listed");
    let right = line.split(" - ").nth(1).unwrap();
    let mut fields = right.split(' ');
    assert_eq!(fields.next(), Some("fuse.tank"));
    assert_eq!(fields.next(), Some("tank:fusetest/fs"));
    assert!(right.contains("allow_other"), "{line}");
}

#[test]
fn unlinked_open_file_stays_readable() {
    require_fuse!();
    let m = mounted();
    let data = noise(300_000, 11);
    fs::write(m.p("f"), &data).unwrap();
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.p("f"))
        .unwrap();
    fs::remove_file(m.p("f")).unwrap();
    assert_errno(fs::metadata(m.p("f")), ENOENT);
    let mut back = Vec::new();
    f.read_to_end(&mut back).unwrap();
    assert_eq!(back, data);
    f.write_all(b"more").unwrap();
    f.sync_all().unwrap();
    assert_eq!(f.metadata().unwrap().nlink(), 0);
    assert_eq!(f.metadata().unwrap().len(), data.len() as u64 + 4);
    // The name can be reused meanwhile.
    fs::write(m.p("f"), b"new").unwrap();
    drop(f);
    assert_eq!(fs::read(m.p("f")).unwrap(), b"new");
}

#[test]
fn fsync_file_and_directory() {
    require_fuse!();
    let m = mounted();
    let mut f = File::create(m.p("f")).unwrap();
    f.write_all(&noise(1 << 20, 5)).unwrap();
    f.sync_data().unwrap();
    f.sync_all().unwrap();
    fs::create_dir(m.p("d")).unwrap();
    File::open(m.p("d")).unwrap().sync_all().unwrap();
    File::open(&m.path).unwrap().sync_all().unwrap();
}

#[test]
fn readdir_of_thousands_of_entries() {
    require_fuse!();
    let m = mounted();
    fs::create_dir(m.p("many")).unwrap();
    let n = 3000;
    for i in 0..n {
        File::create(m.p(&format!("many/file-{i:05}-with-a-longer-name"))).unwrap();
    }
    let mut names: Vec<String> = fs::read_dir(m.p("many"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), n);
    names.sort();
    names.dedup();
    assert_eq!(names.len(), n, "duplicates in the listing");
    // File types come with the entries; metadata of every entry (READDIRPLUS path).
    for e in fs::read_dir(m.p("many")).unwrap() {
        let e = e.unwrap();
        assert!(e.file_type().unwrap().is_file());
        assert_eq!(e.metadata().unwrap().len(), 0);
    }
    // Removing while listing: every entry not removed is still seen exactly once.
    let mut seen = 0;
    for (i, e) in fs::read_dir(m.p("many")).unwrap().enumerate() {
        let e = e.unwrap();
        if i % 2 == 0 {
            fs::remove_file(e.path()).unwrap();
        }
        seen += 1;
    }
    assert!(seen >= n / 2, "saw {seen}");
    let left = fs::read_dir(m.p("many")).unwrap().count();
    assert!((n / 2..n).contains(&left), "{left} left");
}

#[test]
fn root_listing_hides_control_directory() {
    require_fuse!();
    let m = mounted();
    fs::write(m.p("visible"), b"v").unwrap();
    let names: Vec<String> = fs::read_dir(&m.path)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, vec!["visible".to_string()]);
    let meta = fs::metadata(m.p(".tank")).unwrap();
    assert!(meta.is_dir());
    assert_eq!(meta.mode() & 0o7777, 0o555);
    assert_errno(fs::create_dir(m.p(".tank")), EEXIST);
    assert_errno(fs::remove_dir(m.p(".tank")), EROFS);
    assert_errno(fs::write(m.p(".tank/x"), b"x"), EROFS);
    assert_errno(fs::rename(m.p(".tank"), m.p("renamed")), EROFS);
}

#[test]
fn large_requests_pass_through() {
    require_fuse!();
    for writeback in [WritebackCache::On, WritebackCache::Off] {
        let mut opts = MountOptions::new("fusetest/large");
        opts.writeback_cache = writeback;
        let m = Setup {
            opts,
            ..Setup::default()
        }
        .mount();
        let data = noise(8 << 20, 99);
        let mut f = File::create(m.p("big")).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
        drop(f);
        assert_eq!(fs::read(m.p("big")).unwrap(), data, "{writeback:?}");
        let f = File::open(m.p("big")).unwrap();
        for (off, len) in [
            (0usize, 1usize << 20),
            (12345, 1 << 20),
            (7 << 20, 1 << 20),
            (100, 10),
        ] {
            let mut buf = vec![0u8; len];
            f.read_exact_at(&mut buf, off as u64).unwrap();
            assert_eq!(&buf[..], &data[off..off + len]);
        }
        // Overwrite in the middle, unaligned.
        let patch = noise(3 << 20, 100);
        OpenOptions::new()
            .write(true)
            .open(m.p("big"))
            .unwrap()
            .write_all_at(&patch, 777_777)
            .unwrap();
        let mut expect = data.clone();
        expect[777_777..777_777 + patch.len()].copy_from_slice(&patch);
        assert_eq!(fs::read(m.p("big")).unwrap(), expect, "{writeback:?}");
    }
}

#[test]
fn special_files_and_symlinks() {
    require_fuse!();
    let m = mounted();
    mkfifo(&m.p("fifo"), 0o600).unwrap();
    assert!(fs::metadata(m.p("fifo")).unwrap().file_type().is_fifo());
    let long_target = "t".repeat(4000);
    symlink(&long_target, m.p("long")).unwrap();
    assert_eq!(
        fs::read_link(m.p("long")).unwrap().to_str().unwrap(),
        long_target
    );
    assert_eq!(
        fs::symlink_metadata(m.p("long")).unwrap().len(),
        long_target.len() as u64
    );
    symlink("../outside", m.p("rel")).unwrap();
    assert_eq!(
        fs::read_link(m.p("rel")).unwrap().to_str(),
        Some("../outside")
    );
}

#[test]
fn fallocate_modes() {
    require_fuse!();
    let m = mounted();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.p("f"))
        .unwrap();
    fallocate(&f, 0, 0, 1 << 20).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 1 << 20);
    fallocate(&f, libc::FALLOC_FL_KEEP_SIZE, 0, 4 << 20).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 1 << 20);
    f.write_all_at(&[9u8; 65536], 0).unwrap();
    fallocate(
        &f,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        4096,
        8192,
    )
    .unwrap();
    f.sync_all().unwrap();
    let mut buf = vec![1u8; 16384];
    f.read_exact_at(&mut buf, 0).unwrap();
    assert!(buf[..4096].iter().all(|&b| b == 9));
    assert!(buf[4096..12288].iter().all(|&b| b == 0));
    assert!(buf[12288..].iter().all(|&b| b == 9));
    assert_eq!(f.metadata().unwrap().len(), 1 << 20);
}

/// A shared mapping of the first `len` bytes of `f` (unmapped by the caller).
fn map_shared(f: &File, len: usize, prot: libc::c_int) -> *mut libc::c_void {
    use std::os::fd::AsRawFd;
    // SAFETY: a new mapping of a valid descriptor; nothing is read or written here.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            prot,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
    p
}

#[test]
fn shared_mmap_writes_reach_the_file() {
    require_fuse!();
    for writeback in [WritebackCache::On, WritebackCache::Off] {
        let mut opts = MountOptions::new("fusetest/mmap");
        opts.writeback_cache = writeback;
        let m = Setup {
            opts,
            ..Setup::default()
        }
        .mount();
        let len = 256 << 10;
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(m.p("mapped"))
            .unwrap();
        f.set_len(len as u64).unwrap();
        let data = noise(len, 21);
        let p = map_shared(&f, len, libc::PROT_READ | libc::PROT_WRITE);
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), p.cast::<u8>(), len);
            assert_eq!(libc::msync(p, len, libc::MS_SYNC), 0);
            assert_eq!(libc::munmap(p, len), 0);
        }
        drop(f);
        assert_eq!(fs::read(m.p("mapped")).unwrap(), data, "{writeback:?}");
    }
}

/// How many of the file's pages the kernel's page cache holds (mincore of a mapping that
/// is never touched). The file must have no dirty pages: munmap writes them back holding
/// this process's memory map lock, which the server, in this same process, then waits for.
fn cached_pages(f: &File, len: usize) -> usize {
    let page = 4096;
    let pages = len.div_ceil(page);
    let mut vec = vec![0u8; pages];
    let p = map_shared(f, len, libc::PROT_READ);
    unsafe {
        assert_eq!(libc::mincore(p, len, vec.as_mut_ptr()), 0);
        assert_eq!(libc::munmap(p, len), 0);
    }
    vec.iter().filter(|&&b| b & 1 != 0).count()
}

/// Whether this kernel maps files opened past the page cache shared (Linux 6.6).
fn kernel_maps_direct_files() -> bool {
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut parts = release.trim().split(['.', '-']);
    let major: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (major, minor) >= (6, 6)
}

#[test]
fn direct_always_bypasses_the_page_cache_and_stays_coherent() {
    require_fuse!();
    let m = mounted();
    let len = (4 << 20) + 123;
    let data = noise(len, 31);
    // (An open drops the file's cached pages: each file is looked at through the handle
    // that wrote it.)
    let written = |name: &str| {
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(m.p(name))
            .unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
        f
    };
    // direct=standard: what is written stays in the page cache.
    let buffered = written("buffered");
    assert!(
        cached_pages(&buffered, len) > 0,
        "nothing cached with direct=standard"
    );
    drop(buffered);

    *m.hooks.direct.lock() = DirectMode::Always;
    let f = written("direct");
    if kernel_maps_direct_files() {
        assert_eq!(cached_pages(&f, len), 0, "direct=always left pages cached");
    } else {
        eprintln!("kernel before 6.6: direct=always keeps the page cache");
    }
    assert!(fs::read(m.p("direct")).unwrap() == data);
    let mut odd = vec![0u8; 70_001];
    f.read_exact_at(&mut odd, 1_000_003).unwrap();
    assert!(odd[..] == data[1_000_003..1_070_004]);
    // Unaligned writes inside the file, and O_APPEND at its end.
    f.write_all_at(b"inside", 777_777).unwrap();
    let mut a = OpenOptions::new().append(true).open(m.p("direct")).unwrap();
    a.write_all(b"appended").unwrap();
    drop(a);
    let mut want = data.clone();
    want[777_777..777_783].copy_from_slice(b"inside");
    want.extend_from_slice(b"appended");
    assert!(fs::read(m.p("direct")).unwrap() == want);

    // A shared mapping and direct reads and writes see each other.
    let mlen = 64 << 10;
    let p = map_shared(&f, mlen, libc::PROT_READ | libc::PROT_WRITE);
    unsafe {
        let map = std::slice::from_raw_parts_mut(p.cast::<u8>(), mlen);
        assert_eq!(&map[..], &want[..mlen]);
        // Stored through the mapping, read through the file: written back first.
        map[5000..5005].copy_from_slice(b"mmap!");
        let mut got = [0u8; 5];
        f.read_exact_at(&mut got, 5000).unwrap();
        assert_eq!(&got, b"mmap!");
        // Written through the file, seen through the mapping: its pages were dropped.
        f.write_all_at(b"write", 6000).unwrap();
        assert_eq!(&map[6000..6005], b"write");
        // Nothing left dirty for munmap (see `cached_pages`).
        assert_eq!(libc::msync(p, mlen, libc::MS_SYNC), 0);
        assert_eq!(libc::munmap(p, mlen), 0);
    }
    want[5000..5005].copy_from_slice(b"mmap!");
    want[6000..6005].copy_from_slice(b"write");
    drop(f);
    *m.hooks.direct.lock() = DirectMode::Standard;
    assert!(fs::read(m.p("direct")).unwrap() == want);
    assert!(fs::read(m.p("buffered")).unwrap() == data);
}

#[test]
fn parallel_clients() {
    require_fuse!();
    let m = mounted();
    fs::create_dir(m.p("shared")).unwrap();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let m = &m;
            s.spawn(move || {
                let dir = m.p(&format!("t{t}"));
                fs::create_dir(&dir).unwrap();
                for i in 0..150u64 {
                    let data = noise(1000 + (i as usize * 37) % 5000, t * 1000 + i);
                    let p = dir.join(format!("f{i}"));
                    fs::write(&p, &data).unwrap();
                    assert_eq!(fs::read(&p).unwrap(), data);
                    // Same directory for everyone: parallel directory operations.
                    let shared = m.p(&format!("shared/t{t}-{i}"));
                    fs::rename(&p, &shared).unwrap();
                    if i % 3 == 0 {
                        fs::remove_file(&shared).unwrap();
                    }
                }
                fs::read_dir(m.p("shared")).unwrap().count()
            });
        }
    });
    let left = fs::read_dir(m.p("shared")).unwrap().count();
    assert_eq!(left, 4 * 100);
    for t in 0..4 {
        assert_eq!(fs::read_dir(m.p(&format!("t{t}"))).unwrap().count(), 0);
    }
}

#[test]
fn set_gid_directories_and_group_rules() {
    require_fuse!();
    let m = mounted();
    fs::create_dir(m.p("team")).unwrap();
    std::os::unix::fs::chown(m.p("team"), Some(0), Some(SHARED)).unwrap();
    chmod(&m.p("team"), 0o2777);
    as_user(USER, GROUP, &[SHARED], || {
        fs::write(m.p("team/f"), b"x").unwrap();
        fs::create_dir(m.p("team/sub")).unwrap();
        let f = fs::metadata(m.p("team/f")).unwrap();
        assert_eq!((f.uid(), f.gid()), (USER, SHARED));
        let d = fs::metadata(m.p("team/sub")).unwrap();
        assert_eq!(d.gid(), SHARED);
        assert_ne!(d.mode() & 0o2000, 0, "set-gid is inherited by directories");
        // The owner may give a file to a group it belongs to, not to another one.
        std::os::unix::fs::chown(m.p("team/f"), None, Some(GROUP)).unwrap();
        std::os::unix::fs::chown(m.p("team/f"), None, Some(SHARED)).unwrap();
        assert_errno(
            std::os::unix::fs::chown(m.p("team/f"), None, Some(OTHER)),
            EPERM,
        );
    });
    // chmod g+s by an owner outside the file's group drops the bit.
    as_user(USER, GROUP, &[], || {
        chmod(&m.p("team/f"), 0o2755);
        assert_eq!(fs::metadata(m.p("team/f")).unwrap().mode() & 0o7777, 0o755);
    });
}

#[test]
fn ctime_follows_metadata_changes() {
    require_fuse!();
    let m = mounted();
    fs::write(m.p("f"), b"x").unwrap();
    utimens(&m.p("f"), (1_000_000_000, 0), (1_000_000_000, 0)).unwrap();
    let ctime = |p: &str| {
        let meta = fs::symlink_metadata(m.p(p)).unwrap();
        (meta.ctime(), meta.ctime_nsec())
    };
    let mut last = ctime("f");
    let mut step = |what: &str, f: &dyn Fn()| {
        // With the writeback cache the kernel stamps ctime itself, from its coarse clock
        // (one tick is up to 10 ms).
        std::thread::sleep(std::time::Duration::from_millis(25));
        f();
        let now = ctime("f");
        assert!(now > last, "{what} did not move ctime");
        last = now;
    };
    step("chmod", &|| chmod(&m.p("f"), 0o600));
    step("link", &|| fs::hard_link(m.p("f"), m.p("g")).unwrap());
    step("rename", &|| fs::rename(m.p("g"), m.p("h")).unwrap());
    step("setxattr", &|| {
        setxattr(&m.p("f"), "user.a", b"1", 0).unwrap()
    });
    step("truncate", &|| {
        OpenOptions::new()
            .write(true)
            .open(m.p("f"))
            .unwrap()
            .set_len(0)
            .unwrap()
    });
    // Times stay where utimensat put them otherwise.
    let meta = fs::metadata(m.p("f")).unwrap();
    assert_eq!(meta.atime(), 1_000_000_000);
    // UTIME_OMIT leaves a time alone.
    let p = cstr(&m.p("f"));
    let times = [
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        libc::timespec {
            tv_sec: 2_000_000_000,
            tv_nsec: 42,
        },
    ];
    check(unsafe { libc::utimensat(libc::AT_FDCWD, p.as_ptr(), times.as_ptr(), 0) }).unwrap();
    let meta = fs::metadata(m.p("f")).unwrap();
    assert_eq!(meta.atime(), 1_000_000_000);
    assert_eq!((meta.mtime(), meta.mtime_nsec()), (2_000_000_000, 42));
}

#[test]
fn rename_over_a_hard_linked_file() {
    require_fuse!();
    let m = mounted();
    fs::write(m.p("a"), b"a").unwrap();
    fs::write(m.p("b"), b"b").unwrap();
    fs::hard_link(m.p("b"), m.p("b2")).unwrap();
    assert_eq!(fs::metadata(m.p("b2")).unwrap().nlink(), 2);
    fs::rename(m.p("a"), m.p("b")).unwrap();
    assert_eq!(fs::metadata(m.p("b2")).unwrap().nlink(), 1);
    assert_eq!(fs::read(m.p("b2")).unwrap(), b"b");
    assert_eq!(fs::read(m.p("b")).unwrap(), b"a");
    // Renaming one hard link onto another of the same inode does nothing.
    fs::hard_link(m.p("b"), m.p("b3")).unwrap();
    fs::rename(m.p("b"), m.p("b3")).unwrap();
    assert!(m.p("b").exists() && m.p("b3").exists());
    assert_eq!(fs::metadata(m.p("b3")).unwrap().nlink(), 2);
}

#[test]
fn o_dsync_and_o_sync_writes_commit_the_intent_log() {
    require_fuse!();
    let m = mounted();
    let zil = || m.pool.pool.zil.stats();
    for (name, flag) in [("dsync", libc::O_DSYNC), ("sync", libc::O_SYNC)] {
        let mut f = fs::OpenOptions::new()
            .create(true)
            .write(true)
            .custom_flags(flag)
            .open(m.p(name))
            .unwrap();
        let before = zil();
        f.write_all(b"durable when write returns").unwrap();
        let after = zil();
        // The kernel follows such a write with FSYNC (and the server commits when the flag
        // comes with the write). Every commit is on the log or, when the log cannot take
        // it, a txg sync.
        assert!(
            after.commits + after.fallbacks > before.commits + before.fallbacks,
            "{name}: a write with O_{} committed nothing ({before:?} -> {after:?})",
            name.to_uppercase()
        );
    }
    // Without the flag, a write is not committed until fsync.
    let mut f = File::create(m.p("plain")).unwrap();
    let before = zil();
    f.write_all(b"buffered").unwrap();
    let after = zil();
    assert_eq!(
        after.commits + after.fallbacks,
        before.commits + before.fallbacks,
        "a plain write committed the log"
    );
    f.sync_all().unwrap();
    let synced = zil();
    assert!(synced.commits + synced.fallbacks > after.commits + after.fallbacks);
}
