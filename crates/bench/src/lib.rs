//! Measuring and planning: device profiles and their emulation, and the layout advisor
//! (`tank plan`).
//!
//! # Theory of operation
//! `profile.rs` describes disks by the figures that matter (bandwidth, seek, rotation, IOPS,
//! queue depth, capacity, MTTF, URE rate) and turns a profile into a timing model for
//! `tank_device::EmulatedDevice`. `plan.rs` turns a set of disks into candidate layouts with
//! capacity (the engine's own RAID-Z allocation rule), reliability and expected speed, and
//! recommends one for a workload. `fsbench.rs` is the bonnie++-style benchmark of a
//! directory, paced by a network link of `link.rs` when one is given; `emulate.rs` is the
//! grammar of emulated builds. `api.rs` measures the management API's latency over HTTPS
//! against the local socket, and the daemon's memory (`tank bench-api`). `nfs_client.rs` is
//! the NFSv3 client of `tank bench-nfs` (and of the NFS tests).

pub mod api;
pub mod console;
pub mod emulate;
pub mod fsbench;
pub mod link;
pub mod nfs_client;
pub mod plan;
pub mod profile;
pub mod run;
pub mod s3_client;

pub use plan::{Assessment, Layout, PlanInput, VdevType, Workload};
pub use profile::{DeviceProfile, DiskKind, HddModel, SsdModel};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    #[error("{0}")]
    Invalid(String),
}
