//! Objects (ZFS's dmu): object sets of objects with copy-on-write block trees.
//!
//! # Theory of operation
//! `tree.rs` is the generic copy-on-write B+tree (one per object set), `objset.rs` maps
//! objects and their blocks onto it, `store.rs` ties the object sets of a pool to its txgs,
//! `scan.rs` is the scrub that walks them all.
//! This is the API the datasets layer builds on.

pub mod arc;
pub mod cache;
#[doc(hidden)]
pub mod fuzz;
pub mod health;
pub mod l2arc;
pub mod objset;
pub mod scan;
pub mod store;
pub mod tree;
pub mod zil;

pub use objset::{
    ObjectInfo, ObjectSet, ObjsetMode, Space, SyncReport, WritePolicy, FIRST_USER_KIND,
    MAX_BLOCK_SIZE, MIN_BLOCK_SIZE,
};
pub use scan::{ScanPhase, ScanRoots, ScanState, ScanStatus, METADATA_OBJECT, POOL_META_ID};
pub use store::{HookContext, ObjectStore, SyncHook, META_OBJSET, ROOT_OBJSET};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ObjectError {
    #[error("object {0} does not exist")]
    NoSuchObject(u64),
    #[error("object set {0} does not exist")]
    NoSuchObjset(u64),
    #[error("{0}")]
    Invalid(String),
    #[error("read-only object set")]
    ReadOnly,
    #[error("{0}")]
    Busy(String),
    #[error("corrupt object metadata: {0}")]
    Corrupt(String),
    #[error(transparent)]
    Tree(#[from] tree::TreeError),
    #[error(transparent)]
    Pool(#[from] PoolError),
    #[error(transparent)]
    Block(#[from] tank_block::BlockError),
}

pub use tank_pool::PoolError;

impl ObjectError {
    /// The errno a POSIX front end reports.
    pub fn errno(&self) -> i32 {
        match self {
            Self::NoSuchObject(_) | Self::NoSuchObjset(_) => 2, // ENOENT
            Self::Invalid(_) => 22,                             // EINVAL
            Self::ReadOnly => 30,                               // EROFS
            Self::Busy(_) => 16,                                // EBUSY
            Self::Pool(p) => p.errno(),
            Self::Block(tank_block::BlockError::NoSpace) => 28,
            _ => 5, // EIO
        }
    }
}
