//! The emulated-build grammar of `tank bench --emulate`: `7x hdd raidz2 + ssd log + ssd cache`,
//! `1x hdd`, `12x hdd:bw=200M mirror + nvme log`.
//!
//! # Theory of operation
//! Parts are separated by `+`. The first part is the data vdevs:
//! `COUNTx PROFILE [VDEVSxWIDTH] [LAYOUT]` with LAYOUT one of stripe (the default), mirror,
//! raidz, raidz1, raidz2, raidz3. Without VDEVSxWIDTH a mirror layout is pairs and a RAID-Z
//! layout one vdev of all the devices; `24x ssd 3x8 raidz2` is three raidz2 vdevs of eight,
//! `24x ssd 8x3 mirror` eight 3-way mirrors. The other parts are
//! `[COUNTx] PROFILE log|cache|spare`. Profiles are those of `profile.rs`, with overrides.

use crate::profile::DeviceProfile;
use crate::BenchError;

#[derive(Debug, Clone, PartialEq)]
pub struct EmulatedBuild {
    pub count: usize,
    pub profile: DeviceProfile,
    /// "stripe", "mirror", "raidz1", "raidz2", "raidz3".
    pub layout: String,
    /// Devices per vdev (mirror and RAID-Z; `count` for a stripe).
    pub width: usize,
    /// (section, count, profile) for log, cache and spare devices.
    pub extra: Vec<(String, usize, DeviceProfile)>,
}

fn count_and_rest(part: &str) -> Result<(usize, &str), BenchError> {
    let t = part.trim();
    if let Some((n, rest)) = t.split_once(['x', 'X']) {
        if let Ok(n) = n.trim().parse::<usize>() {
            return Ok((n, rest.trim()));
        }
    }
    Ok((1, t))
}

impl EmulatedBuild {
    pub fn parse(spec: &str) -> Result<Self, BenchError> {
        let mut parts = spec.split('+');
        let first = parts.next().unwrap_or("").trim();
        if first.is_empty() {
            return Err(BenchError::Invalid(
                "empty --emulate specification (e.g. \"7x hdd raidz2\")".into(),
            ));
        }
        let (count, rest) = count_and_rest(first)?;
        let words: Vec<&str> = rest.split_whitespace().collect();
        let usage = || {
            BenchError::Invalid(format!(
                "'{first}' is not COUNTx PROFILE [VDEVSxWIDTH] [LAYOUT] (e.g. 7x hdd raidz2, 24x ssd 3x8 raidz2)"
            ))
        };
        let group = |g: &str| -> Result<(usize, usize), BenchError> {
            let (v, w) = g.split_once(['x', 'X']).ok_or_else(usage)?;
            let v: usize = v.parse().map_err(|_| usage())?;
            let w: usize = w.parse().map_err(|_| usage())?;
            if v == 0 || v * w != count {
                return Err(BenchError::Invalid(format!(
                    "{v} vdevs of {w} devices is not the {count} devices given"
                )));
            }
            Ok((v, w))
        };
        let (profile, layout, group) = match words.as_slice() {
            [p] => (DeviceProfile::parse(p)?, "stripe".to_string(), None),
            [p, l] => (DeviceProfile::parse(p)?, l.to_string(), None),
            [p, g, l] => (DeviceProfile::parse(p)?, l.to_string(), Some(group(g)?)),
            _ => return Err(usage()),
        };
        let layout = match layout.as_str() {
            "raidz" => "raidz1".to_string(),
            "stripe" | "mirror" | "raidz1" | "raidz2" | "raidz3" => layout,
            other => {
                return Err(BenchError::Invalid(format!(
                    "unknown layout '{other}' (stripe, mirror, raidz1, raidz2, raidz3)"
                )))
            }
        };
        let min = match layout.as_str() {
            "mirror" => 2,
            "raidz1" => 2,
            "raidz2" => 3,
            "raidz3" => 4,
            _ => 1,
        };
        if count == 0 || count > 64 {
            return Err(BenchError::Invalid(format!(
                "{count} devices: give 1 to 64"
            )));
        }
        let width =
            match (layout.as_str(), group) {
                ("stripe", Some(_)) => return Err(BenchError::Invalid(
                    "a stripe has no vdev groups (give a layout: mirror, raidz1, raidz2, raidz3)"
                        .into(),
                )),
                ("stripe", None) => count,
                (_, Some((_, w))) => w,
                ("mirror", None) => 2,
                (_, None) => count,
            };
        if width < min {
            return Err(BenchError::Invalid(format!(
                "a {layout} vdev of {width} devices: give at least {min}"
            )));
        }
        if layout == "mirror" && group.is_none() && count % 2 != 0 {
            return Err(BenchError::Invalid(
                "a mirror layout needs an even number of devices (pairs)".into(),
            ));
        }
        let mut extra = Vec::new();
        for part in parts {
            let (n, rest) = count_and_rest(part)?;
            let words: Vec<&str> = rest.split_whitespace().collect();
            let [p, section] = words.as_slice() else {
                return Err(BenchError::Invalid(format!(
                    "'{}' is not [COUNTx] PROFILE log|cache|spare",
                    part.trim()
                )));
            };
            if !matches!(*section, "log" | "cache" | "spare") || n == 0 || n > 8 {
                return Err(BenchError::Invalid(format!(
                    "'{}' is not [COUNTx] PROFILE log|cache|spare (1 to 8 devices)",
                    part.trim()
                )));
            }
            extra.push((section.to_string(), n, DeviceProfile::parse(p)?));
        }
        Ok(Self {
            count,
            profile,
            layout,
            width,
            extra,
        })
    }

    /// Share of the data devices' capacity that holds data (before RAID-Z padding).
    pub fn data_fraction(&self) -> f64 {
        let w = self.width as f64;
        match self.layout.as_str() {
            "mirror" => 1.0 / w,
            "raidz1" => (w - 1.0) / w,
            "raidz2" => (w - 2.0) / w,
            "raidz3" => (w - 3.0) / w,
            _ => 1.0,
        }
    }

    /// The data vdevs in the zpool grammar over device names `names` (one per data device).
    pub fn vdev_tokens(&self, names: &[String]) -> Vec<String> {
        if self.layout == "stripe" {
            return names.to_vec();
        }
        let mut tokens = Vec::new();
        for group in names.chunks(self.width) {
            tokens.push(self.layout.clone());
            tokens.extend(group.iter().cloned());
        }
        tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grammar() {
        let b = EmulatedBuild::parse("7x hdd raidz2 + ssd log + ssd cache").unwrap();
        assert_eq!((b.count, b.layout.as_str()), (7, "raidz2"));
        assert_eq!(b.extra.len(), 2);
        assert_eq!(b.extra[0].0, "log");
        assert_eq!(b.width, 7);
        let g = EmulatedBuild::parse("24x ssd 3x8 raidz2").unwrap();
        assert_eq!((g.width, g.layout.as_str()), (8, "raidz2"));
        assert!((g.data_fraction() - 0.75).abs() < 1e-12);
        let names: Vec<String> = (0..24).map(|i| format!("d{i}")).collect();
        let t = g.vdev_tokens(&names);
        assert_eq!(t.iter().filter(|t| *t == "raidz2").count(), 3);
        assert_eq!(t.len(), 27);
        let m3 = EmulatedBuild::parse("24x ssd 8x3 mirror").unwrap();
        assert!((m3.data_fraction() - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(m3.vdev_tokens(&names)[4], "mirror");
        let pairs = EmulatedBuild::parse("12x hdd mirror").unwrap();
        assert_eq!(pairs.width, 2);
        let one = EmulatedBuild::parse("1x hdd").unwrap();
        assert_eq!((one.count, one.layout.as_str()), (1, "stripe"));
        let m = EmulatedBuild::parse("12x hdd:bw=200M mirror + 2x nvme log").unwrap();
        assert_eq!(m.profile.read_bw, 200e6);
        assert_eq!(m.extra[0].1, 2);
        assert!(
            (EmulatedBuild::parse("7x hdd raidz2")
                .unwrap()
                .data_fraction()
                - 5.0 / 7.0)
                .abs()
                < 1e-12
        );
    }

    #[test]
    fn refusals() {
        for bad in [
            "",
            "7x floppy raidz2",
            "2x hdd raidz2",
            "3x hdd mirror",
            "7x hdd raid5",
            "7x hdd raidz2 + ssd",
            "7x hdd raidz2 + ssd l2arc",
            "0x hdd",
            "7x hdd:rpm=0",
            "24x ssd 3x7 raidz2",
            "24x ssd 12x2 stripe",
            "6x ssd 3x2 raidz2",
            "24x ssd axb raidz2",
            "65x hdd",
        ] {
            assert!(EmulatedBuild::parse(bad).is_err(), "{bad} accepted");
        }
    }
}
