//! `tank share`: add, list, set and remove the shares of the imported pools
//! (`tank_service::shares`), kept with their datasets. Each command is a typed request to
//! the service; in the daemon every change goes through its one registry, which the
//! protocol servers watch.

use std::collections::BTreeMap;

use anyhow::Result;
use clap::{Args, Subcommand};
use comfy_table::{presets, Table};
use tank_service::api::{Request, Response};

use crate::client::{call, unexpected};

#[derive(Subcommand)]
pub enum ShareCmd {
    /// Share a dataset (smb, nfs, s3) or a volume (iscsi): PROTOCOL NAME DATASET [-o K=V]...
    /// Options: readonly (ro), comment; smb: users, groups, browseable, guest, timemachine,
    /// timemachine_quota, previous_versions, snapshot_schedule (15min, hourly, daily or
    /// weekly, :KEEP); nfs: clients (hosts), squash (root, none, all), anonuid, anongid, sec;
    /// s3: users, groups, public, versioning, object_lock; iscsi: iqn, lun, initiators,
    /// chap_users.
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

fn share(req: Request) -> Result<tank_service::shares::ShareInfo> {
    match call(req)? {
        Response::Share(s) => Ok(s),
        r => Err(unexpected(r)),
    }
}

pub fn run(c: ShareCmd) -> Result<()> {
    match c {
        ShareCmd::Add(a) => {
            let options: BTreeMap<String, String> =
                crate::out::pairs(&a.options)?.into_iter().collect();
            let s = share(Request::ShareAdd {
                protocol: a.protocol,
                name: a.name,
                dataset: a.dataset,
                options,
            })?;
            outln!("{} share '{}' of {} added", s.protocol, s.name, s.dataset);
        }
        ShareCmd::List(l) => {
            let all = match call(Request::ShareList)? {
                Response::Shares(s) => s,
                r => return Err(unexpected(r)),
            };
            if l.json {
                outln!("{}", serde_json::to_string_pretty(&all)?);
            } else {
                let mut t = Table::new();
                t.load_style(presets::NOTHING);
                t.set_header(vec!["NAME", "PROTOCOL", "DATASET", "STATE", "OPTIONS"]);
                for s in &all {
                    let o: Vec<String> =
                        s.options.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    t.add_row(vec![
                        s.name.clone(),
                        s.protocol.clone(),
                        s.dataset.clone(),
                        s.state.clone().unwrap_or_else(|| "-".into()),
                        o.join(" "),
                    ]);
                }
                outln!("{t}");
            }
        }
        ShareCmd::Set(a) => {
            let s = share(Request::ShareSet {
                name: a.name,
                settings: crate::out::pairs(&a.settings)?,
            })?;
            outln!("share '{}' of {} updated", s.name, s.dataset);
        }
        ShareCmd::Remove(n) => {
            let s = share(Request::ShareRemove { name: n.name })?;
            outln!(
                "{} share '{}' of {} removed (its data stays)",
                s.protocol,
                s.name,
                s.dataset
            );
        }
    }
    Ok(())
}
