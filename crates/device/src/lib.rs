//! Leaf I/O: the `BlockDevice` trait and its implementations.
//!
//! # Theory of operation
//! Every byte tank stores goes through a `BlockDevice`: a flat, fixed-size array of bytes with
//! positional reads and writes, a `flush` that makes every completed write durable, and an
//! optional `trim`. The trait is deliberately narrow (no queues, no async) so that a remote
//! device, an emulated disk or a fault-injecting simulator is just another implementation.
//!
//! Implementations:
//! - [`FileDevice`]: a regular file or a block device, through pread/pwrite, optionally O_DIRECT.
//! - [`MemDevice`]: bytes in RAM, for tests and as a crash image.
//! - [`SimDevice`]: a seeded, deterministic fault-injecting device (read/write errors, bit rot,
//!   misdirected, lost and torn writes; a crash that drops or reorders unflushed writes).
//! - [`EmulatedDevice`]: wraps any device with a [`TimingModel`] (HDD/SSD emulation seam).
//!
//! # Failure model
//! Devices report errors; they never panic on I/O. Callers treat every byte read as untrusted:
//! integrity is checked above this layer (block checksums).
//!
//! # Concurrency
//! All methods take `&self`; implementations are `Send + Sync` and may be shared through
//! `Arc<dyn BlockDevice>` by the per-device I/O workers of the vdev layer.

mod emulated;
mod file;
mod iobuf;
mod mem;
mod sim;

pub use emulated::{EmulatedDevice, IoKind, NullTiming, Timeline, TimingModel};
pub use file::{create_sparse_file, FileDevice, FileDeviceOptions};
pub use iobuf::{recycle_limit, IoBuf, IoRef, IO_ALIGN};
pub use mem::MemDevice;
pub use sim::{CrashMode, FaultConfig, SimDevice, SimFleet, SimStats};

use std::fmt;
use std::sync::Arc;

/// Errors of the leaf I/O layer. `dev` is the device's display name (its path for files).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    #[error("{dev}: I/O error at offset {offset}: {source}")]
    Io {
        dev: String,
        offset: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("{dev}: access of {len} bytes at offset {offset} is beyond the device size {size}")]
    OutOfRange {
        dev: String,
        offset: u64,
        len: u64,
        size: u64,
    },
    #[error("{dev}: cannot open: {source}")]
    Open {
        dev: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{dev}: {what}")]
    Invalid { dev: String, what: String },
    /// A fault injected by `SimDevice` (or a device that stopped answering after a crash).
    #[error("{dev}: injected fault: {what}")]
    Injected { dev: String, what: &'static str },
}

pub type Result<T, E = DeviceError> = std::result::Result<T, E>;

/// A flat array of bytes with positional I/O. See the module documentation.
pub trait BlockDevice: Send + Sync + fmt::Debug {
    /// Reads exactly `buf.len()` bytes at `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()>;
    /// Reads exactly `len` bytes at `offset` into a new buffer. The default fills a `Vec`
    /// with zeros and reads into it; a device that can read into memory not yet written
    /// skips the fill (a memset of every byte read).
    fn read_vec(&self, len: usize, offset: u64) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        self.read_at(&mut buf, offset)?;
        Ok(buf)
    }
    /// Writes all of `buf` at `offset`. The data is durable only after a later `flush`.
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()>;
    /// Writes `bufs` one after another from `offset`, as one request where the device can
    /// (the vdev layer's joined writes). The default joins them into one buffer.
    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> Result<()> {
        if let [one] = bufs {
            return self.write_at(one, offset);
        }
        self.write_at(&bufs.concat(), offset)
    }
    /// Makes every write that completed before this call durable.
    fn flush(&self) -> Result<()>;
    /// Size in bytes.
    fn size(&self) -> u64;
    /// Tells the device that a range holds no data any more. Advisory: may do nothing.
    fn trim(&self, _offset: u64, _len: u64) -> Result<()> {
        Ok(())
    }
    /// How many requests the device serves well at once (its useful queue depth); the vdev
    /// layer runs that many readers for it. One for a disk with a single actuator.
    fn queue_depth(&self) -> usize {
        4
    }
    /// Whether the vdev layer may join writes adjacent on the device into one (up to 1 MiB).
    /// The crash simulator says no, so that a crash can fall between any two of the
    /// writes the layers above issued, as on a disk that persists them one by one.
    fn joins_writes(&self) -> bool {
        true
    }
    /// Display name (the path for file devices).
    fn name(&self) -> &str;
    /// Drops what this host caches of `[offset, +len)`, so that the next read sees what
    /// another host may have written to a shared device since (the multihost activity
    /// check watches for that). Devices that cache nothing do nothing.
    fn forget_cached(&self, _offset: u64, _len: u64) {}
}

pub type DeviceRef = Arc<dyn BlockDevice>;

/// Checks that `[offset, offset + len)` lies inside a device of `size` bytes.
pub fn check_range(dev: &str, offset: u64, len: usize, size: u64) -> Result<()> {
    let len = len as u64;
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(DeviceError::OutOfRange {
            dev: dev.to_string(),
            offset,
            len,
            size,
        }),
    }
}
