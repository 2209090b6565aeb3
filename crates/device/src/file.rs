//! `FileDevice`: a regular file or a block device accessed through pread/pwrite.
//!
//! # Theory of operation
//! The device is opened once and every access is positional (`read_at`/`write_at` from
//! `std::os::unix::fs::FileExt`), so concurrent callers never share a file cursor. The device
//! size is fixed at open: the metadata length for a regular file, the seek-to-end position for
//! a block device. A regular file that does not exist can be created sparse (`set_len`) when
//! the caller asks for it; an existing file is used as is and never truncated.
//!
//! With `direct`, the file is opened `O_DIRECT`, bypassing the page cache. The kernel then
//! requires sector-aligned offsets and lengths (we insist on multiples of 512) and aligned
//! memory: a caller buffer that is not 4096-aligned is bounced through an internally allocated
//! aligned buffer (a `Vec` with slack, used from its first aligned byte), in chunks of at most
//! `BOUNCE_MAX` bytes. Filesystems that refuse `O_DIRECT` (tmpfs) make `open` fail with
//! `EINVAL`; we then fall back to buffered I/O and report it through [`FileDevice::is_direct`].
//!
//! `flush` is `fdatasync`. `trim` punches a hole in regular files (`FALLOC_FL_PUNCH_HOLE |
//! FALLOC_FL_KEEP_SIZE`) and is a no-op elsewhere or where the filesystem cannot punch holes.
//!
//! A file that is shorter than the device size (truncated behind our back) yields short reads:
//! they are reported as `DeviceError::Io` of kind `UnexpectedEof`, never a panic.
//!
//! `exclusive_lock` takes a non-blocking exclusive `flock`-style lock for the lifetime of the
//! device, so that two tank processes (or two opens in one process) cannot share a device.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{self, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::{check_range, BlockDevice, DeviceError, Result};

/// Memory alignment required of buffers handed to the kernel for `O_DIRECT` I/O.
const DIRECT_ALIGN: usize = 4096;
/// Offsets and lengths of `O_DIRECT` I/O must be multiples of this.
const SECTOR: u64 = 512;
/// Largest bounce buffer used for one `O_DIRECT` transfer of an unaligned caller buffer.
const BOUNCE_MAX: usize = 1 << 20;

/// How to open a [`FileDevice`]. `Default` is buffered, read-write, no creation, no lock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileDeviceOptions {
    /// Open with `O_DIRECT` (falls back to buffered I/O where the filesystem refuses it).
    pub direct: bool,
    /// Create the file sparse with this size when it does not exist.
    pub create_size: Option<u64>,
    /// Open read-only: writes and trims fail with `DeviceError::Invalid`.
    pub read_only: bool,
    /// Take a non-blocking exclusive lock; fail if another open holds it.
    pub exclusive_lock: bool,
}

/// A regular file or block device. See the module documentation.
#[derive(Debug)]
pub struct FileDevice {
    file: File,
    path: PathBuf,
    name: String,
    size: u64,
    direct: bool,
    read_only: bool,
    regular: bool,
}

/// Creates a new sparse file of `size` bytes. Fails (with `DeviceError::Open`, kind
/// `AlreadyExists`) if the path already exists: existing data is never truncated.
pub fn create_sparse_file(path: &Path, size: u64) -> Result<()> {
    let open_err = |source| DeviceError::Open {
        dev: path.display().to_string(),
        source,
    };
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(open_err)?;
    file.set_len(size).map_err(open_err)
}

impl FileDevice {
    /// Opens (and, with `create_size`, creates if absent) the file or block device at `path`.
    pub fn open(path: &Path, opts: &FileDeviceOptions) -> Result<FileDevice> {
        let name = path.display().to_string();
        let open_err = |source| DeviceError::Open {
            dev: name.clone(),
            source,
        };

        if let Some(size) = opts.create_size {
            match std::fs::symlink_metadata(path) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    match create_sparse_file(path, size) {
                        Ok(()) => {}
                        // Lost a race with another creator: use the file as is.
                        Err(DeviceError::Open { source, .. })
                            if source.kind() == io::ErrorKind::AlreadyExists => {}
                        Err(e) => return Err(e),
                    }
                }
                Err(e) => return Err(open_err(e)),
            }
        }

        let (file, direct) = open_file(path, opts).map_err(open_err)?;

        if opts.exclusive_lock {
            match file.try_lock() {
                Ok(()) => {}
                Err(TryLockError::WouldBlock) => {
                    return Err(DeviceError::Invalid {
                        dev: name,
                        what: "in use by another process (locked)".to_string(),
                    })
                }
                Err(TryLockError::Error(e)) => return Err(open_err(e)),
            }
        }

        let meta = file.metadata().map_err(open_err)?;
        let file_type = meta.file_type();
        let (size, regular) = if file_type.is_file() {
            (meta.len(), true)
        } else if file_type.is_block_device() {
            ((&file).seek(SeekFrom::End(0)).map_err(open_err)?, false)
        } else {
            return Err(DeviceError::Invalid {
                dev: name,
                what: "not a regular file or block device".to_string(),
            });
        };

        Ok(FileDevice {
            file,
            path: path.to_path_buf(),
            name,
            size,
            direct,
            read_only: opts.read_only,
            regular,
        })
    }

    /// The path the device was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether I/O really is `O_DIRECT` (false after a fallback to buffered I/O).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Whether the device was opened read-only.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    fn io_err(&self, offset: u64, source: io::Error) -> DeviceError {
        DeviceError::Io {
            dev: self.name.clone(),
            offset,
            source,
        }
    }

    fn invalid(&self, what: &str) -> DeviceError {
        DeviceError::Invalid {
            dev: self.name.clone(),
            what: what.to_string(),
        }
    }

    /// `O_DIRECT` needs sector-aligned offsets and lengths.
    fn check_direct(&self, offset: u64, len: usize) -> Result<()> {
        if !offset.is_multiple_of(SECTOR) || !(len as u64).is_multiple_of(SECTOR) {
            return Err(self.invalid(&format!(
                "O_DIRECT access of {len} bytes at offset {offset} is not a multiple of {SECTOR}"
            )));
        }
        Ok(())
    }

    fn check_writable(&self) -> Result<()> {
        if self.read_only {
            return Err(self.invalid("device is opened read-only"));
        }
        Ok(())
    }
}

/// Opens the file, retrying without `O_DIRECT` when the filesystem refuses it with `EINVAL`.
/// Returns the file and whether it really is in direct mode.
fn open_file(path: &Path, opts: &FileDeviceOptions) -> io::Result<(File, bool)> {
    let mut oo = OpenOptions::new();
    oo.read(true).write(!opts.read_only);
    if opts.direct {
        let mut direct = oo.clone();
        direct.custom_flags(libc::O_DIRECT);
        match direct.open(path) {
            Ok(file) => return Ok((file, true)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) => return Err(e),
        }
    }
    Ok((oo.open(path)?, false))
}

fn is_aligned(buf: &[u8]) -> bool {
    buf.as_ptr().addr().is_multiple_of(DIRECT_ALIGN)
}

/// A heap buffer whose usable part starts at a `DIRECT_ALIGN` boundary.
struct AlignedBuf {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> AlignedBuf {
        let storage = vec![0u8; len + DIRECT_ALIGN];
        let misalign = storage.as_ptr().addr() % DIRECT_ALIGN;
        let start = (DIRECT_ALIGN - misalign) % DIRECT_ALIGN;
        AlignedBuf {
            storage,
            start,
            len,
        }
    }

    fn as_mut_slice(&mut self, len: usize) -> &mut [u8] {
        debug_assert!(len <= self.len);
        &mut self.storage[self.start..self.start + len]
    }
}

/// Fills `buf` from `offset`, reporting end-of-file inside the buffer as `UnexpectedEof`.
/// In direct mode a short read that is not sector-aligned can only be end-of-file.
fn read_full(file: &File, buf: &mut [u8], offset: u64, direct: bool) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => return Err(short_read(offset + done as u64)),
            Ok(n) => {
                done += n;
                if direct && done < buf.len() && !(done as u64).is_multiple_of(SECTOR) {
                    return Err(short_read(offset + done as u64));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn short_read(at: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!("short read: the file ends at {at}, inside the device"),
    )
}

/// Deallocates `[offset, offset + len)` of a regular file, keeping its size.
#[allow(unsafe_code)]
fn punch_hole(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let to_off = |v: u64| {
        libc::off_t::try_from(v)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))
    };
    let (off, len) = (to_off(offset)?, to_off(len)?);
    loop {
        // SAFETY: fallocate takes only integer arguments and a file descriptor that stays
        // open for the duration of the call because `file` is borrowed; it touches no memory
        // of this process.
        let rc = unsafe {
            libc::fallocate(
                file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off,
                len,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Most buffers one `pwritev` takes (Linux's `IOV_MAX`).
const IOV_MAX: usize = 1024;

/// Writes `bufs` back to back from `offset` with `pwritev`; returns how many bytes went
/// down before a short write (all of them when it returns `Ok(total)`).
#[allow(unsafe_code)]
fn pwritev_once(file: &File, bufs: &[&[u8]], offset: u64) -> io::Result<usize> {
    let iov: Vec<libc::iovec> = bufs
        .iter()
        .map(|b| libc::iovec {
            iov_base: b.as_ptr() as *mut libc::c_void,
            iov_len: b.len(),
        })
        .collect();
    let off = libc::off_t::try_from(offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?;
    let count = libc::c_int::try_from(iov.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "too many buffers"))?;
    loop {
        // SAFETY: every iovec points into a slice borrowed for the duration of the call and
        // the kernel only reads from them; the descriptor stays open (`file` is borrowed).
        let rc = unsafe { libc::pwritev(file.as_raw_fd(), iov.as_ptr(), count, off) };
        if rc >= 0 {
            return Ok(rc as usize);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

impl BlockDevice for FileDevice {
    #[allow(unsafe_code)]
    fn forget_cached(&self, offset: u64, len: u64) {
        if self.direct {
            return; // Nothing of it is in the page cache.
        }
        // Advisory, as the trait says: on failure the read goes through the cache.
        if let (Ok(off), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) {
            // SAFETY: posix_fadvise takes only integers and a descriptor that stays open for
            // the call (`self.file` is borrowed); it touches no memory of this process.
            unsafe {
                libc::posix_fadvise(self.file.as_raw_fd(), off, len, libc::POSIX_FADV_DONTNEED);
            }
        }
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        check_range(&self.name, offset, buf.len(), self.size)?;
        if buf.is_empty() {
            return Ok(());
        }
        if !self.direct {
            return read_full(&self.file, buf, offset, false).map_err(|e| self.io_err(offset, e));
        }
        self.check_direct(offset, buf.len())?;
        if is_aligned(buf) {
            return read_full(&self.file, buf, offset, true).map_err(|e| self.io_err(offset, e));
        }
        let mut bounce = AlignedBuf::new(buf.len().min(BOUNCE_MAX));
        let mut at = offset;
        for chunk in buf.chunks_mut(BOUNCE_MAX) {
            let tmp = bounce.as_mut_slice(chunk.len());
            read_full(&self.file, tmp, at, true).map_err(|e| self.io_err(at, e))?;
            chunk.copy_from_slice(tmp);
            at += chunk.len() as u64;
        }
        Ok(())
    }

    /// `pread` straight into the new buffer's spare capacity: no zero fill first. Where
    /// O_DIRECT meets memory that is not aligned, the bounced `read_at` instead.
    #[allow(unsafe_code)]
    fn read_vec(&self, len: usize, offset: u64) -> Result<Vec<u8>> {
        check_range(&self.name, offset, len, self.size)?;
        if len == 0 {
            return Ok(Vec::new());
        }
        if self.direct {
            self.check_direct(offset, len)?;
        }
        let mut buf: Vec<u8> = Vec::with_capacity(len);
        if self.direct && !buf.as_ptr().addr().is_multiple_of(DIRECT_ALIGN) {
            buf.resize(len, 0);
            self.read_at(&mut buf, offset)?;
            return Ok(buf);
        }
        let mut done = 0usize;
        while done < len {
            let at = offset + done as u64;
            let off = libc::off_t::try_from(at).map_err(|_| {
                self.io_err(
                    at,
                    io::Error::new(io::ErrorKind::InvalidInput, "offset too large"),
                )
            })?;
            // SAFETY: the kernel writes at most `len - done` bytes from `done` on, inside
            // the buffer's capacity of `len`; the descriptor stays open (`self.file` is
            // borrowed). Nothing reads those bytes before `set_len` below.
            let rc = unsafe {
                libc::pread(
                    self.file.as_raw_fd(),
                    buf.as_mut_ptr().add(done).cast::<libc::c_void>(),
                    len - done,
                    off,
                )
            };
            if rc < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(self.io_err(at, e));
            }
            let n = rc as usize;
            if n == 0 {
                return Err(self.io_err(at, short_read(at)));
            }
            done += n;
            if self.direct && done < len && !(done as u64).is_multiple_of(SECTOR) {
                return Err(self.io_err(offset + done as u64, short_read(offset + done as u64)));
            }
        }
        // SAFETY: the loop above ended with all `len` bytes written by the kernel.
        unsafe { buf.set_len(len) };
        Ok(buf)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.check_writable()?;
        check_range(&self.name, offset, buf.len(), self.size)?;
        if buf.is_empty() {
            return Ok(());
        }
        if self.direct {
            self.check_direct(offset, buf.len())?;
        }
        if !self.direct || is_aligned(buf) {
            return self
                .file
                .write_all_at(buf, offset)
                .map_err(|e| self.io_err(offset, e));
        }
        let mut bounce = AlignedBuf::new(buf.len().min(BOUNCE_MAX));
        let mut at = offset;
        for chunk in buf.chunks(BOUNCE_MAX) {
            let tmp = bounce.as_mut_slice(chunk.len());
            tmp.copy_from_slice(chunk);
            self.file
                .write_all_at(tmp, at)
                .map_err(|e| self.io_err(at, e))?;
            at += chunk.len() as u64;
        }
        Ok(())
    }

    /// One `pwritev` per `IOV_MAX` buffers. In direct mode every buffer must be aligned in
    /// memory and a whole number of sectors long, as the kernel requires of each; otherwise
    /// (and after a short write) the rest goes through `write_at`, which bounces.
    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> Result<()> {
        self.check_writable()?;
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        check_range(&self.name, offset, total, self.size)?;
        if self.direct {
            self.check_direct(offset, total)?;
        }
        let fits = |b: &&[u8]| is_aligned(b) && (b.len() as u64).is_multiple_of(SECTOR);
        if self.direct && !bufs.iter().all(fits) {
            return self.write_at(&bufs.concat(), offset);
        }
        let mut at = offset;
        for group in bufs.chunks(IOV_MAX) {
            let len: usize = group.iter().map(|b| b.len()).sum();
            let done = pwritev_once(&self.file, group, at).map_err(|e| self.io_err(at, e))?;
            if done < len {
                // A short write (rare: a full filesystem, a signal): the rest, joined.
                let rest = group.concat();
                self.write_at(&rest[done..], at + done as u64)?;
            }
            at += len as u64;
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        self.file.sync_data().map_err(|e| self.io_err(0, e))
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn trim(&self, offset: u64, len: u64) -> Result<()> {
        self.check_writable()?;
        let ulen = usize::try_from(len).map_err(|_| DeviceError::OutOfRange {
            dev: self.name.clone(),
            offset,
            len,
            size: self.size,
        })?;
        check_range(&self.name, offset, ulen, self.size)?;
        if len == 0 || !self.regular {
            return Ok(());
        }
        match punch_hole(&self.file, offset, len) {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(()),
            Err(e) => Err(self.io_err(offset, e)),
        }
    }

    fn name(&self) -> &str {
        &self.name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts_create(size: u64) -> FileDeviceOptions {
        FileDeviceOptions {
            create_size: Some(size),
            ..FileDeviceOptions::default()
        }
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn create_sparse_and_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev0");
        let dev = FileDevice::open(&path, &opts_create(1 << 20)).unwrap();
        assert_eq!(dev.size(), 1 << 20);
        assert_eq!(dev.path(), path.as_path());
        assert_eq!(dev.name(), path.display().to_string());
        let data = pattern(5000, 7);
        dev.write_at(&data, 12345).unwrap();
        dev.flush().unwrap();
        drop(dev);

        // Reopening with a different create_size uses the file as is.
        let dev = FileDevice::open(&path, &opts_create(4096)).unwrap();
        assert_eq!(dev.size(), 1 << 20);
        let mut back = vec![0u8; 5000];
        dev.read_at(&mut back, 12345).unwrap();
        assert_eq!(back, data);
        let mut zeros = vec![1u8; 100];
        dev.read_at(&mut zeros, (1 << 20) - 100).unwrap();
        assert!(zeros.iter().all(|&b| b == 0));
    }

    #[test]
    fn missing_file_without_create_fails() {
        let dir = tempfile::tempdir().unwrap();
        let err =
            FileDevice::open(&dir.path().join("nope"), &FileDeviceOptions::default()).unwrap_err();
        assert!(matches!(err, DeviceError::Open { .. }), "{err}");
    }

    #[test]
    fn create_sparse_file_refuses_existing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        create_sparse_file(&path, 8192).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 8192);
        assert!(create_sparse_file(&path, 100).is_err());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 8192);
    }

    #[test]
    fn out_of_range_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let dev = FileDevice::open(&dir.path().join("d"), &opts_create(8192)).unwrap();
        let mut buf = [0u8; 16];
        assert!(matches!(
            dev.read_at(&mut buf, 8190),
            Err(DeviceError::OutOfRange { .. })
        ));
        assert!(matches!(
            dev.write_at(&buf, u64::MAX - 4),
            Err(DeviceError::OutOfRange { .. })
        ));
        assert!(matches!(
            dev.trim(8000, 1000),
            Err(DeviceError::OutOfRange { .. })
        ));
        dev.read_at(&mut buf, 8192 - 16).unwrap();
        dev.read_at(&mut [], 8192).unwrap();
    }

    #[test]
    fn truncated_file_gives_eof_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d");
        for direct in [false, true] {
            let _ = std::fs::remove_file(&path);
            let opts = FileDeviceOptions {
                direct,
                ..opts_create(65536)
            };
            let dev = FileDevice::open(&path, &opts).unwrap();
            OpenOptions::new()
                .write(true)
                .open(&path)
                .unwrap()
                .set_len(1000)
                .unwrap();
            let mut buf = vec![0u8; 4096];
            for offset in [0, 8192] {
                match dev.read_at(&mut buf, offset) {
                    Err(DeviceError::Io { source, .. }) => {
                        assert_eq!(source.kind(), io::ErrorKind::UnexpectedEof)
                    }
                    other => panic!("direct={direct} offset={offset}: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn exclusive_lock_refuses_second_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d");
        let opts = FileDeviceOptions {
            exclusive_lock: true,
            ..opts_create(4096)
        };
        let first = FileDevice::open(&path, &opts).unwrap();
        match FileDevice::open(&path, &opts) {
            Err(DeviceError::Invalid { what, .. }) => assert!(what.contains("locked"), "{what}"),
            other => panic!("second open: {other:?}"),
        }
        drop(first);
        FileDevice::open(&path, &opts).unwrap();
    }

    /// After `forget_cached` a read returns what another handle wrote and flushed, buffered
    /// or direct. (On one host the page cache is shared, so this checks that dropping it
    /// loses nothing; the stale cache of a second host cannot be made here.)
    #[test]
    fn forget_cached_then_read_sees_the_device() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d");
        for direct in [false, true] {
            let _ = std::fs::remove_file(&path);
            let opts = FileDeviceOptions {
                direct,
                ..opts_create(1 << 20)
            };
            let dev = FileDevice::open(&path, &opts).unwrap();
            let mut buf = vec![0u8; 4096];
            dev.read_at(&mut buf, 8192).unwrap();
            let other = FileDevice::open(&path, &FileDeviceOptions::default()).unwrap();
            other.write_at(&[0xabu8; 4096], 8192).unwrap();
            other.flush().unwrap();
            dev.forget_cached(8192, 4096);
            dev.read_at(&mut buf, 8192).unwrap();
            assert!(buf.iter().all(|&b| b == 0xab), "direct {direct}");
        }
    }

    #[test]
    fn read_only_refuses_writes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d");
        create_sparse_file(&path, 4096).unwrap();
        let opts = FileDeviceOptions {
            read_only: true,
            ..FileDeviceOptions::default()
        };
        let dev = FileDevice::open(&path, &opts).unwrap();
        assert!(dev.is_read_only());
        assert!(matches!(
            dev.write_at(&[1], 0),
            Err(DeviceError::Invalid { .. })
        ));
        let mut b = [9u8; 4];
        dev.read_at(&mut b, 0).unwrap();
        assert_eq!(b, [0; 4]);
    }

    /// A new device file "d" of `size` bytes in a new directory, opened direct or buffered.
    fn device_in_tempdir(direct: bool, size: u64) -> (tempfile::TempDir, FileDevice) {
        let dir = tempfile::tempdir().unwrap();
        let opts = FileDeviceOptions {
            direct,
            ..opts_create(size)
        };
        let dev = FileDevice::open(&dir.path().join("d"), &opts).unwrap();
        (dir, dev)
    }

    #[test]
    fn reads_into_new_buffers_match_and_refuse_what_read_at_refuses() {
        for direct in [true, false] {
            let (dir, dev) = device_in_tempdir(direct, 4 << 20);
            let data = pattern(3 * 4096 + 512, 5);
            dev.write_at(&data, 8192).unwrap();
            assert_eq!(dev.read_vec(data.len(), 8192).unwrap(), data);
            assert!(dev.read_vec(0, 0).unwrap().is_empty());
            assert!(matches!(
                dev.read_vec(8192, (4 << 20) - 4096),
                Err(DeviceError::OutOfRange { .. })
            ));
            if dev.is_direct() {
                assert!(matches!(
                    dev.read_vec(512, 100),
                    Err(DeviceError::Invalid { .. })
                ));
            }
            // The file cut short behind the device's back: a clear error, not a panic.
            std::fs::OpenOptions::new()
                .write(true)
                .open(dir.path().join("d"))
                .unwrap()
                .set_len(1 << 20)
                .unwrap();
            let e = dev.read_vec(8192, (1 << 20) - 4096).unwrap_err();
            assert!(e.to_string().contains("short read"), "{e}");
        }
    }

    #[test]
    fn vectored_writes_land_back_to_back() {
        for direct in [true, false] {
            let (_dir, dev) = device_in_tempdir(direct, 8 << 20);
            // Aligned pieces (one pwritev), then a list with a piece not aligned in memory
            // and one of 512 bytes (joined, bounced where direct).
            let a = crate::IoBuf::copy_of(&pattern(8192, 1));
            let b = crate::IoBuf::copy_of(&pattern(4096 * 3, 2));
            dev.write_vectored_at(&[&a, &b], 4096).unwrap();
            let mut back = vec![0u8; 8192 + 4096 * 3];
            dev.read_at(&mut back, 4096).unwrap();
            assert_eq!(&back[..8192], &a[..]);
            assert_eq!(&back[8192..], &b[..]);
            let odd = pattern(4096 + 1, 3);
            let small = pattern(512, 4);
            dev.write_vectored_at(&[&a, &odd[1..], &small], 1 << 20)
                .unwrap();
            let mut back = vec![0u8; 8192 + 4096 + 512];
            dev.read_at(&mut back, 1 << 20).unwrap();
            assert_eq!(back, [&a[..], &odd[1..], &small[..]].concat());
            // Out of range: refused, nothing written.
            assert!(matches!(
                dev.write_vectored_at(&[&a, &b], (8 << 20) - 8192),
                Err(DeviceError::OutOfRange { .. })
            ));
            // More buffers than one pwritev takes.
            let many: Vec<crate::IoBuf> = (0..IOV_MAX + 3)
                .map(|i| crate::IoBuf::copy_of(&pattern(512, i as u8)))
                .collect();
            let refs: Vec<&[u8]> = many.iter().map(|m| &m[..]).collect();
            dev.write_vectored_at(&refs, 2 << 20).unwrap();
            let mut back = vec![0u8; 512 * (IOV_MAX + 3)];
            dev.read_at(&mut back, 2 << 20).unwrap();
            assert_eq!(back, refs.concat());
        }
    }

    #[test]
    fn direct_round_trip_with_unaligned_buffer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d");
        let opts = FileDeviceOptions {
            direct: true,
            ..opts_create(4 << 20)
        };
        // Whether or not the filesystem accepts O_DIRECT, the round trip must work.
        let dev = FileDevice::open(&path, &opts).unwrap();
        eprintln!("O_DIRECT active: {}", dev.is_direct());

        // Unaligned source and destination, larger than one bounce buffer.
        let len = BOUNCE_MAX + 8192;
        let mut src = vec![0u8; len + 1];
        src[1..].copy_from_slice(&pattern(len, 3));
        let src = &src[1..];
        dev.write_at(src, 4096).unwrap();
        let mut dst = vec![0u8; len + 3];
        dev.read_at(&mut dst[3..], 4096).unwrap();
        assert_eq!(&dst[3..], src);

        // Aligned buffer path.
        let mut aligned = AlignedBuf::new(8192);
        let a = aligned.as_mut_slice(8192);
        a.copy_from_slice(&pattern(8192, 9));
        dev.write_at(a, 1 << 20).unwrap();
        let mut back = vec![0u8; 8192];
        dev.read_at(&mut back, 1 << 20).unwrap();
        assert_eq!(back, pattern(8192, 9));
        dev.flush().unwrap();

        if dev.is_direct() {
            let mut b = [0u8; 512];
            assert!(matches!(
                dev.read_at(&mut b, 100),
                Err(DeviceError::Invalid { .. })
            ));
            assert!(matches!(
                dev.write_at(&b[..100], 0),
                Err(DeviceError::Invalid { .. })
            ));
        }
    }

    #[test]
    fn trim_punches_hole() {
        let dir = tempfile::tempdir().unwrap();
        let dev = FileDevice::open(&dir.path().join("d"), &opts_create(1 << 20)).unwrap();
        dev.write_at(&vec![0xAB; 65536], 0).unwrap();
        dev.trim(4096, 8192).unwrap();
        let mut b = vec![0u8; 65536];
        dev.read_at(&mut b, 0).unwrap();
        // Hole punching may be unsupported (then the data stays); when it works, it reads zero.
        assert!(b[..4096].iter().all(|&x| x == 0xAB));
        assert!(b[12288..].iter().all(|&x| x == 0xAB));
        assert_eq!(dev.size(), 1 << 20);
    }
}
