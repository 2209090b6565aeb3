//! `tank bench-scrub`: how fast the repair loop reads, as ratios against the raw device
//! files measured in the same run: a scrub against a cold sequential read of the same bytes
//! from the device files, and a degraded read (devices missing) against a healthy one.
//!
//! # Method
//! In DIR, build the pool (raidz2 of 7 file devices by default, O_DIRECT), write SIZE bytes
//! of incompressible data as one object with 1 MiB records, sync and export, then drop the
//! device files' cached pages before each phase:
//! - *raw*: from every device file at once, read the bytes the pool allocated on it (its
//!   share of the vdev's allocated space, from the start of its data area), sequentially in
//!   1 MiB requests, once through the page cache (with the kernel's readahead, as `dd`
//!   would) and once O_DIRECT, keeping the faster;
//! - *scrub*: import and scrub; its rate is the bytes it read from the devices over its time;
//! - *healthy read*: import and read the object back;
//! - *degraded read*: import with `--missing` devices gone and read the object back;
//! - with `--resilver`: in a pool filled nearly full, and in one a tenth as full, replace a
//!   device by a new file and time the resilver (rebuild and verifying pass).
//!
//! Each figure is the median of `--runs` runs, ratios the median of the per-run ratios.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use rand::{RngCore, SeedableRng};
use tank_device::DeviceRef;
use tank_object::{ObjectStore, ScanPhase, ROOT_OBJSET};
use tank_pool::{CreateOptions, ImportOptions, Pool, PoolSpec};

use crate::run::util::parse_size;
use tank_service::pools::open_device;

#[derive(Args)]
pub struct ScrubBenchArgs {
    /// Directory for the device files (must not hold a pool).
    #[arg(long)]
    dir: PathBuf,
    /// raidz1, raidz2, raidz3 or mirror (one mirror of all devices).
    #[arg(long, default_value = "raidz2")]
    layout: String,
    #[arg(long, default_value_t = 7)]
    devices: usize,
    /// Bytes of data written before the scrub.
    #[arg(long, default_value = "2G")]
    size: String,
    /// Devices missing for the degraded read (at most the layout's redundancy).
    #[arg(long, default_value_t = 2)]
    missing: usize,
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Also time the resilver of a replaced device, the pool nearly full and a tenth as full.
    #[arg(long)]
    resilver: bool,
    #[arg(long)]
    json: bool,
}

/// Drops a file's cached pages (after syncing it), so the next read comes from the disk.
#[allow(unsafe_code)]
fn drop_cached(path: &Path) -> Result<()> {
    use std::os::unix::io::AsRawFd;
    let f = std::fs::File::open(path)?;
    f.sync_all()?;
    // SAFETY: posix_fadvise only reads its integer arguments; the fd is valid for this call.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if r != 0 {
        bail!("posix_fadvise failed on {}: {r}", path.display());
    }
    Ok(())
}

struct Run {
    raw: f64,
    scrub: f64,
    healthy: f64,
    degraded: f64,
    /// Resilver seconds and the fraction of the pool allocated: nearly full, a tenth.
    resilver_full: Option<(f64, f64)>,
    resilver_tenth: Option<(f64, f64)>,
}

fn import(names: &[String], skip: usize) -> Result<(Arc<Pool>, Arc<ObjectStore>)> {
    for n in names {
        drop_cached(Path::new(n))?;
    }
    let devs: Vec<DeviceRef> = names[skip..]
        .iter()
        .map(|n| open_device(n, None, true))
        .collect::<Result<_>>()?;
    let pool = Pool::import(&devs, &ImportOptions::default())?;
    let store = ObjectStore::open(pool.clone())?;
    Ok((pool, store))
}

/// Reads the object back; returns bytes/s.
fn read_back(store: &ObjectStore, id: u64, size: u64) -> Result<f64> {
    let os = store.objset(ROOT_OBJSET)?;
    let t = Instant::now();
    let mut off = 0;
    while off < size {
        let got = os.read(id, off, 8 << 20)?;
        if got.is_empty() {
            bail!("object shorter than written");
        }
        off += got.len() as u64;
    }
    Ok(size as f64 / t.elapsed().as_secs_f64())
}

fn device_names(a: &ScrubBenchArgs, prefix: &str) -> Vec<String> {
    (0..a.devices)
        .map(|i| {
            a.dir
                .join(format!("{prefix}{i}"))
                .to_string_lossy()
                .into_owned()
        })
        .collect()
}

/// A new pool of `names`, each device `per_dev` bytes, with `size` bytes written as one
/// object (1 MiB records) and synced; returns the object's id too.
fn build_pool(
    a: &ScrubBenchArgs,
    names: &[String],
    per_dev: u64,
    size: u64,
    data: &[u8],
) -> Result<(Arc<Pool>, Arc<ObjectStore>, u64)> {
    let mut tokens = vec![a.layout.clone()];
    tokens.extend(names.iter().cloned());
    let spec = PoolSpec::parse(&tokens, false)?;
    let mut devices = std::collections::HashMap::new();
    for n in names {
        let _ = std::fs::remove_file(n);
        devices.insert(n.clone(), open_device(n, Some(per_dev), true)?);
    }
    let (pool, _) = Pool::create("scrubbench", &spec, &devices, &CreateOptions::default())?;
    drop(devices);
    let store = ObjectStore::open(pool.clone())?;
    let os = store.objset(ROOT_OBJSET)?;
    let id = {
        let tx = store.begin(0)?;
        os.create_object(&tx, 1, 1 << 20)?
    };
    let mut off = 0u64;
    while off < size {
        let n = (data.len() as u64).min(size - off) as usize;
        let tx = store.begin(n as u64)?;
        os.write(&tx, id, off, &data[..n])?;
        drop(tx);
        off += n as u64;
        // Bounded dirty data: space checks count what is in flight at its worst case, and
        // the resilver run fills the pool to the brim.
        if off.is_multiple_of(128 << 20) {
            store.sync()?;
        }
    }
    store.sync()?;
    Ok((pool, store, id))
}

/// Replaces the second device of a pool holding `fill` bytes by a new file and times the
/// resilver; returns (seconds, fraction of the pool allocated).
fn resilver_secs(a: &ScrubBenchArgs, per_dev: u64, fill: u64, data: &[u8]) -> Result<(f64, f64)> {
    let names = device_names(a, "resilver-dev");
    let (pool, store, _) = build_pool(a, &names, per_dev, fill, data)?;
    let space = pool.space();
    let new = a.dir.join("resilver-new").to_string_lossy().into_owned();
    let _ = std::fs::remove_file(&new);
    let dev = open_device(&new, Some(per_dev), true)?;
    pool.replace(&names[1], &new, dev, false)?;
    let t = Instant::now();
    store.resilver_start()?;
    store.scan_wait();
    let secs = t.elapsed().as_secs_f64();
    let st = store.scan_status();
    if st.state.phase != ScanPhase::Finished || st.state.errors > 0 || pool.state() != "ONLINE" {
        bail!("the resilver did not finish cleanly: {:?}", st.state);
    }
    pool.destroy()?;
    drop((store, pool));
    for n in names.iter().chain([&new]) {
        let _ = std::fs::remove_file(n);
    }
    Ok((secs, space.allocated as f64 / space.size as f64))
}

fn one_run(a: &ScrubBenchArgs, size: u64, data: &[u8]) -> Result<Run> {
    let names = device_names(a, "scrub-dev");
    let per_dev = size / a.devices as u64 * 2 + (512 << 20);
    let (pool, store, id) = build_pool(a, &names, per_dev, size, data)?;
    let allocated = pool.space().allocated;
    pool.export()?;
    drop((store, pool));

    // Raw: each device file's share of the allocated space, all files at once; the better
    // of reading through the page cache and reading O_DIRECT.
    let share = allocated / a.devices as u64 / 4096 * 4096;
    let raw = raw_read(&names, share, false)?.max(raw_read(&names, share, true)?);

    // Scrub.
    let (pool, store) = import(&names, 0)?;
    let read_before: u64 = pool
        .leaf_list()
        .iter()
        .map(|(_, l)| l.stats.snapshot().read_bytes)
        .sum();
    let t = Instant::now();
    store.scrub_start()?;
    store.scan_wait();
    let secs = t.elapsed().as_secs_f64();
    let st = store.scan_status();
    if st.state.phase != ScanPhase::Finished || st.state.errors > 0 {
        bail!("the scrub did not finish cleanly: {:?}", st.state);
    }
    let read: u64 = pool
        .leaf_list()
        .iter()
        .map(|(_, l)| l.stats.snapshot().read_bytes)
        .sum::<u64>()
        - read_before;
    let scrub = read as f64 / secs;
    pool.export()?;
    drop((store, pool));

    // Healthy and degraded reads.
    let (pool, store) = import(&names, 0)?;
    let healthy = read_back(&store, id, size)?;
    pool.export()?;
    drop((store, pool));
    let (pool, store) = import(&names, a.missing)?;
    if pool.state() != "DEGRADED" {
        bail!("the pool is {} without {} devices", pool.state(), a.missing);
    }
    let degraded = read_back(&store, id, size)?;
    pool.destroy()?;
    drop((store, pool));
    for n in &names {
        let _ = std::fs::remove_file(n);
    }
    // Resilver of a replaced device, the pool nearly full (`size` of data; 1/32 of a pool
    // is always kept free) against a tenth of that.
    let (full, small) = if a.resilver {
        // Room for the data, its parity and metadata, and the reserve, with little spare.
        let data_devices = a.devices.saturating_sub(parity_of(&a.layout)).max(1);
        let per_dev = (size as f64 * 1.12 / data_devices as f64) as u64 + (24 << 20);
        let full = resilver_secs(a, per_dev, size, data)?;
        let small = resilver_secs(a, per_dev, size / 10, data)?;
        (Some(full), Some(small))
    } else {
        (None, None)
    };
    Ok(Run {
        raw,
        scrub,
        healthy,
        degraded,
        resilver_full: full,
        resilver_tenth: small,
    })
}

/// Reads `share` bytes from the start of every device's data area, all devices at once, in
/// 1 MiB requests, cold; returns bytes/s.
fn raw_read(names: &[String], share: u64, direct: bool) -> Result<f64> {
    for n in names {
        drop_cached(Path::new(n))?;
    }
    let devs: Vec<DeviceRef> = names
        .iter()
        .map(|n| open_device(n, None, direct))
        .collect::<Result<_>>()?;
    let t = Instant::now();
    std::thread::scope(|s| -> Result<()> {
        let handles: Vec<_> = devs
            .iter()
            .map(|dev| {
                s.spawn(move || -> Result<()> {
                    let mut buf = vec![0u8; 1 << 20];
                    let mut done = 0;
                    while done < share {
                        let n = (buf.len() as u64).min(share - done) as usize;
                        dev.read_at(&mut buf[..n], tank_vdev::FRONT_RESERVE + done)?;
                        done += n as u64;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().expect("reader thread")?;
        }
        Ok(())
    })?;
    Ok((share * names.len() as u64) as f64 / t.elapsed().as_secs_f64())
}

/// Devices' worth of parity in each row of a layout (a mirror of all devices: all but one).
fn parity_of(layout: &str) -> usize {
    match layout {
        "raidz1" => 1,
        "raidz2" => 2,
        "raidz3" => 3,
        _ => 0,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

pub fn run(a: ScrubBenchArgs) -> Result<()> {
    let size = parse_size(&a.size)?;
    if a.runs == 0 {
        bail!("--runs must be at least 1");
    }
    std::fs::create_dir_all(&a.dir)
        .with_context(|| format!("cannot create {}", a.dir.display()))?;
    let mut data = vec![0u8; 8 << 20];
    rand::rngs::StdRng::seed_from_u64(7).fill_bytes(&mut data);
    let mut runs = Vec::new();
    for i in 0..a.runs {
        eprintln!("run {}/{}...", i + 1, a.runs);
        runs.push(one_run(&a, size, &data)?);
    }
    let med = |f: &dyn Fn(&Run) -> f64| median(runs.iter().map(f).collect());
    let mb = 1e6;
    let (raw, scrub, healthy, degraded) = (
        med(&|r| r.raw),
        med(&|r| r.scrub),
        med(&|r| r.healthy),
        med(&|r| r.degraded),
    );
    let scrub_ratio = med(&|r| r.scrub / r.raw);
    let degraded_ratio = med(&|r| r.degraded / r.healthy);
    let resilver = a.resilver.then(|| {
        let get = |f: &dyn Fn(&Run) -> (f64, f64)| {
            (
                median(runs.iter().map(|r| f(r).0).collect()),
                median(runs.iter().map(|r| f(r).1).collect()),
            )
        };
        let full = get(&|r| r.resilver_full.expect("measured"));
        let tenth = get(&|r| r.resilver_tenth.expect("measured"));
        let ratio = median(
            runs.iter()
                .map(|r| {
                    r.resilver_tenth.expect("measured").0 / r.resilver_full.expect("measured").0
                })
                .collect(),
        );
        (full, tenth, ratio)
    });
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "layout": format!("{} of {}", a.layout, a.devices),
                "size": size,
                "runs": a.runs,
                "raw_cold_read_mb_s": raw / mb,
                "scrub_mb_s": scrub / mb,
                "scrub_over_raw": scrub_ratio,
                "healthy_read_mb_s": healthy / mb,
                "degraded_read_mb_s": degraded / mb,
                "missing": a.missing,
                "degraded_over_healthy": degraded_ratio,
                "resilver_full_secs": resilver.map(|r| r.0 .0),
                "resilver_full_allocated": resilver.map(|r| r.0 .1),
                "resilver_tenth_secs": resilver.map(|r| r.1 .0),
                "resilver_tenth_allocated": resilver.map(|r| r.1 .1),
                "resilver_tenth_over_full": resilver.map(|r| r.2),
            })
        );
    } else {
        println!(
            "{} of {}, {} of data, median of {} runs:",
            a.layout,
            a.devices,
            crate::run::util::human(size),
            a.runs
        );
        println!("  raw cold read of the same bytes  {:>8.0} MB/s", raw / mb);
        println!(
            "  scrub (device bytes read)        {:>8.0} MB/s   scrub / raw: {scrub_ratio:.2}",
            scrub / mb
        );
        println!(
            "  healthy cold read                {:>8.0} MB/s",
            healthy / mb
        );
        println!(
            "  degraded read ({} missing)       {:>8.0} MB/s   degraded / healthy: {degraded_ratio:.2}",
            a.missing,
            degraded / mb
        );
        if let Some(((fs, fa), (ts, ta), ratio)) = resilver {
            println!(
                "  resilver, pool {:.0}% allocated    {fs:>8.2} s",
                fa * 100.0
            );
            println!(
                "  resilver, pool {:.0}% allocated     {ts:>8.2} s      tenth / full: {ratio:.2}",
                ta * 100.0
            );
        }
    }
    Ok(())
}
