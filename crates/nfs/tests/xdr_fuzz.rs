//! The XDR decoding the server runs on what arrives (the vendored `nfs3_types`, changed to
//! read lengths only as far as the bytes go): every procedure's arguments, MOUNT's path,
//! the RPC header and the AUTH_SYS credential, fed random bytes and mutations of valid
//! encodings. Each decode returns a value or an error; none panics, and none takes long
//! (a length field is never believed before its bytes are there).

use std::io::Cursor;
use std::time::{Duration, Instant};

use nfs3_server::nfs3_types::mount::dirpath;
use nfs3_server::nfs3_types::nfs3::*;
use nfs3_server::nfs3_types::rpc::{auth_unix, rpc_msg};
use nfs3_server::nfs3_types::xdr_codec::Unpack;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Decodes `bytes` as `T`; the time it took.
fn decode<T: Unpack>(bytes: &[u8]) -> Duration {
    let t = Instant::now();
    let _ = T::unpack(&mut Cursor::new(bytes));
    t.elapsed()
}

/// Every type the server decodes from a client, on the same bytes.
fn decode_all(bytes: &[u8]) -> Duration {
    decode::<rpc_msg>(bytes)
        + decode::<auth_unix>(bytes)
        + decode::<dirpath>(bytes)
        + decode::<GETATTR3args>(bytes)
        + decode::<SETATTR3args>(bytes)
        + decode::<LOOKUP3args>(bytes)
        + decode::<ACCESS3args>(bytes)
        + decode::<READLINK3args>(bytes)
        + decode::<READ3args>(bytes)
        + decode::<WRITE3args>(bytes)
        + decode::<CREATE3args>(bytes)
        + decode::<MKDIR3args>(bytes)
        + decode::<SYMLINK3args>(bytes)
        + decode::<MKNOD3args>(bytes)
        + decode::<REMOVE3args>(bytes)
        + decode::<RMDIR3args>(bytes)
        + decode::<RENAME3args>(bytes)
        + decode::<LINK3args>(bytes)
        + decode::<READDIR3args>(bytes)
        + decode::<READDIRPLUS3args>(bytes)
        + decode::<FSSTAT3args>(bytes)
        + decode::<FSINFO3args>(bytes)
        + decode::<PATHCONF3args>(bytes)
        + decode::<COMMIT3args>(bytes)
}

fn words(ws: &[u32]) -> Vec<u8> {
    ws.iter().flat_map(|w| w.to_be_bytes()).collect()
}

/// Encodings shaped like real arguments: a 48-byte handle, then names, attributes,
/// offsets and data; and an RPC call header with an AUTH_SYS credential.
fn seeds() -> Vec<Vec<u8>> {
    let fh: Vec<u32> = std::iter::once(48).chain(1..=12).collect();
    let name = [
        5,
        u32::from_be_bytes(*b"hell"),
        u32::from_be_bytes(*b"o\0\0\0"),
    ];
    let sattr = [1, 0o644, 1, 1000, 1, 1000, 1, 0, 4096, 2, 2];
    // GETATTR, LOOKUP / REMOVE, CREATE (guarded), SETATTR (guarded), WRITE, RENAME;
    // READDIRPLUS (cookie, verifier, dircount, maxcount); an RPC call of NFS GETATTR with
    // AUTH_SYS (stamp, machine name, uid, gid, groups).
    vec![
        words(&fh),
        words(&[&fh[..], &name[..]].concat()),
        words(&[&fh[..], &name[..], &[1], &sattr[..]].concat()),
        words(&[&fh[..], &sattr[..], &[1, 5, 6]].concat()),
        words(&[&fh[..], &[0, 4096, 8, 2, 8, 0x4142_4344, 0x4546_4748]].concat()),
        words(&[&fh[..], &name[..], &fh[..], &name[..]].concat()),
        words(&[&fh[..], &[0, 7, 0, 0, 4096, 65536]].concat()),
        words(
            &[
                &[9, 0, 2, 100_003, 3, 1, 1, 32, 1, 4][..],
                &[u32::from_be_bytes(*b"host"), 1000, 1000, 2, 1000, 27][..],
                &[0, 0][..],
                &fh[..],
            ]
            .concat(),
        ),
    ]
}

#[test]
fn decoding_random_and_mutated_arguments_never_panics_nor_stalls() {
    let mut r = Rng(0x2545_f491_4f6c_dd1d);
    let seeds = seeds();
    let mut slowest = Duration::ZERO;
    for i in 0..60_000 {
        let mut b: Vec<u8> = if i % 3 == 0 {
            (0..r.next() % 300).map(|_| r.next() as u8).collect()
        } else {
            seeds[i % seeds.len()].clone()
        };
        for _ in 0..r.next() % 5 {
            if b.is_empty() {
                break;
            }
            let at = (r.next() as usize % b.len()) & !3;
            let n = (b.len() - at).min(4);
            match r.next() % 5 {
                // A word set to a large length, a small one, or anything.
                0 => b[at..at + n].copy_from_slice(&0xffff_fff0u32.to_be_bytes()[..n]),
                1 => {
                    let v = (r.next() % 6) as u32;
                    b[at..at + n].copy_from_slice(&v.to_be_bytes()[..n]);
                }
                2 => b[at] = r.next() as u8,
                3 => b.truncate(at),
                _ => {
                    let extra: Vec<u8> = (0..r.next() % 40).map(|_| r.next() as u8).collect();
                    b.splice(at..at, extra);
                }
            }
        }
        slowest = slowest.max(decode_all(&b));
    }
    assert!(
        slowest < Duration::from_millis(200),
        "a decode took {slowest:?}: a length believed before its bytes?"
    );
}
