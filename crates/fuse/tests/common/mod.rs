//! Shared helpers of the FUSE tests: a pool on file devices in a temporary directory, an
//! `Fs` on it mounted through the kernel, hooks with a quota, a read-only switch and the
//! `direct` property, a
//! snapshot source, and running code as another user.
//!
//! Every mount lives in its test's own temporary directory and is unmounted when the
//! `Mounted` guard drops, also when the test fails. Without /dev/fuse each test prints
//! "skipped: /dev/fuse missing", records itself as skipped for `.ci/run`'s count and returns
//! (`require_fuse!`).

#![allow(dead_code)]
// libc calls (setfsuid, setgroups, unshare, utimensat, ...) are the point of these tests.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tank_dataset::posix::{DatasetHooks, DirectMode, Fs, SyncMode};
use tank_dataset::Errno;
use tank_device::{DeviceRef, FileDevice, FileDeviceOptions};
use tank_fuse::{MountHandle, MountOptions, SnapshotSource};
use tank_object::{ObjectStore, ROOT_OBJSET};
use tank_pool::{CreateOptions, Pool, PoolSpec};

/// Returns from the test when the kernel's FUSE device is absent, saying so on stderr
/// directly (the test harness would swallow `println!` of a passing test).
#[macro_export]
macro_rules! require_fuse {
    () => {
        if let Some(why) = $crate::common::fuse_missing() {
            $crate::common::skip(module_path!(), why);
            return;
        }
    };
}

/// Says on stderr that `test` did not run and why, and appends it to `tmp/skipped.txt` in
/// the target directory, which `.ci/run` counts: a test that returns early passes for the
/// test harness, and must not be counted as passed.
pub fn skip(test: &str, why: &str) {
    use std::io::Write as _;
    let line = format!("{test}: skipped: {why}");
    let _ = writeln!(std::io::stderr(), "{line}");
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("skipped.txt");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(f, "{line}");
    }
}

/// Why this machine cannot mount FUSE filesystems, if it cannot: no /dev/fuse, or no
/// CAP_SYS_ADMIN (bit 21 of the effective capabilities) for mount(2). Under `CI=true` a
/// missing FUSE fails the test instead: CI machines have it, and a run whose FUSE tests
/// all skipped must not pass.
pub fn fuse_missing() -> Option<&'static str> {
    let why = fuse_absent();
    if let (Some(why), Ok("true")) = (why, std::env::var("CI").as_deref()) {
        panic!("CI=true, but FUSE cannot be mounted here: {why}");
    }
    why
}

fn fuse_absent() -> Option<&'static str> {
    if !std::path::Path::new("/dev/fuse").exists() {
        return Some("/dev/fuse missing");
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    if cap_eff & (1 << 21) == 0 {
        return Some("no CAP_SYS_ADMIN to mount FUSE filesystems");
    }
    None
}

/// Hooks of a test dataset: a quota (EDQUOT past it, counting every byte `Fs` asks for),
/// a read-only switch, and a sync mode.
pub struct TestHooks {
    pub readonly: AtomicBool,
    pub quota: AtomicU64,
    pub charged: AtomicU64,
    pub sync_mode: SyncMode,
    /// The `direct` property, changeable while mounted.
    pub direct: Mutex<DirectMode>,
    pub pool_bytes: u64,
}

impl TestHooks {
    pub fn new(pool_bytes: u64) -> TestHooks {
        TestHooks {
            readonly: AtomicBool::new(false),
            quota: AtomicU64::new(u64::MAX),
            charged: AtomicU64::new(0),
            sync_mode: SyncMode::Standard,
            direct: Mutex::new(DirectMode::Standard),
            pool_bytes,
        }
    }
}

impl DatasetHooks for TestHooks {
    fn recordsize(&self) -> u32 {
        128 << 10
    }
    fn readonly(&self) -> bool {
        self.readonly.load(Ordering::Acquire)
    }
    fn atime(&self) -> bool {
        false
    }
    fn sync_mode(&self) -> SyncMode {
        self.sync_mode
    }
    fn direct(&self) -> DirectMode {
        *self.direct.lock()
    }
    fn check_space(&self, bytes: u64) -> Result<(), Errno> {
        let quota = self.quota.load(Ordering::Acquire);
        let charged = self.charged.fetch_add(bytes, Ordering::AcqRel) + bytes;
        if charged > quota {
            self.charged.fetch_sub(bytes, Ordering::AcqRel);
            return Err(Errno::EDQUOT);
        }
        Ok(())
    }
    fn space(&self) -> (u64, u64) {
        let total = self.quota.load(Ordering::Acquire).min(self.pool_bytes);
        let used = self.charged.load(Ordering::Acquire).min(total);
        (total, total - used)
    }
    fn referenced(&self) -> u64 {
        self.charged.load(Ordering::Acquire)
    }
}

/// A pool of one file device in a temporary directory, with its object store.
pub struct TestPool {
    pub dir: tempfile::TempDir,
    pub pool: Arc<Pool>,
    pub store: Arc<ObjectStore>,
    pub bytes: u64,
}

impl TestPool {
    pub fn new(device_bytes: u64) -> TestPool {
        let dir = tempfile::Builder::new()
            .prefix("tank-fuse-test")
            .tempdir()
            .expect("temp dir");
        let path = dir.path().join("d0");
        let dev = FileDevice::open(
            &path,
            &FileDeviceOptions {
                direct: false,
                create_size: Some(device_bytes),
                read_only: false,
                exclusive_lock: true,
            },
        )
        .expect("device");
        let map: HashMap<String, DeviceRef> = [("d0".to_string(), Arc::new(dev) as DeviceRef)]
            .into_iter()
            .collect();
        let spec = PoolSpec::parse(&["d0".to_string()], true).expect("spec");
        let (pool, _) =
            Pool::create("fusetest", &spec, &map, &CreateOptions::default()).expect("pool");
        let store = ObjectStore::open(pool.clone()).expect("store");
        TestPool {
            dir,
            pool,
            store,
            bytes: device_bytes,
        }
    }

    /// A filesystem on the root object set.
    pub fn root_fs(&self, hooks: Arc<TestHooks>) -> Arc<Fs> {
        let os = self.store.objset(ROOT_OBJSET).expect("root objset");
        Fs::mount(self.store.clone(), os, hooks, (0, 0)).expect("Fs::mount")
    }

    /// A filesystem on a new object set.
    pub fn new_fs(&self, hooks: Arc<TestHooks>) -> Arc<Fs> {
        let os = {
            let tx = self.store.begin(0).expect("tx");
            self.store.create_objset(&tx).expect("objset")
        };
        Fs::mount(self.store.clone(), os, hooks, (0, 0)).expect("Fs::mount")
    }

    /// A new mount point directory inside the pool's temporary directory.
    pub fn mount_point(&self, name: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::create_dir(&p).expect("mount point");
        p
    }
}

impl Drop for TestPool {
    fn drop(&mut self) {
        let _ = self.pool.shutdown();
    }
}

/// A mounted filesystem; unmounted on drop (lazily if a test left files open).
pub struct Mounted {
    pub handle: Option<MountHandle>,
    pub fs: Arc<Fs>,
    pub hooks: Arc<TestHooks>,
    pub path: PathBuf,
    // Last: the pool outlives the mount.
    pub pool: Arc<TestPool>,
}

impl Mounted {
    pub fn p(&self, rel: &str) -> PathBuf {
        self.path.join(rel)
    }

    pub fn unmount(&mut self) {
        if let Some(mut h) = self.handle.take() {
            h.unmount().expect("unmount");
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        // Dropping the handle unmounts (MNT_DETACH if busy).
        self.handle.take();
    }
}

pub struct Setup {
    pub device_bytes: u64,
    pub opts: MountOptions,
    pub snapshots: Option<Arc<dyn SnapshotSource>>,
    pub hooks: Option<Arc<TestHooks>>,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            device_bytes: 256 << 20,
            opts: MountOptions::new("fusetest/fs"),
            snapshots: None,
            hooks: None,
        }
    }
}

impl Setup {
    pub fn mount(self) -> Mounted {
        let pool = Arc::new(TestPool::new(self.device_bytes));
        let hooks = self
            .hooks
            .unwrap_or_else(|| Arc::new(TestHooks::new(pool.bytes)));
        let fs = pool.root_fs(hooks.clone());
        mount_on(pool, fs, hooks, self.snapshots, &self.opts)
    }
}

pub fn mount_on(
    pool: Arc<TestPool>,
    fs: Arc<Fs>,
    hooks: Arc<TestHooks>,
    snapshots: Option<Arc<dyn SnapshotSource>>,
    opts: &MountOptions,
) -> Mounted {
    let path = pool.mount_point("mnt");
    let handle = tank_fuse::mount(fs.clone(), snapshots, &path, opts).expect("mount");
    let path = handle.mountpoint().to_path_buf();
    Mounted {
        handle: Some(handle),
        fs,
        hooks,
        path,
        pool,
    }
}

/// A mount with default options.
pub fn mounted() -> Mounted {
    Setup::default().mount()
}

/// Snapshots served from prepared filesystems, counting the opens that found one.
#[derive(Default)]
pub struct TestSnapshots {
    pub snaps: Mutex<Vec<(String, Arc<Fs>)>>,
    pub opens: AtomicU64,
}

impl SnapshotSource for TestSnapshots {
    fn list(&self) -> Vec<String> {
        self.snaps.lock().iter().map(|(n, _)| n.clone()).collect()
    }
    fn open(&self, name: &str) -> Option<Arc<Fs>> {
        let fs = self
            .snaps
            .lock()
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, fs)| fs.clone());
        if fs.is_some() {
            self.opens.fetch_add(1, Ordering::AcqRel);
        }
        fs
    }
}

/// The errno of an io::Error, named for assertion messages.
pub fn errno_of(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

/// Asserts that `r` failed with `expected`.
#[track_caller]
pub fn assert_errno<T: std::fmt::Debug>(r: io::Result<T>, expected: i32) {
    match r {
        Ok(v) => panic!(
            "expected {} ({expected}), got Ok({v:?})",
            Errno(expected).name()
        ),
        Err(e) => assert_eq!(
            errno_of(&e),
            expected,
            "expected {} ({expected}), got {e} ({:?})",
            Errno(expected).name(),
            e.raw_os_error()
        ),
    }
}

pub fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("no NUL in path")
}

/// `-1` → the errno as an io::Error.
pub fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Runs `f` on a thread of its own whose file-system identity is `uid`/`gid` with
/// supplementary `groups` (setfsuid/setfsgid and the raw setgroups syscall act on the
/// calling thread only; glibc's setgroups would change every thread of the process).
/// The thread also gets its own umask (unshare(CLONE_FS)), starting at 022.
pub fn as_user<T: Send>(uid: u32, gid: u32, groups: &[u32], f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            unsafe {
                assert_eq!(libc::unshare(libc::CLONE_FS), 0, "unshare(CLONE_FS)");
                libc::umask(0o022);
                let r = libc::syscall(
                    libc::SYS_setgroups,
                    groups.len() as libc::size_t,
                    groups.as_ptr(),
                );
                assert_eq!(r, 0, "setgroups: {}", io::Error::last_os_error());
                libc::setfsgid(gid);
                libc::setfsuid(uid);
                assert_eq!(libc::setfsuid(u32::MAX) as u32, uid, "setfsuid");
                assert_eq!(libc::setfsgid(u32::MAX) as u32, gid, "setfsgid");
            }
            f()
        })
        .join()
        .expect("user thread panicked")
    })
}

/// Runs `f` as root on a thread with its own umask set to `mask`.
pub fn with_umask<T: Send>(mask: u32, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            unsafe {
                assert_eq!(libc::unshare(libc::CLONE_FS), 0, "unshare(CLONE_FS)");
                libc::umask(mask);
            }
            f()
        })
        .join()
        .expect("umask thread panicked")
    })
}

// Thin wrappers over the libc calls std does not offer; each returns the errno as an
// io::Error.

pub fn utimens(path: &Path, atime: (i64, i64), mtime: (i64, i64)) -> io::Result<()> {
    let times = [
        libc::timespec {
            tv_sec: atime.0,
            tv_nsec: atime.1,
        },
        libc::timespec {
            tv_sec: mtime.0,
            tv_nsec: mtime.1,
        },
    ];
    let p = cstr(path);
    check(unsafe { libc::utimensat(libc::AT_FDCWD, p.as_ptr(), times.as_ptr(), 0) }).map(drop)
}

pub fn renameat2(from: &Path, to: &Path, flags: u32) -> io::Result<()> {
    let (a, b) = (cstr(from), cstr(to));
    check(unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    })
    .map(drop)
}

pub fn setxattr(path: &Path, name: &str, value: &[u8], flags: i32) -> io::Result<()> {
    let (p, n) = (cstr(path), CString::new(name).unwrap());
    check(unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    })
    .map(drop)
}

/// getxattr with a buffer of `size` bytes: (the call's return value, the bytes).
pub fn getxattr(path: &Path, name: &str, size: usize) -> io::Result<(usize, Vec<u8>)> {
    let (p, n) = (cstr(path), CString::new(name).unwrap());
    let mut buf = vec![0u8; size];
    let r = unsafe {
        libc::getxattr(
            p.as_ptr(),
            n.as_ptr(),
            if size == 0 {
                std::ptr::null_mut()
            } else {
                buf.as_mut_ptr().cast()
            },
            size,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(if size == 0 { 0 } else { r as usize });
    Ok((r as usize, buf))
}

pub fn listxattr(path: &Path, size: usize) -> io::Result<(usize, Vec<u8>)> {
    let p = cstr(path);
    let mut buf = vec![0u8; size];
    let r = unsafe {
        libc::listxattr(
            p.as_ptr(),
            if size == 0 {
                std::ptr::null_mut()
            } else {
                buf.as_mut_ptr().cast()
            },
            size,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(if size == 0 { 0 } else { r as usize });
    Ok((r as usize, buf))
}

pub fn removexattr(path: &Path, name: &str) -> io::Result<()> {
    let (p, n) = (cstr(path), CString::new(name).unwrap());
    check(unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) }).map(drop)
}

pub fn statvfs(path: &Path) -> io::Result<libc::statvfs> {
    let p = cstr(path);
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    check(unsafe { libc::statvfs(p.as_ptr(), &mut st) })?;
    Ok(st)
}

pub fn fallocate(file: &std::fs::File, mode: i32, offset: i64, len: i64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    check(unsafe { libc::fallocate(file.as_raw_fd(), mode, offset, len) }).map(drop)
}

pub fn mkfifo(path: &Path, mode: u32) -> io::Result<()> {
    let p = cstr(path);
    check(unsafe { libc::mkfifo(p.as_ptr(), mode) }).map(drop)
}

/// access(2) with the thread's effective (file-system) identity: plain access(2) checks
/// with the real uid, which `as_user` leaves at root.
pub fn access(path: &Path, mode: i32) -> io::Result<()> {
    let p = cstr(path);
    check(unsafe { libc::faccessat(libc::AT_FDCWD, p.as_ptr(), mode, libc::AT_EACCESS) }).map(drop)
}

/// open(2) with explicit flags and mode.
pub fn open_raw(path: &Path, flags: i32, mode: u32) -> io::Result<std::fs::File> {
    use std::os::fd::FromRawFd;
    let p = cstr(path);
    let fd = check(unsafe { libc::open(p.as_ptr(), flags | libc::O_CLOEXEC, mode) })?;
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
}

/// Deterministic bytes that do not compress.
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// Pins the calling thread to CPU 0 (over io_uring, its requests then share one queue).
pub fn pin_to_cpu0() {
    let mut set = nix::sched::CpuSet::new();
    set.set(0).expect("CPU 0");
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).expect("affinity");
}
