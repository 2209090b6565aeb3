//! SCSI block commands (SPC-4, SBC-3) on a tank volume: one logical unit.
//!
//! # Theory of operation
//! A [`Lu`] is one LUN of a target: a held volume, 512-byte logical blocks over the volume's
//! `volblocksize` physical blocks, and the unit's state: unit attentions per I_T nexus,
//! reservations (`reserve.rs`) and the mode parameters an initiator may change (write
//! cache, descriptor sense, software write protect). [`Lu::execute`] runs one CDB with its
//! data-out buffer and returns status, sense and data-in; it blocks on the volume, so the
//! connection runs it off its I/O tasks.
//!
//! Every field is checked before anything is done: ranges with checked arithmetic (an LBA
//! plus a length past the end is LBA OUT OF RANGE, never a wrap), reserved and protection
//! fields (INVALID FIELD IN CDB with its pointer), the data-out length against what the
//! CDB asks (INVALID FIELD IN INFORMATION UNIT, nothing written). A command the unit does
//! not know is INVALID COMMAND OPERATION CODE.
//!
//! Durability: a write is acknowledged once in the pool's open transaction group; a write
//! with FUA, WRITE AND VERIFY, and SYNCHRONIZE CACHE (for everything before it) commit the
//! intent log first. An initiator that turns the write cache off (WCE=0) gets FUA on every
//! write. `sync=always` on the volume makes every write durable, `sync=disabled` none.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;
use tank_dataset::errno::Errno;
use tank_dataset::zvol::Volume;
use tank_service::handles::Hold;

use crate::reserve::{self, Access, Reservations};
use crate::sense::{self, Sense};
use crate::xcopy::{self, CopyList, Held};

/// The logical block size initiators see.
pub const BLOCK: u64 = 512;
/// Largest transfer of one command, in blocks (32 MiB).
pub const MAX_XFER_BLOCKS: u32 = 65536;
/// Largest COMPARE AND WRITE, in blocks.
pub const MAX_CAW_BLOCKS: u8 = 128;
/// Largest WRITE ATOMIC, in blocks.
pub const MAX_ATOMIC_BLOCKS: u32 = 2048;
/// Largest UNMAP: blocks per command, and descriptors.
pub const MAX_UNMAP_BLOCKS: u32 = 0x0010_0000;
pub const MAX_UNMAP_DESCRIPTORS: u32 = 256;
/// Largest WRITE SAME, in blocks.
pub const MAX_WRITE_SAME_BLOCKS: u64 = 0x0400_0000;
/// The vendor and product the unit reports.
const VENDOR: &[u8; 8] = b"TANK    ";
const PRODUCT: &[u8; 16] = b"volume          ";
const REVISION: &[u8; 4] = b"0001";

/// What a command returns.
#[derive(Debug, Default)]
pub struct Reply {
    pub status: u8,
    pub sense: Vec<u8>,
    pub data: Vec<u8>,
}

type Res<T> = Result<T, Failure>;

/// Why a command did not end GOOD.
#[derive(Debug)]
pub enum Failure {
    Check(Sense),
    Conflict,
}

impl From<Sense> for Failure {
    fn from(s: Sense) -> Failure {
        Failure::Check(s)
    }
}

fn check(key: u8, asc: sense::Asc) -> Failure {
    Failure::Check(Sense::new(key, asc))
}

fn bad_cdb(byte: u16, bit: Option<u8>) -> Failure {
    Failure::Check(Sense::cdb_field(byte, bit))
}

fn illegal(asc: sense::Asc) -> Failure {
    check(sense::ILLEGAL_REQUEST, asc)
}

pub(crate) fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

pub(crate) fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().expect("4 bytes"))
}

pub(crate) fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().expect("8 bytes"))
}

/// The length a CDB of `opcode` has (SPC-4 4.2.5.1: the group code), or None for a group
/// without a defined length.
pub fn cdb_len(opcode: u8) -> Option<usize> {
    match opcode >> 5 {
        0 => Some(6),
        1 | 2 => Some(10),
        4 => Some(16),
        5 => Some(12),
        _ => None,
    }
}

/// Mode parameters an initiator may change (not saved: gone at restart, as the unit says
/// by refusing to save them).
#[derive(Debug, Clone, Copy)]
struct Modes {
    wce: bool,
    d_sense: bool,
    swp: bool,
}

struct State {
    /// Unit attentions waiting for each I_T nexus.
    attentions: HashMap<String, Vec<sense::Asc>>,
    /// Nexuses that have used the unit (told of changes other nexuses make).
    seen: std::collections::HashSet<String>,
    modes: Modes,
    reservations: Reservations,
    /// EXTENDED COPY results held for RECEIVE COPY RESULTS, per I_T nexus.
    copies: HashMap<String, VecDeque<Held>>,
}

/// One logical unit: a held volume and its SCSI state.
pub struct Lu {
    pub number: u16,
    pub dataset: String,
    hold: Hold,
    /// The share's `readonly`.
    readonly: bool,
    /// Stable identifiers: the pool's guid and the volume's id in it.
    naa: [u8; 8],
    serial: String,
    state: Mutex<State>,
    /// Where the persistent reservations are kept when an initiator asks (APTPL).
    pr_file: std::sync::OnceLock<std::path::PathBuf>,
}

/// The data-in of `reply` cut to the allocation length the CDB gave.
fn cut(mut data: Vec<u8>, alloc: usize) -> Vec<u8> {
    data.truncate(alloc);
    data
}

impl Lu {
    pub fn new(number: u16, dataset: &str, hold: Hold, readonly: bool, pool_guid: u64) -> Lu {
        let id = hold.handle().id();
        // NAA 3 (locally assigned, 60 bits): the pool guid and dataset id folded together,
        // the same at every start.
        let mixed = pool_guid.rotate_left(17) ^ id.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let naa = ((3u64 << 60) | (mixed & 0x0fff_ffff_ffff_ffff)).to_be_bytes();
        let serial = format!("{:016x}", mixed & 0x0fff_ffff_ffff_ffff);
        Lu {
            number,
            dataset: dataset.to_string(),
            hold,
            readonly,
            naa,
            serial,
            pr_file: std::sync::OnceLock::new(),
            state: Mutex::new(State {
                attentions: HashMap::new(),
                seen: Default::default(),
                modes: Modes {
                    wce: true,
                    d_sense: false,
                    swp: false,
                },
                reservations: Reservations::default(),
                copies: HashMap::new(),
            }),
        }
    }

    /// The unit's serial number (INQUIRY page 80h): the same at every start.
    pub fn serial(&self) -> &str {
        &self.serial
    }

    /// Keeps this unit's persistent reservations in `path` when an initiator asks for it
    /// (APTPL), and starts from what the file holds. A file that cannot be read is an
    /// error, not an empty state: a cluster's fencing depends on it.
    pub fn keep_reservations_in(&self, path: std::path::PathBuf) -> Result<(), String> {
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let r = Reservations::decode(&text).map_err(|e| {
                    format!(
                        "{}: {e}; remove the file to serve the LUN without the persistent \
                         reservations it kept",
                        path.display()
                    )
                })?;
                self.state.lock().reservations = r;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("{}: {e}", path.display())),
        }
        let _ = self.pr_file.set(path);
        Ok(())
    }

    /// Saves `r` (durably: written aside, synced, renamed) when it persists, else removes
    /// the file.
    fn save_reservations(&self, r: &Reservations) -> std::io::Result<()> {
        use std::io::Write as _;
        let Some(path) = self.pr_file.get() else {
            return Ok(());
        };
        if !r.persists() {
            return match std::fs::remove_file(path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            };
        }
        let dir = path.parent().unwrap_or(std::path::Path::new("."));
        std::fs::create_dir_all(dir)?;
        let tmp = path.with_extension("tmp");
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(r.encode().as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    }

    fn volume(&self) -> Res<Arc<Volume>> {
        self.hold
            .volume()
            .ok_or_else(|| check(sense::NOT_READY, sense::NOT_READY_CAUSE_NOT_REPORTABLE))
    }

    fn blocks(&self, vol: &Volume) -> u64 {
        vol.size() / BLOCK
    }

    /// Queues a unit attention for every nexus that used the unit but `except`.
    pub fn attention_all(&self, asc: sense::Asc, except: Option<&str>) {
        let mut st = self.state.lock();
        let nexuses: Vec<String> = st.seen.iter().cloned().collect();
        for n in nexuses {
            if Some(n.as_str()) != except {
                st.attentions.entry(n).or_default().push(asc);
            }
        }
    }

    /// Queues a unit attention for one nexus.
    fn attention(&self, st: &mut State, nexus: &str, asc: sense::Asc) {
        st.attentions
            .entry(nexus.to_string())
            .or_default()
            .push(asc);
    }

    /// REPORT LUNS (answered by the target) clears REPORTED LUNS DATA HAS CHANGED.
    pub fn luns_reported(&self, nexus: &str) {
        if let Some(q) = self.state.lock().attentions.get_mut(nexus) {
            q.retain(|a| *a != sense::REPORTED_LUNS_CHANGED);
        }
    }

    /// An I_T nexus ended.
    pub fn nexus_lost(&self, nexus: &str) {
        let mut st = self.state.lock();
        st.reservations.nexus_lost(nexus);
        st.copies.remove(nexus);
    }

    /// LUN RESET or a target reset: reservations of SPC-2 go, and every nexus that used
    /// the unit is told (the one that asked for the reset too, as SAM-5 says).
    pub fn reset(&self) {
        self.state.lock().reservations.reset();
        self.attention_all(sense::BUS_DEVICE_RESET, None);
    }

    fn descriptor_sense(&self) -> bool {
        self.state.lock().modes.d_sense
    }

    /// Runs one command of `nexus`. `peers` are the units the session may see, which an
    /// EXTENDED COPY may name as its copy targets.
    pub fn execute(&self, nexus: &str, cdb: &[u8], data_out: &[u8], peers: &[Arc<Lu>]) -> Reply {
        let d_sense = self.descriptor_sense();
        let r = self.run(nexus, cdb, data_out, peers);
        match r {
            Ok((status, data)) => Reply {
                status,
                sense: Vec::new(),
                data,
            },
            Err(Failure::Conflict) => Reply {
                status: sense::RESERVATION_CONFLICT,
                ..Reply::default()
            },
            Err(Failure::Check(s)) => Reply {
                status: sense::CHECK_CONDITION,
                sense: s.encode(d_sense),
                data: Vec::new(),
            },
        }
    }

    fn access_of(cdb: &[u8]) -> Access {
        match cdb[0] {
            0x12 | 0x03 | 0xa0 | 0x00 | 0x25 | 0x5e | 0x5f => Access::Always,
            0x9e if cdb[1] & 0x1f == 0x10 => Access::Always,
            0xa3 => Access::Always,
            0x08 | 0x28 | 0xa8 | 0x88 | 0x2f | 0xaf | 0x8f | 0x34 | 0x90 | 0x1a | 0x5a | 0x9e
            | 0x37 | 0xb7 | 0x84 => Access::Read,
            _ => Access::Write,
        }
    }

    fn run(
        &self,
        nexus: &str,
        cdb: &[u8],
        data_out: &[u8],
        peers: &[Arc<Lu>],
    ) -> Res<(u8, Vec<u8>)> {
        let op = cdb[0];
        if cdb_len(op).is_some_and(|n| cdb.len() < n) {
            return Err(illegal(sense::INVALID_OPCODE));
        }
        // The control byte's NACA and LINK bits are not supported.
        if let Some(n) = cdb_len(op) {
            if cdb[n - 1] & 0x05 != 0 {
                return Err(bad_cdb((n - 1) as u16, None));
            }
        }
        {
            let mut st = self.state.lock();
            if !st.seen.contains(nexus) {
                st.seen.insert(nexus.to_string());
            }
            // Pending unit attentions, except for the commands that never report them.
            if !matches!(op, 0x12 | 0x03 | 0xa0) {
                if let Some(q) = st.attentions.get_mut(nexus) {
                    if !q.is_empty() {
                        let asc = q.remove(0);
                        return Err(check(sense::UNIT_ATTENTION, asc));
                    }
                }
            }
            let access = Self::access_of(cdb);
            if !st.reservations.access(nexus, access, op) {
                return Err(Failure::Conflict);
            }
        }
        let good = |data: Vec<u8>| Ok((sense::GOOD, data));
        match op {
            0x00 => {
                self.volume()?;
                good(Vec::new())
            }
            0x03 => self.request_sense(nexus, cdb).map(|d| (sense::GOOD, d)),
            0x12 => self.inquiry(cdb).map(|d| (sense::GOOD, d)),
            0x08 | 0x28 | 0xa8 | 0x88 => self.read(cdb),
            0x0a | 0x2a | 0xaa | 0x8a | 0x2e | 0xae | 0x8e | 0x9c => self.write(cdb, data_out),
            0x2f | 0xaf | 0x8f => self.verify(cdb, data_out),
            0x8b => self.or_write(cdb, data_out),
            0x89 => self.compare_and_write(cdb, data_out),
            0x41 | 0x93 => self.write_same(cdb, data_out),
            0x42 => self.unmap(cdb, data_out),
            0x34 | 0x90 => self.prefetch(cdb),
            0x35 | 0x91 => self.sync_cache(cdb),
            0x25 => self.read_capacity10(cdb),
            0x9e => match cdb[1] & 0x1f {
                0x10 => self.read_capacity16(cdb),
                0x12 => self.get_lba_status(cdb),
                _ => Err(bad_cdb(1, Some(4))),
            },
            0x1a | 0x5a => self.mode_sense(cdb),
            0x15 | 0x55 => self.mode_select(nexus, cdb, data_out),
            0x1b => self.start_stop(cdb),
            0x1e => {
                if cdb[4] & 0xfc != 0 {
                    return Err(bad_cdb(4, None));
                }
                good(Vec::new())
            }
            0x37 | 0xb7 => self.read_defect_data(cdb),
            0x16 | 0x56 => {
                if self.state.lock().reservations.reserve6(nexus) {
                    good(Vec::new())
                } else {
                    Err(Failure::Conflict)
                }
            }
            0x17 | 0x57 => {
                self.state.lock().reservations.release6(nexus);
                good(Vec::new())
            }
            0x5e => self.pr_in(nexus, cdb),
            0x5f => self.pr_out(nexus, cdb, data_out),
            0xa3 if cdb[1] & 0x1f == 0x0c => self.report_opcodes(cdb),
            0x83 => self.extended_copy(nexus, cdb, data_out, peers),
            0x84 => self.receive_copy_results(nexus, cdb),
            _ => Err(illegal(sense::INVALID_OPCODE)),
        }
    }

    fn request_sense(&self, nexus: &str, cdb: &[u8]) -> Res<Vec<u8>> {
        let desc = cdb[1] & 1 != 0;
        let alloc = usize::from(cdb[4]);
        let pending = {
            let mut st = self.state.lock();
            st.attentions.get_mut(nexus).and_then(|q| {
                if q.is_empty() {
                    None
                } else {
                    Some(q.remove(0))
                }
            })
        };
        let s = match pending {
            Some(asc) => Sense::new(sense::UNIT_ATTENTION, asc),
            None => Sense::new(sense::NO_SENSE, (0, 0)),
        };
        Ok(cut(s.encode(desc), alloc))
    }

    fn inquiry(&self, cdb: &[u8]) -> Res<Vec<u8>> {
        let evpd = cdb[1] & 1 != 0;
        if cdb[1] & 0xfe != 0 {
            return Err(bad_cdb(1, None));
        }
        let alloc = usize::from(be16(&cdb[3..5]));
        if !evpd {
            if cdb[2] != 0 {
                return Err(bad_cdb(2, None));
            }
            return Ok(cut(self.standard_inquiry(), alloc));
        }
        let page = cdb[2];
        let body: Vec<u8> = match page {
            0x00 => vec![0x00, 0x80, 0x83, 0x8f, 0xb0, 0xb1, 0xb2],
            0x80 => self.serial.as_bytes().to_vec(),
            0x83 => self.device_identification(),
            0x8f => xcopy::third_party_copy_page(),
            0xb0 => self.block_limits(),
            0xb1 => {
                // Medium rotation rate and form factor not reported.
                vec![0; 0x3c]
            }
            0xb2 => self.provisioning()?,
            _ => return Err(bad_cdb(2, None)),
        };
        let mut out = vec![0x00, page];
        out.extend_from_slice(&(body.len() as u16).to_be_bytes());
        out.extend_from_slice(&body);
        Ok(cut(out, alloc))
    }

    fn standard_inquiry(&self) -> Vec<u8> {
        let mut d = vec![0u8; 74];
        d[0] = 0x00; // connected direct-access block device
        d[2] = 0x06; // SPC-4
        d[3] = 0x12; // HiSup, response data format 2
        d[4] = (d.len() - 5) as u8;
        d[5] = 0x08; // 3PC: a copy manager (EXTENDED COPY)
        d[7] = 0x02; // CmdQue
        d[8..16].copy_from_slice(VENDOR);
        d[16..32].copy_from_slice(PRODUCT);
        d[32..36].copy_from_slice(REVISION);
        // Version descriptors: SAM-5, iSCSI (RFC 7143), SPC-4, SBC-3.
        for (i, v) in [0x00a0u16, 0x0960, 0x0460, 0x04c0].iter().enumerate() {
            d[58 + 2 * i..60 + 2 * i].copy_from_slice(&v.to_be_bytes());
        }
        d
    }

    fn device_identification(&self) -> Vec<u8> {
        let mut d = Vec::new();
        // NAA, logical unit, binary.
        d.extend_from_slice(&[0x01, 0x03, 0x00, 0x08]);
        d.extend_from_slice(&self.naa);
        // T10 vendor identification: vendor and serial, ASCII.
        let mut t10 = VENDOR.to_vec();
        t10.extend_from_slice(self.serial.as_bytes());
        d.extend_from_slice(&[0x02, 0x01, 0x00, t10.len() as u8]);
        d.extend_from_slice(&t10);
        // Relative target port 1 (association: target port).
        d.extend_from_slice(&[0x61, 0x14, 0x00, 0x04, 0, 0, 0, 1]);
        d
    }

    fn block_limits(&self) -> Vec<u8> {
        let pbs = self
            .hold
            .volume()
            .map_or(16384, |v| u64::from(v.block_size()));
        let gran = (pbs / BLOCK).max(1) as u32;
        let mut d = vec![0u8; 0x3c];
        d[1] = MAX_CAW_BLOCKS;
        d[2..4].copy_from_slice(&(gran.min(0xffff) as u16).to_be_bytes());
        d[4..8].copy_from_slice(&MAX_XFER_BLOCKS.to_be_bytes());
        d[8..12].copy_from_slice(&(MAX_XFER_BLOCKS / 8).max(gran).to_be_bytes());
        d[12..16].copy_from_slice(&MAX_XFER_BLOCKS.to_be_bytes());
        d[16..20].copy_from_slice(&MAX_UNMAP_BLOCKS.to_be_bytes());
        d[20..24].copy_from_slice(&MAX_UNMAP_DESCRIPTORS.to_be_bytes());
        d[24..28].copy_from_slice(&gran.to_be_bytes());
        d[28..32].copy_from_slice(&0x8000_0000u32.to_be_bytes()); // UGAVALID, alignment 0
        d[32..40].copy_from_slice(&MAX_WRITE_SAME_BLOCKS.to_be_bytes());
        d[40..44].copy_from_slice(&MAX_ATOMIC_BLOCKS.to_be_bytes());
        d[44..48].copy_from_slice(&1u32.to_be_bytes()); // atomic alignment
        d[48..52].copy_from_slice(&1u32.to_be_bytes()); // atomic granularity
        d
    }

    fn provisioning(&self) -> Res<Vec<u8>> {
        let vol = self.volume()?;
        let mut d = vec![0u8; 4];
        // LBPU (UNMAP), LBPWS (WRITE SAME 16 with UNMAP), LBPWS10; unmapped blocks read zero.
        d[1] = 0x80 | 0x40 | 0x20 | 0x04;
        // Thin when the volume is sparse, else resource provisioned (its refreservation).
        d[2] = if vol.is_sparse() { 0x02 } else { 0x01 };
        Ok(d)
    }

    /// LBA and block count of a READ, WRITE, VERIFY or WRITE AND VERIFY CDB, and its flags
    /// byte.
    fn lba_len(cdb: &[u8]) -> (u64, u64) {
        match cdb[0] >> 5 {
            0 => {
                let lba = (u64::from(cdb[1] & 0x1f) << 16) | u64::from(be16(&cdb[2..4]));
                let n = if cdb[4] == 0 { 256 } else { u64::from(cdb[4]) };
                (lba, n)
            }
            1 | 2 => (u64::from(be32(&cdb[2..6])), u64::from(be16(&cdb[7..9]))),
            5 => (u64::from(be32(&cdb[2..6])), u64::from(be32(&cdb[6..10]))),
            _ => (be64(&cdb[2..10]), u64::from(be32(&cdb[10..14]))),
        }
    }

    /// Checks that `lba..lba+n` is inside the unit; returns its byte range.
    fn range(&self, vol: &Volume, lba: u64, n: u64) -> Res<(u64, u64)> {
        match lba.checked_add(n) {
            Some(end) if end <= self.blocks(vol) => Ok((lba * BLOCK, n * BLOCK)),
            _ => Err(Failure::Check(Sense {
                info: Some(lba),
                ..Sense::new(sense::ILLEGAL_REQUEST, sense::LBA_OUT_OF_RANGE)
            })),
        }
    }

    fn max_xfer(&self, n: u64, field: u16) -> Res<()> {
        if n > u64::from(MAX_XFER_BLOCKS) {
            return Err(bad_cdb(field, None));
        }
        Ok(())
    }

    fn io_error(e: Errno, write: bool) -> Failure {
        if e == Errno::EROFS {
            check(sense::DATA_PROTECT, sense::WRITE_PROTECTED)
        } else if e == Errno::ENOSPC || e == Errno::EDQUOT {
            check(sense::DATA_PROTECT, sense::SPACE_ALLOCATION_FAILED)
        } else if e == Errno::EIO {
            if write {
                check(sense::MEDIUM_ERROR, sense::WRITE_ERROR)
            } else {
                check(sense::MEDIUM_ERROR, sense::UNRECOVERED_READ)
            }
        } else if e == Errno::EINVAL {
            illegal(sense::LBA_OUT_OF_RANGE)
        } else {
            check(sense::HARDWARE_ERROR, sense::INTERNAL_TARGET_FAILURE)
        }
    }

    fn check_protect_field(cdb: &[u8]) -> Res<()> {
        // RDPROTECT/WRPROTECT/VRPROTECT: protection information is not supported. Six-byte
        // CDBs have no such field.
        if cdb[0] >> 5 != 0 && cdb[1] & 0xe0 != 0 {
            return Err(bad_cdb(1, Some(7)));
        }
        Ok(())
    }

    fn writable(&self, vol: &Volume) -> Res<()> {
        if self.readonly || vol.is_readonly() || self.state.lock().modes.swp {
            return Err(check(sense::DATA_PROTECT, sense::WRITE_PROTECTED));
        }
        Ok(())
    }

    fn read(&self, cdb: &[u8]) -> Res<(u8, Vec<u8>)> {
        let vol = self.volume()?;
        Self::check_protect_field(cdb)?;
        let (lba, n) = Self::lba_len(cdb);
        let (off, len) = self.range(&vol, lba, n)?;
        self.max_xfer(n, if cdb[0] == 0x08 { 4 } else { 7 })?;
        let data = vol
            .read(off, len as usize)
            .map_err(|e| Self::io_error(e, false))?;
        Ok((sense::GOOD, data))
    }

    /// WRITE 6/10/12/16, WRITE AND VERIFY 10/12/16, WRITE ATOMIC 16.
    fn write(&self, cdb: &[u8], data: &[u8]) -> Res<(u8, Vec<u8>)> {
        let vol = self.volume()?;
        Self::check_protect_field(cdb)?;
        let (lba, n) = if cdb[0] == 0x9c {
            (be64(&cdb[2..10]), u64::from(be16(&cdb[12..14])))
        } else {
            Self::lba_len(cdb)
        };
        let (off, len) = self.range(&vol, lba, n)?;
        if cdb[0] == 0x9c && n > u64::from(MAX_ATOMIC_BLOCKS) {
            return Err(bad_cdb(12, None));
        }
        self.max_xfer(n, 7)?;
        self.writable(&vol)?;
        // Less data than the CDB asks (the iSCSI expected length is shorter): the whole
        // blocks that came are written, and the residual tells the initiator.
        let len = len.min(data.len() as u64 / BLOCK * BLOCK);
        let n = len / BLOCK;
        let verify = matches!(cdb[0], 0x2e | 0xae | 0x8e);
        let fua = cdb[0] != 0x0a && cdb[1] & 0x08 != 0;
        let durable = fua || verify || !self.state.lock().modes.wce;
        let bytes = &data[..len as usize];
        if n == 0 {
            return Ok((sense::GOOD, Vec::new()));
        }
        if cdb[0] == 0x9c {
            // Atomic: no other command of the volume sees half of it.
            vol.write_atomic(off, bytes, durable)
                .map_err(|e| Self::io_error(e, true))?;
            return Ok((sense::GOOD, Vec::new()));
        }
        let r = if durable {
            vol.write_durable(off, bytes)
        } else {
            vol.write(off, bytes)
        };
        r.map_err(|e| Self::io_error(e, true))?;
        if verify && cdb[1] & 0x02 != 0 {
            let back = vol
                .read(off, bytes.len())
                .map_err(|e| Self::io_error(e, false))?;
            if let Some(i) = back.iter().zip(bytes).position(|(a, b)| a != b) {
                return Err(Failure::Check(Sense {
                    info: Some(i as u64),
                    ..Sense::new(sense::MISCOMPARE, sense::MISCOMPARE_DURING_VERIFY)
                }));
            }
        }
        Ok((sense::GOOD, Vec::new()))
    }

    fn verify(&self, cdb: &[u8], data: &[u8]) -> Res<(u8, Vec<u8>)> {
        let vol = self.volume()?;
        Self::check_protect_field(cdb)?;
        let (lba, n) = Self::lba_len(cdb);
        let (off, len) = self.range(&vol, lba, n)?;
        self.max_xfer(n, 7)?;
        let bytchk = (cdb[1] >> 1) & 3;
        let now = vol
            .read(off, len as usize)
            .map_err(|e| Self::io_error(e, false))?;
        let expect: Vec<u8> = match bytchk {
            0 => return Ok((sense::GOOD, Vec::new())),
            1 => {
                if (data.len() as u64) < len {
                    return Err(illegal(sense::INVALID_FIELD_IN_IU));
                }
                data[..len as usize].to_vec()
            }
            3 => {
                if (data.len() as u64) < BLOCK {
                    return Err(illegal(sense::INVALID_FIELD_IN_IU));
                }
                data[..BLOCK as usize].repeat(n as usize)
            }
            _ => return Err(bad_cdb(1, Some(2))),
        };
        if let Some(i) = now.iter().zip(&expect).position(|(a, b)| a != b) {
            return Err(Failure::Check(Sense {
                info: Some(i as u64),
                ..Sense::new(sense::MISCOMPARE, sense::MISCOMPARE_DURING_VERIFY)
            }));
        }
        Ok((sense::GOOD, Vec::new()))
    }

    fn or_write(&self, cdb: &[u8], data: &[u8]) -> Res<(u8, Vec<u8>)> {
        let vol = self.volume()?;
        Self::check_protect_field(cdb)?;
        let (lba, n) = Self::lba_len(cdb);
        let (off, len) = self.range(&vol, lba, n)?;
        self.max_xfer(n, 10)?;
        self.writable(&vol)?;
        if (data.len() as u64) < len {
            return Err(illegal(sense::INVALID_FIELD_IN_IU));
        }
        if n == 0 {
            return Ok((sense::GOOD, Vec::new()));
        }
        let durable = cdb[1] & 0x08 != 0 || !self.state.lock().modes.wce;
        vol.or_write(off, &data[..len as usize], durable)
            .map_err(|e| Self::io_error(e, true))?;
        Ok((sense::GOOD, Vec::new()))
    }

    fn compare_and_write(&self, cdb: &[u8], data: &[u8]) -> Res<(u8, Vec<u8>)> {
        let vol = self.volume()?;
        Self::check_protect_field(cdb)?;
        let lba = be64(&cdb[2..10]);
        let n = u64::from(cdb[13]);
        if n > u64::from(MAX_CAW_BLOCKS) {
            return Err(bad_cdb(13, None));
        }
        let (off, len) = self.range(&vol, lba, n)?;
        self.writable(&vol)?;
        if n == 0 {
            if !data.is_empty() {
                // 256 blocks do not fit the one-byte field: data with a count of 0 is a
                // CDB that asked for more than the unit takes.
                return Err(bad_cdb(13, None));
            }
            return Ok((sense::GOOD, Vec::new()));
        }
        if (data.len() as u64) != 2 * len {
            return Err(illegal(sense::INVALID_FIELD_IN_IU));
        }
        let (expect, new) = data.split_at(len as usize);
        let durable = cdb[1] & 0x08 != 0 || !self.state.lock().modes.wce;
        match vol.compare_and_write(off, expect, new, durable) {
            Ok(None) => Ok((sense::GOOD, Vec::new())),
            Ok(Some(i)) => Err(Failure::Check(Sense {
                info: Some(i as u64),
                ..Sense::new(sense::MISCOMPARE, sense::MISCOMPARE_DURING_VERIFY)
            })),
            Err(e) => Err(Self::io_error(e, true)),
        }
    }

    fn write_same(&self, cdb: &[u8], data: &[u8]) -> Res<(u8, Vec<u8>)> {
        let vol = self.volume()?;
        Self::check_protect_field(cdb)?;
        let (lba, n) = if cdb[0] == 0x41 {
            (u64::from(be32(&cdb[2..6])), u64::from(be16(&cdb[7..9])))
        } else {
            (be64(&cdb[2..10]), u64::from(be32(&cdb[10..14])))
        };
        let unmap = cdb[1] & 0x08 != 0;
        let anchor = cdb[1] & 0x10 != 0;
        let ndob = cdb[0] == 0x93 && cdb[1] & 0x01 != 0;
        if anchor {
            return Err(bad_cdb(1, Some(4)));
        }
        if cdb[0] == 0x41 && cdb[1] & 0x01 != 0 {
            return Err(bad_cdb(1, Some(0)));
        }
        // Zero blocks: from the LBA to the end of the unit (WSNZ is 0).
        let n = if n == 0 {
            self.blocks(&vol).saturating_sub(lba)
        } else {
            n
        };
        let (off, len) = self.range(&vol, lba, n)?;
        if n > MAX_WRITE_SAME_BLOCKS {
            return Err(bad_cdb(if cdb[0] == 0x41 { 7 } else { 10 }, None));
        }
        self.writable(&vol)?;
        let block: Vec<u8> = if ndob {
            vec![0; BLOCK as usize]
        } else {
            // Exactly one block of data-out.
            if data.len() as u64 != BLOCK {
                return Err(illegal(sense::INVALID_FIELD_IN_IU));
            }
            data.to_vec()
        };
        let durable = !self.state.lock().modes.wce;
        // With UNMAP the blocks are deallocated (they read as zeros: LBPRZ), as LIO does,
        // whatever the data block holds.
        if unmap || ndob {
            vol.unmap(off, len).map_err(|e| Self::io_error(e, true))?;
        } else {
            // The pattern in chunks of up to 1 MiB.
            let per = (1u64 << 20) / BLOCK;
            let mut at = 0;
            while at < n {
                let k = per.min(n - at);
                let buf = block.repeat(k as usize);
                vol.write(off + at * BLOCK, &buf)
                    .map_err(|e| Self::io_error(e, true))?;
                at += k;
            }
        }
        if durable {
            vol.flush().map_err(|e| Self::io_error(e, true))?;
        }
        Ok((sense::GOOD, Vec::new()))
    }

    fn unmap(&self, cdb: &[u8], data: &[u8]) -> Res<(u8, Vec<u8>)> {
        let vol = self.volume()?;
        if cdb[1] & 0x01 != 0 {
            // ANCHOR is not supported.
            return Err(bad_cdb(1, Some(0)));
        }
        let plen = usize::from(be16(&cdb[7..9]));
        if plen == 0 {
            return Ok((sense::GOOD, Vec::new()));
        }
        if plen < 8 || data.len() < plen {
            return Err(illegal(sense::PARAM_LIST_LENGTH));
        }
        self.writable(&vol)?;
        let p = &data[..plen];
        let bd_len = usize::from(be16(&p[2..4]));
        if bd_len % 16 != 0 || 8 + bd_len > plen {
            return Err(illegal(sense::PARAM_LIST_LENGTH));
        }
        let count = bd_len / 16;
        if count as u32 > MAX_UNMAP_DESCRIPTORS {
            return Err(illegal(sense::INVALID_FIELD_IN_PARAM));
        }
        let mut ranges = Vec::with_capacity(count);
        for i in 0..count {
            let d = &p[8 + 16 * i..24 + 16 * i];
            let lba = be64(&d[0..8]);
            let n = u64::from(be32(&d[8..12]));
            if n > u64::from(MAX_UNMAP_BLOCKS) {
                return Err(illegal(sense::INVALID_FIELD_IN_PARAM));
            }
            ranges.push(self.range(&vol, lba, n)?);
        }
        for (off, len) in ranges {
            vol.unmap(off, len).map_err(|e| Self::io_error(e, true))?;
        }
        Ok((sense::GOOD, Vec::new()))
    }

    fn prefetch(&self, cdb: &[u8]) -> Res<(u8, Vec<u8>)> {
        let vol = self.volume()?;
        let (lba, n) = if cdb[0] == 0x34 {
            (u64::from(be32(&cdb[2..6])), u64::from(be16(&cdb[7..9])))
        } else {
            (be64(&cdb[2..10]), u64::from(be32(&cdb[10..14])))
        };
        let n = if n == 0 {
            self.blocks(&vol).saturating_sub(lba)
        } else {
            n
        };
        self.range(&vol, lba, n)?;
        // The ARC brings blocks in as they are read; nothing to do ahead of time.
        Ok((sense::GOOD, Vec::new()))
    }

    fn sync_cache(&self, cdb: &[u8]) -> Res<(u8, Vec<u8>)> {
        let vol = self.volume()?;
        let (lba, n) = if cdb[0] == 0x35 {
            (u64::from(be32(&cdb[2..6])), u64::from(be16(&cdb[7..9])))
        } else {
            (be64(&cdb[2..10]), u64::from(be32(&cdb[10..14])))
        };
        if n != 0 {
            self.range(&vol, lba, n)?;
        } else if lba > self.blocks(&vol) {
            self.range(&vol, lba, 0)?;
        }
        vol.flush().map_err(|e| Self::io_error(e, true))?;
        Ok((sense::GOOD, Vec::new()))
    }

    fn read_capacity10(&self, cdb: &[u8]) -> Res<(u8, Vec<u8>)> {
        let vol = self.volume()?;
        if cdb[8] & 0x01 == 0 && be32(&cdb[2..6]) != 0 {
            // An LBA without PMI is invalid.
            return Err(bad_cdb(2, None));
        }
        let last = self.blocks(&vol).saturating_sub(1);
        let mut d = Vec::with_capacity(8);
        d.extend_from_slice(&u32::try_from(last).unwrap_or(u32::MAX).to_be_bytes());
        d.extend_from_slice(&(BLOCK as u32).to_be_bytes());
        Ok((sense::GOOD, d))
    }

    fn read_capacity16(&self, cdb: &[u8]) -> Res<(u8, Vec<u8>)> {
        let vol = self.volume()?;
        let alloc = be32(&cdb[10..14]) as usize;
        let last = self.blocks(&vol).saturating_sub(1);
        let mut d = vec![0u8; 32];
        d[0..8].copy_from_slice(&last.to_be_bytes());
        d[8..12].copy_from_slice(&(BLOCK as u32).to_be_bytes());
        // Logical blocks per physical block: reported as 1 (exponent 0). The volume's
        // block size reaches initiators as the optimal transfer length granularity of the
        // block limits page (Linux's io_min), where alignment is a hint; as a physical
        // block size, GET LBA STATUS and unmapping would have to be done in whole volume
        // blocks, which a 512-byte UNMAP is not.
        // LBPME (unmap works on every tank volume), LBPRZ (unmapped blocks read zeros).
        d[14] = 0x80 | 0x40;
        Ok((sense::GOOD, cut(d, alloc)))
    }

    fn get_lba_status(&self, cdb: &[u8]) -> Res<(u8, Vec<u8>)> {
        let vol = self.volume()?;
        let lba = be64(&cdb[2..10]);
        let alloc = be32(&cdb[10..14]) as usize;
        if lba >= self.blocks(&vol) {
            return Err(Failure::Check(Sense {
                info: Some(lba),
                ..Sense::new(sense::ILLEGAL_REQUEST, sense::LBA_OUT_OF_RANGE)
            }));
        }
        // Up to 64 descriptors, each a run of mapped or deallocated blocks.
        let mut descs = Vec::new();
        let mut at = lba;
        let end = self.blocks(&vol);
        while at < end && descs.len() < 64 * 16 {
            let (mapped, bytes) = vol
                .block_status(at * BLOCK, (end - at) * BLOCK)
                .map_err(|e| Self::io_error(e, false))?;
            let n = (bytes / BLOCK).max(1).min(u64::from(u32::MAX));
            descs.extend_from_slice(&at.to_be_bytes());
            descs.extend_from_slice(&(n as u32).to_be_bytes());
            descs.push(if mapped { 0 } else { 1 });
            descs.extend_from_slice(&[0; 3]);
            at += n;
        }
        let mut d = Vec::new();
        d.extend_from_slice(&((descs.len() + 4) as u32).to_be_bytes());
        d.extend_from_slice(&[0; 4]);
        d.extend_from_slice(&descs);
        Ok((sense::GOOD, cut(d, alloc)))
    }

    fn mode_pages(&self, page: u8, sub: u8, pc: u8) -> Res<Vec<u8>> {
        let modes = self.state.lock().modes;
        let caching = |pc: u8| -> Vec<u8> {
            let mut p = vec![0u8; 20];
            p[0] = 0x08;
            p[1] = 0x12;
            match pc {
                1 => p[2] = 0x04, // WCE changeable
                2 => p[2] = 0x04, // default: write cache on
                _ => p[2] = if modes.wce { 0x04 } else { 0 },
            }
            p
        };
        let control = |pc: u8| -> Vec<u8> {
            let mut p = vec![0u8; 12];
            p[0] = 0x0a;
            p[1] = 0x0a;
            match pc {
                1 => {
                    p[2] = 0x04; // D_SENSE changeable
                    p[4] = 0x08; // SWP changeable
                }
                2 => p[3] = 0x10, // unrestricted reordering
                _ => {
                    p[2] = if modes.d_sense { 0x04 } else { 0 };
                    p[3] = 0x10;
                    p[4] = if modes.swp { 0x08 } else { 0 };
                }
            }
            p
        };
        let iec = |_pc: u8| -> Vec<u8> {
            let mut p = vec![0u8; 12];
            p[0] = 0x1c;
            p[1] = 0x0a;
            p
        };
        if sub != 0 && !(page == 0x3f && sub == 0xff) {
            return Err(bad_cdb(3, None));
        }
        Ok(match page {
            0x08 => caching(pc),
            0x0a => control(pc),
            0x1c => iec(pc),
            0x3f => [caching(pc), control(pc), iec(pc)].concat(),
            _ => return Err(bad_cdb(2, Some(5))),
        })
    }

    fn mode_sense(&self, cdb: &[u8]) -> Res<(u8, Vec<u8>)> {
        let vol = self.volume()?;
        let six = cdb[0] == 0x1a;
        let dbd = cdb[1] & 0x08 != 0;
        let pc = cdb[2] >> 6;
        let page = cdb[2] & 0x3f;
        let alloc = if six {
            usize::from(cdb[4])
        } else {
            usize::from(be16(&cdb[7..9]))
        };
        if pc == 3 {
            return Err(illegal(sense::SAVING_NOT_SUPPORTED));
        }
        let pages = self.mode_pages(page, cdb[3], pc)?;
        let wp = self.readonly || vol.is_readonly() || self.state.lock().modes.swp;
        let dev = if wp { 0x80 } else { 0 } | 0x10; // WP, DPOFUA
        let mut bd = Vec::new();
        if !dbd {
            let blocks = self.blocks(&vol);
            bd.extend_from_slice(&u32::try_from(blocks).unwrap_or(u32::MAX).to_be_bytes());
            bd.extend_from_slice(&(BLOCK as u32).to_be_bytes());
        }
        let mut d = Vec::new();
        if six {
            d.extend_from_slice(&[0, 0, dev, bd.len() as u8]);
        } else {
            d.extend_from_slice(&[0, 0, 0, dev, 0, 0]);
            d.extend_from_slice(&(bd.len() as u16).to_be_bytes());
        }
        d.extend_from_slice(&bd);
        d.extend_from_slice(&pages);
        if six {
            d[0] = (d.len() - 1).min(255) as u8;
        } else {
            let n = (d.len() - 2) as u16;
            d[0..2].copy_from_slice(&n.to_be_bytes());
        }
        Ok((sense::GOOD, cut(d, alloc)))
    }

    fn mode_select(&self, nexus: &str, cdb: &[u8], data: &[u8]) -> Res<(u8, Vec<u8>)> {
        self.volume()?;
        let six = cdb[0] == 0x15;
        if cdb[1] & 0x01 != 0 {
            return Err(illegal(sense::SAVING_NOT_SUPPORTED));
        }
        let plen = if six {
            usize::from(cdb[4])
        } else {
            usize::from(be16(&cdb[7..9]))
        };
        if plen == 0 {
            return Ok((sense::GOOD, Vec::new()));
        }
        if data.len() < plen {
            return Err(illegal(sense::PARAM_LIST_LENGTH));
        }
        let p = &data[..plen];
        let (hdr, bdl) = if six {
            if p.len() < 4 {
                return Err(illegal(sense::PARAM_LIST_LENGTH));
            }
            (4, usize::from(p[3]))
        } else {
            if p.len() < 8 {
                return Err(illegal(sense::PARAM_LIST_LENGTH));
            }
            (8, usize::from(be16(&p[6..8])))
        };
        let mut at = hdr + bdl;
        if at > p.len() {
            return Err(illegal(sense::PARAM_LIST_LENGTH));
        }
        let mut modes = self.state.lock().modes;
        while at < p.len() {
            if at + 2 > p.len() {
                return Err(illegal(sense::PARAM_LIST_LENGTH));
            }
            let code = p[at] & 0x3f;
            let len = usize::from(p[at + 1]);
            if p[at] & 0x40 != 0 || at + 2 + len > p.len() {
                return Err(Failure::Check(Sense::param_field(at as u16)));
            }
            let page = &p[at..at + 2 + len];
            match (code, len) {
                (0x08, 0x12) => modes.wce = page[2] & 0x04 != 0,
                (0x0a, 0x0a) => {
                    modes.d_sense = page[2] & 0x04 != 0;
                    modes.swp = page[4] & 0x08 != 0;
                }
                (0x1c, 0x0a) => {}
                _ => return Err(Failure::Check(Sense::param_field(at as u16))),
            }
            at += 2 + len;
        }
        let changed = {
            let mut st = self.state.lock();
            let before = st.modes;
            st.modes = modes;
            before.wce != modes.wce || before.d_sense != modes.d_sense || before.swp != modes.swp
        };
        if changed {
            self.attention_all(sense::MODE_PARAMETERS_CHANGED, Some(nexus));
        }
        Ok((sense::GOOD, Vec::new()))
    }

    fn start_stop(&self, cdb: &[u8]) -> Res<(u8, Vec<u8>)> {
        let pc = cdb[4] >> 4;
        if !matches!(pc, 0 | 1 | 2 | 3 | 7 | 0xa | 0xb) {
            return Err(bad_cdb(4, Some(7)));
        }
        // A volume is always spinning: starting, stopping and power conditions are accepted
        // and change nothing; LOEJ on a non-removable unit is a no-op too.
        if cdb[4] & 0x01 == 0 && pc == 0 && cdb[4] & 0x04 == 0 {
            // STOP: make the cache durable first, as a disk does.
            if let Ok(vol) = self.volume() {
                vol.flush().map_err(|e| Self::io_error(e, true))?;
            }
        }
        Ok((sense::GOOD, Vec::new()))
    }

    fn read_defect_data(&self, cdb: &[u8]) -> Res<(u8, Vec<u8>)> {
        let (flags, alloc) = if cdb[0] == 0x37 {
            (cdb[2], usize::from(be16(&cdb[7..9])))
        } else {
            (cdb[1], be32(&cdb[6..10]) as usize)
        };
        // No defects: the header alone, with the lists and format asked for.
        let d = if cdb[0] == 0x37 {
            vec![0, flags & 0x1f, 0, 0]
        } else {
            vec![0, flags & 0x1f, 0, 0, 0, 0, 0, 0]
        };
        Ok((sense::GOOD, cut(d, alloc)))
    }

    fn pr_in(&self, nexus: &str, cdb: &[u8]) -> Res<(u8, Vec<u8>)> {
        let alloc = usize::from(be16(&cdb[7..9]));
        let st = self.state.lock();
        if st.reservations.legacy_conflict(nexus) {
            return Err(Failure::Conflict);
        }
        let d = st.reservations.read(cdb[1] & 0x1f)?;
        Ok((sense::GOOD, cut(d, alloc)))
    }

    fn pr_out(&self, nexus: &str, cdb: &[u8], data: &[u8]) -> Res<(u8, Vec<u8>)> {
        let sa = cdb[1] & 0x1f;
        let scope = cdb[2] >> 4;
        let kind = cdb[2] & 0x0f;
        let plen = be32(&cdb[5..9]) as usize;
        if matches!(sa, 1 | 2 | 4 | 5) && scope != 0 {
            return Err(bad_cdb(2, Some(7)));
        }
        if sa == 7 || sa == 8 {
            // REGISTER AND MOVE, REPLACE LOST RESERVATION: not offered.
            return Err(bad_cdb(1, Some(4)));
        }
        if plen != 24 {
            return Err(illegal(sense::PARAM_LIST_LENGTH));
        }
        if data.len() < 24 {
            return Err(illegal(sense::PARAM_LIST_LENGTH));
        }
        let key = be64(&data[0..8]);
        let sa_key = be64(&data[8..16]);
        if data[20] & 0x0c != 0 {
            // SPEC_I_PT and ALL_TG_PT are not offered.
            return Err(Failure::Check(Sense::param_field(20)));
        }
        let aptpl = data[20] & 0x01 != 0;
        let mut st = self.state.lock();
        if st.reservations.legacy_conflict(nexus) {
            return Err(Failure::Conflict);
        }
        // The change is made on a copy, kept (when it persists) and only then taken.
        let mut next = st.reservations.clone();
        match next.out(nexus, sa, kind, key, sa_key, aptpl) {
            reserve::Outcome::Good(attn) => {
                if self.save_reservations(&next).is_err() {
                    return Err(check(sense::HARDWARE_ERROR, sense::INTERNAL_TARGET_FAILURE));
                }
                st.reservations = next;
                for (n, asc) in attn {
                    self.attention(&mut st, &n, asc);
                }
                Ok((sense::GOOD, Vec::new()))
            }
            reserve::Outcome::Conflict => Err(Failure::Conflict),
            reserve::Outcome::Check(s) => Err(Failure::Check(s)),
        }
    }

    /// Whether a copy target descriptor names this unit (by its NAA or T10 designator).
    fn named_by(&self, t: &xcopy::Target) -> bool {
        match t.kind {
            3 => t.designator == self.naa,
            1 => {
                t.designator.len() == VENDOR.len() + self.serial.len()
                    && t.designator.starts_with(VENDOR)
                    && t.designator.ends_with(self.serial.as_bytes())
            }
            _ => false,
        }
    }

    /// EXTENDED COPY (LID1): every segment of the list, in order (`xcopy.rs`).
    fn extended_copy(
        &self,
        nexus: &str,
        cdb: &[u8],
        data: &[u8],
        peers: &[Arc<Lu>],
    ) -> Res<(u8, Vec<u8>)> {
        if cdb[1] & 0x1f != 0 {
            // LID4 (list identifiers of four bytes, ROD tokens) is not implemented.
            return Err(bad_cdb(1, Some(4)));
        }
        let len = be32(&cdb[10..14]) as usize;
        if data.len() < len {
            return Err(illegal(sense::PARAM_LIST_LENGTH));
        }
        let Some(list) = xcopy::parse(&data[..len])? else {
            return Ok((sense::GOOD, Vec::new()));
        };
        let mut done = 0u16;
        let mut bytes = 0u64;
        let mut result = Ok(());
        for (i, seg) in list.segments.iter().enumerate() {
            result = self.copy_segment(nexus, &list, seg, i, peers, &mut bytes);
            if result.is_err() {
                break;
            }
            done += 1;
        }
        if list.held {
            let mut st = self.state.lock();
            let q = st.copies.entry(nexus.to_string()).or_default();
            q.retain(|h| h.list_id != list.list_id);
            if q.len() >= xcopy::HELD_RESULTS {
                q.pop_front();
            }
            q.push_back(Held {
                list_id: list.list_id,
                good: result.is_ok(),
                segments_done: done,
                bytes,
            });
        }
        result.map(|()| (sense::GOOD, Vec::new()))
    }

    /// One block-to-block segment: both units resolved among this one and `peers`, both
    /// ranges checked, then the blocks copied in pieces of at most 1 MiB (back to front
    /// when the destination overlaps the source from above).
    fn copy_segment(
        &self,
        nexus: &str,
        list: &CopyList,
        seg: &xcopy::Segment,
        i: usize,
        peers: &[Arc<Lu>],
        bytes: &mut u64,
    ) -> Res<()> {
        let abort = |asc| Failure::Check(xcopy::aborted(asc, i));
        let unit = |index: u16| -> Res<&Lu> {
            let t = list
                .targets
                .get(usize::from(index))
                .ok_or_else(|| abort(xcopy::UNREACHABLE_TARGET))?;
            if self.named_by(t) {
                return Ok(self);
            }
            peers
                .iter()
                .find(|l| l.named_by(t))
                .map(|l| l.as_ref())
                .ok_or_else(|| abort(xcopy::TARGET_NOT_REACHABLE))
        };
        let (src, dst) = (unit(seg.src)?, unit(seg.dst)?);
        let src_vol = src
            .volume()
            .map_err(|_| abort(xcopy::TARGET_NOT_REACHABLE))?;
        let dst_vol = dst
            .volume()
            .map_err(|_| abort(xcopy::TARGET_NOT_REACHABLE))?;
        // The other units' reservations count as this one's do.
        for (u, access) in [(src, Access::Read), (dst, Access::Write)] {
            if !std::ptr::eq(u, self) && !u.state.lock().reservations.access(nexus, access, 0x83) {
                return Err(Failure::Conflict);
            }
        }
        dst.writable(&dst_vol)?;
        let fits = |vol: &Volume, lba: u64| {
            lba.checked_add(seg.blocks)
                .is_some_and(|end| end <= vol.size() / BLOCK)
        };
        if !fits(&src_vol, seg.src_lba) || !fits(&dst_vol, seg.dst_lba) {
            return Err(abort(xcopy::NO_ADDITIONAL));
        }
        let durable = !dst.state.lock().modes.wce;
        let piece = 2048u64;
        let pieces = seg.blocks.div_ceil(piece);
        // One volume: a copy onto a higher overlapping range must not read what it wrote.
        let backwards = Arc::ptr_eq(&src_vol, &dst_vol)
            && seg.dst_lba > seg.src_lba
            && seg.dst_lba < seg.src_lba + seg.blocks;
        let failed = |e: Errno, write: bool| match Self::io_error(e, write) {
            Failure::Check(s) => Failure::Check(xcopy::aborted(s.asc, i)),
            other => other,
        };
        for k in 0..pieces {
            let k = if backwards { pieces - 1 - k } else { k };
            let first = k * piece;
            let n = piece.min(seg.blocks - first);
            let data = src_vol
                .read((seg.src_lba + first) * BLOCK, (n * BLOCK) as usize)
                .map_err(|e| failed(e, false))?;
            let off = (seg.dst_lba + first) * BLOCK;
            let r = if durable {
                dst_vol.write_durable(off, &data)
            } else {
                dst_vol.write(off, &data)
            };
            r.map_err(|e| failed(e, true))?;
            *bytes += n * BLOCK;
        }
        Ok(())
    }

    /// RECEIVE COPY RESULTS: OPERATING PARAMETERS, and COPY STATUS of a held list (which
    /// is then let go, as its copy has ended).
    fn receive_copy_results(&self, nexus: &str, cdb: &[u8]) -> Res<(u8, Vec<u8>)> {
        let alloc = be32(&cdb[10..14]) as usize;
        match cdb[1] & 0x1f {
            0x03 => Ok((sense::GOOD, cut(xcopy::operating_parameters(), alloc))),
            0x00 => {
                let mut st = self.state.lock();
                let q = st.copies.get_mut(nexus);
                let at = q
                    .as_ref()
                    .and_then(|q| q.iter().position(|h| h.list_id == cdb[2]));
                match (q, at) {
                    (Some(q), Some(at)) => {
                        let h = q.remove(at).expect("found");
                        Ok((sense::GOOD, cut(xcopy::copy_status(&h), alloc)))
                    }
                    _ => Err(bad_cdb(2, None)),
                }
            }
            _ => Err(bad_cdb(1, Some(4))),
        }
    }

    fn report_opcodes(&self, cdb: &[u8]) -> Res<(u8, Vec<u8>)> {
        let rctd = cdb[2] & 0x80 != 0;
        let options = cdb[2] & 0x07;
        let req_op = cdb[3];
        let req_sa = be16(&cdb[4..6]);
        let alloc = be32(&cdb[6..10]) as usize;
        let timeouts = |d: &mut Vec<u8>| {
            if rctd {
                d.extend_from_slice(&[0, 0x0a, 0, 0]);
                d.extend_from_slice(&0u32.to_be_bytes());
                d.extend_from_slice(&0u32.to_be_bytes());
            }
        };
        match options {
            0 => {
                let mut list = Vec::new();
                for c in SUPPORTED {
                    list.push(c.opcode);
                    list.push(0);
                    list.extend_from_slice(&c.sa.unwrap_or(0).to_be_bytes());
                    list.push(0);
                    list.push(if rctd { 0x02 } else { 0 } | u8::from(c.sa.is_some()));
                    list.extend_from_slice(&(c.usage.len() as u16).to_be_bytes());
                    timeouts(&mut list);
                }
                let mut d = (list.len() as u32).to_be_bytes().to_vec();
                d.extend_from_slice(&list);
                Ok((sense::GOOD, cut(d, alloc)))
            }
            1..=3 => {
                let found = SUPPORTED.iter().find(|c| {
                    c.opcode == req_op
                        && match options {
                            1 => c.sa.is_none(),
                            2 => c.sa == Some(req_sa),
                            _ => c.sa.is_none_or(|s| s == req_sa),
                        }
                });
                // Asking by opcode alone for a command with service actions (or the other
                // way round) is an invalid field.
                let has_sa = SUPPORTED
                    .iter()
                    .any(|c| c.opcode == req_op && c.sa.is_some());
                let no_sa = SUPPORTED
                    .iter()
                    .any(|c| c.opcode == req_op && c.sa.is_none());
                if (options == 1 && has_sa) || (options == 2 && no_sa) {
                    return Err(bad_cdb(2, Some(2)));
                }
                let mut d = vec![0u8, 0];
                match found {
                    Some(c) => {
                        d[1] = if rctd { 0x80 } else { 0 } | 0x03;
                        d.extend_from_slice(&(c.usage.len() as u16).to_be_bytes());
                        d.extend_from_slice(c.usage);
                        timeouts(&mut d);
                    }
                    None => {
                        d[1] = 0x01;
                        d.extend_from_slice(&[0, 0]);
                    }
                }
                Ok((sense::GOOD, cut(d, alloc)))
            }
            _ => Err(bad_cdb(2, Some(2))),
        }
    }
}

/// A supported command: opcode, service action, and the CDB usage bits (which bits of each
/// CDB byte the unit looks at; byte 0 is the opcode).
struct Supported {
    opcode: u8,
    sa: Option<u16>,
    usage: &'static [u8],
}

const fn op(opcode: u8, usage: &'static [u8]) -> Supported {
    Supported {
        opcode,
        sa: None,
        usage,
    }
}

const fn op_sa(opcode: u8, sa: u16, usage: &'static [u8]) -> Supported {
    Supported {
        opcode,
        sa: Some(sa),
        usage,
    }
}

const SUPPORTED: &[Supported] = &[
    op(0x00, &[0x00, 0, 0, 0, 0, 0x07]),
    op(0x03, &[0x03, 0x01, 0, 0, 0xff, 0x07]),
    op(0x08, &[0x08, 0x1f, 0xff, 0xff, 0xff, 0x07]),
    op(0x0a, &[0x0a, 0x1f, 0xff, 0xff, 0xff, 0x07]),
    op(0x12, &[0x12, 0x01, 0xff, 0xff, 0xff, 0x07]),
    op(0x15, &[0x15, 0x11, 0, 0, 0xff, 0x07]),
    op(0x16, &[0x16, 0, 0, 0, 0, 0x07]),
    op(0x17, &[0x17, 0, 0, 0, 0, 0x07]),
    op(0x1a, &[0x1a, 0x08, 0xff, 0xff, 0xff, 0x07]),
    op(0x1b, &[0x1b, 0x01, 0, 0x0f, 0xf7, 0x07]),
    op(0x1e, &[0x1e, 0, 0, 0, 0x03, 0x07]),
    op(0x25, &[0x25, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0x01, 0x07]),
    op(
        0x28,
        &[0x28, 0xf8, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, 0x07],
    ),
    op(
        0x2a,
        &[0x2a, 0xf8, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, 0x07],
    ),
    op(
        0x2e,
        &[0x2e, 0xf2, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, 0x07],
    ),
    op(
        0x2f,
        &[0x2f, 0xf6, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, 0x07],
    ),
    op(
        0x34,
        &[0x34, 0x02, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, 0x07],
    ),
    op(
        0x35,
        &[0x35, 0x02, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, 0x07],
    ),
    op(0x37, &[0x37, 0, 0x1f, 0, 0, 0, 0, 0xff, 0xff, 0x07]),
    op(
        0x41,
        &[0x41, 0xf8, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, 0x07],
    ),
    op(0x42, &[0x42, 0x01, 0, 0, 0, 0, 0x1f, 0xff, 0xff, 0x07]),
    op(0x55, &[0x55, 0x11, 0, 0, 0, 0, 0, 0xff, 0xff, 0x07]),
    op(0x56, &[0x56, 0, 0, 0, 0, 0, 0, 0, 0, 0x07]),
    op(0x57, &[0x57, 0, 0, 0, 0, 0, 0, 0, 0, 0x07]),
    op(0x5a, &[0x5a, 0x08, 0xff, 0xff, 0, 0, 0, 0xff, 0xff, 0x07]),
    op_sa(0x5e, 0, &[0x5e, 0x1f, 0, 0, 0, 0, 0, 0xff, 0xff, 0x07]),
    op_sa(0x5e, 1, &[0x5e, 0x1f, 0, 0, 0, 0, 0, 0xff, 0xff, 0x07]),
    op_sa(0x5e, 2, &[0x5e, 0x1f, 0, 0, 0, 0, 0, 0xff, 0xff, 0x07]),
    op_sa(0x5e, 3, &[0x5e, 0x1f, 0, 0, 0, 0, 0, 0xff, 0xff, 0x07]),
    op_sa(
        0x5f,
        0,
        &[0x5f, 0x1f, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x07],
    ),
    op_sa(
        0x5f,
        1,
        &[0x5f, 0x1f, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x07],
    ),
    op_sa(
        0x5f,
        2,
        &[0x5f, 0x1f, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x07],
    ),
    op_sa(
        0x5f,
        3,
        &[0x5f, 0x1f, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x07],
    ),
    op_sa(
        0x5f,
        4,
        &[0x5f, 0x1f, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x07],
    ),
    op_sa(
        0x5f,
        5,
        &[0x5f, 0x1f, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x07],
    ),
    op_sa(
        0x5f,
        6,
        &[0x5f, 0x1f, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x07],
    ),
    op(
        0x88,
        &[
            0x88, 0xf8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0x1f, 0x07,
        ],
    ),
    op(
        0x89,
        &[
            0x89, 0xf8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0xff, 0x1f, 0x07,
        ],
    ),
    op(
        0x8a,
        &[
            0x8a, 0xf8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0x1f, 0x07,
        ],
    ),
    op(
        0x8b,
        &[
            0x8b, 0xf8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0x1f, 0x07,
        ],
    ),
    op(
        0x8e,
        &[
            0x8e, 0xf2, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0x1f, 0x07,
        ],
    ),
    op(
        0x8f,
        &[
            0x8f, 0xf6, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0x1f, 0x07,
        ],
    ),
    op(
        0x90,
        &[
            0x90, 0x02, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0x1f, 0x07,
        ],
    ),
    op(
        0x91,
        &[
            0x91, 0x02, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0x1f, 0x07,
        ],
    ),
    op(
        0x93,
        &[
            0x93, 0xf9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0x1f, 0x07,
        ],
    ),
    op(
        0x9c,
        &[
            0x9c, 0xf8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0xff, 0xff, 0x1f,
            0x07,
        ],
    ),
    op_sa(
        0x9e,
        0x10,
        &[
            0x9e, 0x1f, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x07,
        ],
    ),
    op_sa(
        0x9e,
        0x12,
        &[
            0x9e, 0x1f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0,
            0x07,
        ],
    ),
    op(
        0xa0,
        &[0xa0, 0, 0xff, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x07],
    ),
    op_sa(
        0xa3,
        0x0c,
        &[
            0xa3, 0x1f, 0x87, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x07,
        ],
    ),
    op(
        0xa8,
        &[
            0xa8, 0xf8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, 0x07,
        ],
    ),
    op(
        0xaa,
        &[
            0xaa, 0xf8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, 0x07,
        ],
    ),
    op(
        0xae,
        &[
            0xae, 0xf2, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, 0x07,
        ],
    ),
    op(
        0xaf,
        &[
            0xaf, 0xf6, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, 0x07,
        ],
    ),
    op(
        0xb7,
        &[0xb7, 0x1f, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x07],
    ),
    op_sa(
        0x83,
        0x00,
        &[
            0x83, 0x1f, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x07,
        ],
    ),
    op_sa(
        0x84,
        0x00,
        &[
            0x84, 0x1f, 0xff, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x07,
        ],
    ),
    op_sa(
        0x84,
        0x03,
        &[
            0x84, 0x1f, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x07,
        ],
    ),
];

/// How many bytes of data-out a command carries by its CDB, when the connection must
/// know before running it (for the residual of a write).
pub fn data_out_len(cdb: &[u8]) -> Option<u64> {
    let n = match cdb[0] {
        0x0a | 0x2a | 0xaa | 0x8a | 0x2e | 0xae | 0x8e | 0x8b => Lu::lba_len(cdb).1 * BLOCK,
        0x9c => u64::from(be16(&cdb[12..14])) * BLOCK,
        0x89 => u64::from(cdb[13]) * 2 * BLOCK,
        0x41 => {
            if cdb[1] & 0x01 != 0 {
                0
            } else {
                BLOCK
            }
        }
        0x93 => {
            if cdb[1] & 0x01 != 0 {
                0
            } else {
                BLOCK
            }
        }
        0x2f | 0xaf | 0x8f => match (cdb[1] >> 1) & 3 {
            1 => Lu::lba_len(cdb).1 * BLOCK,
            3 => BLOCK,
            _ => 0,
        },
        0x42 => u64::from(be16(&cdb[7..9])),
        0x15 => u64::from(cdb[4]),
        0x55 => u64::from(be16(&cdb[7..9])),
        0x5f => u64::from(be32(&cdb[5..9])),
        0x83 => u64::from(be32(&cdb[10..14])),
        _ => return None,
    };
    Some(n)
}
