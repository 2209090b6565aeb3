//! Multipart uploads.
//!
//! # Theory of operation
//! An upload is the directory `.tank-s3/uploads/<id>` of the bucket's dataset, its
//! `user.s3.upload` attribute holding the key, the metadata and who started it; each part
//! is a file there named by its number, with its ETag and size in `user.s3.part`. A part
//! is received like a PUT (length and digests checked, into `.tank-s3/tmp/` first) and is
//! durable before its 200. Completing checks the list the client sends (ascending, each
//! part there with the ETag it was given, all but the last at least 5 MiB), writes the
//! parts one after the other into a new file and makes it the object the way a PUT does:
//! durable before the 200, whole or not at all. The parts are copied: the engine has no
//! block cloning yet that would let the new file point at the parts' blocks. The ETag is
//! S3's: the MD5 of the parts' MD5s, then `-` and the number of parts. Abort removes the
//! upload and its parts. Uploads outlive restarts; a crash during a complete leaves the
//! upload as it was (the object appears only at the final rename).

use std::ffi::OsStr;

use md5::{Digest, Md5};
use s3s::dto::*;
use s3s::{s3_error, S3Request, S3Response, S3Result};
use serde::{Deserialize, Serialize};
use tank_dataset::posix::{Cred, FileKind, Fs, Ino, RenameFlags, XattrMode};
use tank_dataset::Errno;

use crate::buckets::Versioning;
use crate::ops::{check_key, lock_headers, meta_of, receive, s3_errno, ts, Digests, TankS3};
use crate::store::{self, blocking, Meta, NewObject, Res, Retention, UPLOAD};
use crate::versions;

/// A part's attribute.
const PART: &str = "user.s3.part";
/// The smallest part but the last (S3's limit).
const MIN_PART: u64 = 5 << 20;
/// The largest part.
const MAX_PART: u64 = 5 << 30;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Upload {
    key: String,
    meta: Meta,
    owner: (u32, u32),
    initiator: String,
    /// Seconds since 1970.
    created: i64,
    /// Object Lock asked for by the upload's headers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    retention: Option<Retention>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    legal_hold: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Part {
    etag: String,
    size: u64,
}

fn root() -> Cred {
    Cred::root()
}

fn upload_dir(fs: &Fs, id: &str) -> Res<Option<(Ino, Upload)>> {
    if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Ok(None);
    }
    let uploads = store::own_dir(fs, "uploads")?;
    match fs.lookup(&root(), uploads, OsStr::new(id)) {
        Ok(a) => {
            let u = fs
                .getxattr(&root(), a.ino, OsStr::new(UPLOAD))
                .ok()
                .and_then(|v| serde_json::from_slice(&v).ok());
            Ok(u.map(|u| (a.ino, u)))
        }
        Err(e) if e == Errno::ENOENT => Ok(None),
        Err(e) => Err(e),
    }
}

fn part_name(n: i32) -> String {
    format!("{n:05}")
}

/// The parts of an upload, by number.
fn parts(fs: &Fs, dir: Ino) -> Res<Vec<(i32, Ino, Part, tank_dataset::posix::Timespec)>> {
    let mut out = Vec::new();
    let mut cookie = 0;
    loop {
        let batch = fs.readdir(&root(), dir, cookie, 1024)?;
        let Some(last) = batch.last() else { break };
        cookie = last.cookie;
        for e in batch {
            if e.kind != FileKind::File {
                continue;
            }
            let Some(n) = std::str::from_utf8(&e.name)
                .ok()
                .and_then(|s| s.parse::<i32>().ok())
            else {
                continue;
            };
            let Some(p) = fs
                .getxattr(&root(), e.ino, OsStr::new(PART))
                .ok()
                .and_then(|v| serde_json::from_slice::<Part>(&v).ok())
            else {
                continue;
            };
            let a = fs.getattr(e.ino)?;
            out.push((n, e.ino, p, a.mtime));
        }
    }
    out.sort_by_key(|x| x.0);
    Ok(out)
}

/// Removes an upload's directory and parts.
fn remove_upload(fs: &Fs, id: &str, dir: Ino) -> Res<()> {
    let mut cookie = 0;
    let mut names = Vec::new();
    loop {
        let batch = fs.readdir(&root(), dir, cookie, 1024)?;
        let Some(last) = batch.last() else { break };
        cookie = last.cookie;
        names.extend(
            batch
                .into_iter()
                .filter(|e| e.name != b"." && e.name != b"..")
                .map(|e| e.name),
        );
    }
    for n in names {
        use std::os::unix::ffi::OsStrExt;
        fs.unlink(&root(), dir, OsStr::from_bytes(&n))?;
    }
    let uploads = store::own_dir(fs, "uploads")?;
    fs.rmdir(&root(), uploads, OsStr::new(id))
}

fn no_upload() -> s3s::S3Error {
    s3_error!(NoSuchUpload, "The specified upload does not exist. The upload ID may be invalid, or the upload may have been aborted or completed.")
}

pub async fn create(
    s: &TankS3,
    req: S3Request<CreateMultipartUploadInput>,
) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
    let p = s.principal(req.credentials.as_ref())?;
    let i = req.input;
    check_key(&i.key)?;
    let (b, fs) = s.bucket(&i.bucket, &p, true)?;
    let (retention, legal_hold) = lock_headers(
        &b,
        i.object_lock_mode.as_ref(),
        i.object_lock_retain_until_date.as_ref(),
        i.object_lock_legal_hold_status.as_ref(),
    )?;
    let up = Upload {
        retention,
        legal_hold,
        key: i.key.clone(),
        meta: meta_of(
            i.content_type,
            i.content_encoding,
            i.content_disposition,
            i.content_language,
            i.cache_control,
            i.expires,
            i.metadata,
            i.tagging,
        ),
        owner: p.owner(),
        initiator: p.user.as_ref().map(|u| u.name.clone()).unwrap_or_default(),
        created: time::OffsetDateTime::now_utc().unix_timestamp(),
    };
    let id = format!("{:032x}", rand::random::<u128>());
    let id2 = id.clone();
    blocking(fs, move |f| {
        let uploads = store::own_dir(f, "uploads")?;
        let d = f.mkdir(&root(), uploads, OsStr::new(&id2), 0o700)?;
        let v = serde_json::to_vec(&up).map_err(|_| Errno::EIO)?;
        f.setxattr(&root(), d.ino, OsStr::new(UPLOAD), &v, XattrMode::Create)?;
        f.fsync(d.ino, false)
    })
    .await
    .map_err(s3_errno)?;
    Ok(S3Response::new(CreateMultipartUploadOutput {
        bucket: Some(i.bucket),
        key: Some(i.key),
        upload_id: Some(id),
        ..CreateMultipartUploadOutput::default()
    }))
}

pub async fn upload_part(
    s: &TankS3,
    req: S3Request<UploadPartInput>,
) -> S3Result<S3Response<UploadPartOutput>> {
    let p = s.principal(req.credentials.as_ref())?;
    let i = req.input;
    let (_b, fs) = s.bucket(&i.bucket, &p, true)?;
    if !(1..=10_000).contains(&i.part_number) {
        return Err(s3_error!(InvalidArgument, "a part number is 1 to 10,000"));
    }
    let id = i.upload_id.clone();
    let (dir, up) = blocking(fs.clone(), move |f| upload_dir(f, &id))
        .await
        .map_err(s3_errno)?
        .ok_or_else(no_upload)?;
    if up.key != i.key {
        return Err(no_upload());
    }
    let digests = Digests::new(
        i.content_md5.as_deref(),
        i.checksum_algorithm.as_ref(),
        Checksum {
            checksum_crc32: i.checksum_crc32.clone(),
            checksum_crc32c: i.checksum_crc32c.clone(),
            checksum_sha1: i.checksum_sha1.clone(),
            checksum_sha256: i.checksum_sha256.clone(),
            checksum_crc64nvme: i.checksum_crc64nvme.clone(),
            ..Checksum::default()
        },
    )?;
    let got = receive(
        &fs,
        i.body,
        i.content_length,
        MAX_PART,
        digests,
        req.trailing_headers.as_ref(),
    )
    .await?;
    let etag = hex::encode(got.md5);
    let part = Part {
        etag: etag.clone(),
        size: got.len,
    };
    let (tmp, n, ino, num) = (got.tmp, got.name.clone(), got.ino, i.part_number);
    blocking(fs, move |f| {
        let r = (|| {
            let v = serde_json::to_vec(&part).map_err(|_| Errno::EIO)?;
            f.setxattr(&root(), ino, OsStr::new(PART), &v, XattrMode::Any)?;
            f.rename(
                &root(),
                tmp,
                OsStr::new(&n),
                dir,
                OsStr::new(&part_name(num)),
                RenameFlags::default(),
            )?;
            f.fsync(ino, false)
        })();
        if r.is_err() {
            store::discard(f, tmp, &n);
        }
        r
    })
    .await
    .map_err(s3_errno)?;
    let c = got.checksum;
    Ok(S3Response::new(UploadPartOutput {
        e_tag: Some(ETag::Strong(etag)),
        checksum_crc32: c.checksum_crc32,
        checksum_crc32c: c.checksum_crc32c,
        checksum_sha1: c.checksum_sha1,
        checksum_sha256: c.checksum_sha256,
        checksum_crc64nvme: c.checksum_crc64nvme,
        ..UploadPartOutput::default()
    }))
}

pub async fn complete(
    s: &TankS3,
    req: S3Request<CompleteMultipartUploadInput>,
) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
    let p = s.principal(req.credentials.as_ref())?;
    let i = req.input;
    let (b, fs) = s.bucket(&i.bucket, &p, true)?;
    let id = i.upload_id.clone();
    let (dir, up) = blocking(fs.clone(), move |f| upload_dir(f, &id))
        .await
        .map_err(s3_errno)?
        .ok_or_else(no_upload)?;
    if up.key != i.key {
        return Err(no_upload());
    }
    let listed: Vec<(i32, String)> = i
        .multipart_upload
        .and_then(|m| m.parts)
        .unwrap_or_default()
        .into_iter()
        .map(|c| {
            (
                c.part_number.unwrap_or(0),
                c.e_tag
                    .map(|t| t.value().trim_matches('"').to_string())
                    .unwrap_or_default(),
            )
        })
        .collect();
    if listed.is_empty() {
        return Err(s3_error!(
            MalformedXML,
            "a complete names at least one part"
        ));
    }
    if listed.windows(2).any(|w| w[0].0 >= w[1].0) {
        return Err(s3_error!(
            InvalidPartOrder,
            "The list of parts was not in ascending order."
        ));
    }
    if i.if_none_match.is_some() || i.if_match.is_some() {
        let k = i.key.clone();
        let cur = blocking(fs.clone(), move |f| store::find(f, &k))
            .await
            .map_err(s3_errno)?;
        match (&cur, &i.if_none_match, &i.if_match) {
            (Some(_), Some(ETagCondition::Any), _) => {
                return Err(s3_error!(
                    PreconditionFailed,
                    "the key exists (If-None-Match: *)"
                ))
            }
            (None, _, Some(_)) => {
                return Err(s3_error!(NoSuchKey, "The specified key does not exist."))
            }
            (Some(o), _, Some(ETagCondition::ETag(t))) if t.value() != o.etag => {
                return Err(s3_error!(PreconditionFailed, "If-Match: the ETag differs"))
            }
            _ => {}
        }
    }
    let have = blocking(fs.clone(), move |f| parts(f, dir))
        .await
        .map_err(s3_errno)?;
    let mut chosen = Vec::new();
    for (num, etag) in &listed {
        let Some((_, ino, part, _)) = have.iter().find(|x| x.0 == *num) else {
            return Err(s3_error!(InvalidPart, "part {num} was not uploaded"));
        };
        if *etag != part.etag {
            return Err(s3_error!(InvalidPart, "part {num}'s ETag is not {etag}"));
        }
        chosen.push((*ino, part.clone()));
    }
    // Sizes once every part is known to be there (a missing part is InvalidPart).
    for (k, (num, _)) in listed.iter().enumerate() {
        if k + 1 < listed.len() && chosen[k].1.size < MIN_PART {
            return Err(s3_error!(
                EntityTooSmall,
                "part {num} is smaller than 5 MiB"
            ));
        }
    }
    let mut h = Md5::new();
    for (_, part) in &chosen {
        let raw = hex::decode(&part.etag).map_err(|_| s3_error!(InternalError, "a part's ETag"))?;
        h.update(&raw);
    }
    let etag = format!("{}-{}", hex::encode(h.finalize()), chosen.len());
    let key = i.key.clone();
    let upload_id = i.upload_id.clone();
    let nparts = chosen.len() as u32;
    let (versioning, object_lock) = (b.versioning, b.object_lock);
    let (buckets, dataset) = (s.buckets.clone(), b.dataset.clone());
    let o = blocking(fs, move |f| {
        let _key = (versioning != Versioning::Off).then(|| buckets.key_lock(&dataset, &key));
        let lock = versions::lock_of(f, object_lock, up.retention.clone(), up.legal_hold)?;
        let (tmp, n, ino) = store::begin(f)?;
        let copied = (|| {
            let mut at = 0u64;
            for (pino, part) in &chosen {
                let mut off = 0u64;
                while off < part.size {
                    let v = store::read(f, *pino, off, store::PIECE)?;
                    if v.is_empty() {
                        return Err(Errno::EIO);
                    }
                    store::write(f, ino, at + off, &v)?;
                    off += v.len() as u64;
                }
                at += part.size;
            }
            Ok(())
        })();
        if let Err(e) = copied {
            store::discard(f, tmp, &n);
            return Err(e);
        }
        let o = store::commit(
            f,
            tmp,
            &n,
            ino,
            NewObject {
                key: &key,
                etag,
                meta: up.meta,
                owner: up.owner,
                parts: nparts,
                versioning,
                lock,
                upload: Some(upload_id.clone()),
            },
        )?;
        // The object is durable; the upload goes (a crash before this leaves parts that
        // an abort, or the next complete, removes).
        remove_upload(f, &upload_id, dir)?;
        f.fsync(o.ino, false)?;
        Ok(o)
    })
    .await
    .map_err(s3_errno)?;
    b.changed(tank_service::handles::Changed {
        inodes: vec![o.ino],
        entries: Vec::new(),
    });
    Ok(S3Response::new(CompleteMultipartUploadOutput {
        bucket: Some(i.bucket),
        key: Some(i.key),
        e_tag: Some(ETag::Strong(o.etag.clone())),
        version_id: (versioning != Versioning::Off).then(|| o.version_id()),
        ..CompleteMultipartUploadOutput::default()
    }))
}

pub async fn abort(
    s: &TankS3,
    req: S3Request<AbortMultipartUploadInput>,
) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
    let p = s.principal(req.credentials.as_ref())?;
    let i = req.input;
    let (_b, fs) = s.bucket(&i.bucket, &p, true)?;
    let id = i.upload_id.clone();
    let key = i.key.clone();
    blocking(fs, move |f| {
        let Some((dir, up)) = upload_dir(f, &id)? else {
            return Err(Errno::ENOENT);
        };
        if up.key != key {
            return Err(Errno::ENOENT);
        }
        remove_upload(f, &id, dir)?;
        f.fsync(dir, false).or(Ok(()))
    })
    .await
    .map_err(|e| {
        if e == Errno::ENOENT {
            no_upload()
        } else {
            s3_errno(e)
        }
    })?;
    Ok(S3Response::new(AbortMultipartUploadOutput::default()))
}

pub async fn list_parts(
    s: &TankS3,
    req: S3Request<ListPartsInput>,
) -> S3Result<S3Response<ListPartsOutput>> {
    let p = s.principal(req.credentials.as_ref())?;
    let i = req.input;
    let (_b, fs) = s.bucket_to_list(&i.bucket, &p)?;
    let id = i.upload_id.clone();
    let (found, all) = blocking(fs, move |f| {
        let Some((dir, up)) = upload_dir(f, &id)? else {
            return Ok((None, Vec::new()));
        };
        Ok((Some(up), parts(f, dir)?))
    })
    .await
    .map_err(s3_errno)?;
    let up = found.filter(|u| u.key == i.key).ok_or_else(no_upload)?;
    let after = i.part_number_marker.unwrap_or(0);
    let max = i.max_parts.unwrap_or(1000).clamp(0, 1000) as usize;
    let rest: Vec<_> = all.into_iter().filter(|x| x.0 > after).collect();
    let truncated = rest.len() > max;
    let page: Vec<_> = rest.into_iter().take(max).collect();
    let next = page.last().map(|x| x.0);
    Ok(S3Response::new(ListPartsOutput {
        bucket: Some(i.bucket),
        key: Some(i.key),
        upload_id: Some(i.upload_id),
        part_number_marker: i.part_number_marker,
        next_part_number_marker: if truncated { next } else { None },
        max_parts: Some(max as i32),
        is_truncated: Some(truncated),
        initiator: Some(Initiator {
            display_name: Some(up.initiator.clone()),
            id: Some(up.owner.0.to_string()),
        }),
        owner: Some(Owner {
            display_name: Some(up.initiator),
            id: Some(up.owner.0.to_string()),
        }),
        storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
        parts: Some(
            page.into_iter()
                .map(|(n, _, part, mtime)| s3s::dto::Part {
                    part_number: Some(n),
                    e_tag: Some(ETag::Strong(part.etag)),
                    size: Some(part.size as i64),
                    last_modified: Some(ts(mtime)),
                    ..s3s::dto::Part::default()
                })
                .collect(),
        ),
        ..ListPartsOutput::default()
    }))
}

pub async fn list_uploads(
    s: &TankS3,
    req: S3Request<ListMultipartUploadsInput>,
) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
    let p = s.principal(req.credentials.as_ref())?;
    let i = req.input;
    let (_b, fs) = s.bucket_to_list(&i.bucket, &p)?;
    let prefix = i.prefix.clone().unwrap_or_default();
    let mut all = blocking(fs, move |f| {
        let uploads = store::own_dir(f, "uploads")?;
        let mut out = Vec::new();
        let mut cookie = 0;
        loop {
            let batch = f.readdir(&root(), uploads, cookie, 1024)?;
            let Some(last) = batch.last() else { break };
            cookie = last.cookie;
            for e in batch {
                let Ok(id) = String::from_utf8(e.name) else {
                    continue;
                };
                if e.kind != FileKind::Dir || id.len() != 32 {
                    continue;
                }
                if let Some((_, up)) = upload_dir(f, &id)? {
                    out.push((up.key.clone(), id, up));
                }
            }
        }
        Ok(out)
    })
    .await
    .map_err(s3_errno)?;
    all.retain(|(k, _, _)| k.starts_with(&prefix));
    all.sort_by(|a, b| {
        a.0.as_bytes()
            .cmp(b.0.as_bytes())
            .then(a.2.created.cmp(&b.2.created))
    });
    let key_marker = i.key_marker.clone().unwrap_or_default();
    let id_marker = i.upload_id_marker.clone().unwrap_or_default();
    all.retain(|(k, id, _)| {
        k.as_str() > key_marker.as_str()
            || (*k == key_marker && !id_marker.is_empty() && *id > id_marker)
    });
    let max = i.max_uploads.unwrap_or(1000).clamp(0, 1000) as usize;
    let truncated = all.len() > max;
    all.truncate(max);
    let last = all.last().map(|(k, id, _)| (k.clone(), id.clone()));
    Ok(S3Response::new(ListMultipartUploadsOutput {
        bucket: Some(i.bucket),
        prefix: i.prefix,
        key_marker: i.key_marker,
        upload_id_marker: i.upload_id_marker,
        next_key_marker: truncated.then(|| last.clone().map(|l| l.0)).flatten(),
        next_upload_id_marker: truncated.then(|| last.map(|l| l.1)).flatten(),
        max_uploads: Some(max as i32),
        is_truncated: Some(truncated),
        uploads: Some(
            all.into_iter()
                .map(|(k, id, up)| MultipartUpload {
                    key: Some(k),
                    upload_id: Some(id),
                    initiated: Some(ts(tank_dataset::posix::Timespec {
                        sec: up.created,
                        nsec: 0,
                    })),
                    initiator: Some(Initiator {
                        display_name: Some(up.initiator.clone()),
                        id: Some(up.owner.0.to_string()),
                    }),
                    owner: Some(Owner {
                        display_name: Some(up.initiator),
                        id: Some(up.owner.0.to_string()),
                    }),
                    storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
                    ..MultipartUpload::default()
                })
                .collect(),
        ),
        ..ListMultipartUploadsOutput::default()
    }))
}

/// A part copied from an object (all of it, or `bytes=FIRST-LAST` of it), in this bucket or
/// another the caller may read.
pub async fn upload_part_copy(
    s: &TankS3,
    req: S3Request<UploadPartCopyInput>,
) -> S3Result<S3Response<UploadPartCopyOutput>> {
    let p = s.principal(req.credentials.as_ref())?;
    let i = req.input;
    if !(1..=10_000).contains(&i.part_number) {
        return Err(s3_error!(InvalidArgument, "a part number is 1 to 10,000"));
    }
    let CopySource::Bucket {
        bucket: sb,
        key: sk,
        version_id: sv,
    } = &i.copy_source
    else {
        return Err(s3_error!(NotImplemented, "copies from access points"));
    };
    let (_sbk, sfs) = s.bucket(sb, &p, false)?;
    let (_b, fs) = s.bucket(&i.bucket, &p, true)?;
    let id = i.upload_id.clone();
    let (dir, up) = blocking(fs.clone(), move |f| upload_dir(f, &id))
        .await
        .map_err(s3_errno)?
        .ok_or_else(no_upload)?;
    if up.key != i.key {
        return Err(no_upload());
    }
    let src = s.find_version(&sfs, sk, sv.as_deref()).await?;
    crate::ops::preconditions(
        &src,
        i.copy_source_if_match.as_ref(),
        i.copy_source_if_none_match.as_ref(),
        i.copy_source_if_modified_since.as_ref(),
        i.copy_source_if_unmodified_since.as_ref(),
        s3s::S3ErrorCode::PreconditionFailed,
    )?;
    let (start, end) = match i.copy_source_range.as_deref() {
        None => (0, src.size),
        Some(r) => {
            let bad = || {
                s3_error!(
                    InvalidArgument,
                    "x-amz-copy-source-range is bytes=FIRST-LAST"
                )
            };
            let (a, b) = r
                .strip_prefix("bytes=")
                .and_then(|x| x.split_once('-'))
                .ok_or_else(bad)?;
            let (a, b): (u64, u64) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
            if a > b || b >= src.size {
                return Err(s3_error!(
                    InvalidRange,
                    "The requested range is not satisfiable"
                ));
            }
            (a, b + 1)
        }
    };
    if end - start > MAX_PART {
        return Err(s3_error!(EntityTooLarge, "a part has at most 5 GiB"));
    }
    let (s_ino, num) = (src.ino, i.part_number);
    let sfs2 = sfs.clone();
    let (etag, mtime) = blocking(fs, move |f| {
        let (tmp, n, ino) = store::begin(f)?;
        let r = (|| {
            store::open(&sfs2, s_ino)?;
            let mut h = Md5::new();
            let copied = (|| {
                let mut at = start;
                while at < end {
                    let want = (end - at).min(u64::from(store::PIECE)) as u32;
                    let v = store::read(&sfs2, s_ino, at, want)?;
                    if v.is_empty() {
                        return Err(Errno::EIO);
                    }
                    h.update(&v);
                    store::write(f, ino, at - start, &v)?;
                    at += v.len() as u64;
                }
                Ok(())
            })();
            store::close(&sfs2, s_ino);
            copied?;
            let etag = hex::encode(h.finalize());
            let part = Part {
                etag: etag.clone(),
                size: end - start,
            };
            let v = serde_json::to_vec(&part).map_err(|_| Errno::EIO)?;
            f.setxattr(&root(), ino, OsStr::new(PART), &v, XattrMode::Any)?;
            f.rename(
                &root(),
                tmp,
                OsStr::new(&n),
                dir,
                OsStr::new(&part_name(num)),
                RenameFlags::default(),
            )?;
            f.fsync(ino, false)?;
            Ok((etag, f.getattr(ino)?.mtime))
        })();
        if r.is_err() {
            store::discard(f, tmp, &n);
        }
        r
    })
    .await
    .map_err(s3_errno)?;
    Ok(S3Response::new(UploadPartCopyOutput {
        copy_part_result: Some(CopyPartResult {
            e_tag: Some(ETag::Strong(etag)),
            last_modified: Some(ts(mtime)),
            ..CopyPartResult::default()
        }),
        ..UploadPartCopyOutput::default()
    }))
}

/// Removes every upload for which `gone` says so: how many were removed.
fn remove_uploads_where(
    fs: &Fs,
    mut gone: impl FnMut(&Fs, &str, &Upload) -> Res<bool>,
) -> Res<usize> {
    let Ok(own) = fs.lookup(
        &root(),
        tank_dataset::posix::ROOT_INO,
        OsStr::new(crate::keys::OWN_DIR),
    ) else {
        return Ok(0);
    };
    let Ok(uploads) = fs.lookup(&root(), own.ino, OsStr::new("uploads")) else {
        return Ok(0);
    };
    let mut ids = Vec::new();
    let mut cookie = 0;
    loop {
        let batch = fs.readdir(&root(), uploads.ino, cookie, 1024)?;
        let Some(last) = batch.last() else { break };
        cookie = last.cookie;
        ids.extend(
            batch
                .into_iter()
                .filter(|e| e.kind == FileKind::Dir)
                .filter_map(|e| String::from_utf8(e.name).ok())
                .filter(|n| n != "." && n != ".."),
        );
    }
    let mut n = 0;
    for id in ids {
        let Some((dir, up)) = upload_dir(fs, &id)? else {
            continue;
        };
        if gone(fs, &id, &up)? {
            remove_upload(fs, &id, dir)?;
            n += 1;
        }
    }
    if n > 0 {
        fs.fsync(uploads.ino, false)?;
    }
    Ok(n)
}

/// Aborts the uploads of keys within `prefix` begun before `before` (seconds since 1970),
/// as a lifecycle rule does: how many were aborted.
pub fn abort_older(fs: &Fs, prefix: &str, before: i64) -> Res<usize> {
    remove_uploads_where(fs, |_, _, up| {
        Ok(up.key.starts_with(prefix) && up.created < before)
    })
}

/// Removes the uploads whose object was made and is durable but whose parts were not yet
/// removed when the server stopped (a crash within a complete): how many.
pub fn clean_completed(fs: &Fs) -> Res<usize> {
    remove_uploads_where(fs, |fs, id, up| {
        Ok(versions::versions_of(fs, &up.key)?.iter().any(|(o, _)| {
            store::record_of(fs, o.ino)
                .and_then(|r| r.upload)
                .as_deref()
                == Some(id)
        }))
    })
}
