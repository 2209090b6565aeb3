//! The permission matrix: every operation against every file type, as the owner, a member
//! of the file's group and anyone else, through the mount, with the modes of the directory
//! and of the files changed between steps (no sleeps: what the kernel cached must never let
//! a change be bypassed), each result checked against POSIX as Linux applies it.
//!
//! The story behind it: the mount had no `default_permissions`, so the kernel resolved
//! cached names without asking the server: right after `dir` lost its search bit an
//! unprivileged user could still open, truncate, chmod, chown or link `dir/file`; opening a
//! FIFO ignored its mode (the kernel never asks the server); and `open(O_CREAT|O_RDWR, 0)`
//! followed by `ftruncate` was refused with EACCES.
//!
//! `expect` is the model: the answer POSIX gives (in the order Linux checks), from the
//! caller's class (owner, group, other), the directory's mode and the object's. Runs as root
//! and switches threads to unprivileged uids and gids (`common::as_user`).

#![allow(unsafe_code)]

mod common;

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;

use common::*;
use libc::{EACCES, EINVAL, EISDIR, ENODATA, ENOTDIR, ENOTEMPTY, ENXIO, EPERM};
use tank_dataset::Errno;

/// A user: uid, gid, supplementary groups.
type User = (u32, u32, &'static [u32]);

/// The objects' owner; not in their group.
const OWNER: User = (65534, 65534, &[]);
/// The objects' group.
const GROUP: u32 = 65532;
/// A member of the objects' group through a supplementary group.
const MEMBER: User = (65533, 65533, &[GROUP]);
/// Anyone else.
const OTHER: User = (65531, 65531, &[]);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Reg,
    Dir,
    Sym,
    Fifo,
    Sock,
    Dev,
}

const KINDS: [(Kind, &str); 6] = [
    (Kind::Reg, "reg"),
    (Kind::Dir, "dir"),
    (Kind::Sym, "sym"),
    (Kind::Fifo, "fifo"),
    (Kind::Sock, "sock"),
    (Kind::Dev, "dev"),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Owner,
    Member,
    Other,
}

const ROLES: [(Role, User); 3] = [
    (Role::Owner, OWNER),
    (Role::Member, MEMBER),
    (Role::Other, OTHER),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Lstat,
    OpenRead,
    OpenWrite,
    OpenReadWrite,
    Truncate,
    Chmod,
    Chown,
    TouchNow,
    TouchAt,
    AccessRead,
    AccessWrite,
    AccessExec,
    Link,
    Rename,
    Unlink,
    Rmdir,
    Readlink,
    LstatInside,
    GetXattr,
    SetXattr,
}

const OPS: [Op; 20] = [
    Op::Lstat,
    Op::OpenRead,
    Op::OpenWrite,
    Op::OpenReadWrite,
    Op::Truncate,
    Op::Chmod,
    Op::Chown,
    Op::TouchNow,
    Op::TouchAt,
    Op::AccessRead,
    Op::AccessWrite,
    Op::AccessExec,
    Op::Link,
    Op::Rename,
    Op::Unlink,
    Op::Rmdir,
    Op::Readlink,
    Op::LstatInside,
    Op::GetXattr,
    Op::SetXattr,
];

/// Operations that make something in the directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Make {
    /// open(O_CREAT|O_EXCL|O_RDWR, 0), then ftruncate and write on that descriptor.
    CreateNoMode,
    Mkdir,
    Mkfifo,
    Symlink,
}

/// Whether the class of `role` has permission `bit` (4 read, 2 write, 1 execute/search) in
/// `mode`: POSIX picks exactly one class, so an owner without a bit has none, whatever the
/// group and others may do.
fn may(role: Role, mode: u32, bit: u32) -> bool {
    let shift = match role {
        Role::Owner => 6,
        Role::Member => 3,
        Role::Other => 0,
    };
    (mode >> shift) & bit == bit
}

fn is_owner(role: Role) -> bool {
    role == Role::Owner
}

/// The POSIX answer (as Linux orders its checks) to `op` on `kind` named in a directory of
/// mode `dmode`, the object of mode `mode` (a symbolic link's target has `mode`), the
/// directory and its objects all owned by OWNER:GROUP, on a mount without device files. `hardlinks`: fs.protected_hardlinks.
fn expect(op: Op, kind: Kind, role: Role, dmode: u32, mode: u32, hardlinks: bool) -> i32 {
    let search = may(role, dmode, 1);
    if !search {
        // The name cannot be looked up in the directory.
        return EACCES;
    }
    // What a path that follows symbolic links reaches.
    let reached = if kind == Kind::Sym { Kind::Reg } else { kind };
    let (r, w, x) = (may(role, mode, 4), may(role, mode, 2), may(role, mode, 1));
    let dir_change = may(role, dmode, 2);
    let sticky_denies = dmode & 0o1000 != 0 && !is_owner(role);
    let open = |read: bool, write: bool| -> i32 {
        match reached {
            Kind::Dir if write => EISDIR,
            // The mount is nodev.
            Kind::Dev => EACCES,
            _ if (read && !r) || (write && !w) => EACCES,
            Kind::Sock => ENXIO,
            // O_NONBLOCK with no reader.
            Kind::Fifo if write && !read => ENXIO,
            _ => 0,
        }
    };
    match op {
        Op::Lstat => 0,
        Op::Readlink => {
            if kind == Kind::Sym {
                0
            } else {
                EINVAL
            }
        }
        Op::OpenRead => open(true, false),
        Op::OpenWrite => open(false, true),
        Op::OpenReadWrite => open(true, true),
        Op::Truncate => match reached {
            Kind::Dir => EISDIR,
            Kind::Reg if w => 0,
            Kind::Reg => EACCES,
            _ => EINVAL,
        },
        Op::Chmod | Op::Chown | Op::TouchAt => {
            if is_owner(role) {
                0
            } else {
                EPERM
            }
        }
        Op::TouchNow => {
            if is_owner(role) || w {
                0
            } else {
                EACCES
            }
        }
        Op::AccessRead => i32::from(!r) * EACCES,
        Op::AccessWrite => i32::from(!w) * EACCES,
        Op::AccessExec => i32::from(!x) * EACCES,
        Op::Link => {
            // The link itself, not what a symbolic link names. Under protected_hardlinks
            // only the owner, or anyone who may read and write a regular file, may link it.
            let safe = kind == Kind::Reg && r && w;
            if hardlinks && !is_owner(role) && !safe {
                EPERM
            } else if !dir_change {
                EACCES
            } else if kind == Kind::Dir {
                EPERM
            } else {
                0
            }
        }
        Op::Rename => {
            if !dir_change {
                EACCES
            } else if sticky_denies {
                EPERM
            } else {
                0
            }
        }
        Op::Unlink | Op::Rmdir => {
            if !dir_change {
                EACCES
            } else if sticky_denies {
                EPERM
            } else {
                match (op, kind) {
                    (Op::Unlink, Kind::Dir) => EISDIR,
                    (Op::Unlink, _) => 0,
                    // The directory holds `inner`.
                    (Op::Rmdir, Kind::Dir) => ENOTEMPTY,
                    (Op::Rmdir, _) => ENOTDIR,
                    _ => unreachable!(),
                }
            }
        }
        Op::LstatInside => match reached {
            Kind::Dir if !x => EACCES,
            Kind::Dir => 0,
            _ => ENOTDIR,
        },
        Op::GetXattr => match reached {
            Kind::Reg | Kind::Dir if !r => EACCES,
            // No such attribute: the read was allowed.
            _ => ENODATA,
        },
        Op::SetXattr => match reached {
            Kind::Reg | Kind::Dir if w => 0,
            Kind::Reg | Kind::Dir => EACCES,
            _ => EPERM,
        },
    }
}

fn expect_make(role: Role, dmode: u32) -> i32 {
    if may(role, dmode, 1) && may(role, dmode, 2) {
        0
    } else {
        EACCES
    }
}

fn c(path: &Path) -> CString {
    cstr(path)
}

fn errno_name(errno: i32) -> &'static str {
    if errno == 0 {
        "success"
    } else {
        Errno(errno).name()
    }
}

fn result(r: io::Result<()>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) => errno_of(&e),
    }
}

fn sys(ret: libc::c_int) -> io::Result<()> {
    check(ret).map(drop)
}

/// Runs `op` on `dir/name`; what it changed is undone by root afterwards (`undo`).
fn run(op: Op, dir: &Path, name: &str, mode: u32) -> i32 {
    let p = dir.join(name);
    let pc = c(&p);
    result(match op {
        Op::Lstat => fs::symlink_metadata(&p).map(drop),
        Op::OpenRead => open_raw(&p, libc::O_RDONLY | libc::O_NONBLOCK, 0).map(drop),
        Op::OpenWrite => open_raw(&p, libc::O_WRONLY | libc::O_NONBLOCK, 0).map(drop),
        Op::OpenReadWrite => open_raw(&p, libc::O_RDWR | libc::O_NONBLOCK, 0).map(drop),
        Op::Truncate => sys(unsafe { libc::truncate(pc.as_ptr(), 0) }),
        Op::Chmod => sys(unsafe { libc::chmod(pc.as_ptr(), mode) }),
        Op::Chown => sys(unsafe { libc::chown(pc.as_ptr(), OWNER.0, u32::MAX) }),
        Op::TouchNow => {
            sys(unsafe { libc::utimensat(libc::AT_FDCWD, pc.as_ptr(), std::ptr::null(), 0) })
        }
        Op::TouchAt => utimens(&p, (1_000_000, 0), (1_000_000, 0)),
        Op::AccessRead => access(&p, libc::R_OK),
        Op::AccessWrite => access(&p, libc::W_OK),
        Op::AccessExec => access(&p, libc::X_OK),
        Op::Link => fs::hard_link(&p, dir.join(format!("{name}.link"))),
        Op::Rename => fs::rename(&p, dir.join(format!("{name}.moved"))),
        Op::Unlink => sys(unsafe { libc::unlink(pc.as_ptr()) }),
        Op::Rmdir => sys(unsafe { libc::rmdir(pc.as_ptr()) }),
        Op::Readlink => fs::read_link(&p).map(drop),
        Op::LstatInside => fs::symlink_metadata(p.join("inner")).map(drop),
        Op::GetXattr => getxattr(&p, "user.matrix", 64).map(drop),
        Op::SetXattr => setxattr(&p, "user.matrix", b"v", 0),
    })
}

fn make(op: Make, dir: &Path) -> i32 {
    result(match op {
        Make::CreateNoMode => (|| {
            use std::io::Write as _;
            use std::os::fd::AsRawFd;
            let mut f = open_raw(
                &dir.join("new"),
                libc::O_CREAT | libc::O_EXCL | libc::O_RDWR,
                0,
            )?;
            sys(unsafe { libc::ftruncate(f.as_raw_fd(), 4096) })?;
            f.write_all(b"written on the creating descriptor")?;
            f.sync_all()
        })(),
        Make::Mkdir => fs::create_dir(dir.join("new")),
        Make::Mkfifo => mkfifo(&dir.join("new"), 0o644),
        Make::Symlink => symlink("reg", dir.join("new")),
    })
}

/// Makes the objects in `dir` as root, owned by OWNER:GROUP.
fn populate(dir: &Path) {
    fs::write(dir.join("reg"), b"data").unwrap();
    fs::create_dir(dir.join("dir")).unwrap();
    fs::write(dir.join("dir/inner"), b"i").unwrap();
    symlink("reg", dir.join("sym")).unwrap();
    mkfifo(&dir.join("fifo"), 0o644).unwrap();
    let node = |name: &str, mode: u32, dev: libc::dev_t| {
        let p = c(&dir.join(name));
        sys(unsafe { libc::mknod(p.as_ptr(), mode, dev) }).unwrap();
    };
    node("sock", libc::S_IFSOCK | 0o644, 0);
    node("dev", libc::S_IFCHR | 0o644, libc::makedev(1, 3));
    for (_, name) in KINDS {
        let p = c(&dir.join(name));
        sys(unsafe { libc::lchown(p.as_ptr(), OWNER.0, GROUP) }).unwrap();
    }
}

/// Undoes what `op` did to `name` (as root), so every step starts from the same objects.
fn undo(op: Op, dir: &Path, name: &str, kind: Kind) {
    match op {
        Op::Link => {
            let _ = fs::remove_file(dir.join(format!("{name}.link")));
        }
        Op::Rename => {
            let moved = dir.join(format!("{name}.moved"));
            if fs::symlink_metadata(&moved).is_ok() {
                fs::rename(moved, dir.join(name)).unwrap();
            }
        }
        Op::Unlink if fs::symlink_metadata(dir.join(name)).is_err() => {
            recreate(dir, name, kind);
        }
        Op::SetXattr => {
            let _ = removexattr(&dir.join(name), "user.matrix");
        }
        Op::Chown => {
            let p = c(&dir.join(name));
            sys(unsafe { libc::chown(p.as_ptr(), OWNER.0, GROUP) }).unwrap();
        }
        _ => {}
    }
}

fn recreate(dir: &Path, name: &str, kind: Kind) {
    let p = dir.join(name);
    match kind {
        Kind::Reg => fs::write(&p, b"data").unwrap(),
        Kind::Sym => symlink("reg", &p).unwrap(),
        Kind::Fifo => mkfifo(&p, 0o644).unwrap(),
        Kind::Sock | Kind::Dev => {
            let (mode, dev) = if kind == Kind::Sock {
                (libc::S_IFSOCK | 0o644, 0)
            } else {
                (libc::S_IFCHR | 0o644, libc::makedev(1, 3))
            };
            let pc = c(&p);
            sys(unsafe { libc::mknod(pc.as_ptr(), mode, dev) }).unwrap();
        }
        Kind::Dir => unreachable!("directories are never unlinked"),
    }
    let pc = c(&p);
    sys(unsafe { libc::lchown(pc.as_ptr(), OWNER.0, GROUP) }).unwrap();
}

fn set_modes(dir: &Path, mode: u32) {
    for (kind, name) in KINDS {
        if kind != Kind::Sym {
            fs::set_permissions(dir.join(name), fs::Permissions::from_mode(mode)).unwrap();
        }
    }
}

fn clear_new(dir: &Path) {
    let new = dir.join("new");
    if let Ok(m) = fs::symlink_metadata(&new) {
        if m.is_dir() {
            fs::remove_dir(&new).unwrap();
        } else {
            fs::remove_file(&new).unwrap();
        }
    }
}

#[test]
fn every_operation_on_every_file_type_as_every_class_of_user() {
    require_fuse!();
    let m = mounted();
    let dir = m.p("d");
    fs::create_dir(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(OWNER.0), Some(GROUP)).unwrap();
    populate(&dir);
    let hardlinks = fs::read_to_string("/proc/sys/fs/protected_hardlinks")
        .map(|s| s.trim() == "1")
        .unwrap_or(false);
    // Directory modes in an order that takes permissions away from names the kernel has
    // just cached, and gives them back.
    let dir_modes = [
        0o777, 0o755, 0o700, 0o711, 0o750, 0o070, 0o000, 0o1777, 0o777,
    ];
    let modes = [
        0o644, 0o000, 0o444, 0o222, 0o070, 0o007, 0o755, 0o600, 0o666,
    ];
    let mut checked = 0usize;
    let mut wrong = Vec::new();
    for dmode in dir_modes {
        fs::set_permissions(&dir, fs::Permissions::from_mode(dmode)).unwrap();
        for mode in modes {
            set_modes(&dir, mode);
            for (role, (uid, gid, groups)) in ROLES {
                for (kind, name) in KINDS {
                    for op in OPS {
                        let want = expect(op, kind, role, dmode, mode, hardlinks);
                        let got = as_user(uid, gid, groups, || run(op, &dir, name, mode));
                        undo(op, &dir, name, kind);
                        if matches!(op, Op::Chmod | Op::Chown | Op::Unlink) {
                            set_modes(&dir, mode);
                        }
                        checked += 1;
                        if got != want {
                            wrong.push(format!(
                                "dir {dmode:04o} {name} {mode:04o} {role:?} {op:?}: got {}, POSIX says {}",
                                errno_name(got),
                                errno_name(want)
                            ));
                        }
                    }
                }
                for op in [Make::CreateNoMode, Make::Mkdir, Make::Mkfifo, Make::Symlink] {
                    let want = expect_make(role, dmode);
                    let got = as_user(uid, gid, groups, || make(op, &dir));
                    clear_new(&dir);
                    checked += 1;
                    if got != want {
                        wrong.push(format!(
                            "dir {dmode:04o} {role:?} {op:?}: got {}, POSIX says {}",
                            errno_name(got),
                            errno_name(want)
                        ));
                    }
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {checked} steps differ from POSIX:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    // Sanity of the matrix itself: it covered every kind and each refusal it models.
    assert!(checked > 10_000, "{checked}");
}

/// The three cases that were wrong, named on their own.
#[test]
fn a_permission_change_applies_to_the_very_next_access() {
    require_fuse!();
    let m = mounted();
    let dir = m.p("d");
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
    fs::write(dir.join("f"), b"x").unwrap();
    fs::set_permissions(dir.join("f"), fs::Permissions::from_mode(0o666)).unwrap();
    mkfifo(&dir.join("fifo"), 0o666).unwrap();
    let (uid, gid, groups) = OTHER;
    // Cached by a first use.
    as_user(uid, gid, groups, || {
        assert_eq!(fs::read(dir.join("f")).unwrap(), b"x");
        open_raw(&dir.join("fifo"), libc::O_RDONLY | libc::O_NONBLOCK, 0).unwrap();
    });
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o766)).unwrap();
    as_user(uid, gid, groups, || {
        let f = dir.join("f");
        assert_errno(fs::File::open(&f), EACCES);
        assert_errno(fs::OpenOptions::new().write(true).open(&f), EACCES);
        assert_errno(
            fs::set_permissions(&f, fs::Permissions::from_mode(0o777)),
            EACCES,
        );
        assert_errno(std::os::unix::fs::chown(&f, Some(uid), None), EACCES);
        assert_errno(fs::hard_link(&f, m.p("stolen")), EACCES);
    });
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
    fs::set_permissions(dir.join("fifo"), fs::Permissions::from_mode(0o600)).unwrap();
    as_user(uid, gid, groups, || {
        assert_errno(
            open_raw(&dir.join("fifo"), libc::O_RDONLY | libc::O_NONBLOCK, 0),
            EACCES,
        );
        // The creator may ftruncate through the descriptor it created with mode 0.
        assert_eq!(make(Make::CreateNoMode, &dir), 0);
        assert_eq!(fs::metadata(dir.join("new")).unwrap().len(), 4096);
    });
}
