//! Crashes through the whole stack: the real daemon (`tank serve`) on its default pool of
//! file devices, its FUSE mount with the writeback cache and the intent log, killed with
//! SIGKILL at random moments of a mixed workload (writes, fsyncs, renames, hard links made
//! and removed, chmods, chowns, times, snapshots, a running scrub), many times with one
//! seed, and started again.
//!
//! After every restart everything acknowledged is there: a file's bytes after its fsync, its
//! mode, owner and times after an fsync that followed the change, a name after the rename
//! and an fsync of the directory, a hard link (and the link count) after the link or unlink
//! and an fsync of the directory, a snapshot once the command returned. What was in flight
//! may be old or new, byte by byte, but never anything else: no byte nobody wrote, no file
//! under both names or under neither. Then the pool is ONLINE, a scrub finds nothing, and
//! the filesystem takes writes. Last, with the daemon stopped, the pool is checked from its
//! devices as a checker would: fsck of the filesystem and of every snapshot, the dataset
//! accounting recomputed from the trees, and every allocated byte reached exactly once.

mod common;
/// The dataset layer's test helpers: `fsck` and the accounting checks.
#[path = "../../dataset/tests/posix_common/mod.rs"]
mod posix_common;

use common::Env;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng as ChaCha8Rng;
use rand::{Rng, SeedableRng};

const FILES: usize = 6;
const FILE_LEN: usize = 96 << 10;
const ROUNDS: u64 = 8;

/// Where the daemon mounts the default pool's root.
fn mnt(env: &Env) -> PathBuf {
    env.path("data/mnt/tank")
}

fn is_mounted(dir: &Path) -> bool {
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(&*dir.to_string_lossy()))
}

fn serve(env: &Env) -> Child {
    let child = Command::new(env!("CARGO_BIN_EXE_tank"))
        .args(["serve", "--api", "127.0.0.1:0"])
        .env("TANK_DATA_DIR", env.path("data"))
        .current_dir(env.dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !(env.path("data/tank.sock").exists() && is_mounted(&mnt(env))) {
        assert!(Instant::now() < deadline, "the daemon did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

/// SIGKILL, then the mount the dead daemon left is detached (as a reboot would).
fn kill(env: &Env, mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
    let deadline = Instant::now() + Duration::from_secs(30);
    while is_mounted(&mnt(env)) {
        let _ = Command::new("umount").arg("-l").arg(mnt(env)).status();
        assert!(Instant::now() < deadline, "the dead daemon's mount stays");
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = std::fs::remove_file(env.path("data/tank.sock"));
}

/// A file's state: what was acknowledged, and what an operation in flight may have left.
#[derive(Debug, Clone, PartialEq)]
struct State {
    name: String,
    data: Vec<u8>,
    mode: u32,
    uid: u32,
    /// Set by the last change (None after a write, which sets it to its own time).
    mtime: Option<i64>,
    /// Its other names (hard links), beside `name`.
    links: Vec<String>,
}

#[derive(Debug, Clone)]
struct FileModel {
    acked: State,
    /// The state an unacknowledged operation was making (None: nothing in flight).
    pending: Option<State>,
}

struct Model {
    files: Vec<FileModel>,
    snapshots: Vec<String>,
}

fn fsync_path(p: &Path) -> std::io::Result<()> {
    std::fs::File::open(p)?.sync_all()
}

fn set_mtime(p: &Path, secs: i64) -> std::io::Result<()> {
    let f = std::fs::File::options().write(true).open(p)?;
    f.set_modified(std::time::UNIX_EPOCH + Duration::from_secs(secs as u64))
}

/// One step on file `k`: start it as pending, do it, and once it is durable make it
/// acknowledged. An error (the daemon died under it) leaves it pending.
fn step(env: &Env, m: &Mutex<Model>, r: &mut ChaCha8Rng, k: usize, snap: &mut u64) -> bool {
    let mnt = mnt(env);
    let cur = m.lock().unwrap().files[k].acked.clone();
    let mut next = cur.clone();
    let op = r.gen_range(0..12);
    let (at, len) = (r.gen_range(0..FILE_LEN - 1), r.gen_range(1..40_000));
    let len = len.min(FILE_LEN - at);
    match op {
        0..=4 => {
            // Overwrite a range in place (no length change: bytes are old or new).
            let fill: Vec<u8> = (0..len).map(|_| r.gen()).collect();
            next.data[at..at + len].copy_from_slice(&fill);
            next.mtime = None;
        }
        5 => next.mode = 0o600 | (r.gen_range(0..8) << 3),
        6 => next.uid = r.gen_range(1000..1010),
        7 => next.mtime = Some(r.gen_range(1_000_000_000..1_700_000_000)),
        8 => next.name = format!("f{k}-{}", r.gen::<u32>()),
        9 | 10 if op == 9 || cur.links.is_empty() => {
            next.links.push(format!("l{k}-{}", r.gen::<u32>()));
        }
        10 => {
            let gone = r.gen_range(0..cur.links.len());
            next.links.remove(gone);
        }
        _ => {
            *snap += 1;
            let name = format!("tank@crash{snap}");
            let out = env.run(&["snapshot", &name]);
            if !out.status.success() {
                return false;
            }
            m.lock().unwrap().snapshots.push(name);
            return true;
        }
    }
    m.lock().unwrap().files[k].pending = Some(next.clone());
    let path = mnt.join(&cur.name);
    let done = (|| -> std::io::Result<()> {
        match op {
            0..=4 => {
                use std::os::unix::fs::FileExt;
                let f = std::fs::File::options().write(true).open(&path)?;
                f.write_all_at(&next.data[at..at + len], at as u64)?;
                f.sync_all()
            }
            5 => {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(next.mode))?;
                fsync_path(&path)
            }
            6 => {
                std::os::unix::fs::chown(&path, Some(next.uid), None)?;
                fsync_path(&path)
            }
            7 => {
                set_mtime(&path, next.mtime.unwrap_or_default())?;
                fsync_path(&path)
            }
            9 | 10 => {
                if next.links.len() > cur.links.len() {
                    let new = next.links.last().expect("a new link");
                    std::fs::hard_link(&path, mnt.join(new))?;
                } else {
                    let gone = cur.links.iter().find(|l| !next.links.contains(l));
                    std::fs::remove_file(mnt.join(gone.expect("a removed link")))?;
                }
                fsync_path(&mnt)
            }
            _ => {
                std::fs::rename(&path, mnt.join(&next.name))?;
                fsync_path(&mnt)
            }
        }
    })();
    if done.is_err() {
        return false;
    }
    let mut g = m.lock().unwrap();
    g.files[k].acked = next;
    g.files[k].pending = None;
    true
}

/// What is on the mount now for file `k`, found by either of its possible names.
fn check(env: &Env, f: &FileModel, k: usize, round: u64) -> State {
    let ctx = format!("round {round}, file {k}");
    let mut names: Vec<&String> = std::iter::once(&f.acked.name)
        .chain(f.pending.as_ref().map(|p| &p.name))
        .collect();
    names.dedup();
    let found: Vec<&&String> = names.iter().filter(|n| mnt(env).join(n).exists()).collect();
    assert_eq!(
        found.len(),
        1,
        "{ctx}: under {found:?} of its names {names:?}"
    );
    let name = (*found[0]).clone();
    let p = mnt(env).join(&name);
    let md = std::fs::metadata(&p).unwrap();
    let data = std::fs::read(&p).unwrap();
    assert_eq!(data.len(), FILE_LEN, "{ctx}: length");
    let states: Vec<&State> = std::iter::once(&f.acked)
        .chain(f.pending.as_ref())
        .collect();
    for (i, b) in data.iter().enumerate() {
        assert!(
            states.iter().any(|s| s.data[i] == *b),
            "{ctx}: byte {i} is {b:#x}, which no write put there (acked {:#x})",
            f.acked.data[i]
        );
    }
    let mode = md.mode() & 0o7777;
    assert!(
        states.iter().any(|s| s.mode == mode),
        "{ctx}: mode {mode:o}, acked {:o}",
        f.acked.mode
    );
    assert!(
        states.iter().any(|s| s.uid == md.uid()),
        "{ctx}: uid {}, acked {}",
        md.uid(),
        f.acked.uid
    );
    // A time set and then fsync'd stays, unless a write (which sets its own) may follow.
    assert!(
        states
            .iter()
            .any(|s| s.mtime.is_none_or(|t| t == md.mtime())),
        "{ctx}: mtime {}, acked {:?}",
        md.mtime(),
        f.acked.mtime
    );
    // Hard links: one acknowledged in every state is there, one in some states may be; each
    // there is the same file; the link count is a state's.
    let mut candidates: Vec<&String> = states.iter().flat_map(|s| s.links.iter()).collect();
    candidates.sort();
    candidates.dedup();
    let mut links = Vec::new();
    for l in candidates {
        let everywhere = states.iter().all(|s| s.links.contains(l));
        match std::fs::metadata(mnt(env).join(l)) {
            Ok(lm) => {
                assert_eq!(lm.ino(), md.ino(), "{ctx}: link {l} is another file");
                links.push(l.clone());
            }
            Err(_) => assert!(!everywhere, "{ctx}: acknowledged link {l} is gone"),
        }
    }
    assert!(
        states
            .iter()
            .any(|s| 1 + s.links.len() as u64 == md.nlink()),
        "{ctx}: {} links, acked {}",
        md.nlink(),
        1 + f.acked.links.len()
    );
    assert_eq!(
        md.nlink(),
        1 + links.len() as u64,
        "{ctx}: links found {links:?}"
    );
    State {
        name,
        data,
        mode,
        uid: md.uid(),
        mtime: Some(md.mtime()),
        links,
    }
}

#[test]
fn sigkill_at_random_moments_loses_nothing_acknowledged() {
    let test = "sigkill_at_random_moments_loses_nothing_acknowledged";
    if let Some(why) = common::fuse_missing() {
        common::skip(test, why);
        return;
    }
    let env = Env::new();
    let seed: u64 = std::env::var("TANK_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5161_c1a5);
    eprintln!("seed {seed}");
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    let mut child = Some(serve(&env));
    // The files, acknowledged before the first crash.
    let mut files = Vec::new();
    for k in 0..FILES {
        let data: Vec<u8> = (0..FILE_LEN).map(|_| r.gen()).collect();
        let name = format!("f{k}");
        let p = mnt(&env).join(&name);
        std::fs::write(&p, &data).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        fsync_path(&p).unwrap();
        let md = std::fs::metadata(&p).unwrap();
        files.push(FileModel {
            acked: State {
                name,
                data,
                mode: 0o644,
                uid: md.uid(),
                mtime: Some(md.mtime()),
                links: Vec::new(),
            },
            pending: None,
        });
    }
    fsync_path(&mnt(&env)).unwrap();
    let model = Arc::new(Mutex::new(Model {
        files,
        snapshots: Vec::new(),
    }));
    let mut snap = 0u64;
    let mut steps_total = 0;
    let mut links_seen = 0;
    for round in 0..ROUNDS {
        // The workload on two threads (files split between them), killed after a while.
        let stop = Arc::new(AtomicBool::new(false));
        let env_ref = &env;
        let acked_steps = std::thread::scope(|s| {
            let workers: Vec<_> = (0..2usize)
                .map(|w| {
                    let model = model.clone();
                    let stop = stop.clone();
                    let mut wr = ChaCha8Rng::seed_from_u64(seed ^ (round << 8) ^ w as u64);
                    let mut snap_here = snap + 1000 * (w as u64 + 1) * (round + 1);
                    s.spawn(move || {
                        let mut n = 0;
                        let deadline = Instant::now() + Duration::from_secs(30);
                        while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                            let k = w + 2 * wr.gen_range(0..FILES / 2);
                            if !step(env_ref, &model, &mut wr, k, &mut snap_here) {
                                break;
                            }
                            n += 1;
                        }
                        n
                    })
                })
                .collect();
            // A scrub running under the workload in some rounds.
            if round % 2 == 1 {
                let _ = env_ref.run(&["pool", "scrub", "tank"]);
            }
            std::thread::sleep(Duration::from_millis(r.gen_range(300..2500)));
            kill(env_ref, child.take().expect("a running daemon"));
            stop.store(true, Ordering::Relaxed);
            workers
                .into_iter()
                .map(|w| w.join().unwrap())
                .sum::<usize>()
        });
        steps_total += acked_steps;
        snap += 100_000;
        child = Some(serve(&env));
        let mut g = model.lock().unwrap();
        for k in 0..FILES {
            let now = check(&env, &g.files[k], k, round);
            // From here on what is there is acknowledged (it survived; the next crash
            // must keep it).
            g.files[k].acked = now;
            g.files[k].pending = None;
        }
        for name in &g.snapshots {
            let out = env.run(&["dataset", "list", "-H", "-o", "name", name]);
            assert!(
                out.status.success(),
                "round {round}: acknowledged snapshot {name} is gone: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let links: usize = g.files.iter().map(|f| f.acked.links.len()).sum();
        links_seen += links;
        eprintln!(
            "round {round}: {acked_steps} steps acknowledged, checked after SIGKILL ({links} hard links)"
        );
    }
    assert!(steps_total > 0, "the workload acknowledged nothing");
    assert!(
        links_seen > 0,
        "no hard link survived a round to be checked"
    );
    // The pool after all of it: ONLINE, a scrub finds nothing, and it takes writes. A scrub
    // the crashes cut off has resumed in the daemon: let it end first.
    let deadline = Instant::now() + Duration::from_secs(300);
    while env.ok(&["pool", "status", "tank"]).contains("in progress") {
        assert!(Instant::now() < deadline, "the resumed scrub did not end");
        std::thread::sleep(Duration::from_millis(200));
    }
    env.ok(&["pool", "scrub", "-w", "tank"]);
    let status = env.ok(&["pool", "status", "tank"]);
    assert!(status.contains("ONLINE"), "{status}");
    assert!(status.contains("with 0 errors"), "{status}");
    assert!(status.contains("No known data errors"), "{status}");
    std::fs::write(mnt(&env).join("after"), b"after the crashes").unwrap();
    fsync_path(&mnt(&env).join("after")).unwrap();
    common::stop(child.as_mut().expect("a running daemon"));
    check_from_the_devices(&env, &model.lock().unwrap().snapshots);
}

/// The stopped daemon's pool (it exported it), imported here: fsck of the root filesystem
/// and of every snapshot, the datasets' space recomputed from their trees, and the pool's
/// allocated space exactly what its datasets and snapshots reach.
fn check_from_the_devices(env: &Env, snapshots: &[String]) {
    use posix_common::dsl::{check_accounting, pool_usage, DsPool};
    let cache: serde_json::Value =
        serde_json::from_slice(&std::fs::read(env.path("data/pools.json")).unwrap()).unwrap();
    let pool = cache["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "tank")
        .expect("the default pool in the cache file");
    let devs: Vec<tank_device::DeviceRef> = pool["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            let path = Path::new(d.as_str().unwrap());
            std::sync::Arc::new(tank_device::FileDevice::open(path, &Default::default()).unwrap())
                as tank_device::DeviceRef
        })
        .collect();
    let p = DsPool::import(devs).unwrap();
    let m = p.mount("tank").unwrap();
    let image = posix_common::fsck_objset(&m.fs, &m.objset, false)
        .unwrap_or_else(|e| panic!("fsck of the filesystem: {e}"));
    p.unmount(m);
    assert!(image.len() > FILES, "fsck found {} inodes", image.len());
    for name in snapshots {
        p.snapshot_tree(p.id(name))
            .unwrap_or_else(|e| panic!("fsck of {name}: {e}"));
    }
    check_accounting(&p.dsl, &p.store).unwrap_or_else(|e| panic!("dataset accounting: {e}"));
    pool_usage(&p.pool, &p.store, &p.dsl).unwrap_or_else(|e| panic!("pool accounting: {e}"));
    eprintln!(
        "from the devices: fsck of the filesystem ({} inodes) and {} snapshots, accounting: all hold",
        image.len(),
        snapshots.len()
    );
    p.export();
}
