//! The POSIX layer (ZFS's zpl): inodes, directories, symlinks, hard links, extended
//! attributes and permissions on one object set. `types.rs` is the API's vocabulary,
//! `fs.rs` the filesystem (with `dir.rs`, `xattr.rs`, `inode.rs`, `perm.rs` and the on-disk
//! format in `format.rs`). See each file's theory of operation.

mod dir;
mod format;
pub mod fs;
mod inode;
mod perm;
pub mod types;
mod xattr;

pub use fs::Fs;
pub use types::*;
