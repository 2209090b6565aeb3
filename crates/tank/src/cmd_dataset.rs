//! `tank dataset ...`, `tank snapshot`, `tank rollback`, `tank clone`: the zfs(8) vocabulary
//! over the dataset directory.
//!
//! # Theory of operation
//! Each command opens the pool named by the dataset's first component (through the daemon's
//! registry when it runs, else in this process), runs one dataset-directory task or query,
//! prints the result the way zfs does (tables, `-H` for scripts, `-p` for exact numbers,
//! `--json`), and closes the pool.

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use comfy_table::{presets, Table};
use tank_dataset::props::{self, PropType};
use tank_dataset::{DatasetInfo, DatasetKind, Dsl, Op};

use crate::mounts::{remount, unmount_tree};
use crate::pools::{open_pool, Opened};

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

/// The pool a dataset name belongs to.
pub fn pool_of(name: &str) -> &str {
    name.split(['/', '@']).next().unwrap_or(name)
}

/// Runs `f` on the directory of the pool that `name` belongs to, logging the command to
/// the pool history when it changes something.
fn with_dsl<T>(name: &str, change: bool, f: impl FnOnce(&Dsl) -> Result<T>) -> Result<T> {
    with_pool(name, change, |o| f(&o.dsl))
}

fn with_pool<T>(name: &str, change: bool, f: impl FnOnce(&Opened) -> Result<T>) -> Result<T> {
    let opened = open_pool(pool_of(name))?;
    let result = f(&opened);
    if change && result.is_ok() {
        opened.pool.log_history(&crate::command_line());
    }
    opened.close()?;
    result
}

fn parse_props(list: &[String]) -> Result<Vec<(String, String)>> {
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
        DatasetCmd::List(a) => list(a),
        DatasetCmd::Get(a) => get(a),
        DatasetCmd::Set(a) => set(a),
        DatasetCmd::Inherit(a) => inherit(a),
        DatasetCmd::Rename(a) => with_dsl(&a.from, true, |d| {
            if pool_of(&a.to) != pool_of(&a.from) {
                bail!(
                    "cannot rename '{}' to '{}': datasets cannot move to another pool",
                    a.from,
                    a.to
                );
            }
            d.run(Op::Rename {
                from: a.from.clone(),
                to: a.to.clone(),
            })?;
            Ok(())
        }),
        DatasetCmd::Destroy(a) => with_pool(&a.name, true, |o| {
            let d = &o.dsl;
            let was = if a.name.contains('@') {
                Vec::new()
            } else {
                unmount_tree(&a.name)?
            };
            let result = d.run(Op::Destroy {
                name: a.name.clone(),
                recursive: a.recursive || a.dependents,
                dependents: a.dependents,
            });
            let gone = match result {
                Ok(g) => g,
                Err(e) => {
                    let back: Vec<_> = was.into_iter().map(|(n, d)| (n, Some(d))).collect();
                    remount(&o.dsl, &o.store, &back);
                    return Err(e.into());
                }
            };
            if gone.len() > 1 {
                outln!("destroyed {} datasets and snapshots", gone.len());
            }
            Ok(())
        }),
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
    with_pool(&a.name, true, |o| {
        let created = o.dsl.run(Op::Create {
            name: a.name.clone(),
            kind,
            props: props.clone(),
            parents: a.parents,
        })?;
        let names: Vec<(String, Option<std::path::PathBuf>)> = created
            .iter()
            .map(|id| (o.dsl.name_of(*id), None))
            .collect();
        remount(&o.dsl, &o.store, &names);
        Ok(())
    })
}

pub fn snapshot(a: SnapshotArgs) -> Result<()> {
    let pool = pool_of(&a.names[0]).to_string();
    if let Some(other) = a.names.iter().find(|n| pool_of(n) != pool) {
        bail!("cannot snapshot '{other}': all snapshots of one command must be in one pool");
    }
    with_dsl(&pool, true, |d| {
        d.run(Op::Snapshot {
            names: a.names.clone(),
            recursive: a.recursive,
        })?;
        Ok(())
    })
}

pub fn rollback(a: RollbackArgs) -> Result<()> {
    with_pool(&a.snapshot, true, |o| {
        let dataset = a.snapshot.split('@').next().unwrap_or_default();
        // As zfs: the filesystem is unmounted for the rollback and mounted again after.
        let was: Vec<_> = unmount_tree(dataset)?
            .into_iter()
            .map(|(n, d)| (n, Some(d)))
            .collect();
        let result = o.dsl.run(Op::Rollback {
            snapshot: a.snapshot.clone(),
            destroy_later: a.recursive,
        });
        remount(&o.dsl, &o.store, &was);
        result?;
        Ok(())
    })
}

pub fn clone(a: CloneArgs) -> Result<()> {
    let props = parse_props(&a.props)?;
    if pool_of(&a.target) != pool_of(&a.snapshot) {
        bail!(
            "cannot clone '{}' to '{}': a clone stays in its snapshot's pool",
            a.snapshot,
            a.target
        );
    }
    with_pool(&a.snapshot, true, |o| {
        o.dsl.run(Op::Clone {
            snapshot: a.snapshot.clone(),
            target: a.target.clone(),
            props: props.clone(),
        })?;
        remount(&o.dsl, &o.store, &[(a.target.clone(), None)]);
        Ok(())
    })
}

fn set(a: SetArgs) -> Result<()> {
    let (name, assigns) = a.args.split_last().expect("at least two arguments");
    if name.contains('=') {
        bail!("usage: tank dataset set PROP=VALUE... DATASET (the dataset comes last)");
    }
    let props = parse_props(assigns)?;
    with_dsl(name, true, |d| {
        d.run(Op::SetProps {
            name: name.clone(),
            props: props.into_iter().map(|(k, v)| (k, Some(v))).collect(),
        })?;
        Ok(())
    })
}

fn inherit(a: InheritArgs) -> Result<()> {
    for name in &a.names {
        with_dsl(name, true, |d| {
            let root = d.resolve(name)?;
            let targets = if a.recursive {
                d.subtree(root)
            } else {
                vec![root]
            };
            for id in targets {
                let rec = d.record(id)?;
                if rec.kind == DatasetKind::Snapshot
                    || (id != root && !rec.props.contains_key(&a.prop))
                {
                    continue;
                }
                d.run(Op::SetProps {
                    name: d.name_of(id),
                    props: vec![(a.prop.clone(), None)],
                })?;
            }
            Ok(())
        })?;
    }
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

/// The datasets a listing covers: the named ones (and descendants with -r), or all.
fn selected(d: &Dsl, names: &[String], recursive: bool) -> Result<Vec<DatasetInfo>> {
    let ids: Vec<u64> = if names.is_empty() {
        d.all_ids()
    } else {
        let mut ids = Vec::new();
        for n in names {
            let id = d.resolve(n)?;
            if recursive {
                ids.extend(d.subtree(id));
            } else {
                ids.push(id);
            }
        }
        ids
    };
    ids.into_iter().map(|i| Ok(d.info(i)?)).collect()
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

fn pools_for(names: &[String]) -> Result<Vec<String>> {
    if names.is_empty() {
        let cache = crate::datadir::PoolCache::load(&crate::datadir::data_dir())?;
        return Ok(cache.pools.iter().map(|p| p.name.clone()).collect());
    }
    let mut pools: Vec<String> = names.iter().map(|n| pool_of(n).to_string()).collect();
    pools.dedup();
    Ok(pools)
}

fn list(a: ListArgs) -> Result<()> {
    let types = wanted_types(&a.types)?;
    let columns: Vec<String> = a.columns.split(',').map(String::from).collect();
    for c in &columns {
        if c != "name" && props::lookup(c).is_none() {
            bail!("invalid property '{c}'");
        }
    }
    let mut rows = Vec::new();
    for pool in pools_for(&a.names)? {
        let names: Vec<String> = a
            .names
            .iter()
            .filter(|n| pool_of(n) == pool)
            .cloned()
            .collect();
        // Without names, list everything (zfs list shows all datasets).
        let recursive = a.recursive || names.is_empty();
        let infos = with_dsl(&pool, false, |d| selected(d, &names, recursive))?;
        rows.extend(
            infos
                .into_iter()
                .filter(|i| types.contains(&i.kind) || (!names.is_empty() && !a.recursive)),
        );
    }
    if a.json {
        let out: Vec<serde_json::Value> = rows
            .iter()
            .map(|i| {
                let mut m = serde_json::Map::new();
                m.insert("name".into(), i.name.clone().into());
                m.insert("type".into(), i.kind.name().into());
                for c in &columns {
                    if c != "name" {
                        m.insert(c.clone(), shown(i, c, true).into());
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

fn get(a: GetArgs) -> Result<()> {
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
        let infos = with_dsl(name, false, |d| {
            selected(d, std::slice::from_ref(name), a.recursive)
        })?;
        for i in infos {
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
