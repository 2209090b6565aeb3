//! Conversions between the POSIX layer's vocabulary and fuser's.
//!
//! # Theory of operation
//! Plain functions, no state. Times: `Timespec` is (signed seconds, nanoseconds ≥ 0) like
//! the kernel's; fuser speaks `SystemTime`. Outgoing times convert exactly in both
//! directions of the epoch. Incoming `setattr` times are parsed by fuser as
//! `EPOCH - (|sec| s + nsec ns)` when `sec < 0` (it treats the nanoseconds as part of the
//! negative offset); `timespec_from_request` undoes exactly that, so a time before 1970
//! with nanoseconds arrives as the kernel sent it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, FileType, INodeNo};
use tank_dataset::posix::{Attr, FileKind, StatFs, Timespec};

pub fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::BlockDev => FileType::BlockDevice,
        FileKind::CharDev => FileType::CharDevice,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
    }
}

/// A `Timespec` as a `SystemTime` (exact for any time `SystemTime` can hold).
pub fn system_time(t: Timespec) -> SystemTime {
    let nsec = Duration::from_nanos(u64::from(t.nsec.min(999_999_999)));
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::from_secs(t.sec as u64) + nsec
    } else {
        UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs()) + nsec
    }
}

/// A time from a fuser `setattr` request as the kernel sent it (see the module header).
pub fn timespec_from_request(t: SystemTime) -> Timespec {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timespec {
            sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            nsec: d.subsec_nanos(),
        },
        Err(before) => {
            let d = before.duration();
            Timespec {
                sec: -i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
                nsec: d.subsec_nanos(),
            }
        }
    }
}

/// `attr` as the kernel sees it, under node id `nodeid`.
pub fn file_attr(attr: &Attr, nodeid: u64) -> FileAttr {
    FileAttr {
        ino: INodeNo(nodeid),
        size: attr.size,
        blocks: attr.blocks,
        atime: system_time(attr.atime),
        mtime: system_time(attr.mtime),
        ctime: system_time(attr.ctime),
        crtime: system_time(attr.crtime),
        kind: file_type(attr.kind),
        perm: attr.perm & 0o7777,
        nlink: attr.nlink,
        uid: attr.uid,
        gid: attr.gid,
        rdev: attr.rdev,
        blksize: attr.blksize,
        flags: 0,
    }
}

/// The attributes of a virtual directory: read-only for everyone, owned by root.
pub fn virtual_dir_attr(nodeid: u64, nlink: u32, time: SystemTime) -> FileAttr {
    FileAttr {
        ino: INodeNo(nodeid),
        size: 0,
        blocks: 0,
        atime: time,
        mtime: time,
        ctime: time,
        crtime: time,
        kind: FileType::Directory,
        perm: 0o555,
        nlink,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

/// The arguments of `ReplyStatfs::statfs`, in its order.
pub fn statfs_args(s: &StatFs) -> (u64, u64, u64, u64, u64, u32, u32, u32) {
    (
        s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.bsize,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_convert_both_sides_of_the_epoch() {
        for (sec, nsec) in [
            (0i64, 0u32),
            (1, 5),
            (4_102_444_800, 123_456_789), // 2100-01-01
            (-1, 0),
            (-1, 999_999_999),
            (-86_400 * 365, 1),
        ] {
            let t = Timespec { sec, nsec };
            let st = system_time(t);
            // The exact instant: sec + nsec/1e9.
            let expect_nanos = i128::from(sec) * 1_000_000_000 + i128::from(nsec);
            let got_nanos = match st.duration_since(UNIX_EPOCH) {
                Ok(d) => d.as_nanos() as i128,
                Err(e) => -(e.duration().as_nanos() as i128),
            };
            assert_eq!(got_nanos, expect_nanos, "{sec}.{nsec}");
        }
    }

    #[test]
    fn request_times_undo_fusers_parse() {
        // fuser builds EPOCH - Duration::new(-sec, nsec) for sec < 0.
        let parsed = UNIX_EPOCH - Duration::new(5, 250);
        assert_eq!(
            timespec_from_request(parsed),
            Timespec { sec: -5, nsec: 250 }
        );
        let parsed = UNIX_EPOCH + Duration::new(4_102_444_800, 7);
        assert_eq!(
            timespec_from_request(parsed),
            Timespec {
                sec: 4_102_444_800,
                nsec: 7
            }
        );
    }
}
