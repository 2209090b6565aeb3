//! `tank plan`: the layout advisor. Enumerates the sensible layouts for a set of disks and
//! reports, for each, usable capacity, failures tolerated, mean time to data loss, resilver
//! time and expected performance, then recommends one for the stated workload.
//!
//! # Theory of operation
//! - **Capacity** is exact for RAID-Z: a record of `recordsize` bytes occupies
//!   `RaidzGeometry::asize` (the engine's own allocation rule: parity per row and padding to a
//!   multiple of parity + 1 sectors), so efficiency depends on width, parity, ashift and record
//!   size, not just on `(w - p) / w`. Labels (4.5 MiB per disk) and the 1/32 slop reserve
//!   are deducted.
//! - **Reliability** uses the Markov approximation of Patterson, Gibson and Katz
//!   (MTTDL of a group of n disks with p parity: `MTTF^(p+1) / (n (n-1) ... (n-p) MTTR^p)`),
//!   plus the unrecoverable-read-error term that makes wide single-parity groups fail in
//!   rebuilds (the "RAID 5 rebuild problem"): once a group has no redundancy left, a URE in
//!   the data read to rebuild loses data, with probability `1 - exp(-bits x URE)`. The
//!   rate of reaching that state is `n (n-1) ... (n-p+1) MTTR^(p-1) / MTTF^p`.
//! - **Resilver time**: ZFS resilvers only allocated data, in device-offset order, so the
//!   time is the data per disk (capacity x fill) over the slower of read and write bandwidth.
//! - **Performance** follows the usual ZFS rules of thumb, from the device profile:
//!   streaming reads and writes scale with data disks; a random read of one record touches
//!   every data column of a RAID-Z vdev (one disk's IOPS per vdev) but one side of a mirror
//!   (every disk's IOPS); random writes cost one disk's IOPS per vdev.

use serde::Serialize;
use tank_vdev::RaidzGeometry;

use crate::profile::DeviceProfile;
use crate::BenchError;

/// Bytes per disk not available to data: two labels and the boot reserve at the front, two
/// labels at the back.
const LABEL_OVERHEAD: u64 = (4 << 20) + (512 << 10);
const HOURS_PER_YEAR: f64 = 24.0 * 365.25;
/// ZFS L2ARC keeps about this much RAM per cached block (arc_buf_hdr_t with l2 fields).
pub const L2ARC_HEADER_BYTES: u64 = 96;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    Seq,
    Random,
    Mixed,
}

impl Workload {
    pub fn parse(s: &str) -> Result<Self, BenchError> {
        match s {
            "seq" | "sequential" => Ok(Self::Seq),
            "random" => Ok(Self::Random),
            "mixed" => Ok(Self::Mixed),
            _ => Err(BenchError::Invalid(format!(
                "workload '{s}' is not seq, random or mixed"
            ))),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum VdevType {
    Stripe,
    Mirror { ways: usize },
    Raidz { parity: usize },
}

/// One candidate layout: `vdevs` top-level vdevs of `width` disks each, plus hot spares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Layout {
    pub vdev: VdevType,
    pub width: usize,
    pub vdevs: usize,
    pub spares: usize,
}

impl Layout {
    pub fn describe(&self) -> String {
        let body = match self.vdev {
            VdevType::Stripe => format!("stripe of {}", self.width * self.vdevs),
            VdevType::Mirror { ways } => format!("{} x {ways}-way mirror", self.vdevs),
            VdevType::Raidz { parity } => {
                format!("{} x raidz{parity} of {}", self.vdevs, self.width)
            }
        };
        if self.spares > 0 {
            format!(
                "{body} + {} spare{}",
                self.spares,
                if self.spares > 1 { "s" } else { "" }
            )
        } else {
            body
        }
    }

    pub fn disks(&self) -> usize {
        self.width * self.vdevs + self.spares
    }

    /// Disks a vdev may lose.
    pub fn redundancy(&self) -> usize {
        match self.vdev {
            VdevType::Stripe => 0,
            VdevType::Mirror { ways } => ways - 1,
            VdevType::Raidz { parity } => parity,
        }
    }

    /// Disks of a vdev that hold data (all but the parity; one of a mirror).
    pub fn data_disks_per_vdev(&self) -> usize {
        match self.vdev {
            VdevType::Stripe => 1,
            VdevType::Mirror { .. } => 1,
            VdevType::Raidz { parity } => self.width - parity,
        }
    }
}

impl Layout {
    /// Parses `VDEVSxWIDTH LAYOUT` (`3x8 raidz2`, `12x2 mirror`) or `stripe of N`-style
    /// `Nx1 stripe`, as `tank plan --layouts` takes them.
    pub fn parse(s: &str) -> Result<Self, BenchError> {
        let usage = || {
            BenchError::Invalid(format!(
                "'{s}' is not VDEVSxWIDTH LAYOUT (e.g. 3x8 raidz2, 12x2 mirror, 7x1 stripe)"
            ))
        };
        let words: Vec<&str> = s.split_whitespace().collect();
        let [group, kind] = words.as_slice() else {
            return Err(usage());
        };
        let (v, w) = group.split_once(['x', 'X']).ok_or_else(usage)?;
        let vdevs: usize = v.parse().map_err(|_| usage())?;
        let width: usize = w.parse().map_err(|_| usage())?;
        if vdevs == 0 || width == 0 {
            return Err(usage());
        }
        let vdev = match *kind {
            "stripe" => VdevType::Stripe,
            "mirror" if width >= 2 => VdevType::Mirror { ways: width },
            "raidz" | "raidz1" if width >= 2 => VdevType::Raidz { parity: 1 },
            "raidz2" if width >= 3 => VdevType::Raidz { parity: 2 },
            "raidz3" if width >= 4 => VdevType::Raidz { parity: 3 },
            "mirror" | "raidz" | "raidz1" | "raidz2" | "raidz3" => {
                return Err(BenchError::Invalid(format!(
                    "'{s}': a {kind} vdev of {width} disks is too narrow"
                )))
            }
            _ => return Err(usage()),
        };
        // A stripe is one vdev per disk.
        let (vdevs, width) = match vdev {
            VdevType::Stripe => (vdevs * width, 1),
            _ => (vdevs, width),
        };
        Ok(Layout {
            vdev,
            width,
            vdevs,
            spares: 0,
        })
    }

    /// The layout's vdev type in the zpool grammar.
    /// This layout as an emulated build of `profile` disks (`tank bench --emulate`'s
    /// grammar): `7x hdd 1x7 raidz2 + 1x hdd spare`.
    pub fn emulate_spec(&self, profile: &str) -> String {
        let n = self.width * self.vdevs;
        let body = match self.vdev {
            VdevType::Stripe => format!("{n}x {profile}"),
            _ => format!(
                "{n}x {profile} {}x{} {}",
                self.vdevs,
                self.width,
                self.kind()
            ),
        };
        if self.spares > 0 {
            format!("{body} + {}x {profile} spare", self.spares)
        } else {
            body
        }
    }

    pub fn kind(&self) -> String {
        match self.vdev {
            VdevType::Stripe => "stripe".into(),
            VdevType::Mirror { .. } => "mirror".into(),
            VdevType::Raidz { parity } => format!("raidz{parity}"),
        }
    }
}

/// How well measured figures serve a workload (higher is better): the geometric mean of the
/// figures that matter to it, so no one figure can buy a layout its place.
/// - seq: sequential write and read;
/// - random: random seeks;
/// - mixed: sequential write and read, random seeks, tree copy in and out, tree delete.
pub fn measured_score(workload: Workload, f: &crate::fsbench::FsFigures) -> f64 {
    let picked: Vec<f64> = match workload {
        Workload::Seq => vec![f.seq_output_block_mb_s, f.seq_input_block_mb_s],
        Workload::Random => vec![f.random_seeks_per_s],
        Workload::Mixed => vec![
            f.seq_output_block_mb_s,
            f.seq_input_block_mb_s,
            f.random_seeks_per_s,
            f.tree_copy_in_mb_s,
            f.tree_copy_out_mb_s,
            f.tree_delete_files_per_s,
        ],
    };
    if picked
        .iter()
        .any(|v| v.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater))
    {
        return 0.0;
    }
    (picked.iter().map(|v| v.ln()).sum::<f64>() / picked.len() as f64).exp()
}

/// The layouts `tank plan --measure` runs when none are named: the `n` best by the model's
/// score for the workload among those with under 1 % chance of loss in 5 years, spares
/// dropped (they do not change speed), each layout once.
pub fn measure_candidates(workload: Workload, all: &[Assessment], n: usize) -> Vec<Layout> {
    let mut ranked: Vec<&Assessment> = all
        .iter()
        .filter(|a| a.loss_probability_5y < 0.01 && a.failures_tolerated >= 1)
        .collect();
    let key = |a: &Assessment| match workload {
        Workload::Seq => a.seq_write_bytes_per_s.min(a.seq_read_bytes_per_s),
        Workload::Random => a.random_read_iops,
        Workload::Mixed => {
            (a.seq_write_bytes_per_s.min(a.seq_read_bytes_per_s) * a.random_read_iops).sqrt()
        }
    };
    ranked.sort_by(|a, b| key(b).total_cmp(&key(a)));
    let mut out: Vec<Layout> = Vec::new();
    for a in ranked {
        let l = Layout {
            spares: 0,
            ..a.layout
        };
        if !out.contains(&l) {
            out.push(l);
        }
        if out.len() == n {
            break;
        }
    }
    out
}

#[derive(Debug, Clone)]
pub struct PlanInput {
    pub disks: usize,
    pub disk: DeviceProfile,
    pub recordsize: u64,
    pub ashift: u32,
    pub workload: Workload,
    /// Fraction of the pool in use, for resilver and URE estimates.
    pub fill: f64,
    pub ram: u64,
    pub ssd: Option<(usize, DeviceProfile)>,
    /// Cap of the front end (bytes/s), e.g. a gigabit link.
    pub link: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Assessment {
    pub layout: Layout,
    pub name: String,
    pub usable_bytes: u64,
    /// Usable over raw capacity of all disks (spares included).
    pub efficiency: f64,
    /// Failures every vdev survives (the pool survives this many in any placement).
    pub failures_tolerated: usize,
    /// Failures the pool may survive at best (spread over vdevs).
    pub failures_best_case: usize,
    pub mttdl_years: f64,
    pub loss_probability_5y: f64,
    /// Probability that a rebuild with no redundancy left hits an unrecoverable read error.
    pub rebuild_ure_probability: f64,
    pub resilver_hours: f64,
    pub seq_read_bytes_per_s: f64,
    pub seq_write_bytes_per_s: f64,
    pub random_read_iops: f64,
    pub random_write_iops: f64,
}

/// Every sensible layout for `disks` disks: stripes, 2- and 3-way mirrors, raidz1/2/3 at
/// widths from parity + 2 to 16 with as many vdevs as fit, the rest as spares (and variants
/// keeping one spare).
pub fn enumerate(disks: usize) -> Vec<Layout> {
    let mut out = Vec::new();
    if disks == 0 {
        return out;
    }
    out.push(Layout {
        vdev: VdevType::Stripe,
        width: 1,
        vdevs: disks,
        spares: 0,
    });
    for ways in [2usize, 3] {
        for spares in [disks % ways, disks % ways + ways] {
            if disks >= ways + spares && (disks - spares) / ways >= 1 && spares <= 2 {
                out.push(Layout {
                    vdev: VdevType::Mirror { ways },
                    width: ways,
                    vdevs: (disks - spares) / ways,
                    spares,
                });
            }
        }
    }
    for parity in 1..=3usize {
        for width in parity + 2..=16.min(disks) {
            let vdevs = disks / width;
            let rest = disks - vdevs * width;
            if vdevs == 0 || rest > 2 {
                continue;
            }
            out.push(Layout {
                vdev: VdevType::Raidz { parity },
                width,
                vdevs,
                spares: rest,
            });
            if rest == 0 && vdevs * width > width {
                // The same width with one vdev fewer leaves room for spares only when the
                // width is small; skip: spares come from the remainder.
            }
        }
    }
    out.sort_by_key(|l| (l.describe(),));
    out.dedup();
    out
}

/// Bytes a record of `recordsize` takes on one vdev of this layout (exact RAID-Z rule).
pub fn record_asize(layout: &Layout, recordsize: u64, ashift: u32) -> Result<u64, BenchError> {
    let sector = 1u64 << ashift;
    let rounded = recordsize.div_ceil(sector) * sector;
    Ok(match layout.vdev {
        VdevType::Stripe => rounded,
        VdevType::Mirror { ways } => rounded * ways as u64,
        VdevType::Raidz { parity } => RaidzGeometry::new(layout.width, parity, ashift)
            .map_err(|e| BenchError::Invalid(e.to_string()))?
            .asize(rounded),
    })
}

/// Mean time to data loss of one group (hours), disk failures only.
pub fn mttdl_group_hours(n: usize, parity: usize, mttf: f64, mttr: f64) -> f64 {
    let mut denom = 1.0;
    for k in 0..=parity {
        denom *= (n - k) as f64;
    }
    mttf.powi(parity as i32 + 1) / (denom * mttr.powi(parity as i32))
}

/// Rate (per hour) at which a group of n disks with p parity reaches "no redundancy left".
fn exposed_rate(n: usize, parity: usize, mttf: f64, mttr: f64) -> f64 {
    let mut num = 1.0;
    for k in 0..parity {
        num *= (n - k) as f64;
    }
    num * mttr.powi(parity as i32 - 1) / mttf.powi(parity as i32)
}

pub fn assess(input: &PlanInput, layout: &Layout) -> Result<Assessment, BenchError> {
    let d = &input.disk;
    let sector = 1u64 << input.ashift;
    let disk_usable = d.capacity.saturating_sub(LABEL_OVERHEAD) / sector * sector;
    let per_vdev_raw = disk_usable as f64 * layout.width as f64;
    let rounded = input.recordsize.div_ceil(sector) * sector;
    let asize = record_asize(layout, input.recordsize, input.ashift)?;
    let vdev_efficiency = match layout.vdev {
        // A stripe "vdev" is one disk; efficiency 1.
        VdevType::Stripe => 1.0,
        _ => rounded as f64 / asize as f64,
    };
    let usable = per_vdev_raw * vdev_efficiency * layout.vdevs as f64 * (1.0 - 1.0 / 32.0);
    let raw_all = d.capacity as f64 * layout.disks() as f64;

    let n = layout.width;
    let p = layout.redundancy();
    let data_per_disk = disk_usable as f64 * input.fill;
    let rebuild_bw = d.read_bw.min(d.write_bw);
    let resilver_hours = data_per_disk / rebuild_bw / 3600.0;
    // With a hot spare the repair starts at once; without, allow a day to get a disk.
    let mttr = resilver_hours + if layout.spares > 0 { 0.0 } else { 24.0 };
    let (mttdl_hours, p_ure) = match layout.vdev {
        VdevType::Stripe => {
            let rate = layout.vdevs as f64 / d.mttf_hours;
            (1.0 / rate, 0.0)
        }
        _ => {
            let group = mttdl_group_hours(n, p, d.mttf_hours, mttr);
            // Bits read to rebuild with no redundancy left: the data of the other disks that
            // still hold it (n - p of them for RAID-Z: the data columns; 1 side for a mirror).
            let readers = match layout.vdev {
                VdevType::Mirror { .. } => 1.0,
                _ => (n - p) as f64,
            };
            let bits = readers * data_per_disk * 8.0;
            let p_ure = 1.0 - (-bits * d.ure_per_bit).exp();
            let ure_rate = exposed_rate(n, p, d.mttf_hours, mttr) * p_ure;
            let group_rate = 1.0 / group + ure_rate;
            (1.0 / (group_rate * layout.vdevs as f64), p_ure)
        }
    };
    let mttdl_years = mttdl_hours / HOURS_PER_YEAR;
    let loss_5y = 1.0 - (-5.0 / mttdl_years).exp();

    let data_disks = (layout.data_disks_per_vdev() * layout.vdevs) as f64;
    let (mut seq_read, mut seq_write) = match layout.vdev {
        VdevType::Mirror { ways } => (
            layout.vdevs as f64 * ways as f64 * d.read_bw,
            layout.vdevs as f64 * d.write_bw,
        ),
        _ => (data_disks * d.read_bw, data_disks * d.write_bw),
    };
    // RAID-Z padding costs streaming bandwidth too.
    if let VdevType::Raidz { parity } = layout.vdev {
        let ideal = (n - parity) as f64 / n as f64;
        let actual = rounded as f64 / asize as f64;
        seq_write *= actual / ideal;
        seq_read *= actual / ideal;
    }
    if let Some(link) = input.link {
        seq_read = seq_read.min(link);
        seq_write = seq_write.min(link);
    }
    let rec = input.recordsize;
    let (rr, rw) = match layout.vdev {
        VdevType::Stripe => (
            layout.vdevs as f64 * d.random_read_iops(rec),
            layout.vdevs as f64 * d.random_write_iops(rec),
        ),
        VdevType::Mirror { ways } => (
            layout.vdevs as f64 * ways as f64 * d.random_read_iops(rec),
            layout.vdevs as f64 * d.random_write_iops(rec),
        ),
        VdevType::Raidz { parity } => {
            let col = rec.div_ceil((n - parity) as u64);
            (
                layout.vdevs as f64 * d.random_read_iops(col),
                layout.vdevs as f64 * d.random_write_iops(col),
            )
        }
    };
    Ok(Assessment {
        layout: *layout,
        name: layout.describe(),
        usable_bytes: usable as u64,
        efficiency: usable / raw_all,
        failures_tolerated: p,
        failures_best_case: p * layout.vdevs + layout.spares.min(p * layout.vdevs),
        mttdl_years,
        loss_probability_5y: loss_5y,
        rebuild_ure_probability: p_ure,
        resilver_hours,
        seq_read_bytes_per_s: seq_read,
        seq_write_bytes_per_s: seq_write,
        random_read_iops: rr,
        random_write_iops: rw,
    })
}

/// Picks the layout for the workload among those whose chance of losing data within five
/// years is under 1 % (else the safest one): most capacity for streams, most random-read IOPS
/// for random work, the best capacity x IOPS balance for mixed work.
pub fn recommend(workload: Workload, all: &[Assessment]) -> Option<(usize, String)> {
    let safe: Vec<usize> = (0..all.len())
        .filter(|&i| all[i].loss_probability_5y < 0.01 && all[i].failures_tolerated >= 1)
        .collect();
    if safe.is_empty() {
        let i =
            (0..all.len()).max_by(|&a, &b| all[a].mttdl_years.total_cmp(&all[b].mttdl_years))?;
        return Some((
            i,
            "no layout keeps the 5-year loss probability under 1 %: the most reliable one".into(),
        ));
    }
    let max_cap = safe.iter().map(|&i| all[i].usable_bytes).max().unwrap_or(1) as f64;
    let max_iops = safe
        .iter()
        .map(|&i| all[i].random_read_iops)
        .fold(1.0, f64::max);
    let score = |i: usize| -> f64 {
        let a = &all[i];
        let cap = a.usable_bytes as f64 / max_cap;
        let iops = a.random_read_iops / max_iops;
        let base = match workload {
            Workload::Seq => cap + 0.01 * iops,
            Workload::Random => iops + 0.01 * cap,
            Workload::Mixed => cap * iops.sqrt(),
        };
        // Prefer more redundancy on ties (within 2 %).
        base * (1.0 + 0.02 * a.failures_tolerated as f64)
    };
    let best = safe
        .iter()
        .copied()
        .max_by(|&a, &b| score(a).total_cmp(&score(b)))?;
    let why = match workload {
        Workload::Seq => "most usable capacity (streams scale with data disks) among layouts with under 1 % chance of data loss in 5 years",
        Workload::Random => "most random-read IOPS (every mirror side serves reads) among layouts with under 1 % chance of data loss in 5 years",
        Workload::Mixed => "best balance of capacity and random IOPS among layouts with under 1 % chance of data loss in 5 years",
    };
    Some((best, why.into()))
}

#[derive(Debug, Clone, Serialize)]
pub struct CacheAdvice {
    pub l2arc_bytes: u64,
    pub l2arc_header_ram_bytes: u64,
    /// The largest L2ARC whose headers take at most 1/10 of RAM.
    pub l2arc_max_for_ram: u64,
    pub slog_bytes: u64,
    pub slog_reason: String,
}

/// Sizes an L2ARC against RAM and a SLOG against the write rate (a few txgs of dirty data).
pub fn cache_advice(input: &PlanInput, best: &Assessment) -> Option<CacheAdvice> {
    let (count, ssd) = input.ssd.as_ref()?;
    let l2arc = ssd.capacity * *count as u64;
    let blocks = l2arc / input.recordsize.max(512);
    let header = blocks * L2ARC_HEADER_BYTES;
    let max_for_ram = input.ram / 10 / L2ARC_HEADER_BYTES * input.recordsize;
    // ZFS: dirty data at most 10 % of RAM (capped at 4 GiB), a txg every 5 s, and the log
    // must hold what can arrive before the txgs that carry it commit: three of them.
    let dirty_max = (input.ram / 10).min(4 << 30);
    let per_txg = (best.seq_write_bytes_per_s * 5.0) as u64;
    let slog = 3 * per_txg.min(dirty_max);
    Some(CacheAdvice {
        l2arc_bytes: l2arc,
        l2arc_header_ram_bytes: header,
        l2arc_max_for_ram: max_for_ram,
        slog_bytes: slog,
        slog_reason: format!(
            "3 txgs of min(5 s of writes at {:.0} MB/s, dirty limit {:.1} GiB)",
            best.seq_write_bytes_per_s / 1e6,
            dirty_max as f64 / (1u64 << 30) as f64
        ),
    })
}

pub fn validate_input(input: &PlanInput) -> Result<(), BenchError> {
    input.disk.validate()?;
    if input.disks == 0 || input.disks > 1000 {
        return Err(BenchError::Invalid(format!(
            "{} disks: give 1 to 1000",
            input.disks
        )));
    }
    if !(9..=16).contains(&input.ashift) {
        return Err(BenchError::Invalid(format!(
            "ashift {} is out of range (9 to 16)",
            input.ashift
        )));
    }
    if !input.recordsize.is_power_of_two() || !(512..=16 << 20).contains(&input.recordsize) {
        return Err(BenchError::Invalid(
            "recordsize must be a power of two from 512 to 16M".into(),
        ));
    }
    if !(0.0..=1.0).contains(&input.fill) {
        return Err(BenchError::Invalid("fill must be between 0 and 1".into()));
    }
    if let Some((n, ssd)) = &input.ssd {
        ssd.validate()?;
        if *n == 0 {
            return Err(BenchError::Invalid(
                "--ssd needs at least one device".into(),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_layout_is_an_emulated_build_of_its_disks() {
        for disks in 1..=12 {
            for l in enumerate(disks) {
                let spec = l.emulate_spec("hdd:cap=1000000000000");
                let b = crate::emulate::EmulatedBuild::parse(&spec)
                    .unwrap_or_else(|e| panic!("{}: '{spec}': {e}", l.describe()));
                assert_eq!(b.count, l.width * l.vdevs, "{spec}");
                assert_eq!(b.layout, l.kind(), "{spec}");
                assert_eq!(b.profile.capacity, 1_000_000_000_000, "{spec}");
                if !matches!(l.vdev, VdevType::Stripe) {
                    assert_eq!(b.width, l.width, "{spec}");
                }
                let spares: usize = b.extra.iter().map(|(_, n, _)| n).sum();
                assert_eq!(spares, l.spares, "{spec}");
            }
        }
    }

    #[test]
    fn layouts_parse_as_plan_names_them() {
        let l = Layout::parse("3x8 raidz2").unwrap();
        assert_eq!(l.describe(), "3 x raidz2 of 8");
        assert_eq!(l.disks(), 24);
        assert_eq!(
            Layout::parse("12x2 mirror").unwrap().describe(),
            "12 x 2-way mirror"
        );
        let s = Layout::parse("7x1 stripe").unwrap();
        assert_eq!(
            (s.describe(), s.kind()),
            ("stripe of 7".to_string(), "stripe".to_string())
        );
        assert!(enumerate(7).contains(&s));
        assert!(enumerate(24).contains(&Layout::parse("4x6 raidz2").unwrap()));
        for bad in [
            "3x8",
            "raidz2",
            "0x8 raidz2",
            "3x2 raidz2",
            "1x1 mirror",
            "3x8 raid6",
            "ax8 raidz2",
        ] {
            assert!(Layout::parse(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn measured_results_rank_by_the_figures_the_workload_needs() {
        use crate::fsbench::FsFigures;
        let streams = FsFigures {
            seq_output_block_mb_s: 800.0,
            seq_input_block_mb_s: 900.0,
            random_seeks_per_s: 100.0,
            tree_copy_in_mb_s: 50.0,
            tree_copy_out_mb_s: 60.0,
            tree_delete_files_per_s: 1000.0,
            ..Default::default()
        };
        let seeks = FsFigures {
            seq_output_block_mb_s: 400.0,
            seq_input_block_mb_s: 450.0,
            random_seeks_per_s: 800.0,
            tree_copy_in_mb_s: 50.0,
            tree_copy_out_mb_s: 60.0,
            tree_delete_files_per_s: 1000.0,
            ..Default::default()
        };
        let score = |w, f: &FsFigures| measured_score(w, f);
        assert!(score(Workload::Seq, &streams) > score(Workload::Seq, &seeks));
        assert!(score(Workload::Random, &seeks) > score(Workload::Random, &streams));
        // Mixed: half the streams for eight times the seeks wins.
        assert!(score(Workload::Mixed, &seeks) > score(Workload::Mixed, &streams));
        // The geometric mean of 800 and 900.
        assert!((score(Workload::Seq, &streams) - (800.0f64 * 900.0).sqrt()).abs() < 1e-9);
        // A phase that failed to measure (0) scores nothing.
        let broken = FsFigures {
            tree_copy_in_mb_s: 0.0,
            ..seeks
        };
        assert_eq!(score(Workload::Mixed, &broken), 0.0);
    }

    #[test]
    fn measure_candidates_are_safe_distinct_and_without_spares() {
        let inp = input(24);
        let all: Vec<Assessment> = enumerate(24)
            .iter()
            .map(|l| assess(&inp, l).unwrap())
            .collect();
        for w in [Workload::Seq, Workload::Random, Workload::Mixed] {
            let c = measure_candidates(w, &all, 4);
            assert_eq!(c.len(), 4);
            for (i, l) in c.iter().enumerate() {
                assert_eq!(l.spares, 0);
                assert!(l.redundancy() >= 1, "{}", l.describe());
                assert!(!c[..i].contains(l));
            }
        }
        // Random work: mirrors first (every side serves reads).
        let r = measure_candidates(Workload::Random, &all, 1);
        assert!(matches!(r[0].vdev, VdevType::Mirror { .. }), "{:?}", r[0]);
    }

    fn input(disks: usize) -> PlanInput {
        PlanInput {
            disks,
            disk: DeviceProfile::hdd(),
            recordsize: 128 << 10,
            ashift: 12,
            workload: Workload::Seq,
            fill: 0.5,
            ram: 32 << 30,
            ssd: None,
            link: None,
        }
    }

    fn raidz(parity: usize, width: usize) -> Layout {
        Layout {
            vdev: VdevType::Raidz { parity },
            width,
            vdevs: 1,
            spares: 0,
        }
    }

    #[test]
    fn raidz_allocation_by_hand() {
        // raidz2 of 7, ashift 12, 128K: 32 data sectors, 7 rows x 2 parity = 46, padded to
        // a multiple of 3 = 48 sectors (192 KiB): efficiency 2/3, not 5/7.
        assert_eq!(
            record_asize(&raidz(2, 7), 128 << 10, 12).unwrap(),
            48 * 4096
        );
        // Same at ashift 9: 256 sectors, 52 rows x 2 = 104, total 360 (multiple of 3).
        assert_eq!(record_asize(&raidz(2, 7), 128 << 10, 9).unwrap(), 360 * 512);
        // raidz1 of 5, 4K at ashift 12: 1 data + 1 parity = 2 sectors.
        assert_eq!(record_asize(&raidz(1, 5), 4096, 12).unwrap(), 8192);
        // raidz3 of 7, 8K at ashift 12: 2 data + 3 parity = 5, padded to 8 sectors.
        assert_eq!(record_asize(&raidz(3, 7), 8192, 12).unwrap(), 32768);
        // A 512-byte record at ashift 12 still takes a whole sector per column.
        assert_eq!(record_asize(&raidz(1, 3), 512, 12).unwrap(), 8192);
        let m = Layout {
            vdev: VdevType::Mirror { ways: 2 },
            width: 2,
            vdevs: 1,
            spares: 0,
        };
        assert_eq!(record_asize(&m, 128 << 10, 12).unwrap(), 256 << 10);
    }

    #[test]
    fn capacity_follows_the_padding() {
        let a = assess(&input(7), &raidz(2, 7)).unwrap();
        let disk_usable = (4_000_000_000_000u64 - LABEL_OVERHEAD) / 4096 * 4096;
        let expect = disk_usable as f64 * 7.0 * (2.0 / 3.0) * (31.0 / 32.0);
        assert!(
            (a.usable_bytes as f64 - expect).abs() < 1e6,
            "{} vs {expect}",
            a.usable_bytes
        );
        // With 1M records the padding nearly vanishes: closer to 5/7.
        let mut big = input(7);
        big.recordsize = 1 << 20;
        let b = assess(&big, &raidz(2, 7)).unwrap();
        assert!(b.usable_bytes > a.usable_bytes);
    }

    #[test]
    fn mttdl_matches_the_published_formulas() {
        // RAID 5 of n disks: MTTF^2 / (n (n-1) MTTR) (Patterson, Gibson, Katz 1988).
        let (mttf, mttr) = (1e6, 24.0);
        let r5 = mttdl_group_hours(8, 1, mttf, mttr);
        assert!((r5 - mttf * mttf / (8.0 * 7.0 * mttr)).abs() / r5 < 1e-12);
        // RAID 6: MTTF^3 / (n (n-1) (n-2) MTTR^2).
        let r6 = mttdl_group_hours(8, 2, mttf, mttr);
        assert!((r6 - mttf.powi(3) / (8.0 * 7.0 * 6.0 * mttr * mttr)).abs() / r6 < 1e-12);
        // Mirror of 2: MTTF^2 / (2 MTTR).
        let m2 = mttdl_group_hours(2, 1, mttf, mttr);
        assert!((m2 - mttf * mttf / (2.0 * mttr)).abs() / m2 < 1e-12);
    }

    #[test]
    fn the_raid5_rebuild_problem_shows() {
        // 7 x 4 TB single parity, half full: reading 6 x 2 TB = 96 Tbit at 1e-14 per bit
        // hits a URE with probability 1 - e^-0.96 = 62 %.
        let a = assess(&input(7), &raidz(1, 7)).unwrap();
        let bits = 6.0 * ((4_000_000_000_000u64 - LABEL_OVERHEAD) / 4096 * 4096) as f64 * 0.5 * 8.0;
        assert!((a.rebuild_ure_probability - (1.0 - (-bits * 1e-14).exp())).abs() < 1e-9);
        assert!(a.rebuild_ure_probability > 0.5);
        let b = assess(&input(7), &raidz(2, 7)).unwrap();
        assert!(
            b.mttdl_years > 100.0 * a.mttdl_years,
            "raidz2 {} vs raidz1 {}",
            b.mttdl_years,
            a.mttdl_years
        );
        assert!(a.loss_probability_5y > b.loss_probability_5y);
    }

    #[test]
    fn enumeration_and_recommendations() {
        let all: Vec<Assessment> = enumerate(12)
            .iter()
            .map(|l| assess(&input(12), l).unwrap())
            .collect();
        let names: Vec<&str> = all.iter().map(|a| a.name.as_str()).collect();
        for want in [
            "6 x 2-way mirror",
            "2 x raidz2 of 6",
            "1 x raidz2 of 12",
            "4 x raidz1 of 3",
            "stripe of 12",
        ] {
            assert!(names.contains(&want), "{want} missing from {names:?}");
        }
        assert!(all.iter().all(|a| a.layout.disks() == 12));
        let (seq, _) = recommend(Workload::Seq, &all).unwrap();
        let (rnd, _) = recommend(Workload::Random, &all).unwrap();
        assert!(
            matches!(all[rnd].layout.vdev, VdevType::Mirror { .. }),
            "random work: mirrors ({})",
            all[rnd].name
        );
        assert!(
            matches!(all[seq].layout.vdev, VdevType::Raidz { .. }),
            "streams: raidz ({})",
            all[seq].name
        );
        assert!(all[seq].loss_probability_5y < 0.01);
        assert_eq!(
            all.iter()
                .find(|a| a.name == "stripe of 12")
                .unwrap()
                .failures_tolerated,
            0
        );
    }

    #[test]
    fn cache_sizing() {
        let mut i = input(7);
        i.ssd = Some((1, DeviceProfile::ssd()));
        let a = assess(&i, &raidz(2, 7)).unwrap();
        let c = cache_advice(&i, &a).unwrap();
        // 512 GB / 128 KiB = 3.9 M blocks x 96 B = 375 MB of RAM.
        assert_eq!(c.l2arc_header_ram_bytes, 512_000_000_000 / 131072 * 96);
        assert!(c.slog_bytes > 0 && c.slog_bytes <= 3 * (4u64 << 30));
    }

    #[test]
    fn bad_input_is_refused() {
        let mut i = input(0);
        assert!(validate_input(&i).is_err());
        i.disks = 7;
        i.recordsize = 3000;
        assert!(validate_input(&i).is_err());
        i.recordsize = 4096;
        i.ashift = 17;
        assert!(validate_input(&i).is_err());
        assert!(Workload::parse("bursty").is_err());
    }
}
