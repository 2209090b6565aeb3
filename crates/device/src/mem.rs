//! `MemDevice`: a device whose bytes live in RAM.
//!
//! # Theory of operation
//! The whole device is one `Vec<u8>` behind a `parking_lot::RwLock`: reads share the lock,
//! writes take it exclusively, so every access is atomic with respect to the others. There is
//! no cache to write back, so `flush` does nothing. Used by tests and to mount crash images
//! produced by the simulator ([`crate::SimDevice::crash_image`]).

use parking_lot::RwLock;

use crate::{check_range, BlockDevice, Result};

/// A device backed by a `Vec<u8>`. See the module documentation.
#[derive(Debug)]
pub struct MemDevice {
    name: String,
    data: RwLock<Vec<u8>>,
}

impl MemDevice {
    /// A zero-filled device of `size` bytes.
    ///
    /// # Panics
    /// If `size` does not fit in the address space.
    pub fn new(name: impl Into<String>, size: u64) -> MemDevice {
        let size = usize::try_from(size).expect("MemDevice size must fit in memory");
        MemDevice::from_bytes(name, vec![0; size])
    }

    /// A zero-filled device of `size` bytes whose memory the host has already handed over:
    /// every page is touched now, on as many threads as there are CPUs, so that the kernel
    /// zeroes fresh pages here rather than in the first write to each (on a virtual machine
    /// that costs about a second per GiB of CPU, which a device standing in for a disk's
    /// DMA must not take from the work it is measured under).
    ///
    /// # Panics
    /// If `size` does not fit in the address space.
    pub fn populated(name: impl Into<String>, size: u64) -> MemDevice {
        const PAGE: usize = 4096;
        let size = usize::try_from(size).expect("MemDevice size must fit in memory");
        let mut bytes = vec![0u8; size];
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let chunk = size.div_ceil(threads).next_multiple_of(PAGE).max(PAGE);
        std::thread::scope(|s| {
            for part in bytes.chunks_mut(chunk) {
                s.spawn(move || {
                    for i in (0..part.len()).step_by(PAGE) {
                        // A store the compiler cannot drop: the page is the kernel's until then.
                        part[i] = std::hint::black_box(0);
                    }
                });
            }
        });
        MemDevice::from_bytes(name, bytes)
    }

    /// A device holding `bytes` (its size is `bytes.len()`).
    pub fn from_bytes(name: impl Into<String>, bytes: Vec<u8>) -> MemDevice {
        MemDevice {
            name: name.into(),
            data: RwLock::new(bytes),
        }
    }

    /// A copy of the current contents.
    pub fn snapshot(&self) -> Vec<u8> {
        self.data.read().clone()
    }
}

impl BlockDevice for MemDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let data = self.data.read();
        check_range(&self.name, offset, buf.len(), data.len() as u64)?;
        // In range, so the offset fits in usize.
        let start = offset as usize;
        buf.copy_from_slice(&data[start..start + buf.len()]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        let mut data = self.data.write();
        check_range(&self.name, offset, buf.len(), data.len() as u64)?;
        let start = offset as usize;
        data[start..start + buf.len()].copy_from_slice(buf);
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        Ok(())
    }

    fn size(&self) -> u64 {
        self.data.read().len() as u64
    }

    fn name(&self) -> &str {
        &self.name
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DeviceError;

    #[test]
    fn a_populated_device_reads_zeros_and_keeps_writes() {
        let d = MemDevice::populated("p", 3 * 4096 + 512);
        assert_eq!(d.size(), 3 * 4096 + 512);
        let mut buf = vec![1u8; 3 * 4096 + 512];
        d.read_at(&mut buf, 0).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        d.write_at(&[7; 512], 3 * 4096).unwrap();
        let mut tail = [0u8; 512];
        d.read_at(&mut tail, 3 * 4096).unwrap();
        assert_eq!(tail, [7; 512]);
    }

    #[test]
    fn round_trip_and_snapshot() {
        let dev = MemDevice::new("m0", 4096);
        assert_eq!(dev.size(), 4096);
        assert_eq!(dev.name(), "m0");
        dev.write_at(b"hello", 100).unwrap();
        dev.flush().unwrap();
        let mut buf = [0u8; 7];
        dev.read_at(&mut buf, 99).unwrap();
        assert_eq!(&buf, b"\0hello\0");
        let snap = dev.snapshot();
        assert_eq!(snap.len(), 4096);
        assert_eq!(&snap[100..105], b"hello");

        let copy = MemDevice::from_bytes("m1", snap);
        copy.read_at(&mut buf, 99).unwrap();
        assert_eq!(&buf, b"\0hello\0");
    }

    #[test]
    fn bounds_are_checked() {
        let dev = MemDevice::new("m", 10);
        let mut buf = [0u8; 4];
        assert!(matches!(
            dev.read_at(&mut buf, 7),
            Err(DeviceError::OutOfRange { .. })
        ));
        assert!(matches!(
            dev.write_at(&buf, u64::MAX),
            Err(DeviceError::OutOfRange { .. })
        ));
        dev.write_at(&buf, 6).unwrap();
        dev.read_at(&mut [], 10).unwrap();
    }
}
