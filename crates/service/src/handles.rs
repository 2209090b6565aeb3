//! Shared dataset handles: one open filesystem per dataset, held by any number of front ends
//! at once, and told of every change to it.
//!
//! # Theory of operation
//! A front end that serves a filesystem dataset (the FUSE mount, S3, NFS, SMB) or a volume
//! (iSCSI) asks the service for a [`Hold`] on it. The first hold opens the dataset's POSIX layer
//! once (`Fs`, with its one namespace lock) and marks the dataset in use in the dataset
//! directory; later holds share that same `Fs`, so every front end sees one namespace and
//! one cache. Dropping the last hold closes the handle and the dataset is free again.
//!
//! Every holder gives a [`Holder`], the subscriber seam, and is told of what happens to the
//! dataset ([`DatasetEvent`]):
//! - a rename: `Renamed` after it is committed (the handle goes by the new name);
//! - a rollback: `Suspending` before it, when every holder must let go of the filesystem
//!   (`Hold::fs` answers `None` meanwhile), then `Resumed` once the rolled-back filesystem
//!   is open in its place;
//! - a property change: `PropertiesChanged` with the names;
//! - a destroy: refused with `busy` while a hold exists, as `zfs destroy` refuses a busy
//!   dataset; a forced destroy first tells every holder `Destroying`, closes the handle and
//!   then destroys.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::{Mutex, RwLock};
use tank_dataset::posix::Fs;
use tank_dataset::zvol::Volume;
use tank_dataset::{DatasetKind, DsHooks, Dsl};
use tank_object::ObjectStore;

use crate::error::ServiceError;

type Res<T> = Result<T, ServiceError>;

/// What happened to a held dataset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatasetEvent {
    /// The dataset was renamed (committed).
    Renamed { from: String, to: String },
    /// A rollback is about to replace the filesystem: drop every reference to it now.
    Suspending { why: String },
    /// The rollback is done; `Hold::fs` is the rolled-back filesystem.
    Resumed,
    /// Properties were set or inherited (committed).
    PropertiesChanged { names: Vec<String> },
    /// A forced destroy: stop serving the dataset; the handle closes after this.
    Destroying,
    /// Another front end changed files (for the caches a front end keeps of them).
    Changed(Changed),
}

/// What a front end changed in a shared filesystem, so that the others drop what they
/// cache of it (the FUSE mount's kernel caches): inodes whose data or attributes changed,
/// and directory entries (parent inode, name) that appeared or went.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changed {
    pub inodes: Vec<u64>,
    pub entries: Vec<(u64, Vec<u8>)>,
}

/// A front end (or a test double) that holds a dataset and is told what happens to it.
pub trait Holder: Send + Sync {
    fn notify(&self, event: &DatasetEvent);
}

struct HolderEntry {
    id: u64,
    what: String,
    holder: Arc<dyn Holder>,
}

/// One open filesystem dataset or volume, shared by its holders.
pub struct DatasetHandle {
    pool: String,
    id: u64,
    name: Mutex<String>,
    dsl: Arc<Dsl>,
    store: Arc<ObjectStore>,
    kind: DatasetKind,
    fs: RwLock<Option<Arc<Fs>>>,
    vol: RwLock<Option<Arc<Volume>>>,
    holders: Mutex<Vec<HolderEntry>>,
}

impl DatasetHandle {
    /// The dataset's id in its pool (stable across renames, exports and imports).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The pool it is in.
    pub fn pool(&self) -> &str {
        &self.pool
    }

    /// The dataset's name now.
    pub fn name(&self) -> String {
        self.name.lock().clone()
    }

    /// The filesystem; `None` while a rollback replaces it or after a forced destroy.
    pub fn fs(&self) -> Option<Arc<Fs>> {
        self.fs.read().clone()
    }

    /// The volume, for a volume's handle; `None` while a rollback replaces it or after a
    /// forced destroy.
    pub fn volume(&self) -> Option<Arc<Volume>> {
        self.vol.read().clone()
    }

    /// Opens the filesystem or the volume, whichever the dataset is.
    fn open(&self) -> Res<()> {
        if self.kind == DatasetKind::Volume {
            let v = Volume::open(self.dsl.clone(), &self.name()).map_err(|e| {
                ServiceError::Failed(format!("cannot open the volume '{}': {e}", self.name()))
            })?;
            *self.vol.write() = Some(Arc::new(v));
        } else {
            *self.fs.write() = Some(self.open_fs()?);
        }
        Ok(())
    }

    /// Lets go of the filesystem or volume.
    fn shut(&self) {
        self.fs.write().take();
        self.vol.write().take();
    }

    /// What holds it, as `dsl` shows it when it refuses a change.
    pub fn holders(&self) -> Vec<String> {
        self.holders.lock().iter().map(|h| h.what.clone()).collect()
    }

    fn open_fs(&self) -> Res<Arc<Fs>> {
        let hooks = Arc::new(DsHooks {
            dsl: self.dsl.clone(),
            id: self.id,
            snapshot: false,
        });
        let objset = self
            .dsl
            .objset(self.id)
            .map_err(|e| ServiceError::from_anyhow(&e.into()))?;
        Fs::mount(self.store.clone(), objset, hooks, (0, 0)).map_err(|e| {
            ServiceError::Failed(format!(
                "cannot open the filesystem of '{}': {e}",
                self.name()
            ))
        })
    }

    /// Marks the dataset in use in the dataset directory with its holders' names.
    fn mark(&self) {
        let what = self.holders().join(", ");
        self.dsl.release(self.id);
        let _ = self.dsl.hold(self.id, &format!("in use by {what}"));
    }

    fn notify(&self, event: &DatasetEvent) {
        let holders: Vec<Arc<dyn Holder>> = self
            .holders
            .lock()
            .iter()
            .map(|h| h.holder.clone())
            .collect();
        for h in holders {
            h.notify(event);
        }
    }
}

type Key = (String, u64);

/// The open handles of one service.
#[derive(Default)]
pub struct Handles {
    map: Mutex<HashMap<Key, Arc<DatasetHandle>>>,
    next: AtomicU64,
}

/// One holder's share of a dataset handle; dropping it lets go.
pub struct Hold {
    handle: Arc<DatasetHandle>,
    id: u64,
    handles: Weak<Handles>,
}

impl Hold {
    pub fn handle(&self) -> &Arc<DatasetHandle> {
        &self.handle
    }

    /// The shared filesystem (`None` while a rollback replaces it).
    pub fn fs(&self) -> Option<Arc<Fs>> {
        self.handle.fs()
    }

    /// The shared volume (`None` while a rollback replaces it).
    pub fn volume(&self) -> Option<Arc<Volume>> {
        self.handle.volume()
    }

    /// Tells the dataset's other holders what this one changed.
    pub fn changed(&self, change: Changed) {
        let others: Vec<Arc<dyn Holder>> = self
            .handle
            .holders
            .lock()
            .iter()
            .filter(|h| h.id != self.id)
            .map(|h| h.holder.clone())
            .collect();
        let event = DatasetEvent::Changed(change);
        for h in others {
            h.notify(&event);
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let h = &self.handle;
        let last = {
            let mut holders = h.holders.lock();
            holders.retain(|e| e.id != self.id);
            holders.is_empty()
        };
        if last {
            if let Some(handles) = self.handles.upgrade() {
                handles.close(h);
            } else {
                h.shut();
                h.dsl.release(h.id);
            }
        } else {
            h.mark();
        }
    }
}

impl Handles {
    /// Holds the filesystem or volume `name` of an open pool for `what` (a description such
    /// as "mounted at /mnt/x" or "nfs export x"), telling `holder` of its changes.
    pub fn hold(
        self: &Arc<Self>,
        dsl: &Arc<Dsl>,
        store: &Arc<ObjectStore>,
        name: &str,
        what: &str,
        holder: Arc<dyn Holder>,
    ) -> Res<Hold> {
        let id = dsl
            .resolve(name)
            .map_err(|e| ServiceError::from_anyhow(&e.into()))?;
        let rec = dsl
            .record(id)
            .map_err(|e| ServiceError::from_anyhow(&e.into()))?;
        if rec.kind != DatasetKind::Filesystem && rec.kind != DatasetKind::Volume {
            return Err(ServiceError::Invalid(format!(
                "cannot serve '{name}': it is a {}, not a filesystem or volume",
                rec.kind.name()
            )));
        }
        if rec.recv.is_some() {
            return Err(ServiceError::Busy(format!(
                "cannot serve '{name}': a receive into it has not finished (resume it with 'tank send -t' and its receive_resume_token, or abandon it with 'tank receive -A {name}')"
            )));
        }
        let key = (dsl.pool_name(), id);
        let mut map = self.map.lock();
        let handle = match map.get(&key) {
            Some(h) => h.clone(),
            None => {
                // The first holder: the dataset must be free (not held by another kind of
                // user, nor being rolled back).
                if let Some(w) = dsl.held(id) {
                    return Err(ServiceError::Busy(format!("dataset '{name}' is busy: {w}")));
                }
                let h = Arc::new(DatasetHandle {
                    pool: key.0.clone(),
                    id,
                    name: Mutex::new(name.to_string()),
                    dsl: dsl.clone(),
                    store: store.clone(),
                    kind: rec.kind,
                    fs: RwLock::new(None),
                    vol: RwLock::new(None),
                    holders: Mutex::new(Vec::new()),
                });
                h.open()?;
                map.insert(key, h.clone());
                h
            }
        };
        let hid = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        handle.holders.lock().push(HolderEntry {
            id: hid,
            what: what.to_string(),
            holder,
        });
        handle.mark();
        Ok(Hold {
            handle,
            id: hid,
            handles: Arc::downgrade(self),
        })
    }

    fn close(&self, h: &Arc<DatasetHandle>) {
        let mut map = self.map.lock();
        // A new holder may have come between the last drop and this lock.
        if !h.holders.lock().is_empty() {
            return;
        }
        map.remove(&(h.pool.clone(), h.id));
        h.shut();
        h.dsl.release(h.id);
    }

    /// The open handle of a dataset, if any.
    pub fn get(&self, dsl: &Dsl, id: u64) -> Option<Arc<DatasetHandle>> {
        self.map.lock().get(&(dsl.pool_name(), id)).cloned()
    }

    /// The open handles of `name` and its descendants in a pool.
    pub fn under(&self, pool: &str, name: &str) -> Vec<Arc<DatasetHandle>> {
        let below = format!("{name}/");
        self.map
            .lock()
            .values()
            .filter(|h| h.pool == pool && (h.name() == name || h.name().starts_with(&below)))
            .cloned()
            .collect()
    }

    /// After a committed rename: handles go by their new names and their holders are told.
    pub fn renamed(&self, pool: &str, from: &str, to: &str) {
        for h in self.under(pool, from) {
            let old = h.name();
            let new = if old == from {
                to.to_string()
            } else {
                format!("{to}{}", &old[from.len()..])
            };
            *h.name.lock() = new.clone();
            h.notify(&DatasetEvent::Renamed { from: old, to: new });
        }
    }

    /// After committed property changes.
    pub fn properties_changed(&self, dsl: &Dsl, id: u64, names: Vec<String>) {
        if let Some(h) = self.get(dsl, id) {
            h.notify(&DatasetEvent::PropertiesChanged { names });
        }
    }

    /// Runs `f` (a rollback) with the dataset's handle suspended: holders are told and let
    /// go, the filesystem is closed and the dataset freed; afterwards the filesystem is
    /// opened again (rolled back or not, as `f` did) and the holders are told.
    pub fn suspended<T>(&self, dsl: &Dsl, id: u64, why: &str, f: impl FnOnce() -> T) -> Res<T> {
        let Some(h) = self.get(dsl, id) else {
            return Ok(f());
        };
        h.notify(&DatasetEvent::Suspending {
            why: why.to_string(),
        });
        h.shut();
        dsl.release(id);
        let r = f();
        match h.open() {
            Ok(()) => {
                h.mark();
                h.notify(&DatasetEvent::Resumed);
                Ok(r)
            }
            Err(e) => {
                h.mark();
                Err(e)
            }
        }
    }

    /// A pool is let go (exported, destroyed, or a suspended pool opened again): every
    /// holder of its datasets is told `Destroying` and the handles close, so that no front
    /// end goes on serving the pool's old state. The share registry's `pool_back` brings
    /// the front ends back when the pool is open again. Returns how many were held.
    pub fn let_go_of_pool(&self, pool: &str) -> usize {
        let held: Vec<Arc<DatasetHandle>> = self
            .map
            .lock()
            .iter()
            .filter(|((p, _), _)| p == pool)
            .map(|(_, h)| h.clone())
            .collect();
        for h in &held {
            h.notify(&DatasetEvent::Destroying);
            self.map.lock().remove(&(h.pool.clone(), h.id));
            h.shut();
            h.holders.lock().clear();
            h.dsl.release(h.id);
        }
        held.len()
    }

    /// Before a destroy of `name` (and its descendants): refused while held, unless
    /// `force`, which tells the holders and closes the handles.
    pub fn before_destroy(&self, pool: &str, name: &str, force: bool) -> Res<()> {
        let held = self.under(pool, name);
        if held.is_empty() {
            return Ok(());
        }
        if !force {
            let what: Vec<String> = held
                .iter()
                .map(|h| format!("'{}' ({})", h.name(), h.holders().join(", ")))
                .collect();
            return Err(ServiceError::Busy(format!(
                "cannot destroy '{name}': in use by front ends: {}; force it to stop them",
                what.join("; ")
            )));
        }
        for h in held {
            h.notify(&DatasetEvent::Destroying);
            let mut map = self.map.lock();
            map.remove(&(h.pool.clone(), h.id));
            h.shut();
            h.holders.lock().clear();
            h.dsl.release(h.id);
        }
        Ok(())
    }
}
