//! The scrub (ZFS's dsl_scan, scrub function): read every allocated block of the pool, every
//! copy and all parity, verify it against the checksum its parent holds, and repair what is
//! bad from the redundancy.
//!
//! # Theory of operation
//! A scrub works through the pool in *regions* of block addresses, ordered by the first DVA
//! of each block (vdev, offset), as OpenZFS's sorted scan does:
//! 1. **Walk.** Starting from the committed state (the pool's own metadata blocks, every
//!    object set of the committed objset table, and the snapshot roots the layer above
//!    lists through [`ScanRoots`]), every tree node is read and scrubbed on the spot (it has
//!    to be read to find its children), and every data block whose address lies at or after
//!    the region's cursor is collected. A node seen under an earlier root is not walked
//!    again (snapshots and clones share subtrees); a node is known by its address and its
//!    birth txg, since a node written later in space freed meanwhile has the same address
//!    and other children. The collection is bounded: past
//!    `region_budget` entries the region's end moves down to what fits.
//! 2. **Issue.** The collected blocks are sorted by address, deduplicated, and scrubbed in
//!    that order by several workers, in chunks, through the devices' scan I/O class (user
//!    reads go first). The cursor advances over the longest prefix of finished chunks.
//! 3. The next region starts at the previous region's end, until a walk finds the end of
//!    the address space.
//!
//! A scrub may be held to a rate (`SCRUB_MAX_RATE`, the `scrub_max_rate` tunable, bytes per
//! second; 0 for none): the issuing workers sleep after a chunk while the region's bytes
//! are ahead of that rate, so a scrub of a busy home pool can be kept out of the way. A
//! resilver is never held back (it restores redundancy).
//!
//! # Blocks that change under the scan
//! The pool keeps running. While a scan runs, the allocator remembers every extent freed
//! and the txg it was freed in ([`tank_block::SpaceAllocator::watch_frees`]).
//! `BlockStore::scrub` neither reports nor rewrites a block freed meanwhile (its space may
//! already hold another block); a block born after the last free at its address is another
//! block in reused space, and is scrubbed as any other.
//!
//! A walk starts from the committed roots, and a sync may free the nodes it is reading (it
//! frees them before it publishes the new roots). A freed node whose bytes still verify
//! against its pointer is walked all the same: its space is not reused for `DEFER_TXGS`
//! txgs, every block below it that is still live is below the new root too, and the issue
//! skips those freed since. Only a node whose space was overwritten is lost to the walk;
//! the walk then re-walks that object set from its new committed root (waiting for a sync
//! to publish it, `ROOT_WAIT`), entering only what it has not walked: nodes are known by
//! address and birth txg, so a node written later in reused space is walked too. A region
//! whose walks keep losing nodes (`MAX_REWALKS`) is collected again, never issued with
//! blocks missing.
//!
//! These rules are what keeps a busy pool's scan whole: before them a node freed by a sync
//! ended its subtree's walk, a re-walk from the same root skipped it as seen, regions were
//! issued without the blocks below it, and a resilver called a device whole that lacked
//! them. Blocks born after the scrub started are not scrubbed (they were just written), as
//! in ZFS.
//!
//! # Persistence
//! The state (phase, cursor, counters) lives in the meta object set at `(2, 20, 0)` and is
//! written by the next txg whenever it changed, so a scrub survives export, import and a
//! crash: it resumes from the last persisted cursor (the chunks done after it are redone).
//! Permanent errors (blocks no copy of which could be read) are kept by object, as ZFS's
//! error log: `(2, 21, n)` from the last finished scrub, `(2, 22, n)` from the running one;
//! a finished scrub replaces the first with the second, so damage that is gone (deleted or
//! overwritten) leaves the list.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Instant;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tank_block::{BlockPtr, BlockStore, ScrubOutcome};

use crate::store::ObjectStore;
use crate::tree::{CowTree, Key, NodeStore, ScanVisitor, TreeError, WriteKind};
use crate::ObjectError;

/// Object of the meta object set holding the scan state and the error logs.
pub const SCAN_OBJ: u64 = 2;
pub const KIND_SCAN_STATE: u8 = 20;
pub const KIND_ERRLOG_LAST: u8 = 21;
pub const KIND_ERRLOG_SCAN: u8 = 22;
/// Error log entries per item (16 bytes each: id u64, object u64).
const ERRLOG_PER_ITEM: usize = 128;
/// Most entries an error log keeps (further damage is still counted).
const ERRLOG_MAX: usize = 10_000;
/// Id under which the pool's own metadata blocks are reported.
pub const POOL_META_ID: u64 = u64::MAX;
/// Object number reported for a damaged tree node (its objects are unknown).
pub const METADATA_OBJECT: u64 = u64::MAX;
/// Default bound on the blocks collected per region (about 150 bytes of memory each).
pub const DEFAULT_REGION_BUDGET: usize = 1 << 20;
const WORKERS: usize = 8;
const CHUNK: usize = 16;

/// Bytes per second a scrub may issue, every pool together (0: as fast as the devices
/// allow). A tunable (`scrub_max_rate`).
pub static SCRUB_MAX_RATE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Holds a region's issue to `SCRUB_MAX_RATE`: (start, bytes issued).
struct Pace(parking_lot::Mutex<(Instant, u64)>);

impl Pace {
    /// Counts `bytes` issued, and sleeps while the region is ahead of the rate (in slices,
    /// so a stop is seen within a tenth of a second).
    fn account(&self, bytes: u64, stop: &AtomicBool) {
        let cap = SCRUB_MAX_RATE.load(Ordering::Relaxed);
        if cap == 0 {
            return;
        }
        let due = {
            let mut p = self.0.lock();
            p.1 += bytes;
            p.0 + std::time::Duration::from_secs_f64(p.1 as f64 / cap as f64)
        };
        while Instant::now() < due && !stop.load(Ordering::Acquire) {
            std::thread::sleep((due - Instant::now()).min(std::time::Duration::from_millis(100)));
        }
    }
}
/// Re-walks of one object set whose nodes keep being freed under the walk; past them the
/// region is collected again after `REWALK_PAUSE`.
const MAX_REWALKS: usize = 16;
const REWALK_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);
/// How long a re-walk waits for a sync that freed nodes to publish its new root.
const ROOT_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Roots of trees that are not in the objset table (snapshots), listed by the layer above.
pub trait ScanRoots: Send + Sync {
    /// `(id, root)` of every committed snapshot tree. `id` names the tree in the error log.
    fn scan_roots(&self) -> Vec<(u64, Option<BlockPtr>)>;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ScanPhase {
    #[default]
    None,
    Scanning,
    Finished,
    Canceled,
}

/// The persistent state of the last or running scan.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
#[serde(default)]
pub struct ScanState {
    pub func: String,
    pub phase: ScanPhase,
    pub paused: bool,
    /// Seconds since 1970.
    pub start_time: u64,
    pub end_time: u64,
    /// Blocks born after this txg are not scrubbed.
    pub start_txg: u64,
    /// Address (vdev, offset) before which every block was issued.
    pub cursor: (u32, u64),
    /// Allocated bytes when the scan started.
    pub to_examine: u64,
    /// Bytes the walks found (allocated sizes).
    pub examined: u64,
    /// Bytes scrubbed (allocated sizes).
    pub issued: u64,
    pub repaired: u64,
    /// Blocks no copy of which could be read or rebuilt.
    pub errors: u64,
    pub blocks: u64,
    /// Seconds spent scanning, pauses excluded (up to the last persisted point).
    pub active_secs: f64,
    pub regions: u64,
    /// Resilver: blocks born before this txg are not issued (nor walked).
    pub min_birth: u64,
    /// Resilver: only blocks with a copy on these top-level vdevs are issued (all if empty).
    pub vdevs: Vec<u32>,
    /// Resilver: the leaves rebuilt, (guid, first txg, last txg) they lacked.
    pub leaves: Vec<(u64, u64, u64)>,
    /// Resilver: the rebuild is done and a pass is verifying it.
    pub verifying: bool,
    /// Resilver: bytes issued and repaired by the rebuild pass.
    pub rebuilt: u64,
    pub rebuilt_repaired: u64,
    /// Resilver: bytes the verifying pass read, and what it still had to rewrite (0 when
    /// the rebuild was complete).
    pub verified: u64,
    pub verify_repaired: u64,
    /// Verifying passes run (another runs when one still had to rewrite something).
    pub verify_passes: u32,
}

/// What `status` shows: the state plus the live figures.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScanStatus {
    #[serde(flatten)]
    pub state: ScanState,
    /// Whether the scan thread is working now.
    pub running: bool,
    /// Bytes scrubbed per second while scanning.
    pub rate: f64,
    pub eta_secs: Option<f64>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Counters {
    issued: u64,
    repaired: u64,
    errors: u64,
    blocks: u64,
}

impl Counters {
    fn add_outcome(&mut self, bp: &BlockPtr, o: &ScrubOutcome) {
        if o.freed {
            return;
        }
        self.issued += allocated(bp);
        self.repaired += o.repaired_bytes;
        self.blocks += 1;
        if o.unrecoverable {
            self.errors += 1;
        }
    }
    fn add(&mut self, o: &Counters) {
        self.issued += o.issued;
        self.repaired += o.repaired;
        self.errors += o.errors;
        self.blocks += o.blocks;
    }
}

fn allocated(bp: &BlockPtr) -> u64 {
    bp.dvas().map(|d| d.asize).sum()
}

fn address(bp: &BlockPtr) -> (u32, u64) {
    bp.dvas()
        .next()
        .map_or((u32::MAX, u64::MAX), |d| (d.vdev, d.offset))
}

/// Objects with permanent errors: (tree id, object).
type ErrLog = BTreeSet<(u64, u64)>;

/// The scan of one pool; owned by its [`ObjectStore`].
#[derive(Default)]
pub struct Scanner {
    state: Mutex<ScanState>,
    /// Error logs: from the last finished scan, and from the running one.
    errlog: Mutex<(ErrLog, ErrLog)>,
    /// The state or the logs changed since they were last written.
    dirty: AtomicBool,
    stop: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Live figures: when the thread (re)started, the issued bytes then, and the counters
    /// of chunks finished beyond the cursor.
    live: Mutex<(Option<Instant>, u64, Counters)>,
    roots: Mutex<Option<Arc<dyn ScanRoots>>>,
    region_budget: AtomicUsize,
    /// Bytes rewritten on the resilvered devices when the current verifying pass began.
    verify_base: Mutex<u64>,
}

impl std::fmt::Debug for Scanner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scanner")
            .field("state", &*self.state.lock())
            .finish_non_exhaustive()
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Scanner {
    pub(crate) fn new() -> Self {
        let s = Self::default();
        s.region_budget
            .store(DEFAULT_REGION_BUDGET, Ordering::Relaxed);
        s
    }

    /// Loads the persisted state from the meta object set.
    pub(crate) fn load(&self, store: &ObjectStore) -> Result<(), ObjectError> {
        let meta = store.objset(crate::META_OBJSET)?;
        if let Some(raw) = meta.get_item(SCAN_OBJ, KIND_SCAN_STATE, 0)? {
            *self.state.lock() = serde_json::from_slice(&raw)
                .map_err(|e| ObjectError::Corrupt(format!("scan state: {e}")))?;
        }
        let read_log = |kind| -> Result<ErrLog, ObjectError> {
            let mut set = BTreeSet::new();
            for (_, raw) in meta.items(SCAN_OBJ, kind, 0, u64::MAX, usize::MAX)? {
                for e in raw.chunks_exact(16) {
                    let w = |o: usize| u64::from_le_bytes(e[o..o + 8].try_into().expect("8"));
                    set.insert((w(0), w(8)));
                }
            }
            Ok(set)
        };
        *self.errlog.lock() = (read_log(KIND_ERRLOG_LAST)?, read_log(KIND_ERRLOG_SCAN)?);
        // A resilver in progress: its leaves lack what they lacked when it started (their
        // uberblocks are current again, so import alone cannot tell).
        let st = self.state.lock().clone();
        if st.func == "resilver" && st.phase == ScanPhase::Scanning {
            for (_, leaf) in store.pool().leaf_list() {
                if let Some(&(_, first, last)) = st.leaves.iter().find(|l| l.0 == leaf.guid()) {
                    if st.verifying {
                        leaf.rebuilt();
                    } else {
                        leaf.set_dtl(Some((first, last)));
                    }
                }
            }
        }
        Ok(())
    }

    pub(crate) fn is_dirty(&self) -> bool {
        self.dirty.load(Ordering::Acquire)
    }

    /// Writes the state and the error logs into the meta object set (syncing context).
    pub(crate) fn sync(&self, store: &ObjectStore) -> Result<(), ObjectError> {
        if !self.dirty.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        let meta = store.objset(crate::META_OBJSET)?;
        let state = serde_json::to_vec(&*self.state.lock()).expect("serializable");
        meta.put_item_syncing(SCAN_OBJ, KIND_SCAN_STATE, 0, &state)?;
        let (last, scan) = self.errlog.lock().clone();
        for (kind, set) in [(KIND_ERRLOG_LAST, last), (KIND_ERRLOG_SCAN, scan)] {
            let old = meta.items(SCAN_OBJ, kind, 0, u64::MAX, usize::MAX)?.len();
            let entries: Vec<(u64, u64)> = set.into_iter().collect();
            let chunks: Vec<&[(u64, u64)]> = entries.chunks(ERRLOG_PER_ITEM).collect();
            for (i, chunk) in chunks.iter().enumerate() {
                let mut raw = Vec::with_capacity(chunk.len() * 16);
                for (id, obj) in *chunk {
                    raw.extend_from_slice(&id.to_le_bytes());
                    raw.extend_from_slice(&obj.to_le_bytes());
                }
                meta.put_item_syncing(SCAN_OBJ, kind, i as u64, &raw)?;
            }
            for i in chunks.len()..old {
                meta.remove_item_syncing(SCAN_OBJ, kind, i as u64)?;
            }
        }
        Ok(())
    }

    fn mark(&self, pool: &tank_pool::Pool) {
        self.dirty.store(true, Ordering::Release);
        pool.note_change();
    }

    fn running(&self) -> bool {
        self.thread
            .lock()
            .as_ref()
            .is_some_and(|h| !h.is_finished())
    }

    /// Stops the thread (if any) and waits for it.
    fn join(&self) {
        self.stop.store(true, Ordering::Release);
        let handle = self.thread.lock().take();
        if let Some(h) = handle {
            let _ = h.join();
        }
        self.stop.store(false, Ordering::Release);
    }

    pub fn status(&self) -> ScanStatus {
        let state = self.state.lock().clone();
        let (since, issued_then, extra) = *self.live.lock();
        let running = self.running();
        let mut shown = state.clone();
        shown.issued += extra.issued;
        shown.repaired += extra.repaired;
        shown.errors += extra.errors;
        shown.blocks += extra.blocks;
        let rate = match (running, since) {
            (true, Some(t)) if t.elapsed().as_secs_f64() > 0.0 => {
                shown.issued.saturating_sub(issued_then) as f64 / t.elapsed().as_secs_f64()
            }
            _ if state.active_secs > 0.0 => state.issued as f64 / state.active_secs,
            _ => 0.0,
        };
        let eta_secs = (state.phase == ScanPhase::Scanning && rate > 0.0)
            .then(|| shown.to_examine.saturating_sub(shown.issued) as f64 / rate);
        ScanStatus {
            state: shown,
            running,
            rate,
            eta_secs,
        }
    }

    /// Objects with permanent errors: from the last finished scan and the running one.
    pub fn errors(&self) -> Vec<(u64, u64)> {
        let log = self.errlog.lock();
        log.0.union(&log.1).copied().collect()
    }
}

impl ObjectStore {
    /// Registers the layer above's snapshot roots for the scrub.
    pub fn set_scan_roots(&self, roots: Arc<dyn ScanRoots>) {
        *self.scanner.roots.lock() = Some(roots);
    }

    /// Sets how many blocks a scan region may collect (tests use small regions).
    pub fn set_scan_region_budget(&self, blocks: usize) {
        self.scanner
            .region_budget
            .store(blocks.max(1), Ordering::Relaxed);
    }

    pub fn scan_status(&self) -> ScanStatus {
        self.scanner.status()
    }

    pub fn scan_errors(&self) -> Vec<(u64, u64)> {
        self.scanner.errors()
    }

    /// Starts a scrub, or resumes a paused one.
    pub fn scrub_start(self: &Arc<Self>) -> Result<(), ObjectError> {
        self.pool().wait_synced()?;
        {
            let mut st = self.scanner.state.lock();
            if st.phase == ScanPhase::Scanning && st.func == "resilver" {
                return Err(ObjectError::Busy("currently resilvering".into()));
            }
            if st.phase == ScanPhase::Scanning && !st.paused {
                return Err(ObjectError::Busy(
                    "currently scrubbing; use 'scrub -s' to cancel, 'scrub -p' to pause".into(),
                ));
            }
            if st.phase == ScanPhase::Scanning {
                st.paused = false;
            } else {
                *st = ScanState {
                    func: "scrub".into(),
                    phase: ScanPhase::Scanning,
                    start_time: now_secs(),
                    start_txg: self.pool().synced_txg(),
                    to_examine: self.pool().space().allocated,
                    ..ScanState::default()
                };
                let mut log = self.scanner.errlog.lock();
                log.1.clear();
            }
        }
        self.scanner.mark(self.pool());
        self.pool().log_history("scrub started");
        self.pool()
            .events
            .post("sysevent.fs.zfs.scrub_start", None, String::new());
        self.spawn_scan();
        Ok(())
    }

    /// Pauses the running scrub (it resumes with [`ObjectStore::scrub_start`]).
    pub fn scrub_pause(&self) -> Result<(), ObjectError> {
        self.scan_must_be_active()?;
        self.scanner.join();
        self.scanner.state.lock().paused = true;
        self.scanner.mark(self.pool());
        self.pool()
            .events
            .post("sysevent.fs.zfs.scrub_paused", None, String::new());
        Ok(())
    }

    /// Cancels the running or paused scrub.
    pub fn scrub_cancel(&self) -> Result<(), ObjectError> {
        self.scan_must_be_active()?;
        self.scanner.join();
        {
            let mut st = self.scanner.state.lock();
            st.phase = ScanPhase::Canceled;
            st.paused = false;
            st.end_time = now_secs();
        }
        self.blocks().alloc.lock().unwatch_frees();
        self.scanner.mark(self.pool());
        self.pool().log_history("scrub canceled");
        self.pool()
            .events
            .post("sysevent.fs.zfs.scrub_abort", None, String::new());
        Ok(())
    }

    fn scan_must_be_active(&self) -> Result<(), ObjectError> {
        let st = self.scanner.state.lock();
        if st.phase != ScanPhase::Scanning {
            return Err(ObjectError::Invalid("there is no active scrub".into()));
        }
        if st.func == "resilver" {
            return Err(ObjectError::Busy(
                "a resilver is running (it restores redundancy and cannot be paused or canceled)"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Waits until the scan thread stops (finished, paused, canceled or failed).
    pub fn scan_wait(&self) {
        let handle = self.scanner.thread.lock().take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }

    /// Stops the scan thread without changing the state (before an export: the scan
    /// resumes at the next import).
    pub fn scan_suspend(&self) {
        if self.scanner.running() {
            self.scanner.join();
            self.scanner.mark(self.pool());
        }
    }

    /// Starts the scan thread if a scan is active and not paused (after import), or a
    /// resilver if a device lacks txgs and none runs.
    pub fn scan_resume(self: &Arc<Self>) {
        // Hot spares take the place of devices that failed while the pool was away.
        let _ = self.pool().activate_spares();
        let st = self.scanner.state.lock().clone();
        let resilvering = st.phase == ScanPhase::Scanning && st.func == "resilver";
        if !resilvering && !self.lacking_leaves().is_empty() {
            let _ = self.resilver_start();
        } else if st.phase == ScanPhase::Scanning && !st.paused && !self.scanner.running() {
            self.spawn_scan();
        }
    }

    /// Leaves that lack txgs: (guid, first, last, top-level vdev).
    fn lacking_leaves(&self) -> Vec<(u64, u64, u64, u32)> {
        self.pool()
            .leaf_list()
            .into_iter()
            .filter_map(|(top, leaf)| leaf.dtl().map(|(a, b)| (leaf.guid(), a, b, top)))
            .collect()
    }

    /// Starts a resilver of every device that lacks txgs (a running scrub gives way; a
    /// running resilver starts over with the new devices too). Returns false when no device
    /// needs one.
    pub fn resilver_start(self: &Arc<Self>) -> Result<bool, ObjectError> {
        let lacking = self.lacking_leaves();
        if lacking.is_empty() {
            return Ok(false);
        }
        self.scanner.join();
        let mut vdevs: Vec<u32> = lacking.iter().map(|l| l.3).collect();
        vdevs.sort_unstable();
        vdevs.dedup();
        let to_examine = {
            let alloc = self.blocks().alloc.lock();
            vdevs
                .iter()
                .filter_map(|v| alloc.vdev(*v).map(|s| s.allocated()))
                .sum()
        };
        {
            let mut st = self.scanner.state.lock();
            *st = ScanState {
                func: "resilver".into(),
                phase: ScanPhase::Scanning,
                start_time: now_secs(),
                // Blocks born after the last txg a device lacks reached it as they were
                // written (a replaced device's range ends at the txg open when it came in):
                // neither rebuilt nor verified, as ZFS's resilver stops at its max txg.
                start_txg: lacking.iter().map(|l| l.2).max().unwrap_or(u64::MAX),
                to_examine,
                min_birth: lacking.iter().map(|l| l.1).min().unwrap_or(0),
                vdevs,
                leaves: lacking.iter().map(|l| (l.0, l.1, l.2)).collect(),
                ..ScanState::default()
            };
        }
        self.scanner.mark(self.pool());
        self.pool().log_history("resilver started");
        let names: Vec<String> = self
            .pool()
            .leaf_list()
            .iter()
            .filter(|(_, l)| l.dtl().is_some())
            .map(|(_, l)| l.path())
            .collect();
        self.pool().events.post(
            "sysevent.fs.zfs.resilver_start",
            None,
            format!("devices=\"{}\"", names.join(" ")),
        );
        self.spawn_scan();
        Ok(true)
    }

    fn spawn_scan(self: &Arc<Self>) {
        self.scanner.join();
        let weak = Arc::downgrade(self);
        let handle = std::thread::Builder::new()
            .name("scan".into())
            .spawn(move || scan_thread(weak))
            .expect("spawn scan thread");
        *self.scanner.thread.lock() = Some(handle);
    }
}

fn scan_thread(weak: Weak<ObjectStore>) {
    let Some(store) = weak.upgrade() else { return };
    let scanner = &store.scanner;
    store.blocks().alloc.lock().watch_frees();
    let issued = scanner.state.lock().issued;
    // A verifying pass resumed (after an import): its base is the counters as they are now.
    {
        let st = scanner.state.lock();
        if st.verifying {
            *scanner.verify_base.lock() = resilvered_bytes(&store, &st);
        }
    }
    *scanner.live.lock() = (Some(Instant::now()), issued, Counters::default());
    let mut last = Instant::now();
    let account = |last: &mut Instant| {
        let mut st = scanner.state.lock();
        st.active_secs += last.elapsed().as_secs_f64();
        *last = Instant::now();
    };
    loop {
        if scanner.stop.load(Ordering::Acquire) || store.pool().is_closed() {
            break;
        }
        let (cursor, filter) = {
            let st = scanner.state.lock();
            (
                st.cursor,
                Filter {
                    max_txg: st.start_txg,
                    min_birth: st.min_birth,
                    vdevs: st.vdevs.clone(),
                },
            )
        };
        let budget = scanner.region_budget.load(Ordering::Relaxed);
        let region = match collect(&store, cursor, budget, filter) {
            Ok(r) => r,
            Err(e) => {
                if !store.pool().is_closed() {
                    report_failure(&format!("scrub walk failed: {e}"));
                }
                break;
            }
        };
        if scanner.stop.load(Ordering::Acquire) {
            break;
        }
        if !region.complete {
            // Nodes kept being freed under the walk: collected again after a pause, never
            // issued with blocks missing.
            std::thread::sleep(REWALK_PAUSE);
            continue;
        }
        {
            let mut st = scanner.state.lock();
            st.examined += region.examined;
            st.issued += region.nodes.issued;
            st.repaired += region.nodes.repaired;
            st.errors += region.nodes.errors;
            st.blocks += region.nodes.blocks;
            st.regions += 1;
        }
        record_errors(&store, &region.errors);
        scanner.mark(store.pool());
        if !issue(&store, &region) {
            break;
        }
        account(&mut last);
        let mut st = scanner.state.lock();
        match region.end {
            Some(end) => st.cursor = end,
            None if st.func == "resilver" && next_verify_pass(&store, &mut st) => {}
            None => {
                st.phase = ScanPhase::Finished;
                st.end_time = now_secs();
                st.cursor = (u32::MAX, u64::MAX);
                drop(st);
                let mut log = scanner.errlog.lock();
                log.0 = std::mem::take(&mut log.1);
                drop(log);
                store.blocks().alloc.lock().unwatch_frees();
                let st = scanner.state.lock().clone();
                if st.func == "resilver" {
                    finish_resilver(&store, &st);
                    scanner.mark(store.pool());
                    break;
                }
                let summary = format!("repaired={} errors={}", st.repaired, st.errors);
                store.pool().log_history(&format!(
                    "scrub done: repaired {} bytes, {} errors",
                    st.repaired, st.errors
                ));
                store
                    .pool()
                    .events
                    .post("sysevent.fs.zfs.scrub_finish", None, summary);
                scanner.mark(store.pool());
                break;
            }
        }
        drop(st);
        scanner.mark(store.pool());
    }
    account(&mut last);
    scanner.live.lock().2 = Counters::default();
    scanner.mark(store.pool());
}

/// At the end of a resilver pass: after the rebuild, and after a verifying pass that still
/// had to rewrite something, starts a verifying pass over the same blocks; returns false
/// when the resilver is done.
fn next_verify_pass(store: &ObjectStore, st: &mut ScanState) -> bool {
    if st.verifying {
        st.verified = st.issued - st.rebuilt;
        // What the pass rewrote on the resilvered devices: other devices' faults (a read
        // error, a flipped bit) say nothing about the rebuild.
        st.verify_repaired =
            resilvered_bytes(store, st).saturating_sub(*store.scanner.verify_base.lock());
        if st.verify_repaired == 0 || st.verify_passes >= 3 {
            return false;
        }
    } else {
        st.verifying = true;
        // The rebuilt leaves are read like any other from now on.
        for (_, leaf) in store.pool().leaf_list() {
            if st.leaves.iter().any(|l| l.0 == leaf.guid()) {
                leaf.rebuilt();
            }
        }
    }
    st.verify_passes += u32::from(st.verifying);
    st.rebuilt = st.issued;
    st.rebuilt_repaired = st.repaired;
    st.cursor = (0, 0);
    *store.scanner.verify_base.lock() = resilvered_bytes(store, st);
    true
}

/// Bytes rewritten so far on the devices a resilver rebuilds (their repair counters).
fn resilvered_bytes(store: &ObjectStore, st: &ScanState) -> u64 {
    store
        .pool()
        .leaf_list()
        .iter()
        .filter(|(_, l)| st.leaves.iter().any(|r| r.0 == l.guid()))
        .map(|(_, l)| l.stats.snapshot().repaired_bytes)
        .sum()
}

/// Marks the resilvered leaves whole (when the last verifying pass found everything in
/// place) and reports.
fn finish_resilver(store: &ObjectStore, st: &ScanState) {
    let whole = st.verify_repaired == 0 && st.errors == 0;
    for (_, leaf) in store.pool().leaf_list() {
        if whole && st.leaves.iter().any(|l| l.0 == leaf.guid()) {
            leaf.set_resilvered();
        }
    }
    if whole {
        // The labels stop recording what the devices lacked.
        if let Err(e) = store.pool().resilvered() {
            report_failure(&format!("cannot record the finished resilver: {e}"));
        }
    }
    store.pool().log_history(&format!(
        "resilver done: rebuilt {} bytes, verified {} bytes ({} rewritten by verification), {} errors",
        st.rebuilt_repaired, st.verified, st.verify_repaired, st.errors
    ));
    store.pool().events.post(
        "sysevent.fs.zfs.resilver_finish",
        None,
        format!(
            "resilvered={} verified={} verify_rewrote={} errors={} whole={whole}",
            st.rebuilt_repaired, st.verified, st.verify_repaired, st.errors
        ),
    );
}

/// A scan failure with no caller to return it to goes to stderr, as the sync thread's do.
fn report_failure(msg: &str) {
    eprintln!("tank: {msg}");
}

impl ObjectStore {
    /// A read found no good copy of a block of `object`: logged as the scrub logs what it
    /// finds (the next finished scrub keeps it only if the damage is still there).
    pub(crate) fn record_read_error(&self, objset: u64, object: u64) {
        let new = self.scanner.errlog.lock().1.insert((objset, object));
        if new {
            self.pool().events.post(
                "ereport.fs.zfs.data",
                None,
                format!("tree={objset:#x} object={object:#x} found_by=read"),
            );
            self.scanner.mark(self.pool());
        }
    }
}

/// Logs permanent errors (by tree and object) and posts them as events.
fn record_errors(store: &ObjectStore, errors: &[(u64, u64)]) {
    if errors.is_empty() {
        return;
    }
    let mut log = store.scanner.errlog.lock();
    for &(tree, object) in errors {
        if log.1.len() < ERRLOG_MAX {
            log.1.insert((tree, object));
        }
        store.pool().events.post(
            "ereport.fs.zfs.data",
            None,
            format!("tree={tree:#x} object={object:#x}"),
        );
    }
}

struct Entry {
    bp: BlockPtr,
    id: u64,
    object: u64,
}

struct Region {
    entries: Vec<Entry>,
    /// Every object set was walked to the end (see `MAX_REWALKS`).
    complete: bool,
    /// Where the next region starts; `None` when this one reached the end.
    end: Option<(u32, u64)>,
    examined: u64,
    /// What scrubbing the nodes of this region during the walk found.
    nodes: Counters,
    errors: Vec<(u64, u64)>,
}

/// The walk's node reader and collector (see the module documentation, step 1).
/// Which blocks a scan issues.
struct Filter {
    /// Blocks born later are skipped (the scrub's start).
    max_txg: u64,
    /// Blocks born earlier are skipped, and subtrees of nodes born earlier are not walked.
    min_birth: u64,
    /// Only blocks with a copy on these top-level vdevs (all when empty).
    vdevs: Vec<u32>,
}

impl Filter {
    fn wants(&self, bp: &BlockPtr) -> bool {
        bp.birth_txg <= self.max_txg
            && bp.birth_txg >= self.min_birth
            && (self.vdevs.is_empty() || bp.dvas().any(|d| self.vdevs.contains(&d.vdev)))
    }
}

struct Collector<'a> {
    blocks: &'a BlockStore,
    stop: &'a AtomicBool,
    cursor: (u32, u64),
    filter: Filter,
    budget: usize,
    inner: Mutex<CollectState>,
}

#[derive(Default)]
struct CollectState {
    limit: Option<(u32, u64)>,
    entries: Vec<Entry>,
    /// Nodes entered: address and birth txg (see the module documentation).
    seen: HashSet<((u32, u64), u64)>,
    id: u64,
    freed_hit: bool,
    /// The last node read was freed under the walk (not an error).
    last_freed: bool,
    examined: u64,
    nodes: Counters,
    errors: Vec<(u64, u64)>,
}

impl NodeStore for Collector<'_> {
    fn read_block(&self, bp: &BlockPtr) -> Result<Vec<u8>, TreeError> {
        let (outcome, data) = self.blocks.scrub(bp);
        let mut st = self.inner.lock();
        // A node freed under the walk is walked still while its bytes verify (a sync freed
        // it; its space is not reused before `DEFER_TXGS` more txgs): the blocks below it
        // that are still live are in the newer tree too, and the issue skips the others.
        st.last_freed = outcome.freed && data.is_none();
        if st.last_freed {
            st.freed_hit = true;
            // Not walked: a walk from a root that still holds it enters it again.
            st.seen.remove(&(address(bp), bp.birth_txg));
            return Err(TreeError::Store("freed during the scan".into()));
        }
        // Counted once, in its region, and only when the scan is for it (a node written
        // after a resilver's last txg is read to walk it, not to rebuild it).
        if !outcome.freed && self.filter.wants(bp) && self.in_region(&st, address(bp)) {
            st.examined += allocated(bp);
            st.nodes.add_outcome(bp, &outcome);
        }
        drop(st);
        let data = data.ok_or_else(|| TreeError::Store("no copy could be read".into()))?;
        bp.compression
            .decompress_owned(data, bp.lsize as usize)
            .map_err(|e| TreeError::Store(e.to_string()))
    }
    fn write_block(&self, _data: &[u8], _kind: WriteKind) -> Result<BlockPtr, TreeError> {
        Err(TreeError::Store("the scan does not write trees".into()))
    }
    fn free_block(&self, _bp: &BlockPtr) -> Result<(), TreeError> {
        Err(TreeError::Store("the scan does not write trees".into()))
    }
}

struct Visit<'a, 'b>(&'a Collector<'b>);

impl ScanVisitor for Visit<'_, '_> {
    fn enter(&mut self, bp: &BlockPtr) -> bool {
        // A pause or cancel ends the walk early; the region is then not issued at all.
        // Copy-on-write: nothing below a node is newer than the node.
        !self.0.stop.load(Ordering::Acquire)
            && bp.birth_txg >= self.0.filter.min_birth
            && self.0.inner.lock().seen.insert((address(bp), bp.birth_txg))
    }

    fn data(&mut self, key: &Key, bp: &BlockPtr) {
        let c = self.0;
        if !c.filter.wants(bp) {
            return;
        }
        let mut st = c.inner.lock();
        c.push(&mut st, key.obj, bp);
    }

    fn unreadable(&mut self, _bp: &BlockPtr, _err: &TreeError) {
        let mut st = self.0.inner.lock();
        if !st.last_freed {
            // A node none of whose copies could be read: a permanent error in that tree.
            let id = st.id;
            st.errors.push((id, METADATA_OBJECT));
        }
    }
}

impl Collector<'_> {
    fn in_region(&self, st: &CollectState, addr: (u32, u64)) -> bool {
        addr >= self.cursor && st.limit.is_none_or(|l| addr < l)
    }

    /// Collects a block if its address is in the region.
    fn push(&self, st: &mut CollectState, object: u64, bp: &BlockPtr) {
        if !self.in_region(st, address(bp)) {
            return;
        }
        let id = st.id;
        st.entries.push(Entry {
            bp: *bp,
            id,
            object,
        });
        if st.entries.len() >= 2 * self.budget {
            // Keep the lowest addresses; the region now ends at the first one dropped.
            st.entries.sort_unstable_by_key(|e| address(&e.bp));
            st.entries.dedup_by_key(|e| address(&e.bp));
            if st.entries.len() > self.budget {
                st.limit = Some(address(&st.entries[self.budget].bp));
                st.entries.truncate(self.budget);
            }
        }
    }
}

fn collect(
    store: &ObjectStore,
    cursor: (u32, u64),
    budget: usize,
    filter: Filter,
) -> Result<Region, ObjectError> {
    let pool = store.pool();
    let c = Collector {
        blocks: store.blocks(),
        stop: &store.scanner.stop,
        cursor,
        filter,
        budget,
        inner: Mutex::new(CollectState::default()),
    };
    // The pool's own blocks are issued with the data.
    {
        let mut st = c.inner.lock();
        st.id = POOL_META_ID;
        for bp in pool.metadata_blocks()? {
            // Committed and rewritten every txg: scrubbed whatever their birth (resilvered
            // when born in the range).
            if bp.birth_txg >= c.filter.min_birth {
                c.push(&mut st, 0, &bp);
            }
        }
    }
    let snapshots = store.scanner.roots.lock().clone();
    let mut roots: Vec<(u64, Option<BlockPtr>, bool)> = pool
        .objsets()
        .into_iter()
        .map(|(id, root)| (id, root, true))
        .collect();
    if let Some(s) = snapshots {
        roots.extend(s.scan_roots().into_iter().map(|(id, r)| (id, r, false)));
    }
    let mut complete = true;
    for (id, mut root, live) in roots {
        for walk in 1..=MAX_REWALKS {
            {
                let mut st = c.inner.lock();
                st.id = id;
                st.freed_hit = false;
            }
            CowTree::open(root).walk_scan(&c, &mut Visit(&c));
            if !c.inner.lock().freed_hit || !live || pool.is_closed() {
                break;
            }
            if walk == MAX_REWALKS {
                complete = false;
                break;
            }
            // Nodes were freed under the walk: walk the new committed tree; the subtrees
            // seen already are skipped. A sync frees the old nodes before it publishes the
            // new root, so the root may not have changed yet: wait a little for it.
            let committed = || {
                pool.objsets()
                    .into_iter()
                    .find(|(i, _)| *i == id)
                    .map(|(_, r)| r)
            };
            let waited = Instant::now();
            let next = loop {
                let next = committed();
                if next != Some(root)
                    || waited.elapsed() >= ROOT_WAIT
                    || pool.is_closed()
                    || c.stop.load(Ordering::Acquire)
                {
                    break next;
                }
                std::thread::sleep(REWALK_PAUSE / 10);
            };
            match next {
                Some(r) => root = r,
                None => break,
            }
        }
    }
    let mut st = c.inner.into_inner();
    st.entries.sort_unstable_by_key(|e| address(&e.bp));
    st.entries.dedup_by_key(|e| address(&e.bp));
    let examined = st.examined + st.entries.iter().map(|e| allocated(&e.bp)).sum::<u64>();
    Ok(Region {
        entries: st.entries,
        complete,
        end: st.limit,
        examined,
        nodes: st.nodes,
        errors: st.errors,
    })
}

/// Scrubs the region's blocks in address order; returns false when stopped before the end.
fn issue(store: &ObjectStore, region: &Region) -> bool {
    let scanner = &store.scanner;
    let blocks = store.blocks();
    let chunks: Vec<&[Entry]> = region.entries.chunks(CHUNK).collect();
    let next = AtomicUsize::new(0);
    let (tx, rx) = std::sync::mpsc::channel::<(usize, Counters, Vec<(u64, u64)>)>();
    let mut prefix = 0;
    let paced = scanner.state.lock().func != "resilver";
    let pace = Pace(parking_lot::Mutex::new((Instant::now(), 0)));
    std::thread::scope(|s| {
        for _ in 0..WORKERS.min(chunks.len()) {
            let (tx, next, chunks, pace) = (tx.clone(), &next, &chunks, &pace);
            s.spawn(move || loop {
                if scanner.stop.load(Ordering::Acquire) || store.pool().is_closed() {
                    return;
                }
                let i = next.fetch_add(1, Ordering::AcqRel);
                let Some(chunk) = chunks.get(i) else { return };
                let mut c = Counters::default();
                let mut errors = Vec::new();
                for e in *chunk {
                    let (o, _) = blocks.scrub(&e.bp);
                    c.add_outcome(&e.bp, &o);
                    if o.unrecoverable && !o.freed {
                        errors.push((e.id, e.object));
                    }
                }
                if paced {
                    pace.account(c.issued, &scanner.stop);
                }
                if tx.send((i, c, errors)).is_err() {
                    return;
                }
            });
        }
        drop(tx);
        let mut done: BTreeMap<usize, Counters> = BTreeMap::new();
        for (i, c, errors) in rx {
            if store.pool().is_closed() {
                continue;
            }
            record_errors(store, &errors);
            done.insert(i, c);
            let mut advanced = Counters::default();
            while let Some(c) = done.remove(&prefix) {
                advanced.add(&c);
                prefix += 1;
            }
            let mut beyond = Counters::default();
            for c in done.values() {
                beyond.add(c);
            }
            let mut st = scanner.state.lock();
            st.issued += advanced.issued;
            st.repaired += advanced.repaired;
            st.errors += advanced.errors;
            st.blocks += advanced.blocks;
            if let Some(first) = chunks.get(prefix) {
                st.cursor = address(&first[0].bp);
            }
            drop(st);
            scanner.live.lock().2 = beyond;
            scanner.mark(store.pool());
        }
    });
    prefix == chunks.len()
}
