//! `tank bench-nfs`: tank's NFS server against nfs-ganesha exporting a plain directory of
//! the same disk, and against the engine's own sequential rate, in the same run.
//!
//! # Method
//! In the bench directory (one file system, so one disk), each run measures in turn:
//! - *engine*: a raidz2 pool of 6 file devices with a filesystem dataset at its defaults;
//!   `size` bytes written to one file through the dataset layer (`Fs`, what the NFS server
//!   calls) in 1 MiB requests with an fsync at the end, then read back;
//! - *tank NFS*: the same dataset shared over NFSv3 by a server in this process on
//!   127.0.0.1; the peer, *nfs-ganesha* (VFS FSAL) exporting a directory of the bench
//!   directory on 127.0.0.1 (it needs rpcbind running). Against each: libnfs' `nfs-cp` of a
//!   `size` file in (its source's cached pages dropped first) and back out; then the
//!   small-file load of our own client (`nfs_client.rs`, one connection): `files` files of
//!   4 KiB each created (CREATE, WRITE, COMMIT, as a copy tool's close does), read (LOOKUP,
//!   READ) and removed (REMOVE).
//!
//! Reads back come from whatever each server caches (tank's ARC, the host's page cache for
//! ganesha), alike. tank commits every change but an UNSTABLE WRITE to its intent log
//! before the reply, as NFSv3 asks; ganesha's VFS FSAL leaves metadata to the host file
//! system's own schedule, so its creates and removes are not durable at their reply: the
//! small-file ratios compare unequal promises, in ganesha's favour.
//!
//! Each figure is the median of `--runs` runs; each ratio is computed per run, then
//! medianed.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use tank_service::api::{Request, Response};
use tank_service::{Caller, Mode, Service};

use crate::fsbench::{median, pattern};
use crate::nfs_client::Rpc;
use crate::run::util::{human, parse_size};

#[derive(Args)]
pub struct NfsBenchArgs {
    /// Directory for the pool's device files, the peer's export and the copied files (one
    /// file system: one disk for all).
    #[arg(long)]
    dir: PathBuf,
    /// Bytes of the large file copied in and out.
    #[arg(long, default_value = "1G")]
    size: String,
    /// Files of the small-file load.
    #[arg(long, default_value_t = 2000)]
    files: usize,
    /// Runs; figures are medians.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Leave nfs-ganesha out.
    #[arg(long)]
    no_ganesha: bool,
    #[arg(long)]
    json: bool,
}

/// One server's figures in one run.
#[derive(Debug, Clone, Copy, Default)]
struct Figures {
    copy_in_mb_s: f64,
    copy_out_mb_s: f64,
    create_per_s: f64,
    read_per_s: f64,
    remove_per_s: f64,
}

/// Where a server serves the bench export: its NFS and MOUNT ports on 127.0.0.1, and the
/// path a client mounts.
struct Target {
    nfs_port: u16,
    mount_port: u16,
    path: String,
}

fn nfs_cp(from: &str, to: &str) -> Result<()> {
    let out = Command::new("nfs-cp")
        .args([from, to])
        .stdout(Stdio::null())
        .output()
        .context("cannot run nfs-cp (Debian: apt-get install libnfs-utils)")?;
    if !out.status.success() {
        bail!(
            "nfs-cp {from} {to}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

#[allow(unsafe_code)]
fn drop_cached(path: &Path) {
    use std::os::fd::AsRawFd;
    if let Ok(f) = std::fs::File::open(path) {
        // SAFETY: the descriptor is open for the duration of the call; posix_fadvise only
        // advises the kernel and touches no memory of ours.
        unsafe {
            libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
        }
    }
}

/// The large copy in and out, and the small-file load, against one server.
fn measure(t: &Target, src: &Path, size: u64, files: usize, scratch: &Path) -> Result<Figures> {
    let url = |name: &str| {
        format!(
            "nfs://127.0.0.1{}/{name}?version=3&nfsport={}&mountport={}",
            t.path, t.nfs_port, t.mount_port
        )
    };
    let mb = |secs: f64| size as f64 / 1e6 / secs.max(1e-9);
    drop_cached(src);
    let start = Instant::now();
    nfs_cp(&src.to_string_lossy(), &url("big"))?;
    let copy_in = mb(start.elapsed().as_secs_f64());
    let out = scratch.join("copied-out");
    let start = Instant::now();
    nfs_cp(&url("big"), &out.to_string_lossy())?;
    let copy_out = mb(start.elapsed().as_secs_f64());
    let back = std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
    let _ = std::fs::remove_file(&out);
    if back != size {
        bail!("nfs-cp copied {back} bytes back out of {size}");
    }

    let root = Rpc::connect(&format!("127.0.0.1:{}", t.mount_port))
        .context("cannot connect to MOUNT")?
        .mount(&t.path)
        .map_err(|e| anyhow::anyhow!("cannot mount {}: {e}", t.path))?;
    let mut c = Rpc::connect(&format!("127.0.0.1:{}", t.nfs_port)).context("cannot connect")?;
    let fail = |what: &str, e| anyhow::anyhow!("{what}: {e:?}");
    let _ = c.remove(&root, "big");
    let dir = c
        .mkdir(&root, "small", 0o755)
        .map_err(|e| fail("mkdir", e))?;
    let body = pattern(4096, 7);
    use nfs3_server::nfs3_types::nfs3::{createhow3, sattr3, stable_how, Nfs3Option};
    let attrs = || sattr3 {
        mode: Nfs3Option::Some(0o644),
        ..Default::default()
    };
    let rate = |start: Instant| files as f64 / start.elapsed().as_secs_f64().max(1e-9);
    let start = Instant::now();
    for i in 0..files {
        let name = format!("f{i:06}");
        let fh = c
            .create(&dir, &name, createhow3::GUARDED(attrs()))
            .map_err(|e| fail("create", e))?;
        c.write(&fh, 0, &body, stable_how::UNSTABLE)
            .map_err(|e| fail("write", e))?;
        c.commit(&fh).map_err(|e| fail("commit", e))?;
    }
    let create = rate(start);
    let start = Instant::now();
    for i in 0..files {
        let fh = c
            .lookup(&dir, &format!("f{i:06}"))
            .map_err(|e| fail("lookup", e))?;
        let (data, _) = c.read(&fh, 0, 4096).map_err(|e| fail("read", e))?;
        if data != body {
            bail!("file {i} came back different");
        }
    }
    let read = rate(start);
    let start = Instant::now();
    for i in 0..files {
        c.remove(&dir, &format!("f{i:06}"))
            .map_err(|e| fail("remove", e))?;
    }
    let remove = rate(start);
    c.rmdir(&root, "small").map_err(|e| fail("rmdir", e))?;
    Ok(Figures {
        copy_in_mb_s: copy_in,
        copy_out_mb_s: copy_out,
        create_per_s: create,
        read_per_s: read,
        remove_per_s: remove,
    })
}

/// A tank server of one pool in `work`: the service, the NFS server and the pool's name.
struct Tank {
    svc: Arc<Service>,
    server: Option<tank_nfs::NfsServer>,
}

impl Tank {
    fn start(work: &Path, size: u64) -> Result<Tank> {
        let svc = Arc::new(Service::new(&work.join("data"), Mode::Command));
        let admin = Caller::Admin {
            name: "bench".into(),
        };
        let run = |req: Request| -> Result<Response> {
            let (r, _) = svc.handle(&admin, req, None);
            r.map_err(|e| anyhow::anyhow!("{e}"))
        };
        let mut spec = vec!["raidz2".to_string()];
        for i in 0..6 {
            spec.push(work.join(format!("dev{i}")).to_string_lossy().into_owned());
        }
        // Four data devices: each holds a quarter of the file, with room for metadata,
        // the small files and the intent log.
        let per_dev = (size / 4 + (512 << 20)).max(1 << 30);
        run(Request::PoolCreate {
            name: "nfsbench".into(),
            spec,
            size: Some(per_dev),
            force: false,
            ashift: None,
        })?;
        run(Request::DatasetCreate {
            name: "nfsbench/fs".into(),
            kind: tank_dataset::DatasetKind::Filesystem,
            props: vec![],
            parents: false,
        })?;
        let mut options = BTreeMap::new();
        options.insert("clients".to_string(), "127.0.0.1".to_string());
        options.insert("squash".to_string(), "none".to_string());
        run(Request::ShareAdd {
            protocol: "nfs".into(),
            name: "bench".into(),
            dataset: "nfsbench/fs".into(),
            options,
        })?;
        let server = tank_nfs::start(svc.clone(), "127.0.0.1:0".parse()?)?;
        Ok(Tank {
            svc,
            server: Some(server),
        })
    }

    fn target(&self) -> Target {
        let addr = self.server.as_ref().map(|s| s.local_addr());
        let addr = addr.expect("the server runs until the bench ends");
        Target {
            nfs_port: addr.port(),
            mount_port: addr.port(),
            path: "/bench".into(),
        }
    }

    /// The engine's own rate on the dataset: `size` bytes written through `Fs` in 1 MiB
    /// requests with an fsync at the end, then read back. (MB/s write, MB/s read.)
    fn engine(&self, size: u64) -> Result<(f64, f64)> {
        struct Quiet;
        impl tank_service::handles::Holder for Quiet {
            fn notify(&self, _: &tank_service::handles::DatasetEvent) {}
        }
        let hold = self
            .svc
            .hold("nfsbench/fs", "benchmark", Arc::new(Quiet))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let fs = hold.fs().context("the dataset is being rolled back")?;
        let cred = tank_dataset::posix::Cred::root();
        let name = std::ffi::OsStr::new("engine.bin");
        let e = |e: tank_dataset::Errno| anyhow::anyhow!("engine file: {e}");
        let a = fs
            .create(
                &cred,
                tank_dataset::posix::ROOT_INO,
                name,
                libc::S_IFREG | 0o644,
                libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC,
            )
            .map_err(e)?;
        let chunk = pattern(1 << 20, 11);
        let start = Instant::now();
        let mut off = 0;
        while off < size {
            fs.write(&cred, a.ino, off, &chunk, false).map_err(e)?;
            off += chunk.len() as u64;
        }
        fs.fsync(a.ino, false).map_err(e)?;
        let write = off as f64 / 1e6 / start.elapsed().as_secs_f64();
        let start = Instant::now();
        let mut off = 0;
        while off < size {
            let got = fs.read(a.ino, off, 1 << 20).map_err(e)?;
            if got.is_empty() {
                break;
            }
            off += got.len() as u64;
        }
        let read = off as f64 / 1e6 / start.elapsed().as_secs_f64();
        fs.release(a.ino).map_err(e)?;
        fs.unlink(&cred, tank_dataset::posix::ROOT_INO, name)
            .map_err(e)?;
        Ok((write, read))
    }

    fn stop(mut self) {
        if let Some(s) = self.server.take() {
            s.stop();
        }
        let admin = Caller::Admin {
            name: "bench".into(),
        };
        let _ = self.svc.handle(
            &admin,
            Request::PoolDestroy {
                name: "nfsbench".into(),
            },
            None,
        );
        let _ = self.svc.shutdown(false);
    }
}

/// nfs-ganesha exporting a directory, in the foreground, stopped when dropped.
struct Ganesha {
    child: Child,
    target: Target,
}

impl Drop for Ganesha {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Why nfs-ganesha cannot be measured here, if it cannot.
fn ganesha_missing() -> Option<String> {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join("ganesha.nfsd").is_file()))
        .unwrap_or(false);
    if !found {
        return Some(
            "ganesha.nfsd is not installed (Debian: apt-get install nfs-ganesha nfs-ganesha-vfs)"
                .into(),
        );
    }
    if std::net::TcpStream::connect(("127.0.0.1", 111)).is_err() {
        return Some("it registers with rpcbind, which is not running (rpcbind -w)".into());
    }
    None
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Ganesha {
    fn start(work: &Path) -> Result<Ganesha> {
        let export = work.join("export");
        std::fs::create_dir_all(&export)?;
        let (nfs, mnt) = (free_port()?, free_port()?);
        let conf = work.join("ganesha.conf");
        let mut f = std::fs::File::create(&conf)?;
        write!(
            f,
            "NFS_CORE_PARAM {{ Bind_Addr = 127.0.0.1; NFS_Port = {nfs}; MNT_Port = {mnt}; \
             Protocols = 3; Enable_NLM = false; Enable_RQUOTA = false; Enable_UDP = false; }}\n\
             NFSV4 {{ Graceless = true; }}\n\
             EXPORT {{ Export_Id = 1; Path = {p}; Pseudo = /bench; Access_Type = RW; \
             Squash = No_Root_Squash; Protocols = 3; Transports = TCP; SecType = sys; \
             FSAL {{ Name = VFS; }} CLIENT {{ Clients = 127.0.0.1; Access_Type = RW; }} }}\n\
             LOG {{ Default_Log_Level = WARN; }}\n",
            p = export.display()
        )?;
        let child = Command::new("ganesha.nfsd")
            .args(["-F", "-f"])
            .arg(&conf)
            .arg("-L")
            .arg(work.join("ganesha.log"))
            .arg("-p")
            .arg(work.join("ganesha.pid"))
            .args(["-N", "NIV_WARN"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start ganesha.nfsd")?;
        let g = Ganesha {
            child,
            target: Target {
                nfs_port: nfs,
                mount_port: mnt,
                path: export.display().to_string(),
            },
        };
        // Ready once its MOUNT answers (it registers with rpcbind first).
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ok = Rpc::connect(&format!("127.0.0.1:{mnt}"))
                .ok()
                .is_some_and(|mut c| c.mount(&g.target.path).is_ok());
            if ok {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "nfs-ganesha did not start in 60 s (its log: {})",
                    work.join("ganesha.log").display()
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        Ok(g)
    }
}

pub fn run(a: NfsBenchArgs) -> Result<()> {
    let size = parse_size(&a.size)?.max(1 << 20);
    if a.runs == 0 || a.files == 0 {
        bail!("--runs and --files must be at least 1");
    }
    std::fs::create_dir_all(&a.dir)
        .with_context(|| format!("cannot create {}", a.dir.display()))?;
    let work = a.dir.join(format!("tank-bench-nfs-{}", std::process::id()));
    std::fs::create_dir(&work).with_context(|| format!("cannot create {}", work.display()))?;
    crate::fsbench::track(&work);
    crate::run::emulated::clean_up_on_signal();
    let result = run_in(&a, &work, size);
    let _ = std::fs::remove_dir_all(&work);
    result
}

fn run_in(a: &NfsBenchArgs, work: &Path, size: u64) -> Result<()> {
    let src = work.join("source.bin");
    {
        let mut f = std::fs::File::create(&src)?;
        let chunk = pattern(1 << 20, 5);
        let mut left = size;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            f.write_all(&chunk[..n])?;
            left -= n as u64;
        }
        f.sync_all()?;
    }
    let ganesha_why = if a.no_ganesha {
        Some("left out (--no-ganesha)".to_string())
    } else {
        ganesha_missing()
    };
    let mut tank_runs = Vec::new();
    let mut engine_runs = Vec::new();
    let mut peer_runs = Vec::new();
    for r in 0..a.runs {
        eprintln!("run {}/{}: tank ...", r + 1, a.runs);
        let tdir = work.join(format!("tank-{r}"));
        std::fs::create_dir(&tdir)?;
        let tank = Tank::start(&tdir, size)?;
        let result = (|| -> Result<(Figures, (f64, f64))> {
            let engine = tank.engine(size)?;
            let f = measure(&tank.target(), &src, size, a.files, &tdir)?;
            Ok((f, engine))
        })();
        tank.stop();
        let _ = std::fs::remove_dir_all(&tdir);
        let (f, engine) = result?;
        tank_runs.push(f);
        engine_runs.push(engine);
        if ganesha_why.is_none() {
            eprintln!("run {}/{}: nfs-ganesha ...", r + 1, a.runs);
            let gdir = work.join(format!("ganesha-{r}"));
            std::fs::create_dir(&gdir)?;
            let result =
                Ganesha::start(&gdir).and_then(|g| measure(&g.target, &src, size, a.files, &gdir));
            let _ = std::fs::remove_dir_all(&gdir);
            peer_runs.push(result?);
        }
    }
    report(a, size, &tank_runs, &engine_runs, &peer_runs, ganesha_why)
}

/// A row of the report: its label and the figure it shows.
type Row = (&'static str, fn(&Figures) -> f64);

fn report(
    a: &NfsBenchArgs,
    size: u64,
    tank: &[Figures],
    engine: &[(f64, f64)],
    peer: &[Figures],
    ganesha_why: Option<String>,
) -> Result<()> {
    let med = |v: Vec<f64>| median(&mut v.clone());
    let fig = |runs: &[Figures], f: fn(&Figures) -> f64| med(runs.iter().map(f).collect());
    let rows: [Row; 5] = [
        ("copy in (nfs-cp), MB/s", |f| f.copy_in_mb_s),
        ("copy out (nfs-cp), MB/s", |f| f.copy_out_mb_s),
        ("small files created (+write+commit)/s", |f| f.create_per_s),
        ("small files read/s", |f| f.read_per_s),
        ("small files removed/s", |f| f.remove_per_s),
    ];
    let engine_write = med(engine.iter().map(|e| e.0).collect());
    let engine_read = med(engine.iter().map(|e| e.1).collect());
    let of_engine_in = med(tank
        .iter()
        .zip(engine)
        .map(|(t, e)| t.copy_in_mb_s / e.0)
        .collect());
    let of_engine_out = med(tank
        .iter()
        .zip(engine)
        .map(|(t, e)| t.copy_out_mb_s / e.1)
        .collect());
    let ratio = |f: fn(&Figures) -> f64| -> Option<f64> {
        (!peer.is_empty()).then(|| {
            med(tank
                .iter()
                .zip(peer)
                .map(|(t, p)| f(t) / f(p).max(1e-9))
                .collect())
        })
    };
    if a.json {
        let mut out = serde_json::json!({
            "size": size, "files": a.files, "runs": a.runs,
            "engine_write_mb_s": engine_write, "engine_read_mb_s": engine_read,
            "copy_in_of_engine_write": of_engine_in, "copy_out_of_engine_read": of_engine_out,
            "ganesha": ganesha_why.clone().unwrap_or_else(|| "measured".into()),
        });
        for (name, f) in rows {
            let key = name
                .split(',')
                .next()
                .unwrap_or(name)
                .replace([' ', '(', ')', '+'], "_");
            out[format!("tank_{key}")] = serde_json::json!(fig(tank, f));
            if !peer.is_empty() {
                out[format!("ganesha_{key}")] = serde_json::json!(fig(peer, f));
                out[format!("ratio_{key}")] = serde_json::json!(ratio(f));
            }
        }
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "NFSv3 on 127.0.0.1: a {} file, {} small files of 4 KiB, median of {} run(s)",
        human(size),
        a.files,
        a.runs
    );
    println!(
        "{:<40} {:>12} {:>14} {:>8}",
        "", "tank", "nfs-ganesha", "ratio"
    );
    for (name, f) in rows {
        let (p, r) = if peer.is_empty() {
            ("-".to_string(), "-".to_string())
        } else {
            (
                format!("{:.1}", fig(peer, f)),
                format!("{:.2}x", ratio(f).unwrap_or(0.0)),
            )
        };
        println!("{name:<40} {:>12.1} {p:>14} {r:>8}", fig(tank, f));
    }
    println!(
        "engine (the dataset's Fs): write {engine_write:.1} MB/s, read {engine_read:.1} MB/s; \
         NFS copy in {of_engine_in:.2}x of its write, copy out {of_engine_out:.2}x of its read"
    );
    if let Some(why) = ganesha_why {
        println!("nfs-ganesha: not measured: {why}");
    }
    Ok(())
}
