//! Shared helpers for the POSIX layer tests: pools on memory or simulated devices, a
//! filesystem mounted on the root object set with test hooks, export and import, `fsck`.
//! `dsl`: the same for filesystems on datasets, with checks of the dataset accounting.

#![allow(dead_code)]

pub mod dsl;

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

thread_local! {
    /// Set by [`on_raidz2_with_gang_blocks`]: the block stores of the pools this test thread
    /// made or imported since.
    static RAIDZ2_GANG: std::cell::RefCell<Option<Vec<Arc<tank_block::BlockStore>>>> =
        const { std::cell::RefCell::new(None) };
}

/// Blocks above this many bytes are gang blocks in [`on_raidz2_with_gang_blocks`].
pub const GANG_ABOVE: usize = 8192;

/// Runs `body` with the pools that [`sim_pool`] (and the tests' own pool builders through
/// [`sim_layout`]) make as raidz2 over six devices, and with every block
/// above 8 KiB a gang block in every pool made or imported: the crash tests' cuts then also
/// fall between parity columns and between gang pieces and headers. Panics unless gang
/// blocks were written, so the variant cannot pass without testing what it is for.
pub fn on_raidz2_with_gang_blocks<T>(body: impl FnOnce() -> T) -> T {
    RAIDZ2_GANG.with(|g| *g.borrow_mut() = Some(Vec::new()));
    let out = body();
    let stores = RAIDZ2_GANG
        .with(|g| g.borrow_mut().take())
        .unwrap_or_default();
    let ganged: u64 = stores.iter().map(|b| b.gang_writes()).sum();
    assert!(ganged >= 20, "only {ganged} gang blocks were written");
    eprintln!("{ganged} gang blocks written");
    out
}

/// True inside [`on_raidz2_with_gang_blocks`].
pub fn raidz2_with_gangs() -> bool {
    RAIDZ2_GANG.with(|g| g.borrow().is_some())
}

/// The data devices' layout: `names` as raidz2 inside [`on_raidz2_with_gang_blocks`],
/// otherwise one device, or a mirror of several.
pub fn sim_layout(names: &[String]) -> String {
    if raidz2_with_gangs() {
        format!("raidz2 {}", names.join(" "))
    } else if names.len() > 1 {
        format!("mirror {}", names.join(" "))
    } else {
        names.join(" ")
    }
}

/// The data devices' count and size: six inside [`on_raidz2_with_gang_blocks`], otherwise
/// as asked.
pub fn sim_devices(n: usize, size: u64) -> (usize, u64) {
    if raidz2_with_gangs() {
        (6, size)
    } else {
        (n, size)
    }
}

/// Applies the gang knob of [`on_raidz2_with_gang_blocks`] to a pool just made or imported.
pub fn gang_knob(store: &ObjectStore) {
    RAIDZ2_GANG.with(|g| {
        if let Some(stores) = g.borrow_mut().as_mut() {
            store.blocks().set_force_ganging(Some(GANG_ABOVE));
            stores.push(store.blocks().clone());
        }
    });
}

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
        ..Default::default()
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
        let (pool, store) = import_replayed(&devs, false).unwrap();
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
    let (n, size) = sim_devices(n, size);
    let devs: Vec<SimDevice> = (0..n)
        .map(|i| fleet.device(&format!("d{i}"), size))
        .collect();
    let map: HashMap<String, DeviceRef> = devs
        .iter()
        .enumerate()
        .map(|(i, d)| (format!("d{i}"), Arc::new(d.clone()) as DeviceRef))
        .collect();
    let names: Vec<String> = (0..n).map(|i| format!("d{i}")).collect();
    let opts = CreateOptions {
        ashift: 12,
        force: false,
        tunables: manual_txgs(),
        ..Default::default()
    };
    let (pool, _) = Pool::create("sim", &spec(&sim_layout(&names)), &map, &opts).unwrap();
    let store = ObjectStore::open(pool.clone()).unwrap();
    gang_knob(&store);
    (devs, pool, store)
}

pub fn import_images(
    images: Vec<(String, Vec<u8>)>,
) -> Result<(Arc<Pool>, Arc<ObjectStore>), String> {
    let devs: Vec<DeviceRef> = images
        .into_iter()
        .map(|(n, b)| Arc::new(MemDevice::from_bytes(n, b)) as DeviceRef)
        .collect();
    import_replayed(&devs, false)
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
            missing_log: false,
            tunables: Some(manual_txgs()),
            supported_features: None,
            ..Default::default()
        },
    )
    .map_err(|e| e.to_string())?;
    let store = ObjectStore::open(pool.clone()).map_err(|e| e.to_string())?;
    gang_knob(&store);
    Ok((pool, store))
}

/// `import_devs`, then the intent log replayed, as the dataset layer does when it opens
/// (for tests of the POSIX layer alone: no snapshots, so no snapshot txgs to set first).
pub fn import_replayed(
    devs: &[DeviceRef],
    rewind: bool,
) -> Result<(Arc<Pool>, Arc<ObjectStore>), String> {
    let (pool, store) = import_devs(devs, rewind)?;
    store.replay_log().map_err(|e| e.to_string())?;
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

/// What a walk of the filesystem finds at one inode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    File(Vec<u8>),
    Dir(std::collections::BTreeMap<Vec<u8>, Ino>),
    Symlink(Vec<u8>),
    Other(tank_dataset::posix::FileKind),
}

/// An inode as found by a walk: its content and extended attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub content: Content,
    pub xattrs: std::collections::BTreeMap<Vec<u8>, Vec<u8>>,
}

/// The whole filesystem as a walk from the root finds it: inode → what it holds.
pub type Image = std::collections::BTreeMap<Ino, Found>;

/// Walks the whole tree from the root and checks the filesystem's invariants: every entry
/// points at a live inode of the kind it says; "." and ".." are right; a directory has one
/// name, `2 + subdirectories` links and size `entries + 2`; a file's link count is its number
/// of names and its size is what can be read; the object set holds exactly the reachable
/// inodes (nothing leaked) and the unlinked set is empty. Returns what it found.
pub fn fsck(fs: &Fs, store: &ObjectStore) -> Result<Image, String> {
    fsck_with(fs, store, false)
}

/// `fsck` of a filesystem in use: inodes unlinked while open are allowed, as long as each
/// is in the unlinked set with no links.
pub fn fsck_live(fs: &Fs, store: &ObjectStore) -> Result<Image, String> {
    fsck_with(fs, store, true)
}

fn fsck_with(fs: &Fs, store: &ObjectStore, live: bool) -> Result<Image, String> {
    let objset = store.objset(ROOT_OBJSET).map_err(|e| e.to_string())?;
    fsck_objset(fs, &objset, live)
}

/// `fsck` of a filesystem on any object set (a dataset's, or a snapshot's read-only one).
pub fn fsck_objset(fs: &Fs, objset: &tank_object::ObjectSet, live: bool) -> Result<Image, String> {
    use std::collections::{BTreeMap, HashMap};
    use tank_dataset::posix::{Cred, FileKind, ROOT_INO};
    let root = Cred::root();
    let mut image = Image::new();
    let mut names: HashMap<Ino, u32> = HashMap::new();
    let mut stack = vec![(ROOT_INO, ROOT_INO)];
    while let Some((dir, parent)) = stack.pop() {
        let a = fs
            .getattr(dir)
            .map_err(|e| format!("dir {dir}: getattr {e:?}"))?;
        if a.kind != FileKind::Dir {
            return Err(format!("inode {dir} listed as a directory is {:?}", a.kind));
        }
        let mut entries = BTreeMap::new();
        let mut cookie = 0;
        let mut subdirs = 0;
        let mut seen_dots = 0;
        loop {
            let batch = fs
                .readdir(&root, dir, cookie, 97)
                .map_err(|e| format!("readdir {dir}: {e:?}"))?;
            let Some(last) = batch.last() else { break };
            if last.cookie <= cookie {
                return Err(format!("readdir {dir}: cookie went back"));
            }
            cookie = last.cookie;
            for e in batch {
                if e.name == b"." {
                    seen_dots += 1;
                    if e.ino != dir {
                        return Err(format!("dir {dir}: . is {}", e.ino));
                    }
                    continue;
                }
                if e.name == b".." {
                    seen_dots += 1;
                    if e.ino != parent {
                        return Err(format!("dir {dir}: .. is {} not {parent}", e.ino));
                    }
                    continue;
                }
                let ea = fs.getattr(e.ino).map_err(|err| {
                    format!(
                        "dir {dir} entry {:?} -> {}: {err:?}",
                        String::from_utf8_lossy(&e.name),
                        e.ino
                    )
                })?;
                if ea.kind != e.kind {
                    return Err(format!(
                        "entry {:?}: kind {:?} but inode is {:?}",
                        e.name, e.kind, ea.kind
                    ));
                }
                let l = fs
                    .lookup(&root, dir, osb(&e.name))
                    .map_err(|err| format!("lookup {:?}: {err:?}", e.name))?;
                if l.ino != e.ino {
                    return Err(format!(
                        "lookup {:?} gives {} but readdir {}",
                        e.name, l.ino, e.ino
                    ));
                }
                *names.entry(e.ino).or_default() += 1;
                if e.kind == FileKind::Dir {
                    subdirs += 1;
                    stack.push((e.ino, dir));
                }
                if entries.insert(e.name.clone(), e.ino).is_some() {
                    return Err(format!("dir {dir}: name {:?} twice", e.name));
                }
            }
        }
        if seen_dots != 2 {
            return Err(format!("dir {dir}: {seen_dots} dot entries"));
        }
        if a.nlink != 2 + subdirs {
            return Err(format!(
                "dir {dir}: nlink {} with {subdirs} subdirectories",
                a.nlink
            ));
        }
        if a.size != entries.len() as u64 + 2 {
            return Err(format!(
                "dir {dir}: size {} with {} entries",
                a.size,
                entries.len()
            ));
        }
        image.insert(
            dir,
            Found {
                content: Content::Dir(entries),
                xattrs: xattrs_of(fs, dir)?,
            },
        );
    }
    for (&ino, &n) in &names {
        let a = fs.getattr(ino).map_err(|e| format!("{ino}: {e:?}"))?;
        match a.kind {
            FileKind::Dir => {
                if n != 1 {
                    return Err(format!("directory {ino} has {n} names"));
                }
            }
            kind => {
                if a.nlink != n {
                    return Err(format!("inode {ino}: nlink {} with {n} names", a.nlink));
                }
                let content = match kind {
                    FileKind::File => {
                        let data = fs
                            .read(ino, 0, (a.size + 1) as u32)
                            .map_err(|e| format!("read {ino}: {e:?}"))?;
                        if data.len() as u64 != a.size {
                            return Err(format!(
                                "file {ino}: size {} but {} bytes read",
                                a.size,
                                data.len()
                            ));
                        }
                        // st_blocks: each block's bytes up to its last non-zero one, in
                        // 512-byte units; all-zero blocks are holes.
                        let held: u64 = data
                            .chunks(a.blksize as usize)
                            .map(|b| {
                                let n = b.iter().rposition(|&x| x != 0).map_or(0, |p| p + 1);
                                n.div_ceil(512) as u64
                            })
                            .sum();
                        if a.blocks != held {
                            return Err(format!(
                                "file {ino}: st_blocks {} but its data blocks hold {held}",
                                a.blocks
                            ));
                        }
                        Content::File(data)
                    }
                    FileKind::Symlink => {
                        let t = fs
                            .readlink(ino)
                            .map_err(|e| format!("readlink {ino}: {e:?}"))?;
                        if t.len() as u64 != a.size {
                            return Err(format!("symlink {ino}: size {}", a.size));
                        }
                        Content::Symlink(t)
                    }
                    k => Content::Other(k),
                };
                image.insert(
                    ino,
                    Found {
                        content,
                        xattrs: xattrs_of(fs, ino)?,
                    },
                );
            }
        }
    }
    let mut objects = objset
        .list_objects(1, usize::MAX)
        .map_err(|e| e.to_string())?;
    let unlinked: Vec<u64> = objset
        .items(ROOT_INO, UNLINKED_KIND, 0, u64::MAX, usize::MAX)
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|i| i.0)
        .collect();
    if live {
        for ino in &unlinked {
            let a = fs
                .getattr(*ino)
                .map_err(|e| format!("unlinked {ino}: {e:?}"))?;
            if a.nlink != 0 || image.contains_key(ino) {
                return Err(format!("unlinked inode {ino} has links"));
            }
        }
        objects.retain(|o| !unlinked.contains(o));
    } else if !unlinked.is_empty() {
        return Err(format!("unlinked set not empty: {unlinked:?}"));
    }
    let reachable: Vec<Ino> = image.keys().copied().collect();
    if objects != reachable {
        let leaked: Vec<&u64> = objects.iter().filter(|o| !image.contains_key(o)).collect();
        return Err(format!(
            "objects not reachable from the root: {leaked:?} (objects {} reachable {})",
            objects.len(),
            reachable.len()
        ));
    }
    Ok(image)
}

/// The item kind of the persistent unlinked set (docs/FORMAT.md, POSIX layer).
pub const UNLINKED_KIND: u8 = 22;

fn xattrs_of(fs: &Fs, ino: Ino) -> Result<std::collections::BTreeMap<Vec<u8>, Vec<u8>>, String> {
    let root = tank_dataset::posix::Cred::root();
    let mut out = std::collections::BTreeMap::new();
    for name in fs
        .listxattr(&root, ino)
        .map_err(|e| format!("listxattr {ino}: {e:?}"))?
    {
        let v = fs
            .getxattr(&root, ino, osb(&name))
            .map_err(|e| format!("getxattr {ino} {name:?}: {e:?}"))?;
        out.insert(name, v);
    }
    Ok(out)
}
