//! The bucket table: the service's `s3` shares, each a filesystem dataset held open for S3,
//! with who may use it.
//!
//! # Theory of operation
//! [`Buckets`] is built from the share registry at start and rebuilt after every committed
//! share change (it is a `ShareWatcher`), as the NFS export table is. Each [`Bucket`] holds
//! its dataset through the service, so its filesystem is the one the local mount, NFS and
//! SMB use; a destroy of the dataset is refused while it is a bucket (unless forced, which
//! withdraws the bucket). Who may use a bucket: administrators always; a user named in the
//! share's `users` or a member of one of its `groups`; anyone, to read, where `public` is
//! on. A `readonly` share refuses every change. Nothing is cached per caller: a change of
//! the shares applies to the next request.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use parking_lot::RwLock;
use tank_dataset::posix::Fs;
use tank_service::accounts::User;
use tank_service::api::{Request, Response};
use tank_service::handles::{DatasetEvent, Hold, Holder};
use tank_service::shares::{ShareChange, ShareInfo, ShareWatcher};
use tank_service::{Caller, Service};

/// One bucket.
pub struct Bucket {
    pub name: String,
    pub dataset: String,
    pub readonly: bool,
    /// Anyone may read the objects (GET, HEAD) without signing.
    pub public: bool,
    /// And list them.
    pub public_list: bool,
    pub users: Vec<String>,
    pub groups: Vec<String>,
    /// S3 versioning: what a PUT or DELETE does to the version before it.
    pub versioning: Versioning,
    /// Object Lock: versions may carry a retention or a legal hold.
    pub object_lock: bool,
    /// When the share was made (seconds since 1970), as ListBuckets tells it.
    pub created: i64,
    hold: Hold,
}

/// A bucket's versioning state (the share's `versioning` option).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Versioning {
    /// Never enabled: one object per key, replaced in place.
    Off,
    /// Every PUT makes a new version and a DELETE a delete marker.
    Enabled,
    /// New writes are the "null" version; versions kept before stay.
    Suspended,
}

impl Versioning {
    pub fn of(option: Option<&str>) -> Versioning {
        match option {
            Some("enabled") => Versioning::Enabled,
            Some("suspended") => Versioning::Suspended,
            _ => Versioning::Off,
        }
    }
}

/// Who is asking: an account (with its groups), or nobody (an unsigned request).
#[derive(Debug, Clone)]
pub struct Principal {
    pub user: Option<User>,
    pub groups: Vec<String>,
}

impl Principal {
    pub fn anonymous() -> Principal {
        Principal {
            user: None,
            groups: Vec::new(),
        }
    }

    pub fn is_admin(&self) -> bool {
        self.user.as_ref().is_some_and(|u| u.admin)
    }

    /// The owner of what this caller writes: its uid and primary gid.
    pub fn owner(&self) -> (u32, u32) {
        self.user
            .as_ref()
            .map_or((65534, 65534), |u| (u.uid, u.gid))
    }
}

impl Bucket {
    /// The dataset's filesystem (`None` while a rollback replaces it).
    pub fn fs(&self) -> Option<Arc<Fs>> {
        self.hold.fs()
    }

    /// Whether `p` may read the bucket's objects and list them.
    pub fn may_read(&self, p: &Principal) -> bool {
        self.public || self.member(p)
    }

    /// Whether `p` may list the bucket's objects.
    pub fn may_list(&self, p: &Principal) -> bool {
        self.public_list || self.member(p)
    }

    /// Whether `p` may change the bucket's objects.
    pub fn may_write(&self, p: &Principal) -> bool {
        !self.readonly && self.member(p)
    }

    /// Whether `p` is one of the bucket's users (administrators are of every bucket).
    pub fn member(&self, p: &Principal) -> bool {
        let Some(u) = &p.user else { return false };
        u.admin || self.users.contains(&u.name) || self.groups.iter().any(|g| p.groups.contains(g))
    }

    /// Tells the dataset's other holders (the local mount) what a request changed.
    pub fn changed(&self, change: tank_service::handles::Changed) {
        self.hold.changed(change);
    }
}

/// The buckets of a service's `s3` shares.
pub struct Buckets {
    /// Serialize the changes of one key in a versioned bucket (its current object and its
    /// versions move together), striped by the key's hash.
    keys: Vec<parking_lot::Mutex<()>>,
    svc: Arc<Service>,
    table: RwLock<BTreeMap<String, Arc<Bucket>>>,
    problems: RwLock<BTreeMap<String, String>>,
    me: Weak<Buckets>,
    stopped: std::sync::atomic::AtomicBool,
}

/// Stripes of the per-key locks.
const KEY_LOCKS: usize = 256;

/// A bucket's hold: a forced destroy withdraws the bucket at once.
struct Withdraw {
    buckets: Weak<Buckets>,
    name: String,
}

impl Holder for Withdraw {
    fn notify(&self, event: &DatasetEvent) {
        if matches!(event, DatasetEvent::Destroying) {
            if let Some(b) = self.buckets.upgrade() {
                b.table.write().remove(&self.name);
            }
        }
    }
}

fn list_opt(s: &ShareInfo, k: &str) -> Vec<String> {
    s.options
        .get(k)
        .map(|v| {
            v.split(',')
                .filter(|x| !x.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

impl Buckets {
    /// The buckets of `svc`'s shares now, kept in step with their changes.
    pub fn new(svc: Arc<Service>) -> Arc<Buckets> {
        let b = Arc::new_cyclic(|me| Buckets {
            keys: (0..KEY_LOCKS)
                .map(|_| parking_lot::Mutex::new(()))
                .collect(),
            svc: svc.clone(),
            table: RwLock::new(BTreeMap::new()),
            problems: RwLock::new(BTreeMap::new()),
            me: me.clone(),
            stopped: std::sync::atomic::AtomicBool::new(false),
        });
        svc.shares.serving("s3", true);
        b.refresh();
        svc.shares.watch(b.clone());
        b
    }

    /// Builds the table again from the share registry.
    pub fn refresh(&self) {
        if self.stopped.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let admin = Caller::Admin { name: "s3".into() };
        let shares: Vec<ShareInfo> = match self.svc.handle(&admin, Request::ShareList, None).0 {
            Ok(Response::Shares(s)) => s.into_iter().filter(|s| s.protocol == "s3").collect(),
            Ok(_) => Vec::new(),
            Err(e) => {
                eprintln!("s3: cannot list the shares: {e}");
                return;
            }
        };
        let mut next = BTreeMap::new();
        let mut problems = BTreeMap::new();
        for s in shares {
            let keep = self
                .table
                .read()
                .get(&s.name)
                .filter(|b| b.dataset == s.dataset && same(b, &s))
                .cloned();
            if let Some(b) = keep {
                next.insert(s.name.clone(), b);
                continue;
            }
            match self.build(&s) {
                Ok(b) => {
                    next.insert(s.name.clone(), Arc::new(b));
                }
                Err(why) => {
                    problems.insert(s.name.clone(), why);
                }
            }
        }
        for name in next.keys() {
            self.svc.shares.set_state("s3", name, None);
        }
        for (name, why) in &problems {
            self.svc
                .shares
                .set_state("s3", name, Some(format!("not served: {why}")));
        }
        *self.table.write() = next;
        let mut seen = self.problems.write();
        for (name, why) in &problems {
            if seen.get(name) != Some(why) {
                eprintln!("s3: share '{name}' is not served: {why}");
            }
        }
        *seen = problems;
    }

    fn build(&self, s: &ShareInfo) -> Result<Bucket, String> {
        let hold = self
            .svc
            .hold(
                &s.dataset,
                &format!("s3 bucket {}", s.name),
                Arc::new(Withdraw {
                    buckets: self.me.clone(),
                    name: s.name.clone(),
                }),
            )
            .map_err(|e| e.to_string())?;
        let created = hold
            .fs()
            .and_then(|fs| fs.getattr(tank_dataset::posix::ROOT_INO).ok())
            .map_or(0, |a| a.crtime.sec);
        Ok(Bucket {
            name: s.name.clone(),
            dataset: s.dataset.clone(),
            readonly: s.options.get("readonly").map(String::as_str) == Some("on"),
            public: matches!(
                s.options.get("public").map(String::as_str),
                Some("read" | "objects")
            ),
            public_list: s.options.get("public").map(String::as_str) == Some("read"),
            users: list_opt(s, "users"),
            groups: list_opt(s, "groups"),
            versioning: Versioning::of(s.options.get("versioning").map(String::as_str)),
            object_lock: s.options.get("object_lock").map(String::as_str) == Some("on"),
            created,
            hold,
        })
    }

    /// The lock of `key` in the dataset `dataset`.
    pub fn key_lock(&self, dataset: &str, key: &str) -> parking_lot::MutexGuard<'_, ()> {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        dataset.hash(&mut h);
        key.hash(&mut h);
        self.keys[(h.finish() % KEY_LOCKS as u64) as usize].lock()
    }

    pub fn get(&self, name: &str) -> Option<Arc<Bucket>> {
        self.table.read().get(name).cloned()
    }

    /// Every bucket, by name.
    pub fn all(&self) -> Vec<Arc<Bucket>> {
        self.table.read().values().cloned().collect()
    }

    /// Lets go of every dataset, for good (the server's stop).
    pub fn clear(&self) {
        self.stopped
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.table.write().clear();
        self.svc.shares.serving("s3", false);
    }

    /// Lets go of one bucket's dataset now (before its share is removed and its dataset
    /// destroyed by DeleteBucket).
    pub fn forget(&self, name: &str) {
        self.table.write().remove(name);
    }
}

fn same(b: &Bucket, s: &ShareInfo) -> bool {
    let o = |k: &str| s.options.get(k).map(String::as_str);
    b.readonly == (o("readonly") == Some("on"))
        && b.public == matches!(o("public"), Some("read" | "objects"))
        && b.public_list == (o("public") == Some("read"))
        && b.users == list_opt(s, "users")
        && b.groups == list_opt(s, "groups")
        && b.versioning == Versioning::of(o("versioning"))
        && b.object_lock == (o("object_lock") == Some("on"))
}

impl ShareWatcher for Buckets {
    fn share_changed(&self, change: &ShareChange) {
        let s3 = |s: &ShareInfo| s.protocol == "s3";
        let relevant = match change {
            ShareChange::Added(s) | ShareChange::Removed(s) => s3(s),
            ShareChange::Changed { before, after } => s3(before) || s3(after),
        };
        if relevant {
            self.refresh();
        }
    }
}
