//! Objects as files: the blocking operations of the S3 front end on a bucket's filesystem.
//!
//! # Theory of operation
//! Every call here runs on a blocking thread, as root on the dataset's shared `Fs` (S3's
//! own rules, the bucket's users and groups, are checked before): the owner of what is
//! written is set to the account that wrote it.
//!
//! - **PUT** writes the body to a new file in `.tank-s3/tmp/`, checks its length and
//!   digests, records the object's ETag, metadata and the size and mtime they describe in
//!   one extended attribute (`user.s3`), then renames the file over the key's path (making
//!   the directories on the way) and commits the intent log: the object is durable before
//!   the 200, a reader sees the old object or the new one whole, and of two PUTs of one key
//!   the last rename wins whole. A body that fails a check is removed, and the key keeps
//!   what it had.
//! - **GET** opens the file it found (an object replaced or deleted meanwhile is still read
//!   whole, as an unlinked open file) and reads it in 1 MiB pieces.
//! - **DELETE** unlinks the file, then the directories the key made that are now empty,
//!   and commits the intent log.
//! - **LIST** walks the tree in S3's order, UTF-8 binary order of whole keys: in each
//!   directory a subdirectory sorts as its name followed by `/`, so `a/b` comes after
//!   `a-b` as it does in S3. Subtrees that lie outside the prefix, before the marker, or
//!   under one common prefix are not read. Keys kept whole (`keys.rs`) are merged in.
//!
//! A file that another front end wrote has no `user.s3` record, or one whose size and
//! mtime no longer match: its ETag is then made from its inode, size and mtime, with a
//! `-1` suffix, so that clients do not take it for the MD5 of the content.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::sync::Arc;

use md5::{Digest, Md5};
use serde::{Deserialize, Serialize};
use tank_dataset::posix::{
    Cred, FileKind, Fs, Ino, RenameFlags, SetAttr, Timespec, XattrMode, ROOT_INO,
};
use tank_dataset::Errno;

use crate::buckets::Versioning;
use crate::keys::{self, Place, OWN_DIR};
use crate::versions;

pub type Res<T> = Result<T, Errno>;

/// The extended attribute an object's record is kept in.
const RECORD: &str = "user.s3";
/// The attribute of an upload in progress (`.tank-s3/uploads/<id>`).
pub const UPLOAD: &str = "user.s3.upload";
/// Bytes read from the filesystem at a time.
pub const PIECE: u32 = 1 << 20;

/// What S3 keeps of an object besides its bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_encoding: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_disposition: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_language: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_control: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
    /// `x-amz-meta-*`, names lowercased and without the prefix.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub user: BTreeMap<String, String>,
    /// `x-amz-tagging`, as sent (URL-encoded pairs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tagging: Option<String>,
}

/// An Object Lock retention: a version that may not be deleted before `until`
/// (milliseconds since 1970); `mode` is `GOVERNANCE` or `COMPLIANCE`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retention {
    pub mode: String,
    pub until: i64,
}

/// The record of an object, in its `user.s3` attribute.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Record {
    pub(crate) etag: String,
    /// The size and mtime the ETag describes.
    pub(crate) size: u64,
    pub(crate) mtime: (i64, u32),
    #[serde(default)]
    pub(crate) meta: Meta,
    /// The key, for a key kept whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) key: Option<String>,
    /// Parts of a multipart upload (0: a single PUT).
    #[serde(default)]
    pub(crate) parts: u32,
    /// The version's id in a versioned bucket (none: the "null" version).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) version: Option<String>,
    /// A delete marker (in `.tank-s3/versions/` only).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) marker: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) retention: Option<Retention>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) legal_hold: bool,
    /// The multipart upload this object completed (its parts go once it is durable; a
    /// crash between the two is finished at the next start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) upload: Option<String>,
}

/// An object found.
#[derive(Debug, Clone)]
pub struct Obj {
    pub ino: Ino,
    pub size: u64,
    pub mtime: Timespec,
    pub etag: String,
    pub meta: Meta,
    pub parts: u32,
    /// The version's id (none: the "null" version).
    pub version: Option<String>,
    /// A delete marker.
    pub marker: bool,
    pub retention: Option<Retention>,
    pub legal_hold: bool,
}

impl Obj {
    /// The version id S3 tells: the id, or `null`.
    pub fn version_id(&self) -> String {
        self.version.clone().unwrap_or_else(|| "null".into())
    }
}

fn root() -> Cred {
    Cred::root()
}

fn name(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// The MD5 of nothing: the ETag of an empty object.
pub const EMPTY_MD5: &str = "d41d8cd98f00b204e9800998ecf8427e";

/// The record kept with `ino`, if any.
pub(crate) fn record_of(fs: &Fs, ino: Ino) -> Option<Record> {
    fs.getxattr(&root(), ino, name(RECORD))
        .ok()
        .and_then(|v| serde_json::from_slice(&v).ok())
}

/// Writes `rec` as the record of `at`.
pub(crate) fn put_record(fs: &Fs, rec: &Record, at: Ino) -> Res<()> {
    let v = serde_json::to_vec(rec).map_err(|_| Errno::EIO)?;
    fs.setxattr(&root(), at, name(RECORD), &v, XattrMode::Any)
}

/// The object at `ino`, from its record where it still describes the file. A version's
/// id, retention and legal hold are its inode's whatever changed the bytes.
pub(crate) fn obj_of(fs: &Fs, ino: Ino) -> Res<Obj> {
    let a = fs.getattr(ino)?;
    let rec: Option<Record> = record_of(fs, ino);
    let size = if a.kind == FileKind::Dir { 0 } else { a.size };
    let current = rec
        .as_ref()
        .is_some_and(|r| r.size == size && r.mtime == (a.mtime.sec, a.mtime.nsec));
    let etag = match (&rec, current, a.kind) {
        (Some(r), true, _) => r.etag.clone(),
        (_, _, FileKind::Dir) => EMPTY_MD5.to_string(),
        _ => {
            let mut h = Md5::new();
            h.update(ino.to_le_bytes());
            h.update(a.generation.to_le_bytes());
            h.update(size.to_le_bytes());
            h.update(a.mtime.sec.to_le_bytes());
            h.update(a.mtime.nsec.to_le_bytes());
            format!("{}-1", hex::encode(h.finalize()))
        }
    };
    Ok(Obj {
        ino,
        size,
        mtime: a.mtime,
        etag,
        parts: rec.as_ref().filter(|_| current).map_or(0, |r| r.parts),
        version: rec.as_ref().and_then(|r| r.version.clone()),
        marker: rec.as_ref().is_some_and(|r| r.marker),
        retention: rec.as_ref().and_then(|r| r.retention.clone()),
        legal_hold: rec.as_ref().is_some_and(|r| r.legal_hold),
        meta: rec.map(|r| r.meta).unwrap_or_default(),
    })
}

/// The directory `name` in `parent`, made if missing.
fn ensure_dir(fs: &Fs, parent: Ino, n: &str) -> Res<Ino> {
    match fs.lookup(&root(), parent, name(n)) {
        Ok(a) if a.kind == FileKind::Dir => Ok(a.ino),
        Ok(_) => Err(Errno::ENOTDIR),
        Err(e) if e == Errno::ENOENT => match fs.mkdir(&root(), parent, name(n), 0o755) {
            Ok(a) => Ok(a.ino),
            // Made by a racing request meanwhile.
            Err(e) if e == Errno::EEXIST => ensure_dir(fs, parent, n),
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    }
}

/// `.tank-s3/<sub>`, made if missing.
pub fn own_dir(fs: &Fs, sub: &str) -> Res<Ino> {
    let own = ensure_dir(fs, ROOT_INO, OWN_DIR)?;
    ensure_dir(fs, own, sub)
}

/// Walks `segments` from the root: the inode of the last one.
pub(crate) fn walk(fs: &Fs, segments: &[String]) -> Res<Ino> {
    let mut ino = ROOT_INO;
    for s in segments {
        ino = fs.lookup(&root(), ino, name(s))?.ino;
    }
    Ok(ino)
}

/// The object stored for `key`, if any.
pub fn find(fs: &Fs, key: &str) -> Res<Option<Obj>> {
    if let Place::Path { segments, dir } = keys::place(key) {
        match walk(fs, &segments) {
            Ok(ino) => {
                let a = fs.getattr(ino)?;
                let is = match (a.kind, dir) {
                    (FileKind::File, false) => true,
                    (FileKind::Dir, true) => fs.getxattr(&root(), ino, name(RECORD)).is_ok(),
                    _ => false,
                };
                if is {
                    return obj_of(fs, ino).map(Some);
                }
            }
            Err(e) if e == Errno::ENOENT || e == Errno::ENOTDIR => {}
            Err(e) => return Err(e),
        }
    }
    find_whole(fs, key)
}

fn find_whole(fs: &Fs, key: &str) -> Res<Option<Obj>> {
    let Ok(own) = fs.lookup(&root(), ROOT_INO, name(OWN_DIR)) else {
        return Ok(None);
    };
    let Ok(dir) = fs.lookup(&root(), own.ino, name("keys")) else {
        return Ok(None);
    };
    match fs.lookup(&root(), dir.ino, name(&keys::whole_name(key))) {
        Ok(a) => obj_of(fs, a.ino).map(Some),
        Err(e) if e == Errno::ENOENT => Ok(None),
        Err(e) => Err(e),
    }
}

/// A new file in `.tank-s3/tmp/`, for a body being received: its directory, name and inode.
pub fn begin(fs: &Fs) -> Res<(Ino, String, Ino)> {
    let tmp = own_dir(fs, "tmp")?;
    let n = format!("{:032x}", rand::random::<u128>());
    let a = fs.create(
        &root(),
        tmp,
        name(&n),
        libc::S_IFREG | 0o644,
        libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
    )?;
    let _ = fs.release(a.ino);
    Ok((tmp, n, a.ino))
}

/// Removes the bodies a previous run was receiving when it stopped (at the start, before
/// any request): what number were removed.
pub fn clean_tmp(fs: &Fs) -> Res<usize> {
    let Ok(own) = fs.lookup(&root(), ROOT_INO, name(OWN_DIR)) else {
        return Ok(0);
    };
    let Ok(tmp) = fs.lookup(&root(), own.ino, name("tmp")) else {
        return Ok(0);
    };
    let mut names = Vec::new();
    let mut cookie = 0;
    loop {
        let batch = fs.readdir(&root(), tmp.ino, cookie, 1024)?;
        let Some(last) = batch.last() else { break };
        cookie = last.cookie;
        names.extend(
            batch
                .into_iter()
                .filter(|e| e.kind == FileKind::File)
                .filter_map(|e| String::from_utf8(e.name).ok()),
        );
    }
    for n in &names {
        fs.unlink(&root(), tmp.ino, name(n))?;
    }
    if !names.is_empty() {
        fs.fsync(tmp.ino, false)?;
    }
    Ok(names.len())
}

/// Removes a body that will not become an object.
pub fn discard(fs: &Fs, tmp: Ino, n: &str) {
    let _ = fs.unlink(&root(), tmp, name(n));
}

/// Appends `data` at `offset` of the body being received.
pub fn write(fs: &Fs, ino: Ino, offset: u64, data: &[u8]) -> Res<()> {
    fs.write(&root(), ino, offset, data, false).map(|_| ())
}

/// What a new object is made of, besides its bytes.
pub struct NewObject<'a> {
    pub key: &'a str,
    pub etag: String,
    pub meta: Meta,
    pub owner: (u32, u32),
    pub parts: u32,
    /// What becomes of the key's object before this one.
    pub versioning: Versioning,
    /// Object Lock: the new version's retention and legal hold; in a lock bucket every
    /// object is a read-only file of root's, which no other front end can change.
    pub lock: Option<(Option<Retention>, bool)>,
    /// The multipart upload this object completes.
    pub upload: Option<String>,
}

/// Makes the received body (`tmp`/`n`, inode `ino`) the object `new.key`, durably.
pub fn commit(fs: &Fs, tmp: Ino, n: &str, ino: Ino, new: NewObject<'_>) -> Res<Obj> {
    // Held open: a concurrent PUT of the key may replace this file the moment it is in
    // place, and what this one answers is still read from it.
    if let Err(e) = open(fs, ino) {
        discard(fs, tmp, n);
        return Err(e);
    }
    let r = commit_inner(fs, tmp, n, ino, new);
    if r.is_err() {
        discard(fs, tmp, n);
    }
    close(fs, ino);
    r
}

fn commit_inner(fs: &Fs, tmp: Ino, n: &str, ino: Ino, new: NewObject<'_>) -> Res<Obj> {
    let set = match new.lock {
        Some(_) => SetAttr {
            uid: Some(0),
            gid: Some(0),
            mode: Some(0o444),
            ..SetAttr::default()
        },
        None => SetAttr {
            uid: Some(new.owner.0),
            gid: Some(new.owner.1),
            ..SetAttr::default()
        },
    };
    fs.setattr(&root(), ino, &set)?;
    let a = fs.getattr(ino)?;
    let (retention, legal_hold) = new.lock.clone().unwrap_or((None, false));
    let rec = Record {
        etag: new.etag,
        size: a.size,
        mtime: (a.mtime.sec, a.mtime.nsec),
        meta: new.meta,
        key: None,
        parts: new.parts,
        version: (new.versioning == Versioning::Enabled).then(versions::new_id),
        marker: false,
        retention,
        legal_hold,
        upload: new.upload,
    };
    if new.versioning != Versioning::Off {
        versions::before_write(fs, new.key, new.versioning)?;
    }
    place(fs, tmp, n, ino, new.key, rec)
}

/// Puts the file `tmp`/`n` (inode `ino`) in the place of `key` with the record `rec`,
/// durably: at its path, or kept whole.
pub(crate) fn place(fs: &Fs, tmp: Ino, n: &str, ino: Ino, key: &str, mut rec: Record) -> Res<Obj> {
    let put_record = |rec: &Record, at: Ino| put_record(fs, rec, at);
    let new_key = key;
    let a = fs.getattr(ino)?;
    if let Place::Path { segments, dir } = keys::place(key) {
        if dir && a.size == 0 {
            // A "folder": the directory itself, marked.
            match make_dirs(fs, &segments) {
                Ok(d) => {
                    rec.size = 0;
                    let da = fs.getattr(d)?;
                    rec.mtime = (da.mtime.sec, da.mtime.nsec);
                    put_record(&rec, d)?;
                    discard(fs, tmp, n);
                    remove_whole(fs, new_key)?;
                    fs.fsync(d, false)?;
                    return obj_of(fs, d);
                }
                Err(e) if e == Errno::ENOTDIR => {}
                Err(e) => return Err(e),
            }
        } else if !dir {
            put_record(&rec, ino)?;
            let (parents, last) = segments.split_at(segments.len() - 1);
            match make_dirs(fs, parents) {
                Ok(p) => match fs.rename(
                    &root(),
                    tmp,
                    name(n),
                    p,
                    name(&last[0]),
                    RenameFlags::default(),
                ) {
                    Ok(()) => {
                        remove_whole(fs, new_key)?;
                        fs.fsync(ino, false)?;
                        return obj_of(fs, ino);
                    }
                    // A directory is there (`a` when `a/b` exists): kept whole.
                    Err(e) if e == Errno::EISDIR || e == Errno::ENOTEMPTY || e == Errno::EEXIST => {
                    }
                    Err(e) => return Err(e),
                },
                // A file is on the way (`a/b` when `a` exists): kept whole.
                Err(e) if e == Errno::ENOTDIR => {}
                Err(e) => return Err(e),
            }
        }
    }
    rec.key = Some(new_key.to_string());
    put_record(&rec, ino)?;
    let dir = own_dir(fs, "keys")?;
    fs.rename(
        &root(),
        tmp,
        name(n),
        dir,
        name(&keys::whole_name(new_key)),
        RenameFlags::default(),
    )?;
    fs.fsync(ino, false)?;
    obj_of(fs, ino)
}

/// Makes the directories of `segments` from the root: the last one's inode.
fn make_dirs(fs: &Fs, segments: &[String]) -> Res<Ino> {
    let mut ino = ROOT_INO;
    for s in segments {
        ino = ensure_dir(fs, ino, s)?;
    }
    Ok(ino)
}

pub(crate) fn remove_whole(fs: &Fs, key: &str) -> Res<()> {
    let Ok(own) = fs.lookup(&root(), ROOT_INO, name(OWN_DIR)) else {
        return Ok(());
    };
    let Ok(dir) = fs.lookup(&root(), own.ino, name("keys")) else {
        return Ok(());
    };
    match fs.unlink(&root(), dir.ino, name(&keys::whole_name(key))) {
        Ok(()) => Ok(()),
        Err(e) if e == Errno::ENOENT => Ok(()),
        Err(e) => Err(e),
    }
}

/// Deletes the object `key`: whether there was one. The directories it leaves empty go too
/// (but a "folder" object's own directory only when that is what is deleted).
pub fn delete(fs: &Fs, key: &str) -> Res<bool> {
    let mut gone = false;
    if let Place::Path { segments, dir } = keys::place(key) {
        if let Ok(ino) = walk(fs, &segments) {
            let a = fs.getattr(ino)?;
            let (parents, last) = segments.split_at(segments.len() - 1);
            let parent = walk(fs, parents)?;
            match (a.kind, dir) {
                (FileKind::File, false) => {
                    fs.unlink(&root(), parent, name(&last[0]))?;
                    gone = true;
                }
                (FileKind::Dir, true) if fs.getxattr(&root(), ino, name(RECORD)).is_ok() => {
                    fs.removexattr(&root(), ino, name(RECORD))?;
                    let _ = fs.rmdir(&root(), parent, name(&last[0]));
                    gone = true;
                }
                _ => {}
            }
            if gone {
                prune(fs, parents)?;
            }
        }
    }
    if !gone && find_whole(fs, key)?.is_some() {
        remove_whole(fs, key)?;
        gone = true;
    }
    if gone {
        fs.fsync(ROOT_INO, false)?;
    }
    Ok(gone)
}

/// Removes the empty directories of `segments`, deepest first, up to the first that is
/// not empty or is a "folder" object.
pub(crate) fn prune(fs: &Fs, segments: &[String]) -> Res<()> {
    for depth in (1..=segments.len()).rev() {
        let parent = walk(fs, &segments[..depth - 1])?;
        let Ok(a) = fs.lookup(&root(), parent, name(&segments[depth - 1])) else {
            return Ok(());
        };
        if fs.getxattr(&root(), a.ino, name(RECORD)).is_ok() {
            return Ok(());
        }
        if fs
            .rmdir(&root(), parent, name(&segments[depth - 1]))
            .is_err()
        {
            return Ok(());
        }
    }
    Ok(())
}

/// The directory entries on the way to `key`'s path, as far as they exist: what a change
/// of the key may add or remove (for the other front ends' caches).
pub fn key_entries(fs: &Fs, key: &str) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    if let Place::Path { segments, .. } = keys::place(key) {
        let mut at = ROOT_INO;
        for s in &segments {
            out.push((at, s.as_bytes().to_vec()));
            match fs.lookup(&root(), at, name(s)) {
                Ok(a) => at = a.ino,
                Err(_) => break,
            }
        }
    }
    out
}

/// Opens an object's file for reading (it stays readable if it is replaced meanwhile).
pub fn open(fs: &Fs, ino: Ino) -> Res<()> {
    fs.open(&root(), ino, libc::O_RDONLY)
}

/// Closes what `open` opened.
pub fn close(fs: &Fs, ino: Ino) {
    let _ = fs.release(ino);
}

/// Reads up to `len` bytes at `offset`.
pub fn read(fs: &Fs, ino: Ino, offset: u64, len: u32) -> Res<Vec<u8>> {
    fs.read(ino, offset, len)
}

/// Sets an object's record (metadata, tags) anew, keeping its ETag.
pub fn set_meta(fs: &Fs, key: &str, meta: Meta) -> Res<Option<Obj>> {
    let Some(o) = find(fs, key)? else {
        return Ok(None);
    };
    set_meta_of(fs, &o, meta, key).map(Some)
}

/// Sets the record of the object (or version) `o` of `key` anew with `meta`, keeping its
/// ETag, version and lock.
pub fn set_meta_of(fs: &Fs, o: &Obj, meta: Meta, key: &str) -> Res<Obj> {
    let a = fs.getattr(o.ino)?;
    let old = record_of(fs, o.ino).unwrap_or_default();
    let rec = Record {
        etag: o.etag.clone(),
        size: o.size,
        mtime: (a.mtime.sec, a.mtime.nsec),
        meta,
        key: old
            .key
            .or_else(|| matches!(keys::place(key), Place::Whole(_)).then(|| key.to_string())),
        parts: o.parts,
        ..old
    };
    put_record(fs, &rec, o.ino)?;
    fs.fsync(o.ino, false)?;
    obj_of(fs, o.ino)
}

/// Sets the retention and legal hold of the object (or version) at `ino`.
pub fn set_lock(fs: &Fs, ino: Ino, retention: Option<Retention>, legal_hold: bool) -> Res<Obj> {
    let mut rec = record_of(fs, ino).unwrap_or_default();
    let a = fs.getattr(ino)?;
    if rec.etag.is_empty() {
        // A file of another front end's: its ETag as it is now.
        let o = obj_of(fs, ino)?;
        rec.etag = o.etag;
        rec.size = o.size;
        rec.mtime = (a.mtime.sec, a.mtime.nsec);
    }
    rec.retention = retention;
    rec.legal_hold = legal_hold;
    put_record(fs, &rec, ino)?;
    fs.fsync(ino, false)?;
    obj_of(fs, ino)
}

/// A bucket-wide setting kept with the bucket's dataset (an attribute of `.tank-s3`):
/// `what` is `lock`, `tagging`, `cors` or `lifecycle`.
pub fn bucket_conf(fs: &Fs, what: &str) -> Res<Option<Vec<u8>>> {
    let Ok(own) = fs.lookup(&root(), ROOT_INO, name(OWN_DIR)) else {
        return Ok(None);
    };
    match fs.getxattr(&root(), own.ino, name(&format!("user.s3.bucket.{what}"))) {
        Ok(v) => Ok(Some(v)),
        Err(e) if e == Errno::ENODATA || e == Errno::ENOENT => Ok(None),
        Err(e) => Err(e),
    }
}

/// Sets (or, with None, removes) a bucket-wide setting, durably.
pub fn set_bucket_conf(fs: &Fs, what: &str, value: Option<&[u8]>) -> Res<()> {
    let own = ensure_dir(fs, ROOT_INO, OWN_DIR)?;
    let n = format!("user.s3.bucket.{what}");
    match value {
        Some(v) => fs.setxattr(&root(), own, name(&n), v, XattrMode::Any)?,
        None => match fs.removexattr(&root(), own, name(&n)) {
            Ok(()) => {}
            Err(e) if e == Errno::ENODATA || e == Errno::ENOENT => {}
            Err(e) => return Err(e),
        },
    }
    fs.fsync(own, false)
}

/// Whether the dataset holds any object or version (a bucket must be empty to be
/// deleted).
pub fn is_empty(fs: &Fs) -> Res<bool> {
    let l = list(fs, "", None, "", 1)?;
    Ok(l.objects.is_empty() && l.prefixes.is_empty() && !versions::any(fs)?)
}

/// One page of a listing.
#[derive(Debug, Default)]
pub struct Listing {
    pub objects: Vec<(String, Obj)>,
    pub prefixes: Vec<String>,
    pub truncated: bool,
    /// The last key or common prefix returned: where the next page starts after.
    pub last: Option<String>,
}

/// A directory's entries in S3 order: (sort name, name, inode, kind).
pub(crate) type Entries = Vec<(String, String, Ino, FileKind)>;

pub(crate) fn entries(fs: &Fs, dir: Ino, at_root: bool) -> Res<Entries> {
    let mut out = Vec::new();
    let mut cookie = 0;
    loop {
        let batch = fs.readdir(&root(), dir, cookie, 1024)?;
        let Some(last) = batch.last() else { break };
        cookie = last.cookie;
        for e in batch {
            let Ok(n) = String::from_utf8(e.name) else {
                continue; // not a key
            };
            if n == "." || n == ".." || (at_root && (n == OWN_DIR || n == ".tank")) {
                continue;
            }
            match e.kind {
                FileKind::Dir => out.push((format!("{n}/"), n, e.ino, e.kind)),
                FileKind::File => out.push((n.clone(), n, e.ino, e.kind)),
                _ => {}
            }
        }
    }
    out.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    Ok(out)
}

/// Whether a directory holds an object anywhere below it.
fn holds_object(fs: &Fs, dir: Ino) -> Res<bool> {
    if fs.getxattr(&root(), dir, name(RECORD)).is_ok() {
        return Ok(true);
    }
    for (_, _, ino, kind) in entries(fs, dir, false)? {
        if kind == FileKind::File || holds_object(fs, ino)? {
            return Ok(true);
        }
    }
    Ok(false)
}

enum Item {
    Obj(String, Ino),
    Prefix(String),
}

/// The tree's keys in order, within `prefix`, after `after`, rolled up at `/` when the
/// delimiter is `/`.
struct Walk<'a> {
    fs: &'a Fs,
    prefix: &'a str,
    after: &'a str,
    rollup: bool,
    stack: Vec<(String, Entries, usize)>,
}

impl Walk<'_> {
    fn next(&mut self) -> Res<Option<Item>> {
        loop {
            let Some((path, list, i)) = self.stack.last_mut() else {
                return Ok(None);
            };
            let Some((_, n, ino, kind)) = list.get(*i).cloned() else {
                self.stack.pop();
                continue;
            };
            *i += 1;
            let path = path.clone();
            if kind == FileKind::File {
                let key = format!("{path}{n}");
                if key.starts_with(self.prefix) && key.as_str() > self.after {
                    return Ok(Some(Item::Obj(key, ino)));
                }
                continue;
            }
            let dir = format!("{path}{n}/");
            // Outside the prefix, or wholly before the marker: not read.
            if !(dir.starts_with(self.prefix) || self.prefix.starts_with(&dir)) {
                continue;
            }
            if !self.after.starts_with(&dir) && self.after > dir.as_str() {
                continue;
            }
            if self.rollup && dir.len() > self.prefix.len() && dir.starts_with(self.prefix) {
                if holds_object(self.fs, ino)? {
                    return Ok(Some(Item::Prefix(dir)));
                }
                continue;
            }
            let marker = self.fs.getxattr(&root(), ino, name(RECORD)).is_ok();
            self.stack
                .push((dir.clone(), entries(self.fs, ino, false)?, 0));
            if marker && dir.starts_with(self.prefix) && dir.as_str() > self.after {
                return Ok(Some(Item::Obj(dir, ino)));
            }
        }
    }
}

/// The keys kept whole, within `prefix`, sorted.
fn whole_keys(fs: &Fs, prefix: &str) -> Res<Vec<(String, Ino)>> {
    let Ok(own) = fs.lookup(&root(), ROOT_INO, name(OWN_DIR)) else {
        return Ok(Vec::new());
    };
    let Ok(dir) = fs.lookup(&root(), own.ino, name("keys")) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for (_, _, ino, kind) in entries(fs, dir.ino, false)? {
        if kind != FileKind::File {
            continue;
        }
        let key = fs
            .getxattr(&root(), ino, name(RECORD))
            .ok()
            .and_then(|v| serde_json::from_slice::<Record>(&v).ok())
            .and_then(|r| r.key);
        if let Some(k) = key.filter(|k| k.starts_with(prefix)) {
            out.push((k, ino));
        }
    }
    out.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    Ok(out)
}

/// One page of the keys within `prefix` after `after` (exclusive), grouped into common
/// prefixes at `delimiter`, at most `max` entries (objects and prefixes together).
pub fn list(
    fs: &Fs,
    prefix: &str,
    delimiter: Option<&str>,
    after: &str,
    max: usize,
) -> Res<Listing> {
    let delimiter = delimiter.filter(|d| !d.is_empty());
    let mut walk = Walk {
        fs,
        prefix,
        after,
        rollup: delimiter == Some("/"),
        stack: vec![(String::new(), entries(fs, ROOT_INO, true)?, 0)],
    };
    let mut whole = whole_keys(fs, prefix)?
        .into_iter()
        .filter(|(k, _)| k.as_str() > after)
        .peekable();
    let mut pending = walk.next()?;
    let mut out = Listing::default();
    let mut count = 0;
    loop {
        // The smaller of the walk's next item and the next whole key.
        let take_whole = match (&pending, whole.peek()) {
            (None, None) => break,
            (None, Some(_)) => true,
            (Some(_), None) => false,
            (Some(Item::Obj(k, _) | Item::Prefix(k)), Some((w, _))) => w.as_bytes() < k.as_bytes(),
        };
        let item = if take_whole {
            let (k, ino) = whole.next().expect("peeked");
            Item::Obj(k, ino)
        } else {
            let it = pending.take().expect("matched");
            pending = walk.next()?;
            it
        };
        let entry = match item {
            Item::Prefix(p) => Err(p),
            Item::Obj(key, ino) => {
                let rest = &key[prefix.len()..];
                match delimiter.and_then(|d| rest.find(d).map(|i| i + d.len())) {
                    Some(end) => Err(key[..prefix.len() + end].to_string()),
                    None => Ok((key, ino)),
                }
            }
        };
        match entry {
            Err(p) => {
                if p.as_str() <= after || out.prefixes.last() == Some(&p) {
                    continue;
                }
                if count == max {
                    out.truncated = true;
                    break;
                }
                out.last = Some(p.clone());
                out.prefixes.push(p);
            }
            Ok((key, ino)) => {
                if count == max {
                    out.truncated = true;
                    break;
                }
                let o = obj_of(fs, ino)?;
                out.last = Some(key.clone());
                out.objects.push((key, o));
            }
        }
        count += 1;
    }
    Ok(out)
}

/// A shared filesystem and the work on it, for `spawn_blocking`.
pub async fn blocking<T: Send + 'static>(
    fs: Arc<Fs>,
    f: impl FnOnce(&Fs) -> Res<T> + Send + 'static,
) -> Res<T> {
    tokio::task::spawn_blocking(move || f(&fs))
        .await
        .unwrap_or(Err(Errno::EIO))
}
