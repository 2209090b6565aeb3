//! `tank pool ...`: the zpool vocabulary.
//!
//! # Theory of operation
//! Each command turns its arguments into a typed request (device paths made absolute
//! against this directory), sends it to the service (`client.rs`: the daemon, or one in
//! this process) and renders the typed response as zpool does, or as JSON with `--json`.
//! A scrub or resilver runs in the background of whoever holds the pool; with `-w`, or
//! when no daemon runs (the scan would stop with this process), the command follows its
//! job until it ends.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use comfy_table::{presets, Table};
use tank_object::{ScanPhase, ScanStatus};
use tank_pool::{PoolStatus, VdevStatus};
use tank_service::api::{PoolEvent, PoolReport, Request, Response, ScrubAction};

use crate::client::{unexpected, with_client, Client};
use crate::datadir::{human, parse_size};

#[derive(Subcommand)]
pub enum PoolCmd {
    /// Create a pool: tank pool create [-f] [-o ashift=N] NAME [mirror|raidz1|raidz2|raidz3] DEV... [log DEV...] [cache DEV...] [spare DEV...] [special ...]
    Create(CreateArgs),
    /// List imported pools with their size and health.
    List(ListArgs),
    /// Show the vdev tree with states and READ/WRITE/CKSUM counters.
    Status(StatusArgs),
    /// Export a pool: sync it, mark it exported and release its devices.
    Export(NameArg),
    /// Import a pool, or list the pools that can be imported.
    Import(ImportArgs),
    /// Destroy a pool (its devices are marked destroyed).
    Destroy(DestroyArgs),
    /// Show I/O statistics.
    Iostat(IostatArgs),
    /// Show the commands that changed the pool.
    History(HistoryArgs),
    /// Verify every block of the pool (every copy, all parity) and repair what is bad.
    Scrub(ScrubArgs),
    /// Show the pool's events: checksum and I/O errors, state changes, scrubs.
    Events(EventsArgs),
    /// Take a device offline (-t: until the pool is exported).
    Offline(OfflineArgs),
    /// Bring an offline device back; it is resilvered with the txgs it missed.
    Online(DeviceArgs),
    /// Clear error counters (of one device or all) and bring faulted devices back; a
    /// suspended pool whose devices are fixed is opened again from them.
    Clear(ClearArgs),
    /// Resilver the devices that lack txgs now (the daemon does it by itself).
    Resilver(ResilverArgs),
    /// Replace a device by a new one (or by itself after a disk swap); the new device is
    /// resilvered from the others.
    Replace(ReplaceArgs),
    /// Attach a device to a disk (making a mirror) or to a mirror (one side more).
    Attach(AttachArgs),
    /// Set a pool property: autoreplace=on|off, multihost=on|off.
    Set(PoolSetArgs),
    /// Show pool properties: all, or a comma-separated list.
    Get(PoolGetArgs),
    /// Detach a side of a mirror.
    Detach(DeviceArgs),
    /// Add vdevs: data vdevs (the pool grows), or `log`, `cache`, `spare`, `special`
    /// devices, in the create grammar (`add tank cache ssd1`, `add tank log mirror s1 s2`).
    Add(AddArgs),
    /// Remove cache, log or unused spare devices.
    Remove(RemoveArgs),
}

#[derive(Args)]
pub struct AddArgs {
    /// Add even with mismatched replication, or devices that belong to another pool.
    #[arg(short = 'f')]
    force: bool,
    /// Create missing device files, sparse, of this size (e.g. 8G).
    #[arg(long)]
    size: Option<String>,
    name: String,
    /// The vdevs, as for create.
    #[arg(required = true, num_args = 1..)]
    spec: Vec<String>,
}

#[derive(Args)]
pub struct RemoveArgs {
    name: String,
    #[arg(required = true, num_args = 1..)]
    devices: Vec<String>,
}

#[derive(Args)]
pub struct PoolSetArgs {
    /// PROPERTY=VALUE
    assignment: String,
    name: String,
}

#[derive(Args)]
pub struct PoolGetArgs {
    /// all, or properties separated by commas.
    props: String,
    name: String,
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct AttachArgs {
    /// Use the new device even if it appears to belong to another pool.
    #[arg(short = 'f')]
    force: bool,
    /// Create the new device file, sparse, of this size (e.g. 4G).
    #[arg(long)]
    size: Option<String>,
    /// Wait until the resilver is done (always so without the daemon).
    #[arg(short = 'w')]
    wait: bool,
    name: String,
    existing: String,
    new: String,
}

#[derive(Args)]
pub struct ReplaceArgs {
    /// Use the new device even if it appears to belong to another pool.
    #[arg(short = 'f')]
    force: bool,
    /// Create the new device file, sparse, of this size (e.g. 4G).
    #[arg(long)]
    size: Option<String>,
    /// Wait until the resilver is done (always so without the daemon).
    #[arg(short = 'w')]
    wait: bool,
    name: String,
    old: String,
    /// The new device (default: the old device's path, for a disk swapped in place).
    new: Option<String>,
}

#[derive(Args)]
pub struct OfflineArgs {
    /// Temporarily: the device comes back at the next import.
    #[arg(short = 't')]
    temporary: bool,
    name: String,
    device: String,
}

#[derive(Args)]
pub struct DeviceArgs {
    name: String,
    device: String,
}

#[derive(Args)]
pub struct ClearArgs {
    name: String,
    device: Option<String>,
}

#[derive(Args)]
pub struct ResilverArgs {
    /// Wait until done, showing progress (always so without the daemon).
    #[arg(short = 'w')]
    wait: bool,
    name: String,
}

#[derive(Args, Clone)]
pub struct EventsArgs {
    /// Follow: keep printing new events as they come (needs the daemon).
    #[arg(short = 'f')]
    pub follow: bool,
    /// Clear the events.
    #[arg(short = 'c')]
    clear: bool,
    /// Only the events numbered after this one.
    #[arg(long, default_value_t = 0)]
    since: u64,
    #[arg(long)]
    json: bool,
    /// The pool (default: every imported pool).
    name: Option<String>,
}

#[derive(Args)]
pub struct ScrubArgs {
    /// Stop (cancel) the scrub.
    #[arg(short = 's', conflicts_with = "pause")]
    stop: bool,
    /// Pause the scrub; `tank pool scrub NAME` resumes it.
    #[arg(short = 'p')]
    pause: bool,
    /// Wait until the scrub is done, showing its progress (always so without the daemon).
    #[arg(short = 'w')]
    wait: bool,
    name: String,
}

#[derive(Args)]
pub struct CreateArgs {
    /// Use devices even if they appear to belong to another pool, and allow mixed replication.
    #[arg(short = 'f')]
    force: bool,
    /// Pool property at creation: ashift=N (9 to 16).
    #[arg(short = 'o', value_name = "PROP=VALUE")]
    props: Vec<String>,
    /// Create missing device files, sparse, of this size (e.g. 4G).
    #[arg(long)]
    size: Option<String>,
    #[arg(long)]
    json: bool,
    name: String,
    /// The vdev specification.
    #[arg(required = true, num_args = 1.., allow_hyphen_values = true)]
    spec: Vec<String>,
}

#[derive(Args)]
pub struct ListArgs {
    /// Scripted mode: no header, tab-separated.
    #[arg(short = 'H')]
    scripted: bool,
    /// Columns: name,size,alloc,free,frag,cap,health,guid,ashift,txg,usable.
    #[arg(short = 'o', value_delimiter = ',')]
    props: Vec<String>,
    #[arg(long)]
    json: bool,
    names: Vec<String>,
}

#[derive(Args)]
pub struct StatusArgs {
    /// Verbose: also per-device I/O counts.
    #[arg(short = 'v')]
    verbose: bool,
    /// Also each device's slow I/Os (reads and writes over the slow I/O threshold, 3 s)
    #[arg(short = 's')]
    slow: bool,
    #[arg(long)]
    json: bool,
    name: Option<String>,
}

#[derive(Args)]
pub struct NameArg {
    name: String,
}

#[derive(Args)]
pub struct DestroyArgs {
    #[arg(short = 'f')]
    force: bool,
    name: String,
}

#[derive(Args)]
pub struct ImportArgs {
    /// Directory to search for devices (repeatable). Default: the data directory.
    #[arg(short = 'd')]
    dirs: Vec<PathBuf>,
    /// Rewind to an older transaction group if the newest one is damaged.
    #[arg(short = 'F')]
    rewind: bool,
    /// Import even if the pool looks active on another host, or was destroyed.
    #[arg(short = 'f')]
    force: bool,
    /// Import even if a log device holding the intent log is missing; the synchronous
    /// writes only it held are lost.
    #[arg(short = 'm')]
    missing_log: bool,
    #[arg(long)]
    json: bool,
    /// Pool name or numeric guid.
    name: Option<String>,
}

#[derive(Args)]
pub struct IostatArgs {
    #[arg(short = 'v')]
    verbose: bool,
    #[arg(long)]
    json: bool,
    /// [POOL] [INTERVAL [COUNT]]
    args: Vec<String>,
}

#[derive(Args)]
pub struct HistoryArgs {
    #[arg(long)]
    json: bool,
    name: Option<String>,
}

pub fn run(cmd: PoolCmd) -> Result<()> {
    with_client(|c| match cmd {
        PoolCmd::Create(a) => create(c, a),
        PoolCmd::List(a) => list(c, a),
        PoolCmd::Status(a) => status(c, a),
        PoolCmd::Export(a) => done(c, Request::PoolExport { name: a.name }),
        PoolCmd::Import(a) => import(c, a),
        PoolCmd::Destroy(a) => done(c, Request::PoolDestroy { name: a.name }),
        PoolCmd::Iostat(a) => iostat(c, a),
        PoolCmd::History(a) => history(c, a),
        PoolCmd::Scrub(a) => scrub(c, a),
        PoolCmd::Events(a) => events(c, a),
        PoolCmd::Offline(a) => done(
            c,
            Request::PoolOffline {
                name: a.name,
                device: a.device,
                temporary: a.temporary,
            },
        ),
        PoolCmd::Online(a) => scan_change(
            c,
            Request::PoolOnline {
                name: a.name,
                device: a.device,
            },
            false,
        ),
        PoolCmd::Clear(a) => {
            let r = c.call(Request::PoolClear {
                name: a.name,
                device: a.device,
            })?;
            // `zpool clear` says nothing when nothing came back.
            match r {
                Response::Done { .. } => Ok(()),
                r => follow_scan(c, r, false),
            }
        }
        PoolCmd::Resilver(a) => scan_change(c, Request::PoolResilver { name: a.name }, a.wait),
        PoolCmd::Replace(a) => {
            let size = a.size.as_deref().map(parse_size).transpose()?;
            let new = a.new.as_deref().map(absolute);
            scan_change(
                c,
                Request::PoolReplace {
                    name: a.name,
                    old: a.old,
                    new,
                    size,
                    force: a.force,
                },
                a.wait,
            )
        }
        PoolCmd::Attach(a) => {
            let size = a.size.as_deref().map(parse_size).transpose()?;
            scan_change(
                c,
                Request::PoolAttach {
                    name: a.name,
                    existing: a.existing,
                    new: absolute(&a.new),
                    size,
                    force: a.force,
                },
                a.wait,
            )
        }
        PoolCmd::Set(a) => {
            let Some((prop, value)) = a.assignment.split_once('=') else {
                bail!("expected PROPERTY=VALUE, got '{}'", a.assignment);
            };
            c.call(Request::PoolSet {
                name: a.name,
                property: prop.into(),
                value: value.into(),
            })?;
            Ok(())
        }
        PoolCmd::Get(a) => pool_get(c, a),
        PoolCmd::Detach(a) => done(
            c,
            Request::PoolDetach {
                name: a.name,
                device: a.device,
            },
        ),
        PoolCmd::Add(a) => {
            let size = a.size.as_deref().map(parse_size).transpose()?;
            done(
                c,
                Request::PoolAdd {
                    name: a.name,
                    spec: spec_paths(&a.spec),
                    size,
                    force: a.force,
                },
            )
        }
        PoolCmd::Remove(a) => done(
            c,
            Request::PoolRemove {
                name: a.name,
                devices: a.devices,
            },
        ),
    })
}

/// A device path made absolute against this directory (the cache file and the labels name
/// devices from anywhere).
pub fn absolute(p: &str) -> String {
    crate::out::resolve(std::path::Path::new(p))
        .to_string_lossy()
        .into_owned()
}

/// The words of a vdev specification with its device paths made absolute.
fn spec_paths(spec: &[String]) -> Vec<String> {
    const KEYWORDS: &[&str] = &[
        "mirror", "raidz", "raidz1", "raidz2", "raidz3", "log", "cache", "spare", "special",
        "dedup",
    ];
    spec.iter()
        .map(|t| {
            if KEYWORDS.contains(&t.as_str()) || t.starts_with('-') {
                t.clone()
            } else {
                absolute(t)
            }
        })
        .collect()
}

/// Sends a change and prints the message it answers with.
fn done(c: &Client, req: Request) -> Result<()> {
    match c.call(req)? {
        Response::Done { message } => {
            if !message.is_empty() {
                outln!("{message}");
            }
            Ok(())
        }
        r => Err(unexpected(r)),
    }
}

/// Sends a change that may start a resilver, and follows it when asked to (or when no
/// daemon runs it).
fn scan_change(c: &Client, req: Request, wait: bool) -> Result<()> {
    let r = c.call(req)?;
    follow_scan(c, r, wait)
}

fn follow_scan(c: &Client, r: Response, wait: bool) -> Result<()> {
    match r {
        Response::Done { message } => {
            outln!("{message}");
            Ok(())
        }
        Response::ScanStarted {
            pool,
            done,
            message,
            job,
        } => {
            for line in done {
                outln!("{line}");
            }
            if c.is_daemon() && !wait {
                outln!("{message}");
                return Ok(());
            }
            if message.starts_with("resuming") {
                outln!("{message}");
            }
            wait_scan(c, &pool, job)
        }
        r => Err(unexpected(r)),
    }
}

/// Follows a scan's job until it stops running, with its progress every few seconds, then
/// prints how it ended.
fn wait_scan(c: &Client, pool: &str, job: Option<u64>) -> Result<()> {
    let mut last = Instant::now();
    if let Some(id) = job {
        loop {
            let j = match c.call(Request::JobGet { id })? {
                Response::Job(j) => j,
                r => return Err(unexpected(r)),
            };
            if j.state != "running" {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
            if last.elapsed().as_secs() >= 5 {
                last = Instant::now();
                let total = j.total_bytes.max(1);
                errln!(
                    "{} / {} issued at {}/s, {:.2}% done{}",
                    tank_dataset::props::human(j.done_bytes),
                    tank_dataset::props::human(total),
                    tank_dataset::props::human(j.rate as u64),
                    100.0 * j.done_bytes as f64 / total as f64,
                    j.eta_secs
                        .map(|e| format!(", {} to go", hms(e)))
                        .unwrap_or_default()
                );
            }
        }
    }
    for r in reports(c, Some(pool.to_string()))? {
        outln!("{}", scan_lines(&r.scan.status).join("\n"));
    }
    Ok(())
}

fn create(c: &Client, a: CreateArgs) -> Result<()> {
    let mut ashift = None;
    for p in &a.props {
        match p.split_once('=') {
            Some(("ashift", v)) => {
                ashift =
                    Some(v.parse().map_err(|_| {
                        anyhow::anyhow!("invalid ashift '{v}': a number from 9 to 16")
                    })?)
            }
            _ => bail!("invalid pool property '{p}' (supported at create: ashift=N)"),
        }
    }
    let size = a.size.as_deref().map(parse_size).transpose()?;
    let st = match c.call(Request::PoolCreate {
        name: a.name,
        spec: spec_paths(&a.spec),
        size,
        force: a.force,
        ashift,
    })? {
        Response::PoolCreated { status: st } => st,
        r => return Err(unexpected(r)),
    };
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&st)?);
    } else {
        outln!(
            "created pool '{}': {} raw, {} usable, {}",
            st.name,
            human(st.space.size),
            human(st.space.usable),
            st.state
        );
    }
    Ok(())
}

fn list(c: &Client, a: ListArgs) -> Result<()> {
    let cols: Vec<String> = if a.props.is_empty() {
        ["name", "size", "alloc", "free", "frag", "cap", "health"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    } else {
        a.props.clone()
    };
    let known = [
        "name", "size", "alloc", "free", "frag", "cap", "health", "guid", "ashift", "txg", "usable",
    ];
    for col in &cols {
        if !known.contains(&col.as_str()) {
            bail!("invalid property '{col}' (valid: {})", known.join(","));
        }
    }
    let pools = match c.call(Request::PoolList { names: a.names })? {
        Response::Pools(p) => p,
        r => return Err(unexpected(r)),
    };
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&pools)?);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = pools
        .iter()
        .map(|p| {
            cols.iter()
                .map(|col| {
                    let h = |b: u64| if a.scripted { b.to_string() } else { human(b) };
                    match col.as_str() {
                        "name" => p.name.clone(),
                        "size" => h(p.size),
                        "alloc" => h(p.allocated),
                        "free" => h(p.free),
                        "cap" => format!("{}%", p.capacity),
                        "frag" => format!("{}%", p.fragmentation),
                        "health" => p.health.clone(),
                        "guid" => p.guid.to_string(),
                        "ashift" => p.ashift.to_string(),
                        "txg" => p.txg.to_string(),
                        "usable" => h(p.usable),
                        _ => "-".into(),
                    }
                })
                .collect()
        })
        .collect();
    if a.scripted {
        for r in rows {
            outln!("{}", r.join("\t"));
        }
    } else if rows.is_empty() {
        outln!("no pools available");
    } else {
        let mut t = Table::new();
        t.load_style(presets::NOTHING);
        t.set_header(cols.iter().map(|c| c.to_uppercase()));
        for r in rows {
            t.add_row(r);
        }
        outln!("{t}");
    }
    Ok(())
}

fn status_tree(t: &mut Table, v: &VdevStatus, depth: usize, verbose: bool, slow: bool) {
    let mut row = vec![
        format!("{}{}", "  ".repeat(depth), v.name),
        v.state.clone(),
        v.read_errors.to_string(),
        v.write_errors.to_string(),
        v.cksum_errors.to_string(),
    ];
    if slow {
        // Counted per device, as zpool status -s shows them ("-" on the vdevs above).
        row.push(if v.path.is_some() {
            v.stats.slow_ios.to_string()
        } else {
            "-".into()
        });
    }
    if verbose {
        row.push(if v.path.is_some() {
            format!(
                "{} reads {}, {} writes {}",
                v.stats.read_ops,
                human(v.stats.read_bytes),
                v.stats.write_ops,
                human(v.stats.write_bytes)
            )
        } else {
            String::new()
        });
    }
    row.push(v.note.clone().unwrap_or_default());
    t.add_row(row);
    for c in &v.children {
        status_tree(t, c, depth + 1, verbose, slow);
    }
}

/// `hh:mm:ss` (days as `Nd hh:mm:ss`), as zpool shows durations.
pub(crate) fn hms(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    let (d, h, m, s) = (s / 86400, s / 3600 % 24, s / 60 % 60, s % 60);
    if d > 0 {
        format!("{d} days {h:02}:{m:02}:{s:02}")
    } else {
        format!("{h:02}:{m:02}:{s:02}")
    }
}

/// The `scan:` lines of `status`, as zpool writes them (with the rate and the time left
/// measured from this scrub's own progress).
pub fn scan_lines(s: &ScanStatus) -> Vec<String> {
    // Always with a unit, as zpool writes them ("0B repaired").
    let bytes = tank_dataset::props::human;
    let st = &s.state;
    let when = |t: u64| tank_pool::fmt_time(t);
    match st.phase {
        ScanPhase::None => vec!["none requested".into()],
        ScanPhase::Canceled => vec![format!("scrub canceled on {}", when(st.end_time))],
        ScanPhase::Finished if st.func == "resilver" => vec![format!(
            "resilvered {} in {} with {} errors on {}; verified {}, {} rewritten by verification",
            bytes(st.rebuilt_repaired),
            hms(st.active_secs),
            st.errors,
            when(st.end_time),
            bytes(st.verified),
            bytes(st.verify_repaired)
        )],
        ScanPhase::Finished => vec![format!(
            "scrub repaired {} in {} with {} errors on {}",
            bytes(st.repaired),
            hms(st.active_secs),
            st.errors,
            when(st.end_time)
        )],
        ScanPhase::Scanning => {
            let total = st.to_examine.max(st.issued).max(1);
            let head = if st.func == "resilver" {
                format!(
                    "resilver in progress since {}{}",
                    when(st.start_time),
                    if st.verifying {
                        format!(" (verifying pass {})", st.verify_passes)
                    } else {
                        String::new()
                    }
                )
            } else if st.paused {
                format!("scrub paused (started {})", when(st.start_time))
            } else {
                format!("scrub in progress since {}", when(st.start_time))
            };
            let done_word = if st.func == "resilver" {
                "resilvered"
            } else {
                "repaired"
            };
            let rate = if s.running {
                format!(" at {}/s", bytes(s.rate as u64))
            } else {
                String::new()
            };
            let eta = match s.eta_secs {
                Some(e) if s.running => format!(", {} to go", hms(e)),
                _ => String::new(),
            };
            vec![
                head,
                format!(
                    "{} / {} scanned, {} / {} issued{rate}",
                    bytes(st.examined),
                    bytes(total),
                    bytes(st.issued),
                    bytes(total)
                ),
                format!(
                    "{} {done_word}, {:.2}% done{eta}",
                    bytes(st.repaired),
                    100.0 * st.issued as f64 / total as f64
                ),
            ]
        }
    }
}

/// The `scan:` lines of a report; an active scan that no process will go on running says
/// so and names the commands that run it, instead of "in progress".
fn report_scan_lines(r: &PoolReport) -> Vec<String> {
    let mut lines = scan_lines(&r.scan.status);
    if r.scan.runner.as_deref() == Some("none") {
        let st = &r.scan.status.state;
        let pool = &r.status.name;
        let (what, command) = if st.func == "resilver" {
            ("resilver", format!("tank pool resilver -w {pool}"))
        } else {
            ("scrub", format!("tank pool scrub -w {pool}"))
        };
        lines[0] = format!(
            "{what} waiting since {}: no process is running it; start 'tank serve' to run it in the background, or run '{command}'",
            tank_pool::fmt_time(st.start_time)
        );
    }
    lines
}

pub fn print_status(r: &PoolReport, verbose: bool, slow: bool) {
    let st: &PoolStatus = &r.status;
    outln!("  pool: {}", st.name);
    outln!(" state: {}", st.state);
    if let Some(s) = &st.status {
        outln!("status: {s}");
    } else if !r.errors.is_empty() {
        outln!("status: One or more devices has experienced an error resulting in data corruption. Applications may be affected.");
    }
    if let Some(a) = &st.action {
        outln!("action: {a}");
    } else if !r.errors.is_empty() {
        outln!("action: Restore the files in question from a backup or delete them, then scrub again to clear the list.");
    }
    for (i, line) in report_scan_lines(r).iter().enumerate() {
        outln!("{}{line}", if i == 0 { "  scan: " } else { "        " });
    }
    outln!("config:\n");
    let mut t = Table::new();
    t.load_style(presets::NOTHING);
    let mut header = vec!["NAME", "STATE", "READ", "WRITE", "CKSUM"];
    if slow {
        header.push("SLOW");
    }
    if verbose {
        header.push("I/O");
    }
    header.push("");
    t.set_header(header);
    for v in &st.config {
        status_tree(&mut t, v, 0, verbose, slow);
    }
    for (section, vdevs) in &st.sections {
        let mut row = vec![
            section.clone(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
        ];
        if slow {
            row.push(String::new());
        }
        if verbose {
            row.push(String::new());
        }
        row.push(String::new());
        t.add_row(row);
        for v in vdevs {
            status_tree(&mut t, v, 1, verbose, slow);
        }
    }
    outln!("{t}\n");
    let freeing = if st.space.deferred > 0 {
        format!(
            " ({} of it freed, reusable within {} txgs)",
            human(st.space.deferred),
            tank_block::DEFER_TXGS
        )
    } else {
        String::new()
    };
    outln!(
        "space: {} raw, {} allocated{freeing}, {} free ({} usable for data); txg {}",
        human(st.space.size),
        human(st.space.allocated),
        human(st.space.free),
        human(st.space.usable),
        st.txg
    );
    if st.healed_blocks > 0 {
        outln!(
            "healed: {} block(s) repaired from redundancy since import",
            st.healed_blocks
        );
    }
    if st.leaked_gang_blocks > 0 {
        outln!(
            "leaked: {} gang block(s) freed since import without a readable header: their pieces stay allocated",
            st.leaked_gang_blocks
        );
    }
    if r.errors.is_empty() {
        outln!("errors: No known data errors");
    } else if verbose {
        outln!("errors: Permanent errors have been detected in the following files:\n");
        for e in &r.errors {
            outln!("        {e}");
        }
    } else {
        outln!(
            "errors: {} data errors, use '-v' for a list",
            r.errors.len()
        );
    }
}

fn print_events(events: &[PoolEvent]) {
    for e in events {
        let secs = e.time as u64;
        outln!(
            "{}.{:06}  {}  {:<32} {}{}",
            tank_pool::fmt_time(secs),
            ((e.time - secs as f64) * 1e6) as u64,
            e.pool,
            e.class,
            e.vdev
                .as_deref()
                .map(|v| format!("{v} "))
                .unwrap_or_default(),
            e.detail
        );
    }
}

fn fetch_events(c: &Client, name: Option<String>, since: u64) -> Result<Vec<PoolEvent>> {
    match c.call(Request::PoolEvents { name, since })? {
        Response::Events(e) => Ok(e),
        r => Err(unexpected(r)),
    }
}

fn events(c: &Client, a: EventsArgs) -> Result<()> {
    if a.clear {
        c.call(Request::PoolEventsClear { name: a.name })?;
        return Ok(());
    }
    if a.follow {
        if !c.is_daemon() {
            bail!("'pool events -f' follows the daemon's events: start it with 'tank serve'");
        }
        // The newer events, twice a second.
        let mut seen: std::collections::HashMap<String, u64> = Default::default();
        loop {
            let fresh: Vec<PoolEvent> = fetch_events(c, a.name.clone(), a.since)?
                .into_iter()
                .filter(|e| e.seq > seen.get(&e.pool).copied().unwrap_or(a.since))
                .collect();
            for e in &fresh {
                let s = seen.entry(e.pool.clone()).or_default();
                *s = (*s).max(e.seq);
            }
            print_events(&fresh);
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    let all = fetch_events(c, a.name, a.since)?;
    if a.json {
        outln!("{}", serde_json::to_string(&all)?);
    } else {
        print_events(&all);
    }
    Ok(())
}

fn scrub(c: &Client, a: ScrubArgs) -> Result<()> {
    let action = if a.stop {
        ScrubAction::Stop
    } else if a.pause {
        ScrubAction::Pause
    } else {
        ScrubAction::Start
    };
    scan_change(
        c,
        Request::PoolScrub {
            name: a.name,
            action,
        },
        a.wait,
    )
}

fn pool_get(c: &Client, a: PoolGetArgs) -> Result<()> {
    let all = match c.call(Request::PoolGet {
        name: a.name.clone(),
    })? {
        Response::PoolProps(p) => p,
        r => return Err(unexpected(r)),
    };
    let wanted: Vec<&str> = a.props.split(',').collect();
    if let Some(unknown) = wanted
        .iter()
        .find(|w| **w != "all" && !all.iter().any(|p| p.property == **w))
    {
        bail!("no such pool property: '{unknown}'");
    }
    let rows: Vec<_> = all
        .iter()
        .filter(|p| a.props == "all" || wanted.contains(&p.property.as_str()))
        .collect();
    if a.json {
        let m: serde_json::Map<String, serde_json::Value> = rows
            .iter()
            .map(|p| {
                (
                    p.property.clone(),
                    serde_json::json!({"value": p.value, "source": p.source}),
                )
            })
            .collect();
        outln!("{}", serde_json::Value::Object(m));
    } else {
        outln!("{:<8} {:<12} {:<20} SOURCE", "NAME", "PROPERTY", "VALUE");
        for p in rows {
            outln!(
                "{:<8} {:<12} {:<20} {}",
                a.name,
                p.property,
                p.value,
                p.source
            );
        }
    }
    Ok(())
}

fn reports(c: &Client, name: Option<String>) -> Result<Vec<PoolReport>> {
    match c.call(Request::PoolStatus { name })? {
        Response::PoolReports(r) => Ok(r),
        r => Err(unexpected(r)),
    }
}

fn status(c: &Client, a: StatusArgs) -> Result<()> {
    let all = reports(c, a.name)?;
    if all.is_empty() && !a.json {
        outln!("no pools available");
        return Ok(());
    }
    for r in &all {
        for n in &r.import_notes {
            errln!("note: {n}");
        }
    }
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&all)?);
    } else {
        for r in &all {
            print_status(r, a.verbose, a.slow);
        }
    }
    Ok(())
}

fn import(c: &Client, a: ImportArgs) -> Result<()> {
    let dirs: Vec<PathBuf> = a.dirs.iter().map(|d| crate::out::resolve(d)).collect();
    let r = c.call(Request::PoolImport {
        name: a.name,
        dirs,
        rewind: a.rewind,
        force: a.force,
        missing_log: a.missing_log,
    })?;
    match r {
        Response::PoolImported { name, state } => {
            outln!("imported pool '{name}' ({state})");
        }
        Response::ImportCandidates { pools: found } => {
            if a.json {
                outln!("{}", serde_json::to_string_pretty(&found)?);
            } else if found.is_empty() {
                outln!("no pools available to import");
            } else {
                for c in found {
                    outln!("   pool: {}", c.name);
                    outln!("     id: {}", c.guid);
                    outln!(
                        "  state: {}{}",
                        c.state,
                        if c.importable {
                            ""
                        } else {
                            " (cannot be imported: too many devices missing)"
                        }
                    );
                    outln!("   host: {}", c.hostname);
                    outln!("devices: {} of {} found", c.devices_found, c.devices_total);
                    for v in &c.vdevs {
                        outln!("         {v}");
                    }
                    for m in &c.missing {
                        outln!("missing: {m}");
                    }
                    outln!();
                }
            }
        }
        r => return Err(unexpected(r)),
    }
    Ok(())
}

fn iostat(c: &Client, a: IostatArgs) -> Result<()> {
    let mut name = None;
    let mut nums = Vec::new();
    for s in &a.args {
        match s.parse::<f64>() {
            Ok(v) if v > 0.0 => nums.push(v),
            Ok(_) => bail!("interval and count must be positive"),
            Err(_) if name.is_none() && nums.is_empty() => name = Some(s.clone()),
            Err(_) => {
                bail!("unexpected argument '{s}' (usage: iostat [-v] [POOL] [INTERVAL [COUNT]])")
            }
        }
    }
    let interval = nums.first().copied();
    let count = nums
        .get(1)
        .map(|c| *c as u64)
        .unwrap_or(if interval.is_some() { u64::MAX } else { 1 });
    let statuses = |c: &Client| -> Result<Vec<PoolStatus>> {
        Ok(reports(c, name.clone())?
            .into_iter()
            .map(|r| r.status)
            .collect())
    };
    let mut prev = statuses(c)?;
    let mut last = Instant::now();
    let mut out_json = Vec::new();
    for i in 0..count {
        if i > 0 || interval.is_some() {
            std::thread::sleep(Duration::from_secs_f64(interval.unwrap_or(1.0)));
        }
        let secs = last.elapsed().as_secs_f64().max(1e-3);
        last = Instant::now();
        let now = statuses(c)?;
        let mut t = Table::new();
        t.load_style(presets::NOTHING);
        t.set_header([
            "POOL/VDEV",
            "ALLOC",
            "FREE",
            "READ OPS/S",
            "WRITE OPS/S",
            "READ BW",
            "WRITE BW",
        ]);
        for (st, p) in now.iter().zip(prev.iter()) {
            let rate = |new: &VdevStatus, old: &VdevStatus| {
                let sum = |v: &VdevStatus| {
                    let mut s = v.stats;
                    for c in &v.children {
                        s.read_ops += c.stats.read_ops;
                        s.write_ops += c.stats.write_ops;
                        s.read_bytes += c.stats.read_bytes;
                        s.write_bytes += c.stats.write_bytes;
                        for g in &c.children {
                            s.read_ops += g.stats.read_ops;
                            s.write_ops += g.stats.write_ops;
                            s.read_bytes += g.stats.read_bytes;
                            s.write_bytes += g.stats.write_bytes;
                        }
                    }
                    s
                };
                let (n, o) = (sum(new), sum(old));
                (
                    n.read_ops.saturating_sub(o.read_ops) as f64 / secs,
                    n.write_ops.saturating_sub(o.write_ops) as f64 / secs,
                    n.read_bytes.saturating_sub(o.read_bytes) as f64 / secs,
                    n.write_bytes.saturating_sub(o.write_bytes) as f64 / secs,
                )
            };
            let (r, w, rb, wb) = rate(&st.config[0], &p.config[0]);
            t.add_row(vec![
                st.name.clone(),
                human(st.space.allocated),
                human(st.space.free),
                format!("{r:.0}"),
                format!("{w:.0}"),
                human(rb as u64),
                human(wb as u64),
            ]);
            out_json.push(serde_json::json!({"pool": st.name, "allocated": st.space.allocated, "free": st.space.free,
                "read_ops_per_s": r, "write_ops_per_s": w, "read_bytes_per_s": rb, "write_bytes_per_s": wb}));
            if a.verbose {
                let row = |name: String, (r, w, rb, wb): (f64, f64, f64, f64)| {
                    vec![
                        name,
                        String::new(),
                        String::new(),
                        format!("{r:.0}"),
                        format!("{w:.0}"),
                        human(rb as u64),
                        human(wb as u64),
                    ]
                };
                for (nv, ov) in st.config[0]
                    .children
                    .iter()
                    .zip(p.config[0].children.iter())
                {
                    t.add_row(row(format!("  {}", nv.name), rate(nv, ov)));
                    for (nl, ol) in nv.children.iter().zip(ov.children.iter()) {
                        t.add_row(row(format!("    {}", nl.name), rate(nl, ol)));
                    }
                }
            }
        }
        prev = now;
        if a.json {
            outln!("{}", serde_json::to_string(&out_json)?);
            out_json.clear();
        } else {
            outln!("{t}\n");
        }
    }
    Ok(())
}

fn history(c: &Client, a: HistoryArgs) -> Result<()> {
    let all = match c.call(Request::PoolHistory { name: a.name })? {
        Response::History { pools } => pools,
        r => return Err(unexpected(r)),
    };
    for (name, h) in all {
        if a.json {
            outln!("{}", serde_json::to_string_pretty(&h)?);
        } else {
            outln!("History for '{name}':");
            for r in h {
                outln!(
                    "{} {} [txg {} on {}]",
                    tank_pool::fmt_time(r.time),
                    r.command,
                    r.txg,
                    r.host
                );
            }
            outln!();
        }
    }
    Ok(())
}
