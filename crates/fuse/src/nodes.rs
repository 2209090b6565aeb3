//! FUSE node ids for several filesystems served through one mount.
//!
//! # Theory of operation
//! The kernel knows one inode space per mount; we serve the live filesystem, any number of
//! snapshots under `.tank/snapshot/<name>`, and two virtual directories. A node id is
//! `slot << 48 | ino`:
//!
//! - slot 0 is the live filesystem, so its inode numbers pass through unchanged and its
//!   `ROOT_INO` (1) is the FUSE root;
//! - slots 1..=`SNAPSHOT_SLOTS` are snapshots, assigned when a snapshot is first looked up
//!   (or listed) and freed when the kernel has forgotten every node of the slot;
//! - slot `VIRTUAL_SLOT` (0xFFFF) holds the virtual directories `.tank` and `.tank/snapshot`.
//!
//! # Limits
//! Inode numbers of a filesystem must stay below 2^48 (EOVERFLOW otherwise); at most 65534
//! snapshots can be open at once (ENFILE past that).
//!
//! # Lookup bookkeeping
//! Only snapshot slots keep counts: the number of kernel references (lookups not yet
//! forgotten) to any node of the slot, one counter per slot. A reply that hands the kernel
//! a node first *pins* the slot (count + 1, under the table's read lock, so a slot at zero
//! cannot be freed and reassigned in between); the pin is kept when the reply is sent and
//! undone when the operation fails. `forget` lowers the count; at zero the slot is freed
//! under the write lock (after checking the count again), which drops the snapshot's `Fs`.
//! The bookkeeping is therefore bounded by the number of open snapshots, whatever the number
//! of files; the live filesystem's inode lifetimes are the `Fs`'s own business (open/release).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;
use tank_dataset::posix::{Fs, Ino};
use tank_dataset::Errno;

/// Bits of a node id that carry the filesystem's inode number.
pub const INO_BITS: u32 = 48;
pub const INO_MASK: u64 = (1 << INO_BITS) - 1;
/// The live filesystem's slot.
pub const LIVE_SLOT: u16 = 0;
/// The slot of the virtual directories.
pub const VIRTUAL_SLOT: u16 = 0xFFFF;
/// Snapshot slots are 1..=SNAPSHOT_SLOTS.
pub const SNAPSHOT_SLOTS: u16 = VIRTUAL_SLOT - 1;

/// `.tank` at the root of the live filesystem.
pub const CONTROL_NODE: u64 = (VIRTUAL_SLOT as u64) << INO_BITS | 1;
/// `.tank/snapshot`.
pub const SNAPDIR_NODE: u64 = (VIRTUAL_SLOT as u64) << INO_BITS | 2;

/// What a node id names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Node {
    /// An inode of the filesystem in `slot`.
    Fs { slot: u16, ino: Ino },
    /// `.tank`.
    Control,
    /// `.tank/snapshot`.
    SnapshotDir,
}

impl Node {
    pub fn decode(nodeid: u64) -> Option<Node> {
        let slot = (nodeid >> INO_BITS) as u16;
        let ino = nodeid & INO_MASK;
        match (slot, nodeid) {
            (VIRTUAL_SLOT, CONTROL_NODE) => Some(Node::Control),
            (VIRTUAL_SLOT, SNAPDIR_NODE) => Some(Node::SnapshotDir),
            (VIRTUAL_SLOT, _) => None,
            _ if ino == 0 => None,
            _ => Some(Node::Fs { slot, ino }),
        }
    }
}

/// The node id of `ino` in `slot`.
pub fn encode(slot: u16, ino: Ino) -> Result<u64, Errno> {
    debug_assert!(slot != VIRTUAL_SLOT);
    if ino == 0 || ino > INO_MASK {
        return Err(Errno(libc::EOVERFLOW));
    }
    Ok(u64::from(slot) << INO_BITS | ino)
}

struct Slot {
    name: String,
    fs: Arc<Fs>,
    /// Kernel references to nodes of this slot (lookups not yet forgotten), plus pins.
    refs: AtomicU64,
}

#[derive(Default)]
struct Table {
    by_slot: HashMap<u16, Arc<Slot>>,
    by_name: HashMap<String, u16>,
    /// Where the search for a free slot starts (slots are reused round-robin).
    next: u16,
}

/// The filesystems of one mount: the live one and the open snapshots.
pub struct Slots {
    live: Arc<Fs>,
    table: RwLock<Table>,
}

/// A reference to a snapshot slot taken for a reply that hands the kernel a node of it.
/// Dropped, it is given back; `keep` turns it into the kernel's reference.
pub struct Pin<'a> {
    slots: &'a Slots,
    slot: u16,
}

impl Pin<'_> {
    pub fn keep(self) {
        std::mem::forget(self);
    }
}

impl Drop for Pin<'_> {
    fn drop(&mut self) {
        self.slots.forget(self.slot, 1);
    }
}

impl Slots {
    pub fn new(live: Arc<Fs>) -> Slots {
        Slots {
            live,
            table: RwLock::new(Table {
                next: 1,
                ..Table::default()
            }),
        }
    }

    pub fn live(&self) -> &Arc<Fs> {
        &self.live
    }

    /// The filesystem in `slot` (ESTALE for a slot that is not open).
    pub fn fs(&self, slot: u16) -> Result<Arc<Fs>, Errno> {
        if slot == LIVE_SLOT {
            return Ok(self.live.clone());
        }
        let table = self.table.read();
        let s = table.by_slot.get(&slot).ok_or(Errno(libc::ESTALE))?;
        Ok(s.fs.clone())
    }

    /// Takes a reference on `slot` for a node about to be handed to the kernel. The live
    /// slot needs none (`None`).
    pub fn pin(&self, slot: u16) -> Result<Option<Pin<'_>>, Errno> {
        if slot == LIVE_SLOT {
            return Ok(None);
        }
        let table = self.table.read();
        let s = table.by_slot.get(&slot).ok_or(Errno(libc::ESTALE))?;
        s.refs.fetch_add(1, Ordering::AcqRel);
        Ok(Some(Pin { slots: self, slot }))
    }

    /// The slot of the open snapshot `name`, if it is open.
    pub fn find(&self, name: &str) -> Option<(u16, Arc<Fs>)> {
        let table = self.table.read();
        let slot = *table.by_name.get(name)?;
        Some((slot, table.by_slot[&slot].fs.clone()))
    }

    /// Gives `name` a slot for the filesystem `open` returns (unless it already has one)
    /// and pins it.
    pub fn open(
        &self,
        name: &str,
        open: impl FnOnce() -> Option<Arc<Fs>>,
    ) -> Result<(u16, Arc<Fs>, Pin<'_>), Errno> {
        {
            let table = self.table.read();
            if let Some(&slot) = table.by_name.get(name) {
                let s = &table.by_slot[&slot];
                s.refs.fetch_add(1, Ordering::AcqRel);
                return Ok((slot, s.fs.clone(), Pin { slots: self, slot }));
            }
        }
        // Opening may read the pool: not under the lock. A racing opener of the same name
        // may win; its slot is used and this filesystem dropped.
        let fs = open().ok_or(Errno::ENOENT)?;
        let mut table = self.table.write();
        if let Some(&slot) = table.by_name.get(name) {
            let s = &table.by_slot[&slot];
            s.refs.fetch_add(1, Ordering::AcqRel);
            return Ok((slot, s.fs.clone(), Pin { slots: self, slot }));
        }
        if table.by_slot.len() >= usize::from(SNAPSHOT_SLOTS) {
            return Err(Errno(libc::ENFILE));
        }
        let mut slot = table.next;
        while table.by_slot.contains_key(&slot) {
            slot = if slot >= SNAPSHOT_SLOTS { 1 } else { slot + 1 };
        }
        assert!((1..=SNAPSHOT_SLOTS).contains(&slot));
        table.next = if slot >= SNAPSHOT_SLOTS { 1 } else { slot + 1 };
        table.by_slot.insert(
            slot,
            Arc::new(Slot {
                name: name.to_owned(),
                fs: fs.clone(),
                refs: AtomicU64::new(1),
            }),
        );
        table.by_name.insert(name.to_owned(), slot);
        Ok((slot, fs, Pin { slots: self, slot }))
    }

    /// The kernel dropped `count` references to nodes of `slot`. A snapshot slot left with
    /// none is closed.
    pub fn forget(&self, slot: u16, count: u64) {
        if slot == LIVE_SLOT || slot == VIRTUAL_SLOT || count == 0 {
            return;
        }
        let left = {
            let table = self.table.read();
            let Some(s) = table.by_slot.get(&slot) else {
                return;
            };
            let mut cur = s.refs.load(Ordering::Acquire);
            loop {
                // More forgotten than handed out would be a kernel or bookkeeping bug;
                // saturate rather than wrap.
                let new = cur.saturating_sub(count);
                match s
                    .refs
                    .compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) => break new,
                    Err(actual) => cur = actual,
                }
            }
        };
        if left == 0 {
            let mut table = self.table.write();
            let idle = table
                .by_slot
                .get(&slot)
                .is_some_and(|s| s.refs.load(Ordering::Acquire) == 0);
            if idle {
                let s = table.by_slot.remove(&slot).expect("slot present");
                table.by_name.remove(&s.name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_round_trip() {
        assert_eq!(encode(0, 1).unwrap(), 1);
        assert_eq!(Node::decode(1), Some(Node::Fs { slot: 0, ino: 1 }));
        let id = encode(7, 12345).unwrap();
        assert_eq!(
            Node::decode(id),
            Some(Node::Fs {
                slot: 7,
                ino: 12345
            })
        );
        assert_eq!(Node::decode(CONTROL_NODE), Some(Node::Control));
        assert_eq!(Node::decode(SNAPDIR_NODE), Some(Node::SnapshotDir));
        assert_eq!(Node::decode((VIRTUAL_SLOT as u64) << INO_BITS | 3), None);
        assert_eq!(Node::decode(5 << INO_BITS), None);
        assert_eq!(encode(0, INO_MASK + 1), Err(Errno(libc::EOVERFLOW)));
        assert_eq!(encode(3, 0), Err(Errno(libc::EOVERFLOW)));
        // Snapshot slots never reach the virtual slot.
        assert!(encode(SNAPSHOT_SLOTS, INO_MASK).unwrap() < CONTROL_NODE);
    }
}
