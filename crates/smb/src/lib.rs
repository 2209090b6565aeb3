//! tank's SMB front end: Samba's smbd, run and kept in step by the daemon.
//!
//! # Theory of operation
//! No SMB server library exists in Rust, and Samba is what every NAS ships, so tank runs
//! Debian's `smbd` and makes it feel built in: the user never edits smb.conf.
//! - **Its own directory.** Everything Samba reads or keeps is under `DATA_DIR/smb/`: the
//!   generated `smb.conf` (`conf.rs`), the user and group files and the password file
//!   (`users.rs`), and the private, lock, state, cache, pid and log directories. smbd is
//!   started with `--configfile` naming that file; /etc/samba is never read or written.
//! - **The data path.** A share's path is the directory its dataset is mounted at by the
//!   daemon (the FUSE mount), so SMB sees the same files, owners and extended attributes
//!   as the local mount, NFS and S3. A share whose dataset is not mounted is left out of
//!   smb.conf, and [`SmbServer::problems`] says why.
//! - **Users.** smbd runs as root (it becomes each user's uid for that user's files) with
//!   `nss_wrapper`, so its user lookups are answered from tank's accounts, not the host's.
//! - **Supervision.** One thread keeps smbd running: it restarts it when it dies (its
//!   output is tank's log, each line prefixed `smbd:`), rewrites the configuration when a
//!   share or a mount changed and the user files when the account store did, and tells
//!   smbd to reload (SIGHUP). smbd runs in a process group of its own, so that a stop ends
//!   the processes serving connections too.
//! - **mDNS/DNS-SD.** Where smbd listens beyond loopback (and `--no-mdns` is not given),
//!   smb.conf has `multicast dns register = yes`: Debian's smbd, built with avahi, then
//!   registers `_smb._tcp`, `_device-info._tcp` and, for the Time Machine shares,
//!   `_adisk._tcp` with avahi-daemon (now or when it starts), so Finder's sidebar shows the
//!   NAS. A server on loopback is never advertised (no other machine could reach it).
//! - **Previous Versions on a schedule** (`snapshots.rs`): every 10 seconds the supervisor
//!   takes the snapshots the shares' `snapshot_schedule` asks for and destroys the oldest
//!   beyond what they keep.

pub mod conf;
pub mod snapshots;
pub mod users;

use std::collections::BTreeMap;
use std::io::BufRead;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use parking_lot::Mutex;
use tank_service::api::{Request, Response};
use tank_service::shares::{ShareChange, ShareInfo, ShareWatcher};
use tank_service::{Caller, Service};

pub use conf::ShareConf;

/// How SMB is served.
#[derive(Debug, Clone)]
pub struct SmbOptions {
    /// Where smbd listens (port 0: a free one is chosen).
    pub addr: SocketAddr,
    /// Advertise the server over mDNS/DNS-SD (through avahi-daemon) when it listens beyond
    /// loopback.
    pub mdns: bool,
}

/// Whether avahi-daemon runs here (its pid file names a live process).
fn avahi_running() -> bool {
    std::fs::read_to_string("/run/avahi-daemon/pid")
        .ok()
        .and_then(|p| p.trim().parse::<u32>().ok())
        .is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists())
}

/// Whether smbd registers the server with avahi-daemon, and what to say about it: on, or
/// off and why.
fn mdns_state(wanted: bool, addr: SocketAddr, avahi: bool) -> (bool, String) {
    if !wanted {
        return (false, "off (--no-mdns)".into());
    }
    if addr.ip().is_loopback() {
        return (
            false,
            "off: smbd listens on loopback only, which no other machine reaches".into(),
        );
    }
    let how = "smbd registers _smb._tcp, _device-info._tcp and, for Time Machine shares, \
               _adisk._tcp";
    if avahi {
        (true, format!("on: {how} with avahi-daemon"))
    } else {
        (
            true,
            format!(
                "waiting for avahi-daemon, which is not running (apt-get install \
                 avahi-daemon); then {how}"
            ),
        )
    }
}

/// Where a program may be: the PATH, then the system directories Debian installs to.
fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/bin", "/sbin"].iter().map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// nss_wrapper's library.
fn find_nss_wrapper() -> Option<PathBuf> {
    [
        "/usr/lib/x86_64-linux-gnu/libnss_wrapper.so",
        "/usr/lib/aarch64-linux-gnu/libnss_wrapper.so",
        "/usr/lib64/libnss_wrapper.so",
        "/usr/lib/libnss_wrapper.so",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.is_file())
}

/// smbd in the foreground on the configuration of `dir` (its `smb.conf`, and the `passwd`
/// and `group` files nss_wrapper answers from), in a process group of its own.
fn smbd_command(smbd: &Path, nss: &Path, dir: &Path) -> Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(smbd);
    cmd.args([
        "--foreground",
        "--no-process-group",
        "--debug-stdout",
        "--configfile",
    ])
    .arg(dir.join("smb.conf"))
    .env("LD_PRELOAD", nss)
    .env("NSS_WRAPPER_PASSWD", dir.join("passwd"))
    .env("NSS_WRAPPER_GROUP", dir.join("group"))
    .stdin(Stdio::null())
    .process_group(0);
    cmd
}

/// smbd as tank runs it, on the files of `dir` laid out as `DATA_DIR/smb` (for a peer
/// measured against tank: the same configuration serving another directory).
pub fn plain_smbd(dir: &Path) -> Result<Command> {
    if let Some(why) = missing() {
        bail!("{why}");
    }
    let smbd = find_program("smbd").context("smbd")?;
    let nss = find_nss_wrapper().context("nss_wrapper")?;
    Ok(smbd_command(&smbd, &nss, dir))
}

/// Why SMB cannot be served on this machine, if it cannot.
pub fn missing() -> Option<String> {
    if find_program("smbd").is_none() {
        return Some(
            "Samba's smbd is not installed (apt-get install samba, on Debian and Ubuntu)".into(),
        );
    }
    if find_nss_wrapper().is_none() {
        return Some(
            "nss_wrapper is not installed (apt-get install libnss-wrapper, on Debian and Ubuntu)"
                .into(),
        );
    }
    None
}

struct Inner {
    svc: Arc<Service>,
    addr: SocketAddr,
    dir: PathBuf,
    smbd: PathBuf,
    nss: PathBuf,
    child: Mutex<Option<Child>>,
    stopping: AtomicBool,
    /// Shares not served, and why.
    problems: Mutex<BTreeMap<String, String>>,
    /// The configuration last written.
    written: Mutex<String>,
    /// The account store's generation the user files were written at.
    accounts_at: AtomicU64,
    restarts: AtomicU64,
    wake: Mutex<mpsc::Sender<()>>,
    /// Whether smbd registers with avahi-daemon, and the state as said at the start.
    mdns: bool,
    mdns_said: String,
    /// The Time Machine shares of the configuration last written, and of the one smbd was
    /// started with (smbd registers `_adisk._tcp` only when it starts).
    timemachine: Mutex<Vec<String>>,
    advertised: Mutex<Vec<String>>,
}

/// A running SMB front end.
pub struct SmbServer {
    inner: Arc<Inner>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Wakes the supervisor when an smb share changed.
struct Watcher {
    wake: mpsc::Sender<()>,
}

impl ShareWatcher for Watcher {
    fn share_changed(&self, change: &ShareChange) {
        let smb = |s: &ShareInfo| s.protocol == "smb";
        let relevant = match change {
            ShareChange::Added(s) | ShareChange::Removed(s) => smb(s),
            ShareChange::Changed { before, after } => smb(before) || smb(after),
        };
        if relevant {
            let _ = self.wake.send(());
        }
    }
}

fn on(s: &ShareInfo, k: &str) -> bool {
    s.options.get(k).map(String::as_str) == Some("on")
}

impl Inner {
    fn admin() -> Caller {
        Caller::Admin { name: "smb".into() }
    }

    /// The snapshot schedules of the smb shares with Previous Versions: (dataset,
    /// interval in seconds, snapshots kept).
    fn schedules(&self) -> Vec<(String, u64, usize)> {
        let admin = Self::admin();
        let Ok(Response::Shares(shares)) = self.svc.handle(&admin, Request::ShareList, None).0
        else {
            return Vec::new();
        };
        let mut out: Vec<(String, u64, usize)> = shares
            .into_iter()
            .filter(|s| s.protocol == "smb" && on(s, "previous_versions"))
            .filter_map(|s| {
                let v = s.options.get("snapshot_schedule")?;
                let (every, keep) = tank_service::shares::parse_snapshot_schedule(v).ok()?;
                (every > 0).then_some((s.dataset, every, keep))
            })
            .collect();
        // Two shares of one dataset: the shorter interval, the larger count.
        out.sort();
        out.dedup_by(|b, a| {
            if a.0 == b.0 {
                a.1 = a.1.min(b.1);
                a.2 = a.2.max(b.2);
                true
            } else {
                false
            }
        });
        out
    }

    /// The shares smbd should serve now, and the ones it cannot, with why.
    fn shares(&self) -> (Vec<ShareConf>, BTreeMap<String, String>) {
        let admin = Self::admin();
        let shares: Vec<ShareInfo> = match self.svc.handle(&admin, Request::ShareList, None).0 {
            Ok(Response::Shares(s)) => s.into_iter().filter(|s| s.protocol == "smb").collect(),
            _ => Vec::new(),
        };
        let mounts = match self.svc.handle(&admin, Request::MountList, None).0 {
            Ok(Response::Mounts(m)) => m,
            _ => Vec::new(),
        };
        let mut out = Vec::new();
        let mut problems = BTreeMap::new();
        for s in shares {
            let Some(m) = mounts.iter().find(|m| m.dataset == s.dataset) else {
                problems.insert(
                    s.name.clone(),
                    format!("its dataset {} is not mounted", s.dataset),
                );
                continue;
            };
            let mut valid: Vec<String> = s
                .options
                .get("users")
                .map(|u| {
                    u.split(',')
                        .filter(|x| !x.is_empty())
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            if let Some(g) = s.options.get("groups") {
                valid.extend(
                    g.split(',')
                        .filter(|x| !x.is_empty())
                        .map(|g| format!("@{g}")),
                );
            }
            out.push(ShareConf {
                name: s.name.clone(),
                path: m.dir.to_string_lossy().into_owned(),
                readonly: on(&s, "readonly"),
                browseable: s.options.get("browseable").map(String::as_str) != Some("off"),
                guest: on(&s, "guest"),
                valid_users: valid,
                timemachine: on(&s, "timemachine"),
                timemachine_max: s
                    .options
                    .get("timemachine_quota")
                    .and_then(|v| v.parse().ok())
                    .or_else(|| {
                        on(&s, "timemachine")
                            .then(|| self.quota_of(&s.dataset))
                            .flatten()
                    }),
                previous_versions: on(&s, "previous_versions"),
                comment: s.options.get("comment").cloned(),
            });
        }
        (out, problems)
    }

    /// The quota of `dataset` (none where it has none): what Time Machine is told the
    /// share can hold when the share gives no size of its own.
    fn quota_of(&self, dataset: &str) -> Option<u64> {
        let req = Request::DatasetList {
            names: vec![dataset.to_string()],
            recursive: false,
            types: Vec::new(),
        };
        match self.svc.handle(&Self::admin(), req, None).0 {
            Ok(Response::Datasets { datasets }) => datasets
                .first()
                .and_then(|d| d.prop("quota"))
                .and_then(|q| q.parse::<u64>().ok())
                .filter(|q| *q > 0),
            _ => None,
        }
    }

    /// Writes smb.conf if it changed: whether it did.
    fn write_conf(&self) -> Result<bool> {
        let (shares, problems) = self.shares();
        for sh in &shares {
            self.svc.shares.set_state("smb", &sh.name, None);
        }
        for (name, why) in &problems {
            self.svc
                .shares
                .set_state("smb", name, Some(format!("not served: {why}")));
        }
        {
            let mut seen = self.problems.lock();
            for (name, why) in &problems {
                if seen.get(name) != Some(why) {
                    println!("smb: share '{name}' is not served: {why}");
                }
            }
            *seen = problems;
        }
        let text = conf::render(self.addr, &self.dir, &shares, self.mdns);
        let mut written = self.written.lock();
        if *written == text {
            return Ok(false);
        }
        users::write_whole(&self.dir.join("smb.conf"), &text, 0o644)
            .context("cannot write smb.conf")?;
        *written = text;
        *self.timemachine.lock() = shares
            .iter()
            .filter(|s| s.timemachine)
            .map(|s| s.name.clone())
            .collect();
        Ok(true)
    }

    /// Writes the user, group and password files if the account store changed: whether
    /// they were written.
    fn write_users(&self, force: bool) -> Result<bool> {
        let accounts = self.svc.accounts().map_err(|e| anyhow::anyhow!("{e}"))?;
        let generation = accounts.generation();
        if !force && generation == self.accounts_at.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let all = accounts.users().map_err(|e| anyhow::anyhow!("{e}"))?;
        let groups = accounts.groups().map_err(|e| anyhow::anyhow!("{e}"))?;
        let f = users::render(&all, &groups);
        users::write_whole(&self.dir.join("passwd"), &f.passwd, 0o644)?;
        users::write_whole(&self.dir.join("group"), &f.group, 0o644)?;
        users::write_whole(&self.dir.join("private/smbpasswd"), &f.smbpasswd, 0o600)?;
        self.accounts_at.store(generation, Ordering::SeqCst);
        Ok(true)
    }

    /// Posts an event on the pools of the smb shares' datasets (`tank pool events`).
    fn post_event(&self, class: &str, detail: &str) {
        let admin = Self::admin();
        let Ok(Response::Shares(shares)) = self.svc.handle(&admin, Request::ShareList, None).0
        else {
            return;
        };
        let pools: std::collections::BTreeSet<String> = shares
            .iter()
            .filter(|s| s.protocol == "smb")
            .map(|s| tank_service::mounts::pool_of(&s.dataset).to_string())
            .collect();
        for o in self.svc.open_pools() {
            if pools.contains(&o.dsl.pool_name()) {
                o.pool.events.post(class, None, detail.to_string());
            }
        }
    }

    fn spawn(self: &Arc<Self>) -> Result<Child> {
        let mut cmd = smbd_command(&self.smbd, &self.nss, &self.dir);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start {}", self.smbd.display()))?;
        for out in [
            child
                .stdout
                .take()
                .map(|o| Box::new(o) as Box<dyn std::io::Read + Send>),
            child
                .stderr
                .take()
                .map(|o| Box::new(o) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let inner = Arc::downgrade(self);
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                    let line = line.trim();
                    if line.is_empty() {
                        continue;
                    }
                    println!("smbd: {line}");
                    // smbd's errors and panics are events as well as log lines.
                    let lower = line.to_ascii_lowercase();
                    if lower.contains("panic") || lower.contains("error") {
                        if let Some(i) = inner.upgrade() {
                            i.post_event("smb.error", line);
                        }
                    }
                }
            });
        }
        // smbd acknowledges a client's write once write(2) returns: its writes must not
        // wait in the mounts' writeback cache, where a full quota would fail them unseen.
        self.svc.mounts.write_through().set(Some(child.id() as i32));
        *self.advertised.lock() = self.timemachine.lock().clone();
        Ok(child)
    }

    /// Tells smbd (and the processes serving connections) to read its files again.
    fn reload(&self) {
        if let Some(c) = self.child.lock().as_ref() {
            let _ = killpg(Pid::from_raw(c.id() as i32), Signal::SIGHUP);
        }
    }

    /// Stops smbd and every process of its group.
    fn kill(&self) {
        let Some(mut c) = self.child.lock().take() else {
            return;
        };
        let pgid = Pid::from_raw(c.id() as i32);
        let _ = killpg(pgid, Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = c.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = killpg(pgid, Signal::SIGKILL);
        let _ = c.wait();
        self.svc.mounts.write_through().set(None);
    }

    fn supervise(self: Arc<Self>, wake: mpsc::Receiver<()>) {
        let mut backoff = Duration::from_millis(250);
        let mut scheduled_at: Option<Instant> = None;
        loop {
            let _ = wake.recv_timeout(Duration::from_secs(1));
            if self.stopping.load(Ordering::SeqCst) {
                return;
            }
            if scheduled_at.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                scheduled_at = Some(Instant::now());
                for line in snapshots::run(&self.svc, &self.schedules()) {
                    println!("smb: {line}");
                    if line.starts_with("cannot") {
                        self.post_event("smb.snapshot_failed", &line);
                    }
                }
            }
            let mut changed = false;
            match self.write_users(false) {
                Ok(c) => changed |= c,
                Err(e) => eprintln!("smb: cannot write the user files: {e:#}"),
            }
            match self.write_conf() {
                Ok(c) => changed |= c,
                Err(e) => eprintln!("smb: {e:#}"),
            }
            let died = {
                let mut g = self.child.lock();
                match g.as_mut().map(Child::try_wait) {
                    Some(Ok(Some(status))) => {
                        g.take();
                        Some(status.to_string())
                    }
                    None => Some("not running".to_string()),
                    _ => None,
                }
            };
            if let Some(why) = died {
                if self.stopping.load(Ordering::SeqCst) {
                    return;
                }
                let n = self.restarts.fetch_add(1, Ordering::SeqCst) + 1;
                println!("smb: smbd stopped ({why}); starting it again (restart {n})");
                self.post_event(
                    "smb.restart",
                    &format!("smbd stopped ({why}); started again (restart {n})"),
                );
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(10));
                match self.spawn() {
                    Ok(c) => *self.child.lock() = Some(c),
                    Err(e) => eprintln!("smb: {e:#}"),
                }
            } else {
                backoff = Duration::from_millis(250);
                if changed && self.mdns && *self.timemachine.lock() != *self.advertised.lock() {
                    // smbd advertises Time Machine shares only when it starts.
                    println!(
                        "smb: the Time Machine shares changed; starting smbd again so that \
                         it advertises them"
                    );
                    self.kill();
                    match self.spawn() {
                        Ok(c) => *self.child.lock() = Some(c),
                        Err(e) => eprintln!("smb: {e:#}"),
                    }
                } else if changed {
                    self.reload();
                }
            }
        }
    }
}

impl SmbServer {
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// Whether the server is advertised over mDNS/DNS-SD, and how (or why not).
    pub fn mdns(&self) -> &str {
        &self.inner.mdns_said
    }

    /// The smb shares that are not served, and why.
    pub fn problems(&self) -> BTreeMap<String, String> {
        self.inner.problems.lock().clone()
    }

    /// How many times smbd was started again after it stopped.
    pub fn restarts(&self) -> u64 {
        self.inner.restarts.load(Ordering::SeqCst)
    }

    /// Stops smbd and its connections.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        self.inner.stopping.store(true, Ordering::SeqCst);
        let _ = self.inner.wake.lock().send(());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.inner.kill();
        self.inner.svc.shares.serving("smb", false);
    }
}

impl Drop for SmbServer {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

/// Whether something answers TCP at `addr`.
fn listening(addr: SocketAddr) -> bool {
    std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}

/// Serves `svc`'s smb shares with smbd on `opts.addr`, its files under `DATA_DIR/smb`.
pub fn start(svc: Arc<Service>, opts: SmbOptions) -> Result<SmbServer> {
    if let Some(why) = missing() {
        bail!("cannot serve SMB: {why}");
    }
    if !nix::unistd::geteuid().is_root() {
        bail!("cannot serve SMB: smbd serves each user as that user's uid, so tank serve must run as root");
    }
    let smbd = find_program("smbd").expect("checked");
    let nss = find_nss_wrapper().expect("checked");
    // The port, chosen now where 0 was given (smbd is told a number).
    let addr = {
        let l = std::net::TcpListener::bind(opts.addr)
            .with_context(|| format!("cannot listen on {}", opts.addr))?;
        l.local_addr()?
    };
    let dir = svc.data_dir().join("smb");
    for sub in ["private", "lock", "state", "cache", "run", "log"] {
        std::fs::create_dir_all(dir.join(sub))
            .with_context(|| format!("cannot make {}", dir.join(sub).display()))?;
    }
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.join("private"), std::fs::Permissions::from_mode(0o700))?;
    }
    let (tx, rx) = mpsc::channel();
    let (mdns, mdns_said) = mdns_state(opts.mdns, addr, avahi_running());
    let inner = Arc::new(Inner {
        svc: svc.clone(),
        addr,
        dir: dir.clone(),
        smbd,
        nss,
        child: Mutex::new(None),
        stopping: AtomicBool::new(false),
        problems: Mutex::new(BTreeMap::new()),
        written: Mutex::new(String::new()),
        accounts_at: AtomicU64::new(0),
        restarts: AtomicU64::new(0),
        wake: Mutex::new(tx.clone()),
        mdns,
        mdns_said,
        timemachine: Mutex::new(Vec::new()),
        advertised: Mutex::new(Vec::new()),
    });
    inner.write_users(true)?;
    inner.write_conf()?;
    *inner.child.lock() = Some(inner.spawn()?);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !listening(addr) {
        let exited = inner
            .child
            .lock()
            .as_mut()
            .map(|c| c.try_wait())
            .and_then(Result::ok)
            .flatten();
        if let Some(status) = exited {
            bail!(
                "smbd stopped at its start ({status}); its log: {}",
                log_tail(&dir)
            );
        }
        if Instant::now() > deadline {
            inner.kill();
            bail!(
                "smbd did not listen on {addr} within 20 s; its log: {}",
                log_tail(&dir)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    svc.shares.watch(Arc::new(Watcher { wake: tx }));
    svc.shares.serving("smb", true);
    let sup = inner.clone();
    let thread = std::thread::Builder::new()
        .name("tank-smb".into())
        .spawn(move || sup.supervise(rx))?;
    Ok(SmbServer {
        inner,
        thread: Some(thread),
    })
}

/// The last lines of smbd's log file, for an error message.
fn log_tail(dir: &Path) -> String {
    let text = std::fs::read_to_string(dir.join("log/smbd.log")).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(5).collect();
    if lines.is_empty() {
        "(empty)".into()
    } else {
        lines.into_iter().rev().collect::<Vec<_>>().join(" / ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_server_others_reach_is_advertised() {
        let lan: SocketAddr = "0.0.0.0:445".parse().unwrap();
        let lo: SocketAddr = "127.0.0.1:4450".parse().unwrap();
        assert!(mdns_state(true, lan, true).0);
        let (on, said) = mdns_state(true, lan, false);
        assert!(on && said.contains("not running"), "{said}");
        assert!(!mdns_state(true, lo, true).0);
        assert!(!mdns_state(true, "[::1]:445".parse().unwrap(), true).0);
        assert!(!mdns_state(false, lan, true).0);
    }
}
