//! The export table: the service's `nfs` shares, each a dataset held open for NFS, with who
//! may reach it and as whom.
//!
//! # Theory of operation
//! [`Exports`] is built from the share registry at start and rebuilt after every committed
//! share change (it is a `ShareWatcher`). Each [`Export`] holds its dataset through the
//! service ([`Service::hold`]), so the one open filesystem is shared with the FUSE mount and
//! the other front ends, a destroy of the dataset is refused while it is exported (unless
//! forced, which withdraws the export), and a rollback suspends it until the rolled-back
//! filesystem is open. A request names a dataset by the (pool guid, dataset id) of its file
//! handle; the export of that dataset whose `clients` allow the caller's address serves it,
//! with that export's `readonly` and squash rules. Nothing is cached per client: a change of
//! the shares applies to the next request.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Weak};

use parking_lot::{Mutex, RwLock};
use tank_dataset::posix::{Cred, Fs};
use tank_dataset::{DatasetKind, DsHooks, Dsl};
use tank_object::ObjectStore;
use tank_service::api::{Request, Response};
use tank_service::handles::{Changed, DatasetEvent, Hold, Holder};
use tank_service::shares::{ShareChange, ShareInfo, ShareWatcher};
use tank_service::{Caller, Service};

/// How a caller's identity is mapped, as exports(5) says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Squash {
    /// uid 0 becomes the anonymous user (the default).
    Root,
    /// Identities are taken as given.
    None,
    /// Every caller is the anonymous user.
    All,
}

/// One allowed client: an address, a network, or a host name (matched by its addresses,
/// looked up when the export is built).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Network {
    addr: IpAddr,
    prefix: u8,
}

impl Network {
    fn parse(s: &str) -> Vec<Network> {
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, p.parse::<u8>().ok()),
            None => (s, None),
        };
        if let Ok(addr) = a.parse::<IpAddr>() {
            let max = if addr.is_ipv4() { 32 } else { 128 };
            return vec![Network {
                addr,
                prefix: p.unwrap_or(max).min(max),
            }];
        }
        // A host name: the addresses it has now.
        use std::net::ToSocketAddrs;
        (a, 0)
            .to_socket_addrs()
            .map(|it| {
                it.map(|sa| Network {
                    addr: sa.ip(),
                    prefix: if sa.is_ipv4() { 32 } else { 128 },
                })
                .collect()
            })
            .unwrap_or_default()
    }

    /// Whether `ip` is in this network (an IPv4 client over IPv6 as its mapped address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(c)) => {
                let bits = u32::from(self.prefix);
                let mask = if bits == 0 {
                    0
                } else {
                    u32::MAX << (32 - bits)
                };
                u32::from(n) & mask == u32::from(c) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(c)) => {
                let bits = u32::from(self.prefix);
                let mask = if bits == 0 {
                    0
                } else {
                    u128::MAX << (128 - bits)
                };
                u128::from(n) & mask == u128::from(c) & mask
            }
            _ => false,
        }
    }
}

/// One exported dataset.
pub struct Export {
    /// The share's name: clients mount `/NAME`.
    pub name: String,
    pub dataset: String,
    pub readonly: bool,
    pub squash: Squash,
    pub anonuid: u32,
    pub anongid: u32,
    pub clients: Vec<Network>,
    /// The pool's guid and the dataset's id: what file handles name.
    pub pool_guid: u64,
    pub dataset_id: u64,
    hold: Hold,
    pub dsl: Arc<Dsl>,
    store: Arc<ObjectStore>,
    /// The other filesystems reached through the export: child datasets (held, as the
    /// export's own) and snapshots (opened read-only), by dataset id.
    others: Arc<Mutex<HashMap<u64, Other>>>,
}

enum Other {
    Live(Hold),
    Snapshot(Arc<Fs>),
}

/// The most snapshots and child datasets an export keeps open at once.
const MAX_OTHERS: usize = 256;

/// A child dataset's hold: a forced destroy drops it from its export.
struct ForgetChild {
    others: Weak<Mutex<HashMap<u64, Other>>>,
    id: u64,
}

impl Holder for ForgetChild {
    fn notify(&self, event: &DatasetEvent) {
        if matches!(event, DatasetEvent::Destroying) {
            if let Some(o) = self.others.upgrade() {
                o.lock().remove(&self.id);
            }
        }
    }
}

/// Why a filesystem of an export cannot be served now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unavailable {
    /// It is gone, or not inside the export.
    Stale,
    /// A rollback is replacing it: try again.
    Busy,
}

impl Export {
    /// Whether a client at `ip` may use the export.
    pub fn allows(&self, ip: IpAddr) -> bool {
        self.clients.iter().any(|n| n.contains(ip))
    }

    /// The credential a request is served with: AUTH_SYS's uid, gid and groups after
    /// squashing (a request without AUTH_SYS is the anonymous user).
    pub fn cred(&self, auth: Option<(u32, u32, &[u32])>) -> Cred {
        let anon = Cred::user(self.anonuid, self.anongid);
        match (auth, self.squash) {
            (None, _) | (_, Squash::All) => anon,
            (Some((0, _, _)), Squash::Root) => anon,
            (Some((uid, gid, groups)), _) => Cred {
                uid,
                gid,
                groups: groups.to_vec(),
            },
        }
    }

    /// The dataset's filesystem (`None` while a rollback replaces it).
    pub fn fs(&self) -> Option<Arc<Fs>> {
        self.hold.fs()
    }

    /// Tells the other front ends on dataset `dataset` (this export's or a child's) what a
    /// request changed, so that the local mount drops what its kernel caches of it.
    pub fn changed(&self, dataset: u64, change: Changed) {
        if dataset == self.dataset_id {
            self.hold.changed(change);
        } else if let Some(Other::Live(h)) = self.others.lock().get(&dataset) {
            h.changed(change);
        }
    }

    /// The name of a dataset or snapshot of the pool.
    pub fn name_of(&self, id: u64) -> String {
        self.dsl.name_of(id)
    }

    /// Whether `name` (a dataset or a snapshot) is the export's dataset or inside it.
    fn inside(&self, name: &str) -> bool {
        let head = name.split('@').next().unwrap_or(name);
        head == self.dataset
            || head
                .strip_prefix(self.dataset.as_str())
                .is_some_and(|rest| rest.starts_with('/'))
    }

    /// The filesystem of dataset or snapshot `id` reached through this export, and whether
    /// it is a snapshot (read-only): the export's own, a child dataset (crossmnt), or a
    /// snapshot of either (`.tank/snapshot`).
    pub fn fs_of(&self, svc: &Service, id: u64) -> Result<(Arc<Fs>, bool), Unavailable> {
        if id == self.dataset_id {
            return self.fs().map(|f| (f, false)).ok_or(Unavailable::Busy);
        }
        // Still there, under the name it had (a snapshot destroyed and its id reused is
        // another thing).
        let rec = self.dsl.record(id).map_err(|_| Unavailable::Stale)?;
        let name = self.dsl.name_of(id);
        if !self.inside(&name) {
            return Err(Unavailable::Stale);
        }
        if let Some(o) = self.others.lock().get(&id) {
            return match o {
                Other::Live(h) => h.fs().map(|f| (f, false)).ok_or(Unavailable::Busy),
                Other::Snapshot(f) => Ok((f.clone(), true)),
            };
        }
        let other = match rec.kind {
            DatasetKind::Snapshot => {
                let objset = self
                    .dsl
                    .snapshot_objset(id)
                    .map_err(|_| Unavailable::Stale)?;
                let hooks = Arc::new(DsHooks {
                    dsl: self.dsl.clone(),
                    id,
                    snapshot: true,
                });
                let fs = Fs::mount(self.store.clone(), objset, hooks, (0, 0))
                    .map_err(|_| Unavailable::Stale)?;
                Other::Snapshot(fs)
            }
            DatasetKind::Filesystem => {
                let hold = svc
                    .hold(
                        &name,
                        &format!("nfs export {} (below it)", self.name),
                        Arc::new(ForgetChild {
                            others: Arc::downgrade(&self.others),
                            id,
                        }),
                    )
                    .map_err(|_| Unavailable::Stale)?;
                Other::Live(hold)
            }
            _ => return Err(Unavailable::Stale),
        };
        let r = match &other {
            Other::Live(h) => h.fs().map(|f| (f, false)).ok_or(Unavailable::Busy),
            Other::Snapshot(f) => Ok((f.clone(), true)),
        };
        let mut others = self.others.lock();
        if others.len() >= MAX_OTHERS {
            // Snapshots first: they are opened again at no cost but a read of their root.
            let victim = others
                .iter()
                .find(|(_, o)| matches!(o, Other::Snapshot(_)))
                .or_else(|| others.iter().next())
                .map(|(k, _)| *k);
            if let Some(k) = victim {
                others.remove(&k);
            }
        }
        others.insert(id, other);
        r
    }
}

/// The exports of a service's `nfs` shares.
pub struct Exports {
    pub(crate) svc: Arc<Service>,
    table: RwLock<Vec<Arc<Export>>>,
    /// Why shares could not be exported, by share name (for the log, once each).
    problems: RwLock<BTreeMap<String, String>>,
    me: Weak<Exports>,
    /// Set at the server's stop: no more holds are taken.
    stopped: std::sync::atomic::AtomicBool,
}

/// An export's hold: a forced destroy withdraws the export at once.
struct Withdraw {
    exports: Weak<Exports>,
    name: String,
}

impl Holder for Withdraw {
    fn notify(&self, event: &DatasetEvent) {
        if matches!(event, DatasetEvent::Destroying) {
            if let Some(e) = self.exports.upgrade() {
                e.table.write().retain(|x| x.name != self.name);
            }
        }
    }
}

impl Exports {
    /// The exports of `svc`'s shares now, kept in step with their changes.
    pub fn new(svc: Arc<Service>) -> Arc<Exports> {
        let e = Arc::new_cyclic(|me| Exports {
            svc: svc.clone(),
            table: RwLock::new(Vec::new()),
            problems: RwLock::new(BTreeMap::new()),
            me: me.clone(),
            stopped: std::sync::atomic::AtomicBool::new(false),
        });
        svc.shares.serving("nfs", true);
        e.refresh();
        svc.shares.watch(e.clone());
        e
    }

    /// Builds the table again from the share registry: new and changed shares are held
    /// (again), removed ones let go.
    pub fn refresh(&self) {
        if self.stopped.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let admin = Caller::Admin { name: "nfs".into() };
        let shares: Vec<ShareInfo> = match self.svc.handle(&admin, Request::ShareList, None).0 {
            Ok(Response::Shares(s)) => s.into_iter().filter(|s| s.protocol == "nfs").collect(),
            Ok(_) => Vec::new(),
            Err(e) => {
                eprintln!("nfs: cannot list the shares: {e}");
                return;
            }
        };
        let mut next = Vec::new();
        let mut problems = BTreeMap::new();
        for s in shares {
            let keep = self
                .table
                .read()
                .iter()
                .find(|x| x.name == s.name && x.dataset == s.dataset && same_options(x, &s.options))
                .cloned();
            if let Some(x) = keep {
                next.push(x);
                continue;
            }
            match self.build(&s) {
                Ok(x) => next.push(Arc::new(x)),
                Err(why) => {
                    problems.insert(s.name.clone(), why);
                }
            }
        }
        for x in &next {
            self.svc.shares.set_state("nfs", &x.name, None);
        }
        for (name, why) in &problems {
            self.svc
                .shares
                .set_state("nfs", name, Some(format!("not served: {why}")));
        }
        *self.table.write() = next;
        let mut seen = self.problems.write();
        for (name, why) in &problems {
            if seen.get(name) != Some(why) {
                eprintln!("nfs: share '{name}' is not exported: {why}");
            }
        }
        *seen = problems;
    }

    fn build(&self, s: &ShareInfo) -> Result<Export, String> {
        let o = |k: &str| s.options.get(k).map(String::as_str);
        let squash = match o("squash") {
            Some("no_root_squash") => Squash::None,
            Some("all_squash") => Squash::All,
            _ => Squash::Root,
        };
        let num = |k: &str| o(k).and_then(|v| v.parse::<u32>().ok()).unwrap_or(65534);
        let clients = o("clients")
            .or(o("hosts"))
            .unwrap_or("")
            .split(',')
            .filter(|c| !c.is_empty())
            .flat_map(Network::parse)
            .collect();
        let hold = self
            .svc
            .hold(
                &s.dataset,
                &format!("nfs export {}", s.name),
                Arc::new(Withdraw {
                    exports: self.me.clone(),
                    name: s.name.clone(),
                }),
            )
            .map_err(|e| e.to_string())?;
        let (opened, _) = self
            .svc
            .open(hold.handle().pool())
            .map_err(|e| e.to_string())?;
        Ok(Export {
            dsl: opened.dsl.clone(),
            store: opened.store.clone(),
            others: Arc::new(Mutex::new(HashMap::new())),
            name: s.name.clone(),
            dataset: s.dataset.clone(),
            readonly: o("readonly") == Some("on"),
            squash,
            anonuid: num("anonuid"),
            anongid: num("anongid"),
            clients,
            pool_guid: opened.pool.guid(),
            dataset_id: hold.handle().id(),
            hold,
        })
    }

    /// Every export.
    pub fn all(&self) -> Vec<Arc<Export>> {
        self.table.read().clone()
    }

    /// The export named `name` (the first component of a mount path).
    pub fn by_name(&self, name: &str) -> Option<Arc<Export>> {
        self.table.read().iter().find(|x| x.name == name).cloned()
    }

    /// Lets go of every dataset, for good (the server's stop).
    pub fn clear(&self) {
        self.stopped
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.table.write().clear();
        self.svc.shares.serving("nfs", false);
    }
}

fn same_options(x: &Export, opts: &BTreeMap<String, String>) -> bool {
    let o = |k: &str| opts.get(k).map(String::as_str);
    let squash = match o("squash") {
        Some("no_root_squash") => Squash::None,
        Some("all_squash") => Squash::All,
        _ => Squash::Root,
    };
    let num = |k: &str| o(k).and_then(|v| v.parse::<u32>().ok()).unwrap_or(65534);
    let clients: Vec<Network> = o("clients")
        .or(o("hosts"))
        .unwrap_or("")
        .split(',')
        .filter(|c| !c.is_empty())
        .flat_map(Network::parse)
        .collect();
    x.readonly == (o("readonly") == Some("on"))
        && x.squash == squash
        && x.anonuid == num("anonuid")
        && x.anongid == num("anongid")
        && x.clients == clients
}

impl ShareWatcher for Exports {
    fn share_changed(&self, change: &ShareChange) {
        let nfs = |s: &ShareInfo| s.protocol == "nfs";
        let relevant = match change {
            ShareChange::Added(s) | ShareChange::Removed(s) => nfs(s),
            ShareChange::Changed { before, after } => nfs(before) || nfs(after),
        };
        if relevant {
            self.refresh();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_match_addresses_and_prefixes() {
        let n = Network::parse("10.1.0.0/16");
        assert!(n[0].contains("10.1.200.3".parse().unwrap()));
        assert!(!n[0].contains("10.2.0.1".parse().unwrap()));
        let one = Network::parse("127.0.0.1");
        assert!(one[0].contains("127.0.0.1".parse().unwrap()));
        assert!(!one[0].contains("127.0.0.2".parse().unwrap()));
        // An IPv4 client on a dual-stack socket.
        assert!(one[0].contains("::ffff:127.0.0.1".parse().unwrap()));
        let v6 = Network::parse("fd00::/64");
        assert!(v6[0].contains("fd00::1:2".parse().unwrap()));
        assert!(!v6[0].contains("fd01::1".parse().unwrap()));
        assert!(!v6[0].contains("10.0.0.1".parse().unwrap()));
        let all = Network::parse("0.0.0.0/0");
        assert!(all[0].contains("192.0.2.7".parse().unwrap()));
        assert!(Network::parse("localhost")
            .iter()
            .any(|n| n.contains("127.0.0.1".parse().unwrap())));
    }
}
