//! The target table: the service's `iscsi` shares grouped into targets, each LUN a held
//! volume, with who may log in and which LUNs each initiator sees.
//!
//! # Theory of operation
//! [`Targets`] is built from the share registry at start and again after every committed
//! share change (it is a `ShareWatcher`). Shares with the same `iqn` are one target; each
//! share is one LUN (`lun`), a [`Lu`] holding its volume through the service, so a destroy
//! of the volume is refused while it is served and a rollback suspends it. A LUN that did
//! not change keeps its `Lu` (its reservations and unit attentions) across a rebuild; when
//! a target's LUNs change, every other LUN of it raises REPORTED LUNS DATA HAS CHANGED.
//!
//! Access, per LUN share: `initiators` (empty: any initiator) and `chap_users` (empty: no
//! CHAP). A target asks for CHAP when any of its LUNs does; an initiator sees the LUNs whose
//! `initiators` name it and whose `chap_users` name the account it logged in as (or that
//! ask for none). `mutual_chap_user` is the account whose secret the target proves it
//! knows when the initiator asks.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use parking_lot::RwLock;
use tank_service::api::{Request, Response};
use tank_service::handles::{DatasetEvent, Holder};
use tank_service::shares::{ShareChange, ShareInfo, ShareWatcher};
use tank_service::{Caller, Service};

use crate::scsi::Lu;
use crate::sense;

/// One LUN of a target.
pub struct Lun {
    pub lu: Arc<Lu>,
    pub share: ShareInfo,
    initiators: Vec<String>,
    chap_users: Vec<String>,
}

impl Lun {
    fn allows(&self, initiator: &str, chap_user: Option<&str>) -> bool {
        let by_name = self.initiators.is_empty() || self.initiators.iter().any(|i| i == initiator);
        let by_chap = self.chap_users.is_empty()
            || chap_user.is_some_and(|u| self.chap_users.iter().any(|c| c == u));
        by_name && by_chap
    }
}

/// One target: its LUNs by number.
#[derive(Default)]
pub struct Target {
    pub iqn: String,
    pub luns: BTreeMap<u16, Lun>,
}

/// What a login to a target needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// The accounts that may log in by CHAP; empty: no CHAP.
    pub chap_users: Vec<String>,
    /// Every LUN the initiator may see asks for CHAP: a login without it sees nothing.
    pub chap_required: bool,
    pub mutual_user: Option<String>,
}

impl Target {
    /// Whether `initiator` may log in at all (some LUN names it, or admits any), and with
    /// what authentication.
    pub fn policy(&self, initiator: &str) -> Option<Policy> {
        let named: Vec<&Lun> = self
            .luns
            .values()
            .filter(|l| l.initiators.is_empty() || l.initiators.iter().any(|i| i == initiator))
            .collect();
        if named.is_empty() {
            return None;
        }
        let mut chap_users: Vec<String> = Vec::new();
        let mut any_without = false;
        for l in &named {
            if l.chap_users.is_empty() {
                any_without = true;
            }
            for u in &l.chap_users {
                if !chap_users.contains(u) {
                    chap_users.push(u.clone());
                }
            }
        }
        // CHAP is chosen when any LUN wants it and the initiator offers it; a login without
        // CHAP is refused only when every LUN wants it.
        let mutual_user = named
            .iter()
            .filter_map(|l| l.share.options.get("mutual_chap_user"))
            .find(|m| !m.is_empty())
            .cloned();
        Some(Policy {
            chap_required: !any_without,
            chap_users,
            mutual_user,
        })
    }

    /// LUN `n`, if `initiator` (logged in as `chap_user`) sees it.
    pub fn lun_for(&self, n: u16, initiator: &str, chap_user: Option<&str>) -> Option<Arc<Lu>> {
        self.luns
            .get(&n)
            .filter(|l| l.allows(initiator, chap_user))
            .map(|l| l.lu.clone())
    }

    /// The LUNs `initiator` (logged in as `chap_user`) sees.
    pub fn visible(&self, initiator: &str, chap_user: Option<&str>) -> BTreeMap<u16, Arc<Lu>> {
        self.luns
            .iter()
            .filter(|(_, l)| l.allows(initiator, chap_user))
            .map(|(n, l)| (*n, l.lu.clone()))
            .collect()
    }
}

/// A LUN's hold on its volume: a size change is a unit attention, a forced destroy takes
/// the LUN away.
struct LunHolder {
    lu: std::sync::OnceLock<Weak<Lu>>,
    targets: Weak<Targets>,
    share: ShareInfo,
}

impl Holder for LunHolder {
    fn notify(&self, event: &DatasetEvent) {
        match event {
            DatasetEvent::PropertiesChanged { names } if names.iter().any(|n| n == "volsize") => {
                if let Some(lu) = self.lu.get().and_then(Weak::upgrade) {
                    lu.attention_all(sense::CAPACITY_CHANGED, None);
                }
            }
            DatasetEvent::Destroying => {
                if let Some(t) = self.targets.upgrade() {
                    t.drop_lun(&self.share);
                }
            }
            _ => {}
        }
    }
}

/// The targets of a service's iscsi shares.
pub struct Targets {
    svc: Arc<Service>,
    map: RwLock<BTreeMap<String, Arc<RwLock<Target>>>>,
    me: Weak<Targets>,
    problems: RwLock<BTreeMap<String, String>>,
    stopped: std::sync::atomic::AtomicBool,
}

fn list(v: Option<&String>) -> Vec<String> {
    v.map(|s| {
        s.split(',')
            .map(str::trim)
            .filter(|x| !x.is_empty())
            .map(str::to_string)
            .collect()
    })
    .unwrap_or_default()
}

fn lun_of(s: &ShareInfo) -> u16 {
    s.options
        .get("lun")
        .and_then(|l| l.parse().ok())
        .unwrap_or(0)
}

fn iqn_of(s: &ShareInfo) -> String {
    s.options.get("iqn").cloned().unwrap_or_default()
}

impl Targets {
    pub fn new(svc: Arc<Service>) -> Arc<Targets> {
        let t = Arc::new_cyclic(|me| Targets {
            svc: svc.clone(),
            map: RwLock::new(BTreeMap::new()),
            me: me.clone(),
            problems: RwLock::new(BTreeMap::new()),
            stopped: std::sync::atomic::AtomicBool::new(false),
        });
        svc.shares.serving("iscsi", true);
        t.refresh();
        svc.shares.watch(t.clone());
        t
    }

    pub fn service(&self) -> &Arc<Service> {
        &self.svc
    }

    /// The target named `iqn`.
    pub fn get(&self, iqn: &str) -> Option<Arc<RwLock<Target>>> {
        self.map.read().get(iqn).cloned()
    }

    /// Every target's name, for SendTargets, that `initiator` may log in to.
    pub fn names_for(&self, initiator: &str) -> Vec<String> {
        self.map
            .read()
            .iter()
            .filter(|(_, t)| t.read().policy(initiator).is_some())
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// The CHAP secret of an account, if it has one.
    pub fn chap_secret(&self, user: &str) -> Option<String> {
        self.svc.accounts().ok()?.user(user).ok()?.chap_secret
    }

    /// Stops serving: every LUN lets go of its volume.
    pub fn clear(&self) {
        self.stopped
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.map.write().clear();
        self.svc.shares.serving("iscsi", false);
    }

    fn drop_lun(&self, share: &ShareInfo) {
        if let Some(t) = self.get(&iqn_of(share)) {
            let gone = t.write().luns.remove(&lun_of(share)).is_some();
            if gone {
                for l in t.read().luns.values() {
                    l.lu.attention_all(sense::REPORTED_LUNS_CHANGED, None);
                }
            }
        }
    }

    /// Builds the table again from the share registry.
    pub fn refresh(&self) {
        if self.stopped.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let admin = Caller::Admin {
            name: "iscsi".into(),
        };
        let shares: Vec<ShareInfo> = match self.svc.handle(&admin, Request::ShareList, None).0 {
            Ok(Response::Shares(s)) => s.into_iter().filter(|s| s.protocol == "iscsi").collect(),
            Ok(_) => Vec::new(),
            Err(e) => {
                eprintln!("iscsi: cannot list the shares: {e}");
                return;
            }
        };
        let mut problems = BTreeMap::new();
        let mut by_target: BTreeMap<String, Vec<ShareInfo>> = BTreeMap::new();
        for s in shares {
            by_target.entry(iqn_of(&s)).or_default().push(s);
        }
        let mut next: BTreeMap<String, Arc<RwLock<Target>>> = BTreeMap::new();
        for (iqn, shares) in by_target {
            let old = self.get(&iqn);
            let mut luns = BTreeMap::new();
            for s in shares {
                let n = lun_of(&s);
                let kept = old.as_ref().and_then(|t| {
                    let t = t.read();
                    t.luns
                        .get(&n)
                        .filter(|l| {
                            l.share.dataset == s.dataset
                                && l.share.options.get("readonly") == s.options.get("readonly")
                        })
                        .map(|l| l.lu.clone())
                });
                let lu = match kept {
                    Some(lu) => lu,
                    None => match self.build(&s) {
                        Ok(lu) => lu,
                        Err(why) => {
                            problems.insert(s.name.clone(), why);
                            continue;
                        }
                    },
                };
                luns.insert(
                    n,
                    Lun {
                        lu,
                        initiators: list(s.options.get("initiators")),
                        chap_users: list(s.options.get("chap_users")),
                        share: s,
                    },
                );
            }
            let changed = old.as_ref().is_none_or(|t| {
                let t = t.read();
                t.luns.len() != luns.len()
                    || t.luns
                        .iter()
                        .any(|(n, l)| luns.get(n).is_none_or(|m| !Arc::ptr_eq(&m.lu, &l.lu)))
            });
            let target = match old {
                Some(t) => {
                    t.write().luns = luns;
                    t
                }
                None => Arc::new(RwLock::new(Target {
                    iqn: iqn.clone(),
                    luns,
                })),
            };
            if changed {
                for l in target.read().luns.values() {
                    l.lu.attention_all(sense::REPORTED_LUNS_CHANGED, None);
                }
            }
            next.insert(iqn, target);
        }
        for t in next.values() {
            for l in t.read().luns.values() {
                self.svc.shares.set_state("iscsi", &l.share.name, None);
            }
        }
        for (name, why) in &problems {
            self.svc
                .shares
                .set_state("iscsi", name, Some(format!("not served: {why}")));
        }
        *self.map.write() = next;
        let mut seen = self.problems.write();
        for (name, why) in &problems {
            if seen.get(name) != Some(why) {
                eprintln!("iscsi: share '{name}' is not served: {why}");
            }
        }
        *seen = problems;
    }

    fn build(&self, s: &ShareInfo) -> Result<Arc<Lu>, String> {
        let holder = Arc::new(LunHolder {
            lu: std::sync::OnceLock::new(),
            targets: self.me.clone(),
            share: s.clone(),
        });
        let n = lun_of(s);
        let hold = self
            .svc
            .hold(
                &s.dataset,
                &format!("iscsi target {} lun {n}", iqn_of(s)),
                holder.clone(),
            )
            .map_err(|e| e.to_string())?;
        if hold.volume().is_none() {
            return Err(format!("'{}' is not a volume", s.dataset));
        }
        let (opened, _) = self
            .svc
            .open(hold.handle().pool())
            .map_err(|e| e.to_string())?;
        let lu = Arc::new(Lu::new(
            n,
            &s.dataset,
            hold,
            s.options.get("readonly").map(String::as_str) == Some("on"),
            opened.pool.guid(),
        ));
        lu.keep_reservations_in(
            self.svc
                .data_dir()
                .join("iscsi")
                .join("reservations")
                .join(lu.serial()),
        )?;
        let _ = holder.lu.set(Arc::downgrade(&lu));
        Ok(lu)
    }
}

impl ShareWatcher for Targets {
    fn share_changed(&self, change: &ShareChange) {
        let ours = match change {
            ShareChange::Added(s) | ShareChange::Removed(s) => s.protocol == "iscsi",
            ShareChange::Changed { after, .. } => after.protocol == "iscsi",
        };
        if ours {
            self.refresh();
        }
    }
}
