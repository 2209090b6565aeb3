//! The pool-level blocks written at every txg commit: the root block, the objset table and the
//! space map log.
//!
//! # On-disk formats (docs/FORMAT.md)
//! Root block (512 bytes logical, 3 copies; the uberblock points at it):
//! ```text
//!   0 magic "TANKROOT" | 8 version u32 | 12 flags u32 | 16 txg u64 | 24 spacemap_chain u32
//!  28 zero u32 | 32 history_count u64 | 40 objset table bp | 168 space map head bp
//! 296 history head bp | 424 intent log header (56 bytes, zil.rs; zeros: no log yet)
//! 480..512 zero
//! ```
//! Objset table (3 copies): magic "TANKOSTB" | count u32 | zero u32 | count × { id u64, root bp }.
//! Space map log block (3 copies): magic "TANKSPML" | txg u64 | flags u32 (bit 0: condensed)
//! | count u32 | previous block bp (128) | count × 32-byte records (tank_block::SpaceRecord).
//!
//! # Space accounting of these blocks
//! Records describe every allocation and free, except that the allocations of txg N's own
//! space map block and root block can only be recorded in txg N+1's log. On import the
//! newest log block and the root block are therefore marked allocated after the replay (and
//! their records queued for the next txg). A condensed block starts a new chain: it lists the
//! complete state (allocated extents and deferred frees), and the old chain is freed.
//!
//! These blocks come from devices: decoding them never panics, and arithmetic on what they
//! say is checked (`clippy::arithmetic_side_effects` is denied here).

#![deny(clippy::arithmetic_side_effects)]

use std::slice::ChunksExact;

use tank_block::alloc::SPACE_RECORD_SIZE;
use tank_block::{BlockPtr, SpaceRecord, BLKPTR_SIZE};

use crate::PoolError;

pub const ROOT_MAGIC: &[u8; 8] = b"TANKROOT";
pub const OSTB_MAGIC: &[u8; 8] = b"TANKOSTB";
pub const SPML_MAGIC: &[u8; 8] = b"TANKSPML";
pub const ROOT_SIZE: usize = 512;
/// Condense the space map log once its chain is this long (bounds import time).
pub const CONDENSE_CHAIN: u32 = 64;
/// Bytes before an objset table's entries.
const OSTB_HEAD: usize = 16;
/// One objset table entry: id, root block pointer.
const OSTB_ENTRY: usize = 8 + BLKPTR_SIZE;
/// Bytes before a space map log block's records.
const SPML_HEAD: usize = 24 + BLKPTR_SIZE;

fn corrupt(what: &str) -> PoolError {
    PoolError::Corrupt(what.to_string())
}

/// The little-endian u32 at `o` of `b` (which the caller has checked is long enough).
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..][..4].try_into().expect("4 bytes"))
}
/// The little-endian u64 at `o` of `b` (which the caller has checked is long enough).
fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..][..8].try_into().expect("8 bytes"))
}

/// The first `count` of a block's fixed-size `entries`; Err (naming the block, `what`) when
/// it holds fewer.
fn counted<'a>(
    entries: ChunksExact<'a, u8>,
    count: u32,
    what: &str,
) -> Result<impl Iterator<Item = &'a [u8]>, PoolError> {
    usize::try_from(count)
        .ok()
        .filter(|&n| n <= entries.len())
        .map(|n| entries.take(n))
        .ok_or_else(|| corrupt(&format!("{what}: truncated")))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RootBlock {
    pub txg: u64,
    pub spacemap_chain: u32,
    pub history_count: u64,
    pub objset_table: Option<BlockPtr>,
    pub spacemap_head: Option<BlockPtr>,
    pub history_head: Option<BlockPtr>,
    pub log: crate::zil::LogHeader,
}

impl RootBlock {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; ROOT_SIZE];
        b[0..8].copy_from_slice(ROOT_MAGIC);
        b[8..12].copy_from_slice(&crate::FORMAT_VERSION.to_le_bytes());
        b[16..24].copy_from_slice(&self.txg.to_le_bytes());
        b[24..28].copy_from_slice(&self.spacemap_chain.to_le_bytes());
        b[32..40].copy_from_slice(&self.history_count.to_le_bytes());
        b[40..168].copy_from_slice(&BlockPtr::encode_opt(self.objset_table.as_ref()));
        b[168..296].copy_from_slice(&BlockPtr::encode_opt(self.spacemap_head.as_ref()));
        b[296..424].copy_from_slice(&BlockPtr::encode_opt(self.history_head.as_ref()));
        self.log.encode(&mut b[424..]);
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self, PoolError> {
        if b.len() < ROOT_SIZE || &b[0..8] != ROOT_MAGIC {
            return Err(corrupt("root block: bad magic"));
        }
        if u32_at(b, 8) != crate::FORMAT_VERSION {
            return Err(corrupt("root block: unsupported version"));
        }
        Ok(Self {
            txg: u64_at(b, 16),
            spacemap_chain: u32_at(b, 24),
            history_count: u64_at(b, 32),
            objset_table: BlockPtr::decode(&b[40..168])?,
            spacemap_head: BlockPtr::decode(&b[168..296])?,
            history_head: BlockPtr::decode(&b[296..424])?,
            log: crate::zil::LogHeader::decode(&b[424..]).map_err(PoolError::Corrupt)?,
        })
    }
}

pub fn encode_objset_table(entries: &[(u64, Option<BlockPtr>)]) -> Vec<u8> {
    let mut b = Vec::with_capacity(
        entries
            .len()
            .saturating_mul(OSTB_ENTRY)
            .saturating_add(OSTB_HEAD),
    );
    b.extend_from_slice(OSTB_MAGIC);
    b.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    b.extend_from_slice(&[0u8; 4]);
    for (id, bp) in entries {
        b.extend_from_slice(&id.to_le_bytes());
        b.extend_from_slice(&BlockPtr::encode_opt(bp.as_ref()));
    }
    b
}

pub fn decode_objset_table(b: &[u8]) -> Result<Vec<(u64, Option<BlockPtr>)>, PoolError> {
    if b.len() < OSTB_HEAD || &b[0..8] != OSTB_MAGIC {
        return Err(corrupt("objset table: bad magic"));
    }
    let entries = b[OSTB_HEAD..].chunks_exact(OSTB_ENTRY);
    counted(entries, u32_at(b, 8), "objset table")?
        .map(|e| Ok((u64_at(e, 0), BlockPtr::decode(&e[8..])?)))
        .collect()
}

#[derive(Debug, Clone)]
pub struct SpaceMapBlock {
    pub txg: u64,
    pub condensed: bool,
    pub prev: Option<BlockPtr>,
    pub records: Vec<SpaceRecord>,
}

impl SpaceMapBlock {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(
            self.records
                .len()
                .saturating_mul(SPACE_RECORD_SIZE)
                .saturating_add(SPML_HEAD),
        );
        b.extend_from_slice(SPML_MAGIC);
        b.extend_from_slice(&self.txg.to_le_bytes());
        b.extend_from_slice(&u32::from(self.condensed).to_le_bytes());
        b.extend_from_slice(&(self.records.len() as u32).to_le_bytes());
        b.extend_from_slice(&BlockPtr::encode_opt(self.prev.as_ref()));
        for r in &self.records {
            r.encode(&mut b);
        }
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self, PoolError> {
        if b.len() < SPML_HEAD || &b[0..8] != SPML_MAGIC {
            return Err(corrupt("space map log: bad magic"));
        }
        let listed = b[SPML_HEAD..].chunks_exact(SPACE_RECORD_SIZE);
        let records = counted(listed, u32_at(b, 20), "space map log")?
            .map(SpaceRecord::decode)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            txg: u64_at(b, 8),
            condensed: u32_at(b, 16) & 1 == 1,
            prev: BlockPtr::decode(&b[24..SPML_HEAD])?,
            records,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn decoders_never_panic(raw in proptest::collection::vec(any::<u8>(), 0..800), which in 0u8..3) {
            let mut b = raw.clone();
            let magic = [ROOT_MAGIC, OSTB_MAGIC, SPML_MAGIC][which as usize];
            if b.len() >= 8 { b[..8].copy_from_slice(magic); }
            let _ = RootBlock::decode(&b);
            let _ = decode_objset_table(&b);
            let _ = SpaceMapBlock::decode(&b);
        }
    }

    #[test]
    fn round_trips() {
        let r = RootBlock {
            txg: 9,
            spacemap_chain: 3,
            history_count: 4,
            objset_table: None,
            spacemap_head: None,
            history_head: None,
            log: crate::zil::LogHeader {
                guid: 7,
                head_vdev: 2,
                head_offset: 1 << 20,
                head_seq: 11,
                head_size: 8192,
                region: Some(crate::zil::Region {
                    vdev: 0,
                    start: 4 << 20,
                    end: 8 << 20,
                }),
            },
        };
        assert_eq!(RootBlock::decode(&r.encode()).unwrap(), r);
        let t = vec![(0u64, None), (5, None)];
        assert_eq!(decode_objset_table(&encode_objset_table(&t)).unwrap(), t);
        let s = SpaceMapBlock {
            txg: 3,
            condensed: true,
            prev: None,
            records: vec![SpaceRecord {
                vdev: 1,
                op: tank_block::SpaceOp::Free,
                offset: 4096,
                len: 8192,
                txg: 2,
            }],
        };
        let d = SpaceMapBlock::decode(&s.encode()).unwrap();
        assert_eq!(d.records, s.records);
        assert!(d.condensed);
    }
}
