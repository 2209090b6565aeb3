//! fsx at the dataset level: seeded random operations on filesystems in several datasets
//! (a parent, its child, and clones of any snapshot, below either), with snapshots (some
//! recursive), rollbacks (to the latest snapshot, and with -r to an older one), snapshot
//! destruction (alone, -r for the name in every descendant, -R with the clones), clone
//! destruction, renames of clones and snapshots, changes of the properties that decide how
//! blocks are written, export/import and crash/import cycles, all against an in-memory
//! model: each dataset's paths and file contents, each snapshot's frozen copy, each clone's
//! origin.
//!
//! After a crash (the devices lose what was not flushed, at once or at a random operation
//! of a sync, sometimes keeping a random subset of the unflushed writes or tearing the
//! last one), the imported pool must show the model at the last durable point: the last
//! sync, fsync or sync task that returned, or the one in flight. A check walks every
//! dataset and every snapshot (read-only, through the POSIX layer) against the model and
//! recomputes the accounting from the trees (`check_accounting`, `pool_usage`). Sync tasks
//! that must be refused (rollback of a mounted dataset or past later snapshots without -r,
//! destroy of a clone's origin, a recursive snapshot whose name a child already has) are
//! refused and change nothing. Destroying every snapshot of a dataset frees exactly what
//! its `usedbysnapshots` said, and a fresh snapshot references what its dataset does.
//!
//! Seeded: a failure prints the seed and the step; `TANK_SEED=<hex>` replays a seed
//! (`TANK_FSX_SEEDS` and `TANK_FSX_STEPS` run more, `TANK_TRACE` prints every step).

mod posix_common;

use std::collections::BTreeMap;
use std::sync::Arc;

use posix_common::dsl::*;
use posix_common::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tank_dataset::posix::{Cred, Fs, RenameFlags, SetAttr, ROOT_INO};
use tank_dataset::{DatasetKind, Errno, Op};
use tank_device::{CrashMode, DeviceRef, SimFleet};

const DEV_SIZE: u64 = 128 << 20;
const PARENT: &str = "sim/a";
const CHILD: &str = "sim/a/b";
const NAMES: &[&str] = &["a", "b", "c", "d"];
const MAX_SNAPS: usize = 4;
const MAX_CLONES: usize = 3;

fn dirs(t: &Tree) -> Vec<String> {
    let mut v = vec![String::new()];
    v.extend(
        t.iter()
            .filter(|(_, e)| **e == Entry::Dir)
            .map(|(k, _)| k.clone()),
    );
    v
}

fn files(t: &Tree) -> Vec<String> {
    t.iter()
        .filter(|(_, e)| matches!(e, Entry::File(_)))
        .map(|(k, _)| k.clone())
        .collect()
}

/// `len` bytes: one value repeated (compressible) one time in five, else random.
fn data(rng: &mut ChaCha8Rng, len: usize) -> Vec<u8> {
    let mut v = vec![rng.gen::<u8>(); len];
    if rng.gen_bool(0.8) {
        rng.fill(&mut v[..]);
    }
    v
}

struct Run {
    seed: u64,
    rng: ChaCha8Rng,
    step: usize,
    fleet: SimFleet,
    p: Option<DsPool>,
    mounts: BTreeMap<String, Mounted>,
    m: Model,
    /// The model as of the last sync that returned.
    durable: Model,
    next_snap: u64,
    next_clone: u64,
    /// Counts of what ran, to show what a seed exercised.
    done: BTreeMap<&'static str, usize>,
}

impl Run {
    fn p(&self) -> &DsPool {
        self.p.as_ref().unwrap()
    }

    fn ctx(&self, what: &str) -> String {
        format!("seed {:#x} step {}: {what}", self.seed, self.step)
    }

    fn count(&mut self, what: &'static str) {
        if std::env::var_os("TANK_TRACE").is_some() {
            eprintln!("step {}: {what}", self.step);
        }
        *self.done.entry(what).or_default() += 1;
    }

    fn pick<T: Clone>(&mut self, v: &[T]) -> Option<T> {
        if v.is_empty() {
            None
        } else {
            Some(v[self.rng.gen_range(0..v.len())].clone())
        }
    }

    fn fs(&self, ds: &str) -> Arc<Fs> {
        self.mounts[ds].fs.clone()
    }

    fn mount(&mut self, ds: &str) {
        let m = self
            .p()
            .mount(ds)
            .unwrap_or_else(|e| panic!("{}", self.ctx(&e)));
        self.mounts.insert(ds.to_string(), m);
    }

    fn unmount(&mut self, ds: &str) {
        if let Some(m) = self.mounts.remove(ds) {
            self.p().unmount(m);
        }
    }

    fn mount_all(&mut self) {
        let names: Vec<String> = self.m.ds.keys().cloned().collect();
        for n in names {
            self.mount(&n);
        }
    }

    /// Runs a sync task; the txg it waits for makes everything before it durable.
    fn task(&mut self, op: Op) -> Result<Vec<u64>, i32> {
        let what = format!("{op:?}");
        let r = self.p().dsl.run(op);
        if std::env::var_os("TANK_TRACE").is_some() {
            eprintln!("step {}: {what}: {r:?}", self.step);
        }
        if let Err(e) = &r {
            assert!(
                !matches!(e.errno(), libc::EIO),
                "{}",
                self.ctx(&format!("{what}: {e}"))
            );
        }
        self.durable = self.m.clone();
        r.map_err(|e| e.errno())
    }

    fn task_ok(&mut self, op: Op) -> Vec<u64> {
        let what = format!("{op:?}");
        self.task(op)
            .unwrap_or_else(|e| panic!("{}", self.ctx(&format!("{what}: errno {e}"))))
    }

    /// A sync task the directory must refuse with `errno`, changing nothing.
    fn task_refused(&mut self, op: Op, errno: i32) {
        let what = format!("{op:?}");
        let before = self.p().names();
        let got = self.task(op);
        assert_eq!(
            got.err(),
            Some(errno),
            "{}",
            self.ctx(&format!("{what} must be refused"))
        );
        assert_eq!(self.p().names(), before, "{}", self.ctx(&what));
        self.count("refused task");
    }

    fn sync(&mut self) {
        self.p().store.sync().expect("sync");
        self.durable = self.m.clone();
    }

    // ---- file operations in one dataset ----

    fn file_op(&mut self, ds: &str) {
        let root = Cred::root();
        let fs = self.fs(ds);
        let tree = self.m.ds[ds].tree.clone();
        match self.rng.gen_range(0..100) {
            0..=14 => {
                // create a file or a directory (two levels at most)
                let dir = self.pick(&dirs(&tree)).unwrap();
                let name = self.pick(NAMES).unwrap();
                let path = join(&dir, name);
                let mkdir = dir.split('/').count() < 2 && self.rng.gen_bool(0.3);
                let ctx = self.ctx(&format!("{ds}: create {path} (dir {mkdir})"));
                let parent = lookup(&fs, &dir).expect("lookup");
                let got = if mkdir {
                    fs.mkdir(&root, parent, os(name), 0o755)
                } else {
                    fs.mknod(&root, parent, os(name), libc::S_IFREG | 0o644, 0)
                };
                if tree.contains_key(&path) {
                    assert_eq!(got.err(), Some(Errno::EEXIST), "{ctx}");
                    return;
                }
                got.expect(&ctx);
                let e = if mkdir {
                    Entry::Dir
                } else {
                    Entry::File(Vec::new())
                };
                self.m.ds.get_mut(ds).unwrap().tree.insert(path, e);
                self.count("create");
            }
            15..=49 => {
                // write at a random offset: overwrite, extend, or leave a hole
                let Some(path) = self.pick(&files(&tree)) else {
                    return;
                };
                let len = self.rng.gen_range(1..65_536);
                let off = self.rng.gen_range(0..400_000usize);
                let buf = data(&mut self.rng, len);
                let ctx = self.ctx(&format!("{ds}: write {path} at {off} len {len}"));
                let ino = lookup(&fs, &path).expect("lookup");
                fs.write(&root, ino, off as u64, &buf, false).expect(&ctx);
                apply_write(&mut self.m.ds.get_mut(ds).unwrap().tree, &path, off, &buf);
                self.count("write");
            }
            50..=59 => {
                // truncate (shrink or extend)
                let Some(path) = self.pick(&files(&tree)) else {
                    return;
                };
                let size = self.rng.gen_range(0..450_000usize);
                let ctx = self.ctx(&format!("{ds}: truncate {path} to {size}"));
                let set = SetAttr {
                    size: Some(size as u64),
                    ..SetAttr::default()
                };
                fs.setattr(&root, lookup(&fs, &path).expect("lookup"), &set)
                    .expect(&ctx);
                let Some(Entry::File(d)) = self.m.ds.get_mut(ds).unwrap().tree.get_mut(&path)
                else {
                    unreachable!()
                };
                d.resize(size, 0);
                self.count("truncate");
            }
            60..=69 => {
                // unlink a file, or remove a directory (refused while not empty)
                let Some(path) = self.pick(&tree.keys().cloned().collect::<Vec<_>>()) else {
                    return;
                };
                let (dir, name) = split(&path);
                let parent = lookup(&fs, dir).expect("lookup");
                let ctx = self.ctx(&format!("{ds}: remove {path}"));
                if tree[&path] == Entry::Dir {
                    let below = format!("{path}/");
                    let got = fs.rmdir(&root, parent, os(name));
                    if tree.keys().any(|k| k.starts_with(&below)) {
                        assert_eq!(got, Err(Errno::ENOTEMPTY), "{ctx}");
                        return;
                    }
                    got.expect(&ctx);
                } else {
                    fs.unlink(&root, parent, os(name)).expect(&ctx);
                }
                self.m.ds.get_mut(ds).unwrap().tree.remove(&path);
                self.count("remove");
            }
            70..=84 => {
                // rename a file or a directory, replacing a file at the target
                let Some(src) = self.pick(&tree.keys().cloned().collect::<Vec<_>>()) else {
                    return;
                };
                let dir = self.pick(&dirs(&tree)).unwrap();
                let name = self.pick(NAMES).unwrap();
                let dst = join(&dir, name);
                let src_dir = tree[&src] == Entry::Dir;
                let below = format!("{src}/");
                if dst == src
                    || dst.starts_with(&below)
                    || matches!(tree.get(&dst), Some(Entry::Dir))
                    || (src_dir && tree.contains_key(&dst))
                {
                    return;
                }
                let ctx = self.ctx(&format!("{ds}: rename {src} -> {dst}"));
                let (sdir, sname) = split(&src);
                fs.rename(
                    &root,
                    lookup(&fs, sdir).expect("lookup"),
                    os(sname),
                    lookup(&fs, &dir).expect("lookup"),
                    os(name),
                    RenameFlags::default(),
                )
                .expect(&ctx);
                let t = &mut self.m.ds.get_mut(ds).unwrap().tree;
                let moved: Vec<String> = t
                    .keys()
                    .filter(|k| **k == src || k.starts_with(&below))
                    .cloned()
                    .collect();
                for k in moved {
                    let e = t.remove(&k).unwrap();
                    t.insert(format!("{dst}{}", &k[src.len()..]), e);
                }
                self.count("rename");
            }
            85..=92 => {
                // read back a range
                let Some(path) = self.pick(&files(&tree)) else {
                    return;
                };
                let Entry::File(d) = &tree[&path] else {
                    unreachable!()
                };
                let off = self.rng.gen_range(0..d.len() + 10);
                let len = self.rng.gen_range(0..200_000usize);
                let ctx = self.ctx(&format!("{ds}: read {path} at {off} len {len}"));
                let got = fs
                    .read(lookup(&fs, &path).expect("lookup"), off as u64, len as u32)
                    .expect(&ctx);
                let (from, to) = (off.min(d.len()), (off + len).min(d.len()));
                assert!(got[..] == d[from..to], "{ctx}: content differs");
            }
            _ => {
                let ctx = self.ctx(&format!("{ds}: fsync"));
                let fallbacks = self.p().pool.zil.stats().fallbacks;
                fs.fsync(ROOT_INO, false).expect(&ctx);
                if self.p().pool.zil.stats().fallbacks > fallbacks {
                    // The log could not take it: a txg made everything durable.
                    self.durable = self.m.clone();
                } else {
                    // A log commit: this dataset's changes are durable, the others' are not.
                    let now = self.m.ds[ds].clone();
                    self.durable.ds.insert(ds.to_string(), now);
                }
                self.count("fsync");
            }
        }
    }

    // ---- dataset operations ----

    fn snapshot(&mut self) {
        let ds = self
            .pick(&self.m.ds.keys().cloned().collect::<Vec<_>>())
            .unwrap();
        let targets = self.m.subtree(&ds);
        let recursive = targets.len() > 1 && self.rng.gen_bool(0.6);
        if recursive && self.rng.gen_bool(0.15) {
            // A name one of the descendants already has: all are refused.
            let taken: Vec<String> = targets[1..]
                .iter()
                .flat_map(|d| self.m.ds[d].snaps.iter().map(|s| s.name.clone()))
                .filter(|n| !self.m.ds[&ds].snaps.iter().any(|s| s.name == *n))
                .collect();
            if let Some(name) = self.pick(&taken) {
                self.task_refused(snapshot_op(&format!("{ds}@{name}"), true), libc::EEXIST);
                return;
            }
        }
        let targets = if recursive { targets } else { vec![ds.clone()] };
        if targets
            .iter()
            .any(|d| self.m.ds[d].snaps.len() >= MAX_SNAPS)
        {
            return;
        }
        let name = format!("s{}", self.next_snap);
        self.next_snap += 1;
        for d in &targets {
            self.m.snapshot(d, &name);
        }
        self.task_ok(snapshot_op(&format!("{ds}@{name}"), recursive));
        // A fresh snapshot references what its dataset does, which wrote nothing since.
        for d in &targets {
            let p = self.p();
            let referenced = p.prop(d, "referenced");
            let snap = format!("{d}@{name}");
            assert_eq!(
                p.prop(&snap, "referenced"),
                referenced,
                "{}",
                self.ctx(&snap)
            );
            assert_eq!(p.prop(d, "written"), 0, "{}", self.ctx(d));
        }
        self.count(if recursive {
            "recursive snapshot"
        } else {
            "snapshot"
        });
    }

    fn rollback(&mut self) {
        let with_snaps: Vec<String> = self
            .m
            .ds
            .iter()
            .filter(|(_, d)| !d.snaps.is_empty())
            .map(|(k, _)| k.clone())
            .collect();
        let Some(ds) = self.pick(&with_snaps) else {
            return;
        };
        let snaps = self.m.ds[&ds].snaps.clone();
        let latest = snaps.len() - 1;
        if self.rng.gen_bool(0.1) {
            // A mounted dataset cannot be rolled back.
            let s = format!("{ds}@{}", snaps[latest].name);
            self.task_refused(rollback_op(&s, false), libc::EBUSY);
            return;
        }
        let to = if self.rng.gen_bool(0.6) {
            latest
        } else {
            self.rng.gen_range(0..snaps.len())
        };
        let target = format!("{ds}@{}", snaps[to].name);
        let later = &snaps[to + 1..];
        self.unmount(&ds);
        if !later.is_empty() && self.rng.gen_bool(0.3) {
            self.task_refused(rollback_op(&target, false), libc::EBUSY);
        } else if self.m.has_clones(&ds, later) {
            self.task_refused(rollback_op(&target, true), libc::EBUSY);
        } else {
            let d = self.m.ds.get_mut(&ds).unwrap();
            d.tree = snaps[to].tree.clone();
            d.snaps.truncate(to + 1);
            self.task_ok(rollback_op(&target, !later.is_empty()));
            assert_eq!(self.p().prop(&ds, "written"), 0, "{}", self.ctx(&ds));
            self.count(if later.is_empty() {
                "rollback"
            } else {
                "rollback -r"
            });
        }
        self.mount(&ds);
    }

    fn destroy_snapshot(&mut self) {
        let all = self.m.snapshots();
        let Some((ds, snap)) = self.pick(&all) else {
            return;
        };
        // -r: the snapshot of that name in every descendant too (atomically).
        let recursive = self.rng.gen_bool(0.3);
        let targets: Vec<String> = if recursive {
            self.m
                .subtree(&ds)
                .into_iter()
                .filter(|d| self.m.ds[d].snaps.iter().any(|s| s.name == snap))
                .collect()
        } else {
            vec![ds.clone()]
        };
        let full = format!("{ds}@{snap}");
        let cloned = targets
            .iter()
            .any(|d| !self.m.clones_of(&format!("{d}@{snap}")).is_empty());
        if cloned && self.rng.gen_bool(0.6) {
            // The origin of a clone stays (destroying it needs -R).
            self.task_refused(destroy_op(&full, recursive), libc::EBUSY);
            return;
        }
        // -R: the clones go too, with their snapshots and the clones of those.
        let mut gone: Vec<String> = Vec::new();
        let mut origins: Vec<String> = targets.iter().map(|d| format!("{d}@{snap}")).collect();
        while let Some(o) = origins.pop() {
            for c in self.m.clones_of(&o) {
                if !gone.contains(&c) {
                    origins.extend(
                        self.m.ds[&c]
                            .snaps
                            .iter()
                            .map(|s| format!("{c}@{}", s.name)),
                    );
                    gone.push(c);
                }
            }
        }
        let mut expect = targets.len();
        for c in &gone {
            self.unmount(c);
            expect += 1 + self.m.ds.remove(c).unwrap().snaps.len();
        }
        for d in &targets {
            self.m
                .ds
                .get_mut(d)
                .unwrap()
                .snaps
                .retain(|s| s.name != snap);
        }
        let destroyed = self.task_ok(Op::Destroy {
            name: full.clone(),
            recursive,
            dependents: cloned,
        });
        assert_eq!(destroyed.len(), expect, "{}", self.ctx(&full));
        self.count(match (recursive, cloned) {
            (_, true) => "destroy snapshot -R",
            (true, false) => "destroy snapshot -r",
            (false, false) => "destroy snapshot",
        });
    }

    /// Destroys every snapshot of a dataset: it frees exactly what usedbysnapshots said.
    fn destroy_all_snapshots(&mut self) {
        let cands: Vec<String> = self
            .m
            .ds
            .iter()
            .filter(|(k, d)| !d.snaps.is_empty() && !self.m.has_clones(k, &d.snaps))
            .map(|(k, _)| k.clone())
            .collect();
        let Some(ds) = self.pick(&cands) else {
            return;
        };
        self.sync();
        let (used, by_snaps, usage) = {
            let p = self.p();
            let u = pool_usage(&p.pool, &p.store, &p.dsl).unwrap_or_else(|e| panic!("{e}"));
            (p.prop(&ds, "used"), p.prop(&ds, "usedbysnapshots"), u)
        };
        let mut snaps = self.m.ds[&ds].snaps.clone();
        if self.rng.gen_bool(0.5) {
            snaps.reverse();
        }
        for s in &snaps {
            self.task_ok(destroy_op(&format!("{ds}@{}", s.name), false));
        }
        self.m.ds.get_mut(&ds).unwrap().snaps.clear();
        self.durable = self.m.clone();
        let p = self.p();
        let after = pool_usage(&p.pool, &p.store, &p.dsl).unwrap_or_else(|e| panic!("{e}"));
        let ctx = self.ctx(&format!("destroy every snapshot of {ds}"));
        assert_eq!(p.prop(&ds, "usedbysnapshots"), 0, "{ctx}");
        assert_eq!(p.prop(&ds, "used"), used - by_snaps, "{ctx}");
        // One device: allocated bytes are the accounted (deflated) bytes.
        assert_eq!(usage.datasets - after.datasets, by_snaps, "{ctx}");
        self.count("destroy every snapshot");
    }

    fn clone(&mut self) {
        let clones = self.m.clones().len();
        let all: Vec<String> = self
            .m
            .snapshots()
            .iter()
            .map(|(d, s)| format!("{d}@{s}"))
            .collect();
        if clones >= MAX_CLONES {
            return;
        }
        let Some(origin) = self.pick(&all) else {
            return;
        };
        let parent = if self.rng.gen_bool(0.5) {
            "sim"
        } else {
            PARENT
        };
        let target = format!("{parent}/c{}", self.next_clone);
        self.next_clone += 1;
        self.m.add_clone(&origin, &target);
        self.task_ok(clone_op(&origin, &target));
        let p = self.p();
        assert_eq!(
            p.prop(&target, "referenced"),
            p.prop(&origin, "referenced"),
            "{}",
            self.ctx(&target)
        );
        self.mount(&target);
        self.count("clone");
    }

    fn destroy_clone(&mut self) {
        let clones = self.m.clones();
        let Some(ds) = self.pick(&clones) else {
            return;
        };
        if self.m.has_clones(CHILD, &self.m.ds[CHILD].snaps.clone()) && self.rng.gen_bool(0.2) {
            // A dataset whose snapshots have clones cannot go with -r alone.
            self.unmount(CHILD);
            self.task_refused(destroy_op(CHILD, true), libc::EBUSY);
            self.mount(CHILD);
            return;
        }
        if self.rng.gen_bool(0.1) {
            // Mounted: busy.
            self.task_refused(destroy_op(&ds, true), libc::EBUSY);
            return;
        }
        let snaps = self.m.ds[&ds].snaps.clone();
        self.unmount(&ds);
        if self.m.has_clones(&ds, &snaps) {
            self.task_refused(destroy_op(&ds, true), libc::EBUSY);
            self.mount(&ds);
            return;
        }
        if !snaps.is_empty() && self.rng.gen_bool(0.3) {
            self.task_refused(destroy_op(&ds, false), libc::EBUSY);
            self.mount(&ds);
            return;
        }
        self.m.ds.remove(&ds);
        self.task_ok(destroy_op(&ds, true));
        self.count("destroy clone");
    }

    /// Moves a clone to the other parent, or renames a snapshot.
    fn rename(&mut self) {
        if self.rng.gen_bool(0.5) {
            let clones = self.m.clones();
            let Some(from) = self.pick(&clones) else {
                return;
            };
            let leaf = from.rsplit_once('/').unwrap().1;
            let to = if from.starts_with(&format!("{PARENT}/")) {
                format!("sim/{leaf}")
            } else {
                format!("{PARENT}/{leaf}")
            };
            let d = self.m.ds.remove(&from).unwrap();
            self.m.ds.insert(to.clone(), d);
            for d in self.m.ds.values_mut() {
                if let Some(o) = &mut d.origin {
                    if let Some(rest) = o.strip_prefix(&format!("{from}@")) {
                        *o = format!("{to}@{rest}");
                    }
                }
            }
            self.task_ok(rename_op(&from, &to));
            let m = self.mounts.remove(&from).unwrap();
            self.mounts.insert(to, m);
        } else {
            let all = self.m.snapshots();
            let Some((ds, snap)) = self.pick(&all) else {
                return;
            };
            let new = format!("s{}", self.next_snap);
            self.next_snap += 1;
            let (from, to) = (format!("{ds}@{snap}"), format!("{ds}@{new}"));
            for s in &mut self.m.ds.get_mut(&ds).unwrap().snaps {
                if s.name == snap {
                    s.name = new.clone();
                }
            }
            for d in self.m.ds.values_mut() {
                if d.origin.as_deref() == Some(&from) {
                    d.origin = Some(to.clone());
                }
            }
            self.task_ok(rename_op(&from, &to));
        }
        self.count("rename dataset or snapshot");
    }

    /// Sets or inherits a property that decides how blocks are written (the datasets
    /// below inherit it at once: `check_policies`).
    fn set_prop(&mut self) {
        let mut names: Vec<String> = vec!["sim".into()];
        names.extend(self.m.ds.keys().cloned());
        let ds = self.pick(&names).unwrap();
        let (prop, values): (&str, &[&str]) = match self.rng.gen_range(0..3) {
            0 => ("compression", &["off", "lz4", "zstd"]),
            1 => ("checksum", &["blake3", "sha256", "xxh128"]),
            _ => ("copies", &["1", "2"]),
        };
        let value = if self.rng.gen_bool(0.3) {
            None
        } else {
            self.pick(values).map(String::from)
        };
        self.task_ok(Op::SetProps {
            name: ds,
            props: vec![(prop.into(), value)],
        });
        self.count("set or inherit a property");
    }

    // ---- pool cycles ----

    fn close(&mut self) -> Vec<DeviceRef> {
        let names: Vec<String> = self.mounts.keys().cloned().collect();
        for n in names {
            self.unmount(&n);
        }
        self.p.take().unwrap().export()
    }

    fn export_import(&mut self) {
        let devs = self.close();
        self.durable = self.m.clone();
        self.p = Some(DsPool::import(devs).unwrap_or_else(|e| panic!("{}", self.ctx(&e))));
        self.mount_all();
        self.check("export/import");
        self.count("export/import");
    }

    /// Loses power (now, or at a random operation of a sync or a snapshot), imports what
    /// the devices kept, and compares with the last durable state (or the one in flight).
    fn crash(&mut self) {
        let mut candidates = vec![self.durable.clone()];
        let mode = match self.rng.gen_range(0..4) {
            0 => CrashMode::KeepRandomSubset {
                seed: self.rng.gen(),
            },
            1 => CrashMode::TearLast {
                seed: self.rng.gen(),
            },
            _ => CrashMode::DropUnflushed,
        };
        let how = self.rng.gen_range(0..3);
        if how > 0 {
            let k = self.rng.gen_range(0..60);
            self.fleet.set_crash_at(Some(self.fleet.ops() + k));
            let ds = self.pick(&self.m.ds.keys().cloned().collect::<Vec<_>>());
            let ds = ds.unwrap();
            let r = if how == 2 && self.m.ds[&ds].snaps.len() < MAX_SNAPS {
                let name = format!("s{}", self.next_snap);
                self.next_snap += 1;
                self.m.snapshot(&ds, &name);
                self.p()
                    .dsl
                    .run(snapshot_op(&format!("{ds}@{name}"), false))
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            } else {
                self.p().store.sync().map_err(|e| e.to_string())
            };
            match r {
                Ok(()) => candidates = vec![self.m.clone()],
                Err(e) => {
                    let ctx = self.ctx(&format!("sync before the crash point: {e}"));
                    assert!(self.fleet.crashed(), "{ctx}");
                    candidates.push(self.m.clone());
                }
            }
        }
        // Whatever was not reached by the crash point is lost now.
        self.fleet.set_crash_at(Some(self.fleet.ops()));
        let images = self.fleet.crash_images(mode);
        self.mounts.clear();
        if let Some(p) = self.p.take() {
            let _ = p.pool.shutdown();
        }
        self.fleet = SimFleet::new(self.rng.gen());
        let devs: Vec<DeviceRef> = images
            .into_iter()
            .map(|(n, img)| Arc::new(self.fleet.device_from_image(&n, img)) as DeviceRef)
            .collect();
        let ctx = self.ctx(&format!("crash ({mode:?}, {how})"));
        self.p = Some(DsPool::import(devs).unwrap_or_else(|e| panic!("{ctx}: import: {e}")));
        let found = candidates
            .iter()
            .position(|c| matches(self.p(), c, &self.mounts).is_ok())
            .unwrap_or_else(|| {
                let why: Vec<String> = candidates
                    .iter()
                    .map(|c| matches(self.p(), c, &self.mounts).unwrap_err())
                    .collect();
                panic!("{ctx}: no durable state matches: {why:?}")
            });
        self.m = candidates.swap_remove(found);
        self.durable = self.m.clone();
        self.mount_all();
        self.check("after the crash");
        self.count("crash/import");
    }

    // ---- checks ----

    fn check(&mut self, what: &str) {
        self.sync();
        let ctx = self.ctx(what);
        matches(self.p(), &self.m, &self.mounts).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        let p = self.p();
        check_accounting(&p.dsl, &p.store).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        check_policies(&p.dsl).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        pool_usage(&p.pool, &p.store, &p.dsl).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        self.count("check");
    }

    fn step(&mut self) {
        match self.rng.gen_range(0..1000) {
            0..=699 => {
                let ds = self.pick(&self.m.ds.keys().cloned().collect::<Vec<_>>());
                self.file_op(&ds.unwrap());
            }
            700..=759 => self.snapshot(),
            760..=794 => self.rollback(),
            795..=829 => self.destroy_snapshot(),
            830..=839 => self.destroy_all_snapshots(),
            840..=869 => self.clone(),
            870..=884 => self.destroy_clone(),
            885..=894 => self.rename(),
            895..=904 => self.set_prop(),
            905..=939 => self.check("check"),
            940..=964 => self.export_import(),
            _ => self.crash(),
        }
    }
}

fn run(seed: u64, steps: usize) {
    eprintln!("dsl fsx seed {seed:#x} ({steps} steps; replay with TANK_SEED={seed:x})");
    let start = std::time::Instant::now();
    let fleet = SimFleet::new(seed);
    let p = DsPool::on_sim(&fleet, DEV_SIZE);
    let props = |v: &[(&str, &str)]| {
        v.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<Vec<_>>()
    };
    for (name, pr) in [
        (PARENT, props(&[("recordsize", "32K"), ("copies", "2")])),
        (
            CHILD,
            props(&[("recordsize", "8K"), ("compression", "off")]),
        ),
    ] {
        p.dsl
            .run(Op::Create {
                name: name.into(),
                kind: DatasetKind::Filesystem,
                props: pr,
                parents: false,
            })
            .unwrap();
    }
    let mut m = Model::default();
    for n in [PARENT, CHILD] {
        m.ds.insert(
            n.to_string(),
            Ds {
                tree: Tree::new(),
                snaps: vec![],
                origin: None,
            },
        );
    }
    let mut r = Run {
        seed,
        rng: ChaCha8Rng::seed_from_u64(seed),
        step: 0,
        fleet,
        p: Some(p),
        mounts: BTreeMap::new(),
        durable: m.clone(),
        m,
        next_snap: 0,
        next_clone: 0,
        done: BTreeMap::new(),
    };
    r.mount_all();
    for step in 0..steps {
        r.step = step;
        r.step();
    }
    r.step = steps;
    r.export_import();
    eprintln!(
        "  {:.1} s, {} datasets at the end; ran {:?}",
        start.elapsed().as_secs_f64(),
        r.m.ds.len(),
        r.done
    );
}

#[test]
fn dsl_fsx_random_operations_against_a_model() {
    let base = seed(0xd5f0_0001);
    let knob = |name: &str, default: u64| -> u64 {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let steps = knob("TANK_FSX_STEPS", 1000) as usize;
    for i in 0..knob("TANK_FSX_SEEDS", 5) {
        run(base.wrapping_add(i), steps);
    }
}

/// Rollback and destroy walk the dataset's tree in syncing context; when the writes of the
/// same txg changed that tree, its new nodes may still be queued for the devices, and the
/// walk must not read them from there first (it found garbage and suspended the pool).
#[test]
fn rollback_and_destroy_in_the_txg_of_the_last_writes() {
    let p = DsPool::on_sim(&SimFleet::new(7), DEV_SIZE);
    p.dsl.run(create_op(PARENT)).unwrap();
    let root = Cred::root();
    let fill = |m: &Mounted, round: u64| {
        for i in 0..40u64 {
            let name = format!("f{i}");
            let ino = match lookup(&m.fs, &name) {
                Ok(ino) => ino,
                Err(_) => {
                    m.fs.mknod(&root, ROOT_INO, os(&name), libc::S_IFREG | 0o644, 0)
                        .unwrap()
                        .ino
                }
            };
            let mut buf = vec![0u8; 20_000];
            ChaCha8Rng::seed_from_u64(round * 100 + i).fill(&mut buf[..]);
            m.fs.write(&root, ino, 0, &buf, false).unwrap();
        }
    };
    let m = p.mount(PARENT).unwrap();
    fill(&m, 0);
    p.store.sync().unwrap();
    let want = tree_of(&m.fs, &m.objset).unwrap();
    p.dsl.run(snapshot_op("sim/a@base", false)).unwrap();
    p.unmount(m);
    for round in 1..=10 {
        // Rewrite every file, then roll back in the same txg.
        let m = p.mount(PARENT).unwrap();
        fill(&m, round);
        p.unmount(m);
        p.dsl
            .run(rollback_op("sim/a@base", false))
            .unwrap_or_else(|e| panic!("round {round}: rollback: {e}"));
        // A clone rewritten, then destroyed in the same txg.
        let clone = format!("sim/c{round}");
        p.dsl.run(clone_op("sim/a@base", &clone)).unwrap();
        let m = p.mount(&clone).unwrap();
        fill(&m, round + 100);
        p.unmount(m);
        p.dsl
            .run(destroy_op(&clone, false))
            .unwrap_or_else(|e| panic!("round {round}: destroy: {e}"));
    }
    assert_eq!(p.dataset_tree(PARENT).unwrap(), want);
    check_accounting(&p.dsl, &p.store).unwrap();
    pool_usage(&p.pool, &p.store, &p.dsl).unwrap();
}
