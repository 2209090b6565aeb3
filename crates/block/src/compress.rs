//! Record compression: lz4 (default), zstd levels 1 to 19, or off.
//!
//! # Theory of operation
//! A record is compressed before it is checksummed and allocated. If compression does not save
//! at least 12.5 % (one eighth, the ZFS rule), the record is stored raw, so incompressible data
//! costs one fast failed attempt and nothing on read. Decompression of untrusted bytes returns
//! an error, never a panic, and must produce exactly the logical size.

use crate::BlockError;

pub const ZSTD_DEFAULT_LEVEL: u8 = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Compression {
    Off,
    Lz4,
    /// zstd at a level from 1 to 19.
    Zstd(u8),
}

impl Compression {
    pub fn to_u8(self) -> u8 {
        match self {
            Self::Off => 0,
            Self::Lz4 => 1,
            Self::Zstd(level) => 0x10 + level,
        }
    }

    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(Self::Off),
            1 => Some(Self::Lz4),
            0x11..=0x23 => Some(Self::Zstd(v - 0x10)),
            _ => None,
        }
    }

    pub fn name(self) -> String {
        match self {
            Self::Off => "off".into(),
            Self::Lz4 => "lz4".into(),
            Self::Zstd(l) if l == ZSTD_DEFAULT_LEVEL => "zstd".into(),
            Self::Zstd(l) => format!("zstd-{l}"),
        }
    }

    /// Parses a `compression=` property value as zfs accepts it.
    pub fn parse(s: &str) -> Result<Self, BlockError> {
        match s {
            "off" => Ok(Self::Off),
            "on" | "lz4" => Ok(Self::Lz4),
            "zstd" => Ok(Self::Zstd(ZSTD_DEFAULT_LEVEL)),
            _ => {
                if let Some(level) = s.strip_prefix("zstd-") {
                    if let Ok(l) = level.parse::<u8>() {
                        if (1..=19).contains(&l) {
                            return Ok(Self::Zstd(l));
                        }
                    }
                }
                Err(BlockError::InvalidProperty(format!(
                    "compression '{s}' is not one of: off, on, lz4, zstd, zstd-1 .. zstd-19"
                )))
            }
        }
    }

    /// Compresses `data`. Returns `None` when the record should be stored raw (compression off,
    /// or it saves less than one eighth).
    pub fn compress(self, data: &[u8]) -> Option<Vec<u8>> {
        let limit = data.len() - data.len() / 8;
        let out = match self {
            Self::Off => return None,
            Self::Lz4 => return lz4_into_scratch(data, limit),
            Self::Zstd(level) => zstd::bulk::compress(data, i32::from(level)).ok()?,
        };
        (out.len() < limit && !out.is_empty()).then_some(out)
    }

    /// Decompresses `data` into exactly `lsize` bytes (uncompressed data is passed through).
    pub fn decompress_owned(self, data: Vec<u8>, lsize: usize) -> Result<Vec<u8>, BlockError> {
        match self {
            Self::Off if data.len() == lsize => Ok(data),
            _ => self.decompress(&data, lsize),
        }
    }

    /// Decompresses `data` into exactly `lsize` bytes.
    pub fn decompress(self, data: &[u8], lsize: usize) -> Result<Vec<u8>, BlockError> {
        // `lsize` comes from a block pointer: never allocate more than a block can be.
        if lsize > crate::MAX_BLOCK_BYTES {
            return Err(BlockError::Decompress(format!(
                "logical size {lsize} is over the {} byte maximum",
                crate::MAX_BLOCK_BYTES
            )));
        }
        let out = match self {
            Self::Off => data.to_vec(),
            Self::Lz4 => {
                let mut out = vec![0u8; lsize];
                let n = lz4_flex::block::decompress_into(data, &mut out)
                    .map_err(|e| BlockError::Decompress(format!("lz4: {e}")))?;
                out.truncate(n);
                out
            }
            Self::Zstd(_) => zstd::bulk::decompress(data, lsize)
                .map_err(|e| BlockError::Decompress(format!("zstd: {e}")))?,
        };
        if out.len() != lsize {
            return Err(BlockError::Decompress(format!(
                "decompressed to {} bytes, expected {lsize}",
                out.len()
            )));
        }
        Ok(out)
    }
}

/// The largest lz4 scratch buffer a thread keeps.
const LZ4_SCRATCH_MAX: usize = (1 << 20) + (1 << 16);

/// lz4 of `data` into a scratch buffer the thread keeps, copied out only when it saves
/// enough (shorter than `limit`). Most data that does not compress is never copied, and no
/// output buffer is allocated and zeroed per block: the scratch is as large as the largest
/// block this thread has compressed, up to [`LZ4_SCRATCH_MAX`]; larger blocks (records over
/// 1 MiB, space map blocks) get an output buffer of their own.
fn lz4_into_scratch(data: &[u8], limit: usize) -> Option<Vec<u8>> {
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    SCRATCH.with(|scratch| {
        let mut scratch = scratch.borrow_mut();
        let need = lz4_flex::block::get_maximum_output_size(data.len());
        if need > LZ4_SCRATCH_MAX {
            let out = lz4_flex::block::compress(data);
            return (out.len() < limit && !out.is_empty()).then_some(out);
        }
        if scratch.len() < need {
            scratch.resize(need, 0);
        }
        let n = lz4_flex::block::compress_into(data, &mut scratch[..need]).ok()?;
        (n < limit && n > 0).then(|| scratch[..n].to_vec())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parse_names() {
        assert_eq!(
            Compression::parse("zstd-19").unwrap(),
            Compression::Zstd(19)
        );
        assert_eq!(Compression::parse("zstd").unwrap().name(), "zstd");
        assert!(Compression::parse("zstd-20").is_err());
        assert!(Compression::parse("gzip").is_err());
        for c in [
            Compression::Off,
            Compression::Lz4,
            Compression::Zstd(1),
            Compression::Zstd(19),
        ] {
            assert_eq!(Compression::from_u8(c.to_u8()), Some(c));
        }
    }

    #[test]
    fn compressible_round_trip_and_incompressible_raw() {
        let text: Vec<u8> = (0..131072u32)
            .map(|i| b"tank pool "[(i % 10) as usize])
            .collect();
        for c in [Compression::Lz4, Compression::Zstd(3)] {
            let z = c.compress(&text).expect("text compresses");
            assert!(z.len() < text.len() / 8);
            assert_eq!(c.decompress(&z, text.len()).unwrap(), text);
        }
        let mut x = 0x1234_5678_9abc_def0u64;
        let random: Vec<u8> = (0..65536)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        assert!(Compression::Lz4.compress(&random).is_none());
        assert!(Compression::Zstd(3).compress(&random).is_none());
    }

    #[test]
    fn lz4_through_the_scratch_equals_lz4_alone() {
        // Sizes up and down, so the scratch holds a longer block's bytes past the end of
        // a shorter one, and one block over the scratch's limit.
        for (len, period) in [
            (131072usize, 10u32),
            (4096, 7),
            (1 << 20, 13),
            (512, 3),
            (2 << 20, 5),
            (65536, 11),
        ] {
            let data: Vec<u8> = (0..len as u32).map(|i| (i % period) as u8).collect();
            let z = Compression::Lz4.compress(&data).expect("compresses");
            assert_eq!(z, lz4_flex::block::compress(&data), "{len} bytes");
            assert_eq!(Compression::Lz4.decompress(&z, len).unwrap(), data);
        }
    }

    proptest! {
        #[test]
        fn garbage_never_panics(raw in proptest::collection::vec(any::<u8>(), 0..512), lsize in 0usize..4096) {
            let _ = Compression::Lz4.decompress(&raw, lsize);
            let _ = Compression::Zstd(3).decompress(&raw, lsize);
        }
    }
}
