//! `tank bench-send`: `tank send | tank receive` between two pools on one disk, against
//! zfs-fuse's `zfs send | zfs receive` of the same data, in the same run.
//!
//! # Method
//! In the bench directory (one file system, so one disk):
//! - *tank*: two data directories, each with a daemon (`tank serve --no-api`) and a pool of
//!   one device file; the source dataset (its defaults: 128K records, lz4) mounted through
//!   FUSE and filled with `files` files of `size` bytes in all, incompressible, then
//!   snapshot `@1`; `change` percent of its 128K blocks (spread over every file)
//!   overwritten, then snapshot `@2`.
//! - *zfs-fuse*: the same on two zfs-fuse pools of one device file each (compression off:
//!   the data does not compress), written through its mount. It needs Debian's zfs-fuse
//!   daemon running.
//!
//! Each run, for each system: the source's caches dropped (its pool exported and imported,
//! or its daemon restarted, and the device file's pages dropped; the receiving daemon runs
//! throughout), the target dataset destroyed; then timed: the full stream of `@1` piped into a receive (`-u`), and the
//! increment `@1 -> @2` piped into a receive. A time is the pipeline's wall time, from the
//! start of `send` to the end of `receive` (which returns once what it received is
//! committed). Each figure is the median of `--runs` runs; each ratio is computed per run,
//! then medianed.
//!
//! With `--s3`: MinIO (6 drive directories in the bench directory, erasure coded EC:2, as the
//! S3 benchmark runs it) on 127.0.0.1; each run, from a cold source, `tank send @1 --to
//! s3://...` through a plain remote and through an encrypted one, and `rclone copy` (its
//! defaults: 4 transfers, multipart uploads, MD5 checks) of a file of the same size and kind
//! of data from the same disk, cold too. Rates are the stream's (or the file's) bytes over
//! the command's wall time.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::fsbench::median;
use crate::run::engine::{drop_caches, run_cmd};
use crate::run::util::{human, parse_size, start_serve, tank_cli, Daemon};

#[derive(Args)]
pub struct SendBenchArgs {
    /// Directory for the pools' device files and mounts (one file system: one disk).
    #[arg(long)]
    dir: PathBuf,
    /// Bytes of data in the source dataset.
    #[arg(long, default_value = "2G")]
    size: String,
    /// Files the data is spread over.
    #[arg(long, default_value_t = 16)]
    files: usize,
    /// Percent of the 128K blocks changed between the two snapshots.
    #[arg(long, default_value_t = 1.0)]
    change: f64,
    /// Runs; figures are medians.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Leave zfs-fuse out.
    #[arg(long)]
    no_peer: bool,
    /// Also back the full stream up to an S3 server (MinIO on 127.0.0.1, from the PATH),
    /// plain and encrypted, against `rclone copy` of the same number of bytes to it.
    #[arg(long)]
    s3: bool,
}

const BLOCK: u64 = 128 << 10;

/// One run's figures: tank's, and zfs-fuse's when measured; and the baseline's seconds.
type Row = (Times, Option<Times>, f64);

/// The disk's own rate for the same work: `size` bytes of a file read (cold) and written to
/// another file of the same disk, with an fsync at the end; returns the seconds.
fn copy_baseline(src: &Path, dst: &Path) -> Result<f64> {
    use std::io::Read;
    drop_caches(&[src.to_string_lossy().into_owned()])?;
    let _ = std::fs::remove_file(dst);
    let t = Instant::now();
    let mut input = std::fs::File::open(src)?;
    let mut out = std::fs::File::create(dst)?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = input.read(&mut buf)?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n])?;
    }
    out.sync_all()?;
    let secs = t.elapsed().as_secs_f64();
    drop(out);
    std::fs::remove_file(dst)?;
    Ok(secs)
}

/// One system's figures in one run: seconds for the full stream and for the increment.
#[derive(Debug, Clone, Copy, Default)]
struct Times {
    full_s: f64,
    inc_s: f64,
}

/// Incompressible bytes for block `n` of file `f` in version `v`.
fn block_bytes(f: usize, n: u64, v: u64) -> Vec<u8> {
    let mut x = (f as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ n.wrapping_mul(0xbf58_476d_1ce4_e5b9)
        ^ v;
    let mut out = vec![0u8; BLOCK as usize];
    for chunk in out.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    out
}

/// Fills `dir` with the data set; `fsync`s every file.
fn fill(dir: &Path, size: u64, files: usize) -> Result<()> {
    let per_file = size / files as u64 / BLOCK;
    for f in 0..files {
        let path = dir.join(format!("file{f:02}"));
        let mut out = std::fs::File::create(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        for n in 0..per_file {
            out.write_all(&block_bytes(f, n, 0))?;
        }
        out.sync_all()?;
    }
    Ok(())
}

/// Overwrites `percent` of the blocks, spread evenly over every file.
fn change(dir: &Path, size: u64, files: usize, percent: f64) -> Result<u64> {
    use std::os::unix::fs::FileExt;
    let per_file = size / files as u64 / BLOCK;
    let stride = (100.0 / percent).max(1.0) as u64;
    let mut changed = 0;
    for f in 0..files {
        let out = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join(format!("file{f:02}")))?;
        let mut n = (f as u64 * 7) % stride;
        while n < per_file {
            out.write_all_at(&block_bytes(f, n, 1), n * BLOCK)?;
            changed += BLOCK;
            n += stride;
        }
        out.sync_all()?;
    }
    Ok(changed)
}

/// Runs `send | receive` (each a program and its arguments, with environment `env`);
/// returns the wall time.
fn pipeline(
    send: &[&str],
    receive: &[&str],
    env: &[(&str, &Path)],
    env_rx: &[(&str, &Path)],
) -> Result<f64> {
    let t = Instant::now();
    let mut s = Command::new(send[0]);
    s.args(&send[1..])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        s.env(k, v);
    }
    let mut s = s
        .spawn()
        .with_context(|| format!("cannot run {}", send[0]))?;
    let mut r = Command::new(receive[0]);
    r.args(&receive[1..])
        .stdin(s.stdout.take().context("piped")?)
        .stdout(Stdio::null());
    for (k, v) in env_rx {
        r.env(k, v);
    }
    let r = r
        .output()
        .with_context(|| format!("cannot run {}", receive[0]))?;
    let sent = s.wait_with_output()?;
    let secs = t.elapsed().as_secs_f64();
    if !sent.status.success() {
        bail!("{send:?}: {}", String::from_utf8_lossy(&sent.stderr).trim());
    }
    if !r.status.success() {
        bail!("{receive:?}: {}", String::from_utf8_lossy(&r.stderr).trim());
    }
    Ok(secs)
}

struct TankSide {
    a: PathBuf,
    b: PathBuf,
    dev_a: String,
    /// The sending host's daemon (restarted for each run: a cold source) and the receiving
    /// host's (running throughout, as zfs-fuse's daemon does).
    source: Option<Daemon>,
    target: Option<Daemon>,
}

impl TankSide {
    fn start(&mut self) -> Result<()> {
        if self.target.is_none() {
            self.target = Some(start_serve(&self.b, &["--no-api"], "\u{0}")?);
        }
        self.source = Some(start_serve(&self.a, &["--no-api"], "\u{0}")?);
        Ok(())
    }

    fn stop(&mut self) {
        self.source = None;
        self.target = None;
    }
}

fn tank_setup(a: &SendBenchArgs, size: u64) -> Result<TankSide> {
    let mut side = TankSide {
        a: a.dir.join("send-tank-a"),
        b: a.dir.join("send-tank-b"),
        dev_a: String::new(),
        source: None,
        target: None,
    };
    for (data, pool) in [(&side.a, "bsenda"), (&side.b, "bsendb")] {
        let _ = std::fs::remove_dir_all(data);
        std::fs::create_dir_all(data)?;
        let dev = data.join("disk0");
        std::fs::File::create(&dev)?.set_len(size * 2 + (1 << 30))?;
        tank_cli(
            data,
            &["pool", "create", pool, &dev.to_string_lossy()],
            None,
        )?;
    }
    side.dev_a = side.a.join("disk0").to_string_lossy().into_owned();
    side.start()?;
    let mnt = a.dir.join("send-tank-mnt");
    std::fs::create_dir_all(&mnt)?;
    let mp = format!("mountpoint={}", mnt.display());
    tank_cli(
        &side.a,
        &["dataset", "create", "-o", &mp, "bsenda/fs"],
        None,
    )?;
    fill(&mnt, size, a.files)?;
    tank_cli(&side.a, &["snapshot", "bsenda/fs@1"], None)?;
    change(&mnt, size, a.files, a.change)?;
    tank_cli(&side.a, &["snapshot", "bsenda/fs@2"], None)?;
    Ok(side)
}

fn tank_run(side: &mut TankSide) -> Result<Times> {
    // A cold source: its daemon restarted, the device file's pages dropped.
    side.source = None;
    drop_caches(std::slice::from_ref(&side.dev_a))?;
    side.start()?;
    let _ = tank_cli(&side.b, &["dataset", "destroy", "-r", "bsendb/fs"], None);
    let exe = std::env::current_exe()?;
    let exe = exe.to_string_lossy();
    let (ea, eb) = (
        [("TANK_DATA_DIR", side.a.as_path())],
        [("TANK_DATA_DIR", side.b.as_path())],
    );
    let full_s = pipeline(
        &[&exe, "send", "bsenda/fs@1"],
        &[&exe, "receive", "-u", "-o", "mountpoint=none", "bsendb/fs"],
        &ea,
        &eb,
    )?;
    let inc_s = pipeline(
        &[&exe, "send", "-i", "@1", "bsenda/fs@2"],
        &[&exe, "receive", "-u", "-o", "mountpoint=none", "bsendb/fs"],
        &ea,
        &eb,
    )?;
    Ok(Times { full_s, inc_s })
}

struct ZfsSide {
    dev_a: String,
    dev_b: String,
}

const ZA: &str = "bsendza";
const ZB: &str = "bsendzb";

impl Drop for ZfsSide {
    fn drop(&mut self) {
        for p in [ZA, ZB] {
            for _ in 0..20 {
                if run_cmd("zpool", &["destroy", "-f", p]).is_ok() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(500));
            }
        }
        let _ = std::fs::remove_file(&self.dev_a);
        let _ = std::fs::remove_file(&self.dev_b);
    }
}

fn zfs_setup(a: &SendBenchArgs, size: u64) -> Result<ZfsSide> {
    run_cmd("zpool", &["list"]).context(
        "zfs-fuse is not running: start Debian's zfs-fuse daemon (as root: zfs-fuse), or pass --no-peer",
    )?;
    let side = ZfsSide {
        dev_a: a.dir.join("send-zfs-a").to_string_lossy().into_owned(),
        dev_b: a.dir.join("send-zfs-b").to_string_lossy().into_owned(),
    };
    for d in [&side.dev_a, &side.dev_b] {
        std::fs::File::create(d)?.set_len(size * 2 + (1 << 30))?;
    }
    let mnt = a.dir.join("send-zfs-mnt");
    let mnt_s = mnt.to_string_lossy().into_owned();
    run_cmd("zpool", &["create", "-f", "-m", &mnt_s, ZA, &side.dev_a])?;
    run_cmd("zpool", &["create", "-f", "-m", "none", ZB, &side.dev_b])?;
    run_cmd("zfs", &["set", "compression=off", ZA])?;
    run_cmd("zfs", &["set", "compression=off", ZB])?;
    let fs = format!("{ZA}/fs");
    run_cmd("zfs", &["create", &fs])?;
    fill(&mnt.join("fs"), size, a.files)?;
    run_cmd("zfs", &["snapshot", &format!("{fs}@1")])?;
    change(&mnt.join("fs"), size, a.files, a.change)?;
    run_cmd("zfs", &["snapshot", &format!("{fs}@2")])?;
    Ok(side)
}

fn zfs_run(a: &SendBenchArgs, side: &ZfsSide) -> Result<Times> {
    let dir = a.dir.to_string_lossy().into_owned();
    run_cmd("zpool", &["export", ZA])?;
    drop_caches(std::slice::from_ref(&side.dev_a))?;
    run_cmd("zpool", &["import", "-d", &dir, ZA])?;
    let _ = run_cmd("zfs", &["destroy", "-r", &format!("{ZB}/fs")]);
    let (src1, src2, dst) = (
        format!("{ZA}/fs@1"),
        format!("{ZA}/fs@2"),
        format!("{ZB}/fs"),
    );
    let full_s = pipeline(
        &["zfs", "send", &src1],
        &["zfs", "receive", "-u", &dst],
        &[],
        &[],
    )?;
    let inc_s = pipeline(
        &["zfs", "send", "-i", &src1, &src2],
        &["zfs", "receive", "-u", &dst],
        &[],
        &[],
    )?;
    Ok(Times { full_s, inc_s })
}

pub fn run(a: SendBenchArgs) -> Result<()> {
    let size = parse_size(&a.size)?;
    if a.files == 0 || size / (a.files as u64) < BLOCK || !(a.change > 0.0 && a.change <= 100.0) {
        bail!("--files must be at least 1, each file at least 128K, --change in (0, 100]");
    }
    std::fs::create_dir_all(&a.dir)?;
    println!(
        "send | receive of {} in {} files, then an increment of {}% of its blocks (median of {} runs)",
        human(size),
        a.files,
        a.change,
        a.runs
    );
    let base_src = a.dir.join("send-copy-src");
    let base_dst = a.dir.join("send-copy-dst");
    {
        let mut f = std::fs::File::create(&base_src)?;
        for n in 0..size / BLOCK {
            f.write_all(&block_bytes(99, n, 0))?;
        }
        f.sync_all()?;
    }
    let mut tank = tank_setup(&a, size)?;
    let zfs = if a.no_peer {
        None
    } else {
        Some(zfs_setup(&a, size)?)
    };
    let mut rows: Vec<Row> = Vec::new();
    for run in 0..a.runs {
        let c = copy_baseline(&base_src, &base_dst)?;
        let t = tank_run(&mut tank)?;
        let z = zfs.as_ref().map(|z| zfs_run(&a, z)).transpose()?;
        println!(
            "run {}: disk copy {:.2} s; tank full {:.2} s, increment {:.2} s{}",
            run + 1,
            c,
            t.full_s,
            t.inc_s,
            z.map_or(String::new(), |z| format!(
                "; zfs-fuse full {:.2} s, increment {:.2} s",
                z.full_s, z.inc_s
            ))
        );
        rows.push((t, z, c));
    }
    let mb = |s: f64| size as f64 / s / 1e6;
    let med = |f: &dyn Fn(&Row) -> f64| median(&mut rows.iter().map(f).collect::<Vec<f64>>());
    println!();
    println!(
        "| | full stream | increment ({}%) | increment / full |",
        a.change
    );
    println!("|---|---|---|---|");
    println!(
        "| the same bytes copied file to file on the disk | {:.0} MB/s ({:.2} s) | | |",
        med(&|r| mb(r.2)),
        med(&|r| r.2)
    );
    println!(
        "| tank | {:.0} MB/s ({:.2} s) | {:.2} s | {:.3} |",
        med(&|r| mb(r.0.full_s)),
        med(&|r| r.0.full_s),
        med(&|r| r.0.inc_s),
        med(&|r| r.0.inc_s / r.0.full_s)
    );
    println!(
        "| tank / disk copy (speed) | **{:.2}** | | |",
        med(&|r| r.2 / r.0.full_s)
    );
    if zfs.is_some() {
        let z = |r: &Row| r.1.expect("peer measured");
        println!(
            "| zfs-fuse | {:.0} MB/s ({:.2} s) | {:.2} s | {:.3} |",
            med(&|r| mb(z(r).full_s)),
            med(&|r| z(r).full_s),
            med(&|r| z(r).inc_s),
            med(&|r| z(r).inc_s / z(r).full_s)
        );
        println!(
            "| tank / zfs-fuse (speed) | **{:.2}** | **{:.2}** | |",
            med(&|r| z(r).full_s / r.0.full_s),
            med(&|r| z(r).inc_s / r.0.inc_s)
        );
    }
    drop(zfs);
    if !a.s3 {
        tank.stop();
    }
    if a.s3 {
        s3_backups(&a, &mut tank, &base_src, size)?;
    }
    let _ = std::fs::remove_file(&base_src);
    let _ = std::fs::remove_dir_all(&tank.a);
    let _ = std::fs::remove_dir_all(&tank.b);
    Ok(())
}

/// `--s3`: the backup rate against `rclone copy` (see the module documentation).
fn s3_backups(a: &SendBenchArgs, tank: &mut TankSide, file: &Path, size: u64) -> Result<()> {
    if let Some(why) = crate::run::s3::minio_missing() {
        bail!("{why}");
    }
    let which = Command::new("rclone").arg("version").output();
    if !which.is_ok_and(|o| o.status.success()) {
        bail!("rclone is not installed (Debian's rclone)");
    }
    let dir = a.dir.join("send-minio");
    let _ = std::fs::remove_dir_all(&dir);
    let server = crate::run::s3::start_minio(&dir)?;
    let endpoint = format!("http://{}", server.addr);
    for (name, extra) in [("bench", None), ("benchenc", Some("--encrypt"))] {
        let mut args = vec![
            "remote",
            "add",
            name,
            "--endpoint",
            &endpoint,
            "--access-key",
            &server.access_key,
            "--secret-key",
            &server.secret_key,
        ];
        args.extend(extra);
        tank_cli(&tank.a, &args, None)?;
    }
    let exe = std::env::current_exe()?;
    let mut rows: Vec<(f64, f64, f64)> = Vec::new();
    println!();
    println!(
        "backup of the full stream ({}) to MinIO against rclone copy of a file of that size",
        human(size)
    );
    for run in 0..a.runs {
        let mut timed = |remote: &str| -> Result<f64> {
            tank.source = None;
            drop_caches(std::slice::from_ref(&tank.dev_a))?;
            tank.start()?;
            let t = Instant::now();
            let out = Command::new(&exe)
                .args(["send", "bsenda/fs@1", "--to"])
                .arg(format!("s3://bench/run{run}/{remote}"))
                .args(["--remote", remote])
                .env("TANK_DATA_DIR", &tank.a)
                .output()?;
            let secs = t.elapsed().as_secs_f64();
            if !out.status.success() {
                bail!(
                    "tank send --to: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            Ok(secs)
        };
        let plain = timed("bench")?;
        let enc = timed("benchenc")?;
        drop_caches(&[file.to_string_lossy().into_owned()])?;
        let t = Instant::now();
        let out = Command::new("rclone")
            .arg("copy")
            .arg(file)
            .arg(format!("minio:bench/run{run}/rclone"))
            .env("RCLONE_CONFIG_MINIO_TYPE", "s3")
            .env("RCLONE_CONFIG_MINIO_PROVIDER", "Minio")
            .env("RCLONE_CONFIG_MINIO_ENDPOINT", &endpoint)
            .env("RCLONE_CONFIG_MINIO_ACCESS_KEY_ID", &server.access_key)
            .env("RCLONE_CONFIG_MINIO_SECRET_ACCESS_KEY", &server.secret_key)
            .env("RCLONE_CONFIG_MINIO_REGION", "us-east-1")
            // A CA bundle for TLS set in the environment makes the AWS SDK in rclone refuse
            // its plain-HTTP transport; the endpoint here is plain HTTP.
            .env_remove("AWS_CA_BUNDLE")
            .output()?;
        let rc = t.elapsed().as_secs_f64();
        if !out.status.success() {
            bail!(
                "rclone copy: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        println!(
            "run {}: tank backup {plain:.2} s, encrypted {enc:.2} s; rclone copy {rc:.2} s",
            run + 1
        );
        rows.push((plain, enc, rc));
    }
    tank.stop();
    let mb = |s: f64| size as f64 / s / 1e6;
    let med =
        |f: &dyn Fn(&(f64, f64, f64)) -> f64| median(&mut rows.iter().map(f).collect::<Vec<f64>>());
    println!();
    println!("| | rate | time | / rclone copy (speed) |");
    println!("|---|---|---|---|");
    println!(
        "| rclone copy of the file | {:.0} MB/s | {:.2} s | |",
        med(&|r| mb(r.2)),
        med(&|r| r.2)
    );
    println!(
        "| tank send --to s3:// | {:.0} MB/s | {:.2} s | **{:.2}** |",
        med(&|r| mb(r.0)),
        med(&|r| r.0),
        med(&|r| r.2 / r.0)
    );
    println!(
        "| tank send --to s3://, encrypted | {:.0} MB/s | {:.2} s | **{:.2}** |",
        med(&|r| mb(r.1)),
        med(&|r| r.1),
        med(&|r| r.2 / r.1)
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
