//! Text keys (RFC 7143 section 6 and 13): `key=value` pairs separated by NUL, the
//! negotiation of the operational parameters, and CHAP (RFC 1994 as iSCSI uses it).
//!
//! # Theory of operation
//! [`parse`] splits a login or text request's data into pairs, refusing malformed ones and
//! bounding their number and size. [`Params`] holds what one connection and its session
//! use; [`Params::negotiate`] answers one offered key by the rule RFC 7143 gives it (list:
//! our first match in the initiator's order; numeric min or max; boolean OR or AND;
//! declarative) and records the result. Unknown keys are answered `NotUnderstood`, as the
//! RFC asks. CHAP values are hex (`0x`) or base64 (`0b`) and both are accepted.

use md5::{Digest, Md5};

/// Largest text a login or text request may carry in all (its continued PDUs summed).
pub const MAX_TEXT: usize = 64 * 1024;
const MAX_KEYS: usize = 256;

/// Splits `key=value\0...` into pairs.
pub fn parse(data: &[u8]) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for item in data.split(|b| *b == 0) {
        if item.is_empty() {
            continue;
        }
        let s = std::str::from_utf8(item).map_err(|_| "a key is not UTF-8".to_string())?;
        let (k, v) = s
            .split_once('=')
            .ok_or_else(|| format!("'{s}' is not key=value"))?;
        if k.is_empty() || k.len() > 63 || v.len() > 8192 {
            return Err(format!("bad key '{k}'"));
        }
        out.push((k.to_string(), v.to_string()));
        if out.len() > MAX_KEYS {
            return Err("too many keys".into());
        }
    }
    Ok(out)
}

/// Encodes pairs as text data.
pub fn encode(pairs: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(b'=');
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

/// What the target offers or accepts at most.
pub const OUR_MAX_RECV_DATA: u32 = 256 * 1024;
pub const OUR_MAX_BURST: u32 = 16 * 1024 * 1024 - 512;
pub const OUR_FIRST_BURST: u32 = 1024 * 1024;
pub const OUR_MAX_OUTSTANDING_R2T: u32 = 16;

/// The negotiated parameters of a session and its connection.
#[derive(Debug, Clone)]
pub struct Params {
    pub header_digest: bool,
    pub data_digest: bool,
    /// What the initiator receives at most in one PDU (limits our sends).
    pub peer_max_recv_data: u32,
    pub max_burst: u32,
    pub first_burst: u32,
    pub immediate_data: bool,
    pub initial_r2t: bool,
    pub max_outstanding_r2t: u32,
    pub data_pdu_in_order: bool,
    pub data_sequence_in_order: bool,
    pub default_time2wait: u32,
    pub default_time2retain: u32,
    pub initiator_name: String,
    pub initiator_alias: String,
    pub target_name: String,
    pub discovery: bool,
}

impl Default for Params {
    /// RFC 7143's defaults, before any negotiation.
    fn default() -> Params {
        Params {
            header_digest: false,
            data_digest: false,
            peer_max_recv_data: 8192,
            max_burst: 262_144,
            first_burst: 65_536,
            immediate_data: true,
            initial_r2t: true,
            max_outstanding_r2t: 1,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            default_time2wait: 2,
            default_time2retain: 20,
            initiator_name: String::new(),
            initiator_alias: String::new(),
            target_name: String::new(),
            discovery: false,
        }
    }
}

fn yes_no(v: &str) -> Option<bool> {
    match v {
        "Yes" => Some(true),
        "No" => Some(false),
        _ => None,
    }
}

fn yn(b: bool) -> String {
    if b { "Yes" } else { "No" }.to_string()
}

fn number(v: &str, lo: u32, hi: u32) -> Option<u32> {
    let n: u64 = if let Some(h) = v.strip_prefix("0x") {
        u64::from_str_radix(h, 16).ok()?
    } else {
        v.parse().ok()?
    };
    (u64::from(lo)..=u64::from(hi))
        .contains(&n)
        .then_some(n as u32)
}

/// How an offered key was taken.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    /// Answer with this value.
    Reply(String),
    /// Declarative, or a result both sides compute alike: nothing to answer.
    Nothing,
    /// A value out of its range or of the wrong form (login fails: initiator error).
    Reject(String),
}

impl Params {
    /// Takes one offered operational or declarative key (login, or a text request in full
    /// feature phase for the few keys allowed there).
    pub fn negotiate(&mut self, key: &str, value: &str) -> Answer {
        use Answer::*;
        let bad = || Reject(format!("invalid value '{value}' for {key}"));
        match key {
            "HeaderDigest" | "DataDigest" => {
                let mut pick = None;
                for v in value.split(',') {
                    if v == "None" || v == "CRC32C" {
                        pick = Some(v);
                        break;
                    }
                }
                let Some(p) = pick else {
                    return Reply("Reject".into());
                };
                if key == "HeaderDigest" {
                    self.header_digest = p == "CRC32C";
                } else {
                    self.data_digest = p == "CRC32C";
                }
                Reply(p.into())
            }
            "MaxRecvDataSegmentLength" => match number(value, 512, 16_777_215) {
                Some(n) => {
                    self.peer_max_recv_data = n;
                    Nothing
                }
                None => bad(),
            },
            "MaxBurstLength" => match number(value, 512, 16_777_215) {
                Some(n) => {
                    self.max_burst = n.min(OUR_MAX_BURST);
                    self.first_burst = self.first_burst.min(self.max_burst);
                    Reply(self.max_burst.to_string())
                }
                None => bad(),
            },
            "FirstBurstLength" => match number(value, 512, 16_777_215) {
                Some(n) => {
                    self.first_burst = n.min(OUR_FIRST_BURST).min(self.max_burst);
                    Reply(self.first_burst.to_string())
                }
                None => bad(),
            },
            "MaxOutstandingR2T" => match number(value, 1, 65535) {
                Some(n) => {
                    self.max_outstanding_r2t = n.min(OUR_MAX_OUTSTANDING_R2T);
                    Reply(self.max_outstanding_r2t.to_string())
                }
                None => bad(),
            },
            "DefaultTime2Wait" => match number(value, 0, 3600) {
                Some(n) => {
                    self.default_time2wait = n.max(2);
                    Reply(self.default_time2wait.to_string())
                }
                None => bad(),
            },
            "DefaultTime2Retain" => match number(value, 0, 3600) {
                // Error recovery level 0: nothing is retained after a connection is lost.
                Some(_) => {
                    self.default_time2retain = 0;
                    Reply("0".into())
                }
                None => bad(),
            },
            "ImmediateData" => match yes_no(value) {
                Some(b) => {
                    self.immediate_data = b;
                    Reply(yn(b))
                }
                None => bad(),
            },
            "InitialR2T" => match yes_no(value) {
                // OR: we take unsolicited data whenever the initiator wants to send it.
                Some(b) => {
                    self.initial_r2t = b;
                    Reply(yn(b))
                }
                None => bad(),
            },
            "DataPDUInOrder" | "DataSequenceInOrder" => match yes_no(value) {
                // OR, and we want Yes: data arrives in order.
                Some(_) => Reply("Yes".into()),
                None => bad(),
            },
            "ErrorRecoveryLevel" => match number(value, 0, 2) {
                Some(_) => Reply("0".into()),
                None => bad(),
            },
            "MaxConnections" => match number(value, 1, 65535) {
                Some(_) => Reply("1".into()),
                None => bad(),
            },
            "IFMarker" | "OFMarker" => Reply("No".into()),
            "IFMarkInt" | "OFMarkInt" => Reply("Irrelevant".into()),
            "InitiatorName" => {
                self.initiator_name = value.to_string();
                Nothing
            }
            "InitiatorAlias" => {
                self.initiator_alias = value.to_string();
                Nothing
            }
            "TargetName" => {
                self.target_name = value.to_string();
                Nothing
            }
            "SessionType" => match value {
                "Discovery" => {
                    self.discovery = true;
                    Nothing
                }
                "Normal" => {
                    self.discovery = false;
                    Nothing
                }
                _ => bad(),
            },
            _ => Reply("NotUnderstood".into()),
        }
    }
}

/// A CHAP value: `0x` hex or `0b` base64 (RFC 7143 13.1).
pub fn chap_decode(v: &str) -> Option<Vec<u8>> {
    use base64::Engine;
    if let Some(h) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        hex::decode(h).ok()
    } else if let Some(b) = v.strip_prefix("0b").or_else(|| v.strip_prefix("0B")) {
        base64::engine::general_purpose::STANDARD.decode(b).ok()
    } else {
        None
    }
}

pub fn chap_encode(b: &[u8]) -> String {
    format!("0x{}", hex::encode(b))
}

/// CHAP's response: MD5 of the identifier, the secret and the challenge.
pub fn chap_response(id: u8, secret: &[u8], challenge: &[u8]) -> [u8; 16] {
    let mut h = Md5::new();
    h.update([id]);
    h.update(secret);
    h.update(challenge);
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_parse_and_malformed_ones_are_refused() {
        let kv = parse(b"InitiatorName=iqn.x\0SessionType=Normal\0\0").unwrap();
        assert_eq!(kv.len(), 2);
        assert_eq!(kv[1], ("SessionType".into(), "Normal".into()));
        assert!(parse(b"NoEquals\0").is_err());
        assert!(parse(b"=v\0").is_err());
        assert!(parse(&[0xff, b'=', b'1', 0]).is_err());
        assert_eq!(
            parse(&encode(&[("A".into(), "b=c".into())])).unwrap(),
            vec![("A".into(), "b=c".into())]
        );
    }

    #[test]
    fn each_key_follows_its_rule() {
        let mut p = Params::default();
        assert_eq!(
            p.negotiate("HeaderDigest", "CRC32C,None"),
            Answer::Reply("CRC32C".into())
        );
        assert!(p.header_digest);
        assert_eq!(
            p.negotiate("DataDigest", "None"),
            Answer::Reply("None".into())
        );
        assert_eq!(
            p.negotiate("MaxBurstLength", "16776192"),
            Answer::Reply("16776192".into())
        );
        assert_eq!(
            p.negotiate("FirstBurstLength", "16776192"),
            Answer::Reply(OUR_FIRST_BURST.to_string())
        );
        assert_eq!(p.negotiate("InitialR2T", "No"), Answer::Reply("No".into()));
        assert_eq!(
            p.negotiate("ImmediateData", "No"),
            Answer::Reply("No".into())
        );
        assert_eq!(
            p.negotiate("ErrorRecoveryLevel", "2"),
            Answer::Reply("0".into())
        );
        assert_eq!(
            p.negotiate("MaxRecvDataSegmentLength", "262144"),
            Answer::Nothing
        );
        assert_eq!(p.peer_max_recv_data, 262_144);
        assert!(matches!(
            p.negotiate("MaxRecvDataSegmentLength", "12"),
            Answer::Reject(_)
        ));
        assert_eq!(
            p.negotiate("X-com.example.Foo", "1"),
            Answer::Reply("NotUnderstood".into())
        );
    }

    #[test]
    fn chap_matches_rfc_1994() {
        // An exchange computed with the RFC's definition: MD5(id || secret || challenge).
        let r = chap_response(1, b"secretsecret", &[0xaa; 16]);
        let mut h = Md5::new();
        h.update([1u8]);
        h.update(b"secretsecret");
        h.update([0xaa; 16]);
        assert_eq!(r.as_slice(), h.finalize().as_slice());
        assert_eq!(chap_decode("0x0aff").unwrap(), vec![0x0a, 0xff]);
        assert_eq!(chap_decode("0bCv8=").unwrap(), vec![0x0a, 0xff]);
        assert!(chap_decode("0aff").is_none());
        assert_eq!(chap_encode(&[1, 2]), "0x0102");
    }
}
