//! Dataset properties: the table of every property (its type, default, whether it is
//! inherited, which dataset kinds have it), parsing and validation of values, and their
//! display in ZFS's words.
//!
//! # Theory of operation
//! A dataset record stores only its *local* properties as text, already normalized
//! (`parse` turns "128k" into "131072", "on" for compression into "lz4"). The effective
//! value of an inheritable property is the first local value found walking up the
//! parents, else the default; its source is "local", "inherited from NAME" or "default"
//! (resolved in `dsl.rs`, which knows the tree). Read-only properties (used, referenced...)
//! are computed from the accounting and are never stored.

use tank_block::{ChecksumKind, Compression};

use crate::posix::{DirectMode, SyncMode};

/// What a property holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PropType {
    /// Bytes, written with suffixes (K, M, G, T, P), "none" meaning 0 where allowed.
    Size,
    /// on | off.
    Bool,
    /// One of a fixed set of words.
    Enum(&'static [&'static str]),
    /// A path or "none"/"legacy".
    Path,
    Number,
    Text,
}

/// Which kinds of dataset have the property.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applies {
    All,
    Filesystem,
    Volume,
}

#[derive(Debug, Clone, Copy)]
pub struct PropDef {
    pub name: &'static str,
    pub ty: PropType,
    /// The default, in normalized form ("-" for read-only properties).
    pub default: &'static str,
    pub inherit: bool,
    pub readonly: bool,
    pub applies: Applies,
    /// Settable only when the dataset is created (volblocksize).
    pub create_only: bool,
}

const fn editable(
    name: &'static str,
    ty: PropType,
    default: &'static str,
    inherit: bool,
    applies: Applies,
) -> PropDef {
    PropDef {
        name,
        ty,
        default,
        inherit,
        readonly: false,
        applies,
        create_only: false,
    }
}

const fn computed(name: &'static str, ty: PropType) -> PropDef {
    PropDef {
        name,
        ty,
        default: "-",
        inherit: false,
        readonly: true,
        applies: Applies::All,
        create_only: false,
    }
}

pub const COMPRESSION_WORDS: &[&str] = &[
    "on", "off", "lz4", "zstd", "zstd-1", "zstd-2", "zstd-3", "zstd-4", "zstd-5", "zstd-6",
    "zstd-7", "zstd-8", "zstd-9", "zstd-10", "zstd-11", "zstd-12", "zstd-13", "zstd-14", "zstd-15",
    "zstd-16", "zstd-17", "zstd-18", "zstd-19",
];
pub const CHECKSUM_WORDS: &[&str] = &["on", "blake3", "xxh128", "sha256"];

/// Every property, in the order `get all` shows them (ZFS's order, roughly).
pub const PROPS: &[PropDef] = &[
    computed("type", PropType::Text),
    computed("creation", PropType::Number),
    computed("used", PropType::Size),
    computed("available", PropType::Size),
    computed("referenced", PropType::Size),
    computed("compressratio", PropType::Text),
    editable("quota", PropType::Size, "0", false, Applies::Filesystem),
    editable("reservation", PropType::Size, "0", false, Applies::All),
    editable(
        "recordsize",
        PropType::Size,
        "131072",
        true,
        Applies::Filesystem,
    ),
    editable(
        "mountpoint",
        PropType::Path,
        "none",
        true,
        Applies::Filesystem,
    ),
    editable(
        "checksum",
        PropType::Enum(CHECKSUM_WORDS),
        "blake3",
        true,
        Applies::All,
    ),
    editable(
        "compression",
        PropType::Enum(COMPRESSION_WORDS),
        "lz4",
        true,
        Applies::All,
    ),
    editable("atime", PropType::Bool, "on", true, Applies::Filesystem),
    editable("readonly", PropType::Bool, "off", true, Applies::All),
    editable(
        "copies",
        PropType::Enum(&["1", "2", "3"]),
        "1",
        true,
        Applies::All,
    ),
    editable("refquota", PropType::Size, "0", false, Applies::Filesystem),
    editable("refreservation", PropType::Size, "0", false, Applies::All),
    editable(
        "primarycache",
        PropType::Enum(&["all", "metadata", "none"]),
        "all",
        true,
        Applies::All,
    ),
    editable(
        "sync",
        PropType::Enum(&["standard", "always", "disabled"]),
        "standard",
        true,
        Applies::All,
    ),
    editable(
        "direct",
        PropType::Enum(&["disabled", "standard", "always"]),
        "standard",
        true,
        Applies::Filesystem,
    ),
    editable("volsize", PropType::Size, "0", false, Applies::Volume),
    PropDef {
        name: "volblocksize",
        ty: PropType::Size,
        default: "16384",
        inherit: false,
        readonly: false,
        applies: Applies::Volume,
        create_only: true,
    },
    computed("usedbysnapshots", PropType::Size),
    computed("usedbydataset", PropType::Size),
    computed("usedbychildren", PropType::Size),
    computed("usedbyrefreservation", PropType::Size),
    computed("logicalused", PropType::Size),
    computed("logicalreferenced", PropType::Size),
    computed("written", PropType::Size),
    computed("origin", PropType::Text),
    computed("guid", PropType::Text),
    computed("receive_resume_token", PropType::Text),
    computed("refcompressratio", PropType::Text),
    computed("mounted", PropType::Text),
];

impl PropDef {
    /// Whether datasets of `kind` have this property (a snapshot has the `All` ones).
    pub fn applies_to(&self, kind: crate::dsl::DatasetKind) -> bool {
        use crate::dsl::DatasetKind;
        match self.applies {
            Applies::All => true,
            Applies::Filesystem => kind == DatasetKind::Filesystem,
            Applies::Volume => kind == DatasetKind::Volume,
        }
    }
}

pub fn lookup(name: &str) -> Option<&'static PropDef> {
    PROPS.iter().find(|p| p.name == name)
}

/// Parses "4K", "1.5G", "1048576", "none" (= 0 where `allow_none`). Suffixes are binary
/// (K = 1024), as in ZFS; a trailing "B" or "iB" is accepted.
pub fn parse_size(text: &str, allow_none: bool) -> Result<u64, String> {
    let t = text.trim();
    if allow_none && t.eq_ignore_ascii_case("none") {
        return Ok(0);
    }
    let upper = t.to_ascii_uppercase();
    let stripped = upper
        .strip_suffix("IB")
        .or_else(|| upper.strip_suffix('B'))
        .unwrap_or(&upper);
    let (num, mult) = match stripped.chars().last() {
        Some(c @ ('K' | 'M' | 'G' | 'T' | 'P' | 'E')) => {
            let shift = match c {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                'P' => 50,
                _ => 60,
            };
            (&stripped[..stripped.len() - 1], 1u64 << shift)
        }
        _ => (stripped, 1),
    };
    let bad = || format!("'{text}' is not a size (use e.g. 512, 128K, 1.5G)");
    if num.is_empty() {
        return Err(bad());
    }
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(mult).ok_or_else(bad);
    }
    let f: f64 = num.parse().map_err(|_| bad())?;
    if !f.is_finite() || f < 0.0 {
        return Err(bad());
    }
    let v = f * mult as f64;
    if v >= u64::MAX as f64 {
        return Err(bad());
    }
    Ok(v.round() as u64)
}

/// Validates and normalizes `value` for property `def` (the stored form).
pub fn parse(def: &PropDef, value: &str) -> Result<String, String> {
    let name = def.name;
    if def.readonly {
        return Err(format!("property '{name}' is read-only"));
    }
    match def.ty {
        PropType::Size => {
            let allow_none = matches!(
                name,
                "quota" | "refquota" | "reservation" | "refreservation"
            );
            let v = parse_size(value, allow_none)
                .map_err(|e| format!("bad value for property '{name}': {e}"))?;
            let pow2_in = |lo: u64, hi: u64| (lo..=hi).contains(&v) && v.is_power_of_two();
            match name {
                "recordsize" if !pow2_in(512, 1 << 20) => {
                    return Err(format!(
                        "bad value for property 'recordsize': {value} must be a power of two from 512 to 1M"
                    ));
                }
                "volblocksize" if !pow2_in(512, 128 << 10) => {
                    return Err(format!(
                        "bad value for property 'volblocksize': {value} must be a power of two from 512 to 128K"
                    ));
                }
                "volsize" if v == 0 => {
                    return Err("bad value for property 'volsize': must be more than 0".into());
                }
                _ => {}
            }
            Ok(v.to_string())
        }
        PropType::Bool => match value {
            "on" | "off" => Ok(value.to_string()),
            _ => Err(format!(
                "bad value for property '{name}': '{value}' (use on or off)"
            )),
        },
        PropType::Enum(words) => {
            if !words.contains(&value) {
                let hint = if name == "checksum" && value == "off" {
                    " (tank never turns checksums off: every block is verified)".to_string()
                } else {
                    String::new()
                };
                return Err(format!(
                    "bad value for property '{name}': '{value}' (use one of {}){hint}",
                    words.join(", ")
                ));
            }
            Ok(match (name, value) {
                ("compression", "on") => "lz4".to_string(),
                ("checksum", "on") => "blake3".to_string(),
                _ => value.to_string(),
            })
        }
        PropType::Path => {
            if value == "none" || value == "legacy" {
                return Ok(value.to_string());
            }
            if !value.starts_with('/') {
                return Err(format!(
                    "bad value for property '{name}': '{value}' must be an absolute path, none or legacy"
                ));
            }
            if value.contains('\0') || value.split('/').any(|c| c == "..") {
                return Err(format!(
                    "bad value for property '{name}': '{value}' is not a clean path"
                ));
            }
            let trimmed = value.trim_end_matches('/');
            Ok(if trimmed.is_empty() {
                "/".to_string()
            } else {
                trimmed.to_string()
            })
        }
        PropType::Number | PropType::Text => Ok(value.to_string()),
    }
}

/// Human form of a byte count, as zfs list prints it (1.50G, 128K, 0B).
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "K", "M", "G", "T", "P", "E"];
    if bytes < 1024 {
        return format!("{bytes}B");
    }
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if v < 10.0 {
        format!("{v:.2}{}", UNITS[u])
    } else if v < 100.0 {
        format!("{v:.1}{}", UNITS[u])
    } else {
        format!("{v:.0}{}", UNITS[u])
    }
}

/// The display form of a stored value (sizes in human form unless `exact`).
pub fn display(def: &PropDef, stored: &str, exact: bool) -> String {
    match (def.ty, def.name) {
        (PropType::Size, "quota" | "refquota" | "reservation" | "refreservation")
            if stored == "0" =>
        {
            "none".to_string()
        }
        (PropType::Size, _) if !exact => stored.parse::<u64>().map_or(stored.to_string(), human),
        _ => stored.to_string(),
    }
}

pub fn compression_of(stored: &str) -> Compression {
    match stored {
        "off" => Compression::Off,
        "zstd" => Compression::Zstd(3),
        s => match s.strip_prefix("zstd-").and_then(|l| l.parse::<u8>().ok()) {
            Some(level) => Compression::Zstd(level),
            None => Compression::Lz4,
        },
    }
}

pub fn checksum_of(stored: &str) -> ChecksumKind {
    match stored {
        "xxh128" => ChecksumKind::Xxh128,
        "sha256" => ChecksumKind::Sha256,
        _ => ChecksumKind::Blake3,
    }
}

pub fn sync_of(stored: &str) -> SyncMode {
    match stored {
        "always" => SyncMode::Always,
        "disabled" => SyncMode::Disabled,
        _ => SyncMode::Standard,
    }
}

pub fn direct_of(stored: &str) -> DirectMode {
    match stored {
        "always" => DirectMode::Always,
        "disabled" => DirectMode::Disabled,
        _ => DirectMode::Standard,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_as_zfs_does() {
        assert_eq!(parse_size("128K", false).unwrap(), 131072);
        assert_eq!(parse_size("1.5G", false).unwrap(), 3 << 29);
        assert_eq!(parse_size("1MiB", false).unwrap(), 1 << 20);
        assert_eq!(parse_size("none", true).unwrap(), 0);
        assert!(parse_size("none", false).is_err());
        assert!(parse_size("12Q", false).is_err());
        assert!(parse_size("-1", false).is_err());
        assert!(parse_size("99999999999E", false).is_err());
    }

    #[test]
    fn values_are_validated_and_normalized() {
        let rs = lookup("recordsize").unwrap();
        assert_eq!(parse(rs, "1M").unwrap(), "1048576");
        assert!(parse(rs, "2M").is_err());
        assert!(parse(rs, "3K").is_err());
        assert!(parse(rs, "256").is_err());
        let c = lookup("compression").unwrap();
        assert_eq!(parse(c, "on").unwrap(), "lz4");
        assert!(parse(c, "gzip-11").is_err());
        let ck = lookup("checksum").unwrap();
        assert!(parse(ck, "off").unwrap_err().contains("never"));
        let mp = lookup("mountpoint").unwrap();
        assert_eq!(parse(mp, "/mnt/a/").unwrap(), "/mnt/a");
        assert!(parse(mp, "relative").is_err());
        assert!(parse(mp, "/a/../b").is_err());
        assert!(parse(lookup("used").unwrap(), "1").is_err());
        assert!(parse(lookup("atime").unwrap(), "yes").is_err());
        assert!(parse(lookup("copies").unwrap(), "4").is_err());
        let d = lookup("direct").unwrap();
        assert_eq!(parse(d, "always").unwrap(), "always");
        assert!(parse(d, "on").is_err());
        assert_eq!(direct_of("always"), DirectMode::Always);
        assert_eq!(direct_of(d.default), DirectMode::Standard);
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(0), "0B");
        assert_eq!(human(131072), "128K");
        assert_eq!(human(1536 << 20), "1.50G");
    }
}
