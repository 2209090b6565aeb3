//! `tank serve`: the daemon that owns the pools, and the local socket the CLI talks to.
//!
//! # Theory of operation
//! On start the daemon creates the default pool when nothing is configured (six sparse
//! file devices in raidz2 under the data directory, its root filesystem mounted under
//! `DATA_DIR/mnt/tank`; all or nothing, see `demo::ensure_default_pool`), imports every
//! pool of the cache file (finishing the set-up of a default pool an older build left
//! without a mountpoint), mounts every filesystem with a mountpoint (and says why a pool's
//! root is not mounted), and listens on `DATA_DIR/tank.sock`. With `--fuse-io-uring` it first
//! turns the kernel's FUSE over io_uring on, so its mounts take requests from per-CPU rings.
//!
//! **The local API** is one JSON object per line each way. A request names a CLI command:
//! `{"argv": ["dataset", "list", "--json"]}`; the reply carries what the command printed
//! and its exit status: `{"code": 0, "stdout": "...", "stderr": ""}`. Commands run in the
//! daemon on the pools it holds open (the same code as without a daemon), each on its own
//! thread with its output captured, so `--json` output is the structured API. The CLI
//! forwards every pool and dataset command when the socket answers, and runs it in its own
//! process otherwise.
//!
//! SIGTERM or SIGINT unmounts every filesystem, syncs and exports every pool (they stay in
//! the cache file, so the next start imports them), removes the socket and exits.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use tank_dataset::DatasetKind;

use crate::datadir::{data_dir, human, CachedPool, PoolCache};
use crate::demo::{ensure_default_pool, finish_default_pool, DEFAULT_DEVICE_SIZE, DEFAULT_POOL};
use crate::pools::{daemon_pools, enter_daemon_mode, open_pool};

#[derive(Args)]
pub struct ServeArgs {
    /// Turn on the kernel's FUSE over io_uring (Linux 6.14+) before mounting, so that each
    /// request is served on its caller's CPU (docs/FUSE-IO-URING.md). A kernel setting: it
    /// applies to every FUSE mount made afterwards that asks for it
    #[arg(long)]
    pub fuse_io_uring: bool,
}

#[derive(Serialize, Deserialize)]
pub struct Request {
    pub argv: Vec<String>,
    /// A password the command needs (`user add`, `user passwd`), read by the client.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// The client's working directory: relative paths of the command are resolved
    /// against it (`out::resolve`), not against the daemon's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathBuf>,
}

#[derive(Serialize, Deserialize)]
pub struct Reply {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

pub fn socket_path() -> PathBuf {
    data_dir().join("tank.sock")
}

/// Sends a command to a running daemon; None when no daemon answers.
pub fn forward(argv: &[String], secret: Option<String>) -> Result<Option<Reply>> {
    let path = socket_path();
    let Ok(mut stream) = UnixStream::connect(&path) else {
        return Ok(None);
    };
    let mut line = serde_json::to_string(&Request {
        argv: argv.to_vec(),
        secret,
        cwd: std::env::current_dir().ok(),
    })?;
    line.push('\n');
    stream.write_all(line.as_bytes())?;
    let mut reply = String::new();
    BufReader::new(stream)
        .read_line(&mut reply)
        .context("the daemon closed the connection")?;
    Ok(Some(serde_json::from_str(&reply).with_context(|| {
        format!("unreadable reply from the daemon at {}", path.display())
    })?))
}

/// Longest request line accepted (a command line and a password).
const MAX_REQUEST_BYTES: u64 = 1 << 20;

fn handle(stream: UnixStream, accounts: &tank_service::Accounts) -> Result<()> {
    // Who is calling: the peer's uid from the kernel (SO_PEERCRED), never from the request.
    let uid = nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials)
        .context("cannot read the caller's credentials")?
        .uid();
    let mut reader = BufReader::new(std::io::Read::take(stream.try_clone()?, MAX_REQUEST_BYTES));
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let req: Request = serde_json::from_str(&line).context("malformed request")?;
    let command = format!("tank {}", req.argv.join(" "));
    let allowed = tank_service::Caller::local(accounts, uid).and_then(|caller| {
        let access = crate::cmd_account::access_of(&req.argv, accounts);
        tank_service::authorize(&caller, &access)
    });
    let (code, out) = match allowed {
        Ok(()) => crate::out::capture(command, || {
            let mut argv = vec!["tank".to_string()];
            argv.extend(req.argv.iter().cloned());
            crate::out::with_client_dir(req.cwd, || {
                crate::cmd_account::with_secret(req.secret, || crate::run_in_daemon(argv))
            })
        }),
        Err(e) => {
            eprintln!("refused 'tank {}' from uid {uid}: {e}", req.argv.join(" "));
            (
                e.exit_code(),
                crate::out::Captured {
                    stdout: String::new(),
                    stderr: format!("tank: {e}\n"),
                },
            )
        }
    };
    let reply = Reply {
        code,
        stdout: out.stdout,
        stderr: out.stderr,
    };
    let mut w = stream;
    let mut s = serde_json::to_string(&reply)?;
    s.push('\n');
    w.write_all(s.as_bytes())?;
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

/// Mounts every filesystem of the daemon's pools that has a mountpoint.
fn mount_all() {
    for opened in daemon_pools() {
        for id in opened.dsl.all_ids() {
            let Ok(rec) = opened.dsl.record(id) else {
                continue;
            };
            if rec.kind != DatasetKind::Filesystem {
                continue;
            }
            let name = opened.dsl.name_of(id);
            let mp = opened.dsl.prop(id, "mountpoint").unwrap_or_default();
            if mp == "none" || mp == "legacy" || mp.is_empty() {
                if !name.contains('/') {
                    println!(
                        "not mounting {name}: its mountpoint is '{mp}' (set one with 'tank dataset set mountpoint=/PATH {name}')"
                    );
                }
                continue;
            }
            match crate::mounts::mount_dataset(&opened.dsl, &opened.store, &name, None) {
                Ok(dir) => println!("mounted {name} at {}", dir.display()),
                Err(e) => eprintln!("warning: cannot mount {name}: {}", crate::out::chain(&e)),
            }
        }
    }
}

pub fn run(a: ServeArgs) -> Result<()> {
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
        println!(
            "created pool '{DEFAULT_POOL}': raidz2 of 6 sparse file devices of {} in {}",
            human(DEFAULT_DEVICE_SIZE),
            dir.join("devices").display()
        );
    }
    if a.fuse_io_uring {
        match tank_fuse::enable_kernel_io_uring() {
            Ok(()) => {
                println!("FUSE over io_uring: on (mounts serve each request on its caller's CPU)")
            }
            Err(e) => eprintln!("warning: FUSE over io_uring stays off: {e}"),
        }
    }
    enter_daemon_mode();
    for entry in PoolCache::load(&dir)?.pools {
        // Imported through the cache as the CLI does, then kept open.
        let opened = match open_pool(&entry.name) {
            Ok(o) => o,
            Err(e) => {
                eprintln!(
                    "warning: cannot import pool '{}': {}",
                    entry.name,
                    crate::out::chain(&e)
                );
                continue;
            }
        };
        let space = opened.pool.space();
        println!(
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
                    println!(
                        "finished the set-up of pool '{DEFAULT_POOL}': its root mounts at {}",
                        mp.display()
                    );
                }
                Ok(None) => {}
                Err(e) => eprintln!(
                    "warning: cannot set the mountpoint of '{DEFAULT_POOL}': {}",
                    crate::out::chain(&e)
                ),
            }
        }
        crate::pools::adopt(opened);
    }
    mount_all();
    let accounts = crate::cmd_account::open_for_daemon()?;
    crate::cmd_share::daemon_registry();
    let listener = UnixListener::bind(&sock)
        .with_context(|| format!("cannot listen on {}", sock.display()))?;
    // Anyone on the host may connect; each request is authorized for the uid the kernel
    // reports for its peer (root: administrator; another uid: its account, or refused).
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666))
            .with_context(|| format!("cannot open {} to local users", sock.display()))?;
    }
    println!(
        "listening on {} (stop with Ctrl-C or SIGTERM)",
        sock.display()
    );
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let accounts = accounts.clone();
            std::thread::spawn(move || {
                if let Err(e) = handle(stream, &accounts) {
                    eprintln!("warning: client request failed: {}", crate::out::chain(&e));
                }
            });
        }
    });
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])?;
    let sig = signals.forever().next();
    println!("signal {}: stopping", sig.unwrap_or(0));
    let _ = std::fs::remove_file(&sock);
    let mut failed = false;
    for p in crate::mounts::unmount_all() {
        eprintln!("warning: {p}");
        failed = true;
    }
    for opened in daemon_pools() {
        let name = opened.pool.name();
        opened.pool.log_history("tank serve (stop: export)");
        match opened.pool.export() {
            Ok(()) => println!("exported pool '{name}'"),
            Err(e) => {
                eprintln!(
                    "warning: cannot export '{name}': {}",
                    crate::out::chain(&e.into())
                );
                failed = true;
            }
        }
        crate::pools::forget(&name);
    }
    // Let client threads finish their replies.
    std::thread::sleep(Duration::from_millis(50));
    if failed {
        bail!("stopped with errors (see above)");
    }
    Ok(())
}
