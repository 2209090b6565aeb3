//! `tank bench-bonnie`: bonnie++ itself (Debian's package), as the reference build ran it,
//! on the mount of tank's default pool, against zfs-fuse in the same run and the same way.
//!
//! # Method
//! In the bench directory (one file system, so one disk), each run:
//! - *tank*: a data directory of its own with nothing configured. `tank serve --no-api`
//!   creates the default pool (raidz2 of six sparse device files; datasets at their
//!   defaults: 128K records, lz4) and mounts it at `DATA/mnt/tank`, as a new user gets it.
//!   bonnie++ runs in a directory of that mount; then the daemon stops and the data
//!   directory is removed.
//! - *zfs-fuse*: a raidz2 pool of six sparse device files under Debian's zfs-fuse daemon,
//!   at its defaults (compression off), mounted in the bench directory. bonnie++ runs in it;
//!   then the pool is destroyed.
//!
//! The command is `bonnie++ -q -s SIZE -r RAM -n FILES -d DIR` (with `-u root` when run as
//! root), whose last line of output is its CSV record. bonnie++ prints `+++++` for a phase
//! that took too little time to measure: such a figure is shown as such and gets no ratio.
//! Each figure is the median of `--runs` runs; each ratio is computed per run, then medianed.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::fsbench::median;
use crate::run::engine::run_cmd;
use crate::run::util::{parse_size, start_serve};

#[derive(Args)]
pub struct BonnieBenchArgs {
    /// Directory for the pools' device files and mounts (one file system: one disk).
    #[arg(long)]
    dir: PathBuf,
    /// bonnie++'s file size (`-s`).
    #[arg(long, default_value = "4G")]
    size: String,
    /// The memory bonnie++ is told the machine has (`-r`; it wants `--size` at least twice it).
    #[arg(long, default_value = "2G")]
    ram: String,
    /// bonnie++'s small-file count in multiples of 1024 (`-n`).
    #[arg(long, default_value_t = 16)]
    files: u32,
    /// Runs; figures are medians.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Leave zfs-fuse out.
    #[arg(long)]
    no_peer: bool,
}

/// The figures of a bonnie++ CSV record: (field index, name, unit, scale to the unit).
const FIGURES: [(usize, &str, &str, f64); 12] = [
    (9, "per-character write", "MB/s", 1024.0 / 1e6),
    (11, "block write", "MB/s", 1024.0 / 1e6),
    (13, "rewrite", "MB/s", 1024.0 / 1e6),
    (15, "per-character read", "MB/s", 1024.0 / 1e6),
    (17, "block read", "MB/s", 1024.0 / 1e6),
    (19, "random seeks", "/s", 1.0),
    (26, "sequential create", "/s", 1.0),
    (28, "sequential stat", "/s", 1.0),
    (30, "sequential delete", "/s", 1.0),
    (32, "random create", "/s", 1.0),
    (34, "random stat", "/s", 1.0),
    (36, "random delete", "/s", 1.0),
];

/// One run's figures, in the order of `FIGURES`; `None` where bonnie++ printed `+++++`.
type Figures = Vec<Option<f64>>;

/// The figures of bonnie++'s CSV output (its last line).
fn parse_csv(out: &str) -> Result<Figures> {
    let line = out
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .context("bonnie++ printed nothing")?;
    let fields: Vec<&str> = line.split(',').collect();
    if fields.len() <= 36 || fields[0] != "1.98" {
        bail!("not a bonnie++ 1.98 CSV record: {line}");
    }
    FIGURES
        .iter()
        .map(|(i, name, ..)| {
            let f = fields[*i].trim();
            if f.starts_with('+') {
                Ok(None)
            } else {
                f.parse::<f64>()
                    .map(Some)
                    .with_context(|| format!("bonnie++'s {name} is '{f}'"))
            }
        })
        .collect()
}

/// Runs bonnie++ in `dir`; its figures.
fn bonnie(a: &BonnieBenchArgs, dir: &Path) -> Result<Figures> {
    std::fs::create_dir_all(dir)?;
    let files = a.files.to_string();
    let d = dir.to_string_lossy();
    let mut args = vec!["-q", "-s", &a.size, "-r", &a.ram, "-n", &files, "-d", &d];
    if crate::run::iscsi::is_root() {
        args.extend(["-u", "root"]);
    }
    let out = Command::new("bonnie++")
        .args(&args)
        .output()
        .context("cannot run bonnie++ (Debian: apt-get install bonnie++)")?;
    if !out.status.success() {
        bail!(
            "bonnie++ {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    parse_csv(&String::from_utf8_lossy(&out.stdout))
}

fn tank_run(a: &BonnieBenchArgs) -> Result<Figures> {
    let data = a.dir.join("bonnie-tank");
    let _ = std::fs::remove_dir_all(&data);
    std::fs::create_dir_all(&data)?;
    let figures = {
        // Nothing configured: the daemon makes the default pool and mounts it.
        let _daemon = start_serve(&data, &["--no-api"], "\u{0}")?;
        let mnt = data.join("mnt/tank");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !mnt.join(".tank").exists() {
            if std::time::Instant::now() > deadline {
                bail!("the default pool is not mounted at {}", mnt.display());
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        bonnie(a, &mnt.join("bonnie"))
    };
    let _ = std::fs::remove_dir_all(&data);
    figures
}

const ZPOOL: &str = "bbonnie";

fn zfs_run(a: &BonnieBenchArgs) -> Result<Figures> {
    run_cmd("zpool", &["list"]).context(
        "zfs-fuse is not running: start Debian's zfs-fuse daemon (as root: zfs-fuse), or pass --no-peer",
    )?;
    let size = parse_size(&a.size)?;
    let devs: Vec<String> = (0..6)
        .map(|i| {
            a.dir
                .join(format!("bonnie-zfs-{i}"))
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    for d in &devs {
        std::fs::File::create(d)?.set_len(size + (2 << 30))?;
    }
    let mnt = a.dir.join("bonnie-zfs-mnt");
    let mnt_s = mnt.to_string_lossy().into_owned();
    let mut create = vec!["create", "-f", "-m", &mnt_s, ZPOOL, "raidz2"];
    create.extend(devs.iter().map(String::as_str));
    run_cmd("zpool", &create)?;
    let figures = bonnie(a, &mnt.join("bonnie"));
    // zfs-fuse refuses a destroy while its mount is still busy for a moment.
    let mut destroyed = Err(anyhow::anyhow!("not tried"));
    for _ in 0..20 {
        destroyed = run_cmd("zpool", &["destroy", "-f", ZPOOL]);
        if destroyed.is_ok() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    for d in &devs {
        let _ = std::fs::remove_file(d);
    }
    let _ = std::fs::remove_dir(&mnt);
    destroyed?;
    figures
}

fn show(v: Option<f64>) -> String {
    match v {
        Some(v) if v >= 100.0 => format!("{v:.0}"),
        Some(v) => format!("{v:.2}"),
        None => "+++++".into(),
    }
}

/// The median of the runs' values, if every run measured one.
fn med(values: &[Option<f64>]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().collect::<Option<Vec<f64>>>()?;
    (!v.is_empty()).then(|| median(&mut v))
}

pub fn run(a: BonnieBenchArgs) -> Result<()> {
    if a.runs == 0 {
        bail!("--runs must be at least 1");
    }
    std::fs::create_dir_all(&a.dir)?;
    let mut tank: Vec<Figures> = Vec::new();
    let mut zfs: Vec<Figures> = Vec::new();
    for r in 1..=a.runs {
        eprintln!("run {r}/{}: tank ...", a.runs);
        tank.push(tank_run(&a)?);
        if !a.no_peer {
            eprintln!("run {r}/{}: zfs-fuse ...", a.runs);
            zfs.push(zfs_run(&a)?);
        }
    }
    println!(
        "bonnie++ -s {} -r {} -n {}, median of {} runs (per run in brackets); +++++: too fast for bonnie++ to time",
        a.size, a.ram, a.files, a.runs
    );
    println!(
        "{:<22} {:>6}  {:<30} {:<30} {:>12}",
        "figure", "unit", "tank", "zfs-fuse", "tank/zfs-fuse"
    );
    for (k, (_, name, unit, scale)) in FIGURES.iter().enumerate() {
        let of = |runs: &[Figures]| -> Vec<Option<f64>> {
            runs.iter().map(|f| f[k].map(|v| v * scale)).collect()
        };
        let (t, z) = (of(&tank), of(&zfs));
        let each = |v: &[Option<f64>]| v.iter().map(|x| show(*x)).collect::<Vec<_>>().join(", ");
        let ratios: Vec<Option<f64>> = t
            .iter()
            .zip(&z)
            .map(|(t, z)| match (t, z) {
                (Some(t), Some(z)) if *z > 0.0 => Some(t / z),
                _ => None,
            })
            .collect();
        let ratio = if z.is_empty() {
            "-".to_string()
        } else {
            med(&ratios).map_or("-".into(), |r| format!("{r:.2}x"))
        };
        let cell = |v: &[Option<f64>]| {
            if v.is_empty() {
                "-".to_string()
            } else {
                format!("{} [{}]", show(med(v)), each(v))
            }
        };
        println!(
            "{:<22} {:>6}  {:<30} {:<30} {:>12}",
            name,
            unit,
            cell(&t),
            cell(&z),
            ratio
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bonnie_record_is_read_and_its_untimed_phases_kept_apart() {
        let line = "1.98,2.00a,vm,1,1795905087,4G,,8192,5,3191,92,542456,86,635734,19,5835,98,1100654,22,+++++,+++,16,,,,,17954,35,+++++,+++,28899,29,22639,34,+++++,+++,21921,27,3050us,60225us,114ms,2990us,26327us,6233us,5475us,756us,5398us,11877us,357us,6178us";
        let f = parse_csv(&format!("noise\n{line}\n")).unwrap();
        assert_eq!(f.len(), FIGURES.len());
        assert_eq!(f[1], Some(542456.0));
        assert_eq!(f[4], Some(1100654.0));
        assert_eq!(f[5], None);
        assert_eq!(f[6], Some(17954.0));
        assert_eq!(f[7], None);
        assert_eq!(f[11], Some(21921.0));
        assert!(parse_csv("").is_err());
        assert!(parse_csv("1.97,x,y").is_err());
        assert_eq!(med(&[Some(3.0), Some(1.0), Some(2.0)]), Some(2.0));
        assert_eq!(med(&[Some(3.0), None]), None);
    }
}
