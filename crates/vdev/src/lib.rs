//! Virtual devices: leaves with their queues, states and counters; top-level vdevs (disk,
//! mirror, RAID-Z1/2/3) with self-healing reads; the RAID-Z layout and parity code.
//!
//! # Theory of operation
//! `events.rs` is the pool's event log the leaves post to.
//! `leaf.rs` owns one device each (per-device I/O worker, READ/WRITE/CKSUM counters, state).
//! `tree.rs` maps a top-level vdev's address space onto its leaves and heals on read.
//! `raidz.rs` is the variable-width RAID-Z layout (ZFS's map), `codec.rs` the SIMD parity
//! code and the checksum-guided reconstruction, `scalar.rs` the golden scalar reference.

pub mod codec;
pub mod events;
pub mod leaf;
pub mod raidz;
pub mod scalar;
pub mod tree;

pub use codec::ParityCodec;
pub use events::{Event, EventLog};
pub use leaf::{
    aligned_size, label_offsets, usable_size, IoBatch, IoClass, LatencyHistogram, Leaf,
    LeafStatsSnapshot, SlowIoPolicy, VdevState, BACK_RESERVE, FRONT_RESERVE, LABEL_SIZE,
    LATENCY_BUCKETS, MIN_DEVICE_SIZE,
};
pub use raidz::{RaidzError, RaidzGeometry};
pub use tree::{Fix, Layout, PendingRead, ReadReport, ScrubRead, TopVdev, VdevError};
