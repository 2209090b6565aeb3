//! The POSIX filesystem on one object set (ZFS's zpl).
//!
//! # Theory of operation
//! Every inode is an object; its attributes, directory entries, symlink target and extended
//! attributes are items of that object, and a regular file's bytes are the object's data.
//! `format.rs` documents the bytes, `inode.rs` the in-memory inodes and the lock order,
//! `perm.rs` the permission rules; this file holds the [`Fs`] API and the file operations,
//! `dir.rs` the namespace operations and `xattr.rs` the extended attributes.
//!
//! Every operation changes all its items under one transaction, so it is atomic in a crash:
//! it is in the txg that commits it, entirely, or not at all. Validation (names,
//! permissions, existence, space) happens before the transaction begins; a failure inside it
//! can only come from the layers below (an I/O error), and then the cached inodes involved
//! are dropped so they reload from the tree. Two kinds of work are cut into several
//! transactions so that the dirty-data throttle works and memory stays bounded: writes
//! larger than `WRITE_CHUNK` (each chunk is one transaction; a crash may keep a prefix of
//! the write, as on any POSIX filesystem), and freeing a large file's blocks, which runs
//! from the end of the file while the inode is held by the persistent unlinked set (or, for
//! a truncation, lowers the size step by step).
//!
//! Unlinking the last name of an inode that is open, or large, or busy, puts it in the
//! unlinked set (`(ROOT_INO, KIND_UNLINKED, ino)`) in the same transaction; the last
//! `release` (or the next mount, after a crash) frees it and removes it from the set, as
//! ZFS's unlinked set does. A read-only mount (snapshots) writes nothing, not even this.
//!
//! Durability: `fsync` commits the object set's intent log (`ObjectStore::log_commit`):
//! every change of this filesystem made before it is durable when it returns (not only the
//! file's), in a log record on the pool's log device or log region, or, when the log cannot
//! take it, by a txg sync. With `sync=always` every changing operation commits the log
//! before it returns; with `sync=disabled` fsync returns at once (unsafe: a crash loses
//! what the last txgs held, though never the consistency of the filesystem).
//!
//! # Concurrency
//! `ns` (a read-write lock) orders the namespace: operations that add, remove or move
//! directory entries hold it for writing, lookups and readdir for reading. File data and
//! attributes are guarded per inode (`inode.rs`), so reads and writes of different files,
//! and reads of one file, run in parallel. Lock order: `ns`, then inode `data` locks, then
//! inode `meta` locks by increasing inode number, then a transaction. No lock is taken while
//! a transaction is held, and no transaction is held while waiting for a sync.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use parking_lot::{MutexGuard, RwLock};
use tank_object::{ObjectSet, ObjectStore};
use tank_pool::Tx;

use super::format::*;
use super::inode::{InodeCache, Node, Slot};
use super::perm::{self, MAY_READ, MAY_WRITE};
use super::types::*;
use crate::errno::Errno;

/// Largest piece of a write done under one transaction (a few MiB, so the dirty-data
/// throttle sees streams as they go).
pub(crate) const WRITE_CHUNK: usize = 4 << 20;
/// Blocks freed per transaction when a large file shrinks or is freed.
pub(crate) const FREE_BLOCKS_PER_TX: u64 = 16384;
/// A file of at most this many blocks is freed in the transaction that drops its last
/// link; a larger one goes through the unlinked set and is freed step by step.
pub(crate) const FREE_NOW_BLOCKS: u64 = 1024;
/// Dirty bytes charged to a metadata transaction that may allocate (an estimate of the tree
/// nodes it dirties), so a flood of creates is throttled like data.
pub(crate) const META_CHARGE: u64 = 1024;
/// Largest file size (as ext4 and ZFS on Linux: the largest signed 64-bit offset).
pub(crate) const MAX_FILE_SIZE: u64 = i64::MAX as u64;
/// Seconds after which relatime updates an access time even if it is newer than the
/// modification and change times.
const RELATIME_SECS: i64 = 24 * 60 * 60;
/// Unit of `statfs` block counts.
const STATFS_BSIZE: u32 = 4096;

/// One mounted filesystem: an object set seen as directories and files.
/// A file's data version before and after a change (see `inode.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataVersions {
    pub before: u64,
    pub after: u64,
}

pub struct Fs {
    pub(super) store: Arc<ObjectStore>,
    pub(super) objset: Arc<ObjectSet>,
    pub(super) hooks: Arc<dyn DatasetHooks>,
    /// The namespace lock (see the module documentation).
    pub(super) ns: RwLock<()>,
    pub(super) cache: InodeCache,
}

impl std::fmt::Debug for Fs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fs")
            .field("objset", &self.objset.id)
            .finish_non_exhaustive()
    }
}

/// The meta locks of a set of inodes, taken in increasing inode order.
pub(super) struct Locked<'a> {
    slots: Vec<(Ino, MutexGuard<'a, Slot>)>,
}

impl Locked<'_> {
    fn index(&self, ino: Ino) -> usize {
        self.slots
            .iter()
            .position(|(i, _)| *i == ino)
            .unwrap_or_else(|| panic!("inode {ino} is not locked"))
    }

    pub fn get(&self, ino: Ino) -> &Inode {
        self.slots[self.index(ino)].1.inode()
    }

    pub fn get_mut(&mut self, ino: Ino) -> &mut Inode {
        let i = self.index(ino);
        self.slots[i].1.inode_mut()
    }

    pub fn slot(&self, ino: Ino) -> &Slot {
        &self.slots[self.index(ino)].1
    }

    pub fn slot_mut(&mut self, ino: Ino) -> &mut Slot {
        let i = self.index(ino);
        &mut self.slots[i].1
    }

    /// Drops every cached record: they reload from the tree (after a failed transaction).
    pub fn invalidate(&mut self) {
        for (_, s) in &mut self.slots {
            s.inode = None;
            s.gone = false;
        }
    }
}

/// Validates one name of a directory entry: ENOENT when empty, EINVAL with '/' or NUL,
/// ENAMETOOLONG past NAME_MAX bytes.
pub(super) fn check_name(name: &OsStr) -> Result<&[u8]> {
    let b = name.as_bytes();
    if b.is_empty() {
        return Err(Errno::ENOENT);
    }
    if b.contains(&b'/') || b.contains(&0) {
        return Err(Errno::EINVAL);
    }
    if b.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    Ok(b)
}

pub(super) fn is_dot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

/// What `getattr` shows for an inode record. `data_bytes` is what a regular file's object
/// holds in data blocks (`None`: not known, the size stands in).
pub(super) fn attr_with(ino: Ino, i: &Inode, data_bytes: Option<u64>) -> Attr {
    let blocks = match i.kind {
        FileKind::File => data_bytes.unwrap_or(i.size).div_ceil(512),
        FileKind::Symlink => i.size.div_ceil(512),
        FileKind::Dir => 1 + i.size.div_ceil(16),
        _ => 0,
    };
    Attr {
        ino,
        kind: i.kind,
        perm: i.perm,
        nlink: i.nlink,
        uid: i.uid,
        gid: i.gid,
        rdev: i.rdev,
        size: i.size,
        blocks,
        blksize: i.blksize,
        atime: i.atime,
        mtime: i.mtime,
        ctime: i.ctime,
        crtime: i.crtime,
        generation: i.generation,
    }
}

/// What became of an inode whose last link went away in a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fate {
    /// Freed in the transaction.
    Freed,
    /// In the unlinked set; still open, the last release frees it.
    Kept,
    /// In the unlinked set, to be freed right after the transaction (large or busy).
    Reclaim,
}

impl Fs {
    /// Opens the filesystem in `objset`; an empty object set is formatted first (root
    /// directory owned by `root_owner`, mode 0755). Files left unlinked-but-open by a crash
    /// are freed here. A read-only mount (`hooks.readonly()`) writes nothing.
    pub fn mount(
        store: Arc<ObjectStore>,
        objset: Arc<ObjectSet>,
        hooks: Arc<dyn DatasetHooks>,
        root_owner: (u32, u32),
    ) -> Result<Arc<Fs>> {
        let fs = Fs {
            store,
            objset,
            hooks,
            ns: RwLock::new(()),
            cache: InodeCache::new(),
        };
        match fs.objset.get_item(ROOT_INO, KIND_FSINFO, 0)? {
            Some(b) => check_fsinfo(&b)?,
            None => {
                if !fs.objset.list_objects(1, 1)?.is_empty() {
                    // Objects but no filesystem header: not a POSIX filesystem.
                    return Err(Errno::EINVAL);
                }
                fs.writable()?;
                fs.format(root_owner)?;
            }
        }
        let root = fs.getattr(ROOT_INO)?;
        if root.kind != FileKind::Dir {
            return Err(Errno::EIO);
        }
        if !fs.hooks.readonly() {
            fs.reclaim_unlinked()?;
            fs.done()?;
        }
        Ok(Arc::new(fs))
    }

    fn format(&self, root_owner: (u32, u32)) -> Result<()> {
        let now = Timespec::now();
        let tx = self.store.begin(META_CHARGE)?;
        let ino = self
            .objset
            .create_object(&tx, OBJ_TYPE_BASE + kind_code(FileKind::Dir), 512)?;
        assert_eq!(
            ino, ROOT_INO,
            "the root directory is the object set's first object"
        );
        let root = Inode {
            kind: FileKind::Dir,
            perm: 0o755,
            nlink: 2,
            uid: root_owner.0,
            gid: root_owner.1,
            rdev: 0,
            blksize: 512,
            size: 2,
            parent: ROOT_INO,
            generation: tx.txg,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
        };
        self.put_inode(&tx, ROOT_INO, &root)?;
        self.objset
            .put_item(&tx, ROOT_INO, KIND_FSINFO, 0, &encode_fsinfo(now))?;
        Ok(())
    }

    /// Frees every inode a crash left in the unlinked set.
    fn reclaim_unlinked(&self) -> Result<()> {
        let mut from = 0;
        loop {
            let batch = self
                .objset
                .items(ROOT_INO, KIND_UNLINKED, from, u64::MAX, 256)?;
            let Some(last) = batch.last().map(|(ino, _)| *ino) else {
                return Ok(());
            };
            for (ino, _) in batch {
                self.reclaim(ino)?;
            }
            from = last + 1;
        }
    }

    // ---- helpers shared by the operation files ----

    pub(super) fn writable(&self) -> Result<()> {
        if self.hooks.readonly() {
            Err(Errno::EROFS)
        } else {
            Ok(())
        }
    }

    /// After a change: with `sync=always`, make it durable before returning.
    pub(super) fn done(&self) -> Result<()> {
        if self.hooks.sync_mode() == SyncMode::Always {
            self.store.log_commit(&self.objset)?;
        }
        Ok(())
    }

    pub(super) fn node(&self, ino: Ino) -> Arc<Node> {
        self.cache.node(ino)
    }

    /// Loads the record of `ino` into `slot` if needed; ENOENT for no such inode.
    pub(super) fn load(&self, ino: Ino, slot: &mut Slot) -> Result<()> {
        if slot.gone {
            return Err(Errno::ENOENT);
        }
        if slot.inode.is_none() {
            if ino == 0 {
                return Err(Errno::ENOENT);
            }
            match self.objset.get_item(ino, KIND_INODE, 0)? {
                None => return Err(Errno::ENOENT),
                Some(b) => slot.inode = Some(Inode::decode(&b)?),
            }
        }
        Ok(())
    }

    /// Locks the meta of one node, its record loaded.
    pub(super) fn lock<'a>(&self, node: &'a Node) -> Result<MutexGuard<'a, Slot>> {
        let mut slot = node.meta.lock();
        self.load(node.ino, &mut slot)?;
        Ok(slot)
    }

    /// Locks the meta of several nodes (duplicates allowed) in increasing inode order.
    pub(super) fn lock_all<'a>(&self, nodes: &'a [Arc<Node>]) -> Result<Locked<'a>> {
        let mut order: Vec<&'a Arc<Node>> = nodes.iter().collect();
        order.sort_by_key(|n| n.ino);
        order.dedup_by_key(|n| n.ino);
        let mut slots = Vec::with_capacity(order.len());
        for n in order {
            slots.push((n.ino, self.lock(n)?));
        }
        Ok(Locked { slots })
    }

    /// Runs `f` under a transaction charged with `bytes`; when it fails, the records of
    /// `locked` are dropped (they reload from the tree).
    pub(super) fn in_tx<R>(
        &self,
        bytes: u64,
        locked: &mut Locked<'_>,
        f: impl FnOnce(&Tx<'_>, &mut Locked<'_>) -> Result<R>,
    ) -> Result<R> {
        let tx = self.store.begin(bytes)?;
        let r = f(&tx, locked);
        drop(tx);
        if r.is_err() {
            locked.invalidate();
        }
        r
    }

    pub(super) fn put_inode(&self, tx: &Tx<'_>, ino: Ino, inode: &Inode) -> Result<()> {
        self.objset
            .put_item(tx, ino, KIND_INODE, 0, &inode.encode())?;
        Ok(())
    }

    /// One transaction (charged `bytes`) that runs `change` and stores `new` as the inode
    /// of `slot`: the cached inode becomes `new` when it commits, and is dropped (reloaded
    /// from the tree) when it fails.
    pub(super) fn update_inode(
        &self,
        ino: Ino,
        slot: &mut Slot,
        new: Inode,
        bytes: u64,
        change: impl FnOnce(&Tx<'_>) -> Result<()>,
    ) -> Result<()> {
        let r = self.store.begin(bytes).map_err(Errno::from).and_then(|tx| {
            change(&tx)?;
            self.put_inode(&tx, ino, &new)
        });
        match r {
            Ok(()) => {
                *slot.inode_mut() = new;
                Ok(())
            }
            Err(e) => {
                slot.inode = None;
                Err(e)
            }
        }
    }

    /// Writes the records of `inos` (each once) from `locked`.
    pub(super) fn put_inodes(&self, tx: &Tx<'_>, locked: &Locked<'_>, inos: &[Ino]) -> Result<()> {
        let mut done: Vec<Ino> = Vec::with_capacity(inos.len());
        for &ino in inos {
            if !done.contains(&ino) {
                self.put_inode(tx, ino, locked.get(ino))?;
                done.push(ino);
            }
        }
        Ok(())
    }

    /// The inode whose last link went away in `tx` (its record, nlink 0, is written by the
    /// caller): freed now if nobody has it open, it is small and nobody reads it (`idle`),
    /// else put in the unlinked set.
    pub(super) fn dispose(&self, tx: &Tx<'_>, ino: Ino, slot: &Slot, idle: bool) -> Result<Fate> {
        let inode = slot.inode();
        assert_eq!(inode.nlink, 0, "inode {ino} disposed with links");
        let small = inode.kind != FileKind::File
            || inode.size <= FREE_NOW_BLOCKS * u64::from(inode.blksize);
        if slot.open == 0 && idle && small {
            self.objset.free_object(tx, ino)?;
            return Ok(Fate::Freed);
        }
        self.objset
            .put_item(tx, ROOT_INO, KIND_UNLINKED, ino, &ino.to_le_bytes())?;
        Ok(if slot.open == 0 {
            Fate::Reclaim
        } else {
            Fate::Kept
        })
    }

    /// Marks inodes freed in a committed transaction as gone.
    pub(super) fn forget_freed(&self, locked: &mut Locked<'_>, freed: &[Ino]) {
        for &ino in freed {
            let s = locked.slot_mut(ino);
            s.inode = None;
            s.gone = true;
            self.cache.forget(ino);
        }
    }

    /// Frees an inode of the unlinked set once nobody has it open: its blocks from the end of
    /// the file, a bounded number per transaction, then the object and its set entry
    /// together. An entry whose inode is gone or linked again is just removed.
    pub(super) fn reclaim(&self, ino: Ino) -> Result<()> {
        let node = self.node(ino);
        let _data = node.change_data();
        let mut slot = node.meta.lock();
        let exists = match self.load(ino, &mut slot) {
            Ok(()) => true,
            Err(e) if e == Errno::ENOENT => false,
            Err(e) => return Err(e),
        };
        if exists && slot.open > 0 {
            return Ok(());
        }
        let linked = exists && slot.inode().nlink > 0;
        if exists && !linked && slot.inode().kind == FileKind::File {
            self.shrink_in_steps(ino, &mut slot, 0)?;
        }
        let tx = self.store.begin(0)?;
        let r = (|| -> Result<()> {
            if exists && !linked {
                self.objset.free_object(&tx, ino)?;
            }
            self.objset.remove_item(&tx, ROOT_INO, KIND_UNLINKED, ino)?;
            Ok(())
        })();
        drop(tx);
        if let Err(e) = r {
            slot.inode = None;
            return Err(e);
        }
        if exists && !linked {
            slot.inode = None;
            slot.gone = true;
            drop(slot);
            self.cache.forget(ino);
        }
        Ok(())
    }

    /// Lowers a regular file's size towards `target` in steps of `FREE_BLOCKS_PER_TX` blocks,
    /// each under its own transaction, until at most one step remains (done by the caller's
    /// transaction). The caller holds the node's data lock and `slot`.
    pub(super) fn shrink_in_steps(&self, ino: Ino, slot: &mut Slot, target: u64) -> Result<()> {
        let step = FREE_BLOCKS_PER_TX * u64::from(slot.inode().blksize);
        while slot.inode().size > target.saturating_add(step) {
            let size = slot.inode().size - step;
            let mut inode = slot.inode().clone();
            inode.size = size;
            self.update_inode(ino, slot, inode, 0, |tx| {
                Ok(self.objset.truncate(tx, ino, size)?)
            })?;
        }
        Ok(())
    }

    /// Updates the access time after a read or readdir when relatime says so.
    pub(super) fn touch_atime(&self, node: &Node) -> Result<()> {
        if !self.hooks.atime() || self.hooks.readonly() {
            return Ok(());
        }
        let mut slot = self.lock(node)?;
        let now = Timespec::now();
        let i = slot.inode();
        let due = i.atime <= i.mtime
            || i.atime <= i.ctime
            || now.sec.saturating_sub(i.atime.sec) >= RELATIME_SECS;
        if !due || i.atime == now {
            return Ok(());
        }
        let mut inode = i.clone();
        inode.atime = now;
        self.update_inode(node.ino, &mut slot, inode, 0, |_| Ok(()))
    }

    /// What `getattr` shows for inode `ino` whose record is `i`: a regular file's blocks
    /// are what its object's data blocks hold (holes count nothing).
    pub(super) fn attr_of(&self, ino: Ino, i: &Inode) -> Result<Attr> {
        let data_bytes = match i.kind {
            FileKind::File => self.objset.stat(ino)?.data_bytes,
            _ => None,
        };
        Ok(attr_with(ino, i, data_bytes))
    }

    // ---- the API ----

    pub fn getattr(&self, ino: Ino) -> Result<Attr> {
        let node = self.node(ino);
        let slot = self.lock(&node)?;
        self.attr_of(ino, slot.inode())
    }

    /// Looks `name` up in `parent` (search permission needed); "." and ".." too.
    pub fn lookup(&self, cred: &Cred, parent: Ino, name: &OsStr) -> Result<Attr> {
        self.lookup_impl(cred, parent, name)
    }

    pub fn setattr(&self, cred: &Cred, ino: Ino, set: &SetAttr) -> Result<Attr> {
        let a = self.setattr_impl(cred, ino, set, false)?;
        self.done()?;
        Ok(a)
    }

    /// `setattr` through a descriptor open for writing (`ftruncate(2)`): write access was
    /// checked when it was opened, so a size change needs none now. POSIX: after
    /// `open(O_CREAT|O_RDWR, 0)` the creator may `ftruncate` the file it may no longer open.
    /// Every other change is checked as by `setattr`.
    pub fn setattr_open(&self, cred: &Cred, ino: Ino, set: &SetAttr) -> Result<Attr> {
        let a = self.setattr_impl(cred, ino, set, true)?;
        self.done()?;
        Ok(a)
    }

    /// Creates a node of any kind; `mode` carries the kind bits and the permission bits
    /// (already masked by the caller's umask).
    pub fn mknod(
        &self,
        cred: &Cred,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        rdev: u32,
    ) -> Result<Attr> {
        let a = self.mknod_impl(cred, parent, name, mode, rdev)?;
        self.done()?;
        Ok(a)
    }

    /// `open(O_CREAT)`: creates a regular file (mode as for `mknod`) and opens it, without
    /// the access check of `open` (the creator may write a file it creates read-only, as
    /// the kernel allows). When the name exists: EEXIST with O_EXCL in `flags`, else the
    /// existing file is opened as by `open` (O_TRUNC included). Every success is one open
    /// to `release`.
    pub fn create(
        &self,
        cred: &Cred,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        flags: i32,
    ) -> Result<Attr> {
        let a = self.create_impl(cred, parent, name, mode, flags)?;
        self.done()?;
        Ok(a)
    }

    pub fn mkdir(&self, cred: &Cred, parent: Ino, name: &OsStr, mode: u32) -> Result<Attr> {
        let a = self.mkdir_impl(cred, parent, name, mode)?;
        self.done()?;
        Ok(a)
    }

    pub fn symlink(&self, cred: &Cred, parent: Ino, name: &OsStr, target: &OsStr) -> Result<Attr> {
        let a = self.symlink_impl(cred, parent, name, target)?;
        self.done()?;
        Ok(a)
    }

    pub fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        self.readlink_impl(ino)
    }

    pub fn link(&self, cred: &Cred, ino: Ino, newparent: Ino, newname: &OsStr) -> Result<Attr> {
        let a = self.link_impl(cred, ino, newparent, newname)?;
        self.done()?;
        Ok(a)
    }

    pub fn unlink(&self, cred: &Cred, parent: Ino, name: &OsStr) -> Result<()> {
        self.remove_impl(cred, parent, name, false)?;
        self.done()
    }

    pub fn rmdir(&self, cred: &Cred, parent: Ino, name: &OsStr) -> Result<()> {
        self.remove_impl(cred, parent, name, true)?;
        self.done()
    }

    pub fn rename(
        &self,
        cred: &Cred,
        parent: Ino,
        name: &OsStr,
        newparent: Ino,
        newname: &OsStr,
        flags: RenameFlags,
    ) -> Result<()> {
        self.rename_impl(cred, parent, name, newparent, newname, flags)?;
        self.done()
    }

    /// Checks `access(2)`-style permission (`mask` of R_OK/W_OK/X_OK, or F_OK).
    pub fn access(&self, cred: &Cred, ino: Ino, mask: i32) -> Result<()> {
        if mask & !(libc::R_OK | libc::W_OK | libc::X_OK) != 0 {
            return Err(Errno::EINVAL);
        }
        let node = self.node(ino);
        let slot = self.lock(&node)?;
        let inode = slot.inode();
        if mask & libc::W_OK != 0
            && self.hooks.readonly()
            && matches!(
                inode.kind,
                FileKind::File | FileKind::Dir | FileKind::Symlink
            )
        {
            return Err(Errno::EROFS);
        }
        perm::check(cred, inode, mask as u32)
    }

    /// Opens a file or directory (permission check for `flags`' access mode); the inode
    /// stays allocated until the matching `release`, even if unlinked meanwhile. O_TRUNC
    /// truncates a regular file (write permission needed).
    pub fn open(&self, cred: &Cred, ino: Ino, flags: i32) -> Result<()> {
        self.open_impl(cred, ino, flags, false)?;
        self.done()
    }

    pub fn release(&self, ino: Ino) -> Result<()> {
        let node = self.node(ino);
        let mut slot = self.lock(&node)?;
        if slot.open == 0 {
            return Err(Errno::EBADF);
        }
        slot.open -= 1;
        let free = slot.open == 0 && slot.inode().nlink == 0;
        drop(slot);
        if free {
            self.reclaim(ino)?;
        }
        Ok(())
    }

    pub fn read(&self, ino: Ino, offset: u64, size: u32) -> Result<Vec<u8>> {
        self.read_as(ino, offset, size, false)
    }

    /// A read on a file opened for direct I/O (`DirectMode::applies`): the data blocks it
    /// reads whole are not kept in the ARC (`ObjectSet::read_direct`).
    pub fn read_direct(&self, ino: Ino, offset: u64, size: u32) -> Result<Vec<u8>> {
        self.read_as(ino, offset, size, true)
    }

    /// The dataset's `direct` property, as it is now.
    pub fn direct_mode(&self) -> DirectMode {
        self.hooks.direct()
    }

    fn read_as(&self, ino: Ino, offset: u64, size: u32, direct: bool) -> Result<Vec<u8>> {
        let node = self.node(ino);
        let data = node.data.read();
        {
            let slot = self.lock(&node)?;
            match slot.inode().kind {
                FileKind::File => {}
                FileKind::Dir => return Err(Errno::EISDIR),
                _ => return Err(Errno::EINVAL),
            }
        }
        let out = if direct {
            self.objset.read_direct(ino, offset, size as usize)?
        } else {
            self.objset.read(ino, offset, size as usize)?
        };
        self.touch_atime(&node)?;
        drop(data);
        Ok(out)
    }

    /// Writes at `offset` (at the end of the file when `append`); returns bytes written.
    pub fn write(
        &self,
        cred: &Cred,
        ino: Ino,
        offset: u64,
        data: &[u8],
        append: bool,
    ) -> Result<u32> {
        Ok(self.write_versioned(cred, ino, offset, data, append)?.0)
    }

    /// [`Fs::write`], also telling the file's data version before and after it (see
    /// `inode.rs`): a cache of the data as of `before` is current as of `after` once the
    /// same bytes are written to it.
    pub fn write_versioned(
        &self,
        cred: &Cred,
        ino: Ino,
        offset: u64,
        data: &[u8],
        append: bool,
    ) -> Result<(u32, DataVersions)> {
        let r = self.write_impl(cred, ino, offset, data, append)?;
        self.done()?;
        Ok(r)
    }

    /// The version of a file's data now (see `inode.rs`): it changes with every change of
    /// the file's bytes or size, through any front end.
    pub fn data_version(&self, ino: Ino) -> u64 {
        self.node(ino).data_version()
    }

    /// Durable when it returns (unless `sync=disabled`).
    pub fn fsync(&self, ino: Ino, _datasync: bool) -> Result<()> {
        self.getattr(ino)?;
        if self.hooks.sync_mode() == SyncMode::Disabled {
            return Ok(());
        }
        self.store.log_commit(&self.objset)?;
        Ok(())
    }

    /// `mode` 0 allocates (extends the size unless FALLOC_FL_KEEP_SIZE);
    /// FALLOC_FL_PUNCH_HOLE|KEEP_SIZE frees the range; others EOPNOTSUPP.
    pub fn fallocate(&self, cred: &Cred, ino: Ino, offset: u64, len: u64, mode: i32) -> Result<()> {
        self.fallocate_impl(cred, ino, offset, len, mode)?;
        self.done()
    }

    /// Entries after `cookie` (0 = from the start, "." and ".." first), at most `max`.
    pub fn readdir(&self, cred: &Cred, ino: Ino, cookie: u64, max: usize) -> Result<Vec<DirEntry>> {
        self.readdir_impl(cred, ino, cookie, max)
    }

    pub fn statfs(&self) -> Result<StatFs> {
        let (total, avail) = self.hooks.space();
        let bsize = u64::from(STATFS_BSIZE);
        // Inodes cost no preallocated table: count one per 512 bytes of space, as the
        // smallest file would take.
        Ok(StatFs {
            bsize: STATFS_BSIZE,
            blocks: total / bsize,
            bfree: avail / bsize,
            bavail: avail / bsize,
            files: total / 512,
            ffree: avail / 512,
            namelen: NAME_MAX as u32,
        })
    }

    pub fn setxattr(
        &self,
        cred: &Cred,
        ino: Ino,
        name: &OsStr,
        value: &[u8],
        mode: XattrMode,
    ) -> Result<()> {
        self.setxattr_impl(cred, ino, name, value, mode)?;
        self.done()
    }

    pub fn getxattr(&self, cred: &Cred, ino: Ino, name: &OsStr) -> Result<Vec<u8>> {
        self.getxattr_impl(cred, ino, name)
    }

    pub fn listxattr(&self, cred: &Cred, ino: Ino) -> Result<Vec<Vec<u8>>> {
        self.listxattr_impl(cred, ino)
    }

    pub fn removexattr(&self, cred: &Cred, ino: Ino, name: &OsStr) -> Result<()> {
        self.removexattr_impl(cred, ino, name)?;
        self.done()
    }

    /// Makes everything written so far durable (a txg sync), e.g. before unmount.
    pub fn sync_all(&self) -> Result<()> {
        self.store.sync()?;
        Ok(())
    }

    /// Inodes whose in-memory state is cached (bounded; for tests and diagnostics).
    pub fn cached_inodes(&self) -> usize {
        self.cache.len()
    }

    // ---- file operations ----

    pub(super) fn open_impl(
        &self,
        cred: &Cred,
        ino: Ino,
        flags: i32,
        created: bool,
    ) -> Result<Attr> {
        let mut mask = match flags & libc::O_ACCMODE {
            libc::O_RDONLY => MAY_READ,
            libc::O_WRONLY => MAY_WRITE,
            libc::O_RDWR => MAY_READ | MAY_WRITE,
            _ => return Err(Errno::EINVAL),
        };
        let trunc = flags & libc::O_TRUNC != 0 && !created;
        if trunc {
            mask |= MAY_WRITE;
        }
        let node = self.node(ino);
        let _data = if trunc {
            Some(node.change_data())
        } else {
            None
        };
        let mut slot = self.lock(&node)?;
        let inode = slot.inode().clone();
        if !created {
            if inode.kind == FileKind::Dir && mask & MAY_WRITE != 0 {
                return Err(Errno::EISDIR);
            }
            if mask & MAY_WRITE != 0
                && self.hooks.readonly()
                && matches!(inode.kind, FileKind::File | FileKind::Symlink)
            {
                return Err(Errno::EROFS);
            }
            perm::check(cred, &inode, mask)?;
        }
        if trunc && inode.kind == FileKind::File {
            self.writable()?;
            let mut new = inode.clone();
            let now = Timespec::now();
            new.size = 0;
            new.mtime = now;
            new.ctime = now;
            new.perm = perm::perm_after_write(cred, &inode);
            self.shrink_in_steps(ino, &mut slot, 0)?;
            self.update_inode(ino, &mut slot, new, 0, |tx| {
                Ok(self.objset.truncate(tx, ino, 0)?)
            })?;
        }
        slot.open += 1;
        self.attr_of(ino, slot.inode())
    }

    fn write_impl(
        &self,
        cred: &Cred,
        ino: Ino,
        offset: u64,
        data: &[u8],
        append: bool,
    ) -> Result<(u32, DataVersions)> {
        if data.len() > u32::MAX as usize {
            return Err(Errno::EINVAL);
        }
        self.writable()?;
        let node = self.node(ino);
        let change = node.change_data();
        let versions = DataVersions {
            before: change.before,
            after: change.after,
        };
        let mut slot = self.lock(&node)?;
        match slot.inode().kind {
            FileKind::File => {}
            FileKind::Dir => return Err(Errno::EISDIR),
            _ => return Err(Errno::EINVAL),
        }
        let start = if append { slot.inode().size } else { offset };
        if data.is_empty() {
            return Ok((0, versions));
        }
        let end = start
            .checked_add(data.len() as u64)
            .filter(|e| *e <= MAX_FILE_SIZE)
            .ok_or(Errno::EFBIG)?;
        self.hooks.check_space(data.len() as u64)?;
        let mut written = 0usize;
        for chunk in data.chunks(WRITE_CHUNK) {
            let at = start + written as u64;
            let mut inode = slot.inode().clone();
            let now = Timespec::now();
            inode.size = inode.size.max(at + chunk.len() as u64);
            inode.mtime = now;
            inode.ctime = now;
            inode.perm = perm::perm_after_write(cred, &inode);
            let r = self.store.begin(chunk.len() as u64).map_err(Errno::from);
            let r = r.and_then(|tx| {
                self.objset.write(&tx, ino, at, chunk)?;
                self.put_inode(&tx, ino, &inode)
            });
            if let Err(e) = r {
                slot.inode = None;
                if written > 0 {
                    // A short write: what was written stays.
                    break;
                }
                return Err(e);
            }
            *slot.inode_mut() = inode;
            written += chunk.len();
        }
        debug_assert!(start + written as u64 <= end);
        Ok((written as u32, versions))
    }

    fn fallocate_impl(
        &self,
        cred: &Cred,
        ino: Ino,
        offset: u64,
        len: u64,
        mode: i32,
    ) -> Result<()> {
        const KEEP: i32 = libc::FALLOC_FL_KEEP_SIZE;
        const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE;
        if offset > MAX_FILE_SIZE || len == 0 || len > MAX_FILE_SIZE {
            return Err(Errno::EINVAL);
        }
        if mode & !(KEEP | PUNCH) != 0 || (mode & PUNCH != 0 && mode & KEEP == 0) {
            return Err(Errno::EOPNOTSUPP);
        }
        self.writable()?;
        let node = self.node(ino);
        let _data = node.change_data();
        let mut slot = self.lock(&node)?;
        match slot.inode().kind {
            FileKind::File => {}
            FileKind::Dir => return Err(Errno::EISDIR),
            _ => return Err(Errno(libc::ENODEV)),
        }
        let end = offset
            .checked_add(len)
            .filter(|e| *e <= MAX_FILE_SIZE)
            .ok_or(Errno::EFBIG)?;
        let size = slot.inode().size;
        let now = Timespec::now();
        if mode & PUNCH == 0 {
            // Copy-on-write space cannot be reserved ahead; like ZFS, allocation only checks
            // the space and sets the size.
            self.hooks.check_space(end.saturating_sub(size))?;
            if mode & KEEP != 0 || end <= size {
                return Ok(());
            }
            let mut inode = slot.inode().clone();
            inode.size = end;
            inode.mtime = now;
            inode.ctime = now;
            inode.perm = perm::perm_after_write(cred, &inode);
            return self.update_inode(ino, &mut slot, inode, 0, |tx| {
                Ok(self.objset.truncate(tx, ino, end)?)
            });
        }
        // Punch: zeros written over whole blocks become holes in the object layer; only the
        // partial blocks at the ends are rewritten.
        let end = end.min(size);
        if offset >= end {
            return Ok(());
        }
        let bs = u64::from(slot.inode().blksize);
        let step = (WRITE_CHUNK as u64).max(bs);
        let zeros = vec![0u8; step.min(end - offset) as usize];
        let mut at = offset;
        while at < end {
            let n = (end - at).min(step);
            let mut inode = slot.inode().clone();
            inode.mtime = now;
            inode.ctime = now;
            inode.perm = perm::perm_after_write(cred, &inode);
            self.update_inode(ino, &mut slot, inode, 2 * bs, |tx| {
                Ok(self.objset.write(tx, ino, at, &zeros[..n as usize])?)
            })?;
            at += n;
        }
        Ok(())
    }

    fn setattr_impl(&self, cred: &Cred, ino: Ino, set: &SetAttr, opened: bool) -> Result<Attr> {
        let node = self.node(ino);
        let _data = if set.size.is_some() {
            Some(node.change_data())
        } else {
            None
        };
        let mut slot = self.lock(&node)?;
        let cur = slot.inode().clone();
        let changes = set.mode.is_some()
            || set.uid.is_some()
            || set.gid.is_some()
            || set.size.is_some()
            || set.atime.is_some()
            || set.mtime.is_some();
        if !changes {
            return self.attr_of(ino, &cur);
        }
        self.writable()?;
        let owner = perm::owner_or_root(cred, &cur);
        if let Some(size) = set.size {
            match cur.kind {
                FileKind::File => {}
                FileKind::Dir => return Err(Errno::EISDIR),
                _ => return Err(Errno::EINVAL),
            }
            if !opened {
                perm::check(cred, &cur, MAY_WRITE)?;
            }
            if size > MAX_FILE_SIZE {
                return Err(Errno::EFBIG);
            }
        }
        if let Some(uid) = set.uid {
            if !perm::may_chown(cred, &cur, uid) {
                return Err(Errno::EPERM);
            }
        }
        if let Some(gid) = set.gid {
            if !perm::may_chgrp(cred, &cur, gid) {
                return Err(Errno::EPERM);
            }
        }
        if set.mode.is_some() && !owner {
            return Err(Errno::EPERM);
        }
        let explicit =
            matches!(set.atime, Some(TimeSet::At(_))) || matches!(set.mtime, Some(TimeSet::At(_)));
        if (set.atime.is_some() || set.mtime.is_some()) && !owner {
            // utimensat: explicit times (or only one of them set to now) need the owner;
            // both set to now need the owner or write permission.
            if explicit || set.atime.is_none() || set.mtime.is_none() {
                return Err(Errno::EPERM);
            }
            perm::check(cred, &cur, MAY_WRITE)?;
        }

        let now = Timespec::now();
        let mut new = cur.clone();
        let mut ctime = false;
        if let Some(mode) = set.mode {
            new.perm = perm::perm_for_chmod(cred, set.gid.unwrap_or(cur.gid), mode);
            ctime = true;
        }
        if set.uid.is_some() || set.gid.is_some() {
            new.uid = set.uid.unwrap_or(cur.uid);
            new.gid = set.gid.unwrap_or(cur.gid);
            // A mode given with the new owner is the caller's final word (the kernel's
            // notify_change never kills set-uid in the same change as an explicit mode).
            if set.mode.is_none() {
                new.perm = perm::perm_after_chown(&new);
            }
            ctime = true;
        }
        let resize = set.size.filter(|s| *s != cur.size);
        if let Some(size) = set.size {
            new.perm = perm::perm_after_write(cred, &new);
            if resize.is_some() {
                new.size = size;
                new.mtime = now;
                ctime = true;
            }
        }
        let pick = |t: TimeSet| match t {
            TimeSet::Now => now,
            TimeSet::At(t) => t,
        };
        if let Some(t) = set.atime {
            new.atime = pick(t);
            ctime = true;
        }
        if let Some(t) = set.mtime {
            new.mtime = pick(t);
            ctime = true;
        }
        if ctime {
            new.ctime = now;
        }
        if new == cur {
            return self.attr_of(ino, &cur);
        }
        if let Some(size) = resize {
            self.shrink_in_steps(ino, &mut slot, size)?;
        }
        self.update_inode(ino, &mut slot, new, 0, |tx| {
            if let Some(size) = resize {
                self.objset.truncate(tx, ino, size)?;
            }
            Ok(())
        })?;
        self.attr_of(ino, slot.inode())
    }
}
