//! The POSIX layer (ZFS's zpl): inodes, directories, symlinks, hard links, extended
//! attributes and permissions on one object set. `types.rs` is the API's vocabulary,
//! `fs.rs` the filesystem. See each file's theory of operation.

pub mod fs;
pub mod types;

pub use fs::Fs;
pub use types::*;
