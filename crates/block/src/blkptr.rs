//! Block pointers: where a block lives (up to three DVAs), how big it is, how it is compressed,
//! its checksum, and the transaction group that wrote it.
//!
//! # On-disk layout (128 bytes, little-endian; docs/FORMAT.md §"Block pointer")
//! ```text
//!   0  DVA 0  { u32 vdev, u32 asize_sectors512, u64 offset }      16 bytes
//!  16  DVA 1                                                       16 bytes
//!  32  DVA 2                                                       16 bytes
//!  48  u8 kind, u8 level, u8 checksum, u8 compression, u32 flags (bit 0: gang)
//!  56  u32 lsize (logical bytes), u32 psize (physical bytes, as checksummed)
//!  64  u64 birth_txg
//!  72  u64 fill (leaf blocks beneath this pointer; 1 for a leaf)
//!  80  16 bytes reserved (zero)
//!  96  32 bytes checksum of the psize physical bytes
//! ```
//! A hole (no block) is all zero bytes: `birth_txg == 0`.
//!
//! # Invariants
//! - A non-hole pointer has at least DVA 0 and `0 < psize <= lsize` unless compression is off,
//!   in which case `psize == lsize`.
//! - Decoding untrusted bytes never panics: unknown enum values give an error, and arithmetic
//!   on decoded values is checked (`clippy::arithmetic_side_effects` is denied here).

#![deny(clippy::arithmetic_side_effects)]

use crate::checksum::ChecksumKind;
use crate::compress::Compression;
use crate::BlockError;

pub const BLKPTR_SIZE: usize = 128;
pub const MAX_DVAS: usize = 3;
/// One DVA on disk.
const DVA_SIZE: usize = 16;

/// A data virtual address: a top-level vdev, an offset in its address space and the allocated size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Dva {
    pub vdev: u32,
    /// Allocated bytes in the vdev's address space (parity and padding included).
    pub asize: u64,
    pub offset: u64,
}

impl Dva {
    pub fn is_empty(&self) -> bool {
        self.asize == 0
    }
}

/// What a block holds; recorded for debugging tools and for the scrub's reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum BlockKind {
    Data = 1,
    TreeNode = 2,
    ObjsetTable = 3,
    SpaceMapLog = 4,
    History = 5,
    RootBlock = 6,
}

impl BlockKind {
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Data,
            2 => Self::TreeNode,
            3 => Self::ObjsetTable,
            4 => Self::SpaceMapLog,
            5 => Self::History,
            6 => Self::RootBlock,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            Self::Data => "data",
            Self::TreeNode => "tree node",
            Self::ObjsetTable => "objset table",
            Self::SpaceMapLog => "space map log",
            Self::History => "history",
            Self::RootBlock => "root block",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockPtr {
    pub dvas: [Dva; MAX_DVAS],
    pub kind: BlockKind,
    pub level: u8,
    pub checksum_kind: ChecksumKind,
    pub compression: Compression,
    pub lsize: u32,
    pub psize: u32,
    pub birth_txg: u64,
    pub fill: u64,
    pub checksum: [u8; 32],
    /// The DVAs hold a gang header listing the pieces of the block (format: `gang.rs`; reads,
    /// writes and frees: `zio.rs`).
    pub gang: bool,
}

pub const FLAG_GANG: u32 = 1;

impl BlockPtr {
    pub fn copies(&self) -> usize {
        self.dvas.iter().filter(|d| !d.is_empty()).count()
    }

    pub fn dvas(&self) -> impl Iterator<Item = &Dva> {
        self.dvas.iter().filter(|d| !d.is_empty())
    }

    /// Total allocated bytes over all copies.
    pub fn asize_total(&self) -> u64 {
        self.dvas().map(|d| d.asize).sum()
    }

    pub fn encode(&self) -> [u8; BLKPTR_SIZE] {
        let mut out = [0u8; BLKPTR_SIZE];
        for (dva, b) in self.dvas.iter().zip(out.chunks_exact_mut(DVA_SIZE)) {
            debug_assert!(
                dva.asize % 512 == 0,
                "asize {} not in 512-byte units",
                dva.asize
            );
            b[0..4].copy_from_slice(&dva.vdev.to_le_bytes());
            b[4..8].copy_from_slice(&((dva.asize / 512) as u32).to_le_bytes());
            b[8..16].copy_from_slice(&dva.offset.to_le_bytes());
        }
        out[48] = self.kind as u8;
        out[49] = self.level;
        out[50] = self.checksum_kind as u8;
        out[51] = self.compression.to_u8();
        let flags = if self.gang { FLAG_GANG } else { 0 };
        out[52..56].copy_from_slice(&flags.to_le_bytes());
        out[56..60].copy_from_slice(&self.lsize.to_le_bytes());
        out[60..64].copy_from_slice(&self.psize.to_le_bytes());
        out[64..72].copy_from_slice(&self.birth_txg.to_le_bytes());
        out[72..80].copy_from_slice(&self.fill.to_le_bytes());
        out[96..128].copy_from_slice(&self.checksum);
        out
    }

    /// Decodes a pointer; `Ok(None)` for a hole.
    pub fn decode(raw: &[u8]) -> Result<Option<BlockPtr>, BlockError> {
        if raw.len() < BLKPTR_SIZE {
            return Err(BlockError::Decode(
                "block pointer shorter than 128 bytes".into(),
            ));
        }
        let birth_txg = u64_at(raw, 64);
        if birth_txg == 0 {
            if raw[..BLKPTR_SIZE].iter().any(|&b| b != 0) {
                return Err(BlockError::Decode(
                    "hole pointer with non-zero fields".into(),
                ));
            }
            return Ok(None);
        }
        let mut dvas = [Dva::default(); MAX_DVAS];
        for (dva, b) in dvas.iter_mut().zip(raw.chunks_exact(DVA_SIZE)) {
            *dva = Dva {
                vdev: u32_at(b, 0),
                asize: u64::from(u32_at(b, 4)) * 512,
                offset: u64_at(b, 8),
            };
        }
        if dvas[0].is_empty() {
            return Err(BlockError::Decode(
                "block pointer without a first DVA".into(),
            ));
        }
        let kind = BlockKind::from_u8(raw[48])
            .ok_or_else(|| BlockError::Decode(format!("unknown block kind {}", raw[48])))?;
        let checksum_kind = ChecksumKind::from_u8(raw[50])
            .ok_or_else(|| BlockError::Decode(format!("unknown checksum {}", raw[50])))?;
        let compression = Compression::from_u8(raw[51])
            .ok_or_else(|| BlockError::Decode(format!("unknown compression {}", raw[51])))?;
        let flags = u32_at(raw, 52);
        if flags & !FLAG_GANG != 0 {
            return Err(BlockError::Decode(format!(
                "unknown block pointer flags {flags:#x}"
            )));
        }
        let lsize = u32_at(raw, 56);
        let psize = u32_at(raw, 60);
        if psize == 0 || lsize == 0 {
            return Err(BlockError::Decode("block pointer with zero size".into()));
        }
        if compression == Compression::Off && psize != lsize {
            return Err(BlockError::Decode(
                "uncompressed block with psize != lsize".into(),
            ));
        }
        if psize > lsize {
            return Err(BlockError::Decode("psize larger than lsize".into()));
        }
        for dva in dvas
            .iter()
            .filter(|d| !d.is_empty() && flags & FLAG_GANG == 0)
        {
            if dva.asize < u64::from(psize) {
                return Err(BlockError::Decode("DVA smaller than the block".into()));
            }
        }
        let mut checksum = [0u8; 32];
        checksum.copy_from_slice(&raw[96..128]);
        Ok(Some(BlockPtr {
            dvas,
            kind,
            level: raw[49],
            checksum_kind,
            compression,
            lsize,
            psize,
            birth_txg,
            fill: u64_at(raw, 72),
            checksum,
            gang: flags & FLAG_GANG != 0,
        }))
    }

    /// Encodes an optional pointer (a hole is 128 zero bytes).
    pub fn encode_opt(bp: Option<&BlockPtr>) -> [u8; BLKPTR_SIZE] {
        bp.map(BlockPtr::encode).unwrap_or([0u8; BLKPTR_SIZE])
    }

    /// One-line description in the style of zdb.
    pub fn describe(&self) -> String {
        let dvas: Vec<String> = self
            .dvas()
            .map(|d| format!("<{}:{:#x}:{:#x}>", d.vdev, d.offset, d.asize))
            .collect();
        format!(
            "{}{} L{} {} {} {}L/{}P birth={} fill={} cksum={}",
            dvas.join(" "),
            if self.gang { " gang" } else { "" },
            self.level,
            self.kind.name(),
            self.compression.name(),
            self.lsize,
            self.psize,
            self.birth_txg,
            self.fill,
            hex(&self.checksum[..8])
        )
    }
}

/// The little-endian u32 at `at` of `raw` (which the caller has checked is long enough).
fn u32_at(raw: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(raw[at..][..4].try_into().expect("4 bytes"))
}

/// The little-endian u64 at `at` of `raw` (which the caller has checked is long enough).
fn u64_at(raw: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(raw[at..][..8].try_into().expect("8 bytes"))
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> BlockPtr {
        BlockPtr {
            dvas: [
                Dva {
                    vdev: 1,
                    asize: 8192,
                    offset: 0x1000,
                },
                Dva {
                    vdev: 2,
                    asize: 4096,
                    offset: 0x40000,
                },
                Dva::default(),
            ],
            kind: BlockKind::TreeNode,
            level: 2,
            checksum_kind: ChecksumKind::Blake3,
            compression: Compression::Lz4,
            lsize: 16384,
            psize: 3000,
            birth_txg: 77,
            fill: 5,
            checksum: [7u8; 32],
            gang: false,
        }
    }

    #[test]
    fn round_trip() {
        let bp = sample();
        let raw = bp.encode();
        assert_eq!(BlockPtr::decode(&raw).unwrap(), Some(bp));
        assert_eq!(bp.copies(), 2);
        let gang = BlockPtr { gang: true, ..bp };
        assert_eq!(BlockPtr::decode(&gang.encode()).unwrap(), Some(gang));
        assert_eq!(BlockPtr::decode(&[0u8; 128]).unwrap(), None);
    }

    #[test]
    fn rejects_bad_enums() {
        let mut raw = sample().encode();
        raw[48] = 99;
        assert!(BlockPtr::decode(&raw).is_err());
        let mut raw = sample().encode();
        raw[51] = 200;
        assert!(BlockPtr::decode(&raw).is_err());
        assert!(BlockPtr::decode(&raw[..10]).is_err());
    }

    proptest! {
        #[test]
        fn decode_garbage_never_panics(raw in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = BlockPtr::decode(&raw);
        }
    }
}
