//! Device profiles and the timing models that emulate them.
//!
//! # Theory of operation
//! A [`DeviceProfile`] holds the figures that decide how a disk performs and fails: sequential
//! bandwidth, average seek and rotational latency (HDD), IOPS, queue depth, capacity, MTTF and
//! the unrecoverable-read-error rate. Built-in profiles follow data sheets of the hardware in
//! the reference builds (a 7200 rpm 4 TB NAS HDD, a SATA SSD, an NVMe SSD); any figure can be
//! overridden (`hdd:bw=200M,seek=9ms`).
//!
//! [`HddModel`] and [`SsdModel`] implement `tank_device::TimingModel`, the seam of
//! `EmulatedDevice`:
//! - HDD: a request that starts where the previous one ended pays only its transfer
//!   (`len / bandwidth`); one a little further on pays the time the skipped bytes take to
//!   pass under the head (`gap / bandwidth`) when that is less than repositioning; any other
//!   pays a seek that grows with the square root of the distance (track-to-track 0.5 ms up
//!   to a full stroke, scaled so that uniformly random requests average the profile's seek),
//!   plus half a rotation, plus the transfer.
//! - SSD/NVMe: `max(len / bandwidth, 1 / IOPS)`: requests are served one at a time by the
//!   emulated device, so the profile's IOPS at its queue depth is folded into the per-request
//!   time.
//!
//! The models are pure functions of the request stream (plus the head position), so tests
//! check them against analytic expectations without clocks.

use std::time::Duration;

use parking_lot::Mutex;
use serde::Serialize;
use tank_device::{IoKind, TimingModel};

use crate::BenchError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DiskKind {
    Hdd,
    Ssd,
    Nvme,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceProfile {
    pub name: String,
    pub kind: DiskKind,
    /// Bytes.
    pub capacity: u64,
    /// Bytes per second.
    pub read_bw: f64,
    pub write_bw: f64,
    /// Average seek (HDD), milliseconds.
    pub seek_ms: f64,
    /// Spindle speed (HDD); 0 for flash.
    pub rpm: u32,
    /// Random 4 KiB operations per second at `queue_depth` (flash).
    pub read_iops: f64,
    pub write_iops: f64,
    pub queue_depth: u32,
    /// Time to serve one request with nothing else queued (flash), milliseconds: what a
    /// single synchronous reader waits, where `1 / iops` is the device's rate when its queue
    /// is full.
    pub access_ms: f64,
    /// Mean time to failure, hours (data sheet).
    pub mttf_hours: f64,
    /// Unrecoverable read errors per bit read (data sheet: 1 in 10^14 for desktop/NAS HDDs).
    pub ure_per_bit: f64,
}

const KB: f64 = 1e3;
const MB: f64 = 1e6;

impl DeviceProfile {
    /// A 7200 rpm 4 TB NAS HDD (the reference build's Seagate ST4000VN000: 180 MB/s, 1M h
    /// MTBF, 1 URE per 10^14 bits).
    pub fn hdd() -> Self {
        Self {
            name: "7200 rpm NAS HDD".into(),
            kind: DiskKind::Hdd,
            capacity: 4_000_000_000_000,
            read_bw: 180.0 * MB,
            write_bw: 180.0 * MB,
            seek_ms: 8.5,
            rpm: 7200,
            read_iops: 0.0,
            write_iops: 0.0,
            queue_depth: 1,
            access_ms: 0.0,
            mttf_hours: 1_000_000.0,
            ure_per_bit: 1e-14,
        }
    }

    /// A SATA SSD (550/520 MB/s, 90k/80k IOPS at QD32, 90 us for one request alone).
    pub fn ssd() -> Self {
        Self {
            name: "SATA SSD".into(),
            kind: DiskKind::Ssd,
            capacity: 512_000_000_000,
            read_bw: 550.0 * MB,
            write_bw: 520.0 * MB,
            seek_ms: 0.0,
            rpm: 0,
            read_iops: 90.0 * KB,
            write_iops: 80.0 * KB,
            queue_depth: 32,
            access_ms: 0.09,
            mttf_hours: 1_500_000.0,
            ure_per_bit: 1e-16,
        }
    }

    /// An NVMe SSD (3.5/3.0 GB/s, 500k/400k IOPS at QD64, 60 us for one request alone).
    pub fn nvme() -> Self {
        Self {
            name: "NVMe SSD".into(),
            kind: DiskKind::Nvme,
            capacity: 1_000_000_000_000,
            read_bw: 3500.0 * MB,
            write_bw: 3000.0 * MB,
            seek_ms: 0.0,
            rpm: 0,
            read_iops: 500.0 * KB,
            write_iops: 400.0 * KB,
            queue_depth: 64,
            access_ms: 0.06,
            mttf_hours: 1_600_000.0,
            ure_per_bit: 1e-17,
        }
    }

    /// Half a rotation, milliseconds (0 for flash).
    pub fn rotation_ms(&self) -> f64 {
        if self.rpm == 0 {
            0.0
        } else {
            30_000.0 / f64::from(self.rpm)
        }
    }

    /// Random reads of `len` bytes per second, one at a time.
    pub fn random_read_iops(&self, len: u64) -> f64 {
        match self.kind {
            DiskKind::Hdd => {
                1.0 / ((self.seek_ms + self.rotation_ms()) / 1e3 + len as f64 / self.read_bw)
            }
            _ => 1.0 / (1.0 / self.read_iops).max(len as f64 / self.read_bw),
        }
    }

    pub fn random_write_iops(&self, len: u64) -> f64 {
        match self.kind {
            DiskKind::Hdd => {
                1.0 / ((self.seek_ms + self.rotation_ms()) / 1e3 + len as f64 / self.write_bw)
            }
            _ => 1.0 / (1.0 / self.write_iops).max(len as f64 / self.write_bw),
        }
    }

    /// Parses `hdd`, `ssd`, `nvme`, optionally followed by `:key=value,...` overrides
    /// (`cap`, `bw`, `rbw`, `wbw`, `seek`, `rpm`, `riops`, `wiops`, `qd`, `access`, `mttf`,
    /// `ure`).
    pub fn parse(spec: &str) -> Result<Self, BenchError> {
        let (base, overrides) = spec.split_once(':').unwrap_or((spec, ""));
        let mut p = match base.trim() {
            "hdd" => Self::hdd(),
            "ssd" => Self::ssd(),
            "nvme" => Self::nvme(),
            other => {
                return Err(BenchError::Invalid(format!(
                    "unknown device profile '{other}' (hdd, ssd, nvme)"
                )))
            }
        };
        for kv in overrides.split(',').filter(|s| !s.trim().is_empty()) {
            let (k, v) = kv.split_once('=').ok_or_else(|| {
                BenchError::Invalid(format!("profile setting '{kv}' is not key=value"))
            })?;
            let num = |v: &str| -> Result<f64, BenchError> {
                let t = v.trim().trim_end_matches("ms").trim_end_matches("/s");
                parse_quantity(t).ok_or_else(|| {
                    BenchError::Invalid(format!("profile setting {k}: '{v}' is not a number"))
                })
            };
            match k.trim() {
                "cap" => p.capacity = num(v)? as u64,
                "bw" => {
                    p.read_bw = num(v)?;
                    p.write_bw = p.read_bw;
                }
                "rbw" => p.read_bw = num(v)?,
                "wbw" => p.write_bw = num(v)?,
                "seek" => p.seek_ms = num(v)?,
                "rpm" => p.rpm = num(v)? as u32,
                "riops" => p.read_iops = num(v)?,
                "wiops" => p.write_iops = num(v)?,
                "qd" => p.queue_depth = num(v)? as u32,
                "access" => p.access_ms = num(v)?,
                "mttf" => p.mttf_hours = num(v)?,
                "ure" => p.ure_per_bit = num(v)?,
                other => {
                    return Err(BenchError::Invalid(format!(
                        "unknown profile setting '{other}' (cap, bw, rbw, wbw, seek, rpm, riops, wiops, qd, access, mttf, ure)"
                    )))
                }
            }
        }
        p.name = if overrides.is_empty() {
            p.name
        } else {
            format!("{} ({overrides})", p.name)
        };
        p.validate()?;
        Ok(p)
    }

    /// Refuses nonsense: non-positive bandwidths, capacities or MTTF, probabilities out of
    /// range, an HDD without rpm or a flash device without IOPS.
    pub fn validate(&self) -> Result<(), BenchError> {
        let bad = |what: &str| {
            Err(BenchError::Invalid(format!(
                "profile '{}': {what}",
                self.name
            )))
        };
        if self.capacity < (1 << 30) {
            return bad("capacity must be at least 1 GiB");
        }
        if !(self.read_bw > 0.0
            && self.write_bw > 0.0
            && self.read_bw.is_finite()
            && self.write_bw.is_finite())
        {
            return bad("bandwidth must be positive");
        }
        if !(self.mttf_hours > 0.0 && self.mttf_hours.is_finite()) {
            return bad("MTTF must be positive");
        }
        if !(0.0..1.0).contains(&self.ure_per_bit) {
            return bad("URE rate must be a probability per bit (e.g. 1e-14)");
        }
        match self.kind {
            DiskKind::Hdd => {
                if self.rpm == 0
                    || self.rpm > 30_000
                    || !(self.seek_ms >= 0.0 && self.seek_ms < 100.0)
                {
                    return bad("an HDD needs rpm (1 to 30000) and a seek time under 100 ms");
                }
                if self.access_ms != 0.0 {
                    return bad("access is for flash; an HDD's access is its seek and rotation");
                }
            }
            _ => {
                if !(self.read_iops > 0.0 && self.write_iops > 0.0) {
                    return bad("a flash device needs positive IOPS");
                }
                if !(0.0..=100.0).contains(&self.access_ms) {
                    return bad("a flash device's access time must be 0 to 100 ms");
                }
            }
        }
        if self.queue_depth == 0 {
            return bad("queue depth must be at least 1");
        }
        Ok(())
    }

    /// The timing model that emulates this profile on a device of `span` bytes (a scaled-down
    /// stand-in: offsets are stretched over the whole profile capacity, so seeks cost what they
    /// would on the real disk).
    pub fn model(&self, span: u64) -> std::sync::Arc<dyn TimingModel> {
        match self.kind {
            DiskKind::Hdd => std::sync::Arc::new(HddModel::with_span(self.clone(), span)),
            _ => std::sync::Arc::new(SsdModel::new(self.clone())),
        }
    }
}

/// Parses `200M`, `4T`, `1.5e-14`, `8.5` (decimal multipliers K, M, G, T, P).
pub fn parse_quantity(s: &str) -> Option<f64> {
    let s = s.trim();
    let (num, mult) = match s.chars().last()? {
        'K' | 'k' => (&s[..s.len() - 1], 1e3),
        'M' => (&s[..s.len() - 1], 1e6),
        'G' | 'g' => (&s[..s.len() - 1], 1e9),
        'T' | 't' => (&s[..s.len() - 1], 1e12),
        'P' | 'p' => (&s[..s.len() - 1], 1e15),
        _ => (s, 1.0),
    };
    let v: f64 = num.parse().ok()?;
    (v.is_finite()).then_some(v * mult)
}

/// Emulates a hard disk: seeks, rotation, transfer. See the module documentation.
#[derive(Debug)]
pub struct HddModel {
    profile: DeviceProfile,
    /// Byte offset where the head is (the end of the previous request).
    head: Mutex<u64>,
    /// Profile capacity over the emulating device's size.
    stretch: f64,
}

/// Track-to-track seek, milliseconds.
const TRACK_TO_TRACK_MS: f64 = 0.5;
/// E[sqrt(|x - y|)] for x, y uniform on [0, 1]: 8/15. Scales the full stroke so that random
/// requests average the profile's seek time.
const MEAN_SQRT_DISTANCE: f64 = 8.0 / 15.0;

impl HddModel {
    pub fn new(profile: DeviceProfile) -> Self {
        let span = profile.capacity;
        Self::with_span(profile, span)
    }

    /// A model for a stand-in device of `span` bytes (see [`DeviceProfile::model`]).
    pub fn with_span(profile: DeviceProfile, span: u64) -> Self {
        let stretch = profile.capacity as f64 / span.max(1) as f64;
        Self {
            profile,
            head: Mutex::new(0),
            stretch,
        }
    }

    /// Seek time for a move of `distance` bytes, milliseconds.
    pub fn seek_ms(&self, distance: u64) -> f64 {
        if distance == 0 {
            return 0.0;
        }
        let full = TRACK_TO_TRACK_MS
            + (self.profile.seek_ms - TRACK_TO_TRACK_MS).max(0.0) / MEAN_SQRT_DISTANCE;
        let frac = (distance as f64 / self.profile.capacity as f64).min(1.0);
        TRACK_TO_TRACK_MS + (full - TRACK_TO_TRACK_MS) * frac.sqrt()
    }
}

impl TimingModel for HddModel {
    fn service_time(&self, op: IoKind, offset: u64, len: u64) -> Duration {
        let bw = match op {
            IoKind::Read => self.profile.read_bw,
            IoKind::Write => self.profile.write_bw,
            // A cache flush costs about one rotation on a drive with a write cache.
            IoKind::Flush => {
                return Duration::from_secs_f64(self.profile.rotation_ms() * 2.0 / 1e3)
            }
            IoKind::Trim => return Duration::ZERO,
        };
        let mut head = self.head.lock();
        let positioning_ms = if offset == *head {
            0.0
        } else {
            let reposition = self.seek_ms((offset.abs_diff(*head) as f64 * self.stretch) as u64)
                + self.profile.rotation_ms();
            if offset > *head {
                // A short skip forward: the platter carries the skipped sectors past the head
                // (a RAID-Z read skipping a parity column, an allocation gap) in less time
                // than a seek and half a rotation.
                let pass_ms = (offset - *head) as f64 / bw * 1e3;
                pass_ms.min(reposition)
            } else {
                reposition
            }
        };
        *head = offset + len;
        Duration::from_secs_f64(positioning_ms / 1e3 + len as f64 / bw)
    }

    fn transfer_time(&self, op: IoKind, len: u64) -> Duration {
        match op {
            IoKind::Read => Duration::from_secs_f64(len as f64 / self.profile.read_bw),
            IoKind::Write => Duration::from_secs_f64(len as f64 / self.profile.write_bw),
            IoKind::Flush | IoKind::Trim => Duration::ZERO,
        }
    }
}

/// Emulates flash: requests are served side by side (up to the device's queue depth), each
/// taking at least `access + len / bandwidth`, while the device as a whole serves at most
/// its IOPS and bandwidth: every request books `max(len / bandwidth, 1 / IOPS)` on a clock
/// of the device's throughput and ends no earlier than its booking. One reader alone then
/// sees the access time (about 10k IOPS for a SATA SSD), a full queue the data sheet's IOPS.
#[derive(Debug)]
pub struct SsdModel {
    profile: DeviceProfile,
    /// When the device's throughput is next free.
    busy_until: Mutex<Option<std::time::Instant>>,
}

impl SsdModel {
    pub fn new(profile: DeviceProfile) -> Self {
        Self {
            profile,
            busy_until: Mutex::new(None),
        }
    }

    /// Service time of a request issued at `now`.
    pub fn service_at(&self, op: IoKind, len: u64, now: std::time::Instant) -> Duration {
        let (bw, iops) = match op {
            IoKind::Read => (self.profile.read_bw, self.profile.read_iops),
            IoKind::Write => (self.profile.write_bw, self.profile.write_iops),
            IoKind::Flush | IoKind::Trim => return Duration::from_micros(50),
        };
        let transfer = len as f64 / bw;
        let occupancy = Duration::from_secs_f64(transfer.max(1.0 / iops));
        let mut busy = self.busy_until.lock();
        let start = busy.map_or(now, |t| t.max(now));
        let booked_end = start + occupancy;
        *busy = Some(booked_end);
        let alone = now + Duration::from_secs_f64(self.profile.access_ms / 1e3 + transfer);
        alone.max(booked_end) - now
    }
}

impl TimingModel for SsdModel {
    fn service_time(&self, op: IoKind, _offset: u64, len: u64) -> Duration {
        self.service_at(op, len, std::time::Instant::now())
    }

    fn queue_depth(&self) -> usize {
        self.profile.queue_depth.max(1) as usize
    }

    fn serial(&self) -> bool {
        false
    }
}

/// A network link's payload bandwidth (see `link.rs`).
pub fn link_bandwidth(name: &str) -> Result<f64, BenchError> {
    Ok(crate::link::LinkProfile::parse(name)?.bandwidth)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hdd_sequential_is_pure_transfer() {
        let m = HddModel::new(DeviceProfile::hdd());
        let mut t = 0.0;
        let mut off = 0;
        for _ in 0..1000 {
            t += m.service_time(IoKind::Read, off, 1 << 20).as_secs_f64();
            off += 1 << 20;
        }
        // The first request seeks from 0 to 0: none. 1000 MiB at 180 MB/s.
        let expect = 1000.0 * (1u64 << 20) as f64 / 180e6;
        assert!((t - expect).abs() / expect < 1e-6, "{t} vs {expect}");
    }

    #[test]
    fn hdd_short_forward_skips_cost_the_bytes_passing_and_long_ones_a_seek() {
        let p = DeviceProfile::hdd();
        let m = HddModel::new(p.clone());
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let transfer = (128u64 << 10) as f64 / p.read_bw * 1e3;
        m.service_time(IoKind::Read, 0, 128 << 10);
        // Skipping a 24 KiB parity column: 24 KiB pass under the head.
        let skip = ms(m.service_time(IoKind::Read, (128 + 24) << 10, 128 << 10));
        let expect = (24u64 << 10) as f64 / p.read_bw * 1e3 + transfer;
        assert!((skip - expect).abs() < 1e-5, "{skip} vs {expect}");
        // A jump of a quarter of the disk forward: a seek and half a rotation are quicker
        // than letting a terabyte pass.
        let far = ms(m.service_time(IoKind::Read, p.capacity / 4, 128 << 10));
        assert!(far > p.rotation_ms() && far < 30.0, "{far}");
        // Backwards always repositions, however short.
        let back = ms(m.service_time(IoKind::Read, p.capacity / 4 - (256 << 10), 4096));
        assert!(back > p.rotation_ms(), "{back}");
    }

    #[test]
    fn hdd_random_reads_average_the_profile_seek() {
        let p = DeviceProfile::hdd();
        let m = HddModel::new(p.clone());
        // Independent uniform offsets over the whole disk (a fixed xorshift sequence).
        let mut t = 0.0;
        let n = 20_000;
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let off = x % (p.capacity - 4096) / 4096 * 4096;
            t += m.service_time(IoKind::Read, off, 4096).as_secs_f64();
        }
        let iops = n as f64 / t;
        let expect = p.random_read_iops(4096);
        assert!(
            (iops - expect).abs() / expect < 0.10,
            "emulated {iops:.1} IOPS, profile {expect:.1}"
        );
        assert!(
            (70.0..90.0).contains(&expect),
            "a 7200 rpm disk does about 80 random IOPS: {expect}"
        );
    }

    #[test]
    fn ssd_one_request_alone_waits_its_access_time_and_a_full_queue_gets_the_iops() {
        let p = DeviceProfile::ssd();
        let m = SsdModel::new(p.clone());
        let t0 = std::time::Instant::now();
        // Alone: access time plus transfer.
        let alone = m.service_at(IoKind::Read, 4096, t0).as_secs_f64();
        let expect = p.access_ms / 1e3 + 4096.0 / p.read_bw;
        assert!((alone - expect).abs() < 1e-6, "{alone} vs {expect}");
        assert!(
            (8_000.0..12_000.0).contains(&(1.0 / alone)),
            "{}",
            1.0 / alone
        );
        // A queue of 10,000 requests issued together ends at the IOPS rate.
        let m = SsdModel::new(p.clone());
        let last = (0..10_000)
            .map(|_| m.service_at(IoKind::Read, 4096, t0))
            .max()
            .unwrap()
            .as_secs_f64();
        let rate = 10_000.0 / last;
        assert!((rate - p.read_iops).abs() / p.read_iops < 0.01, "{rate}");
        // Large requests: the bandwidth.
        let m = SsdModel::new(p.clone());
        let last = (0..100)
            .map(|_| m.service_at(IoKind::Read, 1 << 20, t0))
            .max()
            .unwrap()
            .as_secs_f64();
        let bw = 100.0 * (1u64 << 20) as f64 / last;
        assert!((bw - p.read_bw).abs() / p.read_bw < 0.01, "{bw}");
        // A request after the device went idle is alone again.
        let later = t0 + Duration::from_secs(60);
        let again = m.service_at(IoKind::Read, 4096, later).as_secs_f64();
        assert!((again - expect).abs() < 1e-6);
    }

    #[test]
    fn parse_overrides_and_refuse_nonsense() {
        let p = DeviceProfile::parse("hdd:bw=200M,seek=9ms,cap=8T").unwrap();
        assert_eq!(p.read_bw, 200e6);
        assert_eq!(p.seek_ms, 9.0);
        assert_eq!(p.capacity, 8_000_000_000_000);
        assert!(DeviceProfile::parse("floppy").is_err());
        assert!(DeviceProfile::parse("hdd:bw=-5").is_err());
        assert!(DeviceProfile::parse("hdd:rpm=0").is_err());
        assert!(DeviceProfile::parse("ssd:riops=0").is_err());
        assert!(DeviceProfile::parse("ssd:access=-1").is_err());
        assert!(DeviceProfile::parse("hdd:access=5").is_err());
        assert_eq!(
            DeviceProfile::parse("ssd:access=0.2ms").unwrap().access_ms,
            0.2
        );
        assert!(DeviceProfile::parse("hdd:ure=2").is_err());
        assert!(DeviceProfile::parse("hdd:speed=3").is_err());
        assert!(DeviceProfile::parse("hdd:bw").is_err());
        assert!(link_bandwidth("1gbe").unwrap() > 100e6);
        assert!(link_bandwidth("10mbit").is_err());
    }
}

#[cfg(test)]
mod emulated_device_tests {
    use super::*;
    use std::sync::Arc;
    use tank_device::{BlockDevice, EmulatedDevice, MemDevice};

    #[test]
    fn emulated_sequential_write_takes_the_modelled_time() {
        let p = DeviceProfile::hdd();
        let inner = Arc::new(MemDevice::new("m", 256 << 20));
        let dev = EmulatedDevice::new(inner, p.model(256 << 20));
        let buf = vec![7u8; 1 << 20];
        let t = std::time::Instant::now();
        for i in 0..20u64 {
            dev.write_at(&buf, i << 20).unwrap();
        }
        let took = t.elapsed().as_secs_f64();
        let expect = 20.0 * (1u64 << 20) as f64 / p.write_bw;
        eprintln!("took {took} expect {expect}");
        assert!(took >= expect * 0.99, "took {took}, model says {expect}");
    }
}
