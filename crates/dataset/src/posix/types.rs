//! The vocabulary of the POSIX layer's API: what the FUSE front end (and later NFS, SMB, S3)
//! pass in and get back. Plain data; no I/O here.

use crate::errno::Errno;

/// An inode number: the object id of the file in its object set. The root directory is
/// `ROOT_INO` (1, as FUSE expects), so front ends pass inode numbers through unchanged.
pub type Ino = u64;
pub const ROOT_INO: Ino = 1;

/// Longest name in a directory, in bytes (as ext4 and ZFS).
pub const NAME_MAX: usize = 255;
/// Longest symlink target, in bytes.
pub const SYMLINK_MAX: usize = 4095;
/// Longest extended attribute value, in bytes (Linux XATTR_SIZE_MAX).
pub const XATTR_SIZE_MAX: usize = 65536;
/// Most hard links to one inode.
pub const LINK_MAX: u32 = 65000;

pub type Result<T> = std::result::Result<T, Errno>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    BlockDev,
    CharDev,
    Fifo,
    Socket,
}

impl FileKind {
    /// The `S_IFMT` bits of this kind.
    pub fn mode_bits(self) -> u32 {
        match self {
            FileKind::File => libc::S_IFREG,
            FileKind::Dir => libc::S_IFDIR,
            FileKind::Symlink => libc::S_IFLNK,
            FileKind::BlockDev => libc::S_IFBLK,
            FileKind::CharDev => libc::S_IFCHR,
            FileKind::Fifo => libc::S_IFIFO,
            FileKind::Socket => libc::S_IFSOCK,
        }
    }

    /// The kind named by the `S_IFMT` bits of `mode`, if any.
    pub fn from_mode(mode: u32) -> Option<FileKind> {
        Some(match mode & libc::S_IFMT {
            libc::S_IFREG => FileKind::File,
            libc::S_IFDIR => FileKind::Dir,
            libc::S_IFLNK => FileKind::Symlink,
            libc::S_IFBLK => FileKind::BlockDev,
            libc::S_IFCHR => FileKind::CharDev,
            libc::S_IFIFO => FileKind::Fifo,
            libc::S_IFSOCK => FileKind::Socket,
            _ => return None,
        })
    }
}

/// A point in time with nanoseconds; seconds are signed 64-bit, so times before 1970 and
/// after 2038 are kept exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timespec {
    pub sec: i64,
    pub nsec: u32,
}

impl Timespec {
    /// The current time as the kernel stamps files: its coarse clock (CLOCK_REALTIME_COARSE,
    /// one tick of resolution), the clock of `current_time()` in local filesystems and of
    /// the times the FUSE writeback cache keeps. A file created and written within one tick
    /// then has the times the kernel would give it, and the kernel has nothing to flush.
    #[allow(unsafe_code)]
    pub fn now() -> Timespec {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes one `timespec` through a valid, exclusive pointer.
        if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) } == 0 {
            return Timespec {
                sec: ts.tv_sec,
                nsec: ts.tv_nsec as u32,
            };
        }
        // A kernel without the coarse clock: the precise one.
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timespec {
            sec: d.as_secs() as i64,
            nsec: d.subsec_nanos(),
        }
    }
}

/// What `getattr` reports (the fields of `struct stat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    pub ino: Ino,
    pub kind: FileKind,
    /// Permission bits including set-uid, set-gid and sticky (`mode & 0o7777`).
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    /// Bytes (for a symlink: the target's length; for a directory: its entry count).
    pub size: u64,
    /// Space used, in 512-byte units: for a regular file, what its data blocks hold before
    /// compression (holes count nothing; a block counts up to its last non-zero byte).
    pub blocks: u64,
    /// Preferred I/O size: the file's record size.
    pub blksize: u32,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    pub crtime: Timespec,
    /// Bumped when an inode number is reused (NFS file handles need it).
    pub generation: u64,
}

impl Attr {
    /// `st_mode`: kind bits and permission bits.
    pub fn mode(&self) -> u32 {
        self.kind.mode_bits() | u32::from(self.perm)
    }
}

/// Who is asking: the caller's user, primary group and supplementary groups. uid 0 is root
/// and passes every permission check (except execute on a file with no execute bit).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Cred {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

impl Cred {
    pub fn root() -> Cred {
        Cred::default()
    }

    pub fn user(uid: u32, gid: u32) -> Cred {
        Cred {
            uid,
            gid,
            groups: Vec::new(),
        }
    }

    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// How to set a timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeSet {
    Now,
    At(Timespec),
}

/// A `setattr` request; fields left `None` are unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SetAttr {
    /// Permission bits (`& 0o7777`; the kind bits are ignored).
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// Truncate or extend.
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
}

/// One directory entry from `readdir`. `cookie` is where the next `readdir` call resumes
/// (stable while entries are added and removed, as POSIX asks of telldir/seekdir).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub ino: Ino,
    pub kind: FileKind,
    pub cookie: u64,
}

/// `rename` flags (renameat2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RenameFlags {
    /// RENAME_NOREPLACE: fail with EEXIST if the target exists.
    pub noreplace: bool,
    /// RENAME_EXCHANGE: swap the two names atomically.
    pub exchange: bool,
}

/// `setxattr` flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum XattrMode {
    #[default]
    Any,
    /// XATTR_CREATE: fail with EEXIST if it exists.
    Create,
    /// XATTR_REPLACE: fail with ENODATA if it does not.
    Replace,
}

/// What `statfs` reports, in `bsize` units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatFs {
    pub bsize: u32,
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub namelen: u32,
}

/// `sync` property: when writes are made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum SyncMode {
    /// fsync and O_SYNC wait for durability; plain writes are committed with the txg.
    #[default]
    Standard,
    /// Every write is durable when it returns.
    Always,
    /// fsync returns at once (unsafe: acknowledged data can be lost in a crash).
    Disabled,
}

/// `direct` property (OpenZFS's Direct I/O): which reads and writes bypass the caches.
/// Over FUSE the kernel's page cache is the first cache, the ARC the second.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DirectMode {
    /// O_DIRECT is honoured: the kernel sends such I/O past its page cache, and the data
    /// blocks it reads whole are not kept in the ARC (cached copies are still used; a
    /// block read in part is kept, as the rest of it is likely read next).
    #[default]
    Standard,
    /// Every open of a regular file is direct, as if opened with O_DIRECT.
    Always,
    /// O_DIRECT reads are cached in the ARC like any other. (The kernel still skips its
    /// own page cache for an O_DIRECT open: FUSE gives the server no say in that.)
    Disabled,
}

impl DirectMode {
    /// Whether I/O on a file opened with `open_flags` is direct.
    pub fn applies(self, open_flags: i32) -> bool {
        match self {
            Self::Always => true,
            Self::Standard => open_flags & libc::O_DIRECT != 0,
            Self::Disabled => false,
        }
    }
}

/// What the POSIX layer asks of the dataset it lives in: its properties and its space.
/// The dataset layer implements it; tests implement it with fixed values.
pub trait DatasetHooks: Send + Sync {
    /// Record size for files created from now on (a power of two, 512 B to 1 MiB).
    fn recordsize(&self) -> u32;
    /// Refuse every change with EROFS (the `readonly` property, and every snapshot).
    fn readonly(&self) -> bool;
    /// Update access times on read (the `atime` property).
    fn atime(&self) -> bool;
    fn sync_mode(&self) -> SyncMode;
    /// The `direct` property (read at each open).
    fn direct(&self) -> DirectMode {
        DirectMode::Standard
    }
    /// Called before a change that may allocate up to `bytes` more: Err(EDQUOT) past a
    /// quota, Err(ENOSPC) when the pool (or the reservations of others) leave no room.
    fn check_space(&self, bytes: u64) -> Result<()>;
    /// (total, available) bytes for statfs, quota-limited.
    fn space(&self) -> (u64, u64);
    /// Bytes the dataset references (for statfs "used").
    fn referenced(&self) -> u64;
}

/// Fixed hooks: no quota, writable, for tests and tools.
#[derive(Debug, Clone)]
pub struct FixedHooks {
    pub recordsize: u32,
    pub readonly: bool,
    pub atime: bool,
    pub sync_mode: SyncMode,
    /// Bytes the filesystem may hold (EDQUOT past them); `u64::MAX` for none.
    pub quota: u64,
}

impl Default for FixedHooks {
    fn default() -> Self {
        Self {
            recordsize: 128 << 10,
            readonly: false,
            atime: true,
            sync_mode: SyncMode::Standard,
            quota: u64::MAX,
        }
    }
}

impl DatasetHooks for FixedHooks {
    fn recordsize(&self) -> u32 {
        self.recordsize
    }
    fn readonly(&self) -> bool {
        self.readonly
    }
    fn atime(&self) -> bool {
        self.atime
    }
    fn sync_mode(&self) -> SyncMode {
        self.sync_mode
    }
    fn check_space(&self, _bytes: u64) -> Result<()> {
        Ok(())
    }
    fn space(&self) -> (u64, u64) {
        (self.quota, self.quota)
    }
    fn referenced(&self) -> u64 {
        0
    }
}
