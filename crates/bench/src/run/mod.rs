//! The benchmark commands' runners (`tank bench`, `bench-engine`, `bench-scrub`,
//! `bench-cache`, `bench-sync`, `bench-nfs`, `bench-s3`, `bench-smb`, `bench-iscsi`, `bench-send`, `bench-bonnie`, `plan`): their arguments, their pools of scratch devices,
//! their measurements and their reports. The binary only parses the command line and calls
//! `run`.
//!
//! # Theory of operation
//! Each runner builds what it measures in this process (file or emulated devices in a
//! scratch directory under the data directory, a pool, a FUSE mount through the service's
//! mount table, `mounts.rs`), measures it against a baseline of the same run (the raw
//! device files, the host file system, a peer), and removes everything it made, also when
//! interrupted (`emulated::clean_up_on_signal`). `awake.rs` keeps CPUs out of idle states
//! when asked, `util.rs` holds the data directory and the size parsers they share.

pub mod awake;
pub mod bonnie;
pub mod cache;
pub mod emulated;
pub mod engine;
pub mod fs;
pub mod iscsi;
pub mod mounts;
pub mod nfs;
pub mod plan;
pub mod s3;
pub mod scrub;
pub mod send;
pub mod smb;
pub mod sync;
pub mod util;
