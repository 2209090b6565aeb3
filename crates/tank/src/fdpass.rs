//! A send's standard output or a receive's standard input, handed to the daemon.
//!
//! # Theory of operation
//! `tank send` and `tank receive` talk to the daemon over its local socket, but the stream
//! does not cross that socket: the command passes its own standard output (send) or input
//! (receive) with the request line, as `SCM_RIGHTS` ancillary data ([`send_with_fd`]), and
//! the daemon writes the stream to it or reads the stream from it directly ([`Passed`]), as
//! zfs-fuse's commands hand their descriptors to its daemon. A stream piped from one daemon
//! to another then crosses one pipe, instead of a socket, a command, a pipe, a command and
//! a socket (four copies of every byte fewer, measured in docs/BENCHMARKS.md).
//!
//! The daemon reads requests through [`FdReader`], which keeps the descriptors that arrive
//! with the bytes it reads (at most one: the newest). While it moves the stream it watches
//! the connection: the command says nothing until the reply, so anything on it (its end,
//! when the command is killed) stops the transfer, as a closed socket did before; each wait
//! for the descriptor is a `poll` of both, so a stalled pipe does not hold the daemon once
//! the command is gone. Once a second, and at the end, the daemon writes the bytes moved
//! so far on the connection (`{"progress":N}`), for `-v`; then the reply, as for any
//! request. A pipe's buffer is raised to 1 MiB (`F_SETPIPE_SZ`), so that a 128K record
//! crosses in one wake-up rather than two or three.

use std::fs::File;
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

/// Writes `line` on `sock` with `fd` attached to its first byte.
pub fn send_with_fd(sock: &UnixStream, line: &[u8], fd: BorrowedFd<'_>) -> io::Result<()> {
    let fds = [fd.as_raw_fd()];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    let sent = loop {
        match sendmsg::<()>(
            sock.as_raw_fd(),
            &[IoSlice::new(line)],
            &cmsg,
            MsgFlags::empty(),
            None,
        ) {
            Ok(n) => break n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    (&*sock).write_all(&line[sent..])
}

/// The daemon's reader of a connection: reads as `read` does, and keeps the descriptor
/// that came with the bytes (see the module documentation).
pub struct FdReader {
    sock: UnixStream,
    fd: Option<OwnedFd>,
}

impl FdReader {
    pub fn new(sock: UnixStream) -> Self {
        FdReader { sock, fd: None }
    }

    /// The newest descriptor received, if any (taken: the next call says `None`).
    pub fn take_fd(&mut self) -> Option<OwnedFd> {
        self.fd.take()
    }
}

impl Read for FdReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut space = nix::cmsg_space!([std::os::fd::RawFd; 4]);
        let mut iov = [IoSliceMut::new(buf)];
        let (n, received) = loop {
            match recvmsg::<()>(
                self.sock.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_CMSG_CLOEXEC,
            ) {
                Ok(msg) => {
                    let mut received = Vec::new();
                    for c in msg.cmsgs()? {
                        if let ControlMessageOwned::ScmRights(fds) = c {
                            received.extend(fds);
                        }
                    }
                    break (msg.bytes, received);
                }
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
        };
        for raw in received {
            // SAFETY: the kernel has just installed `raw` in this process for this message;
            // nothing else knows of it, so this is its only owner (the older one, if any,
            // is closed here).
            #[allow(unsafe_code)]
            let owned = unsafe { OwnedFd::from_raw_fd(raw) };
            self.fd = Some(owned);
        }
        Ok(n)
    }
}

/// Below this many bytes a write is gathered with the next one (a record's header and
/// trailer go out with its payload, in one `writev`).
const GATHER: usize = 64 << 10;

/// How often the bytes moved are written on the connection.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// A passed descriptor as the daemon uses it: the stream's reader or writer, with the
/// connection watched and told the progress (see the module documentation).
pub struct Passed<'a> {
    file: File,
    conn: &'a UnixStream,
    gathered: Vec<u8>,
    /// Bytes moved through the descriptor.
    pub bytes: u64,
    last: Instant,
}

impl<'a> Passed<'a> {
    pub fn new(fd: OwnedFd, conn: &'a UnixStream) -> Self {
        let file = File::from(fd);
        if file
            .metadata()
            .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_fifo(&m.file_type()))
        {
            // The pipe's own limit may refuse it (pipe-max-size, or the user's pipe
            // pages); the stream then goes at the pipe's size.
            let _ = nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_SETPIPE_SZ(1 << 20));
        }
        Passed {
            file,
            conn,
            gathered: Vec::new(),
            bytes: 0,
            last: Instant::now(),
        }
    }

    /// Waits until the descriptor is ready for `ev`; an error once the command has gone.
    fn wait(&self, ev: PollFlags) -> io::Result<()> {
        loop {
            let mut fds = [
                PollFd::new(self.file.as_fd(), ev),
                PollFd::new(self.conn.as_fd(), PollFlags::POLLIN),
            ];
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
            if fds[1].revents().is_some_and(|r| !r.is_empty()) {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    "the command went away",
                ));
            }
            if fds[0].revents().is_some_and(|r| !r.is_empty()) {
                // Ready, or at its end or in error: the read or write says which.
                return Ok(());
            }
        }
    }

    fn moved(&mut self, n: usize) {
        self.bytes += n as u64;
        if self.last.elapsed() >= PROGRESS_EVERY {
            self.last = Instant::now();
            self.report();
        }
    }

    /// Writes the bytes moved so far on the connection (a command gone is found by the
    /// next wait).
    pub fn report(&self) {
        let line = format!("{{\"progress\":{}}}\n", self.bytes);
        let _ = (&*self.conn).write_all(line.as_bytes());
    }
}

impl Read for Passed<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        self.wait(PollFlags::POLLIN)?;
        let n = self.file.read(buf)?;
        self.moved(n);
        Ok(n)
    }
}

impl Write for Passed<'_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.gathered.len() + data.len() <= GATHER {
            self.gathered.extend_from_slice(data);
            return Ok(data.len());
        }
        loop {
            self.wait(PollFlags::POLLOUT)?;
            let n = self
                .file
                .write_vectored(&[IoSlice::new(&self.gathered), IoSlice::new(data)])?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            let held = self.gathered.len();
            if n <= held {
                // Part of what was gathered: the rest of it goes first, with `data` again.
                self.gathered.drain(..n);
                self.moved(n);
                continue;
            }
            self.gathered.clear();
            self.moved(n);
            return Ok(n - held);
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        while !self.gathered.is_empty() {
            self.wait(PollFlags::POLLOUT)?;
            let n = self.file.write(&self.gathered)?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            self.gathered.drain(..n);
            self.moved(n);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_descriptor_travels_with_its_line_and_the_stream_goes_through_it() {
        let (client, server) = UnixStream::pair().unwrap();
        let (mut pipe_r, pipe_w) = {
            let (r, w) = nix::unistd::pipe().unwrap();
            (File::from(r), w)
        };
        send_with_fd(&client, b"{\"request\":1}\n", pipe_w.as_fd()).unwrap();
        drop(pipe_w);
        let mut reader = FdReader::new(server.try_clone().unwrap());
        let mut line = [0u8; 14];
        reader.read_exact(&mut line).unwrap();
        assert_eq!(&line, b"{\"request\":1}\n");
        let fd = reader.take_fd().expect("the descriptor came with the line");
        assert!(reader.take_fd().is_none());
        let reading = std::thread::spawn(move || {
            let mut all = Vec::new();
            pipe_r.read_to_end(&mut all).unwrap();
            all
        });
        let mut out = Passed::new(fd, &server);
        // Small pieces gathered, a large one written with them, then the rest flushed.
        let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let mut want = Vec::new();
        for piece in [&b"head"[..], &big, &b"tail"[..], &big[..1000]] {
            out.write_all(piece).unwrap();
            want.extend_from_slice(piece);
        }
        out.flush().unwrap();
        assert_eq!(out.bytes, want.len() as u64);
        drop(out);
        assert_eq!(reading.join().unwrap(), want);
    }

    #[test]
    fn a_transfer_stops_when_the_command_goes_away() {
        let (client, server) = UnixStream::pair().unwrap();
        let (r, w) = nix::unistd::pipe().unwrap();
        // Nobody writes into the pipe: the read would wait for ever, but the command's
        // end of the connection closes.
        let mut input = Passed::new(r, &server);
        let closer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            drop(client);
        });
        let mut buf = [0u8; 16];
        let err = input.read(&mut buf).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionAborted, "{err}");
        closer.join().unwrap();
        drop(w);
    }
}
