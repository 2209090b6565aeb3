//! The daemon's write memory, made resident ahead of the first writes.
//!
//! # Theory of operation
//! A txg holds its dirty data in the process's memory until the sync has written it, up to
//! the write throttle's `dirty_max` (10 % of memory, at most 1 GiB), and the ARC keeps what
//! the sync wrote. In a daemon just started, all of that is memory the process has never
//! touched: each new page costs a fault and the kernel zeroing it, on the thread that
//! handles the write, in the middle of the one request a client waits for. On the machine
//! `docs/BENCHMARKS.md` describes, the kernel zeroes fresh memory at 0.7 to 1.2 GB/s, and a
//! first 1 GiB written through SMB or the mount ran at half the speed of the same write a
//! minute later.
//!
//! So at start the daemon touches `dirty_max` bytes of heap on a thread of its own, at the
//! kernel's idle priority (`SCHED_IDLE`: it runs only on a CPU nothing else wants), in
//! block-sized pieces, and frees them. The allocator keeps freed memory mapped
//! (`keep_freed_memory` in `main.rs`), so the writes that follow take pages that are
//! already resident, as the host's page cache hands a writer pages it already has
//! (Java's `AlwaysPreTouch` and database buffer pools do the same). The price is resident
//! memory the daemon would reach at its first large write anyway, taken at start: it is
//! skipped when the machine (or the container's memory limit) has less than four times that
//! available, and `TANK_PRETOUCH=0` turns it off (`TANK_PRETOUCH=SIZE` sets the amount).

/// The size of the pieces: the default record size, the allocation the write path makes
/// most.
const PIECE: usize = 128 << 10;

/// Bytes to touch: `setting` (`TANK_PRETOUCH`: a size such as `512M`, or 0) when given,
/// else `dirty_max`; none when `available` is less than four times that.
fn amount(setting: Option<&str>, dirty_max: u64, available: u64) -> Result<u64, String> {
    let want = match setting {
        Some(v) => tank_dataset::props::parse_size(v, false)
            .map_err(|e| format!("TANK_PRETOUCH={v}: {e}"))?,
        None => dirty_max,
    };
    if want.saturating_mul(4) > available {
        return Ok(0);
    }
    Ok(want)
}

/// The memory available to this process without swapping, in bytes: the kernel's estimate
/// for the host (MemAvailable), or what the container's cgroup has left below its limit
/// when that is less.
fn mem_available() -> u64 {
    use tank_pool::txg::{cgroup_bytes, meminfo_bytes};
    let host = meminfo_bytes("MemAvailable").unwrap_or(0);
    match (cgroup_bytes("memory.max"), cgroup_bytes("memory.current")) {
        (Some(limit), Some(used)) => host.min(limit.saturating_sub(used)),
        _ => host,
    }
}

/// Starts the touching thread; says how much it will touch (None: nothing).
pub fn start() -> Result<Option<u64>, String> {
    let setting = std::env::var("TANK_PRETOUCH").ok();
    let dirty_max = tank_pool::txg::TxgTunables::default().dirty_max;
    let bytes = amount(setting.as_deref(), dirty_max, mem_available())?;
    if bytes == 0 {
        return Ok(None);
    }
    let pieces = usize::try_from(bytes.div_ceil(PIECE as u64))
        .map_err(|_| format!("{bytes} bytes is too much"))?;
    std::thread::Builder::new()
        .name("tank-pretouch".into())
        .spawn(move || {
            idle_priority();
            let touched: Vec<Vec<u8>> = (0..pieces).map(|_| vec![1u8; PIECE]).collect();
            drop(touched);
        })
        .map_err(|e| format!("cannot start the thread: {e}"))?;
    Ok(Some(bytes))
}

/// Puts the calling thread in the kernel's idle class: it runs only when a CPU would
/// otherwise idle.
fn idle_priority() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler with pid 0 changes the calling thread only; `param` is a
    // valid sched_param for SCHED_IDLE, whose priority must be 0. A refusal leaves the
    // thread at its normal priority, which is harmless.
    #[allow(unsafe_code)]
    unsafe {
        libc::sched_setscheduler(0, libc::SCHED_IDLE, &param);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_amount_is_dirty_max_unless_set_and_only_where_memory_allows() {
        const G: u64 = 1 << 30;
        assert_eq!(amount(None, G, 24 * G), Ok(G));
        assert_eq!(amount(Some("0"), G, 24 * G), Ok(0));
        assert_eq!(amount(Some(" 256M "), G, 24 * G), Ok(256 << 20));
        // Less than four times the amount available: nothing.
        assert_eq!(amount(None, G, 4 * G - 1), Ok(0));
        assert_eq!(amount(Some("2G"), G, 8 * G), Ok(2 * G));
        let e = amount(Some("lots"), G, 24 * G).unwrap_err();
        assert!(e.starts_with("TANK_PRETOUCH=lots: "), "{e}");
    }
}
