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

/// Wraps a device with a timing model. See the module documentation.
#[derive(Debug)]
pub struct EmulatedDevice {
    inner: DeviceRef,
    model: Arc<dyn TimingModel>,
    /// Serializes operations, like the single actuator of a disk; holds when the previous
    /// operation was due to end.
    head: Mutex<Option<Instant>>,
    /// Whether flushes reach the inner device (not for a scratch device).
    forward_flush: bool,
}

impl EmulatedDevice {
    pub fn new(inner: DeviceRef, model: Arc<dyn TimingModel>) -> EmulatedDevice {
        EmulatedDevice {
            inner,
            model,
            head: Mutex::new(None),
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

    fn timed<T>(&self, op: IoKind, offset: u64, len: u64, f: impl FnOnce() -> T) -> T {
        if !self.model.serial() {
            let start = Instant::now();
            let end = start + self.model.service_time(op, offset, len);
            let out = f();
            let now = Instant::now();
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
        let service = self.model.service_time(op, offset, len);
        let out = f();
        let end = start + service;
        *previous_end = Some(end);
        let now = Instant::now();
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
