//! `/metrics`: the service's state and counters in the Prometheus text format (OpenMetrics).
//!
//! # Theory of operation
//! Nothing is copied ahead of time: each scrape reads the service's open pools (their
//! status, vdev counters, latency histograms, scan and intent-log figures), the ARC and each
//! pool's L2ARC, and the front ends' request counters (`tank_service::stats`), and encodes them with
//! prometheus-client as one collector. Names follow Prometheus' conventions: a `tank_`
//! prefix, base units (bytes, seconds), `_total` on counters, states as one series per
//! state with value 1 for the current one.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tank_pool::VdevStatus;
use tank_service::Service;

type Labels = Vec<(String, String)>;

fn l(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

enum Value {
    Gauge(f64),
    Counter(u64),
    Histogram(Vec<(f64, u64)>, f64),
}

/// Writes a family of series of one type.
fn family(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    ty: MetricType,
    series: &[(Labels, Value)],
) -> Result<(), std::fmt::Error> {
    if series.is_empty() {
        return Ok(());
    }
    let mut m = enc.encode_descriptor(name, help, None, ty)?;
    for (labels, v) in series {
        let mut f = m.encode_family(labels)?;
        match v {
            Value::Gauge(g) => f.encode_gauge(g)?,
            Value::Counter(c) => f.encode_counter::<Labels, u64, f64>(c, None)?,
            Value::Histogram(buckets, sum) => {
                // Per bucket: the encoder writes them cumulative, as the format has them.
                let count = buckets.iter().map(|(_, n)| n).sum();
                f.encode_histogram::<Labels>(*sum, count, buckets, None)?
            }
        }
    }
    Ok(())
}

/// The collector of one service, registered once; it reads the state at each scrape.
pub struct Collect {
    pub svc: Arc<Service>,
}

impl std::fmt::Debug for Collect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("tank service collector")
    }
}

/// Hits over lookups (0 before the first).
fn hit_ratio(hits: u64, misses: u64) -> f64 {
    if hits + misses == 0 {
        0.0
    } else {
        hits as f64 / (hits + misses) as f64
    }
}

fn walk<'v>(v: &'v VdevStatus, out: &mut Vec<&'v VdevStatus>) {
    out.push(v);
    for c in &v.children {
        walk(c, out);
    }
}

const POOL_STATES: [&str; 6] = [
    "ONLINE",
    "DEGRADED",
    "FAULTED",
    "SUSPENDED",
    "UNAVAIL",
    "REMOVED",
];
const VDEV_STATES: [&str; 6] = [
    "ONLINE", "DEGRADED", "FAULTED", "OFFLINE", "UNAVAIL", "REMOVED",
];

impl Collector for Collect {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use MetricType::{Counter, Gauge, Histogram};
        use Value as V;
        let pools = self.svc.open_pools();
        let mut health = Vec::new();
        let mut space: HashMap<&str, Vec<(Labels, Value)>> = HashMap::new();
        let mut txg = Vec::new();
        let mut frag = Vec::new();
        let mut vstate = Vec::new();
        let mut verr = Vec::new();
        let mut vops = Vec::new();
        let mut vbytes = Vec::new();
        let mut vlat = Vec::new();
        let mut l2 = Vec::new();
        let mut l2hits = Vec::new();
        let mut l2miss = Vec::new();
        let mut l2ratio = Vec::new();
        let mut zcommits = Vec::new();
        let mut dirty = Vec::new();
        let mut dirty_max = Vec::new();
        let mut throttle_delays = Vec::new();
        let mut throttle_waits = Vec::new();
        let mut zfallbacks = Vec::new();
        let mut zlat = Vec::new();
        let mut scan_active = Vec::new();
        let mut scan_done = Vec::new();
        let mut scan_total = Vec::new();
        let mut scan_rate = Vec::new();
        let mut scan_errors = Vec::new();
        for o in &pools {
            let st = o.pool.status();
            let p = st.name.as_str();
            let state_word = st.state.split_whitespace().next().unwrap_or("").to_string();
            for s in POOL_STATES {
                health.push((
                    l(&[("pool", p), ("state", s)]),
                    V::Gauge(f64::from(u8::from(state_word == s))),
                ));
            }
            for (k, v) in [
                ("size", st.space.size),
                ("allocated", st.space.allocated),
                ("free", st.space.free),
                ("usable", st.space.usable),
                ("freeing", st.space.deferred),
            ] {
                space
                    .entry(k)
                    .or_default()
                    .push((l(&[("pool", p)]), V::Gauge(v as f64)));
            }
            txg.push((l(&[("pool", p)]), V::Gauge(st.txg as f64)));
            frag.push((
                l(&[("pool", p)]),
                V::Gauge(st.space.fragmentation as f64 / 100.0),
            ));
            let mut all = Vec::new();
            for v in &st.config {
                walk(v, &mut all);
            }
            for (_, vs) in &st.sections {
                for v in vs {
                    walk(v, &mut all);
                }
            }
            for v in all {
                let name = v.path.as_deref().unwrap_or(&v.name);
                let word = v.state.split_whitespace().next().unwrap_or("");
                for s in VDEV_STATES {
                    vstate.push((
                        l(&[("pool", p), ("vdev", name), ("state", s)]),
                        V::Gauge(f64::from(u8::from(word == s))),
                    ));
                }
                for (t, n) in [
                    ("read", v.read_errors),
                    ("write", v.write_errors),
                    ("checksum", v.cksum_errors),
                ] {
                    verr.push((
                        l(&[("pool", p), ("vdev", name), ("type", t)]),
                        V::Counter(n),
                    ));
                }
            }
            for (_, leaf) in o.pool.leaf_list() {
                let path = leaf.path();
                let s = leaf.stats.snapshot();
                for (op, ops, bytes, h) in [
                    ("read", s.read_ops, s.read_bytes, &leaf.stats.read_latency),
                    (
                        "write",
                        s.write_ops,
                        s.write_bytes,
                        &leaf.stats.write_latency,
                    ),
                ] {
                    let lab = l(&[("pool", p), ("vdev", &path), ("op", op)]);
                    vops.push((lab.clone(), V::Counter(ops)));
                    vbytes.push((lab.clone(), V::Counter(bytes)));
                    let (b, sum) = h.snapshot();
                    vlat.push((lab, V::Histogram(b, sum)));
                }
            }
            let l2s = o.store.cache().l2().stats();
            l2.push((l(&[("pool", p)]), V::Gauge(l2s.l2_size as f64)));
            l2hits.push((l(&[("pool", p)]), V::Counter(l2s.l2_hits)));
            l2miss.push((l(&[("pool", p)]), V::Counter(l2s.l2_misses)));
            l2ratio.push((
                l(&[("pool", p)]),
                V::Gauge(hit_ratio(l2s.l2_hits, l2s.l2_misses)),
            ));
            let w = o.pool.write_throttle();
            dirty.push((l(&[("pool", p)]), V::Gauge(w.dirty_bytes as f64)));
            dirty_max.push((l(&[("pool", p)]), V::Gauge(w.dirty_max as f64)));
            throttle_delays.push((l(&[("pool", p)]), V::Counter(w.delays)));
            throttle_waits.push((l(&[("pool", p)]), V::Counter(w.waits)));
            let z = o.pool.zil.stats();
            zcommits.push((l(&[("pool", p)]), V::Counter(z.commits)));
            zfallbacks.push((l(&[("pool", p)]), V::Counter(z.fallbacks)));
            let (b, sum) = o.pool.zil.latency.snapshot();
            zlat.push((l(&[("pool", p)]), V::Histogram(b, sum)));
            let scan = o.store.scan_status();
            let func = if scan.state.func.is_empty() {
                "none".to_string()
            } else {
                scan.state.func.clone()
            };
            let lab = l(&[("pool", p), ("function", &func)]);
            let total = scan.state.to_examine.max(scan.state.issued);
            scan_active.push((
                lab.clone(),
                V::Gauge(f64::from(u8::from(
                    scan.state.phase == tank_object::ScanPhase::Scanning,
                ))),
            ));
            scan_done.push((lab.clone(), V::Gauge(scan.state.issued as f64)));
            scan_total.push((lab.clone(), V::Gauge(total as f64)));
            scan_rate.push((
                lab.clone(),
                V::Gauge(if scan.running { scan.rate } else { 0.0 }),
            ));
            scan_errors.push((lab, V::Gauge(scan.state.errors as f64)));
        }
        family(
            &mut enc,
            "tank_pool_health",
            "1 for the pool's current state, 0 for the others",
            Gauge,
            &health,
        )?;
        for (k, help) in [
            ("size", "raw capacity of the pool's devices"),
            ("allocated", "bytes allocated"),
            ("free", "bytes free"),
            ("usable", "capacity for data, parity excluded"),
            (
                "freeing",
                "bytes freed but not yet reusable (deferred frees)",
            ),
        ] {
            family(
                &mut enc,
                &format!("tank_pool_{k}_bytes"),
                help,
                Gauge,
                space.get(k).map(Vec::as_slice).unwrap_or(&[]),
            )?;
        }
        family(
            &mut enc,
            "tank_pool_txg",
            "the last committed transaction group",
            Gauge,
            &txg,
        )?;
        family(
            &mut enc,
            "tank_pool_fragmentation_ratio",
            "free-space fragmentation (zpool's FRAG, 0 to 1)",
            Gauge,
            &frag,
        )?;
        family(
            &mut enc,
            "tank_vdev_health",
            "1 for the vdev's current state, 0 for the others",
            Gauge,
            &vstate,
        )?;
        family(
            &mut enc,
            "tank_vdev_errors",
            "READ, WRITE and CKSUM errors as pool status counts them",
            Counter,
            &verr,
        )?;
        family(
            &mut enc,
            "tank_vdev_operations",
            "I/O operations of each device",
            Counter,
            &vops,
        )?;
        family(
            &mut enc,
            "tank_vdev_io_bytes",
            "bytes read and written by each device",
            Counter,
            &vbytes,
        )?;
        family(
            &mut enc,
            "tank_vdev_latency_seconds",
            "time each device took per operation (its queue's wait excluded)",
            Histogram,
            &vlat,
        )?;
        let arc = tank_object::arc::global().stats();
        family(
            &mut enc,
            "tank_arc_size_bytes",
            "bytes the ARC holds",
            Gauge,
            &[(Vec::new(), V::Gauge(arc.size as f64))],
        )?;
        family(
            &mut enc,
            "tank_arc_target_bytes",
            "the ARC's target size (c)",
            Gauge,
            &[(Vec::new(), V::Gauge(arc.c as f64))],
        )?;
        family(
            &mut enc,
            "tank_arc_max_bytes",
            "arc_max",
            Gauge,
            &[(Vec::new(), V::Gauge(arc.c_max as f64))],
        )?;
        family(
            &mut enc,
            "tank_arc_hits",
            "ARC hits",
            Counter,
            &[(Vec::new(), V::Counter(arc.hits))],
        )?;
        family(
            &mut enc,
            "tank_arc_misses",
            "ARC misses",
            Counter,
            &[(Vec::new(), V::Counter(arc.misses))],
        )?;
        family(
            &mut enc,
            "tank_arc_hit_ratio",
            "hits over reads since start",
            Gauge,
            &[(Vec::new(), V::Gauge(hit_ratio(arc.hits, arc.misses)))],
        )?;
        family(
            &mut enc,
            "tank_l2arc_size_bytes",
            "bytes the L2ARC holds",
            Gauge,
            &l2,
        )?;
        family(&mut enc, "tank_l2arc_hits", "L2ARC hits", Counter, &l2hits)?;
        family(
            &mut enc,
            "tank_l2arc_misses",
            "L2ARC misses",
            Counter,
            &l2miss,
        )?;
        family(
            &mut enc,
            "tank_l2arc_hit_ratio",
            "L2ARC hits over lookups",
            Gauge,
            &l2ratio,
        )?;
        family(
            &mut enc,
            "tank_dirty_bytes",
            "dirty data held for the open and the syncing txg",
            Gauge,
            &dirty,
        )?;
        family(
            &mut enc,
            "tank_dirty_max_bytes",
            "the dirty data at which writers wait for a sync",
            Gauge,
            &dirty_max,
        )?;
        family(
            &mut enc,
            "tank_write_throttle_delays",
            "writes delayed by the throttle (dirty data over 60 % of its limit)",
            Counter,
            &throttle_delays,
        )?;
        family(
            &mut enc,
            "tank_write_throttle_waits",
            "times a writer slept at the dirty-data limit until a sync made room",
            Counter,
            &throttle_waits,
        )?;
        family(
            &mut enc,
            "tank_zil_commits",
            "intent-log commits (synchronous writes made durable in the log)",
            Counter,
            &zcommits,
        )?;
        family(
            &mut enc,
            "tank_zil_fallbacks",
            "synchronous writes that waited for a txg instead of the log",
            Counter,
            &zfallbacks,
        )?;
        family(
            &mut enc,
            "tank_zil_commit_latency_seconds",
            "time of each intent-log commit, first write to flush",
            Histogram,
            &zlat,
        )?;
        family(
            &mut enc,
            "tank_scan_active",
            "1 while a scrub or resilver is in progress",
            Gauge,
            &scan_active,
        )?;
        family(
            &mut enc,
            "tank_scan_issued_bytes",
            "bytes the scan has verified or rebuilt",
            Gauge,
            &scan_done,
        )?;
        family(
            &mut enc,
            "tank_scan_to_examine_bytes",
            "bytes the scan covers",
            Gauge,
            &scan_total,
        )?;
        family(
            &mut enc,
            "tank_scan_rate_bytes_per_second",
            "the scan's rate while it runs",
            Gauge,
            &scan_rate,
        )?;
        family(
            &mut enc,
            "tank_scan_errors",
            "blocks the scan could not read or rebuild",
            Gauge,
            &scan_errors,
        )?;
        // Replication tasks: state, last success, lag, bytes, failures.
        let mut rfam: HashMap<&str, Vec<(Labels, Value)>> = HashMap::new();
        for r in self.svc.replications().unwrap_or_default() {
            let lab = l(&[
                ("task", &r.spec.name),
                ("source", &r.spec.source),
                ("target", &r.spec.target),
            ]);
            let mut put = |k: &'static str, v: Value| {
                rfam.entry(k).or_default().push((lab.clone(), v));
            };
            put("running", V::Gauge(f64::from(u8::from(r.job.is_some()))));
            put(
                "failing",
                V::Gauge(f64::from(u8::from(r.state.consecutive_failures > 0))),
            );
            if let Some(t) = r.state.last_success {
                put("last_success", V::Gauge(t as f64));
            }
            if let Some(lag) = r.lag_secs {
                put("lag", V::Gauge(lag as f64));
            }
            put("pending", V::Gauge(r.pending as f64));
            put("bytes", V::Counter(r.state.bytes_total));
            put("runs", V::Counter(r.state.runs));
            put("failures", V::Counter(r.state.failures));
        }
        for (k, name, help, ty) in [
            (
                "running",
                "tank_replication_running",
                "1 while the task runs",
                Gauge,
            ),
            (
                "failing",
                "tank_replication_failing",
                "1 when the task's last run failed (an alert)",
                Gauge,
            ),
            (
                "last_success",
                "tank_replication_last_success_timestamp_seconds",
                "when the task last succeeded",
                Gauge,
            ),
            (
                "lag",
                "tank_replication_lag_seconds",
                "age of the newest snapshot on the target",
                Gauge,
            ),
            (
                "pending",
                "tank_replication_pending_snapshots",
                "snapshots of the source the target lacks",
                Gauge,
            ),
            (
                "bytes",
                "tank_replication_sent_bytes",
                "stream bytes the task has sent",
                Counter,
            ),
            ("runs", "tank_replication_runs", "runs of the task", Counter),
            (
                "failures",
                "tank_replication_failures",
                "runs of the task that failed",
                Counter,
            ),
        ] {
            family(&mut enc, name, help, ty, rfam.get(k).map_or(&[][..], |v| v))?;
        }
        let mut reqs = Vec::new();
        let mut errs = Vec::new();
        let mut lat = Vec::new();
        for (k, s) in self.svc.protocols.all() {
            let lab = l(&[("protocol", &k.0), ("op", &k.1)]);
            reqs.push((lab.clone(), V::Counter(s.count.load(Ordering::Relaxed))));
            errs.push((lab.clone(), V::Counter(s.errors.load(Ordering::Relaxed))));
            let (b, sum) = s.latency.snapshot();
            lat.push((lab, V::Histogram(b, sum)));
        }
        family(
            &mut enc,
            "tank_protocol_requests",
            "requests served",
            Counter,
            &reqs,
        )?;
        family(
            &mut enc,
            "tank_protocol_errors",
            "requests answered with an error",
            Counter,
            &errs,
        )?;
        family(
            &mut enc,
            "tank_protocol_latency_seconds",
            "time to answer a request",
            Histogram,
            &lat,
        )?;
        Ok(())
    }
}

/// The registry of a service's metrics.
pub fn registry(svc: Arc<Service>) -> Registry {
    let mut r = Registry::default();
    r.register_collector(Box::new(Collect { svc }));
    r
}

/// The metrics now, in the OpenMetrics text format.
pub fn render(registry: &Registry) -> String {
    let mut buf = String::new();
    // Writing to a String does not fail.
    let _ = prometheus_client::encoding::text::encode(&mut buf, registry);
    buf
}
