//! The service's errors, and their mapping to each kind of client, in one place: an HTTP
//! status for the API, an errno for the protocol front ends, an exit code for the CLI.

/// What went wrong with a request to the service.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// The named thing does not exist.
    #[error("{0}")]
    NotFound(String),
    /// A thing with that name or number exists already.
    #[error("{0}")]
    Exists(String),
    /// A bad argument: a malformed name, a number out of range, an unknown setting.
    #[error("{0}")]
    Invalid(String),
    /// The caller is known but may not do this.
    #[error("permission denied: {0}")]
    Denied(String),
    /// The caller could not be identified (a wrong password, an unknown or revoked key or
    /// token, an unknown local uid).
    #[error("not authenticated: {0}")]
    Unauthenticated(String),
    /// The store could not be read or written; nothing was changed.
    #[error("account store: {0}")]
    Store(String),
}

impl ServiceError {
    /// The HTTP status code of the REST API.
    pub fn http_status(&self) -> u16 {
        match self {
            Self::NotFound(_) => 404,
            Self::Exists(_) => 409,
            Self::Invalid(_) => 400,
            Self::Denied(_) => 403,
            Self::Unauthenticated(_) => 401,
            Self::Store(_) => 500,
        }
    }

    /// The errno a protocol front end answers with.
    pub fn errno(&self) -> i32 {
        match self {
            Self::NotFound(_) => 2,        // ENOENT
            Self::Exists(_) => 17,         // EEXIST
            Self::Invalid(_) => 22,        // EINVAL
            Self::Denied(_) => 13,         // EACCES
            Self::Unauthenticated(_) => 1, // EPERM
            Self::Store(_) => 5,           // EIO
        }
    }

    /// The exit code of the CLI (1 for a failed operation, 2 for a usage error, as clap
    /// uses 2; 77 for permission, as sysexits' EX_NOPERM).
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Invalid(_) => 2,
            Self::Denied(_) | Self::Unauthenticated(_) => 77,
            _ => 1,
        }
    }
}

impl From<redb::Error> for ServiceError {
    fn from(e: redb::Error) -> Self {
        Self::Store(e.to_string())
    }
}

macro_rules! store_error {
    ($($t:ty),*) => {$(
        impl From<$t> for ServiceError {
            fn from(e: $t) -> Self {
                Self::Store(e.to_string())
            }
        }
    )*};
}

store_error!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);
