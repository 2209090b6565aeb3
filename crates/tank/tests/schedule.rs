//! Snapshot schedules run by the daemon, with hours made 2 s long (`--schedule-hour`): the
//! snapshots due are taken (recursively), the oldest beyond each period's count pruned, a
//! snapshot of the user's own left alone, events posted; a removed schedule takes no more.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

fn tank(data: &Path, args: &[&str]) -> String {
    common::tank(data, args, None)
}

/// The scheduled snapshots of `ds` for `period` in a listing of snapshot names.
fn autosnaps(all: &str, ds: &str, period: &str) -> Vec<String> {
    all.lines()
        .filter(|l| l.starts_with(&format!("{ds}@autosnap_")) && l.ends_with(&format!("_{period}")))
        .map(String::from)
        .collect()
}

#[test]
fn schedules_take_and_prune_snapshots() {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let dev = t.path().join("disk0");
    std::fs::File::create(&dev)
        .unwrap()
        .set_len(256 << 20)
        .unwrap();
    tank(&data, &["pool", "create", "sp", dev.to_str().unwrap()]);
    tank(&data, &["dataset", "create", "sp/home"]);
    tank(&data, &["dataset", "create", "sp/home/alice"]);
    tank(&data, &["snapshot", "sp/home@mine"]);
    let (mut child, _, _) = common::serve_until_listening(
        &data,
        &["serve", "--api", "127.0.0.1:0", "--schedule-hour", "2"],
        "api: ",
    );
    tank(
        &data,
        &[
            "schedule", "add", "--hourly", "3", "--daily", "2", "-r", "sp/home",
        ],
    );
    // Six "hours" and more: the hourly count reaches 3 and stays there. A new "hour" starts
    // every 2 s, taking a snapshot before it prunes the oldest: every check below is made on
    // one listing, taken when the count is 3 (a second listing could fall in between).
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen_pruned = false;
    let all = loop {
        std::thread::sleep(Duration::from_secs(2));
        let events = tank(&data, &["pool", "events", "sp"]);
        seen_pruned |= events.contains("autosnap_pruned");
        let all = tank(
            &data,
            &["dataset", "list", "-H", "-t", "snapshot", "-o", "name"],
        );
        if seen_pruned && autosnaps(&all, "sp/home", "hourly").len() == 3 {
            break all;
        }
        assert!(Instant::now() < deadline, "no pruning after 60 s: {events}");
    };
    let hourly = autosnaps(&all, "sp/home", "hourly");
    assert_eq!(hourly.len(), 3, "{hourly:?}");
    let mut sorted = hourly.clone();
    sorted.sort();
    assert_eq!(sorted, hourly, "names sort by time");
    let daily = autosnaps(&all, "sp/home", "daily");
    assert!((1..=2).contains(&daily.len()), "{daily:?}");
    // Recursive: the child has the same snapshots (taken atomically with the parent's).
    let child_hourly: Vec<String> = autosnaps(&all, "sp/home/alice", "hourly")
        .into_iter()
        .map(|n| n.replace("sp/home/alice@", ""))
        .collect();
    let parent_hourly: Vec<String> = hourly.iter().map(|n| n.replace("sp/home@", "")).collect();
    for n in &child_hourly {
        assert!(
            parent_hourly.contains(n) || n < &parent_hourly[0],
            "{n} not among {parent_hourly:?}"
        );
    }
    // A snapshot of the user's own is never pruned.
    let all = tank(
        &data,
        &["dataset", "list", "-H", "-t", "snapshot", "-o", "name"],
    );
    assert!(all.lines().any(|l| l == "sp/home@mine"), "{all}");
    let list = tank(&data, &["schedule", "list"]);
    // 3 kept of 3 wanted, or for an instant 4: a new hour's snapshot before its pruning.
    assert!(
        list.contains("sp/home") && (list.contains("3/3") || list.contains("4/3")),
        "{list}"
    );
    // Removed: no more snapshots.
    tank(&data, &["schedule", "remove", "sp/home"]);
    std::thread::sleep(Duration::from_secs(1));
    let before = tank(
        &data,
        &["dataset", "list", "-H", "-t", "snapshot", "-o", "name"],
    );
    std::thread::sleep(Duration::from_secs(5));
    let after = tank(
        &data,
        &["dataset", "list", "-H", "-t", "snapshot", "-o", "name"],
    );
    assert_eq!(before, after);
    assert!(!tank(&data, &["schedule", "list"]).contains("sp/home"));
    common::stop(&mut child);
}
