//! The FUSE front end as the service's mounter: serves a dataset's shared filesystem
//! handle at a directory, with its snapshots under `.tank/snapshot`, and counts its
//! requests in the service's per-protocol statistics.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;

use crate::{MountHandle, MountOptions, RequestObserver, SnapshotSource};
use anyhow::Result;
use tank_dataset::posix::Fs;
use tank_service::mounts::{MountRequest, MountedFs, Mounter, Snapshots};
use tank_service::stats::{OpStats, ProtocolStats};

pub struct FuseMounter;

struct SnapshotDir(Arc<Snapshots>);

impl SnapshotSource for SnapshotDir {
    fn list(&self) -> Vec<String> {
        self.0.list()
    }

    fn open(&self, name: &str) -> Option<Arc<Fs>> {
        self.0.open(name)
    }
}

struct Mounted(MountHandle);

/// Counts a mount's requests in the service's per-protocol statistics (`fuse`), keeping
/// each operation's counters at hand so a request costs no lock of the table.
struct Observer {
    protocols: Arc<ProtocolStats>,
    ops: RwLock<HashMap<&'static str, Arc<OpStats>>>,
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("fuse request counters")
    }
}

impl RequestObserver for Observer {
    fn observe(&self, op: &'static str, took: std::time::Duration, failed: bool) {
        let known = self.ops.read().get(op).cloned();
        let stats = match known {
            Some(s) => s,
            None => {
                let s = self.protocols.op("fuse", op);
                self.ops.write().insert(op, s.clone());
                s
            }
        };
        stats.record(took, failed);
    }
}

impl Mounter for FuseMounter {
    fn mount(&self, req: MountRequest) -> Result<Box<dyn MountedFs>> {
        let mut opts = MountOptions::new(&req.dataset);
        opts.sync = req.sync;
        opts.write_through = Some(req.write_through.clone());
        opts.observer = Some(Arc::new(Observer {
            protocols: req.protocols.clone(),
            ops: RwLock::new(HashMap::new()),
        }));
        let snapshots: Arc<dyn SnapshotSource> = Arc::new(SnapshotDir(req.snapshots));
        let handle = crate::mount(req.fs, Some(snapshots), &req.dir, &opts)?;
        Ok(Box::new(Mounted(handle)))
    }
}

impl MountedFs for Mounted {
    fn unmount(&mut self) -> Result<()> {
        // Busy is the service's kind (409, EBUSY): the caller may close its files and retry.
        self.0.unmount().map_err(|e| match e {
            crate::MountError::Busy(_) => tank_service::ServiceError::Busy(e.to_string()).into(),
            e => e.into(),
        })
    }

    fn is_mounted(&self) -> bool {
        self.0.is_mounted()
    }

    fn force_unmount(&mut self) -> Result<()> {
        Ok(self.0.force_unmount()?)
    }

    fn io_uring(&self) -> bool {
        self.0.io_uring()
    }

    fn wait(&mut self) -> Result<()> {
        Ok(self.0.wait()?)
    }

    fn unmounter(&self) -> Box<dyn Fn() + Send> {
        let u = self.0.unmounter();
        Box::new(move || {
            let _ = u.unmount();
        })
    }

    fn invalidator(&self) -> Option<tank_service::mounts::Invalidator> {
        let inval = self.0.invalidator()?;
        Some(Arc::new(move |c: &tank_service::handles::Changed| {
            inval(&c.inodes, &c.entries)
        }))
    }
}
