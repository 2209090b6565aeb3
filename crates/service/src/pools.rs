//! The pools a service holds open, the cache file that locates them, and opening devices.
//!
//! # Theory of operation
//! `DATA_DIR/pools.json` lists the imported pools with their member device paths
//! (zpool.cache's role: a pool opens by name without scanning); it only locates devices,
//! the pool's truth is on them. It is written atomically (temporary file, fsync, rename).
//!
//! A [`Pools`] table belongs to one [`crate::Service`]: a pool is opened through the cache
//! the first time a request names it and stays open for the life of the service (the
//! daemon's, or one command's when no daemon runs), so every request of that service sees
//! the same pool, object store and dataset directory. Whoever holds a pool runs its
//! background work (a scrub or resilver resumes when it is opened).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tank_dataset::Dsl;
use tank_device::{DeviceRef, FileDevice, FileDeviceOptions};
use tank_object::ObjectStore;
use tank_pool::{HostIdentity, ImportOptions, Pool};
use tank_vdev::MIN_DEVICE_SIZE;

/// One open pool: the pool, its object store and its dataset directory.
#[derive(Clone)]
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

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CachedPool {
    pub name: String,
    pub guid: u64,
    pub devices: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PoolCache {
    pub pools: Vec<CachedPool>,
}

fn cache_path(dir: &Path) -> PathBuf {
    dir.join("pools.json")
}

impl PoolCache {
    pub fn load(dir: &Path) -> Result<Self> {
        let path = cache_path(dir);
        match std::fs::read(&path) {
            Ok(raw) => serde_json::from_slice(&raw)
                .with_context(|| format!("{} is not a valid pool cache", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
        }
    }

    /// Writes the cache atomically (temporary file, fsync, rename).
    pub fn save(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create data directory {}", dir.display()))?;
        let path = cache_path(dir);
        let tmp = dir.join("pools.json.tmp");
        let raw = serde_json::to_vec_pretty(self)?;
        {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp)
                .with_context(|| format!("cannot write {}", tmp.display()))?;
            f.write_all(&raw)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &path)?;
        Ok(())
    }

    pub fn find(&self, name: &str) -> Option<&CachedPool> {
        self.pools
            .iter()
            .find(|p| p.name == name || p.guid.to_string() == name)
    }

    pub fn upsert(&mut self, entry: CachedPool) {
        self.pools
            .retain(|p| p.name != entry.name && p.guid != entry.guid);
        self.pools.push(entry);
        self.pools.sort_by(|a, b| a.name.cmp(&b.name));
    }

    pub fn remove(&mut self, name: &str) {
        self.pools.retain(|p| p.name != name);
    }

    pub fn names(&self) -> Vec<String> {
        self.pools.iter().map(|p| p.name.clone()).collect()
    }
}

/// This data directory's tank instance id (`DATA_DIR/instance`, made at first use): the
/// labels of the pools it imports name it, so that another data directory on the host does
/// not take a pool this one holds without `-f`.
pub fn instance_id(dir: &Path) -> Result<u64> {
    let path = dir.join("instance");
    let parse = |raw: &str| u64::from_str_radix(raw.trim(), 16).ok().filter(|&v| v != 0);
    if let Ok(raw) = std::fs::read_to_string(&path) {
        return parse(&raw)
            .with_context(|| format!("{} does not hold an instance id", path.display()));
    }
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create the data directory {}", dir.display()))?;
    // Written aside and linked into place: two processes starting at once agree on one id.
    let tmp = dir.join(format!("instance.{}.tmp", std::process::id()));
    std::fs::write(&tmp, format!("{:016x}\n", rand::random::<u64>() | 1))
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    let linked = std::fs::hard_link(&tmp, &path);
    let _ = std::fs::remove_file(&tmp);
    if let Err(e) = linked {
        if e.kind() != std::io::ErrorKind::AlreadyExists {
            return Err(e).with_context(|| format!("cannot write {}", path.display()));
        }
    }
    let raw = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    parse(&raw).with_context(|| format!("{} does not hold an instance id", path.display()))
}

/// Who this data directory's service is, for the labels of the pools it imports.
pub fn host_identity(dir: &Path) -> Result<HostIdentity> {
    Ok(HostIdentity::instance(instance_id(dir)?))
}

pub fn cache_entry(pool: &Pool) -> CachedPool {
    let cfg = pool.config();
    CachedPool {
        name: cfg.name.clone(),
        guid: cfg.guid,
        devices: cfg.leaves().map(|(_, l)| l.path.clone()).collect(),
    }
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

/// Every file in `dirs` large enough to be a member device, opened for import. The
/// directories must be absolute (the cache file and the labels name devices from anywhere).
/// With `lock`, files another process holds locked (a pool imported there) are skipped and
/// listed in the second part.
pub fn scan_dirs(dirs: &[PathBuf], lock: bool) -> Result<(Vec<DeviceRef>, Vec<String>)> {
    let mut out = Vec::new();
    let mut busy = Vec::new();
    for dir in dirs {
        let dir = &std::fs::canonicalize(dir)
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
            match FileDevice::open(&path, &opts) {
                Ok(d) => out.push(Arc::new(d) as DeviceRef),
                Err(tank_device::DeviceError::Invalid { what, .. }) if what.contains("locked") => {
                    busy.push(path.display().to_string())
                }
                Err(_) => {}
            }
        }
    }
    Ok((out, busy))
}

/// Whether the device at `path` carries a label of pool `name` (by name or numeric guid),
/// read without taking its lock (another process holds it).
pub fn member_of(path: &str, name: &str) -> bool {
    let opts = FileDeviceOptions {
        read_only: true,
        ..FileDeviceOptions::default()
    };
    FileDevice::open(Path::new(path), &opts)
        .ok()
        .and_then(|d| tank_pool::label::best_label(&d))
        .is_some_and(|l| l.config.name == name || l.config.guid.to_string() == name)
}

/// Opens the devices named in a create spec (absolute paths), creating sparse files when
/// `size` is given.
pub fn open_for_create(paths: &[String], size: Option<u64>) -> Result<HashMap<String, DeviceRef>> {
    let mut map = HashMap::new();
    for p in paths {
        if !Path::new(p).is_absolute() {
            bail!("device '{p}' is not an absolute path");
        }
        if let Some(parent) = Path::new(p).parent() {
            if size.is_some() {
                std::fs::create_dir_all(parent).ok();
            }
        }
        map.insert(p.clone(), open_device(p, size, direct_io())?);
    }
    Ok(map)
}

/// The pools one service holds open, by name.
#[derive(Default)]
pub struct Pools {
    open: Mutex<HashMap<String, Opened>>,
    /// Serializes opening, so two requests never import the same pool twice.
    opening: Mutex<()>,
}

impl Pools {
    /// A pool this table holds open.
    pub fn get(&self, name: &str) -> Option<Opened> {
        self.open.lock().get(name).cloned()
    }

    /// Every pool this table holds open.
    pub fn all(&self) -> Vec<Opened> {
        let mut v: Vec<Opened> = self.open.lock().values().cloned().collect();
        v.sort_by_key(|o| o.pool.name());
        v
    }

    /// Keeps a pool open (after create or import); a scrub it was running resumes.
    pub fn adopt(&self, opened: Opened) {
        opened.store.scan_resume();
        self.open.lock().insert(opened.pool.name(), opened);
    }

    /// Forgets a pool (after export or destroy).
    pub fn forget(&self, name: &str) -> Option<Opened> {
        self.open.lock().remove(name)
    }

    /// Opens an imported pool by name through the cache file, or returns the one open.
    /// What the import noted (a device missing, a blank device taken in by autoreplace) is
    /// added to `notes`.
    pub fn open(&self, data_dir: &Path, name: &str, notes: &mut Vec<String>) -> Result<Opened> {
        if let Some(o) = self.get(name) {
            return Ok(o);
        }
        let _opening = self.opening.lock();
        if let Some(o) = self.get(name) {
            return Ok(o);
        }
        let cache = PoolCache::load(data_dir)?;
        let Some(entry) = cache.find(name) else {
            return Err(crate::ServiceError::NotFound(format!(
                "cannot open '{name}': no such pool (imported pools: {}); see 'tank pool import'",
                if cache.pools.is_empty() {
                    "none".to_string()
                } else {
                    cache.names().join(", ")
                }
            ))
            .into());
        };
        let mut devs = Vec::new();
        let mut problems = Vec::new();
        for path in &entry.devices {
            match open_device(path, None, direct_io()) {
                Ok(d) => devs.push(d),
                Err(e) => problems.push(crate::error::chain(&e)),
            }
        }
        let pool = Pool::import(
            &devs,
            &ImportOptions {
                name: Some(entry.guid.to_string()),
                host: host_identity(data_dir)?,
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
        for p in problems {
            notes.push(format!("warning: {p}"));
        }
        for path in pool.autoreplace(&devs) {
            notes.push(format!(
                "note: autoreplace: the blank device at {path} replaced the missing one"
            ));
        }
        let (store, dsl) = open_datasets(&pool)?;
        let opened = Opened { pool, store, dsl };
        // Whichever process holds the pool runs its background work: a resilver a hot
        // spare or a returning device needs, a scrub left running. It stops (its cursor
        // kept) when this service closes the pool, and the next one to open it goes on.
        self.adopt(opened.clone());
        Ok(opened)
    }
}
