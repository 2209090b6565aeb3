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
    /// The thing is in use (a mounted or served dataset, a pool another request is
    /// changing): nothing was changed; try again, or force where the request allows it.
    #[error("{0}")]
    Busy(String),
    /// The pool is out of space.
    #[error("{0}")]
    NoSpace(String),
    /// The operation failed (an I/O error, a damaged or suspended pool); the message says
    /// what was and was not done.
    #[error("{0}")]
    Failed(String),
    /// The request is not one this service speaks (a newer API version, a malformed body).
    #[error("{0}")]
    BadRequest(String),
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
            Self::Store(_) | Self::Failed(_) => 500,
            Self::Busy(_) => 409,
            Self::NoSpace(_) => 507,
            Self::BadRequest(_) => 400,
        }
    }

    /// The errno a protocol front end answers with.
    pub fn errno(&self) -> i32 {
        match self {
            Self::NotFound(_) => 2,                // ENOENT
            Self::Exists(_) => 17,                 // EEXIST
            Self::Invalid(_) => 22,                // EINVAL
            Self::Denied(_) => 13,                 // EACCES
            Self::Unauthenticated(_) => 1,         // EPERM
            Self::Store(_) | Self::Failed(_) => 5, // EIO
            Self::Busy(_) => 16,                   // EBUSY
            Self::NoSpace(_) => 28,                // ENOSPC
            Self::BadRequest(_) => 22,             // EINVAL
        }
    }

    /// The exit code of the CLI (1 for a failed operation, 2 for a usage error, as clap
    /// uses 2; 77 for permission, as sysexits' EX_NOPERM).
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Invalid(_) | Self::BadRequest(_) => 2,
            Self::Denied(_) | Self::Unauthenticated(_) => 77,
            _ => 1,
        }
    }
}

impl ServiceError {
    /// The error of a failed operation, classified by what the engine said: the first error
    /// in the chain that the service knows (its own, the dataset directory's, the pool's)
    /// gives the kind; the message is the whole chain, each cause once.
    pub fn from_anyhow(e: &anyhow::Error) -> Self {
        let text = chain(e);
        for cause in e.chain() {
            if let Some(s) = cause.downcast_ref::<ServiceError>() {
                return s.with_message(text);
            }
            if let Some(d) = cause.downcast_ref::<tank_dataset::DslError>() {
                use tank_dataset::DslError as D;
                return match d {
                    D::NotFound(_) => Self::NotFound(text),
                    D::Exists(_) => Self::Exists(text),
                    D::Invalid(_) | D::CrossPool(_) => Self::Invalid(text),
                    D::Busy(_) => Self::Busy(text),
                    D::NoSpace(_) => Self::NoSpace(text),
                    _ => Self::Failed(text),
                };
            }
            if let Some(p) = cause.downcast_ref::<tank_pool::PoolError>() {
                use tank_pool::PoolError as P;
                return match p {
                    P::InvalidSpec(_) | P::InvalidArgument(_) => Self::Invalid(text),
                    P::NoSpace(_) => Self::NoSpace(text),
                    _ => Self::Failed(text),
                };
            }
        }
        Self::Failed(text)
    }

    /// The same kind of error with another message.
    pub fn with_message(&self, text: String) -> Self {
        match self {
            Self::NotFound(_) => Self::NotFound(text),
            Self::Exists(_) => Self::Exists(text),
            Self::Invalid(_) => Self::Invalid(text),
            Self::Denied(_) => Self::Denied(text.trim_start_matches("permission denied: ").into()),
            Self::Unauthenticated(_) => {
                Self::Unauthenticated(text.trim_start_matches("not authenticated: ").into())
            }
            Self::Store(_) => Self::Store(text.trim_start_matches("account store: ").into()),
            Self::Busy(_) => Self::Busy(text),
            Self::NoSpace(_) => Self::NoSpace(text),
            Self::Failed(_) => Self::Failed(text),
            Self::BadRequest(_) => Self::BadRequest(text),
        }
    }

    /// The kind, as the wire names it (`not_found`, `busy`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::NotFound(_) => "not_found",
            Self::Exists(_) => "exists",
            Self::Invalid(_) => "invalid",
            Self::Denied(_) => "denied",
            Self::Unauthenticated(_) => "unauthenticated",
            Self::Store(_) => "store",
            Self::Busy(_) => "busy",
            Self::NoSpace(_) => "no_space",
            Self::Failed(_) => "failed",
            Self::BadRequest(_) => "bad_request",
        }
    }

    /// The error a client rebuilds from the wire's kind and message.
    pub fn from_wire(kind: &str, message: String) -> Self {
        match kind {
            "not_found" => Self::NotFound(message),
            "exists" => Self::Exists(message),
            "invalid" => Self::Invalid(message),
            "denied" => Self::Denied(message),
            "unauthenticated" => Self::Unauthenticated(message),
            "store" => Self::Store(message),
            "busy" => Self::Busy(message),
            "no_space" => Self::NoSpace(message),
            "bad_request" => Self::BadRequest(message),
            _ => Self::Failed(message),
        }
    }

    /// The message without the kind's prefix (what `from_wire` takes back).
    pub fn message(&self) -> &str {
        match self {
            Self::NotFound(m)
            | Self::Exists(m)
            | Self::Invalid(m)
            | Self::Denied(m)
            | Self::Unauthenticated(m)
            | Self::Store(m)
            | Self::Busy(m)
            | Self::NoSpace(m)
            | Self::Failed(m)
            | Self::BadRequest(m) => m,
        }
    }
}

/// An error with its causes, as `{:#}` prints it ("outer: cause: root cause"), but a cause
/// whose words already stand in what precedes it is left out: many errors name their
/// source in their own message and also return it as `source()`, which `{:#}` would print
/// twice.
pub fn chain(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if text.is_empty() {
            text = s;
        } else if !text.contains(&s) {
            text.push_str(": ");
            text.push_str(&s);
        }
    }
    text
}

impl From<anyhow::Error> for ServiceError {
    fn from(e: anyhow::Error) -> Self {
        Self::from_anyhow(&e)
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
