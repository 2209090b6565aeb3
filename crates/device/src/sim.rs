//! `SimDevice`: a deterministic, seeded, fault-injecting device for crash and corruption tests.
//!
//! # Theory of operation
//! Modelled on TigerBeetle's `testing/storage.zig` and redb's crash-testing backend.
//!
//! A [`SimFleet`] holds the state shared by the devices of one simulated machine: the seed, a
//! global clock of operations (every `write_at` and `flush` call on any device of the fleet
//! ticks it; reads and trims do not) and an optional crash point. With the crash point set to
//! `k`, the operation that would be number `k` (0-based) powers the machine off: it and every
//! later operation, reads included, fail with `DeviceError::Injected { what: "crashed" }` and
//! change nothing. The crash is permanent for the fleet; to "reboot", build a new fleet from
//! [`SimFleet::crash_images`].
//!
//! Each device models a disk with a volatile write cache. Conceptually it holds `durable` (the
//! contents as of its last successful flush), the ordered list of pending (unflushed) writes,
//! and the `live` view (durable with pending applied) that reads see. To keep memory at one
//! image per device, the implementation stores `live` plus, for each pending write, the bytes
//! it overwrote: `durable` is `live` with the pending writes undone in reverse order. `flush`
//! just forgets the pending list. `live` is stored sparsely in 64 KiB chunks that are only
//! allocated when written, so large, mostly empty devices are cheap; no operation copies a
//! whole image. After a crash, [`SimDevice::crash_image`] says what the medium holds, per
//! [`CrashMode`]: only durable data, everything, a random subset of the pending writes (writes
//! reach the medium out of order), or everything with the last pending write torn at a sector
//! boundary.
//!
//! Random faults ([`FaultConfig`]: read and write errors, bit rot on read, misdirected and
//! lost writes, failed flushes that lose the writes they covered) are drawn per operation from a `ChaCha8Rng` seeded from the fleet seed and the
//! device index, so the same sequence of calls replays exactly. A probability of zero draws
//! nothing. Deterministic injections for targeted tests: [`SimDevice::corrupt`] (persistent
//! bit rot of the stored bytes), [`SimDevice::set_gone`] (a pulled disk) and
//! [`SimDevice::fail_reads`] (an unreadable byte range).
//!
//! Each device's state sits behind one mutex, and the fleet clock is ticked while it is held,
//! so an operation that obtained its tick is applied atomically with respect to crash images.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::{check_range, BlockDevice, DeviceError, Result};

/// Granularity of torn and misdirected writes.
const SECTOR: usize = 512;
/// Allocation unit of the sparse in-memory image.
const CHUNK: usize = 64 * 1024;
/// Seed domains, so that fault and crash randomness never coincide.
const DOMAIN_FAULTS: u64 = 0x6661_756c_7473;
const DOMAIN_CRASH: u64 = 0x0063_7261_7368;

/// What survives on the medium of a device when the power fails. See the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CrashMode {
    /// Only the data as of the last successful flush.
    DropUnflushed,
    /// Everything written, flushed or not (the live view).
    KeepAll,
    /// Each pending write kept or dropped independently (probability 1/2), seeded.
    KeepRandomSubset { seed: u64 },
    /// All pending writes but the last; the last one kept only for a seeded strict prefix of
    /// the 512-byte sectors it touches (possibly none of them).
    TearLast { seed: u64 },
}

/// Per-operation fault probabilities in `[0, 1]`; all zero by default.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FaultConfig {
    /// A read fails with `Injected { what: "read error" }`.
    pub read_error: f64,
    /// A write fails with `Injected { what: "write error" }` and changes nothing.
    pub write_error: f64,
    /// A read returns its data with one random bit flipped (the stored data is unchanged).
    pub bitrot_on_read: f64,
    /// A write lands at another random sector-aligned offset (same length) and returns `Ok`.
    pub misdirect_write: f64,
    /// A write returns `Ok` but nothing is written.
    pub lost_write: f64,
    /// A flush fails with `Injected { what: "flush error" }`, and the unflushed writes it
    /// covered are lost: reads no longer see them, and a later flush (which then succeeds,
    /// having nothing left to write) does not bring them back. Linux does this with the dirty
    /// pages of a file whose fsync failed ("fsyncgate"): a caller that retries the flush and
    /// takes its success as the writes' loses them.
    pub flush_error: f64,
    /// Every read and write takes this long before it is served (a sick disk retrying its
    /// sectors: seconds per I/O where a healthy one takes milliseconds).
    pub delay: std::time::Duration,
}

/// Counters of one device. Calls are counted whatever their outcome; bytes only on success.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimStats {
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub trims: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Reads failed by `FaultConfig::read_error` or `fail_reads`.
    pub read_errors_injected: u64,
    pub write_errors_injected: u64,
    pub bitrot_injected: u64,
    pub misdirected_writes: u64,
    pub lost_writes: u64,
    /// Flushes failed by `FaultConfig::flush_error`, and the writes they lost.
    pub flush_errors_injected: u64,
    pub writes_lost_by_flush: u64,
}

// ---------------------------------------------------------------------------------------------
// Fleet

/// State shared by the devices of a fleet (no back-references to devices: no `Arc` cycle).
#[derive(Debug)]
struct FleetShared {
    seed: u64,
    clock: Mutex<OpClock>,
    crashed: AtomicBool,
}

#[derive(Debug)]
struct OpClock {
    done: u64,
    crash_at: Option<u64>,
}

impl FleetShared {
    /// Takes a tick of the operation clock; false if the machine is (now) crashed.
    fn begin_op(&self) -> bool {
        let mut clock = self.clock.lock();
        if self.crashed.load(Ordering::Acquire) {
            return false;
        }
        if clock.crash_at.is_some_and(|k| clock.done >= k) {
            self.crashed.store(true, Ordering::Release);
            return false;
        }
        clock.done += 1;
        true
    }

    fn is_crashed(&self) -> bool {
        self.crashed.load(Ordering::Acquire)
    }
}

/// The simulated machine: a set of [`SimDevice`]s sharing an operation clock and a crash
/// point. Cheap to clone (an `Arc` inside).
#[derive(Clone)]
pub struct SimFleet {
    shared: Arc<FleetShared>,
    devices: Arc<Mutex<Vec<SimDevice>>>,
}

impl SimFleet {
    pub fn new(seed: u64) -> SimFleet {
        SimFleet {
            shared: Arc::new(FleetShared {
                seed,
                clock: Mutex::new(OpClock {
                    done: 0,
                    crash_at: None,
                }),
                crashed: AtomicBool::new(false),
            }),
            devices: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// The fleet seed.
    pub fn seed(&self) -> u64 {
        self.shared.seed
    }

    /// Adds a zero-filled device of `size` bytes.
    ///
    /// # Panics
    /// If `size` does not fit in the address space.
    pub fn device(&self, name: &str, size: u64) -> SimDevice {
        let size = usize::try_from(size).expect("SimDevice size must fit in memory");
        self.add(name, Store::zeroed(size))
    }

    /// Adds a device holding `image` (durable; its size is `image.len()`).
    pub fn device_from_image(&self, name: &str, image: Vec<u8>) -> SimDevice {
        self.add(name, Store::from_vec(image))
    }

    fn add(&self, name: &str, live: Store) -> SimDevice {
        let mut devices = self.devices.lock();
        let index = devices.len();
        let rng = ChaCha8Rng::seed_from_u64(derive_seed(self.shared.seed, DOMAIN_FAULTS, index));
        let dev = SimDevice {
            inner: Arc::new(DevInner {
                name: name.to_string(),
                index,
                size: live.size as u64,
                fleet: self.shared.clone(),
                state: Mutex::new(DevState {
                    live,
                    pending: Vec::new(),
                    faults: FaultConfig::default(),
                    rng,
                    gone: false,
                    fail_reads: None,
                    stats: SimStats::default(),
                }),
            }),
        };
        devices.push(dev.clone());
        dev
    }

    /// The devices, in creation order.
    pub fn devices(&self) -> Vec<SimDevice> {
        self.devices.lock().clone()
    }

    /// Writes and flushes performed so far over all devices (the crash clock).
    pub fn ops(&self) -> u64 {
        self.shared.clock.lock().done
    }

    /// Sets (or clears) the crash point: operation number `k` (0-based) and all later ones
    /// do not happen. A point at or before `ops()` crashes the next operation. Clearing the
    /// point does not undo a crash that already happened.
    pub fn set_crash_at(&self, k: Option<u64>) {
        self.shared.clock.lock().crash_at = k;
    }

    /// The crash point, if any.
    pub fn crash_at(&self) -> Option<u64> {
        self.shared.clock.lock().crash_at
    }

    /// Whether the crash point has been reached.
    pub fn crashed(&self) -> bool {
        self.shared.is_crashed()
    }

    /// `(name, crash_image(mode))` of every device, in creation order. Each device derives its
    /// own randomness from the mode's seed and its index.
    pub fn crash_images(&self, mode: CrashMode) -> Vec<(String, Vec<u8>)> {
        self.devices()
            .iter()
            .map(|d| (d.inner.name.clone(), d.crash_image(mode)))
            .collect()
    }
}

impl fmt::Debug for SimFleet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let clock = self.shared.clock.lock();
        f.debug_struct("SimFleet")
            .field("seed", &self.shared.seed)
            .field("ops", &clock.done)
            .field("crash_at", &clock.crash_at)
            .field("crashed", &self.shared.is_crashed())
            .field("devices", &self.devices.lock().len())
            .finish()
    }
}

// ---------------------------------------------------------------------------------------------
// Device

/// One simulated disk of a [`SimFleet`]. Cheap to clone (an `Arc` inside); clones are the
/// same device.
#[derive(Clone)]
pub struct SimDevice {
    inner: Arc<DevInner>,
}

struct DevInner {
    name: String,
    index: usize,
    size: u64,
    fleet: Arc<FleetShared>,
    state: Mutex<DevState>,
}

struct DevState {
    /// Durable data with every pending write applied: what reads see.
    live: Store,
    /// Unflushed writes in issue order, each with the bytes it overwrote.
    pending: Vec<Pending>,
    faults: FaultConfig,
    rng: ChaCha8Rng,
    gone: bool,
    fail_reads: Option<Range<u64>>,
    stats: SimStats,
}

struct Pending {
    offset: usize,
    data: Vec<u8>,
    /// The contents of `[offset, offset + data.len())` just before this write.
    old: Vec<u8>,
}

impl SimDevice {
    /// Position of the device in its fleet (creation order).
    pub fn index(&self) -> usize {
        self.inner.index
    }

    /// Sets the random fault probabilities. Out-of-range values act as 0 or 1.
    pub fn set_faults(&self, faults: FaultConfig) {
        self.inner.state.lock().faults = faults;
    }

    pub fn faults(&self) -> FaultConfig {
        self.inner.state.lock().faults
    }

    /// Waits `FaultConfig::delay` (outside the device's lock: other I/O may go on).
    fn sick_delay(&self) {
        let delay = self.inner.state.lock().faults.delay;
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
    }

    /// Persistent bit rot: inverts every bit of `[offset, offset + len)` in the stored data,
    /// durable and pending alike, so that reads and every crash image see it.
    pub fn corrupt(&self, offset: u64, len: usize) -> Result<()> {
        check_range(&self.inner.name, offset, len, self.inner.size)?;
        let start = offset as usize;
        let end = start + len;
        let mut st = self.inner.state.lock();
        st.live.xor_ff(start, len);
        for p in &mut st.pending {
            let lo = start.max(p.offset);
            let hi = end.min(p.offset + p.data.len());
            if lo < hi {
                let r = lo - p.offset..hi - p.offset;
                xor_ff(&mut p.data[r.clone()]);
                xor_ff(&mut p.old[r]);
            }
        }
        Ok(())
    }

    /// A pulled (`true`) or re-inserted (`false`) disk. While gone, every operation fails
    /// with `Injected { what: "device gone" }`; the data is kept.
    pub fn set_gone(&self, gone: bool) {
        self.inner.state.lock().gone = gone;
    }

    pub fn is_gone(&self) -> bool {
        self.inner.state.lock().gone
    }

    /// Makes reads that overlap the byte range fail with `Injected { what: "read error" }`
    /// (`None` heals).
    pub fn fail_reads(&self, range: Option<Range<u64>>) {
        self.inner.state.lock().fail_reads = range;
    }

    pub fn stats(&self) -> SimStats {
        self.inner.state.lock().stats
    }

    /// Number of writes not yet made durable by a flush.
    pub fn pending_writes(&self) -> usize {
        self.inner.state.lock().pending.len()
    }

    /// What the medium holds after a power loss now, per `mode`. Does not change the device.
    pub fn crash_image(&self, mode: CrashMode) -> Vec<u8> {
        let st = self.inner.state.lock();
        let mut img = st.live.to_vec();
        if mode == CrashMode::KeepAll {
            return img;
        }
        for p in st.pending.iter().rev() {
            img[p.offset..p.offset + p.old.len()].copy_from_slice(&p.old);
        }
        let apply = |img: &mut [u8], p: &Pending, len: usize| {
            img[p.offset..p.offset + len].copy_from_slice(&p.data[..len]);
        };
        match mode {
            CrashMode::DropUnflushed | CrashMode::KeepAll => {}
            CrashMode::KeepRandomSubset { seed } => {
                let mut rng = crash_rng(seed, self.inner.index);
                for p in &st.pending {
                    if rng.gen_bool(0.5) {
                        apply(&mut img, p, p.data.len());
                    }
                }
            }
            CrashMode::TearLast { seed } => {
                if let Some((last, rest)) = st.pending.split_last() {
                    for p in rest {
                        apply(&mut img, p, p.data.len());
                    }
                    let mut rng = crash_rng(seed, self.inner.index);
                    let keep = torn_prefix(last.offset, last.data.len(), &mut rng);
                    apply(&mut img, last, keep);
                }
            }
        }
        img
    }

    fn injected(&self, what: &'static str) -> DeviceError {
        DeviceError::Injected {
            dev: self.inner.name.clone(),
            what,
        }
    }
}

impl fmt::Debug for SimDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimDevice")
            .field("name", &self.inner.name)
            .field("index", &self.inner.index)
            .field("size", &self.inner.size)
            .finish_non_exhaustive()
    }
}

impl BlockDevice for SimDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.sick_delay();
        let mut guard = self.inner.state.lock();
        let st = &mut *guard;
        st.stats.reads += 1;
        if self.inner.fleet.is_crashed() {
            return Err(self.injected("crashed"));
        }
        if st.gone {
            return Err(self.injected("device gone"));
        }
        check_range(&self.inner.name, offset, buf.len(), self.inner.size)?;
        let end = offset + buf.len() as u64;
        let unreadable = st
            .fail_reads
            .as_ref()
            .is_some_and(|r| r.start < end && offset < r.end);
        if unreadable || chance(&mut st.rng, st.faults.read_error) {
            st.stats.read_errors_injected += 1;
            return Err(self.injected("read error"));
        }
        st.live.read(offset as usize, buf);
        if !buf.is_empty() && chance(&mut st.rng, st.faults.bitrot_on_read) {
            let byte = st.rng.gen_range(0..buf.len());
            let bit = st.rng.gen_range(0..8);
            buf[byte] ^= 1 << bit;
            st.stats.bitrot_injected += 1;
        }
        st.stats.bytes_read += buf.len() as u64;
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.sick_delay();
        let mut guard = self.inner.state.lock();
        let st = &mut *guard;
        st.stats.writes += 1;
        if !self.inner.fleet.begin_op() {
            return Err(self.injected("crashed"));
        }
        if st.gone {
            return Err(self.injected("device gone"));
        }
        check_range(&self.inner.name, offset, buf.len(), self.inner.size)?;
        if chance(&mut st.rng, st.faults.write_error) {
            st.stats.write_errors_injected += 1;
            return Err(self.injected("write error"));
        }
        if chance(&mut st.rng, st.faults.lost_write) {
            st.stats.lost_writes += 1;
            return Ok(());
        }
        let mut target = offset as usize;
        if chance(&mut st.rng, st.faults.misdirect_write) {
            let slots = (st.live.size - buf.len()) / SECTOR + 1;
            let mut slot = st.rng.gen_range(0..slots);
            if slot * SECTOR == target && slots > 1 {
                slot = (slot + 1) % slots;
            }
            target = slot * SECTOR;
            st.stats.misdirected_writes += 1;
        }
        if !buf.is_empty() {
            let mut old = vec![0u8; buf.len()];
            st.live.read(target, &mut old);
            st.live.write(target, buf);
            st.pending.push(Pending {
                offset: target,
                data: buf.to_vec(),
                old,
            });
        }
        st.stats.bytes_written += buf.len() as u64;
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        let mut guard = self.inner.state.lock();
        let st = &mut *guard;
        st.stats.flushes += 1;
        if !self.inner.fleet.begin_op() {
            return Err(self.injected("crashed"));
        }
        if st.gone {
            return Err(self.injected("device gone"));
        }
        if chance(&mut st.rng, st.faults.flush_error) {
            // The writes the flush covered are gone: undone newest first, as `durable` is.
            let pending = std::mem::take(&mut st.pending);
            for p in pending.iter().rev() {
                st.live.write(p.offset, &p.old);
            }
            st.stats.flush_errors_injected += 1;
            st.stats.writes_lost_by_flush += pending.len() as u64;
            return Err(self.injected("flush error"));
        }
        st.pending.clear();
        Ok(())
    }

    fn size(&self) -> u64 {
        self.inner.size
    }

    fn trim(&self, offset: u64, len: u64) -> Result<()> {
        let mut st = self.inner.state.lock();
        st.stats.trims += 1;
        if self.inner.fleet.is_crashed() {
            return Err(self.injected("crashed"));
        }
        if st.gone {
            return Err(self.injected("device gone"));
        }
        let end = offset.checked_add(len).filter(|&e| e <= self.inner.size);
        if end.is_none() {
            return Err(DeviceError::OutOfRange {
                dev: self.inner.name.clone(),
                offset,
                len,
                size: self.inner.size,
            });
        }
        Ok(())
    }

    fn joins_writes(&self) -> bool {
        // Each write the layers above issued is a crash point of its own.
        false
    }

    fn name(&self) -> &str {
        &self.inner.name
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers

/// Draws a Bernoulli(p) only when `p > 0` (NaN and negatives never fire, `p >= 1` always).
fn chance(rng: &mut ChaCha8Rng, p: f64) -> bool {
    p > 0.0 && rng.gen::<f64>() < p
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

fn derive_seed(seed: u64, domain: u64, index: usize) -> u64 {
    splitmix64(splitmix64(seed ^ domain).wrapping_add(index as u64))
}

fn crash_rng(seed: u64, index: usize) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(derive_seed(seed, DOMAIN_CRASH, index))
}

/// Bytes kept of a torn write of `len` bytes at `offset`: a seeded strict prefix of the
/// (absolute) 512-byte sectors it touches, possibly empty.
fn torn_prefix(offset: usize, len: usize, rng: &mut ChaCha8Rng) -> usize {
    if len == 0 {
        return 0;
    }
    let first = offset / SECTOR;
    let last = (offset + len - 1) / SECTOR;
    let kept_sectors = rng.gen_range(0..=last - first);
    if kept_sectors == 0 {
        0
    } else {
        (first + kept_sectors) * SECTOR - offset
    }
}

fn xor_ff(bytes: &mut [u8]) {
    bytes.iter_mut().for_each(|b| *b = !*b);
}

/// A sparse byte image: fixed-size chunks, allocated on first write, absent ones read as zero.
struct Store {
    size: usize,
    chunks: Vec<Option<Box<[u8]>>>,
}

impl Store {
    fn zeroed(size: usize) -> Store {
        Store {
            size,
            chunks: vec![None; size.div_ceil(CHUNK)],
        }
    }

    fn from_vec(bytes: Vec<u8>) -> Store {
        let chunks = bytes
            .chunks(CHUNK)
            .map(|c| c.iter().any(|&b| b != 0).then(|| c.into()))
            .collect();
        Store {
            size: bytes.len(),
            chunks,
        }
    }

    /// Splits `[offset, offset + len)` into `(chunk index, offset in chunk, offset in range,
    /// length)` pieces. The range must be inside the store.
    fn pieces(offset: usize, len: usize) -> impl Iterator<Item = (usize, usize, usize, usize)> {
        let mut pos = 0;
        std::iter::from_fn(move || {
            if pos >= len {
                return None;
            }
            let at = offset + pos;
            let within = at % CHUNK;
            let n = (CHUNK - within).min(len - pos);
            let piece = (at / CHUNK, within, pos, n);
            pos += n;
            Some(piece)
        })
    }

    fn chunk_mut(&mut self, idx: usize) -> &mut [u8] {
        let len = CHUNK.min(self.size - idx * CHUNK);
        self.chunks[idx].get_or_insert_with(|| vec![0; len].into_boxed_slice())
    }

    fn read(&self, offset: usize, buf: &mut [u8]) {
        for (idx, within, pos, n) in Store::pieces(offset, buf.len()) {
            let dst = &mut buf[pos..pos + n];
            match &self.chunks[idx] {
                Some(chunk) => dst.copy_from_slice(&chunk[within..within + n]),
                None => dst.fill(0),
            }
        }
    }

    fn write(&mut self, offset: usize, data: &[u8]) {
        for (idx, within, pos, n) in Store::pieces(offset, data.len()) {
            self.chunk_mut(idx)[within..within + n].copy_from_slice(&data[pos..pos + n]);
        }
    }

    fn xor_ff(&mut self, offset: usize, len: usize) {
        for (idx, within, _, n) in Store::pieces(offset, len) {
            xor_ff(&mut self.chunk_mut(idx)[within..within + n]);
        }
    }

    /// A flat copy. Only written chunks are copied: the zeroed allocation stays untouched
    /// (and unbacked by memory) elsewhere, which keeps crash images of large devices cheap.
    fn to_vec(&self) -> Vec<u8> {
        let mut out = vec![0; self.size];
        for (idx, chunk) in self.chunks.iter().enumerate() {
            if let Some(c) = chunk {
                let start = idx * CHUNK;
                out[start..start + c.len()].copy_from_slice(c);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::Rng;

    const MIB: u64 = 1 << 20;

    fn is_injected(r: &Result<()>, what: &str) -> bool {
        matches!(r, Err(DeviceError::Injected { what: w, .. }) if *w == what)
    }

    fn read(dev: &SimDevice, offset: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0; len];
        dev.read_at(&mut buf, offset).unwrap();
        buf
    }

    #[test]
    fn read_write_round_trip_across_chunks() {
        let fleet = SimFleet::new(1);
        let dev = fleet.device("d0", MIB + 100);
        assert_eq!(dev.size(), MIB + 100);
        assert_eq!(dev.name(), "d0");
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        dev.write_at(&data, 60_000).unwrap();
        assert_eq!(read(&dev, 60_000, data.len()), data);
        dev.write_at(&[7; 100], MIB).unwrap();
        assert_eq!(read(&dev, MIB - 1, 101)[1..], [7; 100]);
        assert!(matches!(
            dev.write_at(&[1; 2], MIB + 99),
            Err(DeviceError::OutOfRange { .. })
        ));
        let s = dev.stats();
        assert_eq!((s.writes, s.reads, s.bytes_written), (3, 2, 200_100));
    }

    #[test]
    fn from_image_and_flush_semantics() {
        let fleet = SimFleet::new(1);
        let dev = fleet.device_from_image("img", vec![5; 4096]);
        dev.write_at(&[6; 512], 512).unwrap();
        assert_eq!(dev.pending_writes(), 1);
        assert_eq!(dev.crash_image(CrashMode::DropUnflushed), vec![5; 4096]);
        dev.flush().unwrap();
        assert_eq!(dev.pending_writes(), 0);
        let img = dev.crash_image(CrashMode::DropUnflushed);
        assert_eq!(img[512..1024], [6; 512]);
        assert_eq!(img, dev.crash_image(CrashMode::KeepAll));
    }

    #[test]
    fn crash_point_stops_ops_at_exactly_k() {
        let fleet = SimFleet::new(7);
        let a = fleet.device("a", 8192);
        let b = fleet.device("b", 8192);
        fleet.set_crash_at(Some(3));
        a.write_at(&[1; 512], 0).unwrap(); // op 0
        let mut buf = [0u8; 512];
        a.read_at(&mut buf, 0).unwrap(); // reads are not counted
        b.write_at(&[2; 512], 0).unwrap(); // op 1
        a.flush().unwrap(); // op 2
        assert_eq!(fleet.ops(), 3);
        assert!(!fleet.crashed());
        assert!(is_injected(&b.write_at(&[3; 512], 512), "crashed")); // op 3: crash
        assert!(fleet.crashed());
        assert!(is_injected(&a.flush(), "crashed"));
        assert!(is_injected(&a.read_at(&mut buf, 0), "crashed"));
        assert_eq!(fleet.ops(), 3);
        // Clearing the point does not power the machine back on.
        fleet.set_crash_at(None);
        assert!(fleet.crashed());

        let images = fleet.crash_images(CrashMode::KeepAll);
        assert_eq!(images.len(), 2);
        assert_eq!(images[0].0, "a");
        assert_eq!(images[0].1[..512], [1; 512]);
        assert_eq!(images[1].0, "b");
        assert_eq!(images[1].1[..512], [2; 512]);
        assert_eq!(images[1].1[512..1024], [0; 512]);
        let durable = fleet.crash_images(CrashMode::DropUnflushed);
        assert_eq!(durable[0].1[..512], [1; 512]);
        assert_eq!(durable[1].1, vec![0; 8192]);
    }

    #[test]
    fn crash_at_zero_and_at_past_point() {
        let fleet = SimFleet::new(0);
        let d = fleet.device("d", 4096);
        fleet.set_crash_at(Some(0));
        assert!(is_injected(&d.flush(), "crashed"));
        assert_eq!(fleet.ops(), 0);

        let fleet = SimFleet::new(0);
        let d = fleet.device("d", 4096);
        for _ in 0..5 {
            d.flush().unwrap();
        }
        fleet.set_crash_at(Some(2));
        assert!(is_injected(&d.write_at(&[1], 0), "crashed"));
        assert_eq!(fleet.ops(), 5);
    }

    /// Four pending writes over a flushed base.
    fn pending_setup() -> (SimFleet, SimDevice) {
        let fleet = SimFleet::new(3);
        let dev = fleet.device("d", 16 * 512);
        dev.write_at(&[0xEE; 16 * 512], 0).unwrap();
        dev.flush().unwrap();
        for i in 0..4u8 {
            dev.write_at(&[i + 1; 1024], u64::from(i) * 2048).unwrap();
        }
        (fleet, dev)
    }

    #[test]
    fn drop_unflushed_and_keep_all() {
        let (_fleet, dev) = pending_setup();
        assert_eq!(
            dev.crash_image(CrashMode::DropUnflushed),
            vec![0xEE; 16 * 512]
        );
        let all = dev.crash_image(CrashMode::KeepAll);
        assert_eq!(all, read(&dev, 0, 16 * 512));
        for i in 0..4usize {
            assert_eq!(all[i * 2048..i * 2048 + 1024], vec![i as u8 + 1; 1024][..]);
            assert_eq!(all[i * 2048 + 1024..i * 2048 + 2048], [0xEE; 1024]);
        }
    }

    #[test]
    fn random_subset_keeps_whole_writes_and_varies_with_seed() {
        let (_fleet, dev) = pending_setup();
        let mut seen = std::collections::HashSet::new();
        for seed in 0..64 {
            let img = dev.crash_image(CrashMode::KeepRandomSubset { seed });
            assert_eq!(img, dev.crash_image(CrashMode::KeepRandomSubset { seed }));
            let mut kept = Vec::new();
            for i in 0..4usize {
                let w = &img[i * 2048..i * 2048 + 1024];
                let is_new = w.iter().all(|&b| b == i as u8 + 1);
                assert!(
                    is_new || w.iter().all(|&b| b == 0xEE),
                    "torn write in subset"
                );
                kept.push(is_new);
            }
            seen.insert(kept);
        }
        assert!(seen.len() > 8, "subsets should vary: {seen:?}");
    }

    #[test]
    fn tear_last_keeps_others_and_a_strict_sector_prefix() {
        let (_fleet, dev) = pending_setup();
        let mut prefixes = std::collections::HashSet::new();
        for seed in 0..64 {
            let img = dev.crash_image(CrashMode::TearLast { seed });
            for i in 0..3usize {
                assert_eq!(img[i * 2048..i * 2048 + 1024], vec![i as u8 + 1; 1024][..]);
            }
            let last = &img[3 * 2048..3 * 2048 + 1024];
            let kept = last.iter().take_while(|&&b| b == 4).count();
            assert!(kept % 512 == 0 && kept < 1024, "kept {kept}");
            assert!(last[kept..].iter().all(|&b| b == 0xEE));
            prefixes.insert(kept);
        }
        assert_eq!(prefixes.len(), 2);
    }

    #[test]
    fn overlapping_pending_writes_undo_in_order() {
        let fleet = SimFleet::new(0);
        let dev = fleet.device("d", 4096);
        dev.write_at(&[1; 1000], 0).unwrap();
        dev.flush().unwrap();
        dev.write_at(&[2; 600], 200).unwrap();
        dev.write_at(&[3; 600], 500).unwrap();
        let durable = dev.crash_image(CrashMode::DropUnflushed);
        assert_eq!(durable[..1000], [1; 1000]);
        assert_eq!(durable[1000..], [0; 3096]);
        let all = dev.crash_image(CrashMode::KeepAll);
        assert_eq!(all[200..500], [2; 300]);
        assert_eq!(all[500..1100], [3; 600]);
    }

    fn fault_run(seed: u64) -> Vec<(bool, Vec<u8>)> {
        let fleet = SimFleet::new(seed);
        let devs: Vec<_> = (0..3)
            .map(|i| fleet.device(&format!("d{i}"), 64 * 1024))
            .collect();
        let faults = FaultConfig {
            read_error: 0.1,
            write_error: 0.1,
            bitrot_on_read: 0.1,
            misdirect_write: 0.1,
            lost_write: 0.1,
            flush_error: 0.0,
            ..Default::default()
        };
        devs.iter().for_each(|d| d.set_faults(faults));
        let mut out = Vec::new();
        for i in 0..300u64 {
            let d = &devs[(i % 3) as usize];
            let off = (i * 4096) % (60 * 1024);
            let w = d.write_at(&[i as u8; 1024], off);
            out.push((w.is_ok(), Vec::new()));
            let mut buf = vec![0; 1024];
            let r = d.read_at(&mut buf, off);
            out.push((r.is_ok(), buf));
        }
        for d in &devs {
            out.push((true, d.crash_image(CrashMode::KeepAll)));
        }
        out
    }

    #[test]
    fn seeded_faults_replay() {
        let a = fault_run(42);
        assert_eq!(a, fault_run(42));
        assert_ne!(a, fault_run(43));
        assert!(a.iter().any(|(ok, _)| !ok));
    }

    #[test]
    fn fault_kinds_behave() {
        let fleet = SimFleet::new(9);
        let dev = fleet.device("d", 64 * 1024);
        dev.write_at(&[0x55; 4096], 0).unwrap();

        dev.set_faults(FaultConfig {
            read_error: 1.0,
            ..FaultConfig::default()
        });
        assert!(is_injected(&dev.read_at(&mut [0; 8], 0), "read error"));

        dev.set_faults(FaultConfig {
            bitrot_on_read: 1.0,
            ..FaultConfig::default()
        });
        let got = read(&dev, 0, 4096);
        let flipped: u32 = got.iter().map(|&b| (b ^ 0x55).count_ones()).sum();
        assert_eq!(flipped, 1);

        dev.set_faults(FaultConfig {
            write_error: 1.0,
            ..FaultConfig::default()
        });
        assert!(is_injected(&dev.write_at(&[9; 8], 0), "write error"));

        dev.set_faults(FaultConfig {
            lost_write: 1.0,
            ..FaultConfig::default()
        });
        dev.write_at(&[0xAA; 512], 8192).unwrap();
        dev.set_faults(FaultConfig::default());
        assert_eq!(read(&dev, 0, 4096), vec![0x55; 4096]);
        assert_eq!(read(&dev, 8192, 512), vec![0; 512]);

        let s = dev.stats();
        assert_eq!(s.read_errors_injected, 1);
        assert_eq!(s.bitrot_injected, 1);
        assert_eq!(s.write_errors_injected, 1);
        assert_eq!(s.lost_writes, 1);
    }

    #[test]
    fn misdirected_write_lands_elsewhere() {
        let fleet = SimFleet::new(11);
        let dev = fleet.device("d", 64 * 1024);
        dev.set_faults(FaultConfig {
            misdirect_write: 1.0,
            ..FaultConfig::default()
        });
        dev.write_at(&[0xCC; 1024], 4096).unwrap();
        dev.set_faults(FaultConfig::default());
        assert_eq!(read(&dev, 4096, 1024), vec![0; 1024]);
        let img = dev.crash_image(CrashMode::KeepAll);
        let at = img
            .iter()
            .position(|&b| b == 0xCC)
            .expect("written somewhere");
        assert_ne!(at, 4096);
        assert_eq!(at % SECTOR, 0);
        assert_eq!(img[at..at + 1024], [0xCC; 1024]);
        assert_eq!(img.iter().filter(|&&b| b == 0xCC).count(), 1024);
        assert_eq!(dev.stats().misdirected_writes, 1);
        // Unflushed: dropping pending writes undoes it.
        assert_eq!(
            dev.crash_image(CrashMode::DropUnflushed),
            vec![0; 64 * 1024]
        );
    }

    #[test]
    fn corrupt_is_seen_by_reads_and_images() {
        let fleet = SimFleet::new(5);
        let dev = fleet.device("d", 8192);
        dev.write_at(&[0x0F; 1024], 0).unwrap();
        dev.flush().unwrap();
        dev.write_at(&[0x33; 512], 512).unwrap();
        dev.corrupt(500, 100).unwrap();
        let got = read(&dev, 0, 1024);
        assert_eq!(got[..500], [0x0F; 500]);
        assert_eq!(got[500..512], [0xF0; 12]);
        assert_eq!(got[512..600], [0xCC; 88]);
        assert_eq!(got[600..1024], [0x33; 424]);
        let durable = dev.crash_image(CrashMode::DropUnflushed);
        assert_eq!(durable[500..600], [0xF0; 100]);
        assert_eq!(durable[600..1024], [0x0F; 424]);
        assert!(dev.corrupt(8000, 500).is_err());
    }

    #[test]
    fn gone_device_and_failing_ranges() {
        let fleet = SimFleet::new(5);
        let dev = fleet.device("d", 8192);
        dev.write_at(&[1; 8192], 0).unwrap();
        dev.set_gone(true);
        assert!(dev.is_gone());
        assert!(is_injected(&dev.read_at(&mut [0; 4], 0), "device gone"));
        assert!(is_injected(&dev.write_at(&[0; 4], 0), "device gone"));
        assert!(is_injected(&dev.flush(), "device gone"));
        assert!(is_injected(&dev.trim(0, 4), "device gone"));
        dev.set_gone(false);
        assert_eq!(read(&dev, 0, 4), [1; 4]);

        dev.fail_reads(Some(1000..2000));
        assert!(is_injected(&dev.read_at(&mut [0; 10], 995), "read error"));
        assert!(is_injected(&dev.read_at(&mut [0; 10], 1999), "read error"));
        assert_eq!(read(&dev, 990, 10), [1; 10]);
        assert_eq!(read(&dev, 2000, 10), [1; 10]);
        dev.fail_reads(None);
        assert_eq!(read(&dev, 1000, 1000), [1; 1000]);
        assert_eq!(dev.stats().read_errors_injected, 2);
    }

    #[test]
    fn a_failed_flush_loses_the_writes_it_covered() {
        let fleet = SimFleet::new(6);
        let dev = fleet.device("d", 8192);
        dev.write_at(&[1; 4096], 0).unwrap();
        dev.flush().unwrap();
        dev.write_at(&[2; 4096], 0).unwrap();
        dev.write_at(&[3; 4096], 4096).unwrap();
        dev.set_faults(FaultConfig {
            flush_error: 1.0,
            ..Default::default()
        });
        assert!(is_injected(&dev.flush(), "flush error"));
        dev.set_faults(FaultConfig::default());
        // The retry succeeds, but the writes are gone: reads and the medium agree.
        dev.flush().unwrap();
        assert_eq!(read(&dev, 0, 4), [1; 4]);
        assert_eq!(read(&dev, 4096, 4), [0; 4]);
        let image = dev.crash_image(CrashMode::KeepAll);
        assert_eq!(image[..4096], [1; 4096]);
        assert_eq!(image[4096..], [0; 4096]);
        let st = dev.stats();
        assert_eq!((st.flush_errors_injected, st.writes_lost_by_flush), (1, 2));
    }

    #[test]
    fn large_fleet_is_cheap() {
        let fleet = SimFleet::new(1);
        let devs: Vec<_> = (0..7)
            .map(|i| fleet.device(&format!("d{i}"), 64 * MIB))
            .collect();
        let block = vec![0xA5; 16 * 1024];
        for i in 0..20_000u64 {
            let d = &devs[(i % 7) as usize];
            d.write_at(&block, (i * 7919 * 512) % (64 * MIB - block.len() as u64))
                .unwrap();
            if i % 64 == 63 {
                d.flush().unwrap();
            }
        }
        assert!(fleet.ops() > 20_000);
        let _ = devs[0].crash_image(CrashMode::KeepRandomSubset { seed: 1 });
    }

    /// Operations for the comparison against a naive model (durable image + pending list).
    #[derive(Debug, Clone)]
    enum Op {
        Write { offset: usize, len: usize, byte: u8 },
        Flush,
        Corrupt { offset: usize, len: usize },
    }

    fn op_strategy(size: usize) -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..size, 1..2048usize, any::<u8>()).prop_map(move |(o, l, b)| Op::Write {
                offset: o.min(size - 1),
                len: l.min(size - o.min(size - 1)),
                byte: b,
            }),
            1 => Just(Op::Flush),
            1 => (0..size, 1..512usize).prop_map(move |(o, l)| Op::Corrupt {
                offset: o,
                len: l.min(size - o),
            }),
        ]
    }

    proptest! {
        #[test]
        fn undo_log_matches_naive_model(
            ops in proptest::collection::vec(op_strategy(200_000), 1..60),
            seed in any::<u64>(),
        ) {
            let size = 200_000;
            let fleet = SimFleet::new(seed);
            let dev = fleet.device("d", size as u64);
            let mut durable = vec![0u8; size];
            let mut pending: Vec<(usize, Vec<u8>)> = Vec::new();
            for op in &ops {
                match *op {
                    Op::Write { offset, len, byte } => {
                        dev.write_at(&vec![byte; len], offset as u64).unwrap();
                        pending.push((offset, vec![byte; len]));
                    }
                    Op::Flush => {
                        dev.flush().unwrap();
                        for (o, d) in pending.drain(..) {
                            durable[o..o + d.len()].copy_from_slice(&d);
                        }
                    }
                    Op::Corrupt { offset, len } => {
                        dev.corrupt(offset as u64, len).unwrap();
                        xor_ff(&mut durable[offset..offset + len]);
                        for (o, d) in &mut pending {
                            for (i, b) in d.iter_mut().enumerate() {
                                if (offset..offset + len).contains(&(*o + i)) {
                                    *b = !*b;
                                }
                            }
                        }
                    }
                }
            }
            let apply = |img: &mut Vec<u8>, o: usize, d: &[u8]| {
                img[o..o + d.len()].copy_from_slice(d)
            };
            prop_assert_eq!(dev.crash_image(CrashMode::DropUnflushed), durable.clone());
            let mut live = durable.clone();
            pending.iter().for_each(|(o, d)| apply(&mut live, *o, d));
            prop_assert_eq!(dev.crash_image(CrashMode::KeepAll), live.clone());
            prop_assert_eq!(read(&dev, 0, size), live);

            let mut subset = durable.clone();
            let mut rng = crash_rng(seed, 0);
            for (o, d) in &pending {
                if rng.gen_bool(0.5) {
                    apply(&mut subset, *o, d);
                }
            }
            prop_assert_eq!(dev.crash_image(CrashMode::KeepRandomSubset { seed }), subset);

            let mut torn = durable.clone();
            if let Some(((lo, ld), rest)) = pending.split_last() {
                rest.iter().for_each(|(o, d)| apply(&mut torn, *o, d));
                let keep = torn_prefix(*lo, ld.len(), &mut crash_rng(seed, 0));
                prop_assert!(keep < ld.len());
                apply(&mut torn, *lo, &ld[..keep]);
            }
            prop_assert_eq!(dev.crash_image(CrashMode::TearLast { seed }), torn);
        }
    }
}
