//! `tank arcstat` and `tank param`: the caches' figures and the tunables.
//!
//! # Theory of operation
//! The ARC is the process's (the daemon's when one runs: both commands are requests to the
//! service), the L2ARC each pool's. `arcstat` prints a summary (as arc_summary does), `--json` the
//! raw counters, and with an interval one line per period of rates (as arcstat does): the
//! client asks for the counters each period and prints the differences.
//!
//! `param` lists or sets the tunables by their ZFS module-parameter names: `arc_max`,
//! `l2arc_write_max`, `l2arc_write_boost`, `l2arc_noprefetch`, `l2arc_feed_secs`. They
//! hold for the running process; every tank process takes `arc_max` from `TANK_ARC_MAX` at
//! start (`apply_env`).

use std::time::Duration;

use anyhow::{bail, Result};
use clap::Args;
use tank_service::api::{CacheReport, Request, Response};

use crate::client::{unexpected, with_client, Client};
use crate::datadir::human;

#[derive(Args)]
pub struct ArcstatArgs {
    /// Print the counters as JSON.
    #[arg(long)]
    json: bool,
    /// Print a line of rates every INTERVAL seconds.
    interval: Option<f64>,
    /// Stop after COUNT lines.
    count: Option<u64>,
}

impl ArcstatArgs {
    /// With an interval: a line per period, printed by the client.
    pub fn follows(&self) -> bool {
        self.interval.is_some()
    }
}

#[derive(Args)]
pub struct ParamArgs {
    /// NAME to show, or NAME=VALUE to set; none lists them all.
    assignments: Vec<String>,
    #[arg(long)]
    json: bool,
}

fn report(c: &Client) -> Result<CacheReport> {
    match c.call(Request::CacheStats)? {
        Response::CacheStats(r) => Ok(*r),
        r => Err(unexpected(r)),
    }
}

fn get(m: &serde_json::Map<String, serde_json::Value>, k: &str) -> u64 {
    m.get(k).and_then(|v| v.as_u64()).unwrap_or(0)
}

fn pct(a: u64, total: u64) -> String {
    if total == 0 {
        "-".into()
    } else {
        format!("{:.1}%", a as f64 * 100.0 / total as f64)
    }
}

pub fn run_arcstat(a: ArcstatArgs) -> Result<()> {
    if a.follows() {
        return follow_arcstat(&a);
    }
    let r = with_client(report)?;
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    print_summary(&r);
    Ok(())
}

fn print_summary(r: &CacheReport) {
    let s = &r.arc;
    let g = |k: &str| get(s, k);
    outln!(
        "ARC size:           {} (target {}, arc_max {}; MRU target {})",
        human(g("size")),
        human(g("c")),
        human(g("c_max")),
        human(g("p"))
    );
    outln!(
        "  MRU {}   MFU {}   ghost MRU {}   ghost MFU {}",
        human(g("mru_size")),
        human(g("mfu_size")),
        human(g("mru_ghost_size")),
        human(g("mfu_ghost_size"))
    );
    outln!(
        "  data {}   metadata {}   headers {}   buffers {}",
        human(g("data_size")),
        human(g("metadata_size")),
        human(g("hdr_size")),
        g("buffers")
    );
    let (hits, misses) = (g("hits"), g("misses"));
    outln!(
        "ARC hits:           {} of {} reads ({} hits, {} misses)",
        pct(hits, hits + misses),
        hits + misses,
        hits,
        misses
    );
    for (name, h, m) in [
        ("demand data", "demand_data_hits", "demand_data_misses"),
        (
            "demand metadata",
            "demand_metadata_hits",
            "demand_metadata_misses",
        ),
    ] {
        let (h, m) = (g(h), g(m));
        outln!("  {name:<17}{} ({h} hits, {m} misses)", pct(h, h + m));
    }
    outln!(
        "  by list          MRU {}  MFU {}  ghost MRU {}  ghost MFU {}",
        g("mru_hits"),
        g("mfu_hits"),
        g("mru_ghost_hits"),
        g("mfu_ghost_hits")
    );
    outln!(
        "Prefetch:           {} issued, {} used ({}), {} in flight",
        g("prefetch_issued"),
        g("prefetch_hits"),
        pct(g("prefetch_hits"), g("prefetch_issued")),
        human(g("prefetch_bytes_in_flight"))
    );
    outln!(
        "Evictions:          {} ({})",
        g("evict_count"),
        human(g("evicted_bytes"))
    );
    for (pool, l) in &r.l2arc {
        let g = |k: &str| get(l, k);
        if g("l2_devices") == 0 {
            outln!("L2ARC {pool}: no cache devices");
            continue;
        }
        let (h, m) = (g("l2_hits"), g("l2_misses"));
        outln!(
            "L2ARC {pool}: {} device(s), {} of {} held, {} buffers, headers {} in RAM",
            g("l2_devices"),
            human(g("l2_size")),
            human(g("l2_asize")),
            g("l2_buffers"),
            human(g("l2_hdr_size"))
        );
        outln!(
            "  hits {} ({h} hits, {m} misses); {} feeds wrote {}; errors: {} checksum, {} I/O, {} write",
            pct(h, h + m),
            g("l2_feeds"),
            human(g("l2_write_bytes")),
            g("l2_cksum_bad"),
            g("l2_io_error"),
            g("l2_writes_error")
        );
        if g("l2_rebuild_success") > 0 {
            outln!(
                "  rebuilt at import: {} buffers from {} log blocks",
                g("l2_rebuild_bufs"),
                g("l2_rebuild_log_blks")
            );
        }
    }
}

/// `arcstat INTERVAL [COUNT]`: runs in the client, asking the daemon (or this process) for
/// the counters each period.
fn follow_arcstat(a: &ArcstatArgs) -> Result<()> {
    let interval = a.interval.unwrap_or(1.0);
    if !(interval.is_finite() && interval >= 0.1) {
        bail!("invalid interval '{interval}': at least 0.1 seconds");
    }
    with_client(|c| follow(c, a, interval))
}

fn follow(c: &Client, a: &ArcstatArgs, interval: f64) -> Result<()> {
    let fetch = || report(c);
    println!(
        "{:>8} {:>8} {:>8} {:>8} {:>6} {:>6} {:>6} {:>9} {:>9} {:>8} {:>6} {:>9}",
        "time",
        "read",
        "hits",
        "miss",
        "hit%",
        "dh%",
        "ph%",
        "arcsz",
        "c",
        "l2read",
        "l2hit%",
        "l2size"
    );
    let mut prev = fetch()?;
    let mut n = 0;
    loop {
        std::thread::sleep(Duration::from_secs_f64(interval));
        let cur = fetch()?;
        let d = |k: &str| get(&cur.arc, k).saturating_sub(get(&prev.arc, k));
        let l2 = |r: &CacheReport, k: &str| r.l2arc.iter().map(|(_, m)| get(m, k)).sum::<u64>();
        let (hits, miss) = (d("hits"), d("misses"));
        let (dh, dm) = (d("demand_data_hits"), d("demand_data_misses"));
        let (l2h, l2m) = (
            l2(&cur, "l2_hits").saturating_sub(l2(&prev, "l2_hits")),
            l2(&cur, "l2_misses").saturating_sub(l2(&prev, "l2_misses")),
        );
        let per_s = |v: u64| (v as f64 / interval).round() as u64;
        let now = chrono_like_time();
        println!(
            "{:>8} {:>8} {:>8} {:>8} {:>6} {:>6} {:>6} {:>9} {:>9} {:>8} {:>6} {:>9}",
            now,
            per_s(hits + miss),
            per_s(hits),
            per_s(miss),
            pct(hits, hits + miss),
            pct(dh, dh + dm),
            pct(d("prefetch_hits"), d("prefetch_issued")),
            human(get(&cur.arc, "size")),
            human(get(&cur.arc, "c")),
            per_s(l2h + l2m),
            pct(l2h, l2h + l2m),
            human(l2(&cur, "l2_size"))
        );
        prev = cur;
        n += 1;
        if a.count.is_some_and(|c| n >= c) {
            return Ok(());
        }
    }
}

/// HH:MM:SS of the local wall clock (UTC when the zone is unknown).
fn chrono_like_time() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let t = secs % 86_400;
    format!("{:02}:{:02}:{:02}", t / 3600, t % 3600 / 60, t % 60)
}

/// Sets `arc_max` from `TANK_ARC_MAX` (a size such as 4G), when set.
pub fn apply_env() -> Result<()> {
    if let Ok(v) = std::env::var("TANK_ARC_MAX") {
        tank_service::set_param("arc_max", &v).map_err(|e| anyhow::anyhow!("TANK_ARC_MAX: {e}"))?;
    }
    Ok(())
}

pub fn run_param(a: ParamArgs) -> Result<()> {
    with_client(|c| {
        let mut show: Vec<String> = Vec::new();
        for s in &a.assignments {
            match s.split_once('=') {
                Some((n, v)) => {
                    c.call(Request::ParamSet {
                        name: n.into(),
                        value: v.into(),
                    })?;
                }
                None => show.push(s.clone()),
            }
        }
        let all = match c.call(Request::ParamList)? {
            Response::Params(p) => p,
            r => return Err(unexpected(r)),
        };
        for n in &show {
            if !all.iter().any(|p| &p.name == n) {
                bail!("unknown parameter '{n}'");
            }
        }
        if !a.assignments.is_empty() && show.is_empty() {
            return Ok(());
        }
        let rows: Vec<_> = all
            .into_iter()
            .filter(|p| show.is_empty() || show.contains(&p.name))
            .collect();
        if a.json {
            let m: serde_json::Map<String, serde_json::Value> = rows
                .iter()
                .map(|p| (p.name.clone(), serde_json::Value::String(p.value.clone())))
                .collect();
            outln!("{}", serde_json::to_string_pretty(&m)?);
            return Ok(());
        }
        for p in rows {
            outln!("{:<20} {:>14}   {}", p.name, p.value, p.meaning);
        }
        Ok(())
    })
}
