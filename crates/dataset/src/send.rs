//! `tank send`: a snapshot as a stream, whole or as the changes since an earlier snapshot or
//! bookmark of the same lineage.
//!
//! # Theory of operation
//! The snapshot's tree is described by `ObjectSet::changes_since` (`tree/changes.rs`) from
//! the base's txg: what was born after it, found from birth times, so the cost follows the
//! change. Each change becomes stream records (`stream.rs`): `CLEAR` for a range with
//! nothing, `UNCHANGED` for a subtree the base has as it is, `LEAF` with the keys of a changed leaf, then a `SET_INLINE` or `SET_BLOCK` per
//! new or changed item. A block's bytes are read through the ARC, logical, or as stored with
//! `-c`. `-I` sends every snapshot between the base and the target, one substream each. A
//! resume token (`recv.rs` makes it on the receiving side) names the snapshot, the base and
//! the key to go on from; the sender checks that the token is intact and asks for nothing
//! but the rest of that one increment.
//!
//! A base must be of the snapshot's lineage: an earlier snapshot or bookmark of its dataset,
//! or the origin of a clone. Anything else would describe changes against a tree the
//! receiver does not have.

use std::io::Write;

use tank_object::tree::{Change, Key, TreeError, Value};

use crate::dsl::{DatasetKind, Dsl};
use crate::stream::{
    key_from_hex, key_hex, Begin, Replicate, TransferError, Writer, STREAM_MAGIC, STREAM_VERSION,
};

/// What `tank send` was asked for.
#[derive(Debug, Clone, Default)]
pub struct SendOptions {
    /// `-i` / `-I`: the base, a snapshot (`@snap` or `POOL/DS@snap`) or bookmark (`#mark`
    /// or `POOL/DS#mark`).
    pub from: Option<String>,
    /// `-I`: every snapshot between the base and the target.
    pub intermediates: bool,
    /// `-c` (and `-w`): blocks as stored, compressed.
    pub compressed: bool,
    /// `-R`: every descendant that has the snapshot too, with all their snapshots.
    pub replicate: bool,
}

/// What a send wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SendSummary {
    /// Full names of the snapshots sent, in order.
    pub snapshots: Vec<String>,
    pub bytes: u64,
    pub records: u64,
}

/// A resume token's contents (`receive_resume_token`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ResumeToken {
    /// The replication stream (`-R`) the cut substream belonged to, and its place there:
    /// the sender goes on with the substreams after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicate: Option<Replicate>,
    #[serde(default)]
    pub part: u64,
    pub to_guid: u64,
    pub from_guid: u64,
    pub to_name: String,
    /// Where to go on from (hex of the key); every range before it was received.
    pub next: String,
    pub compressed: bool,
    /// Stream bytes received so far (for the progress display).
    pub bytes: u64,
}

impl ResumeToken {
    /// `1-<checksum>-<hex of the JSON>`: versioned, and checked so a damaged token is refused.
    pub fn encode(&self) -> String {
        let json = serde_json::to_vec(self).expect("token serializes");
        let sum = xxhash_rust::xxh3::xxh3_64(&json);
        format!("1-{sum:016x}-{}", tank_block::blkptr::hex(&json))
    }

    pub fn decode(token: &str) -> Result<ResumeToken, TransferError> {
        let bad = |why: &str| TransferError::Refused(format!("invalid resume token: {why}"));
        let mut parts = token.trim().splitn(3, '-');
        let (Some(v), Some(sum), Some(body)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad("expected 1-CHECKSUM-DATA"));
        };
        if v != "1" {
            return Err(bad(&format!("version {v} (this build makes version 1)")));
        }
        if body.len() % 2 != 0 || body.len() > 8192 {
            return Err(bad("malformed data"));
        }
        let json: Vec<u8> = (0..body.len() / 2)
            .map(|i| u8::from_str_radix(&body[2 * i..2 * i + 2], 16))
            .collect::<Result<_, _>>()
            .map_err(|_| bad("malformed data"))?;
        if format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&json)) != sum {
            return Err(bad("checksum mismatch (the token was changed or cut)"));
        }
        let t: ResumeToken = serde_json::from_slice(&json).map_err(|_| bad("malformed data"))?;
        if key_from_hex(&t.next).is_none() {
            return Err(bad("malformed resume point"));
        }
        Ok(t)
    }
}

/// A resolved base: its guid and txg.
#[derive(Clone, Copy)]
struct Base {
    guid: u64,
    txg: u64,
}

/// Resolves `from` as a base of snapshot `to` (an id), checking the lineage.
fn resolve_base(dsl: &Dsl, to: u64, from: &str) -> Result<Base, TransferError> {
    let to_rec = dsl.record(to)?;
    let head = to_rec.parent;
    let head_name = dsl.name_of(head);
    let full = if from.starts_with('@') || from.starts_with('#') {
        format!("{head_name}{from}")
    } else {
        from.to_string()
    };
    let refuse = |why: String| TransferError::Refused(why);
    if full.contains('#') {
        let (bhead, mark) = dsl.bookmark(&full)?;
        if bhead != head {
            return Err(refuse(format!(
                "'{full}' is not a bookmark of '{head_name}': an incremental base must be of the same dataset"
            )));
        }
        if mark.txg >= to_rec.txg {
            return Err(refuse(format!(
                "'{full}' is not earlier than '{}'",
                dsl.name_of(to)
            )));
        }
        return Ok(Base {
            guid: mark.guid,
            txg: mark.txg,
        });
    }
    let sid = dsl.resolve(&full)?;
    let s = dsl.record(sid)?;
    if s.kind != DatasetKind::Snapshot {
        return Err(refuse(format!("'{full}' is not a snapshot")));
    }
    let head_rec = dsl.record(head)?;
    let lineage = s.parent == head || head_rec.origin == sid;
    if !lineage {
        return Err(refuse(format!(
            "'{full}' is not an earlier snapshot of '{head_name}' nor its origin: an incremental stream needs a base of the same lineage"
        )));
    }
    if s.txg >= to_rec.txg {
        return Err(refuse(format!(
            "'{full}' is not earlier than '{}'",
            dsl.name_of(to)
        )));
    }
    Ok(Base {
        guid: s.guid,
        txg: s.txg,
    })
}

/// The guid of `from` (`@snap`, `#mark` or a full name) as an incremental base of
/// `snapshot`, after the same checks a send makes.
pub fn base_guid(dsl: &Dsl, snapshot: &str, from: &str) -> Result<u64, TransferError> {
    let to = dsl.resolve(snapshot)?;
    Ok(resolve_base(dsl, to, from)?.guid)
}

/// One substream of a plan: snapshot `sid` against the base (`from_guid`, `from_txg`).
#[derive(Debug, Clone, Copy)]
struct Step {
    from_guid: u64,
    from_txg: u64,
    sid: u64,
}

/// The increments of one dataset: from `base` (a snapshot or bookmark; none: the dataset's
/// first snapshot whole) to snapshot `to`, every snapshot between with `intermediates`.
fn steps_of(
    dsl: &Dsl,
    head: u64,
    base: Option<&Base>,
    to: u64,
    intermediates: bool,
) -> Result<Vec<Step>, TransferError> {
    let to_txg = dsl.record(to)?.txg;
    let mut out = Vec::new();
    let (mut from_guid, mut from_txg) = base.map_or((0, 0), |b| (b.guid, b.txg));
    for s in dsl.snapshots(head) {
        let r = dsl.record(s)?;
        let between = r.txg <= to_txg && (base.is_none() || r.txg > from_txg);
        if !between || (!intermediates && s != to) {
            continue;
        }
        out.push(Step {
            from_guid,
            from_txg,
            sid: s,
        });
        (from_guid, from_txg) = (r.guid, r.txg);
    }
    Ok(out)
}

/// The substreams `tank send` writes for `snapshot` with `opts`, and the replication
/// description of a `-R` stream.
fn plan(
    dsl: &Dsl,
    snapshot: &str,
    opts: &SendOptions,
) -> Result<(Vec<Step>, Option<Replicate>), TransferError> {
    let to = dsl.resolve(snapshot)?;
    let to_rec = dsl.record(to)?;
    if to_rec.kind != DatasetKind::Snapshot {
        return Err(TransferError::Refused(format!(
            "'{snapshot}' is not a snapshot: send sends a snapshot (dataset@name)"
        )));
    }
    if opts.intermediates && opts.from.is_none() {
        return Err(TransferError::Refused("-I needs a base snapshot".into()));
    }
    let base = opts
        .from
        .as_deref()
        .map(|f| resolve_base(dsl, to, f))
        .transpose()?;
    if !opts.replicate {
        let steps = match &base {
            None => vec![Step {
                from_guid: 0,
                from_txg: 0,
                sid: to,
            }],
            Some(b) => steps_of(dsl, to_rec.parent, Some(b), to, opts.intermediates)?,
        };
        return Ok((steps, None));
    }
    // Every dataset below that has the snapshot, parents first; each from the base of the
    // same name when it has one, else whole (every snapshot, as zfs send -R).
    let top = to_rec.parent;
    let base_name = opts.from.as_deref().map(|f| {
        f.rsplit_once(['@', '#'])
            .map_or(f.to_string(), |(_, n)| n.to_string())
    });
    let mark = opts.from.as_deref().is_some_and(|f| f.contains('#'));
    let mut steps = Vec::new();
    for d in dsl.subtree(top) {
        let r = dsl.record(d)?;
        if r.kind == DatasetKind::Snapshot {
            continue;
        }
        let name = dsl.name_of(d);
        let Ok(sid) = dsl.resolve(&format!("{name}@{}", to_rec.name)) else {
            continue;
        };
        let b = match &base_name {
            Some(_) if d == top => base,
            Some(n) => {
                let sep = if mark { '#' } else { '@' };
                resolve_base(dsl, sid, &format!("{name}{sep}{n}")).ok()
            }
            None => None,
        };
        let intermediates = opts.intermediates || b.is_none();
        steps.extend(steps_of(dsl, d, b.as_ref(), sid, intermediates)?);
    }
    let replicate = Replicate {
        root: dsl.name_of(top),
        snapshot: to_rec.name.clone(),
        from: base_name.map(|n| format!("{}{n}", if mark { '#' } else { '@' })),
        intermediates: opts.intermediates,
    };
    Ok((steps, Some(replicate)))
}

/// Writes a stream of `snapshot` (see the module documentation). `progress` is told the
/// bytes written so far, now and then.
pub fn send(
    dsl: &Dsl,
    snapshot: &str,
    opts: &SendOptions,
    out: &mut dyn Write,
    progress: &mut dyn FnMut(u64),
) -> Result<SendSummary, TransferError> {
    let (steps, replicate) = plan(dsl, snapshot, opts)?;
    write_steps(
        dsl,
        &steps,
        0,
        Key::MIN,
        replicate,
        opts.compressed,
        out,
        progress,
    )
}

/// The size a stream of `snapshot` with `opts` will have, found by walking the same trees
/// without reading a data block (`send -n`, and the ETA of `send -v`). Exact but for the
/// `BEGIN` records' JSON, counted at 512 bytes each.
pub fn estimate(
    dsl: &Dsl,
    snapshot: &str,
    opts: &SendOptions,
) -> Result<SendSummary, TransferError> {
    use crate::stream::{HEADER_SIZE, TRAILER_SIZE};
    const BEGIN: u64 = 512;
    let per = (HEADER_SIZE + TRAILER_SIZE) as u64;
    let range = 2 * Key::SIZE as u64 + 1;
    let (steps, _) = plan(dsl, snapshot, opts)?;
    let mut total = 0u64;
    let mut snapshots = Vec::new();
    for step in steps {
        snapshots.push(dsl.name_of(step.sid));
        let os = dsl.snapshot_objset(step.sid)?;
        total += BEGIN + per + 16;
        os.changes_since(step.from_txg, Key::MIN, &mut |change| {
            total += per
                + match change {
                    Change::Clear { .. } => range,
                    Change::Unchanged { .. } => range + 2 * Key::SIZE as u64,
                    Change::Leaf { keys, items, .. } => {
                        let mut n = range + 4 + (keys.len() * Key::SIZE) as u64;
                        for (_, v) in &items {
                            n += per + Key::SIZE as u64;
                            n += match v {
                                Value::Inline(b) => b.len() as u64,
                                Value::Block(r) => {
                                    5 + match r.bp() {
                                        Some(bp) if opts.compressed => u64::from(bp.psize),
                                        _ => v.logical_len(),
                                    }
                                }
                            };
                        }
                        n
                    }
                };
            Ok(())
        })?;
    }
    Ok(SendSummary {
        snapshots,
        bytes: total,
        records: 0,
    })
}

/// Writes `steps[first..]`, the first from `next` on (a resumed stream when not
/// `Key::MIN`).
#[allow(clippy::too_many_arguments)]
fn write_steps(
    dsl: &Dsl,
    steps: &[Step],
    first: usize,
    next: Key,
    replicate: Option<Replicate>,
    compressed: bool,
    out: &mut dyn Write,
    progress: &mut dyn FnMut(u64),
) -> Result<SendSummary, TransferError> {
    let mut summary = SendSummary::default();
    let mut w = Writer::new(out);
    let parts = steps.len() as u64;
    for (part, step) in steps.iter().enumerate().skip(first) {
        let plan = Plan {
            part: part as u64,
            parts,
            replicate: replicate.clone(),
        };
        let from = if part == first { next } else { Key::MIN };
        let resumed = from != Key::MIN;
        send_one(
            dsl, &mut w, *step, compressed, from, resumed, &plan, progress,
        )?;
        summary.snapshots.push(dsl.name_of(step.sid));
    }
    summary.bytes = w.bytes;
    summary.records = w.total_records();
    Ok(summary)
}

/// Where a substream stands in its stream.
struct Plan {
    part: u64,
    parts: u64,
    replicate: Option<Replicate>,
}

/// Writes the rest of an interrupted stream, as its resume token describes.
pub fn send_resume(
    dsl: &Dsl,
    token: &str,
    out: &mut dyn Write,
    progress: &mut dyn FnMut(u64),
) -> Result<SendSummary, TransferError> {
    let t = ResumeToken::decode(token)?;
    let to = dsl.snapshot_by_guid(t.to_guid).ok_or_else(|| {
        TransferError::Refused(format!(
            "the token's snapshot '{}' (guid {:#018x}) is not on this pool",
            t.to_name, t.to_guid
        ))
    })?;
    let next = key_from_hex(&t.next).expect("checked by decode");
    // The stream the token was cut from, planned again: the token may ask for the rest of
    // that stream and nothing else.
    let (steps, replicate) = match &t.replicate {
        None => {
            let from = match t.from_guid {
                0 => None,
                g => Some(base_by_guid(dsl, to, g)?),
            };
            let opts = SendOptions {
                from,
                ..Default::default()
            };
            plan(dsl, &dsl.name_of(to), &opts)?
        }
        Some(r) => {
            let opts = SendOptions {
                from: r.from.clone(),
                intermediates: r.intermediates,
                compressed: t.compressed,
                replicate: true,
            };
            plan(dsl, &format!("{}@{}", r.root, r.snapshot), &opts)?
        }
    };
    let first = steps
        .iter()
        .position(|s| s.sid == to && s.from_guid == t.from_guid)
        .filter(|p| t.replicate.is_none() || *p as u64 == t.part)
        .ok_or_else(|| {
            TransferError::Refused(format!(
                "the token asks for '{}' from a base this pool's stream does not send it from",
                t.to_name
            ))
        })?;
    let steps = if t.replicate.is_some() {
        steps
    } else {
        steps[first..=first].to_vec()
    };
    let first = if t.replicate.is_some() { first } else { 0 };
    write_steps(
        dsl,
        &steps,
        first,
        next,
        replicate,
        t.compressed,
        out,
        progress,
    )
}

/// The full name of the base with guid `guid` of snapshot `to`: an earlier snapshot or
/// bookmark of its dataset, or its origin.
fn base_by_guid(dsl: &Dsl, to: u64, guid: u64) -> Result<String, TransferError> {
    let to_rec = dsl.record(to)?;
    let head = to_rec.parent;
    let head_rec = dsl.record(head)?;
    let snap = dsl
        .snapshots(head)
        .into_iter()
        .chain((head_rec.origin != 0).then_some(head_rec.origin))
        .find(|s| {
            dsl.record(*s)
                .is_ok_and(|r| r.guid == guid && r.txg < to_rec.txg)
        });
    if let Some(s) = snap {
        return Ok(dsl.name_of(s));
    }
    head_rec
        .bookmarks
        .iter()
        .find(|b| b.guid == guid && b.txg < to_rec.txg)
        .map(|b| format!("{}#{}", dsl.name_of(head), b.name))
        .ok_or_else(|| {
            TransferError::Refused(format!(
                "the token's base (guid {guid:#018x}) is no longer an earlier snapshot or bookmark of '{}'",
                dsl.name_of(head)
            ))
        })
}

/// One substream: `step`, from `next` on.
#[allow(clippy::too_many_arguments)]
fn send_one(
    dsl: &Dsl,
    w: &mut Writer<'_>,
    step: Step,
    compressed: bool,
    next: Key,
    resumed: bool,
    plan: &Plan,
    progress: &mut dyn FnMut(u64),
) -> Result<(), TransferError> {
    let Step {
        from_guid,
        from_txg,
        sid,
    } = step;
    let rec = dsl.record(sid)?;
    let head = dsl.record(rec.parent)?;
    let os = dsl.snapshot_objset(sid)?;
    w.begin(&Begin {
        magic: STREAM_MAGIC.into(),
        version: STREAM_VERSION,
        kind: head.kind.name().into(),
        from_guid,
        to_guid: rec.guid,
        to_name: dsl.name_of(sid),
        snapshot: rec.name.clone(),
        creation: rec.creation,
        props: head.props.clone(),
        compressed,
        resume_from: resumed.then(|| key_hex(&next)),
        part: plan.part,
        parts: plan.parts,
        replicate: plan.replicate.clone(),
    })?;
    let mut failed: Option<TransferError> = None;
    let mut last_report = 0u64;
    let walk = os.changes_since(from_txg, next, &mut |change| {
        let r = (|| -> Result<(), TransferError> {
            match change {
                Change::Clear { lo, hi } => w.clear(&lo, &hi)?,
                Change::Unchanged {
                    lo,
                    hi,
                    first,
                    last,
                } => w.unchanged(&lo, &hi, &first, &last)?,
                Change::Leaf {
                    lo,
                    hi,
                    keys,
                    items,
                } => {
                    w.leaf(&lo, &hi, &keys)?;
                    let values: Vec<Value> = items.iter().map(|(_, v)| v.clone()).collect();
                    let bytes = os.send_bytes_many(&values, compressed)?;
                    for ((k, v), (comp, bytes)) in items.iter().zip(bytes) {
                        match v {
                            Value::Inline(b) => w.set_inline(k, b)?,
                            Value::Block(_) => {
                                w.set_block(k, comp.to_u8(), v.logical_len() as u32, &bytes)?
                            }
                        }
                    }
                }
            }
            Ok(())
        })();
        if w.bytes - last_report >= 8 << 20 {
            last_report = w.bytes;
            progress(w.bytes);
        }
        r.map_err(|e| {
            let msg = e.to_string();
            failed = Some(e);
            TreeError::Store(msg)
        })
    });
    if let Some(e) = failed {
        return Err(e);
    }
    walk?;
    w.end(rec.guid)?;
    progress(w.bytes);
    Ok(())
}
