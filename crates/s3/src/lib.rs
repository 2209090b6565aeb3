//! tank's S3 endpoint: the service's `s3` shares, served as buckets from the dataset layer.
//!
//! # Theory of operation
//! One TCP listener (`tank serve --s3 URL`), plain HTTP or HTTPS with the daemon's
//! certificate, on a tokio runtime of its own. The S3 protocol (routing, XML, SigV4 in
//! headers, presigned URLs and streaming `aws-chunked` bodies) comes from `s3s`; below it:
//! - `auth.rs` (here): secret keys are the accounts' S3 keys; Signature Version 2 is
//!   refused (it has no clock-skew check: a captured request could be replayed);
//! - `buckets.rs`: the bucket table, built from the share registry and kept in step with
//!   it, each bucket holding its dataset through the service;
//! - `ops.rs`: the operations on buckets and objects, `multipart.rs` the uploads in parts;
//! - `store.rs`: objects as files of the bucket's filesystem, `keys.rs` the key-to-path
//!   mapping.
//!
//! Every response carries an `x-amz-request-id`; every request is counted in the service's
//! per-protocol statistics (`/metrics`). Connections are bounded (1,024 at once) and a
//! client has 30 s to send a request's headers.

pub mod buckets;
pub mod cors;
pub mod keys;
pub mod lifecycle;
pub mod multipart;
pub mod ops;
pub mod ops_bucket;
pub mod ops_versions;
pub mod store;
pub mod versions;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use s3s::access::{S3Access, S3AccessContext};
use s3s::auth::{S3Auth, SecretKey};
use s3s::service::S3ServiceBuilder;
use s3s::{s3_error, S3Result};
use tank_service::Service;

pub use buckets::Buckets;
pub use ops::Settings;

/// How the endpoint is served.
#[derive(Clone)]
pub struct S3Options {
    pub addr: SocketAddr,
    /// HTTPS with this configuration; None: plain HTTP.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// The domain for virtual-hosted-style requests (`BUCKET.DOMAIN`); path-style always
    /// works.
    pub domain: Option<String>,
    pub settings: Settings,
}

/// The largest browser POST upload (held in memory while it is checked).
const MAX_POST: u64 = 64 << 20;

/// Connections served at once.
const MAX_CONNECTIONS: usize = 1024;

/// The secret keys: the accounts' S3 keys, looked up at each request (a removed key is
/// refused at once).
struct KeyAuth {
    svc: Arc<Service>,
}

#[async_trait::async_trait]
impl S3Auth for KeyAuth {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<SecretKey> {
        let accounts = self
            .svc
            .accounts()
            .map_err(|e| s3_error!(InternalError, "the account store: {e}"))?;
        match accounts.key(access_key) {
            Ok(Some(k)) => Ok(SecretKey::from(k.secret_key)),
            Ok(None) => Err(s3_error!(
                InvalidAccessKeyId,
                "The AWS Access Key Id you provided does not exist in our records."
            )),
            Err(e) => Err(s3_error!(InternalError, "the account store: {e}")),
        }
    }
}

/// Lets unsigned requests through to the operations (which allow them only on public
/// buckets, to read), and refuses Signature Version 2.
struct Access;

/// Whether a request is signed with Signature Version 2 (header or query).
fn sig_v2(headers: &http::HeaderMap, query: Option<&str>) -> bool {
    let header = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("AWS "));
    let query = query.is_some_and(|q| {
        q.split('&')
            .any(|kv| kv.starts_with("Signature=") || kv.starts_with("AWSAccessKeyId="))
    });
    header || query
}

#[async_trait::async_trait]
impl S3Access for Access {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        if sig_v2(cx.headers(), cx.uri().query()) {
            return Err(s3_error!(
                AccessDenied,
                "Signature Version 2 is not accepted: sign with Signature Version 4"
            ));
        }
        Ok(())
    }

    /// A PUT, or a browser's POST form (which s3s turns into a PUT), signed with Signature
    /// Version 2 carries no region: refused as above (a form's signature is in its fields,
    /// which `check` does not see).
    async fn put_object(&self, req: &mut s3s::S3Request<s3s::dto::PutObjectInput>) -> S3Result<()> {
        if req.credentials.is_some() && req.region.is_none() {
            return Err(s3_error!(
                AccessDenied,
                "Signature Version 2 is not accepted: sign with Signature Version 4"
            ));
        }
        Ok(())
    }
}

/// A running S3 endpoint.
pub struct S3Server {
    addr: SocketAddr,
    https: bool,
    buckets: Arc<Buckets>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    lifecycle: Option<(std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>)>,
}

impl S3Server {
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The endpoint's URL.
    pub fn url(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// Stops serving and lets go of the buckets' datasets.
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
        if let Some((stop, t)) = self.lifecycle.take() {
            let _ = stop.send(());
            let _ = t.join();
        }
        self.buckets.clear();
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

/// Serves `svc`'s s3 shares as `opts` says.
pub fn start(svc: Arc<Service>, opts: S3Options) -> Result<S3Server> {
    let buckets = Buckets::new(svc.clone());
    // Bodies a previous run was receiving when it stopped (a crash, a kill) never became
    // objects: they go before the first request.
    for b in buckets.all() {
        if let Some(fs) = b.fs() {
            match store::clean_tmp(&fs) {
                Ok(0) => {}
                Ok(n) => println!("s3 bucket {}: removed {n} unfinished upload bodies", b.name),
                Err(e) => eprintln!(
                    "s3 bucket {}: cannot clean its unfinished bodies: errno {}",
                    b.name, e.0
                ),
            }
            match multipart::clean_completed(&fs) {
                Ok(0) => {}
                Ok(n) => println!(
                    "s3 bucket {}: removed the parts of {n} completed uploads",
                    b.name
                ),
                Err(e) => eprintln!(
                    "s3 bucket {}: cannot clean its completed uploads: errno {}",
                    b.name, e.0
                ),
            }
            // A versioned change cut short by the stop is finished (the newest version
            // back in its key's place where the current one was removed).
            match versions::settle_all(&fs) {
                Ok(0) => {}
                Ok(n) => println!(
                    "s3 bucket {}: {n} keys back to their newest version",
                    b.name
                ),
                Err(e) => eprintln!(
                    "s3 bucket {}: cannot check its versions: errno {}",
                    b.name, e.0
                ),
            }
        }
    }
    let backend = ops::TankS3 {
        svc: svc.clone(),
        buckets: buckets.clone(),
        settings: opts.settings.clone(),
    };
    let mut b = S3ServiceBuilder::new(backend);
    // A browser's POST upload is gathered in memory by s3s before it is checked: its size
    // is bounded well below a PUT's.
    let mut config = s3s::config::S3Config::default();
    config.post_object_max_file_size = MAX_POST;
    b.set_config(std::sync::Arc::new(s3s::config::StaticConfigProvider::new(
        std::sync::Arc::new(config),
    )));
    b.set_auth(KeyAuth { svc: svc.clone() });
    b.set_access(Access);
    let std_listener = std::net::TcpListener::bind(opts.addr)
        .with_context(|| format!("cannot listen on {}", opts.addr))?;
    std_listener.set_nonblocking(true)?;
    let addr = std_listener.local_addr()?;
    if let Some(d) = &opts.domain {
        // Clients send the port in Host unless it is the scheme's default.
        let port = addr.port();
        let host = s3s::host::MultiDomain::new([d.clone(), format!("{d}:{port}")])
            .map_err(|e| anyhow::anyhow!("invalid S3 domain '{d}': {e:?}"))?;
        b.set_host(host);
    }
    let service = b.build();
    let cors = cors::Cors {
        buckets: buckets.clone(),
        domain: opts.domain.clone(),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(64)
        .thread_name("tank-s3")
        .enable_all()
        .build()
        .context("cannot start the S3 endpoint's runtime")?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let tls = opts.tls.clone();
    let stats = svc.protocols.clone();
    let thread = std::thread::Builder::new()
        .name("tank-s3".into())
        .spawn(move || {
            rt.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(std_listener) {
                    Ok(l) => l,
                    Err(e) => {
                        eprintln!("s3: cannot listen: {e}");
                        return;
                    }
                };
                tokio::select! {
                    () = serve(listener, tls, service, stats, cors) => {}
                    _ = rx => {}
                }
            });
            rt.shutdown_timeout(Duration::from_secs(5));
        })?;
    let (stop, stopped) = std::sync::mpsc::channel();
    let worker = lifecycle::spawn(
        buckets.clone(),
        opts.settings.lifecycle_interval,
        opts.settings.lifecycle_day,
        stopped,
    )?;
    Ok(S3Server {
        addr,
        https: opts.tls.is_some(),
        buckets,
        shutdown: Some(tx),
        thread: Some(thread),
        lifecycle: Some((stop, worker)),
    })
}

async fn serve(
    listener: tokio::net::TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    service: s3s::service::S3Service,
    stats: Arc<tank_service::stats::ProtocolStats>,
    cors: cors::Cors,
) {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut http = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    http.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(30));
    loop {
        let Ok((tcp, _peer)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            continue; // dropped: closed at once
        };
        let _ = tcp.set_nodelay(true);
        let (service, acceptor, http, stats, cors) = (
            service.clone(),
            acceptor.clone(),
            http.clone(),
            stats.clone(),
            cors.clone(),
        );
        tokio::spawn(async move {
            let _slot = slot;
            let handler =
                hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let service = service.clone();
                    let stats = stats.clone();
                    let cors = cors.clone();
                    async move {
                        let op = format!("{} {}", req.method(), kind_of(req.uri().path()));
                        let start = Instant::now();
                        let method = req.method().clone();
                        let origin = req
                            .headers()
                            .get(http::header::ORIGIN)
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_string);
                        let bucket = cors.bucket_of(req.headers(), req.uri().path());
                        let r = if method == http::Method::OPTIONS {
                            Ok(cors.preflight(req.headers(), req.uri().path()).await)
                        } else {
                            let mut r = service.call(req.map(s3s::Body::from)).await;
                            if let (Some(o), Some(b), Ok(resp)) = (&origin, &bucket, &mut r) {
                                cors.decorate(b, o, &method, resp).await;
                            }
                            r
                        };
                        let failed = r.as_ref().map_or(true, |resp| {
                            resp.status().is_server_error() || resp.status().is_client_error()
                        });
                        stats.op("s3", &op).record(start.elapsed(), failed);
                        r.map(|mut resp| {
                            let id = format!("{:016X}", rand::random::<u64>());
                            if let Ok(v) = http::HeaderValue::from_str(&id) {
                                resp.headers_mut().insert("x-amz-request-id", v);
                            }
                            resp
                        })
                    }
                });
            match acceptor {
                Some(a) => {
                    let Ok(Ok(io)) =
                        tokio::time::timeout(Duration::from_secs(30), a.accept(tcp)).await
                    else {
                        return;
                    };
                    let _ = http.serve_connection(TokioIo::new(io), handler).await;
                }
                None => {
                    let _ = http.serve_connection(TokioIo::new(tcp), handler).await;
                }
            }
        });
    }
}

/// What a path names, for the statistics: the service, a bucket or an object.
fn kind_of(path: &str) -> &'static str {
    match path.trim_start_matches('/').split_once('/') {
        _ if path == "/" || path.is_empty() => "service",
        Some((_, rest)) if !rest.is_empty() => "object",
        _ => "bucket",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_v2_is_recognised_in_headers_and_queries() {
        let mut h = http::HeaderMap::new();
        assert!(!sig_v2(&h, None));
        h.insert(
            http::header::AUTHORIZATION,
            "AWS AKIAEXAMPLE:c2lnbmF0dXJl".parse().unwrap(),
        );
        assert!(sig_v2(&h, None));
        let v4 = http::HeaderMap::new();
        assert!(sig_v2(&v4, Some("AWSAccessKeyId=AK&Expires=1&Signature=x")));
        assert!(!sig_v2(
            &v4,
            Some("X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=abc")
        ));
    }

    #[test]
    fn paths_are_counted_by_kind() {
        assert_eq!(kind_of("/"), "service");
        assert_eq!(kind_of("/b"), "bucket");
        assert_eq!(kind_of("/b/"), "bucket");
        assert_eq!(kind_of("/b/k/x"), "object");
    }
}
