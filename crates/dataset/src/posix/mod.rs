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

pub use fs::Fs;
pub use types::*;
