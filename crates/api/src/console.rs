//! The web console: the pages and assets the daemon serves at the API listener's root.
//!
//! # Theory of operation
//! The console is a static page and a script that drive the same public API every other
//! client uses (`POST /api/v1/{op}`, `GET /api/v1/events`): it holds no management logic
//! of its own and reaches nothing a token holder could not. Every file is embedded in the
//! binary (`include_bytes!` of `crates/api/console/`), hand-written with no build step,
//! plus a vendored copy of uPlot for the charts; nothing is fetched from elsewhere.
//!
//! `GET /login` is the login page. `GET /` is the console's shell: only with a live
//! session (else a redirect to `/login`), and with the session's CSRF token written into
//! a `<meta>` tag, which the script echoes in `X-CSRF-Token` on every request (a page of
//! another origin can neither read the shell nor send the header). The shell carries no
//! inline script or style, so the Content-Security-Policy allows only the console's own
//! files (`'self'`), and no framing (`frame-ancestors 'none'`). The script builds every
//! element with `textContent`, never HTML from data, so a name holding `<script>` shows as
//! text. Requests the script makes on its own (the dashboard's refresh) say so in
//! `X-Tank-Background` and do not keep an idle session alive: it ends after its idle time
//! as if the page were closed.

use axum::body::Body;
use axum::extract::Path;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use sha2::Digest;

use crate::routes::St;

/// The policy of every console response: the console's own files, nothing inline, no
/// framing, requests to this origin only.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; font-src 'self'; form-action 'self'; \
     base-uri 'none'; frame-ancestors 'none'";

/// An embedded file: its name under `/console/`, its type, its bytes.
struct Asset {
    name: &'static str,
    mime: &'static str,
    bytes: &'static [u8],
}

const ASSETS: &[Asset] = &[
    Asset {
        name: "app.js",
        mime: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../console/app.js"),
    },
    Asset {
        name: "login.js",
        mime: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../console/login.js"),
    },
    Asset {
        name: "console.css",
        mime: "text/css; charset=utf-8",
        bytes: include_bytes!("../console/console.css"),
    },
    Asset {
        name: "uPlot.iife.min.js",
        mime: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../console/vendor/uPlot.iife.min.js"),
    },
    Asset {
        name: "uPlot.min.css",
        mime: "text/css; charset=utf-8",
        bytes: include_bytes!("../console/vendor/uPlot.min.css"),
    },
    Asset {
        name: "favicon.svg",
        mime: "image/svg+xml",
        bytes: include_bytes!("../console/favicon.svg"),
    },
];

const SHELL: &str = include_str!("../console/index.html");
const LOGIN: &str = include_str!("../console/login.html");

/// Every answer of the listener (the API's JSON too) carries the console's headers: a
/// browser that is shown an API answer runs nothing, frames nothing, sniffs nothing.
pub async fn harden(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        header::STRICT_TRANSPORT_SECURITY,
        HeaderValue::from_static("max-age=31536000"),
    );
    r
}

fn html(body: String) -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
}

/// `GET /`: the console, for a live session; the login page's address otherwise.
pub async fn shell(Extension(st): Extension<St>, headers: HeaderMap) -> Response {
    let session = crate::auth::cookie(&headers, crate::auth::COOKIE)
        .and_then(|id| st.auth.session(&id, true).ok());
    match session {
        // The token is hex: nothing in it needs escaping.
        Some(s) => html(SHELL.replace("{{csrf}}", &s.csrf)),
        None => (
            StatusCode::SEE_OTHER,
            [
                (header::LOCATION, "/login"),
                (header::CACHE_CONTROL, "no-store"),
            ],
        )
            .into_response(),
    }
}

/// `GET /login`.
pub async fn login_page() -> Response {
    html(LOGIN.to_string())
}

/// The tag of each asset's bytes, for revalidation (worked out once, in `ASSETS`' order).
fn etags() -> &'static [String] {
    static TAGS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    TAGS.get_or_init(|| {
        ASSETS
            .iter()
            .map(|a| {
                let d = sha2::Sha256::digest(a.bytes);
                format!("\"{}\"", tank_service::api::hex_encode(&d[..12]))
            })
            .collect()
    })
}

/// `GET /console/{name}`: an embedded file, revalidated by its tag.
pub async fn asset(Path(name): Path<String>, headers: HeaderMap, body: Body) -> Response {
    drop(body);
    let Some(i) = ASSETS.iter().position(|a| a.name == name) else {
        return (StatusCode::NOT_FOUND, "no such file\n").into_response();
    };
    let (a, tag) = (&ASSETS[i], &etags()[i]);
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == tag.as_str()));
    let mut r = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        ([(header::CONTENT_TYPE, a.mime)], a.bytes).into_response()
    };
    let h = r.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(v) = HeaderValue::from_str(tag) {
        h.insert(header::ETAG, v);
    }
    r
}

/// The console's embedded files and their sizes in bytes (for the page-weight figure).
pub fn assets() -> Vec<(&'static str, usize)> {
    let mut v: Vec<(&'static str, usize)> =
        ASSETS.iter().map(|a| (a.name, a.bytes.len())).collect();
    v.push(("index.html", SHELL.len()));
    v.push(("login.html", LOGIN.len()));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_hold_no_inline_script_or_style() {
        for page in [SHELL, LOGIN] {
            // Every script is a file of the console's; no inline handlers or styles.
            for (i, _) in page.match_indices("<script") {
                let tag = &page[i..page[i..].find('>').map_or(page.len(), |e| i + e)];
                assert!(tag.contains("src=\"/console/"), "inline script: {tag}");
            }
            for bad in [" onclick=", " onload=", " style=", "<style", "javascript:"] {
                assert!(!page.contains(bad), "{bad} in a page");
            }
        }
        assert!(SHELL.contains("{{csrf}}"));
    }

    /// The router's answers for the console's routes, without a network.
    fn get(
        st: &crate::routes::St,
        path: &str,
        cookie: Option<&str>,
    ) -> (StatusCode, HeaderMap, Vec<u8>) {
        let headers: Vec<(header::HeaderName, String)> = cookie
            .map(|c| (header::COOKIE, c.to_string()))
            .into_iter()
            .collect();
        get_with(st, path, &headers)
    }

    fn get_with(
        st: &crate::routes::St,
        path: &str,
        headers: &[(header::HeaderName, String)],
    ) -> (StatusCode, HeaderMap, Vec<u8>) {
        use tower::ServiceExt;
        let app = crate::router(st.clone());
        let mut req = axum::http::Request::get(path);
        for (k, v) in headers {
            req = req.header(k, v);
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let r = app.oneshot(req.body(Body::empty()).unwrap()).await.unwrap();
            let (parts, body) = r.into_parts();
            let bytes = axum::body::to_bytes(body, 1 << 24).await.unwrap();
            (parts.status, parts.headers, bytes.to_vec())
        })
    }

    #[test]
    fn the_shell_needs_a_session_and_every_answer_carries_the_policy() {
        let dir = tempfile::tempdir().unwrap();
        let svc = std::sync::Arc::new(tank_service::Service::new(
            dir.path(),
            tank_service::service::Mode::Command,
        ));
        let st = crate::state(svc, false);
        // No session: to the login page.
        let (status, h, _) = get(&st, "/", None);
        assert_eq!(status, StatusCode::SEE_OTHER);
        assert_eq!(h[header::LOCATION], "/login");
        let (status, _, _) = get(&st, "/", Some("tank_session=0123"));
        assert_eq!(status, StatusCode::SEE_OTHER);
        // A session: the shell, with its CSRF token and no caching.
        let (id, csrf) = st.auth.login("alice");
        let (status, h, body) = get(&st, "/", Some(&format!("tank_session={id}")));
        assert_eq!(status, StatusCode::OK);
        assert_eq!(h[header::CACHE_CONTROL], "no-store");
        let page = String::from_utf8(body).unwrap();
        assert!(page.contains(&format!("content=\"{csrf}\"")), "{page}");
        assert!(!page.contains("{{csrf}}"));
        for (path, want) in [
            ("/login", StatusCode::OK),
            ("/console/app.js", StatusCode::OK),
            ("/console/uPlot.iife.min.js", StatusCode::OK),
            ("/console/../Cargo.toml", StatusCode::NOT_FOUND),
            ("/console/nosuch.js", StatusCode::NOT_FOUND),
        ] {
            let (status, h, _) = get(&st, path, None);
            assert_eq!(status, want, "{path}");
            assert_eq!(h[header::CONTENT_SECURITY_POLICY], CSP, "{path}");
            assert_eq!(h[header::X_FRAME_OPTIONS], "DENY", "{path}");
            assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff", "{path}");
        }
        assert!(CSP.contains("frame-ancestors 'none'") && !CSP.contains("unsafe"));
        // An asset is revalidated by its tag.
        let (_, h, _) = get(&st, "/console/app.js", None);
        let tag = h[header::ETAG].to_str().unwrap().to_string();
        let (status, h, _) = get_with(&st, "/console/app.js", &[(header::IF_NONE_MATCH, tag)]);
        assert_eq!(status, StatusCode::NOT_MODIFIED);
        assert_eq!(h[header::CONTENT_SECURITY_POLICY], CSP);
    }

    #[test]
    fn scripts_never_write_html_from_data() {
        for a in ASSETS
            .iter()
            .filter(|a| a.name == "app.js" || a.name == "login.js")
        {
            let text = std::str::from_utf8(a.bytes).unwrap();
            for bad in [
                "innerHTML",
                "outerHTML",
                "insertAdjacentHTML",
                "document.write",
                "eval(",
            ] {
                assert!(!text.contains(bad), "{} uses {bad}", a.name);
            }
        }
    }
}
