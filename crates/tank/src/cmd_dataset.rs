//! `tank dataset ...`, `tank snapshot`, `tank rollback`, `tank clone`: the zfs(8) vocabulary
//! over the dataset directory.
//!
//! # Theory of operation
//! Each command sends one typed request to the service (`client.rs`), which runs the
//! dataset-directory task with its policy (unmount and remount around rollback and
//! destroy), and prints the result the way zfs does (tables, `-H` for scripts, `-p` for
//! exact numbers, `--json`). Listings get every dataset's properties with their sources;
//! the columns are picked and formatted here.

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use comfy_table::{presets, Table};
use tank_dataset::props::{self, PropType};
use tank_dataset::{DatasetInfo, DatasetKind};
use tank_service::api::{Request, Response};

use crate::client::{call, unexpected, with_client, Client};

#[derive(Subcommand)]
pub enum DatasetCmd {
    /// Create a filesystem, or a volume with -V.
    Create(CreateArgs),
    /// List datasets with their space and mountpoints (or chosen properties).
    List(ListArgs),
    /// Show properties with their values and sources.
    Get(GetArgs),
    /// Set properties: `tank dataset set PROP=VALUE... DATASET`.
    Set(SetArgs),
    /// Remove local values so the properties are inherited again.
    Inherit(InheritArgs),
    /// Rename a dataset (moving it within its pool) or a snapshot.
    Rename(RenameArgs),
    /// Destroy a dataset or snapshot.
    Destroy(DestroyArgs),
}

#[derive(Args)]
pub struct CreateArgs {
    /// Create missing parent datasets.
    #[arg(short = 'p')]
    parents: bool,
    /// Property to set, PROP=VALUE (repeatable).
    #[arg(short = 'o', value_name = "PROP=VALUE")]
    props: Vec<String>,
    /// Create a volume of this size.
    #[arg(short = 'V', value_name = "SIZE")]
    volsize: Option<String>,
    /// Block size of a volume (volblocksize).
    #[arg(short = 'b', value_name = "SIZE")]
    blocksize: Option<String>,
    /// Sparse volume: no refreservation of its size.
    #[arg(short = 's')]
    sparse: bool,
    name: String,
}

#[derive(Args)]
pub struct ListArgs {
    /// Include every descendant.
    #[arg(short = 'r')]
    recursive: bool,
    /// Types to show: filesystem, volume, snapshot, all (comma-separated).
    #[arg(short = 't', default_value = "filesystem,volume")]
    types: String,
    /// Properties to show (comma-separated).
    #[arg(
        short = 'o',
        default_value = "name,used,available,referenced,mountpoint"
    )]
    columns: String,
    /// Scripted mode: no header, tab-separated.
    #[arg(short = 'H')]
    scripted: bool,
    /// Exact numbers.
    #[arg(short = 'p')]
    exact: bool,
    #[arg(long)]
    json: bool,
    names: Vec<String>,
}

#[derive(Args)]
pub struct GetArgs {
    #[arg(short = 'r')]
    recursive: bool,
    #[arg(short = 'H')]
    scripted: bool,
    #[arg(short = 'p')]
    exact: bool,
    #[arg(long)]
    json: bool,
    /// `all` or comma-separated property names.
    props: String,
    #[arg(required = true)]
    names: Vec<String>,
}

#[derive(Args)]
pub struct SetArgs {
    /// PROP=VALUE... followed by the dataset.
    #[arg(required = true, num_args = 2..)]
    args: Vec<String>,
}

#[derive(Args)]
pub struct InheritArgs {
    /// Also clear the local value on every descendant.
    #[arg(short = 'r')]
    recursive: bool,
    prop: String,
    #[arg(required = true)]
    names: Vec<String>,
}

#[derive(Args)]
pub struct RenameArgs {
    from: String,
    to: String,
}

#[derive(Args)]
pub struct DestroyArgs {
    /// Also destroy children and snapshots (for NAME@SNAP: that snapshot of every descendant).
    #[arg(short = 'r')]
    recursive: bool,
    /// Also destroy clones of the snapshots destroyed (and implies -r).
    #[arg(short = 'R')]
    dependents: bool,
    /// Force: unmount even while files are open (they fail from then on) and stop the
    /// other front ends that serve it (NFS, S3, SMB).
    #[arg(short = 'f')]
    force: bool,
    name: String,
}

#[derive(Args)]
pub struct SnapshotArgs {
    /// Snapshot every descendant too, atomically.
    #[arg(short = 'r')]
    recursive: bool,
    #[arg(required = true)]
    names: Vec<String>,
}

#[derive(Args)]
pub struct RollbackArgs {
    /// Destroy the snapshots more recent than the one rolled back to.
    #[arg(short = 'r')]
    recursive: bool,
    snapshot: String,
}

#[derive(Args)]
pub struct CloneArgs {
    #[arg(short = 'o', value_name = "PROP=VALUE")]
    props: Vec<String>,
    snapshot: String,
    target: String,
}

pub fn parse_props(list: &[String]) -> Result<Vec<(String, String)>> {
    list.iter()
        .map(|p| match p.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => bail!("invalid property '{p}': expected PROP=VALUE"),
        })
        .collect()
}

pub fn run(cmd: DatasetCmd) -> Result<()> {
    match cmd {
        DatasetCmd::Create(a) => create(a),
        DatasetCmd::List(a) => with_client(|c| list(c, a)),
        DatasetCmd::Get(a) => with_client(|c| get(c, a)),
        DatasetCmd::Set(a) => set(a),
        DatasetCmd::Inherit(a) => with_client(|c| {
            for name in &a.names {
                c.call(Request::DatasetInherit {
                    name: name.clone(),
                    property: a.prop.clone(),
                    recursive: a.recursive,
                })?;
            }
            Ok(())
        }),
        DatasetCmd::Rename(a) => {
            call(Request::DatasetRename {
                from: a.from,
                to: a.to,
            })?;
            Ok(())
        }
        DatasetCmd::Destroy(a) => {
            match call(Request::DatasetDestroy {
                name: a.name,
                recursive: a.recursive || a.dependents,
                dependents: a.dependents,
                force: a.force,
                background: false,
            })? {
                Response::Destroyed { count } if count > 1 => {
                    outln!("destroyed {count} datasets and snapshots")
                }
                Response::Destroyed { .. } => {}
                r => return Err(unexpected(r)),
            }
            Ok(())
        }
    }
}

fn create(a: CreateArgs) -> Result<()> {
    let mut props = parse_props(&a.props)?;
    let kind = if let Some(v) = &a.volsize {
        props.push(("volsize".into(), v.clone()));
        if let Some(b) = &a.blocksize {
            props.push(("volblocksize".into(), b.clone()));
        }
        // As zfs: a volume reserves its size unless it is sparse.
        if !a.sparse && !props.iter().any(|(k, _)| k == "refreservation") {
            props.push(("refreservation".into(), v.clone()));
        }
        DatasetKind::Volume
    } else {
        if a.blocksize.is_some() {
            bail!("-b sets a volume's block size: use it with -V SIZE");
        }
        DatasetKind::Filesystem
    };
    call(Request::DatasetCreate {
        name: a.name,
        kind,
        props,
        parents: a.parents,
    })?;
    Ok(())
}

pub fn snapshot(a: SnapshotArgs) -> Result<()> {
    call(Request::Snapshot {
        names: a.names,
        recursive: a.recursive,
    })?;
    Ok(())
}

pub fn rollback(a: RollbackArgs) -> Result<()> {
    call(Request::Rollback {
        snapshot: a.snapshot,
        destroy_later: a.recursive,
    })?;
    Ok(())
}

pub fn clone(a: CloneArgs) -> Result<()> {
    call(Request::Clone {
        snapshot: a.snapshot,
        target: a.target,
        props: parse_props(&a.props)?,
    })?;
    Ok(())
}

fn set(a: SetArgs) -> Result<()> {
    let (name, assigns) = a.args.split_last().expect("at least two arguments");
    if name.contains('=') {
        bail!("usage: tank dataset set PROP=VALUE... DATASET (the dataset comes last)");
    }
    call(Request::DatasetSet {
        name: name.clone(),
        props: parse_props(assigns)?,
    })?;
    Ok(())
}

fn wanted_types(spec: &str) -> Result<Vec<DatasetKind>> {
    let mut out = Vec::new();
    for t in spec.split(',') {
        match t {
            "filesystem" | "fs" => out.push(DatasetKind::Filesystem),
            "volume" | "vol" => out.push(DatasetKind::Volume),
            "snapshot" | "snap" => out.push(DatasetKind::Snapshot),
            "all" => out.extend([
                DatasetKind::Filesystem,
                DatasetKind::Volume,
                DatasetKind::Snapshot,
            ]),
            _ => bail!("invalid type '{t}': use filesystem, volume, snapshot or all"),
        }
    }
    Ok(out)
}

fn datasets(
    c: &Client,
    names: Vec<String>,
    recursive: bool,
    types: Vec<DatasetKind>,
) -> Result<Vec<DatasetInfo>> {
    match c.call(Request::DatasetList {
        names,
        recursive,
        types,
    })? {
        Response::Datasets { datasets } => Ok(datasets),
        r => Err(unexpected(r)),
    }
}

fn shown(info: &DatasetInfo, prop: &str, exact: bool) -> String {
    if prop == "name" {
        return info.name.clone();
    }
    match (props::lookup(prop), info.prop(prop)) {
        (Some(def), Some(v)) => {
            if prop == "creation" && !exact {
                return v.parse::<u64>().map_or(v.to_string(), tank_pool::fmt_time);
            }
            if def.ty == PropType::Size && v != "-" {
                props::display(def, v, exact)
            } else {
                v.to_string()
            }
        }
        _ => "-".to_string(),
    }
}

fn list(c: &Client, a: ListArgs) -> Result<()> {
    let types = wanted_types(&a.types)?;
    let columns: Vec<String> = a.columns.split(',').map(String::from).collect();
    for col in &columns {
        if col != "name" && props::lookup(col).is_none() {
            bail!("invalid property '{col}'");
        }
    }
    let named = !a.names.is_empty();
    // Without names, list everything (zfs list shows all datasets).
    let rows: Vec<DatasetInfo> = datasets(c, a.names, a.recursive || !named, types.clone())?
        .into_iter()
        .filter(|i| types.contains(&i.kind) || (named && !a.recursive))
        .collect();
    if a.json {
        let out: Vec<serde_json::Value> = rows
            .iter()
            .map(|i| {
                let mut m = serde_json::Map::new();
                m.insert("name".into(), i.name.clone().into());
                m.insert("type".into(), i.kind.name().into());
                for col in &columns {
                    if col != "name" {
                        m.insert(col.clone(), shown(i, col, true).into());
                    }
                }
                serde_json::Value::Object(m)
            })
            .collect();
        outln!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    print_rows(
        &columns.iter().map(|c| c.to_uppercase()).collect::<Vec<_>>(),
        rows.iter()
            .map(|i| columns.iter().map(|c| shown(i, c, a.exact)).collect())
            .collect(),
        a.scripted,
    );
    Ok(())
}

fn print_rows(header: &[String], rows: Vec<Vec<String>>, scripted: bool) {
    if scripted {
        for r in rows {
            outln!("{}", r.join("\t"));
        }
        return;
    }
    let mut t = Table::new();
    t.load_style(presets::NOTHING);
    t.set_header(header.to_vec());
    for r in rows {
        t.add_row(r);
    }
    outln!("{t}");
}

fn get(c: &Client, a: GetArgs) -> Result<()> {
    let wanted: Option<Vec<String>> = if a.props == "all" {
        None
    } else {
        let list: Vec<String> = a.props.split(',').map(String::from).collect();
        for p in &list {
            if p != "name" && props::lookup(p).is_none() {
                bail!("invalid property '{p}'");
            }
        }
        Some(list)
    };
    let mut rows = Vec::new();
    let mut json = Vec::new();
    for name in &a.names {
        for i in datasets(c, vec![name.clone()], a.recursive, Vec::new())? {
            let props: Vec<&(String, String, String)> = match &wanted {
                None => i.props.iter().collect(),
                Some(w) => w
                    .iter()
                    .filter_map(|p| i.props.iter().find(|(n, _, _)| n == p))
                    .collect(),
            };
            for (p, _, source) in props {
                let value = shown(&i, p, a.exact);
                json.push(serde_json::json!({
                    "name": i.name, "property": p, "value": shown(&i, p, true), "source": source
                }));
                rows.push(vec![i.name.clone(), p.clone(), value, source.clone()]);
            }
        }
    }
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(());
    }
    print_rows(
        &["NAME", "PROPERTY", "VALUE", "SOURCE"].map(String::from),
        rows,
        a.scripted,
    );
    Ok(())
}
