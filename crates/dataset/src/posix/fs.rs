//! The POSIX filesystem on one object set (ZFS's zpl). API placeholder: every call answers
//! ENOSYS until the implementation lands.

use std::ffi::OsStr;
use std::sync::Arc;

use tank_object::{ObjectSet, ObjectStore};

use super::types::*;
use crate::errno::Errno;

/// One mounted filesystem: an object set seen as directories and files.
pub struct Fs {
    #[allow(dead_code)]
    store: Arc<ObjectStore>,
    #[allow(dead_code)]
    objset: Arc<ObjectSet>,
    #[allow(dead_code)]
    hooks: Arc<dyn DatasetHooks>,
}

impl Fs {
    /// Opens the filesystem in `objset`; an empty object set is formatted first (root
    /// directory owned by `root_owner`, mode 0755). Files left unlinked-but-open by a crash
    /// are freed here.
    pub fn mount(
        store: Arc<ObjectStore>,
        objset: Arc<ObjectSet>,
        hooks: Arc<dyn DatasetHooks>,
        _root_owner: (u32, u32),
    ) -> Result<Arc<Fs>> {
        Ok(Arc::new(Fs {
            store,
            objset,
            hooks,
        }))
    }
    pub fn getattr(&self, _ino: Ino) -> Result<Attr> {
        Err(Errno::ENOSYS)
    }
    pub fn lookup(&self, _cred: &Cred, _parent: Ino, _name: &OsStr) -> Result<Attr> {
        Err(Errno::ENOSYS)
    }
    pub fn setattr(&self, _cred: &Cred, _ino: Ino, _set: &SetAttr) -> Result<Attr> {
        Err(Errno::ENOSYS)
    }
    /// Creates a node of any kind; `mode` carries the kind bits and the permission bits
    /// (already masked by the caller's umask).
    pub fn mknod(
        &self,
        _cred: &Cred,
        _parent: Ino,
        _name: &OsStr,
        _mode: u32,
        _rdev: u32,
    ) -> Result<Attr> {
        Err(Errno::ENOSYS)
    }
    pub fn mkdir(&self, _cred: &Cred, _parent: Ino, _name: &OsStr, _mode: u32) -> Result<Attr> {
        Err(Errno::ENOSYS)
    }
    pub fn symlink(
        &self,
        _cred: &Cred,
        _parent: Ino,
        _name: &OsStr,
        _target: &OsStr,
    ) -> Result<Attr> {
        Err(Errno::ENOSYS)
    }
    pub fn readlink(&self, _ino: Ino) -> Result<Vec<u8>> {
        Err(Errno::ENOSYS)
    }
    pub fn link(&self, _cred: &Cred, _ino: Ino, _newparent: Ino, _newname: &OsStr) -> Result<Attr> {
        Err(Errno::ENOSYS)
    }
    pub fn unlink(&self, _cred: &Cred, _parent: Ino, _name: &OsStr) -> Result<()> {
        Err(Errno::ENOSYS)
    }
    pub fn rmdir(&self, _cred: &Cred, _parent: Ino, _name: &OsStr) -> Result<()> {
        Err(Errno::ENOSYS)
    }
    pub fn rename(
        &self,
        _cred: &Cred,
        _parent: Ino,
        _name: &OsStr,
        _newparent: Ino,
        _newname: &OsStr,
        _flags: RenameFlags,
    ) -> Result<()> {
        Err(Errno::ENOSYS)
    }
    /// Checks `access(2)`-style permission (`mask` of R_OK/W_OK/X_OK, or F_OK).
    pub fn access(&self, _cred: &Cred, _ino: Ino, _mask: i32) -> Result<()> {
        Err(Errno::ENOSYS)
    }
    /// Opens a file or directory (permission check for `flags`' access mode); the inode
    /// stays allocated until the matching `release`, even if unlinked meanwhile.
    pub fn open(&self, _cred: &Cred, _ino: Ino, _flags: i32) -> Result<()> {
        Err(Errno::ENOSYS)
    }
    pub fn release(&self, _ino: Ino) -> Result<()> {
        Err(Errno::ENOSYS)
    }
    pub fn read(&self, _ino: Ino, _offset: u64, _size: u32) -> Result<Vec<u8>> {
        Err(Errno::ENOSYS)
    }
    /// Writes at `offset` (at the end of the file when `append`); returns bytes written.
    pub fn write(
        &self,
        _cred: &Cred,
        _ino: Ino,
        _offset: u64,
        _data: &[u8],
        _append: bool,
    ) -> Result<u32> {
        Err(Errno::ENOSYS)
    }
    /// Durable when it returns (unless `sync=disabled`).
    pub fn fsync(&self, _ino: Ino, _datasync: bool) -> Result<()> {
        Err(Errno::ENOSYS)
    }
    /// `mode` 0 allocates (extends the size unless FALLOC_FL_KEEP_SIZE);
    /// FALLOC_FL_PUNCH_HOLE|KEEP_SIZE frees the range; others EOPNOTSUPP.
    pub fn fallocate(
        &self,
        _cred: &Cred,
        _ino: Ino,
        _offset: u64,
        _len: u64,
        _mode: i32,
    ) -> Result<()> {
        Err(Errno::ENOSYS)
    }
    /// Entries after `cookie` (0 = from the start, "." and ".." first), at most `max`.
    pub fn readdir(
        &self,
        _cred: &Cred,
        _ino: Ino,
        _cookie: u64,
        _max: usize,
    ) -> Result<Vec<DirEntry>> {
        Err(Errno::ENOSYS)
    }
    pub fn statfs(&self) -> Result<StatFs> {
        Err(Errno::ENOSYS)
    }
    pub fn setxattr(
        &self,
        _cred: &Cred,
        _ino: Ino,
        _name: &OsStr,
        _value: &[u8],
        _mode: XattrMode,
    ) -> Result<()> {
        Err(Errno::ENOSYS)
    }
    pub fn getxattr(&self, _cred: &Cred, _ino: Ino, _name: &OsStr) -> Result<Vec<u8>> {
        Err(Errno::ENOSYS)
    }
    pub fn listxattr(&self, _cred: &Cred, _ino: Ino) -> Result<Vec<Vec<u8>>> {
        Err(Errno::ENOSYS)
    }
    pub fn removexattr(&self, _cred: &Cred, _ino: Ino, _name: &OsStr) -> Result<()> {
        Err(Errno::ENOSYS)
    }
    /// Makes everything written so far durable (a txg sync), e.g. before unmount.
    pub fn sync_all(&self) -> Result<()> {
        Err(Errno::ENOSYS)
    }
}
