//! `tank share`: add, list, set and remove the shares of the imported pools
//! (`tank_service::shares`), kept with their datasets. In the daemon every command goes
//! through its one registry, which the protocol servers will watch for changes; a command
//! without a daemon uses a registry of its own (no server runs to be told).

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use comfy_table::{presets, Table};
use tank_service::shares::Registry;

use crate::datadir::{data_dir, PoolCache};
use crate::pools::open_pool;

#[derive(Subcommand)]
pub enum ShareCmd {
    /// Share a dataset (smb, nfs, s3) or a volume (iscsi): PROTOCOL NAME DATASET [-o K=V]...
    /// Options: readonly, comment; smb: users, groups, browseable, guest, timemachine,
    /// timemachine_quota, previous_versions; nfs: hosts, squash, anonuid, anongid, sec;
    /// s3: users, groups, public; iscsi: iqn, lun, initiators, chap_users.
    Add(AddArgs),
    /// List the shares of every imported pool.
    List(ListArgs),
    /// Change options of a share: NAME KEY=VALUE... (KEY= goes back to the default).
    Set(SetArgs),
    /// Remove a share (the dataset and its data stay).
    Remove(NameArg),
}

#[derive(Args)]
pub struct AddArgs {
    pub protocol: String,
    pub name: String,
    pub dataset: String,
    /// KEY=VALUE options (repeatable).
    #[arg(short = 'o')]
    pub options: Vec<String>,
}

#[derive(Args)]
pub struct ListArgs {
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct SetArgs {
    pub name: String,
    #[arg(required = true)]
    pub settings: Vec<String>,
}

#[derive(Args)]
pub struct NameArg {
    pub name: String,
}

/// The daemon's registry, made when it starts.
static DAEMON_REGISTRY: OnceLock<Arc<Registry>> = OnceLock::new();

/// The daemon's share registry (made at its start, for its protocol servers to watch).
pub fn daemon_registry() -> Arc<Registry> {
    DAEMON_REGISTRY
        .get_or_init(|| Arc::new(Registry::new()))
        .clone()
}

fn registry() -> Arc<Registry> {
    match DAEMON_REGISTRY.get() {
        Some(r) => r.clone(),
        None => Arc::new(Registry::new()),
    }
}

fn pairs(items: &[String]) -> Result<Vec<(String, String)>> {
    items
        .iter()
        .map(|s| match s.split_once('=') {
            Some((k, v)) => Ok((k.to_string(), v.to_string())),
            None => bail!("expected KEY=VALUE, got '{s}'"),
        })
        .collect()
}

pub fn run(c: ShareCmd) -> Result<()> {
    let names: Vec<String> = PoolCache::load(&data_dir())?
        .pools
        .into_iter()
        .map(|p| p.name)
        .collect();
    let mut opened = Vec::new();
    for n in &names {
        opened.push(open_pool(n)?);
    }
    let pools: Vec<Arc<tank_dataset::Dsl>> = opened.iter().map(|o| o.dsl.clone()).collect();
    let accounts = crate::cmd_account::accounts().ok();
    let registry = registry();
    let result = (|| -> Result<()> {
        match c {
            ShareCmd::Add(a) => {
                let options: BTreeMap<String, String> = pairs(&a.options)?.into_iter().collect();
                let s = registry.add(
                    &pools,
                    &a.protocol,
                    &a.name,
                    &a.dataset,
                    &options,
                    accounts.as_deref(),
                )?;
                outln!("{} share '{}' of {} added", s.protocol, s.name, s.dataset);
            }
            ShareCmd::List(l) => {
                let all = registry.list(&pools);
                if l.json {
                    outln!("{}", serde_json::to_string_pretty(&all)?);
                } else {
                    let mut t = Table::new();
                    t.load_style(presets::NOTHING);
                    t.set_header(vec!["NAME", "PROTOCOL", "DATASET", "OPTIONS"]);
                    for s in &all {
                        let o: Vec<String> =
                            s.options.iter().map(|(k, v)| format!("{k}={v}")).collect();
                        t.add_row(vec![
                            s.name.clone(),
                            s.protocol.clone(),
                            s.dataset.clone(),
                            o.join(" "),
                        ]);
                    }
                    outln!("{t}");
                }
            }
            ShareCmd::Set(a) => {
                let s = registry.set(&pools, &a.name, &pairs(&a.settings)?, accounts.as_deref())?;
                outln!("share '{}' of {} updated", s.name, s.dataset);
            }
            ShareCmd::Remove(n) => {
                let s = registry.remove(&pools, &n.name)?;
                outln!(
                    "{} share '{}' of {} removed (its data stays)",
                    s.protocol,
                    s.name,
                    s.dataset
                );
            }
        }
        Ok(())
    })();
    for o in opened {
        o.close()?;
    }
    result
}
