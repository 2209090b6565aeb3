//! Datasets (ZFS's dsl, zpl and zvol): filesystems and volumes in a hierarchy with inherited
//! properties, snapshots and clones, and the POSIX layer the front ends serve.
//!
//! # Theory of operation
//! - `dsl.rs`: the dataset directory in the meta object set, sync tasks (create, destroy,
//!   snapshot, clone, rollback, rename, set), block lifetimes with deadlists, accounting.
//! - `props.rs`: every property, its parsing, defaults and inheritance.
//! - `posix/`: the filesystem on one object set; `hooks.rs` feeds it the dataset's
//!   properties and space.
//! - `zvol.rs`: volumes.
//! - `autosnap.rs`: snapshot schedules with retention (what is due, what has aged out).
//! - `stream.rs`, `send.rs`, `recv.rs` (and `dsl/sendrecv.rs`): send streams, bookmarks and
//!   receive.
//! - `scan.rs`: the snapshot trees the scrub walks, and names for its error log.
//! - `errno.rs`: the POSIX error type.

pub mod autosnap;
pub mod dsl;
pub mod errno;
#[doc(hidden)]
pub mod fuzz;
pub mod hooks;
pub mod posix;
pub mod props;
pub mod recv;
pub mod scan;
pub mod send;
pub mod stream;
pub mod zvol;

pub use dsl::{DatasetInfo, DatasetKind, Dsl, DslError, Op, Record, Share};
pub use errno::Errno;
pub use hooks::DsHooks;
pub use scan::{error_name, SnapshotRoots, SNAPSHOT_TREE_BASE};
pub use zvol::Volume;
