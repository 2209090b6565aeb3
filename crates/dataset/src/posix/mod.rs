//! The POSIX layer (ZFS's zpl): inodes, directories, symlinks, hard links, extended
//! attributes and permissions on one object set. `types.rs` is the API's vocabulary,
//! `fs.rs` the filesystem (with `dir.rs`, `xattr.rs`, `inode.rs`, `perm.rs` and the on-disk
//! format in `format.rs`). `paths.rs` names inodes for reports without mounting. See each
//! file's theory of operation.

mod dir;
mod format;
pub mod fs;
mod inode;
pub mod paths;
mod perm;
pub mod types;
mod xattr;

/// For the fuzz target: the POSIX layer's on-disk records (inode, directory entry, xattr
/// header) from arbitrary bytes.
pub(crate) fn fuzz_records(data: &[u8]) {
    let _ = format::Inode::decode(data);
    let _ = format::decode_dirent(data);
    let _ = format::decode_xattr_head(data);
}

pub use fs::{DataVersions, Fs};
pub use types::*;
