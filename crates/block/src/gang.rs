//! Gang headers: the 512-byte block that stands in for a block written as pieces (ZFS's gang
//! blocks).
//!
//! # Theory of operation
//! When no free extent is large enough for a block, the write pipeline (`zio.rs`) splits it
//! into 2 or 3 pieces, each written as a block of its own, and writes a gang header listing
//! them; the block's pointer gets the gang flag, and its DVAs hold the header. A read reads
//! a header, then its pieces, and checks the assembled bytes against the pointer's checksum.
//!
//! The header is sealed to the pointer that references it: its checksum covers its bytes and
//! that pointer's first DVA and birth txg ([`gang_seal`]), so a header read through a stale
//! or misdirected pointer does not verify, and nothing is freed or claimed in its name.
//! Version 0 headers, written before the seal, checked only themselves: their pieces are
//! trusted once the assembled data verifies. Either way a header is refused unless its
//! pieces are a sound split of the block, so a chain of nested gang headers always ends.
//!
//! # On-disk layout (512 bytes, little-endian; docs/FORMAT.md §"Gang blocks")
//! ```text
//!   0  magic "TANKGANG"
//!   8  u32 piece count (2 or 3)
//!  12  u32 header version (1: sealed; 0: self-checked)
//!  16  3 block pointers (128 bytes each; unused ones are holes)
//! 400  80 bytes zero
//! 480  32 bytes: the seal (version 1), or BLAKE3-256 of bytes 0..480 (version 0)
//! ```
//! Everything here is pure byte handling on untrusted input: a damaged header is an error,
//! never a panic, and arithmetic on decoded values is checked
//! (`clippy::arithmetic_side_effects` is denied here).

#![deny(clippy::arithmetic_side_effects)]

use crate::blkptr::{BlockPtr, BLKPTR_SIZE};
use crate::BlockError;

/// Pieces a gang header lists.
pub(crate) const GANG_CHILDREN: usize = 3;
pub const GANG_HEADER_SIZE: usize = 512;
pub(crate) const GANG_MAGIC: &[u8; 8] = b"TANKGANG";
/// Header version 1: the checksum is sealed to the referencing pointer (see [`gang_seal`]).
/// Version 0 headers (written before the seal) checked only themselves.
const GANG_SEALED: u32 = 1;
/// Where the piece pointers start.
const PIECES_AT: usize = 16;
/// Where the seal (or a version 0 header's checksum) starts; it covers the bytes before it.
const SEAL_AT: usize = 480;

const _: () = assert!(PIECES_AT + GANG_CHILDREN * BLKPTR_SIZE <= SEAL_AT);
const _: () = assert!(SEAL_AT + 32 == GANG_HEADER_SIZE);

/// The checksum of a gang header: BLAKE3-256 of its bytes 0..480 followed by the referencing
/// pointer's first DVA (vdev u32, offset u64) and birth txg u64, as ZFS seeds a gang header's
/// checksum with its verifier. A header read through any other pointer (stale, misdirected,
/// or left by a freed block at the same place) does not verify.
fn gang_seal(body: &[u8], bp: &BlockPtr) -> [u8; 32] {
    let d = bp.dvas[0];
    let mut h = blake3::Hasher::new();
    h.update(&body[..SEAL_AT]);
    h.update(&d.vdev.to_le_bytes());
    h.update(&d.offset.to_le_bytes());
    h.update(&bp.birth_txg.to_le_bytes());
    *h.finalize().as_bytes()
}

/// Gang header (512 bytes): magic "TANKGANG", count u32, header version u32 (1), 3 block
/// pointers, zero padding to 480, the seal of [`gang_seal`] for the pointer `bp` whose DVAs
/// hold it.
pub(crate) fn encode_gang(children: &[BlockPtr], bp: &BlockPtr) -> Vec<u8> {
    assert!(children.len() <= GANG_CHILDREN);
    let mut b = vec![0u8; GANG_HEADER_SIZE];
    b[..8].copy_from_slice(GANG_MAGIC);
    b[8..12].copy_from_slice(&(children.len() as u32).to_le_bytes());
    b[12..16].copy_from_slice(&GANG_SEALED.to_le_bytes());
    for (slot, c) in b[PIECES_AT..SEAL_AT]
        .chunks_exact_mut(BLKPTR_SIZE)
        .zip(children)
    {
        slot.copy_from_slice(&c.encode());
    }
    let seal = gang_seal(&b, bp);
    b[SEAL_AT..].copy_from_slice(&seal);
    b
}

/// A gang header as read: its pieces, and whether it was sealed to the pointer (version 1)
/// or only checked itself (version 0, whose pieces must be proven by the assembled data).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct GangHeader {
    pub(crate) pieces: Vec<BlockPtr>,
    pub(crate) sealed: bool,
}

/// Whether `buf` (a header as read, with its sector padding) is a gang header of `bp`.
pub(crate) fn gang_verify(buf: &[u8], bp: &BlockPtr) -> bool {
    buf.len() >= GANG_HEADER_SIZE
        && buf[GANG_HEADER_SIZE..].iter().all(|&b| b == 0)
        && decode_gang(buf, bp).is_ok()
}

/// Decodes the gang header `b` that `bp`'s DVAs hold: Err unless it is sealed to `bp` (or a
/// self-consistent version 0 header) and its pieces are a sound split of `bp`: 2 or 3 of
/// them, born in the same txg, each smaller than the block and together exactly its size
/// (so a chain of nested gang headers always ends, whatever the device holds).
pub(crate) fn decode_gang(b: &[u8], bp: &BlockPtr) -> Result<GangHeader, BlockError> {
    let bad =
        |what: String| BlockError::Decode(format!("gang header of {}: {what}", bp.describe()));
    let b = match b.get(..GANG_HEADER_SIZE) {
        Some(b) if b.starts_with(GANG_MAGIC) => b,
        _ => return Err(bad("bad magic".into())),
    };
    let word = |at: usize| u32::from_le_bytes(b[at..][..4].try_into().expect("4 bytes"));
    let sealed = match word(12) {
        0 => {
            if blake3::hash(&b[..SEAL_AT]).as_bytes() != &b[SEAL_AT..] {
                return Err(bad("checksum mismatch".into()));
            }
            false
        }
        GANG_SEALED => {
            if gang_seal(b, bp) != b[SEAL_AT..] {
                return Err(bad(
                    "not sealed to this pointer (stale, misdirected or damaged)".into(),
                ));
            }
            true
        }
        v => return Err(bad(format!("unknown header version {v}"))),
    };
    let count = word(8);
    let n = usize::try_from(count)
        .ok()
        .filter(|n| (2..=GANG_CHILDREN).contains(n))
        .ok_or_else(|| bad(format!("{count} pieces")))?;
    let pieces = b[PIECES_AT..SEAL_AT]
        .chunks_exact(BLKPTR_SIZE)
        .take(n)
        .map(|raw| BlockPtr::decode(raw)?.ok_or_else(|| bad("hole piece".into())))
        .collect::<Result<Vec<_>, _>>()?;
    if split_total(&pieces) != Some(u64::from(bp.psize))
        || pieces
            .iter()
            .any(|p| p.psize == 0 || p.psize >= bp.psize || p.birth_txg != bp.birth_txg)
    {
        return Err(bad("pieces do not split the block".into()));
    }
    Ok(GangHeader { pieces, sealed })
}

/// The pieces' physical bytes together; None past u64.
fn split_total(pieces: &[BlockPtr]) -> Option<u64> {
    pieces
        .iter()
        .try_fold(0u64, |total, p| total.checked_add(u64::from(p.psize)))
}

/// For the fuzz target: seals `b` (a version 1 header to `bp`, any other with the version
/// 0 self-check), so the fuzzer reaches what is behind the seal, and decodes it.
pub(crate) fn decode_gang_for_fuzz(b: &mut [u8], bp: &BlockPtr) {
    if b.len() < GANG_HEADER_SIZE {
        return;
    }
    if b[12..16] == GANG_SEALED.to_le_bytes() {
        let seal = gang_seal(b, bp);
        b[SEAL_AT..GANG_HEADER_SIZE].copy_from_slice(&seal);
    } else {
        let sum = blake3::hash(&b[..SEAL_AT]);
        b[SEAL_AT..GANG_HEADER_SIZE].copy_from_slice(sum.as_bytes());
    }
    if let Ok(h) = decode_gang(b, bp) {
        assert_eq!(
            split_total(&h.pieces),
            Some(u64::from(bp.psize)),
            "accepted pieces split the block"
        );
    }
    let _ = gang_verify(b, bp);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blkptr::{BlockKind, Dva};
    use crate::checksum::ChecksumKind;
    use crate::compress::Compression;

    fn piece(size: u32, offset: u64) -> BlockPtr {
        BlockPtr {
            dvas: [
                Dva {
                    vdev: 0,
                    asize: u64::from(size),
                    offset,
                },
                Dva::default(),
                Dva::default(),
            ],
            kind: BlockKind::Data,
            level: 0,
            checksum_kind: ChecksumKind::Blake3,
            compression: Compression::Off,
            lsize: size,
            psize: size,
            birth_txg: 3,
            fill: 1,
            checksum: [1; 32],
            gang: false,
        }
    }

    proptest::proptest! {
        #[test]
        fn gang_header_decoder_never_panics(raw in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..700)) {
            let mut b = raw.clone();
            if b.len() >= 8 {
                b[..8].copy_from_slice(GANG_MAGIC);
            }
            let bp = piece(8192, 3);
            let _ = decode_gang(&b, &bp);
            let _ = gang_verify(&raw, &bp);
        }
    }

    #[test]
    fn gang_header_round_trip_and_tamper() {
        let child = piece(8192, 4096);
        let owner = BlockPtr {
            gang: true,
            lsize: 16384,
            psize: 16384,
            ..piece(512, 1 << 20)
        };
        let raw = encode_gang(&[child, child], &owner);
        let header = decode_gang(&raw, &owner).unwrap();
        assert_eq!(header.pieces, vec![child, child]);
        assert!(header.sealed);
        let mut bad = raw.clone();
        bad[40] ^= 1;
        let err = decode_gang(&bad, &owner).unwrap_err().to_string();
        assert!(err.contains("not sealed to this pointer"), "{err}");
        // The same bytes read through another pointer: moved, or born in another txg.
        for other in [
            BlockPtr {
                birth_txg: 4,
                ..owner
            },
            BlockPtr {
                dvas: [
                    Dva {
                        offset: 2 << 20,
                        ..owner.dvas[0]
                    },
                    Dva::default(),
                    Dva::default(),
                ],
                ..owner
            },
        ] {
            let err = decode_gang(&raw, &other).unwrap_err().to_string();
            assert!(err.contains("not sealed to this pointer"), "{err}");
        }
        // Pieces that do not add up to the block, or as large as it, are refused even when
        // sealed: a nested chain must shrink at every level.
        let short = BlockPtr {
            psize: 20000,
            ..owner
        };
        let err = decode_gang(&encode_gang(&[child, child], &short), &short).unwrap_err();
        assert!(err.to_string().contains("do not split the block"), "{err}");
        let whole = BlockPtr {
            psize: 8192,
            ..owner
        };
        let err = decode_gang(&encode_gang(&[child], &whole), &whole).unwrap_err();
        assert!(err.to_string().contains("1 pieces"), "{err}");
    }
}
