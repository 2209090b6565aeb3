//! A minimal NFSv3 client over TCP: ONC RPC record marking, AUTH_SYS, and the XDR types of
//! `nfs3_types` (the same definitions the server decodes).
//!
//! # Theory of operation
//! One connection, one call at a time: a call is packed, sent as one record, and its reply
//! read back whole. `bench-nfs` drives its small-file load with it against tank and a peer
//! server alike; the NFS tests use it to send exactly the calls they mean, keep file
//! handles across server restarts, and send what no well-behaved client would. Every wait
//! on the server is bounded by the socket's timeouts.

use std::io::{Cursor, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use nfs3_server::nfs3_types::nfs3::{self as nfs, nfs_fh3, nfsstat3, Nfs3Result};
use nfs3_server::nfs3_types::rpc::{
    accept_stat_data, auth_unix, call_body, msg_body, opaque_auth, reply_body, rpc_msg,
    RPC_VERSION_2,
};
use nfs3_server::nfs3_types::xdr_codec::{Opaque, Pack, Unpack};

/// What came back for a call.
#[derive(Debug)]
pub enum Reply {
    /// Accepted and run: the results' bytes.
    Success(Vec<u8>),
    /// Accepted, not run: the reason (PROG_UNAVAIL, PROC_UNAVAIL, GARBAGE_ARGS, ...).
    Refused(String),
    /// Denied (RPC version, authentication).
    Denied(String),
}

pub struct Rpc {
    stream: TcpStream,
    xid: u32,
    /// AUTH_SYS uid and gid of the calls (None: AUTH_NULL).
    pub auth: Option<(u32, u32)>,
    /// Supplementary groups of the calls (empty: the gid alone).
    pub groups: Vec<u32>,
}

impl Rpc {
    pub fn connect(addr: &str) -> std::io::Result<Rpc> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        stream.set_write_timeout(Some(Duration::from_secs(60)))?;
        Ok(Rpc {
            stream,
            xid: 1,
            auth: Some((0, 0)),
            groups: Vec::new(),
        })
    }

    /// Sends one record (the last-fragment bit set).
    pub fn send_record(&mut self, body: &[u8]) -> std::io::Result<()> {
        // One write: a header sent alone would wait for the server's delayed ACK.
        let mut rec = (body.len() as u32 | 0x8000_0000).to_be_bytes().to_vec();
        rec.extend_from_slice(body);
        self.stream.write_all(&rec)
    }

    /// Sends raw bytes as they are.
    pub fn send_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// Reads one record (all its fragments).
    pub fn read_record(&mut self) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::new();
        loop {
            let mut h = [0u8; 4];
            self.stream.read_exact(&mut h)?;
            let h = u32::from_be_bytes(h);
            let len = (h & 0x7fff_ffff) as usize;
            if len > 4 << 20 {
                return Err(std::io::Error::other(format!(
                    "a reply fragment of {len} bytes"
                )));
            }
            let start = out.len();
            out.resize(start + len, 0);
            self.stream.read_exact(&mut out[start..])?;
            if h & 0x8000_0000 != 0 {
                return Ok(out);
            }
        }
    }

    /// The bytes of a call of `prog`/`vers`/`proc` with `args` already packed.
    pub fn call_bytes(&mut self, prog: u32, vers: u32, proc_: u32, args: &[u8]) -> Vec<u8> {
        self.xid += 1;
        let cred = match self.auth {
            Some((uid, gid)) => opaque_auth::auth_unix(&auth_unix {
                stamp: 1,
                machinename: Opaque::borrowed(b"test"),
                uid,
                gid,
                gids: if self.groups.is_empty() {
                    vec![gid]
                } else {
                    self.groups.clone()
                },
            }),
            None => opaque_auth::default(),
        };
        let msg = rpc_msg {
            xid: self.xid,
            body: msg_body::CALL(call_body {
                rpcvers: RPC_VERSION_2,
                prog,
                vers,
                proc: proc_,
                cred,
                verf: opaque_auth::default(),
            }),
        };
        let mut out = Vec::new();
        // Packing into a Vec cannot fail.
        let _ = msg.pack(&mut out);
        out.extend_from_slice(args);
        out
    }

    /// Sends a call and reads its reply.
    pub fn call_raw(
        &mut self,
        prog: u32,
        vers: u32,
        proc_: u32,
        args: &[u8],
    ) -> std::io::Result<Reply> {
        let bytes = self.call_bytes(prog, vers, proc_, args);
        self.send_record(&bytes)?;
        let rec = self.read_record()?;
        parse_reply(&rec)
    }

    /// A call that must succeed at the RPC level; its results decoded as `R`.
    pub fn call<A: Pack, R: Unpack>(
        &mut self,
        prog: u32,
        proc_: u32,
        args: &A,
    ) -> Result<R, String> {
        let mut a = Vec::new();
        args.pack(&mut a).map_err(|e| e.to_string())?;
        match self
            .call_raw(prog, 3, proc_, &a)
            .map_err(|e| e.to_string())?
        {
            Reply::Success(res) => R::unpack(&mut Cursor::new(&res))
                .map(|r| r.0)
                .map_err(|e| format!("call {prog}/{proc_}: a reply that does not decode: {e}")),
            other => Err(format!("call {prog}/{proc_}: {other:?}")),
        }
    }

    /// An NFS call whose RPC-level failure counts as the server's fault.
    fn nfs<A: Pack, R: Unpack>(&mut self, proc_: u32, args: &A) -> Result<R, nfsstat3> {
        self.call(nfs::PROGRAM, proc_, args)
            .map_err(|_| nfsstat3::NFS3ERR_SERVERFAULT)
    }

    /// MOUNT's MNT of `path`: the root handle of the export.
    pub fn mount(&mut self, path: &str) -> Result<nfs_fh3, String> {
        use nfs3_server::nfs3_types::mount::{dirpath, mountres3};
        let r: mountres3 = self.call(
            nfs3_server::nfs3_types::mount::PROGRAM,
            1,
            &dirpath(Opaque::owned(path.as_bytes().to_vec())),
        )?;
        match r {
            mountres3::Ok(ok) => Ok(nfs_fh3 {
                data: Opaque::owned(ok.fhandle.0.to_vec()),
            }),
            mountres3::Err(e) => Err(format!("{e:?}")),
        }
    }

    pub fn lookup(&mut self, dir: &nfs_fh3, name: &str) -> Result<nfs_fh3, nfsstat3> {
        let r: nfs::LOOKUP3res = self.nfs(
            3,
            &nfs::LOOKUP3args {
                what: dirop(dir, name),
            },
        )?;
        ok(r).map(|o| o.object)
    }

    pub fn getattr(&mut self, fh: &nfs_fh3) -> Result<nfs::fattr3, nfsstat3> {
        let r: nfs::GETATTR3res = self.nfs(1, &nfs::GETATTR3args { object: fh.clone() })?;
        ok(r).map(|o| o.obj_attributes)
    }

    pub fn create(
        &mut self,
        dir: &nfs_fh3,
        name: &str,
        how: nfs::createhow3,
    ) -> Result<nfs_fh3, nfsstat3> {
        let r: nfs::CREATE3res = self.nfs(
            8,
            &nfs::CREATE3args {
                where_: dirop(dir, name),
                how,
            },
        )?;
        ok(r).and_then(|o| match o.obj {
            nfs::post_op_fh3::Some(fh) => Ok(fh),
            // A server may leave the handle out: look it up.
            nfs::post_op_fh3::None => self.lookup(dir, name),
        })
    }

    pub fn write(
        &mut self,
        fh: &nfs_fh3,
        offset: u64,
        data: &[u8],
        stable: nfs::stable_how,
    ) -> Result<nfs::WRITE3resok, nfsstat3> {
        let r: nfs::WRITE3res = self.nfs(
            7,
            &nfs::WRITE3args {
                file: fh.clone(),
                offset,
                count: data.len() as u32,
                stable,
                data: Opaque::borrowed(data),
            },
        )?;
        ok(r)
    }

    pub fn commit(&mut self, fh: &nfs_fh3) -> Result<nfs::writeverf3, nfsstat3> {
        let r: nfs::COMMIT3res = self.nfs(
            21,
            &nfs::COMMIT3args {
                file: fh.clone(),
                offset: 0,
                count: 0,
            },
        )?;
        ok(r).map(|o| o.verf)
    }

    pub fn read(
        &mut self,
        fh: &nfs_fh3,
        offset: u64,
        count: u32,
    ) -> Result<(Vec<u8>, bool), nfsstat3> {
        let r: nfs::READ3res = self.nfs(
            6,
            &nfs::READ3args {
                file: fh.clone(),
                offset,
                count,
            },
        )?;
        ok(r).map(|o| (o.data.to_vec(), o.eof))
    }

    pub fn remove(&mut self, dir: &nfs_fh3, name: &str) -> Result<(), nfsstat3> {
        let r: nfs::REMOVE3res = self.nfs(
            12,
            &nfs::REMOVE3args {
                object: dirop(dir, name),
            },
        )?;
        ok(r).map(|_| ())
    }

    pub fn fsstat(&mut self, fh: &nfs_fh3) -> Result<nfs::FSSTAT3resok, nfsstat3> {
        let r: nfs::FSSTAT3res = self.nfs(18, &nfs::FSSTAT3args { fsroot: fh.clone() })?;
        ok(r)
    }
}

impl Rpc {
    pub fn setattr(&mut self, fh: &nfs_fh3, attrs: nfs::sattr3) -> Result<(), nfsstat3> {
        let r: nfs::SETATTR3res = self.nfs(
            2,
            &nfs::SETATTR3args {
                object: fh.clone(),
                new_attributes: attrs,
                guard: nfs::Nfs3Option::None,
            },
        )?;
        ok(r).map(|_| ())
    }

    pub fn mkdir(&mut self, dir: &nfs_fh3, name: &str, mode: u32) -> Result<nfs_fh3, nfsstat3> {
        let r: nfs::MKDIR3res = self.nfs(
            9,
            &nfs::MKDIR3args {
                where_: dirop(dir, name),
                attributes: nfs::sattr3 {
                    mode: nfs::Nfs3Option::Some(mode),
                    ..Default::default()
                },
            },
        )?;
        ok(r).and_then(|o| match o.obj {
            nfs::post_op_fh3::Some(fh) => Ok(fh),
            nfs::post_op_fh3::None => self.lookup(dir, name),
        })
    }

    pub fn rmdir(&mut self, dir: &nfs_fh3, name: &str) -> Result<(), nfsstat3> {
        let r: nfs::RMDIR3res = self.nfs(
            13,
            &nfs::RMDIR3args {
                object: dirop(dir, name),
            },
        )?;
        ok(r).map(|_| ())
    }

    pub fn rename(
        &mut self,
        from: &nfs_fh3,
        fname: &str,
        to: &nfs_fh3,
        tname: &str,
    ) -> Result<(), nfsstat3> {
        let r: nfs::RENAME3res = self.nfs(
            14,
            &nfs::RENAME3args {
                from: dirop(from, fname),
                to: dirop(to, tname),
            },
        )?;
        ok(r).map(|_| ())
    }

    pub fn symlink(&mut self, dir: &nfs_fh3, name: &str, target: &str) -> Result<(), nfsstat3> {
        let r: nfs::SYMLINK3res = self.nfs(
            10,
            &nfs::SYMLINK3args {
                where_: dirop(dir, name),
                symlink: nfs::symlinkdata3 {
                    symlink_attributes: nfs::sattr3::default(),
                    symlink_data: target.as_bytes().into(),
                },
            },
        )?;
        ok(r).map(|_| ())
    }

    pub fn link(&mut self, file: &nfs_fh3, dir: &nfs_fh3, name: &str) -> Result<(), nfsstat3> {
        let r: nfs::LINK3res = self.nfs(
            15,
            &nfs::LINK3args {
                file: file.clone(),
                link: dirop(dir, name),
            },
        )?;
        ok(r).map(|_| ())
    }

    /// Every name in a directory (READDIRPLUS, page by page).
    pub fn readdir(&mut self, dir: &nfs_fh3) -> Result<Vec<String>, nfsstat3> {
        let mut names = Vec::new();
        let mut cookie = 0;
        let mut verf = nfs::cookieverf3::default();
        for _ in 0..10_000 {
            let r: nfs::READDIRPLUS3res = self.nfs(
                17,
                &nfs::READDIRPLUS3args {
                    dir: dir.clone(),
                    cookie,
                    cookieverf: verf,
                    dircount: 4096,
                    maxcount: 16384,
                },
            )?;
            let ok = ok(r)?;
            verf = ok.cookieverf;
            for e in &ok.reply.entries.0 {
                names.push(String::from_utf8_lossy(&e.name.0).into_owned());
                cookie = e.cookie;
            }
            if ok.reply.eof {
                return Ok(names);
            }
        }
        Err(nfsstat3::NFS3ERR_SERVERFAULT)
    }

    /// The handle of `path` (slash-separated) below `root`, looked up one name at a time.
    pub fn walk(&mut self, root: &nfs_fh3, path: &str) -> Result<nfs_fh3, nfsstat3> {
        let mut fh = root.clone();
        for name in path.split('/').filter(|n| !n.is_empty()) {
            fh = self.lookup(&fh, name)?;
        }
        Ok(fh)
    }
}

pub fn dirop<'a>(dir: &nfs_fh3, name: &'a str) -> nfs::diropargs3<'a> {
    nfs::diropargs3 {
        dir: dir.clone(),
        name: name.as_bytes().into(),
    }
}

fn ok<T, E>(r: Nfs3Result<T, E>) -> Result<T, nfsstat3> {
    match r {
        Nfs3Result::Ok(v) => Ok(v),
        Nfs3Result::Err((s, _)) => Err(s),
    }
}

pub fn parse_reply(rec: &[u8]) -> std::io::Result<Reply> {
    let mut c = Cursor::new(rec);
    let (msg, _) = rpc_msg::unpack(&mut c)
        .map_err(|e| std::io::Error::other(format!("a reply that does not decode: {e}")))?;
    Ok(match msg.body {
        msg_body::REPLY(reply_body::MSG_ACCEPTED(a)) => match a.reply_data {
            accept_stat_data::SUCCESS => Reply::Success(rec[c.position() as usize..].to_vec()),
            other => Reply::Refused(format!("{other:?}")),
        },
        msg_body::REPLY(reply_body::MSG_DENIED(d)) => Reply::Denied(format!("{d:?}")),
        msg_body::CALL(_) => return Err(std::io::Error::other("a call came back")),
    })
}
