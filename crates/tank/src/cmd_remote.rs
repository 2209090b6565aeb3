//! `tank remote`: S3-compatible stores that backups go to (`tank send --to s3://...
//! --remote NAME`) and are restored from (`tank receive --from s3://... --remote NAME`).

use anyhow::Result;
use clap::{Args, Subcommand};
use tank_service::api::{Request, Response};

use crate::client::{call, unexpected};
use tank_bench::run::util::human;

#[derive(Subcommand)]
pub enum RemoteCmd {
    /// Add (or change) a remote: an endpoint and the keys to reach it.
    Add(AddArgs),
    /// The remotes (never their secrets).
    List {
        #[arg(long)]
        json: bool,
    },
    /// Remove a remote (the backups stay in the store).
    Remove { name: String },
    /// The backups under s3://BUCKET/PREFIX: each stream, its base, size and time.
    ListBackups {
        /// The remote.
        name: String,
        /// s3://BUCKET/PREFIX
        url: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
pub struct AddArgs {
    name: String,
    /// http[s]://HOST[:PORT]
    #[arg(long)]
    endpoint: String,
    #[arg(long)]
    access_key: String,
    #[arg(long)]
    secret_key: String,
    #[arg(long)]
    region: Option<String>,
    /// Encrypt backups with a new key (shown once: keep a copy elsewhere).
    #[arg(long, conflicts_with = "encryption_key")]
    encrypt: bool,
    /// Encrypt backups with this key (64 hex digits), e.g. to restore on another machine.
    #[arg(long, value_name = "HEX")]
    encryption_key: Option<String>,
}

pub fn run(c: RemoteCmd) -> Result<()> {
    match c {
        RemoteCmd::Add(a) => {
            let r = call(Request::RemoteAdd {
                name: a.name,
                endpoint: a.endpoint,
                access_key: a.access_key,
                secret_key: a.secret_key,
                region: a.region,
                encryption_key: if a.encrypt {
                    Some("generate".into())
                } else {
                    a.encryption_key
                },
            })?;
            if let Response::Done { message } = r {
                println!("{message}");
            }
            Ok(())
        }
        RemoteCmd::Remove { name } => {
            if let Response::Done { message } = call(Request::RemoteRemove { name })? {
                println!("{message}");
            }
            Ok(())
        }
        RemoteCmd::List { json } => match call(Request::RemoteList)? {
            Response::Remotes(list) => {
                if json {
                    println!("{}", serde_json::to_string_pretty(&list)?);
                    return Ok(());
                }
                println!(
                    "{:<14} {:<36} {:<22} {:<12} ENCRYPTION KEY ID",
                    "NAME", "ENDPOINT", "ACCESS KEY", "REGION"
                );
                for r in list {
                    println!(
                        "{:<14} {:<36} {:<22} {:<12} {}",
                        r.name,
                        r.endpoint,
                        r.access_key,
                        r.region,
                        r.key_id.as_deref().unwrap_or("-")
                    );
                }
                Ok(())
            }
            r => Err(unexpected(r)),
        },
        RemoteCmd::ListBackups { name, url, json } => {
            match call(Request::BackupList { remote: name, url })? {
                Response::Backups(l) => {
                    if json {
                        println!("{}", serde_json::to_string_pretty(&l)?);
                        return Ok(());
                    }
                    println!(
                        "{:<40} {:<20} {:>9} {:<19}  {:<9} SNAPSHOTS",
                        "SNAPSHOT", "BASE", "SIZE", "STORED", "ENCRYPTED"
                    );
                    for m in &l.backups {
                        println!(
                            "{:<40} {:<20} {:>9} {:<19}  {:<9} {}",
                            format!("{}@{}", m.dataset, m.snapshot),
                            m.from.as_deref().unwrap_or("(full)"),
                            human(m.size),
                            tank_pool::fmt_time(m.stored),
                            if m.key_id.is_some() { "yes" } else { "no" },
                            m.snapshots.len()
                        );
                    }
                    for u in &l.unfinished {
                        println!("unfinished upload (never restored): {u}");
                    }
                    Ok(())
                }
                r => Err(unexpected(r)),
            }
        }
    }
}
