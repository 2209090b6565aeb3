//! Shares: which datasets and volumes are served, by which protocol, to whom.
//!
//! # Theory of operation
//! A share is a protocol (`smb`, `nfs`, `s3`, `iscsi`), a name unique among the shares of
//! every imported pool, the dataset or volume it serves, and the protocol's options, who may
//! use it among them. It is stored with the dataset (`tank_dataset::Share` in the dataset's
//! record, written by a sync task), as ZFS keeps `sharenfs` and `sharesmb`, so shares move
//! with the pool and change atomically with a txg.
//!
//! [`validate`] checks a share's options against its protocol and the kind of dataset, with
//! a clear error for each wrong key or value, and fills in defaults; [`Registry`] adds, sets
//! and removes shares across the pools it is given and tells every [`ShareWatcher`] (the
//! protocol servers, when they come) what changed, after the change is committed.
//!
//! # Options
//! | protocol | dataset | options |
//! |---|---|---|
//! | all | | `readonly` or `ro` (on/off), `comment` (text) |
//! | smb | filesystem | `users`, `groups` (accounts; empty: every account), `browseable` (on), `guest` (off), `timemachine` (off), `timemachine_quota` (a size; with timemachine), `previous_versions` (on), `snapshot_schedule` (`off`, or `15min`/`hourly`/`daily`/`weekly` with `:KEEP`) |
//! | nfs | filesystem | `clients` or `hosts` (addresses, CIDR networks or host names; default none), `squash` (`root`/`root_squash`, `none`/`no_root_squash`, `all`/`all_squash`), `anonuid`, `anongid` (65534), `sec` (`sys`) |
//! | s3 | filesystem | `users`, `groups`, `public` (`off`, `read`); the name is the bucket name |
//! | iscsi | volume | `iqn` (the target; the share's name when that is an IQN, else `iqn.2026-11.org.tank:POOL.VOLUME`), `lun` (0-255, default 0), `initiators` (the initiator IQNs allowed to log in; empty: any, as an initiator group that allows all; CHAP is what authenticates), `chap_users` or `chap_user` (accounts whose CHAP secret logs in; empty: no CHAP), `mutual_chap_user` (the account whose secret the target answers with) |
//!
//! Several iscsi shares with the same target IQN and different `lun`s are one target with
//! several LUNs; such a share goes by `IQN/LUN` where the IQN alone is ambiguous.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tank_dataset::{DatasetKind, Dsl, Op, Share};

use crate::accounts::Accounts;
use crate::error::ServiceError;

type Res<T> = Result<T, ServiceError>;

pub const PROTOCOLS: [&str; 4] = ["smb", "nfs", "s3", "iscsi"];

/// A share as listed: where it lives and what it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ShareInfo {
    pub protocol: String,
    pub name: String,
    pub dataset: String,
    pub options: BTreeMap<String, String>,
    /// What the protocol's server does with it now (`served`, or `not served: why`), as
    /// listed; none in a change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

impl ShareInfo {
    /// Whether the account `user` (a member of `groups`) may use the share, by the rules its
    /// protocol's server applies: an SMB share with no `users` and no `groups` is every
    /// account's, and a guest share anyone's; an S3 bucket is its `users`' and `groups'`, and
    /// a public one anyone's to read; an iSCSI target is the accounts whose CHAP secret logs
    /// in to it. An NFS export is no account's: NFS admits hosts and uids, not accounts.
    pub fn usable_by(&self, user: &str, groups: &[String]) -> bool {
        let opt = |k: &str| self.options.get(k).map_or("", String::as_str);
        let named = |k: &str| list(opt(k)).iter().any(|u| u == user);
        let in_group = list(opt("groups")).iter().any(|g| groups.contains(g));
        match self.protocol.as_str() {
            "smb" => {
                (opt("users").is_empty() && opt("groups").is_empty())
                    || opt("guest") == "on"
                    || named("users")
                    || in_group
            }
            "s3" => !matches!(opt("public"), "" | "off") || named("users") || in_group,
            "iscsi" => named("chap_users") || opt("mutual_chap_user") == user,
            _ => false,
        }
    }
}

/// What changed, for the servers of the protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShareChange {
    Added(ShareInfo),
    Changed { before: ShareInfo, after: ShareInfo },
    Removed(ShareInfo),
}

/// A protocol server (or a test double) told of every committed change to the shares.
pub trait ShareWatcher: Send + Sync {
    fn share_changed(&self, change: &ShareChange);
}

fn invalid(msg: String) -> ServiceError {
    ServiceError::Invalid(msg)
}

fn on_off(key: &str, value: &str) -> Res<String> {
    match value {
        "on" | "yes" | "true" => Ok("on".into()),
        "off" | "no" | "false" => Ok("off".into()),
        _ => Err(invalid(format!(
            "invalid value '{value}' for {key}: on or off"
        ))),
    }
}

/// The intervals of a share's `snapshot_schedule`, with the snapshots kept by default.
const SCHEDULES: [(&str, u64, usize); 4] = [
    ("15min", 15 * 60, 8),
    ("hourly", 3600, 24),
    ("daily", 86_400, 7),
    ("weekly", 7 * 86_400, 4),
];

fn schedule_name(every: u64) -> &'static str {
    SCHEDULES
        .iter()
        .find(|s| s.1 == every)
        .map_or("off", |s| s.0)
}

/// An smb share's `snapshot_schedule`: `off`, or `INTERVAL[:KEEP]` with INTERVAL `15min`,
/// `hourly`, `daily` or `weekly` and KEEP the snapshots kept (1 to 1000; by default 8, 24, 7
/// and 4): the interval in seconds (0: off) and KEEP.
pub fn parse_snapshot_schedule(value: &str) -> Result<(u64, usize), String> {
    if value == "off" {
        return Ok((0, 0));
    }
    let (name, keep) = match value.split_once(':') {
        Some((n, k)) => (n, Some(k)),
        None => (value, None),
    };
    let Some(&(_, every, default_keep)) = SCHEDULES.iter().find(|s| s.0 == name) else {
        return Err(format!(
            "invalid snapshot_schedule '{value}': off, or 15min, hourly, daily or weekly, with :KEEP for the snapshots kept (hourly:24)"
        ));
    };
    let keep = match keep {
        None => default_keep,
        Some(k) => match k.parse::<usize>() {
            Ok(n) if (1..=1000).contains(&n) => n,
            _ => {
                return Err(format!(
                    "invalid snapshot_schedule '{value}': keep 1 to 1000 snapshots"
                ))
            }
        },
    };
    Ok((every, keep))
}

fn list(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// An IPv4/IPv6 address, a CIDR network, or a host name.
fn check_host(h: &str) -> Res<()> {
    let (addr, prefix) = match h.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (h, None),
    };
    if let Ok(ip) = addr.parse::<IpAddr>() {
        let max = if ip.is_ipv4() { 32 } else { 128 };
        if let Some(p) = prefix {
            match p.parse::<u8>() {
                Ok(n) if n <= max => {}
                _ => {
                    return Err(invalid(format!(
                        "invalid network '{h}': the prefix length is 0 to {max}"
                    )))
                }
            }
        }
        return Ok(());
    }
    let name_ok = prefix.is_none()
        && !addr.is_empty()
        && addr.len() <= 253
        && addr.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !l.starts_with('-')
        });
    if !name_ok {
        return Err(invalid(format!(
            "invalid host '{h}': an IPv4 or IPv6 address, a network (10.0.0.0/24, fd00::/64) or a host name"
        )));
    }
    Ok(())
}

/// An iSCSI qualified name: `iqn.YYYY-MM.reversed.domain[:anything]`.
fn check_iqn(iqn: &str) -> Res<()> {
    let bad = || {
        invalid(format!(
            "invalid iSCSI name '{iqn}': iqn.YYYY-MM.reversed.domain[:name] (RFC 3720), lowercase"
        ))
    };
    let rest = iqn.strip_prefix("iqn.").ok_or_else(bad)?;
    let date = rest.get(..7).ok_or_else(bad)?;
    let ok_date = date.as_bytes()[4] == b'-'
        && date[..4].chars().all(|c| c.is_ascii_digit())
        && date[5..].chars().all(|c| c.is_ascii_digit());
    let domain = rest[7..].strip_prefix('.').ok_or_else(bad)?;
    let (domain, _id) = domain.split_once(':').unwrap_or((domain, ""));
    let ok_domain = !domain.is_empty()
        && domain
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-');
    if !ok_date || !ok_domain || iqn.len() > 223 || iqn.chars().any(|c| c.is_ascii_uppercase()) {
        return Err(bad());
    }
    Ok(())
}

/// A share name: for s3 a bucket name (3-63 lowercase letters, digits, '-' and '.'), for
/// iscsi the target's IQN or a short name, for the others 1-80 letters, digits, '_', '-' and
/// '.'.
fn check_name(protocol: &str, name: &str) -> Res<()> {
    if protocol == "iscsi" && name.starts_with("iqn.") {
        return check_iqn(name);
    }
    if protocol == "s3" {
        let ok = (3..=63).contains(&name.len())
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
            && name.starts_with(|c: char| c.is_ascii_alphanumeric())
            && name.ends_with(|c: char| c.is_ascii_alphanumeric())
            && !name.contains("..")
            && name.parse::<std::net::Ipv4Addr>().is_err();
        if !ok {
            return Err(invalid(format!(
                "invalid bucket name '{name}': 3 to 63 lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"
            )));
        }
        return Ok(());
    }
    let ok = !name.is_empty()
        && name.len() <= 80
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
    if !ok {
        return Err(invalid(format!(
            "invalid share name '{name}': 1 to 80 letters, digits, '_', '-' and '.'"
        )));
    }
    Ok(())
}

/// Checks and normalizes `options` of a `protocol` share named `name` of a dataset of `kind`
/// (`pool` and `dataset` for defaults); account names are checked against `accounts` when
/// given. Returns the options with every default filled in.
pub fn validate(
    protocol: &str,
    name: &str,
    dataset: &str,
    kind: DatasetKind,
    options: &BTreeMap<String, String>,
    accounts: Option<&Accounts>,
) -> Res<BTreeMap<String, String>> {
    if !PROTOCOLS.contains(&protocol) {
        return Err(invalid(format!(
            "unknown protocol '{protocol}': smb, nfs, s3 or iscsi"
        )));
    }
    check_name(protocol, name)?;
    let want = if protocol == "iscsi" {
        DatasetKind::Volume
    } else {
        DatasetKind::Filesystem
    };
    if kind != want {
        return Err(invalid(format!(
            "cannot share '{dataset}' by {protocol}: it is a {}, and {protocol} serves {}s",
            kind.name(),
            want.name()
        )));
    }
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    let defaults: &[(&str, &str)] = match protocol {
        "smb" => &[
            ("readonly", "off"),
            ("browseable", "on"),
            ("guest", "off"),
            ("timemachine", "off"),
            ("previous_versions", "on"),
        ],
        "nfs" => &[
            ("readonly", "off"),
            ("squash", "root_squash"),
            ("anonuid", "65534"),
            ("anongid", "65534"),
            ("sec", "sys"),
        ],
        "s3" => &[
            ("readonly", "off"),
            ("public", "off"),
            ("versioning", "off"),
            ("object_lock", "off"),
        ],
        _ => &[("readonly", "off"), ("lun", "0")],
    };
    for (k, v) in defaults {
        out.insert(k.to_string(), v.to_string());
    }
    if protocol == "iscsi" {
        // A share named by an IQN is that target's LUN; otherwise the target is named after
        // the volume unless `iqn` says otherwise.
        let iqn = if name.starts_with("iqn.") {
            if let Some(given) = options.get("iqn").filter(|i| *i != name) {
                return Err(invalid(format!(
                    "the share is named by the target IQN '{name}', and iqn={given} names another"
                )));
            }
            name.to_string()
        } else {
            let (pool, vol) = dataset.split_once('/').unwrap_or((dataset, ""));
            format!("iqn.2026-11.org.tank:{pool}.{}", vol.replace('/', ".")).to_lowercase()
        };
        out.insert("iqn".into(), iqn);
    }
    let check_accounts = |key: &str, value: &str| -> Res<String> {
        let names = list(value);
        if let Some(a) = accounts {
            for n in &names {
                let found = if key == "groups" {
                    a.groups()?.iter().any(|g| &g.name == n)
                } else {
                    a.user(n).is_ok()
                };
                if !found {
                    let what = if key == "groups" { "group" } else { "user" };
                    return Err(ServiceError::NotFound(format!(
                        "no such {what} '{n}' (in {key})"
                    )));
                }
            }
        }
        Ok(names.join(","))
    };
    for (k, v) in options {
        // The short forms of the command line (`ro`, nfs `hosts` for `clients`).
        let k = &match (protocol, k.as_str()) {
            (_, "ro") => "readonly".to_string(),
            ("nfs", "hosts") => "clients".to_string(),
            ("s3", "public_read") => "public".to_string(),
            ("iscsi", "chap_user") => "chap_users".to_string(),
            _ => k.clone(),
        };
        let value = match (protocol, k.as_str()) {
            (_, "readonly") => on_off(k, v)?,
            (_, "comment") => {
                if v.len() > 256 || v.chars().any(char::is_control) {
                    return Err(invalid(
                        "a comment has at most 256 printable characters".into(),
                    ));
                }
                v.clone()
            }
            ("smb" | "s3", "users" | "groups") | ("iscsi", "chap_users" | "mutual_chap_user") => {
                check_accounts(k, v)?
            }
            ("smb", "browseable" | "guest" | "timemachine" | "previous_versions") => on_off(k, v)?,
            ("smb", "snapshot_schedule") => {
                let (every, keep) = parse_snapshot_schedule(v).map_err(invalid)?;
                if every == 0 {
                    "off".to_string()
                } else {
                    format!("{}:{keep}", schedule_name(every))
                }
            }
            ("smb", "timemachine_quota") => {
                let bytes = tank_dataset::props::parse_size(v, false).map_err(invalid)?;
                bytes.to_string()
            }
            ("nfs", "clients") => {
                let hosts = list(v);
                for h in &hosts {
                    check_host(h)?;
                }
                hosts.join(",")
            }
            ("nfs", "squash") => match v.as_str() {
                "root_squash" | "root" => "root_squash".into(),
                "no_root_squash" | "none" => "no_root_squash".into(),
                "all_squash" | "all" => "all_squash".into(),
                _ => {
                    return Err(invalid(format!(
                        "invalid squash '{v}': root (root_squash), none (no_root_squash) or all (all_squash)"
                    )))
                }
            },
            ("nfs", "anonuid" | "anongid") => v
                .parse::<u32>()
                .map_err(|_| invalid(format!("invalid {k} '{v}': a number")))?
                .to_string(),
            ("nfs", "sec") => match v.as_str() {
                "sys" => v.clone(),
                _ => return Err(invalid(format!("invalid sec '{v}': only sys is served"))),
            },
            ("s3", "public") => match v.as_str() {
                "off" | "no" | "false" => "off".into(),
                "read" | "on" | "yes" | "true" => "read".into(),
                "objects" => "objects".into(),
                _ => {
                    return Err(invalid(format!(
                        "invalid public '{v}': off, read (anyone may read and list; also public_read=on) or objects (anyone may read, not list)"
                    )))
                }
            },
            ("s3", "versioning") => match v.as_str() {
                "off" | "no" | "false" => "off".into(),
                "on" | "enabled" | "yes" | "true" => "enabled".into(),
                "suspended" => "suspended".into(),
                _ => {
                    return Err(invalid(format!(
                        "invalid versioning '{v}': off, enabled (on) or suspended"
                    )))
                }
            },
            ("s3", "object_lock") => on_off(k, v)?,
            ("iscsi", "iqn") => {
                check_iqn(v)?;
                v.clone()
            }
            ("iscsi", "lun") => match v.parse::<u16>() {
                Ok(n) if n <= 255 => n.to_string(),
                _ => return Err(invalid(format!("invalid lun '{v}': 0 to 255"))),
            },
            ("iscsi", "initiators") => {
                let iqns = list(v);
                for i in &iqns {
                    check_iqn(i)?;
                }
                iqns.join(",")
            }
            _ => {
                return Err(invalid(format!(
                    "unknown {protocol} share option '{k}' (see 'tank share add --help')"
                )))
            }
        };
        out.insert(k.clone(), value);
    }
    if protocol == "s3" && out.get("object_lock").map(String::as_str) == Some("on") {
        // Object Lock keeps versions: it needs versioning on, and keeps it on.
        match options.get("versioning").map(String::as_str) {
            None => {
                out.insert("versioning".into(), "enabled".into());
            }
            Some(_) if out.get("versioning").map(String::as_str) == Some("enabled") => {}
            Some(v) => {
                return Err(invalid(format!(
                    "object_lock=on needs versioning enabled (not '{v}')"
                )))
            }
        }
    }
    if out
        .get("mutual_chap_user")
        .is_some_and(|m| !m.is_empty() && m.contains(','))
    {
        return Err(invalid(
            "mutual_chap_user names one account: the one whose CHAP secret the target proves it knows".into(),
        ));
    }
    if out.get("mutual_chap_user").is_some_and(|m| !m.is_empty())
        && out.get("chap_users").is_none_or(String::is_empty)
    {
        return Err(invalid(
            "mutual_chap_user needs chap_user: the initiator proves itself first".into(),
        ));
    }
    if out.contains_key("timemachine_quota")
        && out.get("timemachine").map(String::as_str) != Some("on")
    {
        return Err(invalid("timemachine_quota needs timemachine=on".into()));
    }
    Ok(out)
}

/// The shares of every pool given, and their changes.
#[derive(Default)]
pub struct Registry {
    watchers: Mutex<Vec<Arc<dyn ShareWatcher>>>,
    /// The protocols whose servers run in this process.
    serving: Mutex<std::collections::BTreeSet<String>>,
    /// What those servers said of each share, by protocol and share name (none said:
    /// `served`).
    states: Mutex<BTreeMap<(String, String), String>>,
}

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Tells `w` of every later change.
    pub fn watch(&self, w: Arc<dyn ShareWatcher>) {
        self.watchers.lock().push(w);
    }

    fn notify(&self, change: ShareChange) {
        for w in self.watchers.lock().iter() {
            w.share_changed(&change);
        }
    }

    /// Pool `pool` is open (again): every protocol server is told of its shares as added,
    /// and builds what it lacks (after `Handles::let_go_of_pool`, all of them).
    pub fn pool_back(&self, pools: &[Arc<Dsl>], pool: &str) {
        let prefix = format!("{pool}/");
        for s in self.list(pools) {
            if s.dataset == pool || s.dataset.starts_with(&prefix) {
                self.notify(ShareChange::Added(s));
            }
        }
    }

    /// A protocol's server runs (`on`) or stopped: its shares are listed as served (or as
    /// it says) or not.
    pub fn serving(&self, protocol: &str, on: bool) {
        if on {
            self.serving.lock().insert(protocol.to_string());
        } else {
            self.serving.lock().remove(protocol);
            self.states.lock().retain(|(p, _), _| p != protocol);
        }
    }

    /// What the `protocol` server says of its share `name` (none: served).
    pub fn set_state(&self, protocol: &str, name: &str, state: Option<String>) {
        let k = (protocol.to_string(), name.to_string());
        match state {
            Some(s) => self.states.lock().insert(k, s),
            None => self.states.lock().remove(&k),
        };
    }

    fn state_of(&self, protocol: &str, name: &str) -> String {
        if !self.serving.lock().contains(protocol) {
            return format!("not served: no {protocol} listener (tank serve --{protocol})");
        }
        self.states
            .lock()
            .get(&(protocol.to_string(), name.to_string()))
            .cloned()
            .unwrap_or_else(|| "served".to_string())
    }

    /// Every share of the pools, by name.
    pub fn list(&self, pools: &[Arc<Dsl>]) -> Vec<ShareInfo> {
        let mut out = Vec::new();
        for dsl in pools {
            for id in dsl.all_ids() {
                let Ok(rec) = dsl.record(id) else { continue };
                for s in rec.shares {
                    let state = Some(self.state_of(&s.protocol, &s.name));
                    out.push(ShareInfo {
                        protocol: s.protocol,
                        name: s.name,
                        dataset: dsl.name_of(id),
                        options: s.options,
                        state,
                    });
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// The share `name`; an iscsi target's LUN as `NAME/LUN` when the target has several.
    fn find(&self, pools: &[Arc<Dsl>], name: &str) -> Res<(ShareInfo, Arc<Dsl>)> {
        let (base, lun) = match name.rsplit_once('/') {
            Some((b, l)) if l.parse::<u16>().is_ok() => (b, Some(l)),
            _ => (name, None),
        };
        let mut found: Vec<(ShareInfo, Arc<Dsl>)> = Vec::new();
        for dsl in pools {
            for s in self.list(std::slice::from_ref(dsl)) {
                let lun_ok =
                    lun.is_none_or(|l| s.options.get("lun").map(String::as_str) == Some(l));
                if s.name == base && lun_ok {
                    // Changes carry the share, not what a server says of it.
                    found.push((ShareInfo { state: None, ..s }, dsl.clone()));
                }
            }
        }
        match found.len() {
            0 => Err(ServiceError::NotFound(format!("no such share '{name}'"))),
            1 => Ok(found.remove(0)),
            _ => {
                let forms: Vec<String> = found
                    .iter()
                    .map(|(s, _)| format!("{base}/{}", s.options.get("lun").map_or("0", |l| l)))
                    .collect();
                Err(invalid(format!(
                    "share '{name}' is a target with several LUNs: name one, as {}",
                    forms.join(" or ")
                )))
            }
        }
    }

    /// Whether the stored `s` is the share `info` (by name, and by LUN for iscsi).
    fn same(s: &Share, info: &ShareInfo) -> bool {
        s.name == info.name
            && s.protocol == info.protocol
            && s.options.get("lun") == info.options.get("lun")
    }

    fn write(dsl: &Dsl, dataset: &str, f: impl FnOnce(&mut Vec<Share>)) -> Res<()> {
        let id = dsl
            .resolve(dataset)
            .map_err(|e| ServiceError::NotFound(e.to_string()))?;
        let mut shares = dsl
            .record(id)
            .map_err(|e| ServiceError::NotFound(e.to_string()))?
            .shares;
        f(&mut shares);
        dsl.run(Op::SetShares {
            name: dataset.to_string(),
            shares,
        })
        .map_err(|e| ServiceError::Store(e.to_string()))?;
        Ok(())
    }

    /// Adds a share of `dataset` (in one of `pools`).
    pub fn add(
        &self,
        pools: &[Arc<Dsl>],
        protocol: &str,
        name: &str,
        dataset: &str,
        options: &BTreeMap<String, String>,
        accounts: Option<&Accounts>,
    ) -> Res<ShareInfo> {
        let pool = dataset.split('/').next().unwrap_or("");
        let dsl = pools
            .iter()
            .find(|d| d.pool_name() == pool)
            .ok_or_else(|| ServiceError::NotFound(format!("no such pool '{pool}'")))?;
        let id = dsl
            .resolve(dataset)
            .map_err(|e| ServiceError::NotFound(e.to_string()))?;
        let kind = dsl
            .record(id)
            .map_err(|e| ServiceError::NotFound(e.to_string()))?
            .kind;
        if kind == DatasetKind::Snapshot {
            return Err(invalid(format!(
                "cannot share '{dataset}': snapshots are served through their dataset (read-only under .tank/snapshot)"
            )));
        }
        let options = validate(protocol, name, dataset, kind, options, accounts)?;
        for s in self.list(pools) {
            if protocol == "iscsi"
                && s.protocol == "iscsi"
                && s.options.get("iqn") == options.get("iqn")
                && s.options.get("lun") == options.get("lun")
            {
                return Err(ServiceError::Exists(format!(
                    "target {} has a LUN {} already (share '{}' of {})",
                    options["iqn"], options["lun"], s.name, s.dataset
                )));
            }
            // Several LUNs of one target may go by the target's name.
            let luns_of_one_target = protocol == "iscsi" && s.protocol == "iscsi";
            if s.name == name && !luns_of_one_target {
                return Err(ServiceError::Exists(format!(
                    "share '{name}' exists ({} share of {})",
                    s.protocol, s.dataset
                )));
            }
        }
        let share = Share {
            protocol: protocol.to_string(),
            name: name.to_string(),
            options: options.clone(),
        };
        Self::write(dsl, dataset, |v| v.push(share))?;
        let info = ShareInfo {
            protocol: protocol.to_string(),
            name: name.to_string(),
            dataset: dataset.to_string(),
            options,
            state: None,
        };
        self.notify(ShareChange::Added(info.clone()));
        Ok(info)
    }

    /// Changes options of a share (`KEY=VALUE`; an empty value goes back to the default).
    pub fn set(
        &self,
        pools: &[Arc<Dsl>],
        name: &str,
        changes: &[(String, String)],
        accounts: Option<&Accounts>,
    ) -> Res<ShareInfo> {
        let (before, dsl) = self.find(pools, name)?;
        let kind = dsl
            .record(
                dsl.resolve(&before.dataset)
                    .map_err(|e| ServiceError::NotFound(e.to_string()))?,
            )
            .map_err(|e| ServiceError::NotFound(e.to_string()))?
            .kind;
        // Re-validate from what was given explicitly, so defaults follow a change of them.
        let mut given = before.options.clone();
        for (k, v) in changes {
            if v.is_empty() {
                given.remove(k);
            } else {
                given.insert(k.clone(), v.clone());
            }
        }
        let options = validate(
            &before.protocol,
            &before.name,
            &before.dataset,
            kind,
            &given,
            accounts,
        )?;
        if before.protocol == "iscsi"
            && (options.get("lun") != before.options.get("lun")
                || options.get("iqn") != before.options.get("iqn"))
        {
            return Err(invalid(
                "a LUN's target and number do not change: remove the share and add it anew".into(),
            ));
        }
        Self::write(&dsl, &before.dataset, |v| {
            for s in v.iter_mut().filter(|s| Self::same(s, &before)) {
                s.options = options.clone();
            }
        })?;
        let after = ShareInfo {
            options,
            ..before.clone()
        };
        self.notify(ShareChange::Changed {
            before,
            after: after.clone(),
        });
        Ok(after)
    }

    pub fn remove(&self, pools: &[Arc<Dsl>], name: &str) -> Res<ShareInfo> {
        let (info, dsl) = self.find(pools, name)?;
        Self::write(&dsl, &info.dataset, |v| v.retain(|s| !Self::same(s, &info)))?;
        self.notify(ShareChange::Removed(info.clone()));
        Ok(info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_share_is_usable_by_whom_its_server_admits() {
        let share = |protocol: &str, kv: &[(&str, &str)]| ShareInfo {
            protocol: protocol.into(),
            name: "s".into(),
            dataset: "p/s".into(),
            options: opts(kv),
            state: None,
        };
        let staff = ["staff".to_string()];
        let open = share("smb", &[("guest", "off")]);
        assert!(open.usable_by("alice", &[]));
        let named = share("smb", &[("users", "bob,carol")]);
        assert!(!named.usable_by("alice", &[]) && named.usable_by("carol", &[]));
        let group = share("smb", &[("groups", "staff")]);
        assert!(!group.usable_by("alice", &[]) && group.usable_by("alice", &staff));
        let guest = share("smb", &[("users", "bob"), ("guest", "on")]);
        assert!(guest.usable_by("alice", &[]));
        let bucket = share("s3", &[("public", "off")]);
        assert!(!bucket.usable_by("alice", &staff));
        assert!(share("s3", &[("public", "read")]).usable_by("alice", &[]));
        assert!(share("s3", &[("groups", "staff")]).usable_by("alice", &staff));
        let target = share(
            "iscsi",
            &[("chap_users", "alice"), ("mutual_chap_user", "tgt")],
        );
        assert!(target.usable_by("alice", &[]) && target.usable_by("tgt", &[]));
        assert!(!target.usable_by("bob", &staff));
        assert!(!share("iscsi", &[]).usable_by("alice", &[]));
        assert!(!share("nfs", &[("clients", "10.0.0.0/8")]).usable_by("alice", &staff));
    }

    #[test]
    fn options_are_checked_per_protocol() {
        let fs = DatasetKind::Filesystem;
        let ok = validate(
            "nfs",
            "media",
            "tank/media",
            fs,
            &opts(&[
                ("hosts", "10.0.0.0/24, fd00::/64,nas.local"),
                ("squash", "all_squash"),
            ]),
            None,
        )
        .unwrap();
        assert_eq!(ok["clients"], "10.0.0.0/24,fd00::/64,nas.local");
        assert_eq!(ok["anonuid"], "65534");
        let smb = validate(
            "smb",
            "tm",
            "tank/tm",
            fs,
            &opts(&[("timemachine", "yes"), ("timemachine_quota", "500G")]),
            None,
        )
        .unwrap();
        assert_eq!(smb["timemachine"], "on");
        assert_eq!(smb["timemachine_quota"], (500u64 << 30).to_string());
        let iscsi = validate(
            "iscsi",
            "vm1",
            "tank/vms/vm1",
            DatasetKind::Volume,
            &BTreeMap::new(),
            None,
        )
        .unwrap();
        assert_eq!(iscsi["iqn"], "iqn.2026-11.org.tank:tank.vms.vm1");
        /// protocol, share name, dataset kind, options, what the refusal says.
        type Case<'a> = (
            &'a str,
            &'a str,
            DatasetKind,
            &'a [(&'a str, &'a str)],
            &'a str,
        );
        let cases: &[Case] = &[
            ("ftp", "x", fs, &[], "unknown protocol"),
            ("nfs", "x", fs, &[("hosts", "10.0.0.0/33")], "prefix length"),
            ("nfs", "x", fs, &[("hosts", "bad host!")], "invalid host"),
            ("nfs", "x", fs, &[("squash", "some")], "invalid squash"),
            ("nfs", "x", fs, &[("sec", "krb5")], "only sys"),
            (
                "nfs",
                "x",
                fs,
                &[("users", "alice")],
                "unknown nfs share option 'users'",
            ),
            ("smb", "x", fs, &[("guest", "maybe")], "on or off"),
            (
                "smb",
                "x",
                fs,
                &[("timemachine_quota", "1T")],
                "needs timemachine=on",
            ),
            ("s3", "Bad_Bucket", fs, &[], "invalid bucket name"),
            ("s3", "ok-bucket", fs, &[("public", "write")], "off, read"),
            (
                "s3",
                "ok-bucket",
                fs,
                &[("versioning", "maybe")],
                "off, enabled",
            ),
            (
                "s3",
                "ok-bucket",
                fs,
                &[("object_lock", "on"), ("versioning", "suspended")],
                "needs versioning enabled",
            ),
            ("iscsi", "vm", fs, &[], "serves volumes"),
            ("smb", "x", DatasetKind::Volume, &[], "serves filesystems"),
            (
                "iscsi",
                "vm",
                DatasetKind::Volume,
                &[("iqn", "iqn.20x6-11.org.tank:a")],
                "invalid iSCSI name",
            ),
            (
                "iscsi",
                "vm",
                DatasetKind::Volume,
                &[("lun", "256")],
                "0 to 255",
            ),
            ("smb", "a b", fs, &[], "invalid share name"),
        ];
        for (proto, name, kind, o, want) in cases {
            let e = validate(proto, name, "tank/x", *kind, &opts(o), None)
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{proto} {o:?}: expected '{want}' in: {e}");
        }
    }

    #[test]
    fn account_names_are_checked_when_accounts_are_given() {
        let dir = tempfile::tempdir().unwrap();
        let a = Accounts::open(&dir.path().join("a.redb")).unwrap();
        a.add_group("staff", None).unwrap();
        let fs = DatasetKind::Filesystem;
        validate(
            "smb",
            "s",
            "t/s",
            fs,
            &opts(&[("groups", "staff")]),
            Some(&a),
        )
        .unwrap();
        let e = validate(
            "smb",
            "s",
            "t/s",
            fs,
            &opts(&[("users", "ghost")]),
            Some(&a),
        )
        .unwrap_err();
        assert!(matches!(e, ServiceError::NotFound(_)), "{e}");
    }
}
