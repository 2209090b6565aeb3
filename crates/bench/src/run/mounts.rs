//! The benchmark runners' mounts: they create, mount and destroy pools of their own in
//! this process, with the service's mount table (`tank_service::mounts`) and the FUSE
//! front end. One table for the process, as its pools are; a signal handler that stops an
//! interrupted benchmark detaches through it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use anyhow::Result;
use tank_dataset::Dsl;
use tank_object::ObjectStore;
use tank_service::mounts::Mounts;

fn mounts() -> &'static Mounts {
    static MOUNTS: OnceLock<Mounts> = OnceLock::new();
    MOUNTS.get_or_init(|| {
        let m = Mounts::default();
        m.set_mounter(Arc::new(tank_fuse::FuseMounter));
        m
    })
}

/// Mounts a filesystem of a benchmark pool at `dir`.
pub fn mount_dataset(
    dsl: &Arc<Dsl>,
    store: &Arc<ObjectStore>,
    name: &str,
    dir: Option<&Path>,
) -> Result<PathBuf> {
    Ok(mounts().mount(dsl, store, name, dir)?.0)
}

/// Unmounts every filesystem of a benchmark pool.
pub fn unmount_pool(pool: &str) -> Result<()> {
    mounts().unmount_pool(pool)
}

/// Takes away every filesystem of a benchmark pool at once (an interrupted run).
pub fn detach_pool(pool: &str) {
    mounts().detach_pool(pool)
}
