//! A batch's flush covers the leaves its writes went to, and only those: a small block on
//! RAID-Z is durable once its columns' leaves are flushed (the intent log's commit relies
//! on this), and the other children are left alone.

use std::sync::Arc;

use tank_device::{DeviceRef, SimFleet};
use tank_vdev::{IoBatch, Layout, Leaf, ParityCodec, RaidzGeometry, TopVdev};

const DEV: u64 = 64 << 20;

#[test]
fn a_small_block_on_raidz2_flushes_its_columns_leaves_only() {
    let fleet = SimFleet::new(7);
    let devs: Vec<_> = (0..6)
        .map(|i| fleet.device(&format!("d{i}"), DEV))
        .collect();
    let leaves: Vec<Arc<Leaf>> = devs
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let dev: DeviceRef = Arc::new(d.clone());
            Leaf::new(i as u64 + 1, format!("d{i}"), DEV - (8 << 20), Some(dev))
        })
        .collect();
    let g = RaidzGeometry::new(6, 2, 12).unwrap();
    let top = TopVdev::new(
        0,
        9,
        Layout::Raidz(g),
        leaves,
        12,
        Arc::new(ParityCodec::new()),
    );
    // One 4 KiB sector of data: one data column and two parity columns.
    let batch = IoBatch::new();
    top.write(0, &[0x5a; 4096], &batch).unwrap();
    assert!(batch.wait().is_empty());
    let before: Vec<u64> = devs.iter().map(|d| d.stats().flushes).collect();
    let flush = IoBatch::new();
    batch.flush_written(&flush);
    assert!(flush.wait().is_empty());
    let flushed: Vec<u64> = devs
        .iter()
        .zip(&before)
        .map(|(d, b)| d.stats().flushes - b)
        .collect();
    let written: Vec<bool> = devs.iter().map(|d| d.stats().writes > 0).collect();
    assert_eq!(written.iter().filter(|w| **w).count(), 3, "{written:?}");
    for (i, (f, w)) in flushed.iter().zip(&written).enumerate() {
        assert_eq!(
            *f,
            u64::from(*w),
            "leaf {i}: flushes {flushed:?}, written {written:?}"
        );
    }

    // A block across every child flushes every child, each once.
    let batch = IoBatch::new();
    top.write(1 << 20, &[0xa5; 16 * 4096], &batch).unwrap();
    top.write(2 << 20, &[0x33; 16 * 4096], &batch).unwrap();
    assert!(batch.wait().is_empty());
    let before: Vec<u64> = devs.iter().map(|d| d.stats().flushes).collect();
    let flush = IoBatch::new();
    batch.flush_written(&flush);
    assert!(flush.wait().is_empty());
    for (d, b) in devs.iter().zip(&before) {
        assert_eq!(d.stats().flushes - b, 1);
    }
}
