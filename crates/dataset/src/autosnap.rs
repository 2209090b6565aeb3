//! Snapshot schedules with retention, as sanoid keeps them: which snapshots are due and which
//! have aged out, at a given time.
//!
//! # Theory of operation
//! A [`Schedule`] keeps, per period (hourly, daily, weekly, monthly), the newest `count`
//! snapshots named `autosnap_YYYY-MM-DD_HH:MM:SS_PERIOD` (UTC), so names sort by time. A
//! period's snapshot is due when none of that period exists since the period's latest
//! boundary (the hour, midnight UTC, Monday 00:00 UTC, the first of the month), and the
//! oldest beyond `count` are destroyed. [`plan`] is pure: given the time and the names that
//! exist it says what to take and what to destroy; the service runs it.

use serde::{Deserialize, Serialize};

/// A dataset's schedule: how many snapshots of each period to keep (0: none taken).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    #[serde(default)]
    pub hourly: u32,
    #[serde(default)]
    pub daily: u32,
    #[serde(default)]
    pub weekly: u32,
    #[serde(default)]
    pub monthly: u32,
    /// Snapshot the dataset's descendants too, atomically (`snapshot -r`).
    #[serde(default)]
    pub recursive: bool,
}

pub const PERIODS: [&str; 4] = ["hourly", "daily", "weekly", "monthly"];
pub const PREFIX: &str = "autosnap_";

impl Schedule {
    pub fn count(&self, period: &str) -> u32 {
        match period {
            "hourly" => self.hourly,
            "daily" => self.daily,
            "weekly" => self.weekly,
            "monthly" => self.monthly,
            _ => 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        PERIODS.iter().all(|p| self.count(p) == 0)
    }
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (Howard Hinnant's
/// `civil_from_days`).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// (year, month, day) to days since 1970-01-01 (`days_from_civil`).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// A snapshot name for `period` taken at `secs` (seconds since 1970, UTC).
pub fn name_at(secs: i64, period: &str) -> String {
    let (y, mo, d) = civil(secs.div_euclid(86_400));
    let s = secs.rem_euclid(86_400);
    format!(
        "{PREFIX}{y:04}-{mo:02}-{d:02}_{:02}:{:02}:{:02}_{period}",
        s / 3600,
        (s / 60) % 60,
        s % 60
    )
}

/// The time a name of ours was taken at, and its period.
pub fn parse_name(name: &str) -> Option<(i64, &str)> {
    let rest = name.strip_prefix(PREFIX)?;
    let (stamp, period) = rest.rsplit_once('_')?;
    if !PERIODS.contains(&period) || stamp.len() != 19 {
        return None;
    }
    let num = |a: usize, b: usize| stamp.get(a..b)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (h, mi, s) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 59 {
        return None;
    }
    let days = days_from_civil(y, mo as u32, d as u32);
    Some((days * 86_400 + h * 3600 + mi * 60 + s, period))
}

/// The latest start of `period` at or before `secs`.
pub fn boundary(secs: i64, period: &str) -> i64 {
    let days = secs.div_euclid(86_400);
    match period {
        "hourly" => secs - secs.rem_euclid(3600),
        "daily" => days * 86_400,
        // 1970-01-01 was a Thursday: Monday is three days later.
        "weekly" => (days - (days + 3).rem_euclid(7)) * 86_400,
        _ => {
            let (y, m, _) = civil(days);
            days_from_civil(y, m, 1) * 86_400
        }
    }
}

/// What is due at `now`: the snapshot names to take (one per period, all with the same
/// time), and those of `existing` (snapshot names of the dataset) to destroy.
pub fn plan(schedule: &Schedule, existing: &[String], now: i64) -> (Vec<String>, Vec<String>) {
    let mut take = Vec::new();
    let mut destroy = Vec::new();
    for period in PERIODS {
        let keep = schedule.count(period) as usize;
        let mut mine: Vec<(i64, &String)> = existing
            .iter()
            .filter_map(|n| {
                parse_name(n)
                    .filter(|(_, p)| *p == period)
                    .map(|(t, _)| (t, n))
            })
            .collect();
        mine.sort();
        let due = keep > 0 && mine.last().is_none_or(|(t, _)| *t < boundary(now, period));
        let mut total = mine.len() + usize::from(due);
        if due {
            take.push(name_at(now, period));
        }
        for (_, n) in &mine {
            if total <= keep {
                break;
            }
            destroy.push((*n).clone());
            total -= 1;
        }
    }
    (take, destroy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sort_by_time() {
        for secs in [0i64, 86_399, 951_782_400, 1_795_814_146, 4_102_444_800] {
            let n = name_at(secs, "daily");
            assert_eq!(parse_name(&n), Some((secs, "daily")), "{n}");
        }
        assert_eq!(
            name_at(1_795_814_146, "hourly"),
            "autosnap_2026-11-27_21:15:46_hourly"
        );
        let a = name_at(1_700_000_000, "hourly");
        let b = name_at(1_800_000_000, "hourly");
        assert!(a < b);
        assert_eq!(parse_name("autosnap_2026-13-01_00:00:00_daily"), None);
        assert_eq!(parse_name("manual"), None);
    }

    #[test]
    fn boundaries() {
        // 2026-11-27 (a Friday) 21:15:46 UTC.
        let t = 1_795_814_146;
        assert_eq!(
            name_at(boundary(t, "hourly"), "x"),
            "autosnap_2026-11-27_21:00:00_x"
        );
        assert_eq!(
            name_at(boundary(t, "daily"), "x"),
            "autosnap_2026-11-27_00:00:00_x"
        );
        assert_eq!(
            name_at(boundary(t, "weekly"), "x"),
            "autosnap_2026-11-23_00:00:00_x"
        );
        assert_eq!(
            name_at(boundary(t, "monthly"), "x"),
            "autosnap_2026-11-01_00:00:00_x"
        );
    }

    #[test]
    fn retention_keeps_the_newest_and_takes_what_is_due() {
        let s = Schedule {
            hourly: 3,
            daily: 1,
            ..Default::default()
        };
        let mut have: Vec<String> = Vec::new();
        let mut t = 1_795_814_146;
        for _ in 0..10 {
            let (take, destroy) = plan(&s, &have, t);
            have.retain(|n| !destroy.contains(n));
            have.extend(take);
            t += 3600;
        }
        let hourly: Vec<_> = have.iter().filter(|n| n.ends_with("_hourly")).collect();
        assert_eq!(hourly.len(), 3);
        assert!(hourly
            .iter()
            .all(|n| parse_name(n).unwrap().0 >= t - 3 * 3600));
        assert_eq!(have.iter().filter(|n| n.ends_with("_daily")).count(), 1);
        // Nothing is due twice in one hour.
        let (take, destroy) = plan(&s, &have, t - 3600 + 60);
        assert!(
            take.is_empty() && destroy.is_empty(),
            "{take:?} {destroy:?}"
        );
        // Other snapshots are never touched.
        have.push("manual".into());
        let (_, destroy) = plan(&Schedule::default(), &have, t);
        assert!(!destroy.contains(&"manual".to_string()));
    }
}
