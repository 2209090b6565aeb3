//! The API's routes and its connection loop (see the crate documentation).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::Path;
use axum::http::{header, HeaderMap, HeaderValue, Method, Request as HttpRequest, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response as HttpResponse};
use axum::routing::{get, post};
use axum::{Extension, Router};
use futures_util::stream::{self, Stream, StreamExt};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use serde_json::{json, Value};
use tank_service::api::{Reply, Request, Response, WireError};
use tank_service::iohistory::IoTotals;
use tank_service::{Caller, ServiceError};
use tower::ServiceExt;

use crate::{State, HANDSHAKE_TIMEOUT, MAX_CONNECTIONS};

/// Largest request body.
pub const MAX_BODY: usize = 1 << 20;

/// The peer's address, put on every request of a connection.
#[derive(Clone, Copy)]
pub struct Peer(pub SocketAddr);

pub(crate) type St = Arc<State>;

fn status_of(e: &ServiceError) -> StatusCode {
    StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

fn error(e: &ServiceError) -> HttpResponse {
    let mut r = (status_of(e), axum::Json(Reply::Error(WireError::from(e)))).into_response();
    if matches!(e, ServiceError::Unauthenticated(_)) {
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"tank\""),
        );
    }
    r
}

fn reply(r: Result<Response, ServiceError>, notes: Vec<String>) -> HttpResponse {
    match r {
        Ok(response) => axum::Json(Reply::Ok { response, notes }).into_response(),
        Err(e) => error(&e),
    }
}

/// Runs a request for a caller on a blocking thread (it completes even if the client goes
/// away), counting it for the metrics.
/// `op` is the request's name, known from the route (naming a request otherwise costs a
/// serialization of it).
async fn run(st: &St, caller: Caller, op: &str, req: Request) -> HttpResponse {
    let stats = st.svc.protocols.op("api", op);
    let started = Instant::now();
    let svc = st.svc.clone();
    // The pool history names the request and who made it.
    let command = format!("api {op} ({})", caller.name().unwrap_or("anonymous"));
    let r = tokio::task::spawn_blocking(move || svc.handle(&caller, req, Some(command))).await;
    let (r, notes) = match r {
        Ok(x) => x,
        Err(e) => (
            Err(ServiceError::Failed(format!(
                "the request's worker failed: {e}"
            ))),
            Vec::new(),
        ),
    };
    stats.record(started.elapsed(), r.is_err());
    reply(r, notes)
}

fn caller(st: &St, headers: &HeaderMap, method: &Method) -> Result<Caller, ServiceError> {
    let changes = !matches!(*method, Method::GET | Method::HEAD);
    st.auth.caller(&st.svc, headers, changes)
}

/// Bytes of an oversized body read and thrown away before the refusal, so that the client
/// is not cut off mid-send and sees the answer; beyond this the connection is dropped.
const DRAIN_MAX: usize = 16 << 20;

async fn read_body(body: Body) -> Result<Bytes, ServiceError> {
    let mut stream = body.into_data_stream();
    let mut buf = Vec::new();
    let mut total = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk =
            chunk.map_err(|e| ServiceError::BadRequest(format!("the body was cut off: {e}")))?;
        total += chunk.len();
        if total <= MAX_BODY {
            buf.extend_from_slice(&chunk);
        } else if total > DRAIN_MAX {
            break;
        }
    }
    if total > MAX_BODY {
        return Err(ServiceError::BadRequest(format!(
            "the body is longer than {MAX_BODY} bytes"
        )));
    }
    Ok(Bytes::from(buf))
}

/// `POST /api/v1/{op}`: the body (a JSON object, or nothing) holds the request's fields.
async fn op(
    Extension(st): Extension<St>,
    Path(op): Path<String>,
    method: Method,
    headers: HeaderMap,
    body: Body,
) -> HttpResponse {
    // The body is read first, whatever the answer: a reply that leaves it unread makes
    // HTTP/2 clients see the stream reset.
    let bytes = match read_body(body).await {
        Ok(b) => b,
        Err(e) => {
            let mut r = error(&e);
            *r.status_mut() = StatusCode::PAYLOAD_TOO_LARGE;
            return r;
        }
    };
    if !st.ops.contains(&op) {
        return error(&ServiceError::NotFound(format!(
            "no such request '{op}' (the API's requests are listed in /api/openapi.json)"
        )));
    }
    let mut fields = if bytes.iter().all(u8::is_ascii_whitespace) {
        serde_json::Map::new()
    } else {
        match serde_json::from_slice::<Value>(&bytes) {
            Ok(Value::Object(m)) => m,
            Ok(_) => {
                return error(&ServiceError::BadRequest(
                    "the body must be a JSON object of the request's fields".into(),
                ))
            }
            Err(e) => return error(&ServiceError::BadRequest(format!("malformed JSON: {e}"))),
        }
    };
    if fields.contains_key("op") {
        return error(&ServiceError::BadRequest(
            "the request is named by the path, not by an 'op' field".into(),
        ));
    }
    fields.insert("op".into(), Value::String(op.clone()));
    let req: Request = match serde_json::from_value(Value::Object(fields)) {
        Ok(r) => r,
        Err(e) => return error(&ServiceError::BadRequest(format!("invalid request: {e}"))),
    };
    let who = match caller(&st, &headers, &method) {
        Ok(c) => c,
        Err(e) => return error(&e),
    };
    run(&st, who, &op, req).await
}

/// A GET shortcut for a read request named `op`.
async fn read(st: &St, headers: &HeaderMap, op: &str, req: Request) -> HttpResponse {
    match caller(st, headers, &Method::GET) {
        Ok(c) => run(st, c, op, req).await,
        Err(e) => error(&e),
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Login {
    user: String,
    password: String,
}

async fn login(
    Extension(st): Extension<St>,
    Extension(Peer(peer)): Extension<Peer>,
    body: Body,
) -> HttpResponse {
    let bytes = match read_body(body).await {
        Ok(b) => b,
        Err(e) => return error(&e),
    };
    let l: Login = match serde_json::from_slice(&bytes) {
        Ok(l) => l,
        Err(e) => {
            return error(&ServiceError::BadRequest(format!(
                "a login is {{\"user\": NAME, \"password\": PASSWORD}}: {e}"
            )))
        }
    };
    if let Some(wait) = st.auth.limited(peer.ip(), &l.user) {
        eprintln!(
            "api: login for '{}' from {} refused: too many failed logins",
            l.user,
            peer.ip()
        );
        let mut r = (
            StatusCode::TOO_MANY_REQUESTS,
            axum::Json(json!({"error": {"kind": "rate_limited", "message": format!(
                "too many failed logins; try again in {wait} s"
            )}})),
        )
            .into_response();
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(wait));
        return r;
    }
    let svc = st.svc.clone();
    let user = l.user.clone();
    let checked = tokio::task::spawn_blocking(move || {
        svc.accounts()
            .and_then(|a| a.check_password(&user, &l.password))
    })
    .await;
    match checked {
        Ok(Ok(u)) => {
            let (id, csrf) = st.auth.login(&u.name);
            let mut r = axum::Json(json!({
                "user": u.name, "admin": u.admin, "csrf_token": csrf,
                "expires_idle_secs": crate::auth::SESSION_IDLE.as_secs(),
            }))
            .into_response();
            let cookie = format!(
                "{}={id}; HttpOnly; Secure; SameSite=Strict; Path=/; Max-Age={}",
                crate::auth::COOKIE,
                crate::auth::SESSION_MAX.as_secs()
            );
            if let Ok(v) = HeaderValue::from_str(&cookie) {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            r
        }
        Ok(Err(_)) | Err(_) => {
            st.auth.failed(peer.ip(), &l.user);
            eprintln!("api: failed login for '{}' from {}", l.user, peer.ip());
            error(&ServiceError::Unauthenticated(
                "wrong user name or password".into(),
            ))
        }
    }
}

async fn logout(Extension(st): Extension<St>, headers: HeaderMap, body: Body) -> HttpResponse {
    let _ = read_body(body).await;
    // Logging out is a change: it needs the session's CSRF token too.
    if let Err(e) = st.auth.caller(&st.svc, &headers, true) {
        return error(&e);
    }
    if let Some(id) = crate::auth::cookie(&headers, crate::auth::COOKIE) {
        st.auth.logout(&id);
    }
    let mut r = axum::Json(
        json!({"ok": {"response": {"type": "done", "data": {"message": "logged out"}}}}),
    )
    .into_response();
    r.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static(
            "tank_session=; HttpOnly; Secure; SameSite=Strict; Path=/; Max-Age=0",
        ),
    );
    r
}

async fn metrics(Extension(st): Extension<St>, headers: HeaderMap) -> HttpResponse {
    if !st.metrics_public {
        match caller(&st, &headers, &Method::GET) {
            Ok(Caller::Anonymous) => {
                return error(&ServiceError::Unauthenticated(
                    "the metrics need a token (or start the daemon with --metrics-public)".into(),
                ))
            }
            Ok(_) => {}
            Err(e) => return error(&e),
        }
    }
    let text = crate::metrics::render(&st.registry);
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// `GET /api/v1/events`: new pool events as `pool_event` and, each second, every pool's
/// I/O of that second as `iostat`, until the client goes away.
async fn events(Extension(st): Extension<St>, headers: HeaderMap) -> HttpResponse {
    let who = match caller(&st, &headers, &Method::GET) {
        Ok(c) => c,
        Err(e) => return error(&e),
    };
    if let Err(e) = tank_service::authorize(&who, &tank_service::Access::Read) {
        return error(&e);
    }
    // A stream a session opened ends with the session (logout, idle or longest life):
    // the stream's own traffic does not keep it alive.
    let session = if headers.contains_key(header::AUTHORIZATION) {
        None
    } else {
        crate::auth::cookie(&headers, crate::auth::COOKIE)
    };
    Sse::new(event_stream(st, session))
        .keep_alive(KeepAlive::default())
        .into_response()
}

#[derive(Default)]
struct Seen {
    seq: HashMap<String, u64>,
    io: HashMap<String, IoTotals>,
}

fn tick(st: &St, seen: &mut Seen, first: bool) -> Vec<Result<Event, Infallible>> {
    let mut out = Vec::new();
    for o in st.svc.open_pools() {
        let name = o.pool.name();
        let last = seen.seq.get(&name).copied();
        let events = o.pool.events.since(last.unwrap_or(0));
        if let Some(newest) = events.iter().map(|e| e.seq).max() {
            seen.seq.insert(name.clone(), newest);
        }
        if !first {
            for e in events {
                let data = json!({"pool": name, "seq": e.seq, "time": e.time, "class": e.class,
                    "vdev": e.vdev, "detail": e.detail});
                out.push(Ok(Event::default()
                    .event("pool_event")
                    .data(data.to_string())));
            }
        }
        let now = IoTotals::of(&o);
        if let Some(prev) = seen.io.insert(name.clone(), now) {
            let d = now.since(&prev);
            let data = json!({"pool": name,
                "read_ops": d.read_ops, "write_ops": d.write_ops,
                "read_bytes": d.read_bytes, "write_bytes": d.write_bytes,
                "interval_secs": 1});
            out.push(Ok(Event::default().event("iostat").data(data.to_string())));
        }
    }
    out
}

fn event_stream(st: St, session: Option<String>) -> impl Stream<Item = Result<Event, Infallible>> {
    let mut seen = Seen::default();
    // What is there when the client connects is not news.
    let _ = tick(&st, &mut seen, true);
    stream::unfold((st, seen), move |(st, mut seen)| {
        let session = session.clone();
        async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if let Some(id) = &session {
                if st.auth.session(id, false).is_err() {
                    return None;
                }
            }
            let items = tick(&st, &mut seen, false);
            Some((stream::iter(items), (st, seen)))
        }
    })
    .flatten()
}

async fn not_found(uri: axum::http::Uri, body: Body) -> HttpResponse {
    let _ = read_body(body).await;
    error(&ServiceError::NotFound(format!(
        "no such route {} (see /api/openapi.json)",
        uri.path()
    )))
}

/// The router of a state (without the connection loop: tests drive it directly too).
pub fn router(st: St) -> Router {
    Router::new()
        .route("/", get(crate::console::shell))
        .route("/login", get(crate::console::login_page))
        .route("/console/{name}", get(crate::console::asset))
        .route("/api/v1/login", post(login))
        .route("/api/v1/logout", post(logout))
        .route(
            "/api/v1/session",
            get(|Extension(st): Extension<St>, h: HeaderMap| async move {
                read(&st, &h, "hello", Request::Hello).await
            }),
        )
        .route(
            "/api/v1/pools",
            get(|Extension(st): Extension<St>, h: HeaderMap| async move {
                read(&st, &h, "pool_list", Request::PoolList { names: vec![] }).await
            }),
        )
        .route(
            "/api/v1/pools/{name}",
            get(
                |Extension(st): Extension<St>, Path(name): Path<String>, h: HeaderMap| async move {
                    read(
                        &st,
                        &h,
                        "pool_status",
                        Request::PoolStatus { name: Some(name) },
                    )
                    .await
                },
            ),
        )
        .route(
            "/api/v1/datasets",
            get(|Extension(st): Extension<St>, h: HeaderMap| async move {
                read(
                    &st,
                    &h,
                    "dataset_list",
                    Request::DatasetList {
                        names: vec![],
                        recursive: true,
                        types: Vec::new(),
                    },
                )
                .await
            }),
        )
        .route(
            "/api/v1/shares",
            get(|Extension(st): Extension<St>, h: HeaderMap| async move {
                read(&st, &h, "share_list", Request::ShareList).await
            }),
        )
        .route(
            "/api/v1/jobs",
            get(|Extension(st): Extension<St>, h: HeaderMap| async move {
                read(&st, &h, "job_list", Request::JobList).await
            }),
        )
        .route(
            "/api/v1/jobs/{id}",
            get(
                |Extension(st): Extension<St>, Path(id): Path<String>, h: HeaderMap| async move {
                    match id.parse() {
                        Ok(id) => read(&st, &h, "job_get", Request::JobGet { id }).await,
                        Err(_) => error(&ServiceError::BadRequest(format!(
                            "'{id}' is not a job id (a number)"
                        ))),
                    }
                },
            ),
        )
        .route("/api/v1/events", get(events))
        .route("/api/v1/{op}", post(op))
        .route(
            "/api/openapi.json",
            get(|Extension(st): Extension<St>| async move {
                axum::Json(st.openapi.clone()).into_response()
            }),
        )
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(axum::middleware::map_response(crate::console::harden))
        .layer(Extension(st))
}

/// Answers plain HTTP with a redirect to HTTPS.
async fn redirect(req: HttpRequest<hyper::body::Incoming>) -> Result<HttpResponse, Infallible> {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost")
        .to_string();
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let location = format!("https://{host}{path}");
    let mut r = (
        StatusCode::PERMANENT_REDIRECT,
        format!("this server speaks HTTPS only: {location}\n"),
    )
        .into_response();
    if let Ok(v) = HeaderValue::from_str(&location) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    Ok(r)
}

/// Accepts connections until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, tls: Arc<rustls::ServerConfig>, st: St) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let app = router(st);
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let (tcp, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(_) => {
                // Out of descriptors, say: try again shortly.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let _ = tcp.set_nodelay(true);
            let mut first = [0u8; 1];
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, tcp.peek(&mut first)).await {
                Ok(Ok(1)) => {}
                _ => return,
            }
            let mut b = auto::Builder::new(TokioExecutor::new());
            b.http1()
                .timer(TokioTimer::new())
                .header_read_timeout(HANDSHAKE_TIMEOUT);
            if first[0] == 0x16 {
                let Ok(Ok(stream)) =
                    tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await
                else {
                    return;
                };
                let svc = app.map_request(move |mut req: HttpRequest<hyper::body::Incoming>| {
                    req.extensions_mut().insert(Peer(peer));
                    req
                });
                let _ = b
                    .serve_connection_with_upgrades(
                        TokioIo::new(stream),
                        TowerToHyperService::new(svc),
                    )
                    .await;
            } else {
                let _ = b
                    .serve_connection(TokioIo::new(tcp), hyper::service::service_fn(redirect))
                    .await;
            }
        });
    }
}
