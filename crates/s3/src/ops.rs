//! The S3 operations: s3s' `S3` trait on tank's buckets.
//!
//! # Theory of operation
//! Each operation finds who is asking (`auth.rs` checked the signature; the access key
//! names an account), finds the bucket and checks the caller's right to it (`buckets.rs`),
//! then does the work on the bucket's filesystem on a blocking thread (`store.rs`). Errors
//! of the filesystem become S3 error codes in one place, [`s3_errno`]. What s3s leaves to
//! the backend is done here: the conditional headers (If-Match, If-None-Match,
//! If-Modified-Since, If-Unmodified-Since), Content-MD5 and the `x-amz-checksum-*` values
//! (headers and trailers), the body's length against its Content-Length, and object-size
//! limits. A body that fails a check never becomes the object.

use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use md5::{Digest, Md5};
use s3s::checksum::ChecksumHasher;
use s3s::dto::*;
use s3s::{s3_error, S3Error, S3ErrorCode, S3Request, S3Response, S3Result, S3};
use tank_dataset::posix::{Fs, Timespec};
use tank_dataset::Errno;
use tank_service::api::{Request, Response};
use tank_service::{Caller, Service};

use crate::buckets::{Bucket, Buckets, Principal, Versioning};
use crate::keys::MAX_KEY;
use crate::multipart;
use crate::ops_bucket;
use crate::ops_versions;
use crate::store::{self, blocking, Meta, NewObject, Obj, Retention};
use crate::versions;

/// The largest object a single PUT may send (S3's limit).
pub const MAX_PUT: u64 = 5 << 30;
/// Bytes gathered before each write to the filesystem.
const WRITE_CHUNK: usize = 1 << 20;

/// Settings of the endpoint.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The region clients sign for and GetBucketLocation tells.
    pub region: String,
    /// Where buckets made through S3 go: `PARENT/BUCKET`.
    pub parent: Option<String>,
    /// How often the lifecycle rules are applied.
    pub lifecycle_interval: std::time::Duration,
    /// A lifecycle rule's day (a day, but for trying rules out).
    pub lifecycle_day: std::time::Duration,
    /// Accept requests signed with Signature Version 2 (no clock-skew check: a captured
    /// request can be replayed; off by default).
    pub allow_sigv2: bool,
}

/// tank's S3 backend.
pub struct TankS3 {
    pub(crate) svc: Arc<Service>,
    pub(crate) buckets: Arc<Buckets>,
    pub(crate) settings: Settings,
}

/// The S3 error for a filesystem error.
pub fn s3_errno(e: Errno) -> S3Error {
    match e {
        Errno::ENOENT => s3_error!(NoSuchKey, "The specified key does not exist."),
        Errno::ENOSPC | Errno::EDQUOT => {
            let mut err = S3Error::with_message(
                S3ErrorCode::Custom("InsufficientStorage".into()),
                "the pool, or the bucket's quota, is full: free space and retry",
            );
            err.set_status_code(http::StatusCode::INSUFFICIENT_STORAGE);
            err
        }
        Errno::EROFS => s3_error!(AccessDenied, "the bucket is read-only"),
        Errno::EACCES | Errno::EPERM => s3_error!(AccessDenied, "Access Denied"),
        Errno::ENAMETOOLONG => s3_error!(KeyTooLongError, "Your key is too long"),
        Errno::EFBIG => s3_error!(
            EntityTooLarge,
            "Your proposed upload exceeds the maximum allowed object size."
        ),
        e => s3_error!(InternalError, "the filesystem answered errno {}", e.0),
    }
}

/// An S3 time from a filesystem time.
pub fn ts(t: Timespec) -> Timestamp {
    let nanos = i128::from(t.sec) * 1_000_000_000 + i128::from(t.nsec);
    time::OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
        .into()
}

fn secs(t: &Timestamp) -> i64 {
    time::OffsetDateTime::from(t.clone()).unix_timestamp()
}

/// Checks a key: not empty, at most 1,024 bytes.
pub fn check_key(key: &str) -> S3Result<()> {
    if key.is_empty() {
        return Err(s3_error!(InvalidArgument, "an empty key"));
    }
    if key.len() > MAX_KEY {
        return Err(s3_error!(KeyTooLongError, "Your key is too long"));
    }
    Ok(())
}

/// How GET, HEAD and copies judge their conditions against the object `o`.
pub fn preconditions(
    o: &Obj,
    if_match: Option<&ETagCondition>,
    if_none_match: Option<&ETagCondition>,
    if_modified_since: Option<&Timestamp>,
    if_unmodified_since: Option<&Timestamp>,
    not_modified: S3ErrorCode,
) -> S3Result<()> {
    let matches = |c: &ETagCondition| match c {
        ETagCondition::Any => true,
        ETagCondition::ETag(t) => t.value() == o.etag,
    };
    let mtime = o.mtime.sec;
    if let Some(c) = if_match {
        if !matches(c) {
            return Err(s3_error!(PreconditionFailed, "If-Match: the ETag differs"));
        }
    } else if let Some(t) = if_unmodified_since {
        if mtime > secs(t) {
            return Err(s3_error!(
                PreconditionFailed,
                "modified since the time given"
            ));
        }
    }
    if let Some(c) = if_none_match {
        if matches(c) {
            return Err(S3Error::new(not_modified));
        }
    } else if let Some(t) = if_modified_since {
        if mtime <= secs(t) {
            return Err(S3Error::new(not_modified));
        }
    }
    Ok(())
}

/// The stream error of a body, as the S3 error a client expects.
fn body_error(e: &(dyn std::error::Error + Send + Sync)) -> S3Error {
    let s = e.to_string();
    if s.contains("Sha256Mismatch") {
        let mut err = S3Error::with_message(
            S3ErrorCode::Custom("XAmzContentSHA256Mismatch".into()),
            "the body's SHA-256 differs from x-amz-content-sha256",
        );
        err.set_status_code(http::StatusCode::BAD_REQUEST);
        err
    } else if s.contains("SignatureMismatch") {
        s3_error!(SignatureDoesNotMatch, "a chunk's signature does not match")
    } else {
        s3_error!(IncompleteBody, "the body ended early: {s}")
    }
}

/// The digests a body is checked against, and what was computed.
pub struct Digests {
    md5: Md5,
    hasher: ChecksumHasher,
    want_md5: Option<[u8; 16]>,
    want: Checksum,
}

impl Digests {
    /// From the request's Content-MD5 and `x-amz-checksum-*` headers (and the algorithm a
    /// trailer will carry).
    pub fn new(
        content_md5: Option<&str>,
        algorithm: Option<&ChecksumAlgorithm>,
        want: Checksum,
    ) -> S3Result<Digests> {
        let want_md5 = match content_md5 {
            None => None,
            Some(b) => {
                use base64::Engine;
                let raw = base64::engine::general_purpose::STANDARD
                    .decode(b.trim())
                    .map_err(|_| s3_error!(InvalidDigest, "Content-MD5 is not base64"))?;
                Some(
                    raw.try_into()
                        .map_err(|_| s3_error!(InvalidDigest, "Content-MD5 is not 16 bytes"))?,
                )
            }
        };
        let alg = algorithm.map(|a| a.as_str().to_ascii_uppercase());
        let on = |present: &Option<String>, name: &str| {
            present.is_some() || alg.as_deref() == Some(name)
        };
        let mut hasher = ChecksumHasher::default();
        if on(&want.checksum_crc32, "CRC32") {
            hasher.crc32 = Some(Default::default());
        }
        if on(&want.checksum_crc32c, "CRC32C") {
            hasher.crc32c = Some(Default::default());
        }
        if on(&want.checksum_sha1, "SHA1") {
            hasher.sha1 = Some(Default::default());
        }
        if on(&want.checksum_sha256, "SHA256") {
            hasher.sha256 = Some(Default::default());
        }
        if on(&want.checksum_crc64nvme, "CRC64NVME") {
            hasher.crc64nvme = Some(Default::default());
        }
        Ok(Digests {
            md5: Md5::new(),
            hasher,
            want_md5,
            want,
        })
    }

    pub fn update(&mut self, b: &[u8]) {
        self.md5.update(b);
        self.hasher.update(b);
    }

    /// Checks what was received against what was announced (trailers included): the MD5
    /// (the ETag) and the checksums computed.
    pub fn finish(self, trailers: Option<&http::HeaderMap>) -> S3Result<([u8; 16], Checksum)> {
        let md5: [u8; 16] = self.md5.finalize().into();
        if let Some(w) = self.want_md5 {
            if w != md5 {
                return Err(s3_error!(
                    BadDigest,
                    "the Content-MD5 you specified did not match what was received"
                ));
            }
        }
        let got = self.hasher.finalize();
        let mut want = self.want;
        if let Some(t) = trailers {
            let h = |n: &str| t.get(n).and_then(|v| v.to_str().ok()).map(str::to_string);
            want.checksum_crc32 = want.checksum_crc32.or(h("x-amz-checksum-crc32"));
            want.checksum_crc32c = want.checksum_crc32c.or(h("x-amz-checksum-crc32c"));
            want.checksum_sha1 = want.checksum_sha1.or(h("x-amz-checksum-sha1"));
            want.checksum_sha256 = want.checksum_sha256.or(h("x-amz-checksum-sha256"));
            want.checksum_crc64nvme = want.checksum_crc64nvme.or(h("x-amz-checksum-crc64nvme"));
        }
        let pairs = [
            ("CRC32", &want.checksum_crc32, &got.checksum_crc32),
            ("CRC32C", &want.checksum_crc32c, &got.checksum_crc32c),
            ("SHA1", &want.checksum_sha1, &got.checksum_sha1),
            ("SHA256", &want.checksum_sha256, &got.checksum_sha256),
            (
                "CRC64NVME",
                &want.checksum_crc64nvme,
                &got.checksum_crc64nvme,
            ),
        ];
        for (name, w, g) in pairs {
            if let (Some(w), Some(g)) = (w, g) {
                if w != g {
                    return Err(s3_error!(
                        BadDigest,
                        "the {name} you specified did not match the calculated checksum"
                    ));
                }
            }
        }
        Ok((md5, got))
    }
}

/// A body received into a new file of `.tank-s3/tmp/`.
pub struct Received {
    pub tmp: u64,
    pub name: String,
    pub ino: u64,
    pub md5: [u8; 16],
    pub checksum: Checksum,
    pub len: u64,
}

/// Receives `body` into a new file, checking its length (`expected`, and at most `max`)
/// and its digests. On any failure the file is removed.
pub async fn receive(
    fs: &Arc<Fs>,
    body: Option<StreamingBlob>,
    expected: Option<i64>,
    max: u64,
    mut digests: Digests,
    trailers: Option<&s3s::TrailingHeaders>,
) -> S3Result<Received> {
    let (tmp, name, ino) = blocking(fs.clone(), store::begin).await.map_err(s3_errno)?;
    let r = receive_into(fs, body, expected, max, &mut digests, ino).await;
    let r = r.and_then(|len| {
        let t = trailers.and_then(s3s::TrailingHeaders::take);
        let (md5, checksum) = digests.finish(t.as_ref())?;
        Ok((len, md5, checksum))
    });
    match r {
        Ok((len, md5, checksum)) => Ok(Received {
            tmp,
            name,
            ino,
            md5,
            checksum,
            len,
        }),
        Err(e) => {
            let n = name.clone();
            let _ = blocking(fs.clone(), move |f| {
                store::discard(f, tmp, &n);
                Ok(())
            })
            .await;
            Err(e)
        }
    }
}

async fn receive_into(
    fs: &Arc<Fs>,
    body: Option<StreamingBlob>,
    expected: Option<i64>,
    max: u64,
    digests: &mut Digests,
    ino: u64,
) -> S3Result<u64> {
    if let Some(n) = expected {
        if n < 0 {
            return Err(s3_error!(InvalidArgument, "a negative Content-Length"));
        }
        if n as u64 > max {
            return Err(s3_error!(
                EntityTooLarge,
                "at most {max} bytes in one request"
            ));
        }
    }
    let mut len = 0u64;
    let mut buf: Vec<u8> = Vec::with_capacity(WRITE_CHUNK);
    let flush = |buf: Vec<u8>, at: u64| {
        let fs = fs.clone();
        async move {
            blocking(fs, move |f| store::write(f, ino, at, &buf))
                .await
                .map_err(s3_errno)
        }
    };
    if let Some(mut body) = body {
        while let Some(chunk) = body.next().await {
            let chunk: Bytes = chunk.map_err(|e| body_error(e.as_ref()))?;
            len += chunk.len() as u64;
            if len > max {
                return Err(s3_error!(
                    EntityTooLarge,
                    "at most {max} bytes in one request"
                ));
            }
            digests.update(&chunk);
            buf.extend_from_slice(&chunk);
            if buf.len() >= WRITE_CHUNK {
                let at = len - buf.len() as u64;
                flush(
                    std::mem::replace(&mut buf, Vec::with_capacity(WRITE_CHUNK)),
                    at,
                )
                .await?;
            }
        }
    }
    if !buf.is_empty() {
        let at = len - buf.len() as u64;
        flush(buf, at).await?;
    }
    if let Some(n) = expected {
        if len != n as u64 {
            return Err(s3_error!(
                IncompleteBody,
                "{len} bytes received, Content-Length said {n}"
            ));
        }
    }
    Ok(len)
}

/// The metadata a PUT or a multipart upload sends, `aws-chunked` taken out of its
/// Content-Encoding.
#[allow(clippy::too_many_arguments)]
pub fn meta_of(
    content_type: Option<String>,
    content_encoding: Option<String>,
    content_disposition: Option<String>,
    content_language: Option<String>,
    cache_control: Option<String>,
    expires: Option<Timestamp>,
    metadata: Option<Metadata>,
    tagging: Option<String>,
) -> Meta {
    let content_encoding = content_encoding
        .map(|e| {
            e.split(',')
                .map(str::trim)
                .filter(|x| !x.eq_ignore_ascii_case("aws-chunked") && !x.is_empty())
                .collect::<Vec<_>>()
                .join(",")
        })
        .filter(|e| !e.is_empty());
    let expires = expires.and_then(|t| {
        let mut v = Vec::new();
        t.format(TimestampFormat::HttpDate, &mut v).ok()?;
        String::from_utf8(v).ok()
    });
    Meta {
        content_type,
        content_encoding,
        content_disposition,
        content_language,
        cache_control,
        expires,
        user: metadata.unwrap_or_default().into_iter().collect(),
        tagging,
    }
}

fn expires_of(m: &Meta) -> Option<Timestamp> {
    m.expires
        .as_deref()
        .and_then(|s| Timestamp::parse(TimestampFormat::HttpDate, s).ok())
}

/// The number of `k=v` pairs of a tagging string.
fn tag_count(m: &Meta) -> Option<i32> {
    m.tagging
        .as_deref()
        .filter(|t| !t.is_empty())
        .map(|t| t.split('&').count() as i32)
}

/// Percent-encodes a key for `encoding-type=url` (every byte but the unreserved ones and
/// `/`).
pub fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn token_of(key: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(key)
}

fn key_of_token(t: &str) -> S3Result<String> {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(t)
        .ok()
        .and_then(|v| String::from_utf8(v).ok())
        .ok_or_else(|| s3_error!(InvalidArgument, "the continuation token is not one of ours"))
}

impl TankS3 {
    /// Who signed the request (none: anonymous).
    pub(crate) fn principal(&self, creds: Option<&s3s::auth::Credentials>) -> S3Result<Principal> {
        let Some(c) = creds else {
            return Ok(Principal::anonymous());
        };
        let accounts = self
            .svc
            .accounts()
            .map_err(|e| s3_error!(InternalError, "the account store: {e}"))?;
        let key = accounts
            .key(&c.access_key)
            .map_err(|e| s3_error!(InternalError, "the account store: {e}"))?
            .ok_or_else(|| {
                s3_error!(
                    InvalidAccessKeyId,
                    "The AWS Access Key Id you provided does not exist in our records."
                )
            })?;
        let user = accounts
            .user(&key.user)
            .map_err(|_| s3_error!(InvalidAccessKeyId, "the key's account is gone"))?;
        let groups = accounts
            .groups_of(&user.name)
            .map(|g| g.into_iter().map(|g| g.name).collect())
            .unwrap_or_default();
        Ok(Principal {
            user: Some(user),
            groups,
        })
    }

    /// The bucket `name` and its filesystem, if `p` may read it (or write it, with `write`).
    pub(crate) fn bucket(
        &self,
        name: &str,
        p: &Principal,
        write: bool,
    ) -> S3Result<(Arc<Bucket>, Arc<Fs>)> {
        let b = self
            .buckets
            .get(name)
            .ok_or_else(|| s3_error!(NoSuchBucket, "The specified bucket does not exist."))?;
        let allowed = if write { b.may_write(p) } else { b.may_read(p) };
        if !allowed {
            return Err(if write && b.readonly && b.may_read(p) {
                s3_error!(AccessDenied, "the bucket is read-only")
            } else {
                s3_error!(AccessDenied, "Access Denied")
            });
        }
        let fs = b.fs().ok_or_else(|| {
            s3_error!(
                ServiceUnavailable,
                "the bucket's dataset is being rolled back: retry"
            )
        })?;
        Ok((b, fs))
    }

    /// The bucket `name` and its filesystem, if `p` may list it.
    pub(crate) fn bucket_to_list(
        &self,
        name: &str,
        p: &Principal,
    ) -> S3Result<(Arc<Bucket>, Arc<Fs>)> {
        let (b, fs) = self.bucket(name, p, false)?;
        if !b.may_list(p) {
            return Err(s3_error!(AccessDenied, "Access Denied"));
        }
        Ok((b, fs))
    }

    /// Runs a management request as the S3 front end.
    fn manage(&self, req: Request) -> S3Result<Response> {
        let admin = Caller::Admin { name: "s3".into() };
        self.svc
            .handle(&admin, req, None)
            .0
            .map_err(|e| s3_error!(InternalError, "{e}"))
    }

    fn object_output(b: &Bucket, o: &Obj) -> GetObjectOutput {
        GetObjectOutput {
            version_id: (b.versioning != Versioning::Off || o.version.is_some())
                .then(|| o.version_id()),
            object_lock_mode: o
                .retention
                .as_ref()
                .map(|r| ObjectLockMode::from(r.mode.clone())),
            object_lock_retain_until_date: o.retention.as_ref().map(|r| ts_ms(r.until)),
            object_lock_legal_hold_status: b.object_lock.then(|| {
                ObjectLockLegalHoldStatus::from_static(if o.legal_hold { "ON" } else { "OFF" })
            }),
            content_length: Some(o.size as i64),
            e_tag: Some(ETag::Strong(o.etag.clone())),
            last_modified: Some(ts(o.mtime)),
            content_type: o.meta.content_type.clone(),
            content_encoding: o.meta.content_encoding.clone(),
            content_disposition: o.meta.content_disposition.clone(),
            content_language: o.meta.content_language.clone(),
            cache_control: o.meta.cache_control.clone(),
            expires: expires_of(&o.meta),
            metadata: (!o.meta.user.is_empty()).then(|| o.meta.user.clone().into_iter().collect()),
            accept_ranges: Some("bytes".into()),
            tag_count: tag_count(&o.meta),
            parts_count: (o.parts > 0).then_some(o.parts as i32),
            ..GetObjectOutput::default()
        }
    }

    async fn find(&self, fs: &Arc<Fs>, key: &str) -> S3Result<Obj> {
        self.find_version(fs, key, None).await
    }

    /// The object `key`, or its version `version`: NoSuchKey (a key whose latest version
    /// is a delete marker too), NoSuchVersion, or MethodNotAllowed for a delete marker.
    pub(crate) async fn find_version(
        &self,
        fs: &Arc<Fs>,
        key: &str,
        version: Option<&str>,
    ) -> S3Result<Obj> {
        let k = key.to_string();
        let v = version.map(str::to_string);
        let found = blocking(fs.clone(), move |f| match &v {
            Some(v) => versions::find(f, &k, v),
            None => store::find(f, &k),
        })
        .await
        .map_err(s3_errno)?;
        match (found, version) {
            (Some(o), _) if o.marker => Err(s3_error!(
                MethodNotAllowed,
                "The specified method is not allowed against this resource: the version is a delete marker."
            )),
            (Some(o), _) => Ok(o),
            (None, Some(_)) => Err(s3_error!(
                NoSuchVersion,
                "The specified version does not exist."
            )),
            (None, None) => Err(s3_error!(NoSuchKey, "The specified key does not exist.")),
        }
    }
}

/// The reader of a GET: the object's file stays open (readable even if replaced) until
/// the body is done or dropped.
struct Reading {
    fs: Arc<Fs>,
    ino: u64,
}

impl Drop for Reading {
    fn drop(&mut self) {
        store::close(&self.fs, self.ino);
    }
}

fn body_of(fs: Arc<Fs>, ino: u64, start: u64, end: u64) -> S3Result<StreamingBlob> {
    store::open(&fs, ino).map_err(s3_errno)?;
    let reading = Arc::new(Reading { fs, ino });
    let s = futures::stream::unfold((reading, start), move |(r, at)| async move {
        if at >= end {
            return None;
        }
        let n = (end - at).min(u64::from(store::PIECE)) as u32;
        let (fs, ino) = (r.fs.clone(), r.ino);
        let got = tokio::task::spawn_blocking(move || store::read(&fs, ino, at, n)).await;
        match got {
            Ok(Ok(v)) if !v.is_empty() => {
                let next = at + v.len() as u64;
                Some((Ok(Bytes::from(v)), (r, next)))
            }
            // The file shrank under the reader (another front end truncated it): the
            // response cannot be whole, so it is cut.
            Ok(Ok(_)) => Some((
                Err(std::io::Error::other("the object shrank while read")),
                (r, end),
            )),
            Ok(Err(e)) => Some((
                Err(std::io::Error::other(format!("read error: errno {}", e.0))),
                (r, end),
            )),
            Err(e) => Some((Err(std::io::Error::other(e.to_string())), (r, end))),
        }
    });
    Ok(StreamingBlob::wrap(s))
}

#[async_trait::async_trait]
impl S3 for TankS3 {
    async fn list_buckets(
        &self,
        req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        let p = self.principal(req.credentials.as_ref())?;
        let Some(u) = p.user.clone() else {
            return Err(s3_error!(
                AccessDenied,
                "ListBuckets needs a signed request"
            ));
        };
        let buckets = self
            .buckets
            .all()
            .into_iter()
            .filter(|b| b.member(&p))
            .map(|b| s3s::dto::Bucket {
                name: Some(b.name.clone()),
                creation_date: Some(ts(Timespec {
                    sec: b.created,
                    nsec: 0,
                })),
                bucket_region: Some(self.settings.region.clone()),
            })
            .collect();
        Ok(S3Response::new(ListBucketsOutput {
            buckets: Some(buckets),
            owner: Some(Owner {
                display_name: Some(u.name.clone()),
                id: Some(u.uid.to_string()),
            }),
            ..ListBucketsOutput::default()
        }))
    }

    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        let p = self.principal(req.credentials.as_ref())?;
        let Some(u) = p.user.clone() else {
            return Err(s3_error!(AccessDenied, "Access Denied"));
        };
        let name = req.input.bucket.clone();
        if let Some(b) = self.buckets.get(&name) {
            return Err(if b.may_write(&p) {
                s3_error!(BucketAlreadyOwnedByYou, "Your previous request to create the named bucket succeeded and you already own it.")
            } else {
                s3_error!(
                    BucketAlreadyExists,
                    "The requested bucket name is not available."
                )
            });
        }
        if !(u.admin || u.s3_bucket_create) {
            return Err(s3_error!(
                AccessDenied,
                "this account may not create buckets (tank user set NAME s3_bucket_create=on)"
            ));
        }
        let parent = self.parent()?;
        let dataset = format!("{parent}/{name}");
        let svc = self.svc.clone();
        let (ds, user) = (dataset.clone(), u.name.clone());
        let lock = req.input.object_lock_enabled_for_bucket.unwrap_or(false);
        let r = tokio::task::spawn_blocking(move || -> S3Result<()> {
            let admin = Caller::Admin { name: "s3".into() };
            let run = |r: Request| svc.handle(&admin, r, None).0;
            // The parent is made at first use, with the bucket's dataset.
            run(Request::DatasetCreate {
                name: ds.clone(),
                kind: tank_dataset::DatasetKind::Filesystem,
                props: Vec::new(),
                parents: true,
            })
            .map_err(|e| s3_error!(InternalError, "cannot create the dataset {ds}: {e}"))?;
            let mut options = std::collections::BTreeMap::new();
            options.insert("users".to_string(), user);
            if lock {
                options.insert("versioning".to_string(), "enabled".to_string());
                options.insert("object_lock".to_string(), "on".to_string());
            }
            if let Err(e) = run(Request::ShareAdd {
                protocol: "s3".into(),
                name: ds.rsplit('/').next().unwrap_or_default().to_string(),
                dataset: ds.clone(),
                options,
            }) {
                let _ = run(Request::DatasetDestroy {
                    name: ds.clone(),
                    recursive: false,
                    dependents: false,
                    force: false,
                    background: false,
                });
                return Err(s3_error!(InvalidBucketName, "{e}"));
            }
            Ok(())
        })
        .await
        .map_err(|e| s3_error!(InternalError, "{e}"))?;
        r?;
        self.buckets.refresh();
        Ok(S3Response::new(CreateBucketOutput {
            location: Some(format!("/{name}")),
        }))
    }

    async fn delete_bucket(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        let p = self.principal(req.credentials.as_ref())?;
        let (b, fs) = self.bucket(&req.input.bucket, &p, true)?;
        if !blocking(fs.clone(), store::is_empty)
            .await
            .map_err(s3_errno)?
        {
            return Err(s3_error!(
                BucketNotEmpty,
                "The bucket you tried to delete is not empty"
            ));
        }
        drop(fs);
        let made_here = self
            .settings
            .parent
            .as_ref()
            .or(self.default_parent().as_ref())
            .is_some_and(|pd| b.dataset == format!("{pd}/{}", b.name));
        let (name, dataset) = (b.name.clone(), b.dataset.clone());
        drop(b);
        self.buckets.forget(&name);
        self.manage(Request::ShareRemove { name: name.clone() })?;
        if made_here {
            // A bucket made through S3 takes its dataset with it; a share of an existing
            // dataset only stops being a bucket.
            let svc = self.svc.clone();
            let _ = tokio::task::spawn_blocking(move || {
                let admin = Caller::Admin { name: "s3".into() };
                svc.handle(
                    &admin,
                    Request::DatasetDestroy {
                        name: dataset,
                        recursive: false,
                        dependents: false,
                        force: false,
                        background: false,
                    },
                    None,
                )
            })
            .await;
        }
        Ok(S3Response::new(DeleteBucketOutput {}))
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        let p = self.principal(req.credentials.as_ref())?;
        self.bucket(&req.input.bucket, &p, false)?;
        Ok(S3Response::new(HeadBucketOutput {
            bucket_region: Some(self.settings.region.clone()),
            ..HeadBucketOutput::default()
        }))
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        let p = self.principal(req.credentials.as_ref())?;
        self.bucket(&req.input.bucket, &p, false)?;
        let region = &self.settings.region;
        Ok(S3Response::new(GetBucketLocationOutput {
            location_constraint: (region != "us-east-1")
                .then(|| BucketLocationConstraint::from(region.clone())),
        }))
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let p = self.principal(req.credentials.as_ref())?;
        let input = req.input;
        check_key(&input.key)?;
        let (b, fs) = self.bucket(&input.bucket, &p, true)?;
        let (retention, legal_hold) = lock_headers(
            &b,
            input.object_lock_mode.as_ref(),
            input.object_lock_retain_until_date.as_ref(),
            input.object_lock_legal_hold_status.as_ref(),
        )?;
        if input.if_none_match.is_some() || input.if_match.is_some() {
            let k = input.key.clone();
            let cur = blocking(fs.clone(), move |f| store::find(f, &k))
                .await
                .map_err(s3_errno)?;
            match (&cur, &input.if_none_match, &input.if_match) {
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
        let digests = Digests::new(
            input.content_md5.as_deref(),
            input.checksum_algorithm.as_ref(),
            Checksum {
                checksum_crc32: input.checksum_crc32.clone(),
                checksum_crc32c: input.checksum_crc32c.clone(),
                checksum_sha1: input.checksum_sha1.clone(),
                checksum_sha256: input.checksum_sha256.clone(),
                checksum_crc64nvme: input.checksum_crc64nvme.clone(),
                ..Checksum::default()
            },
        )?;
        let got = receive(
            &fs,
            input.body,
            input.content_length,
            MAX_PUT,
            digests,
            req.trailing_headers.as_ref(),
        )
        .await?;
        let meta = meta_of(
            input.content_type,
            input.content_encoding,
            input.content_disposition,
            input.content_language,
            input.cache_control,
            input.expires,
            input.metadata,
            input.tagging,
        );
        let etag = hex::encode(got.md5);
        let key = input.key.clone();
        let owner = p.owner();
        let (tmp, n, ino) = (got.tmp, got.name.clone(), got.ino);
        let (versioning, object_lock) = (b.versioning, b.object_lock);
        let (buckets, dataset) = (self.buckets.clone(), b.dataset.clone());
        let o = blocking(fs.clone(), move |f| {
            let _key = (versioning != Versioning::Off).then(|| buckets.key_lock(&dataset, &key));
            let lock = match versions::lock_of(f, object_lock, retention, legal_hold) {
                Ok(l) => l,
                Err(e) => {
                    store::discard(f, tmp, &n);
                    return Err(e);
                }
            };
            store::commit(
                f,
                tmp,
                &n,
                ino,
                NewObject {
                    key: &key,
                    etag,
                    meta,
                    owner,
                    parts: 0,
                    versioning,
                    lock,
                    upload: None,
                },
            )
        })
        .await
        .map_err(s3_errno)?;
        b.changed(tank_service::handles::Changed {
            inodes: vec![o.ino],
            entries: Vec::new(),
        });
        let c = got.checksum;
        Ok(S3Response::new(PutObjectOutput {
            e_tag: Some(ETag::Strong(o.etag.clone())),
            checksum_crc32: c.checksum_crc32,
            checksum_crc32c: c.checksum_crc32c,
            checksum_sha1: c.checksum_sha1,
            checksum_sha256: c.checksum_sha256,
            checksum_crc64nvme: c.checksum_crc64nvme,
            size: Some(got.len as i64),
            version_id: (versioning != Versioning::Off).then(|| o.version_id()),
            ..PutObjectOutput::default()
        }))
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let p = self.principal(req.credentials.as_ref())?;
        let i = req.input;
        check_key(&i.key)?;
        let (b, fs) = self.bucket(&i.bucket, &p, false)?;
        let o = self
            .find_version(&fs, &i.key, i.version_id.as_deref())
            .await?;
        preconditions(
            &o,
            i.if_match.as_ref(),
            i.if_none_match.as_ref(),
            i.if_modified_since.as_ref(),
            i.if_unmodified_since.as_ref(),
            S3ErrorCode::NotModified,
        )?;
        let mut out = Self::object_output(&b, &o);
        let (start, end) = match &i.range {
            Some(r) => {
                let r = r.check(o.size)?;
                out.content_range = Some(format!("bytes {}-{}/{}", r.start, r.end - 1, o.size));
                out.content_length = Some((r.end - r.start) as i64);
                (r.start, r.end)
            }
            None => (0, o.size),
        };
        out.body = Some(if end > start {
            body_of(fs, o.ino, start, end)?
        } else {
            StreamingBlob::wrap(futures::stream::empty::<Result<Bytes, std::io::Error>>())
        });
        Ok(S3Response::new(out))
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let p = self.principal(req.credentials.as_ref())?;
        let i = req.input;
        check_key(&i.key)?;
        let (b, fs) = self.bucket(&i.bucket, &p, false)?;
        let o = self
            .find_version(&fs, &i.key, i.version_id.as_deref())
            .await?;
        preconditions(
            &o,
            i.if_match.as_ref(),
            i.if_none_match.as_ref(),
            i.if_modified_since.as_ref(),
            i.if_unmodified_since.as_ref(),
            S3ErrorCode::NotModified,
        )?;
        let g = Self::object_output(&b, &o);
        Ok(S3Response::new(HeadObjectOutput {
            content_length: g.content_length,
            e_tag: g.e_tag,
            last_modified: g.last_modified,
            content_type: g.content_type,
            content_encoding: g.content_encoding,
            content_disposition: g.content_disposition,
            content_language: g.content_language,
            cache_control: g.cache_control,
            expires: g.expires,
            metadata: g.metadata,
            accept_ranges: g.accept_ranges,
            parts_count: g.parts_count,
            version_id: g.version_id,
            object_lock_mode: g.object_lock_mode,
            object_lock_retain_until_date: g.object_lock_retain_until_date,
            object_lock_legal_hold_status: g.object_lock_legal_hold_status,
            ..HeadObjectOutput::default()
        }))
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        let p = self.principal(req.credentials.as_ref())?;
        let key = req.input.key.clone();
        check_key(&key)?;
        let (b, fs) = self.bucket(&req.input.bucket, &p, true)?;
        if let Some(c) = &req.input.if_match {
            let o = self.find(&fs, &key).await?;
            preconditions(&o, Some(c), None, None, None, S3ErrorCode::NotModified)?;
        }
        let bypass = req.input.bypass_governance_retention.unwrap_or(false) && p.is_admin();
        let d = self
            .delete_one(&b, fs, key, req.input.version_id.clone(), bypass)
            .await?;
        b.changed(tank_service::handles::Changed::default());
        Ok(S3Response::new(DeleteObjectOutput {
            delete_marker: d.marker.then_some(true),
            version_id: d.version,
            ..DeleteObjectOutput::default()
        }))
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let p = self.principal(req.credentials.as_ref())?;
        let (b, fs) = self.bucket(&req.input.bucket, &p, true)?;
        let quiet = req.input.delete.quiet.unwrap_or(false);
        let bypass = req.input.bypass_governance_retention.unwrap_or(false) && p.is_admin();
        if req.input.delete.objects.len() > 1000 {
            return Err(s3_error!(MalformedXML, "at most 1,000 keys in one request"));
        }
        let mut deleted = Vec::new();
        let mut errors = Vec::new();
        for id in req.input.delete.objects {
            let key = id.key.clone();
            let r = if check_key(&key).is_err() {
                Err(s3_error!(InvalidArgument))
            } else {
                self.delete_one(&b, fs.clone(), key.clone(), id.version_id.clone(), bypass)
                    .await
            };
            match r {
                Ok(d) => {
                    if !quiet {
                        let marker_made = d.marker && id.version_id.is_none();
                        deleted.push(DeletedObject {
                            key: Some(key),
                            delete_marker: d.marker.then_some(true),
                            delete_marker_version_id: marker_made
                                .then(|| d.version.clone())
                                .flatten(),
                            version_id: id.version_id.clone(),
                        });
                    }
                }
                Err(e) => errors.push(s3s::dto::Error {
                    key: Some(key),
                    version_id: id.version_id.clone(),
                    code: Some(e.code().as_str().to_string()),
                    message: e.message().map(str::to_string),
                }),
            }
        }
        b.changed(tank_service::handles::Changed::default());
        Ok(S3Response::new(DeleteObjectsOutput {
            deleted: Some(deleted),
            errors: (!errors.is_empty()).then_some(errors),
            ..DeleteObjectsOutput::default()
        }))
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        let p = self.principal(req.credentials.as_ref())?;
        let i = req.input;
        let (_b, fs) = self.bucket_to_list(&i.bucket, &p)?;
        let max = i.max_keys.unwrap_or(1000).clamp(0, 1000) as usize;
        let prefix = i.prefix.clone().unwrap_or_default();
        let after = match &i.continuation_token {
            Some(t) => key_of_token(t)?,
            None => i.start_after.clone().unwrap_or_default(),
        };
        let delimiter = i.delimiter.clone();
        let (pf, dl, af) = (prefix.clone(), delimiter.clone(), after.clone());
        let l = blocking(fs, move |f| store::list(f, &pf, dl.as_deref(), &af, max))
            .await
            .map_err(s3_errno)?;
        let url = i
            .encoding_type
            .as_ref()
            .is_some_and(|e| e.as_str() == "url");
        let enc = |s: &str| if url { url_encode(s) } else { s.to_string() };
        let count = (l.objects.len() + l.prefixes.len()) as i32;
        Ok(S3Response::new(ListObjectsV2Output {
            name: Some(i.bucket),
            prefix: Some(enc(&prefix)),
            delimiter: delimiter.as_deref().map(enc),
            start_after: i.start_after.as_deref().map(enc),
            continuation_token: i.continuation_token,
            max_keys: Some(max as i32),
            key_count: Some(count),
            is_truncated: Some(l.truncated),
            next_continuation_token: l
                .truncated
                .then(|| l.last.as_deref().map(token_of))
                .flatten(),
            encoding_type: i.encoding_type,
            common_prefixes: Some(
                l.prefixes
                    .iter()
                    .map(|p| CommonPrefix {
                        prefix: Some(enc(p)),
                    })
                    .collect(),
            ),
            contents: Some(
                l.objects
                    .iter()
                    .map(|(k, o)| object_entry(&enc(k), o))
                    .collect(),
            ),
            ..ListObjectsV2Output::default()
        }))
    }

    async fn list_objects(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        let p = self.principal(req.credentials.as_ref())?;
        let i = req.input;
        let (_b, fs) = self.bucket_to_list(&i.bucket, &p)?;
        let max = i.max_keys.unwrap_or(1000).clamp(0, 1000) as usize;
        let prefix = i.prefix.clone().unwrap_or_default();
        let after = i.marker.clone().unwrap_or_default();
        let delimiter = i.delimiter.clone();
        let (pf, dl, af) = (prefix.clone(), delimiter.clone(), after);
        let l = blocking(fs, move |f| store::list(f, &pf, dl.as_deref(), &af, max))
            .await
            .map_err(s3_errno)?;
        let url = i
            .encoding_type
            .as_ref()
            .is_some_and(|e| e.as_str() == "url");
        let enc = |s: &str| if url { url_encode(s) } else { s.to_string() };
        Ok(S3Response::new(ListObjectsOutput {
            name: Some(i.bucket),
            prefix: Some(enc(&prefix)),
            marker: Some(i.marker.as_deref().map(enc).unwrap_or_default()),
            delimiter: delimiter.as_deref().map(enc),
            max_keys: Some(max as i32),
            is_truncated: Some(l.truncated),
            next_marker: l.truncated.then(|| l.last.as_deref().map(enc)).flatten(),
            encoding_type: i.encoding_type,
            common_prefixes: Some(
                l.prefixes
                    .iter()
                    .map(|p| CommonPrefix {
                        prefix: Some(enc(p)),
                    })
                    .collect(),
            ),
            contents: Some(
                l.objects
                    .iter()
                    .map(|(k, o)| object_entry(&enc(k), o))
                    .collect(),
            ),
            ..ListObjectsOutput::default()
        }))
    }

    async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        let p = self.principal(req.credentials.as_ref())?;
        let i = req.input;
        check_key(&i.key)?;
        let CopySource::Bucket {
            bucket: sb,
            key: sk,
            version_id: sv,
        } = &i.copy_source
        else {
            return Err(s3_error!(NotImplemented, "copies from access points"));
        };
        let (_sbk, sfs) = self.bucket(sb, &p, false)?;
        let (db, dfs) = self.bucket(&i.bucket, &p, true)?;
        let (retention, legal_hold) = lock_headers(
            &db,
            i.object_lock_mode.as_ref(),
            i.object_lock_retain_until_date.as_ref(),
            i.object_lock_legal_hold_status.as_ref(),
        )?;
        let src = self.find_version(&sfs, sk, sv.as_deref()).await?;
        preconditions(
            &src,
            i.copy_source_if_match.as_ref(),
            i.copy_source_if_none_match.as_ref(),
            i.copy_source_if_modified_since.as_ref(),
            i.copy_source_if_unmodified_since.as_ref(),
            S3ErrorCode::PreconditionFailed,
        )?;
        let replace = i
            .metadata_directive
            .as_ref()
            .is_some_and(|d| d.as_str() == MetadataDirective::REPLACE);
        if !replace && **sb == *i.bucket && **sk == *i.key && sv.is_none() {
            return Err(s3_error!(
                InvalidRequest,
                "This copy request is illegal because it is trying to copy an object to itself without changing the object's metadata"
            ));
        }
        let meta = if replace {
            meta_of(
                i.content_type,
                i.content_encoding,
                i.content_disposition,
                i.content_language,
                i.cache_control,
                i.expires,
                i.metadata,
                src.meta.tagging.clone(),
            )
        } else {
            src.meta.clone()
        };
        let meta = match i.tagging_directive.as_ref().map(|d| d.as_str()) {
            Some("REPLACE") => Meta {
                tagging: i.tagging,
                ..meta
            },
            _ => meta,
        };
        // The bytes, through a new file of the destination (read in pieces).
        let (tmp, n, ino) = blocking(dfs.clone(), store::begin)
            .await
            .map_err(s3_errno)?;
        let (s_ino, size) = (src.ino, src.size);
        let sfs2 = sfs.clone();
        let copied = blocking(dfs.clone(), move |d| {
            store::open(&sfs2, s_ino)?;
            let r = (|| {
                let mut at = 0;
                while at < size {
                    let v = store::read(&sfs2, s_ino, at, store::PIECE)?;
                    if v.is_empty() {
                        return Err(Errno::EIO);
                    }
                    store::write(d, ino, at, &v)?;
                    at += v.len() as u64;
                }
                Ok(())
            })();
            store::close(&sfs2, s_ino);
            r
        })
        .await;
        if let Err(e) = copied {
            let n2 = n.clone();
            let _ = blocking(dfs.clone(), move |f| {
                store::discard(f, tmp, &n2);
                Ok(())
            })
            .await;
            return Err(s3_errno(e));
        }
        let key = i.key.clone();
        let owner = p.owner();
        let (etag, parts) = (src.etag.clone(), src.parts);
        let (versioning, object_lock) = (db.versioning, db.object_lock);
        let (buckets, dataset) = (self.buckets.clone(), db.dataset.clone());
        let o = blocking(dfs, move |f| {
            let _key = (versioning != Versioning::Off).then(|| buckets.key_lock(&dataset, &key));
            let lock = match versions::lock_of(f, object_lock, retention, legal_hold) {
                Ok(l) => l,
                Err(e) => {
                    store::discard(f, tmp, &n);
                    return Err(e);
                }
            };
            store::commit(
                f,
                tmp,
                &n,
                ino,
                NewObject {
                    key: &key,
                    etag,
                    meta,
                    owner,
                    parts,
                    versioning,
                    lock,
                    upload: None,
                },
            )
        })
        .await
        .map_err(s3_errno)?;
        db.changed(tank_service::handles::Changed {
            inodes: vec![o.ino],
            entries: Vec::new(),
        });
        Ok(S3Response::new(CopyObjectOutput {
            copy_object_result: Some(CopyObjectResult {
                e_tag: Some(ETag::Strong(o.etag.clone())),
                last_modified: Some(ts(o.mtime)),
                ..CopyObjectResult::default()
            }),
            version_id: (versioning != Versioning::Off).then(|| o.version_id()),
            copy_source_version_id: (_sbk.versioning != Versioning::Off || src.version.is_some())
                .then(|| src.version_id()),
            ..CopyObjectOutput::default()
        }))
    }

    async fn get_object_tagging(
        &self,
        req: S3Request<GetObjectTaggingInput>,
    ) -> S3Result<S3Response<GetObjectTaggingOutput>> {
        let p = self.principal(req.credentials.as_ref())?;
        let i = req.input;
        check_key(&i.key)?;
        let (_b, fs) = self.bucket(&i.bucket, &p, false)?;
        let o = self
            .find_version(&fs, &i.key, i.version_id.as_deref())
            .await?;
        Ok(S3Response::new(GetObjectTaggingOutput {
            tag_set: tags_of(o.meta.tagging.as_deref()),
            version_id: i.version_id.is_some().then(|| o.version_id()),
        }))
    }

    async fn put_object_tagging(
        &self,
        req: S3Request<PutObjectTaggingInput>,
    ) -> S3Result<S3Response<PutObjectTaggingOutput>> {
        let p = self.principal(req.credentials.as_ref())?;
        let i = req.input;
        check_key(&i.key)?;
        let tagging = tagging_of(&i.tagging.tag_set)?;
        self.set_tagging(&p, &i.bucket, &i.key, i.version_id.as_deref(), tagging)
            .await?;
        Ok(S3Response::new(PutObjectTaggingOutput {
            version_id: i.version_id,
        }))
    }

    async fn delete_object_tagging(
        &self,
        req: S3Request<DeleteObjectTaggingInput>,
    ) -> S3Result<S3Response<DeleteObjectTaggingOutput>> {
        let p = self.principal(req.credentials.as_ref())?;
        let i = req.input;
        check_key(&i.key)?;
        self.set_tagging(&p, &i.bucket, &i.key, i.version_id.as_deref(), None)
            .await?;
        Ok(S3Response::new(DeleteObjectTaggingOutput {
            version_id: i.version_id,
        }))
    }

    async fn get_bucket_versioning(
        &self,
        req: S3Request<GetBucketVersioningInput>,
    ) -> S3Result<S3Response<GetBucketVersioningOutput>> {
        let p = self.principal(req.credentials.as_ref())?;
        let (b, _fs) = self.bucket(&req.input.bucket, &p, false)?;
        // A bucket that never had versioning on has no status at all.
        let status = match b.versioning {
            Versioning::Off => None,
            Versioning::Enabled => Some(BucketVersioningStatus::from_static(
                BucketVersioningStatus::ENABLED,
            )),
            Versioning::Suspended => Some(BucketVersioningStatus::from_static(
                BucketVersioningStatus::SUSPENDED,
            )),
        };
        Ok(S3Response::new(GetBucketVersioningOutput {
            status,
            mfa_delete: None,
        }))
    }

    async fn put_bucket_tagging(
        &self,
        req: S3Request<PutBucketTaggingInput>,
    ) -> S3Result<S3Response<PutBucketTaggingOutput>> {
        ops_bucket::put_bucket_tagging(self, req).await
    }

    async fn get_bucket_tagging(
        &self,
        req: S3Request<GetBucketTaggingInput>,
    ) -> S3Result<S3Response<GetBucketTaggingOutput>> {
        ops_bucket::get_bucket_tagging(self, req).await
    }

    async fn delete_bucket_tagging(
        &self,
        req: S3Request<DeleteBucketTaggingInput>,
    ) -> S3Result<S3Response<DeleteBucketTaggingOutput>> {
        ops_bucket::delete_bucket_tagging(self, req).await
    }

    async fn put_bucket_policy(
        &self,
        req: S3Request<PutBucketPolicyInput>,
    ) -> S3Result<S3Response<PutBucketPolicyOutput>> {
        ops_bucket::put_bucket_policy(self, req).await
    }

    async fn get_bucket_policy(
        &self,
        req: S3Request<GetBucketPolicyInput>,
    ) -> S3Result<S3Response<GetBucketPolicyOutput>> {
        ops_bucket::get_bucket_policy(self, req).await
    }

    async fn delete_bucket_policy(
        &self,
        req: S3Request<DeleteBucketPolicyInput>,
    ) -> S3Result<S3Response<DeleteBucketPolicyOutput>> {
        ops_bucket::delete_bucket_policy(self, req).await
    }

    async fn get_bucket_policy_status(
        &self,
        req: S3Request<GetBucketPolicyStatusInput>,
    ) -> S3Result<S3Response<GetBucketPolicyStatusOutput>> {
        ops_bucket::get_bucket_policy_status(self, req).await
    }

    async fn put_bucket_cors(
        &self,
        req: S3Request<PutBucketCorsInput>,
    ) -> S3Result<S3Response<PutBucketCorsOutput>> {
        ops_bucket::put_bucket_cors(self, req).await
    }

    async fn get_bucket_cors(
        &self,
        req: S3Request<GetBucketCorsInput>,
    ) -> S3Result<S3Response<GetBucketCorsOutput>> {
        ops_bucket::get_bucket_cors(self, req).await
    }

    async fn delete_bucket_cors(
        &self,
        req: S3Request<DeleteBucketCorsInput>,
    ) -> S3Result<S3Response<DeleteBucketCorsOutput>> {
        ops_bucket::delete_bucket_cors(self, req).await
    }

    async fn put_bucket_lifecycle_configuration(
        &self,
        req: S3Request<PutBucketLifecycleConfigurationInput>,
    ) -> S3Result<S3Response<PutBucketLifecycleConfigurationOutput>> {
        ops_bucket::put_bucket_lifecycle_configuration(self, req).await
    }

    async fn get_bucket_lifecycle_configuration(
        &self,
        req: S3Request<GetBucketLifecycleConfigurationInput>,
    ) -> S3Result<S3Response<GetBucketLifecycleConfigurationOutput>> {
        ops_bucket::get_bucket_lifecycle_configuration(self, req).await
    }

    async fn delete_bucket_lifecycle(
        &self,
        req: S3Request<DeleteBucketLifecycleInput>,
    ) -> S3Result<S3Response<DeleteBucketLifecycleOutput>> {
        ops_bucket::delete_bucket_lifecycle(self, req).await
    }

    async fn put_bucket_versioning(
        &self,
        req: S3Request<PutBucketVersioningInput>,
    ) -> S3Result<S3Response<PutBucketVersioningOutput>> {
        ops_versions::put_bucket_versioning(self, req).await
    }

    async fn list_object_versions(
        &self,
        req: S3Request<ListObjectVersionsInput>,
    ) -> S3Result<S3Response<ListObjectVersionsOutput>> {
        ops_versions::list_object_versions(self, req).await
    }

    async fn put_object_lock_configuration(
        &self,
        req: S3Request<PutObjectLockConfigurationInput>,
    ) -> S3Result<S3Response<PutObjectLockConfigurationOutput>> {
        ops_versions::put_object_lock_configuration(self, req).await
    }

    async fn get_object_lock_configuration(
        &self,
        req: S3Request<GetObjectLockConfigurationInput>,
    ) -> S3Result<S3Response<GetObjectLockConfigurationOutput>> {
        ops_versions::get_object_lock_configuration(self, req).await
    }

    async fn put_object_retention(
        &self,
        req: S3Request<PutObjectRetentionInput>,
    ) -> S3Result<S3Response<PutObjectRetentionOutput>> {
        ops_versions::put_object_retention(self, req).await
    }

    async fn get_object_retention(
        &self,
        req: S3Request<GetObjectRetentionInput>,
    ) -> S3Result<S3Response<GetObjectRetentionOutput>> {
        ops_versions::get_object_retention(self, req).await
    }

    async fn put_object_legal_hold(
        &self,
        req: S3Request<PutObjectLegalHoldInput>,
    ) -> S3Result<S3Response<PutObjectLegalHoldOutput>> {
        ops_versions::put_object_legal_hold(self, req).await
    }

    async fn get_object_legal_hold(
        &self,
        req: S3Request<GetObjectLegalHoldInput>,
    ) -> S3Result<S3Response<GetObjectLegalHoldOutput>> {
        ops_versions::get_object_legal_hold(self, req).await
    }

    async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        multipart::upload_part_copy(self, req).await
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        multipart::create(self, req).await
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        multipart::upload_part(self, req).await
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        multipart::complete(self, req).await
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        multipart::abort(self, req).await
    }

    async fn list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        multipart::list_parts(self, req).await
    }

    async fn list_multipart_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        multipart::list_uploads(self, req).await
    }
}

/// The most tags an object has (S3's limit), and their sizes.
const MAX_TAGS: usize = 10;
const MAX_TAG_KEY: usize = 128;
const MAX_TAG_VALUE: usize = 256;

fn url_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = (b[i] == b'%' && i + 3 <= b.len())
            .then(|| std::str::from_utf8(&b[i + 1..i + 3]).ok())
            .flatten()
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (hex, b[i]) {
            (Some(v), _) => {
                out.push(v);
                i += 3;
                continue;
            }
            (None, b'+') => out.push(b' '),
            (None, c) => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The tags of a stored `x-amz-tagging` string.
/// The (key, value) pairs of an object's tags.
pub fn tag_pairs(tagging: Option<&str>) -> Vec<(String, String)> {
    tags_of(tagging)
        .into_iter()
        .map(|t| (t.key.unwrap_or_default(), t.value.unwrap_or_default()))
        .collect()
}

fn tags_of(tagging: Option<&str>) -> TagSet {
    tagging
        .unwrap_or("")
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            Tag {
                key: Some(url_decode(k)),
                value: Some(url_decode(v)),
            }
        })
        .collect()
}

/// A tag set as the stored string, checked against S3's limits.
fn tagging_of(tags: &TagSet) -> S3Result<Option<String>> {
    if tags.len() > MAX_TAGS {
        return Err(s3_error!(InvalidTag, "an object has at most 10 tags"));
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut parts = Vec::new();
    for t in tags {
        let k = t.key.as_deref().unwrap_or("");
        let v = t.value.as_deref().unwrap_or("");
        if k.is_empty() || k.len() > MAX_TAG_KEY || v.len() > MAX_TAG_VALUE {
            return Err(s3_error!(
                InvalidTag,
                "a tag key has 1 to 128 bytes and its value at most 256"
            ));
        }
        if !seen.insert(k) {
            return Err(s3_error!(
                InvalidTag,
                "Cannot provide multiple Tags with the same key"
            ));
        }
        parts.push(format!("{}={}", url_encode(k), url_encode(v)));
    }
    Ok((!parts.is_empty()).then(|| parts.join("&")))
}

impl TankS3 {
    async fn set_tagging(
        &self,
        p: &Principal,
        bucket: &str,
        key: &str,
        version: Option<&str>,
        tagging: Option<String>,
    ) -> S3Result<()> {
        let (b, fs) = self.bucket(bucket, p, true)?;
        // Checked first: a delete marker has no tags, a missing version is NoSuchVersion.
        self.find_version(&fs, key, version).await?;
        let (k, v) = (key.to_string(), version.map(str::to_string));
        let (buckets, dataset) = (self.buckets.clone(), b.dataset.clone());
        let done = blocking(fs, move |f| {
            let _key = buckets.key_lock(&dataset, &k);
            let found = match &v {
                Some(v) => versions::find(f, &k, v)?,
                None => store::find(f, &k)?,
            };
            let Some(o) = found else {
                return Ok(None);
            };
            let meta = Meta {
                tagging,
                ..o.meta.clone()
            };
            store::set_meta_of(f, &o, meta, &k).map(Some)
        })
        .await
        .map_err(s3_errno)?;
        done.map(|_| ())
            .ok_or_else(|| s3_error!(NoSuchKey, "The specified key does not exist."))
    }
}

/// An S3 time from milliseconds since 1970.
pub fn ts_ms(ms: i64) -> Timestamp {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
        .into()
}

/// Milliseconds since 1970 of an S3 time.
pub fn ms_of(t: &Timestamp) -> i64 {
    (time::OffsetDateTime::from(t.clone()).unix_timestamp_nanos() / 1_000_000) as i64
}

/// The retention and legal hold a write asks for with its `x-amz-object-lock-*` headers:
/// refused outside a lock bucket, and a mode without a date (or a date without a mode).
pub fn lock_headers(
    b: &Bucket,
    mode: Option<&ObjectLockMode>,
    until: Option<&Timestamp>,
    hold: Option<&ObjectLockLegalHoldStatus>,
) -> S3Result<(Option<Retention>, bool)> {
    if (mode.is_some() || until.is_some() || hold.is_some()) && !b.object_lock {
        return Err(s3_error!(
            InvalidRequest,
            "Bucket is missing Object Lock Configuration"
        ));
    }
    let retention = match (mode, until) {
        (None, None) => None,
        (Some(m), Some(t)) => {
            let m = m.as_str();
            if m != ObjectLockMode::GOVERNANCE && m != ObjectLockMode::COMPLIANCE {
                return Err(s3_error!(InvalidArgument, "Unknown wormMode directive."));
            }
            let until = ms_of(t);
            if until <= versions::now_ms() {
                return Err(s3_error!(
                    InvalidArgument,
                    "The retain until date must be in the future!"
                ));
            }
            Some(Retention {
                mode: m.to_string(),
                until,
            })
        }
        _ => {
            return Err(s3_error!(
            InvalidArgument,
            "x-amz-object-lock-retain-until-date and x-amz-object-lock-mode must both be supplied"
        ))
        }
    };
    let hold = match hold.map(|h| h.as_str()) {
        None | Some("OFF") => false,
        Some("ON") => true,
        Some(_) => {
            return Err(s3_error!(
                InvalidArgument,
                "Legal Hold must be either of 'ON' or 'OFF'"
            ))
        }
    };
    Ok((retention, hold))
}

impl TankS3 {
    /// A DELETE of `key` (or of its version) in bucket `b`, under the key's lock.
    pub(crate) async fn delete_one(
        &self,
        b: &Bucket,
        fs: Arc<Fs>,
        key: String,
        version: Option<String>,
        bypass: bool,
    ) -> S3Result<versions::Deleted> {
        if version.is_some() && b.versioning == Versioning::Off {
            // A never-versioned bucket has the null version only.
            if version.as_deref() != Some("null") {
                return Err(s3_error!(InvalidArgument, "Invalid version id specified"));
            }
        }
        let mode = b.versioning;
        let (buckets, dataset) = (self.buckets.clone(), b.dataset.clone());
        let r = tokio::task::spawn_blocking(move || {
            let _key = (mode != Versioning::Off || version.is_some())
                .then(|| buckets.key_lock(&dataset, &key));
            let mode = match (mode, &version) {
                // The null version of a never-versioned bucket is its only object.
                (Versioning::Off, Some(_)) => Versioning::Suspended,
                _ => mode,
            };
            let entries = store::key_entries(&fs, &key);
            let d = versions::delete(&fs, &key, mode, version.as_deref(), bypass);
            (d, entries)
        })
        .await
        .map_err(|e| s3_error!(InternalError, "{e}"))?;
        let (r, entries) = r;
        b.changed(tank_service::handles::Changed {
            inodes: Vec::new(),
            entries,
        });
        match r {
            Ok(d) => Ok(d),
            Err(versions::Refusal::Fs(e)) => Err(s3_errno(e)),
            Err(versions::Refusal::Locked(why)) => Err(s3_error!(AccessDenied, "{why}")),
        }
    }
}

fn object_entry(key: &str, o: &Obj) -> Object {
    Object {
        key: Some(key.to_string()),
        e_tag: Some(ETag::Strong(o.etag.clone())),
        last_modified: Some(ts(o.mtime)),
        size: Some(o.size as i64),
        storage_class: Some(ObjectStorageClass::from_static(
            ObjectStorageClass::STANDARD,
        )),
        ..Object::default()
    }
}

impl TankS3 {
    /// Where buckets made through S3 go when no parent was given: `<first pool>/s3`.
    fn default_parent(&self) -> Option<String> {
        let admin = Caller::Admin { name: "s3".into() };
        match self
            .svc
            .handle(&admin, Request::PoolList { names: Vec::new() }, None)
            .0
        {
            Ok(Response::Pools(p)) => p.first().map(|p| format!("{}/s3", p.name)),
            _ => None,
        }
    }

    fn parent(&self) -> S3Result<String> {
        self.settings
            .parent
            .clone()
            .or_else(|| self.default_parent())
            .ok_or_else(|| s3_error!(InternalError, "no pool to make buckets in"))
    }
}

#[cfg(test)]
mod fuzz {
    //! The request parsing that is ours (not s3s'), fed random and mutated input: key
    //! placement, URL coding, tag strings, continuation tokens, digests' headers, bucket
    //! policies and CORS patterns. Nothing may panic, and what must round-trip does.
    use super::*;
    use rand::{Rng, SeedableRng};

    const ALPHABET: &[&str] = &[
        "a",
        "b",
        "/",
        ".",
        "..",
        "%",
        "%2F",
        "+",
        "=",
        "&",
        "\0",
        "é",
        "名",
        " ",
        "*",
        "\"",
        "{",
        "}",
        ":",
        "[",
        "]",
        ",",
        "s3:GetObject",
        "arn:aws:s3:::b/*",
        "Statement",
        "Principal",
        ".tank",
        ".tank-s3",
    ];

    fn random_text(r: &mut impl Rng) -> String {
        let n = r.gen_range(0..40);
        let mut s = String::new();
        for _ in 0..n {
            if r.gen_bool(0.2) {
                s.push(char::from_u32(r.gen_range(0..0x11_0000)).unwrap_or('x'));
            } else {
                s.push_str(ALPHABET[r.gen_range(0..ALPHABET.len())]);
            }
        }
        s
    }

    fn mutate(r: &mut impl Rng, s: &str) -> String {
        let mut b = s.as_bytes().to_vec();
        for _ in 0..r.gen_range(1..6) {
            if b.is_empty() {
                break;
            }
            let i = r.gen_range(0..b.len());
            match r.gen_range(0..3) {
                0 => b[i] = r.gen(),
                1 => {
                    b.remove(i);
                }
                _ => b.insert(i, r.gen()),
            }
        }
        String::from_utf8_lossy(&b).into_owned()
    }

    #[test]
    fn our_parsing_takes_any_input() {
        let mut r = rand::rngs::StdRng::seed_from_u64(0x005e_ed53);
        let policy = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":"*","Action":["s3:GetObject"],"Resource":["arn:aws:s3:::b/*"]}]}"#;
        for _ in 0..100_000 {
            let s = random_text(&mut r);
            // Keys: a path's segments give the key back; a kept-whole name is stable.
            match crate::keys::place(&s) {
                crate::keys::Place::Path { segments, dir } => {
                    let back = segments.join("/") + if dir { "/" } else { "" };
                    assert_eq!(back, s);
                    assert!(segments.iter().all(|x| !x.is_empty() && x.len() <= 255));
                }
                crate::keys::Place::Whole(n) => {
                    assert_eq!(n.len(), 64);
                    assert_eq!(crate::keys::place(&s), crate::keys::Place::Whole(n));
                }
            }
            assert_eq!(url_decode(&url_encode(&s)), s);
            let _ = url_decode(&s);
            let tags = tags_of(Some(&s));
            let _ = tagging_of(&tags);
            let _ = tag_pairs(Some(&s));
            let _ = key_of_token(&s);
            assert_eq!(
                key_of_token(&token_of(&s)).ok().as_deref(),
                Some(s.as_str())
            );
            let _ = Digests::new(Some(&s), None, Checksum::default());
            let _ = Digests::new(
                None,
                None,
                Checksum {
                    checksum_crc32: Some(s.clone()),
                    checksum_sha256: Some(mutate(&mut r, &s)),
                    ..Checksum::default()
                },
            );
            let _ = crate::ops_bucket::anonymous_read("b", &s);
            let _ = crate::ops_bucket::anonymous_read("b", &mutate(&mut r, policy));
            let rule = crate::ops_bucket::CorsRule {
                origins: vec![s.clone()],
                methods: vec!["GET".into()],
                headers: vec![mutate(&mut r, &s)],
                ..Default::default()
            };
            let _ = crate::cors::find(
                &[rule],
                &random_text(&mut r),
                "GET",
                std::slice::from_ref(&s),
            );
        }
    }
}
