//! `tank bench-api --console`: what the web console costs: its page weight, the server time
//! of its dashboard and dataset pages on a pool with many datasets and snapshots, and the
//! daemon's memory with several consoles open on live charts.
//!
//! # Theory of operation
//! A daemon (this program) is started on a data directory of its own with the default
//! pool, an administrator and a token, and given 200 datasets (not mounted: a mounted
//! filesystem's own cost is not the console's) and 1,000 snapshots through the API. Then,
//! over HTTPS on 127.0.0.1:
//! - **Page weight**: a password login, then the shell (`GET /`) and every file it loads,
//!   as a browser fetches them on a first visit; bytes of the bodies as sent.
//! - **Dashboard**: the requests the dashboard makes at each refresh (`pool_status`,
//!   `pool_list`, `cache_stats`, `pool_events`), all at once on a connection each, as the
//!   page sends them; a sample is the time until the last answer. The same requests over
//!   the local socket are the baseline, measured in the same run.
//! - **Datasets page**: `dataset_list` of the filesystems and volumes (200), as the page
//!   asks; and of everything (1,200 entries with the snapshots), as `zfs list -t all`.
//! - **Memory**: N consoles (each an event stream on its connection, and a dashboard
//!   refresh every 5 s on another) for the measured time; the daemon's resident memory at
//!   rest and its peak, and the events each console received (so the streams were live).
//!
//! Nothing here asserts a speed: the numbers are reported.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use tank_api::client::HttpsClient;

use crate::api::{new_token, rss, start, with_data_dir, Daemon, PeakRss};

/// Datasets and snapshots the pool is given.
pub const DATASETS: usize = 200;
pub const SNAPSHOTS: usize = 1000;

/// The dashboard's requests at each refresh.
const DASHBOARD: &[(&str, &str)] = &[
    ("pool_status", "{}"),
    ("pool_list", "{}"),
    ("cache_stats", "{}"),
    ("pool_events", "{}"),
];

pub struct Options {
    pub consoles: usize,
    pub seconds: f64,
    pub samples: usize,
    pub runs: usize,
    pub dir: PathBuf,
}

/// One run's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// (path, bytes) of the first visit, shell first.
    pub files: Vec<(String, usize)>,
    pub page_bytes: usize,
    pub dashboard_https_p50_ms: f64,
    pub dashboard_https_p99_ms: f64,
    pub dashboard_socket_p50_ms: f64,
    pub datasets_https_p50_ms: f64,
    pub datasets_bytes: usize,
    /// Everything, snapshots too (`zfs list -t all`).
    pub all_https_p50_ms: f64,
    pub all_bytes: usize,
    pub consoles: usize,
    pub rss_rest: u64,
    pub rss_peak: u64,
    /// The fewest events one console received.
    pub min_events: u64,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The `p` quantile (0 to 1) of `v` (sorted here).
fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    crate::api::percentile(v, p)
}

fn post(c: &mut HttpsClient, auth: &str, op: &str, body: &str) -> Result<Vec<u8>> {
    let (code, out) = c.request(
        "POST",
        &format!("/api/v1/{op}"),
        &[
            ("Authorization", auth),
            ("Content-Type", "application/json"),
        ],
        body.as_bytes(),
    )?;
    if code != 200 {
        bail!("{op} answered {code}: {}", String::from_utf8_lossy(&out));
    }
    Ok(out)
}

/// The requests at once, one client each; the time until the last answer.
fn at_once(clients: &mut [HttpsClient], auth: &str, reqs: &[(&str, &str)]) -> Result<Duration> {
    let t = Instant::now();
    std::thread::scope(|s| {
        let hs: Vec<_> = clients
            .iter_mut()
            .zip(reqs)
            .map(|(c, (op, body))| s.spawn(move || post(c, auth, op, body).map(|_| ())))
            .collect();
        hs.into_iter()
            .try_for_each(|h| h.join().unwrap_or_else(|_| bail!("a client panicked")))
    })?;
    Ok(t.elapsed())
}

fn socket_at_once(sock: &Path, reqs: &[(&str, &str)]) -> Result<Duration> {
    let conns: Vec<UnixStream> = reqs
        .iter()
        .map(|_| UnixStream::connect(sock))
        .collect::<std::io::Result<_>>()?;
    let t = Instant::now();
    std::thread::scope(|s| {
        let hs: Vec<_> = conns
            .into_iter()
            .zip(reqs)
            .map(|(c, (op, body))| {
                s.spawn(move || -> Result<()> {
                    let fields = body.trim().trim_start_matches('{').trim_end_matches('}');
                    let sep = if fields.trim().is_empty() { "" } else { ", " };
                    let line = format!(
                        "{{\"version\": {}, \"request\": {{\"op\": \"{op}\"{sep}{fields}}}}}\n",
                        tank_service::API_VERSION
                    );
                    let mut w = c.try_clone()?;
                    w.write_all(line.as_bytes())?;
                    let mut reply = String::new();
                    BufReader::new(c).read_line(&mut reply)?;
                    if !reply.starts_with("{\"ok\"") {
                        bail!(
                            "the socket answered {op}: {}",
                            &reply[..reply.len().min(300)]
                        );
                    }
                    Ok(())
                })
            })
            .collect();
        hs.into_iter()
            .try_for_each(|h| h.join().unwrap_or_else(|_| bail!("a client panicked")))
    })?;
    Ok(t.elapsed())
}

/// A login and the files of a first visit: (path, bytes).
fn first_visit(d: &Daemon) -> Result<Vec<(String, usize)>> {
    let mut c = HttpsClient::new(d.addr, &d.data.join("tls/cert.pem"))?;
    let (code, headers, body) = c.request_with_headers(
        "POST",
        "/api/v1/login",
        &[("Content-Type", "application/json")],
        br#"{"user": "bench", "password": "a bench password"}"#,
    )?;
    if code != 200 {
        bail!("login answered {code}: {}", String::from_utf8_lossy(&body));
    }
    let cookie = headers
        .iter()
        .find(|(k, _)| k == "set-cookie")
        .and_then(|(_, v)| v.split(';').next())
        .context("the login set no cookie")?
        .to_string();
    let (code, shell) = c.request("GET", "/", &[("Cookie", &cookie)], b"")?;
    if code != 200 {
        bail!("the console's shell answered {code}");
    }
    let text = String::from_utf8_lossy(&shell).into_owned();
    let mut files = vec![("/".to_string(), shell.len())];
    // Every file the shell names (scripts, styles, the icon).
    for attr in ["src=\"", "href=\""] {
        for part in text.split(attr).skip(1) {
            let path = part.split('"').next().unwrap_or("");
            if path.starts_with("/console/") && !files.iter().any(|(p, _)| p == path) {
                let (code, body) = c.request("GET", path, &[], b"")?;
                if code != 200 {
                    bail!("{path} answered {code}");
                }
                files.push((path.to_string(), body.len()));
            }
        }
    }
    Ok(files)
}

/// N consoles on live charts for `seconds`: the fewest events one received.
fn consoles(d: &Daemon, auth: &str, n: usize, seconds: f64) -> Result<u64> {
    let stop = Arc::new(AtomicBool::new(false));
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let counts: Vec<Result<u64>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|_| {
                let stop = stop.clone();
                s.spawn(move || -> Result<u64> {
                    let cert = d.data.join("tls/cert.pem");
                    let mut sc = HttpsClient::new(d.addr, &cert)?;
                    let (code, mut events) =
                        sc.stream("/api/v1/events", &[("Authorization", auth)])?;
                    if code != 200 {
                        bail!("the event stream answered {code}");
                    }
                    // The page's refresh, every 5 s, on its own connections.
                    let refresher = {
                        let stop = stop.clone();
                        let cert = cert.clone();
                        s.spawn(move || -> Result<()> {
                            let mut cs: Vec<HttpsClient> = DASHBOARD
                                .iter()
                                .map(|_| HttpsClient::new(d.addr, &cert))
                                .collect::<Result<_>>()?;
                            while !stop.load(Ordering::Relaxed) {
                                at_once(&mut cs, auth, DASHBOARD)?;
                                let next = Instant::now() + Duration::from_secs(5);
                                while Instant::now() < next && !stop.load(Ordering::Relaxed) {
                                    std::thread::sleep(Duration::from_millis(100));
                                }
                            }
                            Ok(())
                        })
                    };
                    let mut got = 0;
                    let mut line = String::new();
                    while Instant::now() < until {
                        line.clear();
                        if events.read_line(&mut line)? == 0 {
                            bail!("the event stream ended");
                        }
                        if line.starts_with("event: iostat") {
                            got += 1;
                        }
                    }
                    stop.store(true, Ordering::Relaxed);
                    refresher
                        .join()
                        .unwrap_or_else(|_| bail!("a refresher panicked"))?;
                    Ok(got)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| bail!("a console panicked")))
            .collect()
    });
    let mut min = u64::MAX;
    for c in counts {
        min = min.min(c?);
    }
    Ok(min)
}

fn one_run(exe: &Path, opts: &Options, data: &Path) -> Result<Report> {
    let token = new_token(exe, data)?;
    let auth = format!("Bearer {token}");
    let d = start(exe, data)?;
    let cert = data.join("tls/cert.pem");
    let mut c = HttpsClient::new(d.addr, &cert)?;
    let listed = post(&mut c, &auth, "dataset_list", r#"{"names": ["tank/d000"]}"#);
    if listed.is_err() {
        for i in 0..DATASETS {
            post(
                &mut c,
                &auth,
                "dataset_create",
                &format!(
                    r#"{{"name": "tank/d{i:03}", "kind": "filesystem", "props": [["mountpoint", "none"]]}}"#
                ),
            )?;
        }
        let names: Vec<String> = (0..SNAPSHOTS)
            .map(|i| format!("\"tank/d{:03}@s{i:04}\"", i % DATASETS))
            .collect();
        post(
            &mut c,
            &auth,
            "snapshot",
            &format!(r#"{{"names": [{}]}}"#, names.join(",")),
        )?;
    }
    let files = first_visit(&d)?;
    let page_bytes = files.iter().map(|(_, b)| b).sum();
    let mut cs: Vec<HttpsClient> = DASHBOARD
        .iter()
        .map(|_| HttpsClient::new(d.addr, &cert))
        .collect::<Result<_>>()?;
    at_once(&mut cs, &auth, DASHBOARD)?;
    let mut https = Vec::new();
    let mut socket = Vec::new();
    let sock = data.join("tank.sock");
    for _ in 0..opts.samples {
        https.push(ms(at_once(&mut cs, &auth, DASHBOARD)?));
        socket.push(ms(socket_at_once(&sock, DASHBOARD)?));
    }
    let page = r#"{"recursive": true, "types": ["filesystem", "volume"]}"#;
    let all = r#"{"recursive": true}"#;
    let datasets_bytes = post(&mut c, &auth, "dataset_list", page)?.len();
    let all_bytes = post(&mut c, &auth, "dataset_list", all)?.len();
    let (mut lists, mut alls) = (Vec::new(), Vec::new());
    for _ in 0..opts.samples.clamp(1, 20) {
        let t = Instant::now();
        post(&mut c, &auth, "dataset_list", page)?;
        lists.push(ms(t.elapsed()));
        let t = Instant::now();
        post(&mut c, &auth, "dataset_list", all)?;
        alls.push(ms(t.elapsed()));
    }
    let pid = d.child.0.id();
    std::thread::sleep(Duration::from_secs(1));
    let rss_rest = rss(pid);
    let peak = PeakRss::start(pid);
    let min_events = consoles(&d, &auth, opts.consoles, opts.seconds);
    let rss_peak = peak.finish();
    Ok(Report {
        files,
        page_bytes,
        dashboard_https_p50_ms: percentile(&mut https.clone(), 0.5),
        dashboard_https_p99_ms: percentile(&mut https, 0.99),
        dashboard_socket_p50_ms: percentile(&mut socket, 0.5),
        datasets_https_p50_ms: percentile(&mut lists, 0.5),
        datasets_bytes,
        all_https_p50_ms: percentile(&mut alls, 0.5),
        all_bytes,
        consoles: opts.consoles,
        rss_rest,
        rss_peak,
        min_events: min_events?,
    })
}

/// Runs the benchmark (`exe` is the tank program): one report per run, each on a daemon
/// started afresh on the same data.
pub fn run(exe: &Path, opts: &Options, progress: &dyn Fn(&Report)) -> Result<Vec<Report>> {
    with_data_dir(&opts.dir, "tank-bench-console", exe, |data| {
        let mut out = Vec::new();
        for _ in 0..opts.runs {
            let r = one_run(exe, opts, data)?;
            progress(&r);
            out.push(r);
        }
        Ok(out)
    })
}
