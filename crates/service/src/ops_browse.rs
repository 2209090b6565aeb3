//! `snapshot_browse`: the files of a snapshot, one directory at a time (what a mount shows
//! under `.tank/snapshot/NAME`), for the console and any API client.
//!
//! # Theory of operation
//! The snapshot's filesystem is opened read-only, as a mount's snapshot directory opens
//! it (its own POSIX layer over the snapshot's object set: nothing can be written). The
//! path is walked from the root one name at a time with `lookup`, as a kernel would walk
//! it; `.` and `..` are refused, so a path never leaves the snapshot. The directory is
//! read from a cookie (0: the start) for at most `limit` entries, each with its
//! attributes; the answer's `next` is the cookie to go on from, if there is more. The
//! request is an administrator's (it reads with root's credentials, every file's name and
//! owner whatever its mode).

use std::ffi::OsStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tank_dataset::dsl::DatasetKind;
use tank_dataset::hooks::DsHooks;
use tank_dataset::posix::{Cred, FileKind, Fs, ROOT_INO};

use crate::error::ServiceError;
use crate::mounts::pool_of;
use crate::service::{Ctx, Res, Service};

/// Most entries one answer holds.
pub const BROWSE_MAX: usize = 1000;

/// A file of a snapshot, as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FileEntry {
    /// The name (bytes that are not UTF-8 shown as U+FFFD).
    pub name: String,
    /// `file`, `dir`, `symlink`, `block`, `char`, `fifo` or `socket`.
    pub kind: String,
    pub size: u64,
    /// Permission bits (`mode & 0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Seconds since 1970.
    pub mtime: i64,
}

/// One directory of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Listing {
    pub snapshot: String,
    /// The directory, from the snapshot's root (`/` for the root).
    pub path: String,
    pub entries: Vec<FileEntry>,
    /// The cookie to list the rest from, when there is more.
    pub next: Option<u64>,
}

fn kind_name(k: FileKind) -> &'static str {
    match k {
        FileKind::File => "file",
        FileKind::Dir => "dir",
        FileKind::Symlink => "symlink",
        FileKind::BlockDev => "block",
        FileKind::CharDev => "char",
        FileKind::Fifo => "fifo",
        FileKind::Socket => "socket",
    }
}

impl Service {
    pub(crate) fn snapshot_browse(
        &self,
        ctx: &mut Ctx,
        snapshot: &str,
        path: &str,
        cookie: u64,
        limit: usize,
    ) -> Res<Listing> {
        if !snapshot.contains('@') {
            return Err(ServiceError::Invalid(format!(
                "'{snapshot}' is not a snapshot (POOL/DATASET@NAME)"
            )));
        }
        let o = self.open_pool(pool_of(snapshot), ctx)?;
        let id = o
            .dsl
            .resolve(snapshot)
            .map_err(|_| ServiceError::NotFound(format!("no such snapshot '{snapshot}'")))?;
        let rec = o.dsl.record(id).map_err(anyhow::Error::from)?;
        if rec.kind != DatasetKind::Snapshot {
            return Err(ServiceError::Invalid(format!(
                "'{snapshot}' is not a snapshot"
            )));
        }
        let objset = o
            .dsl
            .snapshot_objset(id)
            .map_err(|e| ServiceError::Failed(format!("cannot open '{snapshot}': {e}")))?;
        let hooks = Arc::new(DsHooks {
            dsl: o.dsl.clone(),
            id,
            snapshot: true,
        });
        let fs = Fs::mount(o.store.clone(), objset, hooks, (0, 0)).map_err(|e| {
            ServiceError::Invalid(format!(
                "'{snapshot}' holds no filesystem to browse (a volume's snapshot?): {e}"
            ))
        })?;
        let cred = Cred::root();
        let mut ino = ROOT_INO;
        let mut shown = String::new();
        for part in path.split('/').filter(|p| !p.is_empty()) {
            if part == "." || part == ".." {
                return Err(ServiceError::Invalid(format!(
                    "'{path}': a path in a snapshot names each directory, without . or .."
                )));
            }
            shown.push('/');
            shown.push_str(part);
            let a = fs
                .lookup(&cred, ino, OsStr::new(part))
                .map_err(|_| ServiceError::NotFound(format!("no '{shown}' in '{snapshot}'")))?;
            if a.kind != FileKind::Dir {
                return Err(ServiceError::Invalid(format!(
                    "'{shown}' in '{snapshot}' is not a directory"
                )));
            }
            ino = a.ino;
        }
        let limit = limit.clamp(1, BROWSE_MAX);
        // Three more than asked: `.` and `..`, and one to know whether there is more.
        let got = fs
            .readdir(&cred, ino, cookie, limit + 3)
            .map_err(|e| ServiceError::Failed(format!("cannot read '{shown}/': {e}")))?;
        let mut entries = Vec::new();
        let (mut last, mut more) = (cookie, false);
        for e in got {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            if entries.len() == limit {
                more = true;
                break;
            }
            let a = fs
                .getattr(e.ino)
                .map_err(|err| ServiceError::Failed(format!("cannot read an entry: {err}")))?;
            entries.push(FileEntry {
                name: String::from_utf8_lossy(&e.name).into_owned(),
                kind: kind_name(a.kind).into(),
                size: a.size,
                mode: u32::from(a.perm),
                uid: a.uid,
                gid: a.gid,
                mtime: a.mtime.sec,
            });
            last = e.cookie;
        }
        let next = more.then_some(last);
        Ok(Listing {
            snapshot: snapshot.to_string(),
            path: if shown.is_empty() { "/".into() } else { shown },
            entries,
            next,
        })
    }
}
