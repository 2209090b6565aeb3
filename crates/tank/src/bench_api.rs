//! `tank bench-api`: the management API's latency for a status request over HTTPS, against
//! the local socket in the same run, at several numbers of clients, and the daemon's memory
//! (`tank_bench::api`). Prints the medians of the runs, or JSON.

use anyhow::{bail, Result};
use clap::Args;
use tank_bench::api::{medians, Options, Sample};

use crate::datadir::human;

#[derive(Args)]
pub struct BenchApiArgs {
    /// Numbers of concurrent clients, comma-separated.
    #[arg(long, default_value = "1,50", value_delimiter = ',')]
    clients: Vec<usize>,
    /// Seconds each measurement lasts.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Runs (the report gives their medians).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Directory for the daemon's data (removed after); default: the system's temporary
    /// directory.
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
    #[arg(long)]
    json: bool,
    /// Measure the web console instead: its page weight, its dashboard's and dataset page's
    /// server time on a pool of 200 datasets and 1,000 snapshots (the dashboard's requests
    /// over the local socket as the baseline), and the daemon's memory with --consoles
    /// consoles on live charts for --seconds.
    #[arg(long)]
    console: bool,
    /// With --console: consoles open at once.
    #[arg(long, default_value_t = 10)]
    consoles: usize,
    /// With --console: dashboard samples per run.
    #[arg(long, default_value_t = 50)]
    samples: usize,
}

fn line(s: &Sample) -> String {
    format!(
        "{:<7} {:>7} {:>10.0} {:>9.0} {:>9.0} {:>10} {:>10}",
        s.transport,
        s.clients,
        s.per_sec,
        s.p50_us,
        s.p99_us,
        human(s.rss_rest),
        human(s.rss_peak)
    )
}

fn run_console(a: BenchApiArgs) -> Result<()> {
    if a.consoles == 0 || a.consoles > 100 || a.samples == 0 {
        bail!("--consoles takes 1 to 100 and --samples at least 1");
    }
    let exe = std::env::current_exe()?;
    let opts = tank_bench::console::Options {
        consoles: a.consoles,
        seconds: a.seconds,
        samples: a.samples,
        runs: a.runs,
        dir: a
            .dir
            .map_or_else(std::env::temp_dir, |d| crate::out::resolve(&d)),
    };
    let all = tank_bench::console::run(&exe, &opts, &|r| {
        if !a.json {
            errln!(
                "run: page {} B, dashboard p50 {:.1} ms (socket {:.1} ms), datasets {:.1} ms, \
                 RSS {} -> {} with {} consoles",
                r.page_bytes,
                r.dashboard_https_p50_ms,
                r.dashboard_socket_p50_ms,
                r.datasets_https_p50_ms,
                human(r.rss_rest),
                human(r.rss_peak),
                r.consoles
            );
        }
    })?;
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(());
    }
    let med = |f: &dyn Fn(&tank_bench::console::Report) -> f64| {
        let mut v: Vec<f64> = all.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let first = &all[0];
    outln!(
        "a first visit: {} bytes in {} files",
        first.page_bytes,
        first.files.len()
    );
    for (p, b) in &first.files {
        outln!("  {b:>8}  {p}");
    }
    let (https, sock) = (
        med(&|r| r.dashboard_https_p50_ms),
        med(&|r| r.dashboard_socket_p50_ms),
    );
    outln!(
        "medians of {} runs, {} datasets and {} snapshots:",
        all.len(),
        tank_bench::console::DATASETS,
        tank_bench::console::SNAPSHOTS
    );
    outln!(
        "  dashboard refresh (4 requests at once): p50 {https:.1} ms, p99 {:.1} ms over HTTPS; \
         {sock:.1} ms over the local socket ({:.2}x)",
        med(&|r| r.dashboard_https_p99_ms),
        https / sock.max(1e-9)
    );
    outln!(
        "  datasets page (dataset_list of the filesystems and volumes, {} bytes): p50 {:.1} ms",
        first.datasets_bytes,
        med(&|r| r.datasets_https_p50_ms)
    );
    outln!(
        "  everything with the snapshots (dataset_list, {} bytes): p50 {:.1} ms",
        first.all_bytes,
        med(&|r| r.all_https_p50_ms)
    );
    outln!(
        "  daemon memory: {} at rest, {} at the peak with {} consoles on live charts for {} s \
         (each received at least {} I/O events)",
        human(med(&|r| r.rss_rest as f64) as u64),
        human(med(&|r| r.rss_peak as f64) as u64),
        a.consoles,
        a.seconds,
        all.iter().map(|r| r.min_events).min().unwrap_or(0)
    );
    Ok(())
}

pub fn run(a: BenchApiArgs) -> Result<()> {
    if a.console {
        return run_console(a);
    }
    if a.clients.is_empty() || a.clients.iter().any(|c| *c == 0 || *c > 1000) {
        bail!("--clients takes numbers from 1 to 1000");
    }
    if !(a.seconds > 0.0 && a.seconds <= 3600.0) || a.runs == 0 {
        bail!("--seconds takes 0 to 3600 and --runs at least 1");
    }
    let exe = std::env::current_exe()?;
    let opts = Options {
        clients: a.clients,
        seconds: a.seconds,
        runs: a.runs,
        dir: a
            .dir
            .map_or_else(std::env::temp_dir, |d| crate::out::resolve(&d)),
    };
    let header = format!(
        "{:<7} {:>7} {:>10} {:>9} {:>9} {:>10} {:>10}",
        "PATH", "CLIENTS", "REQ/S", "P50 µs", "P99 µs", "RSS REST", "RSS PEAK"
    );
    if !a.json {
        errln!("each run: {header}");
    }
    let all = tank_bench::api::run(&exe, &opts, &|s| {
        if !a.json {
            errln!("          {}", line(s));
        }
    })?;
    let med = medians(&all);
    if a.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({"runs": all, "medians": med}))?
        );
        return Ok(());
    }
    outln!(
        "medians of {} runs of {} s (status request: pool_status):",
        opts.runs,
        opts.seconds
    );
    outln!("{header}");
    for s in &med {
        outln!("{}", line(s));
    }
    for c in &opts.clients {
        let of = |t: &str| med.iter().find(|s| s.transport == t && s.clients == *c);
        if let (Some(sock), Some(https)) = (of("socket"), of("https")) {
            outln!(
                "{c} client(s): HTTPS p50 {:.2}x, p99 {:.2}x the socket's; {:.2}x its rate",
                https.p50_us / sock.p50_us.max(1.0),
                https.p99_us / sock.p99_us.max(1.0),
                https.per_sec / sock.per_sec.max(1e-9)
            );
        }
    }
    Ok(())
}
