//! The FUSE front end as the service's mounter: serves a dataset's filesystem handle at a
//! directory (`tank_fuse`), with its snapshots under `.tank/snapshot`.

use std::sync::Arc;

use anyhow::Result;
use tank_dataset::posix::Fs;
use tank_fuse::{MountHandle, MountOptions, SnapshotSource};
use tank_service::mounts::{MountRequest, MountedFs, Mounter, Snapshots};

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

impl Mounter for FuseMounter {
    fn mount(&self, req: MountRequest) -> Result<Box<dyn MountedFs>> {
        let mut opts = MountOptions::new(&req.dataset);
        opts.sync = req.sync;
        let snapshots: Arc<dyn SnapshotSource> = Arc::new(SnapshotDir(req.snapshots));
        let handle = tank_fuse::mount(req.fs, Some(snapshots), &req.dir, &opts)?;
        Ok(Box::new(Mounted(handle)))
    }
}

impl MountedFs for Mounted {
    fn unmount(&mut self) -> Result<()> {
        Ok(self.0.unmount()?)
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
}
