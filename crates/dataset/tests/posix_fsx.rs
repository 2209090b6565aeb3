//! fsx-style random operations against an in-memory model of the namespace and of every
//! file's bytes, with sync, export and import cycles after which the whole tree is walked
//! (`fsck`) and compared with the model.
//!
//! The model is keyed by inode number (numbers persist), so hard links, renames and
//! unlinked-but-open files are modelled exactly. Each operation also predicts its errno
//! (EEXIST, ENOENT, ENOTEMPTY, EISDIR, ENOTDIR, EINVAL for a directory moved into itself,
//! ...). Seeded: a failure prints the seed and the step; `TANK_SEED=<hex>` replays a seed.

mod posix_common;

use std::collections::{BTreeMap, HashMap};

use posix_common::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tank_dataset::posix::{Cred, FileKind, Ino, RenameFlags, SetAttr, XattrMode, ROOT_INO};
use tank_dataset::Errno;

#[derive(Debug, Clone)]
enum Node {
    File(Vec<u8>),
    Dir(BTreeMap<Vec<u8>, Ino>),
    Symlink(Vec<u8>),
}

#[derive(Debug, Clone)]
struct MInode {
    node: Node,
    parent: Ino,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    links: u32,
}

#[derive(Debug, Default)]
struct Model {
    inodes: HashMap<Ino, MInode>,
    /// Open handles (inode numbers; one entry per open).
    open: Vec<Ino>,
}

const NAMES: &[&str] = &["a", "b", "c", "d", "e", "f", "long-name-of-a-file", "x.txt"];

impl Model {
    fn new() -> Self {
        let mut m = Model::default();
        m.inodes.insert(
            ROOT_INO,
            MInode {
                node: Node::Dir(BTreeMap::new()),
                parent: ROOT_INO,
                xattrs: BTreeMap::new(),
                links: 1,
            },
        );
        m
    }

    fn dir(&self, ino: Ino) -> &BTreeMap<Vec<u8>, Ino> {
        match &self.inodes[&ino].node {
            Node::Dir(d) => d,
            _ => panic!("{ino} is not a directory"),
        }
    }

    fn dir_mut(&mut self, ino: Ino) -> &mut BTreeMap<Vec<u8>, Ino> {
        match &mut self.inodes.get_mut(&ino).unwrap().node {
            Node::Dir(d) => d,
            _ => panic!("{ino} is not a directory"),
        }
    }

    fn dirs(&self) -> Vec<Ino> {
        let mut v: Vec<Ino> = self
            .inodes
            .iter()
            .filter(|(_, i)| matches!(i.node, Node::Dir(_)) && i.links > 0)
            .map(|(k, _)| *k)
            .collect();
        v.sort();
        v
    }

    fn linked(&self, file_only: bool) -> Vec<Ino> {
        let mut v: Vec<Ino> = self
            .inodes
            .iter()
            .filter(|(_, i)| i.links > 0 && (!file_only || matches!(i.node, Node::File(_))))
            .map(|(k, _)| *k)
            .collect();
        v.sort();
        v
    }

    fn is_dir(&self, ino: Ino) -> bool {
        matches!(self.inodes[&ino].node, Node::Dir(_))
    }

    fn is_ancestor(&self, a: Ino, mut d: Ino) -> bool {
        loop {
            if d == a {
                return true;
            }
            if d == ROOT_INO {
                return false;
            }
            d = self.inodes[&d].parent;
        }
    }

    /// Drops a link; forgets the inode when nothing refers to it any more.
    fn unref(&mut self, ino: Ino) {
        let i = self.inodes.get_mut(&ino).unwrap();
        i.links -= 1;
        if i.links == 0 && !self.open.contains(&ino) {
            self.inodes.remove(&ino);
        }
    }

    fn release(&mut self, at: usize) {
        let ino = self.open.swap_remove(at);
        if self.inodes[&ino].links == 0 && !self.open.contains(&ino) {
            self.inodes.remove(&ino);
        }
    }

    /// The image `fsck` should find: every linked inode.
    fn image(&self) -> Image {
        self.inodes
            .iter()
            .filter(|(_, i)| i.links > 0)
            .map(|(ino, i)| {
                let content = match &i.node {
                    Node::File(d) => Content::File(d.clone()),
                    Node::Dir(d) => Content::Dir(d.clone()),
                    Node::Symlink(t) => Content::Symlink(t.clone()),
                };
                (
                    *ino,
                    Found {
                        content,
                        xattrs: i.xattrs.clone(),
                    },
                )
            })
            .collect()
    }
}

fn data(rng: &mut ChaCha8Rng, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    if rng.gen_bool(0.3) {
        let b: u8 = rng.gen();
        v.iter_mut().for_each(|x| *x = b);
    } else {
        rng.fill(&mut v[..]);
    }
    v
}

thread_local! {
    /// Outcomes seen (errno name or "ok"), to show what a run exercised.
    static OUTCOMES: std::cell::RefCell<BTreeMap<&'static str, usize>> = Default::default();
}

fn expect<T: std::fmt::Debug>(
    ctx: &str,
    got: Result<T, Errno>,
    want: Result<(), Errno>,
) -> Option<T> {
    let name = match &want {
        Ok(()) => "ok",
        Err(e) => e.name(),
    };
    OUTCOMES.with(|o| *o.borrow_mut().entry(name).or_default() += 1);
    match (got, want) {
        (Ok(v), Ok(())) => Some(v),
        (Err(g), Err(w)) if g == w => None,
        (g, w) => panic!("{ctx}: got {g:?}, expected {w:?}"),
    }
}

struct Run {
    seed: u64,
    rng: ChaCha8Rng,
    t: Option<MemFs>,
    m: Model,
    step: usize,
}

impl Run {
    fn fs(&self) -> &tank_dataset::posix::Fs {
        &self.t.as_ref().unwrap().fs
    }

    fn ctx(&self, what: &str) -> String {
        format!("seed {:#x} step {}: {what}", self.seed, self.step)
    }

    fn pick<T: Copy>(&mut self, v: &[T]) -> Option<T> {
        if v.is_empty() {
            None
        } else {
            Some(v[self.rng.gen_range(0..v.len())])
        }
    }

    fn name(&mut self) -> Vec<u8> {
        NAMES[self.rng.gen_range(0..NAMES.len())]
            .as_bytes()
            .to_vec()
    }

    fn check(&mut self) {
        let t = self.t.as_ref().unwrap();
        let img = fsck(&t.fs, &t.store).unwrap_or_else(|e| panic!("{}", self.ctx(&e)));
        let want = self.m.image();
        if img != want {
            for (ino, f) in &want {
                match img.get(ino) {
                    None => panic!("{}", self.ctx(&format!("inode {ino} missing: {f:?}"))),
                    Some(g) if g != f => panic!(
                        "{}",
                        self.ctx(&format!("inode {ino} differs: got {g:?} want {f:?}"))
                    ),
                    _ => {}
                }
            }
            let extra: Vec<&Ino> = img.keys().filter(|k| !want.contains_key(k)).collect();
            panic!("{}", self.ctx(&format!("extra inodes {extra:?}")));
        }
    }

    fn reopen(&mut self) {
        // Handles do not survive: the unlinked set frees their inodes at mount.
        let open = std::mem::take(&mut self.m.open);
        for ino in open {
            if self.m.inodes.get(&ino).is_some_and(|i| i.links == 0) {
                self.m.inodes.remove(&ino);
            }
        }
        let t = self.t.take().unwrap();
        self.t = Some(t.reopen());
    }

    fn step(&mut self) {
        let root = Cred::root();
        let op = self.rng.gen_range(0..100);
        match op {
            0..=9 => {
                // create a file, or a directory, or a symlink
                let dir = self.pick(&self.m.dirs()).unwrap();
                let name = self.name();
                let exists = self.m.dir(dir).contains_key(&name);
                let want = if exists { Err(Errno::EEXIST) } else { Ok(()) };
                let kind = self.rng.gen_range(0..4);
                let ctx = self.ctx(&format!("create kind {kind} in {dir} {name:?}"));
                let (node, got) = match kind {
                    0 => (
                        Node::Dir(BTreeMap::new()),
                        self.fs().mkdir(&root, dir, osb(&name), 0o755),
                    ),
                    1 => {
                        let len = self.rng.gen_range(1..300);
                        let target = data(&mut self.rng, len)
                            .into_iter()
                            .map(|b| b % 90 + 33)
                            .collect::<Vec<u8>>();
                        let got = self.fs().symlink(&root, dir, osb(&name), osb(&target));
                        (Node::Symlink(target), got)
                    }
                    _ => (
                        Node::File(Vec::new()),
                        self.fs()
                            .mknod(&root, dir, osb(&name), libc::S_IFREG | 0o644, 0),
                    ),
                };
                if let Some(a) = expect(&ctx, got, want) {
                    self.m.dir_mut(dir).insert(name, a.ino);
                    self.m.inodes.insert(
                        a.ino,
                        MInode {
                            node,
                            parent: dir,
                            xattrs: BTreeMap::new(),
                            links: 1,
                        },
                    );
                }
            }
            10..=29 => {
                // write at a random offset
                let Some(ino) = self.pick(&self.m.linked(true)) else {
                    return;
                };
                let len = self.rng.gen_range(1..200_000);
                let off = self.rng.gen_range(0..1_500_000u64);
                let buf = data(&mut self.rng, len);
                let ctx = self.ctx(&format!("write {ino} at {off} len {len}"));
                let n = self.fs().write(&root, ino, off, &buf, false).expect(&ctx);
                assert_eq!(n as usize, len, "{ctx}");
                let Node::File(d) = &mut self.m.inodes.get_mut(&ino).unwrap().node else {
                    unreachable!()
                };
                let end = off as usize + len;
                if d.len() < end {
                    d.resize(end, 0);
                }
                d[off as usize..end].copy_from_slice(&buf);
            }
            30..=34 => {
                // append
                let Some(ino) = self.pick(&self.m.linked(true)) else {
                    return;
                };
                let len = self.rng.gen_range(1..50_000);
                let buf = data(&mut self.rng, len);
                let ctx = self.ctx(&format!("append {ino} len {len}"));
                self.fs().write(&root, ino, 12345, &buf, true).expect(&ctx);
                let Node::File(d) = &mut self.m.inodes.get_mut(&ino).unwrap().node else {
                    unreachable!()
                };
                d.extend_from_slice(&buf);
            }
            35..=41 => {
                // truncate, extend, punch
                let Some(ino) = self.pick(&self.m.linked(true)) else {
                    return;
                };
                let size = self.rng.gen_range(0..1_600_000u64);
                let Node::File(d) = &self.m.inodes[&ino].node else {
                    unreachable!()
                };
                let cur = d.len() as u64;
                match self.rng.gen_range(0..3) {
                    0 => {
                        let ctx = self.ctx(&format!("truncate {ino} to {size}"));
                        let set = SetAttr {
                            size: Some(size),
                            ..SetAttr::default()
                        };
                        self.fs().setattr(&root, ino, &set).expect(&ctx);
                        let Node::File(d) = &mut self.m.inodes.get_mut(&ino).unwrap().node else {
                            unreachable!()
                        };
                        d.resize(size as usize, 0);
                    }
                    1 => {
                        let off = self.rng.gen_range(0..cur + 10);
                        let len = self.rng.gen_range(1..400_000);
                        let ctx = self.ctx(&format!("punch {ino} at {off} len {len}"));
                        self.fs()
                            .fallocate(
                                &root,
                                ino,
                                off,
                                len,
                                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                            )
                            .expect(&ctx);
                        let Node::File(d) = &mut self.m.inodes.get_mut(&ino).unwrap().node else {
                            unreachable!()
                        };
                        let end = ((off + len) as usize).min(d.len());
                        if (off as usize) < end {
                            d[off as usize..end].iter_mut().for_each(|b| *b = 0);
                        }
                    }
                    _ => {
                        let ctx = self.ctx(&format!("fallocate {ino} to {size}"));
                        let off = size / 2;
                        self.fs()
                            .fallocate(&root, ino, off, size - off + 1, 0)
                            .expect(&ctx);
                        let Node::File(d) = &mut self.m.inodes.get_mut(&ino).unwrap().node else {
                            unreachable!()
                        };
                        if (d.len() as u64) < size + 1 {
                            d.resize(size as usize + 1, 0);
                        }
                    }
                }
            }
            42..=55 => self.rename(),
            56..=61 => {
                // link
                let Some(ino) = self.pick(&self.m.linked(false)) else {
                    return;
                };
                let dir = self.pick(&self.m.dirs()).unwrap();
                let name = self.name();
                let ctx = self.ctx(&format!("link {ino} to {dir} {name:?}"));
                let want = if self.m.dir(dir).contains_key(&name) {
                    Err(Errno::EEXIST)
                } else if self.m.is_dir(ino) {
                    Err(Errno::EPERM)
                } else {
                    Ok(())
                };
                if expect(&ctx, self.fs().link(&root, ino, dir, osb(&name)), want).is_some() {
                    self.m.dir_mut(dir).insert(name, ino);
                    self.m.inodes.get_mut(&ino).unwrap().links += 1;
                }
            }
            62..=71 => {
                // unlink or rmdir
                let dir = self.pick(&self.m.dirs()).unwrap();
                let name = self.name();
                let rmdir = self.rng.gen_bool(0.3);
                let ctx = self.ctx(&format!("remove (dir {rmdir}) {dir} {name:?}"));
                let target = self.m.dir(dir).get(&name).copied();
                let want = match target {
                    None => Err(Errno::ENOENT),
                    Some(t) if rmdir && !self.m.is_dir(t) => Err(Errno::ENOTDIR),
                    Some(t) if !rmdir && self.m.is_dir(t) => Err(Errno::EISDIR),
                    Some(t) if rmdir && !self.m.dir(t).is_empty() => Err(Errno::ENOTEMPTY),
                    Some(_) => Ok(()),
                };
                let got = if rmdir {
                    self.fs().rmdir(&root, dir, osb(&name))
                } else {
                    self.fs().unlink(&root, dir, osb(&name))
                };
                if expect(&ctx, got, want).is_some() {
                    let t = self.m.dir_mut(dir).remove(&name).unwrap();
                    self.m.unref(t);
                }
            }
            72..=79 => {
                // xattrs
                let Some(ino) = self.pick(&self.m.linked(false)) else {
                    return;
                };
                let name = format!("user.{}", self.rng.gen_range(0..4)).into_bytes();
                let is_symlink = matches!(self.m.inodes[&ino].node, Node::Symlink(_));
                let name = if is_symlink {
                    format!("trusted.{}", self.rng.gen_range(0..4)).into_bytes()
                } else {
                    name
                };
                if self.rng.gen_bool(0.7) {
                    let len = if self.rng.gen_bool(0.2) {
                        self.rng.gen_range(3000..65536)
                    } else {
                        self.rng.gen_range(0..100)
                    };
                    let v = data(&mut self.rng, len);
                    let ctx = self.ctx(&format!("setxattr {ino} {name:?} len {len}"));
                    self.fs()
                        .setxattr(&root, ino, osb(&name), &v, XattrMode::Any)
                        .expect(&ctx);
                    self.m.inodes.get_mut(&ino).unwrap().xattrs.insert(name, v);
                } else {
                    let ctx = self.ctx(&format!("removexattr {ino} {name:?}"));
                    let want = if self.m.inodes[&ino].xattrs.contains_key(&name) {
                        Ok(())
                    } else {
                        Err(Errno::ENODATA)
                    };
                    if expect(&ctx, self.fs().removexattr(&root, ino, osb(&name)), want).is_some() {
                        self.m.inodes.get_mut(&ino).unwrap().xattrs.remove(&name);
                    }
                }
            }
            80..=85 => {
                // open a file (kept open across later unlinks), or release one
                if !self.m.open.is_empty() && self.rng.gen_bool(0.5) {
                    let at = self.rng.gen_range(0..self.m.open.len());
                    let ino = self.m.open[at];
                    let ctx = self.ctx(&format!("release {ino}"));
                    // The content of an open file is still there, linked or not.
                    if let Node::File(d) = &self.m.inodes[&ino].node {
                        let got = self.fs().read(ino, 0, d.len() as u32 + 10).expect(&ctx);
                        assert!(got == *d, "{ctx}: content differs");
                    }
                    self.fs().release(ino).expect(&ctx);
                    self.m.release(at);
                } else if let Some(ino) = self.pick(&self.m.linked(true)) {
                    let ctx = self.ctx(&format!("open {ino}"));
                    self.fs().open(&root, ino, libc::O_RDWR).expect(&ctx);
                    self.m.open.push(ino);
                }
            }
            86..=93 => {
                // read back a random range
                let Some(ino) = self.pick(&self.m.linked(true)) else {
                    return;
                };
                let Node::File(d) = &self.m.inodes[&ino].node else {
                    unreachable!()
                };
                let off = self.rng.gen_range(0..d.len() as u64 + 100);
                let len = self.rng.gen_range(0..300_000u32);
                let ctx = self.ctx(&format!("read {ino} at {off} len {len}"));
                let got = self.fs().read(ino, off, len).expect(&ctx);
                let Node::File(d) = &self.m.inodes[&ino].node else {
                    unreachable!()
                };
                let from = (off as usize).min(d.len());
                let to = (off as usize + len as usize).min(d.len());
                assert!(got[..] == d[from..to], "{ctx}: content differs");
            }
            94..=97 => self.fs().sync_all().unwrap(),
            _ => {
                self.fs().sync_all().unwrap();
                self.reopen();
                self.check();
            }
        }
    }

    fn rename(&mut self) {
        let root = Cred::root();
        let sdir = self.pick(&self.m.dirs()).unwrap();
        let ddir = self.pick(&self.m.dirs()).unwrap();
        let sname = self.name();
        let dname = self.name();
        let flags = match self.rng.gen_range(0..6) {
            0 => RenameFlags {
                noreplace: true,
                exchange: false,
            },
            1 => RenameFlags {
                noreplace: false,
                exchange: true,
            },
            _ => RenameFlags::default(),
        };
        let ctx = self.ctx(&format!(
            "rename {sdir} {sname:?} -> {ddir} {dname:?} {flags:?}"
        ));
        let src = self.m.dir(sdir).get(&sname).copied();
        let tgt = self.m.dir(ddir).get(&dname).copied();
        let m = &self.m;
        let want = (|| {
            let Some(s) = src else {
                return Err(Errno::ENOENT);
            };
            if flags.exchange && tgt.is_none() {
                return Err(Errno::ENOENT);
            }
            if flags.noreplace && tgt.is_some() {
                return Err(Errno::EEXIST);
            }
            if sdir != ddir {
                if m.is_dir(s) && m.is_ancestor(s, ddir) {
                    return Err(Errno::EINVAL);
                }
                if let Some(t) = tgt {
                    if m.is_dir(t) && m.is_ancestor(t, sdir) {
                        return Err(if flags.exchange {
                            Errno::EINVAL
                        } else {
                            Errno::ENOTEMPTY
                        });
                    }
                }
            }
            if let Some(t) = tgt {
                if t == s {
                    return Ok(());
                }
                if !flags.exchange {
                    if m.is_dir(s) && !m.is_dir(t) {
                        return Err(Errno::ENOTDIR);
                    }
                    if !m.is_dir(s) && m.is_dir(t) {
                        return Err(Errno::EISDIR);
                    }
                    if m.is_dir(t) && !m.dir(t).is_empty() {
                        return Err(Errno::ENOTEMPTY);
                    }
                }
            }
            Ok(())
        })();
        let got = self
            .fs()
            .rename(&root, sdir, osb(&sname), ddir, osb(&dname), flags);
        if expect(&ctx, got, want).is_none() {
            return;
        }
        let s = src.unwrap();
        if tgt == Some(s) {
            return;
        }
        if flags.exchange {
            let t = tgt.unwrap();
            self.m.dir_mut(sdir).insert(sname, t);
            self.m.dir_mut(ddir).insert(dname, s);
            if self.m.is_dir(s) {
                self.m.inodes.get_mut(&s).unwrap().parent = ddir;
            }
            if self.m.is_dir(t) {
                self.m.inodes.get_mut(&t).unwrap().parent = sdir;
            }
            return;
        }
        self.m.dir_mut(sdir).remove(&sname);
        if let Some(old) = self.m.dir_mut(ddir).insert(dname, s) {
            self.m.unref(old);
        }
        if self.m.is_dir(s) {
            self.m.inodes.get_mut(&s).unwrap().parent = ddir;
        }
    }
}

fn run(seed: u64, steps: usize) {
    eprintln!("fsx seed {seed:#x} ({steps} steps; replay with TANK_SEED={seed:x})");
    let mut r = Run {
        seed,
        rng: ChaCha8Rng::seed_from_u64(seed),
        t: Some(MemFs::new(512 << 20)),
        m: Model::new(),
        step: 0,
    };
    for step in 0..steps {
        r.step = step;
        r.step();
    }
    r.step = steps;
    r.fs().sync_all().unwrap();
    r.reopen();
    r.check();
    let outcomes = OUTCOMES.with(|o| std::mem::take(&mut *o.borrow_mut()));
    eprintln!(
        "  {} inodes at the end; predicted outcomes {outcomes:?}",
        r.m.inodes.len()
    );
    // The kinds the model never creates are absent.
    let img = fsck(&r.t.as_ref().unwrap().fs, &r.t.as_ref().unwrap().store).unwrap();
    assert!(img
        .values()
        .all(|f| !matches!(f.content, Content::Other(FileKind::Fifo))));
}

#[test]
fn fsx_random_operations_against_a_model() {
    let base = seed(0xf5c0_0001);
    for i in 0..4 {
        run(base.wrapping_add(i), 4000);
    }
}
