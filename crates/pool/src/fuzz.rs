//! Entry points for the fuzz targets (`fuzz/`, see docs/FUZZING.md): each takes arbitrary
//! bytes, makes them pass the outer check the format puts in front of the decoder (magic,
//! version, CRC, checksum), and decodes them, so the fuzzer explores what lies behind.
//! A decoder may refuse anything; it must never panic, loop or allocate beyond its input.

use crate::commit::{
    decode_objset_table, RootBlock, SpaceMapBlock, OSTB_MAGIC, ROOT_MAGIC, SPML_MAGIC,
};
use crate::history::{self, HIST_MAGIC};
use crate::label::{
    self, Uberblock, CONFIG_MAX, CONFIG_OFFSET, HEADER_SIZE, LABEL_MAGIC, RING_OFFSET, UBER_LEN,
    UBER_MAGIC,
};
use crate::zil::LogHeader;
use crate::PoolConfig;

fn with_magic(data: &[u8], magic: &[u8; 8], min: usize) -> Vec<u8> {
    let mut b = data.to_vec();
    b.resize(b.len().max(min), 0);
    b[..8].copy_from_slice(magic);
    b
}

/// A label: the input's first bytes as the header after the magic, the rest as the
/// config; both CRCs made to match.
pub fn label(data: &[u8]) {
    let mut buf = vec![0u8; RING_OFFSET as usize];
    let head = data.len().min(64);
    buf[..head].copy_from_slice(&data[..head]);
    buf[..8].copy_from_slice(LABEL_MAGIC);
    let config = &data[head..];
    let len = config.len().min(CONFIG_MAX);
    buf[CONFIG_OFFSET..CONFIG_OFFSET + len].copy_from_slice(&config[..len]);
    buf[48..52].copy_from_slice(&(len as u32).to_le_bytes());
    let crc = crc32c::crc32c(&config[..len]);
    buf[52..56].copy_from_slice(&crc.to_le_bytes());
    let crc = crc32c::crc32c(&buf[..HEADER_SIZE - 4]);
    buf[HEADER_SIZE - 4..HEADER_SIZE].copy_from_slice(&crc.to_le_bytes());
    let _ = label::decode_label(&buf, 0);
    // The config alone, as JSON from anywhere.
    let _ = PoolConfig::from_json(data);
}

/// An uberblock, its CRC made to match.
pub fn uberblock(data: &[u8]) {
    let mut b = with_magic(data, UBER_MAGIC, UBER_LEN);
    let crc = crc32c::crc32c(&b[..168]);
    b[168..172].copy_from_slice(&crc.to_le_bytes());
    let _ = Uberblock::decode(&b);
}

/// The root block past its version check, and the pool-level blocks it points at: the
/// object set table, a space map log block and a history block.
pub fn root_block(data: &[u8]) {
    let mut b = with_magic(data, ROOT_MAGIC, 512);
    b[8..12].copy_from_slice(&crate::FORMAT_VERSION.to_le_bytes());
    let _ = RootBlock::decode(&b);
    let _ = decode_objset_table(&with_magic(data, OSTB_MAGIC, 16));
    let _ = SpaceMapBlock::decode(&with_magic(data, SPML_MAGIC, 8));
    let _ = history::decode(&with_magic(data, HIST_MAGIC, 8));
}

/// The intent log: its header in the root block, and log blocks with their entries.
pub fn intent_log(data: &[u8]) {
    let _ = LogHeader::decode(data);
    crate::zil::fuzz_block(data);
}
