//! The zpool vdev grammar: `[mirror|raidz|raidz1|raidz2|raidz3] DEV... [log ...] [cache ...]
//! [spare ...] [special ...]`.
//!
//! # Theory of operation
//! Tokens are read left to right. A group keyword starts a new top-level vdev that takes every
//! following device up to the next keyword; a plain device outside a group is a top-level
//! vdev of its own. `log`, `cache`, `spare` and `special` switch the section. The rules follow
//! zpool: a mirror needs 2 devices, raidzN needs N+1 (at most 255), cache and spare devices are
//! plain disks, no device may be named twice, and mixing replication levels among the data
//! vdevs needs `-f`.

use crate::PoolError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VdevSpec {
    Disk(String),
    Mirror(Vec<String>),
    Raidz { parity: u8, devices: Vec<String> },
}

impl VdevSpec {
    pub fn devices(&self) -> Vec<&String> {
        match self {
            Self::Disk(d) => vec![d],
            Self::Mirror(d) | Self::Raidz { devices: d, .. } => d.iter().collect(),
        }
    }

    /// The replication level as zpool compares it ("disk", "mirror", "raidz2").
    pub fn replication(&self) -> String {
        match self {
            Self::Disk(_) => "disk".into(),
            Self::Mirror(d) => format!("{}-way mirror", d.len()),
            Self::Raidz { parity, .. } => format!("raidz{parity}"),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolSpec {
    pub data: Vec<VdevSpec>,
    pub log: Vec<VdevSpec>,
    pub cache: Vec<String>,
    pub spare: Vec<String>,
    pub special: Vec<VdevSpec>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Section {
    Data,
    Log,
    Cache,
    Spare,
    Special,
}

fn group_keyword(tok: &str) -> Option<Option<u8>> {
    match tok {
        "mirror" => Some(None),
        "raidz" | "raidz1" => Some(Some(1)),
        "raidz2" => Some(Some(2)),
        "raidz3" => Some(Some(3)),
        _ => None,
    }
}

impl PoolSpec {
    /// Parses the vdev part of `pool create`. `force` allows mixed replication levels.
    pub fn parse(tokens: &[String], force: bool) -> Result<Self, PoolError> {
        Self::parse_inner(tokens, force, true)
    }

    /// The grammar of `zpool add`: the same, but data vdevs are optional (`cache DEV`,
    /// `log mirror A B`, `spare DEV` alone are valid).
    pub fn parse_add(tokens: &[String], force: bool) -> Result<Self, PoolError> {
        let spec = Self::parse_inner(tokens, force, false)?;
        if spec.all_devices().is_empty() {
            return Err(PoolError::InvalidSpec(
                "invalid vdev specification: no devices to add".into(),
            ));
        }
        Ok(spec)
    }

    fn parse_inner(tokens: &[String], force: bool, need_data: bool) -> Result<Self, PoolError> {
        let mut spec = PoolSpec::default();
        let mut section = Section::Data;
        let mut i = 0;
        let bad = |msg: String| Err(PoolError::InvalidSpec(msg));
        while i < tokens.len() {
            let tok = tokens[i].as_str();
            match tok {
                "log" | "cache" | "spare" | "special" => {
                    section = match tok {
                        "log" => Section::Log,
                        "cache" => Section::Cache,
                        "spare" => Section::Spare,
                        _ => Section::Special,
                    };
                    i += 1;
                    if i >= tokens.len()
                        || matches!(tokens[i].as_str(), "log" | "cache" | "spare" | "special")
                    {
                        return bad(format!("'{tok}' must be followed by at least one device"));
                    }
                    continue;
                }
                _ => {}
            }
            if let Some(group) = group_keyword(tok) {
                let mut devices = Vec::new();
                i += 1;
                while i < tokens.len()
                    && group_keyword(&tokens[i]).is_none()
                    && !matches!(tokens[i].as_str(), "log" | "cache" | "spare" | "special")
                {
                    devices.push(tokens[i].clone());
                    i += 1;
                }
                let vdev = match group {
                    None => {
                        if devices.len() < 2 {
                            return bad(format!(
                                "invalid vdev specification: mirror requires at least 2 devices, got {}",
                                devices.len()
                            ));
                        }
                        VdevSpec::Mirror(devices)
                    }
                    Some(parity) => {
                        let min = usize::from(parity) + 1;
                        if devices.len() < min {
                            return bad(format!(
                                "invalid vdev specification: raidz{parity} requires at least {min} devices, got {}",
                                devices.len()
                            ));
                        }
                        if devices.len() > 255 {
                            return bad(
                                "invalid vdev specification: raidz allows at most 255 devices"
                                    .into(),
                            );
                        }
                        VdevSpec::Raidz { parity, devices }
                    }
                };
                match section {
                    Section::Data => spec.data.push(vdev),
                    Section::Special => spec.special.push(vdev),
                    Section::Log => match vdev {
                        VdevSpec::Raidz { .. } => {
                            return bad(
                                "invalid vdev specification: log devices cannot be raidz".into()
                            )
                        }
                        v => spec.log.push(v),
                    },
                    Section::Cache | Section::Spare => {
                        let name = if section == Section::Cache {
                            "cache"
                        } else {
                            "spare"
                        };
                        return bad(format!(
                            "invalid vdev specification: {name} devices must be plain disks, not {tok}"
                        ));
                    }
                }
                continue;
            }
            if tok.is_empty() || tok.starts_with('-') {
                return bad(format!("invalid device name '{tok}'"));
            }
            let dev = tok.to_string();
            match section {
                Section::Data => spec.data.push(VdevSpec::Disk(dev)),
                Section::Log => spec.log.push(VdevSpec::Disk(dev)),
                Section::Special => spec.special.push(VdevSpec::Disk(dev)),
                Section::Cache => spec.cache.push(dev),
                Section::Spare => spec.spare.push(dev),
            }
            i += 1;
        }
        if need_data && spec.data.is_empty() {
            return bad("invalid vdev specification: at least one data vdev is required".into());
        }
        let mut seen = std::collections::HashSet::new();
        for d in spec.all_devices() {
            if !seen.insert(d.clone()) {
                return bad(format!("device '{d}' is named more than once"));
            }
        }
        if let (false, Some(v)) = (force, spec.data.first()) {
            let first = v.replication();
            if let Some(other) = spec.data.iter().find(|v| v.replication() != first) {
                return bad(format!(
                    "mismatched replication level: both {first} and {} vdevs are present (use -f to override)",
                    other.replication()
                ));
            }
        }
        Ok(spec)
    }

    pub fn all_devices(&self) -> Vec<String> {
        let mut out = Vec::new();
        for v in self.data.iter().chain(&self.log).chain(&self.special) {
            out.extend(v.devices().into_iter().cloned());
        }
        out.extend(self.cache.iter().cloned());
        out.extend(self.spare.iter().cloned());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<PoolSpec, PoolError> {
        let toks: Vec<String> = s.split_whitespace().map(String::from).collect();
        PoolSpec::parse(&toks, false)
    }

    #[test]
    fn zpool_grammar() {
        let s = p("raidz2 d1 d2 d3 d4 d5 d6 d7 log s1 cache s2").unwrap();
        assert_eq!(s.data.len(), 1);
        assert!(matches!(&s.data[0], VdevSpec::Raidz { parity: 2, devices } if devices.len() == 7));
        assert_eq!(s.log, vec![VdevSpec::Disk("s1".into())]);
        assert_eq!(s.cache, vec!["s2".to_string()]);
        let s = p("mirror a b mirror c d mirror e f spare g").unwrap();
        assert_eq!(s.data.len(), 3);
        assert_eq!(s.spare, vec!["g".to_string()]);
        let s = p("a b c").unwrap();
        assert_eq!(s.data.len(), 3);
        let s = p("mirror a b log mirror c d special mirror e f").unwrap();
        assert_eq!(s.log.len(), 1);
        assert_eq!(s.special.len(), 1);
    }

    #[test]
    fn refusals() {
        assert!(p("raidz2 a b")
            .unwrap_err()
            .to_string()
            .contains("at least 3"));
        assert!(p("raidz3 a b c").is_err());
        assert!(p("mirror a").is_err());
        assert!(p("a a").unwrap_err().to_string().contains("more than once"));
        assert!(p("log a").is_err());
        assert!(p("").is_err());
        assert!(p("a cache mirror b c").is_err());
        assert!(p("a log raidz b c").is_err());
        assert!(p("mirror a b c").is_ok());
        assert!(p("mirror a b raidz c d e")
            .unwrap_err()
            .to_string()
            .contains("-f"));
        let toks: Vec<String> = "mirror a b raidz c d e"
            .split(' ')
            .map(String::from)
            .collect();
        assert!(PoolSpec::parse(&toks, true).is_ok());
        assert!(p("a log").is_err());
    }
}
