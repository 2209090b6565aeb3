//! `tank-api`: the HTTPS REST API of the management service, its OpenAPI document, the
//! event stream and the metrics (docs/ARCHITECTURE.md, "api").
//!
//! # Theory of operation
//! One listener (default 127.0.0.1:8443) on a tokio runtime of its own. Each connection's
//! first byte tells TLS (a handshake record, 0x16) from plain HTTP: TLS is served (rustls,
//! `tls.rs`), plain HTTP only gets a redirect to the same path over HTTPS. Connections
//! are bounded in number, and in the time they may take to hand over a TLS handshake and
//! request headers.
//!
//! Every request runs through the service's one entry point (`Service::handle`) for the
//! caller its credentials name (`auth.rs`: a session cookie with CSRF check, or a bearer
//! token; nobody known otherwise), on a blocking thread: a client that disconnects
//! mid-request does not stop it half-way, the request completes or fails whole. Routes:
//! `POST /api/v1/{op}` for every request of the API (the body holds its fields), GET
//! shortcuts for the common reads, login/logout/session, `GET /api/v1/events` (pool
//! events and I/O statistics as server-sent events), `GET /api/openapi.json` and
//! `GET /metrics` (anonymous or authenticated, as the daemon is told). Replies are the
//! socket's: `{"ok": {"response", "notes"}}` or `{"error": {"kind", "message"}}` with the
//! kind's HTTP status. Bodies over 1 MiB, malformed JSON, unknown fields and routes each
//! get a clear error and change nothing.

pub mod auth;
pub mod client;
pub mod console;
pub mod metrics;
pub mod openapi;
mod routes;
pub mod tls;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tank_service::Service;

pub use routes::router;

/// How the API is served.
#[derive(Debug, Clone)]
pub struct ApiOptions {
    pub addr: SocketAddr,
    /// A certificate chain and key (PEM) to serve instead of the generated one.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// Whether `/metrics` answers without credentials.
    pub metrics_public: bool,
}

/// Most connections served at once; more wait in the kernel's backlog.
pub const MAX_CONNECTIONS: usize = 1024;
/// Time a connection has to complete its TLS handshake, and to send a request's headers.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What every handler shares.
pub struct State {
    pub svc: Arc<Service>,
    pub auth: auth::Auth,
    pub registry: prometheus_client::registry::Registry,
    pub metrics_public: bool,
    pub ops: std::collections::HashSet<String>,
    pub openapi: serde_json::Value,
}

/// A running API server.
pub struct ApiServer {
    addr: SocketAddr,
    pub cert: PathBuf,
    pub generated: bool,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ApiServer {
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address as a URL.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Stops accepting and ends the runtime (requests in flight on blocking threads finish).
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
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

/// The shared state of a server of `svc`.
pub fn state(svc: Arc<Service>, metrics_public: bool) -> Arc<State> {
    let registry = metrics::registry(svc.clone());
    Arc::new(State {
        svc,
        auth: auth::Auth::default(),
        registry,
        metrics_public,
        ops: openapi::ops().into_iter().collect(),
        openapi: openapi::document(),
    })
}

/// Starts serving the API of `svc` on `opts.addr`.
pub fn start(svc: Arc<Service>, data_dir: &Path, opts: &ApiOptions) -> Result<ApiServer> {
    let files = tls::files(data_dir, opts.cert.as_deref(), opts.key.as_deref())?;
    let tls = tls::server_config(&files)?;
    let std_listener = std::net::TcpListener::bind(opts.addr)
        .with_context(|| format!("cannot listen on {}", opts.addr))?;
    std_listener.set_nonblocking(true)?;
    let addr = std_listener.local_addr()?;
    let st = state(svc, opts.metrics_public);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(64)
        .thread_name("tank-api")
        .enable_all()
        .build()
        .context("cannot start the API's runtime")?;
    let thread = std::thread::Builder::new()
        .name("tank-api".into())
        .spawn(move || {
            rt.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(std_listener) {
                    Ok(l) => l,
                    Err(e) => {
                        eprintln!("api: cannot listen: {e}");
                        return;
                    }
                };
                tokio::select! {
                    () = routes::serve(listener, tls, st) => {}
                    _ = rx => {}
                }
            });
            rt.shutdown_timeout(Duration::from_secs(5));
        })?;
    Ok(ApiServer {
        addr,
        cert: files.cert,
        generated: files.generated,
        shutdown: Some(tx),
        thread: Some(thread),
    })
}
