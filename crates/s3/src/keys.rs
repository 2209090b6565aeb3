//! Where an object's key lives in its bucket's filesystem.
//!
//! # Theory of operation
//! A key is a path: `a/b/c` is the file `c` in the directory `b` of the directory `a` at the
//! dataset's root, so that objects are files to the local mount, NFS and SMB, and files are
//! objects. A key that ends in `/` (`photos/`, what consoles make for a "folder") is the
//! directory of that path, marked as an object by an extended attribute.
//!
//! Some keys cannot be paths: an empty, `.` or `..` segment (`a//b`, `./a`), a segment of
//! over 255 bytes, a NUL byte, a first segment that is tank's own (`.tank`, the snapshot
//! directory of the other front ends, and `.tank-s3`, this front end's), or a key whose
//! path is taken by the other kind (`a` and `a/b` both as objects: `a` cannot be a file and
//! a directory at once). Such a key is kept whole, as the file `.tank-s3/keys/<sha256 of
//! the key in hex>` with the key in its `user.s3.key` attribute, and listed in its place
//! among the others: the mapping is reversible and every key can be stored.

use sha2::{Digest, Sha256};

/// This front end's own directory at the root of every bucket's dataset.
pub const OWN_DIR: &str = ".tank-s3";
/// The longest key S3 accepts, in bytes.
pub const MAX_KEY: usize = 1024;

/// Where a key is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// At its path: the segments, and whether the key names a directory (ends in `/`).
    Path { segments: Vec<String>, dir: bool },
    /// Kept whole in `.tank-s3/keys/`, under this name.
    Whole(String),
}

/// A segment that can be a file name as it is.
fn plain(seg: &str, first: bool) -> bool {
    !seg.is_empty()
        && seg.len() <= 255
        && seg != "."
        && seg != ".."
        && !seg.contains('\0')
        && !(first && (seg == ".tank" || seg == OWN_DIR))
}

/// The name a key is kept under in `.tank-s3/keys/`.
pub fn whole_name(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// Where `key` goes, before looking at what is already there.
pub fn place(key: &str) -> Place {
    let (body, dir) = match key.strip_suffix('/') {
        Some(b) => (b, true),
        None => (key, false),
    };
    let segments: Vec<&str> = body.split('/').collect();
    if segments.iter().enumerate().all(|(i, s)| plain(s, i == 0)) {
        Place::Path {
            segments: segments.into_iter().map(str::to_string).collect(),
            dir,
        }
    } else {
        Place::Whole(whole_name(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(k: &str) -> bool {
        matches!(place(k), Place::Path { .. })
    }

    #[test]
    fn plain_keys_are_paths_and_the_others_are_kept_whole() {
        assert_eq!(
            place("a/b/c.txt"),
            Place::Path {
                segments: vec!["a".into(), "b".into(), "c.txt".into()],
                dir: false
            }
        );
        assert_eq!(
            place("photos/"),
            Place::Path {
                segments: vec!["photos".into()],
                dir: true
            }
        );
        assert!(path("x/.tank/y"), "only the first segment is tank's");
        assert!(path("ünïcödé/名前"));
        for k in [
            "a//b",
            "/a",
            "./a",
            "a/../b",
            "a/.",
            ".tank/x",
            ".tank",
            ".tank-s3/keys/x",
            "//",
            "a\0b",
        ] {
            assert!(!path(k), "{k:?} should be kept whole");
        }
        let long = "x".repeat(256);
        assert!(!path(&long));
        assert!(path(&"x".repeat(255)));
        assert_eq!(place("a//b"), place("a//b"), "the same name each time");
        assert_ne!(place("a//b"), place("a///b"));
    }
}
