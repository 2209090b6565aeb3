//! Crash consistency of the filesystem: cut a workload (create, write, rename over an
//! existing file, hard links, unlink of an open file, rmdir, xattrs, fsync) at every device
//! write and flush.
//!
//! Method (as `crates/object/tests/crash_every_write.rs`): run the workload once on a
//! simulated fleet and count its device operations after pool creation; then for every cut
//! point k run it again with the fleet losing power at operation k, take the device images
//! (only flushed writes; seeded variants keep a random subset of the unflushed writes or
//! tear the last one), import, mount, and check that the filesystem is consistent (`fsck`:
//! every entry points at a live inode, link counts and sizes are right, no inode leaked, the
//! unlinked set is empty after mount) and shows exactly the state of one fsync: the last one
//! acknowledged before the cut, or the one in flight. Txgs commit only on fsync here
//! (manual tunables), so those are the only states a crash can show.

mod posix_common;

use std::sync::Arc;

use posix_common::*;
use tank_dataset::posix::{Cred, Fs, RenameFlags, SetAttr, XattrMode, ROOT_INO};
use tank_dataset::Errno;
use tank_device::{CrashMode, SimFleet};
use tank_object::ROOT_OBJSET;

const DEV_SIZE: u64 = 64 << 20;

/// The workload, phase by phase; each phase ends with an fsync. Returns the images
/// expected after each acknowledged phase (index 0: the empty filesystem) and how many
/// phases were acknowledged before an error stopped it.
fn workload(fs: &Fs, store: &tank_object::ObjectStore) -> (Vec<Image>, usize, Result<(), Errno>) {
    let root = Cred::root();
    let mut images = vec![empty_image()];
    let mut acked = 0;
    let r = (|| -> Result<(), Errno> {
        // 1: a directory tree and two files.
        let d = fs.mkdir(&root, ROOT_INO, os("dir"), 0o755)?.ino;
        let sub = fs.mkdir(&root, d, os("sub"), 0o700)?.ino;
        let a = fs.mknod(&root, d, os("a"), libc::S_IFREG | 0o644, 0)?.ino;
        fs.write(&root, a, 0, &pattern(1, 20_000), false)?;
        let b = fs
            .mknod(&root, ROOT_INO, os("b"), libc::S_IFREG | 0o600, 0)?
            .ino;
        fs.write(&root, b, 0, &pattern(2, 300), false)?;
        fs.symlink(&root, sub, os("ln"), os("../a"))?;
        phase(fs, store, a, &mut images, &mut acked)?;
        // 2: rewrite part of a, a hard link, an xattr, rename b over a new name.
        fs.write(&root, a, 5000, &pattern(3, 150_000), false)?;
        fs.link(&root, a, sub, os("a-link"))?;
        fs.setxattr(&root, a, os("user.tag"), b"blue", XattrMode::Any)?;
        fs.rename(
            &root,
            ROOT_INO,
            os("b"),
            d,
            os("b2"),
            RenameFlags::default(),
        )?;
        phase(fs, store, a, &mut images, &mut acked)?;
        // 3: replace a by a new file through rename (atomic replace), unlink an open file
        // (it must be freed at the next mount if the crash comes before its release).
        let n = fs
            .mknod(&root, d, os("a.new"), libc::S_IFREG | 0o644, 0)?
            .ino;
        fs.write(&root, n, 0, &pattern(4, 70_000), false)?;
        fs.rename(&root, d, os("a.new"), d, os("a"), RenameFlags::default())?;
        fs.open(&root, b, libc::O_RDONLY)?;
        fs.unlink(&root, d, os("b2"))?;
        phase(fs, store, n, &mut images, &mut acked)?;
        // 4: truncate, exchange two names, remove a directory's content and itself.
        fs.setattr(
            &root,
            n,
            &SetAttr {
                size: Some(1000),
                ..SetAttr::default()
            },
        )?;
        fs.mkdir(&root, ROOT_INO, os("other"), 0o755)?;
        fs.rename(
            &root,
            d,
            os("sub"),
            ROOT_INO,
            os("other"),
            RenameFlags {
                noreplace: false,
                exchange: true,
            },
        )?;
        fs.unlink(&root, ROOT_INO, os("other"))
            .err()
            .filter(|e| *e == Errno::EISDIR)
            .ok_or(Errno::EIO)?;
        fs.unlink(&root, ROOT_INO, os("other/ln"))
            .err()
            .ok_or(Errno::EIO)?;
        let other = fs.lookup(&root, ROOT_INO, os("other"))?.ino;
        fs.unlink(&root, other, os("ln"))?;
        fs.unlink(&root, other, os("a-link"))?;
        fs.rmdir(&root, ROOT_INO, os("other"))?;
        fs.release(b)?;
        phase(fs, store, n, &mut images, &mut acked)?;
        // 5: many small files, then most of them removed.
        for i in 0..40 {
            let f = fs
                .mknod(&root, d, os(&format!("f{i}")), libc::S_IFREG | 0o644, 0)?
                .ino;
            fs.write(&root, f, 0, &pattern(10 + i, 100 * i as usize), false)?;
        }
        phase(fs, store, ROOT_INO, &mut images, &mut acked)?;
        for i in 0..35 {
            fs.unlink(&root, d, os(&format!("f{i}")))?;
        }
        phase(fs, store, d, &mut images, &mut acked)?;
        // 6: a file of several records written in 1 MiB pieces, then cut and punched.
        let big = fs.mknod(&root, d, os("big"), libc::S_IFREG | 0o644, 0)?.ino;
        for i in 0..3u64 {
            fs.write(&root, big, i << 20, &pattern(50 + i, 1 << 20), false)?;
        }
        phase(fs, store, big, &mut images, &mut acked)?;
        fs.setattr(
            &root,
            big,
            &SetAttr {
                size: Some(1_500_000),
                ..SetAttr::default()
            },
        )?;
        fs.fallocate(
            &root,
            big,
            100_000,
            300_000,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        )?;
        phase(fs, store, big, &mut images, &mut acked)?;
        Ok(())
    })();
    (images, acked, r)
}

fn empty_image() -> Image {
    let mut img = Image::new();
    img.insert(
        ROOT_INO,
        Found {
            content: Content::Dir(Default::default()),
            xattrs: Default::default(),
        },
    );
    img
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    // Compressible, except in the raidz2 variant, whose blocks must stay large enough to
    // be ganged.
    let noise = raidz2_with_gangs();
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let base = (seed.wrapping_mul(31).wrapping_add(i as u64 / 7) % 251) as u8;
            if noise {
                base ^ x as u8
            } else {
                base
            }
        })
        .collect()
}

/// Ends a phase: remembers what the filesystem should look like, then fsyncs.
fn phase(
    fs: &Fs,
    store: &tank_object::ObjectStore,
    ino: u64,
    images: &mut Vec<Image>,
    acked: &mut usize,
) -> Result<(), Errno> {
    // The model of a phase is the filesystem itself, walked before the fsync (the
    // uncrashed run checks it against fsck, so it is consistent).
    // An empty image marks a failed walk (the uncrashed run refuses it).
    images.push(fsck_live(fs, store).unwrap_or_default());
    fs.fsync(ino, false)?;
    *acked = images.len() - 1;
    Ok(())
}

struct Outcome {
    images: Vec<Image>,
    acked: usize,
    ops_after_create: u64,
}

/// A seeded random workload over a few directories (the same seed gives the same
/// operations until the cut): creates, writes, renames over existing names, links,
/// unlinks of open files, directories, xattrs, with an fsync every few operations.
fn random_workload(
    fs: &Fs,
    store: &tank_object::ObjectStore,
    seed: u64,
) -> (Vec<Image>, usize, Result<(), Errno>) {
    use rand::{Rng, SeedableRng};
    let root = Cred::root();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut images = vec![empty_image()];
    let mut acked = 0;
    let mut open: Vec<u64> = Vec::new();
    let r = (|| -> Result<(), Errno> {
        let mut dirs = vec![ROOT_INO];
        for i in 0..3 {
            dirs.push(fs.mkdir(&root, ROOT_INO, os(&format!("d{i}")), 0o755)?.ino);
        }
        let names = ["a", "b", "c", "d", "e"];
        for step in 0..120 {
            let d = dirs[rng.gen_range(0..dirs.len())];
            let d2 = dirs[rng.gen_range(0..dirs.len())];
            let n = names[rng.gen_range(0..names.len())];
            let n2 = names[rng.gen_range(0..names.len())];
            let r = match rng.gen_range(0..9) {
                0 | 1 => fs
                    .mknod(&root, d, os(n), libc::S_IFREG | 0o644, 0)
                    .map(|_| ()),
                2 | 3 => match fs.lookup(&root, d, os(n)) {
                    Ok(a) if a.kind == tank_dataset::posix::FileKind::File => {
                        let len = rng.gen_range(1..60_000);
                        let off = rng.gen_range(0..100_000);
                        fs.write(&root, a.ino, off, &pattern(step, len), false)
                            .map(|_| ())
                    }
                    Ok(_) => Ok(()),
                    Err(e) => Err(e),
                },
                4 => fs.rename(&root, d, os(n), d2, os(n2), RenameFlags::default()),
                5 => match fs.lookup(&root, d, os(n)) {
                    Ok(a) => fs.link(&root, a.ino, d2, os(n2)).map(|_| ()),
                    Err(e) => Err(e),
                },
                6 => {
                    if let Ok(a) = fs.lookup(&root, d, os(n)) {
                        if a.kind == tank_dataset::posix::FileKind::File
                            && fs.open(&root, a.ino, libc::O_RDONLY).is_ok()
                        {
                            open.push(a.ino);
                        }
                    }
                    fs.unlink(&root, d, os(n))
                }
                7 => match fs.lookup(&root, d, os(n)) {
                    Ok(a) => fs.setxattr(
                        &root,
                        a.ino,
                        os("trusted.x"),
                        &pattern(step, 100),
                        XattrMode::Any,
                    ),
                    Err(e) => Err(e),
                },
                _ => {
                    if let Some(ino) = open.pop() {
                        fs.release(ino)
                    } else {
                        fs.mkdir(&root, d, os(n), 0o755)
                            .and_then(|_| fs.rmdir(&root, d, os(n)))
                    }
                }
            };
            if let Err(e) = r {
                if e == Errno::EIO {
                    return Err(e);
                }
            }
            if step % 6 == 5 {
                phase(fs, store, ROOT_INO, &mut images, &mut acked)?;
            }
        }
        Ok(())
    })();
    (images, acked, r)
}

fn run(seed: u64, crash_at: Option<u64>) -> (SimFleet, Outcome) {
    run_workload(seed, crash_at, false)
}

fn run_workload(seed: u64, crash_at: Option<u64>, random: bool) -> (SimFleet, Outcome) {
    let fleet = SimFleet::new(seed);
    let (_devs, pool, store) = sim_pool(&fleet, 1, DEV_SIZE);
    let base = fleet.ops();
    if let Some(k) = crash_at {
        fleet.set_crash_at(Some(base + k));
    }
    let hooks = Arc::new(TestHooks::default());
    hooks
        .atime
        .store(false, std::sync::atomic::Ordering::Relaxed);
    let (images, acked) = match mount(&store, &hooks) {
        Ok(fs) => {
            let (images, acked, r) = if random {
                random_workload(&fs, &store, seed)
            } else {
                workload(&fs, &store)
            };
            if crash_at.is_none() {
                r.expect("the workload runs without a crash");
            }
            (images, acked)
        }
        Err(_) => (vec![empty_image()], 0),
    };
    let ops_after_create = fleet.ops() - base;
    drop(store);
    let _ = pool.shutdown();
    drop(pool);
    (
        fleet,
        Outcome {
            images,
            acked,
            ops_after_create,
        },
    )
}

fn check(seed: u64, k: u64, mode: CrashMode) {
    check_workload(seed, k, mode, false)
}

fn check_workload(seed: u64, k: u64, mode: CrashMode, random: bool) {
    let ctx = format!("seed {seed:#x} cut {k} {mode:?} random {random}");
    let (fleet, out) = run_workload(seed, Some(k), random);
    let images = fleet.crash_images(mode);
    let (pool, store) =
        import_images(images).unwrap_or_else(|e| panic!("{ctx}: import failed: {e}"));
    let hooks = Arc::new(TestHooks::default());
    hooks
        .atime
        .store(false, std::sync::atomic::Ordering::Relaxed);
    let fs = mount(&store, &hooks).unwrap_or_else(|e| panic!("{ctx}: mount failed: {e:?}"));
    let img = fsck(&fs, &store).unwrap_or_else(|e| panic!("{ctx}: {e}"));
    let matches: Vec<usize> = (0..out.images.len())
        .filter(|i| out.images[*i] == img)
        .collect();
    if !matches
        .iter()
        .any(|i| *i == out.acked || *i == out.acked + 1)
    {
        for p in [out.acked, out.acked + 1] {
            if let Some(want) = out.images.get(p) {
                for (ino, f) in want {
                    if img.get(ino) != Some(f) {
                        eprintln!(
                            "{ctx}: phase {p}: inode {ino}: want {f:?}\n got {:?}",
                            img.get(ino)
                        );
                    }
                }
                for ino in img.keys().filter(|i| !want.contains_key(i)) {
                    eprintln!("{ctx}: phase {p}: extra inode {ino}");
                }
            }
        }
    }
    assert!(
        matches
            .iter()
            .any(|i| *i == out.acked || *i == out.acked + 1),
        "{ctx}: the filesystem matches phases {matches:?}, acknowledged phase {}",
        out.acked
    );
    // Every allocated byte is reached from the pool, and every reached one is allocated.
    store.sync().unwrap_or_else(|e| panic!("{ctx}: sync: {e}"));
    posix_common::dsl::store_usage(&pool, &store).unwrap_or_else(|e| panic!("{ctx}: {e}"));
    // The mounted filesystem is usable, and what it does survives another import.
    let root = Cred::root();
    let f = fs
        .mknod(&root, ROOT_INO, os("after"), libc::S_IFREG | 0o644, 0)
        .unwrap();
    fs.write(&root, f.ino, 0, b"after the crash", false)
        .unwrap();
    fs.fsync(f.ino, false).unwrap();
    drop(fs);
    assert!(store.objset(ROOT_OBJSET).is_ok());
    drop(store);
    pool.shutdown().unwrap();
}

/// Runs the workload without a crash and checks its phases; returns its operation count.
fn uncut(seed: u64) -> u64 {
    let (_, full) = run(seed, None);
    let n = full.ops_after_create;
    assert_eq!(
        full.acked,
        full.images.len() - 1,
        "every phase acknowledged"
    );
    assert!(
        full.images[1..].iter().all(|i| !i.is_empty()),
        "fsck of every phase"
    );
    // The phases are distinct states, so matching one of them means something.
    for w in full.images.windows(2) {
        assert_ne!(w[0], w[1]);
    }
    assert!(n > 50, "workload too small: {n} ops");
    n
}

#[test]
fn crash_at_every_write_and_flush() {
    let seed = seed(0xc4a5_0001);
    let n = uncut(seed);
    let start = std::time::Instant::now();
    for k in 0..=n {
        check(seed, k, CrashMode::DropUnflushed);
    }
    eprintln!(
        "checked {} cut points in {:.1} s",
        n + 1,
        start.elapsed().as_secs_f64()
    );
}

/// The cuts again on raidz2, with every block above 8 KiB a gang block.
#[test]
fn crash_at_every_write_on_raidz2_with_gang_blocks() {
    on_raidz2_with_gang_blocks(|| {
        let seed = seed(0xc4a5_0004);
        let n = uncut(seed);
        // Six devices make six times the operations: about 300 cuts, spread evenly.
        let every = (n / 300).max(1) as usize;
        for (i, k) in (0..=n).step_by(every).enumerate() {
            check(seed, k, CrashMode::DropUnflushed);
            if i % 4 == 0 {
                check(seed, k, CrashMode::KeepRandomSubset { seed: k });
            }
        }
        eprintln!("{} operations, cut every {every}", n + 1);
    });
}

#[test]
fn crash_with_reordered_and_torn_unflushed_writes() {
    let seed = seed(0xc4a5_0002);
    let (_, full) = run(seed, None);
    let n = full.ops_after_create;
    let mut k = 0;
    let mut variant = 0u64;
    while k <= n {
        check(seed, k, CrashMode::KeepRandomSubset { seed: variant });
        check(seed, k, CrashMode::TearLast { seed: variant });
        variant += 1;
        k += 5;
    }
}

#[test]
fn crash_at_every_write_of_a_random_workload() {
    let seed = seed(0xc4a5_0003);
    let (_, full) = run_workload(seed, None, true);
    let n = full.ops_after_create;
    assert_eq!(
        full.acked,
        full.images.len() - 1,
        "every phase acknowledged"
    );
    assert!(
        full.images[1..].iter().all(|i| !i.is_empty()),
        "fsck of every phase"
    );
    let start = std::time::Instant::now();
    for k in 0..=n {
        check_workload(seed, k, CrashMode::DropUnflushed, true);
    }
    eprintln!(
        "random workload (seed {seed:#x}): checked {} cut points in {:.1} s",
        n + 1,
        start.elapsed().as_secs_f64()
    );
}
