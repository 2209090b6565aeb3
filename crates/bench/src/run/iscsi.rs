//! `tank bench-iscsi`: tank's iSCSI target against Debian's tgt serving a file of the same
//! disk, in the same run; and the small initiator both the benchmark and the tests drive
//! targets with.
//!
//! # Method
//! In the bench directory (one file system, so one disk), each run measures in turn:
//! - *tank*: `tank serve --iscsi 127.0.0.1:PORT` on a data directory of its own (its
//!   default pool: raidz2 of 6 file devices), a volume of `--size` at its defaults shared
//!   as LUN 0;
//! - *tgt*: `tgtd` serving a file of `--size` in the bench directory as LUN 1 (its default
//!   backing store: read/write on the file through the page cache).
//!
//! Both are first written whole, sequentially, so reads find data and not holes. Then,
//! with the same initiator (one session, commands pipelined up to the queue depth, writes
//! sent as immediate and unsolicited data where the target allows, else by R2T), each for
//! `--seconds`: 4 KiB random reads and writes at queue depths 1 and 32, 1 MiB sequential
//! reads and writes at queue depth 8. A write test ends with SYNCHRONIZE CACHE, inside its
//! time. Each figure is the median of `--runs` runs; each ratio is computed per run, then
//! medianed. libiscsi's `iscsi-perf` reads 4 KiB blocks at queue depth 32 against both as
//! a cross-check of the initiator.
//!
//! Why an initiator of our own: libiscsi ships no writing load generator (`iscsi-perf` only
//! reads), Debian's fio is built without its libiscsi engine, and a kernel initiator needs
//! kernel modules a container does not have.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::fsbench::median;
use crate::run::util::{free_port, human, parse_size, start_serve, tank_cli};

// ---- the initiator ----

/// A PDU as read: the basic header and the data segment.
pub struct RawPdu {
    pub bhs: [u8; 48],
    pub data: Vec<u8>,
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// A PDU's bytes: the header with its data length set, and the data padded to 4 bytes.
pub fn pdu_bytes(bhs: &[u8; 48], data: &[u8]) -> Vec<u8> {
    let mut b = *bhs;
    let n = data.len();
    b[5] = (n >> 16) as u8;
    b[6] = (n >> 8) as u8;
    b[7] = n as u8;
    let mut out = Vec::with_capacity(48 + n + 3);
    out.extend_from_slice(&b);
    out.extend_from_slice(data);
    out.resize(out.len() + (4 - n % 4) % 4, 0);
    out
}

/// Reads one PDU (no digests).
pub fn read_pdu(s: &mut TcpStream) -> std::io::Result<RawPdu> {
    let mut bhs = [0u8; 48];
    s.read_exact(&mut bhs)?;
    let ahs = usize::from(bhs[4]) * 4;
    let n = (usize::from(bhs[5]) << 16) | (usize::from(bhs[6]) << 8) | usize::from(bhs[7]);
    let mut rest = vec![0u8; ahs + n + (4 - n % 4) % 4];
    s.read_exact(&mut rest)?;
    rest.truncate(ahs + n);
    rest.drain(..ahs);
    Ok(RawPdu { bhs, data: rest })
}

/// Sense key, ASC and ASCQ.
pub type Sense = (u8, u8, u8);

/// What a command came back with.
#[derive(Debug)]
pub struct Done {
    pub status: u8,
    /// From fixed or descriptor format sense data.
    pub sense: Option<Sense>,
    pub data: Vec<u8>,
}

/// A command for [`Initiator::load`]: its CDB, its data-out and its data-in length.
pub type Cmd = ([u8; 16], Option<std::sync::Arc<Vec<u8>>>, u32);

/// A command in flight in a pipeline.
struct InFlight {
    write: Option<std::sync::Arc<Vec<u8>>>,
}

/// A minimal iSCSI initiator: one session, no authentication, no digests; commands one
/// at a time ([`Initiator::cmd`]) or pipelined ([`Initiator::load`]). It honours what the
/// target declares (MaxRecvDataSegmentLength, FirstBurstLength, ImmediateData,
/// InitialR2T) and answers R2Ts and pings.
pub struct Initiator {
    pub stream: TcpStream,
    pub cmd_sn: u32,
    pub stat_sn: u32,
    pub itt: u32,
    /// What the target takes in one PDU.
    pub target_max_data: usize,
    pub first_burst: usize,
    pub immediate: bool,
    pub initial_r2t: bool,
}

impl Initiator {
    /// Logs in to `target` at `addr` as `initiator`, to full feature phase.
    pub fn login(addr: &str, target: &str, initiator: &str) -> std::io::Result<Initiator> {
        let mut s = TcpStream::connect(addr)?;
        s.set_read_timeout(Some(Duration::from_secs(60)))?;
        s.set_nodelay(true)?;
        let isid_tail = (std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos())
            ^ std::process::id())
        .to_be_bytes();
        let mut keys = format!(
            "InitiatorName={initiator}\0TargetName={target}\0SessionType=Normal\0HeaderDigest=None\0DataDigest=None\0ImmediateData=Yes\0InitialR2T=No\0MaxRecvDataSegmentLength=262144\0FirstBurstLength=262144\0MaxBurstLength=1048576\0MaxOutstandingR2T=1\0ErrorRecoveryLevel=0\0"
        );
        let mut got: HashMap<String, String> = HashMap::new();
        for round in 0..8u32 {
            let mut bhs = [0u8; 48];
            bhs[0] = 0x43;
            bhs[1] = 0x80 | (1 << 2) | 3;
            bhs[8..14].copy_from_slice(&[
                0x80,
                0x23,
                isid_tail[0],
                isid_tail[1],
                isid_tail[2],
                isid_tail[3],
            ]);
            bhs[16..20].copy_from_slice(&round.to_be_bytes());
            bhs[24..28].copy_from_slice(&1u32.to_be_bytes());
            s.write_all(&pdu_bytes(&bhs, keys.as_bytes()))?;
            keys.clear();
            let r = read_pdu(&mut s)?;
            if r.bhs[0] & 0x3f != 0x23 || r.bhs[36] != 0 {
                return Err(std::io::Error::other(format!(
                    "login refused: status {:#04x}{:02x}",
                    r.bhs[36], r.bhs[37]
                )));
            }
            for kv in r.data.split(|b| *b == 0) {
                if let Some((k, v)) = std::str::from_utf8(kv).ok().and_then(|x| x.split_once('=')) {
                    got.insert(k.to_string(), v.to_string());
                }
            }
            if r.bhs[1] & 0x83 == 0x83 {
                let num = |k: &str, d: usize| got.get(k).and_then(|v| v.parse().ok()).unwrap_or(d);
                return Ok(Initiator {
                    stream: s,
                    cmd_sn: 1,
                    stat_sn: be32(&r.bhs[24..28]).wrapping_add(1),
                    itt: 1,
                    target_max_data: num("MaxRecvDataSegmentLength", 8192),
                    first_burst: num("FirstBurstLength", 65536),
                    immediate: got.get("ImmediateData").is_none_or(|v| v == "Yes"),
                    initial_r2t: got.get("InitialR2T").is_none_or(|v| v == "Yes"),
                });
            }
        }
        Err(std::io::Error::other(
            "login did not reach full feature phase",
        ))
    }

    /// Sends TEST UNIT READY until it is GOOD: the unit attentions a target keeps for a
    /// new session (tgt's POWER ON) are cleared.
    pub fn clear_attentions(&mut self, lun: u8) -> std::io::Result<()> {
        for _ in 0..8 {
            if self.cmd(lun, &[0; 6], &[], 0)?.status == 0 {
                return Ok(());
            }
        }
        Err(std::io::Error::other(
            "TEST UNIT READY never came back GOOD",
        ))
    }

    /// A SCSI command PDU's header for `cdb`, taking the next tag and CmdSN.
    pub fn cmd_pdu(&mut self, lun: u8, cdb: &[u8], edtl: u32, read: bool, write: bool) -> [u8; 48] {
        let mut b = [0u8; 48];
        b[0] = 0x01;
        b[1] = 0x80 | if read { 0x40 } else { 0 } | if write { 0x20 } else { 0 } | 1;
        b[9] = lun;
        self.itt = self.itt.wrapping_add(1);
        b[16..20].copy_from_slice(&self.itt.to_be_bytes());
        b[20..24].copy_from_slice(&edtl.to_be_bytes());
        b[24..28].copy_from_slice(&self.cmd_sn.to_be_bytes());
        b[28..32].copy_from_slice(&self.stat_sn.to_be_bytes());
        b[32..32 + cdb.len().min(16)].copy_from_slice(&cdb[..cdb.len().min(16)]);
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        b
    }

    /// Sends a write's command with its immediate data, then its unsolicited Data-Out.
    fn send_command(
        &mut self,
        lun: u8,
        cdb: &[u8],
        data_out: &[u8],
        read_len: u32,
    ) -> std::io::Result<u32> {
        let write = !data_out.is_empty();
        let edtl = if write {
            data_out.len() as u32
        } else {
            read_len
        };
        let bhs = self.cmd_pdu(lun, cdb, edtl, read_len > 0, write);
        let itt = self.itt;
        let imm = if self.immediate {
            data_out
                .len()
                .min(self.first_burst)
                .min(self.target_max_data)
        } else {
            0
        };
        let mut wire = pdu_bytes(&bhs, &data_out[..imm]);
        if !self.initial_r2t {
            let end = data_out.len().min(self.first_burst);
            self.data_outs(&mut wire, lun, itt, u32::MAX, &data_out[..end], imm);
        }
        self.stream.write_all(&wire)?;
        Ok(itt)
    }

    /// Appends to `wire` the Data-Out PDUs that carry `data[from..]` (offsets from the
    /// start of `data`) for task `itt` and transfer tag `ttt`, each at most what the target
    /// takes in one PDU, numbered from DataSN 0, the last with F.
    fn data_outs(&self, wire: &mut Vec<u8>, lun: u8, itt: u32, ttt: u32, data: &[u8], from: usize) {
        let mut at = from;
        let mut sn = 0u32;
        while at < data.len() {
            let n = (data.len() - at).min(self.target_max_data);
            let mut d = [0u8; 48];
            d[0] = 0x05;
            d[1] = if at + n == data.len() { 0x80 } else { 0 };
            d[9] = lun;
            d[16..20].copy_from_slice(&itt.to_be_bytes());
            d[20..24].copy_from_slice(&ttt.to_be_bytes());
            d[28..32].copy_from_slice(&self.stat_sn.to_be_bytes());
            d[36..40].copy_from_slice(&sn.to_be_bytes());
            d[40..44].copy_from_slice(&(at as u32).to_be_bytes());
            wire.extend_from_slice(&pdu_bytes(&d, &data[at..at + n]));
            at += n;
            sn += 1;
        }
    }

    /// Answers an R2T from `data_out`.
    fn answer_r2t(&mut self, lun: u8, p: &RawPdu, data_out: &[u8]) -> std::io::Result<()> {
        let itt = be32(&p.bhs[16..20]);
        let ttt = be32(&p.bhs[20..24]);
        let off = be32(&p.bhs[40..44]) as usize;
        let len = be32(&p.bhs[44..48]) as usize;
        let end = (off + len).min(data_out.len());
        let mut wire = Vec::new();
        self.data_outs(&mut wire, lun, itt, ttt, &data_out[..end], off);
        self.stream.write_all(&wire)
    }

    fn answer_ping(&mut self, p: &RawPdu) -> std::io::Result<()> {
        if be32(&p.bhs[20..24]) == u32::MAX {
            return Ok(());
        }
        let mut n = [0u8; 48];
        n[0] = 0x40;
        n[1] = 0x80;
        n[16..20].copy_from_slice(&u32::MAX.to_be_bytes());
        n[20..24].copy_from_slice(&p.bhs[20..24]);
        n[24..28].copy_from_slice(&self.cmd_sn.to_be_bytes());
        self.stream.write_all(&pdu_bytes(&n, &[]))
    }

    fn status_of(&mut self, p: &RawPdu) -> Option<(u8, Option<Sense>)> {
        match p.bhs[0] & 0x3f {
            0x25 if p.bhs[1] & 0x01 != 0 => {
                self.stat_sn = be32(&p.bhs[24..28]).wrapping_add(1);
                Some((p.bhs[3], None))
            }
            0x21 => {
                self.stat_sn = be32(&p.bhs[24..28]).wrapping_add(1);
                let s = &p.data;
                let sense = if s.len() >= 4 && s[2] & 0x7f == 0x72 {
                    Some((s[3] & 0xf, s.get(4).copied()?, s.get(5).copied()?))
                } else if s.len() >= 16 {
                    Some((s[4] & 0xf, s[14], s[15]))
                } else {
                    None
                };
                Some((p.bhs[3], sense))
            }
            _ => None,
        }
    }

    /// Sends one SCSI command and reads until its status.
    pub fn cmd(
        &mut self,
        lun: u8,
        cdb: &[u8],
        data_out: &[u8],
        read_len: u32,
    ) -> std::io::Result<Done> {
        self.send_command(lun, cdb, data_out, read_len)?;
        let mut data = Vec::new();
        loop {
            let p = read_pdu(&mut self.stream)?;
            match p.bhs[0] & 0x3f {
                0x31 => self.answer_r2t(lun, &p, data_out)?,
                0x20 => self.answer_ping(&p)?,
                0x25 | 0x21 => {
                    if p.bhs[0] & 0x3f == 0x25 {
                        data.extend_from_slice(&p.data);
                    }
                    if let Some((status, sense)) = self.status_of(&p) {
                        return Ok(Done {
                            status,
                            sense,
                            data,
                        });
                    }
                }
                op => return Err(std::io::Error::other(format!("unexpected PDU {op:#04x}"))),
            }
        }
    }

    /// Runs `next` commands pipelined, `depth` in flight, for `time` or until `next` has
    /// none: each gives a CDB, its data-out (none for a read) and its data-in length.
    /// Returns the commands completed and the time taken. Any status but GOOD is an error.
    pub fn load(
        &mut self,
        lun: u8,
        depth: usize,
        time: Duration,
        mut next: impl FnMut() -> Option<Cmd>,
    ) -> Result<(u64, Duration)> {
        let started = Instant::now();
        let mut flight: HashMap<u32, InFlight> = HashMap::new();
        let mut done = 0u64;
        let mut exhausted = false;
        loop {
            while !exhausted && started.elapsed() < time && flight.len() < depth {
                let Some((cdb, data, read_len)) = next() else {
                    exhausted = true;
                    break;
                };
                let out: &[u8] = data.as_deref().map_or(&[], |d| d.as_slice());
                let itt = self.send_command(lun, &cdb, out, read_len)?;
                flight.insert(itt, InFlight { write: data });
            }
            if flight.is_empty() {
                return Ok((done, started.elapsed()));
            }
            let p = read_pdu(&mut self.stream)?;
            let itt = be32(&p.bhs[16..20]);
            match p.bhs[0] & 0x3f {
                0x31 => {
                    let data = flight
                        .get(&itt)
                        .and_then(|f| f.write.clone())
                        .unwrap_or_default();
                    self.answer_r2t(lun, &p, &data)?;
                }
                0x20 => self.answer_ping(&p)?,
                0x25 | 0x21 => {
                    if let Some((status, sense)) = self.status_of(&p) {
                        if status != 0 {
                            bail!("a command failed: status {status:#x}, sense {sense:x?}");
                        }
                        flight.remove(&itt);
                        done += 1;
                    }
                }
                op => bail!("unexpected PDU {op:#04x}"),
            }
        }
    }
}

pub fn write16(lba: u64, blocks: u32, fua: bool) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x8a;
    c[1] = if fua { 0x08 } else { 0 };
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

pub fn read16(lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x88;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

pub const SYNC_CACHE16: [u8; 16] = [0x91, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];

// ---- tgt, the reference target ----

/// Debian's tgt serving a file as LUN 1 of `TGT_IQN`, on 127.0.0.1: stopped when dropped.
pub struct Tgt {
    child: Child,
    control: u32,
    pub port: u16,
}

pub const TGT_IQN: &str = "iqn.2026-11.org.test:tgt";

impl Drop for Tgt {
    fn drop(&mut self) {
        let _ = Command::new("tgtadm")
            .args([
                "-C",
                &self.control.to_string(),
                "--op",
                "delete",
                "--mode",
                "system",
            ])
            .output();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether `tool` is on the PATH.
pub fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1).map(|x| x == "0"))
        .unwrap_or(false)
}

/// Starts tgtd serving `img` (made `size` bytes) on a free port; why not, if it cannot.
pub fn start_tgt(img: &Path, size: u64) -> Result<Tgt> {
    if !have("tgtd") || !have("tgtadm") {
        bail!("Debian's tgt is not installed (apt-get install tgt)");
    }
    if !is_root() {
        bail!("tgtd needs root");
    }
    std::fs::File::create(img)
        .and_then(|f| f.set_len(size))
        .with_context(|| format!("cannot make {}", img.display()))?;
    let port = free_port()?;
    // A control port of its own, so that another tgtd (the system's) is left alone.
    let control = 100 + u32::from(port % 800);
    let child = Command::new("tgtd")
        .args([
            "-f",
            "-C",
            &control.to_string(),
            "--iscsi",
            &format!("portal=127.0.0.1:{port}"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start tgtd")?;
    let t = Tgt {
        child,
        control,
        port,
    };
    let adm = |args: &[&str]| -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let o = Command::new("tgtadm")
                .args(["-C", &control.to_string(), "--lld", "iscsi"])
                .args(args)
                .output()?;
            if o.status.success() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "tgtadm {args:?}: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    adm(&[
        "--op", "new", "--mode", "target", "--tid", "1", "-T", TGT_IQN,
    ])?;
    let img = img.to_str().context("a UTF-8 path")?;
    adm(&[
        "--op",
        "new",
        "--mode",
        "logicalunit",
        "--tid",
        "1",
        "--lun",
        "1",
        "-b",
        img,
    ])?;
    adm(&[
        "--op", "bind", "--mode", "target", "--tid", "1", "-I", "ALL",
    ])?;
    Ok(t)
}

// ---- the benchmark ----

#[derive(Args)]
pub struct IscsiBenchArgs {
    /// Directory for tank's data directory and tgt's file (one file system: one disk).
    #[arg(long)]
    dir: PathBuf,
    /// Size of the volume and of tgt's file.
    #[arg(long, default_value = "1G")]
    size: String,
    /// Seconds of each measurement.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Runs; figures are medians.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Leave the peer (tgt) out.
    #[arg(long)]
    no_peer: bool,
    /// Measure a running target instead, as ADDR:PORT/IQN/LUN (its LUN is written over).
    #[arg(long, value_name = "ADDR:PORT/IQN/LUN")]
    target: Option<String>,
}

/// The measurements, in order: name, block bytes, queue depth, write, random.
const TESTS: [(&str, u32, usize, bool, bool); 6] = [
    ("4K random read QD1 (IOPS)", 4096, 1, false, true),
    ("4K random read QD32 (IOPS)", 4096, 32, false, true),
    ("4K random write QD1 (IOPS)", 4096, 1, true, true),
    ("4K random write QD32 (IOPS)", 4096, 32, true, true),
    ("1M sequential read QD8 (MB/s)", 1 << 20, 8, false, false),
    ("1M sequential write QD8 (MB/s)", 1 << 20, 8, true, false),
];

/// The figures of one target in one run, as TESTS lists them, then iscsi-perf's IOPS.
type Figures = Vec<f64>;

fn measure(addr: &str, iqn: &str, lun: u8, size: u64, seconds: u64) -> Result<Figures> {
    let mut ini = Initiator::login(addr, iqn, "iqn.2026-11.org.tank:bench")
        .map_err(|e| anyhow::anyhow!("cannot log in to {iqn} at {addr}: {e}"))?;
    ini.clear_attentions(lun)?;
    let blocks = size / 512;
    // Written whole first: reads then find data, not holes.
    let buf = std::sync::Arc::new({
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        (0..(1 << 20))
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect::<Vec<u8>>()
    });
    let mut lba = 0u64;
    ini.load(lun, 8, Duration::from_secs(3600), || {
        if lba + 2048 > blocks {
            return None;
        }
        let cdb = write16(lba, 2048, false);
        lba += 2048;
        Some((cdb, Some(buf.clone()), 0))
    })?;
    let mut out = Vec::new();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for (name, bs, depth, write, random) in TESTS {
        let per = u64::from(bs / 512);
        let span = blocks / per;
        let mut seq = 0u64;
        let small = std::sync::Arc::new(buf[..bs as usize].to_vec());
        let (n, took) = ini.load(lun, depth, Duration::from_secs(seconds), || {
            let slot = if random {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x % span
            } else {
                let s = seq % span;
                seq += 1;
                s
            };
            Some(if write {
                (
                    write16(slot * per, per as u32, false),
                    Some(small.clone()),
                    0,
                )
            } else {
                (read16(slot * per, per as u32), None, bs)
            })
        })?;
        let mut took = took;
        if write {
            let t = Instant::now();
            let r = ini.cmd(lun, &SYNC_CACHE16, &[], 0)?;
            if r.status != 0 {
                bail!("SYNCHRONIZE CACHE failed: {r:?}");
            }
            took += t.elapsed();
        }
        let secs = took.as_secs_f64().max(1e-9);
        let v = if bs >= 1 << 20 {
            n as f64 * f64::from(bs) / 1e6 / secs
        } else {
            n as f64 / secs
        };
        eprintln!("    {name}: {v:.0}");
        out.push(v);
    }
    out.push(iscsi_perf(&format!("iscsi://{addr}/{iqn}/{lun}"), seconds).unwrap_or(f64::NAN));
    Ok(out)
}

/// libiscsi's `iscsi-perf`: 4 KiB random reads at queue depth 32 for `seconds`; its
/// average IOPS.
fn iscsi_perf(url: &str, seconds: u64) -> Result<f64> {
    let out = Command::new("timeout")
        .args([
            "-s",
            "INT",
            &seconds.to_string(),
            "iscsi-perf",
            "-r",
            "-m",
            "32",
            "-b",
            "8",
            url,
        ])
        .output()
        .context("cannot run iscsi-perf (apt-get install libiscsi-bin)")?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    text.rsplit("iops average ")
        .next()
        .and_then(|t| t.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no figure from iscsi-perf: {}", text.trim()))
}

pub fn run(a: IscsiBenchArgs) -> Result<()> {
    let size = parse_size(&a.size)?;
    if size < (64 << 20) || a.runs == 0 || a.seconds == 0 {
        bail!("--size must be at least 64M, --runs and --seconds above 0");
    }
    if let Some(t) = &a.target {
        let mut parts = t.splitn(3, '/');
        let (Some(addr), Some(iqn), Some(lun)) = (parts.next(), parts.next(), parts.next()) else {
            bail!("invalid --target '{t}': ADDR:PORT/IQN/LUN");
        };
        let lun: u8 = lun.parse().context("the LUN is a number")?;
        let runs: Vec<Figures> = (0..a.runs)
            .map(|_| measure(addr, iqn, lun, size, a.seconds))
            .collect::<Result<_>>()?;
        report(&a, size, &runs, &[]);
        return Ok(());
    }
    std::fs::create_dir_all(&a.dir)?;
    let mut tank_runs = Vec::new();
    let mut peer_runs = Vec::new();
    for r in 0..a.runs {
        let work = a.dir.join(format!("bench-iscsi-{r}"));
        let _ = std::fs::remove_dir_all(&work);
        std::fs::create_dir_all(&work)?;
        eprintln!("run {}/{}: tank ...", r + 1, a.runs);
        {
            let data = work.join("tank-data");
            let port = free_port()?;
            let _d = start_serve(
                &data,
                &["--no-api", "--iscsi", &format!("127.0.0.1:{port}")],
                "tank: cannot serve iSCSI",
            )?;
            let vol = human(size);
            tank_cli(
                &data,
                &["dataset", "create", "-V", &vol, "tank/bench"],
                None,
            )?;
            let iqn = "iqn.2026-11.org.tank:bench";
            tank_cli(&data, &["share", "add", "iscsi", iqn, "tank/bench"], None)?;
            let f = measure(&format!("127.0.0.1:{port}"), iqn, 0, size, a.seconds)?;
            tank_runs.push(f);
        }
        let _ = Command::new("sync").status();
        if !a.no_peer {
            eprintln!("run {}/{}: tgt ...", r + 1, a.runs);
            let tgt = start_tgt(&work.join("tgt.img"), size)?;
            let f = measure(
                &format!("127.0.0.1:{}", tgt.port),
                TGT_IQN,
                1,
                size,
                a.seconds,
            )?;
            peer_runs.push(f);
            drop(tgt);
            let _ = Command::new("sync").status();
        }
        let _ = std::fs::remove_dir_all(&work);
    }
    report(&a, size, &tank_runs, &peer_runs);
    Ok(())
}

fn report(a: &IscsiBenchArgs, size: u64, tank: &[Figures], peer: &[Figures]) {
    println!(
        "iSCSI on 127.0.0.1, a {} volume (tank) and a {} file (tgt), {} s per figure; median of {} run(s)",
        human(size),
        human(size),
        a.seconds,
        a.runs
    );
    println!(
        "{:<36} {:>10} {:>10} {:>8}",
        "figure", "tank", "tgt", "ratio"
    );
    let names: Vec<&str> = TESTS
        .iter()
        .map(|t| t.0)
        .chain(["iscsi-perf 4K random read QD32 (IOPS)"])
        .collect();
    for (i, name) in names.iter().enumerate() {
        let t = median(&mut tank.iter().map(|f| f[i]).collect::<Vec<f64>>());
        if peer.is_empty() {
            println!("{name:<36} {t:>10.0} {:>10} {:>8}", "-", "-");
            continue;
        }
        let p = median(&mut peer.iter().map(|f| f[i]).collect::<Vec<f64>>());
        let ratio = median(
            &mut tank
                .iter()
                .zip(peer)
                .map(|(t, p)| t[i] / p[i].max(1e-9))
                .collect::<Vec<f64>>(),
        );
        println!("{name:<36} {t:>10.0} {p:>10.0} {ratio:>7.2}x");
    }
}
