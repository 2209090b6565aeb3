//! EXTENDED COPY (LID1) and RECEIVE COPY RESULTS: the unit's copy manager (SPC-4 6.4 and
//! 6.18), which VMware's "full copy" offload (VAAI XCOPY) and libiscsi use to copy blocks
//! inside the target instead of through the initiator.
//!
//! # Theory of operation
//! An EXTENDED COPY carries a parameter list: a 16-byte header (list identifier, whether
//! the copy manager keeps the list's results, the lengths of the two descriptor lists), a
//! list of copy targets and a list of segments. [`parse`] checks all of it before anything
//! is copied, in the order the standard's tests expect: lengths first (PARAMETER LIST
//! LENGTH ERROR, including a list longer than the unit takes), then counts (TOO MANY
//! TARGET or SEGMENT DESCRIPTORS), then each descriptor's type (UNSUPPORTED ... TYPE CODE)
//! and fields (INVALID FIELD IN PARAMETER LIST with its byte).
//!
//! Copy targets are named as SCSI names them: an identification descriptor (type E4h) that
//! carries one of a unit's INQUIRY page 83h designators (its NAA or its T10 vendor
//! identifier). The unit resolves them among the logical units the session may see, so an
//! initiator copies between its own LUNs and never reaches another's. Segments are
//! block-to-block (type 02h): a count of 512-byte blocks from a source LBA to a destination
//! LBA. The copy itself (in `scsi.rs`) reads and writes through the volumes in pieces of at
//! most 1 MiB, back to front when a copy inside one volume moves data to a higher
//! overlapping range, so the source is never overwritten before it is read.
//!
//! Failures while copying are COPY ABORTED with the number of the segment that failed in
//! the command-specific information, as the standard asks; a target that names no unit is
//! COPY TARGET DEVICE NOT REACHABLE and an index past the target list UNREACHABLE COPY
//! TARGET.
//!
//! RECEIVE COPY RESULTS answers OPERATING PARAMETERS (the limits below) and COPY STATUS of a
//! list identifier whose results the copy manager holds (per I_T nexus); copies run to the
//! end within their command, so a status is always "completed".
//!
//! Why by hand: no library parses third-party copy parameter lists; the unit's own SCSI
//! code (`scsi.rs`) is ours for the reason `lib.rs` gives.

use crate::scsi::{be16, be32, be64};
use crate::sense::{self, Asc, Sense};

/// Copy targets in one parameter list.
pub const MAX_TARGETS: u16 = 2;
/// Segments in one parameter list.
pub const MAX_SEGMENTS: u16 = 16;
/// Bytes of target and segment descriptors together.
pub const MAX_LIST_BYTES: u32 = 1024;
/// Bytes one segment may copy: the block count field's largest value in 512-byte blocks.
pub const MAX_SEGMENT_BYTES: u32 = 0xffff * 512;
/// The descriptor type codes the copy manager implements: block to block, identification.
pub const IMPLEMENTED: [u8; 2] = [0x02, 0xe4];
/// Results held per I_T nexus; the oldest go first.
pub const HELD_RESULTS: usize = 16;

pub const TOO_MANY_TARGETS: Asc = (0x26, 0x06);
pub const UNSUPPORTED_TARGET_TYPE: Asc = (0x26, 0x07);
pub const TOO_MANY_SEGMENTS: Asc = (0x26, 0x08);
pub const UNSUPPORTED_SEGMENT_TYPE: Asc = (0x26, 0x09);
pub const UNREACHABLE_TARGET: Asc = (0x08, 0x04);
pub const TARGET_NOT_REACHABLE: Asc = (0x0d, 0x02);
pub const NO_ADDITIONAL: Asc = (0x00, 0x00);

const HEADER: usize = 16;
const TARGET_LEN: usize = 32;
const SEGMENT_LEN: usize = 28;

/// One copy target: the designator that names a unit, and the block length it expects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The designation descriptor's type (low four bits of its second byte).
    pub kind: u8,
    pub designator: Vec<u8>,
    pub block_len: u32,
}

/// One block-to-block segment: indexes into the target list, and the range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub src: u16,
    pub dst: u16,
    pub blocks: u64,
    pub src_lba: u64,
    pub dst_lba: u64,
}

/// A checked parameter list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyList {
    pub list_id: u8,
    /// Whether the copy manager keeps the results for RECEIVE COPY RESULTS.
    pub held: bool,
    pub targets: Vec<Target>,
    pub segments: Vec<Segment>,
}

/// The results held for one list identifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub list_id: u8,
    pub good: bool,
    pub segments_done: u16,
    pub bytes: u64,
}

fn illegal(asc: Asc) -> Sense {
    Sense::new(sense::ILLEGAL_REQUEST, asc)
}

/// Checks an EXTENDED COPY parameter list; `None` for an empty one (nothing to copy).
pub fn parse(data: &[u8]) -> Result<Option<CopyList>, Sense> {
    if data.is_empty() {
        return Ok(None);
    }
    if data.len() < HEADER {
        return Err(illegal(sense::PARAM_LIST_LENGTH));
    }
    let usage = (data[1] >> 3) & 3;
    if usage == 1 {
        return Err(Sense::param_field(1));
    }
    let tdl = usize::from(be16(&data[2..4]));
    let sdl = be32(&data[8..12]) as usize;
    let inline = be32(&data[12..16]) as usize;
    if HEADER as u64 + tdl as u64 + sdl as u64 + inline as u64 > data.len() as u64 {
        return Err(illegal(sense::PARAM_LIST_LENGTH));
    }
    if tdl as u64 + sdl as u64 > u64::from(MAX_LIST_BYTES) {
        return Err(illegal(sense::PARAM_LIST_LENGTH));
    }
    if inline != 0 {
        // No inline or embedded data: the segment types that use it are not implemented.
        return Err(Sense::param_field(12));
    }
    let tlist = &data[HEADER..HEADER + tdl];
    let slist = &data[HEADER + tdl..HEADER + tdl + sdl];
    if tdl.div_ceil(TARGET_LEN) > usize::from(MAX_TARGETS) {
        return Err(illegal(TOO_MANY_TARGETS));
    }
    // Segment descriptors differ in length: walk their headers to count them.
    let mut bounds = Vec::new();
    let mut at = 0usize;
    while at < sdl {
        if sdl - at < 4 {
            return Err(Sense::param_field((HEADER + tdl + at) as u16));
        }
        let len = 4 + usize::from(be16(&slist[at + 2..at + 4]));
        if len > sdl - at {
            return Err(Sense::param_field((HEADER + tdl + at + 2) as u16));
        }
        bounds.push((at, len));
        at += len;
    }
    if bounds.len() > usize::from(MAX_SEGMENTS) {
        return Err(illegal(TOO_MANY_SEGMENTS));
    }
    let mut targets = Vec::new();
    for (i, d) in tlist.chunks(TARGET_LEN).enumerate() {
        let base = HEADER + i * TARGET_LEN;
        if d[0] != 0xe4 {
            return Err(illegal(UNSUPPORTED_TARGET_TYPE));
        }
        if d.len() < TARGET_LEN {
            return Err(illegal(sense::PARAM_LIST_LENGTH));
        }
        // LU ID TYPE and NUL are ignored (SPC-4); the unit must be a block device.
        if d[1] & 0x1f != 0 {
            return Err(Sense::param_field((base + 1) as u16));
        }
        let len = usize::from(d[7]);
        if len == 0 || len > 20 {
            return Err(Sense::param_field((base + 7) as u16));
        }
        let block_len = u32::from_be_bytes([0, d[29], d[30], d[31]]);
        if block_len != crate::scsi::BLOCK as u32 {
            return Err(Sense::param_field((base + 29) as u16));
        }
        targets.push(Target {
            kind: d[5] & 0x0f,
            designator: d[8..8 + len].to_vec(),
            block_len,
        });
    }
    let mut segments = Vec::new();
    for (at, len) in bounds {
        let d = &slist[at..at + len];
        let base = HEADER + tdl + at;
        if d[0] != 0x02 {
            return Err(illegal(UNSUPPORTED_SEGMENT_TYPE));
        }
        if len != SEGMENT_LEN {
            return Err(Sense::param_field((base + 2) as u16));
        }
        segments.push(Segment {
            src: be16(&d[4..6]),
            dst: be16(&d[6..8]),
            blocks: u64::from(be16(&d[10..12])),
            src_lba: be64(&d[12..20]),
            dst_lba: be64(&d[20..28]),
        });
    }
    Ok(Some(CopyList {
        list_id: data[0],
        held: usage != 3,
        targets,
        segments,
    }))
}

/// COPY ABORTED with `asc`, naming the segment that failed.
pub fn aborted(asc: Asc, segment: usize) -> Sense {
    Sense {
        info: Some(segment as u64),
        ..Sense::new(sense::COPY_ABORTED, asc)
    }
}

/// RECEIVE COPY RESULTS, OPERATING PARAMETERS.
pub fn operating_parameters() -> Vec<u8> {
    let mut d = vec![0u8; 44];
    d[4] = 0x01; // SNLID: list identifiers are unique per I_T nexus.
    d[8..10].copy_from_slice(&MAX_TARGETS.to_be_bytes());
    d[10..12].copy_from_slice(&MAX_SEGMENTS.to_be_bytes());
    d[12..16].copy_from_slice(&MAX_LIST_BYTES.to_be_bytes());
    d[16..20].copy_from_slice(&MAX_SEGMENT_BYTES.to_be_bytes());
    // No inline data, no held data, no stream devices.
    d[34..36].copy_from_slice(&1u16.to_be_bytes()); // total concurrent copies
    d[36] = 1; // maximum concurrent copies
    d[37] = 9; // data segment granularity: 2^9 bytes
    d[43] = IMPLEMENTED.len() as u8;
    d.extend_from_slice(&IMPLEMENTED);
    let len = (d.len() - 4) as u32;
    d[0..4].copy_from_slice(&len.to_be_bytes());
    d
}

/// RECEIVE COPY RESULTS, COPY STATUS of a held list.
pub fn copy_status(h: &Held) -> Vec<u8> {
    let mut d = vec![0u8; 12];
    d[0..4].copy_from_slice(&8u32.to_be_bytes());
    // Completed, with or without errors; never held data (HDD clear).
    d[4] = if h.good { 0x01 } else { 0x02 };
    d[5..7].copy_from_slice(&h.segments_done.to_be_bytes());
    d[7] = 0x01; // transfer count in kibibytes
    d[8..12].copy_from_slice(
        &u32::try_from(h.bytes / 1024)
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    d
}

/// INQUIRY page 8Fh (third-party copy): the commands and descriptors of the copy manager
/// and its limits.
pub fn third_party_copy_page() -> Vec<u8> {
    let mut d = Vec::new();
    // Supported commands: EXTENDED COPY (LID1), RECEIVE COPY RESULTS (COPY STATUS,
    // OPERATING PARAMETERS).
    let cmds: &[u8] = &[0x83, 1, 0x00, 0x84, 2, 0x00, 0x03];
    let mut body = vec![cmds.len() as u8];
    body.extend_from_slice(cmds);
    push_descriptor(&mut d, 0x0001, body);
    // Parameter data: the limits.
    let mut body = vec![0u8; 4];
    body.extend_from_slice(&MAX_TARGETS.to_be_bytes());
    body.extend_from_slice(&MAX_SEGMENTS.to_be_bytes());
    body.extend_from_slice(&MAX_LIST_BYTES.to_be_bytes());
    body.extend_from_slice(&0u32.to_be_bytes());
    body.extend_from_slice(&[0u8; 12]);
    push_descriptor(&mut d, 0x0008, body);
    // Supported descriptors.
    let mut body = vec![IMPLEMENTED.len() as u8];
    body.extend_from_slice(&IMPLEMENTED);
    push_descriptor(&mut d, 0x0009, body);
    d
}

/// A third-party copy descriptor: type, length, body padded to four bytes.
fn push_descriptor(d: &mut Vec<u8>, kind: u16, mut body: Vec<u8>) {
    while !body.len().is_multiple_of(4) {
        body.push(0);
    }
    d.extend_from_slice(&kind.to_be_bytes());
    d.extend_from_slice(&(body.len() as u16).to_be_bytes());
    d.extend_from_slice(&body);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(designator: &[u8]) -> Vec<u8> {
        let mut t = vec![0u8; TARGET_LEN];
        t[0] = 0xe4;
        t[4] = 0x01;
        t[5] = 0x03;
        t[7] = designator.len() as u8;
        t[8..8 + designator.len()].copy_from_slice(designator);
        t[29..32].copy_from_slice(&[0, 2, 0]);
        t
    }

    fn segment(src: u16, dst: u16, blocks: u16, from: u64, to: u64) -> Vec<u8> {
        let mut s = vec![0u8; SEGMENT_LEN];
        s[0] = 0x02;
        s[2..4].copy_from_slice(&0x18u16.to_be_bytes());
        s[4..6].copy_from_slice(&src.to_be_bytes());
        s[6..8].copy_from_slice(&dst.to_be_bytes());
        s[10..12].copy_from_slice(&blocks.to_be_bytes());
        s[12..20].copy_from_slice(&from.to_be_bytes());
        s[20..28].copy_from_slice(&to.to_be_bytes());
        s
    }

    fn list(usage: u8, targets: &[Vec<u8>], segments: &[Vec<u8>]) -> Vec<u8> {
        let t: Vec<u8> = targets.concat();
        let s: Vec<u8> = segments.concat();
        let mut d = vec![0u8; HEADER];
        d[0] = 7;
        d[1] = usage << 3;
        d[2..4].copy_from_slice(&(t.len() as u16).to_be_bytes());
        d[8..12].copy_from_slice(&(s.len() as u32).to_be_bytes());
        d.extend_from_slice(&t);
        d.extend_from_slice(&s);
        d
    }

    fn asc(r: Result<Option<CopyList>, Sense>) -> Asc {
        r.expect_err("refused").asc
    }

    #[test]
    fn a_list_parses_to_its_targets_and_segments() {
        let naa = [0x30, 1, 2, 3, 4, 5, 6, 7];
        let d = list(0, &[target(&naa)], &[segment(0, 0, 2048, 0, 4096)]);
        let l = parse(&d).unwrap().unwrap();
        assert_eq!(l.list_id, 7);
        assert!(l.held);
        assert_eq!(l.targets[0].designator, naa);
        assert_eq!(l.targets[0].kind, 3);
        assert_eq!(
            l.segments,
            vec![Segment {
                src: 0,
                dst: 0,
                blocks: 2048,
                src_lba: 0,
                dst_lba: 4096
            }]
        );
        assert!(!parse(&list(3, &[target(&naa)], &[])).unwrap().unwrap().held);
        assert_eq!(parse(&[]).unwrap(), None);
    }

    #[test]
    fn lengths_counts_types_and_fields_are_refused_in_order() {
        let t = target(&[0x30, 0, 0, 0, 0, 0, 0, 1]);
        let s = segment(0, 0, 8, 0, 8);
        let whole = list(0, std::slice::from_ref(&t), std::slice::from_ref(&s));
        // Cut anywhere inside the descriptors: a length error.
        for cut in [HEADER - 1, HEADER + 31, whole.len() - 1] {
            assert_eq!(asc(parse(&whole[..cut])), sense::PARAM_LIST_LENGTH, "{cut}");
        }
        let many_t = vec![t.clone(); usize::from(MAX_TARGETS) + 1];
        assert_eq!(
            asc(parse(&list(0, &many_t, std::slice::from_ref(&s)))),
            TOO_MANY_TARGETS
        );
        let many_s = vec![s.clone(); usize::from(MAX_SEGMENTS) + 1];
        assert_eq!(
            asc(parse(&list(0, std::slice::from_ref(&t), &many_s))),
            TOO_MANY_SEGMENTS
        );
        // Past the list limit: a length error, before the counts.
        let huge = vec![s.clone(); 40];
        assert_eq!(
            asc(parse(&list(0, &many_t, &huge))),
            sense::PARAM_LIST_LENGTH
        );
        let mut fc = t.clone();
        fc[0] = 0xe0;
        assert_eq!(
            asc(parse(&list(0, &[fc], std::slice::from_ref(&s)))),
            UNSUPPORTED_TARGET_TYPE
        );
        let mut stream = s.clone();
        stream[0] = 0x03;
        assert_eq!(
            asc(parse(&list(0, std::slice::from_ref(&t), &[stream]))),
            UNSUPPORTED_SEGMENT_TYPE
        );
        let mut tape = t.clone();
        tape[1] = 0x01;
        let e = parse(&list(0, &[tape], std::slice::from_ref(&s))).unwrap_err();
        assert_eq!(e.asc, sense::INVALID_FIELD_IN_PARAM);
        assert_eq!(e.field.unwrap().byte, 17);
        let mut four_k = t.clone();
        four_k[29..32].copy_from_slice(&[0, 0x10, 0]);
        let e = parse(&list(0, &[four_k], std::slice::from_ref(&s))).unwrap_err();
        assert_eq!(e.field.unwrap().byte, 16 + 29);
        assert_eq!(
            asc(parse(&list(
                1,
                std::slice::from_ref(&t),
                std::slice::from_ref(&s)
            ))),
            sense::INVALID_FIELD_IN_PARAM
        );
    }

    #[test]
    fn random_lists_never_panic() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let base = list(
            0,
            &[target(&[0x30, 0, 0, 0, 0, 0, 0, 1])],
            &[segment(0, 0, 8, 0, 8)],
        );
        for i in 0..20_000 {
            let mut d = base.clone();
            for _ in 0..(i % 6) + 1 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let at = (x as usize) % d.len();
                d[at] = (x >> 32) as u8;
            }
            d.truncate((x >> 40) as usize % (d.len() + 1));
            let _ = parse(&d);
        }
    }

    #[test]
    fn pages_carry_what_libiscsi_reads() {
        let op = operating_parameters();
        assert_eq!(be32(&op[0..4]) as usize, op.len() - 4);
        assert!(be32(&op[0..4]) >= 40);
        assert_eq!(be16(&op[8..10]), MAX_TARGETS);
        assert_eq!(op[43] as usize, IMPLEMENTED.len());
        let p = third_party_copy_page();
        // The first descriptor lists RECEIVE COPY RESULTS with COPY STATUS.
        assert_eq!(be16(&p[0..2]), 1);
        let cmds = &p[5..5 + usize::from(p[4])];
        assert_eq!(cmds, &[0x83, 1, 0, 0x84, 2, 0, 3]);
        let mut at = 0;
        while at < p.len() {
            at += 4 + usize::from(be16(&p[at + 2..at + 4]));
        }
        assert_eq!(at, p.len());
    }
}
