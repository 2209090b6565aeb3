//! Previous Versions on a schedule: an smb share's `snapshot_schedule`.
//!
//! # Theory of operation
//! A share with `previous_versions=on` and `snapshot_schedule=INTERVAL:KEEP` has its dataset
//! snapshotted once in each interval (15 minutes, an hour, a day, a week, counted in UTC
//! from the epoch, so an hourly snapshot falls on the hour), named as Previous Versions read
//! them: `GMT-YYYY.MM.DD-HH.MM.SS`, the UTC time it was taken. After taking one, the oldest
//! snapshots of that form beyond KEEP are destroyed; other snapshots are never touched.
//! [`plan`] decides both from the clock and the snapshots there are (pure, unit-tested);
//! the SMB supervisor calls [`run`] on every tick, so a schedule added or a daemon started
//! after a missed interval takes its snapshot at once.

use tank_service::api::{Request, Response};
use tank_service::{Caller, Service};

/// The name of the snapshot taken at `unix` seconds (UTC), as shadow_copy2 reads it.
pub fn name_at(unix: i64) -> Option<String> {
    let t = time::OffsetDateTime::from_unix_timestamp(unix).ok()?;
    Some(format!(
        "GMT-{:04}.{:02}.{:02}-{:02}.{:02}.{:02}",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    ))
}

/// The UTC time (unix seconds) a snapshot name of the Previous Versions form stands for.
pub fn time_of(name: &str) -> Option<i64> {
    let rest = name.strip_prefix("GMT-")?;
    let (date, clock) = rest.split_once('-')?;
    let num = |s: &str| s.parse::<i64>().ok();
    let d: Vec<i64> = date.split('.').map(num).collect::<Option<_>>()?;
    let c: Vec<i64> = clock.split('.').map(num).collect::<Option<_>>()?;
    if d.len() != 3 || c.len() != 3 || date.len() != 10 || clock.len() != 8 {
        return None;
    }
    let month = time::Month::try_from(u8::try_from(d[1]).ok()?).ok()?;
    let date =
        time::Date::from_calendar_date(i32::try_from(d[0]).ok()?, month, u8::try_from(d[2]).ok()?)
            .ok()?;
    let clock = time::Time::from_hms(
        u8::try_from(c[0]).ok()?,
        u8::try_from(c[1]).ok()?,
        u8::try_from(c[2]).ok()?,
    )
    .ok()?;
    Some(
        time::PrimitiveDateTime::new(date, clock)
            .assume_utc()
            .unix_timestamp(),
    )
}

/// What a schedule asks for now.
#[derive(Debug, PartialEq, Eq)]
pub struct Plan {
    /// A snapshot to take, at this time.
    pub take: Option<i64>,
    /// Snapshots (times) to destroy, oldest first.
    pub destroy: Vec<i64>,
}

/// Given the time `now`, the interval `every` (seconds), `keep` and the times of the
/// snapshots of the Previous Versions form there are: take one unless one exists in the
/// current interval; destroy the oldest beyond `keep` (counting the one to take).
pub fn plan(now: i64, every: u64, keep: usize, existing: &[i64]) -> Plan {
    let every = i64::try_from(every.max(1)).unwrap_or(i64::MAX);
    let start = now - now.rem_euclid(every);
    let mut times: Vec<i64> = existing.to_vec();
    times.sort_unstable();
    times.dedup();
    let take = (!times.iter().any(|t| *t >= start && *t <= now)).then_some(now);
    if let Some(t) = take {
        times.push(t);
    }
    let extra = times.len().saturating_sub(keep.max(1));
    let destroy = times
        .into_iter()
        .take(extra)
        .filter(|t| Some(*t) != take)
        .collect();
    Plan { take, destroy }
}

/// Applies the schedules of `shares` (dataset, interval, keep) now: the snapshots taken and
/// destroyed, or why not, as lines for the log.
pub fn run(svc: &Service, shares: &[(String, u64, usize)]) -> Vec<String> {
    let admin = Caller::Admin {
        name: "smb snapshot schedule".into(),
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let mut lines = Vec::new();
    for (dataset, every, keep) in shares {
        let req = Request::DatasetList {
            names: vec![dataset.clone()],
            recursive: true,
            types: Vec::new(),
        };
        let existing: Vec<i64> = match svc.handle(&admin, req, None).0 {
            Ok(Response::Datasets { datasets }) => datasets
                .iter()
                .filter_map(|d| {
                    d.name
                        .strip_prefix(&format!("{dataset}@"))
                        .and_then(time_of)
                })
                .collect(),
            Ok(_) => continue,
            Err(e) => {
                lines.push(format!("cannot list the snapshots of {dataset}: {e}"));
                continue;
            }
        };
        let p = plan(now, *every, *keep, &existing);
        if let Some(t) = p.take {
            let Some(name) = name_at(t) else { continue };
            let full = format!("{dataset}@{name}");
            let req = Request::Snapshot {
                names: vec![full.clone()],
                recursive: false,
            };
            match svc.handle(&admin, req, None).0 {
                Ok(_) => lines.push(format!("took snapshot {full}")),
                Err(e) => {
                    lines.push(format!("cannot take snapshot {full}: {e}"));
                    continue;
                }
            }
        }
        for t in p.destroy {
            let Some(name) = name_at(t) else { continue };
            let full = format!("{dataset}@{name}");
            let req = Request::DatasetDestroy {
                name: full.clone(),
                recursive: false,
                dependents: false,
                force: false,
                background: false,
            };
            match svc.handle(&admin, req, None).0 {
                Ok(_) => lines.push(format!(
                    "destroyed snapshot {full} (beyond the {keep} kept)"
                )),
                Err(e) => lines.push(format!("cannot destroy snapshot {full}: {e}")),
            }
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_times_round_trip() {
        let t = 1_795_000_000; // 2026-11-18 (UTC)
        let n = name_at(t).unwrap();
        assert_eq!(n, "GMT-2026.11.18-11.06.40");
        assert_eq!(time_of(&n), Some(t));
        for bad in [
            "GMT-2026.13.01-00.00.00",
            "GMT-2026.11.18-24.00.00",
            "GMT-2026.11.18",
            "gmt-2026.11.18-11.06.40",
            "GMT-2026.11.18-11.06.40x",
            "daily-2026.11.18",
        ] {
            assert_eq!(time_of(bad), None, "{bad}");
        }
    }

    #[test]
    fn one_snapshot_an_interval_and_the_oldest_go() {
        let hour = 3600;
        let now = 100 * hour + 5; // five seconds past an hour
                                  // None yet: take one.
        assert_eq!(
            plan(now, 3600, 3, &[]),
            Plan {
                take: Some(now),
                destroy: vec![]
            }
        );
        // One already this hour: nothing.
        assert_eq!(
            plan(now, 3600, 3, &[100 * hour + 1]),
            Plan {
                take: None,
                destroy: vec![]
            }
        );
        // The last an hour ago, three kept: the oldest two of four go after this one.
        let old = [96 * hour, 97 * hour, 98 * hour, 99 * hour];
        assert_eq!(
            plan(now, 3600, 3, &old),
            Plan {
                take: Some(now),
                destroy: vec![96 * hour, 97 * hour]
            }
        );
        // A snapshot from the future (a clock set back) counts as none for this interval.
        assert_eq!(plan(now, 3600, 5, &[200 * hour]).take, Some(now));
    }
}
