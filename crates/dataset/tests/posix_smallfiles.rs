//! Small-file throughput: create, stat and unlink 100,000 files in-process, and 1 MiB
//! sequential writes and reads of a 256 MiB file. Prints the rates (not a timed test: the
//! figures go to docs/BENCHMARKS.md; the assertions check the results).

mod posix_common;

use std::time::Instant;

use posix_common::*;
use tank_dataset::posix::Cred;

const FILES: usize = 100_000;

#[test]
fn hundred_thousand_small_files() {
    let t = MemFs::with(2 << 30, bulk_txgs(), TestHooks::default());
    let fs = &t.fs;
    let root = Cred::root();
    let dirs: Vec<u64> = (0..10)
        .map(|d| fs.mkdir(&root, 1, os(&format!("d{d}")), 0o755).unwrap().ino)
        .collect();
    let data = [7u8; 100];
    let start = Instant::now();
    let mut inos = Vec::with_capacity(FILES);
    for i in 0..FILES {
        let dir = dirs[i % dirs.len()];
        let a = fs
            .mknod(
                &root,
                dir,
                os(&format!("file-{i}")),
                libc::S_IFREG | 0o644,
                0,
            )
            .unwrap();
        fs.write(&root, a.ino, 0, &data, false).unwrap();
        inos.push(a.ino);
    }
    let create = start.elapsed();
    let start = Instant::now();
    for i in 0..FILES {
        let dir = dirs[i % dirs.len()];
        let a = fs.lookup(&root, dir, os(&format!("file-{i}"))).unwrap();
        assert_eq!(a.ino, inos[i]);
        assert_eq!(a.size, 100);
    }
    let stat = start.elapsed();
    let start = Instant::now();
    for i in 0..FILES {
        let dir = dirs[i % dirs.len()];
        fs.unlink(&root, dir, os(&format!("file-{i}"))).unwrap();
    }
    let unlink = start.elapsed();
    fs.sync_all().unwrap();
    let rate = |d: std::time::Duration| FILES as f64 / d.as_secs_f64();
    eprintln!(
        "{FILES} files: create+write {:.0}/s, lookup {:.0}/s, unlink {:.0}/s",
        rate(create),
        rate(stat),
        rate(unlink)
    );
    for d in &dirs {
        assert!(list_dir(fs, *d, 1000).is_empty());
        assert_eq!(fs.getattr(*d).unwrap().size, 2);
    }
    // Only the root and the ten directories are left.
    assert_eq!(t.objects().len(), 11);
    assert!(fs.cached_inodes() <= 70_000, "inode cache bounded");
}

#[test]
fn streaming_one_mib_writes_and_reads() {
    let t = MemFs::with(1 << 30, bulk_txgs(), TestHooks::default());
    let fs = &t.fs;
    let root = Cred::root();
    let a = fs
        .mknod(&root, 1, os("big"), libc::S_IFREG | 0o644, 0)
        .unwrap();
    let chunk: Vec<u8> = (0..1 << 20).map(|i: u32| (i * 7 % 251) as u8).collect();
    let n = 256u64;
    let start = Instant::now();
    for i in 0..n {
        assert_eq!(
            fs.write(&root, a.ino, i << 20, &chunk, false).unwrap(),
            1 << 20
        );
    }
    fs.fsync(a.ino, false).unwrap();
    let w = start.elapsed();
    let start = Instant::now();
    for i in 0..n {
        let got = fs.read(a.ino, i << 20, 1 << 20).unwrap();
        assert!(got == chunk, "chunk {i} differs");
    }
    let r = start.elapsed();
    let mib = n as f64;
    eprintln!(
        "1 MiB records: write+fsync {:.0} MiB/s, read {:.0} MiB/s",
        mib / w.as_secs_f64(),
        mib / r.as_secs_f64()
    );
    assert_eq!(fs.getattr(a.ino).unwrap().size, n << 20);
}
