//! The caller's credentials for each request.
//!
//! # Theory of operation
//! A FUSE request carries the caller's fsuid, fsgid and thread id, not its supplementary
//! groups; permission checks happen in `Fs`, which needs all three. The groups are read
//! from the `Groups:` line of `/proc/<tid>/status` (the request's pid is the calling
//! thread's id, and groups can differ per thread).
//!
//! Reading `/proc` for every request would cost more than many requests themselves, so the
//! groups are cached per (thread id, uid, gid) for `GROUPS_TTL`. A change of uid or gid
//! (setuid, setfsuid) misses the cache at once; a `setgroups` alone is seen within
//! `GROUPS_TTL`. The cache is bounded: past `CACHE_MAX` entries the stale ones are dropped,
//! and if that is not enough, all of them.
//!
//! Root (uid 0) passes every check in `Fs`, so its groups are not read; neither are those
//! of kernel-internal requests (pid 0). A thread that has exited by the time we look
//! (or a `/proc` we cannot read) gets no supplementary groups: the checks then fall back to
//! the primary group, which can only deny, never grant, more than the truth.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tank_dataset::posix::Cred;

/// How long the groups read for a thread are trusted.
pub const GROUPS_TTL: Duration = Duration::from_millis(250);
/// Most threads remembered at once.
const CACHE_MAX: usize = 4096;

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    pid: u32,
    uid: u32,
    gid: u32,
}

struct Entry {
    groups: Arc<[u32]>,
    read_at: Instant,
}

#[derive(Default)]
pub struct CredCache {
    map: Mutex<HashMap<Key, Entry>>,
}

impl CredCache {
    /// The credentials of a request from `pid` running as `uid`/`gid`.
    pub fn cred(&self, uid: u32, gid: u32, pid: u32) -> Cred {
        if uid == 0 || pid == 0 {
            return Cred::user(uid, gid);
        }
        let key = Key { pid, uid, gid };
        let now = Instant::now();
        if let Some(e) = self.map.lock().get(&key) {
            if now.duration_since(e.read_at) < GROUPS_TTL {
                return Cred {
                    uid,
                    gid,
                    groups: e.groups.to_vec(),
                };
            }
        }
        let groups: Arc<[u32]> = read_groups(pid).unwrap_or_default().into();
        let mut map = self.map.lock();
        if map.len() >= CACHE_MAX {
            map.retain(|_, e| now.duration_since(e.read_at) < GROUPS_TTL);
            if map.len() >= CACHE_MAX {
                map.clear();
            }
        }
        map.insert(
            key,
            Entry {
                groups: groups.clone(),
                read_at: now,
            },
        );
        Cred {
            uid,
            gid,
            groups: groups.to_vec(),
        }
    }
}

/// The supplementary groups of thread `pid`, from `/proc/<pid>/status`.
fn read_groups(pid: u32) -> Option<Vec<u32>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_groups(&status)
}

fn parse_groups(status: &str) -> Option<Vec<u32>> {
    let line = status.lines().find(|l| l.starts_with("Groups:"))?;
    line["Groups:".len()..]
        .split_whitespace()
        .map(|g| g.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_line_is_parsed() {
        let status = "Name:\tx\nUid:\t1000\t1000\t1000\t1000\nGroups:\t4 24 1000 \nNSpid:\t5\n";
        assert_eq!(parse_groups(status), Some(vec![4, 24, 1000]));
        assert_eq!(parse_groups("Groups:\t\n"), Some(vec![]));
        assert_eq!(parse_groups("Name:\tx\n"), None);
        assert_eq!(parse_groups("Groups:\tx\n"), None);
    }

    #[test]
    fn own_thread_groups_are_read_and_root_is_not() {
        let pid = std::process::id();
        // Our own groups, whatever they are, read for a non-root identity.
        let expected = read_groups(pid).expect("readable /proc");
        let cache = CredCache::default();
        let c = cache.cred(1234, 5678, pid);
        assert_eq!(
            (c.uid, c.gid, c.groups.clone()),
            (1234, 5678, expected.clone())
        );
        // Cached: same answer.
        assert_eq!(cache.cred(1234, 5678, pid).groups, expected);
        assert!(cache.cred(0, 0, pid).groups.is_empty());
        assert!(cache.cred(1234, 5678, 0).groups.is_empty());
        // A thread that does not exist has no groups.
        assert!(cache.cred(1234, 5678, u32::MAX - 1).groups.is_empty());
    }
}
