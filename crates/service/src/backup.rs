//! Backups of datasets to S3-compatible object stores: the objects, their encryption, the
//! multipart upload and the chain a restore follows. No HTTP here: the store is reached
//! through [`Bucket`], which the program installs (its S3 client lives with the S3 front
//! end), so these rules are tested against an in-memory bucket as well as a real server.
//!
//! # Theory of operation
//! **Objects.** A backup is one send stream stored as one object,
//! `PREFIX/SNAP.TOGUID.FROMGUID.stream` (guids as 16 hex digits; `FROMGUID` 0 for a full
//! stream), and beside it its [`Manifest`] (`... .json`), written last: a stream without a
//! manifest is an upload that did not finish and is never restored. The manifest names the
//! dataset, the snapshot and its base by name and guid, the snapshots the stream carries,
//! the object's size and SHA-256, and whether (and with which key, by id) it is encrypted.
//!
//! **Encryption** (client-side; the store never sees the key). The object is a 24-byte
//! header (`TANKENC1`, the chunk size as u32 LE, an 8-byte nonce prefix, the key id's first
//! 4 bytes) and the stream cut in chunks of 1 MiB, each sealed with ChaCha20-Poly1305
//! (ring): nonce = prefix ‖ chunk number (u32 LE), additional data = header ‖ chunk number
//! (u64 LE) ‖ 1 for the last chunk, else 0. Every stream has a last chunk (empty for an
//! empty stream), so a cut, a dropped, a repeated or a reordered chunk fails its tag. The nonce prefix is derived from the key and the object's name (keyed
//! BLAKE3): an upload resumed regenerates the very same bytes, and a nonce is only reused for
//! the same plaintext.
//!
//! **Upload** ([`Upload`]): multipart, parts of at least 8 MiB (more for streams that would
//! need over 9,000 parts), four in flight at once, each sent with its Content-MD5 so the
//! store checks it. The
//! upload's id is kept in the settings store until it completes. A resumed upload generates
//! the stream again (a send is deterministic) and skips every part the store already holds
//! with the same size and MD5 (its ETag); so only what is missing crosses the network, and
//! a part that differs is sent again. Completion checks the object's size; the SHA-256 of
//! the whole object goes into the manifest, which a restore checks at its end.
//!
//! **Restore** ([`chain`]): the manifests under the prefix form chains (each increment's
//! base guid is the snapshot guid of an earlier one); the restore takes the chain that ends
//! at the asked-for snapshot (the newest by default), starting after the newest snapshot the
//! target already has, and feeds each object, decrypted and hashed as it is read, to an
//! ordinary receive, which checks the stream's own checksums.

use std::io::{self, Read, Write};

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305};
use serde::{Deserialize, Serialize};
use sha2::Digest;

/// A named S3 endpoint and its credentials (`tank remote add`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Remote {
    pub name: String,
    /// `http[s]://HOST[:PORT][/PATH]`.
    pub endpoint: String,
    pub access_key: String,
    pub secret_key: String,
    pub region: String,
    /// The encryption key (64 hex digits), when backups through it are encrypted.
    #[serde(default)]
    pub key: Option<String>,
}

/// An object in a bucket, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectEntry {
    pub key: String,
    pub size: u64,
}

/// A part of a multipart upload the store holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartEntry {
    pub number: u16,
    /// As the store gives it (MD5 of the part, hex, in quotes for most stores).
    pub etag: String,
    pub size: u64,
}

/// The object operations a backup needs, on one bucket. Errors are the store's message.
pub trait Bucket: Send + Sync {
    fn put(&self, key: &str, data: &[u8]) -> Result<(), String>;
    /// The whole object, as a reader.
    fn get(&self, key: &str) -> Result<Box<dyn Read + Send>, String>;
    /// Every object whose key starts with `prefix`.
    fn list(&self, prefix: &str) -> Result<Vec<ObjectEntry>, String>;
    fn delete(&self, key: &str) -> Result<(), String>;
    /// Starts a multipart upload; its id.
    fn create_multipart(&self, key: &str) -> Result<String, String>;
    /// Sends part `number` with its Content-MD5; its ETag.
    fn upload_part(
        &self,
        key: &str,
        upload: &str,
        number: u16,
        data: &[u8],
        md5: &[u8; 16],
    ) -> Result<String, String>;
    /// The parts the store holds; `None` when it knows no such upload (completed, aborted
    /// or expired).
    fn list_parts(&self, key: &str, upload: &str) -> Result<Option<Vec<PartEntry>>, String>;
    /// Assembles the parts, ETags in part order.
    fn complete(&self, key: &str, upload: &str, etags: &[String]) -> Result<(), String>;
    fn abort(&self, key: &str, upload: &str) -> Result<(), String>;
}

/// Makes [`Bucket`]s: the program's S3 client.
pub trait BucketConnector: Send + Sync {
    fn connect(&self, remote: &Remote, bucket: &str) -> Result<Box<dyn Bucket>, String>;
}

/// `s3://BUCKET[/PREFIX]`: the bucket and the prefix (no leading or trailing `/`).
pub fn parse_url(url: &str) -> Result<(String, String), String> {
    let rest = url
        .strip_prefix("s3://")
        .ok_or_else(|| format!("'{url}' is not an s3://BUCKET/PREFIX address"))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
    if bucket.len() < 3 || bucket.len() > 63 || !bucket.chars().all(ok) {
        return Err(format!(
            "'{bucket}' is not a bucket name (3 to 63 of a-z, 0-9, '-', '.')"
        ));
    }
    let prefix = prefix.trim_matches('/');
    if prefix.split('/').any(|p| p == ".." || p == ".") || prefix.contains("//") {
        return Err(format!("'{prefix}' is not a usable prefix"));
    }
    Ok((bucket.to_string(), prefix.to_string()))
}

/// The object name of a stream (and, with `.json` for `.stream`, of its manifest). An
/// increment with every intermediate snapshot (`-I`) is another stream than the one without
/// (`-i`): its name says `.I`, so that one name is only ever one stream's (the encryption's
/// nonces are derived from the name).
pub fn stream_key(
    prefix: &str,
    snapshot: &str,
    to_guid: u64,
    from_guid: u64,
    intermediates: bool,
) -> String {
    let all = if intermediates && from_guid != 0 {
        ".I"
    } else {
        ""
    };
    let name = format!("{snapshot}.{to_guid:016x}.{from_guid:016x}{all}.stream");
    if prefix.is_empty() {
        name
    } else {
        format!("{prefix}/{name}")
    }
}

pub fn manifest_key(stream_key: &str) -> String {
    format!("{}.json", stream_key.trim_end_matches(".stream"))
}

/// The version of [`Manifest`].
pub const MANIFEST_VERSION: u32 = 1;

/// What a stored stream holds (`... .json` beside it).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Manifest {
    pub version: u32,
    /// The dataset that was sent (POOL/DS).
    pub dataset: String,
    /// The snapshot it brings the target to (short name), its guid and creation time.
    pub snapshot: String,
    pub to_guid: u64,
    pub creation: u64,
    /// The base (short name; a bookmark as `#MARK`) and its guid; 0 for a full stream.
    pub from: Option<String>,
    pub from_guid: u64,
    /// Every snapshot the stream carries, oldest first (more than one with `-I`).
    pub snapshots: Vec<String>,
    /// The object's size and SHA-256 (hex), and the stream's own size.
    pub size: u64,
    pub sha256: String,
    pub stream_bytes: u64,
    pub compressed: bool,
    /// The id of the key it is encrypted with (first 16 hex digits of a keyed hash), if it is.
    pub key_id: Option<String>,
    /// When it was stored (seconds since 1970).
    pub stored: u64,
    /// The stream object's name.
    pub object: String,
}

// ---- encryption ----

const MAGIC: &[u8; 8] = b"TANKENC1";
/// Plaintext bytes per sealed chunk.
pub const CHUNK: usize = 1 << 20;
const HEADER: usize = 24;
const TAG: usize = 16;

/// A 256-bit key from its 64 hex digits.
pub fn parse_key(hex: &str) -> Result<[u8; 32], String> {
    let hex = hex.trim();
    if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err("an encryption key is 64 hex digits (256 bits)".into());
    }
    let mut k = [0u8; 32];
    for (i, b) in k.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|e| e.to_string())?;
    }
    Ok(k)
}

/// A key's id: what manifests name it by (the key itself is never stored there).
pub fn key_id(key: &[u8; 32]) -> String {
    let h = blake3::keyed_hash(key, b"tank backup key id");
    h.to_hex()[..16].to_string()
}

fn sealing_key(key: &[u8; 32]) -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, key).expect("a 32-byte key"))
}

fn chunk_aad(header: &[u8; HEADER], index: u64, last: bool) -> Vec<u8> {
    let mut a = header.to_vec();
    a.extend_from_slice(&index.to_le_bytes());
    a.push(u8::from(last));
    a
}

fn chunk_nonce(header: &[u8; HEADER], index: u64) -> Result<Nonce, io::Error> {
    let i = u32::try_from(index)
        .map_err(|_| io::Error::other("a stream of over 2^32 chunks cannot be encrypted"))?;
    let mut n = [0u8; 12];
    n[..8].copy_from_slice(&header[12..20]);
    n[8..].copy_from_slice(&i.to_le_bytes());
    Ok(Nonce::assume_unique_for_key(n))
}

/// Encrypts a stream as it is written (see the module documentation); `finish` seals the
/// last chunk.
pub struct Sealer<W: Write> {
    out: W,
    key: LessSafeKey,
    header: [u8; HEADER],
    buf: Vec<u8>,
    index: u64,
    started: bool,
}

impl<W: Write> Sealer<W> {
    /// `object` (the stream object's name) and the key fix the nonces.
    pub fn new(out: W, key: &[u8; 32], object: &str) -> Self {
        let mut header = [0u8; HEADER];
        header[..8].copy_from_slice(MAGIC);
        header[8..12].copy_from_slice(&(CHUNK as u32).to_le_bytes());
        let derived = blake3::keyed_hash(key, format!("tank backup nonce {object}").as_bytes());
        header[12..20].copy_from_slice(&derived.as_bytes()[..8]);
        let kid = blake3::keyed_hash(key, b"tank backup key id");
        header[20..24].copy_from_slice(&kid.as_bytes()[..4]);
        Sealer {
            out,
            key: sealing_key(key),
            header,
            buf: Vec::with_capacity(CHUNK + TAG),
            index: 0,
            started: false,
        }
    }

    fn seal(&mut self, last: bool) -> io::Result<()> {
        if !self.started {
            self.out.write_all(&self.header)?;
            self.started = true;
        }
        let nonce = chunk_nonce(&self.header, self.index)?;
        let aad = chunk_aad(&self.header, self.index, last);
        let tag = self
            .key
            .seal_in_place_separate_tag(nonce, Aad::from(&aad), &mut self.buf)
            .map_err(|_| io::Error::other("cannot encrypt"))?;
        self.out.write_all(&self.buf)?;
        self.out.write_all(tag.as_ref())?;
        self.buf.clear();
        self.index += 1;
        Ok(())
    }

    /// Seals what is left as the last chunk; the writer back.
    pub fn finish(mut self) -> io::Result<W> {
        self.seal(true)?;
        self.out.flush()?;
        Ok(self.out)
    }
}

impl<W: Write> Write for Sealer<W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.len() == CHUNK {
            self.seal(false)?;
        }
        let n = data.len().min(CHUNK - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Decrypts a sealed stream as it is read; an error names the chunk that fails.
pub struct Opener<R: Read> {
    input: R,
    key: LessSafeKey,
    header: Option<[u8; HEADER]>,
    expect_kid: [u8; 4],
    /// Decrypted bytes not read yet.
    plain: Vec<u8>,
    at: usize,
    index: u64,
    /// One byte read ahead, to know whether the chunk in hand is the last.
    next: Option<u8>,
    done: bool,
}

impl<R: Read> Opener<R> {
    pub fn new(input: R, key: &[u8; 32]) -> Self {
        let kid = blake3::keyed_hash(key, b"tank backup key id");
        let mut expect_kid = [0u8; 4];
        expect_kid.copy_from_slice(&kid.as_bytes()[..4]);
        Opener {
            input,
            key: sealing_key(key),
            header: None,
            expect_kid,
            plain: Vec::new(),
            at: 0,
            index: 0,
            next: None,
            done: false,
        }
    }

    /// Reads up to `buf.len()` bytes (fewer only at the end of the input).
    fn fill(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut got = 0;
        if let Some(b) = self.next.take() {
            if buf.is_empty() {
                self.next = Some(b);
                return Ok(0);
            }
            buf[0] = b;
            got = 1;
        }
        while got < buf.len() {
            match self.input.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(got)
    }

    fn bad(&self, what: &str) -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("encrypted backup, chunk {}: {what}", self.index),
        )
    }

    fn open_next(&mut self) -> io::Result<()> {
        let header = match self.header {
            Some(h) => h,
            None => {
                let mut h = [0u8; HEADER];
                if self.fill(&mut h)? != HEADER || &h[..8] != MAGIC {
                    return Err(self.bad("not an encrypted tank backup (no TANKENC1 header)"));
                }
                if u32::from_le_bytes(h[8..12].try_into().expect("4 bytes")) as usize != CHUNK {
                    return Err(self.bad("unknown chunk size"));
                }
                if h[20..24] != self.expect_kid {
                    return Err(self.bad("it was encrypted with another key"));
                }
                self.header = Some(h);
                h
            }
        };
        let mut sealed = vec![0u8; CHUNK + TAG];
        let n = self.fill(&mut sealed)?;
        if n < TAG {
            return Err(self.bad("cut short (the last chunk is missing)"));
        }
        sealed.truncate(n);
        // A full chunk may be followed by more: look one byte ahead.
        let mut one = [0u8; 1];
        let last = n < CHUNK + TAG || self.fill(&mut one)? == 0;
        if !last {
            self.next = Some(one[0]);
        }
        let nonce = chunk_nonce(&header, self.index)?;
        let aad = chunk_aad(&header, self.index, last);
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(&aad), &mut sealed)
            .map_err(|_| {
                self.bad("does not authenticate (damaged, cut, reordered, or another key)")
            })?;
        let len = plain.len();
        sealed.truncate(len);
        self.plain = sealed;
        self.at = 0;
        self.index += 1;
        self.done = last;
        Ok(())
    }
}

impl<R: Read> Read for Opener<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.at == self.plain.len() {
            if self.done {
                return Ok(0);
            }
            self.open_next()?;
        }
        let n = buf.len().min(self.plain.len() - self.at);
        buf[..n].copy_from_slice(&self.plain[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// Hashes what is read through it (SHA-256) and counts it.
pub struct Hashing<R: Read> {
    pub inner: R,
    pub hash: sha2::Sha256,
    pub bytes: u64,
}

impl<R: Read> Hashing<R> {
    pub fn new(inner: R) -> Self {
        Hashing {
            inner,
            hash: sha2::Sha256::new(),
            bytes: 0,
        }
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A writer paced to `limit` bytes per second (none: as fast as it goes).
pub struct Throttle<W: Write> {
    pub inner: W,
    limit: Option<u64>,
    start: std::time::Instant,
    /// Bytes written through it.
    pub bytes: u64,
}

impl<W: Write> Throttle<W> {
    pub fn new(inner: W, limit: Option<u64>) -> Self {
        Throttle {
            inner,
            limit,
            start: std::time::Instant::now(),
            bytes: 0,
        }
    }
}

impl<W: Write> Write for Throttle<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = match self.limit {
            // At most a tenth of a second's worth at a time, then wait until the rate is
            // back under the limit.
            Some(l) => buf.len().min((l / 10).max(4096) as usize),
            None => buf.len(),
        };
        let n = self.inner.write(&buf[..n])?;
        self.bytes += n as u64;
        if let Some(l) = self.limit {
            let due = std::time::Duration::from_secs_f64(self.bytes as f64 / l.max(1) as f64);
            let spent = self.start.elapsed();
            if due > spent {
                std::thread::sleep(due - spent);
            }
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

// ---- multipart upload ----

/// Smallest part (S3's minimum is 5 MiB for all but the last).
pub const MIN_PART: usize = 8 << 20;

/// The part size for a stream of about `estimate` bytes: at most 9,000 parts (S3 allows
/// 10,000), in whole MiB.
pub fn part_size(estimate: u64) -> usize {
    let want = estimate.div_ceil(9000).div_ceil(1 << 20) << 20;
    (want as usize).max(MIN_PART)
}

/// What an upload did.
#[derive(Debug, Default, Clone)]
pub struct UploadSummary {
    pub size: u64,
    pub sha256: String,
    pub parts: usize,
    /// Parts the store already had (a resumed upload).
    pub skipped: usize,
    pub sent_bytes: u64,
}

/// Parts sent at once (as `rclone` and the AWS CLI do, several in flight hide each
/// request's round trip and the store's own latency).
pub const PARTS_IN_FLIGHT: usize = 4;

/// A part to send, and what became of one.
type PartJob = (u16, Vec<u8>, [u8; 16]);
type PartDone = (u16, Result<String, String>, u64);

/// A multipart upload as a writer (see the module documentation). Parts are hashed here, in
/// order, and sent by [`PARTS_IN_FLIGHT`] workers; a failed part fails the next write.
pub struct Upload<'b> {
    key: String,
    upload: String,
    bucket: std::sync::Arc<dyn Bucket>,
    part: usize,
    buf: Vec<u8>,
    /// ETags by part number - 1, as they are known.
    etags: Vec<Option<String>>,
    have: Vec<PartEntry>,
    hash: sha2::Sha256,
    summary: UploadSummary,
    jobs: Option<crossbeam_channel::Sender<PartJob>>,
    done: crossbeam_channel::Receiver<PartDone>,
    workers: Vec<std::thread::JoinHandle<()>>,
    /// Bytes the store has acknowledged (or held already).
    acked: u64,
    /// Called with the bytes stored so far, as parts complete.
    progress: Box<dyn FnMut(u64) + 'b>,
    canceled: Box<dyn Fn() -> bool + 'b>,
}

impl<'b> Upload<'b> {
    /// Goes on with upload `upload` (whose parts the store lists in `have`), or a new one.
    pub fn new(
        bucket: std::sync::Arc<dyn Bucket>,
        key: &str,
        upload: String,
        part: usize,
        have: Vec<PartEntry>,
        progress: Box<dyn FnMut(u64) + 'b>,
        canceled: Box<dyn Fn() -> bool + 'b>,
    ) -> Self {
        let (jobs, inbox) = crossbeam_channel::bounded::<PartJob>(PARTS_IN_FLIGHT);
        let (report, done) = crossbeam_channel::unbounded::<PartDone>();
        let workers = (0..PARTS_IN_FLIGHT)
            .map(|_| {
                let (inbox, report) = (inbox.clone(), report.clone());
                let (bucket, key, upload) = (bucket.clone(), key.to_string(), upload.clone());
                std::thread::spawn(move || {
                    for (number, data, md5) in inbox {
                        let r = bucket.upload_part(&key, &upload, number, &data, &md5);
                        if report.send((number, r, data.len() as u64)).is_err() {
                            return;
                        }
                    }
                })
            })
            .collect();
        Upload {
            key: key.to_string(),
            upload,
            bucket,
            part,
            buf: Vec::with_capacity(part),
            etags: Vec::new(),
            have,
            hash: sha2::Sha256::new(),
            summary: UploadSummary::default(),
            jobs: Some(jobs),
            done,
            workers,
            acked: 0,
            progress,
            canceled,
        }
    }

    /// Takes in what the workers finished; the first failure, if any.
    fn collect(&mut self, wait: bool) -> io::Result<()> {
        let next = |rx: &crossbeam_channel::Receiver<PartDone>| {
            if wait {
                rx.recv().ok()
            } else {
                rx.try_recv().ok()
            }
        };
        while let Some((number, r, len)) = next(&self.done) {
            match r {
                Ok(etag) => {
                    self.etags[usize::from(number) - 1] = Some(etag);
                    self.acked += len;
                    self.summary.sent_bytes += len;
                    (self.progress)(self.acked);
                }
                Err(e) => return Err(io::Error::other(format!("part {number}: {e}"))),
            }
        }
        Ok(())
    }

    fn emit(&mut self) -> io::Result<()> {
        if (self.canceled)() {
            return Err(io::Error::other("the backup was canceled"));
        }
        self.collect(false)?;
        let number = u16::try_from(self.etags.len() + 1)
            .ok()
            .filter(|n| *n <= 10_000)
            .ok_or_else(|| io::Error::other("a stream of over 10,000 parts"))?;
        let md5: [u8; 16] = md5::Md5::digest(&self.buf).into();
        let want = hex(&md5);
        let len = self.buf.len() as u64;
        let held = self
            .have
            .iter()
            .find(|p| p.number == number && p.size == len && p.etag.trim_matches('"') == want)
            .map(|p| p.etag.clone());
        self.hash.update(&self.buf);
        self.summary.size += len;
        self.summary.parts += 1;
        match held {
            Some(etag) => {
                self.summary.skipped += 1;
                self.etags.push(Some(etag));
                self.acked += len;
                (self.progress)(self.acked);
                self.buf.clear();
            }
            None => {
                self.etags.push(None);
                let data = std::mem::replace(&mut self.buf, Vec::with_capacity(self.part));
                self.jobs
                    .as_ref()
                    .expect("open until finish")
                    .send((number, data, md5))
                    .map_err(|_| io::Error::other("the upload's workers stopped"))?;
            }
        }
        Ok(())
    }

    /// Sends the last part, waits for every part, and assembles the object.
    pub fn finish(mut self) -> Result<UploadSummary, String> {
        if !self.buf.is_empty() || self.etags.is_empty() {
            self.emit().map_err(|e| e.to_string())?;
        }
        self.jobs = None;
        let waited = self.collect(true);
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
        waited.map_err(|e| e.to_string())?;
        let etags: Vec<String> = self
            .etags
            .iter()
            .enumerate()
            .map(|(i, e)| {
                e.clone()
                    .ok_or_else(|| format!("part {} was not stored", i + 1))
            })
            .collect::<Result<_, _>>()?;
        self.bucket
            .complete(&self.key, &self.upload, &etags)
            .map_err(|e| format!("cannot complete the upload of {}: {e}", self.key))?;
        let mut s = std::mem::take(&mut self.summary);
        s.sha256 = hex(&self.hash.clone().finalize());
        Ok(s)
    }
}

impl Drop for Upload<'_> {
    fn drop(&mut self) {
        // A failed or abandoned upload: the workers finish what they hold, then stop.
        self.jobs = None;
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

impl Write for Upload<'_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = data.len().min(self.part - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == self.part {
            self.emit()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

// ---- chains ----

/// The streams to restore, in order, to bring a target that has the snapshots `have`
/// (guids) to `want` (a snapshot name; the newest by creation when `None`).
pub fn chain<'m>(
    manifests: &'m [Manifest],
    want: Option<&str>,
    have: &[u64],
) -> Result<Vec<&'m Manifest>, String> {
    let target = match want {
        Some(w) => manifests
            .iter()
            .filter(|m| m.snapshot == w)
            .max_by_key(|m| (m.from_guid == 0, m.stored))
            .ok_or_else(|| format!("no backup of snapshot '{w}' there"))?,
        None => manifests
            .iter()
            .max_by_key(|m| (m.creation, m.stored))
            .ok_or("no backups there")?,
    };
    let mut out = vec![target];
    let mut at = target;
    while at.from_guid != 0 && !have.contains(&at.from_guid) {
        // The stream that brought its base; a full one is preferred (a shorter chain).
        let prev = manifests
            .iter()
            .filter(|m| m.to_guid == at.from_guid)
            .max_by_key(|m| (m.from_guid == 0 || have.contains(&m.from_guid), m.stored))
            .ok_or_else(|| {
                format!(
                    "the chain to '{}' is broken: no backup brings its base '{}'",
                    target.snapshot,
                    at.from.as_deref().unwrap_or("?")
                )
            })?;
        if out.len() > manifests.len() {
            return Err("the backups' chain loops".into());
        }
        out.push(prev);
        at = prev;
    }
    if have.contains(&target.to_guid) {
        return Ok(Vec::new());
    }
    out.reverse();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seal(data: &[u8], key: &[u8; 32]) -> Vec<u8> {
        let mut s = Sealer::new(Vec::new(), key, "p/x.stream");
        s.write_all(data).unwrap();
        s.finish().unwrap()
    }

    fn open(data: &[u8], key: &[u8; 32]) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        Opener::new(data, key).read_to_end(&mut out)?;
        Ok(out)
    }

    #[test]
    fn sealed_streams_open_and_every_damage_is_refused() {
        let key = [7u8; 32];
        for len in [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK, 2 * CHUNK + 5] {
            let data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            let s = seal(&data, &key);
            assert_eq!(
                s.len(),
                HEADER + len + TAG * len.div_ceil(CHUNK).max(1),
                "{len}"
            );
            assert_eq!(open(&s, &key).unwrap(), data, "{len}");
            // The same object and key: the same bytes (a resumed upload relies on it).
            assert_eq!(seal(&data, &key), s);
            if len == 0 {
                continue;
            }
            // A flipped bit anywhere, a cut at a chunk's end, another key.
            for at in [0, 9, HEADER, HEADER + len / 2, s.len() - 1] {
                let mut bad = s.clone();
                bad[at] ^= 0x10;
                assert!(open(&bad, &key).is_err(), "flip at {at} of {len}");
            }
            if len > CHUNK {
                let cut = &s[..HEADER + CHUNK + TAG];
                let err = open(cut, &key).unwrap_err();
                assert!(err.to_string().contains("authenticate"), "{err}");
                // The first two chunks swapped.
                if len >= 2 * CHUNK {
                    let one = HEADER..HEADER + CHUNK + TAG;
                    let two = HEADER + CHUNK + TAG..HEADER + 2 * (CHUNK + TAG);
                    let mut swapped = s[..HEADER].to_vec();
                    swapped.extend_from_slice(&s[two.clone()]);
                    swapped.extend_from_slice(&s[one]);
                    swapped.extend_from_slice(&s[two.end..]);
                    assert!(open(&swapped, &key).is_err());
                }
            }
            let err = open(&s, &[8u8; 32]).unwrap_err();
            assert!(err.to_string().contains("another key"), "{err}");
        }
        assert!(open(b"not sealed at all, no header", &key).is_err());
    }

    #[test]
    fn urls_keys_and_part_sizes() {
        assert_eq!(
            parse_url("s3://backups/home/alice/").unwrap(),
            ("backups".into(), "home/alice".into())
        );
        assert_eq!(parse_url("s3://bkt").unwrap(), ("bkt".into(), "".into()));
        for bad in [
            "http://x/y",
            "s3://B/x",
            "s3://ab",
            "s3://bkt/../x",
            "s3://bkt/a//b",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
        assert_eq!(
            stream_key("", "d", 2, 1, true),
            "d.0000000000000002.0000000000000001.I.stream"
        );
        assert_ne!(
            stream_key("", "d", 2, 1, true),
            stream_key("", "d", 2, 1, false)
        );
        let k = stream_key("home", "daily", 0xab, 0, true);
        assert_eq!(k, "home/daily.00000000000000ab.0000000000000000.stream");
        assert_eq!(
            manifest_key(&k),
            "home/daily.00000000000000ab.0000000000000000.json"
        );
        assert_eq!(part_size(0), MIN_PART);
        assert_eq!(part_size(1 << 40), 117 << 20);
        assert!(parse_key("00").is_err());
        assert_eq!(parse_key(&"ab".repeat(32)).unwrap(), [0xab; 32]);
    }

    /// A bucket in memory: objects, uploads' parts, and a part number that fails.
    #[derive(Default)]
    struct MemBucket {
        objects: parking_lot::Mutex<std::collections::BTreeMap<String, Vec<u8>>>,
        parts: parking_lot::Mutex<std::collections::BTreeMap<u16, Vec<u8>>>,
        sent: std::sync::atomic::AtomicUsize,
        fail: Option<u16>,
    }

    impl Bucket for MemBucket {
        fn put(&self, key: &str, data: &[u8]) -> Result<(), String> {
            self.objects.lock().insert(key.into(), data.to_vec());
            Ok(())
        }
        fn get(&self, key: &str) -> Result<Box<dyn Read + Send>, String> {
            let o = self.objects.lock().get(key).cloned().ok_or("NoSuchKey")?;
            Ok(Box::new(io::Cursor::new(o)))
        }
        fn list(&self, prefix: &str) -> Result<Vec<ObjectEntry>, String> {
            Ok(self
                .objects
                .lock()
                .iter()
                .filter(|(k, _)| k.starts_with(prefix))
                .map(|(k, v)| ObjectEntry {
                    key: k.clone(),
                    size: v.len() as u64,
                })
                .collect())
        }
        fn delete(&self, key: &str) -> Result<(), String> {
            self.objects.lock().remove(key);
            Ok(())
        }
        fn create_multipart(&self, _: &str) -> Result<String, String> {
            Ok("u1".into())
        }
        fn upload_part(
            &self,
            _: &str,
            _: &str,
            number: u16,
            data: &[u8],
            md5: &[u8; 16],
        ) -> Result<String, String> {
            if Some(number) == self.fail {
                return Err("503 SlowDown".into());
            }
            let sum: [u8; 16] = md5::Md5::digest(data).into();
            if sum != *md5 {
                return Err("400 BadDigest".into());
            }
            self.sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.parts.lock().insert(number, data.to_vec());
            Ok(format!("\"{}\"", hex(md5)))
        }
        fn list_parts(&self, _: &str, _: &str) -> Result<Option<Vec<PartEntry>>, String> {
            Ok(Some(
                self.parts
                    .lock()
                    .iter()
                    .map(|(n, d)| PartEntry {
                        number: *n,
                        etag: format!("\"{}\"", hex(&md5::Md5::digest(d))),
                        size: d.len() as u64,
                    })
                    .collect(),
            ))
        }
        fn complete(&self, key: &str, _: &str, etags: &[String]) -> Result<(), String> {
            let parts = self.parts.lock();
            let mut whole = Vec::new();
            for (i, e) in etags.iter().enumerate() {
                let d = parts.get(&(i as u16 + 1)).ok_or("InvalidPart")?;
                if *e != format!("\"{}\"", hex(&md5::Md5::digest(d))) {
                    return Err("InvalidPart".into());
                }
                whole.extend_from_slice(d);
            }
            self.objects.lock().insert(key.into(), whole);
            Ok(())
        }
        fn abort(&self, _: &str, _: &str) -> Result<(), String> {
            self.parts.lock().clear();
            Ok(())
        }
    }

    fn upload(b: &std::sync::Arc<MemBucket>, data: &[u8]) -> Result<UploadSummary, String> {
        let have = b.list_parts("k", "u1")?.unwrap_or_default();
        let mut up = Upload::new(
            b.clone(),
            "k",
            "u1".into(),
            MIN_PART,
            have,
            Box::new(|_| {}),
            Box::new(|| false),
        );
        up.write_all(data).map_err(|e| e.to_string())?;
        up.finish()
    }

    #[test]
    fn uploads_go_in_parts_and_resume_with_what_the_store_has() {
        let data: Vec<u8> = (0..5 * MIN_PART + 77).map(|i| (i % 253) as u8).collect();
        // Part 4 fails: the upload fails, and parts before it are kept.
        let b = std::sync::Arc::new(MemBucket {
            fail: Some(4),
            ..Default::default()
        });
        let err = upload(&b, &data).unwrap_err();
        assert!(err.contains("part 4") && err.contains("SlowDown"), "{err}");
        assert!(b.objects.lock().is_empty());
        // One kept part is damaged in the store: it is sent again with the missing ones.
        b.parts.lock().get_mut(&2).unwrap()[9] ^= 1;
        let before = b.sent.load(std::sync::atomic::Ordering::SeqCst);
        let ok = std::sync::Arc::new(MemBucket::default());
        *ok.parts.lock() = b.parts.lock().clone();
        let s = upload(&ok, &data).unwrap();
        assert_eq!(s.parts, 6);
        assert_eq!(
            s.skipped + ok.sent.load(std::sync::atomic::Ordering::SeqCst),
            6
        );
        assert!(s.skipped >= 1 && before >= 1, "{s:?}");
        assert!(ok.parts.lock().len() == 6);
        assert_eq!(ok.objects.lock().get("k").unwrap(), &data);
        assert_eq!(s.sha256, hex(&sha2::Sha256::digest(&data)));
        assert_eq!(s.size, data.len() as u64);
    }

    fn m(snap: &str, to: u64, from: u64, creation: u64) -> Manifest {
        Manifest {
            version: MANIFEST_VERSION,
            dataset: "p/d".into(),
            snapshot: snap.into(),
            to_guid: to,
            creation,
            from: (from != 0).then(|| format!("s{from}")),
            from_guid: from,
            snapshots: vec![snap.into()],
            size: 0,
            sha256: String::new(),
            stream_bytes: 0,
            compressed: true,
            key_id: None,
            stored: creation,
            object: String::new(),
        }
    }

    #[test]
    fn chains_start_at_a_full_stream_or_what_the_target_has() {
        let ms = vec![
            m("a", 1, 0, 10),
            m("b", 2, 1, 20),
            m("c", 3, 2, 30),
            m("d", 4, 3, 40),
        ];
        let names = |c: Vec<&Manifest>| c.iter().map(|m| m.snapshot.clone()).collect::<Vec<_>>();
        assert_eq!(names(chain(&ms, None, &[]).unwrap()), ["a", "b", "c", "d"]);
        assert_eq!(names(chain(&ms, Some("b"), &[]).unwrap()), ["a", "b"]);
        assert_eq!(names(chain(&ms, None, &[2]).unwrap()), ["c", "d"]);
        assert!(chain(&ms, None, &[4]).unwrap().is_empty());
        assert!(chain(&ms[1..], None, &[]).unwrap_err().contains("broken"));
        assert!(chain(&ms, Some("zz"), &[]).is_err());
        // A newer full stream shortens the chain.
        let mut more = ms.clone();
        more.push(m("c", 3, 0, 30));
        assert_eq!(names(chain(&more, None, &[]).unwrap()), ["c", "d"]);
    }
}
