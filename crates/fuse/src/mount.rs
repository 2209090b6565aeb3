//! Mounting, the session's life, and unmounting.
//!
//! # Theory of operation
//! `mount` checks what it can before touching the kernel, so that each failure gets its own
//! message (no /dev/fuse, no permission, missing mount point, something mounted there
//! already), opens /dev/fuse and calls mount(2) itself (type `fuse.tank`, source
//! `tank:<dataset>`, `default_permissions`, `allow_other`), then lets fuser read the kernel's INIT on that
//! descriptor (`Session::from_fd`). No libfuse and no fusermount are involved.
//!
//! The session runs on a thread of its own, which starts `threads` readers of the kernel's
//! queue (each with its own cloned /dev/fuse descriptor) and waits for them. The readers
//! end when the kernel ends the connection, which happens when the filesystem is unmounted,
//! by us or by anyone (`umount`, `tank unmount`). The session thread then syncs the live
//! filesystem (`Fs::sync_all`) and reports both outcomes.
//!
//! # Unmount
//! `MountHandle::unmount` is umount2(2) without flags: it fails with EBUSY while files are
//! open, and then nothing changes. Dropping a handle still mounted unmounts it the same way,
//! and if that is refused as busy, detaches it (MNT_DETACH): the mount disappears from the
//! namespace at once and the session ends, and syncs, when the last open file is closed.
//! `MountHandle::force_unmount` (a forced destroy) aborts a busy mount's connection
//! instead (MNT_FORCE, then MNT_DETACH): its open files fail from then on.
//! The free function `unmount` is for a mount owned by another process: plain umount2,
//! lazy when busy, `fusermount -u -z` when not permitted.
//! Before unmounting a path we check that the session is still alive, so that a mount made
//! later at the same place by someone else is never unmounted by mistake.
//!
//! A mount of tank's own (`fuse.tank`) whose server is gone, left by a daemon that was
//! killed, is detached when a filesystem is mounted at its place again, so that a restart
//! after a crash mounts everything as before; any other FUSE mount there is refused. A mount
//! is taken for dead when statfs(2) of it fails with ENOTCONN (a stat may be answered from
//! the kernel's cache without reaching the server).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use fuser::{Config, Session, SessionACL};
use nix::errno::Errno as NixErrno;
use nix::mount::{MntFlags, MsFlags};
use tank_dataset::posix::{Fs, ROOT_INO};
use tank_dataset::Errno;

use crate::options::{MountError, MountOptions};
use crate::server::{Server, MAX_IO_BYTES};
use crate::SnapshotSource;

/// A ring entry's payload buffer must hold the largest request or reply: max_write and
/// max_pages pages, both 1 MiB here; a page more in case the kernel rounds.
const RING_PAYLOAD_SLACK: u32 = 4096;

pub const FUSE_DEVICE: &str = "/dev/fuse";
/// The filesystem type shown by `mount` (`fuse` with our subtype).
pub const FS_TYPE: &str = "fuse.tank";

/// How the session ended.
struct SessionEnd {
    run: io::Result<()>,
    sync: Result<(), Errno>,
}

/// A mounted filesystem. Dropping it unmounts (lazily if busy).
pub struct MountHandle {
    dir: PathBuf,
    session: Option<JoinHandle<SessionEnd>>,
    /// Requests come through the kernel's io_uring queues (`ring.rs`).
    io_uring: bool,
    /// Sends the kernel cache invalidations (changes made by other front ends).
    notifier: Option<Arc<fuser::Notifier>>,
}

/// Unmounts a `MountHandle`'s filesystem from another thread (e.g. a signal handler's),
/// while the owner waits in `MountHandle::wait`.
#[derive(Debug, Clone)]
pub struct Unmounter {
    dir: PathBuf,
}

impl Unmounter {
    /// umount2(2) without flags: EBUSY while files are open.
    pub fn unmount(&self) -> Result<(), MountError> {
        umount_strict(&self.dir)
    }
}

impl std::fmt::Debug for MountHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MountHandle")
            .field("dir", &self.dir)
            .field("mounted", &self.is_mounted())
            .finish()
    }
}

impl MountHandle {
    /// The mount point (canonical).
    pub fn mountpoint(&self) -> &Path {
        &self.dir
    }

    /// Whether requests come through the kernel's per-CPU io_uring queues rather than
    /// reads of /dev/fuse.
    pub fn io_uring(&self) -> bool {
        self.io_uring
    }

    /// What drops the kernel's caches of files changed past the mount (by another front
    /// end on the same filesystem): the attributes and pages of the inodes given, and the
    /// directory entries `(parent, name)`. What the kernel does not hold is skipped; once
    /// the mount is gone the kernel refuses them, which is ignored.
    #[allow(clippy::type_complexity)]
    pub fn invalidator(&self) -> Option<Arc<dyn Fn(&[u64], &[(u64, Vec<u8>)]) + Send + Sync>> {
        use std::os::unix::ffi::OsStrExt;
        let n = self.notifier.clone()?;
        Some(Arc::new(
            move |inodes: &[u64], entries: &[(u64, Vec<u8>)]| {
                for (parent, name) in entries {
                    let _ =
                        n.inval_entry(fuser::INodeNo(*parent), std::ffi::OsStr::from_bytes(name));
                }
                for ino in inodes {
                    let _ = n.inval_inode(fuser::INodeNo(*ino), 0, 0);
                }
            },
        ))
    }

    /// Whether the session still runs (false once unmounted, by anyone).
    pub fn is_mounted(&self) -> bool {
        self.session.as_ref().is_some_and(|s| !s.is_finished())
    }

    pub fn unmounter(&self) -> Unmounter {
        Unmounter {
            dir: self.dir.clone(),
        }
    }

    /// Unmounts, waits for the session to end and syncs the filesystem. EBUSY (files open)
    /// leaves everything as it was. Calling it again after success does nothing.
    pub fn unmount(&mut self) -> Result<(), MountError> {
        let Some(session) = &self.session else {
            return Ok(());
        };
        if !session.is_finished() {
            match umount_strict(&self.dir) {
                Ok(()) => {}
                // Unmounted by someone else meanwhile: the session ends by itself.
                Err(MountError::NotMounted(_)) => {}
                Err(e) => return Err(e),
            }
        }
        self.wait()
    }

    /// Unmounts even while files are open (`zfs destroy -f`): when a plain unmount is
    /// refused as busy, the connection is aborted (MNT_FORCE), so that every open file and
    /// working directory in it fails with ENOTCONN from then on, and the mount is detached
    /// (MNT_DETACH); the session ends at once. For a dataset about to be destroyed.
    pub fn force_unmount(&mut self) -> Result<(), MountError> {
        let Some(session) = &self.session else {
            return Ok(());
        };
        if !session.is_finished() {
            match umount_strict(&self.dir) {
                Ok(()) | Err(MountError::NotMounted(_)) => {}
                Err(MountError::Busy(_)) => {
                    if umount2_forced(&self.dir).is_err() {
                        return Err(MountError::Busy(self.dir.clone()));
                    }
                }
                Err(e) => return Err(e),
            }
        }
        self.wait()
    }

    /// Blocks until the session ends (the filesystem was unmounted, by anyone), then
    /// reports the session's end and the final sync.
    pub fn wait(&mut self) -> Result<(), MountError> {
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        let end = session.join().map_err(|_| MountError::Session {
            dir: self.dir.clone(),
            source: io::Error::other("the session thread panicked"),
        })?;
        end.run.map_err(|source| MountError::Session {
            dir: self.dir.clone(),
            source,
        })?;
        end.sync.map_err(|errno| MountError::Sync {
            dir: self.dir.clone(),
            errno,
        })
    }
}

impl Drop for MountHandle {
    fn drop(&mut self) {
        let Some(session) = &self.session else {
            return;
        };
        if !session.is_finished() {
            match umount_strict(&self.dir) {
                Ok(()) | Err(MountError::NotMounted(_)) => {}
                Err(_) => {
                    // Busy: detach now; the session (and its final sync) ends with the last
                    // open file. Not joined: that may be much later.
                    let _ = nix::mount::umount2(&self.dir, MntFlags::MNT_DETACH);
                    self.session = None;
                    return;
                }
            }
        }
        let _ = self.wait();
    }
}

/// Opens the FUSE device at `path`, saying what to do when it cannot be used.
pub(crate) fn open_fuse_device(path: &Path) -> Result<File, MountError> {
    let unavailable = |why: String| MountError::FuseUnavailable(why);
    match std::fs::metadata(path) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(unavailable(format!(
                "{} is missing; load the fuse module (modprobe fuse) or run the container \
                 with --device /dev/fuse",
                path.display()
            )));
        }
        Err(e) => return Err(unavailable(format!("{}: {e}", path.display()))),
    }
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::EACCES) | Some(libc::EPERM) => unavailable(format!(
                "cannot open {}: {e}; run tank as root, and in a container allow the device \
                 (--device /dev/fuse)",
                path.display()
            )),
            Some(libc::ENODEV) | Some(libc::ENXIO) => unavailable(format!(
                "cannot open {}: {e}; the fuse kernel module is not loaded (modprobe fuse)",
                path.display()
            )),
            _ => unavailable(format!("cannot open {}: {e}", path.display())),
        })
}

/// One line of /proc/self/mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MountInfo {
    pub dev: (u32, u32),
    pub mount_point: PathBuf,
    pub fs_type: String,
    pub source: String,
}

/// Undoes mountinfo's octal escapes (`\040` for a space, ...).
fn unescape(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let digit = |k: usize| u16::from(b[i + k] - b'0');
            out.push((digit(1) * 64 + digit(2) * 8 + digit(3)) as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

pub(crate) fn parse_mountinfo(text: &str) -> Vec<MountInfo> {
    use std::os::unix::ffi::OsStringExt;
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let l: Vec<&str> = left.split(' ').collect();
            let r: Vec<&str> = right.split(' ').collect();
            let (maj, min) = l.get(2)?.split_once(':')?;
            Some(MountInfo {
                dev: (maj.parse().ok()?, min.parse().ok()?),
                mount_point: PathBuf::from(std::ffi::OsString::from_vec(unescape(l.get(4)?))),
                fs_type: String::from_utf8_lossy(&unescape(r.first()?)).into_owned(),
                source: String::from_utf8_lossy(&unescape(r.get(1)?)).into_owned(),
            })
        })
        .collect()
}

/// The topmost mount at `dir`, if `dir` is a mount point.
pub(crate) fn mount_at(dir: &Path) -> Option<MountInfo> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    parse_mountinfo(&text)
        .into_iter()
        .rev()
        .find(|m| m.mount_point == dir)
}

/// `dir` with its parent resolved but not its last component, which is not looked at:
/// a FUSE mount there whose server hangs would hang us too.
fn resolve_parent(dir: &Path) -> io::Result<PathBuf> {
    match (dir.parent(), dir.file_name()) {
        (Some(parent), Some(name)) => {
            let parent = if parent.as_os_str().is_empty() {
                Path::new(".")
            } else {
                parent
            };
            Ok(parent.canonicalize()?.join(name))
        }
        _ => dir.canonicalize(),
    }
}

/// Whether the FUSE mount at `dir` has lost its server (a process that mounted it and was
/// killed): a statfs(2) of it fails with ENOTCONN. Not a stat: the kernel answers that from
/// the root's cached attributes for as long as they are valid, without asking the server,
/// and a daemon restarted at once took its own dead mount for a live one. Asked on a thread
/// of its own, for at most 2 s, so that a live server that hangs does not hang us.
fn server_gone(dir: &Path) -> bool {
    let (tx, rx) = std::sync::mpsc::channel();
    let d = dir.to_path_buf();
    let _ = std::thread::Builder::new()
        .name("tank-stat".into())
        .spawn(move || {
            let gone = matches!(
                nix::sys::statvfs::statvfs(&d),
                Err(nix::errno::Errno::ENOTCONN)
            );
            let _ = tx.send(gone);
        });
    rx.recv_timeout(std::time::Duration::from_secs(2))
        .unwrap_or(false)
}

fn fuse_mounted_at(dir: &Path) -> Result<(), MountError> {
    match mount_at(dir) {
        // tank's own mount whose server is gone (the daemon was killed): detached, so that
        // the restarted daemon mounts its filesystems again with no step by hand.
        Some(m) if m.fs_type == FS_TYPE && server_gone(dir) => {
            nix::mount::umount2(dir, MntFlags::MNT_DETACH).map_err(|e| MountError::Io {
                op: "cannot detach the dead mount at",
                path: dir.to_path_buf(),
                source: io::Error::from(e),
            })?;
            fuse_mounted_at(dir)
        }
        // Another kind of filesystem mounted there is simply covered (as mount(8) does);
        // a FUSE filesystem there is most likely this one, mounted twice.
        Some(m) if m.fs_type == "fuse" || m.fs_type.starts_with("fuse.") => {
            Err(MountError::AlreadyMounted {
                dir: dir.to_path_buf(),
                what: format!("{} {}", m.fs_type, m.source),
            })
        }
        _ => Ok(()),
    }
}

/// The canonical mount point, after checking it can take a mount.
fn check_mount_point(dir: &Path) -> Result<PathBuf, MountError> {
    let io_error = |op, path: &Path, source: io::Error| match source.raw_os_error() {
        Some(libc::ENOENT) => MountError::MountPointMissing(dir.to_path_buf()),
        Some(libc::ENOTDIR) => MountError::NotADirectory(dir.to_path_buf()),
        Some(libc::ENOTCONN) => MountError::AlreadyMounted {
            dir: dir.to_path_buf(),
            what: "a FUSE filesystem whose server is gone; run `tank unmount`".into(),
        },
        _ => MountError::Io {
            op,
            path: path.to_path_buf(),
            source,
        },
    };
    let lexical = resolve_parent(dir).map_err(|e| io_error("cannot resolve", dir, e))?;
    fuse_mounted_at(&lexical)?;
    let canonical = lexical
        .canonicalize()
        .map_err(|e| io_error("cannot resolve", &lexical, e))?;
    if canonical != lexical {
        fuse_mounted_at(&canonical)?;
    }
    let meta = std::fs::metadata(&canonical)
        .map_err(|e| io_error("cannot stat mount point", &canonical, e))?;
    if !meta.is_dir() {
        return Err(MountError::NotADirectory(canonical));
    }
    Ok(canonical)
}

/// Mounts `fs` on `dir`, with the snapshots of `snapshots` under `.tank/snapshot`.
pub fn mount(
    fs: Arc<Fs>,
    snapshots: Option<Arc<dyn SnapshotSource>>,
    dir: &Path,
    opts: &MountOptions,
) -> Result<MountHandle, MountError> {
    let dir = check_mount_point(dir)?;
    let device = open_fuse_device(Path::new(FUSE_DEVICE))?;

    // The root's mode before the first getattr; the kernel only insists on the type bits.
    let root_mode = fs
        .getattr(ROOT_INO)
        .map(|a| a.mode())
        .unwrap_or(libc::S_IFDIR | 0o755);
    let mut data = format!(
        "fd={},rootmode={:o},user_id={},group_id={}",
        device.as_raw_fd(),
        root_mode,
        nix::unistd::geteuid(),
        nix::unistd::getegid()
    );
    // The kernel checks permissions itself against the attributes we last replied with
    // (server.rs, "Permissions"): a chmod through the mount applies at the next access.
    data.push_str(",default_permissions");
    if opts.allow_other {
        data.push_str(",allow_other");
    }
    let mut flags = MsFlags::empty();
    flags.set(MsFlags::MS_NOSUID, !opts.setuid);
    flags.set(MsFlags::MS_NODEV, !opts.devices);
    flags.set(MsFlags::MS_NOEXEC, !opts.exec);
    flags.set(MsFlags::MS_RDONLY, opts.read_only);
    let source = format!("tank:{}", opts.name);
    nix::mount::mount(
        Some(source.as_str()),
        &dir,
        Some(FS_TYPE),
        flags,
        Some(data.as_str()),
    )
    .map_err(|e| match e {
        NixErrno::EPERM | NixErrno::EACCES => MountError::NotPermitted {
            dir: dir.clone(),
            detail: e.desc().to_string(),
        },
        NixErrno::ENODEV => MountError::FuseUnavailable(
            "the kernel knows no fuse filesystem type; load the fuse module (modprobe fuse)".into(),
        ),
        _ => MountError::Io {
            op: "mount(2) failed on",
            path: dir.clone(),
            source: io::Error::from_raw_os_error(e as i32),
        },
    })?;

    // The rings exist before INIT asks for them: once the kernel grants io_uring, requests
    // wait until every queue has an entry.
    let rings = if opts.io_uring && crate::ring::kernel_offers() {
        crate::ring::Rings::prepare(
            (MAX_IO_BYTES + RING_PAYLOAD_SLACK) as usize,
            opts.ring_workers,
        )
        .ok()
        .filter(|r| r.queues() > 0)
    } else {
        None
    };
    let ring_device = match &rings {
        Some(_) => device.try_clone().ok().map(|f| Arc::new(OwnedFd::from(f))),
        None => None,
    };
    let server = Server::new(
        fs.clone(),
        snapshots,
        opts,
        rings.is_some() && ring_device.is_some(),
    );
    let granted = server.uring.clone();
    let mut config = Config::default();
    config.n_threads = Some(opts.thread_count());
    config.clone_fd = true;
    config.acl = if opts.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    let acl = config.acl;
    let session = match Session::from_fd(server, OwnedFd::from(device), acl, config) {
        Ok(s) => s,
        Err(source) => {
            let _ = nix::mount::umount2(&dir, MntFlags::MNT_DETACH);
            return Err(MountError::Session { dir, source });
        }
    };
    let uring = match (rings, ring_device) {
        (Some(r), Some(d)) if granted.load(std::sync::atomic::Ordering::Acquire) => Some((r, d)),
        _ => None,
    };
    let io_uring = uring.is_some();
    let notifier = session.notifier();
    let thread = std::thread::Builder::new()
        .name("tank-fuse".into())
        .spawn(move || {
            let run = match uring {
                Some((rings, device)) => session.run_with(|d| rings.start(device, d, granted)),
                None => session.run(),
            };
            let sync = fs.sync_all();
            SessionEnd { run, sync }
        });
    let thread = match thread {
        Ok(t) => t,
        Err(source) => {
            let _ = nix::mount::umount2(&dir, MntFlags::MNT_DETACH);
            return Err(MountError::Session { dir, source });
        }
    };
    tune_backing_device(&dir);
    Ok(MountHandle {
        notifier: Some(Arc::new(notifier)),
        dir,
        session: Some(thread),
        io_uring,
    })
}

/// The readahead window of a mount's backing device, in KiB (`tune_backing_device`).
pub const READAHEAD_KB: u32 = 4096;

/// The mount's own backing device (`/sys/class/bdi/<dev>`) is tuned, best effort (the
/// sysfs entries may be read-only in a container, or absent on an older kernel):
/// - readahead: the kernel caps FUSE readahead at the device default (128 KiB) whatever
///   INIT asks; raised to 4 MiB, four requests of 1 MiB at once. A reader that asks for
///   more than the window at a time (smbd reads 8 MiB per SMB READ) waits for it a window
///   at a time: with 1 MiB, one request at a time. smbclient's get of 1 GiB through a share,
///   the file out of the page cache, 6 runs each alternated: 1,256 MB/s with 1 MiB, 1,305
///   with 2 MiB, 1,434 with 4 MiB (medians; 8 MiB was slower, about 1,000); a local `dd`
///   with 1 MiB reads moved within its spread (2.0-2.5 GB/s).
/// - dirty pages: the kernel lets a FUSE mount hold at most 1 % of the dirty-page threshold
///   (strictly, about 40 MB on a 24 GiB host), a guard against untrusted servers. With the
///   writeback cache that throttles a streaming writer long before the server or the pool
///   is busy: 2 GiB written through the mount ran at 330-600 MB/s, and at 850-1,000 MB/s
///   with the limit raised to 256-512 MiB. `dirty_page_limit` raises it (`max_bytes`,
///   Linux 6.2 and later; the strict per-mount limit stays).
///
/// Where a setting cannot be made the process says so once on stderr (the daemon's log), not
/// at every mount.
fn tune_backing_device(dir: &Path) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let Err(why) = try_tune_backing_device(dir) else {
        return;
    };
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "warning: FUSE mounts keep the kernel's defaults ({why}): streams through them \
             read ahead 128 KiB and hold about 1 % of the dirty-page threshold"
        );
    }
}

fn try_tune_backing_device(dir: &Path) -> Result<(), String> {
    let m = mount_at(dir).ok_or_else(|| format!("{} is not in the mount table", dir.display()))?;
    let bdi = format!("/sys/class/bdi/{}:{}", m.dev.0, m.dev.1);
    let set = |name: &str, value: String| {
        std::fs::write(format!("{bdi}/{name}"), value)
            .map_err(|e| format!("cannot write {bdi}/{name}: {e}"))
    };
    let readahead = set("read_ahead_kb", READAHEAD_KB.to_string());
    let limit = dirty_page_limit(tank_object::arc::physical_memory());
    let dirty = set("max_bytes", limit.to_string());
    match (readahead, dirty) {
        (Ok(()), Ok(())) => Ok(()),
        (Err(a), Err(b)) => Err(format!("{a}; {b}")),
        (Err(e), _) | (_, Err(e)) => Err(e),
    }
}

/// Dirty page-cache bytes a mount may hold: 1/16 of memory, from 64 MiB to 512 MiB (the
/// pool's own dirty data, up to a tenth of memory and 1 GiB, comes on top).
fn dirty_page_limit(memory: u64) -> u64 {
    (memory / 16).clamp(64 << 20, 512 << 20)
}

fn umount_strict(dir: &Path) -> Result<(), MountError> {
    nix::mount::umount2(dir, MntFlags::empty()).map_err(|e| match e {
        NixErrno::EBUSY => MountError::Busy(dir.to_path_buf()),
        NixErrno::EINVAL => MountError::NotMounted(dir.to_path_buf()),
        NixErrno::ENOENT => MountError::MountPointMissing(dir.to_path_buf()),
        NixErrno::EPERM => MountError::NotPermitted {
            dir: dir.to_path_buf(),
            detail: e.desc().to_string(),
        },
        _ => MountError::Io {
            op: "umount2(2) failed on",
            path: dir.to_path_buf(),
            source: io::Error::from_raw_os_error(e as i32),
        },
    })
}

/// Aborts the connection of the FUSE mount at `dir` (MNT_FORCE) and detaches it.
fn umount2_forced(dir: &Path) -> nix::Result<()> {
    match nix::mount::umount2(dir, MntFlags::MNT_FORCE) {
        Ok(()) => Ok(()),
        Err(_) => nix::mount::umount2(dir, MntFlags::MNT_DETACH),
    }
}

/// Unmounts the FUSE filesystem at `dir`, whoever serves it: a plain unmount, a lazy one
/// (MNT_DETACH) when it is busy, `fusermount -u -z` when this process may not unmount.
/// Refuses mount points that are not FUSE filesystems.
pub fn unmount(dir: &Path) -> Result<(), MountError> {
    // The mount point itself is not looked at: its server may hang or be gone.
    let dir = resolve_parent(dir).unwrap_or_else(|_| dir.to_path_buf());
    let Some(m) = mount_at(&dir) else {
        return Err(MountError::NotMounted(dir));
    };
    if m.fs_type != "fuse" && !m.fs_type.starts_with("fuse.") {
        return Err(MountError::NotFuse {
            what: format!("{} {}", m.fs_type, m.source),
            dir,
        });
    }
    match umount_strict(&dir) {
        Ok(()) => Ok(()),
        Err(MountError::Busy(_)) => {
            nix::mount::umount2(&dir, MntFlags::MNT_DETACH).map_err(|e| MountError::Io {
                op: "lazy unmount of",
                path: dir.clone(),
                source: io::Error::from_raw_os_error(e as i32),
            })
        }
        Err(MountError::NotPermitted { detail, .. }) => fusermount_unmount(&dir, &detail),
        Err(e) => Err(e),
    }
}

fn fusermount_unmount(dir: &Path, detail: &str) -> Result<(), MountError> {
    for tool in ["fusermount3", "fusermount"] {
        match std::process::Command::new(tool)
            .args(["-u", "-z", "--"])
            .arg(dir)
            .output()
        {
            Ok(out) if out.status.success() => return Ok(()),
            Ok(out) => {
                return Err(MountError::NotPermitted {
                    dir: dir.to_path_buf(),
                    detail: format!(
                        "{detail}; {tool}: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    ),
                })
            }
            Err(_) => continue,
        }
    }
    Err(MountError::NotPermitted {
        dir: dir.to_path_buf(),
        detail: format!("{detail}; no fusermount found"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dirty_page_limit_scales_with_memory_within_bounds() {
        assert_eq!(dirty_page_limit(512 << 20), 64 << 20);
        assert_eq!(dirty_page_limit(4 << 30), 256 << 20);
        assert_eq!(dirty_page_limit(64 << 30), 512 << 20);
    }

    #[test]
    fn missing_device_says_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let err = open_fuse_device(&dir.path().join("fuse")).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, MountError::FuseUnavailable(_)), "{err:?}");
        assert!(msg.starts_with("FUSE is not available:"), "{msg}");
        assert!(msg.contains("is missing"), "{msg}");
        assert!(msg.contains("--device /dev/fuse"), "{msg}");
        assert!(msg.contains("modprobe fuse"), "{msg}");
    }

    #[test]
    fn mount_point_errors_are_specific() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        assert!(matches!(
            check_mount_point(&missing),
            Err(MountError::MountPointMissing(p)) if p == missing
        ));
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        let err = check_mount_point(&file).unwrap_err();
        assert!(matches!(err, MountError::NotADirectory(_)), "{err:?}");
        assert!(err.to_string().contains("not a directory"));
        assert_eq!(
            check_mount_point(dir.path()).unwrap(),
            dir.path().canonicalize().unwrap()
        );
    }

    #[test]
    fn mountinfo_lines_are_parsed() {
        let text = "22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/root rw\n\
                    36 22 0:52 / /mnt/my\\040pool rw,nosuid,nodev,relatime - fuse.tank tank:my\\040pool rw,user_id=0\n\
                    garbage line\n";
        let v = parse_mountinfo(text);
        assert_eq!(v.len(), 2);
        assert_eq!(v[1].dev, (0, 52));
        assert_eq!(v[1].mount_point, PathBuf::from("/mnt/my pool"));
        assert_eq!(v[1].fs_type, "fuse.tank");
        assert_eq!(v[1].source, "tank:my pool");
        assert_eq!(unescape("a\\134b\\011"), b"a\\b\t".to_vec());
        assert_eq!(unescape("trail\\04"), b"trail\\04".to_vec());
    }

    #[test]
    fn unmount_refuses_what_is_not_a_fuse_mount() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            unmount(dir.path()),
            Err(MountError::NotMounted(_))
        ));
        // "/" is mounted, but not FUSE.
        let err = unmount(Path::new("/")).unwrap_err();
        assert!(
            matches!(err, MountError::NotFuse { .. } | MountError::NotMounted(_)),
            "{err:?}"
        );
    }
}
