//! The README's first command, tried as a new user would: a fresh copy of the repository in a
//! temporary directory, the command run there exactly as README.md writes it, from that
//! directory, with no environment variable of tank's (nor any other but `PATH` and `HOME`,
//! which cargo needs to be found at all).
//!
//! The story behind it: the default data directory `./tank-data` is relative, and every other
//! test set an absolute `TANK_DATA_DIR`, so none saw that the first start failed ("bad value
//! for property 'mountpoint'") and left a pool whose root had no mountpoint behind, which
//! every later start accepted silently.
//!
//! The command builds tank in the copy (a release build from nothing: minutes), creates the
//! default pool and mounts it. The test writes and reads a file through the mount the daemon
//! announced, stops it with SIGTERM (clean unmount, pool exported), undoes the mountpoint as
//! an older build left it, starts again (the set-up is finished, the file is still there) and
//! stops again.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

/// The first build of the copy compiles every dependency in release mode.
const BUILD_AND_START_LIMIT: Duration = Duration::from_secs(40 * 60);
/// A start or stop of an already built daemon.
const START_STOP_LIMIT: Duration = Duration::from_secs(120);

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/tank sits two levels below the repository root")
        .to_path_buf()
}

/// The README's two opening commands: the first lines of its first ```sh block, each without
/// its `# comment`.
fn readme_commands(root: &Path) -> Vec<String> {
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let block = readme
        .split("```sh\n")
        .nth(1)
        .expect("README.md opens with a ```sh block");
    let block = &block[..block.find("```").expect("the block ends")];
    block
        .lines()
        .map(|l| l.split(" #").next().unwrap_or("").trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

/// The repository's files as a fresh clone would have them (tracked, plus new files not
/// ignored, so that uncommitted work is tried too); without git, every file but the build
/// output and data directories.
fn repo_files(root: &Path) -> Vec<PathBuf> {
    let git = Command::new("git")
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .current_dir(root)
        .output();
    if let Ok(out) = git {
        if out.status.success() && !out.stdout.is_empty() {
            return out
                .stdout
                .split(|b| *b == 0)
                .filter(|p| !p.is_empty())
                .map(|p| PathBuf::from(String::from_utf8_lossy(p).into_owned()))
                .filter(|p| root.join(p).is_file())
                .collect();
        }
    }
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for e in std::fs::read_dir(root.join(&rel)).unwrap().flatten() {
            let name = e.file_name();
            if [".git", "target", "tank-data"].contains(&name.to_str().unwrap_or("")) {
                continue;
            }
            let p = rel.join(&name);
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

fn copy_repo(root: &Path, target: &Path) {
    for rel in repo_files(root) {
        let to = target.join(&rel);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(root.join(&rel), &to)
            .unwrap_or_else(|e| panic!("copy {}: {e}", rel.display()));
    }
}

/// A shell command run in `dir` as a user's shell would, in its own process group (as a
/// terminal's foreground job), with only `PATH` and `HOME` in its environment.
fn spawn(cmd: &str, dir: &Path) -> Child {
    use std::os::unix::process::CommandExt;
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(cmd)
        .current_dir(dir)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    for var in ["PATH", "HOME"] {
        if let Some(v) = std::env::var_os(var) {
            c.env(var, v);
        }
    }
    c.spawn().expect("sh")
}

/// The daemon's standard output, a line at a time, and everything it said so far.
struct Lines {
    rx: Receiver<String>,
    seen: Vec<String>,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Lines {
    fn of(child: &mut Child) -> Self {
        let (tx, rx) = channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let mut err = child.stderr.take().unwrap();
        let sink = stderr.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Self {
            rx,
            seen: Vec::new(),
            stderr,
        }
    }

    /// Waits for a line starting with `prefix`; fails the test with everything said so far
    /// when it does not come within `limit` or the output ends.
    fn wait_for(&mut self, prefix: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.starts_with(prefix) {
                        return line;
                    }
                }
                Err(e) => panic!(
                    "no line '{prefix}...' ({e:?}); stdout:\n{}\nstderr (last 4000 bytes):\n{}",
                    self.seen.join("\n"),
                    tail(&self.stderr.lock().unwrap(), 4000)
                ),
            }
        }
    }
}

fn tail(s: &str, n: usize) -> &str {
    let mut start = s.len().saturating_sub(n);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

fn is_mounted(dir: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let dir = dir.to_string_lossy();
    mounts
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(dir.as_ref()))
}

/// The process named `tank` in the process group of `child` (the daemon that `cargo run`
/// started), read from /proc.
fn daemon_pid(child: &Child) -> i32 {
    let pgid = child.id() as i32;
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid pgrp ...: comm may hold spaces, so split after its ')'.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = &stat[open + 1..close];
        let pgrp = stat[close + 1..].split_whitespace().nth(2);
        if comm == "tank" && pgrp == Some(pgid.to_string().as_str()) {
            return pid;
        }
    }
    panic!("no process 'tank' in process group {pgid}");
}

/// SIGTERM to the daemon, as `kill -TERM PID` would; waits for the command that started it
/// to end and returns its exit status (`cargo run` exits with the program's status).
#[allow(unsafe_code)]
fn terminate(child: &mut Child) -> std::process::ExitStatus {
    let pid = daemon_pid(child);
    // SAFETY: kill(2) of a process of the group we created for the child.
    let r = unsafe { libc::kill(pid, libc::SIGTERM) };
    assert_eq!(r, 0, "kill: {}", std::io::Error::last_os_error());
    let deadline = Instant::now() + START_STOP_LIMIT;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the daemon did not stop within {START_STOP_LIMIT:?} of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Stops a started daemon and checks the clean stop: exit 0, the mount gone, the pool
/// exported.
fn stop(child: &mut Child, lines: &mut Lines, mnt: &Path) {
    let status = terminate(child);
    lines.wait_for("exported pool 'tank'", START_STOP_LIMIT);
    assert!(
        status.success(),
        "the daemon's stop failed ({status}): {}\n{}",
        lines.seen.join("\n"),
        tail(&lines.stderr.lock().unwrap(), 4000)
    );
    assert!(!is_mounted(mnt), "{} is still mounted", mnt.display());
}

#[test]
fn readme_first_command_starts_tank_from_a_fresh_copy() {
    if let Some(why) = common::fuse_missing() {
        common::skip("readme_first_command_starts_tank_from_a_fresh_copy", why);
        return;
    }
    let root = repo_root();
    let commands = readme_commands(&root);
    assert_eq!(
        commands.len(),
        2,
        "README.md opens with two commands: {commands:?}"
    );
    let first = &commands[0];
    assert!(
        first.contains("serve"),
        "the first command starts tank: {first}"
    );

    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("tank");
    copy_repo(&root, &copy);
    let copy = copy.canonicalize().unwrap();
    let data = copy.join("tank-data");
    let mnt = data.join("mnt").join("tank");

    // First start: builds, creates the default pool, mounts its root.
    let mut child = spawn(first, &copy);
    let mut lines = Lines::of(&mut child);
    let created = lines.wait_for("created pool 'tank'", BUILD_AND_START_LIMIT);
    assert!(created.contains(&data.join("devices").to_string_lossy().into_owned()));
    let mounted = lines.wait_for("mounted tank at ", START_STOP_LIMIT);
    let dir = PathBuf::from(mounted.trim_start_matches("mounted tank at "));
    assert_eq!(dir, mnt, "the mount the daemon announced");
    lines.wait_for("listening on ", START_STOP_LIMIT);
    assert!(is_mounted(&dir));
    let payload: Vec<u8> = (0..1_000_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    let file = dir.join("hello.bin");
    {
        use std::io::Write as _;
        let mut f = std::fs::File::create(&file).unwrap();
        f.write_all(&payload).unwrap();
        f.sync_all().unwrap();
    }
    assert_eq!(std::fs::read(&file).unwrap(), payload);
    stop(&mut child, &mut lines, &dir);

    // A pool left as the old first start left it: the root's mountpoint never set. The next
    // start finishes the set-up and mounts it.
    let mut undo = spawn(
        &first.replace("serve", "dataset inherit mountpoint tank"),
        &copy,
    );
    let undone = undo.wait().unwrap();
    let mut err = String::new();
    undo.stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(undone.success(), "inherit mountpoint: {err}");

    let mut child = spawn(first, &copy);
    let mut lines = Lines::of(&mut child);
    lines.wait_for("imported pool 'tank'", BUILD_AND_START_LIMIT);
    let finished = lines.wait_for("finished the set-up of pool 'tank'", START_STOP_LIMIT);
    assert!(finished.ends_with(&*mnt.to_string_lossy()), "{finished}");
    let mounted = lines.wait_for("mounted tank at ", START_STOP_LIMIT);
    assert_eq!(
        PathBuf::from(mounted.trim_start_matches("mounted tank at ")),
        mnt
    );
    assert_eq!(std::fs::read(mnt.join("hello.bin")).unwrap(), payload);
    stop(&mut child, &mut lines, &mnt);
    assert!(
        !lines.seen.iter().any(|l| l.starts_with("not mounting")),
        "{:?}",
        lines.seen
    );
}
