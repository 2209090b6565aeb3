//! `tank bench-engine`: engine throughput of a pool layout, as ratios against the raw device
//! files measured in the same run, plus the CPU cost per GiB and the per-core speed of parity
//! and checksums; with `--fuse` also tank through its FUSE mount, beside zfs-fuse
//! (`--zfs-fuse`) and the host file system.
//!
//! # Method
//! In the bench directory (one file system, so one disk), each run measures in turn:
//! - *host*: write `size` bytes of incompressible data to one plain file with an fsync at the
//!   end (raw write), drop its cached pages and read it (raw cold read);
//! - *engine*: build the pool from N file devices in the same directory, write the same
//!   amount as one object and wait for the txg sync, free it (a daemon's steady state: the
//!   memory its ARC and buffers use is the process's already), write a second object and
//!   wait for the sync (pool write), close the pool, drop the device files' cached pages,
//!   import and read the object back (pool cold read). The CPU of the first write, into
//!   memory the kernel hands the process for the first time, is reported apart;
//! - *tank FUSE* (`--fuse`): a new pool of the same layout with one filesystem dataset
//!   (compression off, record size `--recordsize`) mounted in this process under the bench
//!   directory as `tank mount` mounts it; the same bytes written to one file through std::fs
//!   with an fsync at the end; then unmount, export, drop the device files' cached pages,
//!   import, mount and read the file cold; then the small-file test on that mount;
//! - *tank FUSE direct=always* (`--fuse --direct`): the same on a dataset set
//!   `direct=always`, so the streams bypass the kernel's page cache (and the ARC keeps
//!   none of the blocks they read);
//! - *zfs-fuse* (`--zfs-fuse`): the same layout under a running zfs-fuse daemon
//!   (compression off, its largest record size 128K): the same file written and fsynced
//!   through its mount, export, cached pages dropped, import, cold read, and (with `--fuse`)
//!   the small-file test;
//! - *host small files* (`--fuse`): the small-file test in a plain directory.
//!
//! The small-file test is bonnie++'s sequential `-n`: `--files` files of 0 to 1 KiB (the
//! same sizes on every system) spread over 100 directories, created in order (open with
//! O_EXCL, write, close); then every directory read and each entry stat'ed by name in it;
//! then every directory read again, each entry unlinked and the directory removed. Each phase
//! is timed alone, in files/s, with no sync, as bonnie++ does (whose stat phase also reads
//! each file's bytes; this one only stats). Stream reads check a sample of every request
//! against what was written, the stat phase every file's size.
//!
//! The report names the machine's cpuidle driver, governor and guest halt-polling window:
//! where a halted vCPU is woken through the hypervisor, that wake-up is most of a FUSE
//! metadata round trip. `--awake` keeps every CPU out of halt at idle priority for the
//! whole measurement, every system alike (`awake.rs`).
//!
//! Systems alternate within each run, so a noisy neighbour hits them alike. Each figure is
//! the median of `--runs` runs (with min and max); each ratio is computed per run and then
//! medianed. The ideal pool write is `raw_write x data fraction` (5/7 for raidz2 of 7), since
//! every byte of parity also goes to the same disk.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use crate::fsbench::median;
use anyhow::{bail, Context, Result};
use clap::Args;
use comfy_table::{presets, Table};
use rand::{RngCore, SeedableRng};
use tank_dataset::{DatasetKind, Dsl, Op};
use tank_device::DeviceRef;
use tank_object::ObjectStore;
use tank_pool::{CreateOptions, ImportOptions, Pool, PoolSpec};

use crate::run::mounts::{mount_dataset, unmount_pool};
use crate::run::util::{human, parse_recordsize, parse_size, DATASET_MAX_RECORD};
use tank_service::pools::{open_datasets, open_device};

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
    /// Also measure tank through a FUSE mount of a filesystem dataset (needs root and
    /// /dev/fuse), with the small-file test there and on the host file system.
    #[arg(long)]
    fuse: bool,
    /// With --fuse, also measure a second FUSE dataset with `direct=always` (every file
    /// past the kernel's page cache, the blocks a read covers whole not kept in the ARC).
    #[arg(long)]
    direct: bool,
    /// Files of the small-file test (with --fuse; 0 skips it).
    #[arg(long, default_value_t = 100_000)]
    files: usize,
    /// Also measure zfs-fuse on the same layout (needs zpool/zfs and a running zfs-fuse).
    #[arg(long)]
    zfs_fuse: bool,
    /// Read the pools back without dropping the device files' cached pages (separates the
    /// engine's own cost from the devices').
    #[arg(long)]
    warm: bool,
    /// Open the pool's device files through the page cache instead of O_DIRECT.
    #[arg(long)]
    buffered: bool,
    /// Keep every CPU out of halt for the whole measurement with an idle-priority spinner
    /// per CPU (as guest halt polling would), for every system measured alike.
    #[arg(long)]
    awake: bool,
    #[arg(long)]
    json: bool,
}

/// What was measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum System {
    /// A plain file or directory on the host file system holding the bench directory.
    Host,
    /// The pool, one object written and read through the object layer.
    Engine,
    /// tank through its FUSE mount.
    Fuse,
    /// tank through its FUSE mount, the dataset set `direct=always`.
    FuseDirect,
    ZfsFuse,
}

impl System {
    const ALL: [System; 5] = [
        System::Host,
        System::Engine,
        System::Fuse,
        System::FuseDirect,
        System::ZfsFuse,
    ];

    fn key(self) -> &'static str {
        match self {
            System::Host => "host",
            System::Engine => "engine",
            System::Fuse => "tank_fuse",
            System::FuseDirect => "tank_fuse_direct",
            System::ZfsFuse => "zfs_fuse",
        }
    }

    fn label(self) -> &'static str {
        match self {
            System::Host => "host fs",
            System::Engine => "engine",
            System::Fuse => "tank FUSE",
            System::FuseDirect => "tank FUSE direct=always",
            System::ZfsFuse => "zfs-fuse",
        }
    }
}

/// A figure of one system: bytes/s for the streams, files/s for the small-file phases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Metric {
    Write,
    Read,
    Create,
    Stat,
    Unlink,
}

impl Metric {
    const ALL: [Metric; 5] = [
        Metric::Write,
        Metric::Read,
        Metric::Create,
        Metric::Stat,
        Metric::Unlink,
    ];
    const SMALL: [Metric; 3] = [Metric::Create, Metric::Stat, Metric::Unlink];

    fn key(self) -> &'static str {
        match self {
            Metric::Write => "write_mb_s",
            Metric::Read => "cold_read_mb_s",
            Metric::Create => "create_per_s",
            Metric::Stat => "stat_per_s",
            Metric::Unlink => "unlink_per_s",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Metric::Write => "write",
            Metric::Read => "cold read",
            Metric::Create => "create",
            Metric::Stat => "stat",
            Metric::Unlink => "unlink",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Metric::Write => "write+fsync MB/s",
            Metric::Read => "cold read MB/s",
            Metric::Create => "create/s",
            Metric::Stat => "stat/s",
            Metric::Unlink => "unlink/s",
        }
    }

    /// The figure as shown: MB/s for streams, files/s for the others.
    fn shown(self, v: f64) -> f64 {
        match self {
            Metric::Write | Metric::Read => v / 1e6,
            _ => v,
        }
    }
}

type Key = (System, Metric);
/// Write and cold read, bytes/s.
type Seq = (f64, f64);
/// Create, stat and unlink, files/s.
type Small = [f64; 3];

/// The figures of one run.
#[derive(Default)]
struct Run {
    figures: BTreeMap<Key, f64>,
    cpu_write_per_gib: f64,
    cpu_read_per_gib: f64,
    /// The first write's, into memory the process never had (see `engine_run`).
    cpu_first_write_per_gib: f64,
}

impl Run {
    fn seq(&mut self, s: System, (write, read): Seq) {
        self.figures.insert((s, Metric::Write), write);
        self.figures.insert((s, Metric::Read), read);
    }

    fn small(&mut self, s: System, rates: Option<Small>) {
        for (m, v) in Metric::SMALL.into_iter().zip(rates.into_iter().flatten()) {
            self.figures.insert((s, m), v);
        }
    }
}

/// Median, min and max of one figure (or ratio) over the runs that have it.
#[derive(Debug, Clone, Copy)]
struct Spread {
    median: f64,
    min: f64,
    max: f64,
}

impl Spread {
    fn of(mut v: Vec<f64>) -> Option<Spread> {
        if v.is_empty() {
            return None;
        }
        let median = median(&mut v);
        Some(Spread {
            median,
            min: v[0],
            max: v[v.len() - 1],
        })
    }

    fn map(self, f: impl Fn(f64) -> f64) -> Spread {
        Spread {
            median: f(self.median),
            min: f(self.min),
            max: f(self.max),
        }
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({"median": self.median, "min": self.min, "max": self.max})
    }
}

/// A ratio of two figures, computed per run: `num / (den x scale)`.
struct Ratio {
    what: String,
    num: Key,
    den: Key,
    scale: f64,
    /// The target it must reach, if there is one.
    target: Option<f64>,
}

impl Ratio {
    fn spread(&self, runs: &[Run]) -> Option<Spread> {
        Spread::of(
            runs.iter()
                .filter_map(|r| {
                    Some(r.figures.get(&self.num)? / (r.figures.get(&self.den)? * self.scale))
                })
                .collect(),
        )
    }
}

/// The ratios reported, with their targets (the engine issue's and the FUSE issue's).
fn ratios(fraction: f64) -> Vec<Ratio> {
    use Metric::*;
    use System::*;
    let mut v = vec![Ratio {
        what: "engine write / ideal (host write x data fraction)".into(),
        num: (Engine, Write),
        den: (Host, Write),
        scale: fraction,
        target: Some(0.8),
    }];
    // (numerator, denominator, the figures compared, target)
    let pairs: [(System, System, &[Metric], Option<f64>); 8] = [
        (Engine, Host, &[Read], Some(0.8)),
        (Fuse, Engine, &[Write, Read], Some(0.6)),
        (FuseDirect, Engine, &[Write, Read], Some(0.6)),
        (Fuse, ZfsFuse, &Metric::ALL, Some(2.0)),
        (FuseDirect, ZfsFuse, &Metric::ALL, Some(2.0)),
        (Engine, ZfsFuse, &[Write, Read], None),
        (Fuse, Host, &Metric::SMALL, None),
        (FuseDirect, Host, &Metric::SMALL, None),
    ];
    for (num, den, metrics, target) in pairs {
        for &m in metrics {
            v.push(Ratio {
                what: format!(
                    "{} {} / {} {}",
                    num.label(),
                    m.name(),
                    den.label(),
                    m.name()
                ),
                num: (num, m),
                den: (den, m),
                scale: 1.0,
                target,
            });
        }
    }
    v
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

pub(crate) fn drop_caches(names: &[String]) -> Result<()> {
    names.iter().try_for_each(|n| drop_cache(Path::new(n)))
}

/// Writes `size` bytes (repeating `data`) to a new file with an fsync; returns bytes/s.
fn write_file(path: &Path, size: u64, data: &[u8]) -> Result<f64> {
    let t = Instant::now();
    let mut f =
        std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let mut left = size;
    while left > 0 {
        let n = (data.len() as u64).min(left) as usize;
        f.write_all(&data[..n])?;
        left -= n as u64;
    }
    f.sync_all()?;
    Ok(size as f64 / t.elapsed().as_secs_f64())
}

/// Reads a file written by `write_file` in 1 MiB requests, checking the start of each
/// against `data`; returns bytes/s.
fn read_file(path: &Path, size: u64, data: &[u8]) -> Result<f64> {
    let t = Instant::now();
    let mut f =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        let at = (off % data.len() as u64) as usize;
        let k = n.min(64).min(data.len() - at);
        if buf[..k] != data[at..at + k] {
            bail!("read-back mismatch in {} at {off}", path.display());
        }
        off += n as u64;
    }
    if off != size {
        bail!("{} has {off} bytes, {size} were written", path.display());
    }
    Ok(size as f64 / t.elapsed().as_secs_f64())
}

/// Directories of the small-file test (bonnie++'s `-n files:max:min:dirs`).
const SMALL_DIRS: usize = 100;
/// Largest small file.
const SMALL_MAX: u64 = 1024;

/// bonnie++'s sequential small-file test under `root` (created, and removed at the end):
/// `n` files of 0 to 1 KiB in `SMALL_DIRS` directories, created in order (open with O_EXCL,
/// write, close); then each directory read and each entry stat'ed by name in it; then each
/// directory read again, each entry unlinked and the directory removed. Returns files/s of
/// each phase.
fn small_files(root: &Path, n: usize) -> Result<Small> {
    let dirs: Vec<PathBuf> = (0..SMALL_DIRS.min(n).max(1))
        .map(|d| root.join(format!("{d:05}")))
        .collect();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let sizes: Vec<u64> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % (SMALL_MAX + 1)
        })
        .collect();
    let content = vec![0x5au8; SMALL_MAX as usize];
    for d in &dirs {
        std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
    }
    let rate = |t: Instant| n as f64 / t.elapsed().as_secs_f64();
    let t = Instant::now();
    for (i, &len) in sizes.iter().enumerate() {
        let p = dirs[i * dirs.len() / n].join(format!("{i:07x}"));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&p)
            .with_context(|| format!("cannot create {}", p.display()))?;
        f.write_all(&content[..len as usize])?;
    }
    let create = rate(t);
    // Every entry of every directory, in the order readdir gives them.
    let each_entry = |f: &mut dyn FnMut(&std::fs::DirEntry) -> Result<()>| -> Result<()> {
        let mut seen = 0;
        for d in &dirs {
            let list =
                std::fs::read_dir(d).with_context(|| format!("cannot read {}", d.display()))?;
            for e in list {
                f(&e?)?;
                seen += 1;
            }
        }
        if seen != n {
            bail!("{} holds {seen} files, {n} were created", root.display());
        }
        Ok(())
    };
    let t = Instant::now();
    each_entry(&mut |e| {
        let m = e.metadata()?;
        let i = e
            .file_name()
            .to_str()
            .and_then(|s| usize::from_str_radix(s, 16).ok());
        if i.and_then(|i| sizes.get(i)) != Some(&m.len()) {
            bail!(
                "{} is not as written ({} bytes)",
                e.path().display(),
                m.len()
            );
        }
        Ok(())
    })?;
    let stat = rate(t);
    let t = Instant::now();
    each_entry(&mut |e| Ok(std::fs::remove_file(e.path())?))?;
    for d in &dirs {
        std::fs::remove_dir(d)?;
    }
    let unlink = rate(t);
    std::fs::remove_dir(root)?;
    Ok([create, stat, unlink])
}

/// The small-file test, when asked for.
fn small_phase(a: &BenchArgs, root: &Path) -> Result<Option<Small>> {
    if !a.fuse || a.files == 0 {
        return Ok(None);
    }
    small_files(root, a.files).map(Some)
}

/// CPU time of this process, without `--awake`'s spinners.
fn cpu_seconds() -> f64 {
    crate::run::awake::stat_cpu_seconds("/proc/self/stat")
        - crate::run::awake::spinners_cpu_seconds()
}

pub(crate) fn run_cmd(cmd: &str, args: &[&str]) -> Result<()> {
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

/// Paths of `n` device files `<prefix><i>` in the bench directory.
fn device_names(dir: &Path, prefix: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            dir.join(format!("{prefix}{i}"))
                .to_string_lossy()
                .into_owned()
        })
        .collect()
}

fn remove_files(names: &[String]) {
    for n in names {
        let _ = std::fs::remove_file(n);
    }
}

/// Creates pool `name` of the bench layout on new device files of `per_dev` bytes.
fn create_pool(a: &BenchArgs, name: &str, names: &[String], per_dev: u64) -> Result<Arc<Pool>> {
    let (tokens, _) = layout_spec(&a.layout, names)?;
    let spec = PoolSpec::parse(&tokens, false)?;
    let mut devices = std::collections::HashMap::new();
    remove_files(names);
    for n in names {
        devices.insert(n.clone(), open_device(n, Some(per_dev), !a.buffered)?);
    }
    let (pool, _) = Pool::create(name, &spec, &devices, &CreateOptions::default())?;
    Ok(pool)
}

/// Imports the pool on `names` again after it was closed, cold unless `--warm`.
fn reimport(a: &BenchArgs, names: &[String]) -> Result<Arc<Pool>> {
    if !a.warm {
        drop_caches(names)?;
    }
    let devs: Vec<DeviceRef> = names
        .iter()
        .map(|n| open_device(n, None, !a.buffered))
        .collect::<Result<_>>()?;
    Ok(Pool::import(&devs, &ImportOptions::default())?)
}

/// The same layout under zfs-fuse (compression off, its largest record size 128K): a file
/// written through its FUSE mount and fsynced, then read back after export, dropping the
/// device files' cached pages, and import; then the small-file test. Needs a running
/// zfs-fuse daemon.
fn zfs_fuse_run(
    a: &BenchArgs,
    size: u64,
    data: &[u8],
    per_dev: u64,
) -> Result<(Seq, Option<Small>)> {
    let names = device_names(&a.dir, "zfs-dev", a.devices);
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
        drop_caches(&names)?;
        let dir_s = a.dir.to_string_lossy().into_owned();
        run_cmd("zpool", &["import", "-d", &dir_s, "tankbenchzf"])?;
        let r = read_file(&file, size, data)?;
        let small = small_phase(a, &mnt.join("small"))?;
        Ok(((w, r), small))
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
        eprintln!(
            "warning: could not destroy the zfs-fuse bench pool: {}",
            tank_service::error::chain(&e)
        );
    }
    remove_files(&names);
    let _ = std::fs::remove_dir(&mnt);
    result
}

const FUSE_POOL: &str = "benchfuse";
const FUSE_DATASET: &str = "benchfuse/fs";

/// The FUSE bench pool and its datasets: on drop, its filesystems are unmounted, the pool
/// destroyed and its device files removed, whatever happened before.
struct FusePool {
    open: Option<(Arc<Pool>, Arc<ObjectStore>, Arc<Dsl>)>,
    names: Vec<String>,
}

impl FusePool {
    fn open(&mut self, pool: Arc<Pool>) -> Result<&Arc<Dsl>> {
        let (store, dsl) = open_datasets(&pool)?;
        Ok(&self.open.insert((pool, store, dsl)).2)
    }

    /// Mounts the bench filesystem at `dir`.
    fn mount(&self, dir: &Path) -> Result<()> {
        let (_, store, dsl) = self.open.as_ref().expect("the bench pool is open");
        mount_dataset(dsl, store, FUSE_DATASET, Some(dir))?;
        Ok(())
    }

    /// Unmounts the bench filesystem and exports the pool.
    fn export(&mut self) -> Result<()> {
        unmount_pool(FUSE_POOL)?;
        let (pool, _, _) = self.open.take().expect("the bench pool is open");
        pool.export()?;
        Ok(())
    }
}

impl Drop for FusePool {
    fn drop(&mut self) {
        crate::run::emulated::tear_down(FUSE_POOL, self.open.take().map(|o| o.0));
        remove_files(&self.names);
    }
}

/// tank through FUSE: a filesystem dataset (compression off, record size `record`, the
/// `direct` property as given) on a new pool of the bench layout, mounted in this process;
/// a file written with an fsync, then unmount, export, import and mount again, and the file
/// read cold; then the small-file test on the mount.
fn tank_fuse_run(
    a: &BenchArgs,
    size: u64,
    record: u32,
    direct: &str,
    data: &[u8],
    per_dev: u64,
) -> Result<(Seq, Option<Small>)> {
    let names = device_names(&a.dir, "fuse-dev", a.devices);
    let mut bench = FusePool {
        open: None,
        names: names.clone(),
    };
    bench
        .open(create_pool(a, FUSE_POOL, &names, per_dev)?)?
        .run(Op::Create {
            name: FUSE_DATASET.into(),
            kind: DatasetKind::Filesystem,
            props: vec![
                ("compression".into(), "off".into()),
                ("recordsize".into(), record.to_string()),
                ("direct".into(), direct.into()),
            ],
            parents: false,
        })?;
    let mnt = a.dir.join("tank-mnt");
    bench.mount(&mnt)?;
    let file = mnt.join("data");
    let w = write_file(&file, size, data)?;
    bench.export()?;
    bench.open(reimport(a, &names)?)?;
    bench.mount(&mnt)?;
    let r = read_file(&file, size, data)?;
    let small = small_phase(a, &mnt.join("small"))?;
    drop(bench);
    let _ = std::fs::remove_dir(&mnt);
    Ok(((w, r), small))
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

/// The engine-level pool: one object written and synced, the pool closed and imported
/// again, the object read back. Returns (write, read) in bytes/s and CPU seconds of each.
fn engine_run(
    a: &BenchArgs,
    size: u64,
    record: u32,
    data: &[u8],
    per_dev: u64,
) -> Result<(Seq, (f64, f64, f64))> {
    let names = device_names(&a.dir, "bench-dev", a.devices);
    let pool = create_pool(a, "benchpool", &names, per_dev)?;
    let store = ObjectStore::open(pool.clone())?;
    let os = store.objset(tank_object::ROOT_OBJSET)?;
    let chunk = data.len() as u64;
    let write_object = || -> Result<(u64, f64, f64)> {
        let id = {
            let tx = store.begin(0)?;
            os.create_object(&tx, 1, record)?
        };
        let cpu0 = cpu_seconds();
        let t = Instant::now();
        let mut off = 0u64;
        while off < size {
            let n = chunk.min(size - off) as usize;
            let tx = store.begin(n as u64)?;
            os.write(&tx, id, off, &data[..n])?;
            drop(tx);
            off += n as u64;
        }
        store.sync()?;
        let rate = size as f64 / t.elapsed().as_secs_f64();
        Ok((id, rate, cpu_seconds() - cpu0))
    };
    // The first write runs in a process that has never had the memory its ARC and buffers
    // fill: every page is the kernel's first touch (on a VM several times a memset). A
    // daemon pays that once; afterwards it reuses what the ARC evicts and frees. That first
    // write is reported apart; the object is then freed (its blocks leave the ARC) and the
    // measured write is a second object of the same size.
    let (first, _, cpu_first) = write_object()?;
    {
        let tx = store.begin(0)?;
        os.free_object(&tx, first)?;
    }
    store.sync()?;
    store.sync()?;
    let (id, pool_write, cpu_write) = write_object()?;
    pool.shutdown()?;
    drop(os);
    drop(store);
    drop(pool);
    let pool = reimport(a, &names)?;
    let store = ObjectStore::open(pool.clone())?;
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
    remove_files(&names);
    Ok(((pool_write, pool_read), (cpu_write, cpu_read, cpu_first)))
}

fn one_run(a: &BenchArgs, size: u64, record: u32, data: &[u8]) -> Result<Run> {
    let mut run = Run::default();
    // Host baseline.
    let raw = a.dir.join("raw-baseline");
    let raw_write = write_file(&raw, size, data)?;
    drop_cache(&raw)?;
    let raw_read = read_file(&raw, size, data)?;
    std::fs::remove_file(&raw)?;
    run.seq(System::Host, (raw_write, raw_read));

    let (_, fraction) = layout_spec(&a.layout, &vec![String::new(); a.devices])?;
    // Room for the data twice (the first object's frees may still be deferred), its
    // parity, metadata, the small files and the 1/32 reserve.
    let per_dev = (size as f64 / fraction / a.devices as f64 * 2.6) as u64 + (256 << 20);
    let (seq, (cpu_write, cpu_read, cpu_first)) = engine_run(a, size, record, data, per_dev)?;
    run.seq(System::Engine, seq);
    let gib = size as f64 / (1u64 << 30) as f64;
    run.cpu_write_per_gib = cpu_write / gib;
    run.cpu_read_per_gib = cpu_read / gib;
    run.cpu_first_write_per_gib = cpu_first / gib;

    if a.fuse {
        let (seq, small) = tank_fuse_run(a, size, record, "standard", data, per_dev)?;
        run.seq(System::Fuse, seq);
        run.small(System::Fuse, small);
        if a.direct {
            let (seq, small) = tank_fuse_run(a, size, record, "always", data, per_dev)?;
            run.seq(System::FuseDirect, seq);
            run.small(System::FuseDirect, small);
        }
    }
    if a.zfs_fuse {
        let (seq, small) = zfs_fuse_run(a, size, data, per_dev)?;
        run.seq(System::ZfsFuse, seq);
        run.small(System::ZfsFuse, small);
    }
    run.small(System::Host, small_phase(a, &a.dir.join("host-small"))?);
    Ok(run)
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
    let record = u64::from(parse_recordsize(&a.recordsize, 16 << 20)?);
    if a.fuse && record > DATASET_MAX_RECORD {
        bail!("with --fuse the record size is a dataset's recordsize: at most 1M");
    }
    if a.runs == 0 || a.devices == 0 {
        bail!("--runs and --devices must be at least 1");
    }
    if a.direct && !a.fuse {
        bail!("--direct measures a second FUSE dataset: it needs --fuse");
    }
    std::fs::create_dir_all(&a.dir)
        .with_context(|| format!("cannot create {}", a.dir.display()))?;
    let mut data = vec![0u8; 8 << 20];
    rand::rngs::StdRng::seed_from_u64(42).fill_bytes(&mut data);
    let idle_states = crate::run::awake::idle_states();
    let awake = if a.awake {
        Some(crate::run::awake::Awake::start()?)
    } else {
        None
    };
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
    let awake = awake.map(|w| {
        let n = w.count();
        drop(w);
        n
    });
    let spread = |k: Key| {
        Spread::of(
            runs.iter()
                .filter_map(|r| r.figures.get(&k).copied())
                .collect(),
        )
    };
    let med = |k: Key| spread(k).map(|s| s.median);
    let cpu = |f: fn(&Run) -> f64| median(&mut runs.iter().map(f).collect::<Vec<_>>());
    let (cpu_w, cpu_r) = (cpu(|r| r.cpu_write_per_gib), cpu(|r| r.cpu_read_per_gib));
    let cpu_first = cpu(|r| r.cpu_first_write_per_gib);
    let (_, fraction) = layout_spec(&a.layout, &vec![String::new(); a.devices])?;
    let ratios: Vec<(Ratio, Spread)> = ratios(fraction)
        .into_iter()
        .filter_map(|r| {
            let s = r.spread(&runs)?;
            Some((r, s))
        })
        .collect();
    let micro = microbench();
    let mb = |k: Key| med(k).map(|v| v / 1e6);
    let ratio_of = |what: &str| {
        ratios
            .iter()
            .find(|(r, _)| r.what.starts_with(what))
            .map(|(_, s)| s.median)
    };
    let mut figures = serde_json::Map::new();
    for s in System::ALL {
        let mut m = serde_json::Map::new();
        for k in Metric::ALL {
            if let Some(v) = spread((s, k)) {
                m.insert(k.key().into(), v.map(|x| k.shown(x)).json());
            }
        }
        if !m.is_empty() {
            figures.insert(s.key().into(), m.into());
        }
    }
    let result = serde_json::json!({
        "layout": a.layout, "devices": a.devices, "size": size, "recordsize": record, "runs": a.runs,
        "files": if a.fuse { Some(a.files) } else { None },
        "raw_write_mb_s": mb((System::Host, Metric::Write)), "raw_cold_read_mb_s": mb((System::Host, Metric::Read)),
        "pool_write_mb_s": mb((System::Engine, Metric::Write)), "pool_cold_read_mb_s": mb((System::Engine, Metric::Read)),
        "ideal_write_mb_s": mb((System::Host, Metric::Write)).map(|w| w * fraction),
        "zfs_fuse_write_mb_s": mb((System::ZfsFuse, Metric::Write)),
        "zfs_fuse_cold_read_mb_s": mb((System::ZfsFuse, Metric::Read)),
        "write_ratio_to_ideal": ratio_of("engine write / ideal"), "read_ratio_to_raw": ratio_of("engine cold read / host"),
        "direct": !a.buffered,
        "idle_states": idle_states, "awake_spinners": awake,
        "cpu_s_per_gib_write": cpu_w, "cpu_s_per_gib_read": cpu_r,
        "cpu_s_per_gib_first_write": cpu_first,
        "figures": figures,
        "ratios": ratios.iter().map(|(r, s)| serde_json::json!({
            "what": r.what, "median": s.median, "min": s.min, "max": s.max,
            "target": r.target, "met": r.target.map(|t| s.median >= t),
        })).collect::<Vec<_>>(),
        "per_core_gb_s": micro.iter().map(|(k, v)| serde_json::json!({"what": k, "gb_s": v})).collect::<Vec<_>>(),
    });
    if a.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
        return Ok(());
    }
    // The bench mounts with the default options: the kernel's io_uring queues when offered.
    let fuse_transport = a.fuse.then(|| {
        if tank_fuse::io_uring_offered() {
            "io_uring"
        } else {
            "/dev/fuse"
        }
    });
    println!(
        "{} of {} devices, {} written and read, record {}{}{}, median (min-max) of {} runs",
        a.layout,
        a.devices,
        human(size),
        human(record),
        if a.fuse && a.files > 0 {
            format!(", {} small files", a.files)
        } else {
            String::new()
        },
        match fuse_transport {
            Some(t) => format!(", tank's FUSE requests over {t}"),
            None => String::new(),
        },
        a.runs
    );
    println!(
        "idle states: {idle_states}{}",
        match awake {
            Some(n) => format!("; CPUs kept out of halt by {n} idle-priority spinners (--awake)"),
            None => String::new(),
        }
    );
    let metrics: Vec<Metric> = Metric::ALL
        .into_iter()
        .filter(|&m| System::ALL.iter().any(|&s| spread((s, m)).is_some()))
        .collect();
    let mut t = Table::new();
    t.load_style(presets::NOTHING);
    t.set_header(std::iter::once("").chain(metrics.iter().map(|m| m.label())));
    for s in System::ALL {
        let cells: Vec<String> = metrics
            .iter()
            .map(|&m| {
                spread((s, m)).map_or("-".into(), |v| {
                    let v = v.map(|x| m.shown(x));
                    format!("{:.0} ({:.0}-{:.0})", v.median, v.min, v.max)
                })
            })
            .collect();
        if cells.iter().any(|c| c != "-") {
            t.add_row(std::iter::once(s.label().to_string()).chain(cells));
        }
    }
    println!("{t}");
    let mut t = Table::new();
    t.load_style(presets::NOTHING);
    t.set_header([
        "ratio (per run, then median)",
        "median",
        "min-max",
        "target",
    ]);
    for (r, s) in &ratios {
        t.add_row([
            r.what.to_string(),
            format!("{:.2}", s.median),
            format!("{:.2}-{:.2}", s.min, s.max),
            r.target.map_or(String::new(), |g| {
                format!("{g} {}", if s.median >= g { "met" } else { "NOT met" })
            }),
        ]);
    }
    println!("{t}");
    println!(
        "CPU per GiB (engine): write {cpu_w:.2} s, read {cpu_r:.2} s; \
         the first write, into memory new to the process: {cpu_first:.2} s"
    );
    for (k, v) in micro {
        println!("{k:<40} {v:>6.1} GB/s per core");
    }
    Ok(())
}
