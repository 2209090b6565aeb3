//! Blocks: block pointers, checksums, compression, allocation and the I/O pipeline (ZFS's zio
//! and metaslab layers).
//!
//! # Theory of operation
//! A write goes compress → checksum → allocate (one DVA per copy, on distinct top-level vdevs
//! where there are several) → queue to the vdevs. A read goes read → verify against the parent's
//! checksum → (heal inside the vdev, or from another copy) → decompress. Nothing read from a
//! device is used before it verifies.
//!
//! See `blkptr.rs` for the 128-byte pointer, `alloc.rs` for space, `zio.rs` for the pipeline,
//! `gang.rs` for the header of a block written as pieces.

pub mod alloc;
pub mod blkptr;
pub mod checksum;
pub mod compress;
#[doc(hidden)]
pub mod fuzz;
mod gang;
pub mod zio;

pub use alloc::{AllocClass, SpaceAllocator, SpaceOp, SpaceRecord, DEFER_TXGS};
pub use blkptr::{BlockKind, BlockPtr, Dva, BLKPTR_SIZE};
pub use checksum::ChecksumKind;
pub use compress::Compression;
pub use zio::{BlockStore, PendingBlock, ScrubOutcome, WriteProps};

/// The largest block, logical or physical, the block layer writes or reads (256 MiB): a
/// pointer naming more is damaged, and nothing sized from it is allocated. Datasets'
/// records are at most 16 MiB; only a space map log block of a txg that frees millions of
/// blocks comes near.
pub const MAX_BLOCK_BYTES: usize = 256 << 20;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BlockError {
    #[error("corrupt on-disk structure: {0}")]
    Decode(String),
    #[error("decompression failed: {0}")]
    Decompress(String),
    #[error("{0}")]
    InvalidProperty(String),
    #[error("space map inconsistency: {0}")]
    SpaceMap(String),
    #[error("out of space")]
    NoSpace,
    #[error("checksum mismatch, no good copy: {bp}")]
    Checksum { bp: String },
    #[error("block pointer names unknown vdev {0}")]
    UnknownVdev(u32),
    #[error(transparent)]
    Vdev(#[from] tank_vdev::VdevError),
    #[error("write failed beyond the redundancy of vdev {0}")]
    WriteFailed(u32),
}
