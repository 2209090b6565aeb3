//! S3 versioning and Object Lock on a bucket's filesystem.
//!
//! # Theory of operation
//! The current version of a key is the object at the key's place (`store.rs`), so the
//! local mount, NFS and SMB always see the latest bytes as a plain file. The other
//! versions of a key, and its delete markers, are files of `.tank-s3/versions/<sha256 of
//! the key>/` (a directory of root's, mode 0700: no other front end reaches them), the key
//! in the directory's `user.s3.key` attribute. Each is named `<mtime in ns, 16 hex>-<id>`,
//! so that a directory's names sort oldest to newest; its record (`user.s3`) carries the
//! version id (none for the "null" version), whether it is a delete marker, and its
//! retention and legal hold.
//!
//! - **A write** in a versioned bucket first gives the current object a second name among
//!   the versions (a hard link: no byte is copied), then renames the new body over the key
//!   (`store::place`). Where versioning is suspended, the new object is the "null"
//!   version: a current null version is simply replaced, and a noncurrent one removed.
//! - **A DELETE without a version** does the same to the current object, removes the
//!   key's name and adds a delete marker; **with a version** it removes that version
//!   (refused while a legal hold or a retention keeps it), and where the current version
//!   went, the newest remaining one that is not a delete marker takes the key's place.
//! - **Crashes**: each step is one filesystem operation, and the intent log is committed
//!   before the answer. A crash between the link and the rename leaves the old current
//!   object with two names: it is still current, its extra name is skipped by inode in
//!   listings and removed with it. A crash after a current version's removal and before
//!   the promotion of the one below it is mended when the key is next read or listed
//!   through [`settle_all`], run at the start.
//! - **Changes of one key** are serialized by the caller (`Buckets::key_lock`).

use std::ffi::OsStr;
use std::time::{SystemTime, UNIX_EPOCH};

use tank_dataset::posix::{Cred, FileKind, Fs, Ino, SetAttr, XattrMode, ROOT_INO};
use tank_dataset::Errno;

use crate::buckets::Versioning;
use crate::keys::{self, OWN_DIR};
use crate::store::{self, obj_of, record_of, Obj, Record, Res, Retention};

/// `.tank-s3/versions`.
const VERSIONS: &str = "versions";
/// The attribute that names the key of a versions directory.
const KEY: &str = "user.s3.key";

fn root() -> Cred {
    Cred::root()
}

fn name(s: &str) -> &OsStr {
    OsStr::new(s)
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Milliseconds since 1970, now.
pub fn now_ms() -> i64 {
    (now_ns() / 1_000_000) as i64
}

/// A new version id: 32 hex digits, the time first, so that ids sort by age.
pub fn new_id() -> String {
    format!("{:016x}{:016x}", now_ns(), rand::random::<u64>())
}

/// Why a versioned change was refused or failed.
#[derive(Debug)]
pub enum Refusal {
    Fs(Errno),
    /// Object Lock keeps the version: why.
    Locked(String),
}

impl From<Errno> for Refusal {
    fn from(e: Errno) -> Refusal {
        Refusal::Fs(e)
    }
}

/// `.tank-s3/versions`, made (root's, mode 0700) if missing.
fn versions_root(fs: &Fs) -> Res<Ino> {
    let d = store::own_dir(fs, VERSIONS)?;
    let a = fs.getattr(d)?;
    if a.mode() & 0o7777 != 0o700 {
        fs.setattr(
            &root(),
            d,
            &SetAttr {
                mode: Some(0o700),
                ..SetAttr::default()
            },
        )?;
    }
    Ok(d)
}

/// The versions directory of `key`, if there is one.
fn dir_of(fs: &Fs, key: &str) -> Res<Option<Ino>> {
    let Ok(own) = fs.lookup(&root(), ROOT_INO, name(OWN_DIR)) else {
        return Ok(None);
    };
    let Ok(v) = fs.lookup(&root(), own.ino, name(VERSIONS)) else {
        return Ok(None);
    };
    match fs.lookup(&root(), v.ino, name(&keys::whole_name(key))) {
        Ok(a) => Ok(Some(a.ino)),
        Err(e) if e == Errno::ENOENT => Ok(None),
        Err(e) => Err(e),
    }
}

/// The versions directory of `key`, made if missing.
fn make_dir_of(fs: &Fs, key: &str) -> Res<Ino> {
    if let Some(d) = dir_of(fs, key)? {
        return Ok(d);
    }
    let v = versions_root(fs)?;
    let n = keys::whole_name(key);
    let d = match fs.mkdir(&root(), v, name(&n), 0o700) {
        Ok(a) => a.ino,
        Err(e) if e == Errno::EEXIST => fs.lookup(&root(), v, name(&n))?.ino,
        Err(e) => return Err(e),
    };
    fs.setxattr(&root(), d, name(KEY), key.as_bytes(), XattrMode::Any)?;
    Ok(d)
}

/// The name of a version in its key's directory.
fn entry_name(o: &Obj) -> String {
    let ns = (o.mtime.sec.max(0) as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::from(o.mtime.nsec));
    format!("{ns:016x}-{}", o.version_id())
}

/// A version kept in a key's directory.
#[derive(Debug, Clone)]
pub struct Kept {
    pub name: String,
    pub obj: Obj,
}

/// The prefix of a version being made (its record not yet written): never a version.
const NEW: &str = "new-";

/// The versions and delete markers kept in the directory `dir`, newest first.
fn kept(fs: &Fs, dir: Ino) -> Res<Vec<Kept>> {
    let mut out = Vec::new();
    for (_, n, ino, kind) in store::entries(fs, dir, false)? {
        if kind != FileKind::File || n.starts_with(NEW) {
            continue;
        }
        out.push(Kept {
            name: n,
            obj: obj_of(fs, ino)?,
        });
    }
    out.sort_by(|a, b| b.name.cmp(&a.name));
    Ok(out)
}

/// Gives the current object `cur` of `key` a name among its versions (a hard link; a
/// "folder" object, a directory, is recorded as an empty file).
fn retire(fs: &Fs, key: &str, cur: &Obj) -> Res<()> {
    let dir = make_dir_of(fs, key)?;
    let n = entry_name(cur);
    if fs.getattr(cur.ino)?.kind == FileKind::Dir {
        if fs.lookup(&root(), dir, name(&n)).is_ok() {
            return Ok(());
        }
        let mut rec = record_of(fs, cur.ino).unwrap_or_default();
        rec.key = Some(key.to_string());
        new_entry(fs, dir, &rec, &n)?;
        return Ok(());
    }
    match fs.link(&root(), cur.ino, dir, name(&n)) {
        Ok(_) => Ok(()),
        Err(e) if e == Errno::EEXIST => Ok(()),
        Err(e) => Err(e),
    }
}

/// Makes an empty file in `dir` with the record `rec` (its mtime the file's, where `rec`
/// has none), under the name `n` (or its entry name, where `n` is empty): made under a
/// `new-` name and renamed once its record is written, so that a crash leaves no version
/// without one.
fn new_entry(fs: &Fs, dir: Ino, rec: &Record, n: &str) -> Res<Obj> {
    let tmp = format!("{NEW}{:016x}", rand::random::<u64>());
    let a = fs.create(
        &root(),
        dir,
        name(&tmp),
        libc::S_IFREG | 0o444,
        libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
    )?;
    let _ = fs.release(a.ino);
    let mut rec = rec.clone();
    if rec.mtime == (0, 0) {
        rec.mtime = (a.mtime.sec, a.mtime.nsec);
    } else {
        // A folder object's record: the file takes its time, so the record still
        // describes it (and its ETag and date hold).
        let t = tank_dataset::posix::Timespec {
            sec: rec.mtime.0,
            nsec: rec.mtime.1,
        };
        fs.setattr(
            &root(),
            a.ino,
            &SetAttr {
                mtime: Some(tank_dataset::posix::TimeSet::At(t)),
                ..SetAttr::default()
            },
        )?;
    }
    store::put_record(fs, &rec, a.ino)?;
    let o = obj_of(fs, a.ino)?;
    let target = if n.is_empty() {
        entry_name(&o)
    } else {
        n.to_string()
    };
    fs.rename(
        &root(),
        dir,
        name(&tmp),
        dir,
        name(&target),
        tank_dataset::posix::RenameFlags::default(),
    )?;
    Ok(o)
}

/// Removes the noncurrent "null" versions of `key` (a write or delete where versioning
/// is suspended replaces the null version).
fn remove_null(fs: &Fs, key: &str, except: Option<Ino>) -> Res<()> {
    let Some(dir) = dir_of(fs, key)? else {
        return Ok(());
    };
    for k in kept(fs, dir)? {
        if k.obj.version.is_none() && Some(k.obj.ino) != except {
            fs.unlink(&root(), dir, name(&k.name))?;
        }
    }
    Ok(())
}

/// What a write of `key` does first, in a bucket whose versioning is not off: the current
/// object becomes a noncurrent version (or, where versioning is suspended and it is the
/// null version, is left to be replaced).
pub fn before_write(fs: &Fs, key: &str, mode: Versioning) -> Res<()> {
    let cur = store::find(fs, key)?;
    if let Some(c) = &cur {
        if mode == Versioning::Enabled || c.version.is_some() {
            retire(fs, key, c)?;
        }
    }
    if mode == Versioning::Suspended {
        let keep = cur.filter(|c| c.version.is_some()).map(|c| c.ino);
        remove_null(fs, key, keep)?;
    }
    Ok(())
}

/// What a DELETE did: whether a delete marker was made or removed, and the version id.
#[derive(Debug, Clone, Default)]
pub struct Deleted {
    pub marker: bool,
    pub version: Option<String>,
}

/// Why `o` may not be deleted now, if it may not.
pub fn locked(o: &Obj, bypass_governance: bool) -> Option<String> {
    if o.legal_hold {
        return Some("the version is under a legal hold".into());
    }
    let r = o.retention.as_ref()?;
    if r.until <= now_ms() {
        return None;
    }
    if r.mode == "COMPLIANCE" {
        return Some("the version is kept in COMPLIANCE mode until its retention ends".into());
    }
    (!bypass_governance).then(|| {
        "the version is kept in GOVERNANCE mode (x-amz-bypass-governance-retention, for an administrator)".into()
    })
}

/// Deletes `key` in a bucket whose versioning is `mode`: without a version id, the
/// current object becomes noncurrent and a delete marker is added (off: the object goes);
/// with one, that version goes, where its lock allows.
pub fn delete(
    fs: &Fs,
    key: &str,
    mode: Versioning,
    version: Option<&str>,
    bypass_governance: bool,
) -> Result<Deleted, Refusal> {
    match version {
        None if mode == Versioning::Off => {
            store::delete(fs, key)?;
            Ok(Deleted::default())
        }
        None => {
            before_write(fs, key, mode)?;
            store::delete(fs, key)?;
            let dir = make_dir_of(fs, key)?;
            let id = (mode == Versioning::Enabled).then(new_id);
            let rec = Record {
                key: Some(key.to_string()),
                version: id,
                marker: true,
                ..Record::default()
            };
            let o = new_entry(fs, dir, &rec, "")?;
            fs.fsync(o.ino, false)?;
            Ok(Deleted {
                marker: true,
                version: Some(o.version_id()),
            })
        }
        Some(v) => {
            let want = (v != "null").then(|| v.to_string());
            let cur = store::find(fs, key)?.filter(|c| c.version == want);
            let dir = dir_of(fs, key)?;
            let kept_here: Vec<Kept> = match dir {
                Some(d) => kept(fs, d)?
                    .into_iter()
                    .filter(|k| k.obj.version == want)
                    .collect(),
                None => Vec::new(),
            };
            // Every check before any change.
            for o in cur.iter().chain(kept_here.iter().map(|k| &k.obj)) {
                if let Some(why) = locked(o, bypass_governance) {
                    return Err(Refusal::Locked(why));
                }
            }
            let marker = cur.is_none() && kept_here.iter().any(|k| k.obj.marker);
            if cur.is_some() {
                store::delete(fs, key)?;
            }
            if let Some(d) = dir {
                for k in &kept_here {
                    fs.unlink(&root(), d, name(&k.name))?;
                }
            }
            settle(fs, key)?;
            fs.fsync(ROOT_INO, false)?;
            Ok(Deleted {
                marker,
                version: Some(v.to_string()),
            })
        }
    }
}

/// Where `key` has no current object, the newest of its versions takes the key's place,
/// unless it is a delete marker; a versions directory left empty goes.
pub fn settle(fs: &Fs, key: &str) -> Res<()> {
    let Some(dir) = dir_of(fs, key)? else {
        return Ok(());
    };
    // Entries a crash left before their record was written.
    for (_, n, _, _) in store::entries(fs, dir, false)? {
        if n.starts_with(NEW) {
            fs.unlink(&root(), dir, name(&n))?;
        }
    }
    let list = kept(fs, dir)?;
    if store::find(fs, key)?.is_none() {
        if let Some(newest) = list.first().filter(|k| !k.obj.marker) {
            let rec = record_of(fs, newest.obj.ino).unwrap_or_default();
            let rec = Record { key: None, ..rec };
            store::place(fs, dir, &newest.name, newest.obj.ino, key, rec)?;
            if list.len() == 1 {
                remove_dir(fs, key, dir)?;
            }
            return Ok(());
        }
    }
    if list.is_empty() {
        remove_dir(fs, key, dir)?;
    }
    Ok(())
}

fn remove_dir(fs: &Fs, key: &str, dir: Ino) -> Res<()> {
    let _ = dir;
    let own = fs.lookup(&root(), ROOT_INO, name(OWN_DIR))?;
    let v = fs.lookup(&root(), own.ino, name(VERSIONS))?;
    match fs.rmdir(&root(), v.ino, name(&keys::whole_name(key))) {
        Ok(()) => Ok(()),
        Err(e) if e == Errno::ENOTEMPTY || e == Errno::ENOENT => Ok(()),
        Err(e) => Err(e),
    }
}

/// The version `version` of `key` (`null` for the null version), current or kept.
pub fn find(fs: &Fs, key: &str, version: &str) -> Res<Option<Obj>> {
    let want = (version != "null").then(|| version.to_string());
    if let Some(c) = store::find(fs, key)?.filter(|c| c.version == want) {
        return Ok(Some(c));
    }
    let Some(dir) = dir_of(fs, key)? else {
        return Ok(None);
    };
    Ok(kept(fs, dir)?
        .into_iter()
        .find(|k| k.obj.version == want)
        .map(|k| k.obj))
}

/// Whether the newest version of `key` is a delete marker (a GET of the key then says so).
pub fn latest_is_marker(fs: &Fs, key: &str) -> Res<bool> {
    if store::find(fs, key)?.is_some() {
        return Ok(false);
    }
    let Some(dir) = dir_of(fs, key)? else {
        return Ok(false);
    };
    Ok(kept(fs, dir)?.first().is_some_and(|k| k.obj.marker))
}

/// Every version of `key`, newest first, with whether it is the latest.
pub fn versions_of(fs: &Fs, key: &str) -> Res<Vec<(Obj, bool)>> {
    let cur = store::find(fs, key)?;
    let mut out = Vec::new();
    if let Some(c) = &cur {
        out.push((c.clone(), true));
    }
    if let Some(dir) = dir_of(fs, key)? {
        for k in kept(fs, dir)? {
            // A second name of the current object (a write cut short by a crash).
            if cur.as_ref().is_some_and(|c| c.ino == k.obj.ino) {
                continue;
            }
            let latest = out.is_empty();
            out.push((k.obj, latest));
        }
    }
    Ok(out)
}

/// The keys that have versions kept, within `prefix`, sorted.
pub fn keys_with_versions(fs: &Fs, prefix: &str) -> Res<Vec<String>> {
    let Ok(own) = fs.lookup(&root(), ROOT_INO, name(OWN_DIR)) else {
        return Ok(Vec::new());
    };
    let Ok(v) = fs.lookup(&root(), own.ino, name(VERSIONS)) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for (_, _, ino, kind) in store::entries(fs, v.ino, false)? {
        if kind != FileKind::Dir {
            continue;
        }
        let Ok(k) = fs.getxattr(&root(), ino, name(KEY)) else {
            continue;
        };
        if let Ok(k) = String::from_utf8(k) {
            if k.starts_with(prefix) {
                out.push(k);
            }
        }
    }
    out.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    Ok(out)
}

/// Whether any key has versions kept.
pub fn any(fs: &Fs) -> Res<bool> {
    Ok(!keys_with_versions(fs, "")?.is_empty())
}

/// Mends what a crash may have left half done: every key without a current object whose
/// newest version is not a delete marker gets that version back in its place. Returns
/// how many keys were mended.
pub fn settle_all(fs: &Fs) -> Res<usize> {
    let mut n = 0;
    for k in keys_with_versions(fs, "")? {
        let before = store::find(fs, &k)?.is_some();
        settle(fs, &k)?;
        if !before && store::find(fs, &k)?.is_some() {
            n += 1;
        }
    }
    if n > 0 {
        fs.fsync(ROOT_INO, false)?;
    }
    Ok(n)
}

/// One page of ListObjectVersions.
#[derive(Debug, Default)]
pub struct VersionListing {
    /// (key, version, is latest)
    pub versions: Vec<(String, Obj, bool)>,
    pub prefixes: Vec<String>,
    pub truncated: bool,
    pub next_key: Option<String>,
    pub next_version: Option<String>,
}

/// An item of a listing in key order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Item {
    Key(String),
    Prefix(String),
}

impl Item {
    fn text(&self) -> &str {
        match self {
            Item::Key(k) | Item::Prefix(k) => k,
        }
    }
}

/// The versions of the keys within `prefix`, in key order (each key's newest first),
/// rolled up into common prefixes at `delimiter`, starting after `key_marker` (or, with
/// `version_marker`, after that version of `key_marker`); at most `max` entries.
pub fn list_versions(
    fs: &Fs,
    prefix: &str,
    delimiter: Option<&str>,
    key_marker: &str,
    version_marker: Option<&str>,
    max: usize,
) -> Res<VersionListing> {
    let delimiter = delimiter.filter(|d| !d.is_empty());
    let roll = |k: &str| -> Item {
        let rest = &k[prefix.len()..];
        match delimiter.and_then(|d| rest.find(d).map(|i| i + d.len())) {
            Some(end) => Item::Prefix(k[..prefix.len() + end].to_string()),
            None => Item::Key(k.to_string()),
        }
    };
    let mut out = VersionListing::default();
    let mut count = 0usize;
    if let (Some(v), false) = (version_marker, key_marker.is_empty()) {
        if key_marker.starts_with(prefix)
            && matches!(roll(key_marker), Item::Key(_))
            && !emit(fs, &mut out, &mut count, max, key_marker, Some(v))?
        {
            return Ok(out);
        }
    }
    let kept_keys = keys_with_versions(fs, prefix)?;
    let mut kept_iter = kept_keys
        .iter()
        .filter(|k| k.as_str() > key_marker)
        .map(|k| roll(k))
        .peekable();
    let mut after = key_marker.to_string();
    let mut last: Option<Item> = None;
    loop {
        let page = store::list(fs, prefix, delimiter, &after, 1000)?;
        let mut live: Vec<Item> = page
            .objects
            .iter()
            .map(|(k, _)| Item::Key(k.clone()))
            .chain(page.prefixes.iter().map(|p| Item::Prefix(p.clone())))
            .collect();
        live.sort_by(|a, b| a.text().as_bytes().cmp(b.text().as_bytes()));
        // The kept keys up to where this page ends (all of them on the last page).
        let bound = page.last.clone().filter(|_| page.truncated);
        let mut merged: Vec<Item> = live;
        while let Some(it) = kept_iter.peek() {
            if bound
                .as_deref()
                .is_some_and(|b| it.text().as_bytes() > b.as_bytes())
            {
                break;
            }
            merged.push(kept_iter.next().expect("peeked"));
        }
        merged.sort_by(|a, b| a.text().as_bytes().cmp(b.text().as_bytes()));
        merged.dedup();
        for it in merged {
            if last.as_ref() == Some(&it) {
                continue;
            }
            if it.text() <= key_marker {
                continue;
            }
            last = Some(it.clone());
            match it {
                Item::Prefix(p) => {
                    if count == max {
                        out.truncated = true;
                        return Ok(out);
                    }
                    out.next_key = Some(p.clone());
                    out.next_version = None;
                    out.prefixes.push(p);
                    count += 1;
                }
                Item::Key(k) => {
                    if !emit(fs, &mut out, &mut count, max, &k, None)? {
                        return Ok(out);
                    }
                }
            }
        }
        match bound {
            Some(b) => after = b,
            None => break,
        }
    }
    out.next_key = None;
    out.next_version = None;
    Ok(out)
}

/// Adds the versions of `key` to a listing (after the version `skip_through`, when given):
/// false once the page is full.
fn emit(
    fs: &Fs,
    out: &mut VersionListing,
    count: &mut usize,
    max: usize,
    key: &str,
    skip_through: Option<&str>,
) -> Res<bool> {
    let mut vs = versions_of(fs, key)?;
    if let Some(v) = skip_through {
        match vs.iter().position(|(o, _)| o.version_id() == v) {
            Some(i) => {
                vs.drain(..=i);
            }
            None => vs.clear(),
        }
    }
    for (o, latest) in vs {
        if *count == max {
            out.truncated = true;
            return Ok(false);
        }
        out.next_key = Some(key.to_string());
        out.next_version = Some(o.version_id());
        out.versions.push((key.to_string(), o, latest));
        *count += 1;
    }
    Ok(true)
}

/// The retention of `o` may be set to `next` by a caller who may (or may not) bypass
/// governance: a COMPLIANCE retention is only lengthened, a GOVERNANCE one shortened or
/// removed only with the bypass.
pub fn may_set_retention(o: &Obj, next: Option<&Retention>, bypass: bool) -> Result<(), String> {
    let Some(cur) = o.retention.as_ref().filter(|r| r.until > now_ms()) else {
        return Ok(());
    };
    let weaker = match next {
        None => true,
        Some(n) => n.until < cur.until || (cur.mode == "COMPLIANCE" && n.mode != "COMPLIANCE"),
    };
    if !weaker {
        return Ok(());
    }
    if cur.mode == "COMPLIANCE" {
        return Err("a COMPLIANCE retention can only be lengthened".into());
    }
    if !bypass {
        return Err(
            "a GOVERNANCE retention is shortened or removed only with x-amz-bypass-governance-retention"
                .into(),
        );
    }
    Ok(())
}

/// A bucket's default retention (ObjectLockConfiguration's rule), kept as its `lock`
/// setting.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DefaultLock {
    pub mode: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub days: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub years: Option<i32>,
}

/// The bucket's default retention rule, if one is set.
pub fn default_lock(fs: &Fs) -> Res<Option<DefaultLock>> {
    Ok(store::bucket_conf(fs, "lock")?.and_then(|v| serde_json::from_slice(&v).ok()))
}

/// What Object Lock a new object of a bucket gets: none outside lock buckets; the
/// request's retention and legal hold, or the bucket's default retention.
pub fn lock_of(
    fs: &Fs,
    object_lock: bool,
    explicit: Option<Retention>,
    legal_hold: bool,
) -> Res<Option<(Option<Retention>, bool)>> {
    if !object_lock {
        return Ok(None);
    }
    let retention = match explicit {
        Some(r) => Some(r),
        None => default_lock(fs)?.map(|d| {
            let days = i64::from(d.days.unwrap_or(0)) + 365 * i64::from(d.years.unwrap_or(0));
            Retention {
                mode: d.mode,
                until: now_ms() + days * 86_400_000,
            }
        }),
    };
    Ok(Some((retention, legal_hold)))
}
