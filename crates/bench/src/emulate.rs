//! The emulated-build grammar of `tank bench --emulate`: `7x hdd raidz2 + ssd log + ssd cache`,
//! `1x hdd`, `12x hdd:bw=200M mirror + nvme log`.
//!
//! # Theory of operation
//! Parts are separated by `+`. The first part is the data vdevs: `COUNTx PROFILE [LAYOUT]`
//! with LAYOUT one of stripe (the default), mirror (pairs), raidz, raidz1, raidz2, raidz3 (one
//! vdev of all the devices). The other parts are `[COUNTx] PROFILE log|cache|spare`. Profiles
//! are those of `profile.rs`, with overrides.

use crate::profile::DeviceProfile;
use crate::BenchError;

#[derive(Debug, Clone, PartialEq)]
pub struct EmulatedBuild {
    pub count: usize,
    pub profile: DeviceProfile,
    /// "stripe", "mirror", "raidz1", "raidz2", "raidz3".
    pub layout: String,
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
        let (profile, layout) = match words.as_slice() {
            [p] => (DeviceProfile::parse(p)?, "stripe".to_string()),
            [p, l] => (DeviceProfile::parse(p)?, l.to_string()),
            _ => {
                return Err(BenchError::Invalid(format!(
                    "'{first}' is not COUNTx PROFILE [LAYOUT] (e.g. 7x hdd raidz2)"
                )))
            }
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
        if count < min || count > 64 {
            return Err(BenchError::Invalid(format!(
                "{layout} of {count} devices: give {min} to 64"
            )));
        }
        if layout == "mirror" && count % 2 != 0 {
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
            extra,
        })
    }

    /// Share of the data devices' capacity that holds data (before RAID-Z padding).
    pub fn data_fraction(&self) -> f64 {
        match self.layout.as_str() {
            "mirror" => 0.5,
            "raidz1" => (self.count - 1) as f64 / self.count as f64,
            "raidz2" => (self.count - 2) as f64 / self.count as f64,
            "raidz3" => (self.count - 3) as f64 / self.count as f64,
            _ => 1.0,
        }
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
        ] {
            assert!(EmulatedBuild::parse(bad).is_err(), "{bad} accepted");
        }
    }
}
