//! Replication tasks (`tank replicate`): a dataset's snapshots kept on another tank host,
//! over SSH, as syncoid and zrepl do for zfs.
//!
//! # Theory of operation
//! A task (its [`ReplicationSpec`] and [`ReplicationState`]) is a record of the daemon's
//! settings store (`accounts.rs`), so it outlives restarts. A run:
//! 1. asks the target, through `ssh HOST tank dataset list`, which snapshots (by guid) and
//!    which unfinished receive (its `receive_resume_token`) it has;
//! 2. resumes an unfinished receive first (`send -t TOKEN`);
//! 3. finds the newest snapshot of the source whose guid the target has; failing that, the
//!    task's cursor bookmark (`SOURCE#tank_repl_NAME`, moved to the newest snapshot sent
//!    after every success, as zrepl's replication cursor), so the source's own schedule may
//!    prune the snapshot the two had in common without breaking the chain;
//! 4. sends a full stream of the oldest snapshot when the target does not exist yet, then
//!    `send -I BASE NEWEST` into `ssh HOST tank receive -s -F TARGET`: incremental,
//!    resumable (`-s`: a cut leaves a token for the next run), the target rolled back to the
//!    base if it changed. A target that exists with nothing in common is refused, never
//!    overwritten;
//! 5. with `--prune`, destroys the target's schedule snapshots (sanoid-style names) that the
//!    source no longer has, never the newest one the two have in common.
//!
//! The stream goes through the service's own send ([`Service::send_stream`]) into the
//! standard input of the system `ssh` (key authentication, `BatchMode=yes`), paced to the
//! task's bandwidth limit, and counted in a job (`replicate`, with rate and time left; a
//! job cancel stops it, and the receive's token lets the next run go on). Each run ends with
//! an event on the source's pool: `sysevent.fs.tank.replication` on success, and on failure
//! `ereport.fs.tank.replication_failed` (the alert). The daemon runs a task when its source
//! has a snapshot the target lacks; a failed task is tried again after a wait that doubles
//! with each failure (one schedule minute up to one schedule hour). A task made `--manual`
//! runs only on request; a request to run a task that is running waits for that run first.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tank_dataset::autosnap;
use tank_dataset::send::{self, SendOptions};
use tank_dataset::{DatasetKind, Op};

use crate::accounts::{validate_name, REPLICATIONS};
use crate::api::{ReplicationInfo, ReplicationSpec, ReplicationState, Request, Response};
use crate::caller::Caller;
use crate::error::ServiceError;
use crate::jobs::Progress;
use crate::mounts::pool_of;
use crate::service::{Ctx, Res, Service};

/// A task as it is stored: what it does and what it did.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Task {
    spec: ReplicationSpec,
    #[serde(default)]
    state: ReplicationState,
}

/// Where a task sends: `ssh://[USER@]HOST[:PORT]/POOL/DS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshTarget {
    pub user: Option<String>,
    pub host: String,
    pub port: Option<u16>,
    pub dataset: String,
}

impl SshTarget {
    pub fn parse(url: &str) -> Res<SshTarget> {
        let bad = |why: &str| ServiceError::Invalid(format!("bad target '{url}': {why}"));
        let rest = url
            .strip_prefix("ssh://")
            .ok_or_else(|| bad("it must read ssh://[USER@]HOST[:PORT]/POOL/DS"))?;
        let (authority, dataset) = rest
            .split_once('/')
            .ok_or_else(|| bad("no dataset after the host"))?;
        let (user, hostport) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u.to_string()), h),
            None => (None, authority),
        };
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (h, tail) = v6.split_once(']').ok_or_else(|| bad("unclosed '['"))?;
            (h.to_string(), tail.strip_prefix(':'))
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (hostport.to_string(), None),
            }
        };
        let port = port
            .map(|p| {
                p.parse::<u16>()
                    .map_err(|_| bad("the port is not a number"))
            })
            .transpose()?;
        let plain = |s: &str| {
            !s.is_empty()
                && !s.starts_with('-')
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-:".contains(c))
        };
        if !plain(&host) {
            return Err(bad("the host may hold letters, digits, '.', '-', ':' only"));
        }
        if user.as_deref().is_some_and(|u| !plain(u)) {
            return Err(bad("the user may hold letters, digits, '.', '-', '_' only"));
        }
        if dataset.is_empty()
            || dataset.contains(['@', '#'])
            || !dataset
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "/._-:".contains(c))
        {
            return Err(bad("the target must be a dataset name (POOL/DS)"));
        }
        Ok(SshTarget {
            user,
            host,
            port,
            dataset: dataset.to_string(),
        })
    }
}

/// A word for the remote shell, in single quotes.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// The `ssh` command line that runs `tank ARGS` on the target.
fn ssh_command(spec: &ReplicationSpec, t: &SshTarget, args: &[&str]) -> Command {
    let mut c = Command::new("ssh");
    for o in [
        "BatchMode=yes",
        "ConnectTimeout=15",
        "ServerAliveInterval=15",
        "ServerAliveCountMax=4",
        "LogLevel=ERROR",
    ] {
        c.args(["-o", o]);
    }
    for o in &spec.ssh_options {
        c.args(["-o", o]);
    }
    if let Some(p) = t.port {
        c.args(["-p", &p.to_string()]);
    }
    if let Some(i) = &spec.identity {
        c.arg("-i").arg(i);
    }
    if let Some(u) = &t.user {
        c.args(["-l", u]);
    }
    let remote: Vec<String> = args.iter().map(|a| shell_quote(a)).collect();
    c.arg(&t.host)
        .arg(format!("{} {}", spec.remote_tank, remote.join(" ")));
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// The last lines of a command's error output, for a message.
fn tail(stderr: &str) -> String {
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(3)..].join("; ")
}

/// Runs `tank ARGS` on the target; its standard output, or why it failed.
fn remote(spec: &ReplicationSpec, t: &SshTarget, args: &[&str]) -> Result<String, String> {
    let out = ssh_command(spec, t, args)
        .output()
        .map_err(|e| format!("cannot run ssh: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(tail(&String::from_utf8_lossy(&out.stderr)))
    }
}

/// What the target has.
struct TargetState {
    exists: bool,
    token: Option<String>,
    /// Its snapshots, oldest first: (short name, guid).
    snapshots: Vec<(String, u64)>,
}

fn target_state(spec: &ReplicationSpec, t: &SshTarget) -> Res<TargetState> {
    let out = remote(
        spec,
        t,
        &[
            "dataset",
            "list",
            "-H",
            "-p",
            "-r",
            "-t",
            "all",
            "-o",
            "name,guid,receive_resume_token",
            &t.dataset,
        ],
    );
    let out = match out {
        Ok(o) => o,
        Err(e) if e.contains("does not exist") => {
            return Ok(TargetState {
                exists: false,
                token: None,
                snapshots: Vec::new(),
            })
        }
        Err(e) => {
            return Err(ServiceError::Failed(format!(
                "cannot list the target {}: {e}",
                t.dataset
            )))
        }
    };
    let mut st = TargetState {
        exists: false,
        token: None,
        snapshots: Vec::new(),
    };
    let prefix = format!("{}@", t.dataset);
    for line in out.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() < 3 {
            continue;
        }
        if f[0] == t.dataset {
            st.exists = true;
            st.token = (f[2] != "-" && !f[2].is_empty()).then(|| f[2].to_string());
        } else if let Some(short) = f[0].strip_prefix(&prefix) {
            if let Ok(g) = f[1].parse() {
                st.snapshots.push((short.to_string(), g));
            }
        }
    }
    Ok(st)
}

/// The stream's way to the target: paced to the task's limit, counted in its job, stopped
/// by a cancel.
struct Paced<W: Write> {
    inner: crate::backup::Throttle<W>,
    start: Instant,
    /// Bytes of the run before this stream (for the job's count).
    before: u64,
    job: Arc<Progress>,
    last: Instant,
}

impl<W: Write> Write for Paced<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.job.canceled() {
            return Err(std::io::Error::other("the replication was canceled"));
        }
        let n = self.inner.write(buf)?;
        if self.last.elapsed() >= Duration::from_millis(500) {
            self.last = Instant::now();
            let done = self.before + self.inner.bytes;
            self.job
                .advance(done, self.start.elapsed(), format!("{done} bytes sent"));
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A compressed stream of `snapshot` (since `from`), or the rest of a cut one (`token`).
fn send_request(
    snapshot: Option<String>,
    from: Option<String>,
    intermediates: bool,
    token: Option<String>,
) -> Request {
    Request::Send {
        snapshot,
        from,
        intermediates,
        compressed: true,
        replicate: false,
        token,
        dry_run: false,
    }
}

/// A snapshot of the source: (short name, guid, creation).
pub(crate) type Snap = (String, u64, u64);

/// The incremental base of a run: the newest snapshot of the source the target has, else
/// the task's cursor bookmark if the target has its snapshot; with whether it is a snapshot
/// (which `-I` may start from). `None`: nothing in common.
pub(crate) fn base_of(
    spec: &ReplicationSpec,
    snaps: &[Snap],
    cursor: Option<(&str, u64)>,
    on_target: &HashSet<u64>,
) -> Option<(String, bool)> {
    match snaps.iter().rev().find(|s| on_target.contains(&s.1)) {
        Some(c) => Some((format!("{}@{}", spec.source, c.0), true)),
        None => match cursor {
            Some((name, g)) if on_target.contains(&g) => Some((name.to_string(), false)),
            _ => None,
        },
    }
}

/// What one run did.
pub(crate) struct RunOutcome {
    pub sent: Vec<String>,
    pub bytes: u64,
    pub pruned: Vec<String>,
    pub newest: Option<Snap>,
    pub resumed: bool,
}

impl Service {
    pub(crate) fn replication_request(&self, ctx: &mut Ctx, req: Request) -> Res<Response> {
        let accounts = self.accounts()?;
        match req {
            Request::ReplicationAdd { task } => {
                validate_name("replication task", &task.name)?;
                if task.target.starts_with("s3://") {
                    let remote = task.remote.as_deref().ok_or_else(|| {
                        ServiceError::Invalid("an s3:// target needs --remote NAME".into())
                    })?;
                    // The remote and the address must be usable now.
                    self.remote_bucket(remote, &task.target)?;
                } else {
                    SshTarget::parse(&task.target)?;
                }
                if task.remote_tank.trim().is_empty() {
                    return Err(ServiceError::Invalid("--remote-tank is empty".into()));
                }
                if task.bwlimit == Some(0) {
                    return Err(ServiceError::Invalid(
                        "a bandwidth limit must be above 0".into(),
                    ));
                }
                if task.ssh_options.iter().any(|o| !o.contains('=')) {
                    return Err(ServiceError::Invalid(
                        "ssh options read KEY=VALUE (as ssh -o takes them)".into(),
                    ));
                }
                let o = self.open_pool(pool_of(&task.source), ctx)?;
                let id = o
                    .dsl
                    .resolve(&task.source)
                    .map_err(|e| ServiceError::from_anyhow(&anyhow::Error::from(e)))?;
                if o.dsl
                    .record(id)
                    .is_ok_and(|r| r.kind == DatasetKind::Snapshot)
                {
                    return Err(ServiceError::Invalid(
                        "the source is a dataset (POOL/DS), not a snapshot".into(),
                    ));
                }
                // Replacing a task keeps what it did, when it still goes to the same place.
                let old: Option<Task> = accounts.setting(REPLICATIONS, &task.name)?;
                let state = old
                    .filter(|t| t.spec.source == task.source && t.spec.target == task.target)
                    .map(|t| t.state)
                    .unwrap_or_default();
                let name = task.name.clone();
                let target = task.target.clone();
                accounts.put_setting(REPLICATIONS, &name, &Task { spec: task, state })?;
                Ok(Response::Done {
                    message: format!("replication task '{name}' sends to {target}"),
                })
            }
            Request::ReplicationList => Ok(Response::Replications(self.replications()?)),
            Request::ReplicationRemove { name } => {
                if !accounts.remove_setting(REPLICATIONS, &name)? {
                    return Err(ServiceError::NotFound(format!(
                        "no replication task '{name}'"
                    )));
                }
                Ok(Response::Done {
                    message: format!("removed replication task '{name}'"),
                })
            }
            Request::ReplicationRun { name } => {
                let line = self.run_replication_when_free(&name)?;
                Ok(Response::Done { message: line })
            }
            _ => Err(ServiceError::BadRequest("not a replication request".into())),
        }
    }

    fn tasks(&self) -> Res<Vec<Task>> {
        self.accounts()?.settings(REPLICATIONS)
    }

    /// The source's snapshots, oldest first; `None` when its pool is not open or it is gone.
    fn source_snapshots(&self, source: &str) -> Option<Vec<Snap>> {
        let o = self
            .open_pools()
            .into_iter()
            .find(|o| o.pool.name() == pool_of(source))?;
        let id = o.dsl.resolve(source).ok()?;
        Some(
            o.dsl
                .snapshots(id)
                .into_iter()
                .filter_map(|s| o.dsl.record(s).ok())
                .map(|r| {
                    let short = r.name.rsplit('@').next().unwrap_or_default().to_string();
                    (short, r.guid, r.creation)
                })
                .collect(),
        )
    }

    /// Every task with its state, lag and what is pending.
    pub fn replications(&self) -> Res<Vec<ReplicationInfo>> {
        let running = self.replicating.lock().clone();
        let now = now_secs();
        Ok(self
            .tasks()?
            .into_iter()
            .map(|t| {
                let snaps = self.source_snapshots(&t.spec.source);
                let pending = snaps.as_ref().map_or(0, |s| {
                    let at = s
                        .iter()
                        .position(|x| Some(x.1) == t.state.last_guid)
                        .map_or(0, |i| i + 1);
                    s.len() - at
                });
                let job = running
                    .get(&t.spec.name)
                    .and_then(|p| p.job.lock().as_ref().map(|j| j.id));
                let status = if job.is_some() {
                    "running"
                } else if snaps.is_none() {
                    "no source"
                } else if t.state.consecutive_failures > 0 {
                    "failing"
                } else if t.state.last_run.is_none() {
                    "never run"
                } else {
                    "ok"
                };
                ReplicationInfo {
                    lag_secs: t.state.last_creation.map(|c| now.saturating_sub(c)),
                    pending,
                    job,
                    status: status.into(),
                    spec: t.spec,
                    state: t.state,
                }
            })
            .collect())
    }

    /// The tasks whose source has a snapshot the target lacks, or whose wait after a
    /// failure is over, each started on a thread of its own. Their names.
    pub fn start_due_replications(self: &Arc<Self>) -> Vec<String> {
        let Ok(tasks) = self.tasks() else {
            return Vec::new();
        };
        let now = now_secs();
        // One schedule minute, doubled per failure, up to one schedule hour.
        let hour = self.schedule_hour();
        let mut started = Vec::new();
        for t in tasks {
            if self.replicating.lock().contains_key(&t.spec.name) {
                continue;
            }
            if !t.spec.auto {
                continue;
            }
            let Some(snaps) = self.source_snapshots(&t.spec.source) else {
                continue;
            };
            let due = match t.state.consecutive_failures {
                0 => snaps.last().is_some_and(|s| Some(s.1) != t.state.last_guid),
                n => {
                    let wait = (hour / 60).max(1) << (n - 1).min(6);
                    now >= t.state.last_run.unwrap_or(0) + wait.min(hour)
                }
            };
            if !due {
                continue;
            }
            let svc = self.clone();
            let name = t.spec.name.clone();
            started.push(name.clone());
            std::thread::Builder::new()
                .name(format!("replicate {name}"))
                .spawn(move || {
                    // The outcome is in the task's state, its job and an event.
                    let _ = svc.run_replication(&name);
                })
                .ok();
        }
        started
    }

    /// Runs task `name` now (after the run under way, if there is one, has ended); a line
    /// saying what it did.
    pub fn run_replication_when_free(&self, name: &str) -> Res<String> {
        loop {
            match self.run_replication(name) {
                Err(ServiceError::Busy(_)) => std::thread::sleep(Duration::from_millis(200)),
                r => return r,
            }
        }
    }

    /// Runs task `name` now; a line saying what it did. Busy if it is running.
    pub fn run_replication(&self, name: &str) -> Res<String> {
        let accounts = self.accounts()?;
        let task: Task = accounts
            .setting(REPLICATIONS, name)?
            .ok_or_else(|| ServiceError::NotFound(format!("no replication task '{name}'")))?;
        let job = {
            let mut running = self.replicating.lock();
            if let Some(p) = running.get(name) {
                let id = p.job.lock().as_ref().map_or(0, |j| j.id);
                return Err(ServiceError::Busy(format!(
                    "replication task '{name}' is running (job {id})"
                )));
            }
            let p = Progress::new("replicate", name, 0);
            running.insert(name.to_string(), p.clone());
            p
        };
        self.jobs.start(job.clone());
        let started = now_secs();
        let result = self.replicate(&task.spec, &job);
        self.replicating.lock().remove(name);
        // Kept unless the task was removed while it ran.
        let mut st = match accounts.setting::<Task>(REPLICATIONS, name) {
            Ok(Some(t)) => t.state,
            _ => task.state.clone(),
        };
        st.last_run = Some(started);
        st.runs += 1;
        let events = self
            .open_pools()
            .into_iter()
            .find(|o| o.pool.name() == pool_of(&task.spec.source))
            .map(|o| o.pool.events.clone());
        // (The pool's event log: the alert of a failed run goes there.)
        let line = match result {
            Ok(out) => {
                st.last_success = Some(now_secs());
                st.consecutive_failures = 0;
                st.last_error = None;
                st.last_bytes = out.bytes;
                st.bytes_total += out.bytes;
                if let Some((short, guid, creation)) = &out.newest {
                    st.last_snapshot = Some(format!("{}@{short}", task.spec.source));
                    st.last_guid = Some(*guid);
                    st.last_creation = Some(*creation);
                }
                let mut line = match out.sent.len() {
                    0 if !out.resumed => "up to date".to_string(),
                    _ => format!(
                        "sent {} ({} bytes){}",
                        if out.sent.is_empty() {
                            "the rest of an interrupted stream".to_string()
                        } else {
                            out.sent.join(", ")
                        },
                        out.bytes,
                        if out.resumed { ", resumed" } else { "" }
                    ),
                };
                if !out.pruned.is_empty() {
                    line.push_str(&format!("; pruned {}", out.pruned.join(", ")));
                }
                if let Some(ev) = &events {
                    ev.post(
                        "sysevent.fs.tank.replication",
                        None,
                        format!(
                            "task={name} target={} snapshot={} bytes={}",
                            task.spec.target,
                            st.last_snapshot.as_deref().unwrap_or("-"),
                            out.bytes
                        ),
                    );
                }
                job.end(Ok(line.clone()));
                Ok(line)
            }
            Err(e) => {
                st.failures += 1;
                st.consecutive_failures += 1;
                st.last_error = Some(e.to_string());
                if let Some(ev) = &events {
                    ev.post(
                        "ereport.fs.tank.replication_failed",
                        None,
                        format!("task={name} target={} error={e}", task.spec.target),
                    );
                }
                job.end(Err(e.to_string()));
                Err(e)
            }
        };
        if accounts.setting::<Task>(REPLICATIONS, name)?.is_some() {
            accounts.put_setting(
                REPLICATIONS,
                name,
                &Task {
                    spec: task.spec,
                    state: st,
                },
            )?;
        }
        line
    }

    /// Sends `req`'s stream into `tank receive ARGS` on the target; the stream's bytes.
    fn pipe(
        &self,
        spec: &ReplicationSpec,
        t: &SshTarget,
        req: Request,
        recv_args: &[&str],
        job: &Arc<Progress>,
        before: u64,
    ) -> Res<u64> {
        let mut cmd = ssh_command(spec, t, recv_args);
        cmd.stdin(Stdio::piped());
        let mut child = cmd
            .spawn()
            .map_err(|e| ServiceError::Failed(format!("cannot run ssh: {e}")))?;
        let drain = |r: Option<Box<dyn Read + Send>>| {
            std::thread::spawn(move || {
                let mut s = String::new();
                if let Some(mut r) = r {
                    // Bounded: a message, not a stream.
                    let _ = r.by_ref().take(1 << 20).read_to_string(&mut s);
                    let _ = std::io::copy(&mut r, &mut std::io::sink());
                }
                s
            })
        };
        let out = drain(
            child
                .stdout
                .take()
                .map(|o| Box::new(o) as Box<dyn Read + Send>),
        );
        let err = drain(
            child
                .stderr
                .take()
                .map(|o| Box::new(o) as Box<dyn Read + Send>),
        );
        let stdin = child.stdin.take().expect("piped");
        let mut w = Paced {
            // Under a limit, small writes: the pace is seen downstream, not in bursts.
            inner: crate::backup::Throttle::new(
                std::io::BufWriter::with_capacity(
                    spec.bwlimit
                        .map_or(1 << 20, |l| (l / 10).clamp(4096, 1 << 20) as usize),
                    stdin,
                ),
                spec.bwlimit,
            ),
            start: Instant::now(),
            before,
            job: job.clone(),
            last: Instant::now(),
        };
        let caller = Caller::Admin {
            name: "replication".into(),
        };
        let (r, _notes) = self.send_stream(
            &caller,
            req,
            &mut w,
            Some(format!("replicate {}", spec.name)),
        );
        let flushed = w.flush();
        let bytes = w.inner.bytes;
        drop(w);
        let status = child.wait();
        let _ = out.join();
        let stderr = err.join().unwrap_or_default();
        let ok = status.as_ref().is_ok_and(|s| s.success());
        match (r, ok) {
            (Ok(_), true) if flushed.is_ok() => Ok(bytes),
            (Err(e), _) if job.canceled() => Err(e),
            (_, false) => Err(ServiceError::Failed(format!(
                "receive on {} failed: {}",
                t.host,
                match tail(&stderr) {
                    s if s.is_empty() => "ssh ended without a word".to_string(),
                    s => s,
                }
            ))),
            (Err(e), true) => Err(e),
            (Ok(_), true) => Err(ServiceError::Failed(format!(
                "cannot write the stream to ssh: {}",
                flushed.err().map(|e| e.to_string()).unwrap_or_default()
            ))),
        }
    }

    fn replicate(&self, spec: &ReplicationSpec, job: &Arc<Progress>) -> Res<RunOutcome> {
        let snaps = self.source_snapshots(&spec.source).ok_or_else(|| {
            ServiceError::NotFound(format!(
                "the source '{}' is not there (its pool is not imported, or it was destroyed)",
                spec.source
            ))
        })?;
        let Some(newest) = snaps.last().cloned() else {
            return Err(ServiceError::Invalid(format!(
                "'{}' has no snapshot to send (give it a schedule, or take one)",
                spec.source
            )));
        };
        let o = self
            .open_pools()
            .into_iter()
            .find(|o| o.pool.name() == pool_of(&spec.source))
            .ok_or_else(|| ServiceError::NotFound(spec.source.clone()))?;
        let cursor = format!("{}#tank_repl_{}", spec.source, spec.name);
        let cursor_guid = o
            .dsl
            .resolve(&spec.source)
            .and_then(|id| o.dsl.record(id))
            .ok()
            .and_then(|r| {
                r.bookmarks
                    .iter()
                    .find(|b| format!("{}#{}", spec.source, b.name) == cursor || b.name == cursor)
                    .map(|b| b.guid)
            });
        let out = if spec.target.starts_with("s3://") {
            self.replicate_s3(spec, job, &snaps, cursor_guid.map(|g| (cursor.as_str(), g)))?
        } else {
            self.replicate_ssh(
                spec,
                job,
                &o,
                &snaps,
                cursor_guid.map(|g| (cursor.as_str(), g)),
            )?
        };
        // The cursor moves to what the target now has.
        if cursor_guid != Some(newest.1) {
            if cursor_guid.is_some() {
                let _ = o.dsl.run(Op::DestroyBookmark {
                    bookmark: cursor.clone(),
                });
            }
            o.dsl
                .run(Op::Bookmark {
                    snapshot: format!("{}@{}", spec.source, newest.0),
                    bookmark: cursor.clone(),
                })
                .map_err(|e| ServiceError::from_anyhow(&anyhow::Error::from(e)))?;
        }
        Ok(out)
    }

    /// A run to another tank host over SSH; `cursor` is the task's bookmark and its guid.
    fn replicate_ssh(
        &self,
        spec: &ReplicationSpec,
        job: &Arc<Progress>,
        o: &crate::pools::Opened,
        snaps: &[Snap],
        cursor: Option<(&str, u64)>,
    ) -> Res<RunOutcome> {
        let t = SshTarget::parse(&spec.target)?;
        let newest = snaps.last().cloned().expect("checked by the caller");
        let mut out = RunOutcome {
            sent: Vec::new(),
            bytes: 0,
            pruned: Vec::new(),
            newest: None,
            resumed: false,
        };
        let target = t.dataset.as_str();
        let mut ts = target_state(spec, &t)?;
        if let Some(token) = ts.token.take() {
            // An interrupted receive goes on first.
            let req = send_request(None, None, false, Some(token));
            out.bytes += self.pipe(spec, &t, req, &["receive", "-s", target], job, 0)?;
            out.resumed = true;
            ts = target_state(spec, &t)?;
        }
        let on_target: HashSet<u64> = ts.snapshots.iter().map(|s| s.1).collect();
        let base = base_of(spec, snaps, cursor, &on_target);
        let full_name = |s: &Snap| format!("{}@{}", spec.source, s.0);
        let estimate = |snap: &str, from: Option<String>, inter: bool| {
            send::estimate(
                &o.dsl,
                snap,
                &SendOptions {
                    from,
                    intermediates: inter,
                    compressed: true,
                    replicate: false,
                },
            )
            .map(|e| e.bytes)
            .unwrap_or(0)
        };
        let base = match base {
            Some(b) => b,
            None if ts.exists => {
                return Err(ServiceError::Invalid(format!(
                    "the target {target} exists and has no snapshot in common with '{}': \
                     refusing to overwrite it (destroy it on {}, or replicate into a new dataset)",
                    spec.source, t.host
                )))
            }
            None => {
                // The first run: the oldest snapshot in full.
                let first = &snaps[0];
                let total = estimate(&full_name(first), None, false)
                    + estimate(&full_name(&newest), Some(full_name(first)), true);
                job.set_total(total);
                let req = send_request(Some(full_name(first)), None, false, None);
                out.bytes += self.pipe(
                    spec,
                    &t,
                    req,
                    &["receive", "-s", "-u", target],
                    job,
                    out.bytes,
                )?;
                out.sent.push(full_name(first));
                (full_name(first), true)
            }
        };
        let (base_name, base_is_snapshot) = base;
        if base_name != full_name(&newest) {
            if out.sent.is_empty() {
                job.set_total(estimate(
                    &full_name(&newest),
                    Some(base_name.clone()),
                    base_is_snapshot,
                ));
            }
            let req = send_request(
                Some(full_name(&newest)),
                Some(base_name.clone()),
                base_is_snapshot,
                None,
            );
            out.bytes += self.pipe(
                spec,
                &t,
                req,
                &["receive", "-s", "-F", target],
                job,
                out.bytes,
            )?;
            let from = snaps
                .iter()
                .position(|s| full_name(s) == base_name)
                .map_or(snaps.len() - 1, |i| i + 1);
            let sent: Vec<String> = if base_is_snapshot {
                snaps[from..].iter().map(full_name).collect()
            } else {
                vec![full_name(&newest)]
            };
            out.sent.extend(sent);
        }
        out.newest = Some(newest.clone());
        if spec.prune {
            let ts = target_state(spec, &t)?;
            let on_source: HashSet<u64> = snaps.iter().map(|s| s.1).collect();
            for (short, guid) in &ts.snapshots {
                // Only the schedule's snapshots, only those the source pruned, and never
                // the newest the two have in common (it was just sent: it is on both).
                if *guid == newest.1
                    || on_source.contains(guid)
                    || autosnap::parse_name(short).is_none()
                {
                    continue;
                }
                let name = format!("{target}@{short}");
                remote(spec, &t, &["dataset", "destroy", &name]).map_err(|e| {
                    ServiceError::Failed(format!("cannot prune {name} on {}: {e}", t.host))
                })?;
                out.pruned.push(name);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_as_ssh_urls() {
        let t = SshTarget::parse("ssh://backup@nas2.lan:2222/tank/home").unwrap();
        assert_eq!(t.user.as_deref(), Some("backup"));
        assert_eq!(t.host, "nas2.lan");
        assert_eq!(t.port, Some(2222));
        assert_eq!(t.dataset, "tank/home");
        let t = SshTarget::parse("ssh://[::1]:22/p/d").unwrap();
        assert_eq!((t.host.as_str(), t.port, t.user), ("::1", Some(22), None));
        let t = SshTarget::parse("ssh://host/p").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("host", None));
        for bad in [
            "host/p/d",
            "ssh://host",
            "ssh://-oProxyCommand=x/p/d",
            "ssh://h;rm/p",
            "ssh://h:99999/p",
            "ssh://h/p/d@snap",
            "ssh://h/p/$(x)",
            "ssh://u'x@h/p",
        ] {
            assert!(SshTarget::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn remote_words_are_quoted_for_the_shell() {
        assert_eq!(shell_quote("p/d"), "'p/d'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
    }
}
