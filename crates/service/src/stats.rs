//! Requests and their latency per protocol and operation, for every front end of a service
//! (the API, the FUSE mounts; the protocol servers as they come), read by the metrics.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use parking_lot::Mutex;
use tank_vdev::LatencyHistogram;

#[derive(Default)]
pub struct ProtocolStats {
    ops: Mutex<HashMap<(String, String), Arc<OpStats>>>,
}

/// One operation of one protocol.
#[derive(Default)]
pub struct OpStats {
    pub count: AtomicU64,
    pub errors: AtomicU64,
    pub latency: LatencyHistogram,
}

impl OpStats {
    /// Counts one request that took `took`.
    pub fn record(&self, took: std::time::Duration, failed: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        self.count.fetch_add(1, Relaxed);
        if failed {
            self.errors.fetch_add(1, Relaxed);
        }
        self.latency.record(took);
    }
}

impl ProtocolStats {
    /// The counters of `op` of `protocol` (made at first use). Front ends on a hot path
    /// keep the returned handle rather than look it up per request.
    pub fn op(&self, protocol: &str, op: &str) -> Arc<OpStats> {
        self.ops
            .lock()
            .entry((protocol.to_string(), op.to_string()))
            .or_default()
            .clone()
    }

    /// Every operation seen, sorted.
    pub fn all(&self) -> Vec<((String, String), Arc<OpStats>)> {
        let mut v: Vec<_> = self
            .ops
            .lock()
            .iter()
            .map(|(k, s)| (k.clone(), s.clone()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}
