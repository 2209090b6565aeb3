//! `tank demo`: the one-command start. Creates the default pool (six sparse file devices in
//! raidz2 under the data directory, at least 16 GiB usable) if it is not there, stores data
//! through it, reads it back verified, and shows the pool.

use std::time::Instant;

use anyhow::{bail, Result};
use clap::Args;
use rand::{RngCore, SeedableRng};
use tank_pool::{CreateOptions, Pool, PoolSpec};

use crate::datadir::{data_dir, human, parse_size, PoolCache};
use tank_service::pools::{cache_entry, open_datasets, open_for_create};

pub const DEFAULT_POOL: &str = "tank";
/// Each default device: 4.5 GiB sparse, so 6 in raidz2 give 4 x ~4.5 GiB > 16 GiB usable.
pub const DEFAULT_DEVICE_SIZE: u64 = 4608 << 20;

#[derive(Args)]
pub struct DemoArgs {
    /// Bytes of test data to write and read back.
    #[arg(long, default_value = "256M")]
    size: String,
}

/// The default pool's root filesystem is mounted here: `DATA_DIR/mnt/tank`.
pub fn default_mountpoint() -> std::path::PathBuf {
    data_dir().join("mnt").join(DEFAULT_POOL)
}

/// Creates the default pool when the cache file does not list it: six sparse file devices in
/// raidz2 under `DATA_DIR/devices`, its root filesystem's mountpoint `DATA_DIR/mnt/tank`.
/// All or nothing: the pool enters the cache file only once it is complete, and a failure
/// before that removes the device files it made, so the next start begins afresh. Returns
/// whether it created the pool.
pub fn ensure_default_pool() -> Result<bool> {
    let dir = data_dir();
    if PoolCache::load(&dir)?.find(DEFAULT_POOL).is_some() {
        return Ok(false);
    }
    let devdir = dir.join("devices");
    let names: Vec<String> = (0..6)
        .map(|i| {
            devdir
                .join(format!("disk{i}"))
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    if names.iter().any(|n| std::path::Path::new(n).exists()) {
        bail!(
            "the default pool's device files exist in {} but the pool is not imported; run 'tank pool import {DEFAULT_POOL}' (or remove the files)",
            devdir.display()
        );
    }
    let made = create_default_pool(&names);
    if made.is_err() {
        for n in &names {
            let _ = std::fs::remove_file(n);
        }
    }
    made?;
    Ok(true)
}

fn create_default_pool(names: &[String]) -> Result<()> {
    let dir = data_dir();
    let mut tokens = vec!["raidz2".to_string()];
    tokens.extend(names.iter().cloned());
    let spec = PoolSpec::parse(&tokens, false)?;
    let devices = open_for_create(names, Some(DEFAULT_DEVICE_SIZE))?;
    let opts = CreateOptions {
        host: tank_service::pools::host_identity(&dir)?,
        ..Default::default()
    };
    let (pool, _) = Pool::create(DEFAULT_POOL, &spec, &devices, &opts)?;
    let made = (|| -> Result<()> {
        pool.log_history("tank (create the default pool)");
        let (store, dsl) = open_datasets(&pool)?;
        set_default_mountpoint(&dsl)?;
        store.sync()?;
        Ok(())
    })();
    let closed = pool.shutdown();
    made?;
    closed?;
    let mut cache = PoolCache::load(&dir)?;
    cache.upsert(cache_entry(&pool));
    cache.save(&dir)?;
    Ok(())
}

fn set_default_mountpoint(dsl: &tank_dataset::Dsl) -> Result<()> {
    dsl.run(tank_dataset::Op::SetProps {
        name: DEFAULT_POOL.into(),
        props: vec![(
            "mountpoint".into(),
            Some(default_mountpoint().to_string_lossy().into_owned()),
        )],
    })?;
    Ok(())
}

/// Finishes the set-up of a default pool that an earlier start left without a mountpoint
/// (its root's `mountpoint` never set: source `default`). A mountpoint the administrator set,
/// `none` included, is left alone. Returns the mountpoint it set, if it did.
pub fn finish_default_pool(dsl: &tank_dataset::Dsl) -> Result<Option<std::path::PathBuf>> {
    let root = dsl.resolve(DEFAULT_POOL)?;
    let info = dsl.info(root)?;
    let never_set = info
        .props
        .iter()
        .any(|(n, _, source)| n == "mountpoint" && source == "default");
    if !never_set {
        return Ok(None);
    }
    set_default_mountpoint(dsl)?;
    Ok(Some(default_mountpoint()))
}

pub fn run(a: DemoArgs) -> Result<()> {
    let size = parse_size(&a.size)?;
    let dir = data_dir();
    if ensure_default_pool()? {
        outln!(
            "created pool '{DEFAULT_POOL}': raidz2 of 6 sparse file devices of {} in {}",
            human(DEFAULT_DEVICE_SIZE),
            dir.join("devices").display()
        );
    } else {
        outln!("using pool '{DEFAULT_POOL}' from {}", dir.display());
    }
    // The pool is opened in this process (as zdb would), for the command.
    let client = crate::client::Client::local();
    let svc = client.service().expect("a local service").clone();
    let (opened, notes) = svc.open(DEFAULT_POOL)?;
    for n in notes {
        errln!("{n}");
    }
    // The test data goes in a dataset of its own, destroyed at the end.
    let scratch = format!("{DEFAULT_POOL}/demo-{}", std::process::id());
    opened.dsl.run(tank_dataset::Op::Create {
        name: scratch.clone(),
        kind: tank_dataset::DatasetKind::Filesystem,
        props: vec![],
        parents: false,
    })?;
    let os = opened.dsl.objset(opened.dsl.resolve(&scratch)?)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x7a4b);
    let chunk = 8 << 20;
    let id = {
        let tx = opened.store.begin(0)?;
        os.create_object(&tx, 1, 128 << 10)?
    };
    let start = Instant::now();
    let mut written = 0u64;
    let mut buf = vec![0u8; chunk];
    while written < size {
        let n = chunk.min((size - written) as usize);
        rng.fill_bytes(&mut buf[..n]);
        let tx = opened.store.begin(n as u64)?;
        os.write(&tx, id, written, &buf[..n])?;
        drop(tx);
        written += n as u64;
    }
    opened.store.sync()?;
    let wsecs = start.elapsed().as_secs_f64();
    outln!(
        "wrote {} of random data to dataset {scratch} and synced: {:.0} MB/s",
        human(size),
        size as f64 / wsecs / 1e6
    );
    let start = Instant::now();
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x7a4b);
    let mut off = 0u64;
    while off < size {
        let n = chunk.min((size - off) as usize);
        rng.fill_bytes(&mut buf[..n]);
        let got = os.read(id, off, n)?;
        if got != buf[..n] {
            bail!("read-back mismatch at offset {off}: this is a bug, please report it");
        }
        off += n as u64;
    }
    let rsecs = start.elapsed().as_secs_f64();
    outln!(
        "read it back and verified every byte: {:.0} MB/s",
        size as f64 / rsecs / 1e6
    );
    drop(os);
    opened.dsl.run(tank_dataset::Op::Destroy {
        name: scratch.clone(),
        recursive: false,
        dependents: false,
    })?;
    opened
        .pool
        .log_history("tank demo (wrote, verified and removed a test dataset)");
    opened.store.sync()?;
    outln!("removed the test dataset {scratch}\n");
    crate::cmd_pool::print_status(&svc.report(&opened), false, false);
    drop(opened);
    client.close()?;
    outln!("\nnext: 'tank pool status', 'tank pool history', 'tank debug object write tank FILE'");
    Ok(())
}
