//! Namespace operations: lookup, create (mknod, mkdir, symlink), link, unlink, rmdir,
//! rename and readdir.
//!
//! # Theory of operation
//! A directory's entries are items `(dir, KIND_DIRENT, slot)` where the slot comes from a
//! hash of the name (`format.rs`); a lookup reads one short range of the tree, so it costs
//! O(log n) however large the directory is, and the slot is the entry's readdir cookie. A
//! directory's size counts its entries (plus 2, as ZFS), its link count its subdirectories
//! (plus 2), and its record names its parent (for ".." and for the rename loop check).
//!
//! Errors follow the Linux VFS order: search permission on the directory first (the path
//! walk), then "." and "..", then EROFS, then existence, then `may_create` / `may_delete`
//! (write and search on the directory, the sticky bit), then the type checks, then
//! emptiness and link limits. Every change is one transaction under the namespace lock
//! held for writing (see `fs.rs`).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use super::format::*;
use super::fs::{check_name, is_dot, Fate, Fs, Locked, FREE_NOW_BLOCKS, META_CHARGE};
use super::perm::{self, MAY_EXEC, MAY_READ, MAY_WRITE};
use super::types::*;
use crate::errno::Errno;

/// Longest chain of parents followed when checking a rename for loops (deeper trees than
/// this are refused with ELOOP rather than walked forever on a corrupt parent chain).
const DEPTH_MAX: usize = 1 << 20;

/// An entry found in a directory.
#[derive(Debug, Clone)]
pub(super) struct Found {
    pub slot: u64,
    pub ino: Ino,
    pub kind: FileKind,
}

/// A name's place in a directory: its entry if it exists, else the slot it would take.
struct Probe {
    found: Option<Found>,
    free: Option<u64>,
}

impl Fs {
    /// Reads `name`'s hash chain in `dir`.
    fn probe(&self, dir: Ino, name: &[u8]) -> Result<Probe> {
        let base = dirent_base(name);
        let items =
            self.objset
                .items(dir, KIND_DIRENT, base, base + DIR_CHAIN, DIR_CHAIN as usize)?;
        let mut free = None;
        let mut expect = base;
        for (slot, value) in &items {
            if free.is_none() && *slot > expect {
                free = Some(expect);
            }
            expect = slot + 1;
            let d = decode_dirent(value)?;
            if d.name == name {
                return Ok(Probe {
                    found: Some(Found {
                        slot: *slot,
                        ino: d.ino,
                        kind: d.kind,
                    }),
                    free: None,
                });
            }
        }
        if free.is_none() && expect < base + DIR_CHAIN {
            free = Some(expect);
        }
        Ok(Probe { found: None, free })
    }

    /// The path walk's check on a directory looked up in: a directory (ENOTDIR) that the
    /// caller may search (EACCES).
    fn check_search(&self, cred: &Cred, dir: Ino) -> Result<()> {
        let node = self.node(dir);
        let slot = self.lock(&node)?;
        let inode = slot.inode();
        if inode.kind != FileKind::Dir {
            return Err(Errno::ENOTDIR);
        }
        perm::check(cred, inode, MAY_EXEC)
    }

    /// Whether directory `ancestor` is `dir` or one of its ancestors.
    fn is_ancestor(&self, ancestor: Ino, dir: Ino) -> Result<bool> {
        let mut cur = dir;
        for _ in 0..DEPTH_MAX {
            if cur == ancestor {
                return Ok(true);
            }
            if cur == ROOT_INO {
                return Ok(false);
            }
            let node = self.node(cur);
            let slot = self.lock(&node)?;
            cur = slot.inode().parent;
        }
        Err(Errno::ELOOP)
    }

    /// Whether a directory has no entries (read from the tree, not from its size).
    fn dir_is_empty(&self, dir: Ino) -> Result<bool> {
        Ok(self
            .objset
            .items(dir, KIND_DIRENT, 0, u64::MAX, 1)?
            .is_empty())
    }

    pub(super) fn lookup_impl(&self, cred: &Cred, parent: Ino, name: &OsStr) -> Result<Attr> {
        let _ns = self.ns.read();
        self.check_search(cred, parent)?;
        let name = check_name(name)?;
        let ino = match name {
            b"." => parent,
            b".." => {
                let node = self.node(parent);
                let slot = self.lock(&node)?;
                slot.inode().parent
            }
            _ => self.probe(parent, name)?.found.ok_or(Errno::ENOENT)?.ino,
        };
        let node = self.node(ino);
        let slot = self.lock(&node)?;
        self.attr_of(ino, slot.inode())
    }

    pub(super) fn mknod_impl(
        &self,
        cred: &Cred,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        rdev: u32,
    ) -> Result<Attr> {
        let kind = match mode & libc::S_IFMT {
            0 => FileKind::File,
            libc::S_IFDIR => return Err(Errno::EPERM),
            libc::S_IFLNK => return Err(Errno::EINVAL),
            m => FileKind::from_mode(m).ok_or(Errno::EINVAL)?,
        };
        let rdev = match kind {
            FileKind::BlockDev | FileKind::CharDev => rdev,
            _ => 0,
        };
        let name = check_name(name)?;
        self.create_node(cred, parent, name, kind, mode, rdev, None, 0)
    }

    pub(super) fn create_impl(
        &self,
        cred: &Cred,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        flags: i32,
    ) -> Result<Attr> {
        if !matches!(mode & libc::S_IFMT, 0 | libc::S_IFREG) {
            return Err(Errno::EINVAL);
        }
        let bytes = check_name(name)?;
        // A name removed between the two steps is created again; the bound is a guard.
        for _ in 0..8 {
            match self.create_node(cred, parent, bytes, FileKind::File, mode, 0, None, 1) {
                Err(e) if e == Errno::EEXIST && flags & libc::O_EXCL == 0 && !is_dot(bytes) => {
                    let a = match self.lookup_impl(cred, parent, name) {
                        Err(e) if e == Errno::ENOENT => continue,
                        r => r?,
                    };
                    if a.kind == FileKind::Dir {
                        return Err(Errno::EISDIR);
                    }
                    return self.open_impl(cred, a.ino, flags, false);
                }
                r => return r,
            }
        }
        Err(Errno::EBUSY)
    }

    pub(super) fn mkdir_impl(
        &self,
        cred: &Cred,
        parent: Ino,
        name: &OsStr,
        mode: u32,
    ) -> Result<Attr> {
        let name = check_name(name)?;
        self.create_node(cred, parent, name, FileKind::Dir, mode, 0, None, 0)
    }

    pub(super) fn symlink_impl(
        &self,
        cred: &Cred,
        parent: Ino,
        name: &OsStr,
        target: &OsStr,
    ) -> Result<Attr> {
        let name = check_name(name)?;
        let target = target.as_bytes();
        if target.is_empty() {
            return Err(Errno::ENOENT);
        }
        if target.len() > SYMLINK_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        if target.contains(&0) {
            return Err(Errno::EINVAL);
        }
        self.create_node(
            cred,
            parent,
            name,
            FileKind::Symlink,
            0o777,
            0,
            Some(target),
            0,
        )
    }

    /// Creates an inode of `kind` named `name` in `parent`, opened `open` times.
    #[allow(clippy::too_many_arguments)]
    fn create_node(
        &self,
        cred: &Cred,
        parent: Ino,
        name: &[u8],
        kind: FileKind,
        mode: u32,
        rdev: u32,
        target: Option<&[u8]>,
        open: u32,
    ) -> Result<Attr> {
        let _ns = self.ns.write();
        self.check_search(cred, parent)?;
        if is_dot(name) {
            return Err(Errno::EEXIST);
        }
        let probe = self.probe(parent, name)?;
        if probe.found.is_some() {
            return Err(Errno::EEXIST);
        }
        self.writable()?;
        let pnode = self.node(parent);
        let nodes = [pnode];
        let mut locked = self.lock_all(&nodes)?;
        let p = locked.get(parent);
        if p.nlink == 0 {
            return Err(Errno::ENOENT);
        }
        perm::check(cred, p, MAY_WRITE | MAY_EXEC)?;
        if kind == FileKind::Dir && p.nlink >= LINK_MAX {
            return Err(Errno::EMLINK);
        }
        if matches!(kind, FileKind::BlockDev | FileKind::CharDev) && !perm::is_root(cred) {
            return Err(Errno::EPERM);
        }
        let slot = probe.free.ok_or(Errno::ENOSPC)?;
        let target_len = target.map_or(0, |t| t.len() as u64);
        self.hooks.check_space(META_CHARGE + target_len)?;
        let (uid, gid, perm_bits) = perm::new_owner(cred, p, kind, mode);
        let blksize = if kind == FileKind::File {
            self.hooks.recordsize()
        } else {
            512
        };
        let now = Timespec::now();
        let (ino, inode) = self.in_tx(META_CHARGE + target_len, &mut locked, |tx, l| {
            let ino = self
                .objset
                .create_object(tx, OBJ_TYPE_BASE + kind_code(kind), blksize)?;
            assert!(ino > parent, "object ids only grow");
            let inode = Inode {
                kind,
                perm: perm_bits,
                nlink: if kind == FileKind::Dir { 2 } else { 1 },
                uid,
                gid,
                rdev,
                blksize,
                size: match kind {
                    FileKind::Dir => 2,
                    _ => target_len,
                },
                parent: if kind == FileKind::Dir { parent } else { 0 },
                generation: tx.txg,
                atime: now,
                mtime: now,
                ctime: now,
                crtime: now,
            };
            self.put_inode(tx, ino, &inode)?;
            if let Some(t) = target {
                for (i, chunk) in t.chunks(SYMLINK_CHUNK).enumerate() {
                    self.objset
                        .put_item(tx, ino, KIND_SYMLINK, i as u64, chunk)?;
                }
            }
            self.objset.put_item(
                tx,
                parent,
                KIND_DIRENT,
                slot,
                &encode_dirent(ino, kind, name),
            )?;
            let p = l.get_mut(parent);
            p.size += 1;
            if kind == FileKind::Dir {
                p.nlink += 1;
            }
            p.mtime = now;
            p.ctime = now;
            self.put_inode(tx, parent, l.get(parent))?;
            Ok((ino, inode))
        })?;
        let a = self.attr_of(ino, &inode)?;
        self.cache.insert_new(ino, inode, open);
        Ok(a)
    }

    pub(super) fn readlink_impl(&self, ino: Ino) -> Result<Vec<u8>> {
        let node = self.node(ino);
        let slot = self.lock(&node)?;
        let inode = slot.inode();
        if inode.kind != FileKind::Symlink {
            return Err(Errno::EINVAL);
        }
        let mut out = Vec::with_capacity(inode.size as usize);
        for (_, chunk) in self.objset.items(ino, KIND_SYMLINK, 0, 2, 2)? {
            out.extend_from_slice(&chunk);
        }
        if out.len() as u64 != inode.size {
            return Err(Errno::EIO);
        }
        Ok(out)
    }

    pub(super) fn link_impl(
        &self,
        cred: &Cred,
        ino: Ino,
        newparent: Ino,
        newname: &OsStr,
    ) -> Result<Attr> {
        let name = check_name(newname)?;
        let _ns = self.ns.write();
        self.check_search(cred, newparent)?;
        if is_dot(name) {
            return Err(Errno::EEXIST);
        }
        let probe = self.probe(newparent, name)?;
        if probe.found.is_some() {
            return Err(Errno::EEXIST);
        }
        self.writable()?;
        let nodes = [self.node(newparent), self.node(ino)];
        let mut locked = self.lock_all(&nodes)?;
        let dir = locked.get(newparent);
        perm::check(cred, dir, MAY_WRITE | MAY_EXEC)?;
        if dir.nlink == 0 {
            return Err(Errno::ENOENT);
        }
        let inode = locked.get(ino);
        if inode.kind == FileKind::Dir {
            return Err(Errno::EPERM);
        }
        if inode.nlink == 0 {
            return Err(Errno::ENOENT);
        }
        if inode.nlink >= LINK_MAX {
            return Err(Errno::EMLINK);
        }
        let slot = probe.free.ok_or(Errno::ENOSPC)?;
        self.hooks.check_space(META_CHARGE)?;
        let kind = inode.kind;
        let now = Timespec::now();
        self.in_tx(META_CHARGE, &mut locked, |tx, l| {
            self.objset.put_item(
                tx,
                newparent,
                KIND_DIRENT,
                slot,
                &encode_dirent(ino, kind, name),
            )?;
            let d = l.get_mut(newparent);
            d.size += 1;
            d.mtime = now;
            d.ctime = now;
            let i = l.get_mut(ino);
            i.nlink += 1;
            i.ctime = now;
            self.put_inodes(tx, l, &[newparent, ino])
        })?;
        self.attr_of(ino, locked.get(ino))
    }

    /// unlink (`dir` false) and rmdir (`dir` true).
    pub(super) fn remove_impl(
        &self,
        cred: &Cred,
        parent: Ino,
        name: &OsStr,
        dir: bool,
    ) -> Result<()> {
        let name = check_name(name)?;
        let reclaim = {
            let _ns = self.ns.write();
            self.check_search(cred, parent)?;
            match name {
                b"." if dir => return Err(Errno::EINVAL),
                b".." if dir => return Err(Errno::ENOTEMPTY),
                b"." | b".." => return Err(Errno::EISDIR),
                _ => {}
            }
            self.writable()?;
            let found = self.probe(parent, name)?.found.ok_or(Errno::ENOENT)?;
            let child = found.ino;
            let cnode = self.node(child);
            let nodes = [self.node(parent), cnode.clone()];
            let mut locked = self.lock_all(&nodes)?;
            perm::may_delete(cred, locked.get(parent), locked.get(child))?;
            let is_dir = locked.get(child).kind == FileKind::Dir;
            if dir && !is_dir {
                return Err(Errno::ENOTDIR);
            }
            if !dir && is_dir {
                return Err(Errno::EISDIR);
            }
            if child == ROOT_INO {
                return Err(Errno::EBUSY);
            }
            if dir && !self.dir_is_empty(child)? {
                return Err(Errno::ENOTEMPTY);
            }
            // Free the inode in this transaction only if no reader is in its data.
            let idle = cnode.data.try_write();
            let now = Timespec::now();
            let fate = self.in_tx(0, &mut locked, |tx, l| {
                self.objset
                    .remove_item(tx, parent, KIND_DIRENT, found.slot)?;
                let p = l.get_mut(parent);
                p.size = p.size.saturating_sub(1).max(2);
                p.mtime = now;
                p.ctime = now;
                if dir {
                    p.nlink = p.nlink.saturating_sub(1);
                }
                let c = l.get_mut(child);
                c.nlink = if dir { 0 } else { c.nlink.saturating_sub(1) };
                c.ctime = now;
                let fate = if c.nlink == 0 {
                    Some(self.dispose(tx, child, l.slot(child), idle.is_some())?)
                } else {
                    None
                };
                if fate == Some(Fate::Freed) {
                    self.put_inode(tx, parent, l.get(parent))?;
                } else {
                    self.put_inodes(tx, l, &[parent, child])?;
                }
                Ok(fate)
            })?;
            drop(idle);
            if fate == Some(Fate::Freed) {
                self.forget_freed(&mut locked, &[child]);
            }
            (fate == Some(Fate::Reclaim)).then_some(child)
        };
        if let Some(ino) = reclaim {
            self.reclaim(ino)?;
        }
        Ok(())
    }

    pub(super) fn rename_impl(
        &self,
        cred: &Cred,
        parent: Ino,
        name: &OsStr,
        newparent: Ino,
        newname: &OsStr,
        flags: RenameFlags,
    ) -> Result<()> {
        if flags.exchange && flags.noreplace {
            return Err(Errno::EINVAL);
        }
        let name = check_name(name)?;
        let newname = check_name(newname)?;
        let reclaim = {
            let _ns = self.ns.write();
            self.check_search(cred, parent)?;
            self.check_search(cred, newparent)?;
            if is_dot(name) {
                return Err(Errno::EBUSY);
            }
            if is_dot(newname) {
                return Err(if flags.noreplace {
                    Errno::EEXIST
                } else {
                    Errno::EBUSY
                });
            }
            self.writable()?;
            let src = self.probe(parent, name)?.found.ok_or(Errno::ENOENT)?;
            let probe = self.probe(newparent, newname)?;
            let tgt = probe.found;
            if flags.exchange && tgt.is_none() {
                return Err(Errno::ENOENT);
            }
            if flags.noreplace && tgt.is_some() {
                return Err(Errno::EEXIST);
            }
            if parent != newparent {
                if src.kind == FileKind::Dir && self.is_ancestor(src.ino, newparent)? {
                    return Err(Errno::EINVAL);
                }
                if let Some(t) = &tgt {
                    if t.kind == FileKind::Dir && self.is_ancestor(t.ino, parent)? {
                        return Err(if flags.exchange {
                            Errno::EINVAL
                        } else {
                            Errno::ENOTEMPTY
                        });
                    }
                }
            }
            if tgt.as_ref().is_some_and(|t| t.ino == src.ino) {
                // Two names of one inode: rename(2) does nothing and succeeds.
                return Ok(());
            }
            let mut nodes = vec![self.node(parent), self.node(newparent), self.node(src.ino)];
            if let Some(t) = &tgt {
                nodes.push(self.node(t.ino));
            }
            let mut locked = self.lock_all(&nodes)?;
            self.rename_checks(cred, &locked, parent, &src, newparent, tgt.as_ref(), flags)?;
            let free_slot = match &tgt {
                Some(_) => None,
                None => Some(probe.free.ok_or(Errno::ENOSPC)?),
            };
            self.hooks.check_space(META_CHARGE)?;
            // A replaced target may be freed in this transaction only if nobody reads it.
            let idle = match (&tgt, flags.exchange) {
                (Some(t), false) => nodes
                    .last()
                    .filter(|n| n.ino == t.ino)
                    .and_then(|n| n.data.try_write()),
                _ => None,
            };
            let now = Timespec::now();
            let fate = self.in_tx(META_CHARGE, &mut locked, |tx, l| {
                if flags.exchange {
                    let t = tgt.as_ref().expect("exchange has a target");
                    self.exchange_entries(tx, l, parent, name, &src, newparent, newname, t, now)?;
                    return Ok(None);
                }
                self.move_entry(
                    tx,
                    l,
                    parent,
                    &src,
                    newparent,
                    newname,
                    tgt.as_ref(),
                    free_slot,
                    idle.is_some(),
                    now,
                )
            })?;
            drop(idle);
            let tino = tgt.as_ref().map(|t| t.ino);
            match (fate, tino) {
                (Some(Fate::Freed), Some(t)) => {
                    self.forget_freed(&mut locked, &[t]);
                    None
                }
                (Some(Fate::Reclaim), Some(t)) => Some(t),
                _ => None,
            }
        };
        if let Some(ino) = reclaim {
            self.reclaim(ino)?;
        }
        Ok(())
    }

    /// rename(2)'s checks once every inode involved is locked (`vfs_rename` order).
    #[allow(clippy::too_many_arguments)]
    fn rename_checks(
        &self,
        cred: &Cred,
        l: &Locked<'_>,
        parent: Ino,
        src: &Found,
        newparent: Ino,
        tgt: Option<&Found>,
        flags: RenameFlags,
    ) -> Result<()> {
        let src_dir = l.get(src.ino).kind == FileKind::Dir;
        perm::may_delete(cred, l.get(parent), l.get(src.ino))?;
        let tgt_dir = tgt.is_some_and(|t| l.get(t.ino).kind == FileKind::Dir);
        match tgt {
            None => {
                let d = l.get(newparent);
                perm::check(cred, d, MAY_WRITE | MAY_EXEC)?;
                if d.nlink == 0 {
                    return Err(Errno::ENOENT);
                }
            }
            Some(t) => {
                perm::may_delete(cred, l.get(newparent), l.get(t.ino))?;
                if !flags.exchange {
                    if src_dir && !tgt_dir {
                        return Err(Errno::ENOTDIR);
                    }
                    if !src_dir && tgt_dir {
                        return Err(Errno::EISDIR);
                    }
                }
            }
        }
        if parent != newparent {
            // Moving a directory rewrites its "..": write permission on it.
            if src_dir {
                perm::check(cred, l.get(src.ino), MAY_WRITE)?;
            }
            if flags.exchange && tgt_dir {
                perm::check(cred, l.get(tgt.expect("target").ino), MAY_WRITE)?;
            }
            if src_dir && !tgt_dir && l.get(newparent).nlink >= LINK_MAX {
                return Err(Errno::EMLINK);
            }
            if flags.exchange && !src_dir && tgt_dir && l.get(parent).nlink >= LINK_MAX {
                return Err(Errno::EMLINK);
            }
        }
        if let (Some(t), false) = (tgt, flags.exchange) {
            if tgt_dir && !self.dir_is_empty(t.ino)? {
                return Err(Errno::ENOTEMPTY);
            }
        }
        Ok(())
    }

    /// The changes of a rename that is not an exchange (inside its transaction).
    #[allow(clippy::too_many_arguments)]
    fn move_entry(
        &self,
        tx: &tank_pool::Tx<'_>,
        l: &mut Locked<'_>,
        parent: Ino,
        src: &Found,
        newparent: Ino,
        newname: &[u8],
        tgt: Option<&Found>,
        free_slot: Option<u64>,
        idle: bool,
        now: Timespec,
    ) -> Result<Option<Fate>> {
        let src_dir = src.kind == FileKind::Dir;
        self.objset.remove_item(tx, parent, KIND_DIRENT, src.slot)?;
        let entry = encode_dirent(src.ino, src.kind, newname);
        let slot = match tgt {
            Some(t) => t.slot,
            None => free_slot.expect("a free slot when there is no target"),
        };
        self.objset
            .put_item(tx, newparent, KIND_DIRENT, slot, &entry)?;
        let p = l.get_mut(parent);
        p.size = p.size.saturating_sub(1).max(2);
        l.get_mut(newparent).size += 1;
        if src_dir && parent != newparent {
            l.get_mut(src.ino).parent = newparent;
            let p = l.get_mut(parent);
            p.nlink = p.nlink.saturating_sub(1);
            l.get_mut(newparent).nlink += 1;
        }
        for d in [parent, newparent] {
            let d = l.get_mut(d);
            d.mtime = now;
            d.ctime = now;
        }
        l.get_mut(src.ino).ctime = now;
        let mut fate = None;
        if let Some(t) = tgt {
            let d = l.get_mut(newparent);
            d.size = d.size.saturating_sub(1).max(2);
            let ti = l.get_mut(t.ino);
            ti.ctime = now;
            if ti.kind == FileKind::Dir {
                ti.nlink = 0;
                let d = l.get_mut(newparent);
                d.nlink = d.nlink.saturating_sub(1);
            } else {
                ti.nlink = ti.nlink.saturating_sub(1);
            }
            if l.get(t.ino).nlink == 0 {
                fate = Some(self.dispose(tx, t.ino, l.slot(t.ino), idle)?);
            }
            if fate != Some(Fate::Freed) {
                self.put_inode(tx, t.ino, l.get(t.ino))?;
            }
        }
        self.put_inodes(tx, l, &[parent, newparent, src.ino])?;
        Ok(fate)
    }

    /// The changes of RENAME_EXCHANGE (inside its transaction).
    #[allow(clippy::too_many_arguments)]
    fn exchange_entries(
        &self,
        tx: &tank_pool::Tx<'_>,
        l: &mut Locked<'_>,
        parent: Ino,
        name: &[u8],
        src: &Found,
        newparent: Ino,
        newname: &[u8],
        tgt: &Found,
        now: Timespec,
    ) -> Result<()> {
        self.objset.put_item(
            tx,
            parent,
            KIND_DIRENT,
            src.slot,
            &encode_dirent(tgt.ino, tgt.kind, name),
        )?;
        self.objset.put_item(
            tx,
            newparent,
            KIND_DIRENT,
            tgt.slot,
            &encode_dirent(src.ino, src.kind, newname),
        )?;
        if parent != newparent {
            if src.kind == FileKind::Dir {
                l.get_mut(src.ino).parent = newparent;
                let p = l.get_mut(parent);
                p.nlink = p.nlink.saturating_sub(1);
                l.get_mut(newparent).nlink += 1;
            }
            if tgt.kind == FileKind::Dir {
                l.get_mut(tgt.ino).parent = parent;
                let d = l.get_mut(newparent);
                d.nlink = d.nlink.saturating_sub(1);
                l.get_mut(parent).nlink += 1;
            }
        }
        for d in [parent, newparent] {
            let d = l.get_mut(d);
            d.mtime = now;
            d.ctime = now;
        }
        l.get_mut(src.ino).ctime = now;
        l.get_mut(tgt.ino).ctime = now;
        self.put_inodes(tx, l, &[parent, newparent, src.ino, tgt.ino])
    }

    pub(super) fn readdir_impl(
        &self,
        cred: &Cred,
        ino: Ino,
        cookie: u64,
        max: usize,
    ) -> Result<Vec<DirEntry>> {
        let _ns = self.ns.read();
        let node = self.node(ino);
        let parent = {
            let slot = self.lock(&node)?;
            let inode = slot.inode();
            if inode.kind != FileKind::Dir {
                return Err(Errno::ENOTDIR);
            }
            perm::check(cred, inode, MAY_READ)?;
            if inode.nlink == 0 {
                return Err(Errno::ENOENT);
            }
            inode.parent
        };
        let mut out = Vec::new();
        if cookie == 0 && out.len() < max {
            out.push(DirEntry {
                name: b".".to_vec(),
                ino,
                kind: FileKind::Dir,
                cookie: 1,
            });
        }
        if cookie <= 1 && out.len() < max {
            out.push(DirEntry {
                name: b"..".to_vec(),
                ino: parent,
                kind: FileKind::Dir,
                cookie: 2,
            });
        }
        let from = cookie.saturating_add(1).max(DIR_SLOT_MIN);
        if out.len() < max && from < u64::MAX {
            let items = self
                .objset
                .items(ino, KIND_DIRENT, from, u64::MAX, max - out.len())?;
            for (slot, value) in items {
                let d = decode_dirent(&value)?;
                out.push(DirEntry {
                    name: d.name,
                    ino: d.ino,
                    kind: d.kind,
                    cookie: slot,
                });
            }
        }
        if max > 0 {
            self.touch_atime(&node)?;
        }
        Ok(out)
    }
}

// Keep the free-now bound meaningful: a file freed inside an unlink transaction removes at
// most this many block items.
const _: () = assert!(FREE_NOW_BLOCKS <= 4096);
