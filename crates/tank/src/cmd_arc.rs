//! `tank arcstat` and `tank param`: the caches' figures and the tunables.
//!
//! # Theory of operation
//! The ARC is the process's (the daemon's when one runs: both commands are forwarded to it),
//! the L2ARC each pool's. `arcstat` prints a summary (as arc_summary does), `--json` the
//! raw counters, and with an interval one line per period of rates (as arcstat does): the
//! client asks for the counters each period and prints the differences.
//!
//! `param` lists or sets the tunables by their ZFS module-parameter names: `arc_max`,
//! `l2arc_write_max`, `l2arc_write_boost`, `l2arc_noprefetch`, `l2arc_feed_secs`. They
//! hold for the running process; every tank process takes `arc_max` from `TANK_ARC_MAX` at
//! start (`apply_env`).

use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use tank_object::arc;
use tank_object::l2arc::{self, L2Stats};

use crate::datadir::{human, parse_size};
use crate::pools::daemon_pools;

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

/// What `arcstat --json` prints.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct CacheReport {
    pub arc: ArcStatsJson,
    /// Per pool, its L2ARC.
    pub l2arc: Vec<(String, L2StatsJson)>,
}

// Serialized copies (the stats types are Serialize only).
pub type ArcStatsJson = serde_json::Map<String, serde_json::Value>;
pub type L2StatsJson = serde_json::Map<String, serde_json::Value>;

fn to_map<T: Serialize>(v: &T) -> serde_json::Map<String, serde_json::Value> {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::Object(m)) => m,
        _ => Default::default(),
    }
}

fn report() -> CacheReport {
    let arc = arc::global().stats();
    let mut pools: Vec<(String, L2Stats)> = daemon_pools()
        .into_iter()
        .map(|o| (o.pool.name(), o.store.cache().l2().stats()))
        .collect();
    pools.sort_by(|a, b| a.0.cmp(&b.0));
    CacheReport {
        arc: to_map(&arc),
        l2arc: pools.iter().map(|(n, s)| (n.clone(), to_map(s))).collect(),
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
    if a.interval.is_some() {
        bail!("arcstat with an interval runs in the client (internal error)");
    }
    let r = report();
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
pub fn follow_arcstat(a: &ArcstatArgs) -> Result<()> {
    let interval = a.interval.unwrap_or(1.0);
    if !(interval.is_finite() && interval >= 0.1) {
        bail!("invalid interval '{interval}': at least 0.1 seconds");
    }
    let fetch = || -> Result<CacheReport> {
        let argv = vec!["arcstat".to_string(), "--json".into()];
        match crate::daemon::forward(&argv, None)? {
            Some(reply) if reply.code == 0 => Ok(serde_json::from_str(reply.stdout.trim())?),
            Some(reply) => bail!("{}", reply.stderr.trim()),
            None => Ok(report()),
        }
    };
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
        set_param("arc_max", &v)
            .map_err(|e| anyhow::anyhow!("TANK_ARC_MAX: {}", crate::out::chain(&e)))?;
    }
    Ok(())
}

/// The tunables: (name, value as shown, what it is).
fn params() -> Vec<(&'static str, String, &'static str)> {
    let t = l2arc::tunables();
    vec![
        (
            "arc_max",
            arc::global().max().to_string(),
            "bytes the ARC may hold, headers included",
        ),
        (
            "l2arc_write_max",
            t.write_max.load(Ordering::Relaxed).to_string(),
            "bytes written to each cache device per feed round",
        ),
        (
            "l2arc_write_boost",
            t.write_boost.load(Ordering::Relaxed).to_string(),
            "extra bytes per round until the ARC first evicts",
        ),
        (
            "l2arc_noprefetch",
            u8::from(t.noprefetch.load(Ordering::Relaxed)).to_string(),
            "1: blocks read ahead and not yet used are not cached on L2ARC",
        ),
        (
            "l2arc_feed_secs",
            t.feed_secs.load(Ordering::Relaxed).to_string(),
            "seconds between feed rounds",
        ),
    ]
}

fn set_param(name: &str, value: &str) -> Result<()> {
    let t = l2arc::tunables();
    let size = || {
        parse_size(value).map_err(|e| anyhow::anyhow!("invalid value '{value}' for {name}: {e}"))
    };
    match name {
        "arc_max" => arc::global()
            .set_max(size()?)
            .map_err(|e| anyhow::anyhow!("cannot set arc_max: {e}"))?,
        "l2arc_write_max" | "l2arc_write_boost" => {
            let v = size()?;
            if name == "l2arc_write_max" && v < 64 << 10 {
                bail!("invalid value '{value}' for {name}: at least 64K");
            }
            if v > 1 << 30 {
                bail!("invalid value '{value}' for {name}: at most 1G per round");
            }
            let slot = if name == "l2arc_write_max" {
                &t.write_max
            } else {
                &t.write_boost
            };
            slot.store(v, Ordering::Relaxed);
        }
        "l2arc_noprefetch" => match value {
            "0" | "1" => t.noprefetch.store(value == "1", Ordering::Relaxed),
            _ => bail!("invalid value '{value}' for {name}: 0 or 1"),
        },
        "l2arc_feed_secs" => match value.parse::<u64>() {
            Ok(v @ 1..=60) => t.feed_secs.store(v, Ordering::Relaxed),
            _ => bail!("invalid value '{value}' for {name}: 1 to 60 seconds"),
        },
        _ => bail!(
            "unknown parameter '{name}' (known: {})",
            params().iter().map(|p| p.0).collect::<Vec<_>>().join(", ")
        ),
    }
    Ok(())
}

pub fn run_param(a: ParamArgs) -> Result<()> {
    let mut show: Vec<String> = Vec::new();
    for s in &a.assignments {
        match s.split_once('=') {
            Some((n, v)) => set_param(n, v)?,
            None => show.push(s.clone()),
        }
    }
    let all = params();
    for n in &show {
        if !all.iter().any(|p| p.0 == n) {
            bail!("unknown parameter '{n}'");
        }
    }
    if !a.assignments.is_empty() && show.is_empty() {
        return Ok(());
    }
    let rows: Vec<_> = all
        .into_iter()
        .filter(|p| show.is_empty() || show.iter().any(|n| n == p.0))
        .collect();
    if a.json {
        let m: serde_json::Map<String, serde_json::Value> = rows
            .iter()
            .map(|(n, v, _)| (n.to_string(), serde_json::Value::String(v.clone())))
            .collect();
        outln!("{}", serde_json::to_string_pretty(&m)?);
        return Ok(());
    }
    for (n, v, what) in rows {
        outln!("{n:<20} {v:>14}   {what}");
    }
    Ok(())
}
