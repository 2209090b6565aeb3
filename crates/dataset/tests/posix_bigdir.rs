//! Directories with very many entries: creation, lookup of every name, and readdir of all
//! of them in pages, with the inode cache staying bounded. The million-entry run is the
//! target; the 100,000-entry run is its everyday version. Timings are printed.

mod posix_common;

use std::collections::HashSet;
use std::time::Instant;

use posix_common::*;
use tank_dataset::posix::{Cred, FileKind, ROOT_INO};

fn big_directory(n: usize, page: usize) {
    let t = MemFs::with(6 << 30, bulk_txgs(), TestHooks::default());
    let fs = &t.fs;
    let r = Cred::root();
    t.hooks
        .atime
        .store(false, std::sync::atomic::Ordering::Relaxed);
    let d = fs.mkdir(&r, ROOT_INO, os("big"), 0o755).unwrap().ino;
    let name = |i: usize| format!("entry-{i:07}-{}", i.wrapping_mul(2_654_435_761) % 10_007);
    let start = Instant::now();
    let mut first = 0;
    for i in 0..n {
        let a = fs
            .mknod(&r, d, os(&name(i)), libc::S_IFREG | 0o644, 0)
            .unwrap();
        if i == 0 {
            first = a.ino;
        }
    }
    let create = start.elapsed();
    assert_eq!(fs.getattr(d).unwrap().size, n as u64 + 2);
    let start = Instant::now();
    for i in 0..n {
        let a = fs.lookup(&r, d, os(&name(i))).unwrap();
        assert_eq!(a.ino, first + i as u64);
    }
    let lookup = start.elapsed();
    let start = Instant::now();
    let mut seen = HashSet::with_capacity(n);
    let mut cookie = 0;
    loop {
        let batch = fs.readdir(&r, d, cookie, page).unwrap();
        let Some(last) = batch.last() else { break };
        cookie = last.cookie;
        for e in batch {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            assert_eq!(e.kind, FileKind::File);
            assert!(seen.insert(e.ino), "inode {} listed twice", e.ino);
        }
    }
    let readdir = start.elapsed();
    assert_eq!(seen.len(), n);
    assert!(
        fs.cached_inodes() <= 70_000,
        "{} cached inodes",
        fs.cached_inodes()
    );
    let start = Instant::now();
    fs.sync_all().unwrap();
    let sync = start.elapsed();
    let rate = |d: std::time::Duration| n as f64 / d.as_secs_f64();
    eprintln!(
        "{n} entries: create {:.1} s ({:.0}/s), lookup {:.1} s ({:.0}/s), readdir {:.1} s, sync {:.1} s",
        create.as_secs_f64(),
        rate(create),
        lookup.as_secs_f64(),
        rate(lookup),
        readdir.as_secs_f64(),
        sync.as_secs_f64()
    );
}

#[test]
fn directory_with_100k_entries() {
    big_directory(100_000, 1000);
}

#[test]
fn directory_with_a_million_entries() {
    big_directory(1_000_000, 4096);
}
