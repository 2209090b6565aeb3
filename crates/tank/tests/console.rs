//! The web console in a real browser: Debian's chromium driven by Playwright for Python
//! (`console_browser.py`), against a daemon this test starts on 127.0.0.1 with its API on
//! a port of its choosing. Where chromium, Playwright or FUSE is missing, the test records
//! "skipped" with the reason (`common::skip`), never a pass.

mod common;

use std::process::Command;

const BROWSER: &str = "/usr/bin/chromium";

fn missing() -> Option<String> {
    if !std::path::Path::new(BROWSER).exists() {
        return Some(format!("{BROWSER} missing (Debian's chromium package)"));
    }
    let pw = Command::new("python3")
        .args(["-c", "import playwright.sync_api"])
        .status();
    if !pw.is_ok_and(|s| s.success()) {
        return Some("Playwright for Python missing (pip install playwright)".into());
    }
    common::fuse_missing().map(String::from)
}

/// Log in, build a pool through the wizard, a dataset, a snapshot, a share, a rollback, a
/// user and their refusals, a scrub's moving progress bar, a phone-sized screen: every
/// step in chromium, failing on any console error or CSP violation.
#[test]
fn the_console_runs_the_nas_in_a_real_browser() {
    if let Some(why) = missing() {
        common::skip("the_console_runs_the_nas_in_a_real_browser", &why);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let devs = dir.path().join("devices");
    std::fs::create_dir_all(&devs).unwrap();
    for i in 0..4 {
        let f = std::fs::File::create(devs.join(format!("d{i}"))).unwrap();
        f.set_len(512 << 20).unwrap();
    }
    common::tank(
        &data,
        &["user", "add", "boss", "--uid", "1700", "--admin"],
        Some("the boss password\n"),
    );
    let (mut child, url, _) =
        common::serve_until_listening(&data, &["serve", "--api", "127.0.0.1:0"], "api: ");
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    // The scrub the browser watches is held to 16 MB/s, so its bar is seen moving.
    common::tank(&data, &["param", "scrub_max_rate=16M"], None);
    let shots = std::env::var("TANK_CONSOLE_SCREENSHOTS").ok();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/console_browser.py");
    let mut cmd = Command::new("timeout");
    cmd.args(["600", "python3", script, &url])
        .arg(&devs)
        .arg(dir.path().join("mnt"))
        .args(shots.iter());
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}");
    common::stop(&mut child);
    assert!(
        out.status.success() && stdout.contains("all steps passed"),
        "the browser run failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    for step in [
        "strict Content-Security-Policy",
        "wrong password is refused",
        "figures before the pool is made",
        "pool 'vault' created",
        "the red banner says 'Pool vault is DEGRADED",
        "online again",
        "shows it as text",
        "rolled back to @one",
        "snapshot's files are browsed",
        "snapshot schedule is set",
        "share 'docs'",
        "user 'bob' added",
        "progress bar moved",
        "keyboard alone",
        "refused by the server",
        "API refuses a scrub",
        "390 px screen",
    ] {
        assert!(stdout.contains(step), "no step '{step}' in:\n{stdout}");
    }
}
