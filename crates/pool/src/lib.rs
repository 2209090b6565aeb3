//! The storage pool (ZFS's spa, txg and uberblock layers): configuration and labels, import and
//! export, transaction groups, the space map log and the pool history.
//!
//! # Theory of operation
//! A [`Pool`] owns its top-level vdevs and a [`tank_block::BlockStore`]. Everything above it
//! (object sets) changes state only inside a transaction ([`Pool::begin_tx`]) of the open txg.
//! A sync thread moves txgs through open → quiescing → syncing: it waits for the open txg's
//! transactions to finish (quiesce), lets the registered [`Syncer`] write that txg's dirty
//! state while the next txg fills, then commits (`commit.rs`): objset table, history, space
//! map log and root block, flush, uberblock into every label ring, flush.
//!
//! # Invariants
//! - A txg is durable exactly when its uberblock is on stable storage; import picks the newest
//!   uberblock whose metadata verifies (never a mix of txgs).
//! - Blocks freed in txg t are not reused before txg t + DEFER_TXGS, so the last DEFER_TXGS
//!   uberblocks stay valid for `import -F`.
//! - After a failed write or flush that leaves a vdev without full data, the pool suspends:
//!   every later operation fails until it is exported and imported again.

pub mod commit;
pub mod config;
#[doc(hidden)]
pub mod fuzz;
pub mod history;
pub mod label;
pub mod mmp;
pub mod pool;
pub mod spec;
pub mod txg;
pub mod zil;

pub use config::{HostIdentity, PoolConfig, PoolState, TopKind, VdevClass, FORMAT_VERSION};
pub use history::HistoryRecord;
pub use mmp::MmpTunables;
pub use pool::{
    fmt_time, validate_pool_name, CreateOptions, ImportCandidate, ImportOptions, Pool, PoolSpace,
    PoolStatus, RootBlockInfo, SyncContext, Syncer, VdevStatus, WriteThrottle,
};
pub use spec::{PoolSpec, VdevSpec};
pub use tank_vdev::SlowIoPolicy;
pub use txg::{Tx, TxgTunables};
pub use zil::{LogEntry, LogError, LogStats};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    #[error("{0}")]
    InvalidSpec(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    Import(String),
    #[error("out of space in pool '{0}'")]
    NoSpace(String),
    #[error("pool '{pool}' is suspended after an I/O failure it could not repair: {reason}. Export and import the pool once the devices are fixed")]
    Suspended { pool: String, reason: String },
    /// The multihost heartbeat stopped reaching the devices (`mmp.rs`).
    #[error("{0}")]
    Multihost(String),
    #[error("corrupt pool metadata: {0}")]
    Corrupt(String),
    #[error(transparent)]
    Block(#[from] tank_block::BlockError),
    #[error(transparent)]
    Device(#[from] tank_device::DeviceError),
    #[error(transparent)]
    Vdev(#[from] tank_vdev::VdevError),
}

impl PoolError {
    /// The errno a POSIX front end reports for this error.
    pub fn errno(&self) -> i32 {
        match self {
            Self::NoSpace(_) | Self::Block(tank_block::BlockError::NoSpace) => 28, // ENOSPC
            Self::InvalidArgument(_) | Self::InvalidSpec(_) => 22,                 // EINVAL
            _ => 5,                                                                // EIO
        }
    }
}
