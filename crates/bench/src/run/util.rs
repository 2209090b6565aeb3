//! What the runners share: the data directory (where their scratch directories and the
//! benchmark history go), the parsers of sizes and record sizes, and the servers they start
//! as processes (`tank serve` and its peers): a free port, `tank` commands on a data
//! directory, a process ended when dropped.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// A server process, ended when dropped: SIGTERM, then SIGKILL after 60 s.
pub struct Daemon(pub Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A TCP port free on 127.0.0.1 now.
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Runs this program as `tank ARGS` on the data directory `data`, `stdin` written to it:
/// its output, or its error.
pub fn tank_cli(data: &Path, args: &[&str], stdin: Option<&str>) -> Result<String> {
    use std::io::Write;
    let exe = std::env::current_exe().context("cannot find the tank program")?;
    let mut child = Command::new(exe)
        .args(args)
        .env("TANK_DATA_DIR", data)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    if let Some(s) = stdin {
        child
            .stdin
            .take()
            .context("piped")?
            .write_all(s.as_bytes())?;
    }
    drop(child.stdin.take());
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "tank {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Starts `tank serve ARGS` on `data` and returns once it listens (the rest of its output
/// is read and dropped); a line starting with `refuse` (a front end it cannot serve) is
/// its error.
pub fn start_serve(data: &Path, args: &[&str], refuse: &str) -> Result<Daemon> {
    let exe = std::env::current_exe().context("cannot find the tank program")?;
    let mut child = Command::new(&exe)
        .arg("serve")
        .args(args)
        .env("TANK_DATA_DIR", data)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("cannot start tank serve")?;
    let mut out = std::io::BufReader::new(child.stdout.take().context("piped")?);
    let daemon = Daemon(child);
    let mut line = String::new();
    let mut ready = false;
    while out.read_line(&mut line).unwrap_or(0) > 0 {
        if line.starts_with(refuse) {
            bail!("{}", line.trim());
        }
        if line.starts_with("listening on ") {
            ready = true;
            break;
        }
        line.clear();
    }
    if !ready {
        bail!("tank serve did not start");
    }
    std::thread::spawn(move || {
        let mut sink = String::new();
        while out.read_line(&mut sink).unwrap_or(0) > 0 {
            sink.clear();
        }
    });
    Ok(daemon)
}

static DATA_DIR: OnceLock<PathBuf> = OnceLock::new();

/// Sets the data directory the runners use (the binary's, resolved once at its start).
pub fn set_data_dir(dir: PathBuf) {
    let _ = DATA_DIR.set(dir);
}

/// The data directory: as set, else `$TANK_DATA_DIR` or `./tank-data`, made absolute.
pub fn data_dir() -> PathBuf {
    DATA_DIR
        .get_or_init(|| {
            let dir = std::env::var_os("TANK_DATA_DIR")
                .filter(|d| !d.is_empty())
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("tank-data"));
            std::path::absolute(&dir).unwrap_or(dir)
        })
        .clone()
}

/// Parses a size such as `512`, `64K`, `1.5G`, `16GiB` (powers of 1024).
pub fn parse_size(s: &str) -> Result<u64> {
    tank_dataset::props::parse_size(s, false).map_err(|e| anyhow::anyhow!(e))
}

/// The largest record size of a dataset (and so of anything measured through one).
pub const DATASET_MAX_RECORD: u64 = 1 << 20;

/// A record size for the benchmarks: a power of two from 512 bytes to `max`.
pub fn parse_recordsize(s: &str, max: u64) -> Result<u32> {
    let r = parse_size(s)?;
    if !r.is_power_of_two() || !(512..=max).contains(&r) {
        anyhow::bail!(
            "invalid record size '{s}': a power of two from 512 to {}",
            human(max)
        );
    }
    Ok(r as u32)
}

/// Bytes as zpool shows them: 1.50G, 512M, 4K (below 1K without a unit).
pub fn human(bytes: u64) -> String {
    if bytes < 1024 {
        bytes.to_string()
    } else {
        tank_dataset::props::human(bytes)
    }
}
