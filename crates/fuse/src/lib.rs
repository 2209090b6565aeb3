//! The FUSE front end: serves a dataset's POSIX layer to the local kernel.
