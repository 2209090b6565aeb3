//! The POSIX layer's on-disk format: the items it keeps in its object set, and their
//! encoders and decoders. Everything here is plain bytes; no locking, no I/O.
//!
//! # Theory of operation
//! Every inode is one object of the object set; its inode number is the object id. The
//! object's data blocks hold a regular file's bytes; everything else lives in items of the
//! object (keys `(object, kind, offset)`, values up to 3072 bytes inline in a tree leaf).
//! The root directory is object 1 (the first id the object layer hands out), and also holds
//! the filesystem-wide items (kinds 21 and 22). All integers are little-endian.
//!
//! ## Objects
//! An inode's object type byte (object header) is `32 + file type` (file types below); the
//! object block size is the dataset's record size when a regular file is created, 512 for
//! everything else. The object header's size field equals the inode's size for regular
//! files (both are changed in the same transaction) and is 0 otherwise.
//!
//! ## Items (kinds 16..=31 belong to the POSIX layer; 23..=31 are unused)
//!
//! | kind | key `(object, kind, offset)` | value |
//! |---|---|---|
//! | 16 inode | `(ino, 16, 0)` | the inode record, 128 bytes (below) |
//! | 17 dirent | `(dir, 17, slot)` | a directory entry: ino u64, file type u8, name (1..=255 bytes) |
//! | 18 symlink | `(ino, 18, i)` | bytes `[2048 i, 2048 (i+1))` of a symlink's target |
//! | 19 xattr | `(ino, 19, xslot)` | an extended attribute: value length u32, name length u8, name, the value's first bytes |
//! | 20 xattr data | `(ino, 20, xslot << 8 \| i)` | part `i` (from 1) of the value's remaining bytes: `[f + 3072 (i-1), f + 3072 i)` of the value, `f` the bytes in the xattr item |
//! | 21 fs info | `(1, 21, 0)` | the filesystem header, 32 bytes (below) |
//! | 22 unlinked | `(1, 22, ino)` | ino u64: inode `ino` has no name left and is freed at the next mount if still there |
//!
//! ### Inode record (128 bytes)
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | record version (1) |
//! | 1 | 1 | file type: 1 regular, 2 directory, 3 symlink, 4 block device, 5 character device, 6 fifo, 7 socket |
//! | 2 | 2 | permission bits (`mode & 0o7777`) |
//! | 4 | 4 | link count (a directory: 2 + its subdirectories; 0 while in the unlinked set) |
//! | 8 | 4 | uid |
//! | 12 | 4 | gid |
//! | 16 | 4 | rdev (device nodes; else 0) |
//! | 20 | 4 | record size: the object's block size |
//! | 24 | 8 | size: a regular file's bytes; a directory's entries + 2; a symlink's target length; else 0 |
//! | 32 | 8 | parent: a directory's parent directory (the root's is itself); else 0 |
//! | 40 | 8 | generation: the txg that created the inode |
//! | 48 | 16 | atime: seconds i64, nanoseconds u32 (< 10^9), 4 zero bytes |
//! | 64 | 16 | mtime, as atime |
//! | 80 | 16 | ctime, as atime |
//! | 96 | 16 | crtime (birth time), as atime |
//! | 112 | 16 | zero (reserved) |
//!
//! ### Directory entries
//! The slot of a name is its hash chain's base plus an index: `base = (xxh3_64(name) >> 1)
//! & !0xFFF` (`xxh3_64`: XXH3 64-bit, seed 0), raised to `0x1000` if it is 0; the entry takes the first free slot of `[base,
//! base + 0xFFF)`. A lookup reads that one range (O(log n) in the tree) and compares names.
//! Slots are below 2^63 and at least 0x1000, so they serve directly as `readdir` cookies
//! (positive as a signed offset; 1 and 2 are the cookies of "." and ".."): a slot never
//! changes while its entry exists.
//!
//! ### Extended attributes
//! The xslot of a name (full name with its namespace prefix, e.g. `user.mime`) is
//! `(xxh3_64(name) >> 32) << 8` plus the first free index in `0..256`. The xattr item holds
//! `min(value length, 3072 - 5 - name length)` bytes of the value; the rest follows in xattr
//! data items of up to 3072 bytes each (at most 64 KiB in all).
//!
//! ### Filesystem header (32 bytes)
//! magic `TANKPOSX` (8) | format version u32 (1) | flags u32 (0) | creation time: seconds
//! i64, nanoseconds u32 | zero u32.
//!
//! Items come from devices: decoding them never panics, and arithmetic on decoded values is
//! checked (`clippy::arithmetic_side_effects` is denied here).

#![deny(clippy::arithmetic_side_effects)]

use super::types::{FileKind, Ino, Timespec};
use crate::errno::Errno;
use xxhash_rust::xxh3::xxh3_64;

pub(crate) const KIND_INODE: u8 = 16;
pub(crate) const KIND_DIRENT: u8 = 17;
pub(crate) const KIND_SYMLINK: u8 = 18;
pub(crate) const KIND_XATTR: u8 = 19;
pub(crate) const KIND_XATTR_DATA: u8 = 20;
pub(crate) const KIND_FSINFO: u8 = 21;
pub(crate) const KIND_UNLINKED: u8 = 22;

const _: () = assert!(KIND_INODE >= tank_object::FIRST_USER_KIND);
const _: () = assert!(KIND_UNLINKED <= 31);

/// Largest item value the object layer stores (`tree::MAX_INLINE`).
pub(crate) const ITEM_MAX: usize = 3072;
/// Bytes of a symlink target per item.
pub(crate) const SYMLINK_CHUNK: usize = 2048;
/// Slots per directory hash chain (indexes `0..DIR_CHAIN`).
pub(crate) const DIR_CHAIN: u64 = 0xFFF;
/// Smallest directory slot: below it are the cookies of "." (1) and ".." (2).
pub(crate) const DIR_SLOT_MIN: u64 = 0x1000;
/// Slots per xattr hash chain.
pub(crate) const XATTR_CHAIN: u64 = 256;

pub(crate) const INODE_LEN: usize = 128;
pub(crate) const INODE_VERSION: u8 = 1;
pub(crate) const FSINFO_MAGIC: &[u8; 8] = b"TANKPOSX";
pub(crate) const FSINFO_VERSION: u32 = 1;
pub(crate) const FSINFO_LEN: usize = 32;
/// Object type byte of an inode: `OBJ_TYPE_BASE + file type`.
pub(crate) const OBJ_TYPE_BASE: u8 = 32;
const XATTR_HEADER_LEN: usize = 5;
const DIRENT_HEADER_LEN: usize = 9;

const _: () = assert!(2 * SYMLINK_CHUNK > super::types::SYMLINK_MAX);
const _: () = assert!(XATTR_HEADER_LEN + super::types::NAME_MAX < ITEM_MAX);
const _: () = assert!(DIRENT_HEADER_LEN + super::types::NAME_MAX < ITEM_MAX);
// Every xattr value fits in the chunk indexes 1..=255.
const _: () = assert!(255 * ITEM_MAX > super::types::XATTR_SIZE_MAX);

fn corrupt() -> Errno {
    Errno::EIO
}

/// The file type code stored on disk.
pub(crate) fn kind_code(kind: FileKind) -> u8 {
    match kind {
        FileKind::File => 1,
        FileKind::Dir => 2,
        FileKind::Symlink => 3,
        FileKind::BlockDev => 4,
        FileKind::CharDev => 5,
        FileKind::Fifo => 6,
        FileKind::Socket => 7,
    }
}

pub(crate) fn kind_from_code(code: u8) -> Option<FileKind> {
    Some(match code {
        1 => FileKind::File,
        2 => FileKind::Dir,
        3 => FileKind::Symlink,
        4 => FileKind::BlockDev,
        5 => FileKind::CharDev,
        6 => FileKind::Fifo,
        7 => FileKind::Socket,
        _ => return None,
    })
}

/// An inode record as kept in memory; see the module documentation for its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Inode {
    pub kind: FileKind,
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
    pub size: u64,
    pub parent: Ino,
    pub generation: u64,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    pub crtime: Timespec,
}

// Fixed-offset fields of records whose length the caller has checked.
fn put_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..][..2].copy_from_slice(&v.to_le_bytes());
}
fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..][..4].copy_from_slice(&v.to_le_bytes());
}
fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..][..8].copy_from_slice(&v.to_le_bytes());
}
fn put_time(b: &mut [u8], at: usize, t: Timespec) {
    let b = &mut b[at..];
    b[..8].copy_from_slice(&t.sec.to_le_bytes());
    put_u32(b, 8, t.nsec);
}
fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..][..2].try_into().expect("2 bytes"))
}
fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..][..4].try_into().expect("4 bytes"))
}
fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..][..8].try_into().expect("8 bytes"))
}
fn get_time(b: &[u8], at: usize) -> Result<Timespec, Errno> {
    let b = &b[at..];
    let t = Timespec {
        sec: i64::from_le_bytes(b[..8].try_into().expect("8 bytes")),
        nsec: get_u32(b, 8),
    };
    if t.nsec >= 1_000_000_000 {
        return Err(corrupt());
    }
    Ok(t)
}

impl Inode {
    pub fn encode(&self) -> [u8; INODE_LEN] {
        assert!(self.perm <= 0o7777, "permission bits {:o}", self.perm);
        let mut b = [0u8; INODE_LEN];
        b[0] = INODE_VERSION;
        b[1] = kind_code(self.kind);
        put_u16(&mut b, 2, self.perm);
        put_u32(&mut b, 4, self.nlink);
        put_u32(&mut b, 8, self.uid);
        put_u32(&mut b, 12, self.gid);
        put_u32(&mut b, 16, self.rdev);
        put_u32(&mut b, 20, self.blksize);
        put_u64(&mut b, 24, self.size);
        put_u64(&mut b, 32, self.parent);
        put_u64(&mut b, 40, self.generation);
        put_time(&mut b, 48, self.atime);
        put_time(&mut b, 64, self.mtime);
        put_time(&mut b, 80, self.ctime);
        put_time(&mut b, 96, self.crtime);
        b
    }

    /// Decodes a record read from disk (untrusted: every field is checked).
    pub fn decode(b: &[u8]) -> Result<Inode, Errno> {
        if b.len() != INODE_LEN || b[0] != INODE_VERSION {
            return Err(corrupt());
        }
        let kind = kind_from_code(b[1]).ok_or_else(corrupt)?;
        let perm = get_u16(b, 2);
        if perm > 0o7777 {
            return Err(corrupt());
        }
        let inode = Inode {
            kind,
            perm,
            nlink: get_u32(b, 4),
            uid: get_u32(b, 8),
            gid: get_u32(b, 12),
            rdev: get_u32(b, 16),
            blksize: get_u32(b, 20),
            size: get_u64(b, 24),
            parent: get_u64(b, 32),
            generation: get_u64(b, 40),
            atime: get_time(b, 48)?,
            mtime: get_time(b, 64)?,
            ctime: get_time(b, 80)?,
            crtime: get_time(b, 96)?,
        };
        if !inode.blksize.is_power_of_two() {
            return Err(corrupt());
        }
        if kind == FileKind::Dir && (inode.size < 2 || inode.parent == 0) {
            return Err(corrupt());
        }
        Ok(inode)
    }
}

/// A directory entry as decoded from its item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Dirent {
    pub ino: Ino,
    pub kind: FileKind,
    pub name: Vec<u8>,
}

pub(crate) fn encode_dirent(ino: Ino, kind: FileKind, name: &[u8]) -> Vec<u8> {
    assert!(!name.is_empty() && name.len() <= super::types::NAME_MAX);
    assert!(ino != 0);
    [&ino.to_le_bytes()[..], &[kind_code(kind)], name].concat()
}

pub(crate) fn decode_dirent(b: &[u8]) -> Result<Dirent, Errno> {
    if b.len() <= DIRENT_HEADER_LEN || b.len() > DIRENT_HEADER_LEN + super::types::NAME_MAX {
        return Err(corrupt());
    }
    let ino = get_u64(b, 0);
    let kind = kind_from_code(b[8]).ok_or_else(corrupt)?;
    if ino == 0 {
        return Err(corrupt());
    }
    Ok(Dirent {
        ino,
        kind,
        name: b[DIRENT_HEADER_LEN..].to_vec(),
    })
}

/// The first slot of `name`'s hash chain in a directory.
pub(crate) fn dirent_base(name: &[u8]) -> u64 {
    let base = (xxh3_64(name) >> 1) & !DIR_CHAIN;
    let base = base.max(DIR_SLOT_MIN);
    debug_assert!(base.checked_add(DIR_CHAIN).is_some_and(|end| end < 1 << 63));
    base
}

/// The first xslot of xattr `name`'s hash chain.
#[allow(clippy::arithmetic_side_effects)] // A 32-bit hash times XATTR_CHAIN (256): below 2^40.
pub(crate) fn xattr_base(name: &[u8]) -> u64 {
    (xxh3_64(name) >> 32) * XATTR_CHAIN
}

/// An xattr item: the name and the value's first bytes, and the whole value's length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct XattrHead {
    pub value_len: usize,
    pub name: Vec<u8>,
    pub first: Vec<u8>,
}

/// How many value bytes the xattr item of a name of `name_len` bytes holds.
pub(crate) fn xattr_first_len(name_len: usize, value_len: usize) -> usize {
    value_len.min((ITEM_MAX - XATTR_HEADER_LEN).saturating_sub(name_len))
}

pub(crate) fn encode_xattr_head(name: &[u8], value: &[u8]) -> Vec<u8> {
    assert!(!name.is_empty() && name.len() <= super::types::NAME_MAX);
    assert!(value.len() <= super::types::XATTR_SIZE_MAX);
    let first = xattr_first_len(name.len(), value.len());
    let b = [
        &(value.len() as u32).to_le_bytes()[..],
        &[name.len() as u8],
        name,
        &value[..first],
    ]
    .concat();
    assert!(b.len() <= ITEM_MAX);
    b
}

pub(crate) fn decode_xattr_head(b: &[u8]) -> Result<XattrHead, Errno> {
    let (head, rest) = b
        .split_first_chunk::<XATTR_HEADER_LEN>()
        .ok_or_else(corrupt)?;
    let value_len = usize::try_from(get_u32(head, 0))
        .ok()
        .filter(|&len| len <= super::types::XATTR_SIZE_MAX)
        .ok_or_else(corrupt)?;
    let name_len = usize::from(head[4]);
    if name_len == 0 {
        return Err(corrupt());
    }
    let (name, first) = rest.split_at_checked(name_len).ok_or_else(corrupt)?;
    if first.len() != xattr_first_len(name_len, value_len) {
        return Err(corrupt());
    }
    Ok(XattrHead {
        value_len,
        name: name.to_vec(),
        first: first.to_vec(),
    })
}

/// The filesystem header at `(ROOT_INO, KIND_FSINFO, 0)`.
pub(crate) fn encode_fsinfo(created: Timespec) -> [u8; FSINFO_LEN] {
    let mut b = [0u8; FSINFO_LEN];
    b[0..8].copy_from_slice(FSINFO_MAGIC);
    put_u32(&mut b, 8, FSINFO_VERSION);
    put_u32(&mut b, 12, 0);
    put_time(&mut b, 16, created);
    b
}

/// Checks a filesystem header read from disk; EINVAL when it is not ours or too new.
pub(crate) fn check_fsinfo(b: &[u8]) -> Result<(), Errno> {
    if b.len() != FSINFO_LEN || &b[0..8] != FSINFO_MAGIC {
        return Err(Errno::EINVAL);
    }
    if get_u32(b, 8) != FSINFO_VERSION || get_u32(b, 12) != 0 {
        return Err(Errno::EINVAL);
    }
    get_time(b, 16)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Inode {
        Inode {
            kind: FileKind::Dir,
            perm: 0o1755,
            nlink: 3,
            uid: 1000,
            gid: 100,
            rdev: 0,
            blksize: 512,
            size: 5,
            parent: 1,
            generation: 7,
            atime: Timespec { sec: -1, nsec: 5 },
            mtime: Timespec {
                sec: 1 << 40,
                nsec: 999_999_999,
            },
            ctime: Timespec { sec: 0, nsec: 0 },
            crtime: Timespec {
                sec: i64::MIN,
                nsec: 1,
            },
        }
    }

    #[test]
    fn inode_round_trips_and_rejects_garbage() {
        let i = sample();
        let b = i.encode();
        assert_eq!(Inode::decode(&b).unwrap(), i);
        let mut bad = b;
        bad[1] = 9;
        assert_eq!(Inode::decode(&bad), Err(Errno::EIO));
        let mut bad = b;
        bad[56..60].copy_from_slice(&1_000_000_000u32.to_le_bytes());
        assert_eq!(Inode::decode(&bad), Err(Errno::EIO));
        assert_eq!(Inode::decode(&b[..100]), Err(Errno::EIO));
    }

    #[test]
    fn dirent_and_xattr_round_trip() {
        let b = encode_dirent(42, FileKind::Symlink, b"name");
        let d = decode_dirent(&b).unwrap();
        assert_eq!(
            (d.ino, d.kind, &d.name[..]),
            (42, FileKind::Symlink, &b"name"[..])
        );
        assert!(decode_dirent(&b[..9]).is_err());
        let value = vec![7u8; 5000];
        let h = decode_xattr_head(&encode_xattr_head(b"user.x", &value)).unwrap();
        assert_eq!(h.value_len, 5000);
        assert_eq!(h.name, b"user.x");
        assert_eq!(h.first.len(), ITEM_MAX - 5 - 6);
        assert!(check_fsinfo(&encode_fsinfo(Timespec::default())).is_ok());
        assert!(check_fsinfo(&[0u8; 32]).is_err());
    }

    #[test]
    fn slots_stay_in_range() {
        for i in 0..10000u32 {
            let name = i.to_le_bytes();
            let b = dirent_base(&name);
            assert!(b >= DIR_SLOT_MIN && b + DIR_CHAIN < 1 << 63);
            assert_eq!(b & DIR_CHAIN, 0);
            assert!(xattr_base(&name) < 1 << 40);
        }
    }
}
