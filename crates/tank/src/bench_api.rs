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

pub fn run(a: BenchApiArgs) -> Result<()> {
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
