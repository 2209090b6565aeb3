//! `tank send`, `tank receive` and `tank bookmark`: streams on standard output and input.
//!
//! # Theory of operation
//! With no daemon the command's own service writes the stream to standard output, or reads
//! it from standard input. Through the daemon the command passes its standard output or
//! input with the request (`fdpass.rs`) and the daemon moves the stream through it
//! directly; the command reads the daemon's progress lines (`{"progress":N}`), then the
//! reply, as for any request.
//!
//! `-v` prints, once a second and at the end, the bytes moved and the rate on standard
//! error, as `zfs send -v` does.

use std::io::{self, BufRead, BufReader, IsTerminal, Read, Write};
use std::os::fd::AsFd;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use tank_service::api::{Envelope, Reply, Request, Response, API_VERSION};
use tank_service::ServiceError;

use crate::client::{command_line, Client};
use tank_bench::run::util::human as human_bytes;

/// The buffer of the standard output or input when the command moves the stream itself.
const STDIO_BUFFER: usize = 1 << 20;

#[derive(Args)]
pub struct SendArgs {
    /// Send only what changed since this snapshot or bookmark (@snap, #mark, or full name).
    #[arg(short = 'i', value_name = "SNAP", conflicts_with = "intermediates")]
    incremental: Option<String>,
    /// As -i, with every snapshot in between.
    #[arg(short = 'I', value_name = "SNAP")]
    intermediates: Option<String>,
    /// Blocks as they are stored (compressed): a smaller stream, less work on both sides.
    #[arg(short = 'c')]
    compressed: bool,
    /// Raw: as -c (tank datasets are not encrypted, so raw and compressed are the same).
    #[arg(short = 'w')]
    raw: bool,
    /// Replicate: every descendant that has the snapshot too, each with all its snapshots
    /// (or, with -i/-I, its increments); received below the target in the same places.
    #[arg(short = 'R')]
    replicate: bool,
    /// Resume an interrupted receive from its receive_resume_token.
    #[arg(short = 't', value_name = "TOKEN", conflicts_with_all = ["incremental", "intermediates", "snapshot", "replicate"])]
    token: Option<String>,
    /// Print progress on standard error: bytes, rate, and the time left against the
    /// stream's estimated size.
    #[arg(short = 'v')]
    verbose: bool,
    /// Dry run: send nothing; say which snapshots would go and the stream's estimated size.
    #[arg(short = 'n', conflicts_with = "token")]
    dry_run: bool,
    /// With -n: the size as a bare number of bytes ("size\tBYTES").
    #[arg(short = 'P', requires = "dry_run")]
    parsable: bool,
    /// The snapshot to send (POOL/DS@SNAP).
    #[arg(required_unless_present = "token")]
    snapshot: Option<String>,
    /// Store the stream in an S3 bucket instead (s3://BUCKET/PREFIX), through --remote.
    #[arg(long, value_name = "s3://BUCKET/PREFIX", requires = "remote", conflicts_with_all = ["token", "dry_run", "replicate"])]
    to: Option<String>,
    /// The remote (tank remote add) that reaches the bucket.
    #[arg(long, value_name = "NAME")]
    remote: Option<String>,
}

#[derive(Args)]
pub struct ReceiveArgs {
    /// Roll the target back to the stream's base first (discarding what changed since).
    #[arg(short = 'F')]
    force: bool,
    /// Keep an interrupted receive, so it can go on with `tank send -t` and the target's
    /// receive_resume_token.
    #[arg(short = 's')]
    resumable: bool,
    /// Do not mount what was received.
    #[arg(short = 'u')]
    no_mount: bool,
    /// Abandon the target's unfinished receive (it goes back to its state before).
    #[arg(short = 'A', conflicts_with_all = ["force", "resumable", "props"])]
    abort: bool,
    /// Set a property on the received dataset (over what the stream carries).
    #[arg(short = 'o', value_name = "PROP=VALUE")]
    props: Vec<String>,
    /// Print progress on standard error.
    #[arg(short = 'v')]
    verbose: bool,
    /// The dataset to receive into (POOL/DS).
    dataset: String,
    /// Restore from backups in an S3 bucket instead (s3://BUCKET/PREFIX), through --remote:
    /// the chain of streams up to the newest snapshot (or --snapshot).
    #[arg(long, value_name = "s3://BUCKET/PREFIX", requires = "remote", conflicts_with_all = ["resumable", "abort", "props"])]
    from: Option<String>,
    /// The remote (tank remote add) that reaches the bucket.
    #[arg(long, value_name = "NAME")]
    remote: Option<String>,
    /// With --from: the snapshot to restore to (its short name).
    #[arg(long, value_name = "SNAP", requires = "from")]
    snapshot: Option<String>,
}

#[derive(Args)]
pub struct BookmarkArgs {
    /// The snapshot (POOL/DS@SNAP).
    snapshot: String,
    /// The bookmark (POOL/DS#MARK, or #MARK).
    bookmark: String,
}

/// Counts the bytes through it and prints the progress with `-v`.
struct Meter<T> {
    inner: T,
    bytes: u64,
    /// The expected bytes, for the time left.
    total: Option<u64>,
    start: Instant,
    last: Instant,
    verbose: bool,
    verb: &'static str,
}

impl<T> Meter<T> {
    fn new(inner: T, verbose: bool, verb: &'static str) -> Self {
        let now = Instant::now();
        Meter {
            inner,
            bytes: 0,
            total: None,
            start: now,
            last: now,
            verbose,
            verb,
        }
    }

    fn count(&mut self, n: usize) {
        self.bytes += n as u64;
        if self.verbose && self.last.elapsed().as_secs() >= 1 {
            self.last = Instant::now();
            self.report("");
        }
    }

    /// The bytes moved, as another process counted them.
    fn set(&mut self, bytes: u64) {
        self.count((bytes.saturating_sub(self.bytes)) as usize);
    }

    fn report(&self, end: &str) {
        let secs = self.start.elapsed().as_secs_f64().max(1e-3);
        let rate = self.bytes as f64 / secs;
        let left = match self.total {
            Some(t) if rate > 0.0 && t > self.bytes => {
                format!(", {:.0} s left", (t - self.bytes) as f64 / rate)
            }
            _ => String::new(),
        };
        eprintln!(
            "{} {} in {:.1} s ({}/s{left}){end}",
            self.verb,
            human_bytes(self.bytes),
            secs,
            human_bytes(rate as u64)
        );
    }
}

impl<W: Write> Write for Meter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.count(n);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<R: Read> Read for Meter<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count(n);
        Ok(n)
    }
}

fn print_notes(notes: Vec<String>) {
    for n in notes {
        eprintln!("{n}");
    }
}

/// A progress line of the daemon's (`fdpass.rs`).
#[derive(serde::Deserialize)]
struct Progress {
    progress: u64,
}

/// Sends `request` to the daemon with `fd`, the command's standard output (a send) or
/// input (a receive), then follows the daemon's progress on `meter` until its reply.
fn stream_through_daemon<T>(
    conn: &mut BufReader<std::os::unix::net::UnixStream>,
    request: Request,
    fd: std::os::fd::BorrowedFd<'_>,
    meter: &mut Meter<T>,
) -> Result<(Result<Response, ServiceError>, Vec<String>)> {
    let env = Envelope {
        version: API_VERSION,
        request,
        command: Some(command_line()),
    };
    let mut line = serde_json::to_string(&env)?;
    line.push('\n');
    crate::fdpass::send_with_fd(conn.get_ref(), line.as_bytes(), fd)
        .context("cannot send the request to the daemon")?;
    loop {
        let mut line = String::new();
        let n = conn
            .by_ref()
            .take(1 << 20)
            .read_line(&mut line)
            .context("cannot read the daemon's reply")?;
        if n == 0 {
            bail!("the daemon closed the connection without a reply");
        }
        if let Ok(p) = serde_json::from_str::<Progress>(&line) {
            meter.set(p.progress);
            continue;
        }
        return Ok(
            match serde_json::from_str::<Reply>(&line)
                .context("unreadable reply from the daemon")?
            {
                Reply::Ok { response, notes } => (Ok(response), notes),
                Reply::Error(e) => (Err(e.into()), Vec::new()),
            },
        );
    }
}

pub fn send(a: SendArgs) -> Result<()> {
    if let (Some(url), Some(remote)) = (&a.to, &a.remote) {
        let r = crate::client::call(Request::BackupSend {
            snapshot: a.snapshot.clone().unwrap_or_default(),
            from: a.intermediates.clone().or(a.incremental.clone()),
            intermediates: a.intermediates.is_some(),
            remote: remote.clone(),
            url: url.clone(),
        })?;
        if let Response::Transferred { snapshots, .. } = r {
            for s in snapshots {
                println!("stored {s}");
            }
        }
        return Ok(());
    }
    let estimate = |a: &SendArgs| -> Result<(Vec<String>, u64)> {
        match crate::client::call(Request::Send {
            snapshot: a.snapshot.clone(),
            from: a.intermediates.clone().or(a.incremental.clone()),
            intermediates: a.intermediates.is_some(),
            compressed: a.compressed || a.raw,
            replicate: a.replicate,
            token: None,
            dry_run: true,
        })? {
            Response::Transferred {
                snapshots, bytes, ..
            } => Ok((snapshots, bytes)),
            r => Err(crate::client::unexpected(r)),
        }
    };
    if a.dry_run {
        let (snapshots, bytes) = estimate(&a)?;
        if a.parsable {
            for s in &snapshots {
                println!("snapshot\t{s}");
            }
            println!("size\t{bytes}");
        } else {
            for s in &snapshots {
                println!("would send {s}");
            }
            println!("total estimated size is {}", human_bytes(bytes));
        }
        return Ok(());
    }
    let total = if a.verbose && a.token.is_none() {
        let (_, bytes) = estimate(&a)?;
        eprintln!("total estimated size is {}", human_bytes(bytes));
        Some(bytes)
    } else {
        None
    };
    if io::stdout().is_terminal() {
        bail!("refusing to write a stream to a terminal: redirect standard output (tank send ... > FILE, or | tank receive ...)");
    }
    let req = Request::Send {
        snapshot: a.snapshot,
        from: a.intermediates.clone().or(a.incremental),
        intermediates: a.intermediates.is_some(),
        compressed: a.compressed || a.raw,
        replicate: a.replicate,
        token: a.token,
        dry_run: false,
    };
    let mut out = Meter::new(
        io::BufWriter::with_capacity(STDIO_BUFFER, io::stdout()),
        a.verbose,
        "sent",
    );
    out.total = total;
    let client = Client::connect()?;
    let (r, notes) = match &client {
        Client::Local(svc) => {
            let caller = tank_service::Caller::Admin {
                name: crate::client::whoami(),
            };
            svc.send_stream(&caller, req, &mut out, Some(command_line()))
        }
        Client::Daemon(conn) => {
            let stdout = io::stdout();
            stream_through_daemon(&mut conn.lock(), req, stdout.as_fd(), &mut out)?
        }
    };
    out.flush().context("cannot write the stream")?;
    print_notes(notes);
    let resp = r?;
    if a.verbose {
        // Done: the rate, and no time left to guess.
        out.total = None;
        out.report("");
    }
    if let Response::Transferred { snapshots, .. } = &resp {
        if a.verbose {
            for s in snapshots {
                eprintln!("sent {s}");
            }
        }
    }
    client.close()
}

pub fn receive(a: ReceiveArgs) -> Result<()> {
    if a.abort {
        let r = crate::client::call(Request::ReceiveAbort { dataset: a.dataset })?;
        if let Response::Done { message } = r {
            println!("{message}");
        }
        return Ok(());
    }
    if let (Some(url), Some(remote)) = (&a.from, &a.remote) {
        let r = crate::client::call(Request::BackupRestore {
            dataset: a.dataset.clone(),
            remote: remote.clone(),
            url: url.clone(),
            snapshot: a.snapshot.clone(),
            force: a.force,
            no_mount: a.no_mount,
        })?;
        if let Response::Transferred {
            snapshots,
            rolled_back,
            ..
        } = r
        {
            for s in rolled_back {
                println!("rolled back to {s} first (-F)");
            }
            for s in snapshots {
                println!("received {s}");
            }
        }
        return Ok(());
    }
    let props = crate::cmd_dataset::parse_props(&a.props)?;
    let req = Request::Receive {
        dataset: a.dataset,
        force: a.force,
        resumable: a.resumable,
        no_mount: a.no_mount,
        props,
    };
    let mut input = Meter::new(
        io::BufReader::with_capacity(STDIO_BUFFER, io::stdin()),
        a.verbose,
        "received",
    );
    let client = Client::connect()?;
    let (r, notes) = match &client {
        Client::Local(svc) => {
            let caller = tank_service::Caller::Admin {
                name: crate::client::whoami(),
            };
            svc.receive_stream(&caller, req, &mut input, Some(command_line()))
        }
        Client::Daemon(conn) => {
            let stdin = io::stdin();
            stream_through_daemon(&mut conn.lock(), req, stdin.as_fd(), &mut input)?
        }
    };
    print_notes(notes);
    let resp = r?;
    if let Response::Transferred {
        snapshots, skipped, ..
    } = &resp
    {
        if a.verbose {
            input.report("");
        }
        for s in skipped {
            println!("skipped {s} (already there)");
        }
        for s in snapshots {
            println!("received {s}");
        }
    }
    client.close()
}

pub fn bookmark(a: BookmarkArgs) -> Result<()> {
    let bookmark = match a.bookmark.strip_prefix('#') {
        Some(mark) => {
            let ds = a.snapshot.split('@').next().unwrap_or_default();
            format!("{ds}#{mark}")
        }
        None => a.bookmark,
    };
    crate::client::call(Request::Bookmark {
        snapshot: a.snapshot,
        bookmark,
    })?;
    Ok(())
}
