//! The login phase (RFC 7143 section 6.3): security negotiation with CHAP or none, then
//! operational negotiation, to full feature phase or a discovery session.
//!
//! # Theory of operation
//! [`login`] answers Login Requests one by one until the initiator and the target agree to
//! go to full feature phase, or one of them fails the login with a status class and
//! detail. Keys continued over several PDUs (the C bit) are gathered first, bounded by
//! `MAX_TEXT`. The stages:
//! - security (CSG 0): `AuthMethod` is chosen among the initiator's offer: CHAP when the
//!   target's LUNs ask for it, else None. CHAP (algorithm 5, MD5) runs over three exchanges
//!   with a 16-byte random challenge; the response is checked against the account's CHAP
//!   secret in constant time. Mutual CHAP answers the initiator's challenge with the
//!   `mutual_chap_user`'s secret and refuses a challenge equal to our own (a reflection).
//! - operational (CSG 1): every key is negotiated by its rule (`text.rs`).
//!
//! A normal session must name a target the initiator may log in to; a discovery session
//! names none. Going to full feature phase without authentication when the target asks for
//! it is refused (authentication failure), as is skipping straight past security.

use rand::RngCore;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::pdu::{self, Digests, Pdu};
use crate::target::{Policy, Target, Targets};
use crate::text::{self, Answer, Params};

/// Login status classes and details (RFC 7143 11.13.5).
pub const AUTH_FAILED: u16 = 0x0201;
pub const FORBIDDEN: u16 = 0x0202;
pub const NOT_FOUND: u16 = 0x0203;
pub const UNSUPPORTED_VERSION: u16 = 0x0205;
pub const MISSING_PARAMETER: u16 = 0x0207;
pub const SESSION_NOT_FOUND: u16 = 0x020a;
pub const INITIATOR_ERROR: u16 = 0x0200;
pub const TARGET_ERROR: u16 = 0x0300;

/// Most Login Requests one login may take.
const MAX_LOGIN_PDUS: usize = 64;

/// A finished login.
pub struct LoggedIn {
    pub params: Params,
    pub isid: [u8; 6],
    pub tsih: u16,
    pub cid: u16,
    /// The CmdSN the initiator will use next, and the StatSN we will.
    pub cmd_sn: u32,
    pub stat_sn: u32,
    pub chap_user: Option<String>,
    pub target: Option<std::sync::Arc<parking_lot::RwLock<Target>>>,
}

/// A failed login: the status to answer with (none: just close) and why, for the log.
pub struct Failed {
    pub status: Option<u16>,
    pub why: String,
}

fn fail(status: u16, why: impl Into<String>) -> Failed {
    Failed {
        status: Some(status),
        why: why.into(),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Chap {
    /// Not started.
    None,
    /// We sent CHAP_A: waiting for CHAP_A.
    WantAlgorithm,
    /// We sent our challenge (identifier, bytes): waiting for CHAP_N and CHAP_R.
    Challenged(u8, [u8; 16]),
    Done,
}

struct State<'a> {
    targets: &'a Targets,
    params: Params,
    policy: Option<Policy>,
    target: Option<std::sync::Arc<parking_lot::RwLock<Target>>>,
    auth: Option<&'static str>,
    chap: Chap,
    chap_user: Option<String>,
    authenticated: bool,
    /// Keys we offer ourselves once (at the first operational response).
    declared: bool,
}

/// Runs the login phase on a new connection. `first` is the connection's first PDU (already
/// read). `new_tsih` gives the session handle for a new session.
pub async fn login<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    rd: &mut R,
    wr: &mut W,
    first: Pdu,
    targets: &Targets,
    new_tsih: impl Fn() -> u16,
) -> Result<LoggedIn, Failed> {
    let mut st = State {
        targets,
        params: Params::default(),
        policy: None,
        target: None,
        auth: None,
        chap: Chap::None,
        chap_user: None,
        authenticated: false,
        declared: false,
    };
    let mut req = first;
    let isid: [u8; 6] = req.bhs[8..14].try_into().expect("6 bytes");
    let tsih = req.u16_at(14);
    let cid = req.u16_at(20);
    let mut stat_sn = req.u32_at(28);
    let cmd_sn = req.u32_at(24);
    let mut text_in: Vec<u8> = Vec::new();
    for _ in 0..MAX_LOGIN_PDUS {
        if req.opcode() != pdu::OP_LOGIN_REQ {
            return Err(Failed {
                status: None,
                why: format!("a PDU of opcode {:#04x} during login", req.opcode()),
            });
        }
        if req.bhs[3] > 0 || req.bhs[2] < req.bhs[3] {
            // Version-min above 0: we speak version 0 only.
            let e = fail(UNSUPPORTED_VERSION, "unsupported iSCSI version");
            respond_fail(wr, &req, &e, stat_sn).await;
            return Err(e);
        }
        let transit = req.flags() & 0x80 != 0;
        let cont = req.flags() & 0x40 != 0;
        let csg = (req.flags() >> 2) & 3;
        let nsg = req.flags() & 3;
        text_in.extend_from_slice(&req.data);
        if text_in.len() > text::MAX_TEXT {
            let e = fail(INITIATOR_ERROR, "login text too long");
            respond_fail(wr, &req, &e, stat_sn).await;
            return Err(e);
        }
        let mut out: Vec<(String, String)> = Vec::new();
        if cont {
            // More keys to come: acknowledge with an empty response.
            let resp = response(&req, false, csg, nsg, stat_sn, Vec::new());
            send(wr, &resp).await?;
            req = next(rd).await?;
            continue;
        }
        let keys = match text::parse(&text_in) {
            Ok(k) => k,
            Err(e) => {
                let e = fail(INITIATOR_ERROR, format!("malformed login keys: {e}"));
                respond_fail(wr, &req, &e, stat_sn).await;
                return Err(e);
            }
        };
        text_in.clear();
        let step = match csg {
            0 => st.security(&keys, transit, &mut out),
            1 => st.operational(&keys, &mut out),
            _ => Err(fail(INITIATOR_ERROR, "login in an invalid stage")),
        };
        if let Err(e) = step {
            respond_fail(wr, &req, &e, stat_sn).await;
            return Err(e);
        }
        if tsih != 0 {
            // Adding a connection to a session: one connection per session here.
            let e = fail(
                SESSION_NOT_FOUND,
                "a connection for an existing session (MaxConnections is 1)",
            );
            respond_fail(wr, &req, &e, stat_sn).await;
            return Err(e);
        }
        // Can we go where the initiator wants?
        let mut go = transit;
        if go && csg == 0 && !st.authenticated {
            go = false;
        }
        if go && nsg == 3 && csg == 0 && !st.declared {
            // Skipping operational negotiation: fine, with the defaults; our declarations
            // go with this response.
            st.declare(&mut out);
        }
        if go && nsg == 3 && st.params.target_name.is_empty() && !st.params.discovery {
            let e = fail(MISSING_PARAMETER, "no TargetName");
            respond_fail(wr, &req, &e, stat_sn).await;
            return Err(e);
        }
        let final_stage = go && nsg == 3;
        let tsih_out = if final_stage { new_tsih() } else { 0 };
        let mut resp = response(&req, go, csg, nsg, stat_sn, text::encode(&out));
        resp.set_u16(14, tsih_out);
        send(wr, &resp).await?;
        stat_sn = stat_sn.wrapping_add(1);
        if final_stage {
            return Ok(LoggedIn {
                params: st.params,
                isid,
                tsih: tsih_out,
                cid,
                cmd_sn,
                stat_sn,
                chap_user: st.chap_user,
                target: st.target,
            });
        }
        req = next(rd).await?;
    }
    Err(Failed {
        status: None,
        why: "too many login requests".into(),
    })
}

async fn next<R: AsyncRead + Unpin>(rd: &mut R) -> Result<Pdu, Failed> {
    pdu::read_pdu(rd, Digests::default(), text::MAX_TEXT)
        .await
        .map_err(|e| Failed {
            status: None,
            why: format!("login: {e}"),
        })
}

async fn send<W: AsyncWrite + Unpin>(wr: &mut W, p: &Pdu) -> Result<(), Failed> {
    pdu::write_pdu(wr, p, Digests::default())
        .await
        .map_err(|e| Failed {
            status: None,
            why: format!("login: {e}"),
        })
}

fn response(req: &Pdu, transit: bool, csg: u8, nsg: u8, stat_sn: u32, data: Vec<u8>) -> Pdu {
    let mut p = Pdu::new(pdu::OP_LOGIN_RESP);
    p.bhs[1] = (if transit { 0x80 } else { 0 }) | (csg << 2) | if transit { nsg } else { 0 };
    p.bhs[2] = 0;
    p.bhs[3] = 0;
    p.bhs[8..14].copy_from_slice(&req.bhs[8..14]);
    p.set_itt(req.itt());
    let cmd_sn = req.u32_at(24);
    p.set_sns(stat_sn, cmd_sn, cmd_sn);
    p.data = data;
    p
}

async fn respond_fail<W: AsyncWrite + Unpin>(wr: &mut W, req: &Pdu, e: &Failed, stat_sn: u32) {
    if let Some(status) = e.status {
        let mut p = response(req, false, 0, 0, stat_sn, Vec::new());
        p.bhs[1] = 0;
        p.bhs[36] = (status >> 8) as u8;
        p.bhs[37] = status as u8;
        let _ = pdu::write_pdu(wr, &p, Digests::default()).await;
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl State<'_> {
    /// Takes the declarative keys any stage may carry, and finds the target.
    fn names(&mut self, keys: &[(String, String)]) -> Result<(), Failed> {
        for (k, v) in keys {
            if matches!(
                k.as_str(),
                "InitiatorName" | "InitiatorAlias" | "TargetName" | "SessionType"
            ) {
                if let Answer::Reject(why) = self.params.negotiate(k, v) {
                    return Err(fail(INITIATOR_ERROR, why));
                }
            }
        }
        if self.params.initiator_name.is_empty() {
            return Err(fail(MISSING_PARAMETER, "no InitiatorName"));
        }
        if self.params.discovery || self.target.is_some() {
            return Ok(());
        }
        if self.params.target_name.is_empty() {
            return Err(fail(MISSING_PARAMETER, "no TargetName"));
        }
        let Some(t) = self.targets.get(&self.params.target_name) else {
            return Err(fail(
                NOT_FOUND,
                format!("no target '{}'", self.params.target_name),
            ));
        };
        let Some(policy) = t.read().policy(&self.params.initiator_name) else {
            return Err(fail(
                FORBIDDEN,
                format!(
                    "initiator '{}' may not log in to '{}'",
                    self.params.initiator_name, self.params.target_name
                ),
            ));
        };
        self.policy = Some(policy);
        self.target = Some(t);
        Ok(())
    }

    fn security(
        &mut self,
        keys: &[(String, String)],
        transit: bool,
        out: &mut Vec<(String, String)>,
    ) -> Result<(), Failed> {
        self.names(keys)?;
        let policy = self.policy.clone();
        let mut chap_keys: Vec<(&str, &str)> = Vec::new();
        for (k, v) in keys {
            match k.as_str() {
                "InitiatorName" | "InitiatorAlias" | "TargetName" | "SessionType" => {}
                "AuthMethod" => {
                    let offered: Vec<&str> = v.split(',').collect();
                    let wants_chap = policy.as_ref().is_some_and(|p| !p.chap_users.is_empty());
                    let must_chap = policy.as_ref().is_some_and(|p| p.chap_required);
                    let pick = if wants_chap && offered.contains(&"CHAP") {
                        "CHAP"
                    } else if !must_chap && offered.contains(&"None") {
                        "None"
                    } else {
                        return Err(fail(
                            AUTH_FAILED,
                            format!("the target needs CHAP, and the initiator offered {v}"),
                        ));
                    };
                    self.auth = Some(pick);
                    out.push(("AuthMethod".into(), pick.into()));
                    if pick == "None" {
                        self.authenticated = true;
                    } else {
                        self.chap = Chap::WantAlgorithm;
                    }
                }
                k if k.starts_with("CHAP_") => chap_keys.push((k, v)),
                // Operational keys may come in the security stage too.
                _ => match self.params.negotiate(k, v) {
                    Answer::Reply(r) => out.push((k.clone(), r)),
                    Answer::Nothing => {}
                    Answer::Reject(why) => return Err(fail(INITIATOR_ERROR, why)),
                },
            }
        }
        if !self.params.discovery && !out.iter().any(|(k, _)| k == "TargetPortalGroupTag") {
            out.push(("TargetPortalGroupTag".into(), "1".into()));
        }
        if !chap_keys.is_empty() {
            self.chap_step(&chap_keys, out)?;
        }
        if self.auth.is_none() && transit {
            // Going on without choosing a method: allowed only if none is needed.
            if policy.as_ref().is_some_and(|p| p.chap_required) {
                return Err(fail(
                    AUTH_FAILED,
                    "no AuthMethod, and the target needs CHAP",
                ));
            }
            self.authenticated = true;
        }
        Ok(())
    }

    fn chap_step(
        &mut self,
        keys: &[(&str, &str)],
        out: &mut Vec<(String, String)>,
    ) -> Result<(), Failed> {
        let get = |name: &str| keys.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
        match self.chap {
            Chap::WantAlgorithm => {
                let algs = get("CHAP_A").ok_or_else(|| fail(AUTH_FAILED, "no CHAP_A"))?;
                if !algs.split(',').any(|a| a == "5") {
                    return Err(fail(
                        AUTH_FAILED,
                        format!("CHAP algorithms {algs}: only MD5 (5)"),
                    ));
                }
                let mut challenge = [0u8; 16];
                rand::thread_rng().fill_bytes(&mut challenge);
                let id = (rand::thread_rng().next_u32() & 0xff) as u8;
                out.push(("CHAP_A".into(), "5".into()));
                out.push(("CHAP_I".into(), id.to_string()));
                out.push(("CHAP_C".into(), text::chap_encode(&challenge)));
                self.chap = Chap::Challenged(id, challenge);
                Ok(())
            }
            Chap::Challenged(id, challenge) => {
                let name = get("CHAP_N").ok_or_else(|| fail(AUTH_FAILED, "no CHAP_N"))?;
                let resp = get("CHAP_R")
                    .and_then(text::chap_decode)
                    .ok_or_else(|| fail(AUTH_FAILED, "no valid CHAP_R"))?;
                let allowed = self
                    .policy
                    .as_ref()
                    .is_some_and(|p| p.chap_users.iter().any(|u| u == name))
                    || self.params.discovery && self.targets.chap_secret(name).is_some();
                let secret = self.targets.chap_secret(name);
                let ok = allowed
                    && secret.as_ref().is_some_and(|s| {
                        constant_time_eq(&text::chap_response(id, s.as_bytes(), &challenge), &resp)
                    });
                if !ok {
                    return Err(fail(AUTH_FAILED, format!("CHAP failed for '{name}'")));
                }
                self.chap_user = Some(name.to_string());
                // Mutual CHAP: the initiator challenges us in turn.
                if let (Some(i), Some(c)) = (get("CHAP_I"), get("CHAP_C")) {
                    let their_id: u8 =
                        i.parse().map_err(|_| fail(AUTH_FAILED, "invalid CHAP_I"))?;
                    let their = text::chap_decode(c)
                        .filter(|c| !c.is_empty() && c.len() <= 1024)
                        .ok_or_else(|| fail(AUTH_FAILED, "invalid CHAP_C"))?;
                    if their == challenge {
                        return Err(fail(AUTH_FAILED, "the initiator reflected our challenge"));
                    }
                    let mutual = self
                        .policy
                        .as_ref()
                        .and_then(|p| p.mutual_user.clone())
                        .ok_or_else(|| {
                            fail(
                                AUTH_FAILED,
                                "mutual CHAP asked, and the target has no mutual_chap_user",
                            )
                        })?;
                    let msecret = self.targets.chap_secret(&mutual).ok_or_else(|| {
                        fail(TARGET_ERROR, format!("user '{mutual}' has no CHAP secret"))
                    })?;
                    if Some(&msecret) == secret.as_ref() {
                        // RFC 7143 9.2.1: the two directions must not share a secret.
                        return Err(fail(
                            AUTH_FAILED,
                            "mutual CHAP with the same secret both ways",
                        ));
                    }
                    out.push(("CHAP_N".into(), mutual));
                    out.push((
                        "CHAP_R".into(),
                        text::chap_encode(&text::chap_response(
                            their_id,
                            msecret.as_bytes(),
                            &their,
                        )),
                    ));
                }
                self.chap = Chap::Done;
                self.authenticated = true;
                Ok(())
            }
            Chap::None | Chap::Done => Err(fail(AUTH_FAILED, "unexpected CHAP keys")),
        }
    }

    fn declare(&mut self, out: &mut Vec<(String, String)>) {
        if self.declared {
            return;
        }
        self.declared = true;
        out.push((
            "MaxRecvDataSegmentLength".into(),
            text::OUR_MAX_RECV_DATA.to_string(),
        ));
        if !self.params.discovery && !out.iter().any(|(k, _)| k == "TargetPortalGroupTag") {
            out.push(("TargetPortalGroupTag".into(), "1".into()));
        }
    }

    fn operational(
        &mut self,
        keys: &[(String, String)],
        out: &mut Vec<(String, String)>,
    ) -> Result<(), Failed> {
        self.names(keys)?;
        if !self.authenticated {
            // Straight to operational negotiation: only when the target asks for no CHAP.
            if self.policy.as_ref().is_some_and(|p| p.chap_required) {
                return Err(fail(
                    AUTH_FAILED,
                    "the target needs CHAP (security negotiation skipped)",
                ));
            }
            self.authenticated = true;
        }
        for (k, v) in keys {
            match k.as_str() {
                "InitiatorName" | "InitiatorAlias" | "TargetName" | "SessionType" => {}
                k if k.starts_with("CHAP_") || k == "AuthMethod" => {
                    return Err(fail(
                        INITIATOR_ERROR,
                        format!("{k} in operational negotiation"),
                    ));
                }
                _ => match self.params.negotiate(k, v) {
                    Answer::Reply(r) => out.push((k.clone(), r)),
                    Answer::Nothing => {}
                    Answer::Reject(why) => return Err(fail(INITIATOR_ERROR, why)),
                },
            }
        }
        self.declare(out);
        Ok(())
    }
}
