//! The object layer's side of the intent log: what a change of an object set looks like in
//! the log, how `fsync` commits the changes of one object set, and how import replays them.
//!
//! # Theory of operation
//! Every change an object set makes in open context is recorded (`ObjectSet::log`) as a
//! [`LogOp`] in the order the changes happened: object creation, a small write (the bytes),
//! truncation, freeing, and `Set` (an item or block of the tree set to a value or removed),
//! which also carries large writes: their blocks are written to the pool by the commit (an
//! *indirect* write, as OpenZFS's WR_INDIRECT) and only the block pointer goes into the log,
//! so a small or slow log device never carries bulk data.
//!
//! [`ObjectStore::log_commit`] makes every change of one object set made so far durable:
//! it takes the changes at a point where no transaction runs (`Pool::quiet`, so no
//! operation of the layer above is cut in half), writes the blocks of large writes and
//! flushes them, then hands the records to the pool's log (`tank_pool::zil`). When the log
//! cannot take them, it waits for a txg sync instead. Commits are serialized; one commit
//! carries everything pending, so concurrent fsyncs share it (group commit).
//!
//! Records are dropped once their txg is committed (at the next quiesce). Replay
//! ([`ObjectStore::replay_log`]) re-applies, in order, the records of txgs after the
//! committed one, through the same object-set operations, into the open txg, then waits
//! for it to commit. A record for an object set that was rolled back or recreated after
//! it was logged is skipped: the object set's *floor* (the first log block sequence number
//! after the reset), kept in the meta object set, says so.

use std::sync::Arc;

use tank_block::{BlockPtr, BLKPTR_SIZE};
use tank_pool::LogEntry;
use tank_vdev::IoBatch;

use crate::objset::{ObjectSet, WritePolicy};
use crate::store::ObjectStore;
use crate::tree::{BlockRef, Key, TreeError, Value};
use crate::ObjectError;

/// Writes up to this many bytes are logged with their bytes; larger ones by block pointer.
pub const IMMEDIATE_MAX: usize = 64 << 10;
/// Where the meta object set keeps the floors: object 3, kind 23, offset = object set id.
pub const ZIL_OBJ: u64 = 3;
pub const KIND_ZIL_FLOOR: u8 = 23;

/// One change of an object set (see the module documentation).
#[derive(Clone, Debug)]
pub enum LogOp {
    Create {
        obj: u64,
        obj_type: u8,
        block_size: u32,
    },
    Write {
        obj: u64,
        offset: u64,
        data: Arc<[u8]>,
    },
    Truncate {
        obj: u64,
        size: u64,
    },
    Free {
        obj: u64,
    },
    Set {
        key: Key,
        value: Option<Value>,
    },
}

/// A recorded change: its order in the object set and its txg.
#[derive(Clone, Debug)]
pub struct Itx {
    pub seq: u64,
    pub txg: u64,
    pub op: LogOp,
}

const OP_CREATE: u8 = 1;
const OP_WRITE: u8 = 2;
const OP_TRUNCATE: u8 = 3;
const OP_FREE: u8 = 4;
const OP_SET: u8 = 5;
const VAL_NONE: u8 = 0;
const VAL_INLINE: u8 = 1;
const VAL_BLOCK: u8 = 2;

/// The value a `Set` record carries on disk: a block is always by pointer.
enum Stored {
    None,
    Inline(Vec<u8>),
    Block(BlockPtr, u32),
}

/// Encodes a record (FORMAT.md §13.3): op u8, 7 zero bytes, obj u64, then per op.
fn encode(op: &LogOp, bp: Option<(BlockPtr, u32)>) -> Vec<u8> {
    let mut b = Vec::with_capacity(64);
    let head = |b: &mut Vec<u8>, code: u8, obj: u64| {
        b.push(code);
        b.extend_from_slice(&[0u8; 7]);
        b.extend_from_slice(&obj.to_le_bytes());
    };
    match op {
        LogOp::Create {
            obj,
            obj_type,
            block_size,
        } => {
            head(&mut b, OP_CREATE, *obj);
            b.push(*obj_type);
            b.extend_from_slice(&[0u8; 3]);
            b.extend_from_slice(&block_size.to_le_bytes());
        }
        LogOp::Write { obj, offset, data } => {
            head(&mut b, OP_WRITE, *obj);
            b.extend_from_slice(&offset.to_le_bytes());
            b.extend_from_slice(data);
        }
        LogOp::Truncate { obj, size } => {
            head(&mut b, OP_TRUNCATE, *obj);
            b.extend_from_slice(&size.to_le_bytes());
        }
        LogOp::Free { obj } => head(&mut b, OP_FREE, *obj),
        LogOp::Set { key, value } => {
            head(&mut b, OP_SET, key.obj);
            b.push(key.kind);
            b.extend_from_slice(&[0u8; 7]);
            b.extend_from_slice(&key.offset.to_le_bytes());
            match (value, bp) {
                (None, _) => b.push(VAL_NONE),
                (Some(Value::Inline(v)), _) => {
                    b.push(VAL_INLINE);
                    b.extend_from_slice(&[0u8; 3]);
                    b.extend_from_slice(v);
                }
                (Some(Value::Block(_)), Some((bp, tag))) => {
                    b.push(VAL_BLOCK);
                    b.extend_from_slice(&[0u8; 3]);
                    b.extend_from_slice(&tag.to_le_bytes());
                    b.extend_from_slice(&bp.encode());
                }
                (Some(Value::Block(_)), None) => unreachable!("block records carry a pointer"),
            }
        }
    }
    b
}

/// A decoded record, ready to apply.
enum Decoded {
    Create {
        obj: u64,
        obj_type: u8,
        block_size: u32,
    },
    Write {
        obj: u64,
        offset: u64,
        data: Vec<u8>,
    },
    Truncate {
        obj: u64,
        size: u64,
    },
    Free {
        obj: u64,
    },
    Set {
        key: Key,
        value: Stored,
    },
}

/// For the fuzz target: an intent log record of an object set, from arbitrary bytes.
pub(crate) fn fuzz_record(b: &[u8]) {
    let _ = decode(b);
}

fn decode(b: &[u8]) -> Result<Decoded, String> {
    let short = || "log record: truncated".to_string();
    if b.len() < 16 {
        return Err(short());
    }
    let u64_at = |o: usize| -> Result<u64, String> {
        b.get(o..o + 8)
            .map(|s| u64::from_le_bytes(s.try_into().expect("8")))
            .ok_or_else(short)
    };
    let obj = u64_at(8)?;
    Ok(match b[0] {
        OP_CREATE => Decoded::Create {
            obj,
            obj_type: *b.get(16).ok_or_else(short)?,
            block_size: u32::from_le_bytes(b.get(20..24).ok_or_else(short)?.try_into().expect("4")),
        },
        OP_WRITE => Decoded::Write {
            obj,
            offset: u64_at(16)?,
            data: b[24.min(b.len())..].to_vec(),
        },
        OP_TRUNCATE => Decoded::Truncate {
            obj,
            size: u64_at(16)?,
        },
        OP_FREE => Decoded::Free { obj },
        OP_SET => {
            let kind = *b.get(16).ok_or_else(short)?;
            let offset = u64_at(24)?;
            let value = match *b.get(32).ok_or_else(short)? {
                VAL_NONE => Stored::None,
                VAL_INLINE => Stored::Inline(b.get(36..).ok_or_else(short)?.to_vec()),
                VAL_BLOCK => {
                    let tag =
                        u32::from_le_bytes(b.get(36..40).ok_or_else(short)?.try_into().expect("4"));
                    let raw = b.get(40..40 + BLKPTR_SIZE).ok_or_else(short)?;
                    let bp = BlockPtr::decode(raw)
                        .map_err(|e| format!("log record: {e}"))?
                        .ok_or("log record: hole block pointer")?;
                    Stored::Block(bp, tag)
                }
                v => return Err(format!("log record: unknown value kind {v}")),
            };
            Decoded::Set {
                key: Key { obj, kind, offset },
                value,
            }
        }
        op => return Err(format!("log record: unknown operation {op}")),
    })
}

impl ObjectStore {
    /// Makes every change of object set `os` made so far durable (fsync, O_SYNC,
    /// `sync=always`); see the module documentation.
    pub fn log_commit(&self, os: &ObjectSet) -> Result<(), ObjectError> {
        let pool = self.pool();
        let mine = pool.quiet(|| os.log_end());
        let _c = self.log_lock.lock();
        if os.log_durable() >= mine {
            // A commit that ran while this one waited carried these changes.
            return Ok(());
        }
        // Group commit: everything complete by now goes along, so the callers that queue
        // behind this commit find their changes durable when it ends.
        let end = pool.quiet(|| os.log_end());
        let mut synced = pool.synced_txg();
        let recs = os.log_pending(end, synced);
        // Blocks of large writes: written now (indirect), unless a sync wrote them, in which
        // case that txg is waited for (it is being committed). Each record with the pointer
        // its entry carries.
        let batch = IoBatch::new();
        let mut wait_for = 0;
        let mut items: Vec<(Itx, Option<(BlockPtr, u32)>)> = Vec::with_capacity(recs.len());
        let mut wrote = false;
        for r in recs {
            let ptr = match &r.op {
                LogOp::Set {
                    value: Some(Value::Block(b)),
                    ..
                } if b.bp().is_some() && !b.by_log() => {
                    wait_for = wait_for.max(r.txg);
                    None
                }
                LogOp::Set {
                    value: Some(Value::Block(b)),
                    ..
                } => {
                    let (bp, by_us) = b
                        .write_now(|data, tag| self.write_indirect(data, tag, r.txg, &batch))
                        .map_err(|e| ObjectError::Corrupt(e.to_string()))?;
                    wrote |= by_us;
                    Some((bp, b.tag()))
                }
                _ => None,
            };
            items.push((r, ptr));
        }
        let mut fallback = false;
        if wrote {
            let _ = batch.wait();
            if self.blocks().check_writable().is_err() {
                fallback = true;
            } else {
                let flush = IoBatch::new();
                self.blocks().flush_all(&flush);
                if !flush.wait().is_empty() && self.blocks().check_writable().is_err() {
                    fallback = true;
                }
            }
        }
        if wait_for > 0 && !fallback {
            pool.wait_txg(wait_for)?;
            synced = pool.synced_txg();
            items.retain(|(r, _)| r.txg > synced);
        }
        if !fallback {
            let entries: Vec<LogEntry> = items
                .iter()
                .map(|(r, p)| LogEntry {
                    objset: os.id,
                    txg: r.txg,
                    seq: 0,
                    data: encode(&r.op, *p),
                })
                .collect();
            if entries.is_empty() {
                os.log_durable_to(end);
                return Ok(());
            }
            match pool.log_write(entries) {
                Ok(()) => {
                    os.log_durable_to(end);
                    return Ok(());
                }
                Err(_) => fallback = true,
            }
        }
        debug_assert!(fallback);
        pool.zil.count_fallback();
        pool.wait_synced()?;
        os.log_durable_to(end);
        Ok(())
    }

    /// Writes a data block of a large synchronous write now (its txg's policy in `tag`).
    fn write_indirect(
        &self,
        data: &[u8],
        tag: u32,
        txg: u64,
        batch: &Arc<IoBatch>,
    ) -> Result<BlockPtr, TreeError> {
        let props = WritePolicy::data_props(tag);
        self.blocks()
            .write(data, &props, txg, 1, batch)
            .map_err(|e| TreeError::Store(e.to_string()))
    }

    /// Applies the intent log's records left from before a crash (once, at open by the
    /// layer above), and waits for the txg that holds them. Returns how many records were
    /// applied. The layer above must first have installed its sync hook and set every
    /// object set's snapshot txgs (`ObjectSet::set_snapshot_txgs`): a replayed change that
    /// kills a block a snapshot shares must keep it, not free it.
    pub fn replay_log(&self) -> Result<usize, ObjectError> {
        let pool = self.pool();
        let entries = pool.zil.take_replay();
        if entries.is_empty() {
            return Ok(0);
        }
        let floors = self.log_floors();
        let mut applied = 0;
        let mut broken: Vec<u64> = Vec::new();
        let txg = {
            let tx = pool.begin_tx(0)?;
            for e in &entries {
                if broken.contains(&e.objset) || e.seq < floors.get(&e.objset).copied().unwrap_or(0)
                {
                    continue;
                }
                let Ok(os) = self.objset(e.objset) else {
                    continue;
                };
                os.set_replaying(true);
                let r = decode(&e.data)
                    .map_err(ObjectError::Corrupt)
                    .and_then(|d| self.apply(&os, &tx, d));
                os.set_replaying(false);
                match r {
                    Ok(()) => applied += 1,
                    Err(err) => {
                        pool.events.post(
                            "sysevent.fs.zfs.zil_replay",
                            None,
                            format!(
                                "objset={} error=\"{err}\" (later records of it skipped)",
                                e.objset
                            ),
                        );
                        broken.push(e.objset);
                    }
                }
            }
            tx.txg
        };
        pool.zil.replayed(txg);
        pool.wait_txg(txg)?;
        Ok(applied)
    }

    fn apply(&self, os: &ObjectSet, tx: &tank_pool::Tx<'_>, d: Decoded) -> Result<(), ObjectError> {
        match d {
            Decoded::Create {
                obj,
                obj_type,
                block_size,
            } => {
                let got = os.create_object(tx, obj_type, block_size)?;
                if got != obj {
                    return Err(ObjectError::Corrupt(format!(
                        "replay created object {got}, the log says {obj}"
                    )));
                }
                Ok(())
            }
            Decoded::Write { obj, offset, data } => os.write(tx, obj, offset, &data),
            Decoded::Truncate { obj, size } => os.truncate(tx, obj, size),
            Decoded::Free { obj } => os.free_object(tx, obj),
            Decoded::Set { key, value } => {
                let value = match value {
                    Stored::None => None,
                    Stored::Inline(v) => Some(Value::inline(&v)),
                    Stored::Block(bp, tag) => {
                        self.claim(&bp)?;
                        Some(Value::Block(BlockRef::new_prewritten(bp, tag)))
                    }
                };
                os.replay_set(key, value)
            }
        }
    }

    /// Marks the extents of a block written by the log as allocated, if the space maps of
    /// the committed txg do not (ZFS's zil_claim).
    fn claim(&self, bp: &BlockPtr) -> Result<(), ObjectError> {
        Ok(self.blocks().claim(bp, self.pool().open_txg())?)
    }
}
