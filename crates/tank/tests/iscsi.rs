//! The iSCSI target as real initiators use it: libiscsi's tools and its conformance suite
//! (`iscsi-test-cu`, compared with Debian's tgt serving a file in the same run), and a raw
//! initiator of the test's own for what a stock one cannot do (malformed PDUs, sequence
//! numbers out of the window, a peer vanishing mid-transfer, thousands of random CDBs, a
//! kill -9 under a writing initiator). Every server listens on 127.0.0.1.

mod common;

use std::io::{Read, Write};

use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tank_bench::run::iscsi::{
    have, is_root, pdu_bytes, read16, read_pdu, start_tgt, write16, Initiator, TGT_IQN,
};

struct Daemon {
    child: Child,
    addr: String,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        common::stop(&mut self.child);
    }
}

impl Daemon {
    fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `tank serve --iscsi` on a free port of 127.0.0.1; returns once it listens.
fn serve(data: &Path) -> Daemon {
    let (child, addr, _) = common::serve_until_listening(
        data,
        &["serve", "--no-api", "--iscsi", "127.0.0.1:0"],
        "iscsi: ",
    );
    Daemon { child, addr }
}

fn tank(data: &Path, args: &[&str]) -> String {
    common::tank(data, args, None)
}

/// Runs a libiscsi tool on `url` as the initiator `iqn`: its exit status and output.
fn as_initiator(tool: &str, iqn: &str, url: &str) -> (bool, String) {
    run(&[tool, "-i", iqn, url], 30)
}

/// Runs a libiscsi tool with a time limit; its exit status and output.
fn run(args: &[&str], secs: u64) -> (bool, String) {
    let mut child = Command::new("timeout")
        .arg(secs.to_string())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let ok = child.wait().unwrap().success();
    (ok, out + &err)
}

/// A small xorshift generator: the same sequence for the same seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

const SYNC_CACHE10: [u8; 10] = [0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0];
const TUR: [u8; 6] = [0; 6];

/// A pool's data directory with a sparse volume shared as LUN 0 of `iqn`.
fn volume(data: &Path, vol: &str, size: &str, iqn: &str, opts: &[&str]) {
    tank(data, &["dataset", "create", "-V", size, "-s", vol]);
    let mut args = vec!["share", "add", "iscsi", iqn, vol];
    for o in opts {
        args.push("-o");
        args.push(o);
    }
    tank(data, &args);
}

/// The counts of an `iscsi-test-cu` run: tests run, passed, failed, and the skips for
/// commands the target answered INVALID COMMAND OPERATION CODE.
#[derive(Debug)]
struct Suite {
    ran: u32,
    passed: u32,
    failed: u32,
    not_implemented: usize,
}

fn suite(url: &str, multipath: Option<&str>, tests: &str) -> (Suite, String) {
    let mut args = vec!["iscsi-test-cu", "-d", "-t", tests, "-n", url];
    if let Some(m) = multipath {
        args.push(m);
    }
    let (_, out) = run(&args, 900);
    let tests = out
        .lines()
        .find(|l| l.trim_start().starts_with("tests "))
        .unwrap_or_else(|| panic!("no summary from iscsi-test-cu:\n{out}"));
    let n: Vec<u32> = tests
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let not_implemented = out.matches("is not implemented").count();
    (
        Suite {
            ran: n[1],
            passed: n[2],
            failed: n[3],
            not_implemented,
        },
        out,
    )
}

#[test]
fn libiscsi_conformance_suite_against_tgt() {
    if !have("iscsi-test-cu") {
        common::skip(
            "libiscsi_conformance_suite_against_tgt",
            "iscsi-test-cu (libiscsi-bin) is not installed",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let d = serve(&data);
    let iqn = "iqn.2026-11.org.tank:conformance";
    volume(&data, "tank/cu", "256M", iqn, &[]);
    let url = format!("iscsi://{}/{iqn}/0", d.addr);
    // The second URL (another session to the same LUN) runs the multipath tests too.
    let (ours, out) = suite(&url, Some(&url), "ALL");
    eprintln!("tank: {ours:?}");
    assert_eq!(ours.ran, 230, "{out}");
    assert_eq!(ours.failed, 0, "{out}");
    assert_eq!(ours.passed, 230);
    // Every command the suite tries is implemented (none answered INVALID COMMAND
    // OPERATION CODE).
    assert_eq!(ours.not_implemented, 0, "{out}");
    match start_tgt(&dir.path().join("tgt.img"), 256 << 20) {
        Err(why) => common::skip(
            "libiscsi_conformance_suite_against_tgt (tgt's run)",
            &why.to_string(),
        ),
        Ok(tgt) => {
            let turl = format!("iscsi://127.0.0.1:{}/{TGT_IQN}/1", tgt.port);
            let (theirs, tout) = suite(&turl, Some(&turl), "ALL");
            eprintln!("tgt: {theirs:?}");
            assert!(theirs.ran == 230, "tgt's run: {tout}");
            assert!(ours.passed >= theirs.passed);
            assert!(
                ours.not_implemented < theirs.not_implemented,
                "tank skips {} tests as unimplemented commands, tgt {}",
                ours.not_implemented,
                theirs.not_implemented
            );
        }
    }
}

#[test]
fn discovery_chap_digests_and_libiscsi_tools() {
    if !have("iscsi-ls") {
        common::skip(
            "discovery_chap_digests_and_libiscsi_tools",
            "libiscsi-bin is not installed",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let d = serve(&data);
    volume(&data, "tank/open", "64M", "iqn.2026-11.org.tank:open", &[]);
    volume(
        &data,
        "tank/only",
        "64M",
        "iqn.2026-11.org.tank:only",
        &["initiators=iqn.2026-11.org.test:allowed"],
    );
    common::tank(&data, &["user", "add", "esx"], Some("password1\n"));
    common::tank(&data, &["user", "add", "array"], Some("password2\n"));
    tank(&data, &["user", "set", "esx", "chap_secret=esx-secret-123"]);
    common::tank(
        &data,
        &["user", "set", "array", "chap_secret=-"],
        Some("array-secret-456\n"),
    );
    volume(
        &data,
        "tank/chap",
        "64M",
        "iqn.2026-11.org.tank:chap",
        &["chap_user=esx", "mutual_chap_user=array"],
    );
    let a = &d.addr;

    // Discovery lists what each initiator may log in to.
    let (ok, out) = as_initiator(
        "iscsi-ls",
        "iqn.2026-11.org.test:other",
        &format!("iscsi://{a}"),
    );
    assert!(ok, "{out}");
    assert!(out.contains("iqn.2026-11.org.tank:open"), "{out}");
    assert!(out.contains("iqn.2026-11.org.tank:chap"), "{out}");
    assert!(!out.contains("iqn.2026-11.org.tank:only"), "{out}");
    let (ok, out) = as_initiator(
        "iscsi-ls",
        "iqn.2026-11.org.test:allowed",
        &format!("iscsi://{a}"),
    );
    assert!(ok && out.contains("iqn.2026-11.org.tank:only"), "{out}");
    // And login follows the same rule.
    let (ok, out) = as_initiator(
        "iscsi-inq",
        "iqn.2026-11.org.test:other",
        &format!("iscsi://{a}/iqn.2026-11.org.tank:only/0"),
    );
    assert!(!ok && out.contains("Authorization failure"), "{out}");
    let (ok, out) = as_initiator(
        "iscsi-inq",
        "iqn.2026-11.org.test:allowed",
        &format!("iscsi://{a}/iqn.2026-11.org.tank:only/0"),
    );
    assert!(ok && out.contains("Vendor:TANK"), "{out}");

    // Inquiry and capacity.
    let (ok, out) = run(
        &[
            "iscsi-readcapacity16",
            &format!("iscsi://{a}/iqn.2026-11.org.tank:open/0"),
        ],
        30,
    );
    assert!(ok, "{out}");
    assert!(out.contains("Total size:67108864"), "{out}");
    assert!(out.contains("LBPME:1"), "{out}");

    // CHAP: none, a wrong secret, the right one; mutual with the right and a wrong secret.
    let chap = |user: &str, extra: &str| {
        run(
            &[
                "iscsi-inq",
                &format!("iscsi://{user}{a}/iqn.2026-11.org.tank:chap/0{extra}"),
            ],
            30,
        )
    };
    let (ok, out) = chap("", "");
    assert!(!ok && out.contains("Authentication failure"), "{out}");
    let (ok, out) = chap("esx%esx-secret-999@", "");
    assert!(!ok && out.contains("Authentication failure"), "{out}");
    let (ok, out) = chap("array%array-secret-456@", "");
    assert!(!ok, "an account not in chap_users: {out}");
    let (ok, out) = chap("esx%esx-secret-123@", "");
    assert!(ok && out.contains("Vendor:TANK"), "{out}");
    let (ok, out) = chap(
        "esx%esx-secret-123@",
        "?target_user=array&target_password=array-secret-456",
    );
    assert!(ok && out.contains("Vendor:TANK"), "{out}");
    let (ok, out) = chap(
        "esx%esx-secret-123@",
        "?target_user=array&target_password=not-the-secret",
    );
    assert!(
        !ok,
        "a target that does not know the secret must fail mutual CHAP: {out}"
    );

    // Header and data digests (CRC32C): writes and reads through libiscsi's own suite.
    let url =
        format!("iscsi://{a}/iqn.2026-11.org.tank:open/0?header_digest=crc32c&data_digest=crc32c");
    let (ok, out) = run(&["iscsi-inq", &url], 30);
    assert!(ok && out.contains("Vendor:TANK"), "{out}");
    let (s, out) = suite(&url, None, "ALL.Write16");
    assert!(s.ran >= 5 && s.failed == 0, "{out}");

    // iscsi-perf reads the volume for a second.
    let (_, out) = run(
        &[
            "timeout",
            "3",
            "iscsi-perf",
            "-m",
            "8",
            &format!("iscsi://{a}/iqn.2026-11.org.tank:open/0"),
        ],
        10,
    );
    assert!(out.contains("iops average"), "{out}");
}

fn used(data: &Path, ds: &str) -> u64 {
    let out = tank(data, &["dataset", "get", "-H", "-p", "used", ds]);
    out.split('\t').nth(2).unwrap().trim().parse().unwrap()
}

#[test]
fn luns_change_live_unmap_frees_space_and_readonly_is_enforced() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let d = serve(&data);
    let iqn = "iqn.2026-11.org.tank:live";
    volume(&data, "tank/live0", "64M", iqn, &[]);
    let mut ini = Initiator::login(&d.addr, iqn, "iqn.2026-11.org.test:raw").unwrap();
    assert_eq!(ini.cmd(0, &TUR, &[], 0).unwrap().status, 0);

    // A LUN added while logged in: REPORTED LUNS DATA HAS CHANGED, then both are listed.
    tank(
        &data,
        &["dataset", "create", "-V", "32M", "-s", "tank/live1"],
    );
    tank(
        &data,
        &[
            "share",
            "add",
            "iscsi",
            iqn,
            "tank/live1",
            "-o",
            "lun=1",
            "-o",
            "ro=on",
        ],
    );
    let r = ini.cmd(0, &TUR, &[], 0).unwrap();
    assert_eq!((r.status, r.sense), (2, Some((6, 0x3f, 0x0e))));
    let mut report = [0u8; 12];
    report[0] = 0xa0;
    report[9] = 64;
    let r = ini.cmd(0, &report, &[], 64).unwrap();
    assert_eq!(r.status, 0);
    assert_eq!(&r.data[..4], &16u32.to_be_bytes(), "two LUNs");
    assert_eq!(ini.cmd(0, &TUR, &[], 0).unwrap().status, 0);

    // The read-only LUN refuses writes with DATA PROTECT, WRITE PROTECTED.
    let r = ini.cmd(1, &write16(0, 8, false), &[7u8; 4096], 0).unwrap();
    assert_eq!((r.status, r.sense), (2, Some((7, 0x27, 0))));
    // A LUN that is not there: LOGICAL UNIT NOT SUPPORTED.
    let r = ini.cmd(5, &TUR, &[], 0).unwrap();
    assert_eq!((r.status, r.sense), (2, Some((5, 0x25, 0))));
    // Out of range, with the wrap of LBA + length that a 64-bit LBA invites.
    let r = ini.cmd(0, &read16(u64::MAX - 1, 8), &[], 4096).unwrap();
    assert_eq!((r.status, r.sense), (2, Some((5, 0x21, 0))));

    // 16 MiB written and synced, then unmapped: the volume's used space goes down, the
    // blocks read as zeros and GET LBA STATUS says deallocated.
    let mut rng = Rng(0x1234_5678);
    let chunk = rng.bytes(1 << 20);
    let before = used(&data, "tank/live0");
    for i in 0..16u64 {
        let r = ini
            .cmd(0, &write16(i * 2048, 2048, false), &chunk, 0)
            .unwrap();
        assert_eq!(r.status, 0, "{r:?}");
    }
    assert_eq!(ini.cmd(0, &SYNC_CACHE10, &[], 0).unwrap().status, 0);
    let r = ini.cmd(0, &read16(5 * 2048, 2048), &[], 1 << 20).unwrap();
    assert_eq!(r.data, chunk);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut written = used(&data, "tank/live0");
    while written < before + (15 << 20) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        written = used(&data, "tank/live0");
    }
    assert!(
        written >= before + (15 << 20),
        "used {written} after writing 16 MiB"
    );
    let mut unmap = [0u8; 10];
    unmap[0] = 0x42;
    unmap[8] = 24;
    let mut param = vec![0u8; 24];
    param[0..2].copy_from_slice(&22u16.to_be_bytes());
    param[2..4].copy_from_slice(&16u16.to_be_bytes());
    param[8..16].copy_from_slice(&0u64.to_be_bytes());
    param[16..20].copy_from_slice(&(16u32 * 2048).to_be_bytes());
    assert_eq!(ini.cmd(0, &unmap, &param, 0).unwrap().status, 0);
    assert_eq!(ini.cmd(0, &SYNC_CACHE10, &[], 0).unwrap().status, 0);
    let r = ini.cmd(0, &read16(5 * 2048, 2048), &[], 1 << 20).unwrap();
    assert!(r.data.iter().all(|b| *b == 0));
    let mut lbas = [0u8; 16];
    lbas[0] = 0x9e;
    lbas[1] = 0x12;
    lbas[13] = 64;
    let r = ini.cmd(0, &lbas, &[], 64).unwrap();
    assert_eq!(r.status, 0);
    assert_eq!(
        r.data[20],
        1,
        "the first descriptor is deallocated: {:?}",
        &r.data[..24]
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut after = used(&data, "tank/live0");
    while after > before + (1 << 20) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        after = used(&data, "tank/live0");
    }
    eprintln!("used: {before} before, {written} written, {after} unmapped");
    assert!(
        after <= before + (1 << 20),
        "used {after} after unmapping 16 MiB"
    );

    // The share removed while logged in: the LUN is gone for the next command.
    tank(&data, &["share", "remove", &format!("{iqn}/1")]);
    let r = ini.cmd(0, &TUR, &[], 0).unwrap();
    assert_eq!((r.status, r.sense), (2, Some((6, 0x3f, 0x0e))));
    let r = ini.cmd(1, &TUR, &[], 0).unwrap();
    assert_eq!((r.status, r.sense), (2, Some((5, 0x25, 0))));
    // A destroy of a served volume is refused as busy.
    let o = Command::new(env!("CARGO_BIN_EXE_tank"))
        .args(["dataset", "destroy", "tank/live0"])
        .env("TANK_DATA_DIR", &data)
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("in use by front ends"),
        "{o:?}"
    );
}

/// Reads from the socket until it closes or `secs` pass; whether it closed.
fn closes_within(s: &mut TcpStream, secs: u64) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(secs))).unwrap();
    let mut buf = [0u8; 4096];
    let until = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < until {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
    false
}

#[test]
fn malformed_pdus_and_random_commands_get_clean_answers() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let d = serve(&data);
    let iqn = "iqn.2026-11.org.tank:bad";
    volume(&data, "tank/bad", "32M", iqn, &[]);
    let a = d.addr.clone();

    // A SCSI command before login: a Reject, then the connection closes.
    let mut s = TcpStream::connect(&a).unwrap();
    let mut cmd = [0u8; 48];
    cmd[0] = 0x01;
    cmd[1] = 0x80;
    s.write_all(&pdu_bytes(&cmd, &[])).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let r = read_pdu(&mut s).unwrap();
    assert_eq!(r.bhs[0] & 0x3f, 0x3f, "a Reject");
    assert!(closes_within(&mut s, 10));

    // A login whose data segment claims 16 MiB: closed before anything is read.
    let mut s = TcpStream::connect(&a).unwrap();
    let mut login = [0u8; 48];
    login[0] = 0x43;
    login[1] = 0x87;
    login[5] = 0xff;
    login[6] = 0xff;
    login[7] = 0xff;
    s.write_all(&login).unwrap();
    assert!(closes_within(&mut s, 10));

    // Bytes that are no PDU at all, and a connection that goes away mid-header.
    let mut rng = Rng(0xdead_beef);
    for _ in 0..50 {
        let mut s = TcpStream::connect(&a).unwrap();
        let n = (rng.next() % 200) as usize;
        let _ = s.write_all(&rng.bytes(n));
        drop(s);
    }

    // Logged in: an unknown opcode is rejected and the session goes on.
    let mut ini = Initiator::login(&a, iqn, "iqn.2026-11.org.test:bad").unwrap();
    let mut odd = [0u8; 48];
    odd[0] = 0x1c;
    odd[1] = 0x80;
    ini.stream.write_all(&pdu_bytes(&odd, &[])).unwrap();
    let r = read_pdu(&mut ini.stream).unwrap();
    assert_eq!((r.bhs[0] & 0x3f, r.bhs[2]), (0x3f, 0x05));
    assert_eq!(ini.cmd(0, &TUR, &[], 0).unwrap().status, 0);

    // A command far beyond MaxCmdSN is ignored (no answer); the next in-window one works.
    let saved = ini.cmd_sn;
    ini.cmd_sn = saved.wrapping_add(100_000);
    let b = ini.cmd_pdu(0, &TUR, 0, false, false);
    ini.stream.write_all(&pdu_bytes(&b, &[])).unwrap();
    ini.stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    assert!(
        read_pdu(&mut ini.stream).is_err(),
        "no answer outside the window"
    );
    ini.stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    ini.cmd_sn = saved;
    assert_eq!(ini.cmd(0, &TUR, &[], 0).unwrap().status, 0);

    // Known data, then 3,000 random CDBs (opcodes the unit knows and others, random
    // fields, random data-out): each gets a status, none takes the target down.
    let known = Rng(77).bytes(64 * 1024);
    assert_eq!(
        ini.cmd(0, &write16(60000, 128, true), &known, 0)
            .unwrap()
            .status,
        0
    );
    let ops = [
        0x00u8, 0x03, 0x08, 0x0a, 0x12, 0x15, 0x1a, 0x1b, 0x1e, 0x25, 0x28, 0x2a, 0x2e, 0x2f, 0x34,
        0x35, 0x37, 0x41, 0x42, 0x55, 0x5a, 0x5e, 0x5f, 0x88, 0x89, 0x8a, 0x8b, 0x8e, 0x8f, 0x90,
        0x91, 0x93, 0x9c, 0x9e, 0xa0, 0xa3, 0xa8, 0xaa, 0xae, 0xaf, 0xb7, 0xc0, 0xff, 0x7f,
    ];
    let mut counts = std::collections::BTreeMap::new();
    for i in 0..3000 {
        let mut cdb = rng.bytes(16);
        cdb[0] = ops[(rng.next() % ops.len() as u64) as usize];
        // Mostly inside the 32 MiB volume but below the known data, sometimes anywhere.
        if i % 4 != 0
            && matches!(
                cdb[0],
                0x88 | 0x8a | 0x8e | 0x8f | 0x89 | 0x8b | 0x93 | 0x9c | 0x90 | 0x91
            )
        {
            cdb[2..10].copy_from_slice(&(rng.next() % 50000).to_be_bytes());
            cdb[10..14].copy_from_slice(&((rng.next() % 64) as u32).to_be_bytes());
            cdb[1] &= 0x1f;
        }
        if matches!(cdb[0], 0x5f | 0x16 | 0x17 | 0x1b) {
            // Not reservations nor stops here: they would only make later commands conflict.
            cdb[0] = 0x00;
        }
        let out_len = match rng.next() % 4 {
            0 => 0,
            1 => 512,
            2 => (rng.next() % 70_000) as usize,
            _ => 24,
        };
        let data_out = rng.bytes(out_len);
        let read_len = if out_len == 0 {
            (rng.next() % 65536) as u32
        } else {
            0
        };
        let r = ini
            .cmd(0, &cdb, &data_out, read_len)
            .unwrap_or_else(|e| panic!("CDB {cdb:02x?} ({out_len} bytes out): {e}"));
        *counts.entry(r.status).or_insert(0) += 1;
        if r.status == 2 {
            let (key, _, _) = r.sense.expect("sense with a check condition");
            assert!(
                key != 0 && key != 0x4 || r.sense.is_some_and(|s| s.0 == 6),
                "{cdb:02x?} {r:?}"
            );
        }
    }
    eprintln!("statuses of 3,000 random CDBs: {counts:?}");
    assert!(counts.get(&0).is_some_and(|n| *n > 100), "{counts:?}");
    assert!(counts.get(&2).is_some_and(|n| *n > 100), "{counts:?}");
    let r = ini.cmd(0, &read16(60000, 128), &[], 65536).unwrap();
    assert_eq!(
        r.data, known,
        "data outside what the random commands could reach"
    );

    // An initiator that vanishes mid-transfer: a 4 MiB write whose R2T is never answered.
    let mut gone = Initiator::login(&a, iqn, "iqn.2026-11.org.test:gone").unwrap();
    let b = gone.cmd_pdu(0, &write16(0, 8192, false), 4 << 20, false, true);
    gone.stream
        .write_all(&pdu_bytes(&b, &[1u8; 65536]))
        .unwrap();
    let r = read_pdu(&mut gone.stream).unwrap();
    assert_eq!(r.bhs[0] & 0x3f, 0x31, "an R2T for the rest");
    drop(gone);
    // And random PDUs after a login: each answered, rejected or the connection closed.
    for round in 0..200 {
        let mut x = Initiator::login(&a, iqn, "iqn.2026-11.org.test:fuzz").unwrap();
        let mut bhs = [0u8; 48];
        bhs.copy_from_slice(&rng.bytes(48));
        bhs[4] = (rng.next() % 3) as u8;
        let n = (rng.next() % 1024) as usize;
        bhs[5] = 0;
        bhs[6] = (n >> 8) as u8;
        bhs[7] = n as u8;
        if round % 2 == 0 {
            bhs[0] = [0x00u8, 0x01, 0x02, 0x04, 0x05, 0x06, 0x10, 0x03][(rng.next() % 8) as usize];
        }
        let mut wire = bhs.to_vec();
        wire.extend_from_slice(&rng.bytes(usize::from(bhs[4]) * 4 + n + (4 - n % 4) % 4));
        let _ = x.stream.write_all(&wire);
        x.stream
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let _ = read_pdu(&mut x.stream);
    }
    // The target still serves, and the known data is intact.
    let mut ini = Initiator::login(&a, iqn, "iqn.2026-11.org.test:after").unwrap();
    let r = ini.cmd(0, &read16(60000, 128), &[], 65536).unwrap();
    assert_eq!(r.data, known);
}

#[test]
fn acknowledged_writes_survive_a_kill_and_snapshots_stay_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let d = serve(&data);
    let iqn = "iqn.2026-11.org.tank:crash";
    volume(&data, "tank/crash", "128M", iqn, &[]);
    // A pattern, snapshotted.
    let mut ini = Initiator::login(&d.addr, iqn, "iqn.2026-11.org.test:crash").unwrap();
    let base = Rng(5).bytes(1 << 20);
    for i in 0..8u64 {
        assert_eq!(
            ini.cmd(0, &write16(i * 2048, 2048, false), &base, 0)
                .unwrap()
                .status,
            0
        );
    }
    assert_eq!(ini.cmd(0, &SYNC_CACHE10, &[], 0).unwrap().status, 0);
    tank(&data, &["snapshot", "tank/crash@before"]);
    // A writer: 64 KiB chunks over the first 8 MiB (the snapshot's) and beyond, each
    // chunk written once; odd ones with FUA, a SYNCHRONIZE CACHE after every 8. What was
    // answered as durable is recorded; the daemon is killed while it writes.
    let (tx, rx) = mpsc::channel::<(u64, Vec<u8>)>();
    let addr = d.addr.clone();
    let writer = std::thread::spawn(move || {
        let mut ini = Initiator::login(&addr, iqn, "iqn.2026-11.org.test:writer").unwrap();
        let mut rng = Rng(99);
        let mut unsynced = Vec::new();
        for k in 0..1500u64 {
            let chunk = rng.bytes(65536);
            let fua = k % 2 == 1;
            match ini.cmd(0, &write16(k * 128, 128, fua), &chunk, 0) {
                Ok(r) if r.status == 0 => {}
                _ => return,
            }
            if fua {
                let _ = tx.send((k, chunk));
            } else {
                unsynced.push((k, chunk));
            }
            if k % 8 == 7 {
                match ini.cmd(0, &SYNC_CACHE10, &[], 0) {
                    Ok(r) if r.status == 0 => {
                        for u in unsynced.drain(..) {
                            let _ = tx.send(u);
                        }
                    }
                    _ => return,
                }
            }
        }
    });
    std::thread::sleep(Duration::from_millis(2500));
    d.kill9();
    let _ = writer.join();
    let durable: Vec<(u64, Vec<u8>)> = rx.try_iter().collect();
    assert!(
        durable.len() > 20,
        "only {} durable writes before the kill",
        durable.len()
    );
    let d = serve(&data);
    let mut ini = Initiator::login(&d.addr, iqn, "iqn.2026-11.org.test:check").unwrap();
    for (k, chunk) in &durable {
        let r = ini.cmd(0, &read16(k * 128, 128), &[], 65536).unwrap();
        assert_eq!(r.status, 0);
        assert!(
            r.data == *chunk,
            "chunk {k}, answered as durable, is not there after the kill"
        );
    }
    // The snapshot, through a clone served as LUN 1, still holds the pattern.
    tank(&data, &["clone", "tank/crash@before", "tank/crash-was"]);
    tank(
        &data,
        &[
            "share",
            "add",
            "iscsi",
            iqn,
            "tank/crash-was",
            "-o",
            "lun=1",
        ],
    );
    let mut ini = Initiator::login(&d.addr, iqn, "iqn.2026-11.org.test:check2").unwrap();
    for i in 0..8u64 {
        let r = ini.cmd(1, &read16(i * 2048, 2048), &[], 1 << 20).unwrap();
        if r.status == 2 {
            // The unit attention of the new LUN first.
            let r = ini.cmd(1, &read16(i * 2048, 2048), &[], 1 << 20).unwrap();
            assert!(r.data == base, "snapshot MiB {i} changed");
            continue;
        }
        assert!(r.data == base, "snapshot MiB {i} changed");
    }
    eprintln!(
        "{} writes answered as durable, all there after kill -9",
        durable.len()
    );
}

/// Why the Linux kernel initiator cannot run here, if it cannot.
fn kernel_initiator_missing() -> Option<String> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let module = Path::new("/sys/module/iscsi_tcp").exists()
        || Command::new("sh")
            .args([
                "-c",
                &format!(
                    "find /lib/modules/{} -name 'iscsi_tcp.ko*' 2>/dev/null | grep -q .",
                    release.trim()
                ),
            ])
            .status()
            .is_ok_and(|s| s.success());
    if !module {
        return Some(
            "the kernel has no iscsi_tcp module (a container or a kernel built without it)".into(),
        );
    }
    if !have("iscsiadm") {
        return Some("open-iscsi (iscsiadm) is not installed".into());
    }
    if !is_root() {
        return Some("the kernel initiator needs root".into());
    }
    None
}

#[test]
fn linux_kernel_initiator() {
    if let Some(why) = kernel_initiator_missing() {
        common::skip("linux_kernel_initiator", &why);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let d = serve(&data);
    let iqn = "iqn.2026-11.org.tank:kernel";
    volume(&data, "tank/kernel", "64M", iqn, &[]);
    let portal = d.addr.clone();
    let adm = |args: &[&str]| {
        let o = Command::new("iscsiadm").args(args).output().unwrap();
        assert!(o.status.success(), "iscsiadm {args:?}: {o:?}");
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let _ = Command::new("modprobe").arg("iscsi_tcp").status();
    let out = adm(&["-m", "discovery", "-t", "sendtargets", "-p", &portal]);
    assert!(out.contains(iqn), "{out}");
    adm(&["-m", "node", "-T", iqn, "-p", &portal, "--login"]);
    let (host, port) = portal.rsplit_once(':').unwrap();
    let link = format!("/dev/disk/by-path/ip-{host}:{port}-iscsi-{iqn}-lun-0");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !Path::new(&link).exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let result = std::panic::catch_unwind(|| {
        let data = Rng(3).bytes(4 << 20);
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&link)
            .unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
        drop(f);
        let _ = Command::new("blockdev")
            .args(["--flushbufs", &link])
            .status();
        let mut back = vec![0u8; 4 << 20];
        std::fs::File::open(&link)
            .unwrap()
            .read_exact(&mut back)
            .unwrap();
        assert!(back == data, "the kernel read back what it wrote");
    });
    adm(&["-m", "node", "-T", iqn, "-p", &portal, "--logout"]);
    let _ = Command::new("iscsiadm")
        .args(["-m", "node", "-T", iqn, "-p", &portal, "-o", "delete"])
        .output();
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

#[test]
fn a_block_the_pool_cannot_read_is_a_medium_error_and_the_rest_still_reads() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // One disk, so that a damaged data block has no second copy to heal from (metadata
    // keeps its extra copies and the pool still imports).
    let disk = dir.path().join("d0");
    tank(
        &data,
        &[
            "pool",
            "create",
            "--size",
            "256M",
            "tank",
            disk.to_str().unwrap(),
        ],
    );
    let iqn = "iqn.2026-11.org.tank:damaged";
    let d = serve(&data);
    volume(&data, "tank/vol", "64M", iqn, &[]);
    let mut ini = Initiator::login(&d.addr, iqn, "iqn.2026-11.org.test:damaged").unwrap();
    // 1 MiB of random data (nothing for compression to take), made durable.
    let pattern = Rng(77).bytes(1 << 20);
    let r = ini.cmd(0, &write16(0, 2048, true), &pattern, 0).unwrap();
    assert_eq!(r.status, 0);
    assert_eq!(ini.cmd(0, &SYNC_CACHE10, &[], 0).unwrap().status, 0);
    drop(ini);
    drop(d);
    // Damage, on the disk, every 4 KiB piece of the volume's first 64 KiB (its first four
    // 16K blocks): one byte inverted in each place the piece is found.
    let first: std::collections::HashSet<&[u8]> = pattern[..65536].chunks(4096).collect();
    let mut image = std::fs::read(&disk).unwrap();
    let mut damaged = 0;
    for piece in image.chunks_mut(4096) {
        if first.contains(&piece[..]) {
            piece[100] ^= 0xff;
            damaged += 1;
        }
    }
    assert!(
        damaged >= 16,
        "only {damaged} pieces of the data found on the disk"
    );
    std::fs::write(&disk, &image).unwrap();
    drop(image);

    let d = serve(&data);
    let mut ini = Initiator::login(&d.addr, iqn, "iqn.2026-11.org.test:reader").unwrap();
    // The damaged range: CHECK CONDITION, MEDIUM ERROR, UNRECOVERED READ ERROR; never data.
    for (lba, blocks) in [(0u64, 128u32), (40, 8), (0, 2048)] {
        let r = ini.cmd(0, &read16(lba, blocks), &[], blocks * 512).unwrap();
        assert_eq!(
            r.status, 2,
            "reading {blocks} blocks at {lba} is not refused"
        );
        assert_eq!(
            r.sense,
            Some((0x3, 0x11, 0x00)),
            "reading {blocks} blocks at {lba}"
        );
    }
    // The rest of the volume reads back whole.
    let r = ini
        .cmd(0, &read16(128, 2048 - 128), &[], (2048 - 128) * 512)
        .unwrap();
    assert_eq!(r.status, 0);
    assert!(r.data == pattern[65536..], "the undamaged data changed");
    // The pool says what it found.
    let status = tank(&data, &["pool", "status", "-v", "tank"]);
    assert!(
        status.contains("tank/vol:") && status.contains("Applications may be affected"),
        "pool status does not report the damage:\n{status}"
    );
    eprintln!("{damaged} damaged pieces; reads of them answered MEDIUM ERROR\n{status}");
}

/// The NAA designator a LUN reports in INQUIRY page 83h.
fn naa_of(ini: &mut Initiator, lun: u8) -> Vec<u8> {
    let r = ini.cmd(lun, &[0x12, 1, 0x83, 0, 255, 0], &[], 255).unwrap();
    assert_eq!(r.status, 0);
    // Page header (4), then the first designation descriptor: NAA, 8 bytes.
    assert_eq!(r.data[5] & 0x0f, 3, "the first designator is not an NAA");
    r.data[8..8 + usize::from(r.data[7])].to_vec()
}

/// An EXTENDED COPY (LID1) CDB and parameter list: copy targets named by NAA, one
/// block-to-block segment (source index, destination index, blocks, source LBA,
/// destination LBA), results held under `list_id`.
fn xcopy(list_id: u8, targets: &[&[u8]], seg: (u16, u16, u16, u64, u64)) -> ([u8; 16], Vec<u8>) {
    let mut tl = Vec::new();
    for naa in targets {
        let mut t = vec![0u8; 32];
        t[0] = 0xe4;
        t[4] = 0x01; // binary
        t[5] = 0x03; // NAA, associated with the logical unit
        t[7] = naa.len() as u8;
        t[8..8 + naa.len()].copy_from_slice(naa);
        t[29..32].copy_from_slice(&[0, 2, 0]); // 512-byte blocks
        tl.extend_from_slice(&t);
    }
    let mut s = vec![0u8; 28];
    s[0] = 0x02;
    s[2..4].copy_from_slice(&0x18u16.to_be_bytes());
    s[4..6].copy_from_slice(&seg.0.to_be_bytes());
    s[6..8].copy_from_slice(&seg.1.to_be_bytes());
    s[10..12].copy_from_slice(&seg.2.to_be_bytes());
    s[12..20].copy_from_slice(&seg.3.to_be_bytes());
    s[20..28].copy_from_slice(&seg.4.to_be_bytes());
    let mut p = vec![0u8; 16];
    p[0] = list_id;
    p[2..4].copy_from_slice(&(tl.len() as u16).to_be_bytes());
    p[8..12].copy_from_slice(&(s.len() as u32).to_be_bytes());
    p.extend_from_slice(&tl);
    p.extend_from_slice(&s);
    let mut cdb = [0u8; 16];
    cdb[0] = 0x83;
    cdb[10..14].copy_from_slice(&(p.len() as u32).to_be_bytes());
    (cdb, p)
}

#[test]
fn extended_copy_between_luns_and_within_one() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let d = serve(&data);
    let iqn = "iqn.2026-11.org.tank:copies";
    let other = "iqn.2026-11.org.tank:elsewhere";
    volume(&data, "tank/a", "64M", iqn, &[]);
    volume(&data, "tank/b", "64M", iqn, &["lun=1"]);
    volume(&data, "tank/ro", "64M", iqn, &["lun=2", "ro=on"]);
    volume(&data, "tank/c", "64M", other, &[]);
    let mut ini = Initiator::login(&d.addr, iqn, "iqn.2026-11.org.test:copier").unwrap();
    let (a, b, ro) = (
        naa_of(&mut ini, 0),
        naa_of(&mut ini, 1),
        naa_of(&mut ini, 2),
    );
    let c = {
        let mut o = Initiator::login(&d.addr, other, "iqn.2026-11.org.test:other").unwrap();
        naa_of(&mut o, 0)
    };
    let pattern = Rng(31).bytes(1 << 20);
    assert_eq!(
        ini.cmd(0, &write16(0, 2048, false), &pattern, 0)
            .unwrap()
            .status,
        0
    );
    // Sent to LUN 0, from LUN 0 to LUN 1 of the same target.
    let (cdb, p) = xcopy(5, &[&a, &b], (0, 1, 2048, 0, 4096));
    let r = ini.cmd(0, &cdb, &p, 0).unwrap();
    assert_eq!((r.status, r.sense), (0, None));
    let r = ini.cmd(1, &read16(4096, 2048), &[], 1 << 20).unwrap();
    assert!(r.data == pattern, "LUN 1 does not hold the copy");
    // Its results, held under list 5: completed, 1,024 KiB; then let go.
    let mut rcr = [0u8; 16];
    rcr[0] = 0x84;
    rcr[2] = 5;
    rcr[10..14].copy_from_slice(&1024u32.to_be_bytes());
    let r = ini.cmd(0, &rcr, &[], 1024).unwrap();
    assert_eq!(r.status, 0);
    assert_eq!(r.data[4], 0x01, "copy status: {:?}", r.data);
    assert_eq!(&r.data[5..7], &[0, 1]);
    assert_eq!(&r.data[8..12], &1024u32.to_be_bytes());
    assert_eq!(ini.cmd(0, &rcr, &[], 1024).unwrap().status, 2);
    // Within LUN 0, onto an overlapping range above the source: the source as it was.
    let (cdb, p) = xcopy(6, &[&a], (0, 0, 2048, 0, 512));
    assert_eq!(ini.cmd(0, &cdb, &p, 0).unwrap().status, 0);
    let r = ini.cmd(0, &read16(0, 2560), &[], 2560 * 512).unwrap();
    assert!(r.data[..512 * 512] == pattern[..512 * 512]);
    assert!(
        r.data[512 * 512..] == pattern[..],
        "an overlapping copy read what it wrote"
    );
    // The same volume shared again as LUN 3 (with the same designators: it is the same
    // unit's data): a copy from LUN 0 onto an overlapping higher range named through LUN 3
    // is a copy within one volume, and reads the source before writing over it.
    tank(
        &data,
        &["share", "add", "iscsi", iqn, "tank/a", "-o", "lun=3"],
    );
    ini.clear_attentions(0).unwrap();
    let a3 = naa_of(&mut ini, 3);
    let before = ini.cmd(0, &read16(0, 4096), &[], 4096 * 512).unwrap().data;
    let (cdb, p) = xcopy(10, &[&a, &a3], (0, 1, 4096, 0, 100));
    assert_eq!(ini.cmd(0, &cdb, &p, 0).unwrap().status, 0);
    let r = ini.cmd(0, &read16(100, 4096), &[], 4096 * 512).unwrap();
    assert!(
        r.data == before,
        "a copy between two LUNs of one volume read what it wrote"
    );
    // Onto a read-only LUN: write protected, nothing written.
    let (cdb, p) = xcopy(7, &[&a, &ro], (0, 1, 8, 0, 0));
    let r = ini.cmd(0, &cdb, &p, 0).unwrap();
    assert_eq!((r.status, r.sense), (2, Some((0x7, 0x27, 0))));
    let r = ini.cmd(2, &read16(0, 8), &[], 4096).unwrap();
    assert!(r.data.iter().all(|x| *x == 0));
    // A unit of another target, which this session cannot see: not reachable, untouched.
    let (cdb, p) = xcopy(8, &[&a, &c], (0, 1, 8, 0, 0));
    let r = ini.cmd(0, &cdb, &p, 0).unwrap();
    assert_eq!((r.status, r.sense), (2, Some((0xa, 0x0d, 0x02))));
    let mut o = Initiator::login(&d.addr, other, "iqn.2026-11.org.test:other2").unwrap();
    let r = o.cmd(0, &read16(0, 8), &[], 4096).unwrap();
    assert!(
        r.data.iter().all(|x| *x == 0),
        "another target's LUN was written"
    );
    // Past the end of the destination: COPY ABORTED, and the held status says it failed.
    let (cdb, p) = xcopy(9, &[&a, &b], (0, 1, 16, 0, (64 << 20) / 512 - 8));
    let r = ini.cmd(0, &cdb, &p, 0).unwrap();
    assert_eq!(r.status, 2);
    assert_eq!(r.sense.map(|s| s.0), Some(0xa));
    rcr[2] = 9;
    let r = ini.cmd(0, &rcr, &[], 1024).unwrap();
    assert_eq!(
        (r.status, r.data[4], &r.data[5..7]),
        (0, 0x02, &[0u8, 0][..])
    );
}

/// PERSISTENT RESERVE OUT: service action, type, key, service action key, APTPL.
fn pr_out(ini: &mut Initiator, sa: u8, kind: u8, key: u64, sa_key: u64, aptpl: bool) -> u8 {
    let cdb = [0x5f, sa, kind, 0, 0, 0, 0, 0, 24, 0];
    let mut p = vec![0u8; 24];
    p[0..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sa_key.to_be_bytes());
    p[20] = u8::from(aptpl);
    ini.cmd(0, &cdb, &p, 0).unwrap().status
}

/// PERSISTENT RESERVE IN with service action `sa`: its data.
fn pr_in(ini: &mut Initiator, sa: u8) -> Vec<u8> {
    let r = ini
        .cmd(0, &[0x5e, sa, 0, 0, 0, 0, 0, 1, 0, 0], &[], 256)
        .unwrap();
    assert_eq!(r.status, 0);
    r.data
}

#[test]
fn reservations_asked_to_persist_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let iqn = "iqn.2026-11.org.tank:cluster";
    let d = serve(&data);
    volume(&data, "tank/shared", "64M", iqn, &[]);
    let mut a = Initiator::login(&d.addr, iqn, "iqn.2026-11.org.test:node-a").unwrap();
    let mut b = Initiator::login(&d.addr, iqn, "iqn.2026-11.org.test:node-b").unwrap();
    // Node A registers with APTPL and takes a write-exclusive reservation; B registers.
    assert_eq!(pr_out(&mut a, 0, 0, 0, 0xa, true), 0);
    assert_eq!(pr_out(&mut b, 0, 0, 0, 0xb, true), 0);
    assert_eq!(pr_out(&mut a, 1, 1, 0xa, 0, false), 0);
    let caps = pr_in(&mut a, 2);
    assert_eq!(
        (caps[2] & 1, caps[3] & 1),
        (1, 1),
        "PTPL_C and PTPL_A: {caps:?}"
    );
    drop((a, b));
    drop(d);

    // After a restart: the keys, the reservation and its holder are there.
    let d = serve(&data);
    let mut c = Initiator::login(&d.addr, iqn, "iqn.2026-11.org.test:node-c").unwrap();
    c.clear_attentions(0).unwrap();
    let keys = pr_in(&mut c, 0);
    assert_eq!(&keys[4..8], &16u32.to_be_bytes(), "{keys:?}");
    assert_eq!(&keys[8..16], &0xau64.to_be_bytes());
    assert_eq!(&keys[16..24], &0xbu64.to_be_bytes());
    let res = pr_in(&mut c, 1);
    assert_eq!(&res[4..8], &16u32.to_be_bytes(), "no reservation: {res:?}");
    assert_eq!(&res[8..16], &0xau64.to_be_bytes());
    assert_eq!(res[21] & 0x0f, 1);
    // The reservation still fences: another node may read, not write.
    let r = c.cmd(0, &read16(0, 8), &[], 4096).unwrap();
    assert_eq!(r.status, 0);
    let r = c.cmd(0, &write16(0, 8, false), &[0u8; 4096], 0).unwrap();
    assert_eq!(r.status, 0x18, "a write past another node's reservation");
    // A REGISTER without APTPL (here B unregistering) turns persistence off: after the next
    // restart nothing is kept.
    let mut b = Initiator::login(&d.addr, iqn, "iqn.2026-11.org.test:node-b").unwrap();
    b.clear_attentions(0).unwrap();
    let gen_before = u32::from_be_bytes(pr_in(&mut b, 0)[0..4].try_into().unwrap());
    // This login is a new nexus (another ISID): it registers, with APTPL off.
    assert_eq!(pr_out(&mut b, 0, 0, 0, 0xbb, false), 0);
    assert_eq!(pr_in(&mut b, 2)[3] & 1, 0);
    assert!(u32::from_be_bytes(pr_in(&mut b, 0)[0..4].try_into().unwrap()) > gen_before);
    drop((b, c));
    drop(d);
    let d = serve(&data);
    let mut e = Initiator::login(&d.addr, iqn, "iqn.2026-11.org.test:node-e").unwrap();
    e.clear_attentions(0).unwrap();
    assert_eq!(&pr_in(&mut e, 0)[4..8], &0u32.to_be_bytes());
    assert_eq!(&pr_in(&mut e, 1)[4..8], &0u32.to_be_bytes());
    // A damaged file keeps the LUN from being served rather than dropping the fence.
    let kept = data.join("iscsi").join("reservations");
    assert_eq!(pr_out(&mut e, 0, 0, 0, 0xe, true), 0);
    let files: Vec<_> = std::fs::read_dir(&kept).unwrap().flatten().collect();
    assert_eq!(files.len(), 1);
    drop(e);
    drop(d);
    std::fs::write(
        files[0].path(),
        "tank persistent reservations 1\nnonsense\n",
    )
    .unwrap();
    let d = serve(&data);
    let out = tank(&data, &["share", "list"]);
    assert!(
        out.contains("reservations") || out.contains("nonsense"),
        "the share does not say why it is not served:\n{out}"
    );
    eprintln!("{out}");
    assert!(
        Initiator::login(&d.addr, iqn, "iqn.2026-11.org.test:node-f")
            .and_then(|mut f| f.cmd(0, &TUR, &[], 0))
            .map_or(true, |r| r.status != 0)
    );
}
