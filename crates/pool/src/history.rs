//! Pool history: every command that changed the pool, as `zpool history` shows it.
//!
//! # On-disk format (docs/FORMAT.md §"History block")
//! A chain of blocks, newest first. Each block: magic "TANKHIST" u64, count u32, 4 zero
//! bytes, the previous block's pointer (128 bytes, a hole for the first), then `count` records
//! of { u32 length, length bytes of JSON {"time", "txg", "host", "command"} }.
//!
//! A history block comes from a device: decoding it never panics, and arithmetic on what it
//! says is checked (`clippy::arithmetic_side_effects` is denied here).

#![deny(clippy::arithmetic_side_effects)]

use serde::{Deserialize, Serialize};
use tank_block::{BlockPtr, BLKPTR_SIZE};

use crate::PoolError;

pub const HIST_MAGIC: &[u8; 8] = b"TANKHIST";
/// Bytes before the records: magic, count, zero, the previous block's pointer.
const HEAD: usize = 16 + BLKPTR_SIZE;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryRecord {
    pub time: u64,
    pub txg: u64,
    pub host: String,
    pub command: String,
}

pub fn encode(prev: Option<&BlockPtr>, records: &[HistoryRecord]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(HIST_MAGIC);
    out.extend_from_slice(&(records.len() as u32).to_le_bytes());
    out.extend_from_slice(&[0u8; 4]);
    out.extend_from_slice(&BlockPtr::encode_opt(prev));
    for r in records {
        let json = serde_json::to_vec(r).expect("history record serializes");
        out.extend_from_slice(&(json.len() as u32).to_le_bytes());
        out.extend_from_slice(&json);
    }
    out
}

/// Decodes one history block: (previous block, records).
pub fn decode(raw: &[u8]) -> Result<(Option<BlockPtr>, Vec<HistoryRecord>), PoolError> {
    let bad = |m: &str| PoolError::Corrupt(format!("history block: {m}"));
    if raw.len() < HEAD || &raw[0..8] != HIST_MAGIC {
        return Err(bad("bad magic"));
    }
    let count = u32::from_le_bytes(raw[8..12].try_into().expect("4"));
    let prev = BlockPtr::decode(&raw[16..HEAD])?;
    let mut rest = &raw[HEAD..];
    let mut records = Vec::with_capacity(count.min(4096) as usize);
    for _ in 0..count {
        let (len, after) = rest
            .split_first_chunk::<4>()
            .ok_or_else(|| bad("truncated"))?;
        let (json, after) = usize::try_from(u32::from_le_bytes(*len))
            .ok()
            .and_then(|len| after.split_at_checked(len))
            .ok_or_else(|| bad("truncated record"))?;
        let r: HistoryRecord = serde_json::from_slice(json).map_err(|e| bad(&e.to_string()))?;
        records.push(r);
        rest = after;
    }
    Ok((prev, records))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip() {
        let recs = vec![HistoryRecord {
            time: 1,
            txg: 2,
            host: "h".into(),
            command: "pool create tank raidz2 a b c".into(),
        }];
        let raw = encode(None, &recs);
        assert_eq!(decode(&raw).unwrap(), (None, recs));
    }

    proptest! {
        #[test]
        fn garbage_never_panics(raw in proptest::collection::vec(any::<u8>(), 0..600)) {
            let mut b = raw.clone();
            if b.len() >= 8 { b[..8].copy_from_slice(HIST_MAGIC); }
            let _ = decode(&b);
            let _ = decode(&raw);
        }
    }
}
