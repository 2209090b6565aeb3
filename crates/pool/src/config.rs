//! The pool configuration stored in every label: name, guids, state, and the vdev tree.
//!
//! # Theory of operation
//! The configuration is a small JSON document (docs/FORMAT.md §"Label config") so that it
//! stays readable with `tank debug label` and extensible by adding fields. It is written to
//! all four labels of every member at create, import, export and whenever the vdev tree
//! changes, with its own `txg`: on import the copy with the highest `txg` wins.

use serde::{Deserialize, Serialize};

/// On-disk format version of tank pools (labels, uberblocks, blocks). docs/FORMAT.md.
pub const FORMAT_VERSION: u32 = 1;

/// Feature flags this build can read. A pool whose label lists a feature not here is refused
/// at import, naming the feature (`unsupported_features`).
pub const SUPPORTED_FEATURES: &[&str] =
    &["spacemap_log", "cow_btree", "raidz_rs", FEATURE_INTENT_LOG];

/// The features every pool has from its creation on.
pub const CREATE_FEATURES: &[&str] = &["spacemap_log", "cow_btree", "raidz_rs"];

/// Listed in the labels while the intent log may hold records that import must replay: from
/// before the first log block a process writes until the pool is closed cleanly (every record
/// then belongs to a committed txg). A build that does not know it refuses the import instead
/// of losing writes acknowledged to fsync (docs/FORMAT.md §13).
pub const FEATURE_INTENT_LOG: &str = "intent_log";

/// What each feature means, for the refusal of a pool that lists one this build lacks.
pub fn feature_meaning(feature: &str) -> &'static str {
    match feature {
        FEATURE_INTENT_LOG => {
            "its intent log holds synchronous writes that must be replayed at import"
        }
        "spacemap_log" => "space maps kept as a log",
        "cow_btree" => "copy-on-write B+tree object sets",
        "raidz_rs" => "RAID-Z parity",
        _ => "written by a newer build",
    }
}

/// The features of `config` that are not in `supported`.
pub fn unsupported_features<'a>(config: &'a PoolConfig, supported: &[&str]) -> Vec<&'a str> {
    config
        .features
        .iter()
        .map(String::as_str)
        .filter(|f| !supported.contains(f))
        .collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolState {
    Active,
    Exported,
    Destroyed,
}

impl PoolState {
    pub fn name(self) -> &'static str {
        match self {
            Self::Active => "ACTIVE",
            Self::Exported => "EXPORTED",
            Self::Destroyed => "DESTROYED",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VdevClass {
    Normal,
    Log,
    Cache,
    Spare,
    Special,
}

impl VdevClass {
    pub fn section(self) -> Option<&'static str> {
        match self {
            Self::Normal => None,
            Self::Log => Some("logs"),
            Self::Cache => Some("cache"),
            Self::Spare => Some("spares"),
            Self::Special => Some("special"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TopKind {
    Disk,
    Mirror,
    Raidz,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeafConfig {
    pub guid: u64,
    pub path: String,
    /// Taken offline by the administrator (stays so across export and import).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub offline: bool,
    /// This slot is served by a hot spare (whose guid and path the entry then carries); the
    /// guid and path of the failed device it stands in for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spare_for: Option<(u64, String)>,
    /// Txgs [first, last] whose blocks the device lacks until a resilver finishes (its dirty
    /// time log, kept here because a device being rebuilt receives uberblocks again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtl: Option<(u64, u64)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopConfig {
    pub id: u32,
    pub guid: u64,
    pub class: VdevClass,
    pub kind: TopKind,
    #[serde(default)]
    pub parity: u8,
    pub children: Vec<LeafConfig>,
    /// Bytes of data area of each child when it differs from the pool's `leaf_asize`: log
    /// and cache devices (usually SSDs) are used at their own size. 0: `leaf_asize`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub asize: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolConfig {
    pub version: u32,
    pub name: String,
    pub guid: u64,
    pub state: PoolState,
    pub hostname: String,
    /// Txg at which this configuration was written.
    pub txg: u64,
    pub create_time: u64,
    pub features: Vec<String>,
    pub ashift: u32,
    /// Usable bytes of every leaf's data area (the smallest member's).
    pub leaf_asize: u64,
    pub vdevs: Vec<TopConfig>,
    /// Guid sums of the configurations before the last device changes (replace, attach,
    /// detach, a hot spare): uberblocks written before a change carry one of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prev_guid_sums: Vec<u64>,
    /// The `autoreplace` pool property: a blank device found where a missing one was is
    /// put in its place (and resilvered).
    #[serde(default)]
    pub autoreplace: bool,
    /// The hostid of the host that last imported the pool (0: written before it was kept).
    #[serde(default)]
    pub hostid: u32,
    /// The tank instance (one per data directory) that last imported the pool (0: unknown).
    #[serde(default)]
    pub instance: u64,
    /// The `multihost` pool property: the importer writes a heartbeat to the labels and an
    /// import first watches for one (`mmp.rs`), for devices other machines can reach.
    #[serde(default)]
    pub multihost: bool,
}

impl PoolConfig {
    /// Whether the labels say `host` is who last imported the pool. Fields written as 0
    /// (older labels, or a caller that has no instance) are not compared.
    pub fn imported_by(&self, host: &HostIdentity) -> bool {
        self.hostname == host.hostname
            && (self.hostid == 0 || self.hostid == host.hostid)
            && (self.instance == 0 || host.instance == 0 || self.instance == host.instance)
    }
}

/// Who imports a pool: the host, by name and 32-bit hostid as ZFS knows it, and the tank
/// instance on it (one per data directory; 0 for a caller that has none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostIdentity {
    pub hostname: String,
    pub hostid: u32,
    pub instance: u64,
}

impl HostIdentity {
    /// This host, with no instance.
    pub fn this_host() -> Self {
        Self {
            hostname: hostname(),
            hostid: hostid(),
            instance: 0,
        }
    }

    /// This host, as the instance `instance`.
    pub fn instance(instance: u64) -> Self {
        Self {
            instance,
            ..Self::this_host()
        }
    }
}

impl Default for HostIdentity {
    fn default() -> Self {
        Self::this_host()
    }
}

/// This host's 32-bit hostid, as `hostid(1)` prints it: `/etc/hostid` (which `zgenhostid`
/// writes) when it exists, else the first 32 bits of `/etc/machine-id`, else a hash of the
/// host name. Never 0 (0 means "not recorded" in the labels).
pub fn hostid() -> u32 {
    let from_file = std::fs::read("/etc/hostid")
        .ok()
        .and_then(|b| {
            b.get(..4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        })
        .filter(|&id| id != 0);
    let from_machine_id = || {
        std::fs::read_to_string("/etc/machine-id")
            .ok()
            .and_then(|s| s.get(..8).and_then(|h| u32::from_str_radix(h, 16).ok()))
            .filter(|&id| id != 0)
    };
    let from_name = || {
        let h = crc32c::crc32c(hostname().as_bytes());
        h.max(1)
    };
    from_file.or_else(from_machine_id).unwrap_or_else(from_name)
}

impl TopConfig {
    /// The data-area size of this vdev's children.
    pub fn leaf_asize(&self, pool_leaf_asize: u64) -> u64 {
        if self.asize > 0 {
            self.asize
        } else {
            pool_leaf_asize
        }
    }
}

impl PoolConfig {
    pub fn leaves(&self) -> impl Iterator<Item = (&TopConfig, &LeafConfig)> {
        self.vdevs
            .iter()
            .flat_map(|t| t.children.iter().map(move |l| (t, l)))
    }

    /// Sum of all leaf guids, recorded in uberblocks to tell pools apart.
    pub fn guid_sum(&self) -> u64 {
        self.leaves()
            .fold(self.guid, |acc, (_, l)| acc.wrapping_add(l.guid))
    }

    /// Changes the devices with `f`, remembering the guid sum before (the last eight).
    pub fn change_devices(&mut self, f: impl FnOnce(&mut PoolConfig)) {
        let before = self.guid_sum();
        f(self);
        if self.guid_sum() != before {
            self.prev_guid_sums.push(before);
            let excess = self.prev_guid_sums.len().saturating_sub(8);
            self.prev_guid_sums.drain(..excess);
        }
    }

    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("config serializes")
    }

    pub fn from_json(raw: &[u8]) -> Result<Self, String> {
        let cfg: PoolConfig = serde_json::from_slice(raw).map_err(|e| e.to_string())?;
        if cfg.version != FORMAT_VERSION {
            return Err(format!(
                "pool format version {} is not supported (this build reads {FORMAT_VERSION})",
                cfg.version
            ));
        }
        // Features are checked at import (`unsupported_features`), so that a pool using one
        // this build lacks is still found and refused with its name rather than not seen.
        if !(9..=16).contains(&cfg.ashift) {
            return Err(format!("invalid ashift {}", cfg.ashift));
        }
        // Ids ascend; a removed log, cache or spare vdev leaves its id unused (a hole).
        let mut next = 0u32;
        for (i, t) in cfg.vdevs.iter().enumerate() {
            let ok = t.id >= next;
            next = t.id.saturating_add(1);
            if !ok || t.id > 1 << 16 || t.children.is_empty() {
                return Err(format!("invalid vdev {i} in config"));
            }
            if t.kind == TopKind::Raidz
                && (!(1..=3).contains(&t.parity) || t.children.len() < usize::from(t.parity) + 1)
            {
                return Err(format!("invalid raidz vdev {i} in config"));
            }
        }
        Ok(cfg)
    }
}

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
