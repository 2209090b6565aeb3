//! Who is calling the API: sessions from a password login, bearer tokens, and the limit on
//! failed logins.
//!
//! # Theory of operation
//! `POST /api/v1/login` checks a password (argon2id, on a blocking thread) and makes a
//! session: a random 256-bit id sent as an `HttpOnly; Secure; SameSite=Strict` cookie,
//! and a CSRF token in the response body. A request with the cookie that changes something
//! (any method but GET and HEAD) must echo that token in `X-CSRF-Token`, so a page of
//! another origin cannot act in the user's name even where a browser would send the
//! cookie. Sessions end after 30 minutes idle or 12 hours, at logout, or when the account
//! is removed; an expired one is refused with a clear message. Programs use API tokens
//! instead (`Authorization: Bearer tank_...`), checked against the account store on every
//! request, so a revoked token stops working at once.
//!
//! Failed logins are logged (account and address) and limited: after 5 failures within 5
//! minutes from one address, or for one account, logins from it or to it are refused with
//! 429 and a Retry-After until the window has passed. The tables are bounded.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rand::RngCore;
use tank_service::{Caller, Service, ServiceError};

/// Idle time after which a session ends.
pub const SESSION_IDLE: Duration = Duration::from_secs(30 * 60);
/// Longest life of a session.
pub const SESSION_MAX: Duration = Duration::from_secs(12 * 3600);
/// Failed logins allowed per window, per address and per account.
pub const MAX_FAILURES: usize = 5;
pub const FAILURE_WINDOW: Duration = Duration::from_secs(5 * 60);
/// Most sessions and failure records kept (the oldest go first).
const MAX_ENTRIES: usize = 10_000;

pub const COOKIE: &str = "tank_session";
/// A request a page makes on its own (a refresh), not on a person's action.
pub const BACKGROUND: &str = "x-tank-background";

#[derive(Clone)]
pub struct Session {
    pub user: String,
    pub csrf: String,
    created: Instant,
    last: Instant,
}

impl std::fmt::Debug for Session {
    /// The user only: the CSRF token is a secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("user", &self.user).finish()
    }
}

fn random_hex(bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    rand::rngs::OsRng.fill_bytes(&mut b);
    tank_service::api::hex_encode(&b)
}

pub struct Auth {
    sessions: Mutex<HashMap<String, Session>>,
    failures: Mutex<HashMap<String, Vec<Instant>>>,
    idle: Duration,
    max: Duration,
}

impl Default for Auth {
    fn default() -> Self {
        Self::with_limits(SESSION_IDLE, SESSION_MAX)
    }
}

impl Auth {
    /// Sessions that end after `idle` without use, or `max` after login.
    pub fn with_limits(idle: Duration, max: Duration) -> Self {
        Auth {
            sessions: Mutex::default(),
            failures: Mutex::default(),
            idle,
            max,
        }
    }

    /// Makes a session for `user`; returns (id, csrf token).
    pub fn login(&self, user: &str) -> (String, String) {
        let id = random_hex(32);
        let csrf = random_hex(32);
        let now = Instant::now();
        let mut s = self.sessions.lock();
        if s.len() >= MAX_ENTRIES {
            let oldest = s.iter().min_by_key(|(_, v)| v.last).map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                s.remove(&k);
            }
        }
        s.insert(
            id.clone(),
            Session {
                user: user.to_string(),
                csrf: csrf.clone(),
                created: now,
                last: now,
            },
        );
        (id, csrf)
    }

    pub fn logout(&self, id: &str) -> bool {
        self.sessions.lock().remove(id).is_some()
    }

    /// The live session `id`, refreshed if `touch` (a person's request, not a page's
    /// own refresh); an expired one is removed and refused.
    pub fn session(&self, id: &str, touch: bool) -> Result<Session, ServiceError> {
        let mut s = self.sessions.lock();
        let now = Instant::now();
        match s.get_mut(id) {
            Some(v)
                if now.duration_since(v.last) < self.idle
                    && now.duration_since(v.created) < self.max =>
            {
                if touch {
                    v.last = now;
                }
                Ok(v.clone())
            }
            Some(_) => {
                s.remove(id);
                Err(ServiceError::Unauthenticated(
                    "the session has expired; log in again".into(),
                ))
            }
            None => Err(ServiceError::Unauthenticated(
                "no such session (logged out, expired, or the server restarted); log in again"
                    .into(),
            )),
        }
    }

    /// Whether logins from `ip` or to `user` are refused now; the seconds to wait if so.
    pub fn limited(&self, ip: IpAddr, user: &str) -> Option<u64> {
        let now = Instant::now();
        let f = self.failures.lock();
        [format!("ip {ip}"), format!("user {user}")]
            .iter()
            .filter_map(|k| f.get(k))
            .filter_map(|times| {
                let recent: Vec<&Instant> = times
                    .iter()
                    .filter(|t| now.duration_since(**t) < FAILURE_WINDOW)
                    .collect();
                if recent.len() >= MAX_FAILURES {
                    let oldest = recent.iter().min()?;
                    Some(
                        FAILURE_WINDOW
                            .saturating_sub(now.duration_since(**oldest))
                            .as_secs()
                            + 1,
                    )
                } else {
                    None
                }
            })
            .max()
    }

    pub fn failed(&self, ip: IpAddr, user: &str) {
        let now = Instant::now();
        let mut f = self.failures.lock();
        if f.len() >= MAX_ENTRIES {
            f.retain(|_, v| v.iter().any(|t| now.duration_since(*t) < FAILURE_WINDOW));
            if f.len() >= MAX_ENTRIES {
                f.clear();
            }
        }
        for k in [format!("ip {ip}"), format!("user {user}")] {
            let v = f.entry(k).or_default();
            v.retain(|t| now.duration_since(*t) < FAILURE_WINDOW);
            v.push(now);
        }
    }

    /// The caller of a request, from its headers: a bearer token, else a session cookie
    /// (with the CSRF check for changes), else nobody known.
    pub fn caller(
        &self,
        svc: &Service,
        headers: &axum::http::HeaderMap,
        changes: bool,
    ) -> Result<Caller, ServiceError> {
        if let Some(v) = headers.get(axum::http::header::AUTHORIZATION) {
            let v = v.to_str().unwrap_or("");
            let Some(token) = v.strip_prefix("Bearer ") else {
                return Err(ServiceError::Unauthenticated(
                    "the Authorization header takes 'Bearer TOKEN'".into(),
                ));
            };
            let user = svc.accounts()?.check_token(token.trim())?;
            return Ok(caller_of(user));
        }
        if let Some(id) = cookie(headers, COOKIE) {
            // The console's own refreshes do not keep an idle session alive.
            let touch = !headers.contains_key(BACKGROUND);
            let s = self.session(&id, touch)?;
            if changes {
                let sent = headers
                    .get("x-csrf-token")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                if !constant_time_eq(sent.as_bytes(), s.csrf.as_bytes()) {
                    return Err(ServiceError::Denied(
                        "a change made with the session cookie needs its X-CSRF-Token header"
                            .into(),
                    ));
                }
            }
            let user = svc.accounts()?.user(&s.user).map_err(|_| {
                self.logout(&id);
                ServiceError::Unauthenticated("the session's account no longer exists".into())
            })?;
            return Ok(caller_of(user));
        }
        Ok(Caller::Anonymous)
    }
}

pub fn caller_of(user: tank_service::User) -> Caller {
    if user.admin {
        Caller::Admin { name: user.name }
    } else {
        Caller::User {
            name: user.name,
            uid: user.uid,
        }
    }
}

/// The value of cookie `name`.
pub fn cookie(headers: &axum::http::HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|kv| {
            let (k, v) = kv.trim().split_once('=')?;
            (k == name).then(|| v.to_string())
        })
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_logins_are_limited_per_address_and_account() {
        let a = Auth::default();
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let other: IpAddr = "127.0.0.2".parse().unwrap();
        for _ in 0..MAX_FAILURES - 1 {
            a.failed(ip, "alice");
        }
        assert!(a.limited(ip, "alice").is_none());
        a.failed(ip, "alice");
        let wait = a.limited(ip, "alice").unwrap();
        assert!(wait > 0 && wait <= FAILURE_WINDOW.as_secs() + 1);
        // The address is limited for every account, the account from every address.
        assert!(a.limited(ip, "bob").is_some());
        assert!(a.limited(other, "alice").is_some());
        assert!(a.limited(other, "bob").is_none());
    }

    #[test]
    fn sessions_expire_idle_and_at_their_longest() {
        let a = Auth::with_limits(Duration::from_millis(200), Duration::from_millis(500));
        let (id, _) = a.login("alice");
        // Used within the idle time, it lives on, but not past its longest life.
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(100));
            assert!(a.session(&id, true).is_ok());
        }
        std::thread::sleep(Duration::from_millis(250));
        let e = a.session(&id, true).unwrap_err();
        assert!(e.to_string().contains("expired"), "{e}");
        // And then it is gone.
        assert!(a
            .session(&id, true)
            .unwrap_err()
            .to_string()
            .contains("no such session"));
        let (id, _) = a.login("alice");
        std::thread::sleep(Duration::from_millis(250));
        assert!(a
            .session(&id, true)
            .unwrap_err()
            .to_string()
            .contains("expired"));
    }

    #[test]
    fn a_pages_own_refreshes_do_not_keep_a_session_alive() {
        let a = Auth::with_limits(Duration::from_millis(300), Duration::from_secs(60));
        let (id, _) = a.login("alice");
        std::thread::sleep(Duration::from_millis(150));
        // A refresh is answered, but does not count as use.
        assert!(a.session(&id, false).is_ok());
        std::thread::sleep(Duration::from_millis(200));
        let e = a.session(&id, false).unwrap_err();
        assert!(e.to_string().contains("expired"), "{e}");
        // A person's request does count.
        let (id, _) = a.login("alice");
        std::thread::sleep(Duration::from_millis(150));
        assert!(a.session(&id, true).is_ok());
        std::thread::sleep(Duration::from_millis(200));
        assert!(a.session(&id, false).is_ok());
    }

    #[test]
    fn sessions_end_at_logout() {
        let a = Auth::default();
        let (id, csrf) = a.login("alice");
        assert_eq!(a.session(&id, true).unwrap().csrf, csrf);
        assert!(a.logout(&id));
        assert!(matches!(
            a.session(&id, true),
            Err(ServiceError::Unauthenticated(_))
        ));
        assert!(constant_time_eq(b"abc", b"abc") && !constant_time_eq(b"abc", b"abd"));
    }
}
