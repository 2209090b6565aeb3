//! `tank bench`: engine throughput of a pool layout, as ratios against the raw device files
//! measured in the same run, plus the CPU cost per GiB and the per-core speed of parity and
//! checksums.
//!
//! # Method
//! In the bench directory (one file system, so one disk): write `size` bytes of incompressible
//! data to one plain file with an fsync at the end (raw write), drop its cached pages and read
//! it (raw cold read). Then build the pool from N file devices in the same directory, write the
//! same amount as one object and wait for the txg sync (pool write), close the pool, drop the
//! device files' cached pages, import and read the object back (pool cold read). Each figure is
//! the median of `--runs` runs. The ideal pool write is `raw_write x data fraction` (5/7 for
//! raidz2 of 7), since every byte of parity also goes to the same disk.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use rand::{RngCore, SeedableRng};
use tank_device::DeviceRef;
use tank_pool::{CreateOptions, ImportOptions, Pool, PoolSpec};

use crate::datadir::{human, parse_size};
use crate::pools::open_device;

#[derive(Args)]
pub struct BenchArgs {
    /// Directory for the device files and the raw baseline (must not hold a pool).
    #[arg(long)]
    dir: PathBuf,
    /// Layout: raidz1|raidz2|raidz3|stripe|mirror.
    #[arg(long, default_value = "raidz2")]
    layout: String,
    /// Number of devices (for mirror: devices in all, grouped in pairs).
    #[arg(long, default_value_t = 7)]
    devices: usize,
    /// Bytes to write and read.
    #[arg(long, default_value = "1G")]
    size: String,
    /// Record (block) size.
    #[arg(long, default_value = "1M")]
    recordsize: String,
    /// Runs; figures are medians.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Also measure zfs-fuse on the same layout (needs zpool/zfs and a running zfs-fuse).
    #[arg(long)]
    zfs_fuse: bool,
    /// Read the pool back without dropping the device files' cached pages (separates the
    /// engine's own cost from the devices').
    #[arg(long)]
    warm: bool,
    /// Open the pool's device files through the page cache instead of O_DIRECT.
    #[arg(long)]
    buffered: bool,
    #[arg(long)]
    json: bool,
}

/// Drops the page cache of a file (clean pages only; call after fsync).
#[allow(unsafe_code)]
fn drop_cache(path: &Path) -> Result<()> {
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

/// Writes `size` bytes (repeating `data`) to a new file with an fsync; returns bytes/s.
fn write_file(path: &Path, size: u64, data: &[u8]) -> Result<f64> {
    let t = Instant::now();
    let mut f = std::fs::File::create(path)?;
    let mut left = size;
    while left > 0 {
        let n = (data.len() as u64).min(left) as usize;
        f.write_all(&data[..n])?;
        left -= n as u64;
    }
    f.sync_all()?;
    Ok(size as f64 / t.elapsed().as_secs_f64())
}

/// Reads a whole file in 1 MiB requests; returns bytes/s for `size` bytes.
fn read_file(path: &Path, size: u64) -> Result<f64> {
    let t = Instant::now();
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    while f.read(&mut buf)? > 0 {}
    Ok(size as f64 / t.elapsed().as_secs_f64())
}

fn cpu_seconds() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            let rest = s.rsplit_once(')')?.1.to_string();
            let f: Vec<&str> = rest.split_whitespace().collect();
            let utime: f64 = f.get(11)?.parse().ok()?;
            let stime: f64 = f.get(12)?.parse().ok()?;
            Some((utime + stime) / 100.0)
        })
        .unwrap_or(0.0)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

struct Run {
    raw_write: f64,
    raw_read: f64,
    pool_write: f64,
    pool_read: f64,
    cpu_write_per_gib: f64,
    cpu_read_per_gib: f64,
    /// zfs-fuse write and cold read on the same layout, when asked for.
    zfs: Option<(f64, f64)>,
}

fn run_cmd(cmd: &str, args: &[&str]) -> Result<()> {
    let out = std::process::Command::new(cmd)
        .args(args)
        .output()
        .with_context(|| format!("cannot run {cmd}"))?;
    if !out.status.success() {
        bail!(
            "{cmd} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// The same layout under zfs-fuse (compression off, its largest record size 128K): a file
/// written through its FUSE mount and fsynced, then read back after export, dropping the
/// device files' cached pages, and import. Needs a running zfs-fuse daemon.
fn zfs_fuse_run(a: &BenchArgs, size: u64, data: &[u8], per_dev: u64) -> Result<(f64, f64)> {
    let names: Vec<String> = (0..a.devices)
        .map(|i| {
            a.dir
                .join(format!("zfs-dev{i}"))
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    let (tokens, _) = layout_spec(&a.layout, &names)?;
    for n in &names {
        let f = std::fs::File::create(n)?;
        f.set_len(per_dev)?;
    }
    let mnt = a.dir.join("zfs-mnt");
    let mnt_s = mnt.to_string_lossy().into_owned();
    let mut args = vec!["create", "-f", "-m", &mnt_s, "tankbenchzf"];
    args.extend(tokens.iter().map(String::as_str));
    run_cmd("zpool", &args)?;
    let result = (|| {
        run_cmd("zfs", &["set", "compression=off", "tankbenchzf"])?;
        let file = mnt.join("data");
        let w = write_file(&file, size, data)?;
        run_cmd("zpool", &["export", "tankbenchzf"])?;
        for n in &names {
            drop_cache(Path::new(n))?;
        }
        let dir_s = a.dir.to_string_lossy().into_owned();
        run_cmd("zpool", &["import", "-d", &dir_s, "tankbenchzf"])?;
        let r = read_file(&file, size)?;
        Ok((w, r))
    })();
    // zfs-fuse reports the pool busy for a moment after its last file is closed.
    let mut destroyed = Err(anyhow::anyhow!("not tried"));
    for _ in 0..20 {
        destroyed = run_cmd("zpool", &["destroy", "-f", "tankbenchzf"]);
        if destroyed.is_ok() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    if let Err(e) = destroyed {
        eprintln!("warning: could not destroy the zfs-fuse bench pool: {e:#}");
    }
    for n in &names {
        let _ = std::fs::remove_file(n);
    }
    result
}

fn layout_spec(layout: &str, names: &[String]) -> Result<(Vec<String>, f64)> {
    let n = names.len();
    Ok(match layout {
        "stripe" => (names.to_vec(), 1.0),
        "mirror" => {
            if !n.is_multiple_of(2) {
                bail!("mirror layout needs an even number of devices");
            }
            let mut t = Vec::new();
            for pair in names.chunks(2) {
                t.push("mirror".into());
                t.extend(pair.iter().cloned());
            }
            (t, 0.5)
        }
        "raidz1" | "raidz2" | "raidz3" => {
            let p: usize = layout[5..].parse().expect("digit");
            let mut t = vec![layout.to_string()];
            t.extend(names.iter().cloned());
            (t, (n - p) as f64 / n as f64)
        }
        _ => bail!("unknown layout '{layout}' (raidz1, raidz2, raidz3, stripe, mirror)"),
    })
}

fn one_run(a: &BenchArgs, size: u64, record: u32, data: &[u8]) -> Result<Run> {
    let dir = &a.dir;
    // Raw baseline.
    let raw = dir.join("raw-baseline");
    let raw_write = write_file(&raw, size, data)?;
    drop_cache(&raw)?;
    let raw_read = read_file(&raw, size)?;
    std::fs::remove_file(&raw)?;

    // The pool.
    let names: Vec<String> = (0..a.devices)
        .map(|i| {
            dir.join(format!("bench-dev{i}"))
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    let (tokens, fraction) = layout_spec(&a.layout, &names)?;
    // Room for the data, its parity, metadata and the 1/32 reserve.
    let per_dev = (size as f64 / fraction / a.devices as f64 * 1.3) as u64 + (256 << 20);
    let spec = PoolSpec::parse(&tokens, false)?;
    let mut devices = std::collections::HashMap::new();
    for n in &names {
        let _ = std::fs::remove_file(n);
        devices.insert(n.clone(), open_device(n, Some(per_dev), !a.buffered)?);
    }
    let (pool, _) = Pool::create("benchpool", &spec, &devices, &CreateOptions::default())?;
    drop(devices);
    let store = tank_object::ObjectStore::open(pool.clone())?;
    let os = store.objset(tank_object::ROOT_OBJSET)?;
    let id = {
        let tx = store.begin(0)?;
        os.create_object(&tx, 1, record)?
    };
    let cpu0 = cpu_seconds();
    let t = Instant::now();
    let mut off = 0u64;
    let chunk = data.len() as u64;
    while off < size {
        let n = chunk.min(size - off) as usize;
        let tx = store.begin(n as u64)?;
        os.write(&tx, id, off, &data[..n])?;
        drop(tx);
        off += n as u64;
    }
    store.sync()?;
    let pool_write = size as f64 / t.elapsed().as_secs_f64();
    let cpu_write = cpu_seconds() - cpu0;
    pool.shutdown()?;
    drop(os);
    drop(store);
    drop(pool);
    if !a.warm {
        for n in &names {
            drop_cache(Path::new(n))?;
        }
    }
    let devs: Vec<DeviceRef> = names
        .iter()
        .map(|n| open_device(n, None, !a.buffered))
        .collect::<Result<_>>()?;
    let pool = Pool::import(&devs, &ImportOptions::default())?;
    drop(devs);
    let store = tank_object::ObjectStore::open(pool.clone())?;
    let os = store.objset(tank_object::ROOT_OBJSET)?;
    let cpu0 = cpu_seconds();
    let t = Instant::now();
    let mut off = 0u64;
    while off < size {
        let got = os.read(id, off, 8 << 20)?;
        if got.is_empty() {
            bail!("object shorter than written");
        }
        let n = got.len();
        let expect_at = (off % chunk) as usize;
        if got[..64.min(n)] != data[expect_at..expect_at + 64.min(n)] {
            bail!("read-back mismatch at {off}");
        }
        off += n as u64;
    }
    let pool_read = size as f64 / t.elapsed().as_secs_f64();
    let cpu_read = cpu_seconds() - cpu0;
    pool.destroy()?;
    drop(os);
    drop(store);
    drop(pool);
    for n in &names {
        std::fs::remove_file(n).ok();
    }
    let zfs = if a.zfs_fuse {
        Some(zfs_fuse_run(a, size, data, per_dev)?)
    } else {
        None
    };
    let gib = size as f64 / (1u64 << 30) as f64;
    Ok(Run {
        raw_write,
        raw_read,
        pool_write,
        pool_read,
        cpu_write_per_gib: cpu_write / gib,
        cpu_read_per_gib: cpu_read / gib,
        zfs,
    })
}

/// Per-core GB/s of parity encoding (5+2 at 128 KiB) and of each checksum at 128 KiB.
fn microbench() -> Vec<(String, f64)> {
    let mut out = Vec::new();
    let geom = tank_vdev::RaidzGeometry::new(7, 2, 12).expect("geometry");
    let codec = tank_vdev::ParityCodec::new();
    let mut data = vec![0u8; 128 << 10];
    rand::rngs::StdRng::seed_from_u64(3).fill_bytes(&mut data);
    let map = geom.map(0, data.len() as u64);
    let measure = |f: &mut dyn FnMut()| {
        let mut best = 0.0f64;
        for _ in 0..3 {
            let t = Instant::now();
            let mut n = 0u64;
            while t.elapsed().as_millis() < 150 {
                f();
                n += 1;
            }
            best = best.max(n as f64 * (128u64 << 10) as f64 / t.elapsed().as_secs_f64() / 1e9);
        }
        best
    };
    out.push((
        "raidz2 parity encode (5+2, 128 KiB)".into(),
        measure(&mut || {
            std::hint::black_box(tank_vdev::codec::encode_map(&codec, &map, &data));
        }),
    ));
    for kind in [
        tank_block::ChecksumKind::Blake3,
        tank_block::ChecksumKind::Xxh128,
        tank_block::ChecksumKind::Sha256,
    ] {
        out.push((
            format!("checksum {} (128 KiB)", kind.name()),
            measure(&mut || {
                std::hint::black_box(kind.compute(&data));
            }),
        ));
    }
    out
}

pub fn run(a: BenchArgs) -> Result<()> {
    let size = parse_size(&a.size)?;
    let record = parse_size(&a.recordsize)?;
    if !(512..=(16 << 20)).contains(&record) || !record.is_power_of_two() {
        bail!(
            "invalid record size '{}': a power of two from 512 to 16M",
            a.recordsize
        );
    }
    if a.runs == 0 || a.devices == 0 {
        bail!("--runs and --devices must be at least 1");
    }
    std::fs::create_dir_all(&a.dir)
        .with_context(|| format!("cannot create {}", a.dir.display()))?;
    let mut data = vec![0u8; 8 << 20];
    rand::rngs::StdRng::seed_from_u64(42).fill_bytes(&mut data);
    let mut runs = Vec::new();
    for i in 0..a.runs {
        eprintln!(
            "run {}/{}: {} {} x {} ...",
            i + 1,
            a.runs,
            a.layout,
            a.devices,
            human(size)
        );
        runs.push(one_run(&a, size, record as u32, &data)?);
    }
    let med = |f: &dyn Fn(&Run) -> f64| median(&mut runs.iter().map(f).collect::<Vec<_>>());

    let (_, fraction) = layout_spec(&a.layout, &vec![String::new(); a.devices])?;
    let write_ratio = med(&|r| r.pool_write / (r.raw_write * fraction));
    let read_ratio = med(&|r| r.pool_read / r.raw_read);
    let raw_w = med(&|r| r.raw_write);
    let raw_r = med(&|r| r.raw_read);
    let pw = med(&|r| r.pool_write);
    let pr = med(&|r| r.pool_read);
    let ideal_w = raw_w * fraction;
    let micro = microbench();
    let result = serde_json::json!({
        "layout": a.layout, "devices": a.devices, "size": size, "recordsize": record, "runs": a.runs,
        "raw_write_mb_s": raw_w / 1e6, "raw_cold_read_mb_s": raw_r / 1e6,
        "pool_write_mb_s": pw / 1e6, "pool_cold_read_mb_s": pr / 1e6,
        "ideal_write_mb_s": ideal_w / 1e6,
        "zfs_fuse_write_mb_s": if a.zfs_fuse { Some(med(&|r| r.zfs.map(|z| z.0).unwrap_or(0.0)) / 1e6) } else { None },
        "zfs_fuse_cold_read_mb_s": if a.zfs_fuse { Some(med(&|r| r.zfs.map(|z| z.1).unwrap_or(0.0)) / 1e6) } else { None },
        "write_ratio_to_ideal": write_ratio, "read_ratio_to_raw": read_ratio, "direct": !a.buffered,
        "cpu_s_per_gib_write": med(&|r| r.cpu_write_per_gib), "cpu_s_per_gib_read": med(&|r| r.cpu_read_per_gib),
        "per_core_gb_s": micro.iter().map(|(k, v)| serde_json::json!({"what": k, "gb_s": v})).collect::<Vec<_>>(),
    });
    if a.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
        return Ok(());
    }
    println!(
        "{} of {} devices, {} written and read, record {}, median of {} runs",
        a.layout,
        a.devices,
        human(size),
        human(record),
        a.runs
    );
    println!("  raw file write+fsync   {:>8.0} MB/s", raw_w / 1e6);
    println!("  raw file cold read     {:>8.0} MB/s", raw_r / 1e6);
    println!(
        "  pool write+sync        {:>8.0} MB/s   {:.2} x ideal ({:.0} MB/s = raw x {:.3})",
        pw / 1e6,
        pw / ideal_w,
        ideal_w / 1e6,
        fraction
    );
    println!(
        "  pool cold read         {:>8.0} MB/s   {:.2} x raw",
        pr / 1e6,
        pr / raw_r
    );
    println!(
        "  CPU per GiB            write {:.2} s, read {:.2} s",
        med(&|r| r.cpu_write_per_gib),
        med(&|r| r.cpu_read_per_gib)
    );
    if a.zfs_fuse {
        let zw = med(&|r| r.zfs.map(|z| z.0).unwrap_or(0.0));
        let zr = med(&|r| r.zfs.map(|z| z.1).unwrap_or(0.0));
        println!(
            "  zfs-fuse write+fsync   {:>8.0} MB/s   (tank / zfs-fuse: {:.2})",
            zw / 1e6,
            med(&|r| r.pool_write / r.zfs.map(|z| z.0).unwrap_or(f64::NAN))
        );
        println!(
            "  zfs-fuse cold read     {:>8.0} MB/s   (tank / zfs-fuse: {:.2})",
            zr / 1e6,
            med(&|r| r.pool_read / r.zfs.map(|z| z.1).unwrap_or(f64::NAN))
        );
    }
    for (k, v) in micro {
        println!("  {k:<40} {v:>6.1} GB/s per core");
    }
    Ok(())
}
