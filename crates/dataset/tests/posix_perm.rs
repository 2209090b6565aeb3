//! Permissions and ownership as the Linux kernel enforces them, with root and non-root
//! callers: search permission on every directory looked up in, write and search on the
//! parent to create and remove, owner/group/other classes with supplementary groups, root's
//! bypass (but execute needs an x bit), sticky directories, chmod/chown/chgrp rules, set-uid
//! and set-gid clearing, set-gid directories, utimes rules, open access modes, device nodes.

mod posix_common;

use posix_common::*;
use tank_dataset::posix::*;
use tank_dataset::Errno;

fn root() -> Cred {
    Cred::root()
}

const ALICE: u32 = 1000;
const BOB: u32 = 1001;
const STAFF: u32 = 50;

fn alice() -> Cred {
    Cred::user(ALICE, ALICE)
}

fn bob() -> Cred {
    Cred::user(BOB, BOB)
}

fn chmod(fs: &Fs, cred: &Cred, ino: Ino, mode: u32) -> Result<Attr> {
    fs.setattr(
        cred,
        ino,
        &SetAttr {
            mode: Some(mode),
            ..SetAttr::default()
        },
    )
}

fn chown(fs: &Fs, cred: &Cred, ino: Ino, uid: Option<u32>, gid: Option<u32>) -> Result<Attr> {
    fs.setattr(
        cred,
        ino,
        &SetAttr {
            uid,
            gid,
            ..SetAttr::default()
        },
    )
}

/// A directory owned by `uid:gid` with `mode`, made by root.
fn owned_dir(fs: &Fs, parent: Ino, name: &str, uid: u32, gid: u32, mode: u32) -> Ino {
    let d = fs.mkdir(&root(), parent, os(name), mode).unwrap();
    chown(fs, &root(), d.ino, Some(uid), Some(gid)).unwrap();
    chmod(fs, &root(), d.ino, mode).unwrap();
    d.ino
}

fn owned_file(fs: &Fs, parent: Ino, name: &str, uid: u32, gid: u32, mode: u32) -> Ino {
    let f = fs
        .mknod(&root(), parent, os(name), libc::S_IFREG | 0o644, 0)
        .unwrap();
    chown(fs, &root(), f.ino, Some(uid), Some(gid)).unwrap();
    chmod(fs, &root(), f.ino, mode).unwrap();
    f.ino
}

const REG: u32 = libc::S_IFREG | 0o644;

#[test]
fn search_permission_on_every_directory_looked_up_in() {
    let t = MemFs::new(128 << 20);
    let fs = &t.fs;
    let a = alice();
    let closed = owned_dir(fs, ROOT_INO, "closed", 0, 0, 0o700);
    owned_file(fs, closed, "f", ALICE, ALICE, 0o666);
    let e = Errno::EACCES;
    assert_eq!(fs.lookup(&a, closed, os("f")).unwrap_err(), e);
    assert_eq!(fs.lookup(&a, closed, os("nope")).unwrap_err(), e);
    assert_eq!(fs.mknod(&a, closed, os("n"), REG, 0).unwrap_err(), e);
    assert_eq!(fs.unlink(&a, closed, os("f")).unwrap_err(), e);
    assert_eq!(fs.readdir(&a, closed, 0, 10).unwrap_err(), e);
    // Search without read: lookups work, listing does not.
    chmod(fs, &root(), closed, 0o711).unwrap();
    assert!(fs.lookup(&a, closed, os("f")).is_ok());
    assert_eq!(
        fs.lookup(&a, closed, os("nope")).unwrap_err(),
        Errno::ENOENT
    );
    assert_eq!(fs.readdir(&a, closed, 0, 10).unwrap_err(), e);
    // Read without search: listing works, lookups do not.
    chmod(fs, &root(), closed, 0o744).unwrap();
    assert!(fs.readdir(&a, closed, 0, 10).is_ok());
    assert_eq!(fs.lookup(&a, closed, os("f")).unwrap_err(), e);
    // Root searches anything.
    chmod(fs, &root(), closed, 0o000).unwrap();
    assert!(fs.lookup(&root(), closed, os("f")).is_ok());
    assert!(fs.readdir(&root(), closed, 0, 10).is_ok());
}

#[test]
fn creating_and_removing_need_write_and_search_on_the_parent() {
    let t = MemFs::new(128 << 20);
    let fs = &t.fs;
    let a = alice();
    let d = owned_dir(fs, ROOT_INO, "d", ALICE, ALICE, 0o555);
    owned_file(fs, d, "f", ALICE, ALICE, 0o644);
    owned_dir(fs, d, "sub", ALICE, ALICE, 0o755);
    let e = Errno::EACCES;
    assert_eq!(fs.mknod(&a, d, os("n"), REG, 0).unwrap_err(), e);
    assert_eq!(fs.mkdir(&a, d, os("n"), 0o755).unwrap_err(), e);
    assert_eq!(fs.symlink(&a, d, os("n"), os("t")).unwrap_err(), e);
    assert_eq!(fs.unlink(&a, d, os("f")).unwrap_err(), e);
    assert_eq!(fs.rmdir(&a, d, os("sub")).unwrap_err(), e);
    let f = fs.lookup(&a, d, os("f")).unwrap().ino;
    assert_eq!(fs.link(&a, f, d, os("l")).unwrap_err(), e);
    assert_eq!(
        fs.rename(&a, d, os("f"), d, os("g"), RenameFlags::default())
            .unwrap_err(),
        e
    );
    // An existing name is EEXIST, and a missing one ENOENT, before the write check.
    assert_eq!(fs.mknod(&a, d, os("f"), REG, 0).unwrap_err(), Errno::EEXIST);
    assert_eq!(fs.unlink(&a, d, os("zz")).unwrap_err(), Errno::ENOENT);
    // Write without search is not enough either.
    chmod(fs, &a, d, 0o666).unwrap();
    assert_eq!(fs.mknod(&a, d, os("n"), REG, 0).unwrap_err(), e);
    chmod(fs, &a, d, 0o333).unwrap();
    let n = fs.mknod(&a, d, os("n"), REG, 0).unwrap();
    assert_eq!((n.uid, n.gid, n.perm), (ALICE, ALICE, 0o644));
    fs.unlink(&a, d, os("n")).unwrap();
    fs.rmdir(&a, d, os("sub")).unwrap();
    // Root passes without any bit.
    chmod(fs, &root(), d, 0o000).unwrap();
    fs.mknod(&root(), d, os("r"), REG, 0).unwrap();
    fs.unlink(&root(), d, os("r")).unwrap();
}

#[test]
fn owner_group_and_other_classes_with_supplementary_groups() {
    let t = MemFs::new(128 << 20);
    let fs = &t.fs;
    let f = owned_file(fs, ROOT_INO, "f", ALICE, STAFF, 0o640);
    let mut b = bob();
    assert_eq!(fs.open(&b, f, libc::O_RDONLY).unwrap_err(), Errno::EACCES);
    assert_eq!(fs.access(&b, f, libc::R_OK).unwrap_err(), Errno::EACCES);
    assert_eq!(fs.access(&b, f, 0), Ok(()));
    b.groups.push(STAFF);
    fs.open(&b, f, libc::O_RDONLY).unwrap();
    fs.release(f).unwrap();
    assert_eq!(fs.open(&b, f, libc::O_RDWR).unwrap_err(), Errno::EACCES);
    assert_eq!(fs.access(&b, f, libc::W_OK).unwrap_err(), Errno::EACCES);
    // The primary group counts too.
    let c = Cred::user(BOB, STAFF);
    assert_eq!(fs.access(&c, f, libc::R_OK), Ok(()));
    // The owner class applies to the owner even when it allows less than the others.
    chmod(fs, &root(), f, 0o077).unwrap();
    assert_eq!(
        fs.open(&alice(), f, libc::O_RDONLY).unwrap_err(),
        Errno::EACCES
    );
    assert_eq!(
        fs.access(&bob(), f, libc::R_OK | libc::W_OK | libc::X_OK),
        Ok(())
    );
    assert_eq!(fs.access(&alice(), f, 42).unwrap_err(), Errno::EINVAL);
    assert_eq!(fs.access(&alice(), 9999, 0).unwrap_err(), Errno::ENOENT);
}

#[test]
fn root_bypasses_everything_but_execute_without_an_x_bit() {
    let t = MemFs::new(128 << 20);
    let fs = &t.fs;
    let r = root();
    let f = owned_file(fs, ROOT_INO, "f", ALICE, ALICE, 0o000);
    fs.open(&r, f, libc::O_RDWR).unwrap();
    fs.release(f).unwrap();
    assert_eq!(fs.access(&r, f, libc::R_OK | libc::W_OK), Ok(()));
    assert_eq!(fs.access(&r, f, libc::X_OK).unwrap_err(), Errno::EACCES);
    chmod(fs, &r, f, 0o001).unwrap();
    assert_eq!(fs.access(&r, f, libc::X_OK), Ok(()));
    let d = owned_dir(fs, ROOT_INO, "d", ALICE, ALICE, 0o000);
    assert_eq!(fs.access(&r, d, libc::X_OK), Ok(()));
}

#[test]
fn sticky_directories_protect_other_users_files() {
    let t = MemFs::new(128 << 20);
    let fs = &t.fs;
    let (a, b) = (alice(), bob());
    let tmp = owned_dir(fs, ROOT_INO, "tmp", 0, 0, 0o1777);
    fs.mknod(&a, tmp, os("alice"), REG, 0).unwrap();
    fs.mknod(&b, tmp, os("bob"), REG, 0).unwrap();
    fs.mkdir(&a, tmp, os("alicedir"), 0o777).unwrap();
    let plain = RenameFlags::default();
    assert_eq!(fs.unlink(&b, tmp, os("alice")).unwrap_err(), Errno::EPERM);
    assert_eq!(fs.rmdir(&b, tmp, os("alicedir")).unwrap_err(), Errno::EPERM);
    assert_eq!(
        fs.rename(&b, tmp, os("alice"), tmp, os("mine"), plain)
            .unwrap_err(),
        Errno::EPERM
    );
    assert_eq!(
        fs.rename(&b, tmp, os("bob"), tmp, os("alice"), plain)
            .unwrap_err(),
        Errno::EPERM
    );
    // Bob may still replace his own names, and Alice remove hers.
    fs.rename(&b, tmp, os("bob"), tmp, os("bob2"), plain)
        .unwrap();
    fs.unlink(&a, tmp, os("alice")).unwrap();
    // The directory's owner may remove anything in it.
    let owned = owned_dir(fs, ROOT_INO, "owned", ALICE, ALICE, 0o1777);
    fs.mknod(&b, owned, os("bob"), REG, 0).unwrap();
    fs.unlink(&a, owned, os("bob")).unwrap();
    fs.rmdir(&root(), tmp, os("alicedir")).unwrap();
}

#[test]
fn chmod_by_owner_or_root_and_setgid_outside_the_group() {
    let t = MemFs::new(128 << 20);
    let fs = &t.fs;
    let f = owned_file(fs, ROOT_INO, "f", ALICE, STAFF, 0o644);
    assert_eq!(chmod(fs, &bob(), f, 0o777).unwrap_err(), Errno::EPERM);
    assert_eq!(chmod(fs, &alice(), f, 0o4755).unwrap().perm, 0o4755);
    // Alice is not in STAFF: set-gid is dropped silently.
    assert_eq!(chmod(fs, &alice(), f, 0o2755).unwrap().perm, 0o0755);
    let mut in_staff = alice();
    in_staff.groups.push(STAFF);
    assert_eq!(chmod(fs, &in_staff, f, 0o2755).unwrap().perm, 0o2755);
    assert_eq!(chmod(fs, &root(), f, 0o2755).unwrap().perm, 0o2755);
    // The kind bits of the mode are ignored.
    assert_eq!(
        chmod(fs, &root(), f, libc::S_IFDIR | 0o600).unwrap().kind,
        FileKind::File
    );
}

#[test]
fn chown_by_root_and_chgrp_by_the_owner_to_his_groups() {
    let t = MemFs::new(128 << 20);
    let fs = &t.fs;
    let f = owned_file(fs, ROOT_INO, "f", ALICE, ALICE, 0o644);
    let mut a = alice();
    a.groups.push(STAFF);
    assert_eq!(chown(fs, &a, f, Some(BOB), None).unwrap_err(), Errno::EPERM);
    assert_eq!(chown(fs, &a, f, Some(ALICE), None).unwrap().uid, ALICE);
    assert_eq!(chown(fs, &a, f, None, Some(STAFF)).unwrap().gid, STAFF);
    assert_eq!(chown(fs, &a, f, None, Some(STAFF)).unwrap().gid, STAFF);
    assert_eq!(chown(fs, &a, f, None, Some(7)).unwrap_err(), Errno::EPERM);
    let mut b = bob();
    b.groups.push(STAFF);
    assert_eq!(chown(fs, &b, f, None, Some(BOB)).unwrap_err(), Errno::EPERM);
    let c = chown(fs, &root(), f, Some(BOB), Some(7)).unwrap();
    assert_eq!((c.uid, c.gid), (BOB, 7));
    // A change of owner clears set-uid, and set-gid when group-executable, whoever does it
    // (chown_common); directories keep theirs.
    chmod(fs, &root(), f, 0o6755).unwrap();
    assert_eq!(
        chown(fs, &root(), f, Some(ALICE), None).unwrap().perm,
        0o0755
    );
    chmod(fs, &root(), f, 0o6745).unwrap();
    assert_eq!(
        chown(fs, &root(), f, None, Some(ALICE)).unwrap().perm,
        0o2745
    );
    // An explicit mode in the same change is kept as given.
    let both = fs
        .setattr(
            &root(),
            f,
            &SetAttr {
                mode: Some(0o4755),
                uid: Some(BOB),
                ..SetAttr::default()
            },
        )
        .unwrap();
    assert_eq!((both.uid, both.perm), (BOB, 0o4755));
    let d = owned_dir(fs, ROOT_INO, "d", ALICE, ALICE, 0o3775);
    assert_eq!(chown(fs, &root(), d, Some(BOB), None).unwrap().perm, 0o3775);
}

#[test]
fn writes_by_others_than_root_clear_setuid_and_setgid() {
    let t = MemFs::new(128 << 20);
    let fs = &t.fs;
    let f = owned_file(fs, ROOT_INO, "f", ALICE, ALICE, 0o6777);
    fs.write(&root(), f, 0, b"root", false).unwrap();
    assert_eq!(fs.getattr(f).unwrap().perm, 0o6777);
    let c0 = fs.getattr(f).unwrap().ctime;
    fs.write(&bob(), f, 0, b"bob", false).unwrap();
    let a = fs.getattr(f).unwrap();
    assert_eq!(a.perm, 0o0777);
    assert!(a.ctime >= c0);
    // Without group execute, set-gid marks mandatory locking and stays.
    chmod(fs, &root(), f, 0o6766).unwrap();
    fs.write(&bob(), f, 0, b"bob", false).unwrap();
    assert_eq!(fs.getattr(f).unwrap().perm, 0o2766);
    // Truncation and fallocate too.
    chmod(fs, &root(), f, 0o4777).unwrap();
    fs.setattr(
        &bob(),
        f,
        &SetAttr {
            size: Some(1),
            ..SetAttr::default()
        },
    )
    .unwrap();
    assert_eq!(fs.getattr(f).unwrap().perm, 0o0777);
    chmod(fs, &root(), f, 0o4777).unwrap();
    fs.fallocate(&bob(), f, 0, 100, 0).unwrap();
    assert_eq!(fs.getattr(f).unwrap().perm, 0o0777);
}

#[test]
fn setgid_directories_pass_their_group_on() {
    let t = MemFs::new(128 << 20);
    let fs = &t.fs;
    let a = alice();
    let d = owned_dir(fs, ROOT_INO, "shared", 0, STAFF, 0o2777);
    let f = fs.mknod(&a, d, os("f"), REG, 0).unwrap();
    assert_eq!((f.uid, f.gid, f.perm), (ALICE, STAFF, 0o644));
    let sub = fs.mkdir(&a, d, os("sub"), 0o755).unwrap();
    assert_eq!((sub.gid, sub.perm), (STAFF, 0o2755));
    // A group-executable set-gid file in a group its creator is not in loses set-gid.
    let g = fs.mknod(&a, d, os("g"), libc::S_IFREG | 0o2755, 0).unwrap();
    assert_eq!(g.perm, 0o0755);
    let plain = fs
        .mknod(&a, ROOT_INO, os("h"), libc::S_IFREG | 0o2755, 0)
        .unwrap_err();
    assert_eq!(plain, Errno::EACCES, "the root directory is 0755 root's");
    let mine = owned_dir(fs, ROOT_INO, "mine", ALICE, ALICE, 0o755);
    let h = fs
        .mknod(&a, mine, os("h"), libc::S_IFREG | 0o2755, 0)
        .unwrap();
    assert_eq!((h.gid, h.perm), (ALICE, 0o2755));
}

#[test]
fn utimes_rules() {
    let t = MemFs::new(128 << 20);
    let fs = &t.fs;
    let f = owned_file(fs, ROOT_INO, "f", ALICE, ALICE, 0o646);
    let at = TimeSet::At(Timespec { sec: 5, nsec: 6 });
    let set = |atime, mtime| SetAttr {
        atime,
        mtime,
        ..SetAttr::default()
    };
    // Explicit times: owner or root only.
    assert_eq!(
        fs.setattr(&bob(), f, &set(Some(at), Some(at))).unwrap_err(),
        Errno::EPERM
    );
    fs.setattr(&alice(), f, &set(Some(at), None)).unwrap();
    fs.setattr(&root(), f, &set(None, Some(at))).unwrap();
    // Both set to now: anyone who may write.
    let now = Some(TimeSet::Now);
    fs.setattr(&bob(), f, &set(now, now)).unwrap();
    assert_eq!(
        fs.setattr(&bob(), f, &set(now, None)).unwrap_err(),
        Errno::EPERM
    );
    chmod(fs, &root(), f, 0o644).unwrap();
    assert_eq!(
        fs.setattr(&bob(), f, &set(now, now)).unwrap_err(),
        Errno::EACCES
    );
    fs.setattr(&alice(), f, &set(now, now)).unwrap();
}

#[test]
fn open_checks_the_access_mode_and_truncates() {
    let t = MemFs::new(128 << 20);
    let fs = &t.fs;
    let b = bob();
    let f = owned_file(fs, ROOT_INO, "f", ALICE, ALICE, 0o604);
    fs.write(&root(), f, 0, b"content", false).unwrap();
    fs.open(&b, f, libc::O_RDONLY).unwrap();
    assert_eq!(fs.open(&b, f, libc::O_WRONLY).unwrap_err(), Errno::EACCES);
    assert_eq!(fs.open(&b, f, libc::O_RDWR).unwrap_err(), Errno::EACCES);
    assert_eq!(
        fs.open(&b, f, libc::O_RDONLY | libc::O_TRUNC).unwrap_err(),
        Errno::EACCES
    );
    assert_eq!(fs.getattr(f).unwrap().size, 7);
    chmod(fs, &root(), f, 0o6606).unwrap();
    fs.open(&b, f, libc::O_WRONLY | libc::O_TRUNC).unwrap();
    let a = fs.getattr(f).unwrap();
    assert_eq!(
        (a.size, a.perm),
        (0, 0o2606),
        "set-gid without group execute stays"
    );
    fs.release(f).unwrap();
    fs.release(f).unwrap();
    assert_eq!(fs.release(f).unwrap_err(), Errno::EBADF);
    let d = owned_dir(fs, ROOT_INO, "d", BOB, BOB, 0o755);
    assert_eq!(fs.open(&b, d, libc::O_WRONLY).unwrap_err(), Errno::EISDIR);
    fs.open(&b, d, libc::O_RDONLY | libc::O_DIRECTORY).unwrap();
    fs.release(d).unwrap();
    // create: a new file opens without the access check, an existing one with it.
    let c = fs
        .create(
            &b,
            d,
            os("new"),
            libc::S_IFREG | 0o444,
            libc::O_WRONLY | libc::O_CREAT,
        )
        .unwrap();
    assert_eq!(c.perm, 0o444);
    fs.write(&b, c.ino, 0, b"ok", false).unwrap();
    fs.release(c.ino).unwrap();
    assert_eq!(
        fs.create(&b, d, os("new"), REG, libc::O_WRONLY | libc::O_CREAT)
            .unwrap_err(),
        Errno::EACCES
    );
    assert_eq!(
        fs.create(&b, d, os("new"), REG, libc::O_CREAT | libc::O_EXCL)
            .unwrap_err(),
        Errno::EEXIST
    );
    let again = fs
        .create(&b, d, os("new"), REG, libc::O_RDONLY | libc::O_CREAT)
        .unwrap();
    assert_eq!(again.ino, c.ino);
    fs.release(c.ino).unwrap();
    assert_eq!(
        fs.create(&b, ROOT_INO, os("d"), REG, libc::O_RDONLY | libc::O_CREAT)
            .unwrap_err(),
        Errno::EISDIR
    );
}

#[test]
fn truncation_needs_write_permission() {
    let t = MemFs::new(128 << 20);
    let fs = &t.fs;
    let f = owned_file(fs, ROOT_INO, "f", ALICE, ALICE, 0o644);
    let trunc = SetAttr {
        size: Some(0),
        ..SetAttr::default()
    };
    assert_eq!(fs.setattr(&bob(), f, &trunc).unwrap_err(), Errno::EACCES);
    fs.setattr(&alice(), f, &trunc).unwrap();
}

#[test]
fn device_nodes_need_root() {
    let t = MemFs::new(128 << 20);
    let fs = &t.fs;
    let d = owned_dir(fs, ROOT_INO, "d", ALICE, ALICE, 0o755);
    let a = alice();
    assert_eq!(
        fs.mknod(&a, d, os("c"), libc::S_IFCHR | 0o600, 0x0103)
            .unwrap_err(),
        Errno::EPERM
    );
    assert_eq!(
        fs.mknod(&a, d, os("b"), libc::S_IFBLK | 0o600, 0x0801)
            .unwrap_err(),
        Errno::EPERM
    );
    let c = fs
        .mknod(&root(), d, os("c"), libc::S_IFCHR | 0o600, 0x0103)
        .unwrap();
    assert_eq!((c.kind, c.rdev), (FileKind::CharDev, 0x0103));
    let p = fs.mknod(&a, d, os("p"), libc::S_IFIFO | 0o600, 0).unwrap();
    assert_eq!((p.kind, p.rdev), (FileKind::Fifo, 0));
    let s = fs.mknod(&a, d, os("s"), libc::S_IFSOCK | 0o600, 0).unwrap();
    assert_eq!(s.kind, FileKind::Socket);
    let plain = fs.mknod(&a, d, os("z"), 0o600, 0).unwrap();
    assert_eq!(plain.kind, FileKind::File);
    assert_eq!(
        fs.mknod(&a, d, os("x"), libc::S_IFDIR | 0o755, 0)
            .unwrap_err(),
        Errno::EPERM
    );
    assert_eq!(
        fs.mknod(&a, d, os("x"), libc::S_IFLNK | 0o777, 0)
            .unwrap_err(),
        Errno::EINVAL
    );
    let t = t.reopen();
    let c = t.fs.lookup(&root(), d, os("c")).unwrap();
    assert_eq!((c.kind, c.rdev), (FileKind::CharDev, 0x0103));
    fsck(&t.fs, &t.store).unwrap();
}

#[test]
fn rename_permissions() {
    let t = MemFs::new(128 << 20);
    let fs = &t.fs;
    let a = alice();
    let plain = RenameFlags::default();
    let src = owned_dir(fs, ROOT_INO, "src", ALICE, ALICE, 0o755);
    let dst = owned_dir(fs, ROOT_INO, "dst", ALICE, ALICE, 0o755);
    let ro = owned_dir(fs, ROOT_INO, "ro", ALICE, ALICE, 0o555);
    owned_dir(fs, src, "locked", ALICE, ALICE, 0o555);
    owned_file(fs, src, "f", ALICE, ALICE, 0o444);
    // Moving a directory to another parent rewrites its "..": write permission on it.
    assert_eq!(
        fs.rename(&a, src, os("locked"), dst, os("locked"), plain)
            .unwrap_err(),
        Errno::EACCES
    );
    // Renaming it within its parent does not.
    fs.rename(&a, src, os("locked"), src, os("locked2"), plain)
        .unwrap();
    // A file needs no permission on itself, only on both parents.
    fs.rename(&a, src, os("f"), dst, os("f"), plain).unwrap();
    assert_eq!(
        fs.rename(&a, dst, os("f"), ro, os("f"), plain).unwrap_err(),
        Errno::EACCES
    );
    assert_eq!(
        fs.rename(&bob(), dst, os("f"), src, os("f"), plain)
            .unwrap_err(),
        Errno::EACCES
    );
    fs.rename(&root(), src, os("locked2"), dst, os("locked"), plain)
        .unwrap();
    fsck(fs, &t.store).unwrap();
}
