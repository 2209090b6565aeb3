//! The CLI's way to the service: the daemon's local socket when it answers, else a
//! service of this command's own.
//!
//! # Theory of operation
//! Every command that reads or changes pools, datasets, accounts or shares builds a typed
//! request (`tank_service::api`) and renders the typed response; one code path serves
//! both the human output and `--json`. [`Client::connect`] tries the socket first: there
//! the daemon, which holds the pools, runs the request for the caller the kernel names
//! (SO_PEERCRED). With no daemon the command runs the same service in this process
//! ([`Mode::Command`]): it opens the pools the requests name, and [`Client::close`] syncs
//! and closes them when the command is done. Notes that come with a response (warnings
//! beside a result) go to standard error, as the command's own would.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use parking_lot::Mutex;
use tank_service::api::{Envelope, Reply, Request, Response, API_VERSION};
use tank_service::{Caller, Mode, Service, ServiceError};

use crate::datadir::data_dir;

pub fn socket_path() -> PathBuf {
    data_dir().join("tank.sock")
}

/// Longest reply line a client reads (a listing of every dataset, a debug dump).
const MAX_REPLY_BYTES: u64 = 256 << 20;

pub enum Client {
    Daemon(Mutex<BufReader<UnixStream>>),
    Local(Arc<Service>),
}

/// The command line as typed, for the pool history.
pub fn command_line() -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    format!("tank {}", args.join(" "))
}

impl Client {
    /// The daemon if its socket answers, else a service in this process.
    pub fn connect() -> Result<Client> {
        if let Some(c) = Self::daemon()? {
            return Ok(c);
        }
        Ok(Self::local())
    }

    /// The daemon, if one answers.
    pub fn daemon() -> Result<Option<Client>> {
        match UnixStream::connect(socket_path()) {
            Ok(s) => Ok(Some(Client::Daemon(Mutex::new(BufReader::new(s))))),
            Err(_) => Ok(None),
        }
    }

    /// A service of this command's own (no daemon runs), with the FUSE front end.
    pub fn local() -> Client {
        let svc = Service::new(&data_dir(), Mode::Command);
        svc.mounts.set_mounter(Arc::new(tank_fuse::FuseMounter));
        svc.set_benchmark(Arc::new(tank_bench::run::fs::ServiceBench));
        svc.set_bucket_connector(Arc::new(tank_s3::client::S3Connector));
        svc.set_planner(Arc::new(tank_bench::run::plan::ServicePlanner));
        Client::Local(Arc::new(svc))
    }

    pub fn is_daemon(&self) -> bool {
        matches!(self, Client::Daemon(_))
    }

    /// The in-process service, when there is no daemon.
    pub fn service(&self) -> Option<&Arc<Service>> {
        match self {
            Client::Local(s) => Some(s),
            Client::Daemon(_) => None,
        }
    }

    /// Sends a request; notes that come back are printed on standard error.
    pub fn call(&self, req: Request) -> Result<Response> {
        let (r, notes) = self.call_quiet(req)?;
        for n in notes {
            eprintln!("{n}");
        }
        r.map_err(anyhow::Error::from)
    }

    /// Sends a request; returns the response (or the service's error) and the notes.
    pub fn call_quiet(
        &self,
        req: Request,
    ) -> Result<(std::result::Result<Response, ServiceError>, Vec<String>)> {
        match self {
            Client::Local(svc) => {
                // This process's user: the files' permissions already decide what it may
                // open, as for any tool on the pool's devices.
                let caller = Caller::Admin { name: whoami() };
                Ok(svc.handle(&caller, req, Some(command_line())))
            }
            Client::Daemon(stream) => {
                let mut stream = stream.lock();
                let env = Envelope {
                    version: API_VERSION,
                    request: req,
                    command: Some(command_line()),
                };
                let mut line = serde_json::to_string(&env)?;
                line.push('\n');
                stream
                    .get_mut()
                    .write_all(line.as_bytes())
                    .context("cannot send the request to the daemon")?;
                let mut reply = String::new();
                let n = (&mut *stream)
                    .take(MAX_REPLY_BYTES)
                    .read_line(&mut reply)
                    .context("cannot read the daemon's reply")?;
                if n == 0 {
                    anyhow::bail!("the daemon closed the connection without a reply");
                }
                let reply: Reply = serde_json::from_str(&reply).with_context(|| {
                    format!(
                        "unreadable reply from the daemon at {}",
                        socket_path().display()
                    )
                })?;
                Ok(match reply {
                    Reply::Ok { response, notes } => (Ok(response), notes),
                    Reply::Error(e) => (Err(e.into()), Vec::new()),
                })
            }
        }
    }

    /// Ends the command: a service of this command's own syncs and closes its pools.
    pub fn close(self) -> Result<()> {
        if let Client::Local(svc) = self {
            let problems = svc.shutdown(false);
            if !problems.is_empty() {
                anyhow::bail!("{}", problems.join("; "));
            }
        }
        Ok(())
    }
}

pub fn whoami() -> String {
    nix::unistd::User::from_uid(nix::unistd::getuid())
        .ok()
        .flatten()
        .map_or_else(|| format!("uid {}", nix::unistd::getuid()), |u| u.name)
}

/// Runs `f` with a client, and closes the client after (also when `f` failed).
pub fn with_client<T>(f: impl FnOnce(&Client) -> Result<T>) -> Result<T> {
    let c = Client::connect()?;
    let r = f(&c);
    let closed = c.close();
    let v = r?;
    closed?;
    Ok(v)
}

/// Sends one request with a new client.
pub fn call(req: Request) -> Result<Response> {
    with_client(|c| c.call(req))
}

/// An unexpected response kind (a daemon of another build).
pub fn unexpected(r: Response) -> anyhow::Error {
    anyhow::anyhow!("unexpected response from the service: {r:?}")
}
