//! `tank plan`: which layout for these disks? See `crate::plan` for the models.
//!
//! `--measure` then runs `tank bench`'s phases on emulated builds of the candidate layouts
//! (the disks' profile, capacity scaled down) at each record size asked, one new pool per
//! measurement, and ranks them by the figures the workload needs
//! (`crate::plan::measured_score`): the record size x layout sensitivity analysis of
//! the reference builds, in minutes instead of days.

use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use crate::emulate::EmulatedBuild;
use crate::fsbench::{summarize, FsBenchConfig, FsFigures};
use crate::link::{Link, LinkProfile};
use crate::plan::{
    assess, cache_advice, enumerate, measure_candidates, measured_score, recommend, validate_input,
};
use crate::profile::parse_quantity;
use crate::{Assessment, DeviceProfile, Layout, PlanInput, VdevType, Workload};
use anyhow::{bail, Context, Result};
use clap::Args;
use comfy_table::{presets, Table};

use crate::run::util::{data_dir, human, parse_recordsize, parse_size, DATASET_MAX_RECORD};

#[derive(Args)]
pub struct PlanArgs {
    /// Disks as COUNTxSIZE, e.g. 7x4TB (sizes in vendor units: 1 TB = 10^12 bytes).
    #[arg(long)]
    disks: String,
    /// Device profile: hdd, ssd, nvme, optionally with overrides (hdd:bw=200M,seek=9ms).
    #[arg(long, default_value = "hdd")]
    disk_type: String,
    /// SSDs for L2ARC and SLOG, as COUNTxSIZE.
    #[arg(long)]
    ssd: Option<String>,
    /// RAM of the machine (binary units: 32GB = 32 GiB).
    #[arg(long, default_value = "32GB")]
    ram: String,
    #[arg(long, default_value = "128K")]
    recordsize: String,
    #[arg(long, default_value_t = 12)]
    ashift: u32,
    /// seq, random or mixed.
    #[arg(long, default_value = "mixed")]
    workload: String,
    /// Fraction of the pool in use, for resilver and rebuild-error estimates.
    #[arg(long, default_value_t = 0.5)]
    fill: f64,
    /// Cap streaming figures at a network link: 1gbe, 10gbe, 25gbe.
    #[arg(long)]
    link: Option<String>,
    /// Measure the candidates on emulated builds and rank them by the results (needs FUSE).
    #[arg(long)]
    measure: bool,
    /// With --measure: the layouts to measure, e.g. "2x12 raidz2,3x8 raidz2,12x2 mirror"
    /// (default: the best few by the model).
    #[arg(long)]
    layouts: Option<String>,
    /// With --measure and no --layouts: how many of the model's best layouts to measure.
    #[arg(long, default_value_t = 4)]
    candidates: usize,
    /// With --measure: record sizes to try (default: --recordsize and 1M).
    #[arg(long)]
    recordsizes: Option<String>,
    /// With --measure: bytes of the stream phases per measurement (default 4x --arc).
    #[arg(long)]
    size: Option<String>,
    /// With --measure: the ARC of the emulated builds.
    #[arg(long, default_value = "64M")]
    arc: String,
    /// With --measure: the bench filesystems' primarycache (all, metadata, none; the
    /// reference build on 24 SSDs measured with none).
    #[arg(long, default_value = "all")]
    primarycache: String,
    /// With --measure: files of the small-file and tree phases.
    #[arg(long, default_value_t = 2000)]
    files: usize,
    #[arg(long, default_value_t = 500)]
    tree_files: usize,
    /// With --measure: runs per measurement (medians).
    #[arg(long, default_value_t = 1)]
    runs: usize,
    #[arg(long)]
    json: bool,
}

/// Parses COUNTxSIZE with a decimal size (`7x4TB`, `1x512GB`).
fn count_size(s: &str) -> Result<(usize, u64)> {
    let (n, size) = s
        .split_once(['x', 'X'])
        .ok_or_else(|| anyhow::anyhow!("'{s}' is not COUNTxSIZE (e.g. 7x4TB)"))?;
    let n: usize = n
        .trim()
        .parse()
        .map_err(|_| anyhow::anyhow!("'{n}' is not a number of disks"))?;
    let size_s = size.trim().trim_end_matches(['B', 'b']);
    let bytes = parse_quantity(size_s)
        .filter(|v| *v > 0.0)
        .ok_or_else(|| anyhow::anyhow!("'{size}' is not a size (e.g. 4TB, 512GB)"))?;
    Ok((n, bytes as u64))
}

pub fn run(a: PlanArgs) -> Result<()> {
    let (disks, size) = count_size(&a.disks)?;
    let mut disk = DeviceProfile::parse(&a.disk_type)?;
    disk.capacity = size;
    let ssd = match &a.ssd {
        Some(s) => {
            let (n, size) = count_size(s)?;
            let mut p = DeviceProfile::ssd();
            p.capacity = size;
            Some((n, p))
        }
        None => None,
    };
    let input = PlanInput {
        disks,
        disk,
        recordsize: parse_size(&a.recordsize)?,
        ashift: a.ashift,
        workload: Workload::parse(&a.workload)?,
        fill: a.fill,
        ram: parse_size(&a.ram)?,
        ssd,
        link: a
            .link
            .as_deref()
            .map(crate::profile::link_bandwidth)
            .transpose()?,
    };
    validate_input(&input)?;
    let layouts = enumerate(disks);
    if layouts.is_empty() {
        bail!("no layout fits {disks} disks");
    }
    let mut all = layouts
        .iter()
        .map(|l| assess(&input, l))
        .collect::<Result<Vec<_>, _>>()?;
    all.sort_by_key(|x| std::cmp::Reverse(x.usable_bytes));
    let (best, why) = recommend(input.workload, &all).expect("at least one layout");
    let cache = cache_advice(&input, &all[best]);
    if a.measure {
        return measure(&a, &input, &all, &all[best].name);
    }
    if a.layouts.is_some() || a.recordsizes.is_some() {
        bail!("--layouts and --recordsizes choose what --measure runs: add --measure");
    }
    if a.json {
        let out = serde_json::json!({
            "input": {
                "disks": disks, "disk_profile": input.disk, "recordsize": input.recordsize,
                "ashift": input.ashift, "workload": input.workload, "fill": input.fill, "ram": input.ram,
            },
            "layouts": all,
            "recommended": all[best].name,
            "reason": why,
            "cache": cache,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "{disks} x {} {} ({:.0} MB/s, {} random IOPS at {}), recordsize {}, ashift {}, {:.0} % full",
        human_dec(size),
        input.disk.name,
        input.disk.read_bw / 1e6,
        input.disk.random_read_iops(input.recordsize).round(),
        human(input.recordsize),
        human(input.recordsize),
        input.ashift,
        input.fill * 100.0
    );
    let mut t = Table::new();
    t.load_style(presets::NOTHING);
    t.set_header([
        "LAYOUT",
        "USABLE",
        "EFF",
        "SURVIVES",
        "MTTDL",
        "LOSS 5Y",
        "RESILVER",
        "SEQ READ",
        "SEQ WRITE",
        "RAND R IOPS",
        "RAND W IOPS",
    ]);
    for (i, x) in all.iter().enumerate() {
        t.add_row(vec![
            format!("{}{}", if i == best { "* " } else { "  " }, x.name),
            human_dec(x.usable_bytes),
            format!("{:.0}%", x.efficiency * 100.0),
            if x.failures_best_case > x.failures_tolerated {
                format!("{} (up to {})", x.failures_tolerated, x.failures_best_case)
            } else {
                x.failures_tolerated.to_string()
            },
            years(x.mttdl_years),
            format!("{:.2}%", x.loss_probability_5y * 100.0),
            format!("{:.1} h", x.resilver_hours),
            format!("{:.0} MB/s", x.seq_read_bytes_per_s / 1e6),
            format!("{:.0} MB/s", x.seq_write_bytes_per_s / 1e6),
            format!("{:.0}", x.random_read_iops),
            format!("{:.0}", x.random_write_iops),
        ]);
    }
    println!("{t}\n");
    println!(
        "recommended for {} work: {} — {why}",
        a.workload, all[best].name
    );
    if let Some(c) = cache {
        println!(
            "L2ARC: {} of cache costs {} of RAM for headers at recordsize {} (RAM allows up to {}); SLOG: {} is enough ({})",
            human_dec(c.l2arc_bytes),
            human(c.l2arc_header_ram_bytes),
            human(input.recordsize),
            human_dec(c.l2arc_max_for_ram),
            human_dec(c.slog_bytes),
            c.slog_reason
        );
    }
    println!("\nmodels: docs/PLAN.md. Estimates, not measurements: `tank bench` and `tank bench-engine` measure.");
    Ok(())
}

/// One measured candidate.
#[derive(serde::Serialize)]
struct Measured {
    layout: String,
    recordsize: u64,
    median: FsFigures,
    score: f64,
}

/// `tank plan --measure`: the emulated benchmark over layouts x record sizes, ranked.
fn measure(a: &PlanArgs, input: &PlanInput, all: &[Assessment], modelled: &str) -> Result<()> {
    let layouts: Vec<Layout> = match &a.layouts {
        Some(list) => list
            .split(',')
            .map(|l| Layout::parse(l.trim()))
            .collect::<Result<_, _>>()?,
        None => measure_candidates(input.workload, all, a.candidates.max(1)),
    };
    for l in &layouts {
        if l.disks() > input.disks {
            bail!(
                "{} needs {} disks, --disks gives {}",
                l.describe(),
                l.disks(),
                input.disks
            );
        }
    }
    let recordsizes: Vec<u64> = match &a.recordsizes {
        Some(list) => list
            .split(',')
            .map(|r| parse_recordsize(r.trim(), DATASET_MAX_RECORD).map(u64::from))
            .collect::<Result<_>>()?,
        None if input.recordsize == DATASET_MAX_RECORD => vec![input.recordsize],
        None => vec![
            u64::from(parse_recordsize(&a.recordsize, DATASET_MAX_RECORD)?),
            DATASET_MAX_RECORD,
        ],
    };
    let arc = parse_size(&a.arc)?;
    crate::run::emulated::set_arc(arc)?;
    crate::run::emulated::clean_up_on_signal();
    let size = match &a.size {
        Some(s) => parse_size(s)?,
        None => 4 * arc,
    };
    let link = match &a.link {
        Some(l) => Some(Arc::new(Link::new(LinkProfile::parse(l)?))),
        None => None,
    };
    if a.runs == 0 {
        bail!("--runs must be at least 1");
    }
    let total = layouts.len() * recordsizes.len();
    let start = Instant::now();
    let mut results = Vec::new();
    let mut last_len = 0;
    for (li, layout) in layouts.iter().enumerate() {
        let build = EmulatedBuild {
            count: layout.width * layout.vdevs,
            profile: input.disk.clone(),
            layout: layout.kind(),
            width: if matches!(layout.vdev, VdevType::Stripe) {
                layout.vdevs
            } else {
                layout.width
            },
            extra: Vec::new(),
        };
        for (ri, &recordsize) in recordsizes.iter().enumerate() {
            let k = li * recordsizes.len() + ri;
            let cfg = FsBenchConfig {
                size,
                recordsize: recordsize as usize,
                jobs: 1,
                runs: a.runs,
                sync: false,
                files: a.files,
                seeks: 2000,
                tree_files: a.tree_files,
                link: link.clone(),
                staging: None,
                meter: Default::default(),
            };
            let what = format!("{} at {}", layout.describe(), human(recordsize));
            let mut progress = |phase: &str, done: f64| {
                let overall = (k as f64 + done) / total as f64;
                let el = start.elapsed().as_secs_f64();
                let eta = if overall > 0.01 {
                    format!("  ETA {:.0} s", (el / overall - el).max(0.0))
                } else {
                    String::new()
                };
                let line = format!(
                    "[{}/{total}] {what}: {phase}  {:.0} %  elapsed {el:.0} s{eta}",
                    k + 1,
                    overall * 100.0
                );
                eprint!("\r{line:<last_len$}");
                last_len = line.len();
                let _ = std::io::stderr().flush();
            };
            let runs = crate::run::emulated::fs_runs(
                &data_dir(),
                &build,
                &cfg,
                &a.primarycache,
                &mut progress,
            )
            .with_context(|| format!("measuring {what}"))?
            .0;
            let median = summarize(&runs).median;
            results.push(Measured {
                layout: layout.describe(),
                recordsize,
                median,
                score: measured_score(input.workload, &median),
            });
        }
    }
    eprintln!();
    results.sort_by(|x, y| y.score.total_cmp(&x.score));
    if a.json {
        let out = serde_json::json!({
            "workload": input.workload, "size": size, "arc": arc, "link": a.link,
            "disk_profile": input.disk, "runs": a.runs,
            "modelled_recommendation": modelled, "measured": results,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "measured on emulated {} disks ({}), {} per stream phase, ARC {}, {}{} run(s) each, ranked for {} work:",
        input.disk.name,
        human_dec(input.disk.capacity),
        human(size),
        human(arc),
        a.link.as_deref().map(|l| format!("behind {l}, ")).unwrap_or_default(),
        a.runs,
        a.workload
    );
    let mut t = Table::new();
    t.load_style(presets::NOTHING);
    t.set_header([
        "LAYOUT",
        "RECORD",
        "WRITE MB/s",
        "READ MB/s",
        "SEEKS/s",
        "TREE IN",
        "TREE OUT",
        "DELETE/s",
        "SCORE",
    ]);
    for (i, m) in results.iter().enumerate() {
        let f = &m.median;
        t.add_row(vec![
            format!("{}{}", if i == 0 { "* " } else { "  " }, m.layout),
            human(m.recordsize),
            format!("{:.0}", f.seq_output_block_mb_s),
            format!("{:.0}", f.seq_input_block_mb_s),
            format!("{:.0}", f.random_seeks_per_s),
            format!("{:.1}", f.tree_copy_in_mb_s),
            format!("{:.1}", f.tree_copy_out_mb_s),
            format!("{:.0}", f.tree_delete_files_per_s),
            format!("{:.1}", m.score),
        ]);
    }
    println!("{t}\n");
    let best = &results[0];
    println!(
        "measured best for {} work: {} at recordsize {} (the model recommends {})",
        a.workload,
        best.layout,
        human(best.recordsize),
        modelled
    );
    println!("score: geometric mean of the figures the workload needs (docs/PLAN.md)");
    Ok(())
}

fn human_dec(bytes: u64) -> String {
    let v = bytes as f64;
    if v >= 1e12 {
        format!("{:.1} TB", v / 1e12)
    } else if v >= 1e9 {
        format!("{:.1} GB", v / 1e9)
    } else {
        format!("{:.0} MB", v / 1e6)
    }
}

fn years(y: f64) -> String {
    if y >= 1e6 {
        format!("{:.1e} y", y)
    } else {
        format!("{y:.0} y")
    }
}

/// The planner of the service's `layout_plan` request (the console's pool wizard and
/// planner page): the same model and defaults as `tank plan`.
pub struct ServicePlanner;

impl tank_service::service::Planner for ServicePlanner {
    fn plan(&self, q: &tank_service::service::PlanQuery) -> Result<serde_json::Value, String> {
        plan_query(q).map_err(|e| format!("{e:#}"))
    }
}

fn plan_query(q: &tank_service::service::PlanQuery) -> Result<serde_json::Value> {
    if q.disk_bytes == 0 {
        bail!("give the disks' size (disk_bytes)");
    }
    let mut disk = DeviceProfile::parse(&q.disk_type)?;
    disk.capacity = q.disk_bytes;
    let input = PlanInput {
        disks: q.disks,
        disk,
        recordsize: 128 << 10,
        ashift: 12,
        workload: Workload::parse(&q.workload)?,
        fill: 0.5,
        ram: 32 << 30,
        ssd: None,
        link: None,
    };
    // The model's checks are for real disks (and emulated builds of them); devices made
    // of small files are assessed all the same, at their own size.
    let mut checked = input.clone();
    checked.disk.capacity = checked.disk.capacity.max(1 << 30);
    validate_input(&checked)?;
    let layouts = match &q.layout {
        Some(l) => {
            let l = Layout::parse(l)?;
            if l.disks() != q.disks {
                bail!(
                    "{} takes {} disks, not {}",
                    l.describe(),
                    l.disks(),
                    q.disks
                );
            }
            vec![l]
        }
        None => enumerate(q.disks),
    };
    if layouts.is_empty() {
        bail!("no layout fits {} disks", q.disks);
    }
    let mut all = layouts
        .iter()
        .map(|l| assess(&input, l))
        .collect::<Result<Vec<_>, _>>()?;
    all.sort_by_key(|x| std::cmp::Reverse(x.usable_bytes));
    let (best, why) = recommend(input.workload, &all).unwrap_or((0, String::new()));
    let warnings = match &q.layout {
        Some(_) => layout_warnings(&input, &all[0].layout)?,
        None => Vec::new(),
    };
    // Each layout also as the emulated build that measures it (`emulated_bench`).
    let sep = if q.disk_type.contains(':') { ',' } else { ':' };
    let profile = format!("{}{sep}cap={}", q.disk_type, q.disk_bytes);
    let layouts: Vec<serde_json::Value> = all
        .iter()
        .map(|a| {
            let mut v = serde_json::to_value(a)?;
            v["emulate"] = a.layout.emulate_spec(&profile).into();
            Ok(v)
        })
        .collect::<Result<_, serde_json::Error>>()?;
    Ok(serde_json::json!({
        "layouts": layouts,
        "recommended": all[best].name,
        "reason": why,
        "warnings": warnings,
    }))
}

/// What zpool and TrueNAS warn of for a layout: no redundancy, vdevs too narrow to be
/// worth parity, too wide to resilver in good time, or a width whose records waste space
/// to RAID-Z padding.
pub fn layout_warnings(input: &PlanInput, l: &Layout) -> Result<Vec<String>> {
    let mut w = Vec::new();
    match l.vdev {
        VdevType::Stripe => {
            w.push("no redundancy: the failure of any one disk loses the whole pool".into())
        }
        VdevType::Mirror { .. } => {}
        VdevType::Raidz { parity } => {
            let data = l.width - parity;
            if data < 2 {
                w.push(format!(
                    "too narrow: a raidz{parity} of {} disks holds no more than a {}-way mirror and is slower",
                    l.width, l.width
                ));
            }
            if l.width > 12 {
                w.push(format!(
                    "wide: a raidz vdev of {} disks resilvers slowly and has one disk's random IOPS; \
                     prefer vdevs of 12 disks or fewer",
                    l.width
                ));
            }
            let loss = padding_loss(input, l)?;
            if loss > 0.02 {
                let better = optimal_widths(input, parity)?;
                w.push(format!(
                    "non-optimal width: {:.0}% of the data disks' space goes to padding at \
                     {} records{}",
                    loss * 100.0,
                    human(input.recordsize),
                    if better.is_empty() {
                        String::new()
                    } else {
                        format!("; raidz{parity} of {better} disks wastes less than 1%")
                    }
                ));
            }
        }
    }
    if l.vdev != VdevType::Stripe && l.redundancy() == 1 && input.disk.capacity > 2_000_000_000_000
    {
        w.push(
            "single parity on disks over 2 TB: a second failure or a read error during the \
             long resilver loses data; consider raidz2 or 3-way mirrors"
                .into(),
        );
    }
    Ok(w)
}

/// The share of a RAID-Z layout's data space its records lose to padding (0 to 1).
fn padding_loss(input: &PlanInput, l: &Layout) -> Result<f64> {
    let sector = 1u64 << input.ashift;
    let rounded = input.recordsize.div_ceil(sector) * sector;
    let actual =
        rounded as f64 / crate::plan::record_asize(l, input.recordsize, input.ashift)? as f64;
    let ideal = l.data_disks_per_vdev() as f64 / l.width as f64;
    Ok(1.0 - actual / ideal)
}

/// The raidz widths up to 16 whose records lose under 1% to padding, as "a, b or c".
fn optimal_widths(input: &PlanInput, parity: usize) -> Result<String> {
    let mut good = Vec::new();
    for width in parity + 2..=16 {
        let l = Layout {
            vdev: VdevType::Raidz { parity },
            width,
            vdevs: 1,
            spares: 0,
        };
        if padding_loss(input, &l)? < 0.01 {
            good.push(width.to_string());
        }
    }
    Ok(match good.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use tank_device::{DeviceRef, FileDevice, FileDeviceOptions};
    use tank_pool::{CreateOptions, Pool, PoolSpec};

    /// The planner's usable capacity is what a pool of that layout reports once made.
    #[test]
    fn the_planned_usable_capacity_is_the_pools() {
        let dir = tempfile::tempdir().unwrap();
        let bytes: u64 = 256 << 20;
        for (layout, disks, tokens) in [
            ("1x4 raidz2", 4, "raidz2 d0 d1 d2 d3"),
            ("1x5 raidz1", 5, "raidz1 d0 d1 d2 d3 d4"),
            ("1x7 raidz2", 7, "raidz2 d0 d1 d2 d3 d4 d5 d6"),
            ("1x6 raidz3", 6, "raidz3 d0 d1 d2 d3 d4 d5"),
            ("2x2 mirror", 4, "mirror d0 d1 mirror d2 d3"),
            ("2x3 raidz1", 6, "raidz1 d0 d1 d2 raidz1 d3 d4 d5"),
        ] {
            let mut devices: HashMap<String, DeviceRef> = HashMap::new();
            for i in 0..disks {
                let name = format!("d{i}");
                let path = dir
                    .path()
                    .join(format!("{}-{name}", layout.replace(' ', "-")));
                let file = FileDevice::open(
                    &path,
                    &FileDeviceOptions {
                        create_size: Some(bytes),
                        ..Default::default()
                    },
                )
                .unwrap();
                devices.insert(name, Arc::new(file));
            }
            let tokens: Vec<String> = tokens.split(' ').map(String::from).collect();
            let spec = PoolSpec::parse(&tokens, true).unwrap();
            let (pool, _) = Pool::create("p", &spec, &devices, &CreateOptions::default()).unwrap();
            let usable = pool.space().usable;
            pool.destroy().unwrap();
            let plan = plan_query(&tank_service::service::PlanQuery {
                disks,
                disk_bytes: bytes,
                disk_type: "ssd".into(),
                workload: "mixed".into(),
                layout: Some(layout.into()),
            })
            .unwrap();
            let planned = plan["layouts"][0]["usable_bytes"].as_u64().unwrap();
            let off = planned.abs_diff(usable) as f64 / usable as f64;
            assert!(
                off < 1e-6,
                "{layout}: planned {planned}, the pool reports {usable}"
            );
        }
    }
}
