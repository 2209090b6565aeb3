//! The mount table: which filesystems a service serves through its local FUSE front end,
//! and the policy around them (unmount before destroy and rollback, remount after).
//!
//! # Theory of operation
//! The FUSE front end sits above this crate: the binary gives the service a [`Mounter`]
//! that serves a dataset's shared filesystem handle at a directory and returns a
//! [`MountedFs`] that unmounts it. The table here decides what is mounted where: at a
//! dataset's `mountpoint` or a directory given, children after parents, deepest first when
//! unmounting, and what to mount again after a rollback or a failed destroy. A service
//! without a mounter (a test, a tool) refuses mount requests with a clear error.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use parking_lot::Mutex;
use tank_dataset::posix::{DatasetHooks, Fs};
use tank_dataset::{DatasetKind, DsHooks, Dsl};
use tank_object::ObjectStore;

use crate::api::MountInfo;
use crate::handles::{Changed, DatasetEvent, Handles, Hold, Holder};

/// The snapshots of one dataset, for a front end's `.tank/snapshot` directory.
pub struct Snapshots {
    pub dsl: Arc<Dsl>,
    pub store: Arc<ObjectStore>,
    pub head: u64,
}

impl Snapshots {
    pub fn list(&self) -> Vec<String> {
        self.dsl
            .snapshots(self.head)
            .into_iter()
            .filter_map(|id| self.dsl.record(id).ok())
            .map(|r| r.name)
            .collect()
    }

    pub fn open(&self, name: &str) -> Option<Arc<Fs>> {
        let full = format!("{}@{name}", self.dsl.name_of(self.head));
        let id = self.dsl.resolve(&full).ok()?;
        let objset = self.dsl.snapshot_objset(id).ok()?;
        let hooks = Arc::new(DsHooks {
            dsl: self.dsl.clone(),
            id,
            snapshot: true,
        });
        Fs::mount(self.store.clone(), objset, hooks, (0, 0)).ok()
    }
}

/// What a mounter is asked to serve.
pub struct MountRequest {
    pub dataset: String,
    pub dir: PathBuf,
    pub fs: Arc<Fs>,
    pub snapshots: Arc<Snapshots>,
    /// The dataset's `sync` property (standard, always, disabled).
    pub sync: tank_dataset::posix::SyncMode,
    /// Where the mount counts its requests (protocol `fuse`).
    pub protocols: Arc<crate::stats::ProtocolStats>,
    /// The processes whose writes must not wait in a writeback cache (`WriteThrough`).
    pub write_through: Arc<WriteThrough>,
}

/// The process group whose writable opens a mount serves past the kernel's writeback
/// cache, so that each write reaches the filesystem before it is answered and a failure
/// (a full quota or pool, EDQUOT or ENOSPC) is the write's own error: a file server that
/// acknowledges what a client wrote once `write(2)` returns, as smbd does, and does not
/// report a failed `close`. Everyone else keeps the cache. No group (0) by default.
#[derive(Debug, Default)]
pub struct WriteThrough {
    group: std::sync::atomic::AtomicI32,
}

impl WriteThrough {
    /// Serves the writes of process group `pgid` (`None`: nobody's) past the cache.
    pub fn set(&self, pgid: Option<i32>) {
        self.group
            .store(pgid.unwrap_or(0), std::sync::atomic::Ordering::SeqCst);
    }

    /// The group, if one is set.
    pub fn group(&self) -> Option<i32> {
        Some(self.group.load(std::sync::atomic::Ordering::SeqCst)).filter(|g| *g > 0)
    }
}

/// A front end that serves filesystems at directories (the FUSE mount).
pub trait Mounter: Send + Sync {
    fn mount(&self, req: MountRequest) -> Result<Box<dyn MountedFs>>;
}

/// One served filesystem.
pub trait MountedFs: Send {
    /// Unmounts it (refused while busy: the handle is kept).
    fn unmount(&mut self) -> Result<()>;
    /// Whether it is still mounted (after a failed unmount: refused, or unmounted but its
    /// final sync failed).
    fn is_mounted(&self) -> bool {
        true
    }
    /// Unmounts it even while busy (a forced destroy): its open files fail from then on.
    fn force_unmount(&mut self) -> Result<()> {
        self.unmount()
    }
    /// Whether requests come through the kernel's io_uring queues.
    fn io_uring(&self) -> bool {
        false
    }
    /// Blocks until the filesystem is unmounted (by anyone).
    fn wait(&mut self) -> Result<()>;
    /// What drops the kernel's caches of files another front end changed, if the mount
    /// has caches to drop.
    fn invalidator(&self) -> Option<Invalidator> {
        None
    }
    /// Something that unmounts it from another thread (a signal handler).
    fn unmounter(&self) -> Box<dyn Fn() + Send>;
}

struct Mounted {
    pool: String,
    dataset: String,
    dir: PathBuf,
    handle: Box<dyn MountedFs>,
    /// The mount's share of the dataset's handle (dropped after the unmount).
    hold: Hold,
}

/// Drops what a mount's kernel caches of changed files.
pub type Invalidator = Arc<dyn Fn(&Changed) + Send + Sync>;

/// A FUSE mount as a holder of its dataset: the service's policy unmounts it before a
/// rollback or destroy and mounts it again after; what another front end changes is
/// dropped from the kernel's caches of the mount (its invalidator, once it is mounted).
#[derive(Default)]
struct MountHolder {
    invalidate: std::sync::OnceLock<Invalidator>,
}

impl Holder for MountHolder {
    fn notify(&self, event: &DatasetEvent) {
        if let (DatasetEvent::Changed(c), Some(inval)) = (event, self.invalidate.get()) {
            inval(c);
        }
    }
}

/// The mounts of one service.
#[derive(Default)]
pub struct Mounts {
    mounter: Mutex<Option<Arc<dyn Mounter>>>,
    table: Mutex<Vec<Mounted>>,
    handles: Arc<Handles>,
    protocols: Arc<crate::stats::ProtocolStats>,
    write_through: Arc<WriteThrough>,
}

/// The pool a dataset name belongs to.
pub fn pool_of(name: &str) -> &str {
    name.split(['/', '@']).next().unwrap_or(name)
}

impl Mounts {
    /// The request counters the mounts report to (the service's).
    pub fn protocols(&self) -> &Arc<crate::stats::ProtocolStats> {
        &self.protocols
    }

    /// Whose writes the mounts serve past the writeback cache (a file server's).
    pub fn write_through(&self) -> &Arc<WriteThrough> {
        &self.write_through
    }

    /// The dataset handles the mounts hold (the service's).
    pub fn handles(&self) -> &Arc<Handles> {
        &self.handles
    }

    pub fn set_mounter(&self, m: Arc<dyn Mounter>) {
        *self.mounter.lock() = Some(m);
    }

    pub fn has_mounter(&self) -> bool {
        self.mounter.lock().is_some()
    }

    pub fn list(&self) -> Vec<MountInfo> {
        self.table
            .lock()
            .iter()
            .map(|m| MountInfo {
                dataset: m.dataset.clone(),
                dir: m.dir.clone(),
            })
            .collect()
    }

    /// The directory a dataset mounts on: `dir`, else its mountpoint property.
    fn mount_dir(dsl: &Dsl, id: u64, name: &str, dir: Option<&Path>) -> Result<PathBuf> {
        if let Some(d) = dir {
            return Ok(d.to_path_buf());
        }
        let mp = dsl.prop(id, "mountpoint")?;
        if mp == "none" || mp == "legacy" {
            bail!(crate::ServiceError::Invalid(format!(
                "cannot mount '{name}': its mountpoint is '{mp}'; give a directory ('tank mount {name} DIR') or set one ('tank dataset set mountpoint=/PATH {name}')"
            )));
        }
        Ok(PathBuf::from(mp))
    }

    /// Mounts a filesystem dataset of an open pool; returns where, and whether requests
    /// come over io_uring.
    pub fn mount(
        &self,
        dsl: &Arc<Dsl>,
        store: &Arc<ObjectStore>,
        name: &str,
        dir: Option<&Path>,
    ) -> Result<(PathBuf, bool)> {
        let Some(mounter) = self.mounter.lock().clone() else {
            bail!(crate::ServiceError::Invalid(format!(
                "cannot mount '{name}': this service has no FUSE front end"
            )));
        };
        let id = dsl.resolve(name)?;
        let rec = dsl.record(id)?;
        if rec.kind != DatasetKind::Filesystem {
            bail!(crate::ServiceError::Invalid(format!(
                "cannot mount '{name}': it is a {} (only filesystems mount; snapshots are under .tank/snapshot)",
                rec.kind.name()
            )));
        }
        let dir = Self::mount_dir(dsl, id, name, dir)?;
        // Made where missing; one that cannot be looked at (the dead mount of a daemon that
        // was killed: ENOTCONN) is the FUSE front end's to judge.
        if matches!(std::fs::symlink_metadata(&dir), Err(e) if e.kind() == std::io::ErrorKind::NotFound)
        {
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create mount point {}", dir.display()))?;
        }
        let holder = Arc::new(MountHolder::default());
        let hold = self.handles.hold(
            dsl,
            store,
            name,
            &format!("mounted at {}", dir.display()),
            holder.clone(),
        )?;
        let Some(fs) = hold.fs() else {
            bail!(crate::ServiceError::Busy(format!(
                "cannot mount '{name}': it is being rolled back"
            )));
        };
        let sync = DsHooks {
            dsl: dsl.clone(),
            id,
            snapshot: false,
        }
        .sync_mode();
        let snapshots = Arc::new(Snapshots {
            dsl: dsl.clone(),
            store: store.clone(),
            head: id,
        });
        // On failure the hold is dropped, and the dataset is free again.
        let handle = mounter.mount(MountRequest {
            dataset: name.to_string(),
            dir: dir.clone(),
            fs,
            snapshots,
            sync,
            protocols: self.protocols.clone(),
            write_through: self.write_through.clone(),
        })?;
        let uring = handle.io_uring();
        if let Some(inval) = handle.invalidator() {
            let _ = holder.invalidate.set(inval);
        }
        self.table.lock().push(Mounted {
            pool: pool_of(name).to_string(),
            dataset: name.to_string(),
            dir: dir.clone(),
            handle,
            hold,
        });
        Ok((dir, uring))
    }

    /// After a rename: the mounts of `from` and its descendants go by their new names.
    pub fn renamed(&self, from: &str, to: &str) {
        let below = format!("{from}/");
        for m in self.table.lock().iter_mut() {
            if m.dataset == from {
                m.dataset = to.to_string();
            } else if let Some(rest) = m.dataset.strip_prefix(&below) {
                m.dataset = format!("{to}/{rest}");
            }
        }
    }

    /// Takes the mount of `target` (a dataset, or its directory) out of the table.
    fn take(&self, target: &str) -> Option<Mounted> {
        let mut t = self.table.lock();
        let pos = t
            .iter()
            .position(|m| m.dataset == target || m.dir == Path::new(target))?;
        Some(t.remove(pos))
    }

    /// Unmounts one mount of this table; None when `target` is not in it.
    pub fn unmount(&self, target: &str) -> Option<Result<PathBuf>> {
        let m = self.take(target)?;
        Some(self.finish_all(vec![m], false).map(|mut v| v.remove(0).1))
    }

    /// Unmounts every filesystem of a pool (before export or destroy).
    pub fn unmount_pool(&self, pool: &str) -> Result<()> {
        let gone = {
            let mut t = self.table.lock();
            let (gone, keep) = std::mem::take(&mut *t)
                .into_iter()
                .partition(|m| m.pool == pool);
            *t = keep;
            gone
        };
        self.finish_all(gone, false)?;
        Ok(())
    }

    /// Unmounts `dataset` and its descendants (before destroy, rollback or rename, as zfs
    /// does); returns what was mounted where, to remount.
    pub fn unmount_tree(&self, dataset: &str) -> Result<Vec<(String, PathBuf)>> {
        self.unmount_tree_with(dataset, false)
    }

    /// `unmount_tree`, forcing busy mounts (`force`: a forced destroy).
    pub fn unmount_tree_with(&self, dataset: &str, force: bool) -> Result<Vec<(String, PathBuf)>> {
        let below = format!("{dataset}/");
        let gone: Vec<Mounted> = {
            let mut t = self.table.lock();
            let (gone, keep) = std::mem::take(&mut *t)
                .into_iter()
                .partition(|m| m.dataset == dataset || m.dataset.starts_with(&below));
            *t = keep;
            gone
        };
        self.finish_all(gone, force)
    }

    /// Unmounts deepest first (a child is mounted inside its parent's directory); on a
    /// failure the mounts not yet undone go back in the table.
    fn finish_all(&self, mut gone: Vec<Mounted>, force: bool) -> Result<Vec<(String, PathBuf)>> {
        gone.sort_by_key(|m| std::cmp::Reverse(m.dir.components().count()));
        let mut out = Vec::new();
        let mut rest = gone.into_iter();
        while let Some(mut m) = rest.next() {
            let done = if force {
                m.handle.force_unmount()
            } else {
                m.handle.unmount()
            };
            if let Err(e) = done {
                if !m.handle.is_mounted() {
                    // Unmounted, but its last sync failed (a suspended pool): the mount is
                    // gone all the same, and what it could not write is the pool's to say.
                    eprintln!("tank: {e:#}");
                    out.push((m.dataset.clone(), m.dir.clone()));
                    drop(m.hold);
                    continue;
                }
                let mut t = self.table.lock();
                t.push(m);
                t.extend(rest);
                // The front end's error names the directory and its kind (busy: open
                // files, a mount inside), which the caller's error keeps.
                return Err(e);
            }
            out.push((m.dataset.clone(), m.dir.clone()));
            drop(m.hold);
        }
        Ok(out)
    }

    /// Removes the (empty) directories a destroyed dataset tree was mounted at, deepest
    /// first, as zfs removes a mountpoint it unmounts for good: nothing written by a
    /// process still inside one (a file server's connection, past a forced unmount) lands
    /// in the bare directory under it.
    pub fn remove_mount_dirs(&self, was: &[(String, PathBuf)]) {
        let mut dirs: Vec<&PathBuf> = was.iter().map(|(_, d)| d).collect();
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for d in dirs {
            let _ = std::fs::remove_dir(d);
        }
    }

    /// Mounts the given datasets at the given directories (or at their mountpoints when
    /// `None`, if they have one); returns a line for each mount made or not made.
    pub fn remount(
        &self,
        dsl: &Arc<Dsl>,
        store: &Arc<ObjectStore>,
        list: &[(String, Option<PathBuf>)],
    ) -> Vec<String> {
        let mut lines = Vec::new();
        if !self.has_mounter() {
            return lines;
        }
        // Parents first: a child mounts inside its parent's directory.
        let mut list = list.to_vec();
        list.sort_by_key(|(n, _)| n.matches('/').count());
        for (name, dir) in &list {
            let Ok(id) = dsl.resolve(name) else {
                continue;
            };
            if dir.is_none() {
                let mp = dsl.prop(id, "mountpoint").unwrap_or_default();
                let is_fs = dsl
                    .record(id)
                    .is_ok_and(|r| r.kind == DatasetKind::Filesystem);
                if !is_fs || mp == "none" || mp == "legacy" || mp.is_empty() {
                    continue;
                }
            }
            match self.mount(dsl, store, name, dir.as_deref()) {
                Ok((d, _)) => lines.push(format!("mounted {name} at {}", d.display())),
                Err(e) => lines.push(format!(
                    "warning: cannot mount {name}: {}",
                    crate::error::chain(&e)
                )),
            }
        }
        lines
    }

    /// Unmounts everything; returns what could not be unmounted.
    pub fn unmount_all(&self) -> Vec<String> {
        let mut all = std::mem::take(&mut *self.table.lock());
        all.sort_by_key(|m| std::cmp::Reverse(m.dir.components().count()));
        let mut problems = Vec::new();
        for mut m in all {
            let r = m.handle.unmount();
            if let Err(e) = r {
                problems.push(format!(
                    "{}: cannot unmount {}: {}",
                    m.dataset,
                    m.dir.display(),
                    crate::error::chain(&e)
                ));
            }
        }
        problems
    }

    /// Takes away every filesystem of a pool at once: unmounted if nothing is open on it,
    /// else detached (gone from the namespace now, its session ending with the last open
    /// file). For an interrupted benchmark, not for user pools.
    pub fn detach_pool(&self, pool: &str) {
        let gone: Vec<Mounted> = {
            let mut t = self.table.lock();
            let (gone, keep) = std::mem::take(&mut *t)
                .into_iter()
                .partition(|m| m.pool == pool);
            *t = keep;
            gone
        };
        for m in gone {
            drop(m.handle);
            drop(m.hold);
        }
    }

    /// Serves the mount of `dataset` until it is unmounted (by anyone, or by a signal
    /// through the returned unmounter), then takes it out of the table: a foreground
    /// `tank mount` without a daemon.
    pub fn wait(&self, dataset: &str, on_start: impl FnOnce(Box<dyn Fn() + Send>)) -> Result<()> {
        let Some(mut m) = self.take(dataset) else {
            bail!("'{dataset}' is not mounted");
        };
        on_start(m.handle.unmounter());
        let waited = m.handle.wait();
        let _ = m.handle.unmount();
        drop(m.hold);
        waited
    }
}
