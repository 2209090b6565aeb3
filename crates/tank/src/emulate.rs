//! `tank bench --emulate "7x hdd raidz2 + ssd log + ssd cache"`: a pool of emulated devices
//! (sparse files slowed to a device profile's timing), measured at the engine level.
//!
//! # Theory of operation
//! Each device is a sparse file in a temporary directory under the data directory, wrapped in
//! an `EmulatedDevice` whose timing model stretches the file's offsets over the profile's full
//! capacity (so seeks cost what they would on the real disk). The pool is built with the
//! zpool grammar, and the engine-level phases run on one object: sequential write by records
//! with a final sync, sequential read, and random 8 KiB reads. Log and cache devices are in
//! the pool; `tank bench-cache` measures the L2ARC's effect.
//! The temporary pool and files are removed at the end, also on errors.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use serde::Serialize;
use tank_bench::emulate::EmulatedBuild;
use tank_bench::fsbench::median;
use tank_device::{DeviceRef, EmulatedDevice, FileDevice, FileDeviceOptions};
use tank_pool::{CreateOptions, Pool, PoolSpec};

use crate::datadir::{data_dir, human};

#[derive(Debug, Clone, Copy, Serialize)]
pub struct EmulatedFigures {
    pub seq_output_block_mb_s: f64,
    pub seq_input_block_mb_s: f64,
    pub random_seeks_per_s: f64,
}

pub struct TempDir(pub PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Size of each stand-in device file (sparse): room for the data, its redundancy and slack.
fn device_size(build: &EmulatedBuild, size: u64) -> u64 {
    let per = size as f64 / build.data_fraction() / build.count as f64 * 1.6;
    (per as u64 + (512 << 20)).max(1 << 30)
}

/// Builds the emulated pool of `build` in `dir` (device files of `dev_size`, log and cache
/// devices of 1 GiB).
pub fn create_pool(
    build: &EmulatedBuild,
    dev_size: u64,
    dir: &std::path::Path,
) -> Result<Arc<Pool>> {
    let mut devices: HashMap<String, DeviceRef> = HashMap::new();
    let mut make =
        |name: String, profile: &tank_bench::DeviceProfile, bytes: u64| -> Result<String> {
            let path = dir.join(&name);
            let file = FileDevice::open(
                &path,
                &FileDeviceOptions {
                    create_size: Some(bytes),
                    ..Default::default()
                },
            )?;
            let dev = EmulatedDevice::new(Arc::new(file), profile.model(bytes));
            devices.insert(name.clone(), Arc::new(dev));
            Ok(name)
        };
    let mut tokens = Vec::new();
    let data: Vec<String> = (0..build.count)
        .map(|i| make(format!("data{i}"), &build.profile, dev_size))
        .collect::<Result<_>>()?;
    match build.layout.as_str() {
        "stripe" => tokens.extend(data),
        "mirror" => {
            for pair in data.chunks(2) {
                tokens.push("mirror".into());
                tokens.extend(pair.iter().cloned());
            }
        }
        layout => {
            tokens.push(layout.to_string());
            tokens.extend(data);
        }
    }
    for (k, (section, n, profile)) in build.extra.iter().enumerate() {
        tokens.push(section.clone());
        for i in 0..*n {
            tokens.push(make(format!("{section}{k}-{i}"), profile, 1 << 30)?);
        }
    }
    let spec = PoolSpec::parse(&tokens, true)?;
    let (pool, _) = Pool::create("emulated", &spec, &devices, &CreateOptions::default())?;
    Ok(pool)
}

fn one_run(
    build: &EmulatedBuild,
    size: u64,
    recordsize: u32,
    seeks: usize,
    run: usize,
) -> Result<EmulatedFigures> {
    let dir = data_dir().join(format!("emulate-{}-{run}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let tmp = TempDir(dir.clone());
    let pool = create_pool(build, device_size(build, size), &dir)?;
    let result = (|| -> Result<EmulatedFigures> {
        let store = tank_object::ObjectStore::open(pool.clone())?;
        let os = store.objset(tank_object::ROOT_OBJSET)?;
        let id = {
            let tx = store.begin(0)?;
            os.create_object(&tx, 1, recordsize)?
        };
        // Incompressible, so the devices move every logical byte.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let chunk: Vec<u8> = (0..(8usize << 20))
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect();
        let t = Instant::now();
        let mut off = 0u64;
        while off < size {
            let n = (chunk.len() as u64).min(size - off) as usize;
            let tx = store.begin(n as u64)?;
            os.write(&tx, id, off, &chunk[..n])?;
            drop(tx);
            off += n as u64;
        }
        store.sync()?;
        let write = size as f64 / t.elapsed().as_secs_f64() / 1e6;
        let t = Instant::now();
        let mut off = 0u64;
        while off < size {
            let got = os.read(id, off, 8 << 20)?;
            if got.is_empty() {
                break;
            }
            off += got.len() as u64;
        }
        let read = size as f64 / t.elapsed().as_secs_f64() / 1e6;
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let t = Instant::now();
        for _ in 0..seeks {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let at = x % (size.saturating_sub(8192) / 8192).max(1) * 8192;
            os.read(id, at, 8192)?;
        }
        let iops = seeks as f64 / t.elapsed().as_secs_f64();
        Ok(EmulatedFigures {
            seq_output_block_mb_s: write,
            seq_input_block_mb_s: read,
            random_seeks_per_s: iops,
        })
    })();
    let _ = pool.destroy();
    drop(pool);
    drop(tmp);
    result
}

pub fn run(spec: &str, size: u64, recordsize: u32, runs: usize, json: bool) -> Result<()> {
    let build = EmulatedBuild::parse(spec)?;
    let seeks = 400;
    let mut all = Vec::new();
    for r in 0..runs {
        eprintln!("run {}/{runs}: {spec}, {} ...", r + 1, human(size));
        all.push(one_run(&build, size, recordsize, seeks, r)?);
    }
    let med = |f: fn(&EmulatedFigures) -> f64| median(&mut all.iter().map(f).collect::<Vec<_>>());
    let result = EmulatedFigures {
        seq_output_block_mb_s: med(|f| f.seq_output_block_mb_s),
        seq_input_block_mb_s: med(|f| f.seq_input_block_mb_s),
        random_seeks_per_s: med(|f| f.random_seeks_per_s),
    };
    let p = &build.profile;
    if json {
        let out = serde_json::json!({"emulate": spec, "size": size, "recordsize": recordsize, "runs": runs,
            "median": result, "device_profile": p});
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "emulated {spec}: {} per run, record {}, median of {runs} (engine level)",
        human(size),
        human(u64::from(recordsize))
    );
    println!(
        "  Seq output block   {:>8.1} MB/s",
        result.seq_output_block_mb_s
    );
    println!(
        "  Seq input block    {:>8.1} MB/s",
        result.seq_input_block_mb_s
    );
    println!(
        "  Random seeks       {:>8.1} /s (8 KiB reads)",
        result.random_seeks_per_s
    );
    println!(
        "  device profile: {} — {:.0} MB/s, {:.0} random 8 KiB reads/s",
        p.name,
        p.read_bw / 1e6,
        p.random_read_iops(8192)
    );
    if !build.extra.is_empty() {
        println!("  log and cache devices are in the pool; 'tank bench-cache' measures what the cache device buys");
    }
    Ok(())
}
