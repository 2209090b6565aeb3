"""Versioning and Object Lock of tank's S3 endpoint, with boto3: run by tests/s3.rs against a
daemon it started on 127.0.0.1.

    python3 s3_versions.py ENDPOINT ADMIN_KEY ADMIN_SECRET USER_KEY USER_SECRET MOUNT_DIR

ADMIN is an administrator; USER ("bob") may create buckets. MOUNT_DIR is the local mount of
the pool's root filesystem, or "-" where FUSE cannot be mounted. Prints "versions workout: N
checks passed" and exits 0, or raises at the first failed check.
"""

import datetime
import hashlib
import os
import sys

import boto3
import botocore
from botocore.config import Config

endpoint, ak, sk, uk, us, mount = sys.argv[1:7]
checks = 0


def check(cond, what):
    global checks
    if not cond:
        raise AssertionError(what)
    checks += 1


def client(key, secret):
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )


def code_of(f):
    try:
        f()
    except botocore.exceptions.ClientError as e:
        return e.response["Error"]["Code"]
    return None


def versions(c, bucket, **kw):
    r = c.list_object_versions(Bucket=bucket, **kw)
    return r.get("Versions", []), r.get("DeleteMarkers", []), r


admin = client(ak, sk)
bob = client(uk, us)

# A bucket starts unversioned: one object per key, the null version.
bob.create_bucket(Bucket="vers")
check("Status" not in bob.get_bucket_versioning(Bucket="vers"), "never enabled")
bob.put_object(Bucket="vers", Key="doc", Body=b"v0 before versioning")

# Enabled: every PUT a new version, each readable by its id, the newest current.
bob.put_bucket_versioning(Bucket="vers", VersioningConfiguration={"Status": "Enabled"})
check(bob.get_bucket_versioning(Bucket="vers")["Status"] == "Enabled", "enabled")
ids = []
for n in range(1, 4):
    r = bob.put_object(Bucket="vers", Key="doc", Body=f"version {n}".encode())
    check(len(r["VersionId"]) == 32, f"a version id: {r.get('VersionId')}")
    ids.append(r["VersionId"])
check(len(set(ids)) == 3, "three ids")
g = bob.get_object(Bucket="vers", Key="doc")
check(g["Body"].read() == b"version 3" and g["VersionId"] == ids[2], "the newest is current")
for n, vid in enumerate(ids, 1):
    g = bob.get_object(Bucket="vers", Key="doc", VersionId=vid)
    check(g["Body"].read() == f"version {n}".encode(), f"version {n} by its id")
check(bob.get_object(Bucket="vers", Key="doc", VersionId="null")["Body"].read() == b"v0 before versioning", "the null version kept")
check(bob.head_object(Bucket="vers", Key="doc", VersionId=ids[0])["ContentLength"] == 9, "HEAD of a version")
check(code_of(lambda: bob.get_object(Bucket="vers", Key="doc", VersionId="0" * 32)) == "NoSuchVersion", "no such version")
vs, dms, _ = versions(bob, "vers")
check([v["VersionId"] for v in vs] == [ids[2], ids[1], ids[0], "null"], f"newest first: {vs}")
check([v["IsLatest"] for v in vs] == [True, False, False, False], "one latest")
check(dms == [], "no delete markers yet")

# The current version is a plain file of the mount; the others are not seen there.
if mount != "-":
    with open(os.path.join(mount, "vers", "doc"), "rb") as f:
        check(f.read() == b"version 3", "the current version is the file")
    check(sorted(os.listdir(os.path.join(mount, "vers"))) == [".tank-s3", "doc"], "nothing else in the tree")

# A DELETE adds a delete marker: the key is gone, its versions stay.
r = bob.delete_object(Bucket="vers", Key="doc")
check(r.get("DeleteMarker") is True and len(r["VersionId"]) == 32, f"a delete marker: {r}")
marker = r["VersionId"]
check(code_of(lambda: bob.get_object(Bucket="vers", Key="doc")) == "NoSuchKey", "deleted")
check(code_of(lambda: bob.get_object(Bucket="vers", Key="doc", VersionId=marker)) == "MethodNotAllowed", "a marker is not read")
check(bob.get_object(Bucket="vers", Key="doc", VersionId=ids[1])["Body"].read() == b"version 2", "old versions stay")
check("Contents" not in bob.list_objects_v2(Bucket="vers"), "not listed as an object")
vs, dms, _ = versions(bob, "vers")
check(len(vs) == 4 and len(dms) == 1 and dms[0]["IsLatest"] and dms[0]["VersionId"] == marker, f"the marker is latest: {dms}")
check(code_of(lambda: bob.delete_bucket(Bucket="vers")) == "BucketNotEmpty", "versions keep a bucket")
if mount != "-":
    check(not os.path.exists(os.path.join(mount, "vers", "doc")), "the file is gone from the mount")

# Deleting the marker brings the newest version back.
r = bob.delete_object(Bucket="vers", Key="doc", VersionId=marker)
check(r.get("DeleteMarker") is True and r["VersionId"] == marker, f"the marker removed: {r}")
check(bob.get_object(Bucket="vers", Key="doc")["Body"].read() == b"version 3", "undeleted")
if mount != "-":
    with open(os.path.join(mount, "vers", "doc"), "rb") as f:
        check(f.read() == b"version 3", "back in the mount")

# Deleting the current version by id makes the one before it current.
bob.delete_object(Bucket="vers", Key="doc", VersionId=ids[2])
g = bob.get_object(Bucket="vers", Key="doc")
check(g["Body"].read() == b"version 2" and g["VersionId"] == ids[1], "the previous version is current")
bob.delete_object(Bucket="vers", Key="doc", VersionId=ids[0])
vs, _, _ = versions(bob, "vers")
check([v["VersionId"] for v in vs] == [ids[1], "null"], f"a noncurrent version deleted: {vs}")

# Copies from a version; tags on a version.
r = bob.copy_object(Bucket="vers", Key="copied", CopySource={"Bucket": "vers", "Key": "doc", "VersionId": "null"})
check(r["CopySourceVersionId"] == "null" and len(r["VersionId"]) == 32, f"a copy of a version: {r}")
check(bob.get_object(Bucket="vers", Key="copied")["Body"].read() == b"v0 before versioning", "copied bytes")
bob.put_object_tagging(Bucket="vers", Key="doc", VersionId="null", Tagging={"TagSet": [{"Key": "era", "Value": "old"}]})
check(bob.get_object_tagging(Bucket="vers", Key="doc", VersionId="null")["TagSet"] == [{"Key": "era", "Value": "old"}], "a version's tags")
check(bob.get_object_tagging(Bucket="vers", Key="doc")["TagSet"] == [], "the current version's tags apart")

# Listing: many keys over pages, with prefixes and markers.
for k in ["a/1", "a/2", "b", "c/x/y"]:
    for n in range(2):
        bob.put_object(Bucket="vers", Key=k, Body=f"{k} {n}".encode())
bob.delete_object(Bucket="vers", Key="b")
seen = []
kw = {}
while True:
    r = bob.list_object_versions(Bucket="vers", MaxKeys=3, **kw)
    seen += [(v["Key"], v["VersionId"], "v") for v in r.get("Versions", [])]
    seen += [(v["Key"], v["VersionId"], "m") for v in r.get("DeleteMarkers", [])]
    if not r["IsTruncated"]:
        break
    kw = {"KeyMarker": r["NextKeyMarker"], "VersionIdMarker": r["NextVersionIdMarker"]}
keys = [s[0] for s in seen]
check(sorted(keys) == sorted(["a/1"] * 2 + ["a/2"] * 2 + ["b"] * 3 + ["c/x/y"] * 2 + ["copied", "doc", "doc"]), f"every version once over pages: {seen}")
check(len(set(seen)) == len(seen), "no repeats")
r = bob.list_object_versions(Bucket="vers", Delimiter="/")
check([p["Prefix"] for p in r["CommonPrefixes"]] == ["a/", "c/"], f"rolled up: {r.get('CommonPrefixes')}")
check(sorted({v["Key"] for v in r["Versions"]}) == ["b", "copied", "doc"], "keys at the top")
r = bob.list_object_versions(Bucket="vers", Prefix="a/")
check([(v["Key"], v["IsLatest"]) for v in r["Versions"]] == [("a/1", True), ("a/1", False), ("a/2", True), ("a/2", False)], "a prefix")

# DeleteObjects with version ids, and without (markers).
r = bob.delete_objects(Bucket="vers", Delete={"Objects": [{"Key": "a/1"}, {"Key": "a/2", "VersionId": versions(bob, "vers", Prefix="a/2")[0][0]["VersionId"]}]})
d = {x["Key"]: x for x in r["Deleted"]}
check(d["a/1"].get("DeleteMarker") is True and "DeleteMarkerVersionId" in d["a/1"], f"a marker from DeleteObjects: {d}")
check(bob.get_object(Bucket="vers", Key="a/2")["Body"].read() == b"a/2 0", "the version below is current")

# Suspended: new writes are the null version, replacing the null version.
bob.put_bucket_versioning(Bucket="vers", VersioningConfiguration={"Status": "Suspended"})
check(bob.get_bucket_versioning(Bucket="vers")["Status"] == "Suspended", "suspended")
r = bob.put_object(Bucket="vers", Key="doc", Body=b"null one")
check(r.get("VersionId") == "null", f"a null version: {r}")
bob.put_object(Bucket="vers", Key="doc", Body=b"null two")
vs, _, _ = versions(bob, "vers", Prefix="doc")
check([v["VersionId"] for v in vs] == ["null", ids[1]], f"one null version: {vs}")
check(bob.get_object(Bucket="vers", Key="doc")["Body"].read() == b"null two", "the newest null")

# Multipart uploads make versions too.
bob.put_bucket_versioning(Bucket="vers", VersioningConfiguration={"Status": "Enabled"})
up = bob.create_multipart_upload(Bucket="vers", Key="big")
part = os.urandom(5 << 20)
e1 = bob.upload_part(Bucket="vers", Key="big", UploadId=up["UploadId"], PartNumber=1, Body=part)["ETag"]
e2 = bob.upload_part(Bucket="vers", Key="big", UploadId=up["UploadId"], PartNumber=2, Body=b"tail")["ETag"]
r = bob.complete_multipart_upload(Bucket="vers", Key="big", UploadId=up["UploadId"],
                                  MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]})
check(len(r["VersionId"]) == 32, "a multipart version")
check(bob.get_object(Bucket="vers", Key="big", VersionId=r["VersionId"])["Body"].read() == part + b"tail", "its bytes")

# Emptied of every version and marker, the bucket can go.
while True:
    vs, dms, _ = versions(bob, "vers")
    if not vs and not dms:
        break
    for v in vs + dms:
        bob.delete_object(Bucket="vers", Key=v["Key"], VersionId=v["VersionId"])
check("Contents" not in bob.list_objects_v2(Bucket="vers"), "empty")
bob.delete_bucket(Bucket="vers")
check("vers" not in [b["Name"] for b in bob.list_buckets()["Buckets"]], "deleted")

# Object Lock: a bucket made with it is versioned; a retention or a legal hold keeps a version.
bob.create_bucket(Bucket="vault", ObjectLockEnabledForBucket=True)
check(bob.get_bucket_versioning(Bucket="vault")["Status"] == "Enabled", "lock turns versioning on")
cfg = bob.get_object_lock_configuration(Bucket="vault")["ObjectLockConfiguration"]
check(cfg["ObjectLockEnabled"] == "Enabled" and "Rule" not in cfg, f"no default rule: {cfg}")
check(code_of(lambda: bob.put_bucket_versioning(Bucket="vault", VersioningConfiguration={"Status": "Suspended"})) == "InvalidBucketState", "cannot suspend")
until = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=1)
r = bob.put_object(Bucket="vault", Key="ledger", Body=b"kept", ObjectLockMode="COMPLIANCE", ObjectLockRetainUntilDate=until)
kept = r["VersionId"]
h = bob.head_object(Bucket="vault", Key="ledger")
check(h["ObjectLockMode"] == "COMPLIANCE" and abs((h["ObjectLockRetainUntilDate"] - until).total_seconds()) < 1, f"retention told: {h}")
ret = bob.get_object_retention(Bucket="vault", Key="ledger")["Retention"]
check(ret["Mode"] == "COMPLIANCE", "GetObjectRetention")
for who in (bob, admin):
    check(code_of(lambda: who.delete_object(Bucket="vault", Key="ledger", VersionId=kept)) == "AccessDenied", "compliance keeps it from everyone")
    check(code_of(lambda: who.delete_object(Bucket="vault", Key="ledger", VersionId=kept, BypassGovernanceRetention=True)) == "AccessDenied", "no bypass of compliance")
check(code_of(lambda: admin.put_object_retention(Bucket="vault", Key="ledger", VersionId=kept,
                                                 Retention={"Mode": "COMPLIANCE", "RetainUntilDate": until - datetime.timedelta(hours=1)})) == "AccessDenied", "not shortened")
admin.put_object_retention(Bucket="vault", Key="ledger", VersionId=kept, Retention={"Mode": "COMPLIANCE", "RetainUntilDate": until + datetime.timedelta(days=1)})
check(bob.get_object_retention(Bucket="vault", Key="ledger", VersionId=kept)["Retention"]["RetainUntilDate"] > until, "lengthened")
# An overwrite is a new version; the locked one stays whole.
bob.put_object(Bucket="vault", Key="ledger", Body=b"newer")
check(bob.get_object(Bucket="vault", Key="ledger", VersionId=kept)["Body"].read() == b"kept", "the locked version kept")
r = bob.delete_object(Bucket="vault", Key="ledger")
check(r.get("DeleteMarker") is True, "a marker over a locked version is allowed")
check(bob.get_object(Bucket="vault", Key="ledger", VersionId=kept)["Body"].read() == b"kept", "still kept")
# Not through the other front ends either: a lock bucket's files are root's and read-only.
if mount != "-":
    bob.put_object(Bucket="vault", Key="plain", Body=b"p")
    st = os.stat(os.path.join(mount, "vault", "plain"))
    check(st.st_uid == 0 and st.st_mode & 0o777 == 0o444, f"root's, read-only: {oct(st.st_mode)} {st.st_uid}")

# GOVERNANCE: an administrator may bypass it, a user may not.
r = bob.put_object(Bucket="vault", Key="gov", Body=b"g", ObjectLockMode="GOVERNANCE", ObjectLockRetainUntilDate=until)
gov = r["VersionId"]
check(code_of(lambda: bob.delete_object(Bucket="vault", Key="gov", VersionId=gov)) == "AccessDenied", "governance keeps it")
check(code_of(lambda: bob.delete_object(Bucket="vault", Key="gov", VersionId=gov, BypassGovernanceRetention=True)) == "AccessDenied", "a user cannot bypass")
check(code_of(lambda: bob.put_object_retention(Bucket="vault", Key="gov", VersionId=gov, Retention={})) == "AccessDenied", "nor remove it")
admin.delete_object(Bucket="vault", Key="gov", VersionId=gov, BypassGovernanceRetention=True)
check(code_of(lambda: bob.get_object(Bucket="vault", Key="gov", VersionId=gov)) == "NoSuchVersion", "bypassed by the administrator")

# A legal hold, on and off.
r = bob.put_object(Bucket="vault", Key="held", Body=b"h")
held = r["VersionId"]
bob.put_object_legal_hold(Bucket="vault", Key="held", LegalHold={"Status": "ON"})
check(bob.get_object_legal_hold(Bucket="vault", Key="held")["LegalHold"]["Status"] == "ON", "held")
check(code_of(lambda: admin.delete_object(Bucket="vault", Key="held", VersionId=held, BypassGovernanceRetention=True)) == "AccessDenied", "a hold keeps it")
bob.put_object_legal_hold(Bucket="vault", Key="held", LegalHold={"Status": "OFF"})
bob.delete_object(Bucket="vault", Key="held", VersionId=held)
check(code_of(lambda: bob.head_object(Bucket="vault", Key="held")) in ("404", "NoSuchKey"), "released and deleted")

# A default retention applies to new objects.
bob.put_object_lock_configuration(Bucket="vault", ObjectLockConfiguration={
    "ObjectLockEnabled": "Enabled", "Rule": {"DefaultRetention": {"Mode": "GOVERNANCE", "Days": 2}}})
cfg = bob.get_object_lock_configuration(Bucket="vault")["ObjectLockConfiguration"]
check(cfg["Rule"]["DefaultRetention"] == {"Mode": "GOVERNANCE", "Days": 2}, f"the rule: {cfg}")
bob.put_object(Bucket="vault", Key="auto", Body=b"a")
ret = bob.get_object_retention(Bucket="vault", Key="auto")["Retention"]
left = ret["RetainUntilDate"] - datetime.datetime.now(datetime.timezone.utc)
check(ret["Mode"] == "GOVERNANCE" and datetime.timedelta(days=1, hours=23) < left <= datetime.timedelta(days=2), f"two days: {ret}")
check(code_of(lambda: bob.put_object_lock_configuration(Bucket="vault", ObjectLockConfiguration={
    "ObjectLockEnabled": "Enabled", "Rule": {"DefaultRetention": {"Mode": "GOVERNANCE", "Days": 0}}})) in ("InvalidArgument", "MalformedXML"), "a zero period refused")
# Lock headers outside a lock bucket, and a mode without a date, are refused.
bob.create_bucket(Bucket="plainb")
check(code_of(lambda: bob.put_object(Bucket="plainb", Key="x", Body=b"x", ObjectLockMode="GOVERNANCE", ObjectLockRetainUntilDate=until)) == "InvalidRequest", "no lock here")
check(code_of(lambda: bob.get_object_lock_configuration(Bucket="plainb")) == "ObjectLockConfigurationNotFoundError", "no configuration")
check(code_of(lambda: bob.put_object(Bucket="vault", Key="x", Body=b"x", ObjectLockMode="GOVERNANCE")) == "InvalidArgument", "a mode needs a date")
check(code_of(lambda: bob.put_object(Bucket="vault", Key="x", Body=b"x", ObjectLockMode="GOVERNANCE",
                                     ObjectLockRetainUntilDate=datetime.datetime(2001, 1, 1, tzinfo=datetime.timezone.utc))) == "InvalidArgument", "a date in the past")
# Enabling Object Lock on an existing bucket needs versioning on first.
check(code_of(lambda: bob.put_object_lock_configuration(Bucket="plainb", ObjectLockConfiguration={"ObjectLockEnabled": "Enabled"})) == "InvalidBucketState", "versioning first")
bob.put_bucket_versioning(Bucket="plainb", VersioningConfiguration={"Status": "Enabled"})
bob.put_object_lock_configuration(Bucket="plainb", ObjectLockConfiguration={"ObjectLockEnabled": "Enabled"})
check(bob.get_object_lock_configuration(Bucket="plainb")["ObjectLockConfiguration"]["ObjectLockEnabled"] == "Enabled", "lock turned on")
check(code_of(lambda: bob.delete_bucket(Bucket="vault")) == "BucketNotEmpty", "a vault with versions stays")

# Bucket tags.
check(code_of(lambda: bob.get_bucket_tagging(Bucket="plainb")) == "NoSuchTagSet", "no tags yet")
bob.put_bucket_tagging(Bucket="plainb", Tagging={"TagSet": [{"Key": "team", "Value": "ops"}, {"Key": "cost", "Value": "42"}]})
check(sorted((t["Key"], t["Value"]) for t in bob.get_bucket_tagging(Bucket="plainb")["TagSet"]) == [("cost", "42"), ("team", "ops")], "bucket tags")
check(code_of(lambda: bob.put_bucket_tagging(Bucket="plainb", Tagging={"TagSet": [{"Key": "a", "Value": "1"}, {"Key": "a", "Value": "2"}]})) == "InvalidTag", "a repeated key")
bob.delete_bucket_tagging(Bucket="plainb")
check(code_of(lambda: bob.get_bucket_tagging(Bucket="plainb")) == "NoSuchTagSet", "tags removed")

# The anonymous-read policy: objects readable without signing, listing only if granted.
anon = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                    config=Config(signature_version=botocore.UNSIGNED, s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
bob.put_object(Bucket="plainb", Key="pub.txt", Body=b"for everyone")
check(code_of(lambda: anon.get_object(Bucket="plainb", Key="pub.txt")) == "AccessDenied", "private before")
check(code_of(lambda: bob.get_bucket_policy(Bucket="plainb")) == "NoSuchBucketPolicy", "no policy yet")
policy = ('{"Version":"2012-10-17","Statement":[{"Sid":"PublicRead","Effect":"Allow","Principal":"*",'
          '"Action":["s3:GetObject"],"Resource":["arn:aws:s3:::plainb/*"]}]}')
bob.put_bucket_policy(Bucket="plainb", Policy=policy)
check(bob.get_bucket_policy(Bucket="plainb")["Policy"] == policy, "the policy as given")
check(bob.get_bucket_policy_status(Bucket="plainb")["PolicyStatus"]["IsPublic"] is True, "public")
check(anon.get_object(Bucket="plainb", Key="pub.txt")["Body"].read() == b"for everyone", "read anonymously")
check(code_of(lambda: anon.list_objects_v2(Bucket="plainb")) == "AccessDenied", "not listed without s3:ListBucket")
check(code_of(lambda: anon.put_object(Bucket="plainb", Key="x", Body=b"x")) == "AccessDenied", "never written anonymously")
check(code_of(lambda: bob.put_bucket_policy(Bucket="plainb", Policy=policy.replace("s3:GetObject", "s3:PutObject"))) == "MalformedPolicy", "other policies refused")
bob.delete_bucket_policy(Bucket="plainb")
check(code_of(lambda: anon.get_object(Bucket="plainb", Key="pub.txt")) == "AccessDenied", "private again")

# CORS: rules kept, preflights answered from them, responses marked.
import urllib.request
import urllib.error
check(code_of(lambda: bob.get_bucket_cors(Bucket="plainb")) == "NoSuchCORSConfiguration", "no CORS yet")
bob.put_bucket_cors(Bucket="plainb", CORSConfiguration={"CORSRules": [
    {"AllowedOrigins": ["https://*.example.org"], "AllowedMethods": ["GET", "PUT"], "AllowedHeaders": ["*"],
     "ExposeHeaders": ["ETag"], "MaxAgeSeconds": 600}]})
rules = bob.get_bucket_cors(Bucket="plainb")["CORSRules"]
check(rules[0]["AllowedMethods"] == ["GET", "PUT"] and rules[0]["MaxAgeSeconds"] == 600, f"CORS rules: {rules}")


def preflight(origin, method):
    r = urllib.request.Request(f"{endpoint}/plainb/pub.txt", method="OPTIONS",
                               headers={"Origin": origin, "Access-Control-Request-Method": method,
                                        "Access-Control-Request-Headers": "content-type,x-amz-date"})
    try:
        with urllib.request.urlopen(r) as resp:
            return resp.status, resp.headers
    except urllib.error.HTTPError as e:
        return e.code, e.headers


st, h = preflight("https://app.example.org", "PUT")
check(st == 200 and h.get("Access-Control-Allow-Origin") == "https://app.example.org", f"preflight allowed: {st} {h}")
check("PUT" in h.get("Access-Control-Allow-Methods", "") and h.get("Access-Control-Max-Age") == "600", f"preflight headers: {h}")
check(preflight("https://evil.example.com", "PUT")[0] == 403, "another origin refused")
check(preflight("https://app.example.org", "DELETE")[0] == 403, "another method refused")
presigner = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=uk, aws_secret_access_key=us, region_name="us-east-1",
                         config=Config(signature_version="s3v4", s3={"addressing_style": "path"}))
u = presigner.generate_presigned_url("get_object", Params={"Bucket": "plainb", "Key": "pub.txt"}, ExpiresIn=60)
try:
    with urllib.request.urlopen(urllib.request.Request(u, headers={"Origin": "https://app.example.org"})) as resp:
        check(resp.headers.get("Access-Control-Allow-Origin") == "https://app.example.org" and resp.headers.get("Access-Control-Expose-Headers") == "ETag", "a response marked for its origin")
except urllib.error.HTTPError as e:
    check(False, f"a signed GET with an Origin: {e.code} {e.read()}")
bob.delete_bucket_cors(Bucket="plainb")
check(preflight("https://app.example.org", "PUT")[0] == 403, "CORS removed")

# A browser's POST upload (a signed policy), and its limits.
post = presigner.generate_presigned_post("plainb", "uploads/note.txt", Fields={"Content-Type": "text/plain"},
                                   Conditions=[{"Content-Type": "text/plain"}, ["starts-with", "$key", "uploads/"],
                                               ["content-length-range", 1, 1000]], ExpiresIn=60)


def post_form(fields, name, data):
    boundary = "----tankform" + hashlib.md5(data).hexdigest()
    body = b""
    for k, v in fields.items():
        body += f"--{boundary}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{v}\r\n".encode()
    body += f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\nContent-Type: text/plain\r\n\r\n".encode()
    body += data + f"\r\n--{boundary}--\r\n".encode()
    r = urllib.request.Request(post["url"], data=body, method="POST",
                               headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    try:
        with urllib.request.urlopen(r) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        global last_error
        last_error = e.read()
        return e.code


last_error = None
st = post_form(post["fields"], "note.txt", b"posted from a form")
check(st == 204, f"a POST upload: {st} {last_error}")
check(bob.get_object(Bucket="plainb", Key="uploads/note.txt")["Body"].read() == b"posted from a form", "its object")
check(post_form(post["fields"], "big.txt", b"x" * 2000) in (400, 403), "over the policy's length range")
bad = dict(post["fields"], **{"Content-Type": "text/html"})
st = post_form(bad, "x.txt", b"x")
check(st in (400, 403), f"a field the policy does not allow: {st} {last_error}")
forged = dict(post["fields"], **{"x-amz-signature": "0" * 64})
check(post_form(forged, "y.txt", b"y") == 403, "a forged signature")
check(bob.get_object(Bucket="plainb", Key="uploads/note.txt")["Body"].read() == b"posted from a form", "refusals change nothing")

# Lifecycle rules (the daemon runs them every second, with a day of two seconds).
import time
bob.create_bucket(Bucket="life")
bob.put_bucket_versioning(Bucket="life", VersioningConfiguration={"Status": "Enabled"})
for k in ["logs/a", "logs/b", "logs/a", "keep/c"]:
    bob.put_object(Bucket="life", Key=k, Body=k.encode())
stale = bob.create_multipart_upload(Bucket="life", Key="logs/big")["UploadId"]
kept_up = bob.create_multipart_upload(Bucket="life", Key="keep/big")["UploadId"]
rules = [
    {"ID": "logs", "Status": "Enabled", "Filter": {"Prefix": "logs/"},
     "Expiration": {"Days": 1}, "NoncurrentVersionExpiration": {"NoncurrentDays": 1},
     "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1}},
    {"ID": "markers", "Status": "Enabled", "Filter": {"Prefix": "logs/"}, "Expiration": {"ExpiredObjectDeleteMarker": True}},
    {"ID": "off", "Status": "Disabled", "Filter": {"Prefix": "keep/"}, "Expiration": {"Days": 1}},
]
bob.put_bucket_lifecycle_configuration(Bucket="life", LifecycleConfiguration={"Rules": rules})
got = bob.get_bucket_lifecycle_configuration(Bucket="life")["Rules"]
check([r["ID"] for r in got] == ["logs", "markers", "off"] and got[0]["Expiration"] == {"Days": 1}, f"rules kept: {got}")
check(code_of(lambda: bob.put_bucket_lifecycle_configuration(Bucket="life", LifecycleConfiguration={"Rules": [
    {"ID": "t", "Status": "Enabled", "Filter": {"Prefix": ""}, "Transitions": [{"Days": 1, "StorageClass": "GLACIER"}]}]})) == "NotImplemented", "no transitions")
deadline = time.time() + 30
while time.time() < deadline:
    vs, dms, _ = versions(bob, "life", Prefix="logs/")
    ups = bob.list_multipart_uploads(Bucket="life").get("Uploads", [])
    if not vs and not dms and [u["UploadId"] for u in ups] == [kept_up]:
        break
    time.sleep(0.5)
vs, dms, _ = versions(bob, "life", Prefix="logs/")
check(not vs and not dms, f"logs/ expired, its versions and then its markers removed: {vs} {dms}")
check([u["UploadId"] for u in bob.list_multipart_uploads(Bucket="life").get("Uploads", [])] == [kept_up], "the stale upload aborted")
check(bob.get_object(Bucket="life", Key="keep/c")["Body"].read() == b"keep/c", "outside the rules, kept")
bob.delete_bucket_lifecycle(Bucket="life")
check(code_of(lambda: bob.get_bucket_lifecycle_configuration(Bucket="life")) == "NoSuchLifecycleConfiguration", "rules removed")

# Object Lock wins over lifecycle rules.
admin.put_bucket_lifecycle_configuration(Bucket="vault", LifecycleConfiguration={"Rules": [
    {"ID": "all", "Status": "Enabled", "Filter": {"Prefix": ""}, "NoncurrentVersionExpiration": {"NoncurrentDays": 1}}]})
time.sleep(6)
check(bob.get_object(Bucket="vault", Key="ledger", VersionId=kept)["Body"].read() == b"kept", "a locked version outlives the rules")

print(f"versions workout: {checks} checks passed")
