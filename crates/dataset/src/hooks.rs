//! The dataset layer's answers to the POSIX layer (`DatasetHooks`): a filesystem's
//! properties and space, read live from the dataset directory so a `set` applies at once.

use std::sync::Arc;

use crate::dsl::Dsl;
use crate::errno::Errno;
use crate::posix::{DatasetHooks, DirectMode, SyncMode};
use crate::props;

/// The hooks of one dataset (a snapshot's are read-only).
pub struct DsHooks {
    pub dsl: Arc<Dsl>,
    pub id: u64,
    pub snapshot: bool,
}

impl DsHooks {
    fn prop(&self, name: &str) -> String {
        self.dsl.prop(self.id, name).unwrap_or_default()
    }
}

impl DatasetHooks for DsHooks {
    fn recordsize(&self) -> u32 {
        self.prop("recordsize").parse().unwrap_or(128 << 10)
    }
    fn readonly(&self) -> bool {
        self.snapshot || self.prop("readonly") == "on"
    }
    fn atime(&self) -> bool {
        !self.snapshot && self.prop("atime") == "on"
    }
    fn sync_mode(&self) -> SyncMode {
        props::sync_of(&self.prop("sync"))
    }
    fn direct(&self) -> DirectMode {
        props::direct_of(&self.prop("direct"))
    }
    fn check_space(&self, bytes: u64) -> Result<(), Errno> {
        if self.snapshot {
            return Err(Errno::EROFS);
        }
        self.dsl.check_space(self.id, bytes).map_err(Errno)
    }
    fn space(&self) -> (u64, u64) {
        let avail = self.dsl.available(self.id);
        (self.referenced() + avail, avail)
    }
    fn referenced(&self) -> u64 {
        self.dsl.record(self.id).map_or(0, |r| r.referenced)
    }
}
