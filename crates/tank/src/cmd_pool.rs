//! `tank pool ...`: the zpool vocabulary.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use comfy_table::{presets, Table};
use tank_object::{ScanPhase, ScanStatus};
use tank_pool::{CreateOptions, ImportOptions, Pool, PoolSpec, PoolStatus, VdevStatus};

use crate::datadir::{data_dir, human, parse_size, PoolCache};
use crate::pools::{cache_entry, open_for_create, open_pool, scan_dirs};

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
    /// Clear error counters (of one device or all) and bring faulted devices back.
    Clear(ClearArgs),
    /// Resilver the devices that lack txgs now (the daemon does it by itself).
    Resilver(ResilverArgs),
    /// Replace a device by a new one (or by itself after a disk swap); the new device is
    /// resilvered from the others.
    Replace(ReplaceArgs),
    /// Attach a device to a disk (making a mirror) or to a mirror (one side more).
    Attach(AttachArgs),
    /// Set a pool property: autoreplace=on|off.
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
    /// Columns: name,size,alloc,free,cap,health,guid,ashift,txg,usable.
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
    match cmd {
        PoolCmd::Create(a) => create(a),
        PoolCmd::List(a) => list(a),
        PoolCmd::Status(a) => status(a),
        PoolCmd::Export(a) => export(&a.name),
        PoolCmd::Import(a) => import(a),
        PoolCmd::Destroy(a) => destroy(a),
        PoolCmd::Iostat(a) => iostat(a),
        PoolCmd::History(a) => history(a),
        PoolCmd::Scrub(a) => scrub(a),
        PoolCmd::Events(a) => events(a),
        PoolCmd::Offline(a) => offline(a),
        PoolCmd::Online(a) => online(a),
        PoolCmd::Clear(a) => clear(a),
        PoolCmd::Resilver(a) => resilver(a),
        PoolCmd::Replace(a) => replace(a),
        PoolCmd::Attach(a) => attach(a),
        PoolCmd::Set(a) => pool_set(a),
        PoolCmd::Get(a) => pool_get(a),
        PoolCmd::Detach(a) => detach(a),
        PoolCmd::Add(a) => add(a),
        PoolCmd::Remove(a) => remove(a),
    }
}

/// `zpool add`: the new devices are opened (created with `--size`), checked and labelled;
/// new cache devices join the L2ARC at once.
fn add(a: AddArgs) -> Result<()> {
    const KEYWORDS: &[&str] = &[
        "mirror", "raidz", "raidz1", "raidz2", "raidz3", "log", "cache", "spare", "special",
    ];
    let tokens = a
        .spec
        .iter()
        .map(|t| {
            if KEYWORDS.contains(&t.as_str()) {
                Ok(t.clone())
            } else {
                crate::pools::absolute(t)
            }
        })
        .collect::<Result<Vec<_>>>()?;
    let spec = PoolSpec::parse_add(&tokens, a.force)?;
    let opened = open_pool(&a.name)?;
    let result = (|| -> Result<()> {
        let size = a.size.as_deref().map(parse_size).transpose()?;
        let leaves = opened.pool.leaf_list();
        for d in spec.all_devices() {
            if leaves.iter().any(|(_, l)| l.path() == d) {
                bail!("cannot add: '{d}' is already a device of this pool");
            }
        }
        let devices = open_for_create(&spec.all_devices(), size)?;
        opened.pool.add(&spec, &devices, a.force)?;
        devices_changed(&opened)?;
        opened.store.cache_devices_changed();
        opened.store.sync()?;
        for d in spec.all_devices() {
            outln!("added {d} to pool '{}'", a.name);
        }
        Ok(())
    })();
    opened.close()?;
    result
}

/// `zpool remove` for cache, log and spare devices.
fn remove(a: RemoveArgs) -> Result<()> {
    let opened = open_pool(&a.name)?;
    let result = (|| -> Result<()> {
        for d in &a.devices {
            let (class, _) = opened.pool.remove(d)?;
            devices_changed(&opened)?;
            opened.store.cache_devices_changed();
            outln!(
                "removed {} device {d} from pool '{}'",
                class.section().unwrap_or("data"),
                a.name
            );
        }
        opened.store.sync()?;
        Ok(())
    })();
    opened.close()?;
    result
}

fn create(a: CreateArgs) -> Result<()> {
    let mut ashift = 12;
    for p in &a.props {
        match p.split_once('=') {
            Some(("ashift", v)) => {
                ashift = v
                    .parse()
                    .map_err(|_| anyhow::anyhow!("invalid ashift '{v}': a number from 9 to 16"))?
            }
            _ => bail!("invalid pool property '{p}' (supported at create: ashift=N)"),
        }
    }
    let cache = PoolCache::load(&data_dir())?;
    if cache.find(&a.name).is_some() {
        bail!(
            "cannot create '{}': a pool with that name is already imported",
            a.name
        );
    }
    let spec = PoolSpec::parse(&a.spec, a.force)?;
    let size = a.size.as_deref().map(parse_size).transpose()?;
    let devices = open_for_create(&spec.all_devices(), size)?;
    let opts = CreateOptions {
        ashift,
        force: a.force,
        ..Default::default()
    };
    let (pool, warnings) = Pool::create(&a.name, &spec, &devices, &opts)?;
    for w in &warnings {
        errln!("warning: {w}");
    }
    let st = register(&pool)?;
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

/// After create or import: records the command, opens the object sets, syncs, enters the
/// pool in the cache file and closes it; returns its status.
fn register(pool: &std::sync::Arc<Pool>) -> Result<PoolStatus> {
    pool.log_history(&crate::command_line());
    let (store, dsl) = crate::pools::open_datasets(pool)?;
    store.sync()?;
    let mut cache = PoolCache::load(&data_dir())?;
    cache.upsert(cache_entry(pool));
    cache.save(&data_dir())?;
    let st = pool.status();
    if crate::pools::daemon_mode() {
        crate::pools::adopt(crate::pools::Opened {
            pool: pool.clone(),
            store,
            dsl,
        });
    } else {
        pool.shutdown()?;
    }
    Ok(st)
}

fn pool_names(given: &[String]) -> Result<Vec<String>> {
    if !given.is_empty() {
        return Ok(given.to_vec());
    }
    Ok(PoolCache::load(&data_dir())?
        .pools
        .into_iter()
        .map(|p| p.name)
        .collect())
}

fn list(a: ListArgs) -> Result<()> {
    let cols: Vec<String> = if a.props.is_empty() {
        ["name", "size", "alloc", "free", "cap", "health"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    } else {
        a.props.clone()
    };
    let known = [
        "name", "size", "alloc", "free", "cap", "health", "guid", "ashift", "txg", "usable",
    ];
    for c in &cols {
        if !known.contains(&c.as_str()) {
            bail!("invalid property '{c}' (valid: {})", known.join(","));
        }
    }
    let mut rows = Vec::new();
    let mut json = Vec::new();
    for name in pool_names(&a.names)? {
        let opened = open_pool(&name)?;
        let st = opened.pool.status();
        let ashift = opened.pool.ashift();
        opened.close()?;
        let cap = (st.space.allocated * 100)
            .checked_div(st.space.size)
            .unwrap_or(0);
        let value = |c: &str, raw: bool| -> String {
            let h = |b: u64| if raw { b.to_string() } else { human(b) };
            match c {
                "name" => st.name.clone(),
                "size" => h(st.space.size),
                "alloc" => h(st.space.allocated),
                "free" => h(st.space.free),
                "cap" => format!("{cap}%"),
                "health" => st.state.clone(),
                "guid" => st.guid.to_string(),
                "ashift" => ashift.to_string(),
                "txg" => st.txg.to_string(),
                "usable" => h(st.space.usable),
                _ => "-".into(),
            }
        };
        rows.push(
            cols.iter()
                .map(|c| value(c, a.scripted))
                .collect::<Vec<_>>(),
        );
        json.push(serde_json::json!({
            "name": st.name, "guid": st.guid, "size": st.space.size, "allocated": st.space.allocated,
            "free": st.space.free, "capacity": cap, "health": st.state, "ashift": ashift,
            "txg": st.txg, "usable": st.space.usable,
        }));
    }
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&json)?);
    } else if a.scripted {
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

fn status_tree(t: &mut Table, v: &VdevStatus, depth: usize, verbose: bool) {
    let mut row = vec![
        format!("{}{}", "  ".repeat(depth), v.name),
        v.state.clone(),
        v.read_errors.to_string(),
        v.write_errors.to_string(),
        v.cksum_errors.to_string(),
    ];
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
        status_tree(t, c, depth + 1, verbose);
    }
}

/// `hh:mm:ss` (days as `Nd hh:mm:ss`), as zpool shows durations.
fn hms(secs: f64) -> String {
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

/// What `status` shows beside the vdev tree: the scan and the permanent errors.
pub struct ScanReport {
    pub scan: ScanStatus,
    /// Permanent errors, named (see `tank_dataset::error_name`).
    pub errors: Vec<String>,
    /// Who runs an active scan: `daemon`, or `none` when the pool is held only by this
    /// command's process (which ran it while it held the pool: it stops with it).
    pub runner: Option<&'static str>,
}

impl ScanReport {
    pub fn of(opened: &crate::pools::Opened) -> Self {
        let errors = opened
            .store
            .scan_errors()
            .into_iter()
            .map(|(tree, obj)| tank_dataset::error_name(&opened.dsl, tree, obj))
            .collect();
        let mut scan = opened.store.scan_status();
        let active = scan.state.phase == ScanPhase::Scanning && !scan.state.paused;
        let runner = match (active, crate::pools::daemon_mode()) {
            (false, _) => None,
            (true, true) => Some("daemon"),
            (true, false) => {
                // This process ran it since it opened the pool, and stops it on exit.
                scan.running = false;
                Some("none")
            }
        };
        Self {
            scan,
            errors,
            runner,
        }
    }

    /// The `scan:` lines; an active scan that no process will go on running says so and
    /// names the commands that run it, instead of "in progress".
    pub fn lines(&self, pool: &str) -> Vec<String> {
        let mut lines = scan_lines(&self.scan);
        if self.runner == Some("none") {
            let st = &self.scan.state;
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
}

pub fn print_status(st: &PoolStatus, report: &ScanReport, verbose: bool) {
    outln!("  pool: {}", st.name);
    outln!(" state: {}", st.state);
    if let Some(s) = &st.status {
        outln!("status: {s}");
    } else if !report.errors.is_empty() {
        outln!("status: One or more devices has experienced an error resulting in data corruption. Applications may be affected.");
    }
    if let Some(a) = &st.action {
        outln!("action: {a}");
    } else if !report.errors.is_empty() {
        outln!("action: Restore the files in question from a backup or delete them, then scrub again to clear the list.");
    }
    for (i, line) in report.lines(&st.name).iter().enumerate() {
        outln!("{}{line}", if i == 0 { "  scan: " } else { "        " });
    }
    outln!("config:\n");
    let mut t = Table::new();
    t.load_style(presets::NOTHING);
    let mut header = vec!["NAME", "STATE", "READ", "WRITE", "CKSUM"];
    if verbose {
        header.push("I/O");
    }
    header.push("");
    t.set_header(header);
    for v in &st.config {
        status_tree(&mut t, v, 0, verbose);
    }
    for (section, vdevs) in &st.sections {
        let mut row = vec![
            section.clone(),
            String::new(),
            String::new(),
            String::new(),
            String::new(),
        ];
        if verbose {
            row.push(String::new());
        }
        row.push(String::new());
        t.add_row(row);
        for v in vdevs {
            status_tree(&mut t, v, 1, verbose);
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
    if report.errors.is_empty() {
        outln!("errors: No known data errors");
    } else if verbose {
        outln!("errors: Permanent errors have been detected in the following files:\n");
        for e in &report.errors {
            outln!("        {e}");
        }
    } else {
        outln!(
            "errors: {} data errors, use '-v' for a list",
            report.errors.len()
        );
    }
}

/// One event of one pool, as `events --json` prints it.
#[derive(serde::Serialize, serde::Deserialize)]
struct PoolEvent {
    pool: String,
    seq: u64,
    time: f64,
    class: String,
    vdev: Option<String>,
    detail: String,
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

fn events(a: EventsArgs) -> Result<()> {
    if a.follow {
        bail!("'pool events -f' follows the daemon's events: start it with 'tank serve'");
    }
    let names = match &a.name {
        Some(n) => vec![n.clone()],
        None => pool_names(&[])?,
    };
    let mut all = Vec::new();
    for name in names {
        let opened = open_pool(&name)?;
        if a.clear {
            opened.pool.events.clear();
        } else {
            all.extend(
                opened
                    .pool
                    .events
                    .since(a.since)
                    .into_iter()
                    .map(|e| PoolEvent {
                        pool: name.clone(),
                        seq: e.seq,
                        time: e.time,
                        class: e.class,
                        vdev: e.vdev,
                        detail: e.detail,
                    }),
            );
        }
        opened.close()?;
    }
    all.sort_by(|x, y| x.time.total_cmp(&y.time));
    if a.json {
        outln!("{}", serde_json::to_string(&all)?);
    } else if !a.clear {
        print_events(&all);
    }
    Ok(())
}

/// `pool events -f` in the client: asks the daemon for the newer events twice a second.
pub fn follow_events(a: &EventsArgs) -> Result<()> {
    let mut seen: std::collections::HashMap<String, u64> = Default::default();
    loop {
        let mut argv = vec!["pool".to_string(), "events".into(), "--json".into()];
        argv.extend(a.name.clone());
        let Some(reply) = crate::daemon::forward(&argv, None)? else {
            bail!("'pool events -f' follows the daemon's events: start it with 'tank serve'");
        };
        if reply.code != 0 {
            bail!("{}", reply.stderr.trim());
        }
        let events: Vec<PoolEvent> = serde_json::from_str(reply.stdout.trim())?;
        let fresh: Vec<PoolEvent> = events
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

/// Waits for the running scan in this process, with its progress every few seconds, then
/// prints how it ended.
fn wait_scan(store: &tank_object::ObjectStore) -> Result<()> {
    let mut last = Instant::now();
    while store.scan_status().running {
        std::thread::sleep(Duration::from_millis(200));
        if last.elapsed().as_secs() >= 5 {
            last = Instant::now();
            let lines = scan_lines(&store.scan_status());
            errln!("{}", lines[1..].join(", "));
        }
    }
    store.scan_wait();
    store.sync()?;
    outln!("{}", scan_lines(&store.scan_status()).join("\n"));
    Ok(())
}

fn offline(a: OfflineArgs) -> Result<()> {
    let opened = open_pool(&a.name)?;
    let r = opened.pool.offline(&a.device, a.temporary);
    let r = r.and_then(|()| {
        opened.pool.log_history(&crate::command_line());
        opened
            .store
            .sync()
            .map_err(|e| tank_pool::PoolError::Corrupt(e.to_string()))
    });
    opened.close()?;
    r?;
    outln!(
        "{} of pool '{}' is offline{}",
        a.device,
        a.name,
        if a.temporary { " until export" } else { "" }
    );
    Ok(())
}

/// After devices came back: resilver what they missed, in the daemon or here.
fn resilver_missed(opened: &crate::pools::Opened, wait: bool) -> Result<()> {
    if !opened.store.resilver_start()? {
        outln!("nothing to resilver: every device has every txg");
        return Ok(());
    }
    if crate::pools::daemon_mode() && !wait {
        outln!(
            "resilver started; 'tank pool status {}' shows its progress",
            opened.pool.name()
        );
        return Ok(());
    }
    wait_scan(&opened.store)
}

fn online(a: DeviceArgs) -> Result<()> {
    let opened = open_pool(&a.name)?;
    let result = (|| -> Result<()> {
        let missed = opened.pool.online(&a.device)?;
        opened.pool.log_history(&crate::command_line());
        match missed {
            Some((first, last)) => {
                outln!("{} is online; it missed txgs {first}..={last}", a.device);
                resilver_missed(&opened, false)
            }
            None => {
                outln!("{} is online", a.device);
                Ok(())
            }
        }
    })();
    opened.close()?;
    result
}

fn clear(a: ClearArgs) -> Result<()> {
    let opened = open_pool(&a.name)?;
    let result = (|| -> Result<()> {
        let back = opened.pool.clear(a.device.as_deref())?;
        opened.pool.log_history(&crate::command_line());
        for (dev, (first, last)) in &back {
            outln!("{dev} is back online; it missed txgs {first}..={last}");
        }
        if !back.is_empty() {
            resilver_missed(&opened, false)?;
        }
        Ok(())
    })();
    opened.close()?;
    result
}

fn replace(a: ReplaceArgs) -> Result<()> {
    let opened = open_pool(&a.name)?;
    let result = (|| -> Result<()> {
        let size = a.size.as_deref().map(parse_size).transpose()?;
        let leaves = opened.pool.leaf_list();
        let (_, old_leaf) = opened.pool.find_leaf(&a.old)?;
        // Without NEW, the disk at the old device's place (for a slot a hot spare stands in
        // for: the failed device's, not the spare's).
        let new = a.new.clone().unwrap_or_else(|| {
            old_leaf
                .spare_for()
                .map_or_else(|| old_leaf.path(), |(_, path)| path)
        });
        let new_abs = crate::pools::absolute(&new)?;
        if new_abs == old_leaf.path() {
            // The same device again (a disk swapped in place): only once it is out of use.
            if old_leaf.is_usable() {
                bail!(
                    "cannot replace {} with itself while it is {}; take it offline first, or name a new device",
                    a.old,
                    old_leaf.state().name()
                );
            }
            old_leaf.close();
        } else if leaves.iter().any(|(_, l)| l.path() == new_abs) {
            bail!(
                "cannot replace {} with {new}: it is already a device of this pool",
                a.old
            );
        }
        let mut devs = open_for_create(std::slice::from_ref(&new), size)?;
        let dev = devs.remove(&new).expect("opened");
        let (first, last) = opened.pool.replace(&a.old, &new_abs, dev, a.force)?;
        devices_changed(&opened)?;
        outln!(
            "{} replaced by {new_abs}; it lacks txgs {first}..={last} until the resilver rebuilt it",
            a.old
        );
        resilver_missed(&opened, a.wait)
    })();
    opened.close()?;
    result
}

/// After a device change: the command goes in the history, the new device paths in the
/// cache file.
fn devices_changed(opened: &crate::pools::Opened) -> Result<()> {
    opened.pool.log_history(&crate::command_line());
    let mut cache = PoolCache::load(&data_dir())?;
    cache.upsert(cache_entry(&opened.pool));
    cache.save(&data_dir())?;
    Ok(())
}

fn pool_set(a: PoolSetArgs) -> Result<()> {
    let Some((prop, value)) = a.assignment.split_once('=') else {
        bail!("expected PROPERTY=VALUE, got '{}'", a.assignment);
    };
    if prop != "autoreplace" {
        bail!("cannot set '{prop}': the settable pool property is autoreplace (ashift is fixed at creation)");
    }
    let on = match value {
        "on" => true,
        "off" => false,
        _ => bail!("bad value '{value}' for {prop}: on or off"),
    };
    let opened = open_pool(&a.name)?;
    let r = opened.pool.set_autoreplace(on);
    if r.is_ok() {
        opened.pool.log_history(&crate::command_line());
    }
    opened.close()?;
    r?;
    Ok(())
}

fn pool_get(a: PoolGetArgs) -> Result<()> {
    let opened = open_pool(&a.name)?;
    let cfg = opened.pool.config();
    let space = opened.pool.space();
    let all: Vec<(&str, String, &str)> = vec![
        ("size", space.size.to_string(), "-"),
        ("allocated", space.allocated.to_string(), "-"),
        ("free", space.free.to_string(), "-"),
        ("health", opened.pool.state().to_string(), "-"),
        ("guid", cfg.guid.to_string(), "-"),
        ("ashift", cfg.ashift.to_string(), "local"),
        (
            "autoreplace",
            if cfg.autoreplace { "on" } else { "off" }.to_string(),
            if cfg.autoreplace { "local" } else { "default" },
        ),
    ];
    opened.close()?;
    let wanted: Vec<&str> = a.props.split(',').collect();
    let rows: Vec<&(&str, String, &str)> = all
        .iter()
        .filter(|(p, _, _)| a.props == "all" || wanted.contains(p))
        .collect();
    if let Some(unknown) = wanted
        .iter()
        .find(|w| **w != "all" && !all.iter().any(|(p, _, _)| p == *w))
    {
        bail!("no such pool property: '{unknown}'");
    }
    if a.json {
        let m: serde_json::Map<String, serde_json::Value> = rows
            .iter()
            .map(|(p, v, s)| (p.to_string(), serde_json::json!({"value": v, "source": s})))
            .collect();
        outln!("{}", serde_json::Value::Object(m));
    } else {
        outln!("{:<8} {:<12} {:<20} SOURCE", "NAME", "PROPERTY", "VALUE");
        for (p, v, s) in rows {
            outln!("{:<8} {:<12} {:<20} {s}", a.name, p, v);
        }
    }
    Ok(())
}

fn attach(a: AttachArgs) -> Result<()> {
    let opened = open_pool(&a.name)?;
    let result = (|| -> Result<()> {
        let size = a.size.as_deref().map(parse_size).transpose()?;
        let new_abs = crate::pools::absolute(&a.new)?;
        if opened
            .pool
            .leaf_list()
            .iter()
            .any(|(_, l)| l.path() == new_abs)
        {
            bail!(
                "cannot attach {} to {}: it is already a device of this pool",
                a.new,
                a.existing
            );
        }
        let mut devs = open_for_create(std::slice::from_ref(&a.new), size)?;
        let dev = devs.remove(&a.new).expect("opened");
        let (first, last) = opened.pool.attach(&a.existing, &new_abs, dev, a.force)?;
        devices_changed(&opened)?;
        outln!(
            "{new_abs} attached to {}; it lacks txgs {first}..={last} until the resilver rebuilt it",
            a.existing
        );
        resilver_missed(&opened, a.wait)
    })();
    opened.close()?;
    result
}

fn detach(a: DeviceArgs) -> Result<()> {
    let opened = open_pool(&a.name)?;
    let result = (|| -> Result<()> {
        opened.pool.detach(&a.device)?;
        devices_changed(&opened)?;
        opened.store.sync()?;
        outln!("{} detached from pool '{}'", a.device, a.name);
        Ok(())
    })();
    opened.close()?;
    result
}

fn resilver(a: ResilverArgs) -> Result<()> {
    let opened = open_pool(&a.name)?;
    let st = opened.store.scan_status();
    let result = if st.running && st.state.func == "resilver" {
        // Resumed when this process opened the pool (or running in the daemon).
        if crate::pools::daemon_mode() && !a.wait {
            outln!(
                "a resilver is running; 'tank pool status {}' shows its progress",
                a.name
            );
            Ok(())
        } else {
            outln!("resuming the resilver of pool '{}'", a.name);
            wait_scan(&opened.store)
        }
    } else {
        resilver_missed(&opened, a.wait)
    };
    opened.close()?;
    result
}

fn scrub(a: ScrubArgs) -> Result<()> {
    let opened = open_pool(&a.name)?;
    let store = opened.store.clone();
    let name = &a.name;
    let result = (|| -> Result<()> {
        if a.stop {
            store
                .scrub_cancel()
                .with_context(|| format!("cannot cancel scrubbing {name}"))?;
            outln!("scrub of pool '{name}' canceled");
            return Ok(());
        }
        if a.pause {
            store
                .scrub_pause()
                .with_context(|| format!("cannot pause scrubbing {name}"))?;
            outln!("scrub of pool '{name}' paused; 'tank pool scrub {name}' resumes it");
            return Ok(());
        }
        let st = store.scan_status();
        if !crate::pools::daemon_mode() && st.running && st.state.func == "scrub" {
            // A scrub an earlier process left: resumed when this one opened the pool.
            outln!("resuming the scrub of pool '{name}'");
            return wait_scan(&store);
        }
        store
            .scrub_start()
            .with_context(|| format!("cannot scrub {name}"))?;
        if crate::pools::daemon_mode() && !a.wait {
            outln!("scrub of pool '{name}' started; 'tank pool status {name}' shows its progress");
            return Ok(());
        }
        wait_scan(&store)
    })();
    opened.close()?;
    result
}

fn status(a: StatusArgs) -> Result<()> {
    let names = match &a.name {
        Some(n) => vec![n.clone()],
        None => pool_names(&[])?,
    };
    if names.is_empty() {
        outln!("no pools available");
        return Ok(());
    }
    let mut all = Vec::new();
    for name in names {
        let opened = open_pool(&name)?;
        for n in &opened.pool.import_notes {
            errln!("note: {n}");
        }
        all.push((opened.pool.status(), ScanReport::of(&opened)));
        opened.close()?;
    }
    if a.json {
        let json: Vec<serde_json::Value> = all
            .iter()
            .map(|(st, r)| {
                let mut v = serde_json::to_value(st).expect("serializable");
                v["scan"] = serde_json::to_value(&r.scan).expect("serializable");
                v["scan"]["runner"] = serde_json::to_value(r.runner).expect("serializable");
                v["errors"] = serde_json::to_value(&r.errors).expect("serializable");
                v
            })
            .collect();
        outln!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        for (st, r) in &all {
            print_status(st, r, a.verbose);
        }
    }
    Ok(())
}

fn export(name: &str) -> Result<()> {
    let opened = open_pool(name)?;
    crate::mounts::unmount_pool(name)?;
    opened.pool.log_history(&crate::command_line());
    opened.pool.export()?;
    crate::pools::forget(name);
    let mut cache = PoolCache::load(&data_dir())?;
    cache.remove(name);
    cache.save(&data_dir())?;
    outln!("exported pool '{name}'");
    Ok(())
}

fn import(a: ImportArgs) -> Result<()> {
    let dirs = if a.dirs.is_empty() {
        vec![data_dir()]
    } else {
        a.dirs.clone()
    };
    let Some(name) = a.name.clone() else {
        let devs = scan_dirs(&dirs, false)?;
        let found = Pool::scan(&devs);
        let cache = PoolCache::load(&data_dir())?;
        let found: Vec<_> = found
            .into_iter()
            .filter(|c| cache.find(&c.guid.to_string()).is_none())
            .collect();
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
        return Ok(());
    };
    let cache = PoolCache::load(&data_dir())?;
    if cache.find(&name).is_some() {
        bail!("cannot import '{name}': a pool with that name is already imported");
    }
    let devs = scan_dirs(&dirs, true)?;
    let pool = Pool::import(
        &devs,
        &ImportOptions {
            name: Some(name.clone()),
            rewind: a.rewind,
            force: a.force,
            missing_log: a.missing_log,
            tunables: None,
            supported_features: None,
        },
    )?;
    for path in pool.autoreplace(&devs) {
        errln!("note: autoreplace: the blank device at {path} replaced the missing one");
    }
    drop(devs);
    for n in &pool.import_notes {
        errln!("note: {n}");
    }
    let st = register(&pool)?;
    outln!("imported pool '{}' ({})", st.name, st.state);
    Ok(())
}

fn destroy(a: DestroyArgs) -> Result<()> {
    let opened = open_pool(&a.name)?;
    crate::mounts::unmount_pool(&a.name)?;
    opened.pool.destroy()?;
    crate::pools::forget(&a.name);
    let mut cache = PoolCache::load(&data_dir())?;
    cache.remove(&a.name);
    cache.save(&data_dir())?;
    outln!("destroyed pool '{}'", a.name);
    Ok(())
}

fn iostat(a: IostatArgs) -> Result<()> {
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
    let names = match name {
        Some(n) => vec![n],
        None => pool_names(&[])?,
    };
    let opened: Vec<_> = names.iter().map(|n| open_pool(n)).collect::<Result<_>>()?;
    let mut prev: Vec<PoolStatus> = opened.iter().map(|o| o.pool.status()).collect();
    let mut last = Instant::now();
    let mut out_json = Vec::new();
    for i in 0..count {
        if i > 0 || interval.is_some() {
            std::thread::sleep(Duration::from_secs_f64(interval.unwrap_or(1.0)));
        }
        let secs = last.elapsed().as_secs_f64().max(1e-3);
        last = Instant::now();
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
        for (o, p) in opened.iter().zip(prev.iter_mut()) {
            let st = o.pool.status();
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
                    (n.read_ops - o.read_ops) as f64 / secs,
                    (n.write_ops - o.write_ops) as f64 / secs,
                    (n.read_bytes - o.read_bytes) as f64 / secs,
                    (n.write_bytes - o.write_bytes) as f64 / secs,
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
            *p = st;
        }
        if a.json {
            outln!("{}", serde_json::to_string(&out_json)?);
            out_json.clear();
        } else {
            outln!("{t}\n");
        }
    }
    for o in opened {
        o.close()?;
    }
    Ok(())
}

fn history(a: HistoryArgs) -> Result<()> {
    let names = match &a.name {
        Some(n) => vec![n.clone()],
        None => pool_names(&[])?,
    };
    for name in names {
        let opened = open_pool(&name)?;
        let h = opened.pool.history()?;
        opened.close()?;
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
