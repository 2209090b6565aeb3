//! `EmulatedDevice`: any device slowed down to the pace of a modelled disk.
//!
//! # Theory of operation
//! A [`TimingModel`] says how long the emulated hardware would take to serve one operation
//! (`service_time(kind, offset, len)`); it may keep state (a head position, a write cache) and
//! is the seam where HDD and SSD profiles plug in. [`NullTiming`] costs nothing.
//!
//! `EmulatedDevice` forwards every call to the inner device while holding a per-device mutex,
//! as one disk serves one request at a time, and then sleeps until the modelled service time
//! has elapsed since the operation started (the inner device's own time counts towards it).
//! An operation issued right after the previous one ended starts at that one's due time, so
//! late wake-ups on a busy host do not add up over a stream. A model that is not serial
//! (flash) is consulted for operations side by side and shares the device out itself.
//! Failed operations take their modelled time too. The device keeps the inner device's name.
//!
//! Each device keeps a [`Timeline`] of what it did: operations and bytes by kind, the time it
//! was busy by the model (and how much of that was positioning: seeks and rotation), the
//! idle time between operations, and the time the inner device ran past the model's (the
//! host, not the model, setting the pace). A benchmark takes one before and after a phase and
//! shows per disk where the time went ([`Timeline::since`]).
//!
//! A *scratch* emulated device ([`EmulatedDevice::scratch`]) does not pass flushes on: the
//! files behind a benchmark's emulated build are thrown away after it, and a host flush
//! (writing back everything the page cache holds of them) would put the host disk's time into
//! what should be the model's alone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::{BlockDevice, DeviceRef, Result};

/// The kind of an operation, as seen by a [`TimingModel`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IoKind {
    Read,
    Write,
    Flush,
    Trim,
}

/// How long an emulated device takes to serve one operation.
pub trait TimingModel: Send + Sync + std::fmt::Debug {
    /// Service time of one operation. `offset` and `len` are 0 for flushes.
    fn service_time(&self, op: IoKind, offset: u64, len: u64) -> Duration;
    /// Requests the emulated device serves at once (it serializes them; one keeps a stream's
    /// requests in the order they were issued, as a disk's queue would sort them).
    fn queue_depth(&self) -> usize {
        1
    }
    /// Whether the device serves one operation at a time (a disk's single actuator). A
    /// model that returns false is called for operations in flight side by side and
    /// accounts for their sharing of the device itself (flash).
    fn serial(&self) -> bool {
        true
    }
    /// The part of an operation's service time that moves its bytes (the rest of it is
    /// positioning: seek and rotation). Zero for a model that does not tell them apart.
    fn transfer_time(&self, _op: IoKind, _len: u64) -> Duration {
        Duration::ZERO
    }
}

/// What an emulated device did, summed since it was made (see the module documentation).
/// Times are in nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timeline {
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Modelled service time of every operation: the device busy.
    pub busy_ns: u64,
    /// The part of reads' and writes' `busy_ns` spent positioning (seeks, rotation) rather
    /// than moving bytes.
    pub positioning_ns: u64,
    /// Operations that paid any positioning.
    pub repositions: u64,
    /// Time between one operation's modelled end and the next one's start: the device idle.
    pub idle_ns: u64,
    /// Idle stretches of a millisecond or more (a short one is a hand-off between requests).
    pub idle_gaps: u64,
    /// Time the inner device took beyond the modelled service time.
    pub overrun_ns: u64,
}

impl Timeline {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &Timeline) -> Timeline {
        Timeline {
            reads: self.reads - earlier.reads,
            writes: self.writes - earlier.writes,
            flushes: self.flushes - earlier.flushes,
            read_bytes: self.read_bytes - earlier.read_bytes,
            write_bytes: self.write_bytes - earlier.write_bytes,
            busy_ns: self.busy_ns - earlier.busy_ns,
            positioning_ns: self.positioning_ns - earlier.positioning_ns,
            repositions: self.repositions - earlier.repositions,
            idle_ns: self.idle_ns - earlier.idle_ns,
            idle_gaps: self.idle_gaps - earlier.idle_gaps,
            overrun_ns: self.overrun_ns - earlier.overrun_ns,
        }
    }

    fn count(&mut self, op: IoKind, len: u64) {
        match op {
            IoKind::Read => {
                self.reads += 1;
                self.read_bytes += len;
            }
            IoKind::Write => {
                self.writes += 1;
                self.write_bytes += len;
            }
            IoKind::Flush => self.flushes += 1,
            IoKind::Trim => {}
        }
    }
}

/// A model in which everything is instantaneous.
#[derive(Debug, Clone, Copy, Default)]
pub struct NullTiming;

impl TimingModel for NullTiming {
    fn service_time(&self, _op: IoKind, _offset: u64, _len: u64) -> Duration {
        Duration::ZERO
    }
}

/// The longest lateness of an operation that still counts as following the previous one.
const CATCH_UP: Duration = Duration::from_millis(1);

/// A device's timeline and the instants its idle time is counted from.
#[derive(Debug, Default)]
struct TimelineState {
    t: Timeline,
    /// When the device was last free: the later of the last operation's modelled end and
    /// the inner device's completion of it.
    last_free: Option<Instant>,
    /// The instant up to which idle time is already in `t` (a timeline taken while idle
    /// counted it): idle time is counted from the later of the two, never twice.
    idle_counted_to: Option<Instant>,
    /// The start of the operation in progress on a serial device, if one is: the device is
    /// not idle from then on, though the operation is recorded only when it ends.
    busy_since: Option<Instant>,
}

/// Wraps a device with a timing model. See the module documentation.
#[derive(Debug)]
pub struct EmulatedDevice {
    inner: DeviceRef,
    model: Arc<dyn TimingModel>,
    /// Serializes operations, like the single actuator of a disk; holds when the previous
    /// operation was due to end.
    head: Mutex<Option<Instant>>,
    /// What the device did (the module documentation).
    timeline: Mutex<TimelineState>,
    /// Whether flushes reach the inner device (not for a scratch device).
    forward_flush: bool,
}

impl EmulatedDevice {
    pub fn new(inner: DeviceRef, model: Arc<dyn TimingModel>) -> EmulatedDevice {
        EmulatedDevice {
            inner,
            model,
            head: Mutex::new(None),
            timeline: Mutex::new(TimelineState::default()),
            forward_flush: true,
        }
    }

    /// An emulated device over scratch storage: flushes take the model's time and are not
    /// passed on. Nothing written survives a crash of the host; for benchmarks only.
    pub fn scratch(inner: DeviceRef, model: Arc<dyn TimingModel>) -> EmulatedDevice {
        EmulatedDevice {
            forward_flush: false,
            ..Self::new(inner, model)
        }
    }

    /// The wrapped device.
    pub fn inner(&self) -> &DeviceRef {
        &self.inner
    }

    /// The timing model.
    pub fn model(&self) -> &Arc<dyn TimingModel> {
        &self.model
    }

    /// What the device has done so far. A serial device idle now counts its idle time up to
    /// now, so that the difference of two timelines (`Timeline::since`) holds only the idle
    /// time between them, not a gap that began before the first. That idle time is kept as
    /// counted: an operation that started before this call and is recorded after it adds
    /// only the idle time after it, so every count only grows.
    pub fn timeline(&self) -> Timeline {
        let mut st = self.timeline.lock();
        if let (true, Some(free)) = (self.model.serial(), st.last_free) {
            let from = st.idle_counted_to.map_or(free, |c| c.max(free));
            let now = Instant::now();
            let now = st.busy_since.map_or(now, |b| b.min(now));
            let idle = now.saturating_duration_since(from);
            st.t.idle_ns += idle.as_nanos().min(u128::from(u64::MAX)) as u64;
            st.idle_counted_to = Some(now.max(from));
        }
        st.t
    }

    /// Adds one operation to the timeline: started at `start` (for a serial device; idle
    /// time is not counted for one that is not), `service` modelled, the inner device done at
    /// `done` against the modelled `end`.
    fn record(
        &self,
        op: IoKind,
        len: u64,
        service: Duration,
        start: Option<Instant>,
        end: Instant,
        done: Instant,
    ) {
        let transfer = self.model.transfer_time(op, len).min(service);
        let ns = |d: Duration| d.as_nanos().min(u128::from(u64::MAX)) as u64;
        let mut st = self.timeline.lock();
        // The whole gap decides whether this operation followed the last; only its part not
        // counted yet (`idle_counted_to`) is added.
        let (gap, idle) = match (start, st.last_free) {
            (Some(start), Some(free)) => {
                let from = st.idle_counted_to.map_or(free, |c| c.max(free));
                (
                    start.saturating_duration_since(free),
                    start.saturating_duration_since(from),
                )
            }
            _ => (Duration::ZERO, Duration::ZERO),
        };
        st.last_free = Some(end.max(done));
        st.busy_since = None;
        let t = &mut st.t;
        t.count(op, len);
        t.busy_ns += ns(service);
        if matches!(op, IoKind::Read | IoKind::Write) && service > transfer {
            t.positioning_ns += ns(service - transfer);
            t.repositions += 1;
        }
        t.idle_ns += ns(idle);
        if gap >= CATCH_UP {
            t.idle_gaps += 1;
        }
        t.overrun_ns += ns(done.saturating_duration_since(end));
    }

    fn timed<T>(&self, op: IoKind, offset: u64, len: u64, f: impl FnOnce() -> T) -> T {
        if !self.model.serial() {
            let start = Instant::now();
            let service = self.model.service_time(op, offset, len);
            let end = start + service;
            let out = f();
            let now = Instant::now();
            self.record(op, len, service, None, end, now);
            if end > now {
                std::thread::sleep(end - now);
            }
            return out;
        }
        let mut previous_end = self.head.lock();
        let now = Instant::now();
        // An operation that follows the previous one closely starts when that one was due to
        // end, not when its sleep happened to return: a sleep's overshoot (a busy host wakes
        // threads late) is then made up by the next operation instead of adding up over a
        // stream. After a longer gap the device was idle and starts now.
        let start = match *previous_end {
            Some(end) if end <= now && now - end < CATCH_UP => end,
            _ => now,
        };
        self.timeline.lock().busy_since = Some(start);
        let service = self.model.service_time(op, offset, len);
        let out = f();
        let end = start + service;
        *previous_end = Some(end);
        let now = Instant::now();
        self.record(op, len, service, Some(start), end, now);
        if end > now {
            std::thread::sleep(end - now);
        }
        out
    }
}

impl BlockDevice for EmulatedDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let len = buf.len() as u64;
        self.timed(IoKind::Read, offset, len, || {
            self.inner.read_at(buf, offset)
        })
    }

    fn read_vec(&self, len: usize, offset: u64) -> Result<Vec<u8>> {
        self.timed(IoKind::Read, offset, len as u64, || {
            self.inner.read_vec(len, offset)
        })
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        let len = buf.len() as u64;
        self.timed(IoKind::Write, offset, len, || {
            self.inner.write_at(buf, offset)
        })
    }

    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> Result<()> {
        let len = bufs.iter().map(|b| b.len() as u64).sum();
        self.timed(IoKind::Write, offset, len, || {
            self.inner.write_vectored_at(bufs, offset)
        })
    }

    fn flush(&self) -> Result<()> {
        self.timed(IoKind::Flush, 0, 0, || {
            if self.forward_flush {
                self.inner.flush()
            } else {
                Ok(())
            }
        })
    }

    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn trim(&self, offset: u64, len: u64) -> Result<()> {
        self.timed(IoKind::Trim, offset, len, || self.inner.trim(offset, len))
    }

    fn name(&self) -> &str {
        self.inner.name()
    }

    fn queue_depth(&self) -> usize {
        self.model.queue_depth()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemDevice;

    /// A fixed cost per operation that records what it was asked.
    #[derive(Debug, Default)]
    struct Fixed {
        calls: Mutex<Vec<(IoKind, u64, u64)>>,
    }

    impl TimingModel for Fixed {
        fn service_time(&self, op: IoKind, offset: u64, len: u64) -> Duration {
            self.calls.lock().push((op, offset, len));
            Duration::from_millis(5)
        }
    }

    #[test]
    fn null_timing_passes_through() {
        let inner: DeviceRef = Arc::new(MemDevice::new("mem0", 4096));
        let dev = EmulatedDevice::new(inner.clone(), Arc::new(NullTiming));
        assert_eq!(dev.name(), "mem0");
        assert_eq!(dev.size(), 4096);
        dev.write_at(b"abc", 10).unwrap();
        dev.flush().unwrap();
        dev.trim(0, 512).unwrap();
        let mut b = [0u8; 3];
        inner.read_at(&mut b, 10).unwrap();
        assert_eq!(&b, b"abc");
        assert!(dev.read_at(&mut b, 4095).is_err());
    }

    #[test]
    fn model_is_consulted_and_time_is_spent() {
        let model = Arc::new(Fixed::default());
        let dev = EmulatedDevice::new(Arc::new(MemDevice::new("m", 8192)), model.clone());
        let start = Instant::now();
        dev.write_at(&[1; 512], 1024).unwrap();
        let mut b = [0u8; 512];
        dev.read_at(&mut b, 1024).unwrap();
        dev.flush().unwrap();
        assert!(start.elapsed() >= Duration::from_millis(15));
        assert_eq!(
            *model.calls.lock(),
            vec![
                (IoKind::Write, 1024, 512),
                (IoKind::Read, 1024, 512),
                (IoKind::Flush, 0, 0)
            ]
        );
    }

    /// A model that charges 5 ms an operation, 2 ms of it moving the bytes.
    #[derive(Debug)]
    struct SplitCost;

    impl TimingModel for SplitCost {
        fn service_time(&self, _op: IoKind, _offset: u64, _len: u64) -> Duration {
            Duration::from_millis(5)
        }
        fn transfer_time(&self, _op: IoKind, _len: u64) -> Duration {
            Duration::from_millis(2)
        }
    }

    #[test]
    fn the_timeline_counts_operations_busy_positioning_and_idle_time() {
        let dev = EmulatedDevice::new(Arc::new(MemDevice::new("m", 1 << 20)), Arc::new(SplitCost));
        assert_eq!(dev.timeline(), Timeline::default());
        dev.write_at(&[7; 4096], 0).unwrap();
        dev.write_vectored_at(&[&[1; 512], &[2; 512]], 4096)
            .unwrap();
        let before = dev.timeline();
        std::thread::sleep(Duration::from_millis(20));
        let mut b = [0u8; 2048];
        dev.read_at(&mut b, 0).unwrap();
        dev.flush().unwrap();
        let all = dev.timeline();
        assert_eq!((all.writes, all.reads, all.flushes), (2, 1, 1));
        assert_eq!((all.write_bytes, all.read_bytes), (5120, 2048));
        assert_eq!(all.busy_ns, 20_000_000, "four operations of 5 ms");
        // The flush is no reposition: only reads and writes move the head.
        assert_eq!((all.repositions, all.positioning_ns), (3, 9_000_000));
        assert_eq!(all.idle_gaps, 1, "one pause of 20 ms");
        assert!(all.idle_ns >= 20_000_000, "idle {} ns", all.idle_ns);
        assert!(all.idle_ns < 1_000_000_000, "idle {} ns", all.idle_ns);
        let later = all.since(&before);
        assert_eq!((later.writes, later.reads, later.flushes), (0, 1, 1));
        assert_eq!(later.busy_ns, 10_000_000);
        assert_eq!(later.idle_gaps, 1);
    }

    /// Timelines taken while another thread keeps the device busy, with pauses: every count
    /// only grows (an operation that started before a timeline was taken and ended after it
    /// once took back idle time the timeline had counted, and `since` underflowed).
    #[test]
    fn timelines_taken_during_operations_only_grow() {
        #[derive(Debug)]
        struct Quick;
        impl TimingModel for Quick {
            fn service_time(&self, _op: IoKind, _offset: u64, _len: u64) -> Duration {
                Duration::from_micros(300)
            }
        }
        let dev = Arc::new(EmulatedDevice::new(
            Arc::new(MemDevice::new("m", 1 << 20)),
            Arc::new(Quick),
        ));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let worker = {
            let (dev, stop) = (dev.clone(), stop.clone());
            std::thread::spawn(move || {
                for i in 0..400u64 {
                    dev.write_at(&[1; 4096], (i % 64) * 4096).unwrap();
                    if i % 7 == 0 {
                        std::thread::sleep(Duration::from_micros(700));
                    }
                }
                stop.store(true, std::sync::atomic::Ordering::SeqCst);
            })
        };
        let mut prev = dev.timeline();
        let mut taken = 0;
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            let cur = dev.timeline();
            assert!(
                cur.idle_ns >= prev.idle_ns && cur.busy_ns >= prev.busy_ns,
                "timeline {taken} went back: {prev:?} then {cur:?}"
            );
            let _ = cur.since(&prev);
            prev = cur;
            taken += 1;
        }
        worker.join().unwrap();
        let all = dev.timeline();
        assert_eq!(all.writes, 400);
        assert!(taken > 100, "{taken} timelines taken");
        assert!(all.busy_ns >= 400 * 300_000);
    }

    #[test]
    fn idle_time_is_split_at_the_moment_a_timeline_is_taken() {
        let dev = EmulatedDevice::new(Arc::new(MemDevice::new("m", 1 << 20)), Arc::new(SplitCost));
        dev.write_at(&[7; 4096], 0).unwrap();
        std::thread::sleep(Duration::from_millis(40));
        let mid = dev.timeline();
        std::thread::sleep(Duration::from_millis(40));
        dev.write_at(&[7; 4096], 8192).unwrap();
        let end = dev.timeline();
        let second = end.since(&mid);
        // The 80 ms pause is counted once in all, and only its second half after `mid`.
        assert!(end.idle_ns >= 80_000_000, "idle {} ns", end.idle_ns);
        assert!(mid.idle_ns >= 40_000_000, "idle {} ns", mid.idle_ns);
        assert!(
            second.idle_ns >= 40_000_000,
            "idle after mid {} ns",
            second.idle_ns
        );
        assert!(
            second.idle_ns + 40_000_000 <= end.idle_ns,
            "the pause before mid counted after it: {} of {} ns",
            second.idle_ns,
            end.idle_ns
        );
        assert!(end.idle_ns < 1_000_000_000, "idle {} ns", end.idle_ns);
    }

    /// A device whose flush always fails, to tell whether a flush reached it.
    #[derive(Debug)]
    struct FailingFlush(MemDevice);

    impl BlockDevice for FailingFlush {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
            self.0.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
            self.0.write_at(buf, offset)
        }
        fn flush(&self) -> Result<()> {
            Err(crate::DeviceError::Invalid {
                dev: "m".into(),
                what: "flush reached the inner device".into(),
            })
        }
        fn size(&self) -> u64 {
            self.0.size()
        }
        fn name(&self) -> &str {
            self.0.name()
        }
    }

    #[test]
    fn a_scratch_device_keeps_flushes_to_the_model() {
        let model = Arc::new(Fixed::default());
        let inner = || Arc::new(FailingFlush(MemDevice::new("m", 8192)));
        assert!(EmulatedDevice::new(inner(), model.clone()).flush().is_err());
        let scratch = EmulatedDevice::scratch(inner(), model.clone());
        let start = Instant::now();
        scratch.flush().unwrap();
        assert!(
            start.elapsed() >= Duration::from_millis(5),
            "the model's time is spent"
        );
        scratch.write_at(b"x", 0).unwrap();
        let mut b = [0u8; 1];
        scratch.read_at(&mut b, 0).unwrap();
        assert_eq!(&b, b"x");
    }
}
