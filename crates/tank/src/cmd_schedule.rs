//! `tank schedule`: snapshots the daemon takes and prunes on its own, as sanoid's
//! `autosnap` and `autoprune` (names `autosnap_YYYY-MM-DD_HH:MM:SS_PERIOD`, UTC).

use anyhow::Result;
use clap::{Args, Subcommand};
use tank_dataset::autosnap::Schedule;
use tank_service::api::{Request, Response};

use crate::client::{call, unexpected};

#[derive(Subcommand)]
pub enum ScheduleCmd {
    /// Snapshot a dataset on schedule, keeping the newest N of each period.
    Add(AddArgs),
    /// Every dataset's schedule and what it keeps now.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Stop snapshotting a dataset on schedule (its snapshots stay).
    Remove { dataset: String },
}

#[derive(Args)]
pub struct AddArgs {
    /// Hourly snapshots to keep.
    #[arg(long, default_value_t = 0)]
    hourly: u32,
    /// Daily snapshots to keep (taken after midnight UTC).
    #[arg(long, default_value_t = 0)]
    daily: u32,
    /// Weekly snapshots to keep (taken after Monday 00:00 UTC).
    #[arg(long, default_value_t = 0)]
    weekly: u32,
    /// Monthly snapshots to keep (taken after the first of the month, 00:00 UTC).
    #[arg(long, default_value_t = 0)]
    monthly: u32,
    /// Snapshot every descendant too, atomically.
    #[arg(short = 'r')]
    recursive: bool,
    dataset: String,
}

pub fn run(c: ScheduleCmd) -> Result<()> {
    match c {
        ScheduleCmd::Add(a) => {
            let schedule = Schedule {
                hourly: a.hourly,
                daily: a.daily,
                weekly: a.weekly,
                monthly: a.monthly,
                recursive: a.recursive,
            };
            if schedule.is_empty() {
                anyhow::bail!("give at least one of --hourly, --daily, --weekly, --monthly");
            }
            if let Response::Done { message } = call(Request::ScheduleSet {
                dataset: a.dataset,
                schedule: Some(schedule),
            })? {
                println!("{message}");
            }
            Ok(())
        }
        ScheduleCmd::Remove { dataset } => {
            call(Request::ScheduleSet {
                dataset,
                schedule: None,
            })?;
            Ok(())
        }
        ScheduleCmd::List { json } => match call(Request::ScheduleList)? {
            Response::Schedules(list) => {
                if json {
                    println!("{}", serde_json::to_string_pretty(&list)?);
                    return Ok(());
                }
                println!(
                    "{:<30} {:>7} {:>6} {:>7} {:>8}  {:<9} NEWEST",
                    "DATASET", "HOURLY", "DAILY", "WEEKLY", "MONTHLY", "RECURSIVE"
                );
                for s in list {
                    let kept = |p: &str, want: u32| {
                        let n = s.kept.iter().find(|(q, _)| q == p).map_or(0, |(_, n)| *n);
                        format!("{n}/{want}")
                    };
                    println!(
                        "{:<30} {:>7} {:>6} {:>7} {:>8}  {:<9} {}",
                        s.dataset,
                        kept("hourly", s.schedule.hourly),
                        kept("daily", s.schedule.daily),
                        kept("weekly", s.schedule.weekly),
                        kept("monthly", s.schedule.monthly),
                        if s.schedule.recursive { "yes" } else { "no" },
                        s.newest.as_deref().unwrap_or("-")
                    );
                }
                Ok(())
            }
            r => Err(unexpected(r)),
        },
    }
}
