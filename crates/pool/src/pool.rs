//! The pool: create, import, the sync thread and txg commit, export, destroy, status.
//!
//! # Theory of operation
//! See the crate documentation for the txg pipeline. This file holds:
//! - `create`: validates the spec and the devices, writes labels and commits txg 1, and on any
//!   failure clears the labels it wrote (never a half-created pool);
//! - `import`: reads labels, builds the vdev tree (missing devices become UNAVAIL), picks the
//!   newest uberblock whose metadata verifies (or, with `rewind`, an older one within the
//!   deferral window), replays the space map log and starts the sync thread;
//! - `commit_txg`: the write order of invariant 2 (blocks, flush, uberblocks, flush).
//!
//! # Concurrency
//! `meta` (mutex) holds the commit state (last root block, history queue); only the sync
//! thread and export touch it while the pool runs. Readers use the block store directly.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rand::Rng;
use serde::{Deserialize, Serialize};
use tank_block::{
    BlockKind, BlockPtr, BlockStore, SpaceAllocator, SpaceOp, SpaceRecord, WriteProps, DEFER_TXGS,
};
use tank_device::{BlockDevice, DeviceRef};
use tank_vdev::{
    usable_size, EventLog, IoBatch, Layout, Leaf, LeafStatsSnapshot, ParityCodec, RaidzGeometry,
    SlowIoPolicy, TopVdev, VdevState, MIN_DEVICE_SIZE,
};

use crate::commit::{
    decode_objset_table, encode_objset_table, RootBlock, SpaceMapBlock, CONDENSE_CHAIN,
};
use crate::config::HostIdentity;
use crate::config::{
    feature_meaning, hostname, now_secs, unsupported_features, LeafConfig, PoolConfig, PoolState,
    TopConfig, TopKind, VdevClass, CREATE_FEATURES, FEATURE_INTENT_LOG, FORMAT_VERSION,
    SUPPORTED_FEATURES,
};
use crate::history::{self, HistoryRecord};
use crate::label::{self, Uberblock};
use crate::mmp::{self, HeartbeatWriter, MmpTunables};
use crate::spec::{PoolSpec, VdevSpec};
use crate::txg::{Refused, Tx, TxgInner, TxgManager, TxgTunables};
use crate::PoolError;

/// What the layer above (object sets) does at each txg. Registered with [`Pool::set_syncer`].
pub trait Syncer: Send + Sync {
    /// Called with every transaction of `txg` finished and none of `txg + 1` started: freeze
    /// what `txg` changed (must be cheap).
    fn quiesce(&self, txg: u64);
    /// Writes what was frozen for `txg` and returns the objset table (id, root).
    fn sync(&self, ctx: &SyncContext<'_>) -> Result<Vec<(u64, Option<BlockPtr>)>, PoolError>;
    /// Whether anything changed since the last quiesce.
    fn is_dirty(&self) -> bool;
    /// The pool is closing (export, destroy, shutdown): stop background work (a scrub) and
    /// leave its state dirty, so the final sync writes it.
    fn closing(&self) {}
    /// Devices changed under the pool (a hot spare took a failed device's place): whatever
    /// they lack should be resilvered.
    fn devices_changed(&self) {}
}

pub struct SyncContext<'a> {
    pub txg: u64,
    pub blocks: &'a BlockStore,
    pub batch: &'a Arc<IoBatch>,
}

#[derive(Debug, Clone)]
pub struct CreateOptions {
    pub ashift: u32,
    pub force: bool,
    pub tunables: TxgTunables,
    /// Who creates the pool (recorded in the labels as its importer).
    pub host: HostIdentity,
    /// The heartbeat's timing, once `multihost` is turned on.
    pub mmp: MmpTunables,
}

impl Default for CreateOptions {
    fn default() -> Self {
        Self {
            ashift: 12,
            force: false,
            tunables: TxgTunables::default(),
            host: HostIdentity::this_host(),
            mmp: MmpTunables::default(),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// Pool name or numeric guid; None imports the only pool found.
    pub name: Option<String>,
    /// Rewind to an older txg when the newest one does not verify (`import -F`).
    pub rewind: bool,
    /// Import a pool that looks active on another host, or destroyed.
    pub force: bool,
    /// Import although a log device holding the intent log is missing: its records are
    /// discarded (`import -m`).
    pub missing_log: bool,
    pub tunables: Option<TxgTunables>,
    /// The features this build reads (None: `SUPPORTED_FEATURES`). Tests give a smaller set
    /// to import as a build that lacks a feature would.
    pub supported_features: Option<&'static [&'static str]>,
    /// Who imports: a pool active for another host or instance needs `force`.
    pub host: HostIdentity,
    /// The activity check's and the heartbeat's timing (pools with `multihost` on).
    pub mmp: MmpTunables,
}

/// A pool found on devices, for `pool import` without a name.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ImportCandidate {
    pub name: String,
    pub guid: u64,
    pub state: String,
    pub hostname: String,
    pub devices_found: usize,
    pub devices_total: usize,
    pub missing: Vec<String>,
    pub importable: bool,
    pub vdevs: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VdevStatus {
    pub name: String,
    pub state: String,
    pub read_errors: u64,
    pub write_errors: u64,
    pub cksum_errors: u64,
    pub note: Option<String>,
    pub children: Vec<VdevStatus>,
    /// I/O counters (leaves; zero on interior vdevs), for iostat.
    #[serde(default)]
    pub stats: LeafStatsSnapshot,
    pub path: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PoolSpace {
    pub size: u64,
    pub allocated: u64,
    pub free: u64,
    pub deferred: u64,
    /// What the datasets can hold, as `zfs list` shows the root's USED + AVAIL: the data
    /// vdevs' capacity (parity and RAID-Z padding deflated as for a 128 KiB block) less the
    /// 1/32 kept back for metadata. `tank plan` predicts the same figure.
    pub usable: u64,
    /// Free-space fragmentation in percent (zpool's FRAG); 0 when nothing is free.
    #[serde(default)]
    pub fragmentation: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PoolStatus {
    pub name: String,
    pub guid: u64,
    pub state: String,
    pub status: Option<String>,
    pub action: Option<String>,
    pub txg: u64,
    pub config: Vec<VdevStatus>,
    pub sections: Vec<(String, Vec<VdevStatus>)>,
    pub space: PoolSpace,
    pub healed_blocks: u64,
    /// Gang blocks freed since import whose header no copy of could be read: their pieces
    /// stay allocated (leaked, as ZFS leaks them) rather than fail the txg.
    #[serde(default)]
    pub leaked_gang_blocks: u64,
    pub suspended: Option<String>,
}

#[derive(Debug, Default)]
struct Meta {
    root: Option<RootBlock>,
    root_bp: Option<BlockPtr>,
    history_pending: Vec<HistoryRecord>,
    /// Space map chain blocks from head to the condensed start (freed when condensing).
    spacemap_chain: Vec<BlockPtr>,
    objsets: Vec<(u64, Option<BlockPtr>)>,
}

pub struct Pool {
    /// Checksum and I/O errors, state changes, scrub start and finish (`pool events`).
    pub events: Arc<EventLog>,
    config: Mutex<PoolConfig>,
    pub blocks: Arc<BlockStore>,
    tops: parking_lot::RwLock<Vec<(VdevClass, Arc<TopVdev>)>>,
    txg: TxgManager,
    meta: Mutex<Meta>,
    syncer: Mutex<Option<Arc<dyn Syncer>>>,
    sync_thread: Mutex<Option<JoinHandle<()>>>,
    /// The sync thread was joined by `close` (waiters for a txg then give up).
    sync_stopped: AtomicBool,
    closed: AtomicBool,
    /// The devices changed since the last commit: the next sync commits even if nothing else
    /// is dirty (see `commit_device_change`).
    config_changed: AtomicBool,
    /// A writer waits for space in flight (see `begin_tx`): the syncs of txgs up to this one
    /// commit even if nothing else is dirty, so that deferred frees come back.
    space_wanted: AtomicU64,
    /// Messages for the user gathered on import (missing devices, rewinds).
    pub import_notes: Vec<String>,
    /// The intent log (`zil.rs`).
    pub zil: crate::zil::IntentLog,
    /// Whether the labels list `intent_log` (`FEATURE_INTENT_LOG`): set before the first log
    /// write, cleared when the pool is closed cleanly. Held while the labels change.
    log_feature: Mutex<bool>,
    /// Who imported the pool (written into the labels).
    host: HostIdentity,
    mmp: MmpTunables,
    /// The multihost heartbeat thread (`mmp.rs`), while `multihost` is on.
    heartbeat: Mutex<Option<JoinHandle<()>>>,
    /// When a heartbeat last reached a device (None: no heartbeat runs). The sync thread
    /// looks too, so that a heartbeat stuck on a hung device still stops the writes.
    heartbeat_at: Mutex<Option<Instant>>,
    /// Acts on the leaves' slow I/O verdicts (`health_loop`).
    health: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("name", &self.name()).finish()
    }
}

/// Checks a pool name against the zpool rules.
pub fn validate_pool_name(name: &str) -> Result<(), PoolError> {
    let bad = |why: &str| {
        Err(PoolError::InvalidArgument(format!(
            "invalid pool name '{name}': {why}"
        )))
    };
    if name.is_empty() {
        return bad("name is empty");
    }
    if name.len() > 200 {
        return bad("name is longer than 200 characters");
    }
    if !name.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return bad("name must begin with a letter");
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "_-.:".contains(*c)))
    {
        return bad(&format!("invalid character '{c}' in name"));
    }
    let reserved = [
        "mirror", "raidz", "draid", "spare", "log", "cache", "special",
    ];
    if reserved.iter().any(|r| name.starts_with(r)) {
        return bad("name is reserved");
    }
    Ok(())
}

fn new_guid() -> u64 {
    rand::thread_rng().gen_range(1..u64::MAX)
}

fn build_top(
    tc: &TopConfig,
    ashift: u32,
    leaves: Vec<Arc<Leaf>>,
    codec: &Arc<ParityCodec>,
) -> Result<TopVdev, PoolError> {
    let layout = match tc.kind {
        TopKind::Disk => Layout::Disk,
        TopKind::Mirror => Layout::Mirror,
        TopKind::Raidz => Layout::Raidz(
            RaidzGeometry::new(tc.children.len(), usize::from(tc.parity), ashift)
                .map_err(|e| PoolError::InvalidSpec(e.to_string()))?,
        ),
    };
    Ok(TopVdev::new(
        tc.id,
        tc.guid,
        layout,
        leaves,
        ashift,
        codec.clone(),
    ))
}

impl Pool {
    pub fn name(&self) -> String {
        self.config.lock().name.clone()
    }

    pub fn guid(&self) -> u64 {
        self.config.lock().guid
    }

    pub fn config(&self) -> PoolConfig {
        self.config.lock().clone()
    }

    pub fn ashift(&self) -> u32 {
        self.config.lock().ashift
    }

    /// The top-level vdevs (a copy: `attach` and `detach` change a vdev's shape).
    /// The class of top-level vdev `id`.
    pub fn class_of(&self, id: u32) -> Option<VdevClass> {
        self.tops
            .read()
            .iter()
            .find(|(_, t)| t.id == id)
            .map(|(c, _)| *c)
    }

    pub fn tops(&self) -> Vec<(VdevClass, Arc<TopVdev>)> {
        self.tops.read().clone()
    }

    /// Creates a pool on `devices` (name in the spec → opened device).
    pub fn create(
        name: &str,
        spec: &PoolSpec,
        devices: &HashMap<String, DeviceRef>,
        opts: &CreateOptions,
    ) -> Result<(Arc<Pool>, Vec<String>), PoolError> {
        validate_pool_name(name)?;
        if !(9..=16).contains(&opts.ashift) {
            return Err(PoolError::InvalidArgument(format!(
                "ashift {} is out of range (9 to 16)",
                opts.ashift
            )));
        }
        let mut warnings = Vec::new();
        let all = spec.all_devices();
        for d in &all {
            let dev = devices
                .get(d)
                .ok_or_else(|| PoolError::InvalidArgument(format!("cannot open '{d}'")))?;
            if dev.size() < MIN_DEVICE_SIZE {
                return Err(PoolError::InvalidArgument(format!(
                    "device '{d}' is too small ({} bytes; the minimum is {} MiB)",
                    dev.size(),
                    MIN_DEVICE_SIZE >> 20
                )));
            }
            if let Some(l) = label::best_label(dev.as_ref()) {
                if l.config.state != PoolState::Destroyed && !opts.force {
                    return Err(PoolError::InvalidArgument(format!(
                        "device '{d}' is part of {} pool '{}' (last used on host '{}'); use -f to override",
                        l.config.state.name().to_lowercase(),
                        l.config.name,
                        l.config.hostname
                    )));
                }
            }
        }
        // Data, special and spare devices set the common leaf size (the smallest wins); log
        // and cache devices are used at their own size.
        let own_size: std::collections::HashSet<&String> = spec
            .log
            .iter()
            .flat_map(|v| v.devices())
            .chain(spec.cache.iter())
            .collect();
        let sizes: Vec<(String, u64)> = all
            .iter()
            .filter(|d| !own_size.contains(d))
            .map(|d| (d.clone(), usable_size(devices[d].size())))
            .collect();
        let min = sizes
            .iter()
            .map(|s| s.1)
            .min()
            .expect("at least one device");
        let max = sizes
            .iter()
            .map(|s| s.1)
            .max()
            .expect("at least one device");
        let sector = 1u64 << opts.ashift;
        let leaf_asize = min / sector * sector;
        if max > min {
            let small: Vec<&str> = sizes
                .iter()
                .filter(|s| s.1 == min)
                .map(|s| s.0.as_str())
                .collect();
            warnings.push(format!(
                "devices differ in size: every device is used as {} MiB, the size of the smallest ({}); up to {} MiB per device is unused",
                leaf_asize >> 20,
                small.join(", "),
                (max - min) >> 20
            ));
        }
        let mut vdevs = Vec::new();
        let mut push = |class: VdevClass, v: &VdevSpec| {
            let (kind, parity, devs) = match v {
                VdevSpec::Disk(d) => (TopKind::Disk, 0, vec![d.clone()]),
                VdevSpec::Mirror(d) => (TopKind::Mirror, 0, d.clone()),
                VdevSpec::Raidz { parity, devices } => (TopKind::Raidz, *parity, devices.clone()),
            };
            let id = vdevs.len() as u32;
            vdevs.push(TopConfig {
                id,
                guid: new_guid(),
                class,
                kind,
                parity,
                children: devs
                    .into_iter()
                    .map(|path| LeafConfig {
                        guid: new_guid(),
                        path,
                        offline: false,
                        spare_for: None,
                        dtl: None,
                    })
                    .collect(),
                asize: 0,
            });
        };
        for v in &spec.data {
            push(VdevClass::Normal, v);
        }
        for v in &spec.special {
            push(VdevClass::Special, v);
        }
        for v in &spec.log {
            push(VdevClass::Log, v);
        }
        for d in &spec.cache {
            push(VdevClass::Cache, &VdevSpec::Disk(d.clone()));
        }
        for d in &spec.spare {
            push(VdevClass::Spare, &VdevSpec::Disk(d.clone()));
        }
        for tc in vdevs
            .iter_mut()
            .filter(|tc| matches!(tc.class, VdevClass::Log | VdevClass::Cache))
        {
            tc.asize = tc
                .children
                .iter()
                .map(|lc| usable_size(devices[&lc.path].size()) / sector * sector)
                .min()
                .unwrap_or(0);
        }
        let config = PoolConfig {
            version: FORMAT_VERSION,
            name: name.to_string(),
            guid: new_guid(),
            state: PoolState::Active,
            hostname: opts.host.hostname.clone(),
            txg: 1,
            create_time: now_secs(),
            features: CREATE_FEATURES.iter().map(|s| s.to_string()).collect(),
            ashift: opts.ashift,
            leaf_asize,
            vdevs,
            prev_guid_sums: Vec::new(),
            autoreplace: false,
            hostid: opts.host.hostid,
            instance: opts.host.instance,
            multihost: false,
        };
        let devs: HashMap<u64, DeviceRef> = config
            .leaves()
            .map(|(_, l)| (l.guid, devices[&l.path].clone()))
            .collect();
        let result = (|| {
            let mut pool = Self::assemble(config.clone(), &devs, opts.tunables, 1, Vec::new())?;
            pool.host = opts.host.clone();
            pool.mmp = opts.mmp;
            pool.write_config(PoolState::Active)?;
            {
                let mut alloc = pool.blocks.alloc.lock();
                for (class, top) in &pool.tops() {
                    alloc.add_vdev(
                        top.id,
                        top.space(),
                        top.sector(),
                        *class == VdevClass::Normal,
                    );
                }
            }
            pool.commit_txg(1, Vec::new())?;
            {
                let mut inner = pool.txg.inner.lock();
                inner.open = 2;
                inner.synced = 1;
            }
            Ok(Arc::new(pool))
        })();
        match result {
            Ok(pool) => {
                pool.start_sync_thread();
                Ok((pool, warnings))
            }
            Err(e) => {
                for dev in devs.values() {
                    let _ = label::clear_labels(dev.as_ref());
                }
                Err(e)
            }
        }
    }

    /// Builds the in-memory pool from a config; missing leaves become UNAVAIL.
    fn assemble(
        mut config: PoolConfig,
        devs: &HashMap<u64, DeviceRef>,
        tunables: TxgTunables,
        open_txg: u64,
        notes: Vec<String>,
    ) -> Result<Pool, PoolError> {
        let codec = Arc::new(ParityCodec::new());
        // Devices may have moved since the config was written: record where they are now.
        for tc in &mut config.vdevs {
            for lc in &mut tc.children {
                if let Some(dev) = devs.get(&lc.guid) {
                    lc.path = dev.name().to_string();
                }
            }
        }
        let mut tops = Vec::new();
        let mut slots: Vec<Option<Arc<TopVdev>>> = Vec::new();
        // Hot spares in use: their device serves the slot of the device they stand in for.
        let lent: HashMap<u64, String> = config
            .vdevs
            .iter()
            .filter(|tc| tc.class != VdevClass::Spare)
            .flat_map(|tc| tc.children.iter())
            .filter_map(|lc| {
                lc.spare_for
                    .as_ref()
                    .map(|(_, orig)| (lc.guid, orig.clone()))
            })
            .collect();
        for tc in &config.vdevs {
            let asize = tc.leaf_asize(config.leaf_asize);
            let leaves: Vec<Arc<Leaf>> = tc
                .children
                .iter()
                .map(|lc| {
                    let leaf = Leaf::new(lc.guid, lc.path.clone(), asize, None);
                    leaf.set_spare_for(lc.spare_for.clone());
                    leaf.set_dtl(lc.dtl);
                    if tc.class == VdevClass::Spare {
                        if let Some(orig) = lent.get(&lc.guid) {
                            leaf.set_state(VdevState::Inuse, Some(format!("in use for {orig}")));
                            return leaf;
                        }
                    }
                    let dev = devs.get(&lc.guid).cloned();
                    if let Some(dev) = dev {
                        if usable_size(dev.size()) < asize {
                            leaf.set_state(
                                VdevState::Unavail,
                                Some(format!(
                                    "device is smaller than the pool recorded ({} < {} bytes of data area): truncated?",
                                    usable_size(dev.size()),
                                    asize
                                )),
                            );
                        } else {
                            leaf.attach(dev);
                            if lc.offline {
                                leaf.set_state(
                                    VdevState::Offline,
                                    Some("offlined by the administrator".into()),
                                );
                            }
                        }
                    }
                    leaf
                })
                .collect();
            let top = Arc::new(build_top(tc, config.ashift, leaves, &codec)?);
            // Block pointers name vdevs by id; ids of removed vdevs stay unused.
            let slot = tc.id as usize;
            if slots.len() <= slot {
                slots.resize(slot + 1, None);
            }
            slots[slot] = Some(top.clone());
            tops.push((tc.class, top));
        }
        let events = Arc::new(EventLog::new());
        for (_, top) in &tops {
            for leaf in &top.leaves {
                leaf.set_events(events.clone());
                if !leaf.is_usable() {
                    events.post(
                        "resource.fs.zfs.statechange",
                        Some(&leaf.path()),
                        format!(
                            "to={} reason=\"{}\"",
                            leaf.state().name(),
                            leaf.reason().unwrap_or_default()
                        ),
                    );
                }
            }
        }
        Ok(Pool {
            events,
            config: Mutex::new(config),
            blocks: Arc::new(BlockStore::new(slots, SpaceAllocator::new())),
            tops: parking_lot::RwLock::new(tops),
            txg: TxgManager::new(open_txg, tunables),
            meta: Mutex::new(Meta::default()),
            syncer: Mutex::new(None),
            sync_thread: Mutex::new(None),
            sync_stopped: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            config_changed: AtomicBool::new(false),
            space_wanted: AtomicU64::new(0),
            import_notes: notes,
            zil: crate::zil::IntentLog::new(None),
            log_feature: Mutex::new(false),
            host: HostIdentity::this_host(),
            mmp: MmpTunables::default(),
            heartbeat: Mutex::new(None),
            heartbeat_at: Mutex::new(None),
            health: Mutex::new(None),
        })
    }

    /// A leaf by path (as `status` shows it), file name or guid, with its top-level vdev.
    pub fn find_leaf(&self, name: &str) -> Result<(Arc<TopVdev>, Arc<Leaf>), PoolError> {
        for (_, top) in &self.tops() {
            for leaf in &top.leaves {
                let is = |path: &str, guid: u64| {
                    path == name
                        || guid.to_string() == name
                        || std::path::Path::new(path)
                            .file_name()
                            .is_some_and(|f| f == name)
                };
                // A slot served by a hot spare answers to the failed device's name too.
                let stood_in = leaf.spare_for().is_some_and(|(g, p)| is(&p, g));
                if is(&leaf.path(), leaf.guid()) || stood_in {
                    return Ok((top.clone(), leaf.clone()));
                }
            }
        }
        Err(PoolError::InvalidArgument(format!(
            "no such device in pool '{}': {name}",
            self.name()
        )))
    }

    /// Takes a device offline (`temporary`: only until the pool is exported). Refused when
    /// its vdev would lose blocks.
    pub fn offline(&self, name: &str, temporary: bool) -> Result<(), PoolError> {
        let (top, leaf) = self.find_leaf(name)?;
        if leaf.state() == VdevState::Offline {
            return Ok(());
        }
        let lacking = top
            .leaves
            .iter()
            .filter(|l| !l.is_usable() || l.is_resilvering())
            .count();
        if leaf.is_usable() && lacking + 1 > top.redundancy() {
            return Err(PoolError::InvalidArgument(format!(
                "cannot offline {name}: no valid replicas ({} {} can lose {} device(s), {lacking} already {})",
                top.type_name(),
                top.id,
                top.redundancy(),
                if lacking == 1 { "is missing or resilvering" } else { "are missing or resilvering" }
            )));
        }
        leaf.set_state(
            VdevState::Offline,
            Some(if temporary {
                "offlined by the administrator until export".into()
            } else {
                "offlined by the administrator".into()
            }),
        );
        if !temporary {
            self.set_leaf_offline(leaf.guid(), true)?;
        }
        Ok(())
    }

    fn set_leaf_offline(&self, guid: u64, offline: bool) -> Result<(), PoolError> {
        {
            let mut cfg = self.config.lock();
            for tc in &mut cfg.vdevs {
                for lc in &mut tc.children {
                    if lc.guid == guid {
                        lc.offline = offline;
                    }
                }
            }
        }
        self.write_config(PoolState::Active)
    }

    /// Brings an offline (or faulted) device back. Returns the txgs it missed, which a
    /// resilver must rebuild (its newest uberblock tells how far it got).
    pub fn online(&self, name: &str) -> Result<Option<(u64, u64)>, PoolError> {
        let (_, leaf) = self.find_leaf(name)?;
        self.bring_back(&leaf, name)
    }

    fn bring_back(&self, leaf: &Arc<Leaf>, name: &str) -> Result<Option<(u64, u64)>, PoolError> {
        let state = leaf.state();
        if state.usable() {
            return Ok(None);
        }
        let Some(dev) = leaf.device() else {
            return Err(PoolError::InvalidArgument(format!(
                "cannot online {name}: the device is {} ({}); replace it",
                state.name(),
                leaf.reason().unwrap_or_default()
            )));
        };
        let last = leaf_last_txg(
            dev.as_ref(),
            self.ashift(),
            &[self.config.lock().guid_sum()],
        );
        // From now on the leaf takes every write; the open txg may already have been partly
        // written without it, so it counts as missed.
        let open = self.txg.open_txg();
        leaf.set_state(VdevState::Online, None);
        let missed = (last < open).then_some((last + 1, open));
        leaf.set_dtl(missed);
        self.set_leaf_offline(leaf.guid(), false)?;
        Ok(missed)
    }

    /// Replaces device `old` by `dev` (at `new_path`, which may be `old`'s own path when the
    /// disk was swapped in place). The new device lacks every txg: the caller starts a
    /// resilver. Refused for a device too small, one that belongs to a pool, or when the
    /// vdev would be left without a copy of some block while the new device is rebuilt.
    pub fn replace(
        &self,
        old: &str,
        new_path: &str,
        dev: DeviceRef,
        force: bool,
    ) -> Result<(u64, u64), PoolError> {
        let (top, leaf) = self.find_leaf(old)?;
        let refuse = |why: String| {
            Err(PoolError::InvalidArgument(format!(
                "cannot replace {old} with {new_path}: {why}"
            )))
        };
        if let Err(why) = self.check_new_device(new_path, &dev, Some(&leaf), force) {
            return refuse(why);
        }
        let lacking = top
            .leaves
            .iter()
            .filter(|l| (!l.is_usable() || l.is_resilvering()) && !Arc::ptr_eq(l, &leaf))
            .count();
        let spared = leaf.spare_for().is_some();
        if lacking + 1 > top.redundancy() && leaf.is_usable() && !leaf.is_resilvering() && !spared {
            return refuse(format!(
                "{} {} would have no copy of some blocks while the new device is rebuilt ({lacking} other device(s) missing or resilvering); replace a failed device first",
                top.type_name(),
                top.id
            ));
        }
        if lacking + 1 > top.redundancy() + 1 {
            return refuse(format!(
                "{} {} has lost more devices than it can rebuild from",
                top.type_name(),
                top.id
            ));
        }
        let guid = new_guid();
        let old_guid = leaf.guid();
        let open = self.txg.open_txg();
        let old_dev = leaf.replace_device(guid, new_path.to_string(), dev, open);
        if spared {
            // The hot spare that stood in goes back to the spares, AVAIL again.
            leaf.set_spare_for(None);
            if let (Some(spare), Some(dev)) = (self.spare_leaf(old_guid), old_dev) {
                spare.attach(dev);
                self.events.post(
                    "resource.fs.zfs.statechange",
                    Some(&spare.path()),
                    "to=AVAIL reason=\"the device it stood in for was replaced\"".into(),
                );
            }
        }
        {
            self.config.lock().change_devices(|cfg| {
                for tc in cfg
                    .vdevs
                    .iter_mut()
                    .filter(|tc| tc.class != VdevClass::Spare)
                {
                    for lc in &mut tc.children {
                        if lc.guid == old_guid {
                            lc.guid = guid;
                            lc.path = new_path.to_string();
                            lc.offline = false;
                            lc.spare_for = None;
                        }
                    }
                }
            });
        }
        self.write_config(PoolState::Active)?;
        self.commit_device_change();
        self.events.post(
            "resource.fs.zfs.statechange",
            Some(new_path),
            format!("replaced={old} to=ONLINE reason=\"lacks every txg until resilvered\""),
        );
        Ok((1, open))
    }

    /// Whether a failed data device has no spare yet while one is available.
    fn spare_wanted(&self) -> bool {
        let free = self
            .tops()
            .iter()
            .filter(|(c, _)| *c == VdevClass::Spare)
            .any(|(_, t)| t.leaves.iter().any(|l| l.is_usable()));
        free && self
            .tops()
            .iter()
            .filter(|(c, _)| *c == VdevClass::Normal)
            .flat_map(|(_, t)| t.leaves.iter())
            .any(|l| {
                matches!(
                    l.state(),
                    VdevState::Faulted | VdevState::Unavail | VdevState::Removed
                ) && l.spare_for().is_none()
            })
    }

    /// Why a device cannot join the pool (at `new_path`, in the place of `replacing`), if it
    /// cannot: too small, already a device of this pool, or of another pool (without force).
    fn check_new_device(
        &self,
        new_path: &str,
        dev: &DeviceRef,
        replacing: Option<&Arc<Leaf>>,
        force: bool,
    ) -> Result<(), String> {
        let asize = self.config.lock().leaf_asize;
        if usable_size(dev.size()) < asize {
            return Err(format!(
                "the device is too small ({} bytes of data area, the pool's devices have {asize})",
                usable_size(dev.size())
            ));
        }
        let same = |l: &Arc<Leaf>| replacing.is_some_and(|r| Arc::ptr_eq(l, r));
        if self
            .leaves()
            .iter()
            .any(|l| l.path() == new_path && !same(l))
        {
            return Err("it is already a device of this pool".into());
        }
        if let Some(label) = label::best_label(dev.as_ref()) {
            let mine = label.pool_guid == self.guid();
            let same_leaf = replacing.is_some_and(|l| l.guid() == label.leaf_guid && l.is_usable());
            if mine
                && (same_leaf || replacing.is_none())
                && label.config.state != PoolState::Destroyed
            {
                return Err(if same_leaf {
                    "it is the same device; use 'online' or 'clear'".into()
                } else {
                    "it is a device of this pool".into()
                });
            }
            if !mine && label.config.state != PoolState::Destroyed && !force {
                return Err(format!(
                    "it belongs to pool '{}' ({}); use -f to overwrite it",
                    label.config.name,
                    label.config.state.name()
                ));
            }
        }
        Ok(())
    }

    /// Puts a reshaped top-level vdev in place (`attach`, `detach`) and records its shape.
    fn swap_top(
        &self,
        top: Arc<TopVdev>,
        kind: TopKind,
        children: Vec<LeafConfig>,
    ) -> Result<(), PoolError> {
        {
            let mut tops = self.tops.write();
            for entry in tops.iter_mut() {
                if entry.1.id == top.id {
                    entry.1 = top.clone();
                }
            }
        }
        self.blocks.set_vdev(top.clone());
        self.config.lock().change_devices(|cfg| {
            if let Some(tc) = cfg.vdevs.iter_mut().find(|tc| tc.id == top.id) {
                tc.kind = kind;
                tc.children = children;
            }
        });
        self.write_config(PoolState::Active)?;
        self.commit_device_change();
        Ok(())
    }

    /// After a device change: the next txg commits at once, so an uberblock with the new
    /// configuration's guid sum exists (import also accepts the previous sums).
    fn commit_device_change(&self) {
        self.config_changed.store(true, Ordering::Release);
        self.note_change();
    }

    /// Attaches a new device to `existing`, as `zpool attach` does: a top-level disk becomes
    /// a two-way mirror, a mirror gains a side. The new side lacks every txg until resilvered
    /// (returned). Only disks and mirrors of the data vdevs take one.
    pub fn attach(
        &self,
        existing: &str,
        new_path: &str,
        dev: DeviceRef,
        force: bool,
    ) -> Result<(u64, u64), PoolError> {
        let (top, _) = self.find_leaf(existing)?;
        let refuse = |why: String| {
            Err(PoolError::InvalidArgument(format!(
                "cannot attach {new_path} to {existing}: {why}"
            )))
        };
        let class = self.class_of(top.id);
        if class != Some(VdevClass::Normal) {
            return refuse("only devices of the data vdevs take a mirror side".into());
        }
        if matches!(top.layout, Layout::Raidz(_)) {
            return refuse(format!(
                "can only attach to mirrors and top-level disks, not to a {} child",
                top.type_name()
            ));
        }
        if let Err(why) = self.check_new_device(new_path, &dev, None, force) {
            return refuse(why);
        }
        let asize = self.config.lock().leaf_asize;
        let leaf = Leaf::new(new_guid(), new_path.to_string(), asize, Some(dev));
        leaf.set_events(self.events.clone());
        let open = self.txg.open_txg();
        leaf.set_dtl(Some((1, open)));
        let mut leaves = top.leaves.clone();
        leaves.push(leaf.clone());
        let mut children = self
            .config
            .lock()
            .vdevs
            .iter()
            .find(|tc| tc.id == top.id)
            .map(|tc| tc.children.clone())
            .unwrap_or_default();
        children.push(LeafConfig {
            guid: leaf.guid(),
            path: new_path.to_string(),
            offline: false,
            spare_for: None,
            dtl: Some((1, open)),
        });
        let reshaped = Arc::new(top.reshaped(Layout::Mirror, leaves));
        self.swap_top(reshaped, TopKind::Mirror, children)?;
        self.events.post(
            "resource.fs.zfs.statechange",
            Some(new_path),
            format!(
                "attached_to=\"{existing}\" to=ONLINE reason=\"lacks every txg until resilvered\""
            ),
        );
        Ok((1, open))
    }

    /// Detaches a side of a mirror (a two-way mirror becomes a disk); refused when no other
    /// side holds every block. The detached device's labels are cleared.
    pub fn detach(&self, name: &str) -> Result<(), PoolError> {
        let (top, leaf) = self.find_leaf(name)?;
        let refuse = |why: String| {
            Err(PoolError::InvalidArgument(format!(
                "cannot detach {name}: {why}"
            )))
        };
        if !matches!(top.layout, Layout::Mirror) {
            return refuse("only a side of a mirror can be detached".into());
        }
        let rest: Vec<Arc<Leaf>> = top
            .leaves
            .iter()
            .filter(|l| !Arc::ptr_eq(l, &leaf))
            .cloned()
            .collect();
        if !rest.iter().any(|l| l.is_usable() && !l.is_resilvering()) {
            return refuse("no other side holds every block (it is the only valid copy)".into());
        }
        let children: Vec<LeafConfig> = self
            .config
            .lock()
            .vdevs
            .iter()
            .find(|tc| tc.id == top.id)
            .map(|tc| {
                tc.children
                    .iter()
                    .filter(|lc| lc.guid != leaf.guid())
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        let (layout, kind) = if rest.len() == 1 {
            (Layout::Disk, TopKind::Disk)
        } else {
            (Layout::Mirror, TopKind::Mirror)
        };
        let reshaped = Arc::new(top.reshaped(layout, rest));
        self.swap_top(reshaped, kind, children)?;
        if let Some(dev) = leaf.take_device() {
            let _ = label::clear_labels(dev.as_ref());
        }
        self.events.post(
            "resource.fs.zfs.statechange",
            Some(&leaf.path()),
            "detached".into(),
        );
        Ok(())
    }

    /// Adds vdevs, as `zpool add` does: data vdevs (the pool grows; their replication should
    /// match the pool's unless `force`), `special`, `log` and `cache` devices and `spare`s.
    /// Log and cache devices are used at their own size; every other device must be as
    /// large as the pool's. Returns the ids of the new top-level vdevs.
    pub fn add(
        &self,
        spec: &PoolSpec,
        devices: &HashMap<String, DeviceRef>,
        force: bool,
    ) -> Result<Vec<u32>, PoolError> {
        let refuse = |why: String| Err(PoolError::InvalidArgument(format!("cannot add: {why}")));
        if let (false, Some(new)) = (force, spec.data.first()) {
            let have = self
                .config()
                .vdevs
                .iter()
                .find(|tc| tc.class == VdevClass::Normal)
                .map(|tc| match tc.kind {
                    TopKind::Disk => "disk".to_string(),
                    TopKind::Mirror => "mirror".to_string(),
                    TopKind::Raidz => format!("raidz{}", tc.parity),
                });
            if let Some(have) = have.filter(|h| *h != new.replication()) {
                return refuse(format!(
                    "mismatched replication level: pool uses {have} and new vdev is {} (use -f to override)",
                    new.replication()
                ));
            }
        }
        let (leaf_asize, ashift) = {
            let c = self.config.lock();
            (c.leaf_asize, c.ashift)
        };
        let sector = 1u64 << ashift;
        for d in spec.all_devices() {
            let Some(dev) = devices.get(&d) else {
                return refuse(format!("cannot open '{d}'"));
            };
            if dev.size() < MIN_DEVICE_SIZE {
                return refuse(format!(
                    "device '{d}' is too small ({} bytes; the minimum is {} MiB)",
                    dev.size(),
                    MIN_DEVICE_SIZE >> 20
                ));
            }
            let own_size =
                spec.cache.contains(&d) || spec.log.iter().any(|v| v.devices().contains(&&d));
            if !own_size && usable_size(dev.size()) < leaf_asize {
                return refuse(format!(
                    "device '{d}' is too small ({} bytes of data area, the pool's devices have {leaf_asize})",
                    usable_size(dev.size())
                ));
            }
            if self.leaves().iter().any(|l| l.path() == d) {
                return refuse(format!("'{d}' is already a device of this pool"));
            }
            if let Some(label) = label::best_label(dev.as_ref()) {
                if label.config.state != PoolState::Destroyed
                    && (label.pool_guid == self.guid() || !force)
                {
                    return refuse(format!(
                        "device '{d}' belongs to pool '{}' ({}){}",
                        label.config.name,
                        label.config.state.name(),
                        if label.pool_guid == self.guid() {
                            String::new()
                        } else {
                            "; use -f to overwrite it".into()
                        }
                    ));
                }
            }
        }
        let mut next_id = self
            .config
            .lock()
            .vdevs
            .iter()
            .map(|tc| tc.id + 1)
            .max()
            .unwrap_or(0);
        let mut new_tops: Vec<(TopConfig, Arc<TopVdev>)> = Vec::new();
        let codec = Arc::new(ParityCodec::new());
        let mut build = |class: VdevClass, v: &VdevSpec| -> Result<(), PoolError> {
            let (kind, parity, devs) = match v {
                VdevSpec::Disk(d) => (TopKind::Disk, 0, vec![d.clone()]),
                VdevSpec::Mirror(d) => (TopKind::Mirror, 0, d.clone()),
                VdevSpec::Raidz { parity, devices } => (TopKind::Raidz, *parity, devices.clone()),
            };
            let asize = if matches!(class, VdevClass::Log | VdevClass::Cache) {
                devs.iter()
                    .map(|d| usable_size(devices[d].size()) / sector * sector)
                    .min()
                    .unwrap_or(0)
            } else {
                0
            };
            let tc = TopConfig {
                id: next_id,
                guid: new_guid(),
                class,
                kind,
                parity,
                children: devs
                    .iter()
                    .map(|path| LeafConfig {
                        guid: new_guid(),
                        path: path.clone(),
                        offline: false,
                        spare_for: None,
                        dtl: None,
                    })
                    .collect(),
                asize,
            };
            next_id += 1;
            let leaves = tc
                .children
                .iter()
                .map(|lc| {
                    let leaf = Leaf::new(
                        lc.guid,
                        lc.path.clone(),
                        tc.leaf_asize(leaf_asize),
                        Some(devices[&lc.path].clone()),
                    );
                    leaf.set_events(self.events.clone());
                    leaf
                })
                .collect();
            let top = Arc::new(build_top(&tc, ashift, leaves, &codec)?);
            new_tops.push((tc, top));
            Ok(())
        };
        for v in &spec.data {
            build(VdevClass::Normal, v)?;
        }
        for v in &spec.special {
            build(VdevClass::Special, v)?;
        }
        for v in &spec.log {
            build(VdevClass::Log, v)?;
        }
        for d in &spec.cache {
            build(VdevClass::Cache, &VdevSpec::Disk(d.clone()))?;
        }
        for d in &spec.spare {
            build(VdevClass::Spare, &VdevSpec::Disk(d.clone()))?;
        }
        {
            let mut alloc = self.blocks.alloc.lock();
            for (tc, top) in &new_tops {
                alloc.add_vdev(
                    top.id,
                    top.space(),
                    top.sector(),
                    tc.class == VdevClass::Normal,
                );
            }
        }
        let ids = new_tops.iter().map(|(tc, _)| tc.id).collect();
        {
            let mut tops = self.tops.write();
            for (tc, top) in &new_tops {
                self.blocks.set_vdev(top.clone());
                tops.push((tc.class, top.clone()));
            }
        }
        self.config.lock().change_devices(|cfg| {
            cfg.vdevs.extend(new_tops.iter().map(|(tc, _)| tc.clone()));
        });
        self.write_config(PoolState::Active)?;
        self.commit_device_change();
        for (tc, top) in &new_tops {
            for leaf in &top.leaves {
                self.events.post(
                    "sysevent.fs.zfs.vdev_add",
                    Some(&leaf.path()),
                    format!("class={}", tc.class.section().unwrap_or("data")),
                );
            }
        }
        Ok(ids)
    }

    /// Removes a cache, log or (unused) spare device, as `zpool remove` does; its labels are
    /// cleared. Removing a data vdev would need its blocks moved elsewhere first, which tank
    /// does not do: refused. A log device is removed only after a txg sync, so nothing the
    /// intent log holds on it is still needed.
    pub fn remove(&self, name: &str) -> Result<(VdevClass, u64), PoolError> {
        let (top, leaf) = self.find_leaf(name)?;
        let refuse = |why: String| {
            Err(PoolError::InvalidArgument(format!(
                "cannot remove {name}: {why}"
            )))
        };
        let class = self.class_of(top.id).unwrap_or(VdevClass::Normal);
        match class {
            VdevClass::Cache | VdevClass::Log | VdevClass::Spare => {}
            _ => {
                return refuse(
                    "only cache, log and spare devices can be removed (moving a data vdev's blocks elsewhere is not supported)".into(),
                )
            }
        }
        if class == VdevClass::Spare && leaf.state() == VdevState::Inuse {
            return refuse(
                "the hot spare is in use; replace or detach the device it stands in for first"
                    .into(),
            );
        }
        if top.leaves.len() > 1 {
            return refuse(format!(
                "it is a side of a mirrored {}: detach it, or remove the whole mirror by the name of its last side",
                class.section().unwrap_or("vdev")
            ));
        }
        if class == VdevClass::Log {
            // The ring moves off it at a txg commit with nothing live (a few at most).
            self.zil.avoid(top.id);
            for _ in 0..16 {
                if !self.zil.uses(top.id) {
                    break;
                }
                self.commit_device_change();
                self.wait_synced()?;
            }
            if self.zil.uses(top.id) {
                return refuse("the intent log still needs it; try again".into());
            }
        }
        self.tops.write().retain(|(_, t)| t.id != top.id);
        self.blocks.remove_vdev(top.id);
        self.blocks.alloc.lock().remove_vdev(top.id);
        self.config
            .lock()
            .change_devices(|cfg| cfg.vdevs.retain(|tc| tc.id != top.id));
        self.write_config(PoolState::Active)?;
        self.commit_device_change();
        if let Some(dev) = leaf.take_device() {
            let _ = label::clear_labels(dev.as_ref());
        }
        self.events.post(
            "sysevent.fs.zfs.vdev_remove",
            Some(&leaf.path()),
            format!("class={}", class.section().unwrap_or("data")),
        );
        Ok((class, top.guid))
    }

    /// A resilver finished and verified: the devices no longer lack anything; the
    /// configuration says so.
    pub fn resilvered(&self) -> Result<(), PoolError> {
        self.write_config(PoolState::Active)
    }

    /// Sets the `autoreplace` property (recorded in the labels).
    pub fn set_autoreplace(&self, on: bool) -> Result<(), PoolError> {
        self.config.lock().autoreplace = on;
        self.write_config(PoolState::Active)
    }

    /// With `autoreplace` on: every missing device (no device, or one that failed) whose
    /// path now holds a blank device (no label) among `devices` is replaced by it in place.
    /// Returns the paths replaced; each lacks every txg until resilvered.
    pub fn autoreplace(&self, devices: &[DeviceRef]) -> Vec<String> {
        if !self.config.lock().autoreplace {
            return Vec::new();
        }
        let mut done = Vec::new();
        for leaf in self.leaves() {
            let missing = matches!(
                leaf.state(),
                VdevState::Unavail | VdevState::Removed | VdevState::Faulted
            );
            if !missing || leaf.device().is_some() || leaf.spare_for().is_some() {
                continue;
            }
            let path = leaf.path();
            let Some(dev) = devices
                .iter()
                .find(|d| d.name() == path && label::best_label(d.as_ref()).is_none())
            else {
                continue;
            };
            if self.replace(&path, &path, dev.clone(), false).is_ok() {
                self.events.post(
                    "resource.fs.zfs.autoreplace",
                    Some(&path),
                    "a blank device took the missing one's place".into(),
                );
                done.push(path);
            }
        }
        done
    }

    /// The hot spare with this guid.
    fn spare_leaf(&self, guid: u64) -> Option<Arc<Leaf>> {
        self.tops()
            .iter()
            .filter(|(c, _)| *c == VdevClass::Spare)
            .flat_map(|(_, t)| t.leaves.iter())
            .find(|l| l.guid() == guid)
            .cloned()
    }

    /// Puts an available hot spare in the place of every failed device (FAULTED, UNAVAIL or
    /// REMOVED; not one taken offline) of the data vdevs; each lacks every txg until a
    /// resilver rebuilt it. Returns (failed device, spare) pairs.
    pub fn activate_spares(&self) -> Result<Vec<(String, String)>, PoolError> {
        let mut done = Vec::new();
        let asize = self.config.lock().leaf_asize;
        for (_, top) in self.tops().iter().filter(|(c, _)| *c == VdevClass::Normal) {
            for leaf in &top.leaves {
                let failed = matches!(
                    leaf.state(),
                    VdevState::Faulted | VdevState::Unavail | VdevState::Removed
                );
                if !failed || leaf.spare_for().is_some() {
                    continue;
                }
                let Some(spare) = self
                    .tops()
                    .iter()
                    .filter(|(c, _)| *c == VdevClass::Spare)
                    .flat_map(|(_, t)| t.leaves.iter())
                    .find(|s| {
                        s.is_usable() && s.device().is_some_and(|d| usable_size(d.size()) >= asize)
                    })
                    .cloned()
                else {
                    return Ok(done);
                };
                let Some(dev) = spare.take_device() else {
                    continue;
                };
                let (orig_guid, orig_path) = (leaf.guid(), leaf.path());
                spare.set_state(VdevState::Inuse, Some(format!("in use for {orig_path}")));
                let open = self.txg.open_txg();
                leaf.replace_device(spare.guid(), spare.path(), dev, open);
                leaf.set_spare_for(Some((orig_guid, orig_path.clone())));
                self.config.lock().change_devices(|cfg| {
                    for tc in cfg
                        .vdevs
                        .iter_mut()
                        .filter(|tc| tc.class != VdevClass::Spare)
                    {
                        for lc in &mut tc.children {
                            if lc.guid == orig_guid {
                                lc.guid = spare.guid();
                                lc.path = spare.path();
                                lc.spare_for = Some((orig_guid, orig_path.clone()));
                            }
                        }
                    }
                });
                self.config_changed.store(true, Ordering::Release);
                self.write_config(PoolState::Active)?;
                self.events.post(
                    "sysevent.fs.zfs.vdev_spare",
                    Some(&spare.path()),
                    format!("for=\"{orig_path}\""),
                );
                done.push((orig_path, spare.path()));
            }
        }
        Ok(done)
    }

    /// Clears the error counters (of one device or all) and brings faulted devices that
    /// still have their device back, as `zpool clear` does; returns the txgs each missed.
    pub fn clear(&self, name: Option<&str>) -> Result<Vec<MissedTxgs>, PoolError> {
        let leaves: Vec<Arc<Leaf>> = match name {
            Some(n) => vec![self.find_leaf(n)?.1],
            None => self.leaves(),
        };
        let mut missed = Vec::new();
        for leaf in leaves {
            leaf.clear_errors();
            if leaf.state() == VdevState::Faulted && leaf.device().is_some() {
                if let Some(m) = self.bring_back(&leaf, &leaf.path())? {
                    missed.push((leaf.path(), m));
                }
            }
        }
        Ok(missed)
    }

    fn leaves(&self) -> Vec<Arc<Leaf>> {
        self.tops()
            .iter()
            .flat_map(|(_, t)| t.leaves.iter().cloned())
            .collect()
    }

    /// The devices of the leaves that can take I/O: where uberblocks and heartbeats go.
    fn usable_devices(&self) -> Vec<DeviceRef> {
        self.leaves()
            .iter()
            .filter(|l| l.is_usable())
            .filter_map(|l| l.device())
            .collect()
    }

    fn top_guid_of(&self, leaf: &Leaf) -> u64 {
        self.tops()
            .iter()
            .find(|(_, t)| t.leaves.iter().any(|l| l.guid() == leaf.guid()))
            .map(|(_, t)| t.guid)
            .unwrap_or(0)
    }

    /// Writes the config with `state` to every usable leaf: L0/L2, flush, L1/L3, flush.
    fn write_config(&self, state: PoolState) -> Result<(), PoolError> {
        // Every leaf's dirty time log goes with the configuration (see `LeafConfig::dtl`).
        // From the data vdevs only: a hot spare in use appears twice with one guid, and its
        // entry in the spare class has no dirty time log (it would hide the one it has in
        // the vdev it stands in, and the resilver it needs would be forgotten).
        let dtls: HashMap<u64, Option<(u64, u64)>> = self
            .tops()
            .iter()
            .filter(|(c, _)| *c != VdevClass::Spare)
            .flat_map(|(_, t)| t.leaves.iter())
            .map(|l| (l.guid(), l.dtl()))
            .collect();
        let cfg = {
            let mut c = self.config.lock();
            for tc in c.vdevs.iter_mut().filter(|tc| tc.class != VdevClass::Spare) {
                for lc in &mut tc.children {
                    if let Some(dtl) = dtls.get(&lc.guid) {
                        lc.dtl = *dtl;
                    }
                }
            }
            c.state = state;
            c.hostname = self.host.hostname.clone();
            c.hostid = self.host.hostid;
            c.instance = self.host.instance;
            c.txg = c.txg.max(self.txg.synced_txg()) + 1;
            c.clone()
        };
        let mut written = 0;
        for half in [[0usize, 2], [1, 3]] {
            for leaf in self.leaves() {
                if let (true, Some(dev)) = (leaf.is_usable(), leaf.device()) {
                    let r = label::write_labels(
                        dev.as_ref(),
                        &cfg,
                        leaf.guid(),
                        self.top_guid_of(&leaf),
                        &half,
                    )
                    .and_then(|_| dev.flush().map_err(PoolError::from));
                    if r.is_ok() {
                        written += 1;
                    }
                }
            }
        }
        if written == 0 {
            return Err(PoolError::Import("could not write any label".into()));
        }
        Ok(())
    }

    /// Reads the labels of `devices` and lists the pools on them.
    pub fn scan(devices: &[DeviceRef]) -> Vec<ImportCandidate> {
        let mut pools: BTreeMap<u64, (PoolConfig, Vec<u64>)> = BTreeMap::new();
        for dev in devices {
            if let Some(l) = label::best_label(dev.as_ref()) {
                let entry = pools
                    .entry(l.pool_guid)
                    .or_insert_with(|| (l.config.clone(), Vec::new()));
                if l.config.txg > entry.0.txg {
                    entry.0 = l.config.clone();
                }
                entry.1.push(l.leaf_guid);
            }
        }
        pools
            .into_values()
            .map(|(cfg, found)| {
                let missing: Vec<String> = cfg
                    .leaves()
                    .filter(|(_, l)| !found.contains(&l.guid))
                    .map(|(_, l)| l.path.clone())
                    .collect();
                let importable = cfg
                    .vdevs
                    .iter()
                    .filter(|t| t.class == VdevClass::Normal)
                    .all(|t| {
                        let lost = t
                            .children
                            .iter()
                            .filter(|l| !found.contains(&l.guid))
                            .count();
                        let redundancy = match t.kind {
                            TopKind::Disk => 0,
                            TopKind::Mirror => t.children.len() - 1,
                            TopKind::Raidz => usize::from(t.parity),
                        };
                        lost <= redundancy
                    });
                ImportCandidate {
                    name: cfg.name.clone(),
                    guid: cfg.guid,
                    state: cfg.state.name().into(),
                    hostname: cfg.hostname.clone(),
                    devices_found: found.len(),
                    devices_total: cfg.leaves().count(),
                    missing,
                    importable,
                    vdevs: cfg
                        .vdevs
                        .iter()
                        .map(|t| {
                            format!(
                                "{}{}: {}",
                                t.class
                                    .section()
                                    .map(|s| format!("{s} "))
                                    .unwrap_or_default(),
                                match t.kind {
                                    TopKind::Disk => "disk".to_string(),
                                    TopKind::Mirror => "mirror".to_string(),
                                    TopKind::Raidz => format!("raidz{}", t.parity),
                                },
                                t.children
                                    .iter()
                                    .map(|l| l.path.as_str())
                                    .collect::<Vec<_>>()
                                    .join(" ")
                            )
                        })
                        .collect(),
                }
            })
            .collect()
    }

    /// Imports a pool from `devices` (any superset of its members).
    pub fn import(devices: &[DeviceRef], opts: &ImportOptions) -> Result<Arc<Pool>, PoolError> {
        let mut labels = Vec::new();
        for dev in devices {
            if let Some(l) = label::best_label(dev.as_ref()) {
                labels.push((l, dev.clone()));
            }
        }
        let mut guids: Vec<u64> = labels
            .iter()
            .filter(|(l, _)| match &opts.name {
                Some(n) => l.config.name == *n || l.config.guid.to_string() == *n,
                None => true,
            })
            .map(|(l, _)| l.pool_guid)
            .collect();
        guids.sort_unstable();
        guids.dedup();
        let guid = match guids.as_slice() {
            [] => {
                return Err(PoolError::Import(match &opts.name {
                    Some(n) => format!("cannot import '{n}': no such pool available"),
                    None => "no pools available to import".into(),
                }))
            }
            [g] => *g,
            _ => {
                return Err(PoolError::Import(
                    "more than one pool matches; import by numeric guid".into(),
                ))
            }
        };
        let mine: Vec<_> = labels
            .into_iter()
            .filter(|(l, _)| l.pool_guid == guid)
            .collect();
        let config = mine
            .iter()
            .map(|(l, _)| l.config.clone())
            .max_by_key(|c| c.txg)
            .expect("at least one label");
        let name = config.name.clone();
        let lacking = unsupported_features(
            &config,
            opts.supported_features.unwrap_or(SUPPORTED_FEATURES),
        );
        if let Some(f) = lacking.first() {
            return Err(PoolError::Import(format!(
                "cannot import '{name}': it uses feature '{f}', which this build does not support ({}); import it with a build that does",
                feature_meaning(f)
            )));
        }
        match config.state {
            PoolState::Destroyed if !opts.force => {
                return Err(PoolError::Import(format!(
                    "cannot import '{name}': pool was destroyed; use -f to import it anyway"
                )))
            }
            PoolState::Active if !config.imported_by(&opts.host) && !opts.force => {
                return Err(PoolError::Import(
                    if config.hostname != opts.host.hostname
                        || config.hostid != 0 && config.hostid != opts.host.hostid
                    {
                        format!(
                        "cannot import '{name}': pool may be in use from another system (host '{}', hostid 0x{:08x}); export it there, or use -f to import it anyway",
                        config.hostname, config.hostid
                    )
                    } else {
                        format!(
                        "cannot import '{name}': pool may be in use by another tank instance on this host (instance {:016x}, another data directory); export it there, or use -f to import it anyway",
                        config.instance
                    )
                    },
                ));
            }
            _ => {}
        }
        // With multihost on, the activity check: claim the devices and watch for another
        // writer (refused even with -f when one shows).
        let session = if config.multihost {
            let devs: Vec<&dyn BlockDevice> = mine.iter().map(|(_, d)| d.as_ref()).collect();
            Some(mmp::claim(&devs, &config, &opts.host, &opts.mmp)?)
        } else {
            None
        };
        let mut devs: HashMap<u64, DeviceRef> = HashMap::new();
        for (l, dev) in &mine {
            devs.entry(l.leaf_guid).or_insert_with(|| dev.clone());
        }
        let mut notes = Vec::new();
        for (_, l) in config.leaves() {
            if !devs.contains_key(&l.guid) {
                notes.push(format!("device {} (guid {}) is missing", l.path, l.guid));
            }
        }
        let tunables = opts.tunables.unwrap_or_default();
        let mut pool = Self::assemble(config.clone(), &devs, tunables, 1, notes)?;
        pool.host = opts.host.clone();
        pool.mmp = opts.mmp;
        for (class, top) in &pool.tops() {
            if *class == VdevClass::Normal && !top.readable() {
                let missing: Vec<String> = top
                    .leaves
                    .iter()
                    .filter(|l| !l.is_usable())
                    .map(|l| format!("{} ({})", l.path(), l.reason().unwrap_or_default()))
                    .collect();
                return Err(PoolError::Import(format!(
                    "cannot import '{name}': {} vdev {} has too many unavailable devices: {}",
                    top.type_name(),
                    top.id,
                    missing.join(", ")
                )));
            }
        }
        // Uberblocks from every usable leaf.
        // Uberblocks carry the guid sum of the configuration they were written with; the
        // labels may hold a newer one (a replaced device) not yet in any uberblock.
        let guid_sums: Vec<u64> = mine
            .iter()
            .flat_map(|(l, _)| {
                let mut sums = l.config.prev_guid_sums.clone();
                sums.push(l.config.guid_sum());
                sums
            })
            .chain([config.guid_sum()])
            .collect();
        let mut ubs: Vec<Uberblock> = Vec::new();
        for leaf in pool.leaves() {
            if let (true, Some(dev)) = (leaf.is_usable(), leaf.device()) {
                for (_, ub) in label::read_uberblocks(dev.as_ref(), config.ashift) {
                    if guid_sums.contains(&ub.guid_sum) && ub.version == FORMAT_VERSION {
                        ubs.push(ub);
                    }
                }
            }
        }
        ubs.sort_by_key(|u| std::cmp::Reverse(u.txg));
        ubs.dedup_by_key(|u| u.txg);
        let newest = ubs.first().map(|u| u.txg).ok_or_else(|| {
            PoolError::Import(format!("cannot import '{name}': no valid uberblock found"))
        })?;
        // Before anything is read: a device whose newest uberblock is older than the pool's
        // previous one missed the txgs between (it was offline, faulted or gone); it lacks
        // their blocks until a resilver, and reads of them do not touch it. A device that
        // lacks only the newest uberblock is taken as current: a crash while uberblocks were
        // being written leaves exactly that, and every block of that txg was flushed to every
        // device before its first uberblock (if one did miss them, checksums still tell).
        let mut missed_notes = Vec::new();
        for leaf in pool.leaves() {
            if let (true, Some(dev)) = (leaf.is_usable(), leaf.device()) {
                let last = leaf_last_txg(dev.as_ref(), config.ashift, &guid_sums);
                if last + 1 < newest {
                    leaf.set_dtl(Some((last + 1, newest)));
                    missed_notes.push(format!(
                        "device {} missed txgs {}..={}: it needs a resilver",
                        leaf.path(),
                        last + 1,
                        newest
                    ));
                }
            }
        }
        let mut chosen = None;
        let mut failures = Vec::new();
        for ub in ubs.iter().filter(|u| u.txg + DEFER_TXGS > newest) {
            match pool.load(ub) {
                Ok(()) => {
                    chosen = Some(*ub);
                    break;
                }
                Err(e) => {
                    failures.push((ub.txg, e.to_string()));
                    if !opts.rewind {
                        break;
                    }
                    // Reset what a failed load may have set up.
                    pool.blocks = Arc::new(BlockStore::new(
                        pool.tops().iter().map(|(_, t)| Some(t.clone())).collect(),
                        SpaceAllocator::new(),
                    ));
                    *pool.meta.lock() = Meta::default();
                }
            }
        }
        let Some(ub) = chosen else {
            let (txg, why) = failures
                .first()
                .cloned()
                .unwrap_or((newest, "unknown".into()));
            let older: Vec<u64> = ubs
                .iter()
                .filter(|u| u.txg < txg && u.txg + DEFER_TXGS > newest)
                .map(|u| u.txg)
                .collect();
            let hint = if opts.rewind {
                "no older transaction group within the rewind window verifies either".to_string()
            } else if let Some(t) = older.first() {
                let age = ubs
                    .iter()
                    .find(|u| u.txg == *t)
                    .map(|u| now_secs().saturating_sub(u.timestamp))
                    .unwrap_or(0);
                format!(
                    "'tank pool import -F {name}' can rewind to txg {t}, discarding the changes of the last {} txg(s) (committed within the last {age} s)",
                    newest - t
                )
            } else {
                "no older transaction group is available to rewind to".into()
            };
            return Err(PoolError::Import(format!(
                "cannot import '{name}': metadata of txg {txg} is damaged ({why}); {hint}"
            )));
        };
        if ub.txg < newest {
            // Make the rewind durable before anything is allocated: the newer uberblocks
            // point at blocks that are free again now.
            for leaf in pool.leaves() {
                if let (true, Some(dev)) = (leaf.is_usable(), leaf.device()) {
                    label::invalidate_newer(dev.as_ref(), config.ashift, ub.txg)?;
                    dev.flush()?;
                }
            }
            let lost = newest - ub.txg;
            pool.import_notes.push(format!(
                "rewound to txg {} (written {}): the changes of the last {lost} txg(s) were discarded",
                ub.txg,
                fmt_time(ub.timestamp)
            ));
        }
        pool.import_notes.extend(missed_notes);
        pool.load_log(
            &ub,
            ub.txg < newest,
            config.state == PoolState::Exported,
            opts,
        )?;
        let open = newest + 1;
        pool.txg = TxgManager::new(open, tunables);
        pool.txg.inner.lock().synced = ub.txg;
        {
            let mut alloc = pool.blocks.alloc.lock();
            alloc.begin_txg(open)?;
        }
        *pool.log_feature.lock() = config.features.iter().any(|f| f == FEATURE_INTENT_LOG);
        pool.write_config(PoolState::Active)?;
        let pool = Arc::new(pool);
        pool.start_sync_thread();
        if let Some(session) = session {
            pool.start_heartbeat(session);
        }
        Ok(pool)
    }

    /// Reads the intent log's chain from the loaded root block (see `zil.rs`). A chain that
    /// starts on a missing or unreadable log device refuses the import, unless the pool was
    /// exported (nothing can be in it) or `missing_log` (`-m`) says to discard it.
    fn load_log(
        &mut self,
        ub: &Uberblock,
        rewound: bool,
        exported: bool,
        opts: &ImportOptions,
    ) -> Result<(), PoolError> {
        let header = self.meta.lock().root.map(|r| r.log).unwrap_or_default();
        self.zil = crate::zil::IntentLog::new(Some(header));
        if header.guid == 0 {
            return Ok(());
        }
        if rewound {
            self.zil.discard();
            self.import_notes
                .push("the intent log was discarded with the rewound txgs".into());
            return Ok(());
        }
        let logs: Vec<(u32, u64)> = self
            .tops()
            .iter()
            .filter(|(c, _)| *c == VdevClass::Log)
            .map(|(_, t)| (t.id, t.space()))
            .collect();
        let region_of = |v: u32| -> Option<crate::zil::Region> {
            if let Some((id, space)) = logs.iter().find(|(id, _)| *id == v) {
                return Some(crate::zil::Region {
                    vdev: *id,
                    start: 0,
                    end: *space,
                });
            }
            header.region.filter(|r| r.vdev == v)
        };
        let blocks = self.blocks.clone();
        match self
            .zil
            .load(&header, ub.txg, &|id| blocks.vdev(id).ok(), &region_of)
        {
            Ok(()) => Ok(()),
            Err(e) if exported => {
                self.zil.discard();
                self.import_notes.push(format!(
                    "{e}; the pool was exported, so its intent log held nothing"
                ));
                Ok(())
            }
            Err(e) if opts.missing_log => {
                self.zil.discard();
                self.import_notes.push(format!(
                    "{e}: the intent log was discarded (-m); synchronous writes acknowledged after txg {} may be lost",
                    ub.txg
                ));
                Ok(())
            }
            Err(e) => Err(PoolError::Import(format!(
                "cannot import '{}': {e}, and the pool's intent log may hold synchronous writes acknowledged after txg {}; use -m to import without them (they are lost)",
                self.name(),
                ub.txg
            ))),
        }
    }

    /// Loads and verifies the metadata of one uberblock: root block, objset table, space map
    /// log (replayed into the allocator), history chain head, objset roots.
    fn load(&self, ub: &Uberblock) -> Result<(), PoolError> {
        let raw = self.blocks.read(&ub.root)?;
        let root = RootBlock::decode(&raw)?;
        if root.txg != ub.txg {
            return Err(PoolError::Corrupt(format!(
                "root block is of txg {}, uberblock of txg {}",
                root.txg, ub.txg
            )));
        }
        let objsets = match &root.objset_table {
            Some(bp) => decode_objset_table(&self.blocks.read(bp)?)?,
            None => Vec::new(),
        };
        for (id, bp) in &objsets {
            if let Some(bp) = bp {
                self.blocks.read_physical(bp).map_err(|e| {
                    PoolError::Corrupt(format!("root of object set {id} unreadable: {e}"))
                })?;
            }
        }
        if let Some(bp) = &root.history_head {
            history::decode(&self.blocks.read(bp)?)?;
        }
        // Space map chain, newest first, back to the condensed block.
        let mut chain = Vec::new();
        let mut next = root.spacemap_head;
        while let Some(bp) = next {
            let block = SpaceMapBlock::decode(&self.blocks.read(&bp)?)?;
            next = block.prev;
            let condensed = block.condensed;
            chain.push((bp, block));
            if condensed {
                break;
            }
            if chain.len() > CONDENSE_CHAIN as usize * 4 {
                return Err(PoolError::Corrupt("space map log chain too long".into()));
            }
        }
        if chain.last().is_some_and(|(_, b)| !b.condensed) {
            return Err(PoolError::Corrupt(
                "space map log chain has no start".into(),
            ));
        }
        let mut alloc = SpaceAllocator::new();
        for (class, top) in &self.tops() {
            alloc.add_vdev(
                top.id,
                top.space(),
                top.sector(),
                *class == VdevClass::Normal,
            );
        }
        for (_, block) in chain.iter().rev() {
            if !block.condensed {
                alloc.begin_txg(block.txg)?;
            }
            for r in &block.records {
                alloc.replay(r)?;
            }
        }
        // The newest log block and the root block are recorded by the next txg.
        let mut carry = Vec::new();
        for bp in [chain.first().map(|c| c.0), Some(ub.root)]
            .into_iter()
            .flatten()
        {
            for d in bp.dvas() {
                let rec = SpaceRecord {
                    vdev: d.vdev,
                    op: SpaceOp::Alloc,
                    offset: d.offset,
                    len: d.asize,
                    txg: ub.txg,
                };
                alloc.replay(&rec)?;
                carry.push(rec);
            }
        }
        alloc.begin_txg(ub.txg)?;
        alloc.take_pending();
        alloc.set_pending(carry);
        *self.blocks.alloc.lock() = alloc;
        let mut meta = self.meta.lock();
        meta.root = Some(root);
        meta.root_bp = Some(ub.root);
        meta.spacemap_chain = chain.iter().map(|c| c.0).collect();
        meta.objsets = objsets;
        Ok(())
    }

    /// The objset table as committed (for the object layer at open).
    pub fn objsets(&self) -> Vec<(u64, Option<BlockPtr>)> {
        self.meta.lock().objsets.clone()
    }

    pub fn set_syncer(&self, syncer: Arc<dyn Syncer>) {
        *self.syncer.lock() = Some(syncer);
    }

    fn suspended(&self) -> Option<String> {
        self.txg.inner.lock().failed.clone()
    }

    fn suspended_error(&self, reason: String) -> PoolError {
        PoolError::Suspended {
            pool: self.name(),
            reason,
        }
    }

    /// Dirty data held in memory for the open and the syncing txg, as the write throttle
    /// counts it (ZFS's `dp_dirty_total`).
    pub fn dirty_bytes(&self) -> u64 {
        let i = self.txg.inner.lock();
        i.dirty_open + i.dirty_syncing
    }

    /// The write throttle's state: dirty data against its limit, and how often writers were
    /// delayed or held (ZFS's `dmu_tx` kstats `dmu_tx_delay` and `dmu_tx_dirty_over_max`).
    pub fn write_throttle(&self) -> WriteThrottle {
        let i = self.txg.inner.lock();
        WriteThrottle {
            dirty_bytes: i.dirty_open + i.dirty_syncing,
            dirty_max: self.txg.tunables.dirty_max,
            delays: i.throttle_delays,
            waits: i.throttle_waits,
        }
    }

    /// Starts a transaction in the open txg, charged with `dirty_bytes` of new data. Refuses
    /// with NoSpace when the pool cannot hold the dirty data plus its parity and metadata.
    ///
    /// The check counts the dirty data already charged, at the worst vdev's inflation, and
    /// keeps the slop back; it and the charge are one step under the txg counters' lock, so
    /// writers that check at once cannot all take the same room. A transaction may charge
    /// more than it was admitted with (a write into part of a block holds the whole block,
    /// known only once it runs), so the check also keeps, for each running transaction and
    /// this one, the largest such extra seen (as ZFS's `dmu_tx_hold_write` counts whole
    /// blocks before it assigns).
    ///
    /// Space in flight is waited for instead of refused, as ZFS's `dmu_tx_wait` after its
    /// ERESTART: the dirty data's charge is an estimate that its sync settles (it often
    /// takes less, and nothing at all when it was freed first); frees are made by the sync
    /// of their txg, and their space comes back `DEFER_TXGS` txgs after it. While the open
    /// txg holds changes, or deferred frees could make room, the writer asks for a sync
    /// (one that commits even with nothing dirty, so that the deferral runs out) and looks
    /// again: a file removed from a full pool gives its space to the next write, rather
    /// than leaving writes refused until enough other txgs happen to pass. Refused when
    /// nothing in flight could make room (after one sync where the open txg holds changes);
    /// at most `DEFER_TXGS + 1` syncs otherwise.
    pub fn begin_tx(&self, dirty_bytes: u64) -> Result<Tx<'_>, PoolError> {
        if dirty_bytes == 0 {
            return self.txg.begin(0).map_err(|r| self.suspended_error(r));
        }
        let mut looks = 0;
        loop {
            // The free space is read between two looks at `synced`; when they differ, a sync
            // ended in between (its allocations out of `free`, its dirty data no longer
            // counted) and the view is taken again. While a sync runs, its allocations count
            // twice (in `free` and as its dirty data): on the safe side.
            let synced = self.synced_txg();
            let (free, slop, deferred) = {
                let a = self.blocks.alloc.lock();
                (a.free_bytes(), a.slop(), a.deferred_bytes())
            };
            let inflation = self.inflation();
            let charge = |bytes: u64| (bytes as f64 * inflation) as u64;
            let mut seen = (synced, 0);
            let room = |i: &TxgInner| {
                let pending = i.dirty_open + i.dirty_syncing;
                seen = (i.synced, pending);
                // Room for what each running transaction, this one too, may still charge.
                let extras = (i.active + 1) * i.max_extra;
                i.synced == synced && charge(pending + dirty_bytes + extras) + slop <= free
            };
            match self.txg.begin_if(dirty_bytes, room) {
                Ok(tx) => return Ok(tx),
                Err(Refused::Failed(reason)) => return Err(self.suspended_error(reason)),
                Err(Refused::NoRoom) => {}
            }
            let (now_synced, pending) = seen;
            if now_synced != synced {
                continue;
            }
            // The most that could come back: the dirty data's whole charge and the deferred
            // frees; and, before the first sync, frees the open txg may hold (they are known
            // once it syncs).
            let could = free + deferred + charge(pending);
            let frees_unknown =
                looks == 0 && self.syncer.lock().clone().is_some_and(|s| s.is_dirty());
            if looks > DEFER_TXGS || (charge(dirty_bytes) + slop > could && !frees_unknown) {
                return Err(PoolError::NoSpace(self.name()));
            }
            self.sync_for_space()?;
            looks += 1;
        }
    }

    /// Commits the open txg, even with nothing dirty in it, and waits for that.
    fn sync_for_space(&self) -> Result<(), PoolError> {
        let txg = self.open_txg();
        self.space_wanted.fetch_max(txg, Ordering::AcqRel);
        // A sync that looked at the flag just before it was set may go idle and answer the
        // wait without committing `txg`; the next one sees the flag.
        while self.synced_txg() < txg {
            self.note_change();
            self.wait_txg(txg)?;
        }
        Ok(())
    }

    /// Allocated bytes per logical byte in the worst vdev, plus metadata (a conservative
    /// estimate used only to refuse writes before the pool is full).
    fn inflation(&self) -> f64 {
        let worst = self
            .tops()
            .iter()
            .filter(|(c, _)| *c == VdevClass::Normal)
            .map(|(_, t)| t.asize(128 << 10) as f64 / (128u64 << 10) as f64)
            .fold(1.0, f64::max);
        worst * 1.1
    }

    pub fn open_txg(&self) -> u64 {
        self.txg.open_txg()
    }

    pub fn synced_txg(&self) -> u64 {
        self.txg.synced_txg()
    }

    /// Adds a line to the pool history (committed with the next txg).
    /// Must not be called while the caller holds a transaction.
    pub fn log_history(&self, command: &str) {
        // Entered like a transaction, so a quiesce sees the record or waits for it.
        let _gate = self.txg.gate.read();
        let txg = self.open_txg();
        self.meta.lock().history_pending.push(HistoryRecord {
            time: now_secs(),
            txg,
            host: hostname(),
            command: command.to_string(),
        });
        // A history line is a change like any transaction: waiters must see it committed.
        self.txg.inner.lock().tx_seq += 1;
        self.txg.wake_all();
    }

    /// Counts a change made outside a transaction (state the syncer writes when asked, such
    /// as a scrub's progress), so waiters for a sync get one.
    pub fn note_change(&self) {
        self.txg.inner.lock().tx_seq += 1;
        self.txg.wake_all();
    }

    /// The pool history, oldest first.
    pub fn history(&self) -> Result<Vec<HistoryRecord>, PoolError> {
        let (mut next, pending) = {
            let m = self.meta.lock();
            (
                m.root.and_then(|r| r.history_head),
                m.history_pending.clone(),
            )
        };
        let mut blocks = Vec::new();
        while let Some(bp) = next {
            let (prev, recs) = history::decode(&self.blocks.read(&bp)?)?;
            blocks.push(recs);
            next = prev;
        }
        let mut out: Vec<HistoryRecord> = blocks.into_iter().rev().flatten().collect();
        out.extend(pending);
        Ok(out)
    }

    /// The pool's own committed metadata blocks, for the scrub: the root block, the objset
    /// table, the space map log chain and the history chain. The objset trees are the layer
    /// above's to walk.
    pub fn metadata_blocks(&self) -> Result<Vec<BlockPtr>, PoolError> {
        let (root_bp, root, chain) = {
            let m = self.meta.lock();
            (m.root_bp, m.root, m.spacemap_chain.clone())
        };
        let mut out: Vec<BlockPtr> = root_bp.into_iter().collect();
        out.extend(root.and_then(|r| r.objset_table));
        out.extend(chain);
        let mut next = root.and_then(|r| r.history_head);
        while let Some(bp) = next {
            out.push(bp);
            next = history::decode(&self.blocks.read(&bp)?)?.0;
        }
        Ok(out)
    }

    /// Whether the pool was exported, destroyed or shut down.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Waits until every transaction that finished before this call is durable.
    pub fn wait_synced(&self) -> Result<(), PoolError> {
        let target = self.txg.inner.lock().open;
        self.wait_txg(target)
    }

    /// Starts writing the multihost heartbeat, going on with the import's claim `session`.
    fn start_heartbeat(self: &Arc<Self>, session: u64) {
        let writer = HeartbeatWriter::new(&self.config(), &self.host, session, self.mmp.interval);
        let weak = Arc::downgrade(self);
        *self.heartbeat_at.lock() = Some(Instant::now());
        let handle = std::thread::Builder::new()
            .name("mmp-heartbeat".into())
            .spawn(move || heartbeat_loop(weak, writer))
            .expect("spawn heartbeat thread");
        if let Some(old) = self.heartbeat.lock().replace(handle) {
            old.thread().unpark();
            let _ = old.join();
        }
    }

    /// Stops the heartbeat thread (the pool is closing, or `multihost` was turned off).
    fn stop_heartbeat(&self) {
        *self.heartbeat_at.lock() = None;
        let handle = self.heartbeat.lock().take();
        if let Some(h) = handle {
            if h.thread().id() != std::thread::current().id() {
                h.thread().unpark();
                let _ = h.join();
            }
        }
    }

    /// The `multihost` property (recorded in the labels). Turning it on starts the
    /// heartbeat at once; an import of the pool from now on watches for it.
    pub fn set_multihost(self: &Arc<Self>, on: bool) -> Result<(), PoolError> {
        if let Some(f) = self.suspended() {
            return Err(self.suspended_error(f));
        }
        let was = std::mem::replace(&mut self.config.lock().multihost, on);
        self.write_config(PoolState::Active)?;
        if on && !was {
            self.start_heartbeat(rand::random::<u64>() | 1);
        } else if !on {
            self.stop_heartbeat();
        }
        Ok(())
    }

    /// With a heartbeat running: refuses to write once none reached a device for the
    /// fail-stop delay (another host may be importing the pool by now).
    fn heartbeat_check(&self) -> Result<(), PoolError> {
        let Some(at) = *self.heartbeat_at.lock() else {
            return Ok(());
        };
        let silent = at.elapsed();
        if silent > self.mmp.fail_after() {
            return Err(PoolError::Multihost(format!(
                "multihost: no heartbeat could be written for {:.1} s (the limit is {:.1} s); the pool stops writing so that another host may import it safely",
                silent.as_secs_f64(),
                self.mmp.fail_after().as_secs_f64()
            )));
        }
        Ok(())
    }

    /// Whether the multihost heartbeat is being written.
    pub fn heartbeat_running(&self) -> bool {
        self.heartbeat
            .lock()
            .as_ref()
            .is_some_and(|h| !h.is_finished())
    }

    /// Sets what counts as a slow I/O on every leaf (tests; the default is ZFS's practice,
    /// see `tank_vdev::SlowIoPolicy`).
    pub fn set_slow_io_policy(&self, policy: SlowIoPolicy) {
        for leaf in self.leaves() {
            leaf.set_slow_io_policy(policy);
        }
    }

    /// Acts on slow I/O verdicts: a leaf whose vdev can spare it is FAULTED (its blocks are
    /// read from redundancy, its queue fails at once), another is DEGRADED.
    fn judge_slow_leaves(&self) {
        for (_, top) in self.tops() {
            for leaf in &top.leaves {
                if leaf.take_slow_verdict() {
                    let state = leaf.judge_slow(top.can_spare(leaf));
                    if state == VdevState::Faulted {
                        // The pool is no longer healthy: waiters see the change.
                        self.note_change();
                    }
                }
            }
        }
    }

    fn start_sync_thread(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let health = std::thread::Builder::new()
            .name("vdev-health".into())
            .spawn({
                let weak = weak.clone();
                move || health_loop(weak)
            })
            .expect("spawn health thread");
        *self.health.lock() = Some(health);
        let handle = std::thread::Builder::new()
            .name("txg-sync".into())
            .spawn(move || sync_loop(weak))
            .expect("spawn sync thread");
        *self.sync_thread.lock() = Some(handle);
    }

    /// One pass of the sync thread: quiesce the open txg and commit it. Returns false when
    /// there was nothing to do.
    fn sync_once(&self) -> Result<bool, PoolError> {
        self.heartbeat_check()?;
        let syncer = self.syncer.lock().clone();
        let txg = {
            let _gate = self.txg.gate.write();
            // `open` changes only here, under the gate.
            let open = self.open_txg();
            let history = !self.meta.lock().history_pending.is_empty()
                || self.config_changed.swap(false, Ordering::AcqRel)
                || self.space_wanted.load(Ordering::Acquire) >= open;
            let dirty = syncer.as_ref().is_some_and(|s| s.is_dirty());
            let mut inner = self.txg.inner.lock();
            if !dirty && !history {
                inner.idle_seq = inner.tx_seq;
                inner.dirty_open = 0;
                self.txg.cv.notify_all();
                return Ok(false);
            }
            let txg = inner.open;
            inner.open += 1;
            inner.dirty_syncing = inner.dirty_open;
            inner.dirty_open = 0;
            if let Some(s) = &syncer {
                s.quiesce(txg);
            }
            txg
        };
        let batch = IoBatch::new();
        self.blocks.alloc.lock().begin_txg(txg)?;
        let objsets = match &syncer {
            Some(s) => s.sync(&SyncContext {
                txg,
                blocks: &self.blocks,
                batch: &batch,
            })?,
            None => self.meta.lock().objsets.clone(),
        };
        let _ = batch.wait();
        self.blocks.check_writable()?;
        self.commit_txg(txg, objsets)?;
        {
            let mut inner = self.txg.inner.lock();
            inner.synced = txg;
            inner.dirty_syncing = 0;
            self.txg.cv.notify_all();
        }
        // A device failed since the last txg and a hot spare is free: it stands in at once.
        if self.spare_wanted() {
            match self.activate_spares() {
                Ok(list) if !list.is_empty() => {
                    if let Some(s) = &syncer {
                        s.devices_changed();
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    self.events
                        .post("sysevent.fs.zfs.vdev_spare", None, format!("error=\"{e}\""))
                }
            }
        }
        Ok(true)
    }

    /// Commits txg `txg`: pool-level blocks, flush, uberblocks, flush (invariant 2).
    fn commit_txg(&self, txg: u64, objsets: Vec<(u64, Option<BlockPtr>)>) -> Result<(), PoolError> {
        let batch = IoBatch::new();
        let mut meta = self.meta.lock();
        let blocks = &self.blocks;
        let old_root = meta.root;
        self.allocate_log_region(txg);
        // Objset table.
        if let Some(bp) = old_root.and_then(|r| r.objset_table) {
            blocks.free(&bp, txg)?;
        }
        let table = blocks.write(
            &encode_objset_table(&objsets),
            &WriteProps::critical(BlockKind::ObjsetTable),
            txg,
            1,
            &batch,
        )?;
        // History.
        let mut history_head = old_root.and_then(|r| r.history_head);
        let mut history_count = old_root.map(|r| r.history_count).unwrap_or(0);
        if !meta.history_pending.is_empty() {
            let recs = std::mem::take(&mut meta.history_pending);
            history_count += recs.len() as u64;
            let raw = history::encode(history_head.as_ref(), &recs);
            history_head = Some(blocks.write(
                &raw,
                &WriteProps::critical(BlockKind::History),
                txg,
                1,
                &batch,
            )?);
        }
        if let Some(bp) = meta.root_bp {
            blocks.free(&bp, txg)?;
        }
        // Space map log: condense when the chain is long (or on the first txg).
        let chain_len = old_root.map(|r| r.spacemap_chain).unwrap_or(0);
        let condense = chain_len == 0 || chain_len >= CONDENSE_CHAIN;
        let block = if condense {
            for bp in std::mem::take(&mut meta.spacemap_chain) {
                blocks.free(&bp, txg)?;
            }
            let mut alloc = blocks.alloc.lock();
            alloc.take_pending();
            SpaceMapBlock {
                txg,
                condensed: true,
                prev: None,
                records: alloc.condensed(),
            }
        } else {
            SpaceMapBlock {
                txg,
                condensed: false,
                prev: meta.spacemap_chain.first().copied(),
                records: blocks.alloc.lock().take_pending(),
            }
        };
        let sm_bp = blocks.write(
            &block.encode(),
            &WriteProps::critical(BlockKind::SpaceMapLog),
            txg,
            1,
            &batch,
        )?;
        let root = RootBlock {
            log: self.log_header(txg),
            txg,
            spacemap_chain: if condense { 1 } else { chain_len + 1 },
            history_count,
            objset_table: Some(table),
            spacemap_head: Some(sm_bp),
            history_head,
        };
        let root_bp = blocks.write(
            &root.encode(),
            &WriteProps::critical(BlockKind::RootBlock),
            txg,
            1,
            &batch,
        )?;
        let _ = batch.wait();
        blocks.check_writable()?;
        // Flush the blocks, then the uberblocks, then flush again.
        let batch = IoBatch::new();
        blocks.flush_all(&batch);
        let _ = batch.wait();
        blocks.check_writable()?;
        // The uberblock makes the txg the pool: not once another host may have taken it.
        self.heartbeat_check()?;
        let ub = Uberblock {
            version: FORMAT_VERSION,
            ashift: self.ashift(),
            txg,
            guid_sum: self.config.lock().guid_sum(),
            timestamp: now_secs(),
            root: root_bp,
        };
        let written = write_uberblocks(&self.usable_devices(), &ub);
        if written == 0 {
            return Err(PoolError::Corrupt(format!(
                "txg {txg}: no device accepted the uberblock"
            )));
        }
        meta.root = Some(root);
        meta.root_bp = Some(root_bp);
        meta.spacemap_chain.insert(0, sm_bp);
        meta.objsets = objsets;
        self.zil.committed(txg);
        Ok(())
    }

    /// The intent log's header for the root block of `txg`; allocates the log's region in
    /// the pool first if a commit wanted one (before the space map block takes the txg's
    /// allocations, so the caller calls this first).
    fn log_header(&self, txg: u64) -> crate::zil::LogHeader {
        let avoid = self.zil.avoided();
        let preferred = self
            .tops()
            .into_iter()
            .filter(|(c, t)| *c == VdevClass::Log && t.readable() && !avoid.contains(&t.id))
            .map(|(_, t)| crate::zil::Region {
                vdev: t.id,
                start: 0,
                end: t.space(),
            })
            .next()
            .or(self.zil.pool_region());
        self.zil.header_for(txg, preferred)
    }

    /// Allocates the intent log's region on a normal vdev when a commit asked for one:
    /// 1/128 of the normal class, from `zil::MIN_REGION` to `zil::MAX_REGION`. Without room
    /// the log keeps falling back to txg syncs.
    fn allocate_log_region(&self, txg: u64) {
        if !self.zil.wants_region() {
            return;
        }
        let normal: u64 = self
            .tops()
            .iter()
            .filter(|(c, _)| *c == VdevClass::Normal)
            .map(|(_, t)| t.space())
            .sum();
        let len = (normal / 128).clamp(crate::zil::MIN_REGION, crate::zil::MAX_REGION) >> 20 << 20;
        let mut alloc = self.blocks.alloc.lock();
        if alloc.free_bytes() < len * 4 {
            return;
        }
        if let Ok((vdev, start, len)) =
            alloc.alloc(&|_| len, &[], tank_block::AllocClass::Metadata, txg)
        {
            self.zil.set_pool_region(crate::zil::Region {
                vdev,
                start,
                end: start + len,
            });
        }
    }

    /// Runs `f` at a point where no transaction is running (the intent log takes the changes
    /// made so far there, so it never holds half of one).
    pub fn quiet<R>(&self, f: impl FnOnce() -> R) -> R {
        let _gate = self.txg.gate.write();
        f()
    }

    /// Writes `entries` to the intent log as one commit (see `zil.rs`); on any error the
    /// caller waits for a txg instead.
    pub fn log_write(
        &self,
        entries: Vec<crate::zil::LogEntry>,
    ) -> Result<(), crate::zil::LogError> {
        if let Some(f) = self.suspended() {
            return Err(crate::zil::LogError::Io(f));
        }
        self.set_log_feature(true)
            .map_err(|e| crate::zil::LogError::Io(e.to_string()))?;
        self.zil.write(entries, &|id| self.blocks.vdev(id).ok())
    }

    /// Lists (or drops) `intent_log` in the labels when it is not so already. Turned on
    /// before the first log block of a process is written, so that a build which cannot
    /// replay the log never imports the pool while the log may hold records; turned off once
    /// every record belongs to a committed txg (a clean close).
    fn set_log_feature(&self, on: bool) -> Result<(), PoolError> {
        let mut active = self.log_feature.lock();
        if *active == on {
            return Ok(());
        }
        let state = {
            let mut c = self.config.lock();
            c.features.retain(|f| f != FEATURE_INTENT_LOG);
            if on {
                c.features.push(FEATURE_INTENT_LOG.to_string());
            }
            c.state
        };
        self.write_config(state)?;
        *active = on;
        Ok(())
    }

    /// Waits until txg `txg` is committed, or until the sync thread found nothing dirty
    /// after every transaction started before this call had finished (all durable).
    pub fn wait_txg(&self, txg: u64) -> Result<(), PoolError> {
        let mut inner = self.txg.inner.lock();
        let seq = inner.tx_seq;
        inner.want = inner.want.max(txg);
        inner.want_seq = inner.want_seq.max(seq);
        self.txg.sync_cv.notify_one();
        loop {
            if let Some(f) = &inner.failed {
                return Err(self.suspended_error(f.clone()));
            }
            if inner.synced >= txg || inner.idle_seq >= seq {
                return Ok(());
            }
            // Not the `sync_thread` lock here: `close` joins the thread, which needs `inner`.
            if inner.shutdown && self.sync_stopped.load(Ordering::Acquire) {
                return Err(self.suspended_error("pool is closed".into()));
            }
            self.txg.cv.wait_for(&mut inner, Duration::from_millis(200));
        }
    }

    /// Syncs everything and stops the sync thread.
    fn close(&self) -> Result<(), PoolError> {
        if let Some(syncer) = self.syncer.lock().clone() {
            syncer.closing();
        }
        if self.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let synced = if self.suspended().is_none() {
            self.wait_synced()
        } else {
            Ok(())
        };
        self.txg.inner.lock().shutdown = true;
        self.txg.wake_all();
        // Joined without holding the `sync_thread` lock: a waiter for a txg looks at the
        // thread's state while it holds `inner`, which the syncing thread needs to finish
        // (that order once deadlocked a FUSE session's last sync against a dropped pool).
        let handle = self.sync_thread.lock().take();
        if let Some(h) = handle {
            let _ = h.join();
        }
        self.stop_heartbeat();
        let health = self.health.lock().take();
        if let Some(h) = health {
            h.thread().unpark();
            let _ = h.join();
        }
        self.sync_stopped.store(true, Ordering::Release);
        self.txg.wake_all();
        synced
    }

    /// Syncs and closes the pool, leaving it imported (marked active).
    pub fn shutdown(&self) -> Result<(), PoolError> {
        let mut r = self.close();
        if r.is_ok() && self.suspended().is_none() {
            // Everything is committed: the log holds nothing to replay.
            r = self.set_log_feature(false);
        }
        for leaf in self.leaves() {
            leaf.close();
        }
        r
    }

    /// `pool export`: syncs, marks the labels exported, closes the devices.
    pub fn export(&self) -> Result<(), PoolError> {
        self.close()?;
        if let Some(f) = self.suspended() {
            return Err(self.suspended_error(f));
        }
        self.config
            .lock()
            .features
            .retain(|f| f != FEATURE_INTENT_LOG);
        self.write_config(PoolState::Exported)?;
        *self.log_feature.lock() = false;
        for leaf in self.leaves() {
            leaf.close();
        }
        Ok(())
    }

    /// Lets go of a suspended pool without writing to it (its devices failed: nothing
    /// written now could be trusted): the sync thread stops and the devices close, leaving
    /// the pool as a crash would, its last committed txg and its intent log as they are on
    /// the devices. An import once the devices are fixed replays the log, as after a crash,
    /// so nothing committed is lost. Refused (`Ok(false)`) for a pool that is not suspended.
    pub fn abandon(&self) -> Result<bool, PoolError> {
        if self.suspended().is_none() {
            return Ok(false);
        }
        let _ = self.close();
        for leaf in self.leaves() {
            leaf.close();
        }
        Ok(true)
    }

    /// `pool destroy`: marks the labels destroyed and closes the devices.
    pub fn destroy(&self) -> Result<(), PoolError> {
        let _ = self.close();
        self.write_config(PoolState::Destroyed)?;
        for leaf in self.leaves() {
            leaf.close();
        }
        Ok(())
    }

    /// Size, free bytes and the data vdevs' capacity (parity-deflated; the slop not taken
    /// out, unlike [`Pool::space`]'s `usable`), without the costlier figures of
    /// [`Pool::space`] (deferred frees, fragmentation): what a check before each write
    /// needs.
    pub fn free_space(&self) -> (u64, u64, u64) {
        let (size, free) = {
            let a = self.blocks.alloc.lock();
            (a.size(), a.free_bytes())
        };
        let usable = self
            .tops()
            .iter()
            .filter(|(c, _)| *c == VdevClass::Normal)
            .map(|(_, t)| t.capacity())
            .sum();
        (size, free, usable)
    }

    pub fn space(&self) -> PoolSpace {
        let (size, free, usable) = self.free_space();
        let a = self.blocks.alloc.lock();
        PoolSpace {
            size,
            allocated: size - free,
            free,
            deferred: a.deferred_bytes(),
            usable: usable - usable / 32,
            fragmentation: a.fragmentation().unwrap_or(0),
        }
    }

    /// The pool's state: ONLINE, DEGRADED, SUSPENDED or UNAVAIL.
    pub fn state(&self) -> &'static str {
        if self.suspended().is_some() {
            return "SUSPENDED";
        }
        let mut state = "ONLINE";
        for (class, top) in self.tops().iter().filter(|(c, _)| *c != VdevClass::Spare) {
            match (top.state(), class) {
                (VdevState::Online, _) => {}
                (VdevState::Degraded, _) => state = "DEGRADED",
                (_, VdevClass::Normal) => return "UNAVAIL",
                _ => state = "DEGRADED",
            }
        }
        state
    }

    pub fn status(&self) -> PoolStatus {
        let spares: Vec<u64> = self
            .tops()
            .iter()
            .filter(|(c, _)| *c == VdevClass::Spare)
            .flat_map(|(_, t)| t.leaves.iter().map(|l| l.guid()))
            .collect();
        let leaf_status = |l: &Arc<Leaf>| {
            let s = l.stats.snapshot();
            // An idle hot spare is AVAIL, as zpool shows it.
            let idle_spare = spares.contains(&l.guid()) && l.is_usable() && l.spare_for().is_none();
            VdevStatus {
                name: l.path(),
                state: if idle_spare {
                    "AVAIL".into()
                } else {
                    l.state().name().into()
                },
                read_errors: s.read_errors,
                write_errors: s.write_errors,
                cksum_errors: s.cksum_errors,
                note: match (l.reason(), l.is_resilvering(), l.dtl()) {
                    (Some(r), _, _) => Some(r),
                    _ if l.spare_for().is_some() => Some(format!(
                        "(hot spare for {}{})",
                        l.spare_for().map(|s| s.1).unwrap_or_default(),
                        if l.is_resilvering() {
                            ", resilvering"
                        } else {
                            ""
                        }
                    )),
                    (None, true, Some((a, b))) => {
                        Some(format!("(resilvering: lacks txgs {a}..={b})"))
                    }
                    (None, true, None) => Some("(resilvering: verifying)".into()),
                    (None, false, _) => None,
                },
                children: Vec::new(),
                stats: s,
                path: Some(l.path()),
            }
        };
        let top_status = |t: &Arc<TopVdev>| {
            let children: Vec<VdevStatus> = t.leaves.iter().map(leaf_status).collect();
            match t.layout {
                Layout::Disk => children.into_iter().next().expect("one leaf"),
                _ => {
                    let sum = |f: fn(&VdevStatus) -> u64| children.iter().map(f).sum();
                    let mut stats = LeafStatsSnapshot::default();
                    for c in &children {
                        stats.read_ops += c.stats.read_ops;
                        stats.write_ops += c.stats.write_ops;
                        stats.read_bytes += c.stats.read_bytes;
                        stats.write_bytes += c.stats.write_bytes;
                    }
                    VdevStatus {
                        name: format!("{}-{}", t.type_name(), t.id),
                        state: t.state().name().into(),
                        read_errors: 0,
                        write_errors: 0,
                        cksum_errors: 0,
                        note: None,
                        stats: LeafStatsSnapshot {
                            read_errors: sum(|c| c.read_errors),
                            ..stats
                        },
                        children,
                        path: None,
                    }
                }
            }
        };
        let name = self.name();
        let mut config = Vec::new();
        let mut sections: Vec<(String, Vec<VdevStatus>)> = Vec::new();
        for (class, top) in &self.tops() {
            match class.section() {
                None => config.push(top_status(top)),
                Some(s) => match sections.iter_mut().find(|(n, _)| n == s) {
                    Some((_, v)) => v.push(top_status(top)),
                    None => sections.push((s.to_string(), vec![top_status(top)])),
                },
            }
        }
        let state = self.state();
        let suspended = self.suspended();
        let (status, action) = if let Some(r) = &suspended {
            (
                Some(format!(
                    "The pool is suspended: an I/O failure could not be repaired ({r})."
                )),
                Some(format!(
                    "Fix the devices, then run 'tank pool clear {}' (or export and import the pool).",
                    self.name()
                )),
            )
        } else if state != "ONLINE" {
            (
                Some("One or more devices could not be used or has failed. The pool continues without full redundancy.".to_string()),
                Some("Replace the failed devices, or reattach missing ones and import the pool again.".to_string()),
            )
        } else if self.leaves().iter().any(|l| {
            let s = l.stats.snapshot();
            s.read_errors + s.write_errors + s.cksum_errors > 0
        }) {
            (
                Some("One or more devices has experienced an error. Applications are unaffected: the data was repaired from redundancy.".to_string()),
                Some("Determine if the device needs to be replaced, and clear the errors with 'tank pool clear'.".to_string()),
            )
        } else {
            (None, None)
        };
        let rs = self.blocks.read_stats();
        PoolStatus {
            name: name.clone(),
            guid: self.guid(),
            state: state.into(),
            status,
            action,
            txg: self.synced_txg(),
            config: vec![VdevStatus {
                name,
                state: state.into(),
                read_errors: 0,
                write_errors: 0,
                cksum_errors: 0,
                note: None,
                children: config,
                stats: LeafStatsSnapshot::default(),
                path: None,
            }],
            sections,
            space: self.space(),
            healed_blocks: rs.healed_copies + rs.healed_in_vdev,
            leaked_gang_blocks: rs.leaked_gangs,
            suspended,
        }
    }

    /// Leaves for tests and tools: (top id, leaf).
    pub fn leaf_list(&self) -> Vec<(u32, Arc<Leaf>)> {
        self.tops()
            .iter()
            .flat_map(|(_, t)| t.leaves.iter().map(move |l| (t.id, l.clone())))
            .collect()
    }

    /// The uberblock and root block in use (for `debug`).
    pub fn root(&self) -> (Option<BlockPtr>, Option<RootBlockInfo>) {
        let m = self.meta.lock();
        (
            m.root_bp,
            m.root.map(|r| RootBlockInfo {
                txg: r.txg,
                spacemap_chain: r.spacemap_chain,
                history_count: r.history_count,
                objset_table: r.objset_table,
                spacemap_head: r.spacemap_head,
                history_head: r.history_head,
            }),
        )
    }

    /// The space map chain blocks, newest first (for `debug`).
    pub fn spacemap_chain(&self) -> Vec<BlockPtr> {
        self.meta.lock().spacemap_chain.clone()
    }
}

/// See [`Pool::write_throttle`].
#[derive(Debug, Clone, Copy, Serialize)]
pub struct WriteThrottle {
    pub dirty_bytes: u64,
    pub dirty_max: u64,
    /// Writers delayed between 60 % and 100 % of `dirty_max`.
    pub delays: u64,
    /// Times a writer slept at `dirty_max` until a sync made room.
    pub waits: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct RootBlockInfo {
    pub txg: u64,
    pub spacemap_chain: u32,
    pub history_count: u64,
    #[serde(skip)]
    pub objset_table: Option<BlockPtr>,
    #[serde(skip)]
    pub spacemap_head: Option<BlockPtr>,
    #[serde(skip)]
    pub history_head: Option<BlockPtr>,
}

/// A device and the txgs `[first, last]` it missed.
pub type MissedTxgs = (String, (u64, u64));

/// The newest txg whose uberblock a device holds (0 when none): it has every block of the
/// txgs up to it, since blocks are flushed before the uberblock is written.
fn leaf_last_txg(dev: &dyn tank_device::BlockDevice, ashift: u32, guid_sums: &[u64]) -> u64 {
    label::read_uberblocks(dev, ashift)
        .into_iter()
        .filter(|(_, ub)| guid_sums.contains(&ub.guid_sum) && ub.version == FORMAT_VERSION)
        .map(|(_, ub)| ub.txg)
        .max()
        .unwrap_or(0)
}

pub fn fmt_time(secs: u64) -> String {
    // Seconds since the epoch as UTC date and time, without a time-zone database.
    let days = secs / 86400;
    let rem = secs % 86400;
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}.{:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Howard Hinnant's days-to-civil algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719468;
    let era = z.div_euclid(146097);
    let doe = z.rem_euclid(146097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Writes a heartbeat record every `interval / leaves` until the pool closes or `multihost`
/// is turned off; suspends the pool when none could be written for the fail-stop delay.
fn heartbeat_loop(pool: std::sync::Weak<Pool>, mut writer: HeartbeatWriter) {
    loop {
        let Some(p) = pool.upgrade() else { return };
        if p.is_closed() || !p.config.lock().multihost || p.suspended().is_some() {
            return;
        }
        let devices = p.usable_devices();
        let devs: Vec<&dyn BlockDevice> = devices.iter().map(|d| d.as_ref()).collect();
        let silent = writer.beat(&devs, p.ashift(), p.synced_txg());
        if let Some(at) = p.heartbeat_at.lock().as_mut() {
            *at = Instant::now().checked_sub(silent).unwrap_or(*at);
        }
        let tick = p.mmp.interval / u32::try_from(devs.len().max(1)).unwrap_or(u32::MAX);
        if let Err(e) = p.heartbeat_check() {
            let reason = e.to_string();
            p.events.post(
                "ereport.fs.zfs.mmp_fail",
                None,
                format!("session={:016x} {reason}", writer.session()),
            );
            let mut inner = p.txg.inner.lock();
            if inner.failed.is_none() {
                inner.failed = Some(reason);
            }
            p.txg.wake_all();
            return;
        }
        drop(devices);
        drop(p);
        std::thread::park_timeout(tick);
    }
}

/// Looks at the leaves' slow I/O verdicts five times a second, apart from the sync thread
/// (which may be waiting on the slow device itself).
fn health_loop(pool: std::sync::Weak<Pool>) {
    loop {
        let Some(p) = pool.upgrade() else { return };
        if p.is_closed() {
            return;
        }
        p.judge_slow_leaves();
        drop(p);
        std::thread::park_timeout(Duration::from_millis(200));
    }
}

/// Most threads a txg's commit writes uberblocks with; a pool of more devices gives each
/// thread a few in turn.
const UBERBLOCK_THREADS: usize = 32;

/// Writes `ub` into the labels of every device and flushes each, the devices side by side
/// (ZFS's vdev_uberblock_sync_list issues them all at once); returns how many took it.
/// One device after another, each commit kept every other disk idle while one seeked to
/// its labels at both ends and flushed: about 40 ms a disk on an emulated hard disk, so
/// 0.3 s of every commit on a 7-disk raidz2.
fn write_uberblocks(devices: &[DeviceRef], ub: &Uberblock) -> usize {
    let one =
        |dev: &DeviceRef| label::write_uberblock(dev.as_ref(), ub).is_ok() && dev.flush().is_ok();
    if devices.len() <= 1 {
        return devices.iter().filter(|d| one(d)).count();
    }
    std::thread::scope(|scope| {
        let groups: Vec<_> = devices
            .chunks(devices.len().div_ceil(UBERBLOCK_THREADS))
            .map(|group| scope.spawn(move || group.iter().filter(|d| one(d)).count()))
            .collect();
        groups
            .into_iter()
            // A panic in a device's write is a bug below us: it goes on up, as it did when
            // the sync thread wrote the uberblocks itself.
            .map(|g| {
                g.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .sum()
    })
}

fn sync_loop(pool: std::sync::Weak<Pool>) {
    let mut last = Instant::now();
    loop {
        let Some(p) = pool.upgrade() else { return };
        let t = p.txg.tunables;
        let go = {
            let mut inner = p.txg.inner.lock();
            let wanted = |i: &crate::txg::TxgInner| i.wanted() || i.dirty_open >= t.dirty_sync;
            if !wanted(&inner) && !inner.shutdown {
                p.txg
                    .sync_cv
                    .wait_for(&mut inner, Duration::from_millis(250));
            }
            if inner.failed.is_some() {
                return;
            }
            inner.shutdown || wanted(&inner) || last.elapsed() >= t.timeout
        };
        if go {
            last = Instant::now();
            match p.sync_once() {
                Ok(_) => {}
                Err(e) => {
                    let mut inner = p.txg.inner.lock();
                    inner.failed = Some(e.to_string());
                    p.txg.wake_all();
                    return;
                }
            }
            let inner = p.txg.inner.lock();
            if inner.shutdown && inner.dirty_open == 0 && !inner.wanted() {
                drop(inner);
                // One more look: is anything left?
                let dirty = p.syncer.lock().clone().is_some_and(|s| s.is_dirty())
                    || !p.meta.lock().history_pending.is_empty();
                if !dirty {
                    return;
                }
            }
        }
        drop(p);
    }
}
