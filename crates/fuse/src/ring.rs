//! FUSE over io_uring (Linux 6.14 and later): the kernel's per-CPU request queues.
//!
//! # Theory of operation
//! With /dev/fuse every synchronous request wakes a server thread, usually on another CPU,
//! and the reply wakes the caller back: on a VM each such wake-up can cost more than the
//! request's work (docs/FUSE-IO-URING.md). Over io_uring the kernel keeps one queue per
//! possible CPU and puts a request in the queue of the CPU its caller runs on; a thread of
//! ours pinned to that CPU serves the queue, so caller and server take turns on one CPU, and
//! a reply and the next fetch are one submission.
//!
//! Each queue is served by `THREADS_PER_QUEUE` threads pinned to its CPU, each with its own
//! io_uring (128-byte submissions) and `DEPTH` entries. One thread with two entries: the
//! kernel fills the second while the first is served, and the thread answers both in one
//! turn. Two threads of one entry each let a request that waits (an fsync waiting for its
//! txg) not hold back the CPU's next one, but an asynchronous request (a RELEASE after each
//! created file) then wakes the second thread: small-file creates fell from 8,300-8,400/s to
//! 6,700-7,100/s in the FUSE benchmark. So one thread, and the requests that wait or take
//! long go to workers (below).
//!
//! Long requests leave the queue's thread: a read or write of `OFFLOAD_BYTES` or more, and
//! an fsync, are served by the mount's workers (unpinned, one per CPU), so an fsync waiting
//! for its txg does not hold back its CPU's other requests, and the server's work for a
//! stream's readahead and writeback (which the kernel puts in the queue of the one CPU its
//! reader or flusher runs on) can run on any CPU. A worker leaves its reply in the entry and tells the
//! queue's thread through an eventfd the thread polls in its own ring; the thread commits
//! the entry (a ring is only ever submitted to by its own thread). The extra wake-up costs
//! tens of microseconds, against milliseconds of work for a 1 MiB request. Measured by
//! `benches/fsync_beside_creates.rs` (docs/BENCHMARKS.md): a thread creating files beside
//! one fsyncing in a loop, both on CPU 0, created 2,443/s when the queue's thread waited
//! for each fsync and 10,011/s with the fsyncs aside, but the fsyncs, now sharing the CPU
//! fairly with the creates instead of stopping them, fell from 1,604/s to 194/s; left to
//! the scheduler, 7,150 and 8,205 creates/s beside 2,203 and 2,113 fsyncs/s. The kernel
//! still copies a request's data in the queue's thread (the ring's task work), so a
//! stream's copies stay on its CPU.
//!
//! An entry is a 288-byte header buffer and a payload buffer registered with the kernel once (REGISTER);
//! from then on the kernel fills the entry with a request and completes its submission,
//! and we answer it with COMMIT_AND_FETCH, which also hands the entry back for the next
//! request. So each entry always has exactly one submission in flight.
//!
//! The kernel splits a request: `fuse_in_header` into the header buffer's first 128 bytes,
//! the operation's fixed argument into the next 128, the rest (names, a write's data) at
//! the start of the payload buffer. fuser's dispatch wants the /dev/fuse layout, all in one
//! piece, so the payload buffer is registered `LEAD` bytes into a larger allocation and the
//! header and fixed argument are copied right before it: a write's data is never copied.
//! The reply of such a request is small and is taken into a buffer, then copied into the
//! entry once dispatch is over (the request's bytes are borrowed until then). A request
//! without payload (read, getattr, readdir) is copied to a small buffer of its own, and its
//! reply (a read's data) is written straight into the payload buffer.
//!
//! INIT, FORGET, INTERRUPT and anything queued before every queue had an entry still come
//! through /dev/fuse, where fuser's readers keep serving them. The kernel ends each entry
//! with ENOTCONN (or ECONNABORTED after an abort) when the connection goes, and the
//! queue's thread ends when all its entries have.
//!
//! Rings are made before the mount is initialised (`prepare`): the kernel routes requests
//! to the rings as soon as INIT accepted them, and a queue without entries would hold every
//! request back, so the capability is asked for only when every queue has its ring.

#![allow(unsafe_code)]

use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, OwnedFd};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use fuser::{Dispatcher, ReplySink};
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use nix::sys::eventfd::{EfdFlags, EventFd};
use parking_lot::Mutex;

use crate::server::Server;

/// The fuse module's switch for io_uring (off by default).
const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Whether the kernel offers FUSE over io_uring to new mounts (Linux 6.14+, with
/// `/sys/module/fuse/parameters/enable_uring` on).
pub fn kernel_offers() -> bool {
    std::fs::read_to_string(ENABLE_URING).is_ok_and(|s| matches!(s.trim(), "Y" | "1"))
}

/// Turns the kernel's FUSE over io_uring on for mounts made from now on (root only; every
/// FUSE server that asks for it gets it, not only tank).
pub fn enable_kernel_io_uring() -> io::Result<()> {
    enable_at(std::path::Path::new(ENABLE_URING))
}

fn enable_at(switch: &std::path::Path) -> io::Result<()> {
    if !switch.exists() {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this kernel has no FUSE over io_uring (it needs Linux 6.14 or later built with \
             CONFIG_FUSE_IO_URING, and the fuse module loaded)",
        ));
    }
    std::fs::write(switch, "Y").map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot write {}: {e} (it needs root)", switch.display()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turning_io_uring_on_writes_the_switch_or_says_why_not() {
        let dir = tempfile::tempdir().unwrap();
        let switch = dir.path().join("enable_uring");
        std::fs::write(&switch, "N").unwrap();
        enable_at(&switch).unwrap();
        assert_eq!(std::fs::read_to_string(&switch).unwrap(), "Y");
        let e = enable_at(&dir.path().join("absent")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::Unsupported);
        assert!(e.to_string().contains("Linux 6.14"), "{e}");
    }

    #[test]
    fn cpu_lists_are_counted_range_by_range() {
        assert_eq!(count_cpus("0\n").unwrap(), 1);
        assert_eq!(count_cpus("0-7").unwrap(), 8);
        assert_eq!(count_cpus("0-3,8-11").unwrap(), 8);
        assert_eq!(count_cpus("0,2,4-5").unwrap(), 4);
        assert!(count_cpus("0-x").is_err());
        // This host's own list parses, and has at least the CPU we run on.
        assert!(possible_cpus().unwrap() >= 1);
    }
}

/// Threads per queue, and entries per thread (see the module comment).
const THREADS_PER_QUEUE: usize = 1;
const DEPTH: usize = 2;
/// `struct fuse_uring_req_header`: in_out[128], op_in[128], `fuse_uring_ent_in_out` (32).
const HEADER_BYTES: usize = 288;
const IN_HEADER_BYTES: usize = 40;
const OUT_HEADER_BYTES: usize = 16;
const OP_IN: usize = 128;
const OP_IN_MAX: usize = 128;
/// `fuse_uring_ent_in_out`: commit_id u64 at 8, payload_sz u32 at 16.
const COMMIT_ID: usize = 256 + 8;
const PAYLOAD_SZ: usize = 256 + 16;
/// Room before the payload for the in-header and the fixed argument.
const LEAD: usize = IN_HEADER_BYTES + OP_IN_MAX;
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// `fuse_in_header.opcode`, and `fuse_read_in.size` within the fixed argument.
const OPCODE: usize = 4;
const READ_SIZE: usize = OP_IN + 16;
const FUSE_READ: u32 = 15;
const FUSE_WRITE: u32 = 16;
const FUSE_FSYNC: u32 = 20;
const FUSE_FSYNCDIR: u32 = 30;
/// Reads and writes of at least this many bytes are served by a worker (module comment).
const OFFLOAD_BYTES: usize = 128 * 1024;
/// The `user_data` of the poll on a queue's eventfd (entries are numbered from 0).
const WAKE: u64 = u64::MAX;

/// One ring entry's memory. The kernel writes into it between a submission and its
/// completion; we touch it only between a completion and the next submission.
struct Entry {
    /// The header buffer, 8-aligned.
    header: Box<[u64; HEADER_BYTES / 8]>,
    /// `LEAD` bytes, then the registered payload buffer.
    buf: Box<[u8]>,
    /// The two iovecs REGISTER points the kernel at (kept where they are until it read them).
    iov: Box<[libc::iovec; 2]>,
}

impl Entry {
    fn new(payload: usize) -> Entry {
        let mut header = Box::new([0u64; HEADER_BYTES / 8]);
        let mut buf = vec![0u8; LEAD + payload].into_boxed_slice();
        let iov = Box::new([
            libc::iovec {
                iov_base: header.as_mut_ptr().cast(),
                iov_len: HEADER_BYTES,
            },
            libc::iovec {
                // SAFETY: LEAD is within the allocation.
                iov_base: unsafe { buf.as_mut_ptr().add(LEAD) }.cast(),
                iov_len: payload,
            },
        ]);
        Entry { header, buf, iov }
    }

    fn header_ptr(&mut self) -> *mut u8 {
        self.header.as_mut_ptr().cast()
    }

    fn header(&self) -> &[u8] {
        // SAFETY: the array is HEADER_BYTES long; read only while the entry is ours.
        unsafe { std::slice::from_raw_parts(self.header.as_ptr().cast(), HEADER_BYTES) }
    }

    fn u32_at(&self, at: usize) -> u32 {
        u32::from_le_bytes(self.header()[at..at + 4].try_into().expect("4 bytes"))
    }

    fn u64_at(&self, at: usize) -> u64 {
        u64::from_le_bytes(self.header()[at..at + 8].try_into().expect("8 bytes"))
    }

    fn set_payload_sz(&mut self, n: u32) {
        let h = self.header_ptr();
        // SAFETY: PAYLOAD_SZ + 4 <= HEADER_BYTES; the entry is ours.
        unsafe { std::ptr::copy_nonoverlapping(n.to_le_bytes().as_ptr(), h.add(PAYLOAD_SZ), 4) };
    }

    /// Writes a reply: the out-header into the header buffer, the body at the payload's start.
    fn put_reply(&mut self, reply: &[u8]) {
        let (head, body) = reply.split_at(OUT_HEADER_BYTES);
        let h = self.header_ptr();
        // SAFETY: 16 <= HEADER_BYTES; the entry is ours.
        unsafe { std::ptr::copy_nonoverlapping(head.as_ptr(), h, OUT_HEADER_BYTES) };
        self.buf[LEAD..LEAD + body.len()].copy_from_slice(body);
        self.set_payload_sz(body.len() as u32);
    }

    /// An error reply to request `unique`.
    fn put_error(&mut self, unique: u64, errno: i32) {
        let mut r = [0u8; OUT_HEADER_BYTES];
        r[0..4].copy_from_slice(&(OUT_HEADER_BYTES as u32).to_le_bytes());
        r[4..8].copy_from_slice(&(-errno).to_le_bytes());
        r[8..16].copy_from_slice(&unique.to_le_bytes());
        self.put_reply(&r);
    }
}

/// A queue: its ring and entries, made before the mount is initialised.
pub(crate) struct Queue {
    qid: u16,
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    entries: Vec<Entry>,
    /// Entries workers have answered, for this queue's thread to commit.
    done: Arc<Done>,
    /// Where long requests go.
    jobs: Sender<Job>,
}

/// Entries a queue's workers have answered: (entry, commit id), and the eventfd that wakes
/// the queue's thread when one is added.
struct Done {
    answered: Mutex<Vec<(usize, u64)>>,
    wake: EventFd,
}

impl Done {
    fn new() -> io::Result<Done> {
        Ok(Done {
            answered: Mutex::new(Vec::new()),
            wake: EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?,
        })
    }

    /// A worker hands entry `i` back, answered.
    fn answered(&self, i: usize, commit_id: u64) {
        self.answered.lock().push((i, commit_id));
        // It can only fail if the counter would overflow, and then the thread is woken.
        let _ = self.wake.write(1);
    }

    /// The queue's thread takes the answered entries (after its poll fired). The eventfd is
    /// reset before the list is taken: an entry added later writes it again.
    fn take(&self, into: &mut Vec<(usize, u64)>) {
        let _ = self.wake.read();
        into.append(&mut self.answered.lock());
    }

    /// Waits until workers handed back `out` entries (the queue's thread is ending).
    fn wait_for(&self, mut out: usize) {
        let mut answered = Vec::new();
        while out > 0 {
            let mut fds = [libc::pollfd {
                fd: self.wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }];
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(fds.as_mut_ptr(), 1, -1) };
            self.take(&mut answered);
            out -= answered.len();
            answered.clear();
        }
    }
}

/// A long request for a worker: entry `i` of a queue, with its request in it.
struct Job {
    entry: *mut Entry,
    i: usize,
    done: Arc<Done>,
}

// SAFETY: while a job is out, its entry belongs to the worker alone: the queue's thread has
// no submission in flight for it and touches it again only after `Done::answered`, and
// the entry (in a Vec that is never resized) outlives the job, since the queue's thread
// waits for every entry's last completion before it ends.
unsafe impl Send for Job {}

// SAFETY: the iovecs' raw pointers point into the entry's own boxes, which move with it;
// a queue is used by one thread at a time.
unsafe impl Send for Queue {}

/// What a queue's thread needs once the kernel granted the rings.
struct Start {
    device: Arc<OwnedFd>,
    dispatcher: Dispatcher<Server>,
    /// Cleared if the kernel refuses an entry (it then sends everything through /dev/fuse).
    active: Arc<AtomicBool>,
}

/// The queues of a mount, one per possible CPU, each with its thread already running and
/// waiting for `start` (so that nothing can fail between the kernel granting the rings and
/// every queue registering its entries: a queue without entries would hold back every
/// request of its CPU).
pub(crate) struct Rings {
    threads: Vec<Waiting<Start>>,
    /// The workers, waiting for the dispatcher.
    workers: Vec<Waiting<Dispatcher<Server>>>,
}

/// A thread waiting for what it needs to start, and the channel that brings it.
type Waiting<T> = (mpsc::Sender<T>, JoinHandle<io::Result<()>>);

/// CPUs the kernel may ever run on (`/sys/devices/system/cpu/possible`, e.g. "0-7"): the
/// kernel makes one queue per possible CPU, numbered as the CPUs.
fn possible_cpus() -> io::Result<usize> {
    count_cpus(&std::fs::read_to_string(
        "/sys/devices/system/cpu/possible",
    )?)
}

/// CPUs in a kernel CPU list ("0-3,8-11", "0").
fn count_cpus(list: &str) -> io::Result<usize> {
    let mut n = 0;
    for part in list.trim().split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (usize, usize) = (
            a.parse().map_err(io::Error::other)?,
            b.parse().map_err(io::Error::other)?,
        );
        n += b.saturating_sub(a) + 1;
    }
    Ok(n)
}

impl Rings {
    /// Makes `THREADS_PER_QUEUE` rings of `DEPTH` entries of `payload` bytes for every
    /// possible CPU, and their threads. Dropped without `start`, the threads end.
    /// With `workers` false, long requests are served by the queues' threads too (there is
    /// no worker to take them).
    pub(crate) fn prepare(payload: usize, workers: bool) -> io::Result<Rings> {
        let cpus = possible_cpus()?;
        let mut rings = Rings {
            threads: Vec::with_capacity(cpus * THREADS_PER_QUEUE),
            workers: Vec::new(),
        };
        let (jobs, work) = crossbeam_channel::unbounded::<Job>();
        let online = std::thread::available_parallelism().map_or(1, |n| n.get());
        for w in 0..if workers { online.min(cpus) } else { 0 } {
            let (tx, rx) = mpsc::channel::<Dispatcher<Server>>();
            let work = work.clone();
            let name = format!("fuse-worker-{w}");
            let thread = std::thread::Builder::new()
                .name(name.clone())
                .spawn(move || match rx.recv() {
                    Ok(dispatcher) => {
                        work_on(&work, &dispatcher, &name);
                        Ok(())
                    }
                    Err(_) => Ok(()),
                })?;
            rings.workers.push((tx, thread));
        }
        for q in 0..cpus {
            for t in 0..THREADS_PER_QUEUE {
                // Room for every entry's submission and the poll of the eventfd.
                let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
                    .build((DEPTH * 2) as u32)?;
                let queue = Queue {
                    qid: q as u16,
                    ring,
                    entries: (0..DEPTH).map(|_| Entry::new(payload)).collect(),
                    done: Arc::new(Done::new()?),
                    jobs: jobs.clone(),
                };
                let (tx, rx) = mpsc::channel::<Start>();
                let name = format!("fuse-ring-{q}.{t}");
                let thread =
                    std::thread::Builder::new()
                        .name(name.clone())
                        .spawn(move || match rx.recv() {
                            Ok(s) => serve(queue, &s, &name),
                            Err(_) => Ok(()),
                        })?;
                rings.threads.push((tx, thread));
            }
        }
        Ok(rings)
    }

    pub(crate) fn queues(&self) -> usize {
        self.threads.len()
    }

    /// Lets every queue's thread register its entries on `device` (the session's
    /// /dev/fuse) and serve requests with `dispatcher`; returns the threads. `active` is
    /// cleared if the kernel refuses the rings.
    pub(crate) fn start(
        self,
        device: Arc<OwnedFd>,
        dispatcher: Dispatcher<Server>,
        active: Arc<AtomicBool>,
    ) -> Vec<JoinHandle<io::Result<()>>> {
        // The threads are waiting on their channels: the sends cannot fail. The workers end
        // when the last queue's thread has (it holds the last sender of jobs).
        let mut threads: Vec<_> = self
            .threads
            .into_iter()
            .map(|(tx, thread)| {
                let _ = tx.send(Start {
                    device: device.clone(),
                    dispatcher: dispatcher.clone(),
                    active: active.clone(),
                });
                thread
            })
            .collect();
        threads.extend(self.workers.into_iter().map(|(tx, thread)| {
            let _ = tx.send(dispatcher.clone());
            thread
        }));
        threads
    }
}

/// A worker: serves long requests until every queue's thread has ended.
fn work_on(work: &Receiver<Job>, dispatcher: &Dispatcher<Server>, name: &str) {
    let mut small = [0u8; LEAD];
    for job in work {
        // SAFETY: the entry is the job's alone until it is handed back (see `Job`).
        let e = unsafe { &mut *job.entry };
        let commit_id = serve_one(e, dispatcher, &mut small, name);
        job.done.answered(job.i, commit_id);
    }
}

/// Whether the request in `e` is long enough to be served by a worker.
fn is_long(e: &Entry) -> bool {
    match e.u32_at(OPCODE) {
        FUSE_READ => e.u32_at(READ_SIZE) as usize >= OFFLOAD_BYTES,
        FUSE_WRITE => e.u32_at(PAYLOAD_SZ) as usize >= OFFLOAD_BYTES,
        FUSE_FSYNC | FUSE_FSYNCDIR => true,
        _ => false,
    }
}

fn cmd(qid: u16, commit_id: u64) -> [u8; 80] {
    // struct fuse_uring_cmd_req { flags u64, commit_id u64, qid u16, padding[6] }
    let mut c = [0u8; 80];
    c[8..16].copy_from_slice(&commit_id.to_le_bytes());
    c[16..18].copy_from_slice(&qid.to_le_bytes());
    c
}

fn register_sqe(fd: i32, qid: u16, i: usize, e: &Entry) -> squeue::Entry128 {
    let sqe = opcode::UringCmd80::new(types::Fd(fd), CMD_REGISTER)
        .cmd(cmd(qid, 0))
        .addr(Some(e.iov.as_ptr() as u64))
        .build()
        .user_data(i as u64);
    // The crate has no setter for `len`, which REGISTER needs to be the iovec count (2).
    // SAFETY: Entry128 is repr(C), 128 bytes: the kernel's io_uring_sqe with its 80-byte
    // command area; `len` is the u32 at byte 24.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    raw[24..28].copy_from_slice(&2u32.to_le_bytes());
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

fn commit_sqe(fd: i32, qid: u16, i: usize, commit_id: u64) -> squeue::Entry128 {
    opcode::UringCmd80::new(types::Fd(fd), CMD_COMMIT_AND_FETCH)
        .cmd(cmd(qid, commit_id))
        .build()
        .user_data(i as u64)
}

/// A one-shot poll of the queue's eventfd: completes when a worker hands an entry back.
fn wake_sqe(done: &Done) -> squeue::Entry128 {
    opcode::PollAdd::new(types::Fd(done.wake.as_raw_fd()), libc::POLLIN as u32)
        .build()
        .user_data(WAKE)
        .into()
}

fn push(ring: &mut IoUring<squeue::Entry128, cqueue::Entry>, sqe: &squeue::Entry128) {
    // SAFETY: the buffers the entry names (its iovecs, header and payload) live in the
    // queue's entries, which outlive the ring's use of them (the thread owns both). The
    // submission queue holds DEPTH * 2 and each entry has at most one submission pending.
    let pushed = unsafe { ring.submission().push(sqe) };
    debug_assert!(pushed.is_ok(), "submission queue full");
}

/// Pins the calling thread to `cpu` (best effort: the CPU may be offline).
fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET stays within it for cpu < 1024.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if cpu < 8 * std::mem::size_of::<libc::cpu_set_t>() {
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }
}

/// Serves one queue until the connection ends.
fn serve(mut q: Queue, start: &Start, name: &str) -> io::Result<()> {
    pin(usize::from(q.qid));
    let fd = start.device.as_raw_fd();
    let dispatcher = &start.dispatcher;
    for i in 0..q.entries.len() {
        let sqe = register_sqe(fd, q.qid, i, &q.entries[i]);
        push(&mut q.ring, &sqe);
    }
    push(&mut q.ring, &wake_sqe(&q.done));
    let mut live = q.entries.len();
    let mut small = [0u8; LEAD];
    let mut done = Vec::new();
    let mut answered = Vec::new();
    // Entries out with workers.
    let mut out = 0usize;
    while live > 0 {
        match q.ring.submit_and_wait(1) {
            Ok(_) => {}
            // Interrupted, or completions to reap first (then submitted on the next turn).
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR | libc::EBUSY | libc::EAGAIN)
                ) => {}
            Err(e) => {
                // The entries must outlive the workers' use of them.
                q.done.wait_for(out);
                return Err(e);
            }
        }
        done.clear();
        done.extend(
            q.ring
                .completion()
                .map(|c| (c.user_data() as usize, c.result())),
        );
        for &(i, res) in &done {
            if i as u64 == WAKE {
                // Workers answered entries: commit them, and poll again.
                q.done.take(&mut answered);
                out -= answered.len();
                for (i, commit_id) in answered.drain(..) {
                    let sqe = commit_sqe(fd, q.qid, i, commit_id);
                    push(&mut q.ring, &sqe);
                }
                push(&mut q.ring, &wake_sqe(&q.done));
                continue;
            }
            if res == -libc::EAGAIN || res == -libc::EINTR {
                // REGISTER before the kernel finished INIT: again.
                let sqe = register_sqe(fd, q.qid, i, &q.entries[i]);
                push(&mut q.ring, &sqe);
                continue;
            }
            if res < 0 {
                // The connection ended (ENOTCONN, ECONNABORTED, ECANCELED), or the kernel
                // refused the entry (it then sends every request through /dev/fuse).
                if !matches!(-res, libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED) {
                    start.active.store(false, Ordering::Release);
                }
                live -= 1;
                continue;
            }
            if is_long(&q.entries[i]) {
                let job = Job {
                    entry: &mut q.entries[i],
                    i,
                    done: q.done.clone(),
                };
                // The workers live until every queue's thread has ended; without workers
                // the send fails and the request is served here.
                if q.jobs.send(job).is_ok() {
                    out += 1;
                    continue;
                }
            }
            let commit_id = serve_one(&mut q.entries[i], dispatcher, &mut small, name);
            let sqe = commit_sqe(fd, q.qid, i, commit_id);
            push(&mut q.ring, &sqe);
        }
    }
    // Every entry has had its last completion; the eventfd's poll is cancelled with the
    // ring (it has no buffer of ours).
    Ok(())
}

/// Dispatches the request in `e` and leaves its reply there; returns its commit id.
fn serve_one(
    e: &mut Entry,
    dispatcher: &Dispatcher<Server>,
    small: &mut [u8; LEAD],
    name: &str,
) -> u64 {
    let commit_id = e.u64_at(COMMIT_ID);
    let unique = e.u64_at(8);
    let len = e.u32_at(0) as usize;
    let payload_sz = e.u32_at(PAYLOAD_SZ) as usize;
    let payload_cap = e.iov[1].iov_len;
    let op_len = len.checked_sub(IN_HEADER_BYTES + payload_sz);
    let Some(op_len) = op_len.filter(|&n| n <= OP_IN_MAX && payload_sz <= payload_cap) else {
        e.put_error(unique, libc::EIO);
        return commit_id;
    };
    let head_len = IN_HEADER_BYTES + op_len;
    if payload_sz == 0 {
        // The request in a buffer of its own; the reply straight into the payload buffer.
        small[..IN_HEADER_BYTES].copy_from_slice(&e.header()[..IN_HEADER_BYTES]);
        small[IN_HEADER_BYTES..head_len].copy_from_slice(&e.header()[OP_IN..OP_IN + op_len]);
        let sink = Arc::new(EntrySink::direct(e));
        let request = &small[..head_len];
        // A handler that panics must not end the queue's thread: its CPU's requests would
        // wait for ever. The request fails with EIO instead.
        let _ = std::panic::catch_unwind(AssertUnwindSafe(|| {
            dispatcher.dispatch(request, sink.clone(), name)
        }));
        if !sink.finish() {
            e.put_error(unique, libc::EIO);
        }
    } else {
        // The request in place before its payload; the reply taken aside.
        let start = LEAD - head_len;
        let (hdr, op) = {
            let h = e.header();
            let mut hdr = [0u8; IN_HEADER_BYTES];
            hdr.copy_from_slice(&h[..IN_HEADER_BYTES]);
            let mut op = [0u8; OP_IN_MAX];
            op[..op_len].copy_from_slice(&h[OP_IN..OP_IN + op_len]);
            (hdr, op)
        };
        e.buf[start..start + IN_HEADER_BYTES].copy_from_slice(&hdr);
        e.buf[start + IN_HEADER_BYTES..LEAD].copy_from_slice(&op[..op_len]);
        let sink = Arc::new(EntrySink::buffered());
        let request = &e.buf[start..LEAD + payload_sz];
        let _ = std::panic::catch_unwind(AssertUnwindSafe(|| {
            dispatcher.dispatch(request, sink.clone(), name)
        }));
        match sink.take() {
            Some(reply) if reply.len() - OUT_HEADER_BYTES <= payload_cap => e.put_reply(&reply),
            _ => e.put_error(unique, libc::EIO),
        }
    }
    commit_id
}

/// Where fuser sends one request's reply.
#[derive(Debug)]
struct EntrySink {
    /// Header and payload buffers to write into (direct mode), valid while `open`.
    direct: Option<(usize, usize, usize)>,
    state: Mutex<SinkState>,
}

#[derive(Debug, Default)]
struct SinkState {
    open: bool,
    replied: bool,
    reply: Vec<u8>,
}

impl EntrySink {
    /// Writes the reply into `e` as it comes (nothing else refers to `e`'s payload meanwhile).
    fn direct(e: &mut Entry) -> EntrySink {
        let header = e.header_ptr() as usize;
        let payload = e.buf[LEAD..].as_mut_ptr() as usize;
        EntrySink {
            direct: Some((header, payload, e.iov[1].iov_len)),
            state: Mutex::new(SinkState {
                open: true,
                ..Default::default()
            }),
        }
    }

    /// Keeps the reply for the caller to copy once dispatch is over.
    fn buffered() -> EntrySink {
        EntrySink {
            direct: None,
            state: Mutex::new(SinkState {
                open: true,
                ..Default::default()
            }),
        }
    }

    /// Closes the sink; whether a reply came.
    fn finish(&self) -> bool {
        let mut s = self.state.lock();
        s.open = false;
        s.replied
    }

    /// Closes the sink and takes the buffered reply.
    fn take(&self) -> Option<Vec<u8>> {
        let mut s = self.state.lock();
        s.open = false;
        s.replied.then(|| std::mem::take(&mut s.reply))
    }
}

impl ReplySink for EntrySink {
    fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        let mut s = self.state.lock();
        if !s.open || s.replied {
            return Err(io::Error::other(
                "a second reply, or one after the request ended",
            ));
        }
        let total: usize = data.iter().map(|d| d.len()).sum();
        if total < OUT_HEADER_BYTES {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        match self.direct {
            Some((header, payload, cap)) => {
                if total - OUT_HEADER_BYTES > cap {
                    return Err(io::Error::from_raw_os_error(libc::EINVAL));
                }
                let (header, payload) = (header as *mut u8, payload as *mut u8);
                let mut at = 0usize;
                for d in data {
                    let mut src: &[u8] = d;
                    while !src.is_empty() {
                        // SAFETY: the entry is ours while the sink is open (its request is
                        // being dispatched on this thread and nothing else refers to its
                        // buffers); writes stay below 16 in the header and below `cap` in
                        // the payload (checked above).
                        let n = if at < OUT_HEADER_BYTES {
                            let n = (OUT_HEADER_BYTES - at).min(src.len());
                            unsafe {
                                std::ptr::copy_nonoverlapping(src.as_ptr(), header.add(at), n)
                            };
                            n
                        } else {
                            let n = src.len();
                            unsafe {
                                std::ptr::copy_nonoverlapping(
                                    src.as_ptr(),
                                    payload.add(at - OUT_HEADER_BYTES),
                                    n,
                                )
                            };
                            n
                        };
                        at += n;
                        src = &src[n..];
                    }
                }
                let body = (total - OUT_HEADER_BYTES) as u32;
                // SAFETY: as above; PAYLOAD_SZ + 4 <= HEADER_BYTES.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        body.to_le_bytes().as_ptr(),
                        header.add(PAYLOAD_SZ),
                        4,
                    )
                };
            }
            None => {
                s.reply.reserve(total);
                for d in data {
                    s.reply.extend_from_slice(d);
                }
            }
        }
        s.replied = true;
        Ok(())
    }
}
