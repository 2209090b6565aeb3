//! Extended attributes in the `user.`, `trusted.` and `security.` namespaces.
//!
//! # Theory of operation
//! An attribute is one xattr item (name, value length and the value's first bytes) plus,
//! for values that do not fit, xattr data items (`format.rs`). The item's xslot comes from a
//! hash of the full name, so finding an attribute reads one short range. All items of an
//! attribute change in one transaction, with the inode's ctime, under the inode's meta lock
//! (readers hold it too, so they never see half a value).
//!
//! Rules as Linux's `xattr_permission` and `setxattr`: names of 1 to 255 bytes (else
//! ERANGE), values up to 64 KiB (else E2BIG); `system.*` and unknown namespaces are
//! EOPNOTSUPP (no ACLs); `trusted.*` is root's only (EPERM to write, ENODATA to read for
//! others, and hidden from their listing); writing `security.*` needs root (the capability
//! module's CAP_SYS_ADMIN), reading it needs nothing; `user.*` exists only on regular files
//! and directories, needs read or write permission, and in a sticky directory only the
//! owner or root may write it.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use super::format::*;
use super::fs::Fs;
use super::perm::{self, MAY_READ, MAY_WRITE};
use super::types::*;
use crate::errno::Errno;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Space {
    User,
    Trusted,
    Security,
}

/// Validates an attribute name and tells its namespace.
fn parse_name(name: &OsStr) -> Result<(&[u8], Space)> {
    let b = name.as_bytes();
    if b.is_empty() || b.len() > NAME_MAX {
        return Err(Errno::ERANGE);
    }
    if b.contains(&0) {
        return Err(Errno::EINVAL);
    }
    let (prefix_len, space) = if b.starts_with(b"user.") {
        (5, Space::User)
    } else if b.starts_with(b"trusted.") {
        (8, Space::Trusted)
    } else if b.starts_with(b"security.") {
        (9, Space::Security)
    } else {
        return Err(Errno::EOPNOTSUPP);
    };
    if b.len() == prefix_len {
        return Err(Errno::EINVAL);
    }
    Ok((b, space))
}

/// `xattr_permission`.
fn check_access(cred: &Cred, inode: &Inode, space: Space, write: bool) -> Result<()> {
    let denied = if write { Errno::EPERM } else { Errno::ENODATA };
    match space {
        Space::Trusted if !perm::is_root(cred) => Err(denied),
        Space::Trusted => Ok(()),
        Space::Security if write && !perm::is_root(cred) => Err(Errno::EPERM),
        Space::Security => Ok(()),
        Space::User => {
            if !matches!(inode.kind, FileKind::File | FileKind::Dir) {
                return Err(denied);
            }
            if write
                && inode.kind == FileKind::Dir
                && inode.perm & 0o1000 != 0
                && !perm::owner_or_root(cred, inode)
            {
                return Err(Errno::EPERM);
            }
            perm::check(cred, inode, if write { MAY_WRITE } else { MAY_READ })
        }
    }
}

/// An attribute found on an inode.
struct FoundXattr {
    xslot: u64,
    head: XattrHead,
}

/// The data item key of part `i` (from 1) of the value at `xslot`.
fn data_key(xslot: u64, i: u64) -> u64 {
    debug_assert!((1..XATTR_CHAIN).contains(&i));
    (xslot << 8) | i
}

/// Data items a value of `len` bytes needs after its xattr item.
fn data_items(name_len: usize, len: usize) -> u64 {
    (len - xattr_first_len(name_len, len)).div_ceil(ITEM_MAX) as u64
}

impl Fs {
    /// Finds `name` on `ino`; also returns the first free xslot of its chain.
    fn find_xattr(&self, ino: Ino, name: &[u8]) -> Result<(Option<FoundXattr>, Option<u64>)> {
        let base = xattr_base(name);
        let items = self.objset.items(
            ino,
            KIND_XATTR,
            base,
            base + XATTR_CHAIN,
            XATTR_CHAIN as usize,
        )?;
        let mut free = None;
        let mut expect = base;
        for (xslot, value) in items {
            if free.is_none() && xslot > expect {
                free = Some(expect);
            }
            expect = xslot + 1;
            let head = decode_xattr_head(&value)?;
            if head.name == name {
                return Ok((Some(FoundXattr { xslot, head }), None));
            }
        }
        if free.is_none() && expect < base + XATTR_CHAIN {
            free = Some(expect);
        }
        Ok((None, free))
    }

    fn read_value(&self, ino: Ino, found: FoundXattr) -> Result<Vec<u8>> {
        let FoundXattr { xslot, head } = found;
        let mut value = head.first;
        value.reserve(head.value_len - value.len());
        let n = data_items(head.name.len(), head.value_len);
        if n > 0 {
            let items = self.objset.items(
                ino,
                KIND_XATTR_DATA,
                data_key(xslot, 1),
                data_key(xslot, n) + 1,
                n as usize,
            )?;
            for (_, part) in items {
                value.extend_from_slice(&part);
            }
        }
        if value.len() != head.value_len {
            return Err(Errno::EIO);
        }
        Ok(value)
    }

    pub(super) fn setxattr_impl(
        &self,
        cred: &Cred,
        ino: Ino,
        name: &OsStr,
        value: &[u8],
        mode: XattrMode,
    ) -> Result<()> {
        let (name, space) = parse_name(name)?;
        if value.len() > XATTR_SIZE_MAX {
            return Err(Errno::E2BIG);
        }
        self.writable()?;
        let nodes = [self.node(ino)];
        let mut locked = self.lock_all(&nodes)?;
        check_access(cred, locked.get(ino), space, true)?;
        let (found, free) = self.find_xattr(ino, name)?;
        match (&found, mode) {
            (Some(_), XattrMode::Create) => return Err(Errno::EEXIST),
            (None, XattrMode::Replace) => return Err(Errno::ENODATA),
            _ => {}
        }
        let xslot = match &found {
            Some(f) => f.xslot,
            None => free.ok_or(Errno::ENOSPC)?,
        };
        let bytes = (name.len() + value.len()) as u64;
        self.hooks.check_space(bytes)?;
        let now = Timespec::now();
        self.in_tx(bytes, &mut locked, |tx, l| {
            let old_items = found
                .as_ref()
                .map_or(0, |f| data_items(f.head.name.len(), f.head.value_len));
            let first = xattr_first_len(name.len(), value.len());
            let rest: Vec<&[u8]> = value[first..].chunks(ITEM_MAX).collect();
            self.objset
                .put_item(tx, ino, KIND_XATTR, xslot, &encode_xattr_head(name, value))?;
            for (i, part) in rest.iter().enumerate() {
                let key = data_key(xslot, i as u64 + 1);
                self.objset.put_item(tx, ino, KIND_XATTR_DATA, key, part)?;
            }
            for i in rest.len() as u64 + 1..=old_items {
                self.objset
                    .remove_item(tx, ino, KIND_XATTR_DATA, data_key(xslot, i))?;
            }
            l.get_mut(ino).ctime = now;
            self.put_inode(tx, ino, l.get(ino))
        })
    }

    pub(super) fn getxattr_impl(&self, cred: &Cred, ino: Ino, name: &OsStr) -> Result<Vec<u8>> {
        let (name, space) = parse_name(name)?;
        let node = self.node(ino);
        let slot = self.lock(&node)?;
        check_access(cred, slot.inode(), space, false)?;
        let (found, _) = self.find_xattr(ino, name)?;
        let found = found.ok_or(Errno::ENODATA)?;
        self.read_value(ino, found)
    }

    pub(super) fn listxattr_impl(&self, cred: &Cred, ino: Ino) -> Result<Vec<Vec<u8>>> {
        let node = self.node(ino);
        let _slot = self.lock(&node)?;
        let mut out = Vec::new();
        let mut from = 0;
        loop {
            let items = self.objset.items(ino, KIND_XATTR, from, u64::MAX, 256)?;
            let Some(last) = items.last().map(|(k, _)| *k) else {
                break;
            };
            for (_, value) in items {
                let head = decode_xattr_head(&value)?;
                if head.name.starts_with(b"trusted.") && !perm::is_root(cred) {
                    continue;
                }
                out.push(head.name);
            }
            from = last + 1;
        }
        Ok(out)
    }

    pub(super) fn removexattr_impl(&self, cred: &Cred, ino: Ino, name: &OsStr) -> Result<()> {
        let (name, space) = parse_name(name)?;
        self.writable()?;
        let nodes = [self.node(ino)];
        let mut locked = self.lock_all(&nodes)?;
        check_access(cred, locked.get(ino), space, true)?;
        let (found, _) = self.find_xattr(ino, name)?;
        let found = found.ok_or(Errno::ENODATA)?;
        let now = Timespec::now();
        self.in_tx(0, &mut locked, |tx, l| {
            self.objset.remove_item(tx, ino, KIND_XATTR, found.xslot)?;
            for i in 1..=data_items(found.head.name.len(), found.head.value_len) {
                self.objset
                    .remove_item(tx, ino, KIND_XATTR_DATA, data_key(found.xslot, i))?;
            }
            l.get_mut(ino).ctime = now;
            self.put_inode(tx, ino, l.get(ino))
        })
    }
}
