//! tank's S3 endpoint: the service's `s3` shares, served as buckets from the dataset layer.
//!
//! # Theory of operation
//! One TCP listener (`tank serve --s3 URL`), plain HTTP or HTTPS with the daemon's
//! certificate, on a tokio runtime of its own. The S3 protocol (routing, XML, SigV4 in
//! headers, presigned URLs and streaming `aws-chunked` bodies) comes from `s3s`; below it:
//! - here: secret keys are the accounts' S3 keys; Signature Version 2 is refused unless
//!   `--s3-sigv2` allows it (it has no clock-skew check: a captured request could be
//!   replayed); the HTTP layer answers CORS (`cors.rs`) around s3s;
//! - `buckets.rs`: the bucket table, built from the share registry and kept in step with
//!   it, each bucket holding its dataset through the service;
//! - `ops.rs`: the operations on buckets and objects, `multipart.rs` the uploads in parts;
//! - `store.rs`: objects as files of the bucket's filesystem, `keys.rs` the key-to-path
//!   mapping;
//! - `versions.rs`: versions, delete markers and Object Lock beside the current files,
//!   `ops_versions.rs` their operations;
//! - `ops_bucket.rs`: bucket tags, the anonymous-read policy, CORS and lifecycle rules;
//!   `lifecycle.rs` the thread that applies the rules.
//!
//! At the start, before any request, each bucket is tidied after a crash: bodies being
//! received are removed, parts of uploads already completed removed, and versioned
//! changes cut short finished.
//!
//! Every response carries an `x-amz-request-id`; every request is counted in the service's
//! per-protocol statistics (`/metrics`). Connections are bounded (1,024 at once) and a
//! client has 30 s to send a request's headers.

pub mod buckets;
pub mod client;
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
/// buckets, to read), and refuses Signature Version 2 unless the administrator allowed it
/// (`--s3-sigv2`).
struct Access {
    sigv2: bool,
}

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
        if !self.sigv2 && sig_v2(cx.headers(), cx.uri().query()) {
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
        if !self.sigv2 && req.credentials.is_some() && req.region.is_none() {
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
    config.xml_max_body_size = MAX_XML as usize;
    b.set_config(std::sync::Arc::new(s3s::config::StaticConfigProvider::new(
        std::sync::Arc::new(config),
    )));
    b.set_auth(KeyAuth { svc: svc.clone() });
    b.set_access(Access {
        sigv2: opts.settings.allow_sigv2,
    });
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
    let sigv2 = opts.settings.allow_sigv2;
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
                    () = serve(listener, tls, service, stats, cors, sigv2) => {}
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
    sigv2: bool,
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
                        // A request announced with `Expect: 100-continue` and answered
                        // without a 100 (an empty body: nothing to continue to; or an
                        // error found before the body was wanted) leaves botocore holding
                        // that answer's status for the connection's next request with the
                        // same header, whose answer it then reads wrong (a stalled, empty
                        // or stale response). Such a connection is closed after its
                        // answer, as S3 itself closes after an error.
                        let expects = req
                            .headers()
                            .get(http::header::EXPECT)
                            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
                        let empty = req
                            .headers()
                            .get(http::header::CONTENT_LENGTH)
                            .is_some_and(|v| v.as_bytes() == b"0");
                        let mut req = req;
                        if sigv2 && sig_v2(req.headers(), req.uri().query()) {
                            v2_bucket_path(&mut req);
                        }
                        let r = if method == http::Method::OPTIONS {
                            Ok(cors.preflight(req.headers(), req.uri().path()).await)
                        } else if let Some(too_big) = xml_too_big(&req) {
                            Ok(too_big)
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
                            let refused =
                                resp.status().is_client_error() || resp.status().is_server_error();
                            if expects && (empty || refused) {
                                resp.headers_mut().insert(
                                    http::header::CONNECTION,
                                    http::HeaderValue::from_static("close"),
                                );
                            }
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

/// The largest XML (or JSON policy) body of a request, read whole before it is parsed.
const MAX_XML: u64 = 4 << 20;

/// Whether a request's body is a document read whole (XML, or a JSON policy): the
/// sub-resources of bucket and object settings, DeleteObjects and a multipart complete.
fn document_body(method: &http::Method, query: Option<&str>) -> bool {
    const SETTINGS: &[&str] = &[
        "tagging",
        "versioning",
        "cors",
        "lifecycle",
        "policy",
        "object-lock",
        "retention",
        "legal-hold",
        "acl",
        "notification",
        "replication",
        "website",
        "encryption",
        "logging",
        "requestPayment",
        "accelerate",
        "ownershipControls",
        "publicAccessBlock",
    ];
    let keys: Vec<&str> = query
        .unwrap_or("")
        .split('&')
        .map(|kv| kv.split('=').next().unwrap_or(""))
        .collect();
    match *method {
        http::Method::POST => keys.iter().any(|k| *k == "delete" || *k == "uploadId"),
        http::Method::PUT => {
            !keys.contains(&"partNumber") && keys.iter().any(|k| SETTINGS.contains(k))
        }
        _ => false,
    }
}

/// The answer to a request whose document body is announced larger than [`MAX_XML`]:
/// refused before a byte of it is read (s3s would read it up to its own limit and answer
/// an internal error).
fn xml_too_big(req: &http::Request<hyper::body::Incoming>) -> Option<http::Response<s3s::Body>> {
    if !document_body(req.method(), req.uri().query()) {
        return None;
    }
    let len: u64 = req
        .headers()
        .get(http::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()?;
    if len <= MAX_XML {
        return None;
    }
    let mut r = error_response(
        http::StatusCode::BAD_REQUEST,
        "MaxMessageLengthExceeded",
        &format!("Your request was too big: documents are at most {MAX_XML} bytes"),
    );
    r.headers_mut().insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("close"),
    );
    Some(r)
}

/// An S3 error response of our own (outside s3s).
pub fn error_response(
    status: http::StatusCode,
    code: &str,
    message: &str,
) -> http::Response<s3s::Body> {
    let esc = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    };
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{}</Code><Message>{}</Message></Error>",
        esc(code),
        esc(message)
    );
    let mut r = http::Response::new(s3s::Body::from(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/xml"),
    );
    r
}

/// A bucket-only path signed with Signature Version 2 gets its trailing slash: SDKs sign
/// `/BUCKET/` for it, as S3 canonicalizes it, while s3s signs the path as sent.
fn v2_bucket_path<B>(req: &mut http::Request<B>) {
    let path = req.uri().path();
    let rest = path.trim_start_matches('/');
    if rest.is_empty() || rest.contains('/') {
        return;
    }
    let pq = match req.uri().query() {
        Some(q) => format!("{path}/?{q}"),
        None => format!("{path}/"),
    };
    let mut parts = req.uri().clone().into_parts();
    if let Ok(v) = pq.parse() {
        parts.path_and_query = Some(v);
        if let Ok(u) = http::Uri::from_parts(parts) {
            *req.uri_mut() = u;
        }
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
