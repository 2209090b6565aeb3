//! A bonnie++-style benchmark of any directory (a tank dataset's mount, or any other file
//! system for comparison), plus the reference build's tree test.
//!
//! # Theory of operation
//! Phases, each run by `jobs` workers started together (a barrier) on files of their own:
//! - *Sequential output, block*: write `size / jobs` bytes per worker in `recordsize`
//!   requests, then fsync (with `sync`, every write is followed by fdatasync).
//! - *Rewrite*: read each block, change it, write it back in place.
//! - *Sequential input, block*: read the file back.
//! - *Random seeks*: reads of 8 KiB at random offsets (one in ten also rewritten), for a
//!   fixed count, as bonnie++ does.
//! - *Small files*: create `files` empty files, stat them, delete them.
//! - *Tree*: copy a tree of mixed file sizes in (timed to the fsync of every file), copy it
//!   out, delete it. The tree is made in a staging directory (`staging`, a local disk, as
//!   the reference build's workstation was; without one, inside the work directory), copied
//!   into the target and back out to it (not synced there: reading the target is what
//!   copying out measures).
//!
//! After each stream phase the files' pages are dropped from the kernel's page cache
//! (`posix_fadvise(DONTNEED)` after their fsync), so the next phase reads from the storage,
//! not from memory the benchmark just filled.
//!
//! With a [`Link`] every byte to or from the target crosses it and every operation without
//! bulk data (create, stat, unlink, a random read's request) costs a round trip, so a
//! storage server is measured as its clients behind that link would see it.
//!
//! A phase's figure is the aggregate over its workers: all bytes (or operations) divided by
//! the time from the common start to the last worker's end, the way parallel bonnie++ runs
//! must be added up (not the sum of per-worker rates, which overstates when they finish at
//! different times). Each figure is reported as the median of `runs`, with min and max.
//!
//! # Safety
//! Everything happens inside a new directory `.tank-bench-<pid>-<n>` under the target (and
//! one of the same name under the staging directory), removed at the end (also on errors);
//! nothing outside them is touched or deleted.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::link::{Direction, Link};
use crate::BenchError;

#[derive(Debug, Clone)]
pub struct FsBenchConfig {
    pub size: u64,
    pub recordsize: usize,
    pub jobs: usize,
    pub runs: usize,
    pub sync: bool,
    pub files: usize,
    pub seeks: usize,
    pub tree_files: usize,
    /// A network link between the benchmark and the target.
    pub link: Option<Arc<Link>>,
    /// Where the tree test's source is made and copied back to (default: the work directory).
    pub staging: Option<PathBuf>,
    /// Bytes moved so far, and the cancel flag.
    pub meter: Arc<Meter>,
}

impl FsBenchConfig {
    /// The bytes a whole benchmark moves to and from the target (what `meter` counts up
    /// to): per run, the stream phases (write, rewrite's read and write, read), the random
    /// seeks' reads and one in ten rewritten, and the tree copied in and out.
    pub fn planned_bytes(&self) -> u64 {
        let jobs = self.jobs.max(1) as u64;
        let rs = self.recordsize.max(1) as u64;
        let per_job = (self.size / jobs).max(rs);
        let stream = jobs * per_job.div_ceil(rs) * rs;
        let per = (self.seeks / self.jobs.max(1)) as u64;
        let seeks = jobs * (per * 8192 + per.div_ceil(10) * 8192);
        let tree: u64 = tree_sizes(self.tree_files).iter().sum();
        self.runs as u64 * (4 * stream + seeks + 2 * tree)
    }
}

/// What a caller watches of a running benchmark: the bytes moved to and from the target so
/// far, and a flag that stops it at its next operation (a job's cancel).
#[derive(Debug, Default)]
pub struct Meter {
    pub bytes: AtomicU64,
    pub cancel: AtomicBool,
}

/// The link's pacing (or nothing without one) and the meter: every byte to or from the
/// target passes here.
struct Pace<'a> {
    link: Option<&'a Link>,
    meter: &'a Meter,
}

impl Pace<'_> {
    fn up(&self, bytes: u64) {
        self.meter.bytes.fetch_add(bytes, Ordering::Relaxed);
        if let Some(l) = self.link {
            l.transfer(Direction::Up, bytes);
        }
    }
    fn down(&self, bytes: u64) {
        self.meter.bytes.fetch_add(bytes, Ordering::Relaxed);
        if let Some(l) = self.link {
            l.transfer(Direction::Down, bytes);
        }
    }
    fn round_trip(&self) {
        if let Some(l) = self.link {
            l.round_trip();
        }
    }
    fn drain(&self) {
        if let Some(l) = self.link {
            l.drain(Direction::Up);
            l.drain(Direction::Down);
        }
    }
    /// An error once the benchmark was interrupted or canceled.
    fn check(&self) -> Result<(), BenchError> {
        if self.meter.cancel.load(Ordering::SeqCst) {
            return Err(BenchError::Invalid("canceled".into()));
        }
        check_interrupted()
    }
}

/// Drops a file's clean pages from the kernel's page cache.
#[allow(unsafe_code)]
fn drop_cached(f: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: the descriptor is open for the duration of the call; posix_fadvise only
    // advises the kernel and touches no memory of ours.
    unsafe {
        libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
}

/// Figures of one run, named as bonnie++ names them (rates per second).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct FsFigures {
    pub seq_output_block_mb_s: f64,
    pub rewrite_mb_s: f64,
    pub seq_input_block_mb_s: f64,
    pub random_seeks_per_s: f64,
    pub seq_create_per_s: f64,
    pub seq_stat_per_s: f64,
    pub seq_delete_per_s: f64,
    pub tree_copy_in_mb_s: f64,
    pub tree_copy_out_mb_s: f64,
    pub tree_delete_files_per_s: f64,
}

pub const FIGURE_NAMES: [&str; 10] = [
    "seq_output_block_mb_s",
    "rewrite_mb_s",
    "seq_input_block_mb_s",
    "random_seeks_per_s",
    "seq_create_per_s",
    "seq_stat_per_s",
    "seq_delete_per_s",
    "tree_copy_in_mb_s",
    "tree_copy_out_mb_s",
    "tree_delete_files_per_s",
];

impl FsFigures {
    pub fn values(&self) -> [f64; 10] {
        [
            self.seq_output_block_mb_s,
            self.rewrite_mb_s,
            self.seq_input_block_mb_s,
            self.random_seeks_per_s,
            self.seq_create_per_s,
            self.seq_stat_per_s,
            self.seq_delete_per_s,
            self.tree_copy_in_mb_s,
            self.tree_copy_out_mb_s,
            self.tree_delete_files_per_s,
        ]
    }

    pub fn from_values(v: [f64; 10]) -> Self {
        Self {
            seq_output_block_mb_s: v[0],
            rewrite_mb_s: v[1],
            seq_input_block_mb_s: v[2],
            random_seeks_per_s: v[3],
            seq_create_per_s: v[4],
            seq_stat_per_s: v[5],
            seq_delete_per_s: v[6],
            tree_copy_in_mb_s: v[7],
            tree_copy_out_mb_s: v[8],
            tree_delete_files_per_s: v[9],
        }
    }
}

/// Median, min and max of each figure over runs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    pub median: FsFigures,
    pub min: FsFigures,
    pub max: FsFigures,
    pub runs: usize,
}

pub fn median(values: &mut [f64]) -> f64 {
    assert!(!values.is_empty());
    values.sort_by(|a, b| a.total_cmp(b));
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

pub fn summarize(runs: &[FsFigures]) -> Summary {
    let mut med = [0.0; 10];
    let mut min = [0.0; 10];
    let mut max = [0.0; 10];
    for i in 0..10 {
        let mut v: Vec<f64> = runs.iter().map(|r| r.values()[i]).collect();
        med[i] = median(&mut v);
        min[i] = v[0];
        max[i] = v[v.len() - 1];
    }
    Summary {
        median: FsFigures::from_values(med),
        min: FsFigures::from_values(min),
        max: FsFigures::from_values(max),
        runs: runs.len(),
    }
}

/// The aggregate rate of workers started together: total amount over the time from the
/// common start to the last one's end. `spans` are (amount, seconds from the common start
/// to this worker's end).
pub fn aggregate(spans: &[(f64, f64)]) -> f64 {
    let total: f64 = spans.iter().map(|s| s.0).sum();
    let wall = spans.iter().map(|s| s.1).fold(0.0, f64::max);
    if wall > 0.0 {
        total / wall
    } else {
        0.0
    }
}

/// Set when the user interrupts the benchmark: every phase stops at its next operation and
/// returns an error, so that the normal clean-up runs (files closed, directories removed,
/// an emulated pool unmounted and destroyed).
static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Asks every running phase to stop (from a signal handler).
pub fn interrupt() {
    INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// An error once the benchmark was interrupted; the phases call it between operations.
pub fn check_interrupted() -> Result<(), BenchError> {
    if INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst) {
        Err(BenchError::Invalid("interrupted".into()))
    } else {
        Ok(())
    }
}

/// Directories a benchmark made and will remove, so that an interrupted benchmark can remove
/// them too (`remove_tracked`, from a signal handler, if the phases did not stop in time).
static TRACKED: parking_lot::Mutex<Vec<PathBuf>> = parking_lot::Mutex::new(Vec::new());

/// Records a directory the benchmark made (removed by `remove_tracked` if it is interrupted).
pub fn track(path: &Path) {
    TRACKED.lock().push(path.to_path_buf());
}

/// Forgets a directory the benchmark has removed itself.
pub fn untrack(path: &Path) {
    TRACKED.lock().retain(|p| p != path);
}

/// Removes every tracked directory (newest first): what an interrupted benchmark leaves.
pub fn remove_tracked() {
    let paths = std::mem::take(&mut *TRACKED.lock());
    for p in paths.iter().rev() {
        let _ = fs::remove_dir_all(p);
    }
}

/// The working directory of one benchmark; removed on drop.
struct Workdir {
    path: PathBuf,
}

impl Workdir {
    fn create(path: PathBuf, parent: &Path) -> Result<Self, BenchError> {
        fs::create_dir(&path).map_err(|e| io("cannot create a directory in", parent, e))?;
        track(&path);
        Ok(Workdir { path })
    }
}

impl Drop for Workdir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
        untrack(&self.path);
    }
}

fn io(what: &str, path: &Path, e: std::io::Error) -> BenchError {
    BenchError::Invalid(format!("{what} {}: {e}", path.display()))
}

/// Free bytes of the file system holding `path`.
#[allow(unsafe_code)]
pub fn free_space(path: &Path) -> Result<u64, BenchError> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| BenchError::Invalid("path contains a NUL byte".into()))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a valid NUL-terminated path; `st` is writable memory of the right type,
    // read only after statvfs reported success (it then initialized it).
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return Err(io("cannot examine", path, std::io::Error::last_os_error()));
    }
    // SAFETY: statvfs returned 0, so the structure is initialized.
    let st = unsafe { st.assume_init() };
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// Runs `f(worker)` on `jobs` threads started together; returns (amount, seconds to end).
fn parallel<F>(jobs: usize, f: F) -> Result<Vec<(f64, f64)>, BenchError>
where
    F: Fn(usize) -> Result<f64, BenchError> + Sync,
{
    let barrier = Arc::new(Barrier::new(jobs));
    let start = std::sync::Mutex::new(None::<Instant>);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..jobs)
            .map(|w| {
                let (barrier, f, start) = (barrier.clone(), &f, &start);
                s.spawn(move || {
                    if barrier.wait().is_leader() {
                        *start.lock().expect("start lock") = Some(Instant::now());
                    }
                    barrier.wait();
                    let t0 = start
                        .lock()
                        .expect("start lock")
                        .expect("set by the leader");
                    let amount = f(w)?;
                    Ok((amount, t0.elapsed().as_secs_f64()))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench worker panicked"))
            .collect()
    })
}

/// Incompressible bytes (xorshift), the same for the same seed.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Runs the benchmark in `target`; `progress(phase, fraction_done)` reports as it goes.
pub fn run(
    target: &Path,
    cfg: &FsBenchConfig,
    progress: &mut dyn FnMut(&str, f64),
) -> Result<Vec<FsFigures>, BenchError> {
    if cfg.jobs == 0 || cfg.runs == 0 || cfg.recordsize == 0 || cfg.size == 0 {
        return Err(BenchError::Invalid(
            "size, recordsize, jobs and runs must be positive".into(),
        ));
    }
    let meta = fs::metadata(target).map_err(|e| io("cannot use", target, e))?;
    if !meta.is_dir() {
        return Err(BenchError::Invalid(format!(
            "{} is not a directory",
            target.display()
        )));
    }
    let need = cfg.size + (cfg.tree_files as u64 * 40_000) + (64 << 20);
    let free = free_space(target)?;
    if free < need {
        return Err(BenchError::Invalid(format!(
            "{} has {} MB free, the benchmark needs {} MB (lower --size)",
            target.display(),
            free / 1_000_000,
            need / 1_000_000
        )));
    }
    let mut out = Vec::new();
    for run in 0..cfg.runs {
        let name = format!(".tank-bench-{}-{run}", std::process::id());
        let wd = Workdir::create(target.join(&name), target)?;
        let stage = match &cfg.staging {
            Some(s) => Some(Workdir::create(s.join(&name), s)?),
            None => None,
        };
        let mut report = |phase: &str, i: usize| {
            progress(
                &format!("run {}/{}: {phase}", run + 1, cfg.runs),
                (run as f64 + i as f64 / 7.0) / cfg.runs as f64,
            )
        };
        let stage_dir = stage.as_ref().map_or(&wd.path, |s| &s.path);
        out.push(one_run(&wd.path, stage_dir, cfg, &mut report)?);
        drop(stage);
        drop(wd);
    }
    progress("done", 1.0);
    Ok(out)
}

fn one_run(
    dir: &Path,
    stage: &Path,
    cfg: &FsBenchConfig,
    report: &mut dyn FnMut(&str, usize),
) -> Result<FsFigures, BenchError> {
    let link = Pace {
        link: cfg.link.as_deref(),
        meter: &cfg.meter,
    };
    let per_job = (cfg.size / cfg.jobs as u64).max(cfg.recordsize as u64);
    let blocks = per_job.div_ceil(cfg.recordsize as u64);
    let file = |w: usize| dir.join(format!("bench.{w}"));
    let data = pattern(cfg.recordsize, 42);
    let mb = |b: f64| b / 1e6;

    report("sequential output", 0);
    let spans = parallel(cfg.jobs, |w| {
        let p = file(w);
        link.round_trip();
        let mut f = File::create(&p).map_err(|e| io("cannot create", &p, e))?;
        for _ in 0..blocks {
            link.check()?;
            link.up(data.len() as u64);
            f.write_all(&data).map_err(|e| io("write to", &p, e))?;
            if cfg.sync {
                f.sync_data().map_err(|e| io("fdatasync", &p, e))?;
                link.round_trip();
            }
        }
        link.drain();
        f.sync_all().map_err(|e| io("fsync", &p, e))?;
        link.round_trip();
        drop_cached(&f);
        Ok((blocks * cfg.recordsize as u64) as f64)
    })?;
    let seq_out = mb(aggregate(&spans));

    report("rewrite", 1);
    let spans = parallel(cfg.jobs, |w| {
        let p = file(w);
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .map_err(|e| io("cannot open", &p, e))?;
        let mut buf = vec![0u8; cfg.recordsize];
        for b in 0..blocks {
            link.check()?;
            let off = b * cfg.recordsize as u64;
            f.read_exact_at(&mut buf, off)
                .map_err(|e| io("read", &p, e))?;
            link.down(buf.len() as u64);
            buf[0] ^= 1;
            link.up(buf.len() as u64);
            f.write_all_at(&buf, off).map_err(|e| io("write", &p, e))?;
        }
        link.drain();
        f.sync_all().map_err(|e| io("fsync", &p, e))?;
        link.round_trip();
        drop_cached(&f);
        let _ = f.seek(SeekFrom::Start(0));
        Ok((blocks * cfg.recordsize as u64) as f64)
    })?;
    let rewrite = mb(aggregate(&spans));

    report("sequential input", 2);
    let spans = parallel(cfg.jobs, |w| {
        let p = file(w);
        let mut f = File::open(&p).map_err(|e| io("cannot open", &p, e))?;
        let mut buf = vec![0u8; cfg.recordsize];
        let mut total = 0u64;
        loop {
            link.check()?;
            let n = f.read(&mut buf).map_err(|e| io("read", &p, e))?;
            if n == 0 {
                break;
            }
            link.down(n as u64);
            total += n as u64;
        }
        link.drain();
        drop_cached(&f);
        Ok(total as f64)
    })?;
    let seq_in = mb(aggregate(&spans));

    report("random seeks", 3);
    let spans = parallel(cfg.jobs, |w| {
        let p = file(w);
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .map_err(|e| io("cannot open", &p, e))?;
        let len = f.metadata().map_err(|e| io("stat", &p, e))?.len();
        let mut buf = [0u8; 8192];
        let mut x = 0x2545_f491_4f6c_dd1du64 ^ (w as u64 + 1);
        let per = cfg.seeks / cfg.jobs;
        link.drain();
        for i in 0..per {
            link.check()?;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let off = (x % (len.saturating_sub(8192) / 8192).max(1)) * 8192;
            link.round_trip();
            f.read_exact_at(&mut buf, off)
                .map_err(|e| io("read", &p, e))?;
            link.down(buf.len() as u64);
            if i % 10 == 0 {
                buf[0] ^= 1;
                link.up(buf.len() as u64);
                f.write_all_at(&buf, off).map_err(|e| io("write", &p, e))?;
                link.round_trip();
            }
        }
        Ok(per as f64)
    })?;
    let seeks = aggregate(&spans);
    for w in 0..cfg.jobs {
        let _ = fs::remove_file(file(w));
    }

    report("small files", 4);
    let per = cfg.files / cfg.jobs;
    let small = |w: usize| dir.join(format!("small.{w}"));
    for w in 0..cfg.jobs {
        fs::create_dir(small(w)).map_err(|e| io("cannot create", &small(w), e))?;
    }
    let create = aggregate(&parallel(cfg.jobs, |w| {
        for i in 0..per {
            link.check()?;
            let p = small(w).join(format!("{i:07}"));
            link.round_trip();
            File::create(&p).map_err(|e| io("cannot create", &p, e))?;
        }
        Ok(per as f64)
    })?);
    let stat = aggregate(&parallel(cfg.jobs, |w| {
        for i in 0..per {
            link.check()?;
            let p = small(w).join(format!("{i:07}"));
            link.round_trip();
            fs::metadata(&p).map_err(|e| io("stat", &p, e))?;
        }
        Ok(per as f64)
    })?);
    let delete = aggregate(&parallel(cfg.jobs, |w| {
        for i in 0..per {
            link.check()?;
            let p = small(w).join(format!("{i:07}"));
            link.round_trip();
            fs::remove_file(&p).map_err(|e| io("delete", &p, e))?;
        }
        Ok(per as f64)
    })?);
    for w in 0..cfg.jobs {
        let _ = fs::remove_dir(small(w));
    }

    report("tree copy", 5);
    // The source tree is made in the staging directory (inside the work directory without
    // one), so nothing outside the benchmark's own directories is written.
    let src = stage.join("tree-src");
    let sizes = make_tree(&src, cfg.tree_files, &link)?;
    let total: u64 = sizes.iter().sum();
    let t = Instant::now();
    copy_tree(&src, &dir.join("tree-in"), &|n| link.up(n), &link)?;
    link.drain();
    sync_dir(&dir.join("tree-in"))?;
    let copy_in = mb(total as f64 / t.elapsed().as_secs_f64());
    let t = Instant::now();
    copy_tree(
        &dir.join("tree-in"),
        &stage.join("tree-out"),
        &|n| link.down(n),
        &link,
    )?;
    link.drain();
    if stage == dir {
        // Copied back into the target itself: its writes are part of the figure.
        sync_dir(&stage.join("tree-out"))?;
    }
    // Copied out to a staging directory (a local disk): what is measured is reading the
    // target, so the local copy is not synced.
    let copy_out = mb(total as f64 / t.elapsed().as_secs_f64());
    report("tree delete", 6);
    let t = Instant::now();
    remove_tree(&dir.join("tree-in"), &link)?;
    let tree_delete = sizes.len() as f64 / t.elapsed().as_secs_f64();
    let _ = fs::remove_dir_all(&src);
    let _ = fs::remove_dir_all(stage.join("tree-out"));
    Ok(FsFigures {
        seq_output_block_mb_s: seq_out,
        rewrite_mb_s: rewrite,
        seq_input_block_mb_s: seq_in,
        random_seeks_per_s: seeks,
        seq_create_per_s: create,
        seq_stat_per_s: stat,
        seq_delete_per_s: delete,
        tree_copy_in_mb_s: copy_in,
        tree_copy_out_mb_s: copy_out,
        tree_delete_files_per_s: tree_delete,
    })
}

/// The sizes of the tree test's `n` files: mostly small, a few large, like a home
/// directory (70 % under 4 KiB, 25 % up to 64 KiB, 5 % up to 1 MiB), with the seed of
/// each file's bytes.
fn tree_plan(n: usize) -> Vec<(u64, u64)> {
    let mut x = 0x9e37_79b9u64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let size = match x % 100 {
                0..=69 => x % 4096,
                70..=94 => x % 65536,
                _ => x % (1 << 20),
            };
            (size, x)
        })
        .collect()
}

fn tree_sizes(n: usize) -> Vec<u64> {
    tree_plan(n).into_iter().map(|(size, _)| size).collect()
}

/// A tree of `n` files of the sizes of `tree_plan`, 20 files per directory.
fn make_tree(root: &Path, n: usize, link: &Pace<'_>) -> Result<Vec<u64>, BenchError> {
    let mut sizes = Vec::with_capacity(n);
    for (i, (size, seed)) in tree_plan(n).into_iter().enumerate() {
        link.check()?;
        let d = root.join(format!("d{:04}", i / 20));
        if i % 20 == 0 {
            fs::create_dir_all(&d).map_err(|e| io("cannot create", &d, e))?;
        }
        let p = d.join(format!("f{i:06}"));
        fs::write(&p, pattern(size as usize, seed)).map_err(|e| io("cannot write", &p, e))?;
        sizes.push(size);
    }
    Ok(sizes)
}

/// Copies a tree file by file in 1 MiB pieces, each piece carried by `carry` (the link's
/// direction), each file and directory created with a round trip.
fn copy_tree(
    from: &Path,
    to: &Path,
    carry: &dyn Fn(u64),
    link: &Pace<'_>,
) -> Result<(), BenchError> {
    link.round_trip();
    fs::create_dir_all(to).map_err(|e| io("cannot create", to, e))?;
    let mut buf = vec![0u8; 1 << 20];
    for entry in fs::read_dir(from).map_err(|e| io("cannot read", from, e))? {
        let entry = entry.map_err(|e| io("cannot read", from, e))?;
        let target = to.join(entry.file_name());
        if entry
            .file_type()
            .map_err(|e| io("stat", &entry.path(), e))?
            .is_dir()
        {
            copy_tree(&entry.path(), &target, carry, link)?;
            continue;
        }
        link.check()?;
        link.round_trip();
        let mut input =
            File::open(entry.path()).map_err(|e| io("cannot open", &entry.path(), e))?;
        let mut output = File::create(&target).map_err(|e| io("cannot create", &target, e))?;
        loop {
            let n = input
                .read(&mut buf)
                .map_err(|e| io("read", &entry.path(), e))?;
            if n == 0 {
                break;
            }
            carry(n as u64);
            output
                .write_all(&buf[..n])
                .map_err(|e| io("write", &target, e))?;
        }
    }
    Ok(())
}

/// Deletes a tree entry by entry, each with a round trip (a client deleting over the link).
fn remove_tree(dir: &Path, link: &Pace<'_>) -> Result<(), BenchError> {
    for entry in fs::read_dir(dir).map_err(|e| io("cannot read", dir, e))? {
        let entry = entry.map_err(|e| io("cannot read", dir, e))?;
        let path = entry.path();
        if entry
            .file_type()
            .map_err(|e| io("stat", &path, e))?
            .is_dir()
        {
            remove_tree(&path, link)?;
        } else {
            link.check()?;
            link.round_trip();
            fs::remove_file(&path).map_err(|e| io("delete", &path, e))?;
        }
    }
    link.round_trip();
    fs::remove_dir(dir).map_err(|e| io("delete", dir, e))
}

/// Flushes a copied tree (files, then the directory), as a copy tool that syncs would.
fn sync_dir(dir: &Path) -> Result<(), BenchError> {
    for entry in fs::read_dir(dir).map_err(|e| io("cannot read", dir, e))? {
        let entry = entry.map_err(|e| io("cannot read", dir, e))?;
        if entry
            .file_type()
            .map_err(|e| io("stat", &entry.path(), e))?
            .is_dir()
        {
            sync_dir(&entry.path())?;
        } else {
            let f = File::open(entry.path()).map_err(|e| io("open", &entry.path(), e))?;
            f.sync_all().map_err(|e| io("fsync", &entry.path(), e))?;
            // Copying out then reads from the storage, not from pages this copy filled.
            drop_cached(&f);
        }
    }
    File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(|e| io("fsync", dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aggregation_counts_the_slowest_worker() {
        // Two workers of 100 MB: one done in 1 s, one in 2 s: 200 MB over 2 s, not 150 MB/s.
        assert_eq!(aggregate(&[(100.0, 1.0), (100.0, 2.0)]), 100.0);
        assert_eq!(aggregate(&[]), 0.0);
    }

    #[test]
    fn medians_min_max() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        let runs: Vec<FsFigures> = [1.0, 5.0, 3.0]
            .iter()
            .map(|&v| FsFigures::from_values([v; 10]))
            .collect();
        let s = summarize(&runs);
        assert_eq!(s.median.rewrite_mb_s, 3.0);
        assert_eq!(s.min.seq_input_block_mb_s, 1.0);
        assert_eq!(s.max.tree_copy_out_mb_s, 5.0);
    }

    #[test]
    fn a_small_run_measures_every_phase_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("user-file"), b"keep me").unwrap();
        let cfg = FsBenchConfig {
            size: 8 << 20,
            recordsize: 128 << 10,
            jobs: 2,
            runs: 2,
            sync: false,
            files: 200,
            seeks: 200,
            tree_files: 60,
            link: None,
            staging: None,
            meter: Default::default(),
        };
        let mut phases = Vec::new();
        let runs = run(dir.path(), &cfg, &mut |p, f| {
            phases.push((p.to_string(), f))
        })
        .unwrap();
        assert_eq!(runs.len(), 2);
        for r in &runs {
            assert!(
                r.values().iter().all(|v| *v > 0.0 && v.is_finite()),
                "{r:?}"
            );
        }
        assert!(phases.iter().any(|(p, _)| p.contains("random seeks")));
        assert_eq!(phases.last().unwrap().1, 1.0);
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            left,
            vec![std::ffi::OsString::from("user-file")],
            "only the user's file remains"
        );
    }

    #[test]
    fn a_link_caps_what_crosses_it_and_the_staging_directory_is_cleaned() {
        let dir = tempfile::tempdir().unwrap();
        let stage = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("user-file"), b"keep me").unwrap();
        std::fs::write(stage.path().join("local-file"), b"keep me too").unwrap();
        let rtt = std::time::Duration::from_micros(200);
        let cfg = FsBenchConfig {
            size: 24 << 20,
            recordsize: 128 << 10,
            jobs: 2,
            runs: 1,
            sync: false,
            files: 100,
            seeks: 100,
            tree_files: 40,
            link: Some(Arc::new(Link::new(crate::link::LinkProfile {
                bandwidth: 40e6,
                rtt,
            }))),
            staging: Some(stage.path().to_path_buf()),
            meter: Default::default(),
        };
        let runs = run(dir.path(), &cfg, &mut |_, _| {}).unwrap();
        let r = runs[0];
        // The meter counted what the plan says a job's progress goes up to.
        assert_eq!(cfg.meter.bytes.load(Ordering::Relaxed), cfg.planned_bytes());
        // Streams share the link's 40 MB/s (each direction); an operation costs a round trip.
        for v in [
            r.seq_output_block_mb_s,
            r.seq_input_block_mb_s,
            r.tree_copy_in_mb_s,
        ] {
            assert!(v > 0.0 && v <= 40.0 * 1.01, "{r:?}");
        }
        let per_rtt = 1.0 / rtt.as_secs_f64();
        for v in [r.seq_create_per_s, r.seq_stat_per_s, r.seq_delete_per_s] {
            // Two jobs each wait a round trip per operation.
            assert!(v > 0.0 && v <= 2.0 * per_rtt * 1.01, "{r:?}");
        }
        let names = |p: &Path| -> Vec<_> {
            std::fs::read_dir(p)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect()
        };
        assert_eq!(
            names(dir.path()),
            vec![std::ffi::OsString::from("user-file")]
        );
        assert_eq!(
            names(stage.path()),
            vec![std::ffi::OsString::from("local-file")]
        );
    }

    #[test]
    fn refuses_bad_targets() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = FsBenchConfig {
            size: 1 << 20,
            recordsize: 4096,
            jobs: 1,
            runs: 1,
            sync: false,
            files: 10,
            seeks: 10,
            tree_files: 10,
            link: None,
            staging: None,
            meter: Default::default(),
        };
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        assert!(run(&file, &cfg, &mut |_, _| {})
            .unwrap_err()
            .to_string()
            .contains("not a directory"));
        assert!(run(&dir.path().join("missing"), &cfg, &mut |_, _| {}).is_err());
        let huge = FsBenchConfig {
            size: 1 << 60,
            ..cfg.clone()
        };
        assert!(run(dir.path(), &huge, &mut |_, _| {})
            .unwrap_err()
            .to_string()
            .contains("free"));
        let zero = FsBenchConfig { jobs: 0, ..cfg };
        assert!(run(dir.path(), &zero, &mut |_, _| {}).is_err());
    }
}
