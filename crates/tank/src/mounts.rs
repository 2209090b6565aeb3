//! `tank mount` / `tank unmount` and the table of this process's FUSE mounts.
//!
//! # Theory of operation
//! Mounting a filesystem dataset holds it in the dataset directory (destroy and rollback
//! refuse while it is mounted), opens its POSIX layer with the dataset's live properties,
//! and serves it with the FUSE front end, snapshots under `.tank/snapshot`. In the daemon
//! the mount lives until `tank unmount`, export or shutdown; without a daemon `tank mount`
//! stays in the foreground until the filesystem is unmounted (by `tank unmount`, `umount`
//! or Ctrl-C), then syncs and closes the pool.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use parking_lot::Mutex;
use tank_dataset::posix::{DatasetHooks, Fs};
use tank_dataset::{DatasetKind, DsHooks, Dsl};
use tank_fuse::{MountHandle, MountOptions, SnapshotSource};
use tank_object::ObjectStore;

use crate::cmd_dataset::pool_of;
use crate::pools::{daemon_mode, open_pool};

#[derive(Args)]
pub struct MountArgs {
    /// The filesystem dataset to mount.
    dataset: String,
    /// Where (default: its mountpoint property).
    dir: Option<PathBuf>,
}

#[derive(Args)]
pub struct UnmountArgs {
    /// A mounted dataset or its directory.
    target: String,
}

struct Mounted {
    pool: String,
    dataset: String,
    id: u64,
    dir: PathBuf,
    handle: MountHandle,
    dsl: Arc<Dsl>,
}

static MOUNTS: Mutex<Vec<Mounted>> = Mutex::new(Vec::new());

/// The snapshots of one dataset, for `.tank/snapshot`.
struct Snapshots {
    dsl: Arc<Dsl>,
    store: Arc<ObjectStore>,
    head: u64,
}

impl SnapshotSource for Snapshots {
    fn list(&self) -> Vec<String> {
        self.dsl
            .snapshots(self.head)
            .into_iter()
            .filter_map(|id| self.dsl.record(id).ok())
            .map(|r| r.name)
            .collect()
    }

    fn open(&self, name: &str) -> Option<Arc<Fs>> {
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

/// The directory a dataset mounts on: `dir`, else its mountpoint property.
fn mount_dir(dsl: &Dsl, id: u64, name: &str, dir: Option<&Path>) -> Result<PathBuf> {
    if let Some(d) = dir {
        return Ok(d.to_path_buf());
    }
    let mp = dsl.prop(id, "mountpoint")?;
    if mp == "none" || mp == "legacy" {
        bail!(
            "cannot mount '{name}': its mountpoint is '{mp}'; give a directory ('tank mount {name} DIR') or set one ('tank dataset set mountpoint=/PATH {name}')"
        );
    }
    Ok(PathBuf::from(mp))
}

/// Mounts a filesystem dataset of an open pool and records it in this process's table.
pub fn mount_dataset(
    dsl: &Arc<Dsl>,
    store: &Arc<ObjectStore>,
    name: &str,
    dir: Option<&Path>,
) -> Result<PathBuf> {
    let id = dsl.resolve(name)?;
    let rec = dsl.record(id)?;
    if rec.kind != DatasetKind::Filesystem {
        bail!(
            "cannot mount '{name}': it is a {} (only filesystems mount; snapshots are under .tank/snapshot)",
            rec.kind.name()
        );
    }
    let dir = mount_dir(dsl, id, name, dir)?;
    if !dir.exists() {
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create mount point {}", dir.display()))?;
    }
    dsl.hold(id, &format!("mounted at {}", dir.display()))?;
    let result = (|| -> Result<MountHandle> {
        let hooks = Arc::new(DsHooks {
            dsl: dsl.clone(),
            id,
            snapshot: false,
        });
        let sync = hooks.sync_mode();
        let fs = Fs::mount(store.clone(), dsl.objset(id)?, hooks, (0, 0))
            .map_err(|e| anyhow::anyhow!("cannot open the filesystem of '{name}': {e}"))?;
        let snapshots = Arc::new(Snapshots {
            dsl: dsl.clone(),
            store: store.clone(),
            head: id,
        });
        let mut opts = MountOptions::new(name);
        opts.sync = sync;
        Ok(tank_fuse::mount(fs, Some(snapshots), &dir, &opts)?)
    })();
    match result {
        Ok(handle) => {
            MOUNTS.lock().push(Mounted {
                pool: pool_of(name).to_string(),
                dataset: name.to_string(),
                id,
                dir: dir.clone(),
                handle,
                dsl: dsl.clone(),
            });
            Ok(dir)
        }
        Err(e) => {
            dsl.release(id);
            Err(e)
        }
    }
}

fn finish(mut m: Mounted) -> Result<()> {
    let r = m.handle.unmount();
    m.dsl.release(m.id);
    r.with_context(|| format!("cannot unmount {}", m.dir.display()))
}

/// Takes the mounts of `pool` out of this process's table.
fn take_pool(pool: &str) -> Vec<Mounted> {
    let mut t = MOUNTS.lock();
    let (gone, keep) = std::mem::take(&mut *t)
        .into_iter()
        .partition(|m| m.pool == pool);
    *t = keep;
    gone
}

/// Unmounts every filesystem of a pool this process mounted (before export or destroy).
pub fn unmount_pool(pool: &str) -> Result<()> {
    finish_all(take_pool(pool))?;
    Ok(())
}

/// Takes away every filesystem of a pool this process mounted, at once: unmounted if
/// nothing is open on it, else detached (MNT_DETACH, gone from the namespace now, its session
/// ending with the last open file). For an interrupted benchmark, not for user pools.
pub fn detach_pool(pool: &str) {
    // Dropping a handle unmounts it, or detaches it when busy.
    drop(take_pool(pool));
}

/// Unmounts `dataset` and its descendants if this process mounted them (before destroy,
/// rollback or rename, as zfs does); returns what was mounted where, to remount.
pub fn unmount_tree(dataset: &str) -> Result<Vec<(String, PathBuf)>> {
    let below = format!("{dataset}/");
    let gone: Vec<Mounted> = {
        let mut t = MOUNTS.lock();
        let (gone, keep) = std::mem::take(&mut *t)
            .into_iter()
            .partition(|m| m.dataset == dataset || m.dataset.starts_with(&below));
        *t = keep;
        gone
    };
    finish_all(gone)
}

/// Unmounts deepest first (a child is mounted inside its parent's directory); on a
/// failure the mounts not yet undone go back in the table.
fn finish_all(mut gone: Vec<Mounted>) -> Result<Vec<(String, PathBuf)>> {
    gone.sort_by_key(|m| std::cmp::Reverse(m.dir.components().count()));
    let mut out = Vec::new();
    let mut rest = gone.into_iter();
    while let Some(mut m) = rest.next() {
        if let Err(e) = m.handle.unmount() {
            let dir = m.dir.clone();
            let mut t = MOUNTS.lock();
            t.push(m);
            t.extend(rest);
            return Err(e).with_context(|| format!("cannot unmount {}", dir.display()));
        }
        m.dsl.release(m.id);
        out.push((m.dataset.clone(), m.dir.clone()));
    }
    Ok(out)
}

/// In the daemon: mounts the given datasets at the given directories (or at their
/// mountpoints when `None`), reporting what could not be mounted.
pub fn remount(dsl: &Arc<Dsl>, store: &Arc<ObjectStore>, list: &[(String, Option<PathBuf>)]) {
    if !daemon_mode() {
        return;
    }
    // Parents first: a child mounts inside its parent's directory.
    let mut list = list.to_vec();
    list.sort_by_key(|(n, _)| n.matches('/').count());
    for (name, dir) in &list {
        let id = match dsl.resolve(name) {
            Ok(id) => id,
            Err(_) => continue,
        };
        if dir.is_none() {
            let mp = dsl.prop(id, "mountpoint").unwrap_or_default();
            let is_fs = dsl
                .record(id)
                .is_ok_and(|r| r.kind == DatasetKind::Filesystem);
            if !is_fs || mp == "none" || mp == "legacy" {
                continue;
            }
        }
        match mount_dataset(dsl, store, name, dir.as_deref()) {
            Ok(d) => outln!("mounted {name} at {}", d.display()),
            Err(e) => errln!("warning: cannot mount {name}: {}", crate::out::chain(&e)),
        }
    }
}

pub fn unmount_all() -> Vec<String> {
    let mut all = std::mem::take(&mut *MOUNTS.lock());
    all.sort_by_key(|m| std::cmp::Reverse(m.dir.components().count()));
    let mut problems = Vec::new();
    for m in all {
        let what = m.dataset.clone();
        if let Err(e) = finish(m) {
            problems.push(format!("{what}: {}", crate::out::chain(&e)));
        }
    }
    problems
}

pub fn run_mount(a: MountArgs) -> Result<()> {
    let opened = open_pool(pool_of(&a.dataset))?;
    let given = a.dir.as_deref().map(crate::out::resolve);
    let dir = mount_dataset(&opened.dsl, &opened.store, &a.dataset, given.as_deref());
    let dir = match dir {
        Ok(d) => d,
        Err(e) => {
            opened.close()?;
            return Err(e);
        }
    };
    // How requests reach us: the kernel's per-CPU io_uring queues, or reads of /dev/fuse.
    let over = match MOUNTS.lock().last().map(|m| m.handle.io_uring()) {
        Some(true) => " (requests over io_uring)",
        _ => "",
    };
    if daemon_mode() {
        outln!("mounted {} at {}{over}", a.dataset, dir.display());
        return Ok(());
    }
    // No daemon: serve in the foreground until unmounted or interrupted.
    errln!(
        "mounted {} at {}{over}; serving until 'tank unmount {}' or Ctrl-C (start 'tank serve' to keep filesystems mounted in the background)",
        a.dataset,
        dir.display(),
        dir.display()
    );
    let unmounter = {
        let t = MOUNTS.lock();
        t.last().map(|m| m.handle.unmounter())
    };
    if let Some(u) = unmounter {
        let mut signals = signal_hook::iterator::Signals::new([
            signal_hook::consts::SIGINT,
            signal_hook::consts::SIGTERM,
            signal_hook::consts::SIGHUP,
        ])?;
        let sig_handle = signals.handle();
        std::thread::spawn(move || {
            if signals.forever().next().is_some() {
                let _ = u.unmount();
            }
        });
        let mut m = MOUNTS.lock().pop().expect("the mount just made");
        let waited = m.handle.wait();
        sig_handle.close();
        m.dsl.release(m.id);
        let _ = m.handle.unmount();
        waited?;
    }
    opened.close()?;
    errln!("unmounted {}", dir.display());
    Ok(())
}

pub fn run_unmount(a: UnmountArgs) -> Result<()> {
    let found = {
        let mut t = MOUNTS.lock();
        let target = crate::out::resolve(Path::new(&a.target));
        let pos = t
            .iter()
            .position(|m| m.dataset == a.target || m.dir == target);
        pos.map(|p| t.remove(p))
    };
    match found {
        Some(m) => {
            let dir = m.dir.clone();
            finish(m)?;
            outln!("unmounted {}", dir.display());
        }
        None => {
            // A mount served by another process (a foreground `tank mount`): by directory,
            // or by the dataset name the kernel's mount table shows as its source.
            // A directory (absolute, or relative to the client's working directory), else
            // a dataset name (which may also contain '/').
            let as_dir = crate::out::resolve(Path::new(&a.target));
            let dir = match mounted_dir_of(&a.target) {
                Some(d) if !a.target.starts_with('/') && !a.target.starts_with('.') => d,
                _ if as_dir.is_dir() => as_dir,
                Some(d) => d,
                None => bail!("cannot unmount '{}': it is not mounted", a.target),
            };
            tank_fuse::unmount(&dir)?;
            outln!("unmounted {}", dir.display());
        }
    }
    Ok(())
}

/// The directory where the kernel's mount table shows `dataset` mounted by tank.
fn mounted_dir_of(dataset: &str) -> Option<PathBuf> {
    let table = std::fs::read_to_string("/proc/self/mounts").ok()?;
    table.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let source = f.next()?;
        let dir = f.next()?;
        let fstype = f.next()?;
        let named = source == dataset || source.strip_prefix("tank:") == Some(dataset);
        (named && fstype.contains("fuse")).then(|| PathBuf::from(dir.replace("\\040", " ")))
    })
}
