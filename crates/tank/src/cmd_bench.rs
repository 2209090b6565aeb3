//! `tank bench --dataset NAME` and `tank bench --emulate BUILD --daemon`: the bonnie++-style
//! benchmark of a mounted filesystem or of an emulated build, run by the service as a job.
//!
//! # Theory of operation
//! The command sends `dataset_bench` (or `emulated_bench`) to the daemon, which runs the
//! benchmark on the dataset's mount (or on a pool of the emulated build that it makes and
//! removes) in the background and answers at once with a job. The command then
//! follows the job (`job_get`), printing its phase, bytes moved, rate and time left every
//! few seconds; Ctrl-C asks the service to cancel it (`job_cancel`) and waits for it to stop
//! and clean up. When the job finishes, the daemon has added its figures to the benchmark
//! history (`DATA_DIR/bench-history.jsonl`, named by `--label` or the dataset), and they are
//! printed as `tank bench PATH` prints them. A command that ends otherwise (killed, its
//! connection lost) leaves the job running: `job_get` and `job_cancel` still reach it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tank_bench::run::fs::{print_record, FsBenchArgs, HistoryEntry};
use tank_service::api::{Job, Request, Response};

use crate::client::{unexpected, Client};
use crate::cmd_pool::hms;
use crate::datadir::human;

pub fn job(a: FsBenchArgs) -> Result<()> {
    let params = a.service_params()?;
    let (name, request) = match (&a.dataset, &a.emulate) {
        (Some(d), _) => (
            format!("'{d}'"),
            Request::DatasetBench {
                dataset: d.clone(),
                params,
            },
        ),
        (None, Some(build)) => (
            format!("the emulated {build}"),
            Request::EmulatedBench {
                build: build.clone(),
                params,
            },
        ),
        (None, None) => bail!("give --dataset NAME or --emulate BUILD --daemon"),
    };
    let c = Client::connect()?;
    if !c.is_daemon() {
        bail!(
            "benchmarking {name} is a job of the daemon: start it (tank serve){}",
            if a.dataset.is_some() {
                " with the dataset mounted, or give a directory to measure here"
            } else {
                ", or leave out --daemon to measure the build in this command"
            }
        );
    }
    let id = match c.call(request)? {
        Response::JobStarted { job, message } => {
            errln!("{message}");
            job
        }
        r => return Err(unexpected(r)),
    };
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("cannot catch signals")?;
    }
    let job = follow(&c, id, &stop)?;
    match job.state.as_str() {
        "finished" => {
            // The daemon has added the run to its history (with the label given).
            let entry: HistoryEntry = serde_json::from_value(
                job.result
                    .context("the finished benchmark job has no figures")?,
            )
            .context("the benchmark job's figures are not in a known form")?;
            print_record(&entry, a.json)
        }
        "canceled" => bail!("benchmark of {name} (job {id}) {}", job.detail),
        _ => bail!("benchmark of {name} (job {id}) failed: {}", job.detail),
    }
}

/// Follows job `id` until it ends, with a progress line every few seconds; a signal in
/// `stop` cancels it (once) and the following goes on until it has stopped.
fn follow(c: &Client, id: u64, stop: &AtomicBool) -> Result<Job> {
    let mut last = Instant::now();
    let mut canceled = false;
    loop {
        if stop.load(Ordering::SeqCst) && !canceled {
            canceled = true;
            errln!("canceling job {id} (its files are removed before it ends)");
            match c.call(Request::JobCancel { id }) {
                Ok(_) => {}
                // It ended between the last look and the cancel.
                Err(e) => errln!("{e:#}"),
            }
        }
        let j = match c.call(Request::JobGet { id })? {
            Response::Job(j) => j,
            r => return Err(unexpected(r)),
        };
        if j.state != "running" && j.state != "canceling" {
            return Ok(j);
        }
        if last.elapsed() >= Duration::from_secs(3) {
            last = Instant::now();
            let total = j.total_bytes.max(1);
            errln!(
                "{}: {} / {} moved at {}/s, {:.0}% done{}",
                j.detail,
                human(j.done_bytes),
                human(total),
                human(j.rate as u64),
                100.0 * j.done_bytes as f64 / total as f64,
                j.eta_secs
                    .map(|e| format!(", about {} to go", hms(e)))
                    .unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
