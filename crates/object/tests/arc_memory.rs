//! The ARC's budget, measured from the process (its resident memory), not from the cache's
//! own counter: a working set six times the budget is written, then read at random, and the
//! resident memory may grow, from the test's start, by no more than the budget, the dirty
//! data the txgs may hold (open and syncing), and a stated allowance for everything else.
//! Without the budget the reads would keep the whole working set (768 MiB) resident.
//!
//! Alone in its test binary, so no other test allocates beside it; devices are files in a
//! temporary directory opened without O_DIRECT (the kernel's page cache is not the
//! process's memory). The binary allocates as `tank` does: mimalloc, with freed memory kept
//! mapped (`purge_delay` -1, see `keep_freed_memory` in the binary), so the resident memory
//! measured is the peak the allocator ever held. The allowance is below the budget: an ARC
//! that held twice its budget fails the test.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tank_device::{DeviceRef, FileDevice, FileDeviceOptions};
use tank_object::arc::AdaptiveCache;
use tank_object::{ObjectStore, ROOT_OBJSET};
use tank_pool::{CreateOptions, Pool, PoolSpec, TxgTunables};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// As the `tank` binary sets it before any thread starts.
#[allow(unsafe_code)]
fn keep_freed_memory() {
    // SAFETY: mi_option_set only stores an option value; the value is one mimalloc
    // documents (-1: never purge). 15 is mi_option_purge_delay.
    unsafe { libmimalloc_sys::mi_option_set(15, -1) };
}

/// The ARC's budget in this test: large enough that an ARC holding twice as much stands out
/// from everything else the process holds.
const BUDGET: u64 = 128 << 20;
const WORKING_SET: u64 = 6 * BUDGET;
const RECORD: u32 = 128 << 10;
/// Dirty data a txg may hold; an open and a syncing txg may both be full.
const DIRTY_MAX: u64 = 32 << 20;
/// What may be resident beyond the budget and the dirty data: decoded tree nodes, device
/// queues, read-ahead (at most an eighth of the budget), compression buffers, the
/// allocator's slack. Below the budget, so that an ARC of twice its budget fails.
const ALLOWANCE: u64 = 96 << 20;

fn vm_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .expect("VmRSS in /proc/self/status")
        * 1024
}

#[test]
fn resident_memory_stays_within_the_arc_budget_plus_the_allowance() {
    keep_freed_memory();
    let start = vm_rss();
    let dir = tempfile::tempdir().unwrap();
    let mut devs: HashMap<String, DeviceRef> = HashMap::new();
    for i in 0..2 {
        let path = dir.path().join(format!("d{i}"));
        let dev = FileDevice::open(
            &path,
            &FileDeviceOptions {
                create_size: Some(WORKING_SET + (256 << 20)),
                ..Default::default()
            },
        )
        .unwrap();
        devs.insert(path.to_string_lossy().into_owned(), Arc::new(dev));
    }
    let names: Vec<String> = devs.keys().cloned().collect();
    let spec = PoolSpec::parse(&names, true).unwrap();
    // Small txgs, so the write phase leaves little dirty data in the allocator.
    let tunables = TxgTunables {
        dirty_max: DIRTY_MAX,
        dirty_sync: 8 << 20,
        timeout: Duration::from_secs(3600),
    };
    let opts = CreateOptions {
        ashift: 12,
        force: false,
        tunables,
        ..Default::default()
    };
    let (pool, _) = Pool::create("arcmem", &spec, &devs, &opts).unwrap();
    let arc = Arc::new(AdaptiveCache::new(BUDGET));
    let store = ObjectStore::open_with_arc(pool.clone(), arc.clone()).unwrap();
    let os = store.objset(ROOT_OBJSET).unwrap();
    let id = {
        let tx = store.begin(0).unwrap();
        os.create_object(&tx, 1, RECORD).unwrap()
    };
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut chunk = vec![0u8; 4 << 20];
    let mut off = 0;
    while off < WORKING_SET {
        for b in chunk.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b.copy_from_slice(&x.to_le_bytes()[..b.len()]);
        }
        let tx = store.begin(chunk.len() as u64).unwrap();
        os.write(&tx, id, off, &chunk).unwrap();
        drop(tx);
        off += chunk.len() as u64;
    }
    drop(chunk);
    store.sync().unwrap();
    os.evict_clean();
    let before = vm_rss();
    let mut peak = before;
    let records = WORKING_SET / u64::from(RECORD);
    // Every record about twice, in random order.
    for i in 0..records * 2 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let r = x % records;
        let got = os.read(id, r * u64::from(RECORD), RECORD as usize).unwrap();
        assert_eq!(got.len(), RECORD as usize);
        if i % 64 == 0 {
            peak = peak.max(vm_rss());
        }
    }
    peak = peak.max(vm_rss());
    let grown = peak.saturating_sub(start);
    let bound = BUDGET + 2 * DIRTY_MAX + ALLOWANCE;
    eprintln!(
        "resident memory grew by {} MiB from the start ({} MiB after the writes; bound {} MiB: \
         budget {} MiB, dirty data 2 x {} MiB, allowance {} MiB)",
        grown >> 20,
        before.saturating_sub(start) >> 20,
        bound >> 20,
        BUDGET >> 20,
        DIRTY_MAX >> 20,
        ALLOWANCE >> 20
    );
    assert!(
        grown <= bound,
        "resident memory grew by {} MiB (bound {} MiB: budget {} MiB, dirty data 2 x {} MiB, \
         allowance {} MiB)",
        grown >> 20,
        bound >> 20,
        BUDGET >> 20,
        DIRTY_MAX >> 20,
        ALLOWANCE >> 20
    );
    assert!(
        arc.stats().evict_count > 0,
        "the working set did not turn the ARC over"
    );
    drop(os);
    drop(store);
    pool.export().unwrap();
}
