//! Lifecycle rules, applied in the background.
//!
//! # Theory of operation
//! A thread of the S3 endpoint wakes every `--s3-lifecycle-interval` (an hour by default)
//! and applies each bucket's enabled rules (`ops_bucket::LifecycleRule`), as S3's own
//! lifecycle does, once a day:
//! - **Expiration** (Days after an object was written, or a Date): a current object that
//!   matches the rule's filter (prefix, tags, sizes) is deleted as a DELETE would delete it:
//!   gone where versioning is off, hidden behind a delete marker where it is on;
//! - **NoncurrentVersionExpiration**: a version that has not been current for NoncurrentDays
//!   goes, beyond the NewerNoncurrentVersions newest ones kept;
//! - **ExpiredObjectDeleteMarker**: a delete marker with no version left below it goes;
//! - **AbortIncompleteMultipartUpload**: an upload not completed DaysAfterInitiation after
//!   it began is aborted, its parts removed.
//!
//! Object Lock wins over every rule: a version under a retention or a legal hold is kept
//! and counted. Each change is made under its key's lock and committed like a client's.
//! A day is 86,400 s; `--s3-lifecycle-day` shortens it only to try rules out.

use std::sync::Arc;

use tank_dataset::posix::Fs;

use crate::buckets::{Bucket, Buckets};
use crate::multipart;
use crate::ops_bucket::{conf, LifecycleRule};
use crate::store::{self, Obj, Res};
use crate::versions::{self, Refusal};

/// What one pass did in one bucket.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pass {
    pub expired: usize,
    pub noncurrent: usize,
    pub markers: usize,
    pub uploads: usize,
    /// Versions a rule would have removed, kept by Object Lock.
    pub locked: usize,
}

impl Pass {
    pub fn is_empty(&self) -> bool {
        *self == Pass::default()
    }
}

fn ms(o: &Obj) -> i64 {
    o.mtime.sec * 1000 + i64::from(o.mtime.nsec / 1_000_000)
}

/// Whether the object `o` of `key` is in the rule's scope.
fn matches(r: &LifecycleRule, key: &str, o: &Obj) -> bool {
    if !key.starts_with(&r.prefix) {
        return false;
    }
    if r.size_gt.is_some_and(|n| o.size as i64 <= n)
        || r.size_lt.is_some_and(|n| o.size as i64 >= n)
    {
        return false;
    }
    if r.tags.is_empty() {
        return true;
    }
    let have = crate::ops::tag_pairs(o.meta.tagging.as_deref());
    r.tags.iter().all(|t| have.contains(t))
}

/// Applies `rules` to the bucket `b` now (`now` and `day` in milliseconds).
pub fn apply(
    buckets: &Buckets,
    b: &Bucket,
    fs: &Fs,
    rules: &[LifecycleRule],
    now: i64,
    day: i64,
) -> Res<Pass> {
    let mut pass = Pass::default();
    let delete = |key: &str, version: Option<&str>, pass: &mut Pass| -> Res<bool> {
        let _key = buckets.key_lock(&b.dataset, key);
        match versions::delete(fs, key, b.versioning, version, false) {
            Ok(_) => Ok(true),
            Err(Refusal::Locked(_)) => {
                pass.locked += 1;
                Ok(false)
            }
            Err(Refusal::Fs(e)) => Err(e),
        }
    };
    for r in rules.iter().filter(|r| r.enabled) {
        // Current objects.
        if r.expire_days.is_some() || r.expire_date.is_some() {
            let due = |o: &Obj| match (r.expire_days, r.expire_date) {
                (Some(d), _) => now >= ms(o) + i64::from(d) * day,
                (_, Some(t)) => now >= t,
                _ => false,
            };
            let mut after = String::new();
            loop {
                let page = store::list(fs, &r.prefix, None, &after, 1000)?;
                for (key, o) in &page.objects {
                    if matches(r, key, o) && due(o) && delete(key, None, &mut pass)? {
                        pass.expired += 1;
                    }
                }
                match page.last.filter(|_| page.truncated) {
                    Some(l) => after = l,
                    None => break,
                }
            }
        }
        // Noncurrent versions and lone delete markers.
        if r.noncurrent_days.is_some() || r.expired_markers {
            for key in versions::keys_with_versions(fs, &r.prefix)? {
                let vs = versions::versions_of(fs, &key)?;
                if let Some(days) = r.noncurrent_days {
                    let keep = r.keep_noncurrent.unwrap_or(0).max(0) as usize;
                    for (j, i) in (1..vs.len()).enumerate() {
                        let (o, _) = &vs[i];
                        let since = ms(&vs[i - 1].0);
                        if j >= keep
                            && now >= since + i64::from(days) * day
                            && (o.marker || matches(r, &key, o))
                            && delete(&key, Some(&o.version_id()), &mut pass)?
                        {
                            pass.noncurrent += 1;
                        }
                    }
                }
                if r.expired_markers {
                    let vs = versions::versions_of(fs, &key)?;
                    if let [(m, true)] = vs.as_slice() {
                        if m.marker && delete(&key, Some(&m.version_id()), &mut pass)? {
                            pass.markers += 1;
                        }
                    }
                }
            }
        }
        if let Some(d) = r.abort_days {
            let before = (now - i64::from(d) * day) / 1000;
            pass.uploads += multipart::abort_older(fs, &r.prefix, before)?;
        }
    }
    Ok(pass)
}

/// One pass over every bucket: the passes that changed something, by bucket.
pub fn run_once(buckets: &Buckets, day: std::time::Duration) -> Vec<(String, Pass)> {
    let mut out = Vec::new();
    for b in buckets.all() {
        let Some(fs) = b.fs() else { continue };
        let rules: Vec<LifecycleRule> = match conf(&fs, "lifecycle") {
            Ok(Some(r)) => r,
            Ok(None) => continue,
            Err(e) => {
                eprintln!(
                    "s3 lifecycle: bucket {}: cannot read its rules: errno {}",
                    b.name, e.0
                );
                continue;
            }
        };
        let day_ms = (day.as_millis() as i64).max(1);
        match apply(buckets, &b, &fs, &rules, versions::now_ms(), day_ms) {
            Ok(p) if !p.is_empty() => {
                println!(
                    "s3 lifecycle: bucket {}: {} objects expired, {} noncurrent versions and {} delete markers removed, {} uploads aborted, {} versions kept by Object Lock",
                    b.name, p.expired, p.noncurrent, p.markers, p.uploads, p.locked
                );
                if p.expired + p.noncurrent + p.markers > 0 {
                    b.changed(tank_service::handles::Changed::default());
                }
                out.push((b.name.clone(), p));
            }
            Ok(_) => {}
            Err(e) => eprintln!("s3 lifecycle: bucket {}: errno {}", b.name, e.0),
        }
    }
    out
}

/// The worker: a pass every `interval` until `stop` says so (or is dropped).
pub fn spawn(
    buckets: Arc<Buckets>,
    interval: std::time::Duration,
    day: std::time::Duration,
    stop: std::sync::mpsc::Receiver<()>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("tank-s3-lifecycle".into())
        .spawn(move || loop {
            match stop.recv_timeout(interval) {
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    run_once(&buckets, day);
                }
                _ => return,
            }
        })
}
