//! `tank bench PATH` and `tank bench --emulate BUILD`: the bonnie++-style benchmark of a
//! directory or of an emulated build (`emulate.rs`), with history, comparison and a chart.
//! The phases and their aggregation are in `crate::fsbench`, the link model in
//! `crate::link`.
//!
//! `tank bench --dataset NAME` runs the same benchmark in the service, as a job on the
//! dataset's mount (`ServiceBench`, installed by the daemon): the client starts it, follows
//! its progress, and records and prints its figures here (`record`, `print_record`).

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use crate::emulate::EmulatedBuild;
use crate::fsbench::{self, FsBenchConfig, Summary, FIGURE_NAMES};
use crate::link::{Link, LinkProfile};
use anyhow::{bail, Context, Result};
use clap::Args;
use comfy_table::{presets, Table};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

use crate::run::util::{data_dir, human, parse_recordsize, parse_size, DATASET_MAX_RECORD};
use tank_service::api::BenchParams;
use tank_service::jobs::{Benchmark, Progress};

#[derive(Args)]
pub struct FsBenchArgs {
    /// Directory to measure (a tank dataset's mount, or any file system).
    path: Option<PathBuf>,
    /// Bytes written and read in all (default: twice the RAM, so caches cannot flatter it).
    #[arg(long)]
    size: Option<String>,
    #[arg(long, default_value = "128K")]
    recordsize: String,
    /// Parallel jobs, started together; figures are their aggregate.
    #[arg(long, default_value_t = 1)]
    jobs: usize,
    /// Runs; the table shows the median with min and max.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// fdatasync after every write.
    #[arg(long)]
    sync: bool,
    /// Files of the small-file phase (bonnie++'s default is 16 x 1024).
    #[arg(long, default_value_t = 16 * 1024)]
    files: usize,
    /// Files of the tree copy test.
    #[arg(long, default_value_t = 2000)]
    tree_files: usize,
    /// A name for this run in the history.
    #[arg(long)]
    pub label: Option<String>,
    /// Write an SVG chart of the result.
    #[arg(long)]
    chart: Option<PathBuf>,
    /// Show the last runs from the history side by side (no benchmark is run).
    #[arg(long)]
    compare: bool,
    /// Measure an emulated build instead of a directory, e.g. "7x hdd raidz2 + ssd log"
    /// (through a FUSE mount of a filesystem on it; the default size is 4x --arc).
    #[arg(long)]
    pub emulate: Option<String>,
    /// With --emulate: measure the pool at the engine level (no FUSE), beside one emulated
    /// device of the profile measured raw.
    #[arg(long)]
    engine: bool,
    /// With --emulate: the ARC of the emulated build.
    #[arg(long, default_value = "256M")]
    arc: String,
    /// With --emulate: the bench filesystem's primarycache (all, metadata, none).
    #[arg(long, default_value = "all")]
    primarycache: String,
    /// A network link in front of the storage: 1gbe, 10gbe or 25gbe (its bandwidth shared by
    /// the jobs, a round trip per operation).
    #[arg(long)]
    link: Option<String>,
    /// Benchmark a mounted filesystem dataset in the service (the daemon), as a job whose
    /// progress this command follows (Ctrl-C cancels it).
    #[arg(long, conflicts_with_all = ["path", "emulate", "compare", "link", "chart"])]
    pub dataset: Option<String>,
    /// With --emulate: measure the build in the service (the daemon) as a job whose
    /// progress this command follows (Ctrl-C cancels it); its filesystem caches metadata
    /// only, so the daemon's ARC is left to its pools.
    #[arg(long, requires = "emulate", conflicts_with_all = ["engine", "link", "chart", "arc", "primarycache"])]
    pub daemon: bool,
    #[arg(long)]
    pub json: bool,
}

impl FsBenchArgs {
    /// The parameters of a `dataset_bench` request from these arguments (the service
    /// applies the defaults the options do not give).
    pub fn service_params(&self) -> Result<BenchParams> {
        Ok(BenchParams {
            size: self.size.as_deref().map(parse_size).transpose()?,
            recordsize: Some(parse_size(&self.recordsize)?),
            runs: Some(u32::try_from(self.runs).context("too many runs")?),
            jobs: Some(u32::try_from(self.jobs).context("too many jobs")?),
            files: Some(u32::try_from(self.files).context("too many files")?),
            tree_files: Some(u32::try_from(self.tree_files).context("too many tree files")?),
            sync: self.sync,
            label: self.label.clone(),
            seeks: None,
        })
    }
}

/// One benchmark's record in the history (and a benchmark job's result).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HistoryEntry {
    pub time: u64,
    pub label: String,
    pub path: String,
    pub size: u64,
    pub recordsize: usize,
    pub jobs: usize,
    pub sync: bool,
    pub summary: Summary,
}

fn history_path() -> PathBuf {
    data_dir().join(tank_service::service::BENCH_HISTORY)
}

fn ram_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map(|k| k * 1024)
        .unwrap_or(8 << 30)
}

const LABELS: [&str; 10] = [
    "Seq output block MB/s",
    "Rewrite MB/s",
    "Seq input block MB/s",
    "Random seeks /s",
    "Seq create /s",
    "Seq stat /s",
    "Seq delete /s",
    "Tree copy in MB/s",
    "Tree copy out MB/s",
    "Tree delete files/s",
];

pub fn run(a: FsBenchArgs) -> Result<()> {
    if a.compare {
        return compare(a.json);
    }
    crate::run::emulated::clean_up_on_signal();
    // A dataset's record size through FUSE; the engine level takes up to 16M; any request
    // size for a directory.
    let recordsize = match (&a.emulate, a.engine) {
        (Some(_), false) => u64::from(parse_recordsize(&a.recordsize, DATASET_MAX_RECORD)?),
        (Some(_), true) => u64::from(parse_recordsize(&a.recordsize, 16 << 20)?),
        (None, _) => parse_size(&a.recordsize)?,
    };
    if !(512..=(16 << 20)).contains(&recordsize) {
        bail!("record size must be from 512 to 16M");
    }
    let build = match &a.emulate {
        Some(spec) => {
            if a.path.is_some() {
                bail!("give a directory or --emulate, not both");
            }
            Some(EmulatedBuild::parse(spec)?)
        }
        None if a.engine => bail!("--engine measures an emulated build: give --emulate"),
        None => None,
    };
    let arc = parse_size(&a.arc)?;
    let size = match (&a.size, &build) {
        (Some(s), _) => parse_size(s)?,
        (None, Some(_)) => 4 * arc,
        (None, None) => 2 * ram_bytes(),
    };
    if let Some(spec) = &a.emulate {
        crate::run::emulated::set_arc(arc)?;
        if a.engine {
            return crate::run::emulated::run_engine(spec, size, recordsize as u32, a.runs, a.json);
        }
    }
    let link = match &a.link {
        Some(l) => Some(Arc::new(Link::new(LinkProfile::parse(l)?))),
        None => None,
    };
    let target = match (&a.path, &a.emulate) {
        (Some(p), _) => p.display().to_string(),
        (None, Some(spec)) => format!("emulated {spec}"),
        (None, None) => bail!("give a directory to measure, --emulate BUILD, or --compare"),
    };
    let cfg = FsBenchConfig {
        size,
        recordsize: recordsize as usize,
        jobs: a.jobs,
        runs: a.runs,
        sync: a.sync,
        files: a.files,
        seeks: 8000,
        tree_files: a.tree_files,
        link,
        staging: None,
        meter: Default::default(),
    };
    let start = Instant::now();
    let mut last_len = 0;
    let mut progress = |phase: &str, done: f64| {
        let el = start.elapsed().as_secs_f64();
        let eta = if done > 0.01 {
            el / done - el
        } else {
            f64::NAN
        };
        let line = if eta.is_finite() {
            format!(
                "{phase}  {:.0} %  elapsed {:.0} s  ETA {:.0} s",
                done * 100.0,
                el,
                eta.max(0.0)
            )
        } else {
            format!("{phase}  elapsed {el:.0} s")
        };
        eprint!("\r{line:<last_len$}");
        last_len = line.len();
        let _ = std::io::stderr().flush();
    };
    let runs = match (&build, &a.path) {
        (Some(build), _) => {
            let (runs, disk_time) = crate::run::emulated::fs_runs(
                &data_dir(),
                build,
                &cfg,
                &a.primarycache,
                &mut progress,
            )?;
            eprintln!();
            crate::run::emulated::print_disk_time(&mut std::io::stderr(), &disk_time);
            runs
        }
        (None, Some(path)) => fsbench::run(path, &cfg, &mut progress)
            .with_context(|| format!("benchmark of {}", path.display()))?,
        (None, None) => unreachable!("a target was checked above"),
    };
    eprintln!();
    let entry = HistoryEntry {
        time: tank_pool::config::now_secs(),
        label: a.label.clone().unwrap_or_else(|| match &a.link {
            Some(l) => format!("{target} via {l}"),
            None => target.clone(),
        }),
        path: target.clone(),
        size,
        recordsize: recordsize as usize,
        jobs: a.jobs,
        sync: a.sync,
        summary: fsbench::summarize(&runs),
    };
    record(&entry)?;
    if let Some(chart) = &a.chart {
        std::fs::write(chart, svg(&entry))
            .with_context(|| format!("cannot write {}", chart.display()))?;
    }
    print_record(&entry, a.json)
}

/// Appends a benchmark to the history (`DATA_DIR/bench-history.jsonl`), as the daemon
/// appends its jobs' runs.
pub fn record(entry: &HistoryEntry) -> Result<()> {
    std::fs::create_dir_all(data_dir()).ok();
    tank_service::service::append_history(&history_path(), &serde_json::to_value(entry)?)
        .with_context(|| format!("cannot write {}", history_path().display()))
}

/// Prints a benchmark's figures: the median with min and max of each (or the record as
/// JSON).
pub fn print_record(entry: &HistoryEntry, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(entry)?);
        return Ok(());
    }
    let summary = &entry.summary;
    println!(
        "{}: {} in {} jobs, record {}, {}{} run(s), median (min..max)",
        entry.label,
        human(entry.size),
        entry.jobs,
        human(entry.recordsize as u64),
        if entry.sync { "sync, " } else { "" },
        summary.runs
    );
    let mut t = Table::new();
    t.load_style(presets::NOTHING);
    t.set_header(["FIGURE", "MEDIAN", "MIN", "MAX"]);
    let (med, min, max) = (
        summary.median.values(),
        summary.min.values(),
        summary.max.values(),
    );
    for i in 0..LABELS.len() {
        t.add_row(vec![
            LABELS[i].to_string(),
            format!("{:.1}", med[i]),
            format!("{:.1}", min[i]),
            format!("{:.1}", max[i]),
        ]);
    }
    println!("{t}");
    Ok(())
}

/// The benchmark the service runs as a job: `dataset_bench`, the same phases as
/// `tank bench PATH` on the dataset's mount, and `emulated_bench`, those of
/// `tank bench --emulate BUILD`. The bytes moved are the job's progress (sampled every
/// quarter second) and its cancel flag is the benchmark's.
pub struct ServiceBench;

/// Held while an emulated build is measured: its pool has one name in the process, so one
/// emulated build is measured at a time.
static EMULATING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Why a second emulated build is refused while one is measured.
const ONE_AT_A_TIME: &str = "another emulated build is being measured: one at a time";

impl ServiceBench {
    /// The benchmark's configuration from a job's parameters (`size` if none is given).
    fn config(params: &BenchParams, size: u64) -> std::result::Result<FsBenchConfig, String> {
        let int = |v: Option<u32>, default: usize| v.map_or(default, |v| v as usize);
        let recordsize = params.recordsize.unwrap_or(128 << 10);
        if !(512..=(16 << 20)).contains(&recordsize) {
            return Err("record size must be from 512 to 16M".into());
        }
        let cfg = FsBenchConfig {
            size: params.size.unwrap_or(size),
            recordsize: recordsize as usize,
            jobs: int(params.jobs, 1),
            runs: int(params.runs, 3),
            sync: params.sync,
            files: int(params.files, 16 * 1024),
            seeks: int(params.seeks, 8000),
            tree_files: int(params.tree_files, 2000),
            link: None,
            staging: None,
            meter: Default::default(),
        };
        if cfg.jobs == 0 || cfg.jobs > 64 || cfg.runs == 0 || cfg.runs > 100 {
            return Err("jobs must be from 1 to 64 and runs from 1 to 100".into());
        }
        Ok(cfg)
    }

    /// Runs `bench` (which reports its phase and takes `cfg`'s meter) with `progress`
    /// following the meter, and makes the job's summary line and figures, for `path`.
    fn measured(
        cfg: &FsBenchConfig,
        path: &str,
        progress: &Progress,
        bench: impl FnOnce(&mut dyn FnMut(&str, f64)) -> Result<Vec<fsbench::FsFigures>>,
    ) -> std::result::Result<(String, serde_json::Value), String> {
        use std::sync::atomic::Ordering;
        progress.set_total(cfg.planned_bytes());
        let start = Instant::now();
        let phase = parking_lot::Mutex::new(String::from("starting"));
        let done = std::sync::atomic::AtomicBool::new(false);
        let sample = || {
            let bytes = cfg.meter.bytes.load(Ordering::Relaxed);
            progress.advance(bytes, start.elapsed(), phase.lock().clone());
        };
        let runs = std::thread::scope(|s| {
            s.spawn(|| {
                while !done.load(Ordering::SeqCst) {
                    if progress.canceled() {
                        cfg.meter.cancel.store(true, Ordering::SeqCst);
                    }
                    sample();
                    std::thread::sleep(std::time::Duration::from_millis(250));
                }
            });
            let r = bench(&mut |p: &str, _| {
                *phase.lock() = p.to_string();
                sample();
            });
            done.store(true, Ordering::SeqCst);
            r
        })
        .map_err(|e| tank_service::error::chain(&e))?;
        let summary = fsbench::summarize(&runs);
        let m = &summary.median;
        let line = format!(
            "{} run(s) in {:.0} s: write {:.1} MB/s, read {:.1} MB/s, {:.0} seeks/s, create {:.0}/s",
            summary.runs,
            start.elapsed().as_secs_f64(),
            m.seq_output_block_mb_s,
            m.seq_input_block_mb_s,
            m.random_seeks_per_s,
            m.seq_create_per_s
        );
        let entry = HistoryEntry {
            time: tank_pool::config::now_secs(),
            label: path.to_string(),
            path: path.to_string(),
            size: cfg.size,
            recordsize: cfg.recordsize,
            jobs: cfg.jobs,
            sync: cfg.sync,
            summary,
        };
        let value = serde_json::to_value(&entry).map_err(|e| e.to_string())?;
        Ok((line, value))
    }
}

impl Benchmark for ServiceBench {
    fn run(
        &self,
        dir: &std::path::Path,
        params: &BenchParams,
        progress: &Progress,
    ) -> std::result::Result<(String, serde_json::Value), String> {
        let cfg = Self::config(params, 2 * ram_bytes())?;
        Self::measured(&cfg, &dir.display().to_string(), progress, |report| {
            Ok(fsbench::run(dir, &cfg, report)?)
        })
    }

    fn check_build(&self, build: &str) -> std::result::Result<(), String> {
        EmulatedBuild::parse(build).map_err(|e| e.to_string())?;
        match EMULATING.try_lock() {
            Err(std::sync::TryLockError::WouldBlock) => Err(ONE_AT_A_TIME.into()),
            _ => Ok(()),
        }
    }

    fn run_emulated(
        &self,
        data_dir: &std::path::Path,
        build: &str,
        params: &BenchParams,
        progress: &Progress,
    ) -> std::result::Result<(String, serde_json::Value), String> {
        let _one = match EMULATING.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Err(ONE_AT_A_TIME.into()),
        };
        let parsed = EmulatedBuild::parse(build).map_err(|e| e.to_string())?;
        // 4x the emulated build's ARC of `tank bench --emulate` by default.
        let cfg = Self::config(params, 1 << 30)?;
        if cfg.recordsize > DATASET_MAX_RECORD as usize || !cfg.recordsize.is_power_of_two() {
            return Err(format!(
                "a filesystem's record size is a power of two up to {}",
                human(DATASET_MAX_RECORD)
            ));
        }
        Self::measured(&cfg, &format!("emulated {build}"), progress, |report| {
            crate::run::emulated::fs_runs(data_dir, &parsed, &cfg, "metadata", report)
                .map(|(runs, _)| runs)
        })
    }
}

fn compare(json: bool) -> Result<()> {
    let raw = match std::fs::read_to_string(history_path()) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            println!("no benchmark history yet in {}", history_path().display());
            return Ok(());
        }
        Err(e) => return Err(e).context("cannot read the benchmark history"),
    };
    let entries: Vec<HistoryEntry> = raw
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let last: Vec<&HistoryEntry> = entries.iter().rev().take(6).rev().collect();
    if json {
        println!("{}", serde_json::to_string_pretty(&last)?);
        return Ok(());
    }
    let mut t = Table::new();
    t.load_style(presets::NOTHING);
    let mut header = vec!["FIGURE (median)".to_string()];
    header.extend(last.iter().map(|e| e.label.clone()));
    t.set_header(header);
    for (i, name) in LABELS.iter().enumerate() {
        let mut row = vec![name.to_string()];
        row.extend(
            last.iter()
                .map(|e| format!("{:.1}", e.summary.median.values()[i])),
        );
        t.add_row(row);
    }
    println!("{t}");
    Ok(())
}

/// A chart in the reference build's style: throughput bars (MB/s) on a linear axis, operation
/// rates on a log axis.
fn svg(e: &HistoryEntry) -> String {
    let v = e.summary.median.values();
    let mb_idx = [0usize, 1, 2, 7, 8];
    let ops_idx = [3usize, 4, 5, 6, 9];
    let (w, h, bar) = (760.0, 330.0, 56.0);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\n<text x=\"10\" y=\"18\" font-size=\"14\">tank bench: {} ({} runs, median)</text>\n",
        xml(&e.label),
        e.summary.runs
    );
    let max_mb = mb_idx.iter().map(|&i| v[i]).fold(1.0, f64::max);
    let top = 40.0;
    let plot = 220.0;
    let bars = |s: &mut String,
                x0: f64,
                idx: &[usize],
                height: &dyn Fn(f64) -> f64,
                color: &str,
                unit: &str| {
        for (k, &i) in idx.iter().enumerate() {
            let x = x0 + k as f64 * (bar + 14.0);
            let bh = height(v[i]);
            *s += &format!(
                "<rect x=\"{x}\" y=\"{}\" width=\"{bar}\" height=\"{bh}\" fill=\"{color}\"/>\n<text x=\"{x}\" y=\"{}\">{:.0}</text>\n<text x=\"{x}\" y=\"{}\" font-size=\"9\">{}</text>\n",
                top + plot - bh,
                top + plot - bh - 3.0,
                v[i],
                top + plot + 14.0,
                xml(FIGURE_NAMES[i].trim_end_matches(unit))
            );
        }
    };
    bars(
        &mut s,
        20.0,
        &mb_idx,
        &|x| x / max_mb * plot,
        "#3a7bd5",
        "_mb_s",
    );
    s += &format!(
        "<text x=\"20\" y=\"{}\">MB/s (linear)</text>\n",
        top + plot + 32.0
    );
    let lmax = ops_idx
        .iter()
        .map(|&i| v[i].max(1.0).log10())
        .fold(1.0, f64::max)
        .ceil();
    bars(
        &mut s,
        400.0,
        &ops_idx,
        &|x| x.max(1.0).log10() / lmax * plot,
        "#d5803a",
        "_per_s",
    );
    s += &format!(
        "<text x=\"400\" y=\"{}\">operations/s (log axis, top = 10^{lmax})</text>\n</svg>\n",
        top + plot + 32.0
    );
    s
}

fn xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
