//! `tank`: the command-line interface.
//!
//! # Theory of operation
//! Each command opens what it needs in this process (devices, pool, object store), does its
//! work and closes the pool cleanly (everything synced). The vocabulary and output follow
//! zpool/zfs; every listing command has `--json`. Errors are printed as one clear message and
//! a non-zero exit; nothing panics on bad input.

#[macro_use]
mod out;
mod awake;
mod bench;
mod bench_cache;
mod bench_scrub;
mod bench_sync;
mod cmd_account;
mod cmd_arc;
mod cmd_dataset;
mod cmd_debug;
mod cmd_pool;
mod cmd_share;
mod daemon;
mod datadir;
mod demo;
mod emulate;
mod fsbench;
mod mounts;
mod plan;
mod pools;

use clap::{Parser, Subcommand};

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
    /// comparison and a chart.
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
        Command::Clone(a) => cmd_dataset::clone(a),
        Command::Mount(a) => mounts::run_mount(a),
        Command::Unmount(a) => mounts::run_unmount(a),
        Command::Serve(a) => daemon::run(a),
        Command::Debug(c) => cmd_debug::run(c),
        Command::Demo(a) => demo::run(a),
        Command::Bench(a) => fsbench::run(a),
        Command::BenchEngine(a) => bench::run(a),
        Command::BenchScrub(a) => bench_scrub::run(a),
        Command::BenchCache(a) => bench_cache::run(a),
        Command::BenchSync(a) => bench_sync::run(a),
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

/// Commands that act on pools, and so go to the daemon when one runs.
fn forwarded(command: &Command) -> bool {
    matches!(
        command,
        Command::Pool(_)
            | Command::Dataset(_)
            | Command::Snapshot(_)
            | Command::Rollback(_)
            | Command::Clone(_)
            | Command::Mount(_)
            | Command::Unmount(_)
            | Command::Debug(_)
            | Command::Param(_)
            | Command::User(_)
            | Command::Group(_)
            | Command::Key(_)
            | Command::Token(_)
            | Command::Share(_)
    ) || matches!(command, Command::Arcstat(a) if !a.follows())
}

/// Runs a client's command line in the daemon; returns its exit status.
pub fn run_in_daemon(argv: Vec<String>) -> i32 {
    let cli = match Cli::try_parse_from(argv) {
        Ok(c) => c,
        Err(e) => {
            errln!("{e}");
            return 2;
        }
    };
    if !forwarded(&cli.command) {
        errln!("tank: this command runs in the client, not in the daemon");
        return 2;
    }
    match dispatch(cli.command) {
        Ok(()) => 0,
        Err(e) => {
            errln!("tank: {}", crate::out::chain(&e));
            exit_code(&e)
        }
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
    datadir::data_dir();
    if let Err(e) = cmd_arc::apply_env() {
        eprintln!("tank: {}", crate::out::chain(&e));
        std::process::exit(2);
    }
    if let Command::Pool(cmd_pool::PoolCmd::Events(a)) = &cli.command {
        if a.follow {
            if let Err(e) = cmd_pool::follow_events(a) {
                eprintln!("tank: {}", crate::out::chain(&e));
                std::process::exit(1);
            }
            return;
        }
    }
    if let Command::Arcstat(a) = &cli.command {
        if a.follows() {
            if let Err(e) = cmd_arc::follow_arcstat(a) {
                eprintln!("tank: {}", crate::out::chain(&e));
                std::process::exit(1);
            }
            return;
        }
    }
    let argv: Vec<String> = std::env::args().skip(1).collect();
    // A password is read once, here, whether the daemon or this process uses it.
    let secret = match cmd_account::secret_source(&argv) {
        Some(file) => match cmd_account::read_secret(file.as_deref()) {
            Ok(s) => Some(s),
            Err(e) => {
                eprintln!("tank: {}", crate::out::chain(&e));
                std::process::exit(2);
            }
        },
        None => None,
    };
    if forwarded(&cli.command) {
        match daemon::forward(&argv, secret.clone()) {
            Ok(Some(reply)) => {
                out::write_out(&reply.stdout);
                out::write_err(&reply.stderr);
                std::process::exit(reply.code);
            }
            Ok(None) => {}
            Err(e) => {
                eprintln!("tank: the daemon did not answer: {}", crate::out::chain(&e));
                std::process::exit(1);
            }
        }
    }
    if let Err(e) = cmd_account::with_secret(secret, || dispatch(cli.command)) {
        eprintln!("tank: {}", crate::out::chain(&e));
        std::process::exit(exit_code(&e));
    }
}

/// The command line as typed, for the pool history.
pub fn command_line() -> String {
    if let Some(c) = out::command() {
        return c;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    format!("tank {}", args.join(" "))
}
