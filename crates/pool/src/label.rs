//! Labels and uberblocks: the only structures tank writes in place.
//!
//! # On-disk layout (docs/FORMAT.md §"Labels")
//! Every member device carries four 256 KiB labels: L0 at 0, L1 at 256 KiB, L2 and L3 in the
//! last 512 KiB (device size rounded down to 256 KiB). Each label is:
//! ```text
//!      0  header (4 KiB): magic "TANKLABL" u64, version u32, header_size u32 (=4096),
//!         pool_guid u64, leaf_guid u64, top_guid u64, config_txg u64, config_len u32,
//!         config_crc32c u32, ... zero ..., crc32c of bytes 0..4092 at 4092
//!   4096  config: `config_len` bytes of JSON (config.rs), at most 124 KiB
//! 131072  uberblock ring: 128 KiB of slots of 2^clamp(ashift, 10, 13) bytes; the last slot
//!         holds the multihost heartbeat (`mmp.rs`), the others uberblocks
//! ```
//! An uberblock in slot `txg % (slots - 1)` of every label of every device:
//! ```text
//!   0 magic "TANKUBER" u64 | 8 version u32 | 12 ashift u32 | 16 txg u64 | 24 guid_sum u64
//!  32 timestamp u64 | 40 root block pointer (128 bytes) | 168 crc32c of bytes 0..168
//! ```
//! # Failure model
//! A torn or rotted label or uberblock fails its CRC and is ignored; the other copies
//! (4 per device, on every device) stand in. Config updates write L0/L2, flush, then L1/L3, so a
//! crash leaves at least one complete generation.
//!
//! Labels and uberblocks come from devices: decoding them never panics, and arithmetic on
//! decoded values is checked (`clippy::arithmetic_side_effects` is denied here).

#![deny(clippy::arithmetic_side_effects)]

use tank_block::{BlockPtr, BLKPTR_SIZE};
use tank_device::BlockDevice;
use tank_vdev::{label_offsets, LABEL_SIZE};

use crate::config::PoolConfig;
use crate::PoolError;

pub const LABEL_MAGIC: &[u8; 8] = b"TANKLABL";
pub const UBER_MAGIC: &[u8; 8] = b"TANKUBER";
pub const HEADER_SIZE: usize = 4096;
pub const CONFIG_OFFSET: usize = 4096;
pub const CONFIG_MAX: usize = 128 * 1024 - CONFIG_OFFSET;
pub const RING_OFFSET: u64 = 128 * 1024;
pub const RING_SIZE: u64 = 128 * 1024;
const RING_END: u64 = RING_OFFSET + RING_SIZE;
pub const UBER_LEN: usize = 172;

/// The header and config of one label, decoded.
#[derive(Debug, Clone)]
pub struct Label {
    pub index: usize,
    pub pool_guid: u64,
    pub leaf_guid: u64,
    pub top_guid: u64,
    pub config: PoolConfig,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Uberblock {
    pub version: u32,
    pub ashift: u32,
    pub txg: u64,
    pub guid_sum: u64,
    pub timestamp: u64,
    pub root: BlockPtr,
}

/// Bytes of a ring slot: a sector, at least 1 KiB and at most 8 KiB (ZFS's
/// MAX_UBERBLOCK_SHIFT), so that the ring has at least 16 slots at any ashift. Pools of
/// ashift 14 to 16 written before the cap used whole-sector slots; those sit at multiples of
/// 8 KiB and are found all the same.
pub fn slot_size(ashift: u32) -> u64 {
    1u64 << slot_shift(ashift)
}

pub fn slots(ashift: u32) -> u64 {
    RING_SIZE >> slot_shift(ashift)
}

/// A ring slot is `1 << slot_shift` bytes (`ashift` may come from a device: any value works).
fn slot_shift(ashift: u32) -> u32 {
    ashift.clamp(10, 13)
}

/// The ring slots that hold uberblocks: all but the last, which is the heartbeat's.
#[allow(clippy::arithmetic_side_effects)] // A ring has 16 to 128 slots.
pub fn uberblock_slots(ashift: u32) -> u64 {
    slots(ashift) - 1
}

/// Where in a label the multihost heartbeat slot is (the ring's last slot).
#[allow(clippy::arithmetic_side_effects)] // A slot (at most 8 KiB) fits in the ring.
pub fn heartbeat_offset(ashift: u32) -> u64 {
    RING_END - slot_size(ashift)
}

/// Where in a label the uberblock of `txg` goes (ring slot `txg % uberblock_slots`).
#[allow(clippy::arithmetic_side_effects)] // The slot is one of the ring's (16 to 128).
fn uberblock_offset(ashift: u32, txg: u64) -> u64 {
    RING_OFFSET + (txg % uberblock_slots(ashift)) * slot_size(ashift)
}

/// The device offset of byte `pos` of the label at `label` (one of `label_offsets`).
pub(crate) fn label_pos(dev: &dyn BlockDevice, label: u64, pos: u64) -> Result<u64, PoolError> {
    label.checked_add(pos).ok_or_else(|| {
        PoolError::InvalidArgument(format!("device {} is too small for labels", dev.name()))
    })
}

/// The little-endian u32 at `o` of `b` (which the caller has checked is long enough).
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..][..4].try_into().expect("4 bytes"))
}
/// The little-endian u64 at `o` of `b` (which the caller has checked is long enough).
fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..][..8].try_into().expect("8 bytes"))
}

/// Encodes the header + config part of a label (the first 128 KiB).
pub fn encode_label(
    config: &PoolConfig,
    leaf_guid: u64,
    top_guid: u64,
) -> Result<Vec<u8>, PoolError> {
    let json = config.to_json();
    if json.len() > CONFIG_MAX {
        return Err(PoolError::InvalidSpec(format!(
            "pool configuration too large for a label ({} bytes)",
            json.len()
        )));
    }
    let mut buf = vec![0u8; RING_OFFSET as usize];
    buf[0..8].copy_from_slice(LABEL_MAGIC);
    buf[8..12].copy_from_slice(&config.version.to_le_bytes());
    buf[12..16].copy_from_slice(&(HEADER_SIZE as u32).to_le_bytes());
    buf[16..24].copy_from_slice(&config.guid.to_le_bytes());
    buf[24..32].copy_from_slice(&leaf_guid.to_le_bytes());
    buf[32..40].copy_from_slice(&top_guid.to_le_bytes());
    buf[40..48].copy_from_slice(&config.txg.to_le_bytes());
    buf[48..52].copy_from_slice(&(json.len() as u32).to_le_bytes());
    buf[52..56].copy_from_slice(&crc32c::crc32c(&json).to_le_bytes());
    let crc = crc32c::crc32c(&buf[..HEADER_SIZE - 4]);
    buf[HEADER_SIZE - 4..HEADER_SIZE].copy_from_slice(&crc.to_le_bytes());
    buf[CONFIG_OFFSET..][..json.len()].copy_from_slice(&json);
    Ok(buf)
}

/// Decodes the first 128 KiB of a label. Untrusted input: errors, never panics.
pub fn decode_label(buf: &[u8], index: usize) -> Result<Label, String> {
    if buf.len() < RING_OFFSET as usize {
        return Err("label too short".into());
    }
    if &buf[0..8] != LABEL_MAGIC {
        return Err("no tank label (bad magic)".into());
    }
    let crc = u32_at(buf, HEADER_SIZE - 4);
    if crc32c::crc32c(&buf[..HEADER_SIZE - 4]) != crc {
        return Err("label header checksum mismatch".into());
    }
    let json = usize::try_from(u32_at(buf, 48))
        .ok()
        .filter(|&len| len <= CONFIG_MAX)
        .map(|len| &buf[CONFIG_OFFSET..][..len])
        .ok_or("label config length out of range")?;
    if crc32c::crc32c(json) != u32_at(buf, 52) {
        return Err("label config checksum mismatch".into());
    }
    let config = PoolConfig::from_json(json)?;
    let label = Label {
        index,
        pool_guid: u64_at(buf, 16),
        leaf_guid: u64_at(buf, 24),
        top_guid: u64_at(buf, 32),
        config,
    };
    if label.pool_guid != label.config.guid || u64_at(buf, 40) != label.config.txg {
        return Err("label header disagrees with its config".into());
    }
    Ok(label)
}

impl Uberblock {
    pub fn encode(&self) -> [u8; UBER_LEN] {
        let mut b = [0u8; UBER_LEN];
        b[0..8].copy_from_slice(UBER_MAGIC);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..16].copy_from_slice(&self.ashift.to_le_bytes());
        b[16..24].copy_from_slice(&self.txg.to_le_bytes());
        b[24..32].copy_from_slice(&self.guid_sum.to_le_bytes());
        b[32..40].copy_from_slice(&self.timestamp.to_le_bytes());
        b[40..40 + BLKPTR_SIZE].copy_from_slice(&self.root.encode());
        let crc = crc32c::crc32c(&b[..168]);
        b[168..172].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self, String> {
        if b.len() < UBER_LEN || &b[0..8] != UBER_MAGIC {
            return Err("no uberblock".into());
        }
        if crc32c::crc32c(&b[..168]) != u32_at(b, 168) {
            return Err("uberblock checksum mismatch".into());
        }
        let root = BlockPtr::decode(&b[40..168])
            .map_err(|e| e.to_string())?
            .ok_or("uberblock without a root")?;
        Ok(Self {
            version: u32_at(b, 8),
            ashift: u32_at(b, 12),
            txg: u64_at(b, 16),
            guid_sum: u64_at(b, 24),
            timestamp: u64_at(b, 32),
            root,
        })
    }
}

/// Reads all four labels of a device; returns the valid ones and why the others are not.
pub fn read_labels(dev: &dyn BlockDevice) -> (Vec<Label>, Vec<String>) {
    let mut good = Vec::new();
    let mut bad = Vec::new();
    if dev.size() < 4 * LABEL_SIZE {
        bad.push(format!("device too small ({} bytes)", dev.size()));
        return (good, bad);
    }
    for (i, off) in label_offsets(dev.size()).into_iter().enumerate() {
        let mut buf = vec![0u8; RING_OFFSET as usize];
        match dev.read_at(&mut buf, off) {
            Ok(()) => match decode_label(&buf, i) {
                Ok(l) => good.push(l),
                Err(e) => bad.push(format!("label {i}: {e}")),
            },
            Err(e) => bad.push(format!("label {i}: {e}")),
        }
    }
    (good, bad)
}

/// The newest valid label of a device.
pub fn best_label(dev: &dyn BlockDevice) -> Option<Label> {
    read_labels(dev).0.into_iter().max_by_key(|l| l.config.txg)
}

/// Writes the header+config of the labels with the given indexes (no flush).
pub fn write_labels(
    dev: &dyn BlockDevice,
    config: &PoolConfig,
    leaf_guid: u64,
    top_guid: u64,
    which: &[usize],
) -> Result<(), PoolError> {
    let buf = encode_label(config, leaf_guid, top_guid)?;
    let offs = label_offsets(dev.size());
    for &i in which {
        dev.write_at(&buf, offs[i])?;
    }
    Ok(())
}

/// Clears all four labels (used by `pool destroy` after marking them destroyed? no: by tests
/// and by `labelclear`).
pub fn clear_labels(dev: &dyn BlockDevice) -> Result<(), PoolError> {
    let zero = vec![0u8; LABEL_SIZE as usize];
    for off in label_offsets(dev.size()) {
        dev.write_at(&zero, off)?;
    }
    dev.flush()?;
    Ok(())
}

/// Writes an uberblock into its ring slot of all four labels (no flush).
pub fn write_uberblock(dev: &dyn BlockDevice, ub: &Uberblock) -> Result<(), PoolError> {
    let slot = slot_size(ub.ashift);
    let mut buf = vec![0u8; slot as usize];
    buf[..UBER_LEN].copy_from_slice(&ub.encode());
    let pos = uberblock_offset(ub.ashift, ub.txg);
    for off in label_offsets(dev.size()) {
        dev.write_at(&buf, label_pos(dev, off, pos)?)?;
    }
    Ok(())
}

/// Zeroes the ring slots that hold uberblocks newer than `keep_txg` (after a rewind).
pub fn invalidate_newer(
    dev: &dyn BlockDevice,
    ashift: u32,
    keep_txg: u64,
) -> Result<(), PoolError> {
    let slot = slot_size(ashift);
    let zero = vec![0u8; slot as usize];
    for off in label_offsets(dev.size()) {
        for pos in (RING_OFFSET..RING_END).step_by(slot as usize) {
            let pos = label_pos(dev, off, pos)?;
            let mut buf = vec![0u8; UBER_LEN];
            if dev.read_at(&mut buf, pos).is_ok() {
                if let Ok(ub) = Uberblock::decode(&buf) {
                    if ub.txg > keep_txg {
                        dev.write_at(&zero, pos)?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Every valid uberblock in every label of a device.
pub fn read_uberblocks(dev: &dyn BlockDevice, ashift: u32) -> Vec<(usize, Uberblock)> {
    let mut out = Vec::new();
    if dev.size() < 4 * LABEL_SIZE {
        return out;
    }
    let slot = slot_size(ashift) as usize;
    for (i, off) in label_offsets(dev.size()).into_iter().enumerate() {
        let mut ring = vec![0u8; RING_SIZE as usize];
        let Ok(pos) = label_pos(dev, off, RING_OFFSET) else {
            continue;
        };
        if dev.read_at(&mut ring, pos).is_err() {
            continue;
        }
        for raw in ring.chunks_exact(slot) {
            if let Ok(ub) = Uberblock::decode(raw) {
                out.push((i, ub));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ring_slots_tile_the_ring_whatever_the_ashift() {
        for ashift in [0, 9, 12, 13, 16, u32::MAX] {
            let slot = slot_size(ashift);
            assert!((1024..=8192).contains(&slot));
            assert_eq!(slots(ashift) * slot, RING_SIZE);
            assert_eq!(
                heartbeat_offset(ashift),
                RING_OFFSET + uberblock_slots(ashift) * slot
            );
            assert_eq!(uberblock_offset(ashift, 0), RING_OFFSET);
            assert_eq!(
                uberblock_offset(ashift, uberblock_slots(ashift)),
                RING_OFFSET
            );
            assert_eq!(uberblock_offset(ashift, 1), RING_OFFSET + slot);
            assert!(uberblock_offset(ashift, u64::MAX) < heartbeat_offset(ashift));
        }
    }

    proptest! {
        #[test]
        fn label_decoder_never_panics(raw in proptest::collection::vec(any::<u8>(), 0..9000), magic in any::<bool>()) {
            let mut buf = raw.clone();
            buf.resize(RING_OFFSET as usize, 0);
            if magic { buf[..8].copy_from_slice(LABEL_MAGIC); }
            let _ = decode_label(&buf, 0);
            let _ = decode_label(&raw, 0);
        }

        #[test]
        fn uberblock_decoder_never_panics(raw in proptest::collection::vec(any::<u8>(), 0..400)) {
            let mut b = raw.clone();
            if b.len() >= 8 { b[..8].copy_from_slice(UBER_MAGIC); }
            let _ = Uberblock::decode(&b);
            let _ = Uberblock::decode(&raw);
        }
    }
}
