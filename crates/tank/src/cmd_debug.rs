//! `tank debug ...`: labels, uberblocks, block trees, and raw objects (zdb's role), so the
//! engine can be exercised and inspected without datasets. Labels are read from the device
//! file here (read-only, as zdb -l does); the rest are requests to the service that holds
//! the pool.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use tank_device::{BlockDevice, FileDevice, FileDeviceOptions};
use tank_object::ROOT_OBJSET;
use tank_pool::label;
use tank_service::api::{hex_decode, hex_encode, Request, Response};

use crate::client::{call, unexpected, with_client};
use crate::datadir::parse_size;

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
    match call(Request::DebugTree {
        pool: a.pool.clone(),
        objset: a.objset,
        limit: a.limit,
    })? {
        Response::Text { text } => out!("{text}"),
        r => return Err(unexpected(r)),
    }
    Ok(())
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
            let mut data = Vec::new();
            if file.as_os_str() == "-" {
                std::io::stdin()
                    .lock()
                    .read_to_end(&mut data)
                    .context("cannot read standard input")?;
            } else {
                let file = crate::out::resolve(&file);
                std::fs::File::open(&file)
                    .and_then(|mut f| f.read_to_end(&mut data))
                    .with_context(|| format!("cannot read {}", file.display()))?;
            }
            match call(Request::DebugObjectWrite {
                pool,
                objset,
                block_size: bs as u32,
                data: hex_encode(&data),
            })? {
                Response::ObjectWritten { id, length } => {
                    errln!("wrote {length} bytes as object {id} of objset {objset}");
                    outln!("{id}");
                }
                r => return Err(unexpected(r)),
            }
            Ok(())
        }
        ObjectCmd::Read { pool, id, objset } => with_client(|c| {
            let mut out = std::io::stdout().lock();
            let mut offset = 0u64;
            loop {
                let (data, size) = match c.call(Request::DebugObjectRead {
                    pool: pool.clone(),
                    objset,
                    id,
                    offset,
                    length: 8 << 20,
                })? {
                    Response::Bytes { data, size } => (hex_decode(&data)?, size),
                    r => return Err(unexpected(r)),
                };
                if data.is_empty() {
                    break;
                }
                out.write_all(&data)?;
                offset += data.len() as u64;
                if offset >= size {
                    break;
                }
            }
            out.flush()?;
            Ok(())
        }),
        ObjectCmd::Rm { pool, id, objset } => {
            match call(Request::DebugObjectRemove { pool, objset, id })? {
                Response::Done { message } => errln!("{message}"),
                r => return Err(unexpected(r)),
            }
            Ok(())
        }
        ObjectCmd::List { pool, objset, json } => {
            let infos = match call(Request::DebugObjectList { pool, objset })? {
                Response::Objects { objects } => objects,
                r => return Err(unexpected(r)),
            };
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
