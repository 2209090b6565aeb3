//! CORS: browsers' requests to a bucket, checked against the bucket's CORS rules.
//!
//! # Theory of operation
//! s3s does not answer CORS, so the endpoint's HTTP layer does, before and after it:
//! - a preflight (`OPTIONS` with `Origin` and `Access-Control-Request-Method`) is answered
//!   here: 200 with the allowed method, headers and max age from the first rule that
//!   matches the origin, the method and every requested header, else 403 (as S3 does,
//!   also where the bucket has no rules);
//! - an ordinary request that carries `Origin` goes to s3s as usual, and its response gets
//!   `Access-Control-Allow-Origin`, `-Expose-Headers` and `Vary: Origin` where a rule
//!   matches its origin and method.
//!
//! CORS only tells a browser what it may let a page read: every request is still signed
//! and authorized as any other. An origin pattern may hold one `*`; header patterns too,
//! compared without case.

use std::sync::Arc;

use http::{HeaderMap, HeaderValue, Method, StatusCode};

use crate::buckets::Buckets;
use crate::ops_bucket::{conf, CorsRule};

/// The CORS side of the endpoint.
#[derive(Clone)]
pub struct Cors {
    pub buckets: Arc<Buckets>,
    /// The domain of virtual-hosted-style requests.
    pub domain: Option<String>,
}

/// Whether `value` matches `pattern`, which may hold one `*`.
fn wildcard(pattern: &str, value: &str, nocase: bool) -> bool {
    let (p, v) = if nocase {
        (pattern.to_ascii_lowercase(), value.to_ascii_lowercase())
    } else {
        (pattern.to_string(), value.to_string())
    };
    match p.split_once('*') {
        None => p == v,
        Some((head, tail)) => {
            v.len() >= head.len() + tail.len() && v.starts_with(head) && v.ends_with(tail)
        }
    }
}

/// The first rule that allows `origin` to use `method` with `headers`.
pub fn find<'a>(
    rules: &'a [CorsRule],
    origin: &str,
    method: &str,
    headers: &[String],
) -> Option<&'a CorsRule> {
    rules.iter().find(|r| {
        r.origins.iter().any(|o| wildcard(o, origin, false))
            && r.methods.iter().any(|m| m == method)
            && headers
                .iter()
                .all(|h| r.headers.iter().any(|p| wildcard(p, h, true)))
    })
}

impl Cors {
    /// The bucket a request names: the Host's first label under the domain, or the first
    /// segment of the path.
    pub fn bucket_of(&self, headers: &HeaderMap, path: &str) -> Option<String> {
        if let (Some(d), Some(host)) = (
            &self.domain,
            headers
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok()),
        ) {
            let host = host.rsplit_once(':').map_or(host, |(h, _)| h);
            if let Some(b) = host.strip_suffix(&format!(".{d}")) {
                return Some(b.to_string());
            }
        }
        let first = path.trim_start_matches('/').split('/').next()?;
        (!first.is_empty()).then(|| first.to_string())
    }

    /// The CORS rules of `bucket` (none where it has none, or is not a bucket).
    async fn rules(&self, bucket: &str) -> Vec<CorsRule> {
        let Some(b) = self.buckets.get(bucket) else {
            return Vec::new();
        };
        let Some(fs) = b.fs() else {
            return Vec::new();
        };
        tokio::task::spawn_blocking(move || conf::<Vec<CorsRule>>(&fs, "cors"))
            .await
            .ok()
            .and_then(Result::ok)
            .flatten()
            .unwrap_or_default()
    }

    /// Answers a preflight request.
    pub async fn preflight(&self, headers: &HeaderMap, path: &str) -> http::Response<s3s::Body> {
        let get = |n: &str| {
            headers
                .get(n)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let refuse = |why: &str| {
            crate::error_response(
                StatusCode::FORBIDDEN,
                "AccessForbidden",
                &format!("CORSResponse: {why}"),
            )
        };
        let (Some(origin), Some(method)) = (get("origin"), get("access-control-request-method"))
        else {
            return refuse("a preflight request needs Origin and Access-Control-Request-Method");
        };
        let Some(bucket) = self.bucket_of(headers, path) else {
            return refuse("This CORS request is not allowed.");
        };
        let asked: Vec<String> = get("access-control-request-headers")
            .unwrap_or_default()
            .split(',')
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .collect();
        let rules = self.rules(&bucket).await;
        if rules.is_empty() {
            return refuse("CORS is not enabled for this bucket.");
        }
        let Some(rule) = find(&rules, &origin, &method, &asked) else {
            return refuse("This CORS request is not allowed. This is usually because the evalution of Origin, request method / Access-Control-Request-Method or Access-Control-Request-Headers are not whitelisted by the resource's CORS spec.");
        };
        let mut r = http::Response::new(s3s::Body::empty());
        let h = r.headers_mut();
        let mut set = |n: &'static str, v: String| {
            if let Ok(v) = HeaderValue::from_str(&v) {
                h.insert(n, v);
            }
        };
        let any = rule.origins.iter().any(|o| o == "*");
        set(
            "access-control-allow-origin",
            if any { "*".to_string() } else { origin },
        );
        set("access-control-allow-methods", rule.methods.join(", "));
        if !asked.is_empty() {
            set("access-control-allow-headers", asked.join(", "));
        }
        if !rule.expose.is_empty() {
            set("access-control-expose-headers", rule.expose.join(", "));
        }
        if let Some(a) = rule.max_age {
            set("access-control-max-age", a.to_string());
        }
        set(
            "vary",
            "Origin, Access-Control-Request-Headers, Access-Control-Request-Method".into(),
        );
        r
    }

    /// Adds the allow headers to the response of an ordinary request from `origin`.
    pub async fn decorate(
        &self,
        bucket: &str,
        origin: &str,
        method: &Method,
        resp: &mut http::Response<s3s::Body>,
    ) {
        let rules = self.rules(bucket).await;
        let Some(rule) = find(&rules, origin, method.as_str(), &[]) else {
            return;
        };
        let h = resp.headers_mut();
        let any = rule.origins.iter().any(|o| o == "*");
        if let Ok(v) = HeaderValue::from_str(if any { "*" } else { origin }) {
            h.insert("access-control-allow-origin", v);
        }
        if !rule.expose.is_empty() {
            if let Ok(v) = HeaderValue::from_str(&rule.expose.join(", ")) {
                h.insert("access-control-expose-headers", v);
            }
        }
        h.insert("vary", HeaderValue::from_static("Origin"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_match_origins_methods_and_headers() {
        let rules = vec![
            CorsRule {
                origins: vec!["https://*.example.org".into()],
                methods: vec!["GET".into(), "PUT".into()],
                headers: vec!["x-amz-*".into(), "Content-Type".into()],
                ..CorsRule::default()
            },
            CorsRule {
                origins: vec!["*".into()],
                methods: vec!["GET".into()],
                ..CorsRule::default()
            },
        ];
        let h = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let first = Some(&rules[0]);
        assert_eq!(
            find(
                &rules,
                "https://app.example.org",
                "PUT",
                &h(&["X-Amz-Date", "content-type"])
            ),
            first
        );
        assert_eq!(
            find(
                &rules,
                "https://app.example.org",
                "PUT",
                &h(&["authorization"])
            ),
            None
        );
        assert_eq!(find(&rules, "http://app.example.org", "PUT", &[]), None);
        assert_eq!(
            find(&rules, "http://elsewhere", "GET", &[]),
            Some(&rules[1])
        );
        assert_eq!(find(&rules, "http://elsewhere", "DELETE", &[]), None);
        assert!(!wildcard(
            "https://*.example.org",
            "https://.example.or",
            false
        ));
    }
}
