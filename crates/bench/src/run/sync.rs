//! `tank bench-sync`: what a log device buys synchronous writes, at the engine level.
//!
//! # Method
//! The emulated build (`--emulate`, default "7x hdd raidz2 + ssd log") is created twice per
//! run, with and without its log devices. In each, one object of `--file` bytes
//! (`--recordsize` records) is written and synced, so the blocks a small write changes are
//! in the ARC (the figure is about the log, not about reading). Then `--threads` writers
//! each write `--write`-sized pieces at random aligned offsets and commit the intent log
//! after every write (what fsync, O_SYNC or `sync=always` do) for `--seconds`. Reported:
//! synchronous writes per second and the commit latency's median and 99th percentile; the
//! ratio is with / without the log device, per run; medians of `--runs`. Without a log
//! device the log lives in a region of the data vdevs, so every commit is a RAID-Z write
//! and a flush of the platters.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crate::emulate::EmulatedBuild;
use crate::fsbench::median;
use anyhow::{bail, Result};
use clap::Args;
use parking_lot::Mutex;
use serde::Serialize;
use tank_object::{ObjectStore, ROOT_OBJSET};
use tank_pool::Pool;

use crate::run::cache::run_threads;
use crate::run::emulated::{create_pool, TempDir};
use crate::run::util::{data_dir, human, parse_recordsize, parse_size, DATASET_MAX_RECORD};

#[derive(Args)]
pub struct SyncBenchArgs {
    /// The emulated build (must have a log section for the comparison).
    #[arg(long, default_value = "7x hdd raidz2 + ssd log")]
    emulate: String,
    /// Size of the file written to.
    #[arg(long, default_value = "64M")]
    file: String,
    #[arg(long, default_value = "128K")]
    recordsize: String,
    /// Size of each synchronous write.
    #[arg(long, default_value = "4K")]
    write: String,
    #[arg(long, default_value_t = 1)]
    threads: usize,
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    #[arg(long, default_value_t = 3)]
    runs: usize,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Clone, Copy, Serialize, Default)]
struct Phase {
    writes_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// Commits that waited for a txg instead of the log.
    fallbacks: u64,
}

struct Params {
    file: u64,
    recordsize: u32,
    write: u64,
    threads: usize,
    seconds: f64,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Synchronous random writes by `threads` for `seconds`.
fn sync_writes(store: &Arc<ObjectStore>, id: u64, p: &Params) -> Result<Phase> {
    let lat = Arc::new(Mutex::new(Vec::<f64>::new()));
    let slots = (p.file / p.write).max(1);
    let fallbacks0 = store.pool().zil.stats().fallbacks;
    let (st, all, write) = (store.clone(), lat.clone(), p.write);
    let secs = run_threads(p.threads, p.seconds, move |k, stop| {
        let os = st.objset(ROOT_OBJSET)?;
        let buf = crate::fsbench::pattern(write as usize, k as u64 + 7);
        let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ ((k as u64 + 1) << 40);
        let mut mine = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let t0 = Instant::now();
            {
                let tx = st.begin(write)?;
                os.write(&tx, id, x % slots * write, &buf)?;
            }
            st.log_commit(&os)?;
            mine.push(t0.elapsed().as_secs_f64() * 1000.0);
        }
        all.lock().extend(mine);
        Ok(())
    })?;
    let mut l = std::mem::take(&mut *lat.lock());
    l.sort_by(f64::total_cmp);
    Ok(Phase {
        writes_per_s: l.len() as f64 / secs,
        p50_ms: percentile(&l, 0.5),
        p99_ms: percentile(&l, 0.99),
        fallbacks: store.pool().zil.stats().fallbacks - fallbacks0,
    })
}

/// One pool of the comparison: build, fill, measure.
fn phase(build: &EmulatedBuild, p: &Params, run: usize, tag: &str) -> Result<Phase> {
    let dir = data_dir().join(format!("bench-sync-{}-{run}-{tag}", std::process::id()));
    let _tmp = TempDir::create(dir.clone())?;
    let dev_size = ((p.file as f64 / build.data_fraction() / build.count as f64 * 2.0) as u64
        + (1 << 30))
        .max(1 << 30);
    let pool: Arc<Pool> = create_pool(build, dev_size, &dir)?;
    let result = (|| -> Result<Phase> {
        let store = ObjectStore::open(pool.clone())?;
        let os = store.objset(ROOT_OBJSET)?;
        let id = crate::run::cache::fill_object(&store, p.recordsize, p.file)?;
        // The first commit makes the log's place (a txg when it is a region of the pool);
        // then the blocks are warm.
        {
            let tx = store.begin(1)?;
            os.write(&tx, id, 0, &[0x51])?;
        }
        store.log_commit(&os)?;
        for blk in 0..p.file.div_ceil(u64::from(p.recordsize)) {
            os.read(id, blk * u64::from(p.recordsize), 1)?;
        }
        sync_writes(&store, id, p)
    })();
    let _ = pool.destroy();
    result
}

pub fn run(a: SyncBenchArgs) -> Result<()> {
    crate::run::emulated::clean_up_on_signal();
    let p = Params {
        file: parse_size(&a.file)?,
        recordsize: parse_recordsize(&a.recordsize, DATASET_MAX_RECORD)?,
        write: parse_size(&a.write)?.max(512),
        threads: a.threads.clamp(1, 64),
        seconds: a.seconds,
    };
    if p.write > p.file {
        bail!("--write must not be larger than --file");
    }
    if !(p.seconds > 0.0 && p.seconds <= 3600.0) || a.runs == 0 {
        bail!("--seconds must be in (0, 3600] and --runs at least 1");
    }
    let (with, without) = crate::run::cache::with_and_without(&a.emulate, "log")?;
    let mut rows: Vec<(Phase, Phase)> = Vec::new();
    for r in 0..a.runs {
        eprintln!("run {}/{}: {} ...", r + 1, a.runs, a.emulate);
        let w = phase(&with, &p, r, "slog")?;
        let n = phase(&without, &p, r, "plain")?;
        eprintln!(
            "  with log {:.0}/s (p50 {:.2} ms, p99 {:.2} ms), without {:.0}/s (p50 {:.2} ms, p99 {:.2} ms)",
            w.writes_per_s, w.p50_ms, w.p99_ms, n.writes_per_s, n.p50_ms, n.p99_ms
        );
        rows.push((w, n));
    }
    let med =
        |f: &dyn Fn(&(Phase, Phase)) -> f64| median(&mut rows.iter().map(f).collect::<Vec<_>>());
    let ratio = med(&|r| r.0.writes_per_s / r.1.writes_per_s.max(1e-9));
    let fallbacks: u64 = rows.iter().map(|r| r.0.fallbacks + r.1.fallbacks).sum();
    if a.json {
        let out = serde_json::json!({"emulate": a.emulate, "file": p.file,
            "recordsize": p.recordsize, "write": p.write, "threads": p.threads, "runs": a.runs,
            "with_log_writes_per_s": med(&|r| r.0.writes_per_s),
            "with_log_p50_ms": med(&|r| r.0.p50_ms), "with_log_p99_ms": med(&|r| r.0.p99_ms),
            "without_log_writes_per_s": med(&|r| r.1.writes_per_s),
            "without_log_p50_ms": med(&|r| r.1.p50_ms), "without_log_p99_ms": med(&|r| r.1.p99_ms),
            "ratio": ratio, "fallbacks": fallbacks});
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "{}: synchronous {} writes at random into a {} file ({} records), {} thread(s), {} s, median of {}",
        a.emulate,
        human(p.write),
        human(p.file),
        human(u64::from(p.recordsize)),
        p.threads,
        p.seconds,
        a.runs
    );
    for (name, f) in [
        (
            "with the log device",
            &(|r: &(Phase, Phase)| r.0) as &dyn Fn(&(Phase, Phase)) -> Phase,
        ),
        ("without", &|r: &(Phase, Phase)| r.1),
    ] {
        println!(
            "  {name:<22} {:>8.0} writes/s   commit latency p50 {:>7.2} ms  p99 {:>7.2} ms",
            med(&|r| f(r).writes_per_s),
            med(&|r| f(r).p50_ms),
            med(&|r| f(r).p99_ms)
        );
    }
    println!("  ratio                  {ratio:>8.2}x");
    if fallbacks > 0 {
        println!("  ({fallbacks} commits waited for a txg instead of the log)");
    }
    Ok(())
}
