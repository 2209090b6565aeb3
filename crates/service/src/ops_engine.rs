//! Engine requests: the caches' counters, the tunables, and inspection of on-disk
//! structures (zdb's role: the root block, object sets, raw objects).
//!
//! # Theory of operation
//! The ARC is the process's, so its counters are those of the process that runs the
//! service (the daemon's when one runs); each open pool has its L2ARC. The tunables go by
//! their ZFS module-parameter names and hold for the running process. Raw-object requests
//! exercise the object layer without datasets; their bytes travel hex-encoded.

use std::sync::atomic::Ordering;

use serde::Serialize;
use tank_object::{arc, l2arc};

use crate::api::{hex_decode, hex_encode, CacheReport, Param, Request, Response};
use crate::error::ServiceError;
use crate::service::{Ctx, Res, Service};

/// Bytes per transaction when writing an object, and most bytes per read response.
pub const CHUNK: usize = 8 << 20;

fn to_map<T: Serialize>(v: &T) -> serde_json::Map<String, serde_json::Value> {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::Object(m)) => m,
        _ => Default::default(),
    }
}

/// The tunables: (name, value as shown, what it is).
pub fn params() -> Vec<Param> {
    let t = l2arc::tunables();
    let p = |name: &str, value: String, meaning: &str| Param {
        name: name.into(),
        value,
        meaning: meaning.into(),
    };
    vec![
        p(
            "arc_max",
            arc::global().max().to_string(),
            "bytes the ARC may hold, headers included",
        ),
        p(
            "scrub_max_rate",
            tank_object::scan::SCRUB_MAX_RATE
                .load(Ordering::Relaxed)
                .to_string(),
            "bytes per second a scrub may read, every pool together (0: no limit; a resilver is never held back)",
        ),
        p(
            "l2arc_write_max",
            t.write_max.load(Ordering::Relaxed).to_string(),
            "bytes written to each cache device per feed round",
        ),
        p(
            "l2arc_write_boost",
            t.write_boost.load(Ordering::Relaxed).to_string(),
            "extra bytes per round until the ARC first evicts",
        ),
        p(
            "l2arc_noprefetch",
            u8::from(t.noprefetch.load(Ordering::Relaxed)).to_string(),
            "1: blocks read ahead and not yet used are not cached on L2ARC",
        ),
        p(
            "l2arc_feed_secs",
            t.feed_secs.load(Ordering::Relaxed).to_string(),
            "seconds between feed rounds",
        ),
    ]
}

/// Sets a tunable for this process.
pub fn set_param(name: &str, value: &str) -> Res<()> {
    let t = l2arc::tunables();
    let invalid =
        |why: String| ServiceError::Invalid(format!("invalid value '{value}' for {name}: {why}"));
    let size = || tank_dataset::props::parse_size(value, false).map_err(|e| invalid(e.to_string()));
    match name {
        "scrub_max_rate" => tank_object::scan::SCRUB_MAX_RATE.store(size()?, Ordering::Relaxed),
        "arc_max" => arc::global()
            .set_max(size()?)
            .map_err(|e| ServiceError::Invalid(format!("cannot set arc_max: {e}")))?,
        "l2arc_write_max" | "l2arc_write_boost" => {
            let v = size()?;
            if name == "l2arc_write_max" && v < 64 << 10 {
                return Err(invalid("at least 64K".into()));
            }
            if v > 1 << 30 {
                return Err(invalid("at most 1G per round".into()));
            }
            let slot = if name == "l2arc_write_max" {
                &t.write_max
            } else {
                &t.write_boost
            };
            slot.store(v, Ordering::Relaxed);
        }
        "l2arc_noprefetch" => match value {
            "0" | "1" => t.noprefetch.store(value == "1", Ordering::Relaxed),
            _ => return Err(invalid("0 or 1".into())),
        },
        "l2arc_feed_secs" => match value.parse::<u64>() {
            Ok(v @ 1..=60) => t.feed_secs.store(v, Ordering::Relaxed),
            _ => return Err(invalid("1 to 60 seconds".into())),
        },
        _ => {
            return Err(ServiceError::Invalid(format!(
                "unknown parameter '{name}' (known: {})",
                params()
                    .iter()
                    .map(|p| p.name.clone())
                    .collect::<Vec<_>>()
                    .join(", ")
            )))
        }
    }
    Ok(())
}

impl Service {
    /// The ARC's counters and each open pool's L2ARC and intent log.
    pub fn cache_report(&self) -> CacheReport {
        let mut open = self.open_pools();
        open.sort_by_key(|o| o.pool.name());
        let l2 = open
            .iter()
            .map(|o| (o.pool.name(), to_map(&o.store.cache().l2().stats())))
            .collect();
        let zil = open
            .iter()
            .map(|o| (o.pool.name(), to_map(&o.pool.zil.stats())))
            .collect();
        CacheReport {
            arc: to_map(&arc::global().stats()),
            l2arc: l2,
            zil,
        }
    }

    pub(crate) fn engine_request(&self, ctx: &mut Ctx, req: Request) -> Res<Response> {
        use std::fmt::Write;
        use Request as R;
        match req {
            R::CacheStats => Ok(Response::CacheStats(Box::new(self.cache_report()))),
            R::ParamList => Ok(Response::Params(params())),
            R::ParamSet { name, value } => {
                set_param(&name, &value)?;
                Ok(Response::Done {
                    message: format!("{name} set to {value}"),
                })
            }
            R::DebugTree {
                pool,
                objset,
                limit,
            } => {
                let o = self.open_pool(&pool, ctx)?;
                let mut t = String::new();
                let (root_bp, root) = o.pool.root();
                let _ = writeln!(t, "pool {pool} txg {}", o.pool.synced_txg());
                if let Some(bp) = root_bp {
                    let _ = writeln!(t, "root block: {}", bp.describe());
                }
                if let Some(r) = root {
                    let _ = writeln!(t, "    history records: {}", r.history_count);
                    let _ = writeln!(t, "    space map log: {} block(s)", r.spacemap_chain);
                    for bp in o.pool.spacemap_chain() {
                        let _ = writeln!(t, "        {}", bp.describe());
                    }
                    if let Some(bp) = r.objset_table {
                        let _ = writeln!(t, "    objset table: {}", bp.describe());
                    }
                }
                for (id, bp) in o.pool.objsets() {
                    let _ = writeln!(
                        t,
                        "objset {id}: root {}",
                        bp.map(|b| b.describe()).unwrap_or_else(|| "empty".into())
                    );
                }
                let os = o.store.objset(objset).map_err(anyhow::Error::from)?;
                let _ = writeln!(t, "items of objset {objset} (first {limit}):");
                for (k, desc) in os.dump(limit).map_err(anyhow::Error::from)? {
                    let _ = writeln!(
                        t,
                        "    obj {} kind {} off {}: {}",
                        k.obj, k.kind, k.offset, desc
                    );
                }
                Ok(Response::Text { text: t })
            }
            R::DebugObjectWrite {
                pool,
                objset,
                block_size,
                data,
            } => {
                if !(512..=(16 << 20)).contains(&block_size) || !block_size.is_power_of_two() {
                    return Err(ServiceError::Invalid(format!(
                        "invalid block size {block_size}: a power of two from 512 to 16M"
                    )));
                }
                let data = hex_decode(&data)?;
                let lock = self.pool_lock(&pool);
                let _l = lock.lock();
                let o = self.open_pool(&pool, ctx)?;
                let r = (|| -> anyhow::Result<(u64, u64)> {
                    let os = o.store.objset(objset)?;
                    let id = {
                        let tx = o.store.begin(0)?;
                        os.create_object(&tx, 1, block_size)?
                    };
                    let mut offset = 0u64;
                    for chunk in data.chunks(CHUNK) {
                        let tx = o.store.begin(chunk.len() as u64)?;
                        os.write(&tx, id, offset, chunk)?;
                        drop(tx);
                        offset += chunk.len() as u64;
                    }
                    o.pool.log_history(&ctx.command);
                    o.store.sync()?;
                    Ok((id, offset))
                })()?;
                Ok(Response::ObjectWritten {
                    id: r.0,
                    length: r.1,
                })
            }
            R::DebugObjectRead {
                pool,
                objset,
                id,
                offset,
                length,
            } => {
                let o = self.open_pool(&pool, ctx)?;
                let os = o.store.objset(objset).map_err(anyhow::Error::from)?;
                let info = os.stat(id).map_err(anyhow::Error::from)?;
                let want = length.min(CHUNK as u64) as usize;
                let data = if offset >= info.size {
                    Vec::new()
                } else {
                    os.read(id, offset, want).map_err(anyhow::Error::from)?
                };
                Ok(Response::Bytes {
                    data: hex_encode(&data),
                    size: info.size,
                })
            }
            R::DebugObjectRemove { pool, objset, id } => {
                let lock = self.pool_lock(&pool);
                let _l = lock.lock();
                let o = self.open_pool(&pool, ctx)?;
                (|| -> anyhow::Result<()> {
                    let os = o.store.objset(objset)?;
                    {
                        let tx = o.store.begin(0)?;
                        os.free_object(&tx, id)?;
                    }
                    o.pool.log_history(&ctx.command);
                    o.store.sync()?;
                    Ok(())
                })()?;
                Ok(Response::Done {
                    message: format!("removed object {id} of objset {objset}"),
                })
            }
            R::DebugObjectList { pool, objset } => {
                let o = self.open_pool(&pool, ctx)?;
                let infos = (|| -> anyhow::Result<Vec<tank_object::ObjectInfo>> {
                    let os = o.store.objset(objset)?;
                    let mut infos = Vec::new();
                    let mut from = 1;
                    loop {
                        let ids = os.list_objects(from, 1000)?;
                        let Some(last) = ids.last().copied() else {
                            break;
                        };
                        for id in &ids {
                            infos.push(os.stat(*id)?);
                        }
                        from = last + 1;
                    }
                    Ok(infos)
                })()?;
                Ok(Response::Objects { objects: infos })
            }
            _ => unreachable!("not an engine request"),
        }
    }
}
