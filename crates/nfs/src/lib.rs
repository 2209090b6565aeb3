//! tank's NFS server: the service's `nfs` shares, served over NFSv3 from the dataset layer
//! (no FUSE hop, no kernel server).
//!
//! # Theory of operation
//! One TCP listener answers the MOUNT, NFS and PORTMAP programs on one port (`tank serve
//! --nfs ADDR`), on a tokio runtime of its own. The RPC record layer, the XDR types and the
//! procedures' framing come from `nfs3_server` (vendored with the caller passed to the file
//! system: vendor/nfs3_server/VENDORED.md). Below it:
//! - `exports.rs`: the export table, built from the share registry and rebuilt after each
//!   committed share change, each export holding its dataset through the service;
//! - `handle.rs`: file handles (pool guid, dataset id, inode, generation), valid across
//!   restarts;
//! - `vfs.rs`: the operations, each on the export's shared filesystem with the caller's
//!   AUTH_SYS identity after squashing;
//! - `portmap.rs`: on the standard port, registration with the system's rpcbind, or a
//!   portmapper of our own on port 111, so that a stock `mount` finds the server.
//!
//! A client mounts `/NAME` for the share NAME (`nfs://HOST/NAME` in libnfs' terms); the
//! server's root lists the exports the client may use. There is no NLM: clients mount with
//! `nolock` (docs/NFS.md).

pub mod exports;
pub mod handle;
pub mod portmap;
pub mod vfs;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use nfs3_server::tcp::{NFSTcp, NFSTcpListener};
use tank_service::Service;

pub use exports::{Export, Exports};
pub use portmap::Portmap;

/// The generation the server puts before every handle: fixed, so that handles outlive a
/// restart (the write verifier still changes at each start).
const HANDLE_GENERATION: u64 = 0x7461_6e6b_0001_0000;

/// A running NFS server.
pub struct NfsServer {
    addr: SocketAddr,
    exports: Arc<Exports>,
    portmap: Portmap,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl NfsServer {
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// How clients find the server without being told its port.
    pub fn portmap(&self) -> &Portmap {
        &self.portmap
    }

    /// Stops serving and lets go of the exported datasets.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        if let Some(s) = self.shutdown.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if matches!(self.portmap, Portmap::Registered { .. }) {
            portmap::unregister();
            self.portmap = Portmap::Unavailable("stopped".into());
        }
        self.exports.clear();
    }
}

impl Drop for NfsServer {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

/// Serves `svc`'s nfs shares on `addr`.
pub fn start(svc: Arc<Service>, addr: SocketAddr) -> Result<NfsServer> {
    let exports = Exports::new(svc.clone());
    let fs = vfs::TankNfs::new(exports.clone(), svc.protocols.clone());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .thread_name("tank-nfs")
        .enable_all()
        .build()
        .context("cannot start the NFS server's runtime")?;
    let listener = rt
        .block_on(NFSTcpListener::bind_with_generation(
            &addr.to_string(),
            fs,
            HANDLE_GENERATION,
        ))
        .with_context(|| format!("cannot listen on {addr}"))?;
    let bound = SocketAddr::new(listener.get_listen_ip(), listener.get_listen_port());
    let portmap = if bound.port() != portmap::NFS_PORT {
        Portmap::NotStandardPort
    } else {
        match portmap::register(bound) {
            Ok(Some(socket)) => Portmap::Registered { socket },
            Err(e) => Portmap::Unavailable(format!("{e:#}")),
            Ok(None) => {
                let at = SocketAddr::new(bound.ip(), portmap::PORTMAP_PORT);
                match rt.block_on(portmap::serve(at, bound.port())) {
                    Ok(()) => Portmap::Serving(at),
                    Err(e) => Portmap::Unavailable(format!("no rpcbind runs, and {e:#}")),
                }
            }
        }
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    let thread = std::thread::Builder::new()
        .name("tank-nfs".into())
        .spawn(move || {
            rt.block_on(async move {
                tokio::select! {
                    r = listener.handle_forever() => {
                        if let Err(e) = r {
                            eprintln!("nfs: the listener stopped: {e}");
                        }
                    }
                    _ = rx => {}
                }
            });
            rt.shutdown_timeout(Duration::from_secs(5));
        })?;
    Ok(NfsServer {
        addr: bound,
        exports,
        portmap,
        shutdown: Some(tx),
        thread: Some(thread),
    })
}
