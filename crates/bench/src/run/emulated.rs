//! `tank bench --emulate "7x hdd raidz2 + ssd log + ssd cache"`: the benchmark run on a pool of
//! emulated devices (sparse files slowed to a device profile's timing), as the real build
//! would run it.
//!
//! # Theory of operation
//! Each device is a sparse file in a temporary directory under the data directory (or as
//! much memory, below), wrapped in an `EmulatedDevice` whose timing model stretches the file's offsets over the profile's full
//! capacity (so seeks cost what they would on the real disk). The pool is built with the
//! zpool grammar (`EmulatedBuild::vdev_tokens`), and every run gets a new pool:
//! - the default (filesystem level): a filesystem dataset (compression off, the record size
//!   asked) mounted with FUSE in this process, and `tank bench`'s phases on the mount, with
//!   the tree test's source in a staging directory beside the devices and an optional
//!   network link in front;
//! - `--engine`: one object written by records with a final sync, read back, and random
//!   8 KiB reads, through the object layer; beside it one emulated device of the profile
//!   measured raw in the same run (the baseline that shows the emulation keeps to the
//!   profile, and what the pool makes of it), and before that the same file bare: a host
//!   whose files are not well above the profile's pace cannot emulate it, and the output
//!   says so.
//!
//! The devices keep their bytes in the process's memory when the run fits in a quarter of
//! the host's ([`backing_for`]), in the sparse files otherwise: a disk moves its bytes by
//! DMA, while the host's page cache copies them with the same CPUs the pool works on, and on
//! a small host that made the host, not the model, set the pace. That memory is taken from
//! the host before the run (`MemDevice::populated`) where the devices' whole capacity fits
//! in half of it: the kernel zeroing fresh pages at each first write took 42% of both CPUs
//! through the mount and showed as the host running past the model. Each device keeps a
//! timeline (busy, positioning, idle, host overrun); both levels print where each device's
//! time went in each phase of the last run (`--engine` on standard output, the filesystem
//! level on standard error).
//!
//! The process's ARC is set to `--arc` (a build scaled down in capacity is scaled down in
//! memory too), and the default size is four times that, so the cache cannot flatter reads.
//! The temporary pool and files are removed at the end of each run, also on errors.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::emulate::EmulatedBuild;
use crate::fsbench::{self, median, FsBenchConfig, FsFigures};
use crate::DeviceProfile;
use anyhow::{bail, Context, Result};
use serde::Serialize;
use tank_dataset::{DatasetKind, Dsl, Op};
use tank_device::{
    BlockDevice, DeviceRef, EmulatedDevice, FileDevice, FileDeviceOptions, MemDevice, Timeline,
};
use tank_object::ObjectStore;
use tank_pool::{CreateOptions, Pool, PoolSpec};

use crate::run::mounts::{mount_dataset, unmount_pool};
use crate::run::util::{data_dir, human};
use tank_service::pools::open_datasets;

/// The emulated pool's name and its benchmark filesystem.
const POOL: &str = "emulated";
const DATASET: &str = "emulated/bench";

#[derive(Debug, Clone, Copy, Serialize)]
pub struct EmulatedFigures {
    pub seq_output_block_mb_s: f64,
    pub seq_input_block_mb_s: f64,
    pub random_seeks_per_s: f64,
}

/// A benchmark's temporary directory, removed on drop (and by `clean_up_on_signal`).
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn create(dir: PathBuf) -> Result<Self> {
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        fsbench::track(&dir);
        Ok(TempDir(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
        fsbench::untrack(&self.0);
    }
}

/// A new temporary directory under `base` (the data directory) for run `run` of this
/// process.
fn temp_dir(base: &Path, what: &str, run: usize) -> Result<TempDir> {
    TempDir::create(base.join(format!("{what}-{}-{run}", std::process::id())))
}

/// On SIGINT or SIGTERM, stops the benchmark so that it cleans up as on any error: every
/// phase returns at its next operation, files are closed, an emulated filesystem unmounted,
/// its pool destroyed and every directory the benchmark made removed, then the command
/// fails with "interrupted". If that has not happened within `FORCED_AFTER` (an operation
/// stuck on a device), the handler detaches the emulated filesystem, removes the
/// directories itself and exits.
pub fn clean_up_on_signal() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let Ok(mut signals) = signal_hook::iterator::Signals::new([
            signal_hook::consts::SIGINT,
            signal_hook::consts::SIGTERM,
        ]) else {
            return;
        };
        std::thread::spawn(move || {
            if let Some(sig) = signals.forever().next() {
                eprintln!("\ntank: interrupted: removing the benchmark's files");
                fsbench::interrupt();
                std::thread::sleep(FORCED_AFTER);
                crate::run::mounts::detach_pool(POOL);
                fsbench::remove_tracked();
                std::process::exit(128 + sig);
            }
        });
    });
}

/// How long an interrupted benchmark has to clean up by itself.
const FORCED_AFTER: std::time::Duration = std::time::Duration::from_secs(20);

/// Size of each stand-in device file (sparse): room for `bytes` of data, its redundancy
/// and slack.
fn device_size(build: &EmulatedBuild, bytes: u64) -> u64 {
    let data_devices = build.count as f64 * build.data_fraction();
    // Twice the data (the rewrite phase writes new copies before the old are freed), and
    // slack for metadata, the intent log region and the slop reserve.
    let per = bytes as f64 / data_devices * 2.5;
    (per as u64 + (512 << 20)).max(1 << 30)
}

/// Where an emulated build's devices keep their bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backing {
    /// Sparse files in the run's temporary directory.
    Files,
    /// The process's memory: a disk moves its bytes by DMA, and the host's page cache would
    /// spend these two CPUs copying them (half of all samples of a 7-disk write) that the
    /// pool's own work needs, so the host and not the model set the pace.
    Memory,
}

/// Memory when a run that writes `bytes` to `build` fits in a quarter of this host's
/// memory (its data, the redundancy, and the rewrite's second copy), files otherwise.
pub fn backing_for(build: &EmulatedBuild, bytes: u64) -> Backing {
    let held = bytes as f64 / build.data_fraction().max(0.01) * 2.0;
    let budget = tank_object::arc::physical_memory() as f64 / 4.0;
    if held <= budget {
        Backing::Memory
    } else {
        Backing::Files
    }
}

/// An emulated device of `profile` of `bytes` at `path` (a sparse file there, or as much
/// memory, every page of it taken from the host before the run when `populate`) (scratch:
/// its flushes cost the model's time, not the host disk's).
fn emulated_device(
    path: &Path,
    profile: &DeviceProfile,
    bytes: u64,
    backing: Backing,
    populate: bool,
) -> Result<EmulatedDevice> {
    let name = path.display().to_string();
    let inner: DeviceRef = match backing {
        Backing::Files => device_file(path, bytes)?,
        Backing::Memory if populate => Arc::new(MemDevice::populated(name, bytes)),
        Backing::Memory => Arc::new(MemDevice::mapped(name, bytes)),
    };
    Ok(EmulatedDevice::scratch(inner, profile.model(bytes)))
}

/// A new sparse file of `bytes` at `path`, as a device.
fn device_file(path: &Path, bytes: u64) -> Result<DeviceRef> {
    let file = FileDevice::open(
        path,
        &FileDeviceOptions {
            create_size: Some(bytes),
            ..Default::default()
        },
    )?;
    Ok(Arc::new(file))
}

/// Builds the emulated pool of `build` in `dir` (device files of `dev_size`, log and cache
/// devices of 1 GiB).
pub fn create_pool(build: &EmulatedBuild, dev_size: u64, dir: &Path) -> Result<Arc<Pool>> {
    Ok(create_pool_watched(build, dev_size, dir, Backing::Files)?.0)
}

/// Size of each log and cache device of an emulated build.
const EXTRA_DEVICE_BYTES: u64 = 1 << 30;

/// An emulated pool's devices by name.
type Watched = Vec<(String, Arc<EmulatedDevice>)>;

/// `create_pool` with the devices' bytes where `backing` says, and the emulated devices by
/// name, to read their timelines.
fn create_pool_watched(
    build: &EmulatedBuild,
    dev_size: u64,
    dir: &Path,
    backing: Backing,
) -> Result<(Arc<Pool>, Watched)> {
    let mut devices: HashMap<String, DeviceRef> = HashMap::new();
    let mut watched = Vec::new();
    // The devices' whole capacity is taken up front only where it fits in half of memory
    // (7 disks of 1 GiB do, 24 would not); otherwise only what is written is ever taken, at
    // its first write.
    let extra: u64 = build.extra.iter().map(|(_, n, _)| *n as u64).sum();
    let capacity = build.count as u64 * dev_size + extra * EXTRA_DEVICE_BYTES;
    let populate = capacity <= tank_object::arc::physical_memory() / 2;
    let mut make = |name: String, profile: &DeviceProfile, bytes: u64| -> Result<String> {
        let dev = Arc::new(emulated_device(
            &dir.join(&name),
            profile,
            bytes,
            backing,
            populate,
        )?);
        watched.push((name.clone(), dev.clone()));
        devices.insert(name.clone(), dev);
        Ok(name)
    };
    let data: Vec<String> = (0..build.count)
        .map(|i| make(format!("data{i}"), &build.profile, dev_size))
        .collect::<Result<_>>()?;
    let mut tokens = build.vdev_tokens(&data);
    for (k, (section, n, profile)) in build.extra.iter().enumerate() {
        tokens.push(section.clone());
        for i in 0..*n {
            tokens.push(make(
                format!("{section}{k}-{i}"),
                profile,
                EXTRA_DEVICE_BYTES,
            )?);
        }
    }
    let spec = PoolSpec::parse(&tokens, true)?;
    let (pool, _) = Pool::create(POOL, &spec, &devices, &CreateOptions::default())?;
    Ok((pool, watched))
}

/// What each emulated device did during one phase of a run, and how long the phase took.
#[derive(Debug, Clone)]
pub struct PhaseDisks {
    pub phase: String,
    pub wall: Duration,
    pub disks: Vec<(String, Timeline)>,
}

/// Takes the devices' timelines at the start of a phase; `end` gives what each did in it.
struct PhaseWatch<'a> {
    devices: &'a [(String, Arc<EmulatedDevice>)],
    start: Instant,
    before: Vec<Timeline>,
}

impl<'a> PhaseWatch<'a> {
    fn start(devices: &'a [(String, Arc<EmulatedDevice>)]) -> Self {
        PhaseWatch {
            devices,
            start: Instant::now(),
            before: devices.iter().map(|(_, d)| d.timeline()).collect(),
        }
    }

    fn end(self, phase: impl Into<String>) -> PhaseDisks {
        let wall = self.start.elapsed();
        let disks = self
            .devices
            .iter()
            .zip(&self.before)
            .map(|((name, d), before)| (name.clone(), d.timeline().since(before)))
            .collect();
        PhaseDisks {
            phase: phase.into(),
            wall,
            disks,
        }
    }
}

/// Prints where each device's time went in each phase: busy (by the model) and of that
/// positioning (seeks and rotation), idle (and in gaps of 1 ms or more), the host running
/// past the model, and the mean request.
pub fn print_disk_time(out: &mut dyn std::io::Write, phases: &[PhaseDisks]) {
    let w = phases
        .iter()
        .map(|p| p.phase.len())
        .max()
        .unwrap_or(0)
        .max(5);
    let _ = writeln!(
        out,
        "  where the devices' time went, last run (per cent of the phase's wall time):"
    );
    let _ = writeln!(
        out,
        "  {:<w$} {:<8} {:>6} {:>6} {:>6} {:>6} {:>9} {:>8} {:>9} {:>7}",
        "PHASE",
        "DEVICE",
        "BUSY",
        "SEEK",
        "IDLE",
        "HOST",
        "IDLE GAPS",
        "REQUESTS",
        "MEAN KiB",
        "SEEKS"
    );
    for p in phases {
        let wall = p.wall.as_nanos().max(1) as f64;
        let pct = |ns: u64| ns as f64 / wall * 100.0;
        for (name, t) in &p.disks {
            let requests = t.reads + t.writes;
            if requests == 0 {
                continue;
            }
            let bytes = t.read_bytes + t.write_bytes;
            let _ = writeln!(
                out,
                "  {:<w$} {:<8} {:>5.1}% {:>5.1}% {:>5.1}% {:>5.1}% {:>9} {:>8} {:>9.1} {:>7}",
                p.phase,
                name,
                pct(t.busy_ns),
                pct(t.positioning_ns),
                pct(t.idle_ns),
                pct(t.overrun_ns),
                t.idle_gaps,
                requests,
                bytes as f64 / requests as f64 / 1024.0,
                t.repositions
            );
        }
    }
}

/// An emulated pool with its benchmark filesystem mounted; on drop the filesystem is
/// unmounted, the pool destroyed and its files removed, whatever happened before.
struct Mounted {
    open: Option<(Arc<Pool>, Arc<ObjectStore>, Arc<Dsl>)>,
    devices: Watched,
    mnt: PathBuf,
    staging: PathBuf,
    _tmp: TempDir,
}

impl Mounted {
    fn new(
        base: &Path,
        build: &EmulatedBuild,
        bytes: u64,
        recordsize: u32,
        primarycache: &str,
        run: usize,
    ) -> Result<Self> {
        let tmp = temp_dir(base, "emulate", run)?;
        let backing = backing_for(build, bytes);
        let (pool, devices) =
            create_pool_watched(build, device_size(build, bytes), &tmp.0, backing)?;
        let (store, dsl) = open_datasets(&pool)?;
        let mut m = Mounted {
            open: Some((pool, store.clone(), dsl.clone())),
            devices,
            mnt: tmp.0.join("mnt"),
            staging: tmp.0.join("staging"),
            _tmp: tmp,
        };
        dsl.run(Op::Create {
            name: DATASET.into(),
            kind: DatasetKind::Filesystem,
            props: vec![
                ("compression".into(), "off".into()),
                ("recordsize".into(), recordsize.to_string()),
                ("primarycache".into(), primarycache.to_string()),
            ],
            parents: false,
        })?;
        std::fs::create_dir_all(&m.staging)
            .with_context(|| format!("cannot create {}", m.staging.display()))?;
        m.mnt = mount_dataset(&dsl, &store, DATASET, Some(&m.mnt)).context(
            "the filesystem-level emulated benchmark mounts with FUSE (root and /dev/fuse); \
             --engine measures the pool without it",
        )?;
        Ok(m)
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        tear_down(POOL, self.open.take().map(|o| o.0));
    }
}

/// Unmounts a benchmark pool's filesystems and destroys the pool (warning, not failing,
/// when a filesystem cannot be unmounted).
pub fn tear_down(name: &str, pool: Option<Arc<Pool>>) {
    if let Err(e) = unmount_pool(name) {
        eprintln!(
            "warning: cannot unmount the benchmark's filesystem: {}",
            tank_service::error::chain(&e)
        );
    }
    if let Some(pool) = pool {
        let _ = pool.destroy();
    }
}

/// Sets the process's ARC to `arc` bytes for an emulated build.
pub fn set_arc(arc: u64) -> Result<()> {
    tank_object::arc::global()
        .set_max(arc)
        .map_err(|e| anyhow::anyhow!("--arc: {e}"))
}

/// The filesystem-level benchmark of `build`, one new pool per run in a temporary
/// directory under `base`, the filesystem's `primarycache` as given (all, metadata, none);
/// `progress` as `fsbench::run` reports it, over all runs. Also gives where each device's
/// time went in each phase of the last run.
pub fn fs_runs(
    base: &Path,
    build: &EmulatedBuild,
    cfg: &FsBenchConfig,
    primarycache: &str,
    progress: &mut dyn FnMut(&str, f64),
) -> Result<(Vec<FsFigures>, Vec<PhaseDisks>)> {
    let mut out = Vec::new();
    let mut disk_time = Vec::new();
    let bytes = cfg.size + cfg.tree_files as u64 * 40_000 + cfg.files as u64 * 4096;
    let recordsize = u32::try_from(cfg.recordsize).context("record size")?;
    eprintln!(
        "the emulated devices keep their bytes {}",
        match backing_for(build, bytes) {
            Backing::Memory => "in memory",
            Backing::Files => "in sparse files (the run does not fit in a quarter of memory)",
        }
    );
    for run in 0..cfg.runs {
        let m = Mounted::new(base, build, bytes, recordsize, primarycache, run)?;
        let one = FsBenchConfig {
            runs: 1,
            staging: Some(m.staging.clone()),
            ..cfg.clone()
        };
        let mut phases = Vec::new();
        let mut watch: Option<(String, PhaseWatch)> = None;
        let mut report = |phase: &str, done: f64| {
            // A new phase: the devices' time of the one before it is taken.
            let name = phase.rsplit(": ").next().unwrap_or(phase).to_string();
            if watch.as_ref().is_none_or(|(n, _)| *n != name) {
                if let Some((n, w)) = watch.take() {
                    phases.push(w.end(n));
                }
                if name != "done" {
                    watch = Some((name, PhaseWatch::start(&m.devices)));
                }
            }
            let phase = phase.replacen("run 1/1", &format!("run {}/{}", run + 1, cfg.runs), 1);
            progress(&phase, (run as f64 + done) / cfg.runs as f64);
        };
        let mut figures = fsbench::run(&m.mnt, &one, &mut report)
            .with_context(|| format!("benchmark of the emulated build, run {}", run + 1))?;
        out.append(&mut figures);
        drop(m);
        disk_time = phases;
    }
    Ok((out, disk_time))
}

/// Incompressible bytes, 8 MiB, so the devices move every logical byte.
fn stream_chunk() -> Vec<u8> {
    fsbench::pattern(8 << 20, 0x9e37_79b9_7f4a_7c15)
}

/// Random 8 KiB-aligned offsets below `span`.
fn random_offsets(span: u64, n: usize) -> Vec<u64> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % (span.saturating_sub(8192) / 8192).max(1) * 8192
        })
        .collect()
}

/// One device file measured raw, first bare (the host's own pace, which bounds any emulation
/// on it) and then as an emulated device of `profile`: `size` bytes written and read in 1 MiB
/// requests from the start, then `seeks` random 8 KiB reads over the whole device. The bare
/// phases run twice and the second pass counts: the first allocates the file's pages (a
/// machine's first touch of fresh memory can be slower than anything after it), so both
/// measured passes see the file in the same state.
fn raw_device(
    profile: &DeviceProfile,
    size: u64,
    seeks: usize,
    run: usize,
) -> Result<(EmulatedFigures, EmulatedFigures)> {
    let tmp = temp_dir(&data_dir(), "emulate-raw", run)?;
    let bytes = size.max(1 << 30);
    let file = device_file(&tmp.0.join("raw"), bytes)?;
    stream_phases(&*file, size, seeks, false)?;
    let host = stream_phases(&*file, size, seeks, false)?;
    let dev = EmulatedDevice::scratch(file, profile.model(bytes));
    let emulated = stream_phases(&dev, size, seeks, true)?;
    Ok((host, emulated))
}

/// The raw phases of `raw_device` on `dev`; `flush` ends the write phase with a flush (a
/// scratch emulated device's costs the model's time; the bare file's would cost the host
/// disk's, which no emulation pays).
fn stream_phases(
    dev: &dyn BlockDevice,
    size: u64,
    seeks: usize,
    flush: bool,
) -> Result<EmulatedFigures> {
    let chunk = stream_chunk();
    let req = 1usize << 20;
    let t = Instant::now();
    let mut off = 0u64;
    while off < size {
        fsbench::check_interrupted()?;
        let i = (off as usize) % chunk.len();
        dev.write_at(&chunk[i..i + req], off)?;
        off += req as u64;
    }
    if flush {
        dev.flush()?;
    }
    let write = off as f64 / t.elapsed().as_secs_f64() / 1e6;
    let mut buf = vec![0u8; req];
    let t = Instant::now();
    let mut off = 0u64;
    while off < size {
        fsbench::check_interrupted()?;
        dev.read_at(&mut buf, off)?;
        off += req as u64;
    }
    let read = off as f64 / t.elapsed().as_secs_f64() / 1e6;
    let mut small = vec![0u8; 8192];
    let t = Instant::now();
    // Over the whole device, as the profile's random reads are.
    for at in random_offsets(dev.size(), seeks) {
        fsbench::check_interrupted()?;
        dev.read_at(&mut small, at)?;
    }
    let iops = seeks as f64 / t.elapsed().as_secs_f64();
    Ok(EmulatedFigures {
        seq_output_block_mb_s: write,
        seq_input_block_mb_s: read,
        random_seeks_per_s: iops,
    })
}

/// The engine-level phases on one new emulated pool.
fn engine_run(
    build: &EmulatedBuild,
    size: u64,
    recordsize: u32,
    seeks: usize,
    run: usize,
) -> Result<(EmulatedFigures, Vec<PhaseDisks>)> {
    let tmp = temp_dir(&data_dir(), "emulate", run)?;
    let backing = backing_for(build, size);
    let (pool, devices) = create_pool_watched(build, device_size(build, size), &tmp.0, backing)?;
    let result = (|| -> Result<(EmulatedFigures, Vec<PhaseDisks>)> {
        let mut phases = Vec::new();
        let store = ObjectStore::open(pool.clone())?;
        let os = store.objset(tank_object::ROOT_OBJSET)?;
        let id = {
            let tx = store.begin(0)?;
            os.create_object(&tx, 1, recordsize)?
        };
        let chunk = stream_chunk();
        let watch = PhaseWatch::start(&devices);
        let t = Instant::now();
        let mut off = 0u64;
        while off < size {
            fsbench::check_interrupted()?;
            let n = (chunk.len() as u64).min(size - off) as usize;
            let tx = store.begin(n as u64)?;
            os.write(&tx, id, off, &chunk[..n])?;
            drop(tx);
            off += n as u64;
        }
        store.sync()?;
        let write = size as f64 / t.elapsed().as_secs_f64() / 1e6;
        phases.push(watch.end("write"));
        // What the ARC kept of the writes would flatter the reads: start them cold.
        store.cache().arc().remove_spa(store.cache().spa());
        let watch = PhaseWatch::start(&devices);
        let t = Instant::now();
        let mut off = 0u64;
        while off < size {
            fsbench::check_interrupted()?;
            let got = os.read(id, off, 8 << 20)?;
            if got.is_empty() {
                break;
            }
            off += got.len() as u64;
        }
        let read = size as f64 / t.elapsed().as_secs_f64() / 1e6;
        phases.push(watch.end("read"));
        store.cache().arc().remove_spa(store.cache().spa());
        let watch = PhaseWatch::start(&devices);
        let t = Instant::now();
        for at in random_offsets(size, seeks) {
            fsbench::check_interrupted()?;
            os.read(id, at, 8192)?;
        }
        let iops = seeks as f64 / t.elapsed().as_secs_f64();
        phases.push(watch.end("seeks"));
        let figures = EmulatedFigures {
            seq_output_block_mb_s: write,
            seq_input_block_mb_s: read,
            random_seeks_per_s: iops,
        };
        Ok((figures, phases))
    })();
    let _ = pool.destroy();
    drop(pool);
    result
}

/// How much faster than a profile the bare host file must be for the emulation to keep to
/// the profile: each emulated operation costs the longer of the host's time and the model's,
/// so a host near the profile's pace drags the average below it.
const HOST_MARGIN: f64 = 2.0;

/// The figures for which the bare host file was under `HOST_MARGIN` times the profile.
fn host_bound(host: &EmulatedFigures, profile: &EmulatedFigures) -> Vec<&'static str> {
    let pairs = [
        (
            "seq_output_block_mb_s",
            host.seq_output_block_mb_s,
            profile.seq_output_block_mb_s,
        ),
        (
            "seq_input_block_mb_s",
            host.seq_input_block_mb_s,
            profile.seq_input_block_mb_s,
        ),
        (
            "random_seeks_per_s",
            host.random_seeks_per_s,
            profile.random_seeks_per_s,
        ),
    ];
    pairs
        .into_iter()
        .filter(|&(_, h, p)| h < HOST_MARGIN * p)
        .map(|(name, _, _)| name)
        .collect()
}

fn medians(all: &[EmulatedFigures]) -> EmulatedFigures {
    let med = |f: fn(&EmulatedFigures) -> f64| median(&mut all.iter().map(f).collect::<Vec<_>>());
    EmulatedFigures {
        seq_output_block_mb_s: med(|f| f.seq_output_block_mb_s),
        seq_input_block_mb_s: med(|f| f.seq_input_block_mb_s),
        random_seeks_per_s: med(|f| f.random_seeks_per_s),
    }
}

/// `tank bench --emulate SPEC --engine`.
pub fn run_engine(spec: &str, size: u64, recordsize: u32, runs: usize, json: bool) -> Result<()> {
    let build = EmulatedBuild::parse(spec)?;
    if runs == 0 {
        bail!("--runs must be at least 1");
    }
    let seeks = 400;
    let raw_size = size.min(512 << 20);
    let (mut pool, mut raw, mut bare) = (Vec::new(), Vec::new(), Vec::new());
    let mut last_phases = Vec::new();
    for r in 0..runs {
        eprintln!("run {}/{runs}: {spec}, {} ...", r + 1, human(size));
        let (host_file, device) = raw_device(&build.profile, raw_size, seeks, r)?;
        bare.push(host_file);
        raw.push(device);
        let (figures, phases) = engine_run(&build, size, recordsize, seeks, r)?;
        pool.push(figures);
        last_phases = phases;
    }
    let (result, device, host) = (medians(&pool), medians(&raw), medians(&bare));
    let p = &build.profile;
    let profile = EmulatedFigures {
        seq_output_block_mb_s: p.write_bw / 1e6,
        seq_input_block_mb_s: p.read_bw / 1e6,
        random_seeks_per_s: p.random_read_iops(8192),
    };
    if json {
        let in_memory = backing_for(&build, size) == Backing::Memory;
        let out = serde_json::json!({"emulate": spec, "size": size, "recordsize": recordsize, "runs": runs,
            "devices_in_memory": in_memory,
            "median": result, "raw_device": device, "host_file": host, "profile": profile,
            "device_profile": p, "host_margin": HOST_MARGIN, "host_bound": host_bound(&host, &profile),
            "disk_time_last_run": disk_time_json(&last_phases)});
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    let backing = match backing_for(&build, size) {
        Backing::Memory => "in memory",
        Backing::Files => "on sparse files",
    };
    println!(
        "emulated {spec}: {} per run, record {}, median of {runs} (engine level; the pool's devices' bytes {backing}; one device raw over {})",
        human(size),
        human(u64::from(recordsize)),
        human(raw_size)
    );
    type Figure = fn(&EmulatedFigures) -> f64;
    let rows: [(&str, Figure, &str); 3] = [
        ("Seq output block", |f| f.seq_output_block_mb_s, "MB/s"),
        ("Seq input block", |f| f.seq_input_block_mb_s, "MB/s"),
        ("Random seeks", |f| f.random_seeks_per_s, "/s (8 KiB reads)"),
    ];
    println!(
        "  {:<18} {:>10} {:>10} {:>10} {:>12} {:>10}",
        "FIGURE", "POOL", "DEVICE", "PROFILE", "DEVICE/PROF", "HOST FILE"
    );
    for (name, f, unit) in rows {
        println!(
            "  {name:<18} {:>10.1} {:>10.1} {:>10.1} {:>11.0}% {:>10.1}  {unit}",
            f(&result),
            f(&device),
            f(&profile),
            f(&device) / f(&profile) * 100.0,
            f(&host)
        );
    }
    for figure in host_bound(&host, &profile) {
        println!(
            "  warning: the bare host file is under {HOST_MARGIN}x the profile's {figure}: \
             the emulation cannot keep to the profile there, and the figures show the host's pace"
        );
    }
    println!(
        "  device profile: {} — {:.0} MB/s, {:.0} random 8 KiB reads/s",
        p.name,
        p.read_bw / 1e6,
        p.random_read_iops(8192)
    );
    if !build.extra.is_empty() {
        println!("  log and cache devices are in the pool; 'tank bench-cache' and 'tank bench-sync' measure what they buy");
    }
    print_disk_time(&mut std::io::stdout(), &last_phases);
    Ok(())
}

/// The devices' timelines of `print_disk_time`, for `--json`.
fn disk_time_json(phases: &[PhaseDisks]) -> serde_json::Value {
    let phases: Vec<_> = phases
        .iter()
        .map(|p| {
            let disks: Vec<_> = p
                .disks
                .iter()
                .map(|(name, t)| {
                    serde_json::json!({"device": name, "reads": t.reads, "writes": t.writes,
                        "flushes": t.flushes, "read_bytes": t.read_bytes, "write_bytes": t.write_bytes,
                        "busy_ns": t.busy_ns, "positioning_ns": t.positioning_ns,
                        "repositions": t.repositions, "idle_ns": t.idle_ns, "idle_gaps": t.idle_gaps,
                        "overrun_ns": t.overrun_ns})
                })
                .collect();
            serde_json::json!({"phase": p.phase, "wall_ns": p.wall.as_nanos() as u64, "devices": disks})
        })
        .collect();
    serde_json::Value::Array(phases)
}
