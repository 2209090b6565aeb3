//! The FUSE front end: serves a dataset's POSIX layer (`tank_dataset::posix::Fs`) to the
//! local kernel.
//!
//! # Theory of operation
//! `mount` mounts a filesystem with our own mount(2) call on /dev/fuse (as root; no libfuse,
//! no fusermount) and serves it with the `fuser` crate on a multi-threaded session: one
//! reader per CPU (at least 2), each on its own cloned /dev/fuse descriptor. Requests are
//! mapped onto `Fs` one to one (`server.rs`), errors go on the wire as the errnos `Fs`
//! returns. Reads and writes of up to 1 MiB pass through in one request, with no copy
//! beyond the one fuser makes of the kernel's buffer.
//!
//! Where the kernel offers FUSE over io_uring (Linux 6.14+, module parameter
//! `enable_uring`), requests come instead through per-CPU rings served by a thread pinned
//! to each CPU (`ring.rs`), so a caller and the thread serving it share a CPU; fuser's
//! readers stay for what the kernel still sends through /dev/fuse.
//!
//! The root of the mount holds a virtual, read-only `.tank` directory, hidden from
//! `readdir` (as ZFS's `.zfs` with `snapdir=hidden`) but reachable by name. Its
//! `snapshot/` lists the snapshots a `SnapshotSource` offers; `.tank/snapshot/<name>/` is
//! the root of that snapshot's `Fs`, opened on first use and refused any change (EROFS).
//! The inode numbers of all these filesystems share the mount's node id space
//! (`nodes.rs`: 16 bits of filesystem slot above 48 bits of inode number).
//!
//! Modules: `options` (MountOptions, MountError), `mount` (mount(2), the session thread,
//! unmount), `server` (the operations), `ring` (the io_uring transport), `nodes` (node ids, snapshot slots), `cred`
//! (caller credentials with supplementary groups), `attr` (conversions).

mod attr;
mod cred;
mod mount;
mod mounter;
mod nodes;
mod options;
mod ring;
mod server;

use std::sync::Arc;

use tank_dataset::posix::Fs;

pub use mount::{mount, unmount, MountHandle, Unmounter, FS_TYPE, FUSE_DEVICE, READAHEAD_KB};
pub use mounter::FuseMounter;
pub use nodes::{INO_BITS, SNAPSHOT_SLOTS};
pub use options::{MountError, MountOptions, WritebackCache};
pub use ring::{enable_kernel_io_uring, kernel_offers as io_uring_offered};
pub use server::{CONTROL_NAME, SNAPSHOT_DIR_NAME};

/// The snapshots of the mounted dataset, as `.tank/snapshot` shows them.
/// Something told of every request a mount serves (the service's metrics).
pub trait RequestObserver: Send + Sync + std::fmt::Debug {
    /// `op` is the FUSE operation (`lookup`, `read`, ...); `took`, its handler's time;
    /// `failed`, whether it was answered with an error (a request a ring worker answers
    /// later counts as its hand-over did).
    fn observe(&self, op: &'static str, took: std::time::Duration, failed: bool);
}

pub trait SnapshotSource: Send + Sync {
    /// Names of the snapshots that exist now.
    fn list(&self) -> Vec<String>;
    /// The filesystem of snapshot `name` (read-only), or `None` if there is no such
    /// snapshot. Called when the snapshot is first used; the mount keeps it open while the
    /// kernel references any of its files.
    fn open(&self, name: &str) -> Option<Arc<Fs>>;
}
