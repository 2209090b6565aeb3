//! Block checksums: BLAKE3 (default), XXH3-128 (fast) and SHA-256.
//!
//! # Theory of operation
//! A block's checksum is computed over its physical bytes (after compression, before parity)
//! and stored in the parent's block pointer, so a block can never vouch for itself: a stale,
//! misdirected or rotted block fails verification against what its parent expected.
//! Digests are stored in a 32-byte field; shorter digests are zero-padded.

use crate::BlockError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ChecksumKind {
    Blake3 = 1,
    Xxh128 = 2,
    Sha256 = 3,
}

impl ChecksumKind {
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Blake3,
            2 => Self::Xxh128,
            3 => Self::Sha256,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Blake3 => "blake3",
            Self::Xxh128 => "xxh128",
            Self::Sha256 => "sha256",
        }
    }

    pub fn parse(s: &str) -> Result<Self, BlockError> {
        match s {
            "on" | "blake3" => Ok(Self::Blake3),
            "xxh128" => Ok(Self::Xxh128),
            "sha256" => Ok(Self::Sha256),
            _ => Err(BlockError::InvalidProperty(format!(
                "checksum '{s}' is not one of: on, blake3, xxh128, sha256"
            ))),
        }
    }

    pub fn compute(self, data: &[u8]) -> [u8; 32] {
        let mut out = [0u8; 32];
        match self {
            Self::Blake3 => out.copy_from_slice(blake3::hash(data).as_bytes()),
            Self::Xxh128 => {
                out[..16].copy_from_slice(&xxhash_rust::xxh3::xxh3_128(data).to_le_bytes())
            }
            Self::Sha256 => {
                use sha2::Digest;
                out.copy_from_slice(&sha2::Sha256::digest(data));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_differ_and_detect_flips() {
        let mut data = vec![0x5au8; 4096];
        for kind in [
            ChecksumKind::Blake3,
            ChecksumKind::Xxh128,
            ChecksumKind::Sha256,
        ] {
            let a = kind.compute(&data);
            data[100] ^= 1;
            assert_ne!(a, kind.compute(&data), "{kind:?} missed a bit flip");
            data[100] ^= 1;
            assert_eq!(a, kind.compute(&data));
            assert_eq!(ChecksumKind::from_u8(kind as u8), Some(kind));
        }
        assert!(ChecksumKind::parse("fletcher4").is_err());
    }
}
