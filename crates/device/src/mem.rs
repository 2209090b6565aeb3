//! `MemDevice`: a device whose bytes live in RAM.
//!
//! # Theory of operation
//! The whole device is one `Vec<u8>` behind a `parking_lot::RwLock`: reads share the lock,
//! writes take it exclusively, so every access is atomic with respect to the others. There is
//! no cache to write back, so `flush` does nothing. Used by tests and to mount crash images
//! produced by the simulator ([`crate::SimDevice::crash_image`]).
//!
//! The emulated benchmarks' devices (`mapped`, `populated`) take their memory straight from
//! the kernel as an anonymous mapping instead of the heap: its pages are the kernel's zero
//! pages until written and go back to the kernel when the device is dropped. A heap
//! allocator that keeps freed memory for reuse (tank's does) zeroes a reused block byte by
//! byte for a zeroed allocation, so a second run of 24 devices of 1 GiB made all 24 GiB
//! resident at once.

use std::ptr::NonNull;

use parking_lot::RwLock;

use crate::{check_range, BlockDevice, Result};

/// A device backed by a `Vec<u8>`. See the module documentation.
#[derive(Debug)]
pub struct MemDevice {
    name: String,
    data: RwLock<Storage>,
}

/// A device's bytes: on the heap, or an anonymous mapping of its own.
#[derive(Debug)]
enum Storage {
    Heap(Vec<u8>),
    Mapped(Region),
}

impl std::ops::Deref for Storage {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Storage::Heap(v) => v,
            Storage::Mapped(r) => r.as_slice(),
        }
    }
}

impl std::ops::DerefMut for Storage {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            Storage::Heap(v) => v,
            Storage::Mapped(r) => r.as_mut_slice(),
        }
    }
}

/// Zeroed memory mapped for one owner (`mmap` of `MAP_PRIVATE | MAP_ANONYMOUS |
/// MAP_NORESERVE`), unmapped on drop.
#[derive(Debug)]
struct Region {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a Region owns its mapping alone; shared access is through `&self` (reads) and
// exclusive access through `&mut self`, as for a `Vec<u8>`.
#[allow(unsafe_code)]
unsafe impl Send for Region {}
#[allow(unsafe_code)]
unsafe impl Sync for Region {}

impl Region {
    /// # Panics
    /// If the kernel refuses the mapping.
    #[allow(unsafe_code)]
    fn new(len: usize) -> Region {
        if len == 0 {
            return Region {
                ptr: NonNull::dangling(),
                len,
            };
        }
        // SAFETY: a fresh anonymous mapping with no address hint; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert!(
            p != libc::MAP_FAILED,
            "cannot map {len} bytes for a memory device: {}",
            std::io::Error::last_os_error()
        );
        Region {
            ptr: NonNull::new(p.cast()).expect("mmap returned a null mapping"),
            len,
        }
    }

    #[allow(unsafe_code)]
    fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is a live mapping of `len` readable bytes (or dangling with len 0).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    #[allow(unsafe_code)]
    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as `as_slice`, writable, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Region {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: the mapping made in `new`, unmapped once; nothing borrows it now.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        }
    }
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
        let mut region = Region::new(size);
        let bytes = region.as_mut_slice();
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
        MemDevice {
            name: name.into(),
            data: RwLock::new(Storage::Mapped(region)),
        }
    }

    /// A zero-filled device of `size` bytes in a mapping of its own (module documentation):
    /// memory is taken only where it is written, and given back when the device is dropped.
    ///
    /// # Panics
    /// If `size` does not fit in the address space or cannot be mapped.
    pub fn mapped(name: impl Into<String>, size: u64) -> MemDevice {
        let size = usize::try_from(size).expect("MemDevice size must fit in memory");
        MemDevice {
            name: name.into(),
            data: RwLock::new(Storage::Mapped(Region::new(size))),
        }
    }

    /// A device holding `bytes` (its size is `bytes.len()`).
    pub fn from_bytes(name: impl Into<String>, bytes: Vec<u8>) -> MemDevice {
        MemDevice {
            name: name.into(),
            data: RwLock::new(Storage::Heap(bytes)),
        }
    }

    /// A copy of the current contents.
    pub fn snapshot(&self) -> Vec<u8> {
        self.data.read().to_vec()
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
    fn mapped_and_populated_devices_read_zeros_and_keep_writes() {
        for d in [
            MemDevice::populated("p", 3 * 4096 + 512),
            MemDevice::mapped("m", 3 * 4096 + 512),
        ] {
            assert_eq!(d.size(), 3 * 4096 + 512);
            let mut buf = vec![1u8; 3 * 4096 + 512];
            d.read_at(&mut buf, 0).unwrap();
            assert!(buf.iter().all(|&b| b == 0));
            d.write_at(&[7; 512], 3 * 4096).unwrap();
            let mut tail = [0u8; 512];
            d.read_at(&mut tail, 3 * 4096).unwrap();
            assert_eq!(tail, [7; 512]);
            assert_eq!(&d.snapshot()[3 * 4096..], &[7; 512]);
            assert!(matches!(
                d.read_at(&mut tail, 3 * 4096 + 1),
                Err(DeviceError::OutOfRange { .. })
            ));
        }
        let empty = MemDevice::mapped("e", 0);
        assert_eq!(empty.size(), 0);
        empty.read_at(&mut [], 0).unwrap();
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
