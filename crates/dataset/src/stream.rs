//! The send stream: records with a running checksum (docs/FORMAT.md §"Send stream").
//!
//! # Theory of operation
//! A stream is one or more *substreams*, each carrying one snapshot of one dataset: a
//! `BEGIN` record, the changes of the dataset's tree since the base (`CLEAR`, `UNCHANGED`,
//! `LEAF`, and the `SET_INLINE` / `SET_BLOCK` items of each leaf), and an `END` record. Every record has a
//! 16-byte header (type, flags, payload length, sequence number within the substream), its
//! payload, and a 16-byte trailer: the XXH3-128 hash of every header and payload of the
//! substream so far (as zfs's running fletcher-4: against damage, not against an
//! adversary, whom the transport keeps out). So a flipped bit, a lost, repeated or reordered record, or a record of
//! another stream spliced in, fails the trailer of the record where it happens; a cut stream
//! lacks its `END`. [`Writer`] makes records, [`Reader`] checks and decodes them; neither
//! knows what the records mean (`send.rs`, `recv.rs`).

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};
use tank_object::tree::Key;

/// Format version in `BEGIN`.
pub const STREAM_VERSION: u32 = 1;
/// The `BEGIN` payload's `magic`.
pub const STREAM_MAGIC: &str = "tank-send-stream";
pub const HEADER_SIZE: usize = 16;
pub const TRAILER_SIZE: usize = 16;
/// Largest payload: a 16 MiB block and its key and sizes.
pub const PAYLOAD_MAX: usize = (16 << 20) + 64;

pub const REC_BEGIN: u16 = 1;
pub const REC_CLEAR: u16 = 2;
pub const REC_LEAF: u16 = 3;
pub const REC_SET_INLINE: u16 = 4;
pub const REC_SET_BLOCK: u16 = 5;
pub const REC_END: u16 = 6;
pub const REC_UNCHANGED: u16 = 7;

/// What a `BEGIN` record says (its payload is this as JSON).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Begin {
    pub magic: String,
    pub version: u32,
    /// "filesystem" or "volume".
    pub kind: String,
    /// The base snapshot's (or bookmark's) guid; 0 for a full stream.
    pub from_guid: u64,
    /// The snapshot carried.
    pub to_guid: u64,
    /// Its full name on the sending pool, and its own name (after '@').
    pub to_name: String,
    pub snapshot: String,
    /// Its creation time, seconds since 1970.
    pub creation: u64,
    /// The dataset's local properties as of sending.
    pub props: std::collections::BTreeMap<String, String>,
    /// Blocks come as stored (compressed) rather than as logical bytes.
    pub compressed: bool,
    /// A resumed stream starts at this key (hex of its 17 bytes); absent from the start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_from: Option<String>,
    /// This substream's place in its stream (0-based) and the stream's number of them, so
    /// a stream cut between two substreams is known to be short.
    #[serde(default)]
    pub part: u64,
    #[serde(default)]
    pub parts: u64,
    /// `send -R`: what the stream replicates; a substream's dataset keeps its place below
    /// `root` under the receive's target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicate: Option<Replicate>,
}

/// What a replication stream (`send -R`) was made of: enough to make it again, for a resume.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Replicate {
    /// The replicated dataset's full name on the sender, and the snapshot sent.
    pub root: String,
    pub snapshot: String,
    /// The base (`@name` or `#name`), if an increment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    #[serde(default)]
    pub intermediates: bool,
}

/// One decoded record.
#[derive(Debug)]
pub enum Record {
    Begin(Box<Begin>),
    Clear {
        lo: Key,
        hi: Option<Key>,
    },
    Leaf {
        lo: Key,
        hi: Option<Key>,
        keys: Vec<Key>,
    },
    Unchanged {
        lo: Key,
        hi: Option<Key>,
        first: Key,
        last: Key,
    },
    SetInline {
        key: Key,
        data: Vec<u8>,
    },
    SetBlock {
        key: Key,
        /// `Compression` as u8 (0 = off) and the logical length.
        compression: u8,
        lsize: u32,
        data: Vec<u8>,
    },
    End {
        to_guid: u64,
        records: u64,
    },
}

pub fn key_hex(k: &Key) -> String {
    tank_block::blkptr::hex(&k.encode())
}

pub fn key_from_hex(s: &str) -> Option<Key> {
    if s.len() != 2 * Key::SIZE {
        return None;
    }
    let mut raw = [0u8; Key::SIZE];
    for (i, b) in raw.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(Key::decode(&raw))
}

fn put_range(out: &mut Vec<u8>, lo: &Key, hi: &Option<Key>) {
    out.extend_from_slice(&lo.encode());
    match hi {
        Some(h) => {
            out.push(1);
            out.extend_from_slice(&h.encode());
        }
        None => {
            out.push(0);
            out.extend_from_slice(&[0u8; Key::SIZE]);
        }
    }
}

/// Writes the records of one substream.
pub struct Writer<'a> {
    out: &'a mut dyn Write,
    hasher: xxhash_rust::xxh3::Xxh3Default,
    seq: u64,
    total: u64,
    /// Bytes written so far.
    pub bytes: u64,
}

impl<'a> Writer<'a> {
    pub fn new(out: &'a mut dyn Write) -> Self {
        Writer {
            out,
            hasher: xxhash_rust::xxh3::Xxh3Default::new(),
            seq: 0,
            total: 0,
            bytes: 0,
        }
    }

    /// Records written so far, in all substreams.
    pub fn total_records(&self) -> u64 {
        self.total
    }

    fn record(&mut self, kind: u16, payload: &[u8]) -> io::Result<()> {
        self.record_parts(kind, &[payload])
    }

    /// A record whose payload is `parts` one after the other: a block's bytes go out from
    /// where they were read, never copied into a payload first.
    fn record_parts(&mut self, kind: u16, parts: &[&[u8]]) -> io::Result<()> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        assert!(len <= PAYLOAD_MAX, "stream payload too large");
        let mut header = [0u8; HEADER_SIZE];
        header[0..2].copy_from_slice(&kind.to_le_bytes());
        header[4..8].copy_from_slice(&(len as u32).to_le_bytes());
        header[8..16].copy_from_slice(&self.seq.to_le_bytes());
        self.hasher.update(&header);
        for p in parts {
            self.hasher.update(p);
        }
        let trailer = self.hasher.digest128().to_le_bytes();
        self.out.write_all(&header)?;
        for p in parts {
            self.out.write_all(p)?;
        }
        self.out.write_all(&trailer)?;
        self.seq += 1;
        self.total += 1;
        self.bytes += (HEADER_SIZE + len + TRAILER_SIZE) as u64;
        Ok(())
    }

    pub fn begin(&mut self, b: &Begin) -> io::Result<()> {
        let json = serde_json::to_vec(b).map_err(io::Error::other)?;
        self.record(REC_BEGIN, &json)
    }

    pub fn clear(&mut self, lo: &Key, hi: &Option<Key>) -> io::Result<()> {
        let mut p = Vec::with_capacity(2 * Key::SIZE + 1);
        put_range(&mut p, lo, hi);
        self.record(REC_CLEAR, &p)
    }

    pub fn unchanged(
        &mut self,
        lo: &Key,
        hi: &Option<Key>,
        first: &Key,
        last: &Key,
    ) -> io::Result<()> {
        let mut p = Vec::with_capacity(4 * Key::SIZE + 1);
        put_range(&mut p, lo, hi);
        p.extend_from_slice(&first.encode());
        p.extend_from_slice(&last.encode());
        self.record(REC_UNCHANGED, &p)
    }

    pub fn leaf(&mut self, lo: &Key, hi: &Option<Key>, keys: &[Key]) -> io::Result<()> {
        let mut p = Vec::with_capacity(2 * Key::SIZE + 5 + keys.len() * Key::SIZE);
        put_range(&mut p, lo, hi);
        p.extend_from_slice(&(keys.len() as u32).to_le_bytes());
        for k in keys {
            p.extend_from_slice(&k.encode());
        }
        self.record(REC_LEAF, &p)
    }

    pub fn set_inline(&mut self, key: &Key, data: &[u8]) -> io::Result<()> {
        let mut p = Vec::with_capacity(Key::SIZE + data.len());
        p.extend_from_slice(&key.encode());
        p.extend_from_slice(data);
        self.record(REC_SET_INLINE, &p)
    }

    pub fn set_block(
        &mut self,
        key: &Key,
        compression: u8,
        lsize: u32,
        data: &[u8],
    ) -> io::Result<()> {
        let mut p = [0u8; Key::SIZE + 5];
        p[..Key::SIZE].copy_from_slice(&key.encode());
        p[Key::SIZE] = compression;
        p[Key::SIZE + 1..].copy_from_slice(&lsize.to_le_bytes());
        self.record_parts(REC_SET_BLOCK, &[&p, data])
    }

    /// Ends the substream; the next record written starts a new one.
    pub fn end(&mut self, to_guid: u64) -> io::Result<()> {
        let mut p = [0u8; 16];
        p[..8].copy_from_slice(&to_guid.to_le_bytes());
        p[8..].copy_from_slice(&self.seq.to_le_bytes());
        self.record(REC_END, &p)?;
        self.out.flush()?;
        self.hasher = xxhash_rust::xxh3::Xxh3Default::new();
        self.seq = 0;
        Ok(())
    }
}

/// Why a send or a receive failed.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    #[error(transparent)]
    Stream(#[from] StreamError),
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    NoSpace(String),
    #[error(transparent)]
    Dsl(#[from] crate::dsl::DslError),
    #[error(transparent)]
    Object(#[from] tank_object::ObjectError),
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// Why a stream was refused. Every message names the record and the byte where it went wrong.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("stream damaged at record {record} (byte {offset}): {what}")]
    Damaged {
        record: u64,
        offset: u64,
        what: String,
    },
    #[error("stream cut short at byte {offset}, in record {record}: {what}")]
    Truncated {
        record: u64,
        offset: u64,
        what: String,
    },
}

/// Reads and checks the records of a stream.
pub struct Reader<'a> {
    input: &'a mut dyn Read,
    hasher: xxhash_rust::xxh3::Xxh3Default,
    seq: u64,
    /// Bytes read so far.
    pub offset: u64,
    /// Records read in all substreams.
    pub total_records: u64,
}

impl<'a> Reader<'a> {
    pub fn new(input: &'a mut dyn Read) -> Self {
        Reader {
            input,
            hasher: xxhash_rust::xxh3::Xxh3Default::new(),
            seq: 0,
            offset: 0,
            total_records: 0,
        }
    }

    fn damaged(&self, what: impl Into<String>) -> StreamError {
        StreamError::Damaged {
            record: self.total_records,
            offset: self.offset,
            what: what.into(),
        }
    }

    /// Fills `buf`; `Ok(false)` at the end of the input before the first byte.
    fn fill(&mut self, buf: &mut [u8], what: &str, eof_ok: bool) -> Result<bool, StreamError> {
        let mut got = 0;
        while got < buf.len() {
            match self.input.read(&mut buf[got..]) {
                Ok(0) => {
                    if got == 0 && eof_ok {
                        return Ok(false);
                    }
                    return Err(StreamError::Truncated {
                        record: self.total_records,
                        offset: self.offset + got as u64,
                        what: format!("the input ended inside the {what}"),
                    });
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.offset += buf.len() as u64;
        Ok(true)
    }

    /// The next record, checked; `None` at the end of the input between substreams.
    pub fn next_record(&mut self) -> Result<Option<Record>, StreamError> {
        let mut header = [0u8; HEADER_SIZE];
        if !self.fill(&mut header, "record header", self.seq == 0)? {
            return Ok(None);
        }
        let kind = u16::from_le_bytes([header[0], header[1]]);
        let len = u32::from_le_bytes(header[4..8].try_into().expect("4")) as usize;
        let seq = u64::from_le_bytes(header[8..16].try_into().expect("8"));
        if len > PAYLOAD_MAX {
            return Err(self.damaged(format!("record of {len} bytes (at most {PAYLOAD_MAX})")));
        }
        // A SET's bytes are read into a buffer of their own (no copy, no zeroing): they
        // become the item as they are.
        let prefix_len = match kind {
            REC_SET_BLOCK => len.min(Key::SIZE + 5),
            REC_SET_INLINE => len.min(Key::SIZE),
            _ => len,
        };
        let mut payload = vec![0u8; prefix_len];
        self.fill(&mut payload, "record payload", false)?;
        let rest = len - prefix_len;
        let mut data = Vec::with_capacity(rest);
        let got = (&mut *self.input)
            .take(rest as u64)
            .read_to_end(&mut data)?;
        self.offset += got as u64;
        if got < rest {
            return Err(StreamError::Truncated {
                record: self.total_records,
                offset: self.offset,
                what: "the input ended inside the record payload".into(),
            });
        }
        let mut trailer = [0u8; TRAILER_SIZE];
        self.fill(&mut trailer, "record checksum", false)?;
        self.hasher.update(&header);
        self.hasher.update(&payload);
        self.hasher.update(&data);
        if self.hasher.digest128().to_le_bytes() != trailer {
            return Err(self.damaged(
                "checksum mismatch (a changed, lost or reordered record, or another stream's)",
            ));
        }
        if seq != self.seq {
            return Err(self.damaged(format!("record number {seq} where {} expected", self.seq)));
        }
        if header[2] != 0 || header[3] != 0 {
            return Err(self.damaged("unknown record flags"));
        }
        if self.seq == 0 && kind != REC_BEGIN {
            return Err(self.damaged("a substream must start with BEGIN"));
        }
        let rec = self.decode(kind, payload, data)?;
        self.seq += 1;
        self.total_records += 1;
        if matches!(rec, Record::End { .. }) {
            self.hasher = xxhash_rust::xxh3::Xxh3Default::new();
            self.seq = 0;
        }
        Ok(Some(rec))
    }

    fn key_at(&self, p: &[u8], at: usize) -> Result<Key, StreamError> {
        let raw: &[u8; Key::SIZE] = p
            .get(at..at + Key::SIZE)
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| self.damaged("record too short for its key"))?;
        Ok(Key::decode(raw))
    }

    fn range_at(&self, p: &[u8]) -> Result<(Key, Option<Key>), StreamError> {
        if p.len() < 2 * Key::SIZE + 1 {
            return Err(self.damaged("record too short for its range"));
        }
        let lo = self.key_at(p, 0)?;
        let hi = match p[Key::SIZE] {
            0 => None,
            1 => Some(self.key_at(p, Key::SIZE + 1)?),
            x => return Err(self.damaged(format!("range end marker {x}"))),
        };
        if hi.is_some_and(|h| h <= lo) {
            return Err(self.damaged("empty or inverted range"));
        }
        Ok((lo, hi))
    }

    /// Decodes a checked record: `p` its payload, but for a SET the bytes after the key
    /// (and sizes), which come as `data`.
    fn decode(&self, kind: u16, p: Vec<u8>, data: Vec<u8>) -> Result<Record, StreamError> {
        const RANGE: usize = 2 * Key::SIZE + 1;
        Ok(match kind {
            REC_BEGIN => {
                if self.seq != 0 {
                    return Err(self.damaged("BEGIN inside a substream"));
                }
                let b: Begin = serde_json::from_slice(&p)
                    .map_err(|e| self.damaged(format!("unreadable BEGIN: {e}")))?;
                if b.magic != STREAM_MAGIC {
                    return Err(self.damaged("not a tank send stream"));
                }
                if b.version != STREAM_VERSION {
                    return Err(self.damaged(format!(
                        "stream format version {} (this build reads {STREAM_VERSION})",
                        b.version
                    )));
                }
                Record::Begin(Box::new(b))
            }
            REC_CLEAR => {
                if p.len() != RANGE {
                    return Err(self.damaged("CLEAR of the wrong size"));
                }
                let (lo, hi) = self.range_at(&p)?;
                Record::Clear { lo, hi }
            }
            REC_UNCHANGED => {
                if p.len() != RANGE + 2 * Key::SIZE {
                    return Err(self.damaged("UNCHANGED of the wrong size"));
                }
                let (lo, hi) = self.range_at(&p)?;
                let first = self.key_at(&p, RANGE)?;
                let last = self.key_at(&p, RANGE + Key::SIZE)?;
                if first < lo || last < first || hi.is_some_and(|h| last >= h) {
                    return Err(self.damaged("UNCHANGED keys outside its range"));
                }
                Record::Unchanged {
                    lo,
                    hi,
                    first,
                    last,
                }
            }
            REC_LEAF => {
                let (lo, hi) = self.range_at(&p)?;
                let n = p
                    .get(RANGE..RANGE + 4)
                    .map(|b| u32::from_le_bytes(b.try_into().expect("4")) as usize)
                    .ok_or_else(|| self.damaged("LEAF too short"))?;
                if p.len() != RANGE + 4 + n * Key::SIZE {
                    return Err(self.damaged("LEAF of the wrong size"));
                }
                let mut keys = Vec::with_capacity(n);
                for i in 0..n {
                    let k = self.key_at(&p, RANGE + 4 + i * Key::SIZE)?;
                    if keys.last().is_some_and(|prev| *prev >= k) {
                        return Err(self.damaged("LEAF keys out of order"));
                    }
                    if k < lo || hi.is_some_and(|h| k >= h) {
                        return Err(self.damaged("LEAF key outside its range"));
                    }
                    keys.push(k);
                }
                Record::Leaf { lo, hi, keys }
            }
            REC_SET_INLINE => {
                let key = self.key_at(&p, 0)?;
                Record::SetInline { key, data }
            }
            REC_SET_BLOCK => {
                let key = self.key_at(&p, 0)?;
                if p.len() < Key::SIZE + 5 {
                    return Err(self.damaged("SET_BLOCK too short"));
                }
                let compression = p[Key::SIZE];
                let lsize =
                    u32::from_le_bytes(p[Key::SIZE + 1..Key::SIZE + 5].try_into().expect("4"));
                Record::SetBlock {
                    key,
                    compression,
                    lsize,
                    data,
                }
            }
            REC_END => {
                if p.len() != 16 {
                    return Err(self.damaged("END of the wrong size"));
                }
                let to_guid = u64::from_le_bytes(p[..8].try_into().expect("8"));
                let records = u64::from_le_bytes(p[8..].try_into().expect("8"));
                if records != self.seq {
                    return Err(
                        self.damaged(format!("END counts {records} records, {} came", self.seq))
                    );
                }
                Record::End { to_guid, records }
            }
            other => return Err(self.damaged(format!("unknown record type {other}"))),
        })
    }
}

/// The `BEGIN` of a one-part full stream of `p/a@s` (guid 7), for tests and the fuzz target.
fn sample_begin(compressed: bool) -> Begin {
    Begin {
        magic: STREAM_MAGIC.into(),
        version: STREAM_VERSION,
        kind: "filesystem".into(),
        from_guid: 0,
        to_guid: 7,
        to_name: "p/a@s".into(),
        snapshot: "s".into(),
        creation: 1,
        props: Default::default(),
        compressed,
        resume_from: None,
        part: 0,
        parts: 1,
        replicate: None,
    }
}

/// For the fuzz target `send_stream` (`fuzz.rs`): the input read as a stream as it is, then
/// cut into records (a type byte, a 16-bit length, the payload) that are given their header
/// and running checksum, so that the decoding behind the checksum is reached; with a real
/// `BEGIN` in front when the first byte is odd.
#[doc(hidden)]
pub fn fuzz_stream(data: &[u8]) {
    fn read_all(bytes: &[u8]) {
        let mut input = bytes;
        let mut r = Reader::new(&mut input);
        // Every record takes at least 32 bytes: the loop ends with the input.
        while let Ok(Some(_)) = r.next_record() {}
    }
    read_all(data);
    let Some((&first, mut rest)) = data.split_first() else {
        return;
    };
    let mut out = Vec::new();
    {
        let mut w = Writer::new(&mut out);
        if first & 1 == 1 {
            let _ = w.begin(&sample_begin(first & 2 == 2));
        }
        while let [kind, l0, l1, tail @ ..] = rest {
            let len = usize::from(u16::from_le_bytes([*l0, *l1])).min(tail.len());
            let (payload, after) = tail.split_at(len);
            let _ = w.record(u16::from(*kind % 9), payload);
            rest = after;
        }
    }
    read_all(&out);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let mut out = Vec::new();
        let mut w = Writer::new(&mut out);
        w.begin(&sample_begin(false)).unwrap();
        let k = Key::new(1, 1, 0);
        w.leaf(&Key::MIN, &None, &[k]).unwrap();
        w.set_inline(&k, b"hello").unwrap();
        w.set_block(&Key::new(1, 2, 0), 0, 3, b"abc").unwrap();
        w.end(7).unwrap();
        out
    }

    fn read_all(bytes: &[u8]) -> Result<Vec<Record>, StreamError> {
        let mut input = bytes;
        let mut r = Reader::new(&mut input);
        let mut out = Vec::new();
        while let Some(rec) = r.next_record()? {
            out.push(rec);
        }
        Ok(out)
    }

    #[test]
    fn round_trip() {
        let recs = read_all(&sample()).unwrap();
        assert_eq!(recs.len(), 5);
        assert!(matches!(&recs[2], Record::SetInline { data, .. } if data == b"hello"));
        assert!(matches!(
            recs[4],
            Record::End {
                to_guid: 7,
                records: 4
            }
        ));
    }

    #[test]
    fn every_flipped_bit_is_refused() {
        let good = sample();
        for byte in 0..good.len() {
            for bit in [0u8, 3, 7] {
                let mut bad = good.clone();
                bad[byte] ^= 1 << bit;
                assert!(
                    read_all(&bad).is_err(),
                    "flip at byte {byte} bit {bit} accepted"
                );
            }
        }
    }

    #[test]
    fn every_cut_is_refused_or_ends_between_substreams() {
        let good = sample();
        for cut in 1..good.len() {
            let r = read_all(&good[..cut]);
            assert!(r.is_err(), "cut at {cut} accepted");
        }
    }

    #[test]
    fn reordered_records_are_refused() {
        let good = sample();
        // Swap the SET_INLINE and SET_BLOCK records (each header 16 + payload + 32).
        let mut input = &good[..];
        let mut r = Reader::new(&mut input);
        let mut bounds = vec![0u64];
        while r.next_record().unwrap().is_some() {
            bounds.push(r.offset);
        }
        let (a, b, c) = (bounds[2] as usize, bounds[3] as usize, bounds[4] as usize);
        let mut bad = good[..a].to_vec();
        bad.extend_from_slice(&good[b..c]);
        bad.extend_from_slice(&good[a..b]);
        bad.extend_from_slice(&good[c..]);
        assert!(matches!(
            read_all(&bad),
            Err(StreamError::Damaged { record: 2, .. })
        ));
    }
}
