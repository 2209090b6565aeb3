//! `tank bench-smb`: tank's SMB shares against Samba serving a plain directory of the same
//! disk, in the same run.
//!
//! # Method
//! In the bench directory (one file system, so one disk), each run measures in turn:
//! - *tank*: `tank serve --smb 127.0.0.1:PORT` on a data directory of its own (its default
//!   pool: raidz2 of 6 file devices), a dataset at its defaults shared over SMB to one
//!   account, served by the smbd tank supervises through the dataset's FUSE mount;
//! - *Samba on the host file system*: the same smbd with the configuration tank generated
//!   (the same global options, share options and accounts, copied with tank's user files),
//!   its share's path a plain directory of the bench directory.
//!
//! Against each, with Samba's `smbclient` (SMB3, one connection per command): a `size` file
//! put and got back (to /dev/null), then `files` files of 4 KiB put with `mput` into a new
//! directory, got back with `mget` and deleted with `del`. Each figure is the command's
//! wall time, connection included. Both servers run with `strict sync`, so a client's flush
//! is a sync on both; smbclient sends none. Reads come from each server's cache (tank's
//! ARC, the host's page cache for the peer), alike.
//!
//! Before and after each server's measurements every file system is synced (sync(1)), so
//! that neither pays for writing back what the other left in the page cache.
//!
//! Each figure is the median of `--runs` runs; each ratio is computed per run, then
//! medianed.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::fsbench::median;
use crate::run::util::{free_port, human, parse_size, start_serve, tank_cli, Daemon};

#[derive(Args)]
pub struct SmbBenchArgs {
    /// Directory for tank's data directory, the peer's share and the files copied (one file
    /// system: one disk for all).
    #[arg(long)]
    dir: PathBuf,
    /// Bytes of the large file put and got.
    #[arg(long, default_value = "1G")]
    size: String,
    /// Files of the small-file load.
    #[arg(long, default_value_t = 2000)]
    files: usize,
    /// Runs; figures are medians.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Leave the peer (Samba on the host file system) out.
    #[arg(long)]
    no_peer: bool,
}

/// One server's figures in one run.
#[derive(Debug, Clone, Copy, Default)]
struct Figures {
    put_mb_s: f64,
    get_mb_s: f64,
    create_per_s: f64,
    read_per_s: f64,
    delete_per_s: f64,
}

const USER: &str = "bench";
const PASSWORD: &str = "bench-password-1";
const SHARE: &str = "bench";

/// Runs smbclient against `port` in `cwd`: its time, or why it failed.
fn smbclient(port: u16, cwd: &Path, commands: &str) -> Result<Duration> {
    let started = Instant::now();
    let out = Command::new("smbclient")
        .args(["-s", "/dev/null", "-p", &port.to_string(), "-m", "SMB3"])
        .arg(format!("//127.0.0.1/{SHARE}"))
        .args(["-U", &format!("{USER}%{PASSWORD}"), "-c", commands])
        .current_dir(cwd)
        .output()
        .context("cannot run smbclient (apt-get install smbclient)")?;
    let took = started.elapsed();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() || text.contains("NT_STATUS_") {
        bail!("smbclient {commands:?}: {}", text.trim());
    }
    Ok(took)
}

/// Waits until the share answers.
fn wait_for_share(port: u16, cwd: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match smbclient(port, cwd, "ls") {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(300)),
        }
    }
}

/// Starts `tank serve --smb` on `data` with the bench share: the daemon and smbd's port.
fn start_tank(data: &Path) -> Result<(Daemon, u16)> {
    let port = free_port()?;
    let daemon = start_serve(
        data,
        &["--no-api", "--smb", &format!("127.0.0.1:{port}")],
        "warning: cannot serve SMB",
    )?;
    tank_cli(data, &["user", "add", USER], Some(&format!("{PASSWORD}\n")))?;
    tank_cli(data, &["dataset", "create", "tank/bench"], None)?;
    let uid = tank_uid(data)?;
    std::os::unix::fs::chown(data.join("mnt/tank/bench"), Some(uid), None)?;
    tank_cli(
        data,
        &[
            "share",
            "add",
            "smb",
            SHARE,
            "tank/bench",
            "-o",
            &format!("users={USER}"),
        ],
        None,
    )?;
    Ok((daemon, port))
}

/// The bench account's uid.
fn tank_uid(data: &Path) -> Result<u32> {
    let list: serde_json::Value =
        serde_json::from_str(&tank_cli(data, &["user", "list", "--json"], None)?)?;
    list.as_array()
        .and_then(|a| a.iter().find(|u| u["name"] == USER))
        .and_then(|u| u["uid"].as_u64())
        .map(|u| u as u32)
        .context("the bench account has no uid")
}

/// Copies tank's generated Samba files (`DATA_DIR/smb`) into `peer`, laid out the same
/// way, for a peer that serves with tank's very configuration: each share's path becomes
/// `share_dir(its path under tank)`, the port `port`. smbd is then started on `peer`
/// with `tank_smb::plain_smbd`.
pub fn make_peer(
    tank_smb: &Path,
    peer: &Path,
    port: u16,
    share_dir: impl Fn(&str) -> PathBuf,
) -> Result<()> {
    for d in ["private", "lock", "state", "cache", "run", "log"] {
        std::fs::create_dir_all(peer.join(d))?;
    }
    for f in ["passwd", "group", "private/smbpasswd"] {
        std::fs::copy(tank_smb.join(f), peer.join(f))
            .with_context(|| format!("cannot copy tank's {f}"))?;
    }
    let conf = std::fs::read_to_string(tank_smb.join("smb.conf"))?;
    let from = format!("{}/", tank_smb.display());
    let to = format!("{}/", peer.display());
    let mut out = String::new();
    for line in conf.lines() {
        let t = line.trim_start();
        let line = if let Some(path) = t.strip_prefix("path = ") {
            format!("\tpath = {}", share_dir(path).display())
        } else if t.starts_with("smb ports = ") {
            format!("\tsmb ports = {port}")
        } else {
            line.replace(&from, &to)
        };
        out.push_str(&line);
        out.push('\n');
    }
    std::fs::write(peer.join("smb.conf"), out)?;
    Ok(())
}

/// Writes every file system's dirty pages back (sync(1)), so that what one server left in
/// the host's page cache is not written back while the next one is measured.
fn settle() {
    let _ = Command::new("sync").status();
}

/// The five figures against the share at `port`.
fn measure(port: u16, work: &Path, big: &Path, small: &Path, a: &SmbBenchArgs) -> Result<Figures> {
    settle();
    let size = std::fs::metadata(big)?.len() as f64;
    let mb_s = |t: Duration| size / 1e6 / t.as_secs_f64().max(1e-9);
    let per_s = |t: Duration| a.files as f64 / t.as_secs_f64().max(1e-9);
    let name = big.file_name().context("name")?.to_string_lossy();
    let put = smbclient(port, work, &format!("put {name}"))?;
    let get = smbclient(port, work, &format!("get {name} /dev/null"))?;
    let small_name = small.file_name().context("name")?.to_string_lossy();
    let back = work.join("back");
    let _ = std::fs::remove_dir_all(&back);
    std::fs::create_dir_all(&back)?;
    let create = smbclient(
        port,
        work,
        &format!("prompt off; mkdir s; cd s; lcd {small_name}; mput *"),
    )?;
    let read = smbclient(port, work, "prompt off; cd s; lcd back; mget *")?;
    let got = std::fs::read_dir(&back)?.count();
    if got != a.files {
        bail!("mget brought back {got} of {} files", a.files);
    }
    let delete = smbclient(port, work, "cd s; del *")?;
    smbclient(port, work, &format!("rmdir s; del {name}"))?;
    settle();
    Ok(Figures {
        put_mb_s: mb_s(put),
        get_mb_s: mb_s(get),
        create_per_s: per_s(create),
        read_per_s: per_s(read),
        delete_per_s: per_s(delete),
    })
}

/// Writes the large file and the small files the clients send.
fn make_sources(work: &Path, size: u64, files: usize) -> Result<(PathBuf, PathBuf)> {
    use std::io::Write;
    let big = work.join("big.bin");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&big)?);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut buf = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        for w in buf.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            w.copy_from_slice(&x.to_le_bytes());
        }
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n])?;
        left -= n as u64;
    }
    f.flush()?;
    let small = work.join("small");
    std::fs::create_dir_all(&small)?;
    for i in 0..files {
        std::fs::write(
            small.join(format!("f{i:06}")),
            &buf[(i % 255) * 4096..][..4096],
        )?;
    }
    Ok((big, small))
}

pub fn run(a: SmbBenchArgs) -> Result<()> {
    let size = parse_size(&a.size)?;
    if size == 0 || a.files == 0 || a.runs == 0 {
        bail!("--size, --files and --runs must be above 0");
    }
    std::fs::create_dir_all(&a.dir)?;
    let mut tank_runs = Vec::new();
    let mut peer_runs = Vec::new();
    for r in 0..a.runs {
        let work = a.dir.join(format!("bench-smb-{r}"));
        let _ = std::fs::remove_dir_all(&work);
        std::fs::create_dir_all(&work)?;
        let (big, small) = make_sources(&work, size, a.files)?;
        let data = work.join("tank-data");
        let peer_dir = work.join("peer-smb");
        let peer_share = work.join("peer-share");
        let peer_port = free_port()?;
        eprintln!("run {}/{}: tank ...", r + 1, a.runs);
        {
            let (_daemon, port) = start_tank(&data)?;
            wait_for_share(port, &work)?;
            let f = measure(port, &work, &big, &small, &a)?;
            eprintln!("  tank: {f:.1?}");
            tank_runs.push(f);
            make_peer(&data.join("smb"), &peer_dir, peer_port, |_| {
                peer_share.clone()
            })?;
        }
        if !a.no_peer {
            eprintln!(
                "run {}/{}: Samba on the host file system ...",
                r + 1,
                a.runs
            );
            std::fs::create_dir_all(&peer_share)?;
            let owner = passwd_uid(&peer_dir.join("passwd"))?;
            std::os::unix::fs::chown(&peer_share, Some(owner), None)?;
            let mut cmd = tank_smb::plain_smbd(&peer_dir)?;
            let _peer = Daemon(
                cmd.stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .context("cannot start smbd")?,
            );
            wait_for_share(peer_port, &work)?;
            let f = measure(peer_port, &work, &big, &small, &a)?;
            eprintln!("  Samba: {f:.1?}");
            peer_runs.push(f);
        }
        let _ = std::fs::remove_dir_all(&work);
    }
    report(&a, size, &tank_runs, &peer_runs);
    Ok(())
}

/// The bench account's uid in an nss_wrapper passwd file.
fn passwd_uid(path: &Path) -> Result<u32> {
    std::fs::read_to_string(path)?
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.first() == Some(&USER)).then(|| f.get(2)?.parse().ok())?
        })
        .context("the bench account is not in smbd's passwd file")
}

fn report(a: &SmbBenchArgs, size: u64, tank: &[Figures], peer: &[Figures]) {
    println!(
        "SMB on 127.0.0.1 (smbclient, SMB3): {} put and got, {} files of 4 KiB; median of {} run(s)",
        human(size),
        a.files,
        a.runs
    );
    println!(
        "{:<26} {:>10} {:>10} {:>8}",
        "figure", "tank", "Samba", "ratio"
    );
    type Figure = fn(&Figures) -> f64;
    let rows: [(&str, Figure); 5] = [
        ("put, MB/s", |f| f.put_mb_s),
        ("get, MB/s", |f| f.get_mb_s),
        ("small files put /s", |f| f.create_per_s),
        ("small files got /s", |f| f.read_per_s),
        ("small files deleted /s", |f| f.delete_per_s),
    ];
    for (name, f) in rows {
        let med = |runs: &[Figures]| {
            let mut v: Vec<f64> = runs.iter().map(f).collect();
            median(&mut v)
        };
        let t = med(tank);
        let ratio = if peer.is_empty() {
            "-".to_string()
        } else {
            let mut v: Vec<f64> = tank
                .iter()
                .zip(peer)
                .map(|(t, p)| f(t) / f(p).max(1e-9))
                .collect();
            format!("{:.2}x", median(&mut v))
        };
        let peer_col = if peer.is_empty() {
            "-".to_string()
        } else {
            format!("{:.1}", med(peer))
        };
        println!("{name:<26} {t:>10.1} {peer_col:>10} {ratio:>8}");
    }
    if a.no_peer {
        println!("Samba on the host file system: not measured (--no-peer)");
    }
}
