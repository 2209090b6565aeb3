//! `tank`: the command-line interface.
//!
//! # Theory of operation
//! The binary is argument parsing and rendering. Every command that reads or changes pools,
//! datasets, accounts or shares is a typed request to the management service
//! (`tank_service`): over the daemon's local socket when it runs, else to a service in this
//! process that opens what the command needs and closes it cleanly after (`client.rs`).
//! The vocabulary and output follow zpool/zfs; every listing command has `--json`, made
//! from the same typed response as the human output. Errors are printed as one clear
//! message and a non-zero exit (the service's mapping: 2 for a bad argument, 77 for a
//! refused caller, 1 otherwise); nothing panics on bad input.

#[macro_use]
mod out;
mod bench_api;
mod client;
mod cmd_account;
mod cmd_arc;
mod cmd_bench;
mod cmd_dataset;
mod cmd_debug;
mod cmd_pool;
mod cmd_remote;
mod cmd_replicate;
mod cmd_schedule;
mod cmd_share;
mod cmd_stream;
mod daemon;
mod datadir;
mod demo;
mod fdpass;
mod mounts;
mod pretouch;

use clap::{Parser, Subcommand};
use tank_bench::run::{
    bonnie as bench_bonnie, cache as bench_cache, engine as bench, fs as fsbench,
    iscsi as bench_iscsi, nfs as bench_nfs, plan, s3 as bench_s3, scrub as bench_scrub,
    send as bench_send, smb as bench_smb, sync as bench_sync,
};

/// mimalloc keeps freed memory for reuse: the data path allocates and frees buffers of 128 KiB
/// to several MiB per block, which with the system allocator means fresh mappings and page
/// faults on every block (measured: most of the CPU of a streaming read).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `purge_delay` option: how long freed pages stay mapped before they go back to
/// the kernel.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Keeps freed memory mapped for reuse instead of returning it to the kernel 10 ms later
/// (mimalloc's default). Every txg frees its dirty buffers and the next allocates as many: with
/// purging, each comes back as fresh pages the kernel must zero, which took half the CPU of a
/// streaming write (an emulated NVMe device written at 1 GiB: 260 MB/s with purging, 1,060
/// MB/s without). The process's resident memory then stays at its peak, which the ARC
/// budget and the dirty-data limit bound.
#[allow(unsafe_code)]
fn keep_freed_memory() {
    // SAFETY: mi_option_set only stores an option value; it is called before any thread is
    // started, and the value is one mimalloc documents (-1: never purge).
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
}

#[derive(Parser)]
#[command(
    name = "tank",
    version,
    about = "A ZFS-class storage server in user space"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Pools: create, list, status, import, export, destroy, iostat, history.
    #[command(subcommand)]
    Pool(cmd_pool::PoolCmd),
    /// Datasets: create, list, get, set, inherit, rename, destroy (the zfs vocabulary).
    #[command(subcommand)]
    Dataset(cmd_dataset::DatasetCmd),
    /// Take snapshots: DATASET@NAME... (-r for every descendant, atomically).
    Snapshot(cmd_dataset::SnapshotArgs),
    /// Roll a dataset back to a snapshot.
    Rollback(cmd_dataset::RollbackArgs),
    /// Write a snapshot as a stream on standard output: whole, or since a snapshot or
    /// bookmark (-i, -I); -t resumes an interrupted receive.
    Send(cmd_stream::SendArgs),
    /// Read a stream from standard input into a dataset (-F roll back first, -s resumable,
    /// -A abandon an unfinished receive).
    #[command(alias = "recv")]
    Receive(cmd_stream::ReceiveArgs),
    /// Keep a snapshot's place as an incremental base: POOL/DS@SNAP POOL/DS#MARK.
    Bookmark(cmd_stream::BookmarkArgs),
    /// Snapshot schedules with retention (hourly, daily, weekly, monthly), run by the
    /// daemon: add, list, remove.
    #[command(subcommand)]
    Schedule(cmd_schedule::ScheduleCmd),
    /// Replication tasks: a dataset's snapshots kept on another tank host over SSH,
    /// incremental and resumable, run by the daemon: add, list, run, remove.
    #[command(subcommand)]
    Replicate(cmd_replicate::ReplicateCmd),
    /// S3-compatible stores for backups (send --to s3://, receive --from s3://): add,
    /// list, remove, list-backups.
    #[command(subcommand)]
    Remote(cmd_remote::RemoteCmd),
    /// Create a writable clone of a snapshot.
    Clone(cmd_dataset::CloneArgs),
    /// Mount a filesystem dataset with FUSE (in the daemon, or in the foreground without one).
    Mount(mounts::MountArgs),
    /// Unmount a dataset or directory.
    Unmount(mounts::UnmountArgs),
    /// Run the daemon: own the pools, mount their filesystems, answer the CLI on a local
    /// socket. With nothing configured, create the default pool first.
    Serve(daemon::ServeArgs),
    /// Inspect on-disk structures and exercise the engine (in the spirit of zdb).
    #[command(subcommand)]
    Debug(cmd_debug::DebugCmd),
    /// Create (if needed) the default pool under the data directory, write and read back
    /// data through it, and show its status.
    Demo(demo::DemoArgs),
    /// Benchmark a directory the way bonnie++ does (plus a tree copy test), with history,
    /// comparison and a chart; or a mounted dataset in the daemon, as a job (--dataset).
    Bench(fsbench::FsBenchArgs),
    /// Measure a pool layout at the engine level against the raw device files it is built on.
    BenchEngine(bench::BenchArgs),
    /// Measure the scrub and a degraded read against the raw device files.
    BenchScrub(bench_scrub::ScrubBenchArgs),
    /// Measure what an L2ARC device buys for random reads (emulated build), or the ARC's
    /// memory discipline (--rss).
    BenchCache(bench_cache::CacheBenchArgs),
    /// Synchronous write rate and fsync latency with and without a log device (SLOG) on
    /// an emulated build.
    BenchSync(bench_sync::SyncBenchArgs),
    /// The management API's latency for a status request over HTTPS against the local
    /// socket, at several numbers of clients, and the daemon's memory.
    BenchApi(bench_api::BenchApiArgs),
    /// The NFS server against nfs-ganesha on the same disk and against the engine's own
    /// rate: a large file copied in and out, small files created, read and removed.
    BenchNfs(bench_nfs::NfsBenchArgs),
    /// The S3 endpoint against MinIO on the same disk: PUT and GET of 4 KiB and 4 MiB
    /// objects by parallel clients, with latency and CPU per GiB.
    BenchS3(bench_s3::S3BenchArgs),
    /// SMB shares against Samba serving a plain directory of the same disk: smbclient's put
    /// and get of a large file, and small files put, got and deleted.
    BenchSmb(bench_smb::SmbBenchArgs),
    /// The iSCSI target against Debian's tgt serving a file of the same disk: 4 KiB random
    /// reads and writes at queue depths 1 and 32, 1 MiB sequential reads and writes.
    BenchIscsi(bench_iscsi::IscsiBenchArgs),
    /// `tank send | tank receive` between two pools on one disk against zfs-fuse's
    /// `zfs send | zfs receive` of the same data: a full stream and a 1% increment.
    BenchSend(bench_send::SendBenchArgs),
    /// bonnie++ itself on the mount of the default pool, against zfs-fuse (raidz2 of six
    /// files) on the same disk: block and per-character I/O, seeks, small files.
    BenchBonnie(bench_bonnie::BonnieBenchArgs),
    /// Recommend a layout for a set of disks: capacity, reliability, resilver time, speed.
    Plan(plan::PlanArgs),
    /// Show the ARC and L2ARC: sizes, hit rates by list, prefetch, evictions (with an
    /// INTERVAL, a line of rates per period).
    Arcstat(cmd_arc::ArcstatArgs),
    /// List or set tunables: arc_max, l2arc_write_max, l2arc_write_boost, l2arc_noprefetch,
    /// l2arc_feed_secs.
    Param(cmd_arc::ParamArgs),
    /// Users: add, passwd, set, list, remove, export, import (the accounts every front end
    /// authenticates).
    #[command(subcommand)]
    User(cmd_account::UserCmd),
    /// Groups: add, list, remove, member add|remove.
    #[command(subcommand)]
    Group(cmd_account::GroupCmd),
    /// S3 access keys: add, list, remove.
    #[command(subcommand)]
    Key(cmd_account::KeyCmd),
    /// API tokens: add, list, remove.
    #[command(subcommand)]
    Token(cmd_account::TokenCmd),
    /// Shares (smb, nfs, s3, iscsi): add, list, set, remove; kept with their datasets.
    #[command(subcommand)]
    Share(cmd_share::ShareCmd),
}

fn dispatch(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Pool(c) => cmd_pool::run(c),
        Command::Dataset(c) => cmd_dataset::run(c),
        Command::Snapshot(a) => cmd_dataset::snapshot(a),
        Command::Rollback(a) => cmd_dataset::rollback(a),
        Command::Send(a) => cmd_stream::send(a),
        Command::Receive(a) => cmd_stream::receive(a),
        Command::Bookmark(a) => cmd_stream::bookmark(a),
        Command::Schedule(c) => cmd_schedule::run(c),
        Command::Replicate(c) => cmd_replicate::run(c),
        Command::Remote(c) => cmd_remote::run(c),
        Command::Clone(a) => cmd_dataset::clone(a),
        Command::Mount(a) => mounts::run_mount(a),
        Command::Unmount(a) => mounts::run_unmount(a),
        Command::Serve(a) => daemon::run(a),
        Command::Debug(c) => cmd_debug::run(c),
        Command::Demo(a) => demo::run(a),
        Command::Bench(a) if a.dataset.is_some() || a.daemon => cmd_bench::job(a),
        Command::Bench(a) => fsbench::run(a),
        Command::BenchEngine(a) => bench::run(a),
        Command::BenchScrub(a) => bench_scrub::run(a),
        Command::BenchCache(a) => bench_cache::run(a),
        Command::BenchSync(a) => bench_sync::run(a),
        Command::BenchApi(a) => bench_api::run(a),
        Command::BenchNfs(a) => bench_nfs::run(a),
        Command::BenchS3(a) => bench_s3::run(a),
        Command::BenchSmb(a) => bench_smb::run(a),
        Command::BenchIscsi(a) => bench_iscsi::run(a),
        Command::BenchSend(a) => bench_send::run(a),
        Command::BenchBonnie(a) => bench_bonnie::run(a),
        Command::Plan(a) => plan::run(a),
        Command::Arcstat(a) => cmd_arc::run_arcstat(a),
        Command::Param(a) => cmd_arc::run_param(a),
        Command::User(c) => cmd_account::run_user(c),
        Command::Group(c) => cmd_account::run_group(c),
        Command::Key(c) => cmd_account::run_key(c),
        Command::Token(c) => cmd_account::run_token(c),
        Command::Share(c) => cmd_share::run(c),
    }
}

/// The exit status of a failed command: the service's own mapping for its errors (77 for a
/// refused caller, 2 for a bad argument), else 1.
pub fn exit_code(e: &anyhow::Error) -> i32 {
    e.chain()
        .find_map(|c| c.downcast_ref::<tank_service::ServiceError>())
        .map_or(1, tank_service::ServiceError::exit_code)
}

fn main() {
    keep_freed_memory();
    let cli = Cli::parse();
    // The data directory is made absolute once, here, against the directory tank started in.
    tank_bench::run::util::set_data_dir(datadir::data_dir());
    if let Err(e) = cmd_arc::apply_env() {
        eprintln!("tank: {}", crate::out::chain(&e));
        std::process::exit(2);
    }
    if let Err(e) = dispatch(cli.command) {
        eprintln!("tank: {}", crate::out::chain(&e));
        std::process::exit(exit_code(&e));
    }
}
