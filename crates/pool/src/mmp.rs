//! Multihost protection (ZFS's MMP): one importer at a time, also across machines.
//!
//! # Theory of operation
//! A pool whose devices other machines can reach (a shared SAS shelf, an iSCSI or NBD
//! disk, a file on a cluster filesystem) could be imported by two hosts at once, each
//! overwriting the other's metadata. The advisory device lock (`FileDevice`) protects
//! processes of one host only; the host and instance in the labels stop a later import only
//! when the labels were written before it looked. With the `multihost` property on:
//!
//! - **Heartbeat.** The importer writes a heartbeat record (docs/FORMAT.md §"Multihost
//!   heartbeat") into the last slot of a label's uberblock ring, one leaf and label after
//!   another, so that every `interval` each leaf gets one, and flushes it. Each record
//!   carries the writer's host, instance, a random session id and a sequence number.
//! - **Fail-stop.** If no heartbeat could be written for `fail_intervals` × `interval`, the
//!   pool suspends: it writes nothing more, so that another host that sees the silence and
//!   imports cannot meet a writer that was only slow.
//! - **Activity check and claim.** An import first writes its own claim (a heartbeat with a
//!   new session, sequence 0) into every label of every device, then watches them. Any
//!   heartbeat slot that no longer holds the claim, or a newer uberblock, means another
//!   writer: the import is refused, naming the host in the record, and `-f` does not
//!   override it. The watch lasts `import_intervals` × `interval` (more than the owner's
//!   fail-stop delay) when the labels say another host or instance has the pool active, and
//!   two intervals when it was exported or was ours (what remains to catch then is another
//!   importer racing this one, which writes a claim of its own). Two importers that claim at
//!   once both see the other's record and both back off: never both win.
//!
//! The interval used is the larger of this importer's and the one the records carry. The
//! watch reads past this host's page cache (`BlockDevice::forget_cached`): another host's
//! writes are on the device, not in it.
//!
//! Heartbeat records come from devices (and from other hosts): decoding them never panics,
//! and arithmetic on what they say is checked (`clippy::arithmetic_side_effects` is denied
//! here).

#![deny(clippy::arithmetic_side_effects)]

use std::time::{Duration, Instant};

use tank_device::BlockDevice;
use tank_vdev::label_offsets;

use crate::config::{now_secs, HostIdentity, PoolConfig, PoolState};
use crate::label::{self, heartbeat_offset, label_pos, slot_size, RING_OFFSET, RING_SIZE};
use crate::PoolError;

pub const HEARTBEAT_MAGIC: &[u8; 8] = b"TANKMMP1";
pub const HEARTBEAT_VERSION: u32 = 1;
pub const HEARTBEAT_LEN: usize = 140;
const HOSTNAME_MAX: usize = 64;

/// How often the heartbeat is written and how long silence lasts before the pool suspends
/// (ZFS: zfs_multihost_interval, zfs_multihost_fail_intervals,
/// zfs_multihost_import_intervals; the same defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmpTunables {
    pub interval: Duration,
    /// Intervals without a heartbeat written before the pool suspends.
    pub fail_intervals: u32,
    /// Intervals an import watches a pool active elsewhere (more than `fail_intervals`).
    pub import_intervals: u32,
}

impl Default for MmpTunables {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(1),
            fail_intervals: 10,
            import_intervals: 20,
        }
    }
}

impl MmpTunables {
    /// How long a writer may go without a heartbeat before it suspends.
    pub fn fail_after(&self) -> Duration {
        self.interval.saturating_mul(self.fail_intervals.max(1))
    }
}

/// One heartbeat record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    pub pool_guid: u64,
    pub hostname: String,
    pub hostid: u32,
    pub instance: u64,
    /// Random per import (and per claim): tells two writers from one host apart.
    pub session: u64,
    /// 0 for a claim, then one more for each record written.
    pub seq: u64,
    /// The last committed txg when it was written.
    pub txg: u64,
    /// Wall-clock seconds when it was written (for messages only: hosts' clocks differ).
    pub timestamp: u64,
    pub interval_ms: u32,
}

impl Heartbeat {
    /// `host`'s claim on the pool of `config` (sequence 0; txg and time not yet set).
    pub fn claim(
        config: &PoolConfig,
        host: &HostIdentity,
        session: u64,
        interval: Duration,
    ) -> Self {
        Self {
            pool_guid: config.guid,
            hostname: host.hostname.clone(),
            hostid: host.hostid,
            instance: host.instance,
            session,
            seq: 0,
            txg: 0,
            timestamp: 0,
            interval_ms: u32::try_from(interval.as_millis()).unwrap_or(u32::MAX),
        }
    }

    pub fn encode(&self) -> [u8; HEARTBEAT_LEN] {
        let mut b = [0u8; HEARTBEAT_LEN];
        b[0..8].copy_from_slice(HEARTBEAT_MAGIC);
        b[8..12].copy_from_slice(&HEARTBEAT_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.hostid.to_le_bytes());
        b[16..24].copy_from_slice(&self.pool_guid.to_le_bytes());
        b[24..32].copy_from_slice(&self.instance.to_le_bytes());
        b[32..40].copy_from_slice(&self.session.to_le_bytes());
        b[40..48].copy_from_slice(&self.seq.to_le_bytes());
        b[48..56].copy_from_slice(&self.txg.to_le_bytes());
        b[56..64].copy_from_slice(&self.timestamp.to_le_bytes());
        b[64..68].copy_from_slice(&self.interval_ms.to_le_bytes());
        // A host name is cut at a character boundary to fit.
        let name = &self.hostname[..self.hostname.floor_char_boundary(HOSTNAME_MAX)];
        b[68..72].copy_from_slice(&(name.len() as u32).to_le_bytes());
        b[72..][..name.len()].copy_from_slice(name.as_bytes());
        let crc = crc32c::crc32c(&b[..136]);
        b[136..140].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self, String> {
        let b = b.get(..HEARTBEAT_LEN).ok_or("heartbeat record is short")?;
        if &b[0..8] != HEARTBEAT_MAGIC {
            return Err("no heartbeat record".into());
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..][..4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..][..8].try_into().expect("8 bytes"));
        if u32_at(136) != crc32c::crc32c(&b[..136]) {
            return Err("heartbeat record fails its checksum".into());
        }
        if u32_at(8) != HEARTBEAT_VERSION {
            return Err(format!("heartbeat record version {} is unknown", u32_at(8)));
        }
        let name = usize::try_from(u32_at(68))
            .ok()
            .filter(|&len| len <= HOSTNAME_MAX)
            .map(|len| &b[72..][..len])
            .ok_or("heartbeat host name is too long")?;
        Ok(Self {
            hostid: u32_at(12),
            pool_guid: u64_at(16),
            instance: u64_at(24),
            session: u64_at(32),
            seq: u64_at(40),
            txg: u64_at(48),
            timestamp: u64_at(56),
            interval_ms: u32_at(64),
            hostname: String::from_utf8_lossy(name).into_owned(),
        })
    }

    /// Who wrote it, for messages: "host 'h' (hostid 0x1234abcd, instance 0x…)".
    pub fn writer(&self) -> String {
        let mut s = format!("host '{}' (hostid 0x{:08x}", self.hostname, self.hostid);
        if self.instance != 0 {
            s.push_str(&format!(", tank instance {:016x}", self.instance));
        }
        s.push(')');
        s
    }
}

/// Writes `hb` into the heartbeat slot of label `index` (0 to 3) of `dev` (no flush).
pub fn write_heartbeat(
    dev: &dyn BlockDevice,
    ashift: u32,
    index: usize,
    hb: &Heartbeat,
) -> Result<(), PoolError> {
    let mut buf = vec![0u8; slot_size(ashift) as usize];
    buf[..HEARTBEAT_LEN].copy_from_slice(&hb.encode());
    let offs = label_offsets(dev.size());
    let off = offs
        .get(index)
        .ok_or_else(|| PoolError::InvalidArgument(format!("label {index} does not exist")))?;
    dev.write_at(&buf, label_pos(dev, *off, heartbeat_offset(ashift))?)?;
    Ok(())
}

/// What the heartbeat slot of each label of `dev` holds: `Ok(None)` for a slot without a
/// record (never written, or an uberblock of a pool from before the heartbeat slot),
/// `Err` for one that cannot be read.
pub fn read_heartbeats(dev: &dyn BlockDevice, ashift: u32) -> Vec<Result<Option<Heartbeat>, ()>> {
    label_offsets(dev.size())
        .into_iter()
        .map(|off| {
            let mut buf = vec![0u8; slot_size(ashift) as usize];
            let pos = label_pos(dev, off, heartbeat_offset(ashift)).map_err(|_| ())?;
            // Another host's record is on the device, not in this host's page cache.
            dev.forget_cached(pos, slot_size(ashift));
            dev.read_at(&mut buf, pos).map_err(|_| ())?;
            Ok(Heartbeat::decode(&buf).ok())
        })
        .collect()
}

/// The newest committed txg the uberblock rings of `dev` show.
fn newest_txg(dev: &dyn BlockDevice, ashift: u32) -> u64 {
    for off in label_offsets(dev.size()) {
        if let Ok(ring) = label_pos(dev, off, RING_OFFSET) {
            dev.forget_cached(ring, RING_SIZE);
        }
    }
    label::read_uberblocks(dev, ashift)
        .iter()
        .map(|(_, u)| u.txg)
        .max()
        .unwrap_or(0)
}

/// The activity check of an import with `multihost` on: claims the pool on `devs` for
/// `host` and watches for another writer. Returns the session of the claim, which the
/// heartbeat then goes on with.
pub fn claim(
    devs: &[&dyn BlockDevice],
    config: &PoolConfig,
    host: &HostIdentity,
    tunables: &MmpTunables,
) -> Result<u64, PoolError> {
    let name = &config.name;
    let ashift = config.ashift;
    let before: Vec<_> = devs.iter().map(|d| read_heartbeats(*d, ashift)).collect();
    let recorded_ms = before
        .iter()
        .flatten()
        .filter_map(|r| r.as_ref().ok().and_then(|h| h.as_ref()))
        .filter(|h| h.pool_guid == config.guid)
        .map(|h| u64::from(h.interval_ms))
        .max()
        .unwrap_or(0);
    let interval = tunables.interval.max(Duration::from_millis(recorded_ms));
    let elsewhere = config.state == PoolState::Active && !config.imported_by(host);
    let watch = if elsewhere {
        let intervals = tunables
            .import_intervals
            .max(tunables.fail_intervals.saturating_add(1));
        interval.saturating_mul(intervals)
    } else {
        interval.saturating_mul(2)
    };
    let txgs: Vec<u64> = devs.iter().map(|d| newest_txg(*d, ashift)).collect();
    let session = rand::random::<u64>() | 1;
    let mine = Heartbeat {
        txg: txgs.iter().copied().max().unwrap_or(0),
        timestamp: now_secs(),
        ..Heartbeat::claim(config, host, session, tunables.interval)
    };
    let mut claimed = false;
    for dev in devs {
        let mut ok = true;
        for index in 0..4 {
            ok &= write_heartbeat(*dev, ashift, index, &mine).is_ok();
        }
        claimed |= ok && dev.flush().is_ok();
    }
    if !claimed {
        return Err(PoolError::Import(format!(
            "cannot import '{name}': multihost is on and no device took this host's claim (write errors)"
        )));
    }
    let start = Instant::now();
    loop {
        let waited = start.elapsed();
        std::thread::sleep(
            interval
                .min(watch.saturating_sub(waited))
                .max(Duration::from_millis(1)),
        );
        for (i, dev) in devs.iter().enumerate() {
            for slot in read_heartbeats(*dev, ashift).into_iter().flatten() {
                match slot {
                    Some(h) if h == mine => {}
                    Some(h) if h.pool_guid == config.guid => {
                        let seen = if h.seq == 0 {
                            "is being imported by"
                        } else {
                            "is imported on"
                        };
                        return Err(PoolError::Import(format!(
                            "cannot import '{name}': the pool {seen} {} (its heartbeat was written while this import watched the devices); export it there first. With multihost on, -f does not override this",
                            h.writer()
                        )));
                    }
                    _ => {
                        return Err(PoolError::Import(format!(
                            "cannot import '{name}': another system overwrote this import's claim on device {} while it watched; the pool may be in use (multihost is on)",
                            dev.name()
                        )));
                    }
                }
            }
            if newest_txg(*dev, ashift) > txgs[i] {
                return Err(PoolError::Import(format!(
                    "cannot import '{name}': another system committed a transaction group to device {} while this import watched; the pool is in use (multihost is on)",
                    dev.name()
                )));
            }
        }
        if start.elapsed() >= watch {
            return Ok(session);
        }
    }
}

/// The heartbeat writer of an imported pool: which leaf and label come next, the sequence,
/// and when a record last reached a device.
#[derive(Debug)]
pub struct HeartbeatWriter {
    record: Heartbeat,
    next: usize,
    last_written: Instant,
}

impl HeartbeatWriter {
    pub fn new(config: &PoolConfig, host: &HostIdentity, session: u64, interval: Duration) -> Self {
        Self {
            record: Heartbeat::claim(config, host, session, interval),
            next: 0,
            last_written: Instant::now(),
        }
    }

    /// Writes the next record to the next of `devs` (a label after another), and flushes it.
    /// Returns how long it has been since a record last reached a device.
    pub fn beat(&mut self, devs: &[&dyn BlockDevice], ashift: u32, txg: u64) -> Duration {
        // Each device in turn, and the next label once every device had one (none: no devices).
        let turn = self.next.checked_rem(devs.len());
        if let Some((d, round)) = turn.zip(self.next.checked_div(devs.len())) {
            let dev = devs[d];
            let index = round % 4;
            self.next = self.next.wrapping_add(1);
            self.record.seq = self.record.seq.saturating_add(1);
            self.record.txg = txg;
            self.record.timestamp = now_secs();
            let ok =
                write_heartbeat(dev, ashift, index, &self.record).is_ok() && dev.flush().is_ok();
            if ok {
                self.last_written = Instant::now();
            }
        }
        self.last_written.elapsed()
    }

    pub fn session(&self) -> u64 {
        self.record.session
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Heartbeat {
        Heartbeat {
            pool_guid: 7,
            hostname: "nas".into(),
            hostid: 0x1234_abcd,
            instance: 9,
            session: 11,
            seq: 3,
            txg: 42,
            timestamp: 1_700_000_000,
            interval_ms: 1000,
        }
    }

    #[test]
    fn a_record_decodes_to_itself_and_any_flipped_bit_is_refused() {
        let hb = record();
        let raw = hb.encode();
        assert_eq!(Heartbeat::decode(&raw).unwrap(), hb);
        for bit in 0..HEARTBEAT_LEN * 8 {
            let mut b = raw;
            b[bit / 8] ^= 1 << (bit % 8);
            assert!(
                Heartbeat::decode(&b).is_err(),
                "bit {bit} flipped still decodes"
            );
        }
        assert!(Heartbeat::decode(&raw[..HEARTBEAT_LEN - 1]).is_err());
    }

    #[test]
    fn a_long_host_name_is_cut_at_a_character_boundary() {
        let mut hb = record();
        hb.hostname = "é".repeat(40);
        let back = Heartbeat::decode(&hb.encode()).unwrap();
        assert_eq!(back.hostname, "é".repeat(32));
    }
}
