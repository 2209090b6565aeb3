//! A small history of each pool's I/O, for charts that start with the past and not empty.
//!
//! # Theory of operation
//! The daemon calls `Service::sample_io` once a second. Each call reads every open pool's
//! leaf counters (the same ones `pool iostat` and the metrics read) and records the
//! difference from the previous call as one sample of rates per second. The last hour is
//! kept at one sample a second; every full minute is also folded into one averaged
//! sample, and the last week of those is kept. At 40 bytes a sample that is under 600 KiB
//! a pool in memory. A pool's history ends when it is exported. A gap (the daemon was
//! busy, the clock jumped) is averaged over the time that really passed, so a rate is
//! never inflated.
//!
//! The history outlives the daemon: it is written to `DATA_DIR/io-history.json` every ten
//! minutes and when the daemon stops (a new file renamed over the old, so a crash leaves
//! one or the other), and read back when the daemon next samples. The minute being
//! gathered is lost, and the time the daemon was down is a gap in the charts, not zeros:
//! the first sample after a start only sets the counters' base.

use std::collections::{HashMap, VecDeque};
use std::path::Path;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Samples at one a second: an hour.
pub const SECONDS_KEPT: usize = 3600;
/// Samples at one a minute: a week.
pub const MINUTES_KEPT: usize = 7 * 24 * 60;

/// A pool's I/O totals since it was opened: read ops, write ops, read bytes, write bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoTotals {
    pub read_ops: u64,
    pub write_ops: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
}

impl IoTotals {
    /// The totals of every leaf device of a pool.
    pub fn of(o: &crate::pools::Opened) -> IoTotals {
        o.pool
            .leaf_list()
            .iter()
            .map(|(_, l)| l.stats.snapshot())
            .fold(IoTotals::default(), |a, s| IoTotals {
                read_ops: a.read_ops + s.read_ops,
                write_ops: a.write_ops + s.write_ops,
                read_bytes: a.read_bytes + s.read_bytes,
                write_bytes: a.write_bytes + s.write_bytes,
            })
    }

    /// What happened between `before` and `self` (counters only grow; a reset counts 0).
    pub fn since(&self, before: &IoTotals) -> IoTotals {
        IoTotals {
            read_ops: self.read_ops.saturating_sub(before.read_ops),
            write_ops: self.write_ops.saturating_sub(before.write_ops),
            read_bytes: self.read_bytes.saturating_sub(before.read_bytes),
            write_bytes: self.write_bytes.saturating_sub(before.write_bytes),
        }
    }
}

/// Rates per second over one sample's interval, ending at `time` (seconds since 1970).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct IoSample {
    pub time: u64,
    pub read_ops: f64,
    pub write_ops: f64,
    pub read_bytes: f64,
    pub write_bytes: f64,
}

impl IoSample {
    fn add(&mut self, o: &IoSample) {
        self.read_ops += o.read_ops;
        self.write_ops += o.write_ops;
        self.read_bytes += o.read_bytes;
        self.write_bytes += o.write_bytes;
    }
    fn scaled(mut self, k: f64) -> IoSample {
        self.read_ops *= k;
        self.write_ops *= k;
        self.read_bytes *= k;
        self.write_bytes *= k;
        self
    }
}

/// One pool's history, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct IoHistory {
    pub pool: String,
    /// One a second, the last hour.
    pub seconds: Vec<IoSample>,
    /// One a minute (each the minute's average), the last week.
    pub minutes: Vec<IoSample>,
}

#[derive(Default)]
struct Track {
    /// The last totals read and when (seconds since 1970, as f64).
    last: Option<(f64, IoTotals)>,
    seconds: VecDeque<IoSample>,
    /// The minute being gathered: its start (whole minutes since 1970), sum, samples.
    minute: Option<(u64, IoSample, u32)>,
    minutes: VecDeque<IoSample>,
}

/// Every pool's history.
#[derive(Default)]
pub struct IoRecorder {
    pools: Mutex<HashMap<String, Track>>,
}

/// The history as kept on disk.
#[derive(Serialize, Deserialize)]
struct Saved {
    version: u32,
    pools: Vec<IoHistory>,
}

/// The version of `io-history.json` this code writes and reads.
const SAVED_VERSION: u32 = 1;

impl IoRecorder {
    /// Writes every pool's history to `path` (a new file renamed over the old one).
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let saved = Saved {
            version: SAVED_VERSION,
            pools: self.history(None),
        };
        let tmp = path.with_extension("json.new");
        std::fs::write(&tmp, serde_json::to_vec(&saved)?)?;
        std::fs::rename(&tmp, path)
    }

    /// Reads back the history `save` wrote, for the pools that have none yet; returns how
    /// many pools it restored. No file is no history; a file of another version or a
    /// damaged one is an error (and nothing is restored).
    pub fn load(&self, path: &Path) -> std::io::Result<usize> {
        let raw = match std::fs::read(path) {
            Ok(r) => r,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e),
        };
        let saved: Saved = serde_json::from_slice(&raw)?;
        if saved.version != SAVED_VERSION {
            return Err(std::io::Error::other(format!(
                "version {} (this daemon reads {SAVED_VERSION})",
                saved.version
            )));
        }
        let mut pools = self.pools.lock();
        let mut restored = 0;
        for h in saved.pools {
            let keep = |v: Vec<IoSample>, n: usize| -> VecDeque<IoSample> {
                v.into_iter().rev().take(n).rev().collect()
            };
            pools.entry(h.pool).or_insert_with(|| {
                restored += 1;
                Track {
                    last: None,
                    seconds: keep(h.seconds, SECONDS_KEPT),
                    minute: None,
                    minutes: keep(h.minutes, MINUTES_KEPT),
                }
            });
        }
        Ok(restored)
    }

    /// Records `totals` of `pool` read at `now` (seconds since 1970).
    pub fn record(&self, pool: &str, now: f64, totals: IoTotals) {
        let mut pools = self.pools.lock();
        let t = pools.entry(pool.to_string()).or_default();
        let Some((then, before)) = t.last.replace((now, totals)) else {
            return;
        };
        let dt = now - then;
        if dt <= 0.0 {
            return;
        }
        let d = totals.since(&before);
        let s = IoSample {
            time: now as u64,
            read_ops: d.read_ops as f64 / dt,
            write_ops: d.write_ops as f64 / dt,
            read_bytes: d.read_bytes as f64 / dt,
            write_bytes: d.write_bytes as f64 / dt,
        };
        t.seconds.push_back(s);
        while t.seconds.len() > SECONDS_KEPT {
            t.seconds.pop_front();
        }
        let minute = s.time / 60;
        match &mut t.minute {
            Some((m, sum, n)) if *m == minute => {
                sum.add(&s);
                *n += 1;
            }
            other => {
                if let Some((m, sum, n)) = other.take() {
                    let mut avg = sum.scaled(1.0 / f64::from(n.max(1)));
                    avg.time = (m + 1) * 60;
                    t.minutes.push_back(avg);
                    while t.minutes.len() > MINUTES_KEPT {
                        t.minutes.pop_front();
                    }
                }
                *other = Some((minute, s, 1));
            }
        }
    }

    /// Ends the history of pools not in `open`.
    pub fn keep_only(&self, open: &[String]) {
        self.pools.lock().retain(|k, _| open.contains(k));
    }

    /// The history of `pool`, or of every pool, by name.
    pub fn history(&self, pool: Option<&str>) -> Vec<IoHistory> {
        let pools = self.pools.lock();
        let mut out: Vec<IoHistory> = pools
            .iter()
            .filter(|(k, _)| pool.is_none_or(|p| p == k.as_str()))
            .map(|(k, t)| IoHistory {
                pool: k.clone(),
                seconds: t.seconds.iter().copied().collect(),
                minutes: t.minutes.iter().copied().collect(),
            })
            .collect();
        out.sort_by(|a, b| a.pool.cmp(&b.pool));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(r: u64, w: u64) -> IoTotals {
        IoTotals {
            read_ops: r,
            write_ops: w,
            read_bytes: r * 4096,
            write_bytes: w * 131072,
        }
    }

    #[test]
    fn samples_are_rates_over_the_time_that_passed() {
        let h = IoRecorder::default();
        h.record("p", 600.0, totals(0, 0));
        h.record("p", 601.0, totals(100, 10));
        // Three seconds passed: the rate is over three, not one.
        h.record("p", 604.0, totals(400, 40));
        let v = h.history(Some("p"));
        assert_eq!(v.len(), 1);
        let s = &v[0].seconds;
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].time, 601);
        assert_eq!(s[0].read_ops, 100.0);
        assert_eq!(s[0].write_bytes, 10.0 * 131072.0);
        assert_eq!(s[1].read_ops, 100.0);
        assert!(h.history(Some("q")).is_empty());
    }

    #[test]
    fn minutes_average_their_seconds_and_history_is_bounded() {
        let h = IoRecorder::default();
        let mut r = 0;
        // Two hours at one sample a second, 10 reads a second in the first minute, 20 after.
        for s in 0..7200u64 {
            r += if s < 60 { 10 } else { 20 };
            h.record("p", s as f64 + 1.0, totals(r, 0));
        }
        let v = &h.history(None)[0];
        assert_eq!(v.seconds.len(), SECONDS_KEPT);
        assert_eq!(v.seconds.last().unwrap().time, 7200);
        assert_eq!(v.minutes.len(), 120);
        assert!(
            (v.minutes[0].read_ops - 10.0).abs() < 1e-9,
            "{:?}",
            v.minutes[0]
        );
        assert_eq!(v.minutes[0].time, 60);
        assert!((v.minutes[5].read_ops - 20.0).abs() < 1e-9);
        h.keep_only(&[]);
        assert!(h.history(None).is_empty());
    }

    #[test]
    fn the_history_is_saved_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("io-history.json");
        let h = IoRecorder::default();
        assert_eq!(h.load(&path).unwrap(), 0, "no file: no history");
        for s in 0..200u64 {
            h.record("p", s as f64 + 1.0, totals(s * 10, s));
        }
        h.save(&path).unwrap();
        let before = h.history(None);
        let again = IoRecorder::default();
        assert_eq!(again.load(&path).unwrap(), 1);
        assert_eq!(again.history(None), before);
        // After a restart the first reading only sets the base: no rate across the gap.
        again.record("p", 5000.0, totals(1 << 40, 0));
        assert_eq!(again.history(None), before);
        again.record("p", 5001.0, totals((1 << 40) + 7, 0));
        let after = &again.history(Some("p"))[0];
        assert_eq!(after.seconds.len(), before[0].seconds.len() + 1);
        assert_eq!(after.seconds.last().unwrap().read_ops, 7.0);
        // A damaged file is an error, and restores nothing.
        std::fs::write(&path, b"{\"version\": 1, \"pools\": [").unwrap();
        let third = IoRecorder::default();
        assert!(third.load(&path).is_err());
        assert!(third.history(None).is_empty());
    }
}
