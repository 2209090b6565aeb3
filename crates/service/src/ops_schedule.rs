//! Snapshot schedules (`tank schedule`): kept with their datasets, run by the daemon.
//!
//! # Theory of operation
//! A schedule is a field of its dataset's record (so it moves with the pool, as shares do).
//! The daemon calls [`Service::run_schedules`] every little while: for each dataset of each
//! open pool with a schedule, `autosnap::plan` says which snapshots are due and which have
//! aged out; the due ones are taken in one sync task (with `-r` semantics when the schedule
//! is recursive), then the aged ones destroyed, each under the pool's lock as a command's
//! would be. Every snapshot taken or destroyed is an event
//! (`sysevent.fs.tank.autosnap`, `sysevent.fs.tank.autosnap_pruned`); a failure is an
//! `ereport.fs.tank.autosnap_failed` event, and the next round tries again.

use std::sync::atomic::Ordering;

use tank_dataset::autosnap::{self, PERIODS};
use tank_dataset::{DatasetKind, Op};

use crate::api::{Request, Response, ScheduleInfo};
use crate::error::ServiceError;
use crate::mounts::pool_of;
use crate::service::{Ctx, Res, Service};

fn now_secs_f64() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl Service {
    pub(crate) fn schedule_request(&self, ctx: &mut Ctx, req: Request) -> Res<Response> {
        match req {
            Request::ScheduleSet { dataset, schedule } => {
                let o = self.open_pool(pool_of(&dataset), ctx)?;
                o.dsl
                    .run(Op::SetSchedule {
                        name: dataset.clone(),
                        schedule,
                    })
                    .map_err(|e| ServiceError::from_anyhow(&e.into()))?;
                o.pool.log_history(&ctx.command);
                Ok(Response::Done {
                    message: match schedule.filter(|s| !s.is_empty()) {
                        Some(_) => format!("'{dataset}' is snapshotted on schedule"),
                        None => format!("'{dataset}' has no schedule"),
                    },
                })
            }
            Request::ScheduleList => {
                let mut out = Vec::new();
                for o in self.open_pools() {
                    for id in o.dsl.all_ids() {
                        let Ok(rec) = o.dsl.record(id) else { continue };
                        let Some(schedule) = rec.schedule else {
                            continue;
                        };
                        let names = self.snapshot_names(&o.dsl, id);
                        let kept = PERIODS
                            .iter()
                            .map(|p| {
                                let n = names
                                    .iter()
                                    .filter(|n| {
                                        autosnap::parse_name(n).is_some_and(|(_, q)| q == *p)
                                    })
                                    .count();
                                (p.to_string(), n)
                            })
                            .collect();
                        let newest = names
                            .iter()
                            .filter_map(|n| autosnap::parse_name(n).map(|(t, _)| (t, n)))
                            .max()
                            .map(|(_, n)| format!("{}@{n}", o.dsl.name_of(id)));
                        out.push(ScheduleInfo {
                            dataset: o.dsl.name_of(id),
                            schedule,
                            kept,
                            newest,
                        });
                    }
                }
                Ok(Response::Schedules(out))
            }
            _ => Err(ServiceError::BadRequest("not a schedule request".into())),
        }
    }

    fn snapshot_names(&self, dsl: &tank_dataset::Dsl, id: u64) -> Vec<String> {
        dsl.snapshots(id)
            .into_iter()
            .filter_map(|s| dsl.record(s).ok().map(|r| r.name))
            .collect()
    }

    /// The length of a schedule's hour (3600 s; shorter only to try schedules out: the
    /// schedules' clock then runs faster from now on).
    pub fn set_schedule_hour(&self, secs: u64) {
        self.schedule_hour_secs
            .store(secs.max(1), Ordering::Relaxed);
        self.schedule_origin
            .store(now_secs_f64().to_bits(), Ordering::Relaxed);
    }

    pub fn schedule_hour(&self) -> u64 {
        self.schedule_hour_secs.load(Ordering::Relaxed)
    }

    /// Takes the snapshots that are due and destroys those that aged out, on every open
    /// pool; returns a line per snapshot taken or destroyed, and per failure.
    pub fn run_schedules(&self) -> Vec<String> {
        // Time as the schedules see it: real, or running faster (from when the hour was made
        // shorter) to try schedules out.
        let real = now_secs_f64();
        let origin = f64::from_bits(self.schedule_origin.load(Ordering::Relaxed));
        let now = (origin + (real - origin) * 3600.0 / self.schedule_hour() as f64) as i64;
        let mut lines = Vec::new();
        for o in self.open_pools() {
            for id in o.dsl.all_ids() {
                let Ok(rec) = o.dsl.record(id) else { continue };
                if rec.kind == DatasetKind::Snapshot || rec.recv.is_some() {
                    continue;
                }
                let Some(schedule) = rec.schedule else {
                    continue;
                };
                let name = o.dsl.name_of(id);
                let (take, destroy) =
                    autosnap::plan(&schedule, &self.snapshot_names(&o.dsl, id), now);
                let lock = self.pool_lock(&name);
                let _l = lock.lock();
                let events = &o.pool.events;
                if !take.is_empty() {
                    let names: Vec<String> = take.iter().map(|n| format!("{name}@{n}")).collect();
                    match o.dsl.run(Op::Snapshot {
                        names: names.clone(),
                        recursive: schedule.recursive,
                    }) {
                        Ok(_) => {
                            for n in &names {
                                events.post(
                                    "sysevent.fs.tank.autosnap",
                                    None,
                                    format!("snapshot={n}"),
                                );
                                lines.push(format!("took {n}"));
                            }
                        }
                        Err(e) => {
                            events.post(
                                "ereport.fs.tank.autosnap_failed",
                                None,
                                format!("dataset={name} error={e}"),
                            );
                            lines.push(format!("warning: cannot snapshot {name}: {e}"));
                            continue;
                        }
                    }
                }
                for n in destroy {
                    let full = format!("{name}@{n}");
                    match o.dsl.run(Op::Destroy {
                        name: full.clone(),
                        recursive: schedule.recursive,
                        dependents: false,
                    }) {
                        Ok(_) => {
                            events.post(
                                "sysevent.fs.tank.autosnap_pruned",
                                None,
                                format!("snapshot={full}"),
                            );
                            lines.push(format!("pruned {full}"));
                        }
                        Err(e) => {
                            events.post(
                                "ereport.fs.tank.autosnap_failed",
                                None,
                                format!("dataset={name} snapshot={full} error={e}"),
                            );
                            lines.push(format!("warning: cannot prune {full}: {e}"));
                        }
                    }
                }
            }
        }
        lines
    }
}
