//! `tank serve`: the daemon that owns the pools, and the local socket the CLI talks to.
//!
//! # Theory of operation
//! On start the daemon creates the default pool when nothing is configured (six sparse
//! file devices in raidz2 under the data directory, its root filesystem mounted under
//! `DATA_DIR/mnt/tank`; all or nothing, see `demo::ensure_default_pool`), makes the one
//! service (`tank_service::Service`) that holds its pools, mounts, shares, accounts and
//! jobs, imports every pool of the cache file through it (finishing the set-up of a default
//! pool an older build left without a mountpoint), mounts every filesystem with a
//! mountpoint (and says why a pool's root is not mounted), and listens on
//! `DATA_DIR/tank.sock`. Unless `--no-fuse-io-uring`, it first turns the kernel's FUSE over
//! io_uring on, so its mounts take requests from per-CPU rings.
//!
//! **The local API** is the service's typed API (`tank_service::api`): one JSON envelope
//! per line in (`{"version": 1, "request": {"op": "pool_status", ...}}`), one reply per
//! line out. A connection may carry many requests, one after another. Anyone on the host
//! may connect; every request is authorized for the uid the kernel reports for the peer
//! (SO_PEERCRED): root is an administrator, another uid is its account or is refused. A
//! malformed line, an unknown field or a newer API version gets a clear error and changes
//! nothing.
//!
//! The NFS server (`tank_nfs`, `--nfs ADDR`) serves the nfs shares from the same service,
//! and the S3 endpoint (`tank_s3`, `--s3 URL`) the s3 shares, the iSCSI target
//! (`tank_iscsi`, `--iscsi ADDR`) the iscsi shares.
//! The HTTPS API (`tank_api`) runs beside the socket on the same service, on `--api`
//! (default 127.0.0.1:8443). SIGTERM or SIGINT stops the API, then unmounts every
//! filesystem, syncs and exports every pool (they stay in the cache file, so the next start
//! imports them), removes the socket and exits.

/// A line of the daemon's log on stdout. A reader that went away (a closed pipe) loses the
/// line and the daemon goes on: `println!` would panic, and a daemon that dies on its way
/// out leaves its mounts dead and its pools not exported.
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($t)*);
    }};
}

/// The same on stderr.
macro_rules! say_err {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use tank_dataset::DatasetKind;
use tank_service::api::{Envelope, Reply, Request, WireError, API_VERSION};
use tank_service::{Mode, Service, ServiceError};

use crate::client::socket_path;
use crate::datadir::{data_dir, human};
use crate::demo::{ensure_default_pool, finish_default_pool, DEFAULT_DEVICE_SIZE, DEFAULT_POOL};
use crate::pretouch;
use tank_service::pools::{CachedPool, PoolCache};

#[derive(Args)]
pub struct ServeArgs {
    /// Leave the kernel's FUSE over io_uring setting as it is. By default the daemon turns it
    /// on where the kernel has it (Linux 6.14+, as root), so that each request of its mounts
    /// is served on its caller's CPU (docs/FUSE-IO-URING.md). A kernel setting: it applies to
    /// every FUSE mount made afterwards that asks for it
    #[arg(long)]
    pub no_fuse_io_uring: bool,
    /// Turn the kernel's FUSE over io_uring on (the default; kept for scripts that name it)
    #[arg(long, hide = true, conflicts_with = "no_fuse_io_uring")]
    pub fuse_io_uring: bool,
    /// Serve the HTTPS API (REST, OpenAPI at /api/openapi.json, metrics at /metrics) on
    /// ADDR:PORT
    #[arg(long, value_name = "ADDR:PORT", default_value = DEFAULT_API)]
    pub api: String,
    /// Serve no HTTPS API
    #[arg(long, conflicts_with = "api")]
    pub no_api: bool,
    /// The API's certificate chain (PEM) instead of the self-signed one made at first start
    #[arg(long, requires = "api_key", value_name = "FILE")]
    pub api_cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of --api-cert
    #[arg(long, requires = "api_cert", value_name = "FILE")]
    pub api_key: Option<std::path::PathBuf>,
    /// Let anyone read /metrics (by default a token or session is needed)
    #[arg(long)]
    pub metrics_public: bool,
    /// Serve the nfs shares over NFSv3 on ADDR:PORT (MOUNT and NFS on that one port; the
    /// standard port is 2049). Clients mount /NAME with nolock
    #[arg(long, value_name = "ADDR:PORT")]
    pub nfs: Option<String>,
    /// Serve the smb shares with Samba's smbd on ADDR:PORT (the standard port is 445);
    /// smbd runs under tank's supervision with a configuration tank writes
    #[arg(long, value_name = "ADDR:PORT")]
    pub smb: Option<String>,
    /// Do not advertise the SMB server over mDNS/DNS-SD (by default smbd registers with
    /// avahi-daemon when it listens beyond loopback)
    #[arg(long, requires = "smb")]
    pub no_mdns: bool,
    /// Serve the s3 shares as buckets at URL: https://ADDR:PORT (with the API's
    /// certificate) or http://ADDR:PORT
    #[arg(long, value_name = "URL")]
    pub s3: Option<String>,
    /// Serve the iscsi shares (volumes) as an iSCSI target on ADDR:PORT (the standard port
    /// is 3260)
    #[arg(long, value_name = "ADDR:PORT")]
    pub iscsi: Option<String>,
    /// Where buckets created through S3 go, as PARENT/BUCKET (default: <first pool>/s3)
    #[arg(long, value_name = "DATASET", requires = "s3")]
    pub s3_parent: Option<String>,
    /// The domain of virtual-hosted-style requests (BUCKET.DOMAIN); path-style always works
    #[arg(long, value_name = "DOMAIN", requires = "s3")]
    pub s3_domain: Option<String>,
    /// The region clients sign for
    #[arg(
        long,
        value_name = "REGION",
        default_value = "us-east-1",
        requires = "s3"
    )]
    pub s3_region: String,
    /// How often the buckets' lifecycle rules are applied, in seconds
    #[arg(long, value_name = "SECONDS", default_value_t = 3600, requires = "s3")]
    pub s3_lifecycle_interval: u64,
    /// The length of a lifecycle rule's day, in seconds (86400; shorter only to try rules
    /// out, as Ceph's rgw_lc_debug_interval)
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 86400,
        hide = true,
        requires = "s3"
    )]
    pub s3_lifecycle_day: u64,
    /// The length of a snapshot schedule's hour, in seconds (3600; shorter only to try
    /// schedules out)
    #[arg(long, value_name = "SECONDS", default_value_t = 3600, hide = true)]
    pub schedule_hour: u64,
    /// Also accept S3 requests signed with Signature Version 2, for old clients (it has no
    /// clock-skew check: a captured request can be replayed until it expires)
    #[arg(long, requires = "s3")]
    pub s3_sigv2: bool,
}

/// The API's address when none is given: loopback, port 8443.
pub const DEFAULT_API: &str = "127.0.0.1:8443";

/// Longest request line accepted (a request with a password, or a debug object's bytes).
const MAX_REQUEST_BYTES: u64 = 64 << 20;
/// Requests one connection may send before the daemon closes it.
const MAX_REQUESTS_PER_CONNECTION: usize = 100_000;

fn error_reply(e: &ServiceError) -> Reply {
    Reply::Error(WireError::from(e))
}

/// Reads one request line of a client: its envelope, or the reply that refuses it.
fn parse_envelope(line: &str) -> Result<Envelope, Box<Reply>> {
    let env: Envelope = match serde_json::from_str(line) {
        Ok(e) => e,
        Err(e) => {
            // A client of a newer API may send requests this build does not know: say so
            // rather than "unknown variant".
            let version = serde_json::from_str::<serde_json::Value>(line)
                .ok()
                .and_then(|v| v.get("version").and_then(|v| v.as_u64()));
            let msg = match version {
                Some(v) if v != u64::from(API_VERSION) => format!(
                    "the client speaks API version {v}, this daemon {API_VERSION}: use a tank of the same version"
                ),
                _ => format!("malformed request: {e}"),
            };
            return Err(Box::new(error_reply(&ServiceError::BadRequest(msg))));
        }
    };
    if env.version != API_VERSION {
        return Err(Box::new(error_reply(&ServiceError::BadRequest(format!(
            "the client speaks API version {}, this daemon {API_VERSION}: use a tank of the same version",
            env.version
        )))));
    }
    Ok(env)
}

/// Answers one request of a client.
fn answer(svc: &Service, uid: u32, env: Envelope) -> Reply {
    let caller = match svc.local_caller(uid) {
        Ok(c) => c,
        Err(e) => {
            say_err!("refused {} from uid {uid}: {e}", env.request.op());
            return error_reply(&e);
        }
    };
    let (r, notes) = svc.handle(&caller, env.request, env.command);
    match r {
        Ok(response) => Reply::Ok { response, notes },
        Err(e) => {
            if matches!(
                e,
                ServiceError::Denied(_) | ServiceError::Unauthenticated(_)
            ) {
                // The refusal names what was refused; the request is not named again (that
                // would cost a serialization of every request, large ones included).
                say_err!("refused a request from uid {uid}: {e}");
            }
            error_reply(&e)
        }
    }
}

fn serve_connection(stream: UnixStream, svc: &Service) -> Result<()> {
    // Who is calling: the peer's uid from the kernel (SO_PEERCRED), never from the request.
    let uid = nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials)
        .context("cannot read the caller's credentials")?
        .uid();
    // Through FdReader: a send or a receive passes the command's standard output or input
    // with its request line (`fdpass.rs`).
    let mut reader = BufReader::new(crate::fdpass::FdReader::new(stream.try_clone()?));
    let mut writer = stream;
    for _ in 0..MAX_REQUESTS_PER_CONNECTION {
        let mut line = String::new();
        let n = (&mut reader).take(MAX_REQUEST_BYTES).read_line(&mut line)?;
        if n == 0 {
            return Ok(());
        }
        let reply = if !line.ends_with('\n') && n as u64 >= MAX_REQUEST_BYTES {
            let r = error_reply(&ServiceError::BadRequest(format!(
                "request longer than {} bytes",
                MAX_REQUEST_BYTES
            )));
            let mut s = serde_json::to_string(&r)?;
            s.push('\n');
            writer.write_all(s.as_bytes())?;
            return Ok(());
        } else {
            match parse_envelope(line.trim_end()) {
                Err(reply) => *reply,
                Ok(env)
                    if matches!(
                        env.request,
                        Request::Send { dry_run: false, .. } | Request::Receive { .. }
                    ) =>
                {
                    // A stream follows (receive) or comes back (send), in frames; the
                    // connection carries nothing after it.
                    return serve_stream(svc, uid, env, reader, writer);
                }
                Ok(env) => answer(svc, uid, env),
            }
        };
        let mut s = serde_json::to_string(&reply)?;
        s.push('\n');
        writer.write_all(s.as_bytes())?;
    }
    Ok(())
}

/// A send or a receive: the stream through the descriptor the command passed with its
/// request (`fdpass.rs`), then the reply.
fn serve_stream(
    svc: &Service,
    uid: u32,
    env: Envelope,
    mut reader: BufReader<crate::fdpass::FdReader>,
    mut writer: UnixStream,
) -> Result<()> {
    use crate::fdpass::Passed;
    let reply_line = |r: &Reply| -> Result<Vec<u8>> {
        let mut s = serde_json::to_string(r)?;
        s.push('\n');
        Ok(s.into_bytes())
    };
    let what = env.request.op();
    let Some(fd) = reader.get_mut().take_fd() else {
        let e = ServiceError::BadRequest(format!(
            "{what}: the command passes its standard {} with the request (SCM_RIGHTS); none came",
            if matches!(env.request, Request::Send { .. }) {
                "output"
            } else {
                "input"
            }
        ));
        writer.write_all(&reply_line(&error_reply(&e))?)?;
        return Ok(());
    };
    let caller = match svc.local_caller(uid) {
        Ok(c) => c,
        Err(e) => {
            say_err!("refused {what} from uid {uid}: {e}");
            writer.write_all(&reply_line(&error_reply(&e))?)?;
            return Ok(());
        }
    };
    let to_reply = |(r, notes): (Result<tank_service::Response, ServiceError>, Vec<String>)| match r
    {
        Ok(response) => Reply::Ok { response, notes },
        Err(e) => error_reply(&e),
    };
    // The descriptor is closed before the reply: the other end of a pipe sees its end (or
    // a broken pipe) no later than the command does.
    let reply = match env.request {
        req @ Request::Send { .. } => {
            let mut out = Passed::new(fd, &writer);
            let (mut result, notes) = svc.send_stream(&caller, req, &mut out, env.command);
            if let Err(e) = out.flush() {
                if result.is_ok() {
                    result = Err(ServiceError::Failed(format!("stream: {e}")));
                }
            }
            out.report();
            to_reply((result, notes))
        }
        req => {
            // A small buffer: a record's header comes through it, its block's bytes
            // mostly straight into their own buffer.
            let mut input = BufReader::with_capacity(16 << 10, Passed::new(fd, &writer));
            let result = svc.receive_stream(&caller, req, &mut input, env.command);
            input.get_ref().report();
            to_reply(result)
        }
    };
    writer.write_all(&reply_line(&reply)?)?;
    Ok(())
}

/// Whether a cached pool is the default one: its devices are the files under
/// `DATA_DIR/devices` that `ensure_default_pool` makes.
fn is_default_pool(entry: &CachedPool) -> bool {
    let devdir = data_dir().join("devices");
    !entry.devices.is_empty()
        && entry
            .devices
            .iter()
            .all(|d| std::path::Path::new(d).starts_with(&devdir))
}

/// Mounts every filesystem of the service's pools that has a mountpoint.
fn mount_all(svc: &Service) {
    for opened in svc.open_pools() {
        let root = opened.pool.name();
        if let Ok(id) = opened.dsl.resolve(&root) {
            let is_fs = opened
                .dsl
                .record(id)
                .is_ok_and(|r| r.kind == DatasetKind::Filesystem);
            let mp = opened.dsl.prop(id, "mountpoint").unwrap_or_default();
            if is_fs && (mp == "none" || mp == "legacy" || mp.is_empty()) {
                say!(
                    "not mounting {root}: its mountpoint is '{mp}' (set one with 'tank dataset set mountpoint=/PATH {root}')"
                );
            }
        }
        for line in svc.mount_pool(&opened) {
            if line.starts_with("warning:") {
                say_err!("{line}");
            } else {
                say!("{line}");
            }
        }
    }
}

pub fn run(a: ServeArgs) -> Result<()> {
    // Caught from the start: a SIGTERM while the daemon still imports, mounts or starts its
    // listeners waits for that to finish, then stops it cleanly (never a kill mid-start).
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])?;
    let dir = data_dir();
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("cannot create the data directory {}", dir.display()))?;
    let sock = socket_path();
    if UnixStream::connect(&sock).is_ok() {
        bail!(
            "a tank daemon is already running (socket {}); stop it first",
            sock.display()
        );
    }
    let _ = std::fs::remove_file(&sock);
    if PoolCache::load(&dir)?.pools.is_empty() && ensure_default_pool()? {
        say!(
            "created pool '{DEFAULT_POOL}': raidz2 of 6 sparse file devices of {} in {}",
            human(DEFAULT_DEVICE_SIZE),
            dir.join("devices").display()
        );
    }
    // The fast path is the default: FUSE over io_uring where the kernel has it.
    if tank_fuse::io_uring_offered() {
        say!("FUSE over io_uring: on (mounts serve each request on its caller's CPU)");
    } else if a.no_fuse_io_uring {
        say!("FUSE over io_uring: off (--no-fuse-io-uring); mounts use /dev/fuse");
    } else {
        match tank_fuse::enable_kernel_io_uring() {
            Ok(()) => {
                say!("FUSE over io_uring: on (mounts serve each request on its caller's CPU)")
            }
            Err(e) => say_err!("warning: FUSE over io_uring is off, mounts use /dev/fuse: {e}"),
        }
    }
    match pretouch::start() {
        Ok(Some(bytes)) => say!(
            "write memory: {} made resident in the background",
            human(bytes)
        ),
        Ok(None) => {}
        Err(e) => say_err!("warning: write memory is not made resident: {e}"),
    }
    let svc = Arc::new(Service::new(&dir, Mode::Daemon));
    svc.mounts.set_mounter(Arc::new(tank_fuse::FuseMounter));
    svc.set_benchmark(Arc::new(tank_bench::run::fs::ServiceBench));
    svc.set_bucket_connector(Arc::new(tank_s3::client::S3Connector));
    svc.set_planner(Arc::new(tank_bench::run::plan::ServicePlanner));
    for entry in PoolCache::load(&dir)?.pools {
        // Imported through the cache as a command would, then kept open.
        let opened = match svc.open(&entry.name) {
            Ok((o, notes)) => {
                for n in notes {
                    say_err!("{n}");
                }
                o
            }
            Err(e) => {
                say_err!("warning: cannot import pool '{}': {e}", entry.name);
                continue;
            }
        };
        let space = opened.pool.space();
        say!(
            "imported pool '{}' ({}, {} usable)",
            entry.name,
            opened.pool.state(),
            human(space.usable)
        );
        if entry.name == DEFAULT_POOL && is_default_pool(&entry) {
            match finish_default_pool(&opened.dsl) {
                Ok(Some(mp)) => {
                    opened
                        .pool
                        .log_history("tank serve (finish the default pool's set-up)");
                    say!(
                        "finished the set-up of pool '{DEFAULT_POOL}': its root mounts at {}",
                        mp.display()
                    );
                }
                Ok(None) => {}
                Err(e) => say_err!(
                    "warning: cannot set the mountpoint of '{DEFAULT_POOL}': {}",
                    crate::out::chain(&e)
                ),
            }
        }
    }
    mount_all(&svc);
    svc.accounts().with_context(|| {
        format!(
            "cannot open the account store {}",
            dir.join("accounts.redb").display()
        )
    })?;
    let api = if a.no_api {
        None
    } else {
        let addr: std::net::SocketAddr = a.api.parse().map_err(|_| {
            anyhow::anyhow!(
                "invalid --api '{}': give ADDR:PORT, e.g. 127.0.0.1:8443",
                a.api
            )
        })?;
        let opts = tank_api::ApiOptions {
            addr,
            cert: a.api_cert.as_deref().map(crate::out::resolve),
            key: a.api_key.as_deref().map(crate::out::resolve),
            metrics_public: a.metrics_public,
        };
        match tank_api::start(svc.clone(), &dir, &opts) {
            Ok(server) => {
                if server.generated {
                    say!(
                        "made a self-signed certificate for the API: {}",
                        server.cert.display()
                    );
                }
                say!("api: {}", server.url());
                Some(server)
            }
            // The default port may be taken by something else: the daemon still serves
            // its pools and the local socket, and says why the API is not there.
            Err(e) if a.api == DEFAULT_API => {
                say_err!(
                    "warning: no HTTPS API: {} (choose another address with --api)",
                    crate::out::chain(&e)
                );
                None
            }
            Err(e) => return Err(e.context("cannot serve the API")),
        }
    };
    let nfs = match &a.nfs {
        None => None,
        Some(spec) => {
            let addr: std::net::SocketAddr = spec.parse().map_err(|_| {
                anyhow::anyhow!(
                    "invalid --nfs '{spec}': give ADDR:PORT, e.g. 127.0.0.1:2049 or [::1]:2049"
                )
            })?;
            let server = tank_nfs::start(svc.clone(), addr).context("cannot serve NFS")?;
            say!("nfs: {}", server.local_addr());
            say!("nfs portmapper: {}", server.portmap());
            Some(server)
        }
    };
    let s3 = match &a.s3 {
        None => None,
        Some(spec) => {
            let (https, rest) = if let Some(r) = spec.strip_prefix("https://") {
                (true, r)
            } else if let Some(r) = spec.strip_prefix("http://") {
                (false, r)
            } else {
                (true, spec.as_str())
            };
            let addr: std::net::SocketAddr = rest.trim_end_matches('/').parse().map_err(|_| {
                anyhow::anyhow!(
                    "invalid --s3 '{spec}': give https://ADDR:PORT or http://ADDR:PORT, e.g. https://127.0.0.1:9000"
                )
            })?;
            let tls = if https {
                let files = tank_api::tls::files(
                    &dir,
                    a.api_cert.as_deref().map(crate::out::resolve).as_deref(),
                    a.api_key.as_deref().map(crate::out::resolve).as_deref(),
                )?;
                Some(tank_api::tls::server_config(&files)?)
            } else {
                None
            };
            let opts = tank_s3::S3Options {
                addr,
                tls,
                domain: a.s3_domain.clone(),
                settings: tank_s3::Settings {
                    region: a.s3_region.clone(),
                    parent: a.s3_parent.clone(),
                    lifecycle_interval: std::time::Duration::from_secs(
                        a.s3_lifecycle_interval.max(1),
                    ),
                    lifecycle_day: std::time::Duration::from_secs(a.s3_lifecycle_day.max(1)),
                    allow_sigv2: a.s3_sigv2,
                },
            };
            let server = tank_s3::start(svc.clone(), opts).context("cannot serve S3")?;
            say!("s3: {}", server.url());
            Some(server)
        }
    };
    let smb = match &a.smb {
        None => None,
        Some(spec) => {
            let addr: std::net::SocketAddr = spec.parse().map_err(|_| {
                anyhow::anyhow!(
                    "invalid --smb '{spec}': give ADDR:PORT, e.g. 0.0.0.0:445 or 127.0.0.1:4450"
                )
            })?;
            // Without Samba the rest of tank runs on: SMB is left out, and says why.
            let opts = tank_smb::SmbOptions {
                addr,
                mdns: !a.no_mdns,
            };
            match tank_smb::start(svc.clone(), opts) {
                Ok(server) => {
                    say!("smb: {}", server.local_addr());
                    say!("smb mdns: {}", server.mdns());
                    Some(server)
                }
                Err(e) => {
                    say_err!("warning: {}", crate::out::chain(&e));
                    None
                }
            }
        }
    };
    let iscsi = match &a.iscsi {
        None => None,
        Some(spec) => {
            let addr: std::net::SocketAddr = spec.parse().map_err(|_| {
                anyhow::anyhow!(
                    "invalid --iscsi '{spec}': give ADDR:PORT, e.g. 0.0.0.0:3260 or 127.0.0.1:3260"
                )
            })?;
            let server = tank_iscsi::start(svc.clone(), addr).context("cannot serve iSCSI")?;
            say!("iscsi: {}", server.local_addr());
            Some(server)
        }
    };
    let listener = UnixListener::bind(&sock)
        .with_context(|| format!("cannot listen on {}", sock.display()))?;
    // Anyone on the host may connect; each request is authorized for the uid the kernel
    // reports for its peer (root: administrator; another uid: its account, or refused).
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666))
            .with_context(|| format!("cannot open {} to local users", sock.display()))?;
    }
    say!(
        "listening on {} (stop with Ctrl-C or SIGTERM)",
        sock.display()
    );
    {
        // Snapshot schedules and replication tasks: checked a few times per schedule hour
        // (every minute at most).
        svc.set_schedule_hour(a.schedule_hour);
        let svc = svc.clone();
        let tick =
            std::time::Duration::from_millis((a.schedule_hour.max(1) * 1000 / 8).min(60_000));
        std::thread::spawn(move || loop {
            for line in svc.run_schedules() {
                if line.starts_with("warning:") {
                    say_err!("{line}");
                } else {
                    say!("{line}");
                }
            }
            // Replication tasks whose source has a snapshot the target lacks (each runs
            // on a thread of its own; its outcome is in its state, job and events).
            for name in svc.start_due_replications() {
                say!("replicating {name}");
            }
            std::thread::sleep(tick);
        });
    }
    {
        // Each pool's I/O history, for the console's charts: one sample a second.
        let svc = svc.clone();
        std::thread::spawn(move || loop {
            svc.sample_io();
            std::thread::sleep(std::time::Duration::from_secs(1));
        });
    }
    {
        let svc = svc.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let svc = svc.clone();
                std::thread::spawn(move || {
                    if let Err(e) = serve_connection(stream, &svc) {
                        say_err!("warning: client request failed: {}", crate::out::chain(&e));
                    }
                });
            }
        });
    }
    let sig = signals.forever().next();
    say!("signal {}: stopping", sig.unwrap_or(0));
    // No new requests: the API first (requests in flight finish), then the socket.
    if let Some(api) = api {
        api.stop();
    }
    if let Some(nfs) = nfs {
        nfs.stop();
    }
    if let Some(s3) = s3 {
        s3.stop();
    }
    if let Some(smb) = smb {
        smb.stop();
    }
    if let Some(iscsi) = iscsi {
        iscsi.stop();
    }
    let _ = std::fs::remove_file(&sock);
    let names: Vec<String> = svc.open_pools().iter().map(|o| o.pool.name()).collect();
    let problems = svc.shutdown(true);
    for p in &problems {
        say_err!("warning: {p}");
    }
    for n in names {
        if !problems.iter().any(|p| p.contains(&format!("'{n}'"))) {
            say!("exported pool '{n}'");
        }
    }
    // Let client threads finish their replies.
    std::thread::sleep(Duration::from_millis(50));
    if !problems.is_empty() {
        bail!("stopped with errors (see above)");
    }
    Ok(())
}
