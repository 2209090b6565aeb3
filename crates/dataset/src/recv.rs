//! `tank receive`: a stream applied to a dataset, all or nothing per snapshot.
//!
//! # Theory of operation
//! Per substream: `RecvBegin` (`dsl/sendrecv.rs`) checks the target and marks it
//! inconsistent; the records are checked (`stream.rs`) and applied in key order, each in a
//! transaction of its own; `RecvEnd` takes the snapshot. The records must tile the key space
//! from where the receive starts to its end, each range starting where the last one ended,
//! and a `SET` must be one of its leaf's keys, in order: a stream out of order, or made
//! against another base (a key said unchanged that the target lacks: an `UNCHANGED`
//! subtree's first or last key, or a leaf key not set), is refused.
//!
//! Every range's first transaction also records the receive's progress in the head's tree
//! (`(0, KIND_RECV, 0)`): the key before which every range is complete. It commits with the
//! changes it accounts for, so after a crash the progress is never ahead of the data. On
//! any failure (a damaged or cut stream, a full pool, an I/O error) the receive is aborted
//! (`RecvAbort`: the target goes back to its state before the snapshot) or, with `-s`,
//! kept: the progress then makes the `receive_resume_token`, and `tank send -t` sends the
//! rest. Ranges are idempotent (a `LEAF` clears what is not listed, a `SET` replaces), so a
//! range begun twice ends the same.
//!
//! The dataset is held ("receiving") while records are applied, so it is neither mounted
//! nor served; an unfinished receive keeps it unmountable.

use std::io::Read;
use std::sync::Arc;

use tank_block::Compression;
use tank_object::tree::Key;
use tank_object::ObjectSet;

use crate::dsl::{DatasetKind, Dsl, Op, RecvBegin, RecvState};
use crate::send::ResumeToken;
use crate::stream::{key_from_hex, key_hex, Reader, Record, StreamError, TransferError};

/// What `tank receive` was asked for.
#[derive(Debug, Clone, Default)]
pub struct RecvOptions {
    /// `-F`: roll the target back to the stream's base first.
    pub force: bool,
    /// `-s`: keep an interrupted receive for `send -t`.
    pub resumable: bool,
    /// `-o PROP=VALUE`: set on the received dataset, over what the stream carries.
    pub props: Vec<(String, String)>,
}

/// What a receive did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecvSummary {
    /// Full names of the snapshots received, in order.
    pub snapshots: Vec<String>,
    /// Targets rolled back by `-F` (what they were rolled back to).
    pub rolled_back: Vec<String>,
    /// Snapshots of a replication stream the target had already (sent again after a cut).
    pub skipped: Vec<String>,
    pub bytes: u64,
    pub records: u64,
}

/// Where a receive has got to, as stored in the head's tree (JSON).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Progress {
    to_guid: u64,
    from_guid: u64,
    /// Every range before this key is complete (hex).
    next: String,
    bytes: u64,
}

/// The resume token of a head with an unfinished resumable receive.
pub fn resume_token(dsl: &Dsl, id: u64) -> Result<Option<String>, TransferError> {
    let rec = dsl.record(id)?;
    let Some(state) = rec.recv.filter(|s| s.resumable) else {
        return Ok(None);
    };
    let os = dsl.objset(id)?;
    let (next, bytes) = match os.recv_progress()? {
        Some(raw) => {
            let p: Progress = serde_json::from_slice(&raw)
                .map_err(|e| TransferError::Refused(format!("unreadable receive progress: {e}")))?;
            if p.to_guid == state.to_guid {
                (p.next, p.bytes)
            } else {
                (key_hex(&Key::MIN), 0)
            }
        }
        None => (key_hex(&Key::MIN), 0),
    };
    Ok(Some(
        ResumeToken {
            replicate: state.replicate,
            part: state.part,
            to_guid: state.to_guid,
            from_guid: state.from_guid,
            to_name: state.to_name,
            next,
            compressed: state.compressed,
            bytes,
        }
        .encode(),
    ))
}

/// Abandons an unfinished receive (`receive -A`): the dataset goes back to its state before it.
pub fn abort(dsl: &Dsl, name: &str) -> Result<(), TransferError> {
    let id = dsl.resolve(name)?;
    if dsl.record(id)?.recv.is_none() {
        return Err(TransferError::Refused(format!(
            "'{name}' has no unfinished receive"
        )));
    }
    dsl.run(Op::RecvAbort {
        name: name.to_string(),
    })?;
    Ok(())
}

/// Receives every substream of `input` into `target` (see the module documentation).
pub fn receive(
    dsl: &Arc<Dsl>,
    target: &str,
    input: &mut dyn Read,
    opts: &RecvOptions,
    progress: &mut dyn FnMut(u64),
) -> Result<RecvSummary, TransferError> {
    let mut reader = Reader::new(input);
    let mut summary = RecvSummary::default();
    let top = target;
    // Substreams the stream says it has (0: not said), and how many came.
    let mut parts = 0u64;
    let mut part = 0u64;
    loop {
        let begin = match reader.next_record()? {
            None if summary.snapshots.is_empty() => {
                return Err(TransferError::Refused("the stream is empty".into()))
            }
            None if part < parts => {
                return Err(TransferError::Stream(StreamError::Truncated {
                    record: reader.total_records,
                    offset: reader.offset,
                    what: format!(
                        "the input ended after {part} of the stream's {parts} snapshots (each one received is whole: send the rest as an increment from the last)"
                    ),
                }))
            }
            None => break,
            Some(Record::Begin(b)) => b,
            Some(_) => unreachable!("the reader starts every substream with BEGIN"),
        };
        if part == 0 {
            parts = begin.parts;
            if begin.resume_from.is_some() {
                // A resumed stream starts where the cut one stopped.
                part = begin.part;
            }
        }
        if begin.parts != parts || (parts > 0 && begin.part != part) {
            return Err(TransferError::Stream(StreamError::Damaged {
                record: reader.total_records,
                offset: reader.offset,
                what: format!(
                    "substream {} of {} where {part} of {parts} was expected",
                    begin.part, begin.parts
                ),
            }));
        }
        part += 1;
        // A replication stream keeps each dataset's place below the target.
        let target_name = match begin.replicate.as_ref().map(|r| &r.root) {
            None => top.to_string(),
            Some(root) => {
                let ds = begin.to_name.split('@').next().unwrap_or_default();
                match ds.strip_prefix(root.as_str()) {
                    Some(rel) if rel.is_empty() || rel.starts_with('/') => format!("{top}{rel}"),
                    _ => {
                        return Err(TransferError::Refused(format!(
                            "the stream's '{}' is not below its replicated dataset '{root}'",
                            begin.to_name
                        )))
                    }
                }
            }
        };
        let target = target_name.as_str();
        if begin.replicate.is_some() && has_snapshot(dsl, target, begin.to_guid) {
            // A replication stream sent again after a cut: what came before is there.
            skip_substream(&mut reader)?;
            summary.skipped.push(format!("{target}@{}", begin.snapshot));
            continue;
        }
        let kind = match begin.kind.as_str() {
            "filesystem" => DatasetKind::Filesystem,
            "volume" => DatasetKind::Volume,
            other => {
                return Err(TransferError::Refused(format!(
                    "the stream carries a '{other}', which this build cannot receive"
                )))
            }
        };
        if let Some(r) = will_roll_back(dsl, target, begin.from_guid, opts.force) {
            summary.rolled_back.push(r);
        }
        let mut props: Vec<(String, String)> = begin
            .props
            .iter()
            .filter(|(k, _)| !opts.props.iter().any(|(o, _)| o == *k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        props.extend(opts.props.iter().cloned());
        dsl.run(Op::RecvBegin(Box::new(RecvBegin {
            name: target.to_string(),
            kind,
            props,
            state: RecvState {
                from_guid: begin.from_guid,
                to_guid: begin.to_guid,
                to_name: begin.to_name.clone(),
                snapshot: begin.snapshot.clone(),
                creation: begin.creation,
                created: false,
                resumable: opts.resumable,
                compressed: begin.compressed,
                replicate: begin.replicate.clone(),
                part: begin.part,
            },
            force: opts.force,
        })))?;
        let id = dsl.resolve(target)?;
        dsl.hold(id, "receiving a stream")?;
        let applied = apply(dsl, id, &begin, &mut reader, progress);
        dsl.release(id);
        if let Err(e) = applied {
            if opts.resumable {
                // What was applied stays, with the progress that says so.
                dsl.store().sync()?;
            } else {
                dsl.run(Op::RecvAbort {
                    name: target.to_string(),
                })?;
            }
            return Err(e);
        }
        dsl.run(Op::RecvEnd {
            name: target.to_string(),
        })?;
        if begin.from_guid != 0 && !opts.props.is_empty() {
            // An increment changes no property of the target but those given with -o (as
            // zfs, whose increments carry none): what the target set for itself, such as its
            // mountpoint, stays.
            let rec = dsl.record(id)?;
            let changed: Vec<(String, Option<String>)> = opts
                .props
                .iter()
                .filter(|(k, v)| rec.props.get(k) != Some(v))
                .map(|(k, v)| (k.clone(), Some(v.clone())))
                .collect();
            if !changed.is_empty() {
                dsl.run(Op::SetProps {
                    name: target.to_string(),
                    props: changed,
                })?;
            }
        }
        summary
            .snapshots
            .push(format!("{target}@{}", begin.snapshot));
    }
    summary.bytes = reader.offset;
    summary.records = reader.total_records;
    Ok(summary)
}

/// Whether dataset `name` has the snapshot with this guid.
fn has_snapshot(dsl: &Dsl, name: &str, guid: u64) -> bool {
    dsl.resolve(name).is_ok_and(|id| {
        dsl.snapshots(id)
            .into_iter()
            .any(|s| dsl.record(s).is_ok_and(|r| r.guid == guid))
    })
}

/// Reads a substream through its `END`, checking it, applying nothing.
fn skip_substream(reader: &mut Reader<'_>) -> Result<(), TransferError> {
    loop {
        match reader.next_record()? {
            Some(Record::End { .. }) => return Ok(()),
            Some(_) => {}
            None => {
                return Err(TransferError::Stream(StreamError::Truncated {
                    record: reader.total_records,
                    offset: reader.offset,
                    what: "the input ended before the END record".into(),
                }))
            }
        }
    }
}

/// The snapshot `-F` will roll `target` back to, if it will.
fn will_roll_back(dsl: &Dsl, target: &str, from_guid: u64, force: bool) -> Option<String> {
    if !force || from_guid == 0 {
        return None;
    }
    let id = dsl.resolve(target).ok()?;
    let rec = dsl.record(id).ok()?;
    if rec.recv.is_some() {
        return None;
    }
    let snaps = dsl.snapshots(id);
    let base = snaps
        .iter()
        .copied()
        .find(|s| dsl.record(*s).is_ok_and(|r| r.guid == from_guid))?;
    (snaps.last() != Some(&base) || rec.written > 0).then(|| dsl.name_of(base))
}

/// The leaf whose items are being set.
struct OpenLeaf {
    keys: Vec<Key>,
    /// Keys set so far (a prefix of the leaf's items, in order).
    set: Vec<Key>,
}

/// Applies the records of one substream after its `BEGIN`.
fn apply(
    dsl: &Dsl,
    id: u64,
    begin: &crate::stream::Begin,
    reader: &mut Reader<'_>,
    progress: &mut dyn FnMut(u64),
) -> Result<(), TransferError> {
    let os = dsl.objset(id)?;
    let start = start_key(&os, begin)?;
    let damaged = |reader: &Reader<'_>, what: String| {
        TransferError::Stream(StreamError::Damaged {
            record: reader.total_records,
            offset: reader.offset,
            what,
        })
    };
    // The next range must start here; `None` once the key space is covered.
    let mut expect: Option<Key> = Some(start);
    let mut leaf: Option<OpenLeaf> = None;
    let mut last_report = 0u64;
    loop {
        let rec = reader.next_record()?.ok_or_else(|| {
            TransferError::Stream(StreamError::Truncated {
                record: reader.total_records,
                offset: reader.offset,
                what: "the input ended before the END record".into(),
            })
        })?;
        if reader.offset - last_report >= 8 << 20 {
            last_report = reader.offset;
            progress(reader.offset);
        }
        match rec {
            Record::Begin(_) => unreachable!("the reader refuses BEGIN inside a substream"),
            Record::Clear { lo, .. } | Record::Leaf { lo, .. } | Record::Unchanged { lo, .. }
                if expect != Some(lo) =>
            {
                return Err(damaged(
                    reader,
                    format!(
                        "range starting at {} where {} was expected",
                        key_hex(&lo),
                        expect.map_or("the end".into(), |k| key_hex(&k))
                    ),
                ));
            }
            Record::Clear { lo, hi } => {
                close_leaf(&os, leaf.take(), reader)?;
                let tx = dsl.store().begin(0)?;
                os.recv_clear(&tx, lo, hi, &[])?;
                save_progress(&os, &tx, begin, hi, reader.offset)?;
                expect = hi;
            }
            Record::Unchanged {
                lo,
                hi,
                first,
                last,
            } => {
                close_leaf(&os, leaf.take(), reader)?;
                for k in [first, last] {
                    if !os.has_item(&k)? {
                        return Err(another_base(k, reader));
                    }
                }
                let tx = dsl.store().begin(0)?;
                os.recv_clear(&tx, lo, Some(first), &[])?;
                if let Some(after) = last.successor() {
                    if hi.is_none_or(|h| after < h) {
                        os.recv_clear(&tx, after, hi, &[])?;
                    }
                }
                save_progress(&os, &tx, begin, hi, reader.offset)?;
                expect = hi;
            }
            Record::Leaf { lo, hi, keys } => {
                close_leaf(&os, leaf.take(), reader)?;
                let tx = dsl.store().begin(0)?;
                os.recv_clear(&tx, lo, hi, &keys)?;
                save_progress(&os, &tx, begin, Some(lo), reader.offset)?;
                leaf = Some(OpenLeaf { keys, set: vec![] });
                expect = hi;
            }
            Record::SetInline { key, data } => {
                check_set(&mut leaf, key, reader)?;
                let tx = dsl.store().begin(0)?;
                os.recv_set(&tx, key, data, false)?;
            }
            Record::SetBlock {
                key,
                compression,
                lsize,
                data,
            } => {
                check_set(&mut leaf, key, reader)?;
                let data = match Compression::from_u8(compression) {
                    Some(Compression::Off) => data,
                    Some(c) => c
                        .decompress_owned(data, lsize as usize)
                        .map_err(|e| damaged(reader, format!("block does not decompress: {e}")))?,
                    None => return Err(damaged(reader, format!("compression {compression}"))),
                };
                if data.len() != lsize as usize {
                    return Err(damaged(
                        reader,
                        format!("block of {} bytes where {lsize} was said", data.len()),
                    ));
                }
                dsl.check_space(id, data.len() as u64).map_err(|errno| {
                    TransferError::NoSpace(format!(
                        "cannot receive into '{}': {}",
                        dsl.name_of(id),
                        if errno == libc::EDQUOT {
                            "quota exceeded"
                        } else {
                            "out of space"
                        }
                    ))
                })?;
                let tx = dsl.store().begin(data.len() as u64)?;
                os.recv_set(&tx, key, data, true)?;
            }
            Record::End { to_guid, .. } => {
                if to_guid != begin.to_guid {
                    return Err(damaged(reader, "END of another snapshot".into()));
                }
                if let Some(k) = expect {
                    return Err(damaged(
                        reader,
                        format!("the stream ends before key {}", key_hex(&k)),
                    ));
                }
                close_leaf(&os, leaf.take(), reader)?;
                let tx = dsl.store().begin(0)?;
                os.set_recv_progress(&tx, None)?;
                progress(reader.offset);
                return Ok(());
            }
        }
    }
}

/// Where this substream starts: the beginning, or (a resumed stream) the receive's progress.
fn start_key(os: &ObjectSet, begin: &crate::stream::Begin) -> Result<Key, TransferError> {
    let Some(from) = &begin.resume_from else {
        return Ok(Key::MIN);
    };
    let from = key_from_hex(from)
        .ok_or_else(|| TransferError::Refused("the stream's resume point is malformed".into()))?;
    let at = match os.recv_progress()? {
        Some(raw) => serde_json::from_slice::<Progress>(&raw)
            .ok()
            .filter(|p| p.to_guid == begin.to_guid)
            .and_then(|p| key_from_hex(&p.next))
            .unwrap_or(Key::MIN),
        None => Key::MIN,
    };
    if from != at {
        return Err(TransferError::Refused(format!(
            "the stream resumes at {} but this receive has got to {}: use the dataset's current receive_resume_token",
            key_hex(&from),
            key_hex(&at)
        )));
    }
    Ok(from)
}

fn save_progress(
    os: &ObjectSet,
    tx: &tank_pool::Tx<'_>,
    begin: &crate::stream::Begin,
    next: Option<Key>,
    bytes: u64,
) -> Result<(), TransferError> {
    let p = Progress {
        to_guid: begin.to_guid,
        from_guid: begin.from_guid,
        next: key_hex(&next.unwrap_or(Key::MAX)),
        bytes,
    };
    os.set_recv_progress(
        tx,
        Some(&serde_json::to_vec(&p).expect("progress serializes")),
    )?;
    Ok(())
}

/// A `SET` must be one of the open leaf's keys, after the last one set.
fn check_set(
    leaf: &mut Option<OpenLeaf>,
    key: Key,
    reader: &Reader<'_>,
) -> Result<(), TransferError> {
    let ok = leaf.as_ref().is_some_and(|l| {
        l.keys.binary_search(&key).is_ok() && l.set.last().is_none_or(|last| *last < key)
    });
    if !ok {
        return Err(TransferError::Stream(StreamError::Damaged {
            record: reader.total_records,
            offset: reader.offset,
            what: format!("item {} is not the next of its leaf", key_hex(&key)),
        }));
    }
    leaf.as_mut().expect("checked").set.push(key);
    Ok(())
}

/// A leaf is done: every key it listed and did not set must be one the target holds.
fn close_leaf(
    os: &ObjectSet,
    leaf: Option<OpenLeaf>,
    reader: &Reader<'_>,
) -> Result<(), TransferError> {
    let Some(leaf) = leaf else { return Ok(()) };
    for k in &leaf.keys {
        if leaf.set.binary_search(k).is_err() && !os.has_item(k)? {
            return Err(another_base(*k, reader));
        }
    }
    Ok(())
}

fn another_base(k: Key, reader: &Reader<'_>) -> TransferError {
    TransferError::Refused(format!(
        "the stream says item {} is unchanged but the target does not hold it: the stream was made against another base (record {}, byte {})",
        key_hex(&k),
        reader.total_records,
        reader.offset
    ))
}
