//! `tank`: the command-line interface.
//!
//! # Theory of operation
//! Each command opens what it needs in this process (devices, pool, object store), does its
//! work and closes the pool cleanly (everything synced). The vocabulary and output follow
//! zpool/zfs; every listing command has `--json`. Errors are printed as one clear message and
//! a non-zero exit; nothing panics on bad input.

mod bench;
mod cmd_dataset;
mod cmd_debug;
mod cmd_pool;
mod datadir;
mod demo;
mod emulate;
mod fsbench;
mod plan;
mod pools;

use clap::{Parser, Subcommand};

/// mimalloc keeps freed memory for reuse: the data path allocates and frees buffers of 128 KiB
/// to several MiB per block, which with the system allocator means fresh mappings and page
/// faults on every block (measured: most of the CPU of a streaming read).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    /// Recommend a layout for a set of disks: capacity, reliability, resilver time, speed.
    Plan(plan::PlanArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Pool(c) => cmd_pool::run(c),
        Command::Dataset(c) => cmd_dataset::run(c),
        Command::Snapshot(a) => cmd_dataset::snapshot(a),
        Command::Rollback(a) => cmd_dataset::rollback(a),
        Command::Clone(a) => cmd_dataset::clone(a),
        Command::Debug(c) => cmd_debug::run(c),
        Command::Demo(a) => demo::run(a),
        Command::Bench(a) => fsbench::run(a),
        Command::BenchEngine(a) => bench::run(a),
        Command::Plan(a) => plan::run(a),
    };
    if let Err(e) = result {
        eprintln!("tank: {e:#}");
        std::process::exit(1);
    }
}

/// The command line as typed, for the pool history.
pub fn command_line() -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    format!("tank {}", args.join(" "))
}
