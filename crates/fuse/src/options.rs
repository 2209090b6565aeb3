//! Mount options and the errors of mounting and unmounting.
//!
//! # Theory of operation
//! `MountOptions` is plain data with ZFS-like defaults for a FUSE mount owned by root:
//! everyone may use the mount (`allow_other`; permissions are checked by `Fs` with each
//! caller's credentials), set-uid and device files are not honoured unless asked, the
//! kernel's writeback cache is on unless the dataset's `sync` property is `always`.
//! `MountError` says what went wrong in words an operator can act on.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use tank_dataset::posix::SyncMode;
use tank_dataset::Errno;

/// Whether the kernel may buffer writes in its page cache (FUSE_WRITEBACK_CACHE).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WritebackCache {
    /// On, unless `sync` is `Always` (every write must reach `Fs` before `write(2)` returns).
    #[default]
    Auto,
    On,
    Off,
}

#[derive(Debug, Clone)]
pub struct MountOptions {
    /// The dataset's name: `mount` and `df` show the filesystem as `tank:<name>`.
    pub name: String,
    /// The dataset's `sync` property (decides `WritebackCache::Auto`).
    pub sync: SyncMode,
    pub writeback_cache: WritebackCache,
    /// Threads reading the kernel's queue; `None` = one per CPU, at least 2.
    pub threads: Option<usize>,
    /// Take requests through the kernel's per-CPU io_uring queues when it offers them
    /// (Linux 6.14+ with `/sys/module/fuse/parameters/enable_uring` on).
    pub io_uring: bool,
    /// Over io_uring, serve long requests (reads and writes of 128 KiB or more, fsyncs) on
    /// workers, so that they do not hold back the other requests of their CPU (ring.rs).
    /// Off only to measure what the workers buy.
    pub ring_workers: bool,
    /// How long the kernel may cache names and attributes of the live filesystem. Every
    /// change made through this mount invalidates what it changes; the TTL bounds how long
    /// a change made past the mount (another front end on the same dataset) stays unseen.
    pub attr_ttl: Duration,
    /// The same for snapshots, which never change.
    pub snapshot_ttl: Duration,
    /// Let every user use the mount (the permissions are then those the files say).
    pub allow_other: bool,
    /// Mount read-only (the `readonly` property): every change fails with EROFS.
    pub read_only: bool,
    /// Honour set-uid and set-gid bits when executing (the `setuid` property).
    pub setuid: bool,
    /// Honour device files (the `devices` property).
    pub devices: bool,
    /// Allow executing files (the `exec` property).
    pub exec: bool,
    /// Told of every request and how long it took (the service's per-protocol metrics).
    pub observer: Option<std::sync::Arc<dyn crate::RequestObserver>>,
    /// The process group (a file server's) whose writable opens bypass the writeback
    /// cache, so that a write's failure is the write's own error (`WriteThrough`).
    pub write_through: Option<std::sync::Arc<tank_service::mounts::WriteThrough>>,
}

impl MountOptions {
    pub fn new(name: impl Into<String>) -> MountOptions {
        MountOptions {
            name: name.into(),
            sync: SyncMode::Standard,
            writeback_cache: WritebackCache::Auto,
            threads: None,
            io_uring: true,
            ring_workers: true,
            attr_ttl: Duration::from_secs(1),
            snapshot_ttl: Duration::from_secs(3600),
            allow_other: true,
            read_only: false,
            setuid: false,
            devices: false,
            exec: true,
            observer: None,
            write_through: None,
        }
    }

    /// Whether the writeback cache is asked of the kernel.
    pub fn wants_writeback(&self) -> bool {
        match self.writeback_cache {
            WritebackCache::Auto => self.sync != SyncMode::Always,
            WritebackCache::On => true,
            WritebackCache::Off => false,
        }
    }

    /// Session threads.
    pub fn thread_count(&self) -> usize {
        self.threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
            .max(2)
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MountError {
    /// The kernel's FUSE device cannot be used.
    #[error("FUSE is not available: {0}")]
    FuseUnavailable(String),
    /// This process may not mount.
    #[error("cannot mount {dir}: not permitted ({detail}); mounting needs root (CAP_SYS_ADMIN): run tank as root, or in a container add --cap-add SYS_ADMIN and --device /dev/fuse")]
    NotPermitted { dir: PathBuf, detail: String },
    #[error("cannot mount on {0}: no such directory (create it first)")]
    MountPointMissing(PathBuf),
    #[error("cannot mount on {0}: not a directory")]
    NotADirectory(PathBuf),
    #[error("cannot mount on {dir}: already mounted ({what}); unmount it first")]
    AlreadyMounted { dir: PathBuf, what: String },
    #[error("{0} is not mounted")]
    NotMounted(PathBuf),
    #[error("{dir} is not a FUSE mount ({what}); refusing to unmount it")]
    NotFuse { dir: PathBuf, what: String },
    #[error(
        "cannot unmount {0}: busy (files are open or a process has its working directory there)"
    )]
    Busy(PathBuf),
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    /// The FUSE session ended with an error.
    #[error("FUSE session on {dir}: {source}")]
    Session { dir: PathBuf, source: io::Error },
    /// Syncing the filesystem at unmount failed: data written may not be durable.
    #[error("sync of {dir} at unmount failed: {errno}")]
    Sync { dir: PathBuf, errno: Errno },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writeback_follows_the_sync_property_unless_forced() {
        let mut o = MountOptions::new("p/fs");
        assert!(o.wants_writeback());
        o.sync = SyncMode::Always;
        assert!(!o.wants_writeback());
        o.writeback_cache = WritebackCache::On;
        assert!(o.wants_writeback());
        o.sync = SyncMode::Disabled;
        o.writeback_cache = WritebackCache::Off;
        assert!(!o.wants_writeback());
    }

    #[test]
    fn at_least_two_threads() {
        let mut o = MountOptions::new("p/fs");
        assert!(o.thread_count() >= 2);
        o.threads = Some(1);
        assert_eq!(o.thread_count(), 2);
        o.threads = Some(8);
        assert_eq!(o.thread_count(), 8);
    }
}
