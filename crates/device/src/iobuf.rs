//! Aligned I/O buffers: the bytes a write hands to a device.
//!
//! # Theory of operation
//! A block on its way to the disks is copied once, from the caller's buffer into an
//! [`IoBuf`] whose first byte sits on a [`IO_ALIGN`] boundary, padded with zeros to the
//! vdev's sector. From there nothing copies it again: a RAID-Z map's data columns are
//! ranges of that one buffer ([`IoRef`]), a mirror's sides share it, the parity columns are
//! buffers of their own, and a leaf that joins adjacent writes hands the kernel the list
//! of ranges (`pwritev`) instead of gluing them together. Because the memory is aligned,
//! a device opened `O_DIRECT` writes it as it is, without the bounce buffer an unaligned
//! `Vec` would need.
//!
//! `std`'s `Vec<u8>` cannot ask for an alignment, and no maintained crate offers a shared,
//! sliceable aligned buffer of this shape, so this one is written out: one allocation from
//! the global allocator with `Layout::from_size_align(pages * IO_ALIGN, IO_ALIGN)`, every
//! byte of the buffer written before it is handed out, freed with the same layout.
//!
//! A freed buffer goes back to a recycler, by its size in pages, up to a bound of
//! [`recycle_limit`] bytes (ZFS keeps its ABD chunks in kmem caches the same way). A txg's
//! writes allocate and free the same sizes over and over from different threads: the sync
//! thread fills them, the leaf writers drop them. The allocator did not hand that memory
//! back to the sync thread but took new pages from the kernel instead, and the kernel's
//! first touch of a page costs several times a memset (a third of the write path's CPU).

use std::alloc::Layout;
use std::collections::HashMap;
use std::ops::{Deref, DerefMut, Range};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

/// Alignment of every [`IoBuf`]: the page size, which `O_DIRECT` accepts on every
/// filesystem and block device.
pub const IO_ALIGN: usize = 4096;

/// Largest buffer the recycler keeps (the largest block, 16 MiB).
const RECYCLE_MAX_BUF: usize = 16 << 20;

/// A fixed-length heap buffer whose first byte is `IO_ALIGN`-aligned. Every byte is
/// initialised.
pub struct IoBuf {
    ptr: NonNull<u8>,
    len: usize,
    /// Pages allocated (at least one).
    pages: usize,
}

/// An allocation held by the recycler.
struct Chunk(NonNull<u8>);

// SAFETY: a chunk is an allocation nobody else refers to; any thread may take it.
#[allow(unsafe_code)]
unsafe impl Send for Chunk {}

/// Freed allocations by size in pages, and their bytes in all.
struct Recycler {
    free: Mutex<HashMap<usize, Vec<Chunk>>>,
    bytes: AtomicUsize,
    limit: usize,
}

/// Bytes of freed buffers the recycler keeps: 1/64 of physical memory, between 32 and
/// 512 MiB (enough for the buffers of one txg's writes on a machine of 24 GiB).
pub fn recycle_limit() -> usize {
    recycler().limit
}

fn recycler() -> &'static Recycler {
    static R: OnceLock<Recycler> = OnceLock::new();
    R.get_or_init(|| {
        // SAFETY: sysconf only reads system configuration.
        #[allow(unsafe_code)]
        let (pages, size) = unsafe {
            (
                libc::sysconf(libc::_SC_PHYS_PAGES),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        let ram = (pages.max(0) as u64).saturating_mul(size.max(0) as u64);
        let limit = (ram / 64).clamp(32 << 20, 512 << 20) as usize;
        Recycler {
            free: Mutex::new(HashMap::new()),
            bytes: AtomicUsize::new(0),
            limit,
        }
    })
}

impl Recycler {
    fn take(&self, pages: usize) -> Option<NonNull<u8>> {
        let chunk = self.free.lock().get_mut(&pages)?.pop()?;
        self.bytes.fetch_sub(pages * IO_ALIGN, Ordering::Relaxed);
        Some(chunk.0)
    }

    /// Keeps `ptr` if there is room; gives it back otherwise.
    fn put(&self, ptr: NonNull<u8>, pages: usize) -> Option<NonNull<u8>> {
        let bytes = pages * IO_ALIGN;
        if bytes > RECYCLE_MAX_BUF
            || self.bytes.fetch_add(bytes, Ordering::Relaxed) + bytes > self.limit
        {
            if bytes <= RECYCLE_MAX_BUF {
                self.bytes.fetch_sub(bytes, Ordering::Relaxed);
            }
            return Some(ptr);
        }
        self.free.lock().entry(pages).or_default().push(Chunk(ptr));
        None
    }
}

// SAFETY: an IoBuf owns its allocation exclusively, like a Vec<u8>; shared access is
// through `&self` (reads only) and mutation through `&mut self`.
#[allow(unsafe_code)]
unsafe impl Send for IoBuf {}
// SAFETY: as for Send: `&IoBuf` gives read-only access to initialised bytes.
#[allow(unsafe_code)]
unsafe impl Sync for IoBuf {}

impl IoBuf {
    fn layout(pages: usize) -> Layout {
        Layout::from_size_align(pages * IO_ALIGN, IO_ALIGN).expect("buffer size within isize")
    }

    fn pages(len: usize) -> usize {
        len.div_ceil(IO_ALIGN).max(1)
    }

    /// An allocation of `pages`, recycled or new (zeroed when `zero`), and whether it is
    /// recycled (its bytes are initialised but not zero).
    #[allow(unsafe_code)]
    fn allocate(pages: usize, zero: bool) -> (NonNull<u8>, bool) {
        if let Some(ptr) = recycler().take(pages) {
            return (ptr, true);
        }
        let layout = Self::layout(pages);
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe {
            if zero {
                std::alloc::alloc_zeroed(layout)
            } else {
                std::alloc::alloc(layout)
            }
        };
        match NonNull::new(raw) {
            Some(ptr) => (ptr, false),
            None => std::alloc::handle_alloc_error(layout),
        }
    }

    /// An aligned buffer of `len` zero bytes.
    #[allow(unsafe_code)]
    pub fn zeroed(len: usize) -> IoBuf {
        let pages = Self::pages(len);
        let (ptr, recycled) = Self::allocate(pages, true);
        if recycled {
            // SAFETY: the allocation holds `pages * IO_ALIGN >= len` bytes.
            unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, len) };
        }
        IoBuf { ptr, len, pages }
    }

    /// An aligned buffer of `len` bytes whose contents are unspecified (zeros, or what a
    /// recycled buffer held): for a caller that overwrites every byte.
    pub fn scratch(len: usize) -> IoBuf {
        let pages = Self::pages(len);
        let (ptr, _) = Self::allocate(pages, true);
        IoBuf { ptr, len, pages }
    }

    /// An aligned buffer of `len` bytes: `src` followed by zeros.
    ///
    /// # Panics
    /// If `src` is longer than `len`.
    #[allow(unsafe_code)]
    pub fn copy_padded(src: &[u8], len: usize) -> IoBuf {
        assert!(src.len() <= len, "{} bytes do not fit in {len}", src.len());
        let pages = Self::pages(len);
        let (ptr, _) = Self::allocate(pages, false);
        // SAFETY: the allocation holds at least `len` bytes and does not overlap `src`
        // (it belongs to no one else); after these two writes all `len` bytes are
        // initialised.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), ptr.as_ptr(), src.len());
            std::ptr::write_bytes(ptr.as_ptr().add(src.len()), 0, len - src.len());
        }
        IoBuf { ptr, len, pages }
    }

    /// An aligned copy of `src`.
    pub fn copy_of(src: &[u8]) -> IoBuf {
        Self::copy_padded(src, src.len())
    }
}

impl Deref for IoBuf {
    type Target = [u8];
    #[allow(unsafe_code)]
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` initialised bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for IoBuf {
    #[allow(unsafe_code)]
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for deref, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for IoBuf {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        if let Some(ptr) = recycler().put(self.ptr, self.pages) {
            // SAFETY: allocated in `allocate` with exactly this layout, and no longer used.
            unsafe { std::alloc::dealloc(ptr.as_ptr(), Self::layout(self.pages)) }
        }
    }
}

impl std::fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IoBuf({} bytes)", self.len)
    }
}

/// What an [`IoRef`] shares: an aligned buffer of its own, or a caller's immutable bytes
/// (an object's dirty block, written as it is when it needs no padding and happens to be
/// aligned).
#[derive(Clone, Debug)]
enum Backing {
    Io(Arc<IoBuf>),
    Bytes(Arc<Vec<u8>>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Io(b) => b,
            Backing::Bytes(v) => v,
        }
    }
}

/// A shared range of an aligned buffer (or of bytes the caller shares): what a leaf
/// writes. Cloning shares the bytes.
#[derive(Clone, Debug)]
pub struct IoRef {
    buf: Backing,
    start: usize,
    end: usize,
}

impl IoRef {
    /// The whole of `buf`.
    pub fn whole(buf: IoBuf) -> IoRef {
        let end = buf.len();
        IoRef {
            buf: Backing::Io(Arc::new(buf)),
            start: 0,
            end,
        }
    }

    /// `range` of a shared buffer.
    ///
    /// # Panics
    /// If `range` is not inside the buffer.
    pub fn range(buf: &Arc<IoBuf>, range: Range<usize>) -> IoRef {
        IoRef {
            buf: Backing::Io(buf.clone()),
            start: 0,
            end: buf.len(),
        }
        .slice(range)
    }

    /// The whole of `bytes`, shared without a copy when they start on an [`IO_ALIGN`]
    /// boundary (the kernel takes them for O_DIRECT as they are); otherwise an aligned
    /// copy.
    pub fn share_or_copy(bytes: &Arc<Vec<u8>>) -> IoRef {
        if !bytes.as_ptr().addr().is_multiple_of(IO_ALIGN) {
            return Self::copy_of(bytes);
        }
        IoRef {
            buf: Backing::Bytes(bytes.clone()),
            start: 0,
            end: bytes.len(),
        }
    }

    /// `range` of this range.
    ///
    /// # Panics
    /// If `range` is not inside it.
    pub fn slice(&self, range: Range<usize>) -> IoRef {
        let len = self.end - self.start;
        assert!(
            range.start <= range.end && range.end <= len,
            "range {range:?} outside a buffer of {len} bytes"
        );
        IoRef {
            buf: self.buf.clone(),
            start: self.start + range.start,
            end: self.start + range.end,
        }
    }

    /// An aligned copy of `src` of its own.
    pub fn copy_of(src: &[u8]) -> IoRef {
        Self::whole(IoBuf::copy_of(src))
    }
}

impl Deref for IoRef {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf.bytes()[self.start..self.end]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_padded_and_shared() {
        for len in [0usize, 1, 511, 4096, 26 * 1024, 128 * 1024 + 7] {
            let z = IoBuf::zeroed(len);
            assert_eq!(z.len(), len);
            assert!(z.as_ptr().addr().is_multiple_of(IO_ALIGN));
            assert!(z.iter().all(|&b| b == 0));
            let src: Vec<u8> = (0..len).map(|i| (i % 251) as u8 + 1).collect();
            let c = IoBuf::copy_padded(&src, len + 1000);
            assert!(c.as_ptr().addr().is_multiple_of(IO_ALIGN));
            assert_eq!(&c[..len], &src[..]);
            assert!(c[len..].iter().all(|&b| b == 0));
        }
        let shared = Arc::new(IoBuf::copy_of(&[1, 2, 3, 4, 5]));
        let a = IoRef::range(&shared, 1..3);
        let b = a.clone();
        assert_eq!(&*a, &[2, 3]);
        assert_eq!(&*b, &[2, 3]);
        let mut m = IoBuf::zeroed(8);
        m[3] = 9;
        assert_eq!(IoRef::whole(m)[3], 9);
        let whole = IoRef::range(&shared, 0..5);
        assert_eq!(&*whole.slice(1..4).slice(1..3), &[3, 4]);
        // A caller's bytes: shared when aligned, copied otherwise; the same bytes either way.
        let bytes = Arc::new((0..10_000u32).map(|i| i as u8).collect::<Vec<u8>>());
        let r = IoRef::share_or_copy(&bytes);
        assert_eq!(&*r, &bytes[..]);
        assert!(r.as_ptr().addr().is_multiple_of(IO_ALIGN));
        assert_eq!(
            r.as_ptr() == bytes.as_ptr(),
            bytes.as_ptr().addr().is_multiple_of(IO_ALIGN)
        );
    }

    #[test]
    fn freed_buffers_are_reused_and_come_back_zeroed_or_filled() {
        // A size no other test uses, so that the recycler's class is this test's alone.
        let len = 77 * IO_ALIGN + 5;
        let first = IoBuf::copy_of(&vec![0xAB; len]);
        let at = first.as_ptr();
        drop(first);
        let z = IoBuf::zeroed(len);
        assert_eq!(z.as_ptr(), at, "the freed buffer is reused");
        assert!(
            z.iter().all(|&b| b == 0),
            "a recycled zeroed buffer is zero"
        );
        drop(z);
        let c = IoBuf::copy_padded(&[7; 10], len);
        assert_eq!(c.as_ptr(), at);
        assert_eq!(&c[..10], &[7; 10]);
        assert!(c[10..].iter().all(|&b| b == 0), "padding is zero");
        assert!(recycle_limit() >= 32 << 20);
    }

    #[test]
    #[should_panic(expected = "outside a buffer")]
    fn a_range_past_the_end_is_refused() {
        let shared = Arc::new(IoBuf::zeroed(4));
        let _ = IoRef::range(&shared, 2..5);
    }
}
