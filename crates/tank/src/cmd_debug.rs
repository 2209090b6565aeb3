//! `tank debug ...`: labels, uberblocks, block trees, and raw objects (zdb's role), so the
//! engine can be exercised and inspected without datasets.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use tank_device::{BlockDevice, FileDevice, FileDeviceOptions};
use tank_object::{ObjectSet, ROOT_OBJSET};
use tank_pool::label;

use crate::datadir::parse_size;
use crate::pools::open_pool;

#[derive(Subcommand)]
pub enum DebugCmd {
    /// Dump the four labels and the uberblock ring of a device.
    Label(LabelArgs),
    /// Dump the pool's root block, space map log, objset table and the items of an object set.
    Tree(TreeArgs),
    /// Write, read, list and delete raw objects.
    #[command(subcommand)]
    Object(ObjectCmd),
}

#[derive(Args)]
pub struct LabelArgs {
    #[arg(long)]
    json: bool,
    device: PathBuf,
}

#[derive(Args)]
pub struct TreeArgs {
    pool: String,
    #[arg(long, default_value_t = ROOT_OBJSET)]
    objset: u64,
    /// Most items to show.
    #[arg(long, default_value_t = 200)]
    limit: usize,
}

#[derive(Subcommand)]
pub enum ObjectCmd {
    /// Store a file as a new object; prints the object id alone on the last line.
    Write {
        pool: String,
        /// File to store ('-' for standard input).
        file: PathBuf,
        /// Block size of the object (power of two, 512 to 1M).
        #[arg(long, default_value = "128K")]
        block_size: String,
        #[arg(long, default_value_t = ROOT_OBJSET)]
        objset: u64,
    },
    /// Write an object's bytes to standard output.
    Read {
        pool: String,
        id: u64,
        #[arg(long, default_value_t = ROOT_OBJSET)]
        objset: u64,
    },
    /// Delete an object and free its blocks.
    Rm {
        pool: String,
        id: u64,
        #[arg(long, default_value_t = ROOT_OBJSET)]
        objset: u64,
    },
    /// List objects with their sizes.
    List {
        pool: String,
        #[arg(long, default_value_t = ROOT_OBJSET)]
        objset: u64,
        #[arg(long)]
        json: bool,
    },
}

pub fn run(cmd: DebugCmd) -> Result<()> {
    match cmd {
        DebugCmd::Label(a) => dump_label(&crate::out::resolve(&a.device), a.json),
        DebugCmd::Tree(a) => dump_tree(&a),
        DebugCmd::Object(c) => object(c),
    }
}

fn dump_label(path: &Path, json: bool) -> Result<()> {
    let dev = FileDevice::open(
        path,
        &FileDeviceOptions {
            read_only: true,
            ..Default::default()
        },
    )?;
    let (good, bad) = label::read_labels(&dev);
    let ashift = good.first().map(|l| l.config.ashift).unwrap_or(12);
    let mut ubs = label::read_uberblocks(&dev, ashift);
    ubs.sort_by_key(|(i, u)| (u.txg, *i));
    if json {
        let out = serde_json::json!({
            "device": path.display().to_string(),
            "size": dev.size(),
            "labels": good.iter().map(|l| serde_json::json!({
                "index": l.index, "pool_guid": l.pool_guid, "leaf_guid": l.leaf_guid,
                "top_guid": l.top_guid, "config": l.config,
            })).collect::<Vec<_>>(),
            "bad_labels": bad,
            "uberblocks": ubs.iter().map(|(i, u)| serde_json::json!({
                "label": i, "txg": u.txg, "timestamp": u.timestamp, "guid_sum": u.guid_sum,
                "root": u.root.describe(),
            })).collect::<Vec<_>>(),
        });
        outln!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    outln!("device {} ({} bytes)", path.display(), dev.size());
    for l in &good {
        outln!("--------------------------------------------");
        outln!("LABEL {}", l.index);
        outln!("--------------------------------------------");
        outln!("    pool: {} (guid {})", l.config.name, l.pool_guid);
        outln!("    state: {}", l.config.state.name());
        outln!("    txg: {}", l.config.txg);
        outln!("    version: {}", l.config.version);
        outln!("    hostname: {}", l.config.hostname);
        outln!("    leaf guid: {}  top guid: {}", l.leaf_guid, l.top_guid);
        outln!("    ashift: {}", l.config.ashift);
        outln!("    features: {}", l.config.features.join(", "));
        for t in &l.config.vdevs {
            outln!(
                "    vdev {}: {:?} {:?}{} guid {}",
                t.id,
                t.class,
                t.kind,
                if t.parity > 0 {
                    format!(" parity {}", t.parity)
                } else {
                    String::new()
                },
                t.guid
            );
            for c in &t.children {
                outln!("        {} guid {}", c.path, c.guid);
            }
        }
    }
    for b in &bad {
        outln!("failed to unpack {b}");
    }
    outln!("uberblocks ({} valid copies):", ubs.len());
    for (i, u) in ubs.iter().rev().take(32) {
        outln!(
            "    label {i} txg {} time {} root {}",
            u.txg,
            tank_pool::fmt_time(u.timestamp),
            u.root.describe()
        );
    }
    Ok(())
}

fn dump_tree(a: &TreeArgs) -> Result<()> {
    let opened = open_pool(&a.pool)?;
    let (root_bp, root) = opened.pool.root();
    outln!("pool {} txg {}", a.pool, opened.pool.synced_txg());
    if let Some(bp) = root_bp {
        outln!("root block: {}", bp.describe());
    }
    if let Some(r) = root {
        outln!("    history records: {}", r.history_count);
        outln!("    space map log: {} block(s)", r.spacemap_chain);
        for bp in opened.pool.spacemap_chain() {
            outln!("        {}", bp.describe());
        }
        if let Some(bp) = r.objset_table {
            outln!("    objset table: {}", bp.describe());
        }
    }
    for (id, bp) in opened.pool.objsets() {
        outln!(
            "objset {id}: root {}",
            bp.map(|b| b.describe()).unwrap_or_else(|| "empty".into())
        );
    }
    let os = opened.store.objset(a.objset)?;
    outln!("items of objset {} (first {}):", a.objset, a.limit);
    for (k, desc) in os.dump(a.limit)? {
        outln!(
            "    obj {} kind {} off {}: {}",
            k.obj,
            k.kind,
            k.offset,
            desc
        );
    }
    opened.close()
}

/// Bytes per transaction when streaming a file into an object.
const WRITE_CHUNK: usize = 8 << 20;

fn write_object(
    os: &ObjectSet,
    store: &tank_object::ObjectStore,
    mut input: impl Read,
    block_size: u32,
) -> Result<(u64, u64)> {
    let id = {
        let tx = store.begin(0)?;
        os.create_object(&tx, 1, block_size)?
    };
    let mut offset = 0u64;
    let mut buf = vec![0u8; WRITE_CHUNK];
    loop {
        let mut filled = 0;
        while filled < buf.len() {
            let n = input.read(&mut buf[filled..])?;
            if n == 0 {
                break;
            }
            filled += n;
        }
        if filled == 0 {
            break;
        }
        let tx = store.begin(filled as u64)?;
        os.write(&tx, id, offset, &buf[..filled])?;
        drop(tx);
        offset += filled as u64;
        if filled < buf.len() {
            break;
        }
    }
    Ok((id, offset))
}

fn object(cmd: ObjectCmd) -> Result<()> {
    match cmd {
        ObjectCmd::Write {
            pool,
            file,
            block_size,
            objset,
        } => {
            let bs = parse_size(&block_size)?;
            if !(512..=(16 << 20)).contains(&bs) || !bs.is_power_of_two() {
                bail!("invalid block size '{block_size}': a power of two from 512 to 16M");
            }
            let opened = open_pool(&pool)?;
            let os = opened.store.objset(objset)?;
            let (id, len) = if file.as_os_str() == "-" {
                write_object(&os, &opened.store, std::io::stdin().lock(), bs as u32)?
            } else {
                let file = crate::out::resolve(&file);
                let f = std::fs::File::open(&file)
                    .with_context(|| format!("cannot open {}", file.display()))?;
                write_object(&os, &opened.store, std::io::BufReader::new(f), bs as u32)?
            };
            opened.pool.log_history(&crate::command_line());
            opened.store.sync()?;
            opened.close()?;
            errln!("wrote {len} bytes as object {id} of objset {objset}");
            outln!("{id}");
            Ok(())
        }
        ObjectCmd::Read { pool, id, objset } => {
            let opened = open_pool(&pool)?;
            let os = opened.store.objset(objset)?;
            let info = os.stat(id)?;
            let mut out = std::io::stdout().lock();
            let mut off = 0;
            while off < info.size {
                let chunk = os.read(id, off, WRITE_CHUNK)?;
                if chunk.is_empty() {
                    break;
                }
                out.write_all(&chunk)?;
                off += chunk.len() as u64;
            }
            out.flush()?;
            opened.close()
        }
        ObjectCmd::Rm { pool, id, objset } => {
            let opened = open_pool(&pool)?;
            let os = opened.store.objset(objset)?;
            {
                let tx = opened.store.begin(0)?;
                os.free_object(&tx, id)?;
            }
            opened.pool.log_history(&crate::command_line());
            opened.store.sync()?;
            opened.close()?;
            errln!("removed object {id} of objset {objset}");
            Ok(())
        }
        ObjectCmd::List { pool, objset, json } => {
            let opened = open_pool(&pool)?;
            let os = opened.store.objset(objset)?;
            let mut infos = Vec::new();
            let mut from = 1;
            loop {
                let ids = os.list_objects(from, 1000)?;
                if ids.is_empty() {
                    break;
                }
                for id in &ids {
                    infos.push(os.stat(*id)?);
                }
                from = ids.last().expect("non-empty") + 1;
            }
            opened.close()?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&infos)?);
            } else {
                outln!("{:>8} {:>12} {:>8} {:>8}", "ID", "SIZE", "BLKSZ", "TXG");
                for i in infos {
                    outln!(
                        "{:>8} {:>12} {:>8} {:>8}",
                        i.id,
                        i.size,
                        i.block_size,
                        i.modified_txg
                    );
                }
            }
            Ok(())
        }
    }
}
