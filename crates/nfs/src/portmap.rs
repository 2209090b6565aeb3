//! How a stock client finds the server: the portmapper.
//!
//! # Theory of operation
//! A client that is not told the ports (`mount -t nfs HOST:/share`, `nfs://HOST/share`)
//! asks the portmapper on port 111 where MOUNT and NFS are served. tank answers that in one
//! of two ways, only for a server on the standard NFS port 2049 (a server on another port
//! is a test's or a private one, and its clients name the port: it stays out of the
//! system's table):
//! - **a system rpcbind runs** (its local socket answers): the server registers NFS v3 and
//!   MOUNT v3 over TCP with it (RPCBPROC_SET, version 4, on the local socket, the one
//!   transport rpcbind trusts to change its table), after clearing what a previous run
//!   left, and unregisters them when it stops;
//! - **none runs**: the server answers the portmapper itself on port 111 of its own
//!   address, over TCP and UDP (PMAP version 2 GETPORT and DUMP, RPCBIND versions 3 and 4
//!   GETADDR), when it may bind that port (root, or CAP_NET_BIND_SERVICE); otherwise it
//!   says so and serves on, clients then giving `port=` and `mountport=`.
//!
//! Either way, only what is served is answered: NFS and MOUNT version 3 over TCP, and the
//! portmapper itself. Anything else (NLM, NFS over UDP, NFSv4) gets port 0, "not
//! registered", so a client fails at once with a clear error instead of timing out on a
//! service that is not there.
//!
//! The call header is decoded by `nfs3_types`; the arguments (words and strings) by the
//! small bounded reader here, which `tests::random_calls_never_panic` feeds with random
//! and mutated bytes.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use nfs3_server::nfs3_types::rpc::{
    accept_stat_data, accepted_reply, call_body, msg_body, opaque_auth, reply_body, rpc_msg,
};
use nfs3_server::nfs3_types::xdr_codec::{Pack, Unpack};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The standard NFS port: only a server there takes part in the portmapper.
pub const NFS_PORT: u16 = 2049;
/// The portmapper's port.
pub const PORTMAP_PORT: u16 = 111;

const PMAP_PROG: u32 = 100_000;
const NFS_PROG: u32 = 100_003;
const MOUNT_PROG: u32 = 100_005;
const IPPROTO_TCP: u32 = 6;
const IPPROTO_UDP: u32 = 17;

/// Where rpcbind listens for local callers (the second for older systems).
const RPCBIND_SOCKETS: [&str; 2] = ["/run/rpcbind.sock", "/var/run/rpcbind.sock"];

/// A call larger than this is not a portmapper call: its connection is closed.
const MAX_CALL: usize = 8 << 10;

/// What the server registered or serves, for the line `tank serve` prints and for the stop.
#[derive(Debug)]
pub enum Portmap {
    /// Not on the standard port: no part in the portmapper.
    NotStandardPort,
    /// Registered with the system's rpcbind (the socket it was reached on).
    Registered { socket: String },
    /// Our own portmapper on this address.
    Serving(SocketAddr),
    /// Neither could be done: why.
    Unavailable(String),
}

impl std::fmt::Display for Portmap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Portmap::NotStandardPort => write!(
                f,
                "not registered (not the standard port {NFS_PORT}): clients give port= and mountport="
            ),
            Portmap::Registered { socket } => {
                write!(f, "registered with the system's rpcbind ({socket})")
            }
            Portmap::Serving(a) => write!(f, "answered by tank on {a}"),
            Portmap::Unavailable(why) => {
                write!(f, "unavailable ({why}): clients give port= and mountport=")
            }
        }
    }
}

/// One program the server serves, as the portmapper tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mapping {
    prog: u32,
    vers: u32,
    prot: u32,
    port: u16,
}

/// What our portmapper answers: NFS and MOUNT v3 over TCP on `nfs_port`, and itself.
fn table(nfs_port: u16) -> Vec<Mapping> {
    let m = |prog, vers, prot, port| Mapping {
        prog,
        vers,
        prot,
        port,
    };
    vec![
        m(PMAP_PROG, 2, IPPROTO_TCP, PORTMAP_PORT),
        m(PMAP_PROG, 2, IPPROTO_UDP, PORTMAP_PORT),
        m(PMAP_PROG, 3, IPPROTO_TCP, PORTMAP_PORT),
        m(PMAP_PROG, 4, IPPROTO_TCP, PORTMAP_PORT),
        m(NFS_PROG, 3, IPPROTO_TCP, nfs_port),
        m(MOUNT_PROG, 3, IPPROTO_TCP, nfs_port),
    ]
}

/// A bounded reader of XDR words and strings.
struct Xdr<'a> {
    buf: &'a [u8],
}

impl<'a> Xdr<'a> {
    fn u32(&mut self) -> Option<u32> {
        let (w, rest) = self.buf.split_first_chunk::<4>()?;
        self.buf = rest;
        Some(u32::from_be_bytes(*w))
    }

    /// A string of at most `max` bytes (padded to a word).
    fn string(&mut self, max: usize) -> Option<String> {
        let len = self.u32()? as usize;
        if len > max || len > self.buf.len() {
            return None;
        }
        let padded = len.div_ceil(4) * 4;
        let s = std::str::from_utf8(&self.buf[..len]).ok()?.to_owned();
        self.buf = self.buf.get(padded..)?;
        Some(s)
    }
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_be_bytes());
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    put_u32(out, s.len() as u32);
    out.extend_from_slice(s.as_bytes());
    out.resize(out.len().div_ceil(4) * 4, 0);
}

/// The reply header for `xid` with `stat`, then `body`.
fn reply(xid: u32, stat: accept_stat_data, body: &[u8]) -> Vec<u8> {
    let msg = rpc_msg {
        xid,
        body: msg_body::REPLY(reply_body::MSG_ACCEPTED(accepted_reply {
            verf: opaque_auth::default(),
            reply_data: stat,
        })),
    };
    let mut out = Vec::with_capacity(msg.packed_size() + body.len());
    // Packing into a Vec cannot fail.
    let _ = msg.pack(&mut out);
    out.extend_from_slice(body);
    out
}

/// The universal address of `ip` and `port` (RFC 5665): `h1.h2.h3.h4.p1.p2`, or the IPv6
/// text form followed by `.p1.p2`.
fn uaddr(ip: IpAddr, port: u16) -> String {
    format!("{ip}.{}.{}", port >> 8, port & 0xff)
}

/// The netid of a transport over `ip`'s family.
fn netid(ip: IpAddr, prot: u32) -> &'static str {
    match (ip.is_ipv6(), prot == IPPROTO_UDP) {
        (false, false) => "tcp",
        (false, true) => "udp",
        (true, false) => "tcp6",
        (true, true) => "udp6",
    }
}

/// The answer of our portmapper at `ip` (the address the call came to) for the call in
/// `record`; None where the record is not a call (its connection is then closed).
fn answer(record: &[u8], ip: IpAddr, nfs_port: u16) -> Option<Vec<u8>> {
    let mut cur = std::io::Cursor::new(record);
    let (msg, used) = rpc_msg::unpack(&mut cur).ok()?;
    let xid = msg.xid;
    let call: call_body = match msg.body {
        msg_body::CALL(c) => c,
        msg_body::REPLY(_) => return None,
    };
    let mut args = Xdr {
        buf: &record[used..],
    };
    if call.prog != PMAP_PROG {
        return Some(reply(xid, accept_stat_data::PROG_UNAVAIL, &[]));
    }
    if !(2..=4).contains(&call.vers) {
        return Some(reply(
            xid,
            accept_stat_data::PROG_MISMATCH { low: 2, high: 4 },
            &[],
        ));
    }
    let served = table(nfs_port);
    let mut out = Vec::new();
    match (call.vers, call.proc) {
        (_, 0) => {}
        // PMAPPROC_GETPORT (mapping: prog, vers, prot, port) -> port, 0 if not served.
        (2, 3) => {
            let (Some(prog), Some(vers), Some(prot), Some(_)) =
                (args.u32(), args.u32(), args.u32(), args.u32())
            else {
                return Some(reply(xid, accept_stat_data::GARBAGE_ARGS, &[]));
            };
            let port = served
                .iter()
                .find(|m| m.prog == prog && m.vers == vers && m.prot == prot)
                .map_or(0, |m| m.port);
            put_u32(&mut out, u32::from(port));
        }
        // PMAPPROC_DUMP -> a list of mappings.
        (2, 4) => {
            for m in &served {
                put_u32(&mut out, 1);
                for w in [m.prog, m.vers, m.prot, u32::from(m.port)] {
                    put_u32(&mut out, w);
                }
            }
            put_u32(&mut out, 0);
        }
        // RPCBPROC_GETADDR (rpcb: prog, vers, netid, addr, owner) -> a universal address,
        // empty if not served. The address is the one the call came to.
        (3 | 4, 3) => {
            let (Some(prog), Some(vers), Some(net), Some(_), Some(_)) = (
                args.u32(),
                args.u32(),
                args.string(64),
                args.string(128),
                args.string(128),
            ) else {
                return Some(reply(xid, accept_stat_data::GARBAGE_ARGS, &[]));
            };
            let found = served.iter().find(|m| {
                m.prog == prog
                    && m.vers == vers
                    && (net.is_empty() || net == netid(ip, m.prot) || m.prog == PMAP_PROG)
            });
            let addr = found.map_or(String::new(), |m| uaddr(ip, m.port));
            put_string(&mut out, &addr);
        }
        _ => return Some(reply(xid, accept_stat_data::PROC_UNAVAIL, &[])),
    }
    Some(reply(xid, accept_stat_data::SUCCESS, &out))
}

/// Serves our portmapper on `addr` (TCP and UDP) until the runtime stops. Binding is done
/// here, so that a refusal is told at start.
pub(crate) async fn serve(addr: SocketAddr, nfs_port: u16) -> Result<()> {
    let tcp = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let udp = tokio::net::UdpSocket::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} (UDP)"))?;
    tokio::spawn(async move {
        let mut buf = vec![0u8; MAX_CALL];
        loop {
            let Ok((n, from)) = udp.recv_from(&mut buf).await else {
                continue;
            };
            if let Some(r) = answer(&buf[..n], addr.ip(), nfs_port) {
                let _ = udp.send_to(&r, from).await;
            }
        }
    });
    tokio::spawn(async move {
        // Bounded like the NFS listener: a connection is a few small calls.
        let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(256));
        loop {
            let Ok((conn, _)) = tcp.accept().await else {
                continue;
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                continue; // dropped: closed
            };
            tokio::spawn(async move {
                let _slot = slot;
                let _ = tokio::time::timeout(
                    Duration::from_secs(60),
                    serve_conn(conn, addr.ip(), nfs_port),
                )
                .await;
            });
        }
    });
    Ok(())
}

/// One TCP connection: record-marked calls, each answered in turn.
async fn serve_conn(mut conn: tokio::net::TcpStream, ip: IpAddr, nfs_port: u16) -> Result<()> {
    loop {
        let mut record = Vec::new();
        loop {
            let mut h = [0u8; 4];
            conn.read_exact(&mut h).await?;
            let h = u32::from_be_bytes(h);
            let len = (h & 0x7fff_ffff) as usize;
            if record.len() + len > MAX_CALL {
                bail!("a record of over {MAX_CALL} bytes");
            }
            let start = record.len();
            record.resize(start + len, 0);
            conn.read_exact(&mut record[start..]).await?;
            if h & 0x8000_0000 != 0 {
                break;
            }
        }
        let Some(r) = answer(&record, ip, nfs_port) else {
            bail!("not an RPC call");
        };
        let mut framed = Vec::with_capacity(4 + r.len());
        framed.extend_from_slice(&(r.len() as u32 | 0x8000_0000).to_be_bytes());
        framed.extend_from_slice(&r);
        conn.write_all(&framed).await?;
    }
}

/// The first rpcbind socket that accepts a connection.
fn rpcbind_socket() -> Option<(&'static str, UnixStream)> {
    RPCBIND_SOCKETS.iter().find_map(|p| {
        if !Path::new(p).exists() {
            return None;
        }
        UnixStream::connect(p).ok().map(|s| (*p, s))
    })
}

/// One RPCBIND version 4 call on the local socket: SET (1) or UNSET (2) of `prog` version
/// `vers` over `netid` at `addr`. Whether rpcbind said yes.
fn rpcb_call(
    s: &mut UnixStream,
    xid: u32,
    proc_: u32,
    prog: u32,
    vers: u32,
    netid: &str,
    addr: &str,
) -> Result<bool> {
    let mut call = Vec::new();
    for w in [xid, 0, 2, PMAP_PROG, 4, proc_] {
        put_u32(&mut call, w);
    }
    // AUTH_NULL credential and verifier.
    for w in [0, 0, 0, 0] {
        put_u32(&mut call, w);
    }
    put_u32(&mut call, prog);
    put_u32(&mut call, vers);
    put_string(&mut call, netid);
    put_string(&mut call, addr);
    put_string(&mut call, "superuser");
    let mut framed = (call.len() as u32 | 0x8000_0000).to_be_bytes().to_vec();
    framed.extend_from_slice(&call);
    s.write_all(&framed)?;
    let mut h = [0u8; 4];
    s.read_exact(&mut h)?;
    let len = (u32::from_be_bytes(h) & 0x7fff_ffff) as usize;
    if len > MAX_CALL {
        bail!("rpcbind sent a record of {len} bytes");
    }
    let mut r = vec![0u8; len];
    s.read_exact(&mut r)?;
    let mut x = Xdr { buf: &r };
    // xid, REPLY, MSG_ACCEPTED, verifier (flavor, body), SUCCESS, the boolean.
    let (Some(rx), Some(1), Some(0), Some(_), Some(vlen)) =
        (x.u32(), x.u32(), x.u32(), x.u32(), x.u32())
    else {
        bail!("rpcbind refused the call");
    };
    if rx != xid || vlen > 400 {
        bail!("rpcbind's reply does not match the call");
    }
    x.buf = x.buf.get(vlen.div_ceil(4) as usize * 4..).unwrap_or(&[]);
    match (x.u32(), x.u32()) {
        (Some(0), Some(ok)) => Ok(ok != 0),
        (Some(stat), _) => bail!("rpcbind answered with status {stat}"),
        _ => bail!("rpcbind's reply is cut short"),
    }
}

/// The registrations of a server at `nfs`: (program, version).
const REGISTERED: [(u32, u32); 2] = [(NFS_PROG, 3), (MOUNT_PROG, 3)];

/// Registers the server at `nfs` with the system's rpcbind, if one runs: Ok(None) if none.
pub(crate) fn register(nfs: SocketAddr) -> Result<Option<String>> {
    let Some((path, mut s)) = rpcbind_socket() else {
        return Ok(None);
    };
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    let net = netid(nfs.ip(), IPPROTO_TCP);
    let addr = uaddr(nfs.ip(), nfs.port());
    let mut xid = std::process::id() << 8;
    for (prog, vers) in REGISTERED {
        // What a previous run left (a kill -9 unregisters nothing), over every netid.
        xid += 1;
        rpcb_call(&mut s, xid, 2, prog, vers, "", "")
            .with_context(|| format!("rpcbind at {path}"))?;
        xid += 1;
        if !rpcb_call(&mut s, xid, 1, prog, vers, net, &addr)
            .with_context(|| format!("rpcbind at {path}"))?
        {
            bail!("rpcbind at {path} refused to register program {prog} version {vers}");
        }
    }
    Ok(Some(path.to_string()))
}

/// Takes the server's registrations back from the system's rpcbind.
pub(crate) fn unregister() {
    if let Some((_, mut s)) = rpcbind_socket() {
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let mut xid = (std::process::id() << 8) | 0x80;
        for (prog, vers) in REGISTERED {
            xid += 1;
            let _ = rpcb_call(&mut s, xid, 2, prog, vers, "", "");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(xid: u32, prog: u32, vers: u32, proc_: u32, args: &[u8]) -> Vec<u8> {
        let mut c = Vec::new();
        for w in [xid, 0, 2, prog, vers, proc_, 0, 0, 0, 0] {
            put_u32(&mut c, w);
        }
        c.extend_from_slice(args);
        c
    }

    fn words(r: &[u8]) -> Vec<u32> {
        r.chunks(4)
            .map(|w| u32::from_be_bytes(w.try_into().unwrap()))
            .collect()
    }

    const LO: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    #[test]
    fn getport_tells_only_what_is_served() {
        let ask = |prog, vers, prot| {
            let mut a = Vec::new();
            for w in [prog, vers, prot, 0] {
                put_u32(&mut a, w);
            }
            let r = answer(&call(7, PMAP_PROG, 2, 3, &a), LO, 2049).unwrap();
            // xid, REPLY, ACCEPTED, verf flavor, verf len, SUCCESS, port
            let w = words(&r);
            assert_eq!(&w[..6], &[7, 1, 0, 0, 0, 0]);
            w[6]
        };
        assert_eq!(ask(NFS_PROG, 3, IPPROTO_TCP), 2049);
        assert_eq!(ask(MOUNT_PROG, 3, IPPROTO_TCP), 2049);
        assert_eq!(ask(NFS_PROG, 3, IPPROTO_UDP), 0, "no NFS over UDP");
        assert_eq!(ask(NFS_PROG, 4, IPPROTO_TCP), 0, "no NFSv4");
        assert_eq!(ask(100_021, 4, IPPROTO_TCP), 0, "no NLM");
        assert_eq!(ask(PMAP_PROG, 2, IPPROTO_UDP), 111);
    }

    #[test]
    fn getaddr_answers_universal_addresses() {
        let ask = |ip, prog, netid: &str| {
            let mut a = Vec::new();
            put_u32(&mut a, prog);
            put_u32(&mut a, 3);
            put_string(&mut a, netid);
            put_string(&mut a, "");
            put_string(&mut a, "");
            let r = answer(&call(9, PMAP_PROG, 4, 3, &a), ip, 2049).unwrap();
            let mut x = Xdr { buf: &r[24..] };
            x.string(200).unwrap()
        };
        assert_eq!(ask(LO, NFS_PROG, "tcp"), "127.0.0.1.8.1");
        assert_eq!(ask("::1".parse().unwrap(), MOUNT_PROG, "tcp6"), "::1.8.1");
        assert_eq!(ask(LO, NFS_PROG, "udp"), "");
        assert_eq!(ask(LO, 100_021, "tcp"), "");
    }

    #[test]
    fn other_programs_versions_and_procedures_are_refused() {
        let stat = |r: Vec<u8>| words(&r)[5];
        assert_eq!(
            stat(answer(&call(1, NFS_PROG, 3, 0, &[]), LO, 2049).unwrap()),
            1
        );
        assert_eq!(
            stat(answer(&call(1, PMAP_PROG, 5, 0, &[]), LO, 2049).unwrap()),
            2
        );
        assert_eq!(
            stat(answer(&call(1, PMAP_PROG, 2, 1, &[]), LO, 2049).unwrap()),
            3,
            "SET is not ours to serve"
        );
        assert_eq!(
            stat(answer(&call(1, PMAP_PROG, 2, 3, &[0, 0]), LO, 2049).unwrap()),
            4
        );
        assert!(answer(&[1, 2, 3], LO, 2049).is_none());
    }

    /// Random records and mutations of real calls: an answer or None, never a panic.
    #[test]
    fn random_calls_never_panic() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut getaddr = Vec::new();
        put_u32(&mut getaddr, NFS_PROG);
        put_u32(&mut getaddr, 3);
        put_string(&mut getaddr, "tcp");
        put_string(&mut getaddr, "127.0.0.1.8.1");
        put_string(&mut getaddr, "superuser");
        let seeds = [
            call(1, PMAP_PROG, 2, 3, &[0; 16]),
            call(2, PMAP_PROG, 2, 4, &[]),
            call(3, PMAP_PROG, 4, 3, &getaddr),
            call(4, PMAP_PROG, 3, 3, &getaddr),
        ];
        for i in 0..200_000 {
            let mut rec = if i % 4 == 0 {
                (0..rnd() % 200).map(|_| rnd() as u8).collect()
            } else {
                seeds[i % seeds.len()].clone()
            };
            let flips = rnd() % 6;
            for _ in 0..flips {
                if rec.is_empty() {
                    break;
                }
                let at = rnd() as usize % rec.len();
                match rnd() % 3 {
                    0 => rec[at] = rnd() as u8,
                    1 => rec.truncate(at),
                    _ => rec[at] ^= 0x80,
                }
            }
            let _ = answer(&rec, LO, 2049);
        }
    }
}
