//! `tank-service`: the management service above the datasets, on which the CLI, the REST API
//! and every protocol front end stand (docs/ARCHITECTURE.md, "service").
//!
//! # Theory of operation
//! [`Service`] (`service.rs`) owns the running state: the open pools (`pools.rs`), the
//! mount table and its policy (`mounts.rs`), the share registry, the account store and the
//! jobs (`jobs.rs`). Its one entry point, [`Service::handle`], takes the caller and a typed
//! request of the versioned API (`api.rs`), authorizes it and runs it (`ops_*.rs`); the CLI
//! (over the daemon's socket or in-process) and every later front end call it the same way.
//! Beside it:
//! - [`accounts`]: local users and groups (with the uid and gid numbers the filesystems
//!   store), argon2id password hashes, S3 access keys and API tokens, in one crash-safe store
//!   in the data directory;
//! - [`caller`]: who is asking (an administrator, a user, or nobody known) and the two roles'
//!   rules, [`caller::authorize`], which every request passes before it runs;
//! - [`shares`]: which datasets and volumes are served by which protocol, to whom: kept
//!   with the datasets, checked per protocol, with a seam that tells the protocol servers
//!   what changed;
//! - [`error`]: the service's errors, mapped once to HTTP status codes, errnos and CLI exit
//!   codes.
//!
//! # Architecture invariant
//! No process globals: a daemon or a command holds a [`Service`] and passes it (and the
//! [`caller::Caller`]) to what needs them. Nothing here knows HTTP, FUSE, XDR or SCSI: the
//! FUSE front end is given to the service as a [`mounts::Mounter`].

pub mod accounts;
pub mod api;
pub mod backup;
pub mod caller;
pub mod error;
pub mod handles;
pub mod iohistory;
pub mod jobs;
pub mod mounts;
mod ops_account;
mod ops_backup;
pub mod ops_browse;
mod ops_dataset;
mod ops_engine;
mod ops_pool;
mod ops_replicate;
mod ops_schedule;
mod ops_stream;
pub mod pools;
pub mod service;
pub mod shares;
pub mod stats;

pub use accounts::{AccessKey, Accounts, Export, Group, NewUser, Token, User};
pub use api::{Envelope, Reply, Request, Response, API_VERSION};
pub use caller::{authorize, Access, Caller};
pub use error::ServiceError;
pub use ops_engine::{params, set_param};
pub use service::{Mode, Service};
