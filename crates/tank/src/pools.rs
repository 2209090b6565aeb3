//! Opening devices and pools for a command (no daemon: the pool is opened in this process for
//! the command and closed cleanly after it).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use anyhow::{bail, Context, Result};
use tank_dataset::Dsl;
use tank_device::{DeviceRef, FileDevice, FileDeviceOptions};
use tank_object::ObjectStore;
use tank_pool::{ImportOptions, Pool};
use tank_vdev::MIN_DEVICE_SIZE;

use crate::datadir::{data_dir, CachedPool, PoolCache};

pub struct Opened {
    pub pool: Arc<Pool>,
    pub store: Arc<ObjectStore>,
    pub dsl: Arc<Dsl>,
}

/// Opens the object sets and the dataset directory of a pool. Every path that writes to a
/// pool goes through here, so blocks that snapshots reference are never freed.
pub fn open_datasets(pool: &Arc<Pool>) -> Result<(Arc<ObjectStore>, Arc<Dsl>)> {
    let store = ObjectStore::open(pool.clone()).context("cannot open object sets")?;
    let dsl = Dsl::open(store.clone()).context("cannot open the dataset directory")?;
    store.set_scan_roots(tank_dataset::SnapshotRoots::new(&dsl));
    Ok((store, dsl))
}

impl Opened {
    /// Syncs and closes the pool, leaving it imported (in the daemon, where pools stay
    /// open between commands, only syncs).
    pub fn close(self) -> Result<()> {
        if daemon_pool(&self.pool.name()).is_some() {
            self.store.sync()?;
        } else {
            self.pool.shutdown()?;
        }
        Ok(())
    }
}

/// The pools the daemon owns, by name. Empty in a CLI process.
static DAEMON_POOLS: Mutex<Option<HashMap<String, Opened>>> = Mutex::new(None);

/// Whether this process is the daemon (commands keep pools open in it).
pub fn daemon_mode() -> bool {
    DAEMON_POOLS.lock().is_some()
}

pub fn enter_daemon_mode() {
    DAEMON_POOLS.lock().get_or_insert_with(HashMap::new);
}

fn daemon_pool(name: &str) -> Option<Opened> {
    DAEMON_POOLS.lock().as_ref()?.get(name).map(Opened::share)
}

/// Keeps a pool open in the daemon (after create or import); a scrub it was running resumes.
pub fn adopt(opened: Opened) {
    opened.store.scan_resume();
    if let Some(map) = DAEMON_POOLS.lock().as_mut() {
        map.insert(opened.pool.name(), opened);
    }
}

/// Forgets a pool the daemon owned (after export or destroy).
pub fn forget(name: &str) {
    if let Some(map) = DAEMON_POOLS.lock().as_mut() {
        map.remove(name);
    }
}

/// The daemon's pools.
pub fn daemon_pools() -> Vec<Opened> {
    DAEMON_POOLS
        .lock()
        .as_ref()
        .map(|m| m.values().map(Opened::share).collect())
        .unwrap_or_default()
}

impl Opened {
    fn share(&self) -> Opened {
        Opened {
            pool: self.pool.clone(),
            store: self.store.clone(),
            dsl: self.dsl.clone(),
        }
    }
}

/// Makes a device path absolute so the cache and labels name it unambiguously.
pub fn absolute(path: &str) -> Result<String> {
    let abs = crate::out::resolve(Path::new(path));
    Ok(abs.to_string_lossy().into_owned())
}

pub fn open_device(path: &str, create_size: Option<u64>, direct: bool) -> Result<DeviceRef> {
    let opts = FileDeviceOptions {
        direct,
        create_size,
        read_only: false,
        exclusive_lock: true,
    };
    let dev = FileDevice::open(Path::new(path), &opts).with_context(|| {
        if create_size.is_none() && !Path::new(path).exists() {
            format!("cannot open '{path}': no such device or file (use --size to create files)")
        } else {
            format!("cannot open '{path}'")
        }
    })?;
    Ok(Arc::new(dev))
}

/// Pool devices bypass the page cache (O_DIRECT) unless `TANK_DIRECT_IO=0`: tank caches
/// what it reads itself, and double caching costs more than it gives (docs/BENCHMARKS.md:
/// cold streaming reads 1.0 GB/s buffered against 2.0 GB/s direct on the same pool).
/// Filesystems that refuse O_DIRECT fall back to buffered I/O.
pub fn direct_io() -> bool {
    std::env::var("TANK_DIRECT_IO").map_or(true, |v| v != "0")
}

pub fn cache_entry(pool: &Pool) -> CachedPool {
    let cfg = pool.config();
    CachedPool {
        name: cfg.name.clone(),
        guid: cfg.guid,
        devices: cfg.leaves().map(|(_, l)| l.path.clone()).collect(),
    }
}

/// Opens an imported pool by name through the cache file.
pub fn open_pool(name: &str) -> Result<Opened> {
    if let Some(o) = daemon_pool(name) {
        return Ok(o);
    }
    let dir = data_dir();
    let cache = PoolCache::load(&dir)?;
    let Some(entry) = cache.find(name) else {
        bail!(
            "cannot open '{name}': no such pool (imported pools: {}); see 'tank pool import'",
            if cache.pools.is_empty() {
                "none".to_string()
            } else {
                cache
                    .pools
                    .iter()
                    .map(|p| p.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        );
    };
    let mut devs = Vec::new();
    let mut problems = Vec::new();
    for path in &entry.devices {
        match open_device(path, None, direct_io()) {
            Ok(d) => devs.push(d),
            Err(e) => problems.push(crate::out::chain(&e)),
        }
    }
    let pool = Pool::import(
        &devs,
        &ImportOptions {
            name: Some(entry.guid.to_string()),
            ..Default::default()
        },
    )
    .with_context(|| {
        if problems.is_empty() {
            format!("cannot open pool '{name}'")
        } else {
            format!("cannot open pool '{name}' ({})", problems.join("; "))
        }
    })?;
    for p in &problems {
        errln!("warning: {p}");
    }
    for path in pool.autoreplace(&devs) {
        errln!("note: autoreplace: the blank device at {path} replaced the missing one");
    }
    let (store, dsl) = open_datasets(&pool)?;
    // Whichever process holds the pool runs its background work: a resilver a hot spare or
    // a returning device needs, a scrub left running. It stops (its cursor kept) when this
    // process closes the pool, and the next one to open it goes on.
    store.scan_resume();
    Ok(Opened { pool, store, dsl })
}

/// Every file in `dirs` large enough to be a member device, opened for import.
pub fn scan_dirs(dirs: &[PathBuf], lock: bool) -> Result<Vec<DeviceRef>> {
    let mut out = Vec::new();
    for dir in dirs {
        // Absolute, so the cache file and the labels name the devices from anywhere.
        let dir = &std::fs::canonicalize(crate::out::resolve(dir))
            .with_context(|| format!("cannot read directory {}", dir.display()))?;
        let entries = std::fs::read_dir(dir)
            .with_context(|| format!("cannot read directory {}", dir.display()))?;
        let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        paths.sort();
        for path in paths {
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            use std::os::unix::fs::FileTypeExt;
            let ft = meta.file_type();
            if !(ft.is_file() && meta.len() >= MIN_DEVICE_SIZE || ft.is_block_device()) {
                continue;
            }
            let opts = FileDeviceOptions {
                direct: false,
                create_size: None,
                read_only: !lock,
                exclusive_lock: lock,
            };
            if let Ok(d) = FileDevice::open(&path, &opts) {
                out.push(Arc::new(d) as DeviceRef);
            }
        }
    }
    Ok(out)
}

/// Opens the devices named in a create spec, creating sparse files when `size` is given.
pub fn open_for_create(paths: &[String], size: Option<u64>) -> Result<HashMap<String, DeviceRef>> {
    let mut map = HashMap::new();
    for p in paths {
        let abs = absolute(p)?;
        if let Some(parent) = Path::new(&abs).parent() {
            if size.is_some() {
                std::fs::create_dir_all(parent).ok();
            }
        }
        map.insert(p.clone(), open_device(&abs, size, direct_io())?);
    }
    Ok(map)
}
