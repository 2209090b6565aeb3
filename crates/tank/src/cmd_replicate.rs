//! `tank replicate`: tasks that keep a dataset's snapshots on another tank host over SSH,
//! run by the daemon whenever the source has a snapshot the target lacks (see the service's
//! `ops_replicate.rs` for how a run goes).

use anyhow::Result;
use clap::{Args, Subcommand};
use tank_service::api::{ReplicationSpec, Request, Response};

use crate::client::{call, unexpected};
use tank_bench::run::util::{human, parse_size};

#[derive(Subcommand)]
pub enum ReplicateCmd {
    /// Add (or change) a task: NAME POOL/DS ssh://[USER@]HOST[:PORT]/POOL/DS, or NAME POOL/DS
    /// s3://BUCKET/PREFIX --remote REMOTE (backups).
    Add(AddArgs),
    /// Every task: its state, its last success, its lag and what it sent.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Run a task now, and wait for it.
    Run { name: String },
    /// Remove a task (what it sent stays on the target).
    Remove { name: String },
}

#[derive(Args)]
pub struct AddArgs {
    /// The task's name.
    name: String,
    /// The dataset whose snapshots are sent.
    source: String,
    /// Where to: ssh://[USER@]HOST[:PORT]/POOL/DS, or s3://BUCKET/PREFIX.
    target: String,
    /// At most this many bytes per second (e.g. 20M), to either kind of target.
    #[arg(long, value_name = "RATE")]
    bwlimit: Option<String>,
    /// Destroy the target's schedule snapshots once the source has pruned them (never the
    /// newest snapshot the two have in common); on s3://, delete the chains of backups none
    /// of whose snapshots the source has (never the newest chain).
    #[arg(long)]
    prune: bool,
    /// For s3://: the remote (tank remote add) that reaches the bucket.
    #[arg(long, value_name = "NAME")]
    remote: Option<String>,
    /// For s3://: begin a new chain with a full stream once the chain has N streams.
    #[arg(long, value_name = "N", default_value_t = 0)]
    full_every: u32,
    /// The private key to authenticate with (ssh -i).
    #[arg(long, value_name = "FILE")]
    identity: Option<String>,
    /// An ssh option, KEY=VALUE (ssh -o); may be given more than once.
    #[arg(long = "ssh-option", value_name = "KEY=VALUE")]
    ssh_options: Vec<String>,
    /// How the remote shell runs tank.
    #[arg(long, default_value = "tank", value_name = "COMMAND")]
    remote_tank: String,
    /// Run only on request (tank replicate run), not whenever the source has a new snapshot.
    #[arg(long)]
    manual: bool,
}

fn ago(secs: Option<u64>) -> String {
    match secs {
        None => "-".into(),
        Some(s) if s < 120 => format!("{s} s"),
        Some(s) if s < 7200 => format!("{} min", s / 60),
        Some(s) if s < 172_800 => format!("{} h", s / 3600),
        Some(s) => format!("{} d", s / 86400),
    }
}

pub fn run(c: ReplicateCmd) -> Result<()> {
    match c {
        ReplicateCmd::Add(a) => {
            let bwlimit = a.bwlimit.as_deref().map(parse_size).transpose()?;
            let r = call(Request::ReplicationAdd {
                task: ReplicationSpec {
                    name: a.name,
                    source: a.source,
                    target: a.target,
                    bwlimit,
                    prune: a.prune,
                    identity: a.identity,
                    ssh_options: a.ssh_options,
                    remote_tank: a.remote_tank,
                    auto: !a.manual,
                    remote: a.remote,
                    full_every: a.full_every,
                },
            })?;
            if let Response::Done { message } = r {
                println!("{message}");
            }
            Ok(())
        }
        ReplicateCmd::Run { name } => {
            if let Response::Done { message } = call(Request::ReplicationRun { name })? {
                println!("{message}");
            }
            Ok(())
        }
        ReplicateCmd::Remove { name } => {
            if let Response::Done { message } = call(Request::ReplicationRemove { name })? {
                println!("{message}");
            }
            Ok(())
        }
        ReplicateCmd::List { json } => match call(Request::ReplicationList)? {
            Response::Replications(list) => {
                if json {
                    println!("{}", serde_json::to_string_pretty(&list)?);
                    return Ok(());
                }
                println!(
                    "{:<14} {:<22} {:<36} {:<10} {:>9} {:>8} {:>7} {:>9}  LAST ERROR",
                    "NAME", "SOURCE", "TARGET", "STATUS", "LAST OK", "LAG", "PENDING", "SENT"
                );
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                for r in list {
                    println!(
                        "{:<14} {:<22} {:<36} {:<10} {:>9} {:>8} {:>7} {:>9}  {}",
                        r.spec.name,
                        r.spec.source,
                        r.spec.target,
                        r.status,
                        r.state.last_success.map_or("-".into(), |t| format!(
                            "{} ago",
                            ago(Some(now - t.min(now)))
                        )),
                        ago(r.lag_secs),
                        r.pending,
                        human(r.state.bytes_total),
                        r.state.last_error.as_deref().unwrap_or("-")
                    );
                }
                Ok(())
            }
            r => Err(unexpected(r)),
        },
    }
}
