//! Shared helpers for the POSIX layer tests: pools on memory or simulated devices, a
//! filesystem mounted on the root object set with test hooks, export and import.

#![allow(dead_code)]

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tank_dataset::posix::{DatasetHooks, Fs, Ino, SyncMode};
use tank_dataset::Errno;
use tank_device::{DeviceRef, MemDevice, SimDevice, SimFleet};
use tank_object::{ObjectStore, ROOT_OBJSET};
use tank_pool::{CreateOptions, ImportOptions, Pool, PoolSpec, TxgTunables};

/// Tunables that make txgs commit only when a test asks (so a txg is exactly one step).
pub fn manual_txgs() -> TxgTunables {
    TxgTunables {
        dirty_max: 512 << 20,
        dirty_sync: u64::MAX / 2,
        timeout: Duration::from_secs(3600),
    }
}

/// Tunables for bulk tests: txgs commit on dirty data as in production, never on a timer.
pub fn bulk_txgs() -> TxgTunables {
    TxgTunables {
        dirty_max: 256 << 20,
        dirty_sync: 64 << 20,
        timeout: Duration::from_secs(3600),
    }
}

pub fn spec(s: &str) -> PoolSpec {
    let toks: Vec<String> = s.split_whitespace().map(String::from).collect();
    PoolSpec::parse(&toks, true).unwrap()
}

/// Hooks whose answers a test can change while the filesystem is mounted.
#[derive(Debug)]
pub struct TestHooks {
    pub recordsize: AtomicU64,
    pub readonly: AtomicBool,
    pub atime: AtomicBool,
    pub sync_mode: Mutex<SyncMode>,
    /// The error `check_space` answers (e.g. EDQUOT), if any.
    pub space_error: Mutex<Option<Errno>>,
    /// Calls of `check_space` and the bytes asked for.
    pub space_checks: AtomicU64,
    pub space_bytes: AtomicU64,
}

impl Default for TestHooks {
    fn default() -> Self {
        Self {
            recordsize: AtomicU64::new(128 << 10),
            readonly: AtomicBool::new(false),
            atime: AtomicBool::new(true),
            sync_mode: Mutex::new(SyncMode::Standard),
            space_error: Mutex::new(None),
            space_checks: AtomicU64::new(0),
            space_bytes: AtomicU64::new(0),
        }
    }
}

impl DatasetHooks for TestHooks {
    fn recordsize(&self) -> u32 {
        self.recordsize.load(Ordering::Relaxed) as u32
    }
    fn readonly(&self) -> bool {
        self.readonly.load(Ordering::Relaxed)
    }
    fn atime(&self) -> bool {
        self.atime.load(Ordering::Relaxed)
    }
    fn sync_mode(&self) -> SyncMode {
        *self.sync_mode.lock()
    }
    fn check_space(&self, bytes: u64) -> Result<(), Errno> {
        self.space_checks.fetch_add(1, Ordering::Relaxed);
        self.space_bytes.fetch_add(bytes, Ordering::Relaxed);
        match *self.space_error.lock() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
    fn space(&self) -> (u64, u64) {
        (1 << 30, 1 << 29)
    }
    fn referenced(&self) -> u64 {
        0
    }
}

/// A pool on memory devices, with its filesystem mounted.
pub struct MemFs {
    pub mems: Vec<Arc<MemDevice>>,
    pub pool: Arc<Pool>,
    pub store: Arc<ObjectStore>,
    pub hooks: Arc<TestHooks>,
    pub fs: Arc<Fs>,
}

pub fn mem_pool(
    n: usize,
    size: u64,
    tunables: TxgTunables,
) -> (Vec<Arc<MemDevice>>, Arc<Pool>, Arc<ObjectStore>) {
    let mems: Vec<Arc<MemDevice>> = (0..n)
        .map(|i| Arc::new(MemDevice::new(format!("m{i}"), size)))
        .collect();
    let map: HashMap<String, DeviceRef> = mems
        .iter()
        .enumerate()
        .map(|(i, m)| (format!("m{i}"), m.clone() as DeviceRef))
        .collect();
    let names: Vec<String> = (0..n).map(|i| format!("m{i}")).collect();
    let opts = CreateOptions {
        ashift: 12,
        force: false,
        tunables,
    };
    let (pool, _) = Pool::create("ptest", &spec(&names.join(" ")), &map, &opts).unwrap();
    let store = ObjectStore::open(pool.clone()).unwrap();
    (mems, pool, store)
}

pub fn mount(store: &Arc<ObjectStore>, hooks: &Arc<TestHooks>) -> Result<Arc<Fs>, Errno> {
    let os = store.objset(ROOT_OBJSET).unwrap();
    Fs::mount(
        store.clone(),
        os,
        hooks.clone() as Arc<dyn DatasetHooks>,
        (0, 0),
    )
}

impl MemFs {
    /// A fresh filesystem on one memory device of `size` bytes.
    pub fn new(size: u64) -> MemFs {
        Self::with(size, manual_txgs(), TestHooks::default())
    }

    pub fn with(size: u64, tunables: TxgTunables, hooks: TestHooks) -> MemFs {
        let (mems, pool, store) = mem_pool(1, size, tunables);
        let hooks = Arc::new(hooks);
        let fs = mount(&store, &hooks).unwrap();
        MemFs {
            mems,
            pool,
            store,
            hooks,
            fs,
        }
    }

    /// Exports the pool and imports it again from the same devices, remounting.
    pub fn reopen(self) -> MemFs {
        let MemFs {
            mems,
            pool,
            store,
            hooks,
            fs,
        } = self;
        drop(fs);
        drop(store);
        pool.export().unwrap();
        drop(pool);
        let devs: Vec<DeviceRef> = mems.iter().map(|m| m.clone() as DeviceRef).collect();
        let (pool, store) = import_devs(&devs, false).unwrap();
        let fs = mount(&store, &hooks).unwrap();
        MemFs {
            mems,
            pool,
            store,
            hooks,
            fs,
        }
    }

    /// Objects in the object set (inodes, since the filesystem keeps nothing else).
    pub fn objects(&self) -> Vec<u64> {
        self.store
            .objset(ROOT_OBJSET)
            .unwrap()
            .list_objects(1, usize::MAX)
            .unwrap()
    }
}

pub fn sim_pool(
    fleet: &SimFleet,
    n: usize,
    size: u64,
) -> (Vec<SimDevice>, Arc<Pool>, Arc<ObjectStore>) {
    let devs: Vec<SimDevice> = (0..n)
        .map(|i| fleet.device(&format!("d{i}"), size))
        .collect();
    let map: HashMap<String, DeviceRef> = devs
        .iter()
        .enumerate()
        .map(|(i, d)| (format!("d{i}"), Arc::new(d.clone()) as DeviceRef))
        .collect();
    let names: Vec<String> = (0..n).map(|i| format!("d{i}")).collect();
    let spec_text = if n > 1 {
        format!("mirror {}", names.join(" "))
    } else {
        names.join(" ")
    };
    let opts = CreateOptions {
        ashift: 12,
        force: false,
        tunables: manual_txgs(),
    };
    let (pool, _) = Pool::create("sim", &spec(&spec_text), &map, &opts).unwrap();
    let store = ObjectStore::open(pool.clone()).unwrap();
    (devs, pool, store)
}

pub fn import_images(
    images: Vec<(String, Vec<u8>)>,
) -> Result<(Arc<Pool>, Arc<ObjectStore>), String> {
    let devs: Vec<DeviceRef> = images
        .into_iter()
        .map(|(n, b)| Arc::new(MemDevice::from_bytes(n, b)) as DeviceRef)
        .collect();
    import_devs(&devs, false)
}

pub fn import_devs(
    devs: &[DeviceRef],
    rewind: bool,
) -> Result<(Arc<Pool>, Arc<ObjectStore>), String> {
    let pool = Pool::import(
        devs,
        &ImportOptions {
            name: None,
            rewind,
            force: false,
            tunables: Some(manual_txgs()),
        },
    )
    .map_err(|e| e.to_string())?;
    let store = ObjectStore::open(pool.clone()).map_err(|e| e.to_string())?;
    Ok((pool, store))
}

pub fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

pub fn osb(b: &[u8]) -> &OsStr {
    OsStr::from_bytes(b)
}

/// Every entry of a directory, by reading it in pages of `page` entries (without . and ..).
pub fn list_dir(fs: &Fs, dir: Ino, page: usize) -> Vec<tank_dataset::posix::DirEntry> {
    let root = tank_dataset::posix::Cred::root();
    let mut out = Vec::new();
    let mut cookie = 0;
    loop {
        let batch = fs.readdir(&root, dir, cookie, page).unwrap();
        let Some(last) = batch.last() else {
            break;
        };
        cookie = last.cookie;
        out.extend(
            batch
                .into_iter()
                .filter(|e| e.name != b"." && e.name != b".."),
        );
    }
    out
}

/// Seed for randomized tests: `TANK_SEED` in the environment, else `default`.
pub fn seed(default: u64) -> u64 {
    std::env::var("TANK_SEED")
        .ok()
        .and_then(|s| {
            let s = s.trim_start_matches("0x");
            u64::from_str_radix(s, 16).ok()
        })
        .unwrap_or(default)
}
