//! tank's iSCSI target: the service's `iscsi` shares, volumes served as SCSI block devices
//! to initiators (hypervisors first), over RFC 7143.
//!
//! # Theory of operation
//! No usable Rust iSCSI target library exists (the one published crate panics on a READ(16)
//! past the end of the disk and then stops answering), so the target is written here, on a
//! tokio runtime of its own (`tank serve --iscsi ADDR`):
//! - `pdu.rs`: PDUs, digests and LUN addressing;
//! - `text.rs`: text keys, parameter negotiation and CHAP's arithmetic;
//! - `login.rs`: the login phase (security and operational negotiation);
//! - `conn.rs`: a connection's full feature phase: command ordering, R2T flow control,
//!   Data-In, task management, keepalive, session reinstatement;
//! - `target.rs`: the targets and their LUNs, built from the share registry;
//! - `scsi.rs`, `sense.rs`, `reserve.rs`: the SCSI block device (SPC-4, SBC-3) on a volume,
//!   its sense data and its reservations;
//! - `xcopy.rs`: the copy manager (EXTENDED COPY, RECEIVE COPY RESULTS).
//!
//! docs/ISCSI.md has the feature matrix.

pub mod conn;
pub mod login;
pub mod pdu;
pub mod reserve;
pub mod scsi;
pub mod sense;
pub mod target;
pub mod text;
pub mod xcopy;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use tank_service::Service;

pub use target::Targets;

/// Connections the target serves at once.
const MAX_CONNECTIONS: usize = 256;

/// A running iSCSI target.
pub struct IscsiServer {
    addr: SocketAddr,
    shared: Arc<conn::Shared>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl IscsiServer {
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sessions logged in now.
    pub fn sessions(&self) -> usize {
        self.shared.sessions.count()
    }

    /// Stops serving: every session is closed and every volume let go.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        self.shared.sessions.close_all();
        if let Some(s) = self.shutdown.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.shared.targets.clear();
    }
}

impl Drop for IscsiServer {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

/// Serves `svc`'s iscsi shares on `addr`.
pub fn start(svc: Arc<Service>, addr: SocketAddr) -> Result<IscsiServer> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(64)
        .thread_name("tank-iscsi")
        .enable_all()
        .build()
        .context("cannot start the iSCSI target's runtime")?;
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(addr))
        .with_context(|| format!("cannot listen on {addr}"))?;
    let bound = listener.local_addr()?;
    let shared = Arc::new(conn::Shared {
        targets: Targets::new(svc.clone()),
        sessions: conn::Sessions::default(),
        stats: svc.protocols.clone(),
    });
    let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
    let sh = shared.clone();
    let thread = std::thread::Builder::new()
        .name("tank-iscsi".into())
        .spawn(move || {
            rt.block_on(async move {
                let limit = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
                loop {
                    tokio::select! {
                        _ = &mut rx => break,
                        a = listener.accept() => {
                            let Ok((stream, _)) = a else { continue };
                            let Ok(permit) = limit.clone().try_acquire_owned() else {
                                // Too many connections: this one is closed at once.
                                drop(stream);
                                continue;
                            };
                            let sh = sh.clone();
                            tokio::spawn(async move {
                                conn::serve(sh, stream).await;
                                drop(permit);
                            });
                        }
                    }
                }
            });
            rt.shutdown_timeout(std::time::Duration::from_secs(5));
        })
        .context("cannot start the iSCSI target's thread")?;
    Ok(IscsiServer {
        addr: bound,
        shared,
        shutdown: Some(tx),
        thread: Some(thread),
    })
}
