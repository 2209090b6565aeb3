//! `tank send`, `tank receive` and `tank bookmark`: streams on standard output and input.
//!
//! # Theory of operation
//! With no daemon the command's own service writes the stream to standard output, or reads
//! it from standard input. Through the daemon the stream crosses the socket in frames
//! ([`FrameWriter`], [`FrameReader`]): after the request line, frames of a u32 LE length
//! and that many bytes, ended by a frame of length 0; then the reply line, as for any
//! request. A sender that fails midway ends its frames at once, so the reply always comes.
//! A daemon that stops reading a receive (a refused stream) replies and closes the
//! connection; the command stops sending and reads the reply.
//!
//! `-v` prints, once a second and at the end, the bytes moved and the rate on standard
//! error, as `zfs send -v` does.

use std::io::{self, BufRead, BufReader, IsTerminal, Read, Write};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use tank_service::api::{Envelope, Reply, Request, Response, API_VERSION};
use tank_service::ServiceError;

use crate::client::{command_line, Client};
use tank_bench::run::util::human as human_bytes;

/// Largest frame written.
pub const FRAME_MAX: usize = 1 << 20;

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

/// Writes a stream as frames (see the module documentation).
pub struct FrameWriter<W: Write> {
    out: W,
    buf: Vec<u8>,
}

impl<W: Write> FrameWriter<W> {
    pub fn new(out: W) -> Self {
        FrameWriter {
            out,
            buf: Vec::with_capacity(FRAME_MAX),
        }
    }

    fn emit(&mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            self.out.write_all(&(self.buf.len() as u32).to_le_bytes())?;
            self.out.write_all(&self.buf)?;
            self.buf.clear();
        }
        Ok(())
    }

    /// Ends the frames (the last one is empty); the writer goes back for the reply.
    pub fn finish(mut self) -> io::Result<W> {
        self.emit()?;
        self.out.write_all(&0u32.to_le_bytes())?;
        self.out.flush()?;
        Ok(self.out)
    }
}

impl<W: Write> Write for FrameWriter<W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = data.len().min(FRAME_MAX - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == FRAME_MAX {
            self.emit()?;
        }
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.emit()?;
        self.out.flush()
    }
}

/// Reads a framed stream: the bytes of the frames, then the end of input at the empty one.
pub struct FrameReader<R: Read> {
    input: R,
    left: usize,
    done: bool,
}

impl<R: Read> FrameReader<R> {
    pub fn new(input: R) -> Self {
        FrameReader {
            input,
            left: 0,
            done: false,
        }
    }

    /// Whether the empty frame that ends the stream was read.
    pub fn is_done(&self) -> bool {
        self.done
    }
}

impl<R: Read> Read for FrameReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.done || buf.is_empty() {
            return Ok(0);
        }
        if self.left == 0 {
            let mut len = [0u8; 4];
            self.input.read_exact(&mut len)?;
            let len = u32::from_le_bytes(len) as usize;
            if len == 0 {
                self.done = true;
                return Ok(0);
            }
            if len > FRAME_MAX {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("stream frame of {len} bytes (at most {FRAME_MAX})"),
                ));
            }
            self.left = len;
        }
        let want = buf.len().min(self.left);
        let n = self.input.read(&mut buf[..want])?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        self.left -= n;
        Ok(n)
    }
}

fn print_notes(notes: Vec<String>) {
    for n in notes {
        eprintln!("{n}");
    }
}

fn read_reply(
    stream: &mut BufReader<std::os::unix::net::UnixStream>,
) -> Result<(Result<Response, ServiceError>, Vec<String>)> {
    let mut line = String::new();
    let n = stream
        .by_ref()
        .take(1 << 20)
        .read_line(&mut line)
        .context("cannot read the daemon's reply")?;
    if n == 0 {
        bail!("the daemon closed the connection without a reply");
    }
    Ok(
        match serde_json::from_str::<Reply>(&line).context("unreadable reply from the daemon")? {
            Reply::Ok { response, notes } => (Ok(response), notes),
            Reply::Error(e) => (Err(e.into()), Vec::new()),
        },
    )
}

fn send_request(stream: &mut std::os::unix::net::UnixStream, request: Request) -> Result<()> {
    let env = Envelope {
        version: API_VERSION,
        request,
        command: Some(command_line()),
    };
    let mut line = serde_json::to_string(&env)?;
    line.push('\n');
    stream
        .write_all(line.as_bytes())
        .context("cannot send the request to the daemon")
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
    let stdout = io::stdout().lock();
    let mut out = Meter::new(
        io::BufWriter::with_capacity(FRAME_MAX, stdout),
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
            let mut conn = conn.lock();
            send_request(conn.get_mut(), req)?;
            let mut frames = FrameReader::new(&mut *conn);
            let copied = io::copy(&mut frames, &mut out);
            let done = frames.is_done();
            let reply = read_reply(&mut conn);
            match (copied, reply) {
                (_, Ok(reply)) if done => reply,
                (Err(e), _) => return Err(e).context("cannot write the stream"),
                (Ok(_), Err(e)) => return Err(e),
                (Ok(_), Ok(_)) => bail!("the daemon ended the stream without its last frame"),
            }
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
    let stdin = io::stdin().lock();
    let mut input = Meter::new(
        io::BufReader::with_capacity(FRAME_MAX, stdin),
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
            let mut conn = conn.lock();
            send_request(conn.get_mut(), req)?;
            // A daemon that refuses the stream midway replies and closes: the copy then
            // fails, and the reply says why.
            let writer = conn.get_mut().try_clone()?;
            let mut frames = FrameWriter::new(writer);
            let copied = io::copy(&mut input, &mut frames).and_then(|_| frames.finish().map(drop));
            match (read_reply(&mut conn), copied) {
                (Ok(reply), _) => reply,
                (Err(e), Err(c)) => return Err(e).context(format!("cannot send the stream: {c}")),
                (Err(e), Ok(())) => return Err(e),
            }
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
