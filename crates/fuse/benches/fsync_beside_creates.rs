//! Does a request that waits hold back the other requests of its CPU?
//!
//! A thread creates small files (open O_EXCL, write 100 bytes, close) for a few seconds,
//! first alone, then beside a thread appending 4 KiB and fsyncing in a loop, both pinned to
//! CPU 0 (so over io_uring both use one queue), then both left to the scheduler, on a mount of a one-device pool in a temporary directory.
//! Measured over /dev/fuse (the baseline, several readers) and, where the kernel offers it,
//! over io_uring with the long requests served by the queue's own thread and by the
//! mount's workers (`MountOptions::ring_workers`), alternating within each round. Reported:
//! creates/s alone and beside the fsyncs, the 99th percentile of a create beside them,
//! fsyncs/s; medians of the rounds (min-max).
//!
//! `cargo bench -p tank-fuse --bench fsync_beside_creates [-- ROUNDS SECONDS]` as root
//! (it mounts); without /dev/fuse or the right to mount it says so and does nothing.

#[path = "../tests/common/mod.rs"]
mod common;

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{pin_to_cpu0, Setup};

/// Creates files in `dir` for `secs`: (creates/s, p99 seconds).
fn creates(dir: &std::path::Path, secs: f64) -> (f64, f64) {
    fs::create_dir(dir).expect("directory");
    let start = Instant::now();
    let mut lat = Vec::new();
    while start.elapsed().as_secs_f64() < secs {
        let t = Instant::now();
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(dir.join(lat.len().to_string()))
            .expect("create");
        f.write_all(&[7u8; 100]).expect("write");
        drop(f);
        lat.push(t.elapsed().as_secs_f64());
    }
    let rate = lat.len() as f64 / start.elapsed().as_secs_f64();
    lat.sort_by(f64::total_cmp);
    (rate, lat[lat.len() * 99 / 100])
}

struct Round {
    alone: f64,
    beside: f64,
    p99: f64,
    fsyncs: f64,
}

fn round(io_uring: bool, workers: bool, pinned: bool, secs: f64) -> Round {
    let mut setup = Setup {
        device_bytes: 2 << 30,
        ..Setup::default()
    };
    setup.opts.io_uring = io_uring;
    setup.opts.ring_workers = workers;
    let m = setup.mount();
    assert_eq!(
        m.handle.as_ref().expect("mounted").io_uring(),
        io_uring,
        "transport"
    );
    // The creating thread is this one (pinned by the caller, or not).
    let (alone, _) = creates(&m.p("alone"), secs);
    let stop = Arc::new(AtomicBool::new(false));
    let syncer = {
        let (path, stop) = (m.p("synced"), stop.clone());
        std::thread::spawn(move || {
            if pinned {
                pin_to_cpu0();
            }
            let mut f = File::create(path).expect("file");
            let start = Instant::now();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                f.write_all(&[9u8; 4096]).expect("append");
                f.sync_data().expect("fsync");
                n += 1;
            }
            n as f64 / start.elapsed().as_secs_f64()
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let (beside, p99) = creates(&m.p("beside"), secs);
    stop.store(true, Ordering::Relaxed);
    let fsyncs = syncer.join().expect("fsync thread");
    Round {
        alone,
        beside,
        p99,
        fsyncs,
    }
}

/// Median (min-max) with `prec` decimals.
fn summary(mut v: Vec<f64>, prec: usize) -> String {
    v.sort_by(f64::total_cmp);
    let (mid, lo, hi) = (v[v.len() / 2], v[0], v[v.len() - 1]);
    format!("{mid:.prec$} ({lo:.prec$}-{hi:.prec$})")
}

fn main() {
    if let Some(why) = common::fuse_missing() {
        println!("fsync_beside_creates: skipped: {why}");
        return;
    }
    // `cargo bench` passes "--bench"; numbers are ours.
    let nums: Vec<f64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let rounds = nums.first().map_or(3, |&n| n as usize).max(1);
    let secs = nums.get(1).copied().unwrap_or(5.0);
    let mut kinds = vec![("/dev/fuse", false, true)];
    if tank_fuse::io_uring_offered() {
        kinds.push(("io_uring, long requests on the queue's thread", true, false));
        kinds.push(("io_uring, long requests on workers", true, true));
    } else {
        println!("the kernel does not offer FUSE over io_uring here: /dev/fuse only");
    }
    for pinned in [true, false] {
        // Affinity is per thread: a helper thread per placement starts unpinned.
        let kinds = kinds.clone();
        std::thread::spawn(move || measure(&kinds, pinned, rounds, secs))
            .join()
            .expect("measurement");
    }
}

fn measure(kinds: &[(&str, bool, bool)], pinned: bool, rounds: usize, secs: f64) {
    if pinned {
        pin_to_cpu0();
    }
    let mut results: Vec<Vec<Round>> = kinds.iter().map(|_| Vec::new()).collect();
    for r in 0..rounds {
        for (k, &(name, io_uring, workers)) in kinds.iter().enumerate() {
            eprintln!("round {}/{rounds}: {name} ...", r + 1);
            results[k].push(round(io_uring, workers, pinned, secs));
        }
    }
    println!(
        "\ncreates beside a 4 KiB append+fsync loop, {}, {secs} s each, median (min-max) of \
         {rounds} rounds",
        if pinned {
            "both threads pinned to CPU 0"
        } else {
            "both left to the scheduler"
        }
    );
    println!(
        "{:<48} {:>22} {:>22} {:>20} {:>18}",
        "transport", "creates/s alone", "creates/s beside", "p99 beside, ms", "fsyncs/s"
    );
    for (k, &(name, _, _)) in kinds.iter().enumerate() {
        let rs = &results[k];
        println!(
            "{:<48} {:>22} {:>22} {:>20} {:>18}",
            name,
            summary(rs.iter().map(|r| r.alone).collect(), 0),
            summary(rs.iter().map(|r| r.beside).collect(), 0),
            summary(rs.iter().map(|r| r.p99 * 1e3).collect(), 1),
            summary(rs.iter().map(|r| r.fsyncs).collect(), 0),
        );
    }
}
