//! `tank mount` / `tank unmount`.
//!
//! # Theory of operation
//! Mounting is the service's (`tank_service::mounts`: it holds the dataset, opens its
//! POSIX layer and has the FUSE front end serve it). With a daemon the mount lives in it
//! until `tank unmount`, export or shutdown. Without one, `tank mount` runs the service in
//! this process and stays in the foreground until the filesystem is unmounted (by `tank
//! unmount`, `umount` or Ctrl-C), then syncs and closes the pool. `tank unmount` of a
//! mount that another process serves (a foreground `tank mount`) unmounts it by its
//! directory, which ends that process's session.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use clap::Args;
use tank_service::api::{Request, Response};
use tank_service::ServiceError;

use crate::client::{unexpected, Client};

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

pub fn run_mount(a: MountArgs) -> Result<()> {
    let c = Client::connect()?;
    let given = a.dir.as_deref().map(crate::out::resolve);
    let (r, notes) = c.call_quiet(Request::Mount {
        dataset: a.dataset.clone(),
        dir: given,
    })?;
    let over = if notes.iter().any(|n| n.contains("io_uring")) {
        " (requests over io_uring)"
    } else {
        ""
    };
    let dir = match r {
        Ok(Response::Mounted(m)) => m.dir,
        Ok(r) => {
            c.close()?;
            return Err(unexpected(r));
        }
        Err(e) => {
            c.close()?;
            return Err(e.into());
        }
    };
    let Some(svc) = c.service().cloned() else {
        outln!("mounted {} at {}{over}", a.dataset, dir.display());
        return Ok(());
    };
    // No daemon: serve in the foreground until unmounted or interrupted.
    errln!(
        "mounted {} at {}{over}; serving until 'tank unmount {}' or Ctrl-C (start 'tank serve' to keep filesystems mounted in the background)",
        a.dataset,
        dir.display(),
        dir.display()
    );
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ])?;
    let sig_handle = signals.handle();
    let waited = svc.mounts.wait(&a.dataset, |unmount| {
        std::thread::spawn(move || {
            if signals.forever().next().is_some() {
                unmount();
            }
        });
    });
    sig_handle.close();
    c.close()?;
    waited?;
    errln!("unmounted {}", dir.display());
    Ok(())
}

pub fn run_unmount(a: UnmountArgs) -> Result<()> {
    let as_dir = crate::out::resolve(Path::new(&a.target));
    if let Some(c) = Client::daemon()? {
        // The daemon's mount: by dataset name, or by its directory.
        for target in [a.target.clone(), as_dir.to_string_lossy().into_owned()] {
            match c.call_quiet(Request::Unmount { target })?.0 {
                Ok(Response::Done { message }) => {
                    outln!("{message}");
                    return Ok(());
                }
                Ok(r) => return Err(unexpected(r)),
                Err(ServiceError::NotFound(_)) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
    // A mount served by another process (a foreground `tank mount`): by directory, or by
    // the dataset name the kernel's mount table shows as its source. A directory (absolute,
    // or relative to this directory), else a dataset name (which may also contain '/').
    let dir = match mounted_dir_of(&a.target) {
        Some(d) if !a.target.starts_with('/') && !a.target.starts_with('.') => d,
        _ if as_dir.is_dir() => as_dir,
        Some(d) => d,
        None => bail!("cannot unmount '{}': it is not mounted", a.target),
    };
    tank_fuse::unmount(&dir)?;
    outln!("unmounted {}", dir.display());
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
