//! The S3 endpoint as real clients use it: boto3 (the AWS SDK for Python), the AWS CLI,
//! rclone and restic, against `tank serve --s3` on 127.0.0.1 started by each test; and
//! kill -9 of the daemon under parallel uploads.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

struct Daemon {
    child: Child,
    url: String,
}

impl Daemon {
    fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        common::stop(&mut self.child);
    }
}

/// Starts `tank serve` with S3 at `spec` (port 0: a free one); returns when it listens.
fn serve(data: &Path, spec: &str) -> Daemon {
    serve_with(data, spec, &[])
}

/// `serve`, with more arguments.
fn serve_with(data: &Path, spec: &str, extra: &[&str]) -> Daemon {
    let mut args = vec!["serve", "--no-api", "--s3", spec];
    args.extend_from_slice(extra);
    let (child, url, _) = common::serve_until_listening(data, &args, "s3: ");
    Daemon { child, url }
}

use common::tank;

/// A user with an S3 key: (access key, secret key).
fn user_with_key(data: &Path, name: &str, admin: bool) -> (String, String) {
    let mut args = vec!["user", "add", name];
    if admin {
        args.push("--admin");
    }
    tank(data, &args, Some("a-password-1\n"));
    let out = tank(data, &["key", "add", name], None);
    let field = |k: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(k))
            .unwrap_or_else(|| panic!("no {k} in {out}"))
            .trim()
            .to_string()
    };
    (field("access_key:"), field("secret_key:"))
}

/// Runs a client with a time limit.
fn run(cmd: &mut Command, what: &str) -> Output {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let id = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(300)) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &id.to_string()]).status();
            panic!("{what} did not finish in 300 s");
        }
    }
}

fn ok(cmd: &mut Command, what: &str) -> String {
    let out = run(cmd, what);
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false)
}

fn boto3_missing() -> Option<String> {
    let ok = Command::new("python3")
        .args(["-c", "import boto3"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    (!ok).then(|| "boto3 is not installed (pip install boto3)".to_string())
}

fn skipped(name: &str, why: &str) {
    if std::env::var_os("CI").is_some() {
        println!("{name}: not run: {why}");
    }
    common::skip(name, why);
}

/// A tree of files of assorted sizes (some empty, some over the CLI's multipart threshold).
fn make_tree(dir: &Path) {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for (i, size) in [0usize, 1, 4096, 100_000, 9 << 20, 33, 1 << 20]
        .iter()
        .enumerate()
    {
        let sub = dir.join(format!("d{}/e{}", i % 3, i % 2));
        std::fs::create_dir_all(&sub).unwrap();
        let body: Vec<u8> = (0..*size).map(|_| rnd() as u8).collect();
        std::fs::write(sub.join(format!("f{i}.bin")), body).unwrap();
    }
    std::fs::write(dir.join("top level.txt"), b"a name with a space").unwrap();
}

/// Every file below `dir`, relative, with its bytes.
fn tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((
                    p.strip_prefix(dir).unwrap().to_path_buf(),
                    std::fs::read(&p).unwrap(),
                ));
            }
        }
    }
    out.sort();
    out
}

/// boto3 works every operation a backup or sync tool uses, and the rules around them:
/// buckets, objects, metadata, ranges, conditions, digests, odd keys, listings, copies,
/// multipart, concurrent writers, who may do what, signatures, cut bodies, and the same
/// bytes through the local mount (tests/s3_boto3.py).
#[test]
fn s3_boto3_workout() {
    const NAME: &str = "s3_boto3_workout";
    if let Some(why) = boto3_missing() {
        return skipped(NAME, &why);
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let d = serve(&data, "http://127.0.0.1:0");
    let (ak, sk) = user_with_key(&data, "alice", true);
    let (uk, us) = user_with_key(&data, "bob", false);
    for (ds, share, opts) in [
        ("tank/shared", "shared", vec!["users=bob"]),
        ("tank/readonly", "readonly", vec!["users=bob", "ro=on"]),
        ("tank/pub", "pub", vec!["public_read=on"]),
    ] {
        tank(&data, &["dataset", "create", ds], None);
        let mut args = vec!["share", "add", "s3", share, ds];
        for o in &opts {
            args.push("-o");
            args.push(o);
        }
        tank(&data, &args, None);
    }
    let mount = if common::fuse_missing().is_none() {
        data.join("mnt/tank/s3").to_string_lossy().into_owned()
    } else {
        "-".to_string()
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/s3_boto3.py");
    let out = ok(
        Command::new("python3")
            .arg(&script)
            .args([&d.url, &ak, &sk, &uk, &us, &mount]),
        "the boto3 workout",
    );
    let n: u32 = out
        .lines()
        .find_map(|l| l.strip_prefix("boto3 workout: "))
        .and_then(|s| s.strip_suffix(" checks passed"))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("unexpected output: {out}"));
    assert!(n >= 80, "only {n} checks ran");
}

/// Versioning, Object Lock, bucket tags, the anonymous-read policy, CORS, browser POST
/// uploads and lifecycle rules, with boto3 (tests/s3_versions.py); then a restart keeps
/// every version, lock and setting.
#[test]
fn s3_versions_locks_and_bucket_settings() {
    const NAME: &str = "s3_versions_locks_and_bucket_settings";
    if let Some(why) = boto3_missing() {
        return skipped(NAME, &why);
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    // Lifecycle passes every second, with a day of two seconds.
    let lc = ["--s3-lifecycle-interval", "1", "--s3-lifecycle-day", "2"];
    let d = serve_with(&data, "http://127.0.0.1:0", &lc);
    let (ak, sk) = user_with_key(&data, "alice", true);
    let (uk, us) = user_with_key(&data, "bob", false);
    tank(&data, &["user", "set", "bob", "s3_bucket_create=on"], None);
    let mount = if common::fuse_missing().is_none() {
        data.join("mnt/tank/s3").to_string_lossy().into_owned()
    } else {
        "-".to_string()
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/s3_versions.py");
    let out = ok(
        Command::new("python3")
            .arg(&script)
            .args([&d.url, &ak, &sk, &uk, &us, &mount]),
        "the versions workout",
    );
    let n: u32 = out
        .lines()
        .find_map(|l| l.strip_prefix("versions workout: "))
        .and_then(|s| s.strip_suffix(" checks passed"))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("unexpected output: {out}"));
    assert!(n >= 100, "only {n} checks ran");
    // After a kill -9 and a restart: the vault's versions, locks and rule are all there.
    d.kill9();
    let d = serve(&data, "http://127.0.0.1:0");
    let script = r#"
import sys, boto3, botocore
from botocore.config import Config
c = boto3.client("s3", endpoint_url=sys.argv[1], aws_access_key_id=sys.argv[2], aws_secret_access_key=sys.argv[3],
                 region_name="us-east-1", config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
r = c.list_object_versions(Bucket="vault", Prefix="ledger")
vs = r.get("Versions", [])
assert len(vs) == 1 and not vs[0]["IsLatest"], vs
assert len(r.get("DeleteMarkers", [])) == 1 and r["DeleteMarkers"][0]["IsLatest"], r
vid = vs[0]["VersionId"]
assert c.get_object(Bucket="vault", Key="ledger", VersionId=vid)["Body"].read() == b"kept"
assert c.get_object_retention(Bucket="vault", Key="ledger", VersionId=vid)["Retention"]["Mode"] == "COMPLIANCE"
try:
    c.delete_object(Bucket="vault", Key="ledger", VersionId=vid, BypassGovernanceRetention=True)
    raise SystemExit("a locked version was deleted after the restart")
except botocore.exceptions.ClientError as e:
    assert e.response["Error"]["Code"] == "AccessDenied", e
rule = c.get_object_lock_configuration(Bucket="vault")["ObjectLockConfiguration"]["Rule"]
assert rule["DefaultRetention"] == {"Mode": "GOVERNANCE", "Days": 2}, rule
assert c.get_bucket_versioning(Bucket="plainb")["Status"] == "Enabled"
print("after the restart: versions and locks kept")
"#;
    let out = ok(
        Command::new("python3").args(["-c", script, &d.url, &ak, &sk]),
        "the check after the restart",
    );
    assert!(out.contains("versions and locks kept"), "{out}");
    // The share options show the state, as `tank share list` tells it.
    let shares = tank(&data, &["share", "list"], None);
    assert!(
        shares
            .lines()
            .any(|l| l.contains("vault") && l.contains("object_lock=on")),
        "{shares}"
    );
}

/// Malformed XML, clock skew, a body that is not the one signed, oversized bodies and
/// headers, a cut chunked body: each gets the error a client expects and leaves the bucket
/// as it was, and the server serves on (tests/s3_bad_input.py, requests signed by hand).
#[test]
fn s3_bad_requests_get_clear_errors_and_change_nothing() {
    const NAME: &str = "s3_bad_requests_get_clear_errors_and_change_nothing";
    if let Some(why) = boto3_missing() {
        return skipped(NAME, &why);
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let d = serve(&data, "http://127.0.0.1:0");
    let (ak, sk) = user_with_key(&data, "alice", true);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/s3_bad_input.py");
    let out = ok(
        Command::new("python3")
            .arg(&script)
            .args([&d.url, &ak, &sk]),
        "the bad requests",
    );
    let n: u32 = out
        .lines()
        .find_map(|l| l.strip_prefix("bad input: "))
        .and_then(|s| s.strip_suffix(" checks passed"))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("unexpected output: {out}"));
    assert!(n >= 20, "only {n} checks ran");
}

/// Signature Version 2 is refused by default (the boto3 workout) and accepted with
/// `--s3-sigv2`, for old clients: header-signed requests and presigned URLs, whose
/// signatures are still checked.
#[test]
fn s3_signature_v2_only_when_allowed() {
    const NAME: &str = "s3_signature_v2_only_when_allowed";
    if let Some(why) = boto3_missing() {
        return skipped(NAME, &why);
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let d = serve_with(&data, "http://127.0.0.1:0", &["--s3-sigv2"]);
    let (ak, sk) = user_with_key(&data, "alice", true);
    let script = r#"
import sys, time, urllib.request, urllib.error, boto3, botocore
from botocore.config import Config
url, ak, sk = sys.argv[1:4]
def client(secret):
    return boto3.client("s3", endpoint_url=url, aws_access_key_id=ak, aws_secret_access_key=secret, region_name="us-east-1",
                        config=Config(signature_version="s3", s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
v2 = client(sk)
v2.create_bucket(Bucket="old")
v2.put_object(Bucket="old", Key="k", Body=b"signed the old way")
assert v2.get_object(Bucket="old", Key="k")["Body"].read() == b"signed the old way"
try:
    client("wrong" + sk).get_object(Bucket="old", Key="k")
    raise SystemExit("a wrong V2 signature was accepted")
except botocore.exceptions.ClientError as e:
    assert e.response["Error"]["Code"] in ("SignatureDoesNotMatch", "AccessDenied"), e
u = v2.generate_presigned_url("get_object", Params={"Bucket": "old", "Key": "k"}, ExpiresIn=60)
assert "Signature=" in u, u
assert urllib.request.urlopen(u).read() == b"signed the old way"
for bad in (u.replace("Signature=", "Signature=x"), v2.generate_presigned_url("get_object", Params={"Bucket": "old", "Key": "k"}, ExpiresIn=-10)):
    try:
        urllib.request.urlopen(bad)
        raise SystemExit(f"a bad V2 URL was accepted: {bad}")
    except urllib.error.HTTPError as e:
        assert e.code == 403, e.code
print("signature v2: accepted when allowed, and checked")
"#;
    let out = ok(
        Command::new("python3").args(["-c", script, &d.url, &ak, &sk]),
        "Signature V2 allowed",
    );
    assert!(out.contains("accepted when allowed"), "{out}");
}

/// The AWS CLI, rclone and restic each sync a tree up and back down (compared byte for
/// byte), list it and delete it.
#[test]
fn s3_aws_cli_rclone_and_restic_round_trip_a_tree() {
    const NAME: &str = "s3_aws_cli_rclone_and_restic_round_trip_a_tree";
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let d = serve(&data, "http://127.0.0.1:0");
    let (ak, sk) = user_with_key(&data, "alice", true);
    let src = tmp.path().join("src");
    make_tree(&src);
    let want = tree(&src);
    let mut ran = 0;

    if on_path("aws") {
        let aws = |args: &[&str]| {
            let mut c = Command::new("aws");
            c.args(["--endpoint-url", &d.url, "--region", "us-east-1"])
                .args(args)
                .env("AWS_ACCESS_KEY_ID", &ak)
                .env("AWS_SECRET_ACCESS_KEY", &sk)
                .env("AWS_CONFIG_FILE", tmp.path().join("aws-config"))
                .env("AWS_SHARED_CREDENTIALS_FILE", tmp.path().join("aws-creds"));
            c
        };
        ok(&mut aws(&["s3", "mb", "s3://cli"]), "aws s3 mb");
        ok(
            &mut aws(&["s3", "sync", src.to_str().unwrap(), "s3://cli/tree/"]),
            "aws s3 sync up",
        );
        let ls = ok(
            &mut aws(&["s3", "ls", "--recursive", "s3://cli/"]),
            "aws s3 ls",
        );
        assert_eq!(ls.lines().count(), want.len(), "{ls}");
        let back = tmp.path().join("aws-back");
        ok(
            &mut aws(&["s3", "sync", "s3://cli/tree/", back.to_str().unwrap()]),
            "aws s3 sync down",
        );
        assert!(tree(&back) == want, "the AWS CLI's copy differs");
        // A second sync finds nothing to do.
        let again = ok(
            &mut aws(&["s3", "sync", src.to_str().unwrap(), "s3://cli/tree/"]),
            "aws s3 sync again",
        );
        assert!(again.trim().is_empty(), "a second sync uploaded: {again}");
        ok(
            &mut aws(&["s3", "rm", "--recursive", "s3://cli/"]),
            "aws s3 rm",
        );
        ok(&mut aws(&["s3", "rb", "s3://cli"]), "aws s3 rb");
        ran += 1;
    } else {
        skipped(
            &format!("{NAME} (aws)"),
            "the AWS CLI is not installed (pip install awscli)",
        );
    }

    if on_path("rclone") {
        let rclone = |args: &[&str]| {
            let mut c = Command::new("rclone");
            // rclone's S3 library cannot load a CA bundle named in the environment into
            // its own transport (and the endpoint here is plain HTTP).
            c.args(args)
                .env_remove("AWS_CA_BUNDLE")
                .env("RCLONE_CONFIG", tmp.path().join("rclone.conf"))
                .env("RCLONE_CONFIG_TANK_TYPE", "s3")
                .env("RCLONE_CONFIG_TANK_PROVIDER", "Other")
                .env("RCLONE_CONFIG_TANK_ENDPOINT", &d.url)
                .env("RCLONE_CONFIG_TANK_ACCESS_KEY_ID", &ak)
                .env("RCLONE_CONFIG_TANK_SECRET_ACCESS_KEY", &sk)
                .env("RCLONE_CONFIG_TANK_FORCE_PATH_STYLE", "true");
            c
        };
        ok(&mut rclone(&["mkdir", "tank:rclone-b"]), "rclone mkdir");
        ok(
            &mut rclone(&["sync", src.to_str().unwrap(), "tank:rclone-b/tree"]),
            "rclone sync up",
        );
        ok(
            &mut rclone(&["check", src.to_str().unwrap(), "tank:rclone-b/tree"]),
            "rclone check",
        );
        let back = tmp.path().join("rclone-back");
        ok(
            &mut rclone(&["sync", "tank:rclone-b/tree", back.to_str().unwrap()]),
            "rclone sync down",
        );
        assert!(tree(&back) == want, "rclone's copy differs");
        let ls = ok(&mut rclone(&["ls", "tank:rclone-b"]), "rclone ls");
        assert_eq!(ls.lines().count(), want.len(), "{ls}");
        ok(&mut rclone(&["purge", "tank:rclone-b"]), "rclone purge");
        ran += 1;
    } else {
        skipped(
            &format!("{NAME} (rclone)"),
            "rclone is not installed (apt-get install rclone)",
        );
    }

    if on_path("restic") {
        tank(&data, &["dataset", "create", "tank/backup"], None);
        tank(
            &data,
            &[
                "share",
                "add",
                "s3",
                "backup",
                "tank/backup",
                "-o",
                "users=alice",
            ],
            None,
        );
        let restic = |args: &[&str]| {
            let mut c = Command::new("restic");
            c.args(args)
                .env("RESTIC_REPOSITORY", format!("s3:{}/backup/repo", d.url))
                .env("RESTIC_PASSWORD", "a restic password")
                .env("AWS_ACCESS_KEY_ID", &ak)
                .env("AWS_SECRET_ACCESS_KEY", &sk)
                .env("RESTIC_CACHE_DIR", tmp.path().join("restic-cache"));
            c
        };
        ok(&mut restic(&["init"]), "restic init");
        ok(
            &mut restic(&["backup", "--host", "test", src.to_str().unwrap()]),
            "restic backup",
        );
        ok(&mut restic(&["check", "--read-data"]), "restic check");
        let back = tmp.path().join("restic-back");
        ok(
            &mut restic(&["restore", "latest", "--target", back.to_str().unwrap()]),
            "restic restore",
        );
        let restored = back.join(src.strip_prefix("/").unwrap());
        assert!(tree(&restored) == want, "restic's restore differs");
        let snaps = ok(&mut restic(&["snapshots", "--json"]), "restic snapshots");
        assert!(snaps.contains("\"hostname\":\"test\""), "{snaps}");
        ran += 1;
    } else {
        skipped(
            &format!("{NAME} (restic)"),
            "restic is not installed (apt-get install restic)",
        );
    }
    if ran == 0 {
        skipped(NAME, "none of the AWS CLI, rclone and restic is installed");
    }
}

/// kill -9 of the daemon while 8 clients PUT and DELETE objects: after the restart every
/// object whose PUT was answered 200 (and not deleted after) is there whole with its
/// ETag; every object listed is whole (its bytes are one of the bodies sent for its key);
/// nothing of an unanswered PUT is left half-written; the bodies in flight are cleaned up.
#[test]
fn s3_acknowledged_objects_survive_kill_9() {
    const NAME: &str = "s3_acknowledged_objects_survive_kill_9";
    if let Some(why) = boto3_missing() {
        return skipped(NAME, &why);
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let d = serve(&data, "http://127.0.0.1:0");
    let (ak, sk) = user_with_key(&data, "alice", true);
    let writer = r#"
import sys, hashlib, threading, boto3
from botocore.config import Config
url, ak, sk = sys.argv[1:4]
def body(key, v):
    seed = hashlib.sha256(f"{key}/{v}".encode()).digest()
    return seed * (1 + (v * 7919 + len(key)) % 40000)
lock = threading.Lock()
def say(line):
    # One line at a time: the threads' prints would otherwise run into each other.
    with lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
def worker(t):
    s3 = boto3.client("s3", endpoint_url=url, aws_access_key_id=ak, aws_secret_access_key=sk,
                      region_name="us-east-1", config=Config(retries={"max_attempts": 1}, s3={"addressing_style": "path"}))
    # Threads 0-3 write the unversioned bucket, 4-7 the versioned one.
    bucket = "crash" if t < 4 else "crashv"
    v = 0
    while True:
        v += 1
        key = f"k{t}/{v % 13}"
        op = "delete" if v % 5 == 0 else "put"
        say(f"start {op} {key} {v}")
        try:
            if v % 5 == 0:
                s3.delete_object(Bucket=bucket, Key=key)
                say(f"deleted {key}" if t < 4 else f"vdeleted {key}")
                continue
            if v % 7 == 3:
                # A multipart upload of one part, completed.
                up = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
                e = s3.upload_part(Bucket=bucket, Key=key, UploadId=up, PartNumber=1, Body=body(key, v))["ETag"]
                r = s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up,
                                                 MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e}]})
                say(f"completed {up}")
            else:
                r = s3.put_object(Bucket=bucket, Key=key, Body=body(key, v))
            if t < 4:
                say(f"put {key} {v} {r['ETag'].strip(chr(34))}")
            else:
                say(f"vput {key} {v} {r['VersionId']}")
        except Exception as e:
            return
s3 = boto3.client("s3", endpoint_url=url, aws_access_key_id=ak, aws_secret_access_key=sk, region_name="us-east-1")
s3.create_bucket(Bucket="crash")
s3.create_bucket(Bucket="crashv")
s3.put_bucket_versioning(Bucket="crashv", VersioningConfiguration={"Status": "Enabled"})
say("ready")
ts = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
[t.start() for t in ts]
[t.join() for t in ts]
"#;
    let mut child = Command::new("python3")
        .args(["-c", writer, &d.url, &ak, &sk])
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
    // Kill once 150 changes of the unversioned bucket were answered.
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while lines
        .iter()
        .filter(|l: &&String| l.starts_with("put "))
        .count()
        < 150
    {
        let l = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("the writers stalled");
        lines.push(l);
    }
    d.kill9();
    let _ = child.wait();
    // Whatever was answered before the kill was printed before these.
    while let Ok(l) = rx.recv_timeout(Duration::from_millis(500)) {
        lines.push(l);
    }
    // The last answered change of each key decides what must be there.
    let mut expect: std::collections::BTreeMap<String, Option<(String, String)>> =
        Default::default();
    // Changes sent whose answer the kill cut off: they may or may not have landed.
    let mut started: std::collections::BTreeSet<(String, String)> = Default::default();
    for l in &lines {
        let f: Vec<&str> = l.split(' ').collect();
        match f.as_slice() {
            ["start", op, key, _] => {
                started.insert((op.to_string(), key.to_string()));
            }
            ["put", key, v, etag] => {
                started.remove(&("put".to_string(), key.to_string()));
                expect.insert(key.to_string(), Some((v.to_string(), etag.to_string())));
            }
            ["deleted", key] => {
                started.remove(&("delete".to_string(), key.to_string()));
                expect.insert(key.to_string(), None);
            }
            _ => {}
        }
    }
    // Versions answered in the versioned bucket, and uploads whose complete was answered.
    let vputs: Vec<String> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("vput "))
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            format!("[\"{}\", {}, \"{}\"]", f[0], f[1], f[2])
        })
        .collect();
    let completed: Vec<String> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("completed "))
        .map(|id| format!("\"{id}\""))
        .collect();
    assert!(
        vputs.len() >= 20,
        "too few versioned writes: {}",
        vputs.len()
    );
    assert!(!completed.is_empty(), "no multipart upload completed");
    let d = serve(&data, "http://127.0.0.1:0");
    let expect_json: Vec<String> = expect
        .iter()
        .map(|(k, e)| match e {
            Some((v, etag)) => {
                let may_be_gone = started.contains(&("delete".to_string(), k.clone()));
                format!("[\"{k}\", {v}, \"{etag}\", {may_be_gone}]")
            }
            None => format!("[\"{k}\", null, null, true]"),
        })
        .collect();
    let checker = r#"
import sys, json, hashlib, boto3
url, ak, sk, expect = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
vputs, completed = json.loads(sys.argv[5]), set(json.loads(sys.argv[6]))
def body(key, v):
    seed = hashlib.sha256(f"{key}/{v}".encode()).digest()
    return seed * (1 + (v * 7919 + len(key)) % 40000)
s3 = boto3.client("s3", endpoint_url=url, aws_access_key_id=ak, aws_secret_access_key=sk, region_name="us-east-1")
n = 0
listed = {}
for page in s3.get_paginator("list_objects_v2").paginate(Bucket="crash"):
    for o in page.get("Contents", []):
        listed[o["Key"]] = o["ETag"].strip('"')
for key, etag in listed.items():
    data = s3.get_object(Bucket="crash", Key=key)["Body"].read()
    want = hashlib.md5(data).hexdigest()
    if "-" in etag:
        # A multipart upload of one part.
        want = hashlib.md5(hashlib.md5(data).digest()).hexdigest() + "-1"
    assert want == etag, f"{key}: its bytes are not its ETag's"
    assert any(data == body(key, v) for v in range(1, 2000) if v % 5), f"{key}: not one of the bodies sent"
    n += 1
for key, v, etag, may_be_gone in expect:
    if v is None:
        continue
    # A later PUT of the key may have landed without its answer: the answered one, or a
    # later body, whole; a DELETE sent and not answered may have landed too.
    if key not in listed:
        assert may_be_gone, f"{key}: acknowledged (v{v}) and gone"
        n += 1
        continue
    data = s3.get_object(Bucket="crash", Key=key)["Body"].read()
    if listed[key] == etag:
        assert data == body(key, v), f"{key}: the acknowledged body differs"
    else:
        later = [w for w in range(v + 1, v + 40) if w % 5 and data == body(key, w)]
        assert later, f"{key}: neither the acknowledged body (v{v}) nor a later one"
    n += 1
# Every answered version of the versioned bucket is there by its id (its deletes only add
# delete markers), whole.
for key, v, vid in vputs:
    data = s3.get_object(Bucket="crashv", Key=key, VersionId=vid)["Body"].read()
    assert data == body(key, v), f"{key} version {vid}: not its body"
    n += 1
# No upload whose complete was answered is left with its parts.
for b in ("crash", "crashv"):
    left = {u["UploadId"] for u in s3.list_multipart_uploads(Bucket=b).get("Uploads", [])}
    assert not (left & completed), f"completed uploads left: {left & completed}"
    n += 1
print(f"crash check: {n} checks passed", flush=True)
"#;
    let out = ok(
        Command::new("python3").args([
            "-c",
            checker,
            &d.url,
            &ak,
            &sk,
            &format!("[{}]", expect_json.join(",")),
            &format!("[{}]", vputs.join(",")),
            &format!("[{}]", completed.join(",")),
        ]),
        "the check after kill -9",
    );
    assert!(out.contains("checks passed"), "{out}");
    // The bodies that were in flight are gone (cleaned up at the start), seen through the
    // local mount, which the restart mounted again in place of the killed daemon's.
    if common::fuse_missing().is_none() {
        let tmpdir = data.join("mnt/tank/s3/crash/.tank-s3/tmp");
        let left: Vec<_> = std::fs::read_dir(&tmpdir)
            .unwrap_or_else(|e| panic!("{}: {e} (the mount is not live again)", tmpdir.display()))
            .filter_map(Result::ok)
            .map(|e| e.file_name())
            .collect();
        assert!(left.is_empty(), "bodies in flight were left: {left:?}");
    }
}

/// Over HTTPS with the daemon's certificate (boto3 verifying it), path style, and virtual-
/// hosted style with `--s3-domain` (BUCKET.DOMAIN, resolved to 127.0.0.1 by curl); a
/// request whose signature names another bucket is refused.
#[test]
fn s3_serves_https_and_virtual_hosted_buckets() {
    const NAME: &str = "s3_serves_https_and_virtual_hosted_buckets";
    if let Some(why) = boto3_missing() {
        return skipped(NAME, &why);
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut child = Command::new(env!("CARGO_BIN_EXE_tank"))
        .args([
            "serve",
            "--no-api",
            "--s3",
            "https://127.0.0.1:0",
            "--s3-domain",
            "s3.tank.test",
        ])
        .env("TANK_DATA_DIR", &data)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    let mut url = None;
    for line in out.lines().map_while(Result::ok) {
        if let Some(a) = line.strip_prefix("s3: ") {
            url = Some(a.to_string());
        }
        if line.starts_with("listening on ") {
            break;
        }
    }
    let d = Daemon {
        child,
        url: url.expect("the daemon printed its S3 URL"),
    };
    assert!(d.url.starts_with("https://127.0.0.1:"), "{}", d.url);
    let port = d.url.rsplit(':').next().unwrap().to_string();
    let cert = data.join("tls/cert.pem");
    assert!(cert.exists(), "the daemon's certificate");
    let (ak, sk) = user_with_key(&data, "alice", true);
    let script = r#"
import sys, boto3, subprocess
from botocore.config import Config
url, ak, sk, cert, port = sys.argv[1:6]
s3 = boto3.client("s3", endpoint_url=url, aws_access_key_id=ak, aws_secret_access_key=sk,
                  region_name="us-east-1", verify=cert, config=Config(s3={"addressing_style": "path"}))
s3.create_bucket(Bucket="vhost")
s3.put_object(Bucket="vhost", Key="dir/file.txt", Body=b"over https")
assert s3.get_object(Bucket="vhost", Key="dir/file.txt")["Body"].read() == b"over https"
# Virtual-hosted style: the bucket in the host name, signed for it.
v = boto3.client("s3", endpoint_url=f"https://s3.tank.test:{port}", aws_access_key_id=ak,
                 aws_secret_access_key=sk, region_name="us-east-1",
                 config=Config(s3={"addressing_style": "virtual"}, signature_version="s3v4"))
u = v.generate_presigned_url("get_object", Params={"Bucket": "vhost", "Key": "dir/file.txt"}, ExpiresIn=60)
assert u.startswith(f"https://vhost.s3.tank.test:{port}/dir/file.txt?"), u
def curl(u):
    r = subprocess.run(["curl", "-sk", "--resolve", f"vhost.s3.tank.test:{port}:127.0.0.1",
                        "--resolve", f"other.s3.tank.test:{port}:127.0.0.1",
                        "-o", "-", "-w", "\n%{http_code}", u], capture_output=True, timeout=60)
    body, code = r.stdout.rsplit(b"\n", 1)
    return body, int(code)
body, code = curl(u)
assert code == 200 and body == b"over https", (code, body)
# The same signature sent to another bucket's host: refused.
body, code = curl(u.replace("vhost.s3", "other.s3"))
assert code == 403, (code, body)
print("https and virtual hosts: ok", flush=True)
"#;
    let out = ok(
        Command::new("python3").args([
            "-c",
            script,
            &d.url,
            &ak,
            &sk,
            cert.to_str().unwrap(),
            &port,
        ]),
        "the HTTPS and virtual-host checks",
    );
    assert!(out.contains("ok"), "{out}");
}

/// A bucket whose dataset's quota is full refuses a PUT with InsufficientStorage and keeps
/// nothing of it; what was there is intact, and the bucket takes writes again once space
/// is freed.
#[test]
fn s3_a_full_quota_is_a_clean_error() {
    const NAME: &str = "s3_a_full_quota_is_a_clean_error";
    if let Some(why) = boto3_missing() {
        return skipped(NAME, &why);
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let d = serve(&data, "http://127.0.0.1:0");
    let (ak, sk) = user_with_key(&data, "alice", true);
    tank(&data, &["dataset", "create", "tank/small"], None);
    tank(
        &data,
        &[
            "dataset",
            "set",
            "quota=24M",
            "compression=off",
            "tank/small",
        ],
        None,
    );
    tank(
        &data,
        &[
            "share",
            "add",
            "s3",
            "small",
            "tank/small",
            "-o",
            "users=alice",
        ],
        None,
    );
    let script = r#"
import sys, os, time, boto3, botocore
from botocore.config import Config
url, ak, sk = sys.argv[1:4]
s3 = boto3.client("s3", endpoint_url=url, aws_access_key_id=ak, aws_secret_access_key=sk,
                  region_name="us-east-1", config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
first = os.urandom(12 << 20)
s3.put_object(Bucket="small", Key="first", Body=first)
code = None
try:
    s3.put_object(Bucket="small", Key="second", Body=os.urandom(40 << 20))
except botocore.exceptions.ClientError as e:
    code = e.response["Error"]["Code"]
assert code == "InsufficientStorage", code
assert s3.get_object(Bucket="small", Key="first")["Body"].read() == first, "the first object changed"
keys = [o["Key"] for o in s3.list_objects_v2(Bucket="small").get("Contents", [])]
assert keys == ["first"], keys
s3.delete_object(Bucket="small", Key="first")
# The space of what was deleted is free once its txg is synced.
for _ in range(50):
    try:
        s3.put_object(Bucket="small", Key="after", Body=os.urandom(8 << 20))
        break
    except botocore.exceptions.ClientError as e:
        assert e.response["Error"]["Code"] == "InsufficientStorage", e
        time.sleep(0.2)
else:
    raise AssertionError("the bucket stayed full after its object was deleted")
print("quota: ok", flush=True)
"#;
    let out = ok(
        Command::new("python3").args(["-c", script, &d.url, &ak, &sk]),
        "the full-quota checks",
    );
    assert!(out.contains("quota: ok"), "{out}");
}
