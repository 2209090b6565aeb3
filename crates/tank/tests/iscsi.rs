//! The iSCSI target as real initiators use it: libiscsi's tools and its conformance suite
//! (`iscsi-test-cu`, compared with Debian's tgt serving a file in the same run), and a raw
//! initiator of the test's own for what a stock one cannot do (malformed PDUs, sequence
//! numbers out of the window, a peer vanishing mid-transfer, thousands of random CDBs, a
//! kill -9 under a writing initiator). Every server listens on 127.0.0.1.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

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
    let mut child = Command::new(env!("CARGO_BIN_EXE_tank"))
        .args(["serve", "--no-api", "--iscsi", "127.0.0.1:0"])
        .env("TANK_DATA_DIR", data)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let out = BufReader::new(child.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut addr = None;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("the daemon did not start");
        if let Some(a) = line.strip_prefix("iscsi: ") {
            addr = Some(a.to_string());
        }
        if line.starts_with("listening on ") {
            break;
        }
    }
    Daemon {
        child,
        addr: addr.expect("the daemon printed its iSCSI address"),
    }
}

fn tank(data: &Path, args: &[&str]) -> String {
    common::tank(data, args, None)
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
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

// ---- a raw initiator: just enough of RFC 7143 to send what a test needs ----

struct Ini {
    s: TcpStream,
    cmd_sn: u32,
    stat_sn: u32,
    itt: u32,
}

struct Pdu {
    bhs: [u8; 48],
    data: Vec<u8>,
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().unwrap())
}

fn pdu_bytes(bhs: &[u8; 48], data: &[u8]) -> Vec<u8> {
    let mut b = *bhs;
    let n = data.len();
    b[5] = (n >> 16) as u8;
    b[6] = (n >> 8) as u8;
    b[7] = n as u8;
    let mut out = b.to_vec();
    out.extend_from_slice(data);
    out.resize(out.len() + (4 - n % 4) % 4, 0);
    out
}

fn read_pdu(s: &mut TcpStream) -> std::io::Result<Pdu> {
    let mut bhs = [0u8; 48];
    s.read_exact(&mut bhs)?;
    let ahs = usize::from(bhs[4]) * 4;
    let n = (usize::from(bhs[5]) << 16) | (usize::from(bhs[6]) << 8) | usize::from(bhs[7]);
    let mut rest = vec![0u8; ahs + n + (4 - n % 4) % 4];
    s.read_exact(&mut rest)?;
    Ok(Pdu {
        bhs,
        data: rest[ahs..ahs + n].to_vec(),
    })
}

/// What a command came back with.
#[derive(Debug)]
struct Done {
    status: u8,
    /// Sense key, ASC, ASCQ (fixed format).
    sense: Option<(u8, u8, u8)>,
    data: Vec<u8>,
}

impl Ini {
    /// Logs in to `target` as `initiator` (no authentication), straight to full feature
    /// phase with immediate data and unsolicited data on.
    fn login(addr: &str, target: &str, initiator: &str) -> std::io::Result<Ini> {
        let mut s = TcpStream::connect(addr)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        s.set_nodelay(true)?;
        let mut bhs = [0u8; 48];
        bhs[0] = 0x43;
        bhs[1] = 0x80 | (1 << 2) | 3;
        bhs[8..14].copy_from_slice(&[0x80, 0x12, 0x34, 0x56, 0x78, rand_byte()]);
        bhs[24..28].copy_from_slice(&1u32.to_be_bytes());
        let keys = format!(
            "InitiatorName={initiator}\0TargetName={target}\0SessionType=Normal\0HeaderDigest=None\0DataDigest=None\0ImmediateData=Yes\0InitialR2T=No\0MaxRecvDataSegmentLength=262144\0FirstBurstLength=262144\0MaxBurstLength=1048576\0"
        );
        s.write_all(&pdu_bytes(&bhs, keys.as_bytes()))?;
        let r = read_pdu(&mut s)?;
        if r.bhs[0] & 0x3f != 0x23 || r.bhs[36] != 0 || r.bhs[1] & 0x83 != 0x83 {
            return Err(std::io::Error::other(format!(
                "login refused: status {:#04x}{:02x}",
                r.bhs[36], r.bhs[37]
            )));
        }
        Ok(Ini {
            s,
            cmd_sn: 1,
            stat_sn: be32(&r.bhs[24..28]).wrapping_add(1),
            itt: 1,
        })
    }

    fn cmd_pdu(&mut self, lun: u8, cdb: &[u8], edtl: u32, read: bool, write: bool) -> [u8; 48] {
        let mut b = [0u8; 48];
        b[0] = 0x01;
        b[1] = 0x80 | if read { 0x40 } else { 0 } | if write { 0x20 } else { 0 } | 1;
        b[9] = lun;
        self.itt += 1;
        b[16..20].copy_from_slice(&self.itt.to_be_bytes());
        b[20..24].copy_from_slice(&edtl.to_be_bytes());
        b[24..28].copy_from_slice(&self.cmd_sn.to_be_bytes());
        b[28..32].copy_from_slice(&self.stat_sn.to_be_bytes());
        b[32..32 + cdb.len()].copy_from_slice(cdb);
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        b
    }

    /// Sends one SCSI command (data-out up to 256 KiB goes as immediate data, the rest as
    /// the target asks by R2T) and reads until its status.
    fn cmd(
        &mut self,
        lun: u8,
        cdb: &[u8],
        data_out: &[u8],
        read_len: u32,
    ) -> std::io::Result<Done> {
        let write = !data_out.is_empty();
        let edtl = if write {
            data_out.len() as u32
        } else {
            read_len
        };
        let bhs = self.cmd_pdu(lun, cdb, edtl, read_len > 0, write);
        let itt = self.itt;
        let imm = data_out.len().min(262_144);
        self.s.write_all(&pdu_bytes(&bhs, &data_out[..imm]))?;
        let mut data = Vec::new();
        loop {
            let p = read_pdu(&mut self.s)?;
            match p.bhs[0] & 0x3f {
                0x31 => {
                    // R2T: send what it asks, in 256 KiB Data-Outs.
                    let ttt = be32(&p.bhs[20..24]);
                    let off = be32(&p.bhs[40..44]) as usize;
                    let len = be32(&p.bhs[44..48]) as usize;
                    let mut at = off;
                    let mut sn = 0u32;
                    while at < off + len {
                        let n = (off + len - at).min(262_144);
                        let mut d = [0u8; 48];
                        d[0] = 0x05;
                        d[1] = if at + n == off + len { 0x80 } else { 0 };
                        d[9] = lun;
                        d[16..20].copy_from_slice(&itt.to_be_bytes());
                        d[20..24].copy_from_slice(&ttt.to_be_bytes());
                        d[28..32].copy_from_slice(&self.stat_sn.to_be_bytes());
                        d[36..40].copy_from_slice(&sn.to_be_bytes());
                        d[40..44].copy_from_slice(&(at as u32).to_be_bytes());
                        self.s.write_all(&pdu_bytes(&d, &data_out[at..at + n]))?;
                        at += n;
                        sn += 1;
                    }
                }
                0x25 => {
                    data.extend_from_slice(&p.data);
                    if p.bhs[1] & 0x01 != 0 {
                        self.stat_sn = be32(&p.bhs[24..28]).wrapping_add(1);
                        return Ok(Done {
                            status: p.bhs[3],
                            sense: None,
                            data,
                        });
                    }
                }
                0x21 => {
                    self.stat_sn = be32(&p.bhs[24..28]).wrapping_add(1);
                    let sense =
                        (p.data.len() >= 16).then(|| (p.data[4] & 0xf, p.data[14], p.data[15]));
                    return Ok(Done {
                        status: p.bhs[3],
                        sense,
                        data,
                    });
                }
                0x20 => {
                    // A ping: answer it.
                    let mut n = [0u8; 48];
                    n[0] = 0x40;
                    n[1] = 0x80;
                    n[16..20].copy_from_slice(&u32::MAX.to_be_bytes());
                    n[20..24].copy_from_slice(&p.bhs[20..24]);
                    n[24..28].copy_from_slice(&self.cmd_sn.to_be_bytes());
                    self.s.write_all(&pdu_bytes(&n, &[]))?;
                }
                op => {
                    return Err(std::io::Error::other(format!("unexpected PDU {op:#04x}")));
                }
            }
        }
    }
}

fn rand_byte() -> u8 {
    (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos()
        % 251) as u8
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

fn write16(lba: u64, blocks: u32, fua: bool) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x8a;
    c[1] = if fua { 0x08 } else { 0 };
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

fn read16(lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x88;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
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

/// Debian's tgt serving a file of `size` bytes as LUN 1 on `port`: the reference target.
struct Tgt {
    child: Child,
    control: u32,
}

impl Drop for Tgt {
    fn drop(&mut self) {
        let _ = Command::new("tgtadm")
            .args([
                "-C",
                &self.control.to_string(),
                "--op",
                "delete",
                "--mode",
                "system",
            ])
            .output();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_tgt(dir: &Path, port: u16, size: u64) -> Result<Tgt, String> {
    if !have("tgtd") || !have("tgtadm") {
        return Err("Debian's tgt is not installed".into());
    }
    if !nix_is_root() {
        return Err("tgtd needs root".into());
    }
    let img = dir.join("tgt.img");
    std::fs::File::create(&img)
        .and_then(|f| f.set_len(size))
        .map_err(|e| e.to_string())?;
    let control = 100 + u32::from(port % 500);
    let child = Command::new("tgtd")
        .args([
            "-f",
            "-C",
            &control.to_string(),
            "--iscsi",
            &format!("portal=127.0.0.1:{port}"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    let t = Tgt { child, control };
    let adm = |args: &[&str]| -> Result<(), String> {
        let mut a = vec![
            "-C".to_string(),
            control.to_string(),
            "--lld".into(),
            "iscsi".into(),
        ];
        a.extend(args.iter().map(|s| s.to_string()));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let o = Command::new("tgtadm")
                .args(&a)
                .output()
                .map_err(|e| e.to_string())?;
            if o.status.success() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "tgtadm {args:?}: {}",
                    String::from_utf8_lossy(&o.stderr)
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    adm(&[
        "--op",
        "new",
        "--mode",
        "target",
        "--tid",
        "1",
        "-T",
        "iqn.2026-11.org.test:tgt",
    ])?;
    adm(&[
        "--op",
        "new",
        "--mode",
        "logicalunit",
        "--tid",
        "1",
        "--lun",
        "1",
        "-b",
        img.to_str().unwrap(),
    ])?;
    adm(&[
        "--op", "bind", "--mode", "target", "--tid", "1", "-I", "ALL",
    ])?;
    Ok(t)
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1).map(|x| x == "0"))
        .unwrap_or(false)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
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
    match start_tgt(dir.path(), free_port(), 256 << 20) {
        Err(why) => common::skip("libiscsi_conformance_suite_against_tgt (tgt's run)", &why),
        Ok(tgt) => {
            let port = tgt_port(&tgt);
            let turl = format!("iscsi://127.0.0.1:{port}/iqn.2026-11.org.test:tgt/1");
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

fn tgt_port(t: &Tgt) -> u16 {
    // The portal was given on the command line; read it back from tgtadm.
    let o = Command::new("tgtadm")
        .args([
            "-C",
            &t.control.to_string(),
            "--op",
            "show",
            "--mode",
            "portal",
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .find_map(|w| w.strip_prefix("127.0.0.1:"))
        .and_then(|p| p.split(',').next())
        .and_then(|p| p.parse().ok())
        .expect("tgt's portal")
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
    let (ok, out) = run(
        &[
            "iscsi-ls",
            "-i",
            "iqn.2026-11.org.test:other",
            &format!("iscsi://{a}"),
        ],
        30,
    );
    assert!(ok, "{out}");
    assert!(out.contains("iqn.2026-11.org.tank:open"), "{out}");
    assert!(out.contains("iqn.2026-11.org.tank:chap"), "{out}");
    assert!(!out.contains("iqn.2026-11.org.tank:only"), "{out}");
    let (ok, out) = run(
        &[
            "iscsi-ls",
            "-i",
            "iqn.2026-11.org.test:allowed",
            &format!("iscsi://{a}"),
        ],
        30,
    );
    assert!(ok && out.contains("iqn.2026-11.org.tank:only"), "{out}");
    // And login follows the same rule.
    let (ok, out) = run(
        &[
            "iscsi-inq",
            "-i",
            "iqn.2026-11.org.test:other",
            &format!("iscsi://{a}/iqn.2026-11.org.tank:only/0"),
        ],
        30,
    );
    assert!(!ok && out.contains("Authorization failure"), "{out}");
    let (ok, out) = run(
        &[
            "iscsi-inq",
            "-i",
            "iqn.2026-11.org.test:allowed",
            &format!("iscsi://{a}/iqn.2026-11.org.tank:only/0"),
        ],
        30,
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
    let mut ini = Ini::login(&d.addr, iqn, "iqn.2026-11.org.test:raw").unwrap();
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
    let mut ini = Ini::login(&a, iqn, "iqn.2026-11.org.test:bad").unwrap();
    let mut odd = [0u8; 48];
    odd[0] = 0x1c;
    odd[1] = 0x80;
    ini.s.write_all(&pdu_bytes(&odd, &[])).unwrap();
    let r = read_pdu(&mut ini.s).unwrap();
    assert_eq!((r.bhs[0] & 0x3f, r.bhs[2]), (0x3f, 0x05));
    assert_eq!(ini.cmd(0, &TUR, &[], 0).unwrap().status, 0);

    // A command far beyond MaxCmdSN is ignored (no answer); the next in-window one works.
    let saved = ini.cmd_sn;
    ini.cmd_sn = saved.wrapping_add(100_000);
    let b = ini.cmd_pdu(0, &TUR, 0, false, false);
    ini.s.write_all(&pdu_bytes(&b, &[])).unwrap();
    ini.s
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    assert!(
        read_pdu(&mut ini.s).is_err(),
        "no answer outside the window"
    );
    ini.s
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
    let mut gone = Ini::login(&a, iqn, "iqn.2026-11.org.test:gone").unwrap();
    let b = gone.cmd_pdu(0, &write16(0, 8192, false), 4 << 20, false, true);
    gone.s.write_all(&pdu_bytes(&b, &[1u8; 65536])).unwrap();
    let r = read_pdu(&mut gone.s).unwrap();
    assert_eq!(r.bhs[0] & 0x3f, 0x31, "an R2T for the rest");
    drop(gone);
    // And random PDUs after a login: each answered, rejected or the connection closed.
    for round in 0..200 {
        let mut x = Ini::login(&a, iqn, "iqn.2026-11.org.test:fuzz").unwrap();
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
        let _ = x.s.write_all(&wire);
        x.s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let _ = read_pdu(&mut x.s);
    }
    // The target still serves, and the known data is intact.
    let mut ini = Ini::login(&a, iqn, "iqn.2026-11.org.test:after").unwrap();
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
    let mut ini = Ini::login(&d.addr, iqn, "iqn.2026-11.org.test:crash").unwrap();
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
        let mut ini = Ini::login(&addr, iqn, "iqn.2026-11.org.test:writer").unwrap();
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
    let mut ini = Ini::login(&d.addr, iqn, "iqn.2026-11.org.test:check").unwrap();
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
    let mut ini = Ini::login(&d.addr, iqn, "iqn.2026-11.org.test:check2").unwrap();
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
