//! Datasets (ZFS's dsl, zpl and zvol): filesystems and volumes in a hierarchy with inherited
//! properties, snapshots and clones, and the POSIX layer the front ends serve.
//!
//! # Theory of operation
//! `posix` is the filesystem on one object set; `errno` is its error type.

pub mod errno;
pub mod posix;

pub use errno::Errno;
