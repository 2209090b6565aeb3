//! File handles: what a client keeps to name a file, valid as long as the file exists.
//!
//! # Format (40 bytes after the server's 8-byte generation prefix, big-endian)
//! | bytes | field |
//! |---|---|
//! | 0..8 | the pool's guid |
//! | 8..16 | the dataset's id in the pool |
//! | 16..24 | the export: FNV-1a 64 of the share's name |
//! | 24..32 | the inode number (object id) |
//! | 32..40 | the inode's generation |
//!
//! None of these change across daemon restarts or pool export and import, so a handle
//! stays valid; an inode number reused by a later file has another generation, so a handle
//! of a deleted file is stale and never reaches the new file's data. The export is part of
//! the handle because one dataset may be shared twice with other rules (read-only to one
//! network, read-write to another): a handle obtained through one share is served by that
//! share's rules only, and is stale once that share is gone. The pseudo-root that lists
//! the exports is all zeros but inode 1.

use nfs3_server::vfs::FileHandle;
use tank_dataset::posix::Ino;

pub const LEN: usize = 40;

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fh {
    bytes: [u8; LEN],
}

impl Fh {
    pub fn new(pool_guid: u64, dataset_id: u64, export: u64, ino: Ino, generation: u64) -> Fh {
        let mut bytes = [0u8; LEN];
        for (i, v) in [pool_guid, dataset_id, export, ino, generation]
            .into_iter()
            .enumerate()
        {
            bytes[i * 8..i * 8 + 8].copy_from_slice(&v.to_be_bytes());
        }
        Fh { bytes }
    }

    /// The pseudo-root above the exports.
    pub fn root() -> Fh {
        Fh::new(0, 0, 0, 1, 0)
    }

    /// The id of the export named `name` in handles.
    pub fn export_id(name: &str) -> u64 {
        name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
    }

    fn field(&self, i: usize) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.bytes[i * 8..i * 8 + 8]);
        u64::from_be_bytes(b)
    }

    pub fn pool_guid(&self) -> u64 {
        self.field(0)
    }

    pub fn dataset_id(&self) -> u64 {
        self.field(1)
    }

    pub fn export(&self) -> u64 {
        self.field(2)
    }

    pub fn ino(&self) -> Ino {
        self.field(3)
    }

    pub fn generation(&self) -> u64 {
        self.field(4)
    }

    pub fn is_root(&self) -> bool {
        self.pool_guid() == 0 && self.dataset_id() == 0
    }
}

impl std::fmt::Debug for Fh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Fh({:x}/{}/{:x}/{}#{})",
            self.pool_guid(),
            self.dataset_id(),
            self.export(),
            self.ino(),
            self.generation()
        )
    }
}

impl FileHandle for Fh {
    fn len(&self) -> usize {
        LEN
    }

    fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    fn from_bytes(bytes: &[u8]) -> Option<Self> {
        Some(Fh {
            bytes: bytes.try_into().ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_round_trips_and_refuses_other_lengths() {
        let e = Fh::export_id("media");
        let h = Fh::new(0xdead_beef_0000_0001, 7, e, 1234, 3);
        let back = Fh::from_bytes(h.as_bytes()).unwrap();
        assert_eq!(back, h);
        assert_eq!(
            (
                back.pool_guid(),
                back.dataset_id(),
                back.export(),
                back.ino(),
                back.generation()
            ),
            (0xdead_beef_0000_0001, 7, e, 1234, 3)
        );
        assert_ne!(Fh::export_id("media"), Fh::export_id("media2"));
        assert!(!h.is_root());
        assert!(Fh::root().is_root());
        assert!(Fh::from_bytes(&h.as_bytes()[..39]).is_none());
        assert!(Fh::from_bytes(&[0u8; 48]).is_none());
    }
}
