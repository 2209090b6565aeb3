//! `tank-service`: the management service above the datasets, on which the CLI, the REST API
//! and every protocol front end stand (docs/ARCHITECTURE.md, "service").
//!
//! # Theory of operation
//! This crate is being built up in steps. It holds today:
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
//! No process globals: a daemon or a command holds an [`accounts::Accounts`] and passes it
//! (and the [`caller::Caller`]) to what needs them. Nothing here knows HTTP, FUSE, XDR or SCSI.

pub mod accounts;
pub mod caller;
pub mod error;
pub mod shares;

pub use accounts::{AccessKey, Accounts, Export, Group, NewUser, Token, User};
pub use caller::{authorize, Access, Caller};
pub use error::ServiceError;
