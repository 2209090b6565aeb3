//! The service's typed, versioned API: every management request and its response.
//!
//! # Theory of operation
//! A client sends an [`Envelope`]: the API version it speaks ([`API_VERSION`]), the
//! [`Request`] (tagged by `op`, e.g. `{"op": "pool_status", "name": "tank"}`) and, for the
//! pool history, the command line the user typed. The service answers with a [`Reply`]:
//! either `{"ok": RESPONSE, "notes": [...]}` or `{"error": {"kind": ..., "message": ...}}`.
//! Notes are what a command prints on standard error beside its result (a device that did
//! not open, a pool imported with a problem); the kinds of error are those of
//! [`ServiceError`], mapped once to HTTP status codes, errnos and exit codes.
//!
//! The same types travel over the local socket (one JSON object per line), over HTTPS, and
//! in-process when no daemon runs; `deny_unknown_fields` makes a misspelt field an error,
//! not a silently ignored one. A client of another major version is refused with a clear
//! message rather than misread.
//!
//! Paths in requests (devices, directories) are absolute: the client resolves them against
//! its own working directory before it sends them.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use tank_dataset::{DatasetInfo, DatasetKind};
use tank_pool::{HistoryRecord, ImportCandidate, PoolStatus};
use utoipa::ToSchema;

use crate::accounts::{Export, Group, User};
use crate::error::ServiceError;
use crate::shares::ShareInfo;

/// The API version this build speaks. A change that an older client would misread bumps it.
pub const API_VERSION: u32 = 1;

/// A request as it travels.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    pub version: u32,
    pub request: Request,
    /// The command line the user typed, for the pool history (`tank pool history`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
}

/// A reply as it travels.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Reply {
    Ok {
        response: Response,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        notes: Vec<String>,
    },
    Error(WireError),
}

/// An error as it travels: its kind (`not_found`, `busy`, ...) and message.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WireError {
    pub kind: String,
    pub message: String,
}

impl From<&ServiceError> for WireError {
    fn from(e: &ServiceError) -> Self {
        WireError {
            kind: e.kind().into(),
            message: e.message().into(),
        }
    }
}

impl From<WireError> for ServiceError {
    fn from(w: WireError) -> Self {
        ServiceError::from_wire(&w.kind, w.message)
    }
}

/// What a scrub request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ScrubAction {
    Start,
    Pause,
    Stop,
}

/// Every management request.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Who the service takes the caller for, and its versions.
    Hello,

    // Pools.
    PoolList {
        #[serde(default)]
        names: Vec<String>,
    },
    PoolStatus {
        #[serde(default)]
        name: Option<String>,
    },
    PoolCreate {
        name: String,
        /// The layout: vdev keywords and absolute device paths, as `zpool create` takes them.
        spec: Vec<String>,
        /// Create missing device files of this size (bytes).
        #[serde(default)]
        size: Option<u64>,
        #[serde(default)]
        force: bool,
        #[serde(default)]
        ashift: Option<u32>,
    },
    PoolImport {
        /// None: list the pools found instead.
        #[serde(default)]
        name: Option<String>,
        /// Directories to search (absolute); none: the data directory.
        #[serde(default)]
        #[schema(value_type = Vec<String>)]
        dirs: Vec<PathBuf>,
        #[serde(default)]
        rewind: bool,
        #[serde(default)]
        force: bool,
        #[serde(default)]
        missing_log: bool,
    },
    PoolExport {
        name: String,
    },
    PoolDestroy {
        name: String,
    },
    PoolHistory {
        #[serde(default)]
        name: Option<String>,
    },
    PoolEvents {
        #[serde(default)]
        name: Option<String>,
        /// Only events with a sequence number above this.
        #[serde(default)]
        since: u64,
    },
    PoolEventsClear {
        #[serde(default)]
        name: Option<String>,
    },
    PoolScrub {
        name: String,
        action: ScrubAction,
    },
    PoolResilver {
        name: String,
    },
    PoolOffline {
        name: String,
        device: String,
        #[serde(default)]
        temporary: bool,
    },
    PoolOnline {
        name: String,
        device: String,
    },
    PoolClear {
        name: String,
        #[serde(default)]
        device: Option<String>,
    },
    PoolReplace {
        name: String,
        old: String,
        /// Absolute; none: the disk at the old device's place.
        #[serde(default)]
        new: Option<String>,
        #[serde(default)]
        size: Option<u64>,
        #[serde(default)]
        force: bool,
    },
    PoolAttach {
        name: String,
        existing: String,
        new: String,
        #[serde(default)]
        size: Option<u64>,
        #[serde(default)]
        force: bool,
    },
    PoolDetach {
        name: String,
        device: String,
    },
    PoolAdd {
        name: String,
        spec: Vec<String>,
        #[serde(default)]
        size: Option<u64>,
        #[serde(default)]
        force: bool,
    },
    PoolRemove {
        name: String,
        devices: Vec<String>,
    },
    PoolGet {
        name: String,
    },
    PoolSet {
        name: String,
        property: String,
        value: String,
    },

    // Datasets, snapshots, clones.
    DatasetList {
        /// Datasets to list (and, with `recursive`, their descendants); none: every one.
        #[serde(default)]
        names: Vec<String>,
        #[serde(default)]
        recursive: bool,
        /// Only these kinds (`zfs list -t`); none: every kind. A dataset named without
        /// `recursive` is listed whatever its kind.
        #[serde(default)]
        #[schema(value_type = Vec<String>)]
        types: Vec<DatasetKind>,
    },
    DatasetCreate {
        name: String,
        #[schema(value_type = String)]
        kind: DatasetKind,
        #[serde(default)]
        #[schema(value_type = Vec<Vec<String>>)]
        props: Vec<(String, String)>,
        #[serde(default)]
        parents: bool,
    },
    DatasetSet {
        name: String,
        #[schema(value_type = Vec<Vec<String>>)]
        props: Vec<(String, String)>,
    },
    DatasetInherit {
        name: String,
        property: String,
        #[serde(default)]
        recursive: bool,
    },
    DatasetRename {
        from: String,
        to: String,
    },
    DatasetDestroy {
        name: String,
        #[serde(default)]
        recursive: bool,
        /// Also clones of the snapshots destroyed.
        #[serde(default)]
        dependents: bool,
        /// Even while front ends hold it (they are told, and let go).
        #[serde(default)]
        force: bool,
        /// Answer at once with a job, and destroy the datasets one by one in the
        /// background (children first), with progress in bytes freed.
        #[serde(default)]
        background: bool,
    },
    /// Benchmark a mounted filesystem the way bonnie++ does (streams, random seeks, small
    /// files, a tree copy), as a job in the background; its figures come with the job.
    DatasetBench {
        dataset: String,
        #[serde(default)]
        params: BenchParams,
    },
    /// Benchmark an emulated build (`tank bench --emulate`), e.g. `7x hdd raidz2 + ssd log`:
    /// a pool of sparse files paced to the devices' profiles, made in the data directory,
    /// measured as `dataset_bench` measures a filesystem, and removed after; a job, one at a
    /// time. Its filesystem caches metadata only, so the service's ARC neither flatters its
    /// reads nor gives up the pools' data to it.
    EmulatedBench {
        build: String,
        #[serde(default)]
        params: BenchParams,
    },
    Snapshot {
        names: Vec<String>,
        #[serde(default)]
        recursive: bool,
    },
    Rollback {
        snapshot: String,
        /// Destroy the snapshots more recent than the one rolled back to.
        #[serde(default)]
        destroy_later: bool,
    },
    Clone {
        snapshot: String,
        target: String,
        #[serde(default)]
        #[schema(value_type = Vec<Vec<String>>)]
        props: Vec<(String, String)>,
    },
    /// A stream of a snapshot (`tank send`), written on the connection after the reply
    /// (see `Service::send_stream`); `token` resumes an interrupted receive instead.
    Send {
        #[serde(default)]
        snapshot: Option<String>,
        /// `-i` / `-I`: the base snapshot or bookmark.
        #[serde(default)]
        from: Option<String>,
        #[serde(default)]
        intermediates: bool,
        /// `-c`: blocks as stored.
        #[serde(default)]
        compressed: bool,
        /// `-R`: the descendants too, with every snapshot.
        #[serde(default)]
        replicate: bool,
        #[serde(default)]
        token: Option<String>,
        /// `-n`: no stream, only what it would be (snapshots, estimated bytes); answered
        /// by `handle` like any request.
        #[serde(default)]
        dry_run: bool,
    },
    /// A stream into a dataset (`tank receive`), read from the connection after the request
    /// (see `Service::receive_stream`).
    Receive {
        dataset: String,
        /// `-F`: roll the target back to the stream's base first.
        #[serde(default)]
        force: bool,
        /// `-s`: keep an interrupted receive, with a resume token.
        #[serde(default)]
        resumable: bool,
        /// `-u`: do not mount what was received.
        #[serde(default)]
        no_mount: bool,
        #[serde(default)]
        #[schema(value_type = Vec<Vec<String>>)]
        props: Vec<(String, String)>,
    },
    /// `tank receive -A`: abandon an unfinished receive.
    ReceiveAbort {
        dataset: String,
    },
    /// Sets (or, with no schedule, removes) a dataset's snapshot schedule.
    ScheduleSet {
        dataset: String,
        #[serde(default)]
        #[schema(value_type = Option<Object>)]
        schedule: Option<tank_dataset::autosnap::Schedule>,
    },
    /// Every dataset's schedule and its snapshots.
    ScheduleList,
    /// `tank replicate add`: a task that keeps a dataset's snapshots on another tank host,
    /// over SSH (replaces a task of the same name).
    ReplicationAdd {
        #[schema(value_type = Object)]
        task: ReplicationSpec,
    },
    /// Every replication task, with its state.
    ReplicationList,
    ReplicationRemove {
        name: String,
    },
    /// Runs a task now (in the caller's request), and answers when it has finished.
    ReplicationRun {
        name: String,
    },
    /// `tank remote add`: an S3 endpoint for backups (replaces one of the same name).
    RemoteAdd {
        name: String,
        /// `http[s]://HOST[:PORT]`.
        endpoint: String,
        access_key: String,
        secret_key: String,
        #[serde(default)]
        region: Option<String>,
        /// Encrypt backups through this remote: 64 hex digits, or `generate` for a new key
        /// (shown once, in the answer).
        #[serde(default)]
        encryption_key: Option<String>,
    },
    RemoteList,
    RemoteRemove {
        name: String,
    },
    /// `tank send ... --to s3://BUCKET/PREFIX --remote NAME`: a stream stored as an object.
    BackupSend {
        snapshot: String,
        #[serde(default)]
        from: Option<String>,
        #[serde(default)]
        intermediates: bool,
        remote: String,
        url: String,
    },
    /// `tank receive ... --from s3://BUCKET/PREFIX --remote NAME`: a chain of stored
    /// streams received, up to `snapshot` (the newest when none).
    BackupRestore {
        dataset: String,
        remote: String,
        url: String,
        #[serde(default)]
        snapshot: Option<String>,
        #[serde(default)]
        force: bool,
        #[serde(default)]
        no_mount: bool,
    },
    /// `tank remote list-backups NAME s3://BUCKET/PREFIX`.
    BackupList {
        remote: String,
        url: String,
    },
    /// The files of a snapshot, one directory at a time (administrators).
    SnapshotBrowse {
        snapshot: String,
        /// A directory from the snapshot's root (`/`, `docs/2024`); none: the root.
        #[serde(default)]
        path: String,
        /// Where to go on from (a listing's `next`); none: the start.
        #[serde(default)]
        cookie: u64,
        /// Most entries (up to 1,000; default 200).
        #[serde(default)]
        limit: Option<usize>,
    },
    /// `tank bookmark POOL/DS@SNAP POOL/DS#MARK`.
    Bookmark {
        snapshot: String,
        bookmark: String,
    },
    Mount {
        dataset: String,
        #[serde(default)]
        #[schema(value_type = Option<String>)]
        dir: Option<PathBuf>,
    },
    Unmount {
        /// A mounted dataset, or its directory (absolute).
        target: String,
    },
    MountList,

    // Accounts.
    UserAdd {
        name: String,
        #[serde(default)]
        uid: Option<u32>,
        #[serde(default)]
        groups: Vec<String>,
        #[serde(default)]
        admin: bool,
        #[serde(default)]
        password: Option<String>,
    },
    UserPasswd {
        name: String,
        password: String,
    },
    UserSet {
        name: String,
        #[schema(value_type = Vec<Vec<String>>)]
        settings: Vec<(String, String)>,
    },
    UserList,
    UserRemove {
        name: String,
    },
    AccountsExport,
    AccountsImport {
        #[schema(value_type = Object)]
        data: Export,
    },
    GroupAdd {
        name: String,
        #[serde(default)]
        gid: Option<u32>,
    },
    GroupList,
    GroupRemove {
        name: String,
    },
    GroupMember {
        group: String,
        user: String,
        add: bool,
    },
    KeyAdd {
        user: String,
    },
    KeyList {
        #[serde(default)]
        user: Option<String>,
    },
    KeyRemove {
        access_key: String,
    },
    TokenAdd {
        user: String,
    },
    TokenList {
        #[serde(default)]
        user: Option<String>,
    },
    TokenRemove {
        id: String,
    },

    // Shares.
    ShareAdd {
        protocol: String,
        name: String,
        dataset: String,
        #[serde(default)]
        options: BTreeMap<String, String>,
    },
    ShareList,
    ShareSet {
        name: String,
        #[schema(value_type = Vec<Vec<String>>)]
        settings: Vec<(String, String)>,
    },
    ShareRemove {
        name: String,
    },

    /// Each pool's recent I/O (rates per second): the last hour by the second, the last
    /// week by the minute, as the daemon has sampled it since it started.
    PoolIostatHistory {
        #[serde(default)]
        name: Option<String>,
    },
    /// `tank plan`'s model: the sensible layouts of `disks` disks of `disk_bytes` each
    /// (or one `layout`, with warnings), with capacity, reliability and speed.
    LayoutPlan {
        disks: usize,
        disk_bytes: u64,
        /// `hdd` (default), `ssd`, `nvme`, with overrides (`hdd:bw=200M`).
        #[serde(default)]
        disk_type: Option<String>,
        /// `seq`, `random` or `mixed` (default).
        #[serde(default)]
        workload: Option<String>,
        /// One layout, `VDEVSxWIDTH KIND` (`1x7 raidz2`).
        #[serde(default)]
        layout: Option<String>,
    },
    /// The benchmark history (`DATA_DIR/bench-history.jsonl`): the figures of the last
    /// `limit` runs (default 50), oldest first, as `tank bench --compare` reads them.
    BenchHistory {
        #[serde(default)]
        limit: Option<usize>,
    },
    /// The devices the host offers for pools: block devices, and the files of a directory.
    DeviceList {
        /// Absolute; none: the data directory's `devices`.
        #[serde(default)]
        #[schema(value_type = Option<String>)]
        dir: Option<PathBuf>,
    },

    // The caches and tunables.
    /// The ARC's counters and each open pool's L2ARC and intent log.
    CacheStats,
    ParamList,
    ParamSet {
        name: String,
        value: String,
    },

    // Engine inspection (zdb's role).
    DebugTree {
        pool: String,
        objset: u64,
        limit: usize,
    },
    DebugObjectWrite {
        pool: String,
        objset: u64,
        block_size: u32,
        /// The bytes, hex-encoded.
        data: String,
    },
    DebugObjectRead {
        pool: String,
        objset: u64,
        id: u64,
        offset: u64,
        length: u64,
    },
    DebugObjectRemove {
        pool: String,
        objset: u64,
        id: u64,
    },
    DebugObjectList {
        pool: String,
        objset: u64,
    },

    // Jobs.
    JobList,
    JobGet {
        id: u64,
    },
    /// Stop a job: a benchmark or background destroy at its next step, a scrub at once (a
    /// resilver cannot be stopped, as in ZFS).
    JobCancel {
        id: u64,
    },
}

/// What a benchmark job measures; every field has a default.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BenchParams {
    /// Bytes written and read by the stream phases (default: twice the RAM, so that no
    /// cache can flatter the result; 1 GiB for an emulated build).
    #[serde(default)]
    pub size: Option<u64>,
    /// Request size of the stream phases (default 128 KiB).
    #[serde(default)]
    pub recordsize: Option<u64>,
    /// Runs; the figures are their median, with min and max (default 3).
    #[serde(default)]
    pub runs: Option<u32>,
    /// Parallel workers, started together (default 1).
    #[serde(default)]
    pub jobs: Option<u32>,
    /// Files of the small-file phase (default 16,384, as bonnie++).
    #[serde(default)]
    pub files: Option<u32>,
    /// Files of the tree copy test (default 2,000).
    #[serde(default)]
    pub tree_files: Option<u32>,
    /// Random 8 KiB reads of the seek phase (default 8,000).
    #[serde(default)]
    pub seeks: Option<u32>,
    /// fdatasync after every write.
    #[serde(default)]
    pub sync: bool,
    /// The run's name in the benchmark history (default: the dataset's name).
    #[serde(default)]
    pub label: Option<String>,
}

impl Request {
    /// The request's name on the wire (`pool_status`).
    pub fn op(&self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| v.get("op").and_then(|o| o.as_str()).map(String::from))
            .unwrap_or_default()
    }
}

/// One pool, as `pool list` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct PoolSummary {
    pub name: String,
    pub guid: u64,
    pub size: u64,
    pub allocated: u64,
    pub free: u64,
    /// Percent of the size allocated.
    pub capacity: u64,
    pub health: String,
    pub ashift: u32,
    pub txg: u64,
    pub usable: u64,
    /// Free-space fragmentation in percent.
    pub fragmentation: u64,
}

/// A pool's status with its scan and its permanent errors, as `pool status` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PoolReport {
    #[serde(flatten)]
    #[schema(value_type = Object)]
    pub status: PoolStatus,
    pub scan: ScanReport,
    /// Files with permanent errors, named.
    pub errors: Vec<String>,
    /// What the import noted (the pool was opened with a problem).
    #[serde(default)]
    pub import_notes: Vec<String>,
}

/// A scan (scrub or resilver) as reported, with who runs it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ScanReport {
    #[serde(flatten)]
    #[schema(value_type = Object)]
    pub status: tank_object::ScanStatus,
    /// Who runs an active scan: `daemon`, or `none` when only this command's process held
    /// the pool (it stops with it); null when no scan is active.
    pub runner: Option<String>,
}

/// A pool property with its source.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct PoolProp {
    pub property: String,
    pub value: String,
    pub source: String,
}

/// One event of one pool.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct PoolEvent {
    pub pool: String,
    pub seq: u64,
    pub time: f64,
    pub class: String,
    pub vdev: Option<String>,
    pub detail: String,
}

/// A FUSE mount (or another holder's) of a dataset.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct MountInfo {
    pub dataset: String,
    #[schema(value_type = String)]
    pub dir: PathBuf,
}

/// A long-running operation.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct Job {
    pub id: u64,
    /// `scrub`, `resilver`, ...
    pub kind: String,
    /// What it works on (a pool, a dataset).
    pub target: String,
    /// `running`, `canceling`, `paused`, `finished`, `canceled`, `failed`.
    pub state: String,
    /// Seconds since 1970.
    pub started: u64,
    pub done_bytes: u64,
    pub total_bytes: u64,
    /// Bytes per second, while running.
    pub rate: f64,
    pub eta_secs: Option<f64>,
    /// How it ended, or what it is doing.
    pub detail: String,
    /// What it produced, when it has a result (a benchmark's figures).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub result: Option<serde_json::Value>,
}

/// A newly made S3 access key: the secret is shown this once.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NewKey {
    pub user: String,
    pub access_key: String,
    pub secret_key: String,
}

/// A newly made API token: shown this once.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NewToken {
    pub user: String,
    pub id: String,
    pub token: String,
}

/// A dataset's snapshot schedule, and what it has taken.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ScheduleInfo {
    pub dataset: String,
    #[schema(value_type = Object)]
    pub schedule: tank_dataset::autosnap::Schedule,
    /// Per period (hourly, daily, weekly, monthly): the snapshots kept now.
    #[schema(value_type = Vec<Vec<String>>)]
    pub kept: Vec<(String, usize)>,
    pub newest: Option<String>,
}

/// What a replication task does (`tank replicate add`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct ReplicationSpec {
    /// Letters, digits, `.`, `_` and `-`.
    pub name: String,
    /// The dataset whose snapshots are sent (POOL/DS).
    pub source: String,
    /// `ssh://[USER@]HOST[:PORT]/POOL/DS`, or `s3://BUCKET/PREFIX` (with `remote`).
    pub target: String,
    /// Bytes per second at most (none: as fast as it goes).
    #[serde(default)]
    pub bwlimit: Option<u64>,
    /// Destroy the target's schedule snapshots that the source no longer has (never the
    /// newest snapshot the two have in common); on an `s3://` target, delete the chains
    /// none of whose snapshots the source has (never the newest chain).
    #[serde(default)]
    pub prune: bool,
    /// The private key ssh authenticates with (`ssh -i`); none: ssh's own defaults.
    #[serde(default)]
    pub identity: Option<String>,
    /// More `ssh -o` options (`KEY=VALUE`).
    #[serde(default)]
    pub ssh_options: Vec<String>,
    /// How the remote shell runs tank (default `tank`), e.g. with its data directory set.
    #[serde(default = "default_remote_tank")]
    pub remote_tank: String,
    /// Run by the daemon whenever the source has a snapshot the target lacks (and again
    /// after a failure); when false, only on request (`tank replicate run`).
    #[serde(default = "default_true")]
    pub auto: bool,
    /// For an `s3://BUCKET/PREFIX` target: the remote that reaches it.
    #[serde(default)]
    pub remote: Option<String>,
    /// For an `s3://` target: start a new chain with a full stream once the chain has this
    /// many streams (0: never).
    #[serde(default)]
    pub full_every: u32,
}

fn default_true() -> bool {
    true
}

fn default_remote_tank() -> String {
    "tank".into()
}

/// What a replication task has done (kept with the task, across restarts).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct ReplicationState {
    /// Seconds since 1970.
    pub last_run: Option<u64>,
    pub last_success: Option<u64>,
    /// The newest snapshot known to be on the target, its guid and creation time.
    pub last_snapshot: Option<String>,
    pub last_guid: Option<u64>,
    pub last_creation: Option<u64>,
    /// Bytes sent by the last run, and by every run.
    pub last_bytes: u64,
    pub bytes_total: u64,
    pub runs: u64,
    pub failures: u64,
    /// Failures since the last success (the next try waits longer each time).
    pub consecutive_failures: u32,
    pub last_error: Option<String>,
}

/// A replication task and its state.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ReplicationInfo {
    #[schema(value_type = Object)]
    pub spec: ReplicationSpec,
    #[schema(value_type = Object)]
    pub state: ReplicationState,
    /// Running now: its job.
    pub job: Option<u64>,
    /// Seconds between the newest snapshot on the target and now (none before the first
    /// success).
    pub lag_secs: Option<u64>,
    /// The source's snapshots newer than the newest on the target.
    pub pending: usize,
    /// `ok`, `running`, `failing`, `never run`, `no source`.
    pub status: String,
}

/// An S3 remote as it is shown (never its secret key or encryption key).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct RemoteInfo {
    pub name: String,
    pub endpoint: String,
    pub access_key: String,
    pub region: String,
    /// The id of its encryption key, when backups through it are encrypted.
    pub key_id: Option<String>,
}

/// The backups under an S3 prefix.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct BackupListing {
    #[schema(value_type = Vec<Object>)]
    pub backups: Vec<crate::backup::Manifest>,
    /// Stream objects without a manifest: uploads that did not finish (never restored).
    pub unfinished: Vec<String>,
}

/// Every response.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", content = "data", rename_all = "snake_case")]
pub enum Response {
    Hello {
        api_version: u32,
        version: String,
        /// The caller's account name, if it has one.
        caller: Option<String>,
        admin: bool,
        /// Whether this is the daemon (else a command's own service).
        daemon: bool,
    },
    /// A change was made; the message says what, as the CLI prints it.
    Done {
        message: String,
    },
    /// A scan was started (or resumed, or found running); it runs in the background.
    ScanStarted {
        pool: String,
        /// What was done before the scan started (a device back online, replaced).
        done: Vec<String>,
        /// Where the scan runs and how to follow it.
        message: String,
        job: Option<u64>,
    },
    Pools(Vec<PoolSummary>),
    PoolReports(Vec<PoolReport>),
    PoolCreated {
        #[schema(value_type = Object)]
        status: Box<PoolStatus>,
    },
    PoolImported {
        name: String,
        state: String,
    },
    ImportCandidates {
        #[schema(value_type = Vec<Object>)]
        pools: Vec<ImportCandidate>,
    },
    History {
        /// Per pool: (name, its records).
        #[schema(value_type = Vec<Object>)]
        pools: Vec<(String, Vec<HistoryRecord>)>,
    },
    Events(Vec<PoolEvent>),
    PoolProps(Vec<PoolProp>),
    Datasets {
        #[schema(value_type = Vec<Object>)]
        datasets: Vec<DatasetInfo>,
    },
    /// Datasets made (a create with parents, a clone, snapshots).
    DatasetNames(Vec<String>),
    Schedules(Vec<ScheduleInfo>),
    Replications(Vec<ReplicationInfo>),
    Remotes(Vec<RemoteInfo>),
    Backups(BackupListing),
    /// What a send wrote or a receive took.
    Transferred {
        snapshots: Vec<String>,
        bytes: u64,
        /// `receive -F`: the datasets rolled back first, and to what.
        #[serde(default)]
        rolled_back: Vec<String>,
        /// Snapshots of a replication stream the target had already.
        #[serde(default)]
        skipped: Vec<String>,
    },
    /// How many datasets and snapshots a destroy removed.
    Destroyed {
        count: usize,
    },
    /// Long work started in the background; `job_get` follows it.
    JobStarted {
        job: u64,
        message: String,
    },
    Mounted(MountInfo),
    Mounts(Vec<MountInfo>),
    User(User),
    Users(Vec<UserEntry>),
    Groups(Vec<Group>),
    Key(NewKey),
    Keys(Vec<KeyEntry>),
    Token(NewToken),
    Tokens(Vec<TokenEntry>),
    Accounts {
        #[schema(value_type = Object)]
        accounts: Box<Export>,
    },
    Share(ShareInfo),
    Shares(Vec<ShareInfo>),
    Jobs(Vec<Job>),
    Job(Job),
    CacheStats(Box<CacheReport>),
    Params(Vec<Param>),
    IoHistory(Vec<crate::iohistory::IoHistory>),
    /// The planner's answer, as `tank plan --json` prints it.
    Plan {
        #[schema(value_type = Object)]
        plan: serde_json::Value,
    },
    Devices(Vec<crate::service::DeviceEntry>),
    Files(crate::ops_browse::Listing),
    BenchHistory {
        #[schema(value_type = Vec<Object>)]
        runs: Vec<serde_json::Value>,
    },
    /// A text dump (engine inspection).
    Text {
        text: String,
    },
    ObjectWritten {
        id: u64,
        length: u64,
    },
    /// Bytes, hex-encoded; empty at the end of the object.
    Bytes {
        data: String,
        /// The object's size.
        size: u64,
    },
    Objects {
        #[schema(value_type = Vec<Object>)]
        objects: Vec<tank_object::ObjectInfo>,
    },
}

/// The ARC's counters and each pool's L2ARC (names as arcstat's).
#[derive(Debug, Clone, Serialize, Deserialize, Default, ToSchema)]
pub struct CacheReport {
    #[schema(value_type = Object)]
    pub arc: serde_json::Map<String, serde_json::Value>,
    /// Per pool, its L2ARC.
    #[schema(value_type = Vec<Object>)]
    pub l2arc: Vec<(String, serde_json::Map<String, serde_json::Value>)>,
    /// Per pool, its intent log: commits, blocks and bytes written, commits that waited for
    /// a txg instead, write errors, where the log is.
    #[serde(default)]
    #[schema(value_type = Vec<Object>)]
    pub zil: Vec<(String, serde_json::Map<String, serde_json::Value>)>,
}

/// A tunable, by its ZFS module-parameter name.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct Param {
    pub name: String,
    pub value: String,
    pub meaning: String,
}

/// Bytes as lowercase hex.
pub fn hex_encode(data: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(data.len() * 2);
    for b in data {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// Hex back to bytes.
pub fn hex_decode(s: &str) -> Result<Vec<u8>, ServiceError> {
    let bad = || ServiceError::BadRequest("data is not hex".into());
    if !s.len().is_multiple_of(2) {
        return Err(bad());
    }
    let v = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    s.as_bytes()
        .chunks(2)
        .map(|p| Some(v(p[0])? << 4 | v(p[1])?))
        .collect::<Option<Vec<u8>>>()
        .ok_or_else(bad)
}

/// A user as listed: the account (whether it has a password, not its hash) and its
/// groups.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct UserEntry {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub admin: bool,
    pub password: bool,
    pub groups: Vec<String>,
    pub created: u64,
}

/// An access key as listed (its secret is shown only when it is made).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct KeyEntry {
    pub access_key: String,
    pub user: String,
    pub created: u64,
}

/// A token as listed (its secret is not kept).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct TokenEntry {
    pub id: String,
    pub user: String,
    pub created: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_tagged_and_strict() {
        let r: Request = serde_json::from_str(r#"{"op": "pool_status", "name": "tank"}"#).unwrap();
        assert!(matches!(r, Request::PoolStatus { name: Some(ref n) } if n == "tank"));
        assert_eq!(r.op(), "pool_status");
        // A misspelt field is an error, not ignored.
        let e = serde_json::from_str::<Request>(r#"{"op": "pool_status", "nmae": "tank"}"#)
            .unwrap_err();
        assert!(e.to_string().contains("unknown field"), "{e}");
        let e = serde_json::from_str::<Request>(r#"{"op": "pool_explode"}"#).unwrap_err();
        assert!(e.to_string().contains("unknown variant"), "{e}");
        let e = serde_json::from_str::<Request>(r#"{"op": "pool_export", "name": 7}"#).unwrap_err();
        assert!(e.to_string().contains("invalid type"), "{e}");
        let env: Envelope = serde_json::from_str(
            r#"{"version": 1, "request": {"op": "hello"}, "command": "tank pool list"}"#,
        )
        .unwrap();
        assert_eq!(env.version, API_VERSION);
        assert!(serde_json::from_str::<Envelope>(
            r#"{"version": 1, "request": {"op": "hello"}, "x": 1}"#
        )
        .is_err());
    }

    #[test]
    fn replies_round_trip() {
        let r = Reply::Ok {
            response: Response::Done {
                message: "done".into(),
            },
            notes: vec!["note: x".into()],
        };
        let s = serde_json::to_string(&r).unwrap();
        let back: Reply = serde_json::from_str(&s).unwrap();
        assert!(matches!(back, Reply::Ok { notes, .. } if notes == ["note: x"]));
        let e = ServiceError::Busy("dataset 'tank/a' is busy".into());
        let w = serde_json::to_string(&Reply::Error(WireError::from(&e))).unwrap();
        let Reply::Error(back) = serde_json::from_str(&w).unwrap() else {
            panic!("{w}")
        };
        let e2 = ServiceError::from(back);
        assert_eq!(e2.to_string(), e.to_string());
        assert_eq!(e2.http_status(), 409);
    }
}
