//! `tank bench-api`: the management API's latency and the daemon's memory, against the
//! local socket measured in the same run.
//!
//! # Theory of operation
//! A daemon (`tank serve`, this program) is started on a data directory of its own with
//! the default pool, an administrator account and a token. For each number of clients,
//! each a thread with one connection, every client sends the same status request
//! (`pool_status` of the default pool) back to back for the measured time: first over the
//! local socket (the CLI's path: one JSON line each way, no TLS: the baseline), then over
//! HTTPS with the token (TLS, HTTP, the caller's token checked against the account store).
//! Every latency is kept; a run reports p50, p99 and the request rate, and the daemon's
//! resident memory is read from /proc at rest and, sampled, under load. Several runs give
//! medians. Nothing here asserts a speed: the numbers are reported.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use tank_api::client::HttpsClient;

/// One transport at one number of clients, over one run.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub transport: &'static str,
    pub clients: usize,
    pub requests: u64,
    pub per_sec: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// The daemon's resident memory: at the start of the run, and the peak during it.
    pub rss_rest: u64,
    pub rss_peak: u64,
}

pub struct Options {
    pub clients: Vec<usize>,
    pub seconds: f64,
    pub runs: usize,
    /// Where the daemon's data directory is made (removed after).
    pub dir: PathBuf,
}

pub(crate) struct Daemon {
    pub(crate) child: crate::run::util::Daemon,
    pub(crate) addr: std::net::SocketAddr,
    pub(crate) data: PathBuf,
}

/// The peak of a process's resident memory, sampled every 100 ms on a thread until
/// `finish`.
pub(crate) struct PeakRss {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl PeakRss {
    pub(crate) fn start(pid: u32) -> PeakRss {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut peak = 0;
            while !flag.load(Ordering::Relaxed) {
                peak = peak.max(rss(pid));
                std::thread::sleep(Duration::from_millis(100));
            }
            peak
        });
        PeakRss { stop, thread }
    }

    pub(crate) fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or(0)
    }
}

/// Runs `f` on a data directory made under `dir` with an administrator account `bench`
/// (password "a bench password"), and removes it after.
pub(crate) fn with_data_dir<T>(
    dir: &Path,
    name: &str,
    exe: &Path,
    f: impl FnOnce(&Path) -> Result<T>,
) -> Result<T> {
    let tmp = dir.join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    let result = (|| {
        let data = tmp.join("data");
        tank(
            exe,
            &data,
            &["user", "add", "bench", "--admin"],
            "a bench password\n",
        )?;
        f(&data)
    })();
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

/// The daemon's resident memory in bytes.
pub fn rss(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

pub(crate) fn tank(exe: &Path, data: &Path, args: &[&str], stdin: &str) -> Result<String> {
    let mut child = Command::new(exe)
        .args(args)
        .env("TANK_DATA_DIR", data)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(stdin.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "tank {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub(crate) fn start(exe: &Path, data: &Path) -> Result<Daemon> {
    let mut child = Command::new(exe)
        .args(["serve", "--api", "127.0.0.1:0"])
        .env("TANK_DATA_DIR", data)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start tank serve")?;
    let out = BufReader::new(child.stdout.take().expect("piped"));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let addr = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .context("the daemon did not print its API address")?;
        if let Some(u) = line.strip_prefix("api: https://") {
            break u.parse()?;
        }
    };
    std::thread::spawn(move || while rx.recv().is_ok() {});
    while !data.join("tank.sock").exists() {
        if Instant::now() > deadline {
            bail!("the daemon's socket did not appear");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(Daemon {
        child: crate::run::util::Daemon(child),
        addr,
        data: data.to_path_buf(),
    })
}

const STATUS: &str = r#"{"name": "tank"}"#;

/// One client over the local socket: latencies in microseconds. The daemon closes a
/// connection after a bounded number of requests; the client then connects again (the
/// request that found it closed is sent again and not timed).
fn socket_client(sock: &Path, until: Instant) -> Result<Vec<u32>> {
    let line = format!(
        "{{\"version\": {}, \"request\": {{\"op\": \"pool_status\", \"name\": \"tank\"}}}}\n",
        tank_service::API_VERSION
    );
    let mut lat = Vec::new();
    let mut reply = String::new();
    let mut conn: Option<(BufReader<UnixStream>, UnixStream)> = None;
    while Instant::now() < until {
        let (reader, w) = match &mut conn {
            Some(c) => c,
            None => {
                let s = UnixStream::connect(sock)?;
                conn.insert((BufReader::new(s.try_clone()?), s))
            }
        };
        let t = Instant::now();
        reply.clear();
        let answered = w.write_all(line.as_bytes()).is_ok()
            && reader.read_line(&mut reply).is_ok_and(|n| n > 0);
        if !answered {
            conn = None;
            continue;
        }
        if !reply.starts_with("{\"ok\"") {
            bail!("the socket answered: {reply}");
        }
        lat.push(t.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
    }
    Ok(lat)
}

/// One client over HTTPS with the token.
fn https_client(d: &Daemon, token: &str, until: Instant) -> Result<Vec<u32>> {
    let mut c = HttpsClient::new(d.addr, &d.data.join("tls/cert.pem"))?;
    let auth = format!("Bearer {token}");
    let mut lat = Vec::new();
    while Instant::now() < until {
        let t = Instant::now();
        let (code, body) = c.request(
            "POST",
            "/api/v1/pool_status",
            &[
                ("Authorization", &auth),
                ("Content-Type", "application/json"),
            ],
            STATUS.as_bytes(),
        )?;
        if code != 200 {
            bail!("HTTPS answered {code}: {}", String::from_utf8_lossy(&body));
        }
        lat.push(t.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
    }
    Ok(lat)
}

/// The `p` quantile (0 to 1) of values sorted ascending; 0 for none.
pub(crate) fn percentile<T: Copy + Into<f64>>(sorted: &[T], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].into()
}

/// A new API token of the `bench` account of `data`, made with the command line.
pub(crate) fn new_token(exe: &Path, data: &Path) -> Result<String> {
    Ok(tank(exe, data, &["token", "add", "bench"], "")?
        .trim()
        .strip_prefix("token: ")
        .context("no token printed")?
        .to_string())
}

fn measure(
    d: &Daemon,
    token: &str,
    transport: &'static str,
    clients: usize,
    seconds: f64,
) -> Result<Sample> {
    let pid = d.child.0.id();
    let rss_rest = rss(pid);
    let peak = PeakRss::start(pid);
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(seconds);
    let sock = d.data.join("tank.sock");
    let results: Vec<Result<Vec<u32>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..clients)
            .map(|_| {
                let sock = sock.clone();
                s.spawn(move || match transport {
                    "socket" => socket_client(&sock, until),
                    _ => https_client(d, token, until),
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| bail!("a client thread panicked"))
            })
            .collect()
    });
    let elapsed = started.elapsed().as_secs_f64();
    let rss_peak = peak.finish();
    let mut all = Vec::new();
    for r in results {
        all.extend(r?);
    }
    all.sort_unstable();
    Ok(Sample {
        transport,
        clients,
        requests: all.len() as u64,
        per_sec: all.len() as f64 / elapsed,
        p50_us: percentile(&all, 0.50),
        p99_us: percentile(&all, 0.99),
        rss_rest,
        rss_peak,
    })
}

/// Runs the benchmark; `exe` is the tank program. Returns every sample of every run.
pub fn run(exe: &Path, opts: &Options, progress: &dyn Fn(&Sample)) -> Result<Vec<Sample>> {
    with_data_dir(&opts.dir, "tank-bench-api", exe, |data| {
        let token = new_token(exe, data)?;
        let d = start(exe, data)?;
        // Warm up both paths (connections, caches).
        measure(&d, &token, "socket", 1, 0.5)?;
        measure(&d, &token, "https", 1, 0.5)?;
        let mut out = Vec::new();
        for _ in 0..opts.runs {
            for &c in &opts.clients {
                for t in ["socket", "https"] {
                    let s = measure(&d, &token, t, c, opts.seconds)?;
                    progress(&s);
                    out.push(s);
                }
            }
        }
        drop(d);
        Ok(out)
    })
}

/// The median of each (transport, clients) over the runs.
pub fn medians(samples: &[Sample]) -> Vec<Sample> {
    let mut keys: Vec<(&'static str, usize)> =
        samples.iter().map(|s| (s.transport, s.clients)).collect();
    keys.dedup();
    keys.sort_by_key(|k| (k.1, k.0 != "socket"));
    keys.dedup();
    let med = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    keys.into_iter()
        .map(|(t, c)| {
            let of: Vec<&Sample> = samples
                .iter()
                .filter(|s| s.transport == t && s.clients == c)
                .collect();
            Sample {
                transport: t,
                clients: c,
                requests: med(of.iter().map(|s| s.requests as f64).collect()) as u64,
                per_sec: med(of.iter().map(|s| s.per_sec).collect()),
                p50_us: med(of.iter().map(|s| s.p50_us).collect()),
                p99_us: med(of.iter().map(|s| s.p99_us).collect()),
                rss_rest: med(of.iter().map(|s| s.rss_rest as f64).collect()) as u64,
                rss_peak: med(of.iter().map(|s| s.rss_peak as f64).collect()) as u64,
            }
        })
        .collect()
}
