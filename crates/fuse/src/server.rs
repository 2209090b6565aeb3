//! The FUSE operations: each request the kernel sends, mapped onto `Fs`.
//!
//! # Theory of operation
//! `Server` is fuser's `Filesystem`. Every handler decodes the node id (`nodes.rs`), builds
//! the caller's credentials (`cred.rs`), calls the `Fs` of the node's slot and replies;
//! `Fs` errors go on the wire unchanged (`Errno` values are Linux errnos). Handlers run on
//! several session threads at once; `Server` holds no lock of its own except the slot
//! table's and the credential cache's, both short.
//!
//! # What the kernel does and what we do
//! - Permissions: the mount has `default_permissions`, so the kernel checks every access
//!   against the mode, owner and group it holds for each node, before it sends us anything:
//!   search permission on every directory of a path, including the parts it resolves from
//!   its dentry cache without asking us; opens of FIFOs, sockets and device nodes, which
//!   never reach us; the sticky bit; chmod, chown and utimes rules. The attributes it
//!   checks against are those of our last reply, and every change through the mount
//!   replies with the new ones, so a chmod applies to the very next access, whatever is
//!   cached (the TTL bounds only what changes past the mount: another front end on the
//!   same dataset). `Fs` checks every operation too, with the caller's uid, gid and
//!   supplementary groups, since the network front ends call it directly; both apply the
//!   same POSIX rules, so they agree. No POSIX ACLs (FUSE_POSIX_ACL is not asked for):
//!   `Fs` keeps none. `access(2)` is answered by the kernel, from the mode bits: inside
//!   `.tank/snapshot` it grants W_OK where the mode does, though every write there fails
//!   with EROFS (ZFS mounts each snapshot read-only on its own, where access says EROFS).
//! - ftruncate(2) comes as `setattr(size)` with the descriptor's file handle; the kernel
//!   allows it only on a descriptor open for writing, so `Fs::setattr_open` skips the write
//!   check of the mode, which the open made (`open(O_CREAT|O_RDWR, 0)` then `ftruncate`
//!   succeeds, as POSIX says).
//! - umask: we do not ask for FUSE_DONT_MASK, so the kernel applies the umask to the mode
//!   of mkdir/mknod/create; we apply the `umask` field of the request again, which changes
//!   nothing when it was applied already and is exact if it was not.
//! - O_TRUNC comes with the open (FUSE_ATOMIC_O_TRUNC) and `Fs::open` truncates; create is
//!   `Fs::create`, whose open skips the permission check (POSIX: `open(O_CREAT|O_RDWR,
//!   0444)` succeeds for its creator).
//! - truncate(2) and ftruncate(2) come as `setattr(size)` with mtime "now"; the mtime is
//!   dropped (`Fs` stamps it when the size changes), since a writer who is not the owner
//!   may truncate but not set times.
//! - Writeback cache (when negotiated): the kernel buffers writes and sends them later
//!   marked FUSE_WRITE_CACHE, with no meaningful credentials: those run as root and never
//!   append (the kernel chose the offset, O_APPEND included). The kernel then keeps mtime
//!   itself: "now" arrives as an explicit time equal to the request's ctime (told apart
//!   from an explicit time, which differs), and it flushes the mtime it kept (`setattr` of
//!   mtime alone) on fsync and writeback with the credentials of whoever syncs; when `Fs`
//!   refuses that to a caller who is not the owner, the flush is answered with the current
//!   attributes (the write already set mtime in `Fs`). The price: `utimensat` of mtime
//!   alone to "now" by a non-owner is a silent no-op instead of EPERM. FLUSH, which the
//!   kernel then sends at every close after writing the file back itself, is answered
//!   ENOSYS (nothing is buffered here), so it stops sending it.
//! - Set-uid/set-gid clearing: we ask for FUSE_HANDLE_KILLPRIV_V2, which makes it the
//!   filesystem's job, and `Fs` does it: a write or truncate by anyone but root, and any
//!   chown of a non-directory, clear S_ISUID (and S_ISGID when group-executable). The
//!   kernel sends a write by a caller without CAP_FSETID past its writeback cache, with our
//!   credentials and FUSE_WRITE_KILL_SUIDGID, which we honour even for a root caller. On
//!   kernels without v2 the kernel sends the clearing as a `setattr(mode)` with the
//!   writer's credentials, which a non-owner may not do: such a mode change that only
//!   drops those bits is done for any caller with write access.
//! - Snapshots (slots ≠ 0) and the virtual directories refuse every change with EROFS;
//!   their files are opened with FOPEN_KEEP_CACHE and their directories with
//!   FOPEN_CACHE_DIR, since they never change.
//! - Live files keep their cached pages across opens while nothing has changed their data
//!   (the kernel's keep-cache): each open compares the file's data version
//!   (`Fs::data_version`, which every change of its bytes or size through any front end
//!   moves on) with the version recorded when its pages were last known current
//!   (`PageStamps`), and keeps them only on a match; otherwise the kernel drops them, as
//!   close-to-open consistency asks. Writes the kernel writes back from its own pages
//!   (FUSE_WRITE_CACHE) carry the stamp from the version before each to the one after it,
//!   in whatever order they finish, as long as nothing else changed the file in between
//!   (a step that starts from a version nobody recorded never joins); any other write, a size change and
//!   `fallocate` forget the stamp, so the next open drops the pages. Changes made past the
//!   mount (NFS, S3) also drop the kernel's pages as they happen (the mount's invalidator);
//!   a rollback remounts.
//! - Direct I/O (the `direct` property, `DirectMode`): a read on a file whose open is direct
//!   (O_DIRECT under `standard`, every open under `always`) does not keep the data blocks
//!   it reads whole in the ARC (`ObjectSet::read_direct`). The kernel itself sends O_DIRECT
//!   I/O past its page cache; under `always` every regular file is opened with
//!   FOPEN_DIRECT_IO, so its reads and writes come here as they are made (up to 1 MiB
//!   each, several at once for writes inside the file: FOPEN_PARALLEL_DIRECT_WRITES)
//!   instead of through the page cache. The kernel writes a file's dirty pages back before
//!   such I/O and drops its cached pages after a direct write, and maps such files shared
//!   (FUSE_DIRECT_IO_ALLOW_MMAP) through the page cache; a kernel without that (before
//!   6.6) could not map them shared, so there `always` keeps the page cache and only its
//!   ARC half applies. The property is read at each open (the handle, `DIRECT_FH`, carries
//!   the answer to its reads), so a `set` applies to the files opened after it.
//! - Write-through for a file server (`WriteThrough`): a writable open by the process group
//!   the service names (smbd's) gets FOPEN_DIRECT_IO while the writeback cache is on, so
//!   its writes come here as they are made and a full quota or pool fails the write
//!   itself; smbd acknowledges a client's write when `write(2)` returns and does not pass
//!   on a failed `close`, where the cache would otherwise report it. The kernel writes the
//!   file's cached dirty pages (the local mount's writers') back first and drops its
//!   cached pages after each such write, so both keep one view of the file.
//! - A name looked up and not found in the live filesystem is answered as a negative entry
//!   (node 0) with the entry TTL, so the kernel keeps its absence as it keeps a name's
//!   presence: smbd's `vfs_fruit` looks for a file's AppleDouble `._name` three times
//!   before it deletes the file. A name made through the mount replaces it; one made past
//!   the mount (NFS, S3) drops it through the mount's invalidator. Not in the virtual
//!   directories, where a new snapshot appears without such a notice.
//! - copy_file_range, lseek (SEEK_DATA/SEEK_HOLE), poll and locks are left to the kernel's
//!   generic code (ENOSYS, or no capability asked).

use std::ffi::OsStr;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, CopyFileRangeFlags, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenFlags, PollEvents,
    PollFlags, PollNotifier, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen, ReplyPoll, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use tank_dataset::posix::{
    Attr, Cred, DataVersions, DirEntry, DirectMode, FileKind, Fs, Ino, RenameFlags, SetAttr,
    TimeSet, XattrMode, ROOT_INO,
};
use tank_dataset::Errno;

use crate::attr::{file_attr, file_type, statfs_args, timespec_from_request, virtual_dir_attr};
use crate::cred::CredCache;
use crate::nodes::{
    encode, Node, Pin, Slots, CONTROL_NODE, INO_BITS, INO_MASK, LIVE_SLOT, SNAPDIR_NODE,
    VIRTUAL_SLOT,
};
use crate::options::MountOptions;
use crate::SnapshotSource;

/// The name of the virtual directory at the root of the live filesystem.
pub const CONTROL_NAME: &str = ".tank";
/// Its one entry.
pub const SNAPSHOT_DIR_NAME: &str = "snapshot";

/// The file handle of a direct open (`Server::file_open`); every other open's is 0.
const DIRECT_FH: u64 = 1;

/// Largest write the kernel may send in one request, and the readahead we ask for.
pub(crate) const MAX_IO_BYTES: u32 = 1 << 20;
/// How long a /dev/fuse reader pauses after forgets when requests come over io_uring.
const FORGET_PAUSE: Duration = Duration::from_millis(2);
/// Background requests (readahead, writeback) the kernel may have in flight.
const MAX_BACKGROUND: u16 = 64;
/// Smallest `fuse_dirent` (24-byte header, name padded to 8) and `fuse_direntplus`
/// (128-byte entry + dirent): how many entries a reply buffer can hold at most.
const DIRENT_MIN_BYTES: usize = 32;
const DIRENTPLUS_MIN_BYTES: usize = 160;

/// The attributes of a negative entry: node 0 tells the kernel the name does not exist; the
/// rest is not read.
fn absent_attr() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: SystemTime::UNIX_EPOCH,
        mtime: SystemTime::UNIX_EPOCH,
        ctime: SystemTime::UNIX_EPOCH,
        crtime: SystemTime::UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

type Result<T> = std::result::Result<T, Errno>;

/// An error as the kernel gets it; it also marks the request being handled on this thread
/// as failed, for the observer.
fn wire(e: Errno) -> fuser::Errno {
    FAILED.with(|f| f.set(true));
    fuser::Errno::from_i32(e.code())
}

thread_local! {
    /// Whether the request this thread handles was answered with an error (`wire`).
    static FAILED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

const ESTALE: Errno = Errno(libc::ESTALE);

/// A node handed to the kernel by a reply.
struct Entry<'a> {
    attr: FileAttr,
    generation: u64,
    attr_ttl: Duration,
    entry_ttl: Duration,
    /// The slot reference that becomes the kernel's once the reply is sent.
    pin: Option<Pin<'a>>,
}

/// Ways a directory handler emits an entry: returns true when the reply buffer is full.
enum DirReply {
    Plain(ReplyDirectory),
    Plus(ReplyDirectoryPlus),
}

pub(crate) struct Server {
    slots: Slots,
    snapshots: Option<Arc<dyn SnapshotSource>>,
    creds: CredCache,
    ttl: Duration,
    snapshot_ttl: Duration,
    read_only: bool,
    want_writeback: bool,
    /// Negotiated with the kernel at init.
    writeback: bool,
    killpriv_v2: bool,
    /// The kernel maps files opened with FOPEN_DIRECT_IO shared (FUSE_DIRECT_IO_ALLOW_MMAP,
    /// Linux 6.6): only then does `direct=always` bypass the page cache.
    direct_mmap: bool,
    /// Whether to ask for FUSE over io_uring (its rings are ready), and whether requests
    /// come over it: set when INIT granted it (`mount` reads it then), cleared if the
    /// kernel later refuses the rings' entries.
    want_uring: bool,
    pub(crate) uring: Arc<std::sync::atomic::AtomicBool>,
    /// Times of the virtual directories.
    started: SystemTime,
    /// Told of each request and how long its handler took (the service's metrics).
    observer: Option<Arc<dyn crate::RequestObserver>>,
    /// Whose writable opens bypass the writeback cache (`file_open`).
    write_through: Option<Arc<tank_service::mounts::WriteThrough>>,
    /// When live files' cached pages were last known current (module header).
    page_stamps: PageStamps,
}

/// Most files whose page stamps are kept; past it they are all forgotten at once (the next
/// open of each drops its pages, as without a stamp).
const PAGE_STAMPS_MAX: usize = 1 << 18;

/// The data version (`Fs::data_version`) of each live file as the kernel's cached pages of
/// it hold it, by node id.
#[derive(Default)]
struct PageStamps(parking_lot::Mutex<std::collections::HashMap<u64, PageStamp>>);

/// Written-back writes whose version step waits for an earlier one, at most (past it the
/// stamp is forgotten).
const PAGE_STAMP_PENDING_MAX: usize = 64;

#[derive(Debug, Default)]
struct PageStamp {
    /// The version the pages hold.
    version: u64,
    /// Steps (before, after) of written-back writes that answered before the write that
    /// leads to their `before`: the kernel writes pages back several at a time, and they
    /// finish in any order.
    pending: Vec<(u64, u64)>,
}

impl PageStamps {
    /// At an open: whether the pages cached of the file are still current (its data
    /// version is the one recorded). Records the version it has now, either way.
    fn still_current(&self, nodeid: u64, fs: &Fs, ino: Ino) -> bool {
        self.record(nodeid, fs.data_version(ino))
    }

    /// Records `version` for the file; whether it was the one recorded.
    fn record(&self, nodeid: u64, version: u64) -> bool {
        let mut stamps = self.0.lock();
        if stamps.len() >= PAGE_STAMPS_MAX && !stamps.contains_key(&nodeid) {
            stamps.clear();
        }
        let fresh = PageStamp {
            version,
            pending: Vec::new(),
        };
        stamps
            .insert(nodeid, fresh)
            .is_some_and(|old| old.version == version)
    }

    /// The kernel wrote its own pages back, taking the file from version `before` to
    /// `after`. The pages hold `after` once every step from the recorded version leads
    /// there; a step that starts anywhere else (something else changed the file in
    /// between) never joins, and the next open drops the pages.
    fn renew(&self, nodeid: u64, versions: DataVersions) {
        let mut stamps = self.0.lock();
        let Some(stamp) = stamps.get_mut(&nodeid) else {
            return;
        };
        if stamp.version != versions.before {
            if stamp.pending.len() >= PAGE_STAMP_PENDING_MAX {
                stamps.remove(&nodeid);
            } else {
                stamp.pending.push((versions.before, versions.after));
            }
            return;
        }
        stamp.version = versions.after;
        while let Some(i) = stamp.pending.iter().position(|(b, _)| *b == stamp.version) {
            stamp.version = stamp.pending.swap_remove(i).1;
        }
    }

    /// The file changed past the kernel's pages: the next open drops them.
    fn forget(&self, nodeid: u64) {
        self.0.lock().remove(&nodeid);
    }
}

/// Tells the observer how long a request's handler took, when it returns.
struct Timed<'a> {
    observer: Option<&'a dyn crate::RequestObserver>,
    op: &'static str,
    started: std::time::Instant,
}

impl Drop for Timed<'_> {
    fn drop(&mut self) {
        let failed = FAILED.with(|f| f.replace(false));
        if let Some(o) = self.observer {
            o.observe(self.op, self.started.elapsed(), failed);
        }
    }
}

impl Server {
    pub fn new(
        live: Arc<Fs>,
        snapshots: Option<Arc<dyn SnapshotSource>>,
        opts: &MountOptions,
        want_uring: bool,
    ) -> Server {
        Server {
            slots: Slots::new(live),
            snapshots,
            creds: CredCache::default(),
            ttl: opts.attr_ttl,
            snapshot_ttl: opts.snapshot_ttl,
            read_only: opts.read_only,
            want_writeback: opts.wants_writeback(),
            writeback: false,
            killpriv_v2: false,
            direct_mmap: false,
            want_uring,
            uring: Arc::default(),
            started: SystemTime::now(),
            observer: opts.observer.clone(),
            write_through: opts.write_through.clone(),
            page_stamps: PageStamps::default(),
        }
    }

    /// Times a request's handler for the observer (requests a ring worker answers later
    /// count the time to hand them over).
    fn timed(&self, op: &'static str) -> Timed<'_> {
        FAILED.with(|f| f.set(false));
        Timed {
            observer: self.observer.as_deref(),
            op,
            started: std::time::Instant::now(),
        }
    }

    fn cred(&self, req: &Request) -> Cred {
        self.creds.cred(req.uid(), req.gid(), req.pid())
    }

    /// How long the kernel may keep names and attributes of a slot's nodes. Names are
    /// cached in every directory: the kernel checks search permission on each directory of a
    /// path itself (`default_permissions`, module header), with the attributes every change
    /// through the mount refreshes, so a cached name never lets a caller past a directory it
    /// may not search.
    fn ttl_for(&self, slot: u16) -> Duration {
        if slot == LIVE_SLOT {
            self.ttl
        } else {
            self.snapshot_ttl
        }
    }

    fn decode(nodeid: INodeNo) -> Result<Node> {
        Node::decode(nodeid.0).ok_or(ESTALE)
    }

    /// The filesystem and inode of a node that exists in some filesystem.
    fn fs_node(&self, nodeid: INodeNo) -> Result<(u16, Arc<Fs>, Ino)> {
        match Self::decode(nodeid)? {
            Node::Fs { slot, ino } => Ok((slot, self.slots.fs(slot)?, ino)),
            Node::Control | Node::SnapshotDir => Err(Errno::EISDIR),
        }
    }

    /// The live filesystem and inode of a node that may be changed.
    fn writable(&self, nodeid: INodeNo) -> Result<(Arc<Fs>, Ino)> {
        if self.read_only {
            return Err(Errno::EROFS);
        }
        match Self::decode(nodeid)? {
            Node::Fs {
                slot: LIVE_SLOT,
                ino,
            } => Ok((self.slots.live().clone(), ino)),
            _ => Err(Errno::EROFS),
        }
    }

    fn is_control_name(parent: INodeNo, name: &OsStr) -> bool {
        parent.0 == ROOT_INO && name.as_bytes() == CONTROL_NAME.as_bytes()
    }

    /// A node of `slot` for the kernel, its name cached for `entry_ttl`.
    fn entry<'a>(
        &self,
        slot: u16,
        attr: &Attr,
        pin: Option<Pin<'a>>,
        entry_ttl: Duration,
    ) -> Result<Entry<'a>> {
        let nodeid = encode(slot, attr.ino)?;
        Ok(Entry {
            attr: file_attr(attr, nodeid),
            generation: attr.generation,
            attr_ttl: self.ttl_for(slot),
            entry_ttl,
            pin,
        })
    }

    fn virtual_entry(&self, node: Node) -> Entry<'static> {
        Entry {
            attr: self.virtual_attr(node),
            generation: 0,
            attr_ttl: self.snapshot_ttl,
            entry_ttl: self.snapshot_ttl,
            pin: None,
        }
    }

    fn virtual_attr(&self, node: Node) -> FileAttr {
        match node {
            Node::SnapshotDir => virtual_dir_attr(SNAPDIR_NODE, 2, self.started),
            _ => virtual_dir_attr(CONTROL_NODE, 3, self.started),
        }
    }

    fn reply_entry(reply: ReplyEntry, entry: Result<Entry<'_>>) {
        match entry {
            Ok(e) => {
                reply.entry_with_ttls(&e.attr_ttl, &e.entry_ttl, &e.attr, Generation(e.generation));
                if let Some(pin) = e.pin {
                    pin.keep();
                }
            }
            Err(e) => reply.error(wire(e)),
        }
    }

    fn reply_empty(reply: ReplyEmpty, r: Result<()>) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(wire(e)),
        }
    }

    fn snapshot_source(&self) -> Result<&Arc<dyn SnapshotSource>> {
        self.snapshots.as_ref().ok_or(Errno::ENOENT)
    }

    /// `.tank/snapshot/<name>`: the root of that snapshot, opened if it is not.
    fn snapshot_root(&self, name: &OsStr) -> Result<Entry<'_>> {
        let source = self.snapshot_source()?;
        let name = name.to_str().ok_or(Errno::ENOENT)?;
        if self.slots.find(name).is_some() && !source.list().iter().any(|n| n == name) {
            // Destroyed since it was opened: it goes once the kernel forgets it.
            return Err(Errno::ENOENT);
        }
        let (slot, fs, pin) = self.slots.open(name, || source.open(name))?;
        let attr = fs.getattr(ROOT_INO)?;
        // The set of snapshots changes: the name is cached only briefly.
        self.entry(slot, &attr, Some(pin), self.ttl)
    }

    fn do_lookup(&self, req: &Request, parent: INodeNo, name: &OsStr) -> Result<Entry<'_>> {
        match Self::decode(parent)? {
            Node::Control => {
                if name.as_bytes() == SNAPSHOT_DIR_NAME.as_bytes() {
                    Ok(self.virtual_entry(Node::SnapshotDir))
                } else {
                    Err(Errno::ENOENT)
                }
            }
            Node::SnapshotDir => self.snapshot_root(name),
            Node::Fs { slot, ino } => {
                if slot == LIVE_SLOT && Self::is_control_name(parent, name) {
                    return Ok(self.virtual_entry(Node::Control));
                }
                let fs = self.slots.fs(slot)?;
                let pin = self.slots.pin(slot)?;
                let attr = fs.lookup(&self.cred(req), ino, name)?;
                self.entry(slot, &attr, pin, self.ttl_for(slot))
            }
        }
    }

    /// Whether a name found missing in `parent` may be cached as missing: in the live
    /// filesystem's directories, whose entries other front ends' changes invalidate (the
    /// mount's invalidator), not in the virtual directories (a new snapshot appears in
    /// `.tank/snapshot` with no such notice).
    fn caches_absence(&self, parent: INodeNo) -> bool {
        matches!(Self::decode(parent), Ok(Node::Fs { slot, .. }) if slot == LIVE_SLOT)
            && !self.ttl.is_zero()
    }

    fn do_getattr(&self, nodeid: INodeNo) -> Result<(FileAttr, Duration)> {
        match Self::decode(nodeid)? {
            node @ (Node::Control | Node::SnapshotDir) => {
                Ok((self.virtual_attr(node), self.snapshot_ttl))
            }
            Node::Fs { slot, ino } => {
                let attr = self.slots.fs(slot)?.getattr(ino)?;
                Ok((file_attr(&attr, nodeid.0), self.ttl_for(slot)))
            }
        }
    }

    /// Clears set-uid, and set-gid when group-execute is set, of a regular file (the
    /// kernel's rule for killing privileges).
    fn kill_suidgid(fs: &Fs, ino: Ino) -> Result<()> {
        let attr = fs.getattr(ino)?;
        if attr.kind != FileKind::File {
            return Ok(());
        }
        let perm = u32::from(attr.perm);
        let mut kept = perm & !libc::S_ISUID;
        if perm & libc::S_IXGRP != 0 {
            kept &= !libc::S_ISGID;
        }
        if kept != perm {
            let set = SetAttr {
                mode: Some(kept),
                ..SetAttr::default()
            };
            fs.setattr(&Cred::root(), ino, &set)?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn do_setattr(
        &self,
        req: &Request,
        nodeid: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        opened: bool,
    ) -> Result<FileAttr> {
        let (fs, ino) = self.writable(nodeid)?;
        let cred = self.cred(req);
        let time = |t: TimeOrNow| match t {
            TimeOrNow::Now => TimeSet::Now,
            TimeOrNow::SpecificTime(t) => TimeSet::At(timespec_from_request(t)),
        };
        let mut set = SetAttr {
            mode: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size,
            atime: atime.map(time),
            mtime: mtime.map(time),
        };
        if self.writeback {
            // With the writeback cache the kernel keeps mtime itself and sends "now" as the
            // time it read from its clock, the same it gives ctime; an explicit time differs
            // from ctime. Tell them apart, since only the owner may set an explicit time.
            if let (Some(TimeSet::At(m)), Some(c)) = (set.mtime, ctime) {
                if m == timespec_from_request(c) {
                    set.mtime = Some(TimeSet::Now);
                }
            }
        }
        if set.size.is_some() && set.mtime == Some(TimeSet::Now) && set.atime.is_none() {
            // truncate(2) stamps mtime as a side effect; `Fs` does so when the size changes,
            // and a writer who is not the owner may not set mtime alone.
            set.mtime = None;
        }
        // A change through a file handle is ftruncate(2) on a descriptor open for writing.
        let changed = if opened {
            fs.setattr_open(&cred, ino, &set)
        } else {
            fs.setattr(&cred, ino, &set)
        };
        let attr = match changed {
            Ok(attr) => attr,
            Err(e) if e == Errno::EPERM || e == Errno::EACCES => {
                let only_mtime = set.mtime == Some(TimeSet::Now)
                    && SetAttr { mtime: None, ..set } == SetAttr::default();
                if self.writeback && only_mtime {
                    // The writeback cache flushing the mtime it kept, on behalf of whoever
                    // syncs (module header): not the caller's request, never refused.
                    fs.getattr(ino)?
                } else if !self.killpriv_v2 && self.drops_only_suidgid(&fs, ino, &set)? {
                    fs.access(&cred, ino, libc::W_OK)?;
                    fs.setattr(&Cred::root(), ino, &set)?
                } else {
                    return Err(e);
                }
            }
            Err(e) => return Err(e),
        };
        if size.is_some() {
            // A change of the data: the next open drops the pages (a change of times or
            // owner leaves the data version as it was).
            self.page_stamps.forget(nodeid.0);
        }
        Ok(file_attr(&attr, nodeid.0))
    }

    /// Whether `set` is a mode change that only drops set-uid/set-gid bits.
    fn drops_only_suidgid(&self, fs: &Fs, ino: Ino, set: &SetAttr) -> Result<bool> {
        let Some(mode) = set.mode else {
            return Ok(false);
        };
        if (SetAttr { mode: None, ..*set }) != SetAttr::default() {
            return Ok(false);
        }
        let perm = u32::from(fs.getattr(ino)?.perm);
        let bits = libc::S_ISUID | libc::S_ISGID;
        Ok(mode != perm && mode & !bits == perm & !bits && mode & bits & !perm == 0)
    }

    /// `open(O_CREAT)`: `Fs::create` creates (or, without O_EXCL, opens what another
    /// caller created since the kernel's lookup) and opens.
    fn do_create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Result<Entry<'_>> {
        let (fs, pino) = self.writable(parent)?;
        if Self::is_control_name(parent, name) {
            return Err(Errno::EEXIST);
        }
        let kind = match mode & libc::S_IFMT {
            0 => libc::S_IFREG,
            k => k,
        };
        let mode = kind | (mode & 0o7777 & !umask);
        let attr = fs.create(&self.cred(req), pino, name, mode, flags)?;
        self.entry(LIVE_SLOT, &attr, None, self.ttl_for(LIVE_SLOT))
    }

    fn open_flags(&self, slot: u16, dir: bool) -> FopenFlags {
        match (slot == LIVE_SLOT, dir) {
            (true, false) => FopenFlags::FOPEN_NOFLUSH,
            (true, true) => FopenFlags::empty(),
            (false, false) => FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_NOFLUSH,
            (false, true) => FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_CACHE_DIR,
        }
    }

    /// The handle and flags of a regular file's open (`open_flags` 0 and O_DIRECT...): a
    /// direct open (module header) gets `DIRECT_FH`, which its reads check, and under
    /// `direct=always` bypasses the page cache where the kernel can still map such a file
    /// shared. The property is read here, once per open.
    ///
    /// A writable open by the write-through process group (a file server: smbd) also
    /// bypasses the writeback cache, so that each of its writes reaches `Fs` before it is
    /// answered and a full quota or pool fails that write (`WriteThrough`).
    fn file_open(
        &self,
        req: &Request,
        nodeid: u64,
        (slot, ino): (u16, Ino),
        fs: &Fs,
        open_flags: i32,
    ) -> (FileHandle, FopenFlags) {
        let mode = fs.direct_mode();
        let fh = FileHandle(if mode.applies(open_flags) {
            DIRECT_FH
        } else {
            0
        });
        if self.direct_mmap && mode == DirectMode::Always {
            let flags = FopenFlags::FOPEN_DIRECT_IO
                | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES
                | FopenFlags::FOPEN_NOFLUSH;
            (fh, flags)
        } else if self.writes_through(req, open_flags) {
            let flags = FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES;
            (fh, flags)
        } else {
            let mut flags = self.open_flags(slot, false);
            if slot == LIVE_SLOT && self.page_stamps.still_current(nodeid, fs, ino) {
                flags |= FopenFlags::FOPEN_KEEP_CACHE;
            }
            (fh, flags)
        }
    }

    /// Whether a writable open is the write-through group's (only where writes would
    /// otherwise wait in the writeback cache).
    fn writes_through(&self, req: &Request, open_flags: i32) -> bool {
        let Some(group) = self.write_through.as_ref().and_then(|w| w.group()) else {
            return false;
        };
        if !self.writeback || open_flags & libc::O_ACCMODE == libc::O_RDONLY {
            return false;
        }
        let pid = nix::unistd::Pid::from_raw(req.pid() as i32);
        nix::unistd::getpgid(Some(pid)).is_ok_and(|g| g.as_raw() == group)
    }

    /// Whether a read is direct: its open was, or O_DIRECT was set on the file since
    /// (fcntl) and the property honours it.
    fn read_is_direct(fh: FileHandle, flags: i32, fs: &Fs) -> bool {
        fh.0 == DIRECT_FH
            || (flags & libc::O_DIRECT != 0 && fs.direct_mode() != DirectMode::Disabled)
    }

    fn do_open(
        &self,
        req: &Request,
        nodeid: INodeNo,
        flags: i32,
        dir: bool,
    ) -> Result<(FileHandle, FopenFlags)> {
        match Self::decode(nodeid)? {
            Node::Control | Node::SnapshotDir => {
                if flags & libc::O_ACCMODE != libc::O_RDONLY {
                    return Err(Errno::EISDIR);
                }
                Ok((FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE))
            }
            Node::Fs { slot, ino } => {
                let changes =
                    flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
                if changes && (slot != LIVE_SLOT || self.read_only) {
                    return Err(Errno::EROFS);
                }
                let fs = self.slots.fs(slot)?;
                fs.open(&self.cred(req), ino, flags)?;
                Ok(if dir {
                    (FileHandle(0), self.open_flags(slot, dir))
                } else {
                    self.file_open(req, nodeid.0, (slot, ino), &fs, flags)
                })
            }
        }
    }

    fn do_release(&self, nodeid: INodeNo) -> Result<()> {
        match Self::decode(nodeid)? {
            Node::Fs { slot, ino } => self.slots.fs(slot)?.release(ino),
            Node::Control | Node::SnapshotDir => Ok(()),
        }
    }

    fn do_write(
        &self,
        req: &Request,
        nodeid: INodeNo,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
    ) -> Result<u32> {
        let (fs, ino) = self.writable(nodeid)?;
        let cached = write_flags.contains(WriteFlags::FUSE_WRITE_CACHE);
        let cred = if cached {
            // Written back by the kernel: no caller to speak of (module header).
            Cred::root()
        } else {
            self.cred(req)
        };
        let append = !self.writeback && !cached && flags.0 & libc::O_APPEND != 0;
        let written = fs.write_versioned(&cred, ino, offset, data, append);
        match &written {
            // Written back from the kernel's pages, whole: they hold what the file now holds.
            Ok((n, versions)) if cached && *n as usize == data.len() => {
                self.page_stamps.renew(nodeid.0, *versions)
            }
            // Past the pages (or failed or short, when pages may hold what the file does
            // not).
            _ => self.page_stamps.forget(nodeid.0),
        }
        let (written, _) = written?;
        if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
            // The data is written; failing to clear the bits now would misreport it.
            let _ = Self::kill_suidgid(&fs, ino);
        }
        if !cached && flags.0 & libc::O_DSYNC != 0 {
            // O_SYNC and O_DSYNC (O_SYNC includes the O_DSYNC bit): durable before the
            // answer. Written-back pages of such a file come with an fsync of the kernel's.
            fs.fsync(ino, true)?;
        }
        Ok(written)
    }

    /// The entries of a virtual directory: (name, node id, cookie), sorted by cookie.
    fn virtual_entries(&self, node: Node) -> Vec<(Vec<u8>, u64, u64)> {
        match node {
            Node::Control => vec![
                (b".".to_vec(), CONTROL_NODE, 1),
                (b"..".to_vec(), ROOT_INO, 2),
                (SNAPSHOT_DIR_NAME.as_bytes().to_vec(), SNAPDIR_NODE, 3),
            ],
            _ => {
                let mut v = vec![
                    (b".".to_vec(), SNAPDIR_NODE, 1),
                    (b"..".to_vec(), CONTROL_NODE, 2),
                ];
                let names = self
                    .snapshots
                    .as_ref()
                    .map(|s| s.list())
                    .unwrap_or_default();
                let mut snaps: Vec<(Vec<u8>, u64, u64)> = names
                    .into_iter()
                    .map(|n| {
                        // A cookie from the name, so that resuming a listing is right even
                        // when snapshots come and go in between.
                        let mut h = DefaultHasher::new();
                        n.hash(&mut h);
                        let cookie = h.finish().max(3);
                        // Node ids of snapshots not open yet: a stand-in that names no
                        // node (only `readdir`'s d_ino shows it; lookup opens the snapshot).
                        let nodeid = match self.slots.find(&n) {
                            Some((slot, _)) => encode(slot, ROOT_INO).unwrap_or(0),
                            None => {
                                (u64::from(VIRTUAL_SLOT) << INO_BITS) | (cookie & INO_MASK).max(3)
                            }
                        };
                        (n.into_bytes(), nodeid, cookie)
                    })
                    .collect();
                snaps.sort_by(|a, b| (a.2, &a.0).cmp(&(b.2, &b.0)));
                v.extend(snaps);
                v
            }
        }
    }

    fn virtual_readdir(&self, node: Node, offset: u64, reply: &mut DirReply) -> Result<()> {
        for (name, nodeid, cookie) in self.virtual_entries(node) {
            if cookie <= offset {
                continue;
            }
            let name = OsStr::from_bytes(&name);
            let full = match reply {
                DirReply::Plain(r) => r.add(INodeNo(nodeid), cookie, FileType::Directory, name),
                DirReply::Plus(r) => {
                    let entry = match Node::decode(nodeid) {
                        Some(n @ (Node::Control | Node::SnapshotDir)) => self.virtual_entry(n),
                        _ if nodeid == ROOT_INO => {
                            let attr = self.slots.live().getattr(ROOT_INO)?;
                            self.entry(LIVE_SLOT, &attr, None, self.snapshot_ttl)?
                        }
                        _ => match self.snapshot_root(name) {
                            Ok(e) => e,
                            // Destroyed while we list.
                            Err(e) if e == Errno::ENOENT => continue,
                            Err(e) => return Err(e),
                        },
                    };
                    let full = r.add(
                        INodeNo(entry.attr.ino.0),
                        cookie,
                        name,
                        &entry.entry_ttl,
                        &entry.attr,
                        Generation(entry.generation),
                    );
                    // "." and ".." are not linked by the kernel: no reference taken.
                    if !full && name != "." && name != ".." {
                        if let Some(pin) = entry.pin {
                            pin.keep();
                        }
                    }
                    full
                }
            };
            if full {
                break;
            }
        }
        Ok(())
    }

    /// Lists a directory of a filesystem into `reply` from `offset` (a cookie of `Fs`).
    fn fs_readdir(
        &self,
        req: &Request,
        slot: u16,
        ino: Ino,
        offset: u64,
        size: usize,
        reply: &mut DirReply,
    ) -> Result<()> {
        let fs = self.slots.fs(slot)?;
        let cred = self.cred(req);
        let plus = matches!(reply, DirReply::Plus(_));
        let max = if plus {
            size / DIRENTPLUS_MIN_BYTES
        } else {
            size / DIRENT_MIN_BYTES
        }
        .clamp(1, 1024);
        let hide_control = slot == LIVE_SLOT && ino == ROOT_INO;
        let name_ttl = if plus {
            self.ttl_for(slot)
        } else {
            Duration::ZERO
        };
        let mut cookie = offset;
        let mut added = 0usize;
        loop {
            let batch = fs.readdir(&cred, ino, cookie, max)?;
            if batch.is_empty() {
                return Ok(());
            }
            for e in batch {
                debug_assert!(e.cookie != 0, "Fs gave a zero readdir cookie");
                if hide_control && e.name == CONTROL_NAME.as_bytes() {
                    cookie = e.cookie;
                    continue;
                }
                match self.add_fs_entry(&fs, slot, ino, name_ttl, &e, reply) {
                    Ok(true) => return Ok(()),
                    Ok(false) => added += 1,
                    // Removed since the listing: leave it out.
                    Err(err) if err == Errno::ENOENT => {}
                    // Reply with what fits so far; the next call meets the error again.
                    Err(_) if added > 0 => return Ok(()),
                    Err(err) => return Err(err),
                }
                cookie = e.cookie;
            }
        }
    }

    /// Adds one `Fs` entry; true when the reply buffer is full (the entry not added).
    fn add_fs_entry(
        &self,
        fs: &Fs,
        slot: u16,
        dir: Ino,
        name_ttl: Duration,
        e: &DirEntry,
        reply: &mut DirReply,
    ) -> Result<bool> {
        let name = OsStr::from_bytes(&e.name);
        let dots = e.name == b"." || e.name == b"..";
        // ".." of a snapshot's root is `.tank/snapshot`.
        let parent_of_snapshot = slot != LIVE_SLOT && dir == ROOT_INO && e.name == b"..";
        match reply {
            DirReply::Plain(r) => {
                let nodeid = if parent_of_snapshot {
                    SNAPDIR_NODE
                } else {
                    encode(slot, e.ino)?
                };
                Ok(r.add(INodeNo(nodeid), e.cookie, file_type(e.kind), name))
            }
            DirReply::Plus(r) => {
                let entry = if parent_of_snapshot {
                    self.virtual_entry(Node::SnapshotDir)
                } else {
                    let pin = if dots { None } else { self.slots.pin(slot)? };
                    let attr = fs.getattr(e.ino)?;
                    self.entry(slot, &attr, pin, name_ttl)?
                };
                let full = r.add(
                    INodeNo(entry.attr.ino.0),
                    e.cookie,
                    name,
                    &entry.entry_ttl,
                    &entry.attr,
                    Generation(entry.generation),
                );
                if !full {
                    if let Some(pin) = entry.pin {
                        pin.keep();
                    }
                }
                Ok(full)
            }
        }
    }

    fn do_readdir(
        &self,
        req: &Request,
        nodeid: INodeNo,
        offset: u64,
        size: usize,
        reply: &mut DirReply,
    ) -> Result<()> {
        match Self::decode(nodeid)? {
            node @ (Node::Control | Node::SnapshotDir) => self.virtual_readdir(node, offset, reply),
            Node::Fs { slot, ino } => self.fs_readdir(req, slot, ino, offset, size, reply),
        }
    }

    fn xattr_reply(reply: ReplyXattr, size: u32, value: Result<Vec<u8>>) {
        match value {
            Ok(v) if size == 0 => match u32::try_from(v.len()) {
                Ok(n) => reply.size(n),
                Err(_) => reply.error(wire(Errno::E2BIG)),
            },
            Ok(v) if v.len() > size as usize => reply.error(wire(Errno::ERANGE)),
            Ok(v) => reply.data(&v),
            Err(e) => reply.error(wire(e)),
        }
    }

    fn do_getxattr(&self, req: &Request, nodeid: INodeNo, name: &OsStr) -> Result<Vec<u8>> {
        match Self::decode(nodeid)? {
            Node::Control | Node::SnapshotDir => Err(Errno::ENODATA),
            Node::Fs { slot, ino } => self.slots.fs(slot)?.getxattr(&self.cred(req), ino, name),
        }
    }

    fn do_listxattr(&self, req: &Request, nodeid: INodeNo) -> Result<Vec<u8>> {
        let names = match Self::decode(nodeid)? {
            Node::Control | Node::SnapshotDir => Vec::new(),
            Node::Fs { slot, ino } => self.slots.fs(slot)?.listxattr(&self.cred(req), ino)?,
        };
        let mut out = Vec::with_capacity(names.iter().map(|n| n.len() + 1).sum());
        for n in names {
            out.extend_from_slice(&n);
            out.push(0);
        }
        Ok(out)
    }

    fn do_access(&self, req: &Request, nodeid: INodeNo, mask: i32) -> Result<()> {
        let wants_write = mask & libc::W_OK != 0;
        match Self::decode(nodeid)? {
            Node::Control | Node::SnapshotDir => {
                if wants_write {
                    Err(Errno::EROFS)
                } else {
                    Ok(())
                }
            }
            Node::Fs { slot, ino } => {
                let fs = self.slots.fs(slot)?;
                if wants_write && (slot != LIVE_SLOT || self.read_only) {
                    // access(2) says EROFS for files, directories and symlinks on a
                    // read-only filesystem; device files and the like stay writable.
                    let kind = fs.getattr(ino)?.kind;
                    if matches!(kind, FileKind::File | FileKind::Dir | FileKind::Symlink) {
                        return Err(Errno::EROFS);
                    }
                }
                fs.access(&self.cred(req), ino, mask)
            }
        }
    }

    fn forget_node(&self, ino: INodeNo, nlookup: u64) {
        if let Some(Node::Fs { slot, .. }) = Node::decode(ino.0) {
            self.slots.forget(slot, nlookup);
        }
    }

    /// With the io_uring transport the /dev/fuse readers serve little but FORGET, which the
    /// kernel sends as each inode leaves its cache (one per file removed) and which nobody
    /// waits for. Each wakes a reader, usually on another CPU; a reader that pauses after
    /// one instead finds the next ones queued and takes them in one BATCH_FORGET. Unlinking
    /// small files: 0.9 reader wake-ups per file without the pause.
    fn coalesce_forgets(&self) {
        if self.uring.load(std::sync::atomic::Ordering::Acquire) {
            std::thread::sleep(FORGET_PAUSE);
        }
    }
}

impl Filesystem for Server {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Each capability on its own: one the kernel lacks must not cost the others.
        let mut ask = |flags: InitFlags| config.add_capabilities(flags).is_ok();
        ask(InitFlags::FUSE_MAX_PAGES);
        ask(InitFlags::FUSE_PARALLEL_DIROPS);
        ask(InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO);
        ask(InitFlags::FUSE_CACHE_SYMLINKS);
        ask(InitFlags::FUSE_ATOMIC_O_TRUNC);
        ask(InitFlags::FUSE_ASYNC_DIO);
        self.direct_mmap = ask(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP);
        self.killpriv_v2 = ask(InitFlags::FUSE_HANDLE_KILLPRIV_V2);
        self.writeback = self.want_writeback && ask(InitFlags::FUSE_WRITEBACK_CACHE);
        if self.want_uring && ask(InitFlags::FUSE_OVER_IO_URING) {
            self.uring.store(true, std::sync::atomic::Ordering::Release);
        }
        let _ = config.set_max_write(MAX_IO_BYTES);
        if let Err(most) = config.set_max_readahead(MAX_IO_BYTES) {
            let _ = config.set_max_readahead(most);
        }
        let _ = config.set_max_background(MAX_BACKGROUND);
        let _ = config.set_congestion_threshold(MAX_BACKGROUND * 3 / 4);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _timed = self.timed("lookup");
        match self.do_lookup(req, parent, name) {
            Err(e) if e == Errno::ENOENT && self.caches_absence(parent) => {
                // A negative entry (node 0): the kernel keeps the name's absence for the
                // entry TTL, as it keeps a name's presence. Still a "not found" answer for
                // the request counters.
                FAILED.with(|f| f.set(true));
                reply.entry_with_ttls(&Duration::ZERO, &self.ttl, &absent_attr(), Generation(0));
            }
            r => Self::reply_entry(reply, r),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let _timed = self.timed("forget");
        self.forget_node(ino, nlookup);
        self.coalesce_forgets();
    }

    fn batch_forget(&self, _req: &Request, nodes: &[fuser::ForgetOne]) {
        let _timed = self.timed("batch_forget");
        for n in nodes {
            self.forget_node(n.nodeid(), n.nlookup());
        }
        self.coalesce_forgets();
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _timed = self.timed("getattr");
        match self.do_getattr(ino) {
            Ok((attr, ttl)) => reply.attr(&ttl, &attr),
            Err(e) => reply.error(wire(e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let _timed = self.timed("setattr");
        let opened = fh.is_some();
        match self.do_setattr(req, ino, mode, uid, gid, size, atime, mtime, ctime, opened) {
            Ok(attr) => reply.attr(&self.ttl, &attr),
            Err(e) => reply.error(wire(e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let _timed = self.timed("readlink");
        match self.fs_node(ino).and_then(|(_, fs, ino)| fs.readlink(ino)) {
            Ok(target) => reply.data(&target),
            Err(e) if e == Errno::EISDIR => reply.error(wire(Errno::EINVAL)),
            Err(e) => reply.error(wire(e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let _timed = self.timed("mknod");
        let r = self.writable(parent).and_then(|(fs, pino)| {
            if Self::is_control_name(parent, name) {
                return Err(Errno::EEXIST);
            }
            let mode = (mode & libc::S_IFMT) | (mode & 0o7777 & !umask);
            let attr = fs.mknod(&self.cred(req), pino, name, mode, rdev)?;
            self.entry(LIVE_SLOT, &attr, None, self.ttl_for(LIVE_SLOT))
        });
        Self::reply_entry(reply, r);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let _timed = self.timed("mkdir");
        let r = self.writable(parent).and_then(|(fs, pino)| {
            if Self::is_control_name(parent, name) {
                return Err(Errno::EEXIST);
            }
            let attr = fs.mkdir(&self.cred(req), pino, name, mode & 0o7777 & !umask)?;
            self.entry(LIVE_SLOT, &attr, None, self.ttl_for(LIVE_SLOT))
        });
        Self::reply_entry(reply, r);
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _timed = self.timed("unlink");
        let r = self.writable(parent).and_then(|(fs, pino)| {
            if Self::is_control_name(parent, name) {
                return Err(Errno::EROFS);
            }
            fs.unlink(&self.cred(req), pino, name)
        });
        Self::reply_empty(reply, r);
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _timed = self.timed("rmdir");
        let r = self.writable(parent).and_then(|(fs, pino)| {
            if Self::is_control_name(parent, name) {
                return Err(Errno::EROFS);
            }
            fs.rmdir(&self.cred(req), pino, name)
        });
        Self::reply_empty(reply, r);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        let _timed = self.timed("symlink");
        let r = self.writable(parent).and_then(|(fs, pino)| {
            if Self::is_control_name(parent, link_name) {
                return Err(Errno::EEXIST);
            }
            let attr = fs.symlink(&self.cred(req), pino, link_name, target.as_os_str())?;
            self.entry(LIVE_SLOT, &attr, None, self.ttl_for(LIVE_SLOT))
        });
        Self::reply_entry(reply, r);
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _timed = self.timed("rename");
        let r = (|| {
            if flags.contains(fuser::RenameFlags::RENAME_WHITEOUT)
                || !fuser::RenameFlags::all().contains(flags)
            {
                return Err(Errno::EINVAL);
            }
            let (fs, pino) = self.writable(parent)?;
            let (_, npino) = self.writable(newparent)?;
            if Self::is_control_name(parent, name) || Self::is_control_name(newparent, newname) {
                return Err(Errno::EROFS);
            }
            let flags = RenameFlags {
                noreplace: flags.contains(fuser::RenameFlags::RENAME_NOREPLACE),
                exchange: flags.contains(fuser::RenameFlags::RENAME_EXCHANGE),
            };
            fs.rename(&self.cred(req), pino, name, npino, newname, flags)
        })();
        Self::reply_empty(reply, r);
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let _timed = self.timed("link");
        let r = (|| {
            let (fs, ino) = self.writable(ino)?;
            let (_, npino) = self.writable(newparent)?;
            if Self::is_control_name(newparent, newname) {
                return Err(Errno::EEXIST);
            }
            let attr = fs.link(&self.cred(req), ino, npino, newname)?;
            self.entry(LIVE_SLOT, &attr, None, self.ttl_for(LIVE_SLOT))
        })();
        Self::reply_entry(reply, r);
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _timed = self.timed("open");
        match self.do_open(req, ino, flags.0, false) {
            Ok((fh, fopen)) => reply.opened(fh, fopen),
            Err(e) => reply.error(wire(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let _timed = self.timed("read");
        match self.fs_node(ino).and_then(|(_, fs, ino)| {
            if Self::read_is_direct(fh, flags.0, &fs) {
                fs.read_direct(ino, offset, size)
            } else {
                fs.read(ino, offset, size)
            }
        }) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(wire(e)),
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let _timed = self.timed("write");
        match self.do_write(req, ino, offset, data, write_flags, flags) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(wire(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let _timed = self.timed("flush");
        // Nothing is buffered here: every write reached `Fs` when it was answered. ENOSYS
        // says so once for the whole mount: the kernel stops sending FLUSH, which with the
        // writeback cache it sends at every close after writing the file's dirty pages back
        // (close(2) still reports the errors of that write-back). One round trip less per
        // close.
        reply.error(fuser::Errno::ENOSYS);
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let _timed = self.timed("release");
        Self::reply_empty(reply, self.do_release(ino));
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _timed = self.timed("fsync");
        let r = match Node::decode(ino.0) {
            Some(Node::Fs {
                slot: LIVE_SLOT,
                ino,
            }) => self.slots.live().fsync(ino, datasync),
            Some(_) => Ok(()),
            None => Err(ESTALE),
        };
        Self::reply_empty(reply, r);
    }

    fn opendir(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _timed = self.timed("opendir");
        match self.do_open(req, ino, flags.0, true) {
            Ok((fh, fopen)) => reply.opened(fh, fopen),
            Err(e) => reply.error(wire(e)),
        }
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        let _timed = self.timed("readdir");
        // fuser does not pass the buffer size to the handler; 4 KiB is what the kernel asks.
        let mut out = DirReply::Plain(reply);
        let r = self.do_readdir(req, ino, offset, 4096, &mut out);
        let DirReply::Plain(reply) = out else {
            unreachable!()
        };
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(wire(e)),
        }
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        let _timed = self.timed("readdirplus");
        let mut out = DirReply::Plus(reply);
        let r = self.do_readdir(req, ino, offset, 4096, &mut out);
        let DirReply::Plus(reply) = out else {
            unreachable!()
        };
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(wire(e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        let _timed = self.timed("releasedir");
        Self::reply_empty(reply, self.do_release(ino));
    }

    fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _timed = self.timed("fsyncdir");
        self.fsync(req, ino, fh, datasync, reply);
    }

    fn statfs(&self, _req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        let _timed = self.timed("statfs");
        let fs = match Node::decode(ino.0) {
            Some(Node::Fs { slot, .. }) => self.slots.fs(slot),
            _ => Ok(self.slots.live().clone()),
        };
        match fs.and_then(|fs| fs.statfs()) {
            Ok(s) => {
                let (blocks, bfree, bavail, files, ffree, bsize, namelen, frsize) = statfs_args(&s);
                reply.statfs(blocks, bfree, bavail, files, ffree, bsize, namelen, frsize);
            }
            Err(e) => reply.error(wire(e)),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        position: u32,
        reply: ReplyEmpty,
    ) {
        let _timed = self.timed("setxattr");
        let r = (|| {
            let (fs, ino) = self.writable(ino)?;
            let mode = match flags {
                0 => XattrMode::Any,
                libc::XATTR_CREATE => XattrMode::Create,
                libc::XATTR_REPLACE => XattrMode::Replace,
                _ => return Err(Errno::EINVAL),
            };
            if position != 0 {
                return Err(Errno::EINVAL);
            }
            fs.setxattr(&self.cred(req), ino, name, value, mode)
        })();
        Self::reply_empty(reply, r);
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let _timed = self.timed("getxattr");
        Self::xattr_reply(reply, size, self.do_getxattr(req, ino, name));
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let _timed = self.timed("listxattr");
        Self::xattr_reply(reply, size, self.do_listxattr(req, ino));
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _timed = self.timed("removexattr");
        let r = self
            .writable(ino)
            .and_then(|(fs, ino)| fs.removexattr(&self.cred(req), ino, name));
        Self::reply_empty(reply, r);
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let _timed = self.timed("access");
        Self::reply_empty(reply, self.do_access(req, ino, mask.bits()));
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let _timed = self.timed("create");
        match self.do_create(req, parent, name, mode, umask, flags) {
            Ok(e) => {
                let nodeid = e.attr.ino.0;
                let ino = match Node::decode(nodeid) {
                    Some(Node::Fs { ino, .. }) => ino,
                    _ => 0,
                };
                let live = self.slots.live();
                let (fh, fopen) = self.file_open(req, nodeid, (LIVE_SLOT, ino), live, flags);
                // fuser has one TTL for both the name and the attributes here.
                reply.created(
                    &e.entry_ttl.min(e.attr_ttl),
                    &e.attr,
                    Generation(e.generation),
                    fh,
                    fopen,
                );
            }
            Err(e) => reply.error(wire(e)),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let _timed = self.timed("fallocate");
        self.page_stamps.forget(ino.0);
        let r = self
            .writable(ino)
            .and_then(|(fs, ino)| fs.fallocate(&self.cred(req), ino, offset, length, mode));
        Self::reply_empty(reply, r);
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: i64,
        _whence: i32,
        reply: ReplyLseek,
    ) {
        let _timed = self.timed("lseek");
        // The kernel's generic lseek (the whole file is data) takes over.
        reply.error(fuser::Errno::ENOSYS);
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        _fh_in: FileHandle,
        _offset_in: u64,
        _ino_out: INodeNo,
        _fh_out: FileHandle,
        _offset_out: u64,
        _len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let _timed = self.timed("copy_file_range");
        // The kernel falls back to copying through the page cache.
        reply.error(fuser::Errno::ENOSYS);
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        let _timed = self.timed("ioctl");
        reply.error(fuser::Errno::from_i32(libc::ENOTTY));
    }

    fn poll(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _ph: PollNotifier,
        _events: PollEvents,
        _flags: PollFlags,
        reply: ReplyPoll,
    ) {
        let _timed = self.timed("poll");
        // Files are always ready; the kernel says so itself after ENOSYS.
        reply.error(fuser::Errno::ENOSYS);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(before: u64, after: u64) -> DataVersions {
        DataVersions { before, after }
    }

    #[test]
    fn page_stamps_follow_written_back_writes_in_any_order() {
        let stamps = PageStamps::default();
        // First open: nothing cached yet.
        assert!(!stamps.record(7, 10));
        assert!(stamps.record(7, 10));
        // Three writes back, answered out of order: 10 -> 11 -> 12 -> 13.
        stamps.renew(7, step(12, 13));
        stamps.renew(7, step(10, 11));
        stamps.renew(7, step(11, 12));
        assert!(
            stamps.record(7, 13),
            "the steps joined up to the file's version"
        );
    }

    #[test]
    fn page_stamps_never_join_across_a_change_made_elsewhere() {
        let stamps = PageStamps::default();
        assert!(!stamps.record(1, 10));
        // Ours 10 -> 11, then a change elsewhere 11 -> 12, then ours 12 -> 13.
        stamps.renew(1, step(10, 11));
        stamps.renew(1, step(12, 13));
        assert!(
            !stamps.record(1, 13),
            "pages kept across a change they do not hold"
        );
        // Forgotten by any other change.
        assert!(stamps.record(1, 13));
        stamps.forget(1);
        assert!(!stamps.record(1, 13));
        // A file without a stamp gains none from a write back.
        stamps.renew(2, step(1, 2));
        assert!(!stamps.record(2, 2));
        // Too many steps waiting: forgotten.
        assert!(!stamps.record(3, 100));
        for i in 0..=PAGE_STAMP_PENDING_MAX as u64 {
            stamps.renew(3, step(1000 + i, 2000 + i));
        }
        assert!(!stamps.record(3, 100));
    }
}
