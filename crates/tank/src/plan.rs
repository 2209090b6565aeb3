//! `tank plan`: which layout for these disks? See `tank_bench::plan` for the models.

use anyhow::{bail, Result};
use clap::Args;
use comfy_table::{presets, Table};
use tank_bench::plan::{assess, cache_advice, enumerate, recommend, validate_input};
use tank_bench::profile::parse_quantity;
use tank_bench::{DeviceProfile, PlanInput, Workload};

use crate::datadir::{human, parse_size};

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
            .map(tank_bench::profile::link_bandwidth)
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
