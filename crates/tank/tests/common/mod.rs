//! Helpers shared by the `tank` command's tests: whether FUSE can be mounted here, and the
//! record of a test that could not run.

#![allow(dead_code)]

use std::io::Write as _;

/// Why this machine cannot mount FUSE filesystems, if it cannot: no /dev/fuse, or no
/// CAP_SYS_ADMIN (bit 21 of the effective capabilities) for mount(2). Under `CI=true` a
/// missing FUSE fails the test instead: CI machines have it, and a run whose FUSE tests
/// all skipped must not pass.
pub fn fuse_missing() -> Option<&'static str> {
    let why = fuse_absent();
    if let (Some(why), Ok("true")) = (why, std::env::var("CI").as_deref()) {
        panic!("CI=true, but FUSE cannot be mounted here: {why}");
    }
    why
}

fn fuse_absent() -> Option<&'static str> {
    if !std::path::Path::new("/dev/fuse").exists() {
        return Some("/dev/fuse missing");
    }
    let cap_eff = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    if cap_eff & (1 << 21) == 0 {
        return Some("no CAP_SYS_ADMIN to mount FUSE filesystems");
    }
    None
}

/// Says on stderr that `test` did not run and why, and appends it to `tmp/skipped.txt` in
/// the target directory, which `.ci/run` counts: a test that returns early passes for the
/// test harness, and must not be counted as passed.
pub fn skip(test: &str, why: &str) {
    let line = format!("{test}: skipped: {why}");
    let _ = writeln!(std::io::stderr(), "{line}");
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("skipped.txt");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(f, "{line}");
    }
}

/// Stops a daemon the test started: SIGTERM, then SIGKILL if it is still running after
/// 60 s (a daemon syncs and exports its pools on SIGTERM).
pub fn stop(child: &mut std::process::Child) {
    use std::time::{Duration, Instant};
    if let Ok(None) = child.try_wait() {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Runs `tank ARGS` on the data directory `data`, `stdin` written to it; asserts that it
/// succeeds and returns its output.
pub fn tank(data: &std::path::Path, args: &[&str], stdin: Option<&str>) -> String {
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_tank"))
        .args(args)
        .env("TANK_DATA_DIR", data)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(s) = stdin {
        child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "tank {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Starts `tank ARGS` (a `serve`) on the data directory `data` and waits until it listens:
/// the process, the rest of its line that starts with `key` (such as `"nfs: "`, its
/// address), and the lines it printed before listening. Its standard error is dropped.
pub fn serve_until_listening(
    data: &std::path::Path,
    args: &[&str],
    key: &str,
) -> (std::process::Child, String, Vec<String>) {
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let mut child = Command::new(env!("CARGO_BIN_EXE_tank"))
        .args(args)
        .env("TANK_DATA_DIR", data)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let out = std::io::BufReader::new(child.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut value = None;
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("the daemon did not start");
        if let Some(a) = line.strip_prefix(key) {
            value = Some(a.to_string());
        }
        if line.starts_with("listening on ") {
            break;
        }
        lines.push(line);
    }
    let value = value.unwrap_or_else(|| panic!("the daemon printed no '{key}' line"));
    (child, value, lines)
}

/// A test's own directory, with `TANK_DATA_DIR` inside it, and the `tank` command run there.
pub struct Env {
    pub dir: tempfile::TempDir,
}

impl Env {
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join(name)
    }

    pub fn run(&self, args: &[&str]) -> std::process::Output {
        std::process::Command::new(env!("CARGO_BIN_EXE_tank"))
            .args(args)
            .env("TANK_DATA_DIR", self.path("data"))
            .current_dir(self.dir.path())
            .output()
            .unwrap()
    }

    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "tank {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    pub fn fails(&self, args: &[&str], expect: &str) -> String {
        let out = self.run(args);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "tank {args:?} should have failed");
        assert!(
            err.contains(expect),
            "tank {args:?}: expected '{expect}' in: {err}"
        );
        assert!(!err.contains("panicked"), "tank {args:?} panicked: {err}");
        err
    }
}

/// A small tmpfs mounted at a directory of a test's own, for a device that fills up: a
/// pool on it suspends when its txg no longer fits. Unmounted when dropped.
pub struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` (as mount(8) takes it: "40M") at `dir` (created). `None`,
    /// with test `test` recorded as skipped and why, where mounting is not allowed.
    pub fn mount(test: &str, dir: &std::path::Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(dir).unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .unwrap();
        if !out.status.success() {
            skip(
                test,
                &format!(
                    "cannot mount a tmpfs for the failing device: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            );
            return None;
        }
        Some(Tmpfs(dir.to_path_buf()))
    }

    /// Gives the file system `size` (the device has room again).
    pub fn resize(&self, size: &str) {
        let grown = std::process::Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .status()
            .unwrap();
        assert!(
            grown.success(),
            "cannot resize the tmpfs at {}",
            self.0.display()
        );
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}
