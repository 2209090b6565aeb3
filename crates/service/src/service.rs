//! The service: the running state above the datasets, and the one entry point every front
//! end calls.
//!
//! # Theory of operation
//! A [`Service`] owns what a running tank holds: the open pools ([`Pools`]), the mount
//! table and its FUSE front end ([`Mounts`]), the share registry, the account store, and
//! the long-running jobs. There are no process globals: the daemon makes one service for
//! its life; a command run without a daemon makes one for the command and closes it after
//! (its pools synced and closed, its scans stopped with their cursors kept).
//!
//! [`Service::handle`] takes the caller (found by the front end: SO_PEERCRED on the local
//! socket, a session or token over HTTPS) and a typed [`Request`]; it authorizes the
//! request for that caller ([`Service::access`]), runs it, and returns a typed
//! [`Response`] or a [`ServiceError`]. Notes for the user (warnings beside a result) are
//! collected in a [`Ctx`] and travel with the reply. A change is logged in the pool's
//! history with the command line the client sent, or the request's name.
//!
//! Requests that change one pool run one at a time on that pool (a per-pool lock), so two
//! destroys, or a create during a destroy, see each other's result rather than half of it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use crate::accounts::Accounts;
use crate::api::{Request, Response, API_VERSION};
use crate::caller::{authorize, Access, Caller};
use crate::error::ServiceError;
use crate::jobs::Jobs;
use crate::mounts::{pool_of, Mounts};
use crate::pools::{Opened, PoolCache, Pools};
use crate::shares::Registry;

pub type Res<T> = Result<T, ServiceError>;

/// Where a service runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The daemon: pools, mounts and scans outlive each request.
    Daemon,
    /// One command without a daemon: everything ends when the command does.
    Command,
}

/// One request's context: who asks, what they typed, and the notes for them.
pub struct Ctx<'a> {
    pub caller: &'a Caller,
    /// The command line for the pool history.
    pub command: String,
    pub notes: Vec<String>,
}

impl Ctx<'_> {
    pub fn note(&mut self, s: impl Into<String>) {
        self.notes.push(s.into());
    }
}

pub struct Service {
    data_dir: PathBuf,
    mode: Mode,
    pub(crate) pools: Pools,
    pub mounts: Mounts,
    pub shares: Registry,
    accounts: OnceLock<Accounts>,
    pub jobs: Jobs,
    /// Requests per protocol and operation, for the metrics.
    pub protocols: Arc<crate::stats::ProtocolStats>,
    /// One lock per pool name for requests that change it.
    pool_locks: Mutex<HashMap<String, Arc<Mutex<()>>>>,
    /// The runner of `dataset_bench`, installed by the program (it lives above this crate).
    benchmark: OnceLock<Arc<dyn crate::jobs::Benchmark>>,
    /// The length of a schedule's hour in seconds (3600; shorter only to try schedules out).
    pub(crate) schedule_hour_secs: std::sync::atomic::AtomicU64,
    /// Since when (seconds since 1970, f64 bits) the schedules' clock runs at that rate.
    pub(crate) schedule_origin: std::sync::atomic::AtomicU64,
    /// Replication tasks running now, by name: their jobs' progress.
    pub(crate) replicating: Mutex<HashMap<String, Arc<crate::jobs::Progress>>>,
    /// Filesystems unmounted for a receive that was cut and kept (`-s`), and where they
    /// were mounted: mounted there again when a receive finishes them.
    pub(crate) unmounted_for_receive: Mutex<HashMap<String, PathBuf>>,
    /// The S3 client of backups, installed by the program (it lives with the S3 front end).
    pub(crate) buckets: OnceLock<Arc<dyn crate::backup::BucketConnector>>,
    /// The layout planner of `layout_plan`, installed by the program (it lives with the
    /// benchmarks).
    planner: OnceLock<Arc<dyn Planner>>,
    /// Each pool's recent I/O, sampled by the daemon (`sample_io`).
    pub io_history: crate::iohistory::IoRecorder,
    /// Set at the first `sample_io` (which reads the saved history back).
    io_sampling: std::sync::atomic::AtomicBool,
    /// The ten-minute period of the last save of the I/O history.
    io_saved: std::sync::atomic::AtomicU64,
    /// Set by `shutdown` (after its save): sampling stops, so closed pools do not empty
    /// the history that a later save would then write.
    io_stopped: std::sync::atomic::AtomicBool,
    /// How many times this process let go of a pool's uncommitted changes without a
    /// restart (a suspended pool exported, or cleared and opened again): NFS mixes it into
    /// its write verifier, so that clients send their UNSTABLE writes again.
    lost_uncommitted: std::sync::atomic::AtomicU64,
}

/// The I/O history's file in the data directory (`iohistory.rs`).
pub const IO_HISTORY: &str = "io-history.json";

/// The benchmark history's file in the data directory, one JSON record a line.
pub const BENCH_HISTORY: &str = "bench-history.jsonl";

/// Appends one record to a history file (one JSON line, written whole).
pub fn append_history(path: &Path, record: &serde_json::Value) -> std::io::Result<()> {
    use std::io::Write;
    let mut line = serde_json::to_vec(record).map_err(std::io::Error::other)?;
    line.push(b'\n');
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?
        .write_all(&line)
}

/// What `layout_plan` asks of the planner.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanQuery {
    pub disks: usize,
    pub disk_bytes: u64,
    /// `hdd`, `ssd`, `nvme`, with overrides (as `tank plan --disk-type`).
    pub disk_type: String,
    /// `seq`, `random` or `mixed`.
    pub workload: String,
    /// One layout to assess (`1x7 raidz2`), with its warnings; none: every sensible one.
    pub layout: Option<String>,
}

/// The layout planner (`tank plan`'s model), installed by the program.
pub trait Planner: Send + Sync {
    /// The assessed layouts as `tank plan --json` prints them, plus `warnings` for a
    /// single layout asked; an error says what in the query is wrong.
    fn plan(&self, q: &PlanQuery) -> Result<serde_json::Value, String>;
}

impl Service {
    pub fn new(data_dir: &Path, mode: Mode) -> Self {
        let mounts = Mounts::default();
        Service {
            data_dir: data_dir.to_path_buf(),
            mode,
            pools: Pools::default(),
            protocols: mounts.protocols().clone(),
            mounts,
            shares: Registry::new(),
            accounts: OnceLock::new(),
            jobs: Jobs::default(),
            pool_locks: Mutex::new(HashMap::new()),
            benchmark: OnceLock::new(),
            schedule_hour_secs: std::sync::atomic::AtomicU64::new(3600),
            schedule_origin: std::sync::atomic::AtomicU64::new(0),
            replicating: Mutex::new(HashMap::new()),
            unmounted_for_receive: Mutex::new(HashMap::new()),
            buckets: OnceLock::new(),
            planner: OnceLock::new(),
            io_history: Default::default(),
            io_sampling: Default::default(),
            io_saved: Default::default(),
            io_stopped: Default::default(),
            lost_uncommitted: Default::default(),
        }
    }

    /// See `lost_uncommitted`: changes whenever writes acknowledged but not committed may
    /// have been dropped while the process ran on.
    pub fn lost_uncommitted_epoch(&self) -> u64 {
        self.lost_uncommitted
            .load(std::sync::atomic::Ordering::Acquire)
    }

    pub(crate) fn note_lost_uncommitted(&self) {
        self.lost_uncommitted
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// Installs the S3 client of backups (once; later calls are ignored).
    pub fn set_bucket_connector(&self, c: Arc<dyn crate::backup::BucketConnector>) {
        let _ = self.buckets.set(c);
    }

    /// Installs the layout planner (once; later calls are ignored).
    pub fn set_planner(&self, p: Arc<dyn Planner>) {
        let _ = self.planner.set(p);
    }

    /// Records one sample of every open pool's I/O into the history (the daemon calls
    /// this once a second).
    ///
    /// The history kept at the last stop is read back at the first call, and the history
    /// is written every ten minutes (and by `shutdown`).
    pub fn sample_io(&self) {
        if self.io_stopped.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let path = self.data_dir.join(IO_HISTORY);
        if !self
            .io_sampling
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            if let Err(e) = self.io_history.load(&path) {
                eprintln!(
                    "tank: the I/O history in {} cannot be read ({e}); it starts anew",
                    path.display()
                );
            }
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let open = self.open_pools();
        let names: Vec<String> = open.iter().map(|o| o.pool.name()).collect();
        for (o, name) in open.iter().zip(&names) {
            self.io_history
                .record(name, now, crate::iohistory::IoTotals::of(o));
        }
        self.io_history.keep_only(&names);
        let ten = (now as u64) / 600;
        if self.io_saved.swap(ten, std::sync::atomic::Ordering::SeqCst) != ten {
            self.save_io_history();
        }
    }

    /// Writes the I/O history to the data directory (if this service has sampled any).
    fn save_io_history(&self) {
        if !self.io_sampling.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let path = self.data_dir.join(IO_HISTORY);
        if let Err(e) = self.io_history.save(&path) {
            eprintln!(
                "tank: cannot keep the I/O history in {}: {e}",
                path.display()
            );
        }
    }

    /// Installs the runner of `dataset_bench` (once; later calls are ignored).
    pub fn set_benchmark(&self, runner: Arc<dyn crate::jobs::Benchmark>) {
        let _ = self.benchmark.set(runner);
    }

    pub(crate) fn benchmark(&self) -> Option<Arc<dyn crate::jobs::Benchmark>> {
        self.benchmark.get().cloned()
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    pub fn is_daemon(&self) -> bool {
        self.mode == Mode::Daemon
    }

    /// The account store, opened at first use (`DATA_DIR/accounts.redb`, mode 0600).
    pub fn accounts(&self) -> Res<&Accounts> {
        if let Some(a) = self.accounts.get() {
            return Ok(a);
        }
        std::fs::create_dir_all(&self.data_dir).map_err(|e| {
            ServiceError::Store(format!(
                "cannot create the data directory {}: {e}",
                self.data_dir.display()
            ))
        })?;
        let a = Accounts::open(&self.data_dir.join("accounts.redb"))?;
        Ok(self.accounts.get_or_init(|| a))
    }

    /// The caller on the local socket whose peer has `uid`.
    pub fn local_caller(&self, uid: u32) -> Res<Caller> {
        if uid == 0 {
            return Ok(Caller::Admin {
                name: "root".into(),
            });
        }
        Caller::local(self.accounts()?, uid)
    }

    /// The names of the imported pools (the cache file's).
    pub fn pool_names(&self) -> Res<Vec<String>> {
        Ok(PoolCache::load(&self.data_dir)?.names())
    }

    /// Opens (or finds open) a pool by name.
    pub fn open_pool(&self, name: &str, ctx: &mut Ctx) -> Res<Opened> {
        Ok(self.pools.open(&self.data_dir, name, &mut ctx.notes)?)
    }

    /// Opens (or finds open) a pool by name for a tool of this process (the daemon's start,
    /// `tank demo`); returns what the import noted beside it.
    pub fn open(&self, name: &str) -> Res<(Opened, Vec<String>)> {
        let mut notes = Vec::new();
        let o = self.pools.open(&self.data_dir, name, &mut notes)?;
        Ok((o, notes))
    }

    /// Holds the filesystem dataset or volume `name` for a front end (`what` says which,
    /// e.g. "nfs export x"); `holder` is told of renames, rollbacks, property changes and a
    /// forced destroy. Every holder of a dataset shares one open filesystem (or volume).
    pub fn hold(
        &self,
        name: &str,
        what: &str,
        holder: Arc<dyn crate::handles::Holder>,
    ) -> Res<crate::handles::Hold> {
        let (o, _) = self.open(pool_of(name))?;
        self.mounts
            .handles()
            .hold(&o.dsl, &o.store, name, what, holder)
    }

    /// Every pool this service holds open.
    pub fn open_pools(&self) -> Vec<Opened> {
        self.pools.all()
    }

    /// Opens every imported pool (for requests that span them: shares, a full listing).
    pub fn open_all(&self, ctx: &mut Ctx) -> Res<Vec<Opened>> {
        self.pool_names()?
            .iter()
            .map(|n| self.open_pool(n, ctx))
            .collect()
    }

    /// Keeps a newly created or imported pool open.
    pub fn adopt(&self, opened: Opened) {
        self.pools.adopt(opened);
    }

    pub(crate) fn pool_lock(&self, name: &str) -> Arc<Mutex<()>> {
        self.pool_locks
            .lock()
            .entry(pool_of(name).to_string())
            .or_default()
            .clone()
    }

    /// What a request needs of its caller.
    pub fn access(&self, req: &Request) -> Access {
        use Request as R;
        let owner_of = |id: &str| -> Option<String> {
            let a = self.accounts().ok()?;
            a.key(id)
                .ok()
                .flatten()
                .map(|k| k.user)
                .or_else(|| a.token(id).ok().flatten().map(|t| t.user))
        };
        match req {
            R::Hello
            | R::PoolList { .. }
            | R::PoolStatus { .. }
            | R::PoolHistory { .. }
            | R::PoolEvents { .. }
            | R::PoolGet { .. }
            | R::DatasetList { .. }
            | R::MountList
            | R::ShareList
            | R::ScheduleList
            | R::ReplicationList
            | R::JobList
            | R::JobGet { .. }
            | R::CacheStats
            | R::ParamList
            | R::PoolIostatHistory { .. }
            | R::BenchHistory { .. }
            | R::LayoutPlan { .. } => Access::Read,
            R::UserPasswd { name, .. } => Access::Account(name.clone()),
            R::KeyAdd { user } | R::TokenAdd { user } => Access::Account(user.clone()),
            R::KeyList { user: Some(u) } | R::TokenList { user: Some(u) } => {
                Access::Account(u.clone())
            }
            R::KeyRemove { access_key: id } | R::TokenRemove { id } => match owner_of(id) {
                Some(owner) => Access::Account(owner),
                None => Access::Admin,
            },
            _ => Access::Admin,
        }
    }

    /// The one entry point: authorizes `req` for `caller`, runs it, and returns its
    /// response with the notes for the user. `command` is what the user typed (for the
    /// pool history), if the request came from a command line.
    pub fn handle(
        &self,
        caller: &Caller,
        req: Request,
        command: Option<String>,
    ) -> (Res<Response>, Vec<String>) {
        let mut ctx = Ctx {
            caller,
            command: command.unwrap_or_else(|| format!("api {} ({})", req.op(), who(caller))),
            notes: Vec::new(),
        };
        let r = authorize(caller, &self.access(&req)).and_then(|()| self.dispatch(&mut ctx, req));
        (r, ctx.notes)
    }

    fn dispatch(&self, ctx: &mut Ctx, req: Request) -> Res<Response> {
        use Request as R;
        match req {
            R::Hello => Ok(Response::Hello {
                api_version: API_VERSION,
                version: env!("CARGO_PKG_VERSION").into(),
                caller: ctx.caller.name().map(String::from),
                admin: ctx.caller.is_admin(),
                daemon: self.is_daemon(),
            }),
            R::PoolList { .. }
            | R::PoolStatus { .. }
            | R::PoolCreate { .. }
            | R::PoolImport { .. }
            | R::PoolExport { .. }
            | R::PoolDestroy { .. }
            | R::PoolHistory { .. }
            | R::PoolEvents { .. }
            | R::PoolEventsClear { .. }
            | R::PoolScrub { .. }
            | R::PoolResilver { .. }
            | R::PoolOffline { .. }
            | R::PoolOnline { .. }
            | R::PoolClear { .. }
            | R::PoolReplace { .. }
            | R::PoolAttach { .. }
            | R::PoolDetach { .. }
            | R::PoolAdd { .. }
            | R::PoolRemove { .. }
            | R::PoolGet { .. }
            | R::PoolSet { .. } => self.pool_request(ctx, req),
            R::DatasetList { .. }
            | R::DatasetCreate { .. }
            | R::DatasetSet { .. }
            | R::DatasetInherit { .. }
            | R::DatasetRename { .. }
            | R::DatasetDestroy { .. }
            | R::DatasetBench { .. }
            | R::EmulatedBench { .. }
            | R::Snapshot { .. }
            | R::Rollback { .. }
            | R::Clone { .. }
            | R::Mount { .. }
            | R::Unmount { .. }
            | R::MountList => self.dataset_request(ctx, req),
            R::Send { .. } | R::Receive { .. } | R::ReceiveAbort { .. } | R::Bookmark { .. } => {
                self.stream_request(ctx, req)
            }
            R::ScheduleSet { .. } | R::ScheduleList => self.schedule_request(ctx, req),
            R::ReplicationAdd { .. }
            | R::ReplicationList
            | R::ReplicationRemove { .. }
            | R::ReplicationRun { .. } => self.replication_request(ctx, req),
            R::RemoteAdd { .. }
            | R::RemoteList
            | R::RemoteRemove { .. }
            | R::BackupSend { .. }
            | R::BackupRestore { .. }
            | R::BackupList { .. } => self.backup_request(ctx, req),
            R::UserAdd { .. }
            | R::UserPasswd { .. }
            | R::UserSet { .. }
            | R::UserList
            | R::UserRemove { .. }
            | R::AccountsExport
            | R::AccountsImport { .. }
            | R::GroupAdd { .. }
            | R::GroupList
            | R::GroupRemove { .. }
            | R::GroupMember { .. }
            | R::KeyAdd { .. }
            | R::KeyList { .. }
            | R::KeyRemove { .. }
            | R::TokenAdd { .. }
            | R::TokenList { .. }
            | R::TokenRemove { .. } => self.account_request(ctx, req),
            R::ShareAdd { .. } | R::ShareList | R::ShareSet { .. } | R::ShareRemove { .. } => {
                self.share_request(ctx, req)
            }
            R::CacheStats
            | R::ParamList
            | R::ParamSet { .. }
            | R::DebugTree { .. }
            | R::DebugObjectWrite { .. }
            | R::DebugObjectRead { .. }
            | R::DebugObjectRemove { .. }
            | R::DebugObjectList { .. } => self.engine_request(ctx, req),
            R::PoolIostatHistory { name } => {
                if let Some(n) = &name {
                    self.open_pool(n, ctx)?;
                }
                Ok(Response::IoHistory(
                    self.io_history.history(name.as_deref()),
                ))
            }
            R::LayoutPlan {
                disks,
                disk_bytes,
                disk_type,
                workload,
                layout,
            } => {
                let planner = self.planner.get().ok_or_else(|| {
                    ServiceError::Failed("this program has no layout planner".into())
                })?;
                let q = PlanQuery {
                    disks,
                    disk_bytes,
                    disk_type: disk_type.unwrap_or_else(|| "hdd".into()),
                    workload: workload.unwrap_or_else(|| "mixed".into()),
                    layout,
                };
                planner
                    .plan(&q)
                    .map(|plan| Response::Plan { plan })
                    .map_err(ServiceError::Invalid)
            }
            R::DeviceList { dir } => self.device_list(dir).map(Response::Devices),
            R::BenchHistory { limit } => {
                let path = self.data_dir.join(BENCH_HISTORY);
                let text = match std::fs::read_to_string(&path) {
                    Ok(t) => t,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
                    Err(e) => {
                        return Err(ServiceError::Failed(format!(
                            "cannot read {}: {e}",
                            path.display()
                        )))
                    }
                };
                // A line cut by a crash mid-append is skipped, not fatal.
                let all: Vec<serde_json::Value> = text
                    .lines()
                    .filter_map(|l| serde_json::from_str(l).ok())
                    .collect();
                let keep = limit.unwrap_or(50).min(all.len());
                Ok(Response::BenchHistory {
                    runs: all[all.len() - keep..].to_vec(),
                })
            }
            R::SnapshotBrowse {
                snapshot,
                path,
                cookie,
                limit,
            } => self
                .snapshot_browse(ctx, &snapshot, &path, cookie, limit.unwrap_or(200))
                .map(Response::Files),
            R::JobList => Ok(Response::Jobs(self.jobs.list(self))),
            R::JobGet { id } => self
                .jobs
                .get(self, id)
                .map(Response::Job)
                .ok_or_else(|| ServiceError::NotFound(format!("no such job {id}"))),
            R::JobCancel { id } => self.jobs.cancel(self, id).map(Response::Job),
        }
    }

    /// Stops the service: unmounts every filesystem and closes every pool. The daemon
    /// exports them (they stay in the cache file, so the next start imports them again);
    /// a command's service syncs and closes them. Returns what went wrong, one line each.
    pub fn shutdown(&self, export: bool) -> Vec<String> {
        // Work in the background stops first (a benchmark removes its files, a destroy
        // ends between datasets), before the mounts and pools go from under it.
        let mut problems: Vec<String> = self
            .jobs
            .stop_workers(std::time::Duration::from_secs(30))
            .into_iter()
            .map(|id| format!("job {id} did not stop within 30 s"))
            .collect();
        problems.extend(self.mounts.unmount_all());
        self.save_io_history();
        self.io_stopped
            .store(true, std::sync::atomic::Ordering::SeqCst);
        for opened in self.pools.all() {
            let name = opened.pool.name();
            let r = if export {
                opened.pool.log_history("tank serve (stop: export)");
                opened.pool.export()
            } else {
                opened.pool.shutdown()
            };
            if let Err(e) = r {
                problems.push(format!("cannot close '{name}': {e}"));
            }
            self.pools.forget(&name);
        }
        problems
    }
}

fn who(caller: &Caller) -> String {
    match caller {
        Caller::Admin { name } | Caller::User { name, .. } => name.clone(),
        Caller::Anonymous => "anonymous".into(),
    }
}

/// A device the host offers for a pool: a block device, or a file in a directory.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct DeviceEntry {
    pub path: String,
    /// `disk` or `file`.
    pub kind: String,
    pub size: u64,
    /// The disk's model, as the kernel names it.
    pub model: Option<String>,
    /// What uses it, if anything does: `pool NAME`, `mounted at DIR` (it or a
    /// partition), `swap`, `held by NAME` (a device-mapper or RAID layer over it).
    pub in_use: Option<String>,
}

/// What uses block device `name` (or one of its partitions), from the kernel's tables.
fn block_device_use(sys: &Path, name: &str, mounts: &str, swaps: &str) -> Option<String> {
    let mut parts = vec![name.to_string()];
    if let Ok(rd) = std::fs::read_dir(sys) {
        parts.extend(
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(name)),
        );
    }
    for p in &parts {
        let dev = format!("/dev/{p}");
        if let Some(dir) = mounts.lines().find_map(|l| {
            let mut f = l.split_whitespace();
            (f.next() == Some(dev.as_str())).then(|| f.next().unwrap_or("?").to_string())
        }) {
            return Some(format!("mounted at {dir}"));
        }
        if swaps
            .lines()
            .any(|l| l.split_whitespace().next() == Some(dev.as_str()))
        {
            return Some("swap".into());
        }
        let holders = if p == name {
            sys.join("holders")
        } else {
            sys.join(p).join("holders")
        };
        if let Some(h) = std::fs::read_dir(holders)
            .ok()
            .and_then(|mut rd| rd.next())
            .and_then(|e| e.ok())
        {
            return Some(format!("held by {}", h.file_name().to_string_lossy()));
        }
    }
    None
}

impl Service {
    /// The block devices of the host (loop, RAM and device-mapper devices left out) and the
    /// regular files of `dir` (an absolute directory; none: the data directory's `devices`,
    /// where the default pool's files are), each with the open pool that uses it.
    pub(crate) fn device_list(&self, dir: Option<PathBuf>) -> Res<Vec<DeviceEntry>> {
        let used: HashMap<String, String> = self
            .open_pools()
            .iter()
            .flat_map(|o| {
                let name = o.pool.name();
                o.pool
                    .leaf_list()
                    .into_iter()
                    .map(move |(_, l)| (l.path(), name.clone()))
            })
            .collect();
        let mut out = Vec::new();
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
        let pool_use = |path: &str| used.get(path).map(|p| format!("pool {p}"));
        if let Ok(rd) = std::fs::read_dir("/sys/block") {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if ["loop", "ram", "zram", "dm-", "sr", "fd"]
                    .iter()
                    .any(|p| name.starts_with(p))
                {
                    continue;
                }
                let sectors: u64 = std::fs::read_to_string(e.path().join("size"))
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                    .unwrap_or(0);
                if sectors == 0 {
                    continue;
                }
                let model = std::fs::read_to_string(e.path().join("device/model"))
                    .ok()
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty());
                let path = format!("/dev/{name}");
                out.push(DeviceEntry {
                    in_use: pool_use(&path)
                        .or_else(|| block_device_use(&e.path(), &name, &mounts, &swaps)),
                    path,
                    kind: "disk".into(),
                    size: sectors * 512,
                    model,
                });
            }
        }
        let dir = match dir {
            Some(d) if !d.is_absolute() => {
                return Err(ServiceError::Invalid(format!(
                    "'{}' is not an absolute directory",
                    d.display()
                )))
            }
            Some(d) => d,
            None => self.data_dir.join("devices"),
        };
        let mut files = Vec::new();
        match std::fs::read_dir(&dir) {
            Ok(rd) => {
                for e in rd.flatten() {
                    let Ok(md) = e.metadata() else { continue };
                    if !md.is_file() {
                        continue;
                    }
                    let path = e.path().to_string_lossy().into_owned();
                    files.push(DeviceEntry {
                        in_use: pool_use(&path),
                        path,
                        kind: "file".into(),
                        size: md.len(),
                        model: None,
                    });
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(ServiceError::Failed(format!(
                    "cannot list {}: {e}",
                    dir.display()
                )))
            }
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        out.sort_by(|a, b| a.path.cmp(&b.path));
        out.extend(files);
        Ok(out)
    }
}
