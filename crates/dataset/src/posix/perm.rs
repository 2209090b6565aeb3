//! Permission checks, as the Linux VFS makes them (`generic_permission`, `may_delete`,
//! `setattr_prepare`, `chown_ok`, `setattr_should_drop_suidgid`, ...), on an inode record and
//! a caller's credentials.
//!
//! # Theory of operation
//! Pure functions: they read an [`Inode`] and a [`Cred`] and answer. The owner class is used
//! when the caller owns the file, else the group class when the caller is in the file's group
//! (primary or supplementary), else the other class; there is no fallthrough between classes
//! (an owner denied by the owner bits is denied even if "other" would allow). Root (uid 0)
//! passes every read and write check, and an execute check when the inode is a directory or
//! has at least one execute bit (CAP_DAC_OVERRIDE).

use super::format::Inode;
use super::types::{Cred, FileKind};
use crate::errno::Errno;

pub(crate) const MAY_EXEC: u32 = 1;
pub(crate) const MAY_WRITE: u32 = 2;
pub(crate) const MAY_READ: u32 = 4;

const S_ISUID: u16 = 0o4000;
const S_ISGID: u16 = 0o2000;
const S_ISVTX: u16 = 0o1000;
const S_IXGRP: u16 = 0o0010;

pub(crate) fn is_root(cred: &Cred) -> bool {
    cred.uid == 0
}

/// Whether `cred` may access `inode` for every right in `mask` (MAY_*).
pub(crate) fn permits(cred: &Cred, inode: &Inode, mask: u32) -> bool {
    debug_assert!(mask & !(MAY_READ | MAY_WRITE | MAY_EXEC) == 0);
    if is_root(cred) {
        return mask & MAY_EXEC == 0 || inode.kind == FileKind::Dir || inode.perm & 0o111 != 0;
    }
    let bits = if cred.uid == inode.uid {
        u32::from(inode.perm >> 6) & 7
    } else if cred.in_group(inode.gid) {
        u32::from(inode.perm >> 3) & 7
    } else {
        u32::from(inode.perm) & 7
    };
    mask & !bits == 0
}

/// EACCES unless `permits`.
pub(crate) fn check(cred: &Cred, inode: &Inode, mask: u32) -> Result<(), Errno> {
    if permits(cred, inode, mask) {
        Ok(())
    } else {
        Err(Errno::EACCES)
    }
}

/// The owner or root (`inode_owner_or_capable`).
pub(crate) fn owner_or_root(cred: &Cred, inode: &Inode) -> bool {
    is_root(cred) || cred.uid == inode.uid
}

/// Removing `victim` from `dir` (`may_delete` without the type checks): write and search on
/// the directory (EACCES), and in a sticky directory only the owner of the victim or of the
/// directory, or root (EPERM).
pub(crate) fn may_delete(cred: &Cred, dir: &Inode, victim: &Inode) -> Result<(), Errno> {
    check(cred, dir, MAY_WRITE | MAY_EXEC)?;
    if dir.perm & S_ISVTX != 0 && !is_root(cred) && cred.uid != victim.uid && cred.uid != dir.uid {
        return Err(Errno::EPERM);
    }
    Ok(())
}

/// `chown_ok`: root, or the owner "changing" the owner to himself.
pub(crate) fn may_chown(cred: &Cred, inode: &Inode, uid: u32) -> bool {
    is_root(cred) || (cred.uid == inode.uid && uid == inode.uid)
}

/// `chgrp_ok`: root, or the owner changing the group to the current one or to a group he is
/// in.
pub(crate) fn may_chgrp(cred: &Cred, inode: &Inode, gid: u32) -> bool {
    is_root(cred) || (cred.uid == inode.uid && (gid == inode.gid || cred.in_group(gid)))
}

/// The permission bits after a write, truncate or fallocate by `cred`
/// (`file_remove_privs`): a non-root writer of a regular file clears set-uid, and set-gid
/// when the file is group-executable (without group execute, set-gid marks mandatory
/// locking and stays).
pub(crate) fn perm_after_write(cred: &Cred, inode: &Inode) -> u16 {
    if is_root(cred) || inode.kind != FileKind::File {
        return inode.perm;
    }
    drop_suid_sgid(inode.perm)
}

/// The permission bits after a change of owner or group of a non-directory (`chown_common`
/// sets ATTR_KILL_SUID for every caller, root included, since Linux 2.2.13): set-uid
/// cleared, set-gid cleared when group-executable.
pub(crate) fn perm_after_chown(inode: &Inode) -> u16 {
    if inode.kind == FileKind::Dir {
        return inode.perm;
    }
    drop_suid_sgid(inode.perm)
}

fn drop_suid_sgid(perm: u16) -> u16 {
    let mut p = perm & !S_ISUID;
    if p & S_IXGRP != 0 {
        p &= !S_ISGID;
    }
    p
}

/// The permission bits `chmod` sets (`setattr_prepare`): set-gid is dropped when a non-root
/// caller is not in the file's group (`gid`, the new one if it changes too).
pub(crate) fn perm_for_chmod(cred: &Cred, gid: u32, mode: u32) -> u16 {
    let mut p = (mode & 0o7777) as u16;
    if !is_root(cred) && !cred.in_group(gid) {
        p &= !S_ISGID;
    }
    p
}

/// Owner, group and permission bits of a new inode in `dir` (`inode_init_owner`): the group
/// is the directory's when it is set-gid (and a new directory inherits the set-gid bit),
/// else the caller's; a non-directory created group-executable and set-gid in a group the
/// non-root caller is not in loses set-gid (`mode_strip_sgid`).
pub(crate) fn new_owner(cred: &Cred, dir: &Inode, kind: FileKind, mode: u32) -> (u32, u32, u16) {
    let mut perm = (mode & 0o7777) as u16;
    let gid = if dir.perm & S_ISGID != 0 {
        if kind == FileKind::Dir {
            perm |= S_ISGID;
        }
        dir.gid
    } else {
        cred.gid
    };
    if kind != FileKind::Dir
        && perm & (S_ISGID | S_IXGRP) == (S_ISGID | S_IXGRP)
        && !is_root(cred)
        && !cred.in_group(gid)
    {
        perm &= !S_ISGID;
    }
    (cred.uid, gid, perm)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::posix::types::Timespec;

    fn inode(kind: FileKind, perm: u16, uid: u32, gid: u32) -> Inode {
        Inode {
            kind,
            perm,
            nlink: 1,
            uid,
            gid,
            rdev: 0,
            blksize: 512,
            size: if kind == FileKind::Dir { 2 } else { 0 },
            parent: 1,
            generation: 1,
            atime: Timespec::default(),
            mtime: Timespec::default(),
            ctime: Timespec::default(),
            crtime: Timespec::default(),
        }
    }

    #[test]
    fn classes_do_not_fall_through() {
        let f = inode(FileKind::File, 0o077, 10, 20);
        assert!(!permits(&Cred::user(10, 20), &f, MAY_READ));
        assert!(permits(&Cred::user(11, 20), &f, MAY_READ | MAY_WRITE));
        let mut c = Cred::user(11, 5);
        assert!(permits(&c, &f, MAY_READ));
        c.groups.push(20);
        assert!(permits(&c, &f, MAY_EXEC));
        let g = inode(FileKind::File, 0o707, 10, 20);
        assert!(!permits(&c, &g, MAY_READ));
    }

    #[test]
    fn root_needs_an_execute_bit_on_files_only() {
        let f = inode(FileKind::File, 0o600, 10, 20);
        assert!(permits(&Cred::root(), &f, MAY_READ | MAY_WRITE));
        assert!(!permits(&Cred::root(), &f, MAY_EXEC));
        let d = inode(FileKind::Dir, 0o000, 10, 20);
        assert!(permits(&Cred::root(), &d, MAY_EXEC | MAY_WRITE));
        let x = inode(FileKind::File, 0o001, 10, 20);
        assert!(permits(&Cred::root(), &x, MAY_EXEC));
    }

    #[test]
    fn sticky_directories() {
        let d = inode(FileKind::Dir, 0o1777, 1, 1);
        let f = inode(FileKind::File, 0o644, 10, 10);
        assert_eq!(may_delete(&Cred::user(11, 11), &d, &f), Err(Errno::EPERM));
        assert_eq!(may_delete(&Cred::user(10, 11), &d, &f), Ok(()));
        assert_eq!(may_delete(&Cred::user(1, 11), &d, &f), Ok(()));
        assert_eq!(may_delete(&Cred::root(), &d, &f), Ok(()));
        let closed = inode(FileKind::Dir, 0o1755, 1, 1);
        assert_eq!(
            may_delete(&Cred::user(10, 11), &closed, &f),
            Err(Errno::EACCES)
        );
    }

    #[test]
    fn privileges_dropped() {
        let f = inode(FileKind::File, 0o6755, 10, 20);
        assert_eq!(perm_after_write(&Cred::user(10, 20), &f), 0o0755);
        assert_eq!(perm_after_write(&Cred::root(), &f), 0o6755);
        let lock = inode(FileKind::File, 0o2644, 10, 20);
        assert_eq!(perm_after_write(&Cred::user(10, 20), &lock), 0o2644);
        assert_eq!(perm_after_chown(&f), 0o0755);
        assert_eq!(perm_for_chmod(&Cred::user(10, 5), 20, 0o2755), 0o0755);
        assert_eq!(perm_for_chmod(&Cred::user(10, 20), 20, 0o2755), 0o2755);
        let sgid_dir = inode(FileKind::Dir, 0o2775, 1, 50);
        assert_eq!(
            new_owner(&Cred::user(10, 20), &sgid_dir, FileKind::Dir, 0o755),
            (10, 50, 0o2755)
        );
        assert_eq!(
            new_owner(&Cred::user(10, 20), &sgid_dir, FileKind::File, 0o2755),
            (10, 50, 0o0755)
        );
    }
}
