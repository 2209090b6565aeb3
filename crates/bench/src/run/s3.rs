//! `tank bench-s3`: tank's S3 endpoint against MinIO on the same disk, in the same run.
//!
//! # Method
//! In the bench directory (one file system, so one disk), each run starts in turn:
//! - *tank*: `tank serve --s3 http://127.0.0.1:PORT` on a data directory of its own (the
//!   default pool: raidz2 of 6 file devices), with an administrator, a key and a bucket;
//! - *MinIO*: `minio server` with 6 drive directories, erasure-coded with 2 parity drives
//!   as raidz2 is (`MINIO_STORAGE_CLASS_STANDARD=EC:2`), found on the PATH (install it with
//!   `go install github.com/minio/minio@latest`).
//!
//! Against each, `--clients` threads (one kept-alive connection each, `s3_client.rs`)
//! PUT 4 KiB objects for `--seconds`, then GET them back for as long, then the same with
//! 4 MiB objects. Reported: objects per second, MB/s, latency percentiles and the server
//! process's CPU seconds per GiB moved (from /proc). Each figure is the median of `--runs`
//! runs; ratios are computed per run, then medianed. tank's PUTs are durable at their 200
//! (committed to its intent log); MinIO's are written through its drives' page cache with
//! `O_DIRECT` and fdatasync as it configures itself.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::fsbench::median;
use crate::run::util::{free_port, start_serve, tank_cli, Daemon};
use crate::s3_client::S3Client;

#[derive(Args)]
pub struct S3BenchArgs {
    /// Directory for tank's data directory and MinIO's drives (one file system: one disk).
    #[arg(long)]
    dir: PathBuf,
    /// Client threads, one connection each.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Seconds of each phase.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Runs; figures are medians.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Leave MinIO out.
    #[arg(long)]
    no_minio: bool,
}

/// One phase's figures.
#[derive(Debug, Clone, Copy, Default)]
struct Phase {
    ops_per_s: f64,
    mb_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    cpu_s_per_gib: f64,
}

/// A server under test.
pub(crate) struct Server {
    child: Daemon,
    pub(crate) addr: String,
    pub(crate) access_key: String,
    pub(crate) secret_key: String,
}

/// CPU seconds a process has used (user and system), from /proc.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis: utime and stime are the 12th and
    // 13th of them.
    let rest = stat.rsplit_once(')').map_or("", |x| x.1);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    #[allow(unsafe_code)]
    // SAFETY: sysconf reads a constant of the system; no memory of ours is touched.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (ticks(11) + ticks(12)) / hz.max(1.0)
}

fn start_tank(dir: &Path) -> Result<Server> {
    let data = dir.join("tank-data");
    let port = free_port()?;
    let child = start_serve(
        &data,
        &["--no-api", "--s3", &format!("http://127.0.0.1:{port}")],
        "warning: cannot serve S3",
    )?;
    tank_cli(
        &data,
        &["user", "add", "bench", "--admin"],
        Some("bench-password\n"),
    )?;
    let keys = tank_cli(&data, &["key", "add", "bench"], None)?;
    let field = |k: &str| {
        keys.lines()
            .find_map(|l| l.strip_prefix(k))
            .map(|v| v.trim().to_string())
            .context("no key printed")
    };
    Ok(Server {
        child,
        addr: format!("127.0.0.1:{port}"),
        access_key: field("access_key:")?,
        secret_key: field("secret_key:")?,
    })
}

/// Why MinIO cannot be measured here, if it cannot.
pub(crate) fn minio_missing() -> Option<String> {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join("minio").is_file()))
        .unwrap_or(false);
    (!found).then(|| {
        "minio is not on the PATH (go install github.com/minio/minio@latest; add ~/go/bin to PATH)"
            .to_string()
    })
}

pub(crate) fn start_minio(dir: &Path) -> Result<Server> {
    let port = free_port()?;
    let console = free_port()?;
    let drives: Vec<String> = (1..=6)
        .map(|i| {
            dir.join(format!("minio-drive{i}"))
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    for d in &drives {
        std::fs::create_dir_all(d)?;
    }
    let (user, pass) = ("benchadmin", "bench-secret-key-0123456789");
    let child = Command::new("minio")
        .arg("server")
        .args(["--address", &format!("127.0.0.1:{port}")])
        .args(["--console-address", &format!("127.0.0.1:{console}")])
        .args(&drives)
        .env("MINIO_ROOT_USER", user)
        .env("MINIO_ROOT_PASSWORD", pass)
        .env("MINIO_STORAGE_CLASS_STANDARD", "EC:2")
        // Drives that are directories of the root disk, which MinIO otherwise refuses.
        .env("MINIO_CI_CD", "1")
        .env("MINIO_BROWSER", "off")
        .env("MINIO_UPDATE", "off")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start minio")?;
    let server = Server {
        child: Daemon(child),
        addr: format!("127.0.0.1:{port}"),
        access_key: user.into(),
        secret_key: pass.into(),
    };
    // Ready once a signed request is answered.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut c = S3Client::new(&server.addr, user, pass);
        if c.make_bucket("bench").is_ok() {
            return Ok(server);
        }
        if Instant::now() > deadline {
            bail!("MinIO did not start in 60 s");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Runs `clients` threads doing `op` (client index, iteration) for `secs`: the ops done,
/// their latencies and the server's CPU seconds meanwhile.
fn phase(
    s: &Server,
    clients: usize,
    secs: u64,
    size: usize,
    op: impl Fn(&mut S3Client, usize, usize, &[u8], &mut Vec<u8>) -> Result<()> + Send + Sync + 'static,
) -> Result<(Vec<Duration>, f64, f64)> {
    let op = Arc::new(op);
    let stop = Arc::new(AtomicBool::new(false));
    let cpu0 = cpu_seconds(s.child.0.id());
    let start = Instant::now();
    let mut threads = Vec::new();
    for c in 0..clients {
        let (op, stop) = (op.clone(), stop.clone());
        let (addr, ak, sk) = (s.addr.clone(), s.access_key.clone(), s.secret_key.clone());
        threads.push(std::thread::spawn(move || -> Result<Vec<Duration>> {
            let mut client = S3Client::new(&addr, &ak, &sk);
            let body: Vec<u8> = (0..size).map(|i| (i * 31 + c) as u8).collect();
            let mut buf = Vec::with_capacity(size);
            let mut lat = Vec::new();
            let mut i = 0;
            // Bounded: the phase's time, and at most a million requests a client.
            while !stop.load(Ordering::Relaxed) && i < 1_000_000 {
                let t = Instant::now();
                op(&mut client, c, i, &body, &mut buf)?;
                lat.push(t.elapsed());
                i += 1;
            }
            Ok(lat)
        }));
    }
    std::thread::sleep(Duration::from_secs(secs));
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for t in threads {
        all.extend(
            t.join()
                .map_err(|_| anyhow::anyhow!("a client panicked"))??,
        );
    }
    let elapsed = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds(s.child.0.id()) - cpu0;
    Ok((all, elapsed, cpu))
}

fn figures(lat: &mut [Duration], elapsed: f64, cpu: f64, size: usize) -> Phase {
    lat.sort();
    let n = lat.len().max(1);
    let pct = |p: f64| {
        lat.get(((n as f64 * p) as usize).min(n - 1))
            .map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    let bytes = lat.len() as f64 * size as f64;
    Phase {
        ops_per_s: lat.len() as f64 / elapsed,
        mb_per_s: bytes / 1e6 / elapsed,
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        cpu_s_per_gib: if bytes > 0.0 {
            cpu / (bytes / (1u64 << 30) as f64)
        } else {
            0.0
        },
    }
}

/// The four phases against one server: PUT and GET of 4 KiB, then of 4 MiB.
fn measure(s: &Server, a: &S3BenchArgs) -> Result<Vec<Phase>> {
    let mut c = S3Client::new(&s.addr, &s.access_key, &s.secret_key);
    c.make_bucket("bench")?;
    let mut out = Vec::new();
    for (size, tag) in [(4usize << 10, "small"), (4 << 20, "large")] {
        // Large objects: bounded to what the disk can take (a key per client and index,
        // written over after 64 of them).
        let wrap = if size > 1 << 20 { 64 } else { usize::MAX };
        let written = Arc::new(
            (0..a.clients)
                .map(|_| std::sync::atomic::AtomicUsize::new(0))
                .collect::<Vec<_>>(),
        );
        let w = written.clone();
        let (mut lat, el, cpu) = phase(s, a.clients, a.seconds, size, move |cl, c, i, body, _| {
            cl.put("bench", &format!("{tag}/{c}/{}", i % wrap), body)?;
            w[c].fetch_max((i % wrap) + 1, Ordering::Relaxed);
            Ok(())
        })?;
        out.push(figures(&mut lat, el, cpu, size));
        let w = written.clone();
        let (mut lat, el, cpu) = phase(s, a.clients, a.seconds, size, move |cl, c, i, _, buf| {
            let n = w[c].load(Ordering::Relaxed).max(1);
            cl.get("bench", &format!("{tag}/{c}/{}", i % n), buf)?;
            if buf.len() != size {
                bail!("GET returned {} bytes of {size}", buf.len());
            }
            Ok(())
        })?;
        out.push(figures(&mut lat, el, cpu, size));
    }
    Ok(out)
}

const PHASES: [&str; 4] = ["PUT 4 KiB", "GET 4 KiB", "PUT 4 MiB", "GET 4 MiB"];

pub fn run(a: S3BenchArgs) -> Result<()> {
    std::fs::create_dir_all(&a.dir)?;
    let why_not = if a.no_minio {
        Some("left out (--no-minio)".to_string())
    } else {
        minio_missing()
    };
    let mut tank_runs = Vec::new();
    let mut minio_runs = Vec::new();
    for r in 0..a.runs {
        let work = a.dir.join(format!("bench-s3-{r}"));
        let _ = std::fs::remove_dir_all(&work);
        std::fs::create_dir_all(&work)?;
        eprintln!("run {}/{}: tank ...", r + 1, a.runs);
        {
            let s = start_tank(&work)?;
            tank_runs.push(measure(&s, &a)?);
        }
        if why_not.is_none() {
            eprintln!("run {}/{}: MinIO ...", r + 1, a.runs);
            let s = start_minio(&work)?;
            minio_runs.push(measure(&s, &a)?);
        }
        let _ = std::fs::remove_dir_all(&work);
    }
    println!(
        "S3 on 127.0.0.1: {} clients, {} s a phase, median of {} run(s)",
        a.clients, a.seconds, a.runs
    );
    println!(
        "{:<12} {:>10} {:>9} {:>8} {:>8} {:>10}   {:>10} {:>9} {:>8} {:>8} {:>10}   {:>7}",
        "",
        "tank op/s",
        "MB/s",
        "p50 ms",
        "p99 ms",
        "CPU s/GiB",
        "MinIO op/s",
        "MB/s",
        "p50 ms",
        "p99 ms",
        "CPU s/GiB",
        "ratio"
    );
    for (i, name) in PHASES.iter().enumerate() {
        let med = |runs: &Vec<Vec<Phase>>, f: fn(&Phase) -> f64| {
            let mut v: Vec<f64> = runs.iter().map(|r| f(&r[i])).collect();
            median(&mut v)
        };
        let t = |f: fn(&Phase) -> f64| med(&tank_runs, f);
        let m = |f: fn(&Phase) -> f64| med(&minio_runs, f);
        let ratio = if minio_runs.is_empty() {
            "-".to_string()
        } else {
            let mut v: Vec<f64> = tank_runs
                .iter()
                .zip(&minio_runs)
                .map(|(t, m)| t[i].ops_per_s / m[i].ops_per_s.max(1e-9))
                .collect();
            format!("{:.2}x", median(&mut v))
        };
        let cols = |ops: f64, mb: f64, p50: f64, p99: f64, cpu: f64| {
            format!("{ops:>10.0} {mb:>9.1} {p50:>8.2} {p99:>8.2} {cpu:>10.2}")
        };
        let minio = if minio_runs.is_empty() {
            format!("{:>50}", "-")
        } else {
            cols(
                m(|p| p.ops_per_s),
                m(|p| p.mb_per_s),
                m(|p| p.p50_ms),
                m(|p| p.p99_ms),
                m(|p| p.cpu_s_per_gib),
            )
        };
        println!(
            "{name:<12} {}   {minio}   {ratio:>7}",
            cols(
                t(|p| p.ops_per_s),
                t(|p| p.mb_per_s),
                t(|p| p.p50_ms),
                t(|p| p.p99_ms),
                t(|p| p.cpu_s_per_gib)
            ),
        );
    }
    if let Some(w) = why_not {
        println!("MinIO: not measured: {w}");
    }
    Ok(())
}
