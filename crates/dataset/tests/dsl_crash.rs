//! Crash consistency of the dataset directory's sync tasks: cut a workload of filesystem
//! writes and sync tasks (create, with -p, snapshot, recursive snapshot, clone, rename of a
//! dataset and of a snapshot, destroy of a snapshot, of a clone, of a snapshot name with -r,
//! of a tree with its clones (-R), rollback -r) at every device write and flush.
//!
//! Method (as `posix_crash.rs`): run the workload once on a simulated fleet, counting its
//! device operations after the pool and its dataset directory exist, and checking the pool
//! against the model after every phase; then for every cut point k run it again with the
//! fleet losing power at operation k, take the device images (only flushed writes; seeded
//! variants keep a random subset of the unflushed writes or tear the last one), import, and
//! check that the pool shows exactly the model of one phase: the last one acknowledged before
//! the cut, or the one in flight. A phase ends with one durable step (a sync task, which
//! also commits the writes before it, or an fsync), so a task is all there or not at all: a
//! recursive snapshot exists on both datasets or neither, a clone exists with its origin's
//! contents or not at all, a rollback or destroy is complete or absent. Each imported pool
//! also passes `fsck` of every dataset and snapshot, the accounting recomputed from the
//! trees, and the allocator's agreement with what the pool reaches; it then takes and
//! destroys a recursive snapshot of everything, and is checked again.

mod posix_common;

use std::collections::BTreeMap;
use std::sync::Arc;

use posix_common::dsl::*;
use posix_common::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tank_dataset::posix::{Cred, ROOT_INO};
use tank_dataset::Op;
use tank_device::{CrashMode, DeviceRef, SimFleet};

const DEV_SIZE: u64 = 64 << 20;

type Res = Result<(), String>;

/// The workload's state: the pool, its mounts, the model and the model of every phase.
struct Work<'a> {
    p: &'a DsPool,
    mounts: BTreeMap<String, Mounted>,
    m: Model,
    /// The model after each phase (index 0: before the first).
    phases: Vec<Model>,
    /// The last phase whose durable step returned.
    acked: usize,
    /// Check the pool against the model after every phase (the uncrashed run).
    verify: bool,
}

/// `len` bytes of seeded random data.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    ChaCha8Rng::seed_from_u64(seed).fill(&mut v[..]);
    v
}

impl Work<'_> {
    fn mount(&mut self, ds: &str) -> Res {
        let m = self.p.mount(ds)?;
        self.mounts.insert(ds.to_string(), m);
        Ok(())
    }

    fn unmount(&mut self, ds: &str) {
        if let Some(m) = self.mounts.remove(ds) {
            self.p.unmount(m);
        }
    }

    /// Writes `data` at `off` of the file at `path` (created if missing).
    fn write(&mut self, ds: &str, path: &str, off: usize, data: &[u8]) -> Res {
        let root = Cred::root();
        let fs = &self.mounts[ds].fs;
        let e = |e| format!("{ds}: write {path}: {e:?}");
        let ino = match lookup(fs, path) {
            Ok(ino) => ino,
            Err(_) => {
                let (dir, name) = split(path);
                let parent = lookup(fs, dir).map_err(e)?;
                fs.mknod(&root, parent, os(name), libc::S_IFREG | 0o644, 0)
                    .map_err(e)?
                    .ino
            }
        };
        fs.write(&root, ino, off as u64, data, false).map_err(e)?;
        apply_write(&mut self.m.ds.get_mut(ds).unwrap().tree, path, off, data);
        Ok(())
    }

    /// Makes a directory (`mkdir`) or removes a file at `path`.
    fn change_name(&mut self, ds: &str, path: &str, mkdir: bool) -> Res {
        let fs = &self.mounts[ds].fs;
        let (dir, name) = split(path);
        let e = |e| format!("{ds}: mkdir {mkdir} / unlink {path}: {e:?}");
        let parent = lookup(fs, dir).map_err(e)?;
        let tree = &mut self.m.ds.get_mut(ds).unwrap().tree;
        if mkdir {
            fs.mkdir(&Cred::root(), parent, os(name), 0o755)
                .map_err(e)?;
            tree.insert(path.to_string(), Entry::Dir);
        } else {
            fs.unlink(&Cred::root(), parent, os(name)).map_err(e)?;
            tree.remove(path);
        }
        Ok(())
    }

    /// Ends a phase with a durable step; the model already shows its effect.
    fn durable(&mut self, step: impl FnOnce(&Self) -> Res) -> Res {
        self.phases.push(self.m.clone());
        step(self)?;
        self.acked = self.phases.len() - 1;
        if self.verify {
            let ctx = format!("phase {}", self.acked);
            matches(self.p, &self.m, &self.mounts).map_err(|e| format!("{ctx}: {e}"))?;
            // An fsync may leave its work in the intent log (and the blocks of its large
            // writes allocated outside any committed tree): the accounting is checked on
            // a committed txg.
            self.p.store.sync().map_err(|e| format!("{ctx}: {e}"))?;
            check_accounting(&self.p.dsl, &self.p.store).map_err(|e| format!("{ctx}: {e}"))?;
            pool_usage(&self.p.pool, &self.p.store, &self.p.dsl)
                .map_err(|e| format!("{ctx}: {e}"))?;
        }
        Ok(())
    }

    fn task(&mut self, op: Op) -> Res {
        let what = format!("{op:?}");
        self.durable(|w| {
            w.p.dsl
                .run(op)
                .map(|_| ())
                .map_err(|e| format!("{what}: {e}"))
        })
    }

    fn fsync(&mut self, ds: &str) -> Res {
        self.durable(|w| {
            w.mounts[ds]
                .fs
                .fsync(ROOT_INO, false)
                .map_err(|e| format!("fsync {ds}: {e:?}"))
        })
    }

    /// Snapshot `name` of `datasets[0]`, recursive when more are given (its descendants).
    fn snapshot(&mut self, datasets: &[&str], name: &str) -> Res {
        for d in datasets {
            self.m.snapshot(d, name);
        }
        let full = format!("{}@{name}", datasets[0]);
        self.task(snapshot_op(&full, datasets.len() > 1))
    }

    fn clone(&mut self, origin: &str, target: &str) -> Res {
        self.m.add_clone(origin, target);
        self.task(clone_op(origin, target))
    }

    /// Renames a dataset in the model (and its mount).
    fn rename_ds(&mut self, from: &str, to: &str) {
        let d = self.m.ds.remove(from).unwrap();
        self.m.ds.insert(to.to_string(), d);
        if let Some(mt) = self.mounts.remove(from) {
            self.mounts.insert(to.to_string(), mt);
        }
    }

    fn forget_snapshot(&mut self, full: &str) {
        let (ds, snap) = full.split_once('@').unwrap();
        self.m
            .ds
            .get_mut(ds)
            .unwrap()
            .snaps
            .retain(|s| s.name != snap);
    }
}

/// The workload, phase by phase (see the module documentation).
fn workload(w: &mut Work<'_>) -> Res {
    let (a, b, c) = ("sim/a", "sim/a/b", "sim/c");
    // 1, 2: a filesystem and its child.
    w.m.ds.insert(a.into(), Ds::default());
    w.task(create_op(a))?;
    w.m.ds.insert(b.into(), Ds::default());
    w.task(create_op(b))?;
    w.mount(a)?;
    w.mount(b)?;
    // 3: files in both, fsync.
    w.write(a, "f1", 0, &pattern(1, 200_000))?;
    w.change_name(a, "d", true)?;
    w.write(a, "d/g", 0, &pattern(2, 50_000))?;
    w.write(b, "h", 0, &pattern(3, 100_000))?;
    w.fsync(a)?;
    // 4: a snapshot of the parent alone.
    w.snapshot(&[a], "one")?;
    // 5: more writes, then a recursive snapshot in the same txg as them.
    w.write(a, "f1", 50_000, &pattern(4, 30_000))?;
    w.write(a, "d/g", 50_000, &pattern(5, 20_000))?;
    w.write(b, "h2", 0, &pattern(6, 10_000))?;
    w.snapshot(&[a, b], "two")?;
    // 6: a clone of the first snapshot.
    w.clone("sim/a@one", c)?;
    // 7: the clone diverges; fsync.
    w.mount(c)?;
    w.write(c, "f1", 0, &pattern(7, 70_000))?;
    w.change_name(c, "d/g", false)?;
    w.fsync(c)?;
    // 8: rename the child while it is mounted.
    w.rename_ds(b, "sim/a/b2");
    let b = "sim/a/b2";
    w.task(rename_op("sim/a/b", b))?;
    // 9: a write and a third snapshot.
    w.write(a, "f1", 0, &pattern(8, 10_000))?;
    w.snapshot(&[a], "three")?;
    // 10: destroy the child's snapshot.
    w.forget_snapshot("sim/a/b2@two");
    w.task(destroy_op("sim/a/b2@two", false))?;
    // 11: a write, then rollback -r to the first snapshot (the clone's origin) in the
    // same txg: the later snapshots go.
    w.write(a, "late", 0, &pattern(9, 40_000))?;
    w.unmount(a);
    let d = w.m.ds.get_mut(a).unwrap();
    d.snaps.truncate(1);
    d.tree = d.snaps[0].tree.clone();
    w.task(rollback_op("sim/a@one", true))?;
    w.mount(a)?;
    // 12: writes in both, a recursive snapshot.
    w.write(a, "f1", 100_000, &pattern(10, 60_000))?;
    w.write(b, "h", 0, &pattern(11, 5_000))?;
    w.snapshot(&[a, b], "four")?;
    // 13: a write in the clone, then destroy it in the same txg.
    w.write(c, "f1", 0, &pattern(12, 90_000))?;
    w.unmount(c);
    w.m.ds.remove(c);
    w.task(destroy_op(c, false))?;
    // 14: the former origin can go now.
    w.forget_snapshot("sim/a@one");
    w.task(destroy_op("sim/a@one", false))?;
    // 15: destroy -r of a snapshot name: the parent's and the child's.
    w.forget_snapshot("sim/a@four");
    w.forget_snapshot("sim/a/b2@four");
    w.task(destroy_op("sim/a@four", true))?;
    // 16, 17: a snapshot, renamed.
    w.write(a, "f2", 1 << 20, &pattern(13, 8_000))?;
    w.snapshot(&[a], "five")?;
    w.m.ds.get_mut(a).unwrap().snaps[0].name = "last".into();
    w.task(rename_op("sim/a@five", "sim/a@last"))?;
    // 18: two datasets at once (-p); the parent is never mounted.
    let (t, u, k) = ("sim/t", "sim/t/u", "sim/a/k");
    w.m.ds.insert(t.into(), Ds::default());
    w.m.ds.insert(u.into(), Ds::default());
    w.task(Op::Create {
        name: u.into(),
        kind: tank_dataset::DatasetKind::Filesystem,
        props: vec![],
        parents: true,
    })?;
    // 19: a write, a recursive snapshot of both.
    w.mount(u)?;
    w.write(u, "x", 0, &pattern(14, 30_000))?;
    w.snapshot(&[t, u], "x")?;
    // 20: a clone elsewhere, written to.
    w.clone("sim/t/u@x", k)?;
    w.mount(k)?;
    w.write(k, "x", 1000, &pattern(15, 3_000))?;
    w.fsync(k)?;
    // 21: destroy -R of the tree: both datasets, their snapshots, and the clone.
    w.unmount(u);
    w.unmount(k);
    for d in [t, u, k] {
        w.m.ds.remove(d);
    }
    w.task(Op::Destroy {
        name: t.into(),
        recursive: true,
        dependents: true,
    })?;
    Ok(())
}

struct Outcome {
    phases: Vec<Model>,
    acked: usize,
    ops_after_create: u64,
}

fn run(seed: u64, crash_at: Option<u64>) -> (SimFleet, Outcome) {
    let fleet = SimFleet::new(seed);
    let p = DsPool::on_sim(&fleet, DEV_SIZE);
    // Walking a filesystem to compare it must not change it.
    p.dsl
        .run(Op::SetProps {
            name: "sim".into(),
            props: vec![("atime".into(), Some("off".into()))],
        })
        .unwrap();
    let base = fleet.ops();
    if let Some(k) = crash_at {
        fleet.set_crash_at(Some(base + k));
    }
    let mut w = Work {
        p: &p,
        mounts: BTreeMap::new(),
        m: Model::default(),
        phases: vec![Model::default()],
        acked: 0,
        verify: crash_at.is_none(),
    };
    let r = workload(&mut w);
    if let Err(e) = r {
        // Only the crash may stop it.
        assert!(
            crash_at.is_some() && fleet.crashed(),
            "seed {seed:#x} cut {crash_at:?}: the workload failed before the cut: {e}"
        );
    }
    let out = Outcome {
        phases: std::mem::take(&mut w.phases),
        acked: w.acked,
        ops_after_create: fleet.ops() - base,
    };
    drop(w);
    let _ = p.pool.shutdown();
    drop(p);
    (fleet, out)
}

fn check(seed: u64, k: u64, mode: CrashMode) {
    let ctx = format!("seed {seed:#x} cut {k} {mode:?}");
    let (fleet, out) = run(seed, Some(k));
    let devs: Vec<DeviceRef> = fleet
        .crash_images(mode)
        .into_iter()
        .map(|(n, b)| Arc::new(tank_device::MemDevice::from_bytes(n, b)) as DeviceRef)
        .collect();
    let p = DsPool::import(devs).unwrap_or_else(|e| panic!("{ctx}: import failed: {e}"));
    let none = BTreeMap::new();
    let candidates = [out.acked, out.acked + 1];
    let found = candidates
        .iter()
        .filter_map(|i| out.phases.get(*i))
        .any(|m| matches(&p, m, &none).is_ok());
    if !found {
        let why: Vec<String> = candidates
            .iter()
            .filter_map(|i| out.phases.get(*i).map(|m| (i, m)))
            .map(|(i, m)| format!("phase {i}: {}", matches(&p, m, &none).unwrap_err()))
            .collect();
        panic!(
            "{ctx}: the pool shows neither the acknowledged phase {} nor the next: {why:?}",
            out.acked
        );
    }
    let verify = |p: &DsPool, when: &str| {
        check_accounting(&p.dsl, &p.store).unwrap_or_else(|e| panic!("{ctx}: {when}: {e}"));
        pool_usage(&p.pool, &p.store, &p.dsl).unwrap_or_else(|e| panic!("{ctx}: {when}: {e}"));
    };
    verify(&p, "after import");
    // The imported pool takes new sync tasks over everything it holds.
    p.dsl
        .run(snapshot_op("sim@after", true))
        .unwrap_or_else(|e| panic!("{ctx}: snapshot -r after the crash: {e}"));
    verify(&p, "after a recursive snapshot");
    p.dsl
        .run(destroy_op("sim@after", true))
        .unwrap_or_else(|e| panic!("{ctx}: destroy -r after the crash: {e}"));
    verify(&p, "after its destroy");
    p.pool.shutdown().unwrap();
}

/// Checks the cut points `0, every, 2 every, ...` of the workload, each with the crash
/// modes `modes(i)` (`i`: the cut's index).
fn check_cuts(seed: u64, every: usize, modes: impl Fn(u64) -> Vec<CrashMode>) {
    let (_, full) = run(seed, None);
    let n = full.ops_after_create;
    assert_eq!(
        full.acked + 1,
        full.phases.len(),
        "every phase acknowledged"
    );
    // The phases are distinct states, so matching one of them means something.
    for (i, w) in full.phases.windows(2).enumerate() {
        assert_ne!(w[0], w[1], "phases {i} and {}", i + 1);
    }
    assert!(n > 100, "workload too small: {n} ops");
    let start = std::time::Instant::now();
    let mut checked = 0;
    for (i, k) in (0..=n).step_by(every).enumerate() {
        for mode in modes(i as u64) {
            check(seed, k, mode);
            checked += 1;
        }
    }
    eprintln!(
        "seed {seed:#x}: {} operations over {} phases, {checked} crash images checked in {:.1} s",
        n,
        full.phases.len() - 1,
        start.elapsed().as_secs_f64()
    );
}

#[test]
fn crash_at_every_write_and_flush_across_sync_tasks() {
    check_cuts(seed(0xd5c0_0001), 1, |_| vec![CrashMode::DropUnflushed]);
}

/// The sync tasks' cuts on raidz2, with every block above 8 KiB a gang block.
#[test]
fn crash_across_sync_tasks_on_raidz2_with_gang_blocks() {
    on_raidz2_with_gang_blocks(|| {
        check_cuts(seed(0xd5c0_0003), 7, |i| {
            let mut modes = vec![CrashMode::DropUnflushed];
            if i % 4 == 0 {
                modes.push(CrashMode::KeepRandomSubset { seed: i });
            }
            modes
        })
    });
}

#[test]
fn crash_with_reordered_and_torn_unflushed_writes_across_sync_tasks() {
    check_cuts(seed(0xd5c0_0002), 3, |i| {
        vec![
            CrashMode::KeepRandomSubset { seed: i },
            CrashMode::TearLast { seed: i },
        ]
    });
}
