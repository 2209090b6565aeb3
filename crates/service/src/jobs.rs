//! Long-running work as jobs: what runs, how far it got, its rate and the time left.
//!
//! # Theory of operation
//! A scrub or resilver is the pool's own background work, kept on the pool (its cursor and
//! counters in the scan state), so its job is a view: each scan a pool has run while this
//! service held it gets a job id the first time it is seen (keyed by pool, kind and start
//! time), and its progress is read from the pool's scan status whenever it is asked for.
//! Other long work registers a [`Progress`] that its worker updates:
//! - the destroy of a dataset tree in the background (`dataset_destroy` with `background`),
//!   in bytes of the datasets destroyed so far;
//! - a benchmark of a mounted filesystem (`dataset_bench`) or of an emulated build
//!   (`emulated_bench`), in bytes moved to and from it, its figures kept with the job when
//!   it ends.
//!
//! The rate and time left follow from the bytes done. `job_cancel` sets a worker's cancel
//! flag, which it reads between steps (the job shows `canceling` until it has stopped and
//! cleaned up, then `canceled`); a scrub is canceled on its pool. Ids are unique for the
//! life of the service.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tank_object::ScanPhase;

use crate::api::{BenchParams, Job};
use crate::error::ServiceError;
use crate::service::{Res, Service};

/// Progress a worker reports for a job that is not a scan.
#[derive(Debug, Default)]
pub struct Progress {
    pub job: Mutex<Option<Job>>,
    /// Set by `job_cancel` (or the service's shutdown); the worker stops at its next step.
    cancel: AtomicBool,
}

/// The benchmark a service runs as a job (`dataset_bench`). Its runner lives above this
/// crate (with the other benchmarks), so the program that makes the service installs it.
pub trait Benchmark: Send + Sync {
    /// Runs in the directory `dir` (a work directory of its own is made in it and removed
    /// after), reporting into `progress` and stopping soon after `progress.canceled()`.
    /// Returns a one-line summary and the figures.
    fn run(
        &self,
        dir: &Path,
        params: &BenchParams,
        progress: &Progress,
    ) -> Result<(String, serde_json::Value), String>;

    /// Whether `build` is an emulated build this runner can measure now (its grammar, and
    /// no other emulated build being measured): the reason if not.
    fn check_build(&self, build: &str) -> Result<(), String>;

    /// Builds the emulated pool of `build` under `data_dir`, measures it as `run` measures
    /// a filesystem, and removes it, whatever happens.
    fn run_emulated(
        &self,
        data_dir: &Path,
        build: &str,
        params: &BenchParams,
        progress: &Progress,
    ) -> Result<(String, serde_json::Value), String>;
}

enum Source {
    /// A scan of a pool: (pool, func, start time).
    Scan(String, String, u64),
    Worker(Arc<Progress>),
}

#[derive(Default)]
pub struct Jobs {
    next: AtomicU64,
    entries: Mutex<Vec<(u64, Source)>>,
    scans: Mutex<HashMap<(String, String, u64), u64>>,
}

fn scan_job(id: u64, pool: &str, st: &tank_object::ScanStatus) -> Job {
    let s = &st.state;
    let total = s.to_examine.max(s.issued);
    let state = match s.phase {
        ScanPhase::Scanning if s.paused => "paused",
        ScanPhase::Scanning if st.running => "running",
        ScanPhase::Scanning => "waiting",
        ScanPhase::Finished if s.errors > 0 => "failed",
        ScanPhase::Finished => "finished",
        ScanPhase::Canceled => "canceled",
        ScanPhase::None => "none",
    };
    let detail = match s.phase {
        ScanPhase::Finished if s.func == "resilver" => format!(
            "resilvered {} bytes with {} errors; verified {} bytes",
            s.rebuilt_repaired, s.errors, s.verified
        ),
        ScanPhase::Finished => format!("repaired {} bytes with {} errors", s.repaired, s.errors),
        ScanPhase::Scanning if s.verifying => format!("verifying pass {}", s.verify_passes),
        ScanPhase::Scanning => format!("{} bytes repaired so far", s.repaired),
        _ => String::new(),
    };
    Job {
        id,
        kind: s.func.clone(),
        target: pool.to_string(),
        state: state.into(),
        started: s.start_time,
        done_bytes: s.issued,
        total_bytes: total,
        rate: if st.running { st.rate } else { 0.0 },
        eta_secs: if st.running { st.eta_secs } else { None },
        detail,
        result: None,
    }
}

impl Progress {
    /// A job of `kind` on `target`, started now, of `total_bytes`.
    pub fn new(kind: &str, target: &str, total_bytes: u64) -> Arc<Progress> {
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Arc::new(Progress {
            job: Mutex::new(Some(Job {
                id: 0,
                kind: kind.into(),
                target: target.into(),
                state: "running".into(),
                started,
                done_bytes: 0,
                total_bytes,
                rate: 0.0,
                eta_secs: None,
                detail: String::new(),
                result: None,
            })),
            cancel: AtomicBool::new(false),
        })
    }

    /// Sets the total after the job started (once the worker knows it).
    pub fn set_total(&self, total_bytes: u64) {
        if let Some(j) = self.job.lock().as_mut() {
            j.total_bytes = total_bytes;
        }
    }

    /// Whether the job was asked to stop.
    pub fn canceled(&self) -> bool {
        self.cancel.load(Ordering::SeqCst)
    }

    pub(crate) fn request_cancel(&self) {
        self.cancel.store(true, Ordering::SeqCst);
        if let Some(j) = self.job.lock().as_mut() {
            if j.state == "running" {
                j.state = "canceling".into();
            }
        }
    }

    fn is_running(&self) -> bool {
        self.job
            .lock()
            .as_ref()
            .is_some_and(|j| j.state == "running" || j.state == "canceling")
    }

    /// Ends the job with a result kept beside it.
    pub fn finish(&self, detail: String, result: serde_json::Value) {
        self.end(Ok(detail));
        if let Some(j) = self.job.lock().as_mut() {
            j.result = Some(result);
        }
    }

    /// Records `done` bytes of the total after `elapsed`, with the rate and time left
    /// that follow from them.
    pub fn advance(&self, done: u64, elapsed: std::time::Duration, detail: String) {
        if let Some(j) = self.job.lock().as_mut() {
            j.done_bytes = done;
            let secs = elapsed.as_secs_f64().max(1e-3);
            j.rate = done as f64 / secs;
            j.eta_secs = (j.rate > 0.0).then(|| j.total_bytes.saturating_sub(done) as f64 / j.rate);
            j.detail = detail;
        }
    }

    /// Ends the job: `finished`, or `failed` with why (`canceled` if it was asked to stop
    /// and did not finish).
    pub fn end(&self, result: Result<String, String>) {
        let canceled = self.canceled();
        if let Some(j) = self.job.lock().as_mut() {
            j.rate = 0.0;
            j.eta_secs = None;
            match result {
                Ok(detail) => {
                    j.state = "finished".into();
                    j.detail = detail;
                }
                Err(why) if canceled => {
                    j.state = "canceled".into();
                    j.detail = format!("canceled: {why}");
                }
                Err(why) => {
                    j.state = "failed".into();
                    j.detail = why;
                }
            }
        }
    }
}

impl Jobs {
    fn next_id(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Registers work that reports its own progress; returns its id.
    pub fn start(&self, progress: Arc<Progress>) -> u64 {
        let id = self.next_id();
        if let Some(j) = progress.job.lock().as_mut() {
            j.id = id;
        }
        self.entries.lock().push((id, Source::Worker(progress)));
        id
    }

    /// The job of the scan a pool runs or ran last (registered at first sight).
    pub fn scan_of(&self, svc: &Service, pool: &str) -> Option<u64> {
        let opened = svc.pools.get(pool)?;
        let st = opened.store.scan_status();
        if st.state.phase == ScanPhase::None {
            return None;
        }
        let key = (pool.to_string(), st.state.func.clone(), st.state.start_time);
        let mut scans = self.scans.lock();
        if let Some(id) = scans.get(&key) {
            return Some(*id);
        }
        let id = self.next_id();
        scans.insert(key.clone(), id);
        self.entries
            .lock()
            .push((id, Source::Scan(key.0, key.1, key.2)));
        Some(id)
    }

    fn view(&self, svc: &Service, id: u64, src: &Source) -> Option<Job> {
        match src {
            Source::Worker(p) => p.job.lock().clone(),
            Source::Scan(pool, func, start) => {
                let opened = svc.pools.get(pool)?;
                let st = opened.store.scan_status();
                if &st.state.func == func && st.state.start_time == *start {
                    Some(scan_job(id, pool, &st))
                } else {
                    // A later scan replaced it: what is known is that it ended.
                    Some(Job {
                        id,
                        kind: func.clone(),
                        target: pool.clone(),
                        state: "replaced".into(),
                        started: *start,
                        done_bytes: 0,
                        total_bytes: 0,
                        rate: 0.0,
                        eta_secs: None,
                        detail: "a later scan of the pool replaced its record".into(),
                        result: None,
                    })
                }
            }
        }
    }

    /// Every job: the scans of the open pools (registered now if new) and the others.
    pub fn list(&self, svc: &Service) -> Vec<Job> {
        for o in svc.pools.all() {
            self.scan_of(svc, &o.pool.name());
        }
        let entries = self.entries.lock();
        entries
            .iter()
            .filter_map(|(id, src)| self.view(svc, *id, src))
            .collect()
    }

    pub fn get(&self, svc: &Service, id: u64) -> Option<Job> {
        for o in svc.pools.all() {
            self.scan_of(svc, &o.pool.name());
        }
        let entries = self.entries.lock();
        let (_, src) = entries.iter().find(|(i, _)| *i == id)?;
        self.view(svc, id, src)
    }

    /// Stops job `id`: a worker's at its next step, a scrub at once. Returns the job as it
    /// is after the request.
    pub fn cancel(&self, svc: &Service, id: u64) -> Res<Job> {
        let job = self
            .get(svc, id)
            .ok_or_else(|| ServiceError::NotFound(format!("no such job {id}")))?;
        if job.state != "running" && job.state != "paused" && job.state != "canceling" {
            return Err(ServiceError::Invalid(format!(
                "job {id} ({} of {}) is not running: {}",
                job.kind, job.target, job.state
            )));
        }
        let worker = {
            let entries = self.entries.lock();
            entries
                .iter()
                .find(|(i, _)| *i == id)
                .and_then(|(_, s)| match s {
                    Source::Worker(p) => Some(p.clone()),
                    Source::Scan(..) => None,
                })
        };
        match worker {
            Some(p) => p.request_cancel(),
            None if job.kind == "scrub" => {
                let opened = svc.pools.get(&job.target).ok_or_else(|| {
                    ServiceError::NotFound(format!("pool '{}' is not open", job.target))
                })?;
                opened.store.scrub_cancel().map_err(|e| {
                    ServiceError::Failed(format!("cannot cancel scrubbing {}: {e}", job.target))
                })?;
            }
            None => {
                return Err(ServiceError::Invalid(format!(
                    "job {id} is a {} of pool '{}': it cannot be canceled (it runs until the pool is whole again)",
                    job.kind, job.target
                )))
            }
        }
        self.get(svc, id)
            .ok_or_else(|| ServiceError::NotFound(format!("no such job {id}")))
    }

    /// Asks every worker to stop and waits up to `limit` for them to end (the service's
    /// shutdown, before it unmounts and closes the pools under them). Returns the ids of
    /// those still running.
    pub fn stop_workers(&self, limit: Duration) -> Vec<u64> {
        let workers: Vec<(u64, Arc<Progress>)> = self
            .entries
            .lock()
            .iter()
            .filter_map(|(id, s)| match s {
                Source::Worker(p) if p.is_running() => Some((*id, p.clone())),
                _ => None,
            })
            .collect();
        for (_, p) in &workers {
            p.request_cancel();
        }
        let deadline = Instant::now() + limit;
        while workers.iter().any(|(_, p)| p.is_running()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        workers
            .iter()
            .filter(|(_, p)| p.is_running())
            .map(|(id, _)| *id)
            .collect()
    }
}
