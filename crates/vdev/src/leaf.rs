//! Leaf vdevs: one device each, with its own I/O queue, health state and error counters.
//!
//! # Theory of operation
//! A leaf owns a device (or none, when the device is missing), one writer thread that
//! executes its write queue in order, and a few reader threads (its read queue depth), so the
//! children of a mirror or RAID-Z vdev are read and written concurrently (the per-device
//! queues of DESIGN.md §5).
//! Offsets given to a leaf are relative to its data area, which starts after the front labels
//! and reserve (`FRONT_RESERVE`) and ends before the back labels.
//!
//! # States and counters
//! READ, WRITE and CKSUM counters are kept as `zpool status` shows them. A leaf whose write or
//! flush fails is FAULTED at once: its content can no longer be trusted to be current, so it is
//! read as missing until it is repaired (the conservative rule that keeps invariant 7 honest).
//! A device missing at import is UNAVAIL; one taken away at run time is REMOVED.
//! As ZFS's fault management does (zfs_vdev_io_n/_t, checksum_n/_t): 10 read errors within
//! 10 minutes FAULT a leaf, 10 checksum errors within 10 minutes make it DEGRADED (still
//! used, but the pool is no longer healthy) until `clear`.
//!
//! # Slow devices
//! A sick disk often answers, only in seconds (retrying a sector, a failing head), and drags
//! every stripe it is in down to its pace. A read or write that took longer than the slow
//! I/O threshold (ZFS's zio_slow_io_ms; 3 s here: a healthy disk under load takes tens of
//! milliseconds, flushes are not counted) is counted (`slow_ios`, the SLOW column of
//! `zpool status -s`) and reported as a `delay` event; `slow_io_n` of them within
//! `slow_io_t` (10 in 60 s, as ZFS's fault manager counts them) raise the leaf's verdict,
//! which the pool acts on: FAULTED when its vdev can spare it (the reads then come from
//! redundancy), DEGRADED otherwise. A FAULTED leaf's queued reads and writes fail at once
//! instead of waiting their turn at the sick device.
//!
//! # Missing txgs (ZFS's dirty time log)
//! A leaf that was offline, faulted or missing while txgs committed lacks their blocks. Its
//! `dtl` is that txg range: reads of blocks born in it treat the leaf as missing (no false
//! CKSUM errors, no stale bytes), and a resilver rewrites them. After the rebuild the leaf
//! stays `resilvering` until a verifying pass found everything in place.
//!
//! # Priority
//! Reads come in two classes: normal (the users' reads and the pool's own) and scan (scrub
//! and resilver). The reader threads always take a waiting normal read before a scan read,
//! so a scrub fills the device's idle time and yields as soon as users need it (ZFS's
//! scrub I/O class, reduced to the two classes that matter here).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

use crossbeam_channel::{Receiver, Sender};
use parking_lot::{Condvar, Mutex};
use tank_device::{DeviceError, DeviceRef, IoRef};

/// Size of one label.
pub const LABEL_SIZE: u64 = 256 << 10;
/// Bytes at the front of a leaf before its data area: labels L0 and L1 and a boot reserve.
pub const FRONT_RESERVE: u64 = 4 << 20;
/// Bytes at the end of a leaf after its data area: labels L2 and L3.
pub const BACK_RESERVE: u64 = 2 * LABEL_SIZE;
/// The smallest device tank accepts.
pub const MIN_DEVICE_SIZE: u64 = 64 << 20;

/// The device size labels are placed against: rounded down to a whole label.
pub fn aligned_size(size: u64) -> u64 {
    size / LABEL_SIZE * LABEL_SIZE
}

/// Offsets of the four labels on a device of `size` bytes.
pub fn label_offsets(size: u64) -> [u64; 4] {
    // A device too small for four labels (refused at create, and by every reader that looks
    // at the size first) gets offsets clamped to its start instead of a wrapped one.
    let s = aligned_size(size);
    [
        0,
        LABEL_SIZE,
        s.saturating_sub(2 * LABEL_SIZE),
        s.saturating_sub(LABEL_SIZE),
    ]
}

/// Bytes of data area on a device of `size` bytes.
pub fn usable_size(size: u64) -> u64 {
    aligned_size(size).saturating_sub(FRONT_RESERVE + BACK_RESERVE)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum VdevState {
    Online,
    Degraded,
    Faulted,
    Offline,
    Unavail,
    Removed,
    /// A hot spare standing in for a failed device (its own leaf takes no I/O then).
    Inuse,
}

impl VdevState {
    pub fn name(self) -> &'static str {
        match self {
            Self::Online => "ONLINE",
            Self::Degraded => "DEGRADED",
            Self::Faulted => "FAULTED",
            Self::Offline => "OFFLINE",
            Self::Unavail => "UNAVAIL",
            Self::Removed => "REMOVED",
            Self::Inuse => "INUSE",
        }
    }

    /// Whether I/O can be sent to a leaf in this state.
    pub fn usable(self) -> bool {
        matches!(self, Self::Online | Self::Degraded)
    }
}

/// Buckets of a latency histogram: bucket `k` counts operations that took less than
/// `2^k` microseconds (1 µs to about 17 s), the last one everything slower; as `zpool
/// iostat -w` shows them.
pub const LATENCY_BUCKETS: usize = 25;

/// Operation latencies in power-of-two buckets of microseconds, lock-free.
#[derive(Debug, Default)]
pub struct LatencyHistogram {
    buckets: [AtomicU64; LATENCY_BUCKETS],
    sum_us: AtomicU64,
}

impl LatencyHistogram {
    pub fn record(&self, took: std::time::Duration) {
        let us = took.as_micros().min(u128::from(u64::MAX)) as u64;
        // The first power of two above `us`: 0 µs → bucket 0 (< 1 µs), 1 µs → 1 (< 2 µs).
        let k = (u64::BITS - us.leading_zeros()) as usize;
        self.buckets[k.min(LATENCY_BUCKETS - 1)].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    /// (upper bound in seconds, operations in that bucket) for each bucket, and the sum
    /// of all latencies in seconds. The last bucket's bound is infinite.
    pub fn snapshot(&self) -> (Vec<(f64, u64)>, f64) {
        let b = self
            .buckets
            .iter()
            .enumerate()
            .map(|(k, n)| {
                let bound = if k == LATENCY_BUCKETS - 1 {
                    f64::INFINITY
                } else {
                    (1u64 << k) as f64 / 1e6
                };
                (bound, n.load(Ordering::Relaxed))
            })
            .collect();
        (b, self.sum_us.load(Ordering::Relaxed) as f64 / 1e6)
    }
}

/// Counters shown by `pool status` and `pool iostat`.
#[derive(Debug, Default)]
pub struct LeafStats {
    pub read_errors: AtomicU64,
    pub write_errors: AtomicU64,
    pub cksum_errors: AtomicU64,
    pub read_ops: AtomicU64,
    pub write_ops: AtomicU64,
    pub read_bytes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub repaired_bytes: AtomicU64,
    /// How long reads and writes took at the device (the queue's wait excluded).
    pub read_latency: LatencyHistogram,
    pub write_latency: LatencyHistogram,
    /// Reads and writes that took longer than the slow I/O threshold.
    pub slow_ios: AtomicU64,
}

#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub struct LeafStatsSnapshot {
    pub read_errors: u64,
    pub write_errors: u64,
    pub cksum_errors: u64,
    pub read_ops: u64,
    pub write_ops: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub repaired_bytes: u64,
    #[serde(default)]
    pub slow_ios: u64,
}

impl LeafStats {
    pub fn snapshot(&self) -> LeafStatsSnapshot {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        LeafStatsSnapshot {
            read_errors: g(&self.read_errors),
            write_errors: g(&self.write_errors),
            cksum_errors: g(&self.cksum_errors),
            read_ops: g(&self.read_ops),
            write_ops: g(&self.write_ops),
            read_bytes: g(&self.read_bytes),
            write_bytes: g(&self.write_bytes),
            repaired_bytes: g(&self.repaired_bytes),
            slow_ios: g(&self.slow_ios),
        }
    }

    pub fn clear_errors(&self) {
        self.read_errors.store(0, Ordering::Relaxed);
        self.write_errors.store(0, Ordering::Relaxed);
        self.cksum_errors.store(0, Ordering::Relaxed);
        self.slow_ios.store(0, Ordering::Relaxed);
    }
}

/// Completion tracking for a group of queued I/Os.
#[derive(Debug, Default)]
pub struct IoBatch {
    state: Mutex<BatchState>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct BatchState {
    outstanding: usize,
    errors: Vec<(Arc<Leaf>, DeviceError)>,
    /// The leaves a write of this batch was queued to (each once).
    written: Vec<Arc<Leaf>>,
}

impl IoBatch {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn start(&self) {
        self.state.lock().outstanding += 1;
    }

    fn start_write(&self, leaf: &Arc<Leaf>) {
        let mut st = self.state.lock();
        st.outstanding += 1;
        if !st.written.iter().any(|l| Arc::ptr_eq(l, leaf)) {
            st.written.push(leaf.clone());
        }
    }

    /// Queues a flush, into `flush`, of every leaf this batch wrote to that can still take
    /// I/O: what makes this batch's writes durable, and no more (a small block on RAID-Z
    /// touches only some of the children; the others have nothing of it to flush).
    pub fn flush_written(&self, flush: &Arc<IoBatch>) {
        let written = self.state.lock().written.clone();
        for leaf in written {
            if leaf.is_usable() {
                leaf.flush(flush);
            }
        }
    }

    fn finish(&self, leaf: &Arc<Leaf>, result: Result<(), DeviceError>) {
        let mut st = self.state.lock();
        st.outstanding -= 1;
        if let Err(e) = result {
            st.errors.push((leaf.clone(), e));
        }
        if st.outstanding == 0 {
            self.cv.notify_all();
        }
    }

    /// Waits for every queued I/O; returns the failures.
    pub fn wait(&self) -> Vec<(Arc<Leaf>, DeviceError)> {
        let mut st = self.state.lock();
        while st.outstanding > 0 {
            self.cv.wait(&mut st);
        }
        std::mem::take(&mut st.errors)
    }
}

enum Request {
    Write {
        offset: u64,
        data: IoRef,
        batch: Arc<IoBatch>,
    },
    /// Zeros over padding sectors of a block being written (`RaidzGeometry::padding`):
    /// optional, written only inside a run of joined writes, where they fill the gap
    /// between two real ones; nothing waits for them.
    Pad {
        offset: u64,
        len: u64,
    },
    Flush {
        batch: Arc<IoBatch>,
    },
}

struct LeafInner {
    dev: Option<DeviceRef>,
    state: VdevState,
    /// Why the leaf is not ONLINE, for `status`.
    reason: Option<String>,
    queue: Option<Sender<Request>>,
    reads: Option<Sender<ReadReq>>,
    scan_reads: Option<Sender<ReadReq>>,
    workers: Vec<thread::JoinHandle<()>>,
}

/// A leaf vdev. See the module documentation.
pub struct Leaf {
    /// Guid and path: they change when the device is replaced.
    ident: Mutex<(u64, String)>,
    inner: Mutex<LeafInner>,
    /// Where errors and state changes are posted (the pool's log, once it is built).
    events: std::sync::OnceLock<Arc<crate::events::EventLog>>,
    /// Txgs `[first, last]` whose blocks this leaf may lack (see the module documentation).
    dtl: Mutex<Option<(u64, u64)>>,
    /// Rebuilt by a resilver, not yet verified: not yet full redundancy.
    resilvering: std::sync::atomic::AtomicBool,
    /// Served by a hot spare: the device it stands in for (guid, path).
    spare_for: Mutex<Option<(u64, String)>>,
    /// When the recent read and checksum errors happened (see the module documentation).
    recent: Mutex<(
        std::collections::VecDeque<std::time::Instant>,
        std::collections::VecDeque<std::time::Instant>,
    )>,
    /// What counts as slow, and when the recent slow I/Os happened.
    slow: Mutex<(SlowIoPolicy, std::collections::VecDeque<std::time::Instant>)>,
    /// The policy's threshold in microseconds, read without the lock on every I/O.
    slow_threshold_us: AtomicU64,
    /// Too many slow I/Os: set here, taken by the pool, which decides what to do.
    slow_verdict: std::sync::atomic::AtomicBool,
    pub stats: LeafStats,
    /// Usable bytes of the data area as recorded in the pool config (the pool's smallest member).
    pub asize: u64,
}

impl std::fmt::Debug for Leaf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leaf")
            .field("guid", &self.guid())
            .field("path", &self.path())
            .field("state", &self.state())
            .finish()
    }
}

impl Leaf {
    /// A leaf with a device (ONLINE) or without one (UNAVAIL).
    pub fn new(guid: u64, path: String, asize: u64, dev: Option<DeviceRef>) -> Arc<Self> {
        let leaf = Arc::new(Self {
            ident: Mutex::new((guid, path)),
            inner: Mutex::new(LeafInner {
                dev: None,
                state: VdevState::Unavail,
                reason: Some("cannot open".into()),
                queue: None,
                reads: None,
                scan_reads: None,
                workers: Vec::new(),
            }),
            stats: LeafStats::default(),
            asize,
            events: std::sync::OnceLock::new(),
            dtl: Mutex::new(None),
            resilvering: std::sync::atomic::AtomicBool::new(false),
            recent: Mutex::new(Default::default()),
            slow: Mutex::new(Default::default()),
            slow_threshold_us: AtomicU64::new(micros(SlowIoPolicy::default().threshold)),
            slow_verdict: std::sync::atomic::AtomicBool::new(false),
            spare_for: Mutex::new(None),
        });
        if let Some(dev) = dev {
            leaf.attach(dev);
        }
        leaf
    }

    /// Gives the leaf a device and starts its I/O worker.
    pub fn attach(self: &Arc<Self>, dev: DeviceRef) {
        let (tx, rx) = crossbeam_channel::unbounded();
        let worker_dev = dev.clone();
        let weak = Arc::downgrade(self);
        let mut workers = vec![thread::Builder::new()
            .name(format!("vdev-{:x}-w", self.guid() & 0xffff))
            .spawn(move || worker(worker_dev, rx, weak))
            .expect("spawn vdev worker")];
        let (rtx, rrx) = crossbeam_channel::unbounded::<ReadReq>();
        let (stx, srx) = crossbeam_channel::unbounded::<ReadReq>();
        for i in 0..dev.queue_depth().clamp(1, READ_QUEUE_DEPTH) {
            let (dev, rrx, srx, weak) =
                (dev.clone(), rrx.clone(), srx.clone(), Arc::downgrade(self));
            workers.push(
                thread::Builder::new()
                    .name(format!("vdev-{:x}-r{i}", self.guid() & 0xffff))
                    .spawn(move || loop {
                        // Normal reads first; a scan read only when none waits.
                        let req = match rrx.try_recv() {
                            Ok(req) => req,
                            Err(_) => crossbeam_channel::select_biased! {
                                recv(rrx) -> r => match r { Ok(req) => req, Err(_) => return },
                                recv(srx) -> r => match r { Ok(req) => req, Err(_) => return },
                            },
                        };
                        let Some(leaf) = weak.upgrade() else { return };
                        do_read(&dev, &leaf, req);
                    })
                    .expect("spawn vdev reader"),
            );
        }
        let mut inner = self.inner.lock();
        inner.dev = Some(dev);
        inner.queue = Some(tx);
        inner.reads = Some(rtx);
        inner.scan_reads = Some(stx);
        inner.workers = workers;
        inner.state = VdevState::Online;
        inner.reason = None;
    }

    pub fn guid(&self) -> u64 {
        self.ident.lock().0
    }

    /// The device's path, as the pool's configuration names it.
    pub fn path(&self) -> String {
        self.ident.lock().1.clone()
    }

    /// Puts a new device in this leaf's place (`replace`): the old one is closed, the new
    /// one lacks every txg until a resilver rebuilt it.
    /// Returns the device it had, if any.
    pub fn replace_device(
        self: &Arc<Self>,
        guid: u64,
        path: String,
        dev: DeviceRef,
        txg: u64,
    ) -> Option<DeviceRef> {
        let old = self.take_device();
        *self.ident.lock() = (guid, path);
        self.stats.clear_errors();
        self.attach(dev);
        *self.dtl.lock() = None;
        self.set_dtl(Some((1, txg)));
        old
    }

    pub fn device(&self) -> Option<DeviceRef> {
        self.inner.lock().dev.clone()
    }

    pub fn state(&self) -> VdevState {
        self.inner.lock().state
    }

    pub fn reason(&self) -> Option<String> {
        self.inner.lock().reason.clone()
    }

    pub fn is_usable(&self) -> bool {
        self.state().usable()
    }

    /// The txgs this leaf may lack, if any.
    pub fn dtl(&self) -> Option<(u64, u64)> {
        *self.dtl.lock()
    }

    /// Records that the leaf may lack the blocks of txgs `[first, last]` (merged with what
    /// it lacked already); `None` clears it.
    pub fn set_dtl(&self, range: Option<(u64, u64)>) {
        let mut dtl = self.dtl.lock();
        *dtl = match (*dtl, range) {
            (Some((a, b)), Some((c, d))) => Some((a.min(c), b.max(d))),
            (_, r) => r,
        };
        if dtl.is_some() {
            self.resilvering.store(true, Ordering::Release);
        }
    }

    /// Whether the leaf may lack a block born in `birth`. On every read: a leaf with a
    /// dirty time log is always resilvering, so healthy leaves answer without a lock.
    pub fn is_stale(&self, birth: u64) -> bool {
        self.is_resilvering()
            && self
                .dtl
                .lock()
                .is_some_and(|(first, last)| birth >= first && birth <= last)
    }

    /// Whether the leaf lacks redundancy it should have: missing txgs, or rebuilt and not
    /// yet verified.
    pub fn is_resilvering(&self) -> bool {
        self.resilvering.load(Ordering::Acquire)
    }

    /// The rebuild is done: the leaf no longer lacks txgs, but stays resilvering until a
    /// verifying pass found its blocks in place.
    pub fn rebuilt(&self) {
        *self.dtl.lock() = None;
        self.resilvering.store(true, Ordering::Release);
    }

    /// Marks the rebuild verified (or abandoned): the leaf is whole again.
    pub fn set_resilvered(&self) {
        *self.dtl.lock() = None;
        self.resilvering.store(false, Ordering::Release);
    }

    /// Whether a block born in `birth` can be read from this leaf.
    pub fn readable_for(&self, birth: u64) -> bool {
        self.is_usable() && !self.is_stale(birth)
    }

    /// Sets the log errors and state changes are posted to (once).
    pub fn set_events(&self, log: Arc<crate::events::EventLog>) {
        let _ = self.events.set(log);
    }

    fn post(&self, class: &str, detail: String) {
        if let Some(log) = self.events.get() {
            log.post(class, Some(&self.path()), detail);
        }
    }

    /// Changes the state (and why). Leaves that are not usable get no I/O.
    pub fn set_state(&self, state: VdevState, reason: Option<String>) {
        let old = {
            let mut inner = self.inner.lock();
            let old = inner.state;
            inner.state = state;
            inner.reason = reason.clone();
            old
        };
        if old != state {
            self.post(
                "resource.fs.zfs.statechange",
                format!(
                    "from={} to={}{}",
                    old.name(),
                    state.name(),
                    reason
                        .map(|r| format!(" reason=\"{r}\""))
                        .unwrap_or_default()
                ),
            );
        }
    }

    /// Marks the leaf FAULTED after a failed write or flush.
    fn fault(&self, why: String) {
        let changed = {
            let mut inner = self.inner.lock();
            let usable = inner.state.usable();
            if usable {
                inner.state = VdevState::Faulted;
                inner.reason = Some(why.clone());
            }
            usable
        };
        if changed {
            self.post(
                "resource.fs.zfs.statechange",
                format!("to=FAULTED reason=\"{why}\""),
            );
        }
    }

    fn queue(&self) -> Option<Sender<Request>> {
        let inner = self.inner.lock();
        if inner.state.usable() {
            inner.queue.clone()
        } else {
            None
        }
    }

    fn read_queue(&self, class: IoClass) -> Option<Sender<ReadReq>> {
        let inner = self.inner.lock();
        if !inner.state.usable() {
            return None;
        }
        match class {
            IoClass::Normal => inner.reads.clone(),
            IoClass::Scan => inner.scan_reads.clone(),
        }
    }

    /// Queues a write of `data` at data-area offset `offset`. A leaf that cannot take I/O
    /// reports an error into the batch at once.
    pub fn write(self: &Arc<Self>, offset: u64, data: IoRef, batch: &Arc<IoBatch>) {
        batch.start_write(self);
        match self.queue() {
            Some(q) => {
                let req = Request::Write {
                    offset: offset + FRONT_RESERVE,
                    data,
                    batch: batch.clone(),
                };
                if q.send(req).is_err() {
                    batch.finish(self, Err(self.unavailable()));
                }
            }
            None => batch.finish(self, Err(self.unavailable())),
        }
    }

    /// Queues optional zeros over `len` bytes of padding at data-area offset `offset` (see
    /// `Request::Pad`); a leaf that cannot take I/O drops them.
    pub fn pad(self: &Arc<Self>, offset: u64, len: u64) {
        if len > ZEROS.0.len() as u64 {
            return;
        }
        if let Some(q) = self.queue() {
            let _ = q.send(Request::Pad {
                offset: offset + FRONT_RESERVE,
                len,
            });
        }
    }

    pub fn flush(self: &Arc<Self>, batch: &Arc<IoBatch>) {
        batch.start();
        match self.queue() {
            Some(q) => {
                if q.send(Request::Flush {
                    batch: batch.clone(),
                })
                .is_err()
                {
                    batch.finish(self, Err(self.unavailable()));
                }
            }
            None => batch.finish(self, Err(self.unavailable())),
        }
    }

    /// Queues a read; the result arrives on the returned channel.
    pub fn read_async(
        self: &Arc<Self>,
        offset: u64,
        len: usize,
    ) -> Receiver<Result<Vec<u8>, DeviceError>> {
        self.read_async_class(offset, len, IoClass::Normal)
    }

    /// Queues a read in a priority class (see the module documentation).
    pub fn read_async_class(
        self: &Arc<Self>,
        offset: u64,
        len: usize,
        class: IoClass,
    ) -> Receiver<Result<Vec<u8>, DeviceError>> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        match self.read_queue(class) {
            Some(q) => {
                if q.send((offset + FRONT_RESERVE, len, tx.clone())).is_err() {
                    let _ = tx.send(Err(self.unavailable()));
                }
            }
            None => {
                let _ = tx.send(Err(self.unavailable()));
            }
        }
        rx
    }

    pub fn read(self: &Arc<Self>, offset: u64, len: usize) -> Result<Vec<u8>, DeviceError> {
        self.read_async(offset, len)
            .recv()
            .unwrap_or_else(|_| Err(self.unavailable()))
    }

    fn unavailable(&self) -> DeviceError {
        DeviceError::Invalid {
            dev: self.path(),
            what: format!("device is {}", self.state().name()),
        }
    }

    /// Counts a CKSUM error: the device returned wrong bytes for `[offset, +len)`.
    pub fn count_cksum_error(&self, offset: u64, len: u64) {
        self.stats.cksum_errors.fetch_add(1, Ordering::Relaxed);
        self.post(
            "ereport.fs.zfs.checksum",
            format!("offset={offset:#x} size={len:#x}"),
        );
        if self.too_many(false) && self.state() == VdevState::Online {
            self.set_state(
                VdevState::Degraded,
                Some(format!(
                    "too many checksum errors ({ERRORS_N} in {} s); 'clear' when dealt with",
                    ERRORS_T.as_secs()
                )),
            );
        }
    }

    /// Sets what counts as a slow I/O and how many make a verdict.
    pub fn set_slow_io_policy(&self, policy: SlowIoPolicy) {
        let mut slow = self.slow.lock();
        slow.0 = policy;
        slow.1.clear();
        self.slow_threshold_us
            .store(micros(policy.threshold), Ordering::Relaxed);
    }

    pub fn slow_io_policy(&self) -> SlowIoPolicy {
        self.slow.lock().0
    }

    /// Notes how long a read or write of `len` bytes at `offset` took at the device.
    fn note_latency(&self, op: &str, offset: u64, len: usize, took: std::time::Duration) {
        if micros(took) < self.slow_threshold_us.load(Ordering::Relaxed) {
            return;
        }
        let verdict = {
            let mut slow = self.slow.lock();
            let policy = slow.0;
            if took < policy.threshold {
                return;
            }
            let now = std::time::Instant::now();
            slow.1.push_back(now);
            while slow
                .1
                .front()
                .is_some_and(|t| now.duration_since(*t) > policy.window)
            {
                slow.1.pop_front();
            }
            slow.1.len() >= policy.count
        };
        self.stats.slow_ios.fetch_add(1, Ordering::Relaxed);
        self.post(
            "ereport.fs.zfs.delay",
            format!(
                "op={op} offset={offset:#x} size={len:#x} delay_ms={}",
                took.as_millis()
            ),
        );
        if verdict && self.state().usable() {
            self.slow_verdict.store(true, Ordering::Release);
        }
    }

    /// Whether the leaf had too many slow I/Os since the last call (the pool then faults
    /// it, or marks it DEGRADED when its vdev cannot spare it: [`Leaf::judge_slow`]).
    pub fn take_slow_verdict(&self) -> bool {
        self.slow_verdict.swap(false, Ordering::AcqRel)
    }

    /// Acts on a slow verdict: FAULTED when `can_spare` (the vdev reads all its blocks
    /// without this leaf), else DEGRADED. Returns the new state.
    pub fn judge_slow(&self, can_spare: bool) -> VdevState {
        let policy = self.slow_io_policy();
        let what = format!(
            "too many slow I/Os ({} over {} ms in {} s)",
            policy.count,
            policy.threshold.as_millis(),
            policy.window.as_secs()
        );
        if can_spare {
            self.fault(format!("{what}; served from redundancy until 'clear'"));
            VdevState::Faulted
        } else {
            if self.state() == VdevState::Online {
                self.set_state(
                    VdevState::Degraded,
                    Some(format!(
                        "{what}; still used: its vdev has no redundancy to spare"
                    )),
                );
            }
            self.state()
        }
    }

    /// Notes an error of a kind (`io` or checksum) now; true when there were `ERRORS_N`
    /// within `ERRORS_T`.
    fn too_many(&self, io: bool) -> bool {
        let now = std::time::Instant::now();
        let mut recent = self.recent.lock();
        let q = if io { &mut recent.0 } else { &mut recent.1 };
        q.push_back(now);
        while q.front().is_some_and(|t| now.duration_since(*t) > ERRORS_T) {
            q.pop_front();
        }
        q.len() >= ERRORS_N
    }

    /// Clears the error counters and the errors' memory; a leaf DEGRADED by errors is
    /// ONLINE again.
    pub fn clear_errors(&self) {
        self.stats.clear_errors();
        *self.recent.lock() = Default::default();
        self.slow.lock().1.clear();
        self.slow_verdict.store(false, Ordering::Release);
        if self.state() == VdevState::Degraded {
            self.set_state(VdevState::Online, None);
        }
    }

    /// Stops the worker and releases the device (and its lock) before returning; the leaf
    /// keeps its identity and counters.
    pub fn close(&self) {
        self.take_device();
    }

    /// Stops the worker and hands the device over (a hot spare lent to another leaf, or
    /// given back); the leaf keeps its identity and counters.
    pub fn take_device(&self) -> Option<DeviceRef> {
        let (dev, handles) = {
            let mut inner = self.inner.lock();
            inner.queue = None;
            inner.reads = None;
            inner.scan_reads = None;
            (inner.dev.take(), std::mem::take(&mut inner.workers))
        };
        for h in handles {
            if h.thread().id() != thread::current().id() {
                let _ = h.join();
            }
        }
        dev
    }

    /// For a leaf served by a hot spare: the guid and path of the device it stands in for.
    pub fn spare_for(&self) -> Option<(u64, String)> {
        self.spare_for.lock().clone()
    }

    pub fn set_spare_for(&self, orig: Option<(u64, String)>) {
        *self.spare_for.lock() = orig;
    }
}

/// The priority class of a read (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoClass {
    Normal,
    Scan,
}

/// Errors within `ERRORS_T` that fault (I/O) or degrade (checksum) a leaf.
const ERRORS_N: usize = 10;
const ERRORS_T: std::time::Duration = std::time::Duration::from_secs(600);

fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// What makes a device slow (see "Slow devices" in the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlowIoPolicy {
    /// A read or write that took at least this long is slow (ZFS: zio_slow_io_ms).
    pub threshold: std::time::Duration,
    /// This many slow I/Os within `window` make a verdict (ZFS: slow_io_n, slow_io_t).
    pub count: usize,
    pub window: std::time::Duration,
}

impl Default for SlowIoPolicy {
    fn default() -> Self {
        Self {
            threshold: std::time::Duration::from_secs(3),
            count: 10,
            window: std::time::Duration::from_secs(60),
        }
    }
}

/// Most reader threads per leaf: the reads a device has in flight at once (fewer when the
/// device says it serves fewer, as a single-actuator disk does).
const READ_QUEUE_DEPTH: usize = 4;

type ReadReq = (u64, usize, Sender<Result<Vec<u8>, DeviceError>>);

fn do_read(dev: &DeviceRef, leaf: &Leaf, (offset, len, reply): ReadReq) {
    if leaf.state() == VdevState::Faulted {
        // Queued before the leaf was faulted: fail now (the read is served from redundancy)
        // rather than wait for a device known to be sick.
        let _ = reply.send(Err(leaf.unavailable()));
        return;
    }
    let started = std::time::Instant::now();
    let r = dev.read_vec(len, offset);
    let took = started.elapsed();
    leaf.stats.read_latency.record(took);
    leaf.note_latency("read", offset, len, took);
    leaf.stats.read_ops.fetch_add(1, Ordering::Relaxed);
    let r = match r {
        Ok(buf) => {
            leaf.stats
                .read_bytes
                .fetch_add(len as u64, Ordering::Relaxed);
            Ok(buf)
        }
        Err(e) => {
            leaf.stats.read_errors.fetch_add(1, Ordering::Relaxed);
            leaf.post(
                "ereport.fs.zfs.io",
                format!("op=read offset={:#x} size={len:#x} error=\"{e}\"", offset),
            );
            if leaf.too_many(true) {
                leaf.fault(format!(
                    "too many read errors ({ERRORS_N} in {} s)",
                    ERRORS_T.as_secs()
                ));
            }
            Err(e)
        }
    };
    let _ = reply.send(r);
}

/// Writes the writer thread considers at once for reordering (ZFS's vdev queue sorts and
/// aggregates the same way).
const ELEVATOR_WINDOW: usize = 128;

/// Executes a leaf's write queue: one request at a time, a flush never overtaken by a later
/// write nor run before an earlier one finished; writes adjacent on the device are joined
/// into one of up to `AGGREGATE_MAX` bytes. Between two flushes the writes waiting in
/// the queue are served in offset order from where the last one ended (C-LOOK, as a disk's
/// own queue or ZFS's vdev queue would), unless two of them overlap, when they keep their
/// order: nothing may rely on the order of unflushed writes, which real disks reorder too,
/// and on a disk with one actuator sorted writes save a seek between a block and its copy a
/// quarter of the device away. Reads have their own queue and `READ_QUEUE_DEPTH` threads, so
/// a device sees several reads in flight; a read never targets a block whose write is still
/// queued (the object layer keeps new blocks in memory until their writes completed, see
/// `ObjectSet::writes_completed`).
fn worker(dev: DeviceRef, rx: Receiver<Request>, leaf: std::sync::Weak<Leaf>) {
    let mut pending: std::collections::VecDeque<Request> = std::collections::VecDeque::new();
    let mut head = 0u64;
    loop {
        if pending.is_empty() {
            match rx.recv() {
                Ok(req) => pending.push_back(req),
                Err(_) => return,
            }
        }
        while pending.len() < ELEVATOR_WINDOW {
            match rx.try_recv() {
                Ok(req) => pending.push_back(req),
                Err(_) => break,
            }
        }
        let Some(leaf) = leaf.upgrade() else { return };
        if leaf.state() == VdevState::Faulted {
            // Faulted (a failed write, or a sick device): what is queued fails at once, as
            // a request made now would; the leaf lacks those txgs until it is cleared.
            for req in pending.drain(..) {
                match req {
                    Request::Write { batch, .. } | Request::Flush { batch } => {
                        batch.finish(&leaf, Err(leaf.unavailable()))
                    }
                    Request::Pad { .. } => {}
                }
            }
            continue;
        }
        let writes = pending
            .iter()
            .position(|r| matches!(r, Request::Flush { .. }))
            .unwrap_or(pending.len());
        if writes == 0 {
            if let Some(Request::Flush { batch }) = pending.pop_front() {
                let r = dev.flush();
                if let Err(e) = &r {
                    leaf.stats.write_errors.fetch_add(1, Ordering::Relaxed);
                    leaf.post("ereport.fs.zfs.io", format!("op=flush error=\"{e}\""));
                    leaf.fault(format!("flush failed: {e}"));
                }
                batch.finish(&leaf, r);
            }
            continue;
        }
        let mut segment: Vec<Option<Request>> = pending.drain(..writes).map(Some).collect();
        let ranges: Vec<(u64, u64)> = segment
            .iter()
            .map(|r| match r {
                Some(Request::Write { offset, data, .. }) => (*offset, data.len() as u64),
                Some(Request::Pad { offset, len }) => (*offset, *len),
                _ => unreachable!("a segment holds writes only"),
            })
            .collect();
        // In elevator order, runs of writes that follow each other on the device go down
        // as one write of up to AGGREGATE_MAX bytes (ZFS's vdev queue aggregation): a
        // txg's small blocks become a few large writes per disk.
        let order = elevator_order(&ranges, head);
        let join = dev.joins_writes();
        let mut k = 0;
        while k < order.len() {
            if leaf.state() == VdevState::Faulted {
                // Faulted while this segment was being written: the rest fails at once.
                for &i in &order[k..] {
                    if let Some(Request::Write { batch, .. }) = segment[i].take() {
                        batch.finish(&leaf, Err(leaf.unavailable()));
                    }
                }
                break;
            }
            let mut end = k + 1;
            let mut total = ranges[order[k]].1;
            while end < order.len() {
                let (prev_off, prev_len) = ranges[order[end - 1]];
                let (off, len) = ranges[order[end]];
                if !join || off != prev_off + prev_len || total + len > AGGREGATE_MAX {
                    break;
                }
                total += len;
                end += 1;
            }
            // Each piece: (offset, bytes, the batch waiting for it; None for padding).
            let mut run: Vec<(u64, Piece, Option<Arc<IoBatch>>)> = order[k..end]
                .iter()
                .map(|&i| match segment[i].take() {
                    Some(Request::Write {
                        offset,
                        data,
                        batch,
                    }) => (offset, Piece::Data(data), Some(batch)),
                    Some(Request::Pad { offset, len }) => (offset, Piece::Zeros(len), None),
                    _ => unreachable!("each write is served once"),
                })
                .collect();
            k = end;
            // Padding is written only between two real writes of the run: at either end
            // it would join nothing.
            while run.last().is_some_and(|(_, _, b)| b.is_none()) {
                run.pop();
            }
            let lead = run.iter().take_while(|(_, _, b)| b.is_none()).count();
            run.drain(..lead);
            let Some(&(offset, _, _)) = run.first() else {
                continue;
            };
            if run.len() > 1 {
                let total: u64 = run.iter().map(|(_, p, _)| p.len() as u64).sum();
                // Handed down as a list of buffers (pwritev), not copied together.
                let bufs: Vec<&[u8]> = run.iter().map(|(_, p, _)| p.bytes()).collect();
                let started = std::time::Instant::now();
                if dev.write_vectored_at(&bufs, offset).is_ok() {
                    let took = started.elapsed();
                    leaf.stats.write_latency.record(took);
                    leaf.note_latency("write", offset, total as usize, took);
                    leaf.stats.write_ops.fetch_add(1, Ordering::Relaxed);
                    leaf.stats.write_bytes.fetch_add(total, Ordering::Relaxed);
                    head = offset + total;
                    for batch in run.into_iter().filter_map(|(_, _, b)| b) {
                        batch.finish(&leaf, Ok(()));
                    }
                    continue;
                }
                // The joined write failed: each piece again on its own (padding not), so
                // that each request gets its own result and error report.
            }
            for (offset, data, batch) in run.into_iter().filter_map(|(o, p, b)| match p {
                Piece::Data(d) => b.map(|b| (o, d, b)),
                Piece::Zeros(_) => None,
            }) {
                let started = std::time::Instant::now();
                let r = dev.write_at(&data, offset);
                let took = started.elapsed();
                leaf.stats.write_latency.record(took);
                leaf.note_latency("write", offset, data.len(), took);
                head = offset + data.len() as u64;
                leaf.stats.write_ops.fetch_add(1, Ordering::Relaxed);
                match &r {
                    Ok(()) => {
                        leaf.stats
                            .write_bytes
                            .fetch_add(data.len() as u64, Ordering::Relaxed);
                    }
                    Err(e) => {
                        leaf.stats.write_errors.fetch_add(1, Ordering::Relaxed);
                        leaf.post(
                            "ereport.fs.zfs.io",
                            format!(
                                "op=write offset={offset:#x} size={:#x} error=\"{e}\"",
                                data.len()
                            ),
                        );
                        leaf.fault(format!("write failed: {e}"));
                    }
                }
                batch.finish(&leaf, r);
            }
        }
    }
}

/// Largest write the writer makes of adjacent queued writes (ZFS's
/// zfs_vdev_aggregation_limit).
const AGGREGATE_MAX: u64 = 1 << 20;

/// Zeros for padding writes: one sector of the largest ashift, aligned for O_DIRECT.
#[repr(align(4096))]
struct Zeros([u8; 1 << 16]);
static ZEROS: Zeros = Zeros([0; 1 << 16]);

/// One piece of a run of joined writes.
enum Piece {
    Data(IoRef),
    /// Zeros of this many bytes (padding; at most `ZEROS`).
    Zeros(u64),
}

impl Piece {
    fn bytes(&self) -> &[u8] {
        match self {
            Piece::Data(d) => d,
            Piece::Zeros(len) => &ZEROS.0[..*len as usize],
        }
    }

    fn len(&self) -> usize {
        self.bytes().len()
    }
}

/// The order in which to serve writes of `(offset, len)` with the head at `head`: ascending
/// offsets starting from the first at or after `head`, then wrapping to the lowest (C-LOOK);
/// the given order when any two overlap (their order decides the bytes left).
fn elevator_order(ranges: &[(u64, u64)], head: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..ranges.len()).collect();
    order.sort_by_key(|&i| ranges[i].0);
    if order
        .windows(2)
        .any(|w| ranges[w[0]].0 + ranges[w[0]].1 > ranges[w[1]].0)
    {
        return (0..ranges.len()).collect();
    }
    let first = order.partition_point(|&i| ranges[i].0 < head);
    order.rotate_left(first);
    order
}

#[cfg(test)]
mod latency_tests {
    use super::*;

    #[test]
    fn latencies_fall_in_power_of_two_buckets() {
        let h = LatencyHistogram::default();
        h.record(std::time::Duration::from_nanos(300));
        h.record(std::time::Duration::from_micros(1));
        h.record(std::time::Duration::from_micros(1500));
        h.record(std::time::Duration::from_secs(3600));
        let (b, sum) = h.snapshot();
        assert_eq!(b.len(), LATENCY_BUCKETS);
        assert_eq!(b[0].1, 1); // < 1 µs
        assert_eq!(b[1].1, 1); // < 2 µs
        assert_eq!(b[11].1, 1); // 1.5 ms < 2.048 ms
        assert_eq!(b[LATENCY_BUCKETS - 1], (f64::INFINITY, 1));
        assert!((sum - 3600.001501).abs() < 1e-6, "{sum}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tank_device::{BlockDevice, MemDevice};

    /// A device that records every write it is given (offset, length) and holds its first
    /// write until `open` is set, so that a test can queue everything else behind it.
    #[derive(Debug)]
    struct Recorder {
        inner: MemDevice,
        writes: Mutex<Vec<(u64, u64)>>,
        open: Mutex<bool>,
        opened: Condvar,
    }

    impl Recorder {
        fn hold_until_open(&self) {
            let mut open = self.open.lock();
            while !*open {
                self.opened.wait(&mut open);
            }
        }
    }

    impl BlockDevice for Recorder {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> tank_device::Result<()> {
            self.inner.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> tank_device::Result<()> {
            self.hold_until_open();
            self.writes.lock().push((offset, buf.len() as u64));
            self.inner.write_at(buf, offset)
        }
        fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> tank_device::Result<()> {
            self.hold_until_open();
            let len: u64 = bufs.iter().map(|b| b.len() as u64).sum();
            self.writes.lock().push((offset, len));
            let mut at = offset;
            for b in bufs {
                self.inner.write_at(b, at)?;
                at += b.len() as u64;
            }
            Ok(())
        }
        fn flush(&self) -> tank_device::Result<()> {
            Ok(())
        }
        fn size(&self) -> u64 {
            self.inner.size()
        }
        fn name(&self) -> &str {
            self.inner.name()
        }
    }

    #[test]
    fn padding_joins_writes_on_either_side_and_is_dropped_elsewhere() {
        const K: u64 = 4096;
        let dev = Arc::new(Recorder {
            inner: MemDevice::new("rec", 64 << 20),
            writes: Mutex::new(Vec::new()),
            open: Mutex::new(false),
            opened: Condvar::new(),
        });
        // Stale bytes where the padding goes: the joined write must put zeros there.
        dev.inner
            .write_at(&[0xee; 4096], FRONT_RESERVE + 7 * K)
            .unwrap();
        dev.inner
            .write_at(&[0xee; 4096], FRONT_RESERVE + 10 * K)
            .unwrap();
        dev.inner
            .write_at(&[0xee; 4096], FRONT_RESERVE + 100 * K)
            .unwrap();
        let leaf = Leaf::new(1, "rec".into(), 64 << 20, Some(dev.clone()));
        let batch = IoBatch::new();
        // Held by the device, so that the rest is queued before the writer looks again.
        leaf.write(40 * K, IoRef::copy_of(&[9; 4096]), &batch);
        std::thread::sleep(std::time::Duration::from_millis(50));
        // Two blocks with a padding sector between them, a padding sector after the
        // second (joins nothing), and a padding sector on its own far away.
        leaf.write(0, IoRef::copy_of(&[1; 28672]), &batch);
        leaf.pad(7 * K, K);
        leaf.write(8 * K, IoRef::copy_of(&[2; 8192]), &batch);
        leaf.pad(10 * K, K);
        leaf.pad(100 * K, K);
        *dev.open.lock() = true;
        dev.opened.notify_all();
        assert!(batch.wait().is_empty());
        let mut writes = dev.writes.lock().clone();
        writes.sort_unstable();
        assert_eq!(
            writes,
            vec![(FRONT_RESERVE, 10 * K), (FRONT_RESERVE + 40 * K, K)],
            "the two blocks and the padding between them as one write, nothing else"
        );
        let mut back = vec![0u8; 10 * K as usize];
        dev.inner.read_at(&mut back, FRONT_RESERVE).unwrap();
        assert!(back[..28672].iter().all(|&b| b == 1));
        assert!(
            back[28672..32768].iter().all(|&b| b == 0),
            "padding is zeros"
        );
        assert!(back[32768..].iter().all(|&b| b == 2));
        for at in [10 * K, 100 * K] {
            let mut left = vec![0u8; 4096];
            dev.inner.read_at(&mut left, FRONT_RESERVE + at).unwrap();
            assert!(
                left.iter().all(|&b| b == 0xee),
                "padding joining nothing is not written"
            );
        }
        assert_eq!(leaf.stats.write_bytes.load(Ordering::Relaxed), 11 * K);
        leaf.close();
    }

    #[test]
    fn writes_are_served_upwards_from_the_head_then_wrap() {
        let ranges = [(800, 8), (100, 8), (500, 8), (0, 8), (900, 100)];
        assert_eq!(elevator_order(&ranges, 400), vec![2, 0, 4, 3, 1]);
        assert_eq!(elevator_order(&ranges, 0), vec![3, 1, 2, 0, 4]);
        assert_eq!(elevator_order(&ranges, 5000), vec![3, 1, 2, 0, 4]);
        assert!(elevator_order(&[], 7).is_empty());
    }

    #[test]
    fn overlapping_writes_keep_their_order() {
        // The second write covers part of the first: the later bytes must win.
        let ranges = [(100, 50), (0, 120), (500, 8)];
        assert_eq!(elevator_order(&ranges, 0), vec![0, 1, 2]);
        // The same offset twice.
        assert_eq!(elevator_order(&[(8, 8), (8, 8)], 0), vec![0, 1]);
        // Touching ranges do not overlap.
        assert_eq!(elevator_order(&[(8, 8), (0, 8)], 0), vec![1, 0]);
    }
}
