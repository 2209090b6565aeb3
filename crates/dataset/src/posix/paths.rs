//! Names of inodes for reports (`status -v` names the files with permanent errors), read from
//! an object set without mounting it and without writing anything.
//!
//! # Theory of operation
//! Directory entries point down (a directory to its children) and only directories point up
//! (their parent). So a file's name is found by scanning every directory's entries for its
//! inode number, then climbing parent pointers to the root, finding each directory's name in
//! its parent. A full scan: fine for the few names an error report asks for; a hard-linked
//! file is named by the first entry found.

use tank_object::ObjectSet;

use super::format::{decode_dirent, Inode, KIND_DIRENT, KIND_INODE};
use super::types::{FileKind, ROOT_INO};

fn inode(os: &ObjectSet, ino: u64) -> Option<Inode> {
    Inode::decode(&os.get_item(ino, KIND_INODE, 0).ok()??).ok()
}

/// The name under which directory `dir` lists `ino`.
fn name_in(os: &ObjectSet, dir: u64, ino: u64) -> Option<Vec<u8>> {
    os.items(dir, KIND_DIRENT, 0, u64::MAX, usize::MAX)
        .ok()?
        .into_iter()
        .filter_map(|(_, raw)| decode_dirent(&raw).ok())
        .find(|d| d.ino == ino)
        .map(|d| d.name)
}

/// The path of inode `ino` from the filesystem's root (`/a/b`), or `None` when no directory
/// lists it (unlinked but still open, or not an inode of this filesystem).
pub fn path_of(os: &ObjectSet, ino: u64) -> Option<String> {
    let node = inode(os, ino)?;
    if ino == ROOT_INO {
        return Some("/".into());
    }
    // A directory knows its parent; anything else is looked for in every directory.
    let (mut dir, name) = if node.kind == FileKind::Dir {
        (node.parent, name_in(os, node.parent, ino)?)
    } else {
        os.list_objects(1, usize::MAX)
            .ok()?
            .into_iter()
            .filter(|&d| inode(os, d).is_some_and(|i| i.kind == FileKind::Dir))
            .find_map(|d| name_in(os, d, ino).map(|n| (d, n)))?
    };
    let mut parts = vec![name];
    // Bounded climb: a damaged parent chain cannot loop forever.
    for _ in 0..4096 {
        if dir == ROOT_INO {
            parts.reverse();
            let joined: Vec<String> = parts
                .iter()
                .map(|p| String::from_utf8_lossy(p).into_owned())
                .collect();
            return Some(format!("/{}", joined.join("/")));
        }
        let parent = inode(os, dir)?.parent;
        parts.push(name_in(os, parent, dir)?);
        dir = parent;
    }
    None
}
