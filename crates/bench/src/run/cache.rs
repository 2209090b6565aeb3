//! `tank bench-cache`: what the caches buy, measured at the engine level.
//!
//! # Method
//! **L2ARC** (default): the emulated build (`--emulate`, default "7x hdd raidz2 + ssd
//! cache") is created twice per run, with and without its cache devices. In each, one object
//! of `--working-set` bytes (incompressible, `--recordsize` records) is written and synced,
//! the ARC of the run is `--arc` bytes (smaller than the working set, which is smaller than
//! the cache device), and the object is read through once sequentially to warm the caches,
//! with an L2ARC feed round after every 16 MiB (`l2arc_write_max` raised to 64 MiB for the
//! warm-up, as the reference build raised it). Then `--threads` readers issue random
//! `--read`-sized reads over the working set for `--seconds`: the figure is reads per second.
//! The ratio is with / without the cache device, per run; medians of `--runs`.
//!
//! **ARC memory** (`--rss`): on plain file devices (O_DIRECT), a `--working-set` object is
//! written, then `--threads` readers read random records of it for `--seconds` through an
//! ARC of `--arc` bytes; the process's resident memory (VmRSS) is sampled every 100 ms. The
//! report is the resident memory at the start, after the writes, the peak during the reads,
//! and the peak minus the start and the ARC budget: the fixed overhead of everything else
//! (devices' queues, tree nodes, read-ahead, pages the allocator retained from the writes).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::emulate::EmulatedBuild;
use crate::fsbench::median;
use anyhow::{bail, Result};
use clap::Args;
use serde::Serialize;
use tank_object::arc::AdaptiveCache;
use tank_object::{ObjectStore, ROOT_OBJSET};
use tank_pool::Pool;

use crate::run::emulated::{create_pool, TempDir};
use crate::run::util::{data_dir, human, parse_recordsize, parse_size, DATASET_MAX_RECORD};

#[derive(Args)]
pub struct CacheBenchArgs {
    /// The emulated build (must have a cache section for the L2ARC comparison).
    #[arg(long, default_value = "7x hdd raidz2 + ssd cache")]
    emulate: String,
    /// The ARC budget of the run.
    #[arg(long, default_value = "64M")]
    arc: String,
    /// Bytes read at random: larger than the ARC, smaller than the cache device.
    #[arg(long, default_value = "512M")]
    working_set: String,
    #[arg(long, default_value = "128K")]
    recordsize: String,
    /// Size of each random read.
    #[arg(long, default_value = "8K")]
    read: String,
    #[arg(long, default_value_t = 4)]
    threads: usize,
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Measure the ARC's memory discipline instead (plain file devices).
    #[arg(long)]
    rss: bool,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Clone, Copy, Serialize, Default)]
struct Phase {
    reads_per_s: f64,
    arc_hit_pct: f64,
    l2_hit_pct: f64,
}

struct Params {
    arc: u64,
    ws: u64,
    recordsize: u32,
    read: u64,
    threads: usize,
    seconds: f64,
}

/// Writes the working set as one object and syncs; returns its id.
fn fill(store: &ObjectStore, p: &Params) -> Result<u64> {
    fill_object(store, p.recordsize, p.ws)
}

/// Writes one object of `bytes` incompressible bytes in `recordsize` records into the root
/// object set and syncs; returns its id.
pub(crate) fn fill_object(store: &ObjectStore, recordsize: u32, bytes: u64) -> Result<u64> {
    let os = store.objset(ROOT_OBJSET)?;
    let id = {
        let tx = store.begin(0)?;
        os.create_object(&tx, 1, recordsize)?
    };
    let chunk = crate::fsbench::pattern(8 << 20, 0x9e37_79b9_7f4a_7c15);
    let mut off = 0;
    while off < bytes {
        let n = (chunk.len() as u64).min(bytes - off) as usize;
        let tx = store.begin(n as u64)?;
        os.write(&tx, id, off, &chunk[..n])?;
        drop(tx);
        off += n as u64;
    }
    store.sync()?;
    Ok(id)
}

/// The emulated build `spec` and the same build without its `section` devices (which it
/// must have): the two pools of a with/without comparison.
pub(crate) fn with_and_without(
    spec: &str,
    section: &str,
) -> Result<(EmulatedBuild, EmulatedBuild)> {
    let with = EmulatedBuild::parse(spec)?;
    if !with.extra.iter().any(|(s, _, _)| s == section) {
        bail!("the emulated build has no {section} device: add '+ ssd {section}'");
    }
    let mut without = with.clone();
    without.extra.retain(|(s, _, _)| s != section);
    Ok((with, without))
}

/// Runs `work(k, stop)` on `threads` threads for `seconds`, then raises `stop` and joins
/// them; returns the wall time they had.
pub(crate) fn run_threads(
    threads: usize,
    seconds: f64,
    work: impl Fn(usize, &AtomicBool) -> Result<()> + Send + Sync + 'static,
) -> Result<f64> {
    let stop = Arc::new(AtomicBool::new(false));
    let work = Arc::new(work);
    let t = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|k| {
            let (stop, work) = (stop.clone(), work.clone());
            std::thread::spawn(move || work(k, &stop))
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join()
            .map_err(|_| anyhow::anyhow!("a benchmark thread panicked"))??;
    }
    Ok(t.elapsed().as_secs_f64())
}

/// Random reads by `threads` for `seconds`; reads per second.
fn random_reads(store: &Arc<ObjectStore>, id: u64, p: &Params) -> Result<f64> {
    let count = Arc::new(AtomicU64::new(0));
    let slots = (p.ws / p.read).max(1);
    let (store, counter, read) = (store.clone(), count.clone(), p.read);
    let secs = run_threads(p.threads, p.seconds, move |k, stop| {
        let os = store.objset(ROOT_OBJSET)?;
        let mut x = 0x2545_f491_4f6c_dd1du64 ^ ((k as u64 + 1) << 32);
        while !stop.load(Ordering::Relaxed) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            os.read(id, x % slots * read, read as usize)?;
            counter.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    })?;
    Ok(count.load(Ordering::Relaxed) as f64 / secs)
}

/// One pool of the L2ARC comparison: build, fill, warm, measure.
fn l2_phase(build: &EmulatedBuild, p: &Params, run: usize, tag: &str) -> Result<Phase> {
    let dir = data_dir().join(format!("bench-cache-{}-{run}-{tag}", std::process::id()));
    let _tmp = TempDir::create(dir.clone())?;
    let dev_size = ((p.ws as f64 / build.data_fraction() / build.count as f64 * 1.6) as u64
        + (512 << 20))
        .max(1 << 30);
    let pool: Arc<Pool> = create_pool(build, dev_size, &dir)?;
    let result = (|| -> Result<Phase> {
        let arc = Arc::new(AdaptiveCache::new(p.arc));
        let store = ObjectStore::open_with_arc(pool.clone(), arc.clone())?;
        let id = fill(&store, p)?;
        // Warm: one sequential pass, feeding the L2ARC as the ARC turns over.
        let os = store.objset(ROOT_OBJSET)?;
        let t = tank_object::l2arc::tunables();
        let old_max = t.write_max.swap(64 << 20, Ordering::Relaxed);
        let mut off = 0;
        while off < p.ws {
            os.read(id, off, 16 << 20)?;
            off += 16 << 20;
            store.cache().l2().feed(&arc, store.cache().spa());
        }
        t.write_max.store(old_max, Ordering::Relaxed);
        let (a0, l0) = (arc.stats(), store.cache().l2().stats());
        let rate = random_reads(&store, id, p)?;
        let (a1, l1) = (arc.stats(), store.cache().l2().stats());
        let pct = |h: u64, m: u64| {
            if h + m == 0 {
                0.0
            } else {
                h as f64 * 100.0 / (h + m) as f64
            }
        };
        Ok(Phase {
            reads_per_s: rate,
            arc_hit_pct: pct(a1.hits - a0.hits, a1.misses - a0.misses),
            l2_hit_pct: pct(l1.l2_hits - l0.l2_hits, l1.l2_misses - l0.l2_misses),
        })
    })();
    let _ = pool.destroy();
    result
}

fn vm_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024
}

fn rss_run(p: &Params) -> Result<(u64, u64, u64, u64)> {
    let start = vm_rss();
    let dir = data_dir().join(format!("bench-cache-rss-{}", std::process::id()));
    let _tmp = TempDir::create(dir.clone())?;
    let build = EmulatedBuild::parse("7x ssd raidz2")?;
    let dev = ((p.ws / 5) as f64 * 1.6) as u64 + (512 << 20);
    // Plain file devices: the same files, no timing model.
    let mut devices = std::collections::HashMap::new();
    let mut toks = vec!["raidz2".to_string()];
    for i in 0..build.count {
        let path = dir.join(format!("d{i}"));
        let d = tank_service::pools::open_device(&path.to_string_lossy(), Some(dev), true)?;
        devices.insert(path.to_string_lossy().into_owned(), d);
        toks.push(path.to_string_lossy().into_owned());
    }
    let spec = tank_pool::PoolSpec::parse(&toks, true)?;
    let (pool, _) = Pool::create("rssbench", &spec, &devices, &Default::default())?;
    drop(devices);
    let result = (|| -> Result<(u64, u64, u64, u64)> {
        let arc = Arc::new(AdaptiveCache::new(p.arc));
        let store = ObjectStore::open_with_arc(pool.clone(), arc.clone())?;
        let id = fill(&store, p)?;
        let before = vm_rss();
        let peak = Arc::new(AtomicU64::new(before));
        let done = Arc::new(AtomicBool::new(false));
        let sampler = {
            let (peak, done) = (peak.clone(), done.clone());
            std::thread::spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    peak.fetch_max(vm_rss(), Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        };
        random_reads(&store, id, p)?;
        done.store(true, Ordering::Relaxed);
        let _ = sampler.join();
        let s = arc.stats();
        if s.size > p.arc {
            bail!("the ARC's own count is over budget: {} > {}", s.size, p.arc);
        }
        Ok((start, before, peak.load(Ordering::Relaxed), s.size))
    })();
    let _ = pool.destroy();
    result
}

pub fn run(a: CacheBenchArgs) -> Result<()> {
    crate::run::emulated::clean_up_on_signal();
    let p = Params {
        arc: parse_size(&a.arc)?,
        ws: parse_size(&a.working_set)?,
        recordsize: parse_recordsize(&a.recordsize, DATASET_MAX_RECORD)?,
        read: parse_size(&a.read)?.max(512),
        threads: a.threads.clamp(1, 64),
        seconds: a.seconds,
    };
    if p.arc < tank_object::arc::ARC_MIN {
        bail!(
            "--arc {} is below the ARC's minimum of {}",
            a.arc,
            human(tank_object::arc::ARC_MIN)
        );
    }
    if !(p.seconds > 0.0 && p.seconds <= 3600.0) || a.runs == 0 {
        bail!("--seconds must be in (0, 3600] and --runs at least 1");
    }
    if a.rss {
        if p.ws < 4 * p.arc {
            bail!("--working-set should be at least 4x --arc so the ARC turns over");
        }
        let mut rows = Vec::new();
        for r in 0..a.runs {
            eprintln!(
                "run {}/{}: ARC {} over {} ...",
                r + 1,
                a.runs,
                a.arc,
                a.working_set
            );
            rows.push(rss_run(&p)?);
        }
        let m = |f: fn(&(u64, u64, u64, u64)) -> u64| {
            median(&mut rows.iter().map(|r| f(r) as f64).collect::<Vec<_>>()) as u64
        };
        let (start, before, peak) = (m(|r| r.0), m(|r| r.1), m(|r| r.2));
        let worst = rows.iter().map(|r| r.2).max().unwrap_or(0);
        let overhead = peak.saturating_sub(p.arc + start);
        if a.json {
            let out = serde_json::json!({"arc_max": p.arc, "working_set": p.ws, "runs": a.runs,
                "rss_at_start": start, "rss_before_reads": before, "rss_peak_median": peak, "rss_peak_max": worst,
                "overhead_over_budget": overhead});
            println!("{}", serde_json::to_string_pretty(&out)?);
        } else {
            println!(
                "ARC budget {}, {} random {} reads over {} for {} s, median of {}:",
                human(p.arc),
                p.threads,
                human(p.read),
                human(p.ws),
                p.seconds,
                a.runs
            );
            println!("  resident at start           {}", human(start));
            println!("  resident after the writes   {}", human(before));
            println!(
                "  resident at peak            {} (worst run {})",
                human(peak),
                human(worst)
            );
            println!(
                "  peak - start - ARC budget   {} (everything else: write buffers the allocator retained, queues, tree nodes, read-ahead)",
                human(overhead)
            );
        }
        return Ok(());
    }
    let (with, without) = with_and_without(&a.emulate, "cache")?;
    let mut rows: Vec<(Phase, Phase)> = Vec::new();
    for r in 0..a.runs {
        eprintln!("run {}/{}: {} ...", r + 1, a.runs, a.emulate);
        let w = l2_phase(&with, &p, r, "l2")?;
        let n = l2_phase(&without, &p, r, "plain")?;
        rows.push((w, n));
    }
    let med =
        |f: &dyn Fn(&(Phase, Phase)) -> f64| median(&mut rows.iter().map(f).collect::<Vec<_>>());
    let with_rate = med(&|r| r.0.reads_per_s);
    let without_rate = med(&|r| r.1.reads_per_s);
    let ratio = med(&|r| r.0.reads_per_s / r.1.reads_per_s.max(1e-9));
    if a.json {
        let out = serde_json::json!({"emulate": a.emulate, "arc": p.arc, "working_set": p.ws,
            "recordsize": p.recordsize, "read": p.read, "threads": p.threads, "runs": a.runs,
            "with_cache_reads_per_s": with_rate, "without_cache_reads_per_s": without_rate,
            "ratio": ratio, "with_cache_arc_hit_pct": med(&|r| r.0.arc_hit_pct),
            "with_cache_l2_hit_pct": med(&|r| r.0.l2_hit_pct),
            "without_cache_arc_hit_pct": med(&|r| r.1.arc_hit_pct)});
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "{}: random {} reads over {} ({} records), ARC {}, {} threads, {} s, median of {}",
        a.emulate,
        human(p.read),
        human(p.ws),
        human(u64::from(p.recordsize)),
        human(p.arc),
        p.threads,
        p.seconds,
        a.runs
    );
    println!(
        "  with the cache device     {:>9.0} reads/s  (ARC hits {:.0}%, L2ARC hits {:.0}%)",
        with_rate,
        med(&|r| r.0.arc_hit_pct),
        med(&|r| r.0.l2_hit_pct)
    );
    println!(
        "  without                   {:>9.0} reads/s  (ARC hits {:.0}%)",
        without_rate,
        med(&|r| r.1.arc_hit_pct)
    );
    println!("  ratio                     {ratio:>9.2}x");
    Ok(())
}
