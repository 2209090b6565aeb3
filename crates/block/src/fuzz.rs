//! Entry points for the fuzz targets (`fuzz/`, see docs/FUZZING.md): each takes arbitrary
//! bytes, makes them pass the outer check the format puts in front of the decoder (a magic,
//! a seal), and decodes them. A decoder may refuse anything; it must never panic, loop or
//! allocate more than the input justifies.

use crate::alloc::{AllocClass, SpaceAllocator, SpaceRecord, SPACE_RECORD_SIZE};
use crate::blkptr::{BlockPtr, BLKPTR_SIZE};
use crate::gang::{decode_gang_for_fuzz, GANG_HEADER_SIZE};

/// A block pointer.
pub fn blkptr(data: &[u8]) {
    if let Ok(Some(bp)) = BlockPtr::decode(data) {
        let _ = bp.describe();
        let again = BlockPtr::decode(&bp.encode()).ok().flatten();
        assert_eq!(again, Some(bp), "a decoded pointer encodes to itself");
    }
}

/// A gang header, sealed to the pointer in the input's first 128 bytes (so the fuzzer
/// reaches the piece checks behind the seal).
pub fn gang_header(data: &[u8]) {
    if data.len() < BLKPTR_SIZE {
        return;
    }
    let Ok(Some(bp)) = BlockPtr::decode(&data[..BLKPTR_SIZE]) else {
        return;
    };
    let mut header = data[BLKPTR_SIZE..].to_vec();
    header.resize(header.len().max(GANG_HEADER_SIZE), 0);
    decode_gang_for_fuzz(&mut header, &bp);
}

/// Space map records, replayed into an allocator of two vdevs.
pub fn space_map(data: &[u8]) {
    let mut alloc = SpaceAllocator::new();
    alloc.add_vdev(0, 1 << 30, 4096, true);
    alloc.add_vdev(1, 64 << 20, 512, true);
    for raw in data.chunks(SPACE_RECORD_SIZE) {
        if let Ok(rec) = SpaceRecord::decode(raw) {
            let _ = alloc.replay(&rec);
        }
    }
    let _ = alloc.begin_txg(u64::MAX);
    let _ = alloc.alloc(&|_| 8192, &[], AllocClass::Metadata, 1);
    let _ = alloc.condensed();
}
