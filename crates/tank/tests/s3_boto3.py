"""A workout of tank's S3 endpoint with boto3, the AWS SDK for Python: run by tests/s3.rs
against a daemon it started on 127.0.0.1.

    python3 s3_boto3.py ENDPOINT ADMIN_KEY ADMIN_SECRET USER_KEY USER_SECRET MOUNT_DIR

ADMIN is an administrator; USER ("bob") an account named in the bucket "shared" only, and
"readonly" is a read-only share he may read, "pub" a public one of the administrator's. MOUNT_DIR
is the local mount of the pool's root filesystem, or "-" where FUSE cannot be mounted.
Prints "boto3 workout: N checks passed" and exits 0, or raises at the first failed check.
"""

import base64
import concurrent.futures
import hashlib
import io
import os
import socket
import sys
import urllib.parse
import urllib.request

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


def client(key, secret, **cfg):
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}, **cfg),
    )


def code_of(f):
    try:
        f()
    except botocore.exceptions.ClientError as e:
        return e.response["Error"]["Code"]
    return None


admin = client(ak, sk)
bob = client(uk, us)

# Buckets: created by the administrator; bob (no s3_bucket_create) may not.
check(admin.create_bucket(Bucket="work")["ResponseMetadata"]["HTTPStatusCode"] == 200, "create")
check(code_of(lambda: admin.create_bucket(Bucket="work")) == "BucketAlreadyOwnedByYou", "twice")
check(code_of(lambda: bob.create_bucket(Bucket="bobs")) == "AccessDenied", "bob creates")
names = [b["Name"] for b in admin.list_buckets()["Buckets"]]
check({"work", "shared", "readonly", "pub"} <= set(names), f"admin lists {names}")
names = [b["Name"] for b in bob.list_buckets()["Buckets"]]
check("shared" in names and "work" not in names, f"bob lists {names}")
check(admin.head_bucket(Bucket="work")["ResponseMetadata"]["HTTPStatusCode"] == 200, "head")
check(code_of(lambda: admin.head_bucket(Bucket="nothere")) in ("404", "NoSuchBucket"), "head 404")

# Objects: bytes, metadata, ranges, conditions.
body = os.urandom(300_000)
md5 = hashlib.md5(body).hexdigest()
r = admin.put_object(Bucket="work", Key="docs/report.bin", Body=body, ContentType="application/x-test",
                     Metadata={"owner": "ops", "n": "1"}, CacheControl="no-cache")
check(r["ETag"] == f'"{md5}"', "the ETag is the MD5")
o = admin.get_object(Bucket="work", Key="docs/report.bin")
check(o["Body"].read() == body, "read back")
check(o["ContentType"] == "application/x-test" and o["Metadata"] == {"owner": "ops", "n": "1"}, "metadata")
check(o["CacheControl"] == "no-cache", "cache-control")
h = admin.head_object(Bucket="work", Key="docs/report.bin")
check(h["ContentLength"] == len(body) and h["ETag"] == f'"{md5}"', "head")
part = admin.get_object(Bucket="work", Key="docs/report.bin", Range="bytes=1000-1999")
check(part["Body"].read() == body[1000:2000] and part["ContentRange"] == f"bytes 1000-1999/{len(body)}", "range")
tail = admin.get_object(Bucket="work", Key="docs/report.bin", Range="bytes=-10")["Body"].read()
check(tail == body[-10:], "suffix range")
check(code_of(lambda: admin.get_object(Bucket="work", Key="docs/report.bin", Range="bytes=999999999-")) == "InvalidRange", "416")
check(code_of(lambda: admin.get_object(Bucket="work", Key="docs/report.bin", IfMatch='"00"')) == "PreconditionFailed", "if-match")
check(code_of(lambda: admin.get_object(Bucket="work", Key="docs/report.bin", IfNoneMatch=f'"{md5}"')) == "304", "if-none-match")
check(admin.get_object(Bucket="work", Key="docs/report.bin", IfMatch=f'"{md5}"')["ContentLength"] == len(body), "if-match ok")
check(code_of(lambda: admin.put_object(Bucket="work", Key="docs/report.bin", Body=b"x", IfNoneMatch="*")) == "PreconditionFailed", "if-none-match *")
check(code_of(lambda: admin.get_object(Bucket="work", Key="nope")) == "NoSuchKey", "NoSuchKey")

# Content-MD5 and checksums are verified; a bad one leaves the object as it was.
bad_md5 = base64.b64encode(hashlib.md5(b"other").digest()).decode()
check(code_of(lambda: admin.put_object(Bucket="work", Key="docs/report.bin", Body=b"new", ContentMD5=bad_md5)) == "BadDigest", "Content-MD5")
check(admin.get_object(Bucket="work", Key="docs/report.bin")["Body"].read() == body, "unchanged after BadDigest")
# (CRC32C needs botocore's optional native package; the server checks it as the others.)
for alg in ["CRC32", "SHA1", "SHA256"]:
    r = admin.put_object(Bucket="work", Key=f"sum/{alg}", Body=b"checksummed", ChecksumAlgorithm=alg)
    check(r.get(f"Checksum{alg}"), f"{alg} returned")
sha = base64.b64encode(hashlib.sha256(b"other").digest()).decode()
check(code_of(lambda: admin.put_object(Bucket="work", Key="sum/bad", Body=b"body", ChecksumSHA256=sha)) == "BadDigest", "x-amz-checksum-sha256")
check(code_of(lambda: admin.head_object(Bucket="work", Key="sum/bad")) in ("404", "NoSuchKey"), "nothing left")

# Keys that are not plain paths, and an object that is also a prefix.
odd = ["a//b", "./dot", "x/../y", ".tank/snap", "k" * 300, "a", "a/b", "ünï/cödé", "sp ace/+plus"]
for k in odd:
    admin.put_object(Bucket="work", Key=k, Body=k.encode())
for k in odd:
    check(admin.get_object(Bucket="work", Key=k)["Body"].read() == k.encode(), f"odd key {k[:20]}")
keys = []
for page in admin.get_paginator("list_objects_v2").paginate(Bucket="work", PaginationConfig={"PageSize": 3}):
    keys += [x["Key"] for x in page.get("Contents", [])]
want = sorted(odd + ["docs/report.bin"] + [f"sum/{a}" for a in ["CRC32", "SHA1", "SHA256"]],
              key=lambda s: s.encode())
check(keys == want, f"listing in UTF-8 binary order: {keys} != {want}")
r = admin.list_objects_v2(Bucket="work", Delimiter="/", Prefix="")
cps = [p["Prefix"] for p in r.get("CommonPrefixes", [])]
check("docs/" in cps and "sum/" in cps and "a/" in cps, f"common prefixes {cps}")
check("a" in [x["Key"] for x in r["Contents"]], "a beside a/")
r = admin.list_objects_v2(Bucket="work", Prefix="sum/", StartAfter="sum/CRC32")
check([x["Key"] for x in r["Contents"]] == ["sum/SHA1", "sum/SHA256"], "start-after")
r = admin.list_objects(Bucket="work", Prefix="sum/", MaxKeys=2)
check(r["IsTruncated"] and len(r["Contents"]) == 2, "v1 max-keys")
r = admin.list_objects_v2(Bucket="work", Prefix="sp ace/", EncodingType="url")
check(r["Contents"][0]["Key"] in ("sp%20ace/%2Bplus", "sp ace/+plus"), f"url encoding {r['Contents'][0]['Key']}")

# Copies, deletes.
admin.copy_object(Bucket="work", Key="copy/report.bin", CopySource={"Bucket": "work", "Key": "docs/report.bin"})
check(admin.get_object(Bucket="work", Key="copy/report.bin")["Body"].read() == body, "copy")
admin.copy_object(Bucket="work", Key="copy/meta", CopySource={"Bucket": "work", "Key": "docs/report.bin"},
                  MetadataDirective="REPLACE", Metadata={"new": "yes"}, ContentType="text/x-new")
h = admin.head_object(Bucket="work", Key="copy/meta")
check(h["Metadata"] == {"new": "yes"} and h["ContentType"] == "text/x-new", "copy with REPLACE")
check(code_of(lambda: admin.copy_object(Bucket="work", Key="docs/report.bin", CopySource={"Bucket": "work", "Key": "docs/report.bin"})) == "InvalidRequest", "copy onto itself")
r = admin.delete_objects(Bucket="work", Delete={"Objects": [{"Key": k} for k in odd]})
check(len(r["Deleted"]) == len(odd), "delete objects")
for k in odd:
    check(code_of(lambda: admin.head_object(Bucket="work", Key=k)) in ("404", "NoSuchKey"), f"{k[:20]} gone")
admin.delete_object(Bucket="work", Key="never-was")

# Multipart: 3 parts of 5 MiB and a tail, completed; a bad part list refused; abort.
parts_body = [os.urandom(5 << 20) for _ in range(3)] + [os.urandom(1000)]
up = admin.create_multipart_upload(Bucket="work", Key="mp/big.bin", ContentType="application/x-mp")
uid = up["UploadId"]
etags = []
for i, p in enumerate(parts_body, 1):
    etags.append(admin.upload_part(Bucket="work", Key="mp/big.bin", UploadId=uid, PartNumber=i, Body=p)["ETag"])
lp = admin.list_parts(Bucket="work", Key="mp/big.bin", UploadId=uid)
check([p["PartNumber"] for p in lp["Parts"]] == [1, 2, 3, 4], "list parts")
ups = admin.list_multipart_uploads(Bucket="work")
check([u["UploadId"] for u in ups.get("Uploads", [])] == [uid], "list uploads")
check(code_of(lambda: admin.complete_multipart_upload(Bucket="work", Key="mp/big.bin", UploadId=uid, MultipartUpload={
    "Parts": [{"PartNumber": 2, "ETag": etags[1]}, {"PartNumber": 1, "ETag": etags[0]}]})) == "InvalidPartOrder", "order")
check(code_of(lambda: admin.complete_multipart_upload(Bucket="work", Key="mp/big.bin", UploadId=uid, MultipartUpload={
    "Parts": [{"PartNumber": 1, "ETag": '"0000"'}]})) == "InvalidPart", "bad etag")
check(code_of(lambda: admin.complete_multipart_upload(Bucket="work", Key="mp/big.bin", UploadId=uid, MultipartUpload={
    "Parts": [{"PartNumber": 4, "ETag": etags[3]}, {"PartNumber": 5, "ETag": etags[3]}]})) == "InvalidPart", "missing part")
r = admin.complete_multipart_upload(Bucket="work", Key="mp/big.bin", UploadId=uid, MultipartUpload={
    "Parts": [{"PartNumber": i, "ETag": e} for i, e in enumerate(etags, 1)]})
want_etag = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts_body)).hexdigest() + "-4"
check(r["ETag"] == f'"{want_etag}"', f"multipart ETag {r['ETag']}")
o = admin.get_object(Bucket="work", Key="mp/big.bin")
check(o["Body"].read() == b"".join(parts_body) and o["ContentType"] == "application/x-mp", "multipart body")
check(admin.list_multipart_uploads(Bucket="work").get("Uploads", []) == [], "the upload is gone")
up2 = admin.create_multipart_upload(Bucket="work", Key="mp/aborted")["UploadId"]
admin.upload_part(Bucket="work", Key="mp/aborted", UploadId=up2, PartNumber=1, Body=b"x")
admin.abort_multipart_upload(Bucket="work", Key="mp/aborted", UploadId=up2)
check(code_of(lambda: admin.list_parts(Bucket="work", Key="mp/aborted", UploadId=up2)) == "NoSuchUpload", "aborted")
# boto3's own managed transfer (multipart above its threshold, parts in parallel).
big = os.urandom(24 << 20)
admin.upload_fileobj(io.BytesIO(big), "work", "managed.bin")
out = io.BytesIO()
admin.download_fileobj("work", "managed.bin", out)
check(out.getvalue() == big, "managed transfer")

# UploadPartCopy: a part copied whole, and one from a byte range of an object.
src = os.urandom(6 << 20)
admin.put_object(Bucket="work", Key="pc/src", Body=src)
uid = admin.create_multipart_upload(Bucket="work", Key="pc/dst")["UploadId"]
e1 = admin.upload_part_copy(Bucket="work", Key="pc/dst", UploadId=uid, PartNumber=1,
                            CopySource={"Bucket": "work", "Key": "pc/src"})["CopyPartResult"]["ETag"]
e2 = admin.upload_part_copy(Bucket="work", Key="pc/dst", UploadId=uid, PartNumber=2,
                            CopySource={"Bucket": "work", "Key": "pc/src"}, CopySourceRange="bytes=100-1099")["CopyPartResult"]["ETag"]
check(e1 == f'"{hashlib.md5(src).hexdigest()}"', "a copied part's ETag")
check(code_of(lambda: admin.upload_part_copy(Bucket="work", Key="pc/dst", UploadId=uid, PartNumber=3,
      CopySource={"Bucket": "work", "Key": "pc/src"}, CopySourceRange=f"bytes=0-{len(src)}")) == "InvalidRange", "range past the end")
admin.complete_multipart_upload(Bucket="work", Key="pc/dst", UploadId=uid, MultipartUpload={
    "Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]})
check(admin.get_object(Bucket="work", Key="pc/dst")["Body"].read() == src + src[100:1100], "copied parts")

# Object tagging, and versioning as never enabled.
admin.put_object(Bucket="work", Key="tagged", Body=b"t", Tagging="a=1&b=two%20words")
check(admin.head_object(Bucket="work", Key="tagged")["ResponseMetadata"]["HTTPHeaders"].get("x-amz-tagging-count") in (None, "2"), "tag count")
tags = {t["Key"]: t["Value"] for t in admin.get_object_tagging(Bucket="work", Key="tagged")["TagSet"]}
check(tags == {"a": "1", "b": "two words"}, f"tags {tags}")
admin.put_object_tagging(Bucket="work", Key="tagged", Tagging={"TagSet": [{"Key": "x/y", "Value": "z&w"}]})
tags = {t["Key"]: t["Value"] for t in admin.get_object_tagging(Bucket="work", Key="tagged")["TagSet"]}
check(tags == {"x/y": "z&w"}, f"tags replaced {tags}")
check(admin.get_object(Bucket="work", Key="tagged")["Body"].read() == b"t", "tagging keeps the bytes")
check(code_of(lambda: admin.put_object_tagging(Bucket="work", Key="tagged", Tagging={"TagSet": [
    {"Key": f"k{i}", "Value": "v"} for i in range(11)]})) == "InvalidTag", "11 tags")
admin.delete_object_tagging(Bucket="work", Key="tagged")
check(admin.get_object_tagging(Bucket="work", Key="tagged")["TagSet"] == [], "tags deleted")
check(code_of(lambda: admin.get_object_tagging(Bucket="work", Key="nope")) == "NoSuchKey", "tags of nothing")
check("Status" not in admin.get_bucket_versioning(Bucket="work"), "versioning never enabled")

# Concurrent PUTs of one key: one whole winner.
bodies = [bytes([i]) * (1 << 20) for i in range(8)]
with concurrent.futures.ThreadPoolExecutor(8) as ex:
    list(ex.map(lambda b: client(ak, sk).put_object(Bucket="work", Key="race", Body=b), bodies))
got = admin.get_object(Bucket="work", Key="race")["Body"].read()
check(got in bodies, "one whole winner")

# Access: bob only in "shared"; "readonly" refuses writes; "pub" is readable unsigned.
check(code_of(lambda: bob.get_object(Bucket="work", Key="race")) == "AccessDenied", "bob reads work")
check(code_of(lambda: bob.put_object(Bucket="work", Key="x", Body=b"x")) == "AccessDenied", "bob writes work")
# A refusal given before the body was wanted ("Expect: 100-continue" unanswered) closes
# the connection: botocore would read the connection's next answer with this one's status.
try:
    bob.put_object(Bucket="work", Key="x", Body=b"x")
    check(False, "bob wrote work")
except botocore.exceptions.ClientError as e:
    check(e.response["ResponseMetadata"]["HTTPHeaders"].get("connection") == "close",
          f"a refused PUT closes its connection: {e.response['ResponseMetadata']['HTTPHeaders']}")
bob.put_object(Bucket="shared", Key="from-bob.txt", Body=b"bob was here")
check(admin.get_object(Bucket="shared", Key="from-bob.txt")["Body"].read() == b"bob was here", "shared")
check(code_of(lambda: bob.put_object(Bucket="readonly", Key="x", Body=b"x")) == "AccessDenied", "read-only bucket")
check(code_of(lambda: admin.put_object(Bucket="readonly", Key="x", Body=b"x")) == "AccessDenied", "read-only for admin too")
bob.list_objects_v2(Bucket="readonly")
admin.put_object(Bucket="pub", Key="hello.txt", Body=b"public")
anon = client(None, None, signature_version=botocore.UNSIGNED)
check(anon.get_object(Bucket="pub", Key="hello.txt")["Body"].read() == b"public", "anonymous read")
check(code_of(lambda: anon.put_object(Bucket="pub", Key="x", Body=b"x")) == "AccessDenied", "anonymous write")
check(code_of(lambda: anon.get_object(Bucket="work", Key="race")) == "AccessDenied", "anonymous private")
check(code_of(lambda: anon.list_buckets()) == "AccessDenied", "anonymous list")
with urllib.request.urlopen(f"{endpoint}/pub/hello.txt") as r:
    check(r.read() == b"public", "plain HTTP GET of a public object")

# Authentication: wrong secret, unknown key, Signature Version 2, presigned URLs.
check(code_of(lambda: client(ak, "x" * 40).list_buckets()) == "SignatureDoesNotMatch", "wrong secret")
check(code_of(lambda: client("AKIANOTAKEY000000000", sk).list_buckets()) == "InvalidAccessKeyId", "unknown key")
check(code_of(lambda: client(ak, sk, signature_version="s3").list_buckets()) == "AccessDenied", "SigV2 refused")
v2url = client(ak, sk, signature_version="s3").generate_presigned_url(
    "get_object", Params={"Bucket": "work", "Key": "race"}, ExpiresIn=60)
try:
    urllib.request.urlopen(v2url)
    check(False, "a SigV2 presigned URL was accepted")
except urllib.error.HTTPError as e:
    check(e.code == 403, f"SigV2 presigned: {e.code}")
presigner = client(ak, sk, signature_version="s3v4")
url = presigner.generate_presigned_url("get_object", Params={"Bucket": "work", "Key": "race"}, ExpiresIn=60)
with urllib.request.urlopen(url) as r:
    check(r.read() == got, "presigned GET")
url = presigner.generate_presigned_url("put_object", Params={"Bucket": "work", "Key": "presigned"}, ExpiresIn=60)
req = urllib.request.Request(url, data=b"via presigned PUT", method="PUT")
with urllib.request.urlopen(req) as r:
    check(r.status == 200, "presigned PUT")
check(admin.get_object(Bucket="work", Key="presigned")["Body"].read() == b"via presigned PUT", "presigned body")
tampered = url.replace("presigned", "tampered")
try:
    urllib.request.urlopen(urllib.request.Request(tampered, data=b"x", method="PUT"))
    check(False, "a tampered presigned URL was accepted")
except urllib.error.HTTPError as e:
    check(e.code == 403, f"tampered presigned: {e.code}")

# A body cut short (a client that goes away mid-upload): nothing is stored, and what was
# there stays.
admin.put_object(Bucket="work", Key="cut", Body=b"before")
url = presigner.generate_presigned_url("put_object", Params={"Bucket": "work", "Key": "cut"}, ExpiresIn=60)
u = urllib.parse.urlparse(url)
s = socket.create_connection((u.hostname, u.port))
s.sendall(f"PUT {u.path}?{u.query} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Length: 3000000\r\n\r\n".encode() + b"y" * 100000)
s.close()
import time
time.sleep(1)
check(admin.get_object(Bucket="work", Key="cut")["Body"].read() == b"before", "a cut body changes nothing")

# The same bytes as files, both ways, through the local mount.
if mount != "-":
    p = os.path.join(mount, "work", "docs", "report.bin")
    with open(p, "rb") as f:
        check(f.read() == body, "an object is a file of the mount")
    with open(os.path.join(mount, "work", "from-mount.txt"), "wb") as f:
        f.write(b"written through the mount")
    check(admin.get_object(Bucket="work", Key="from-mount.txt")["Body"].read() == b"written through the mount", "a file is an object")
    e = admin.head_object(Bucket="work", Key="from-mount.txt")["ETag"]
    check(e.endswith('-1"'), f"a file's ETag is not taken for an MD5: {e}")

# Buckets: not deleted while they hold objects.
check(code_of(lambda: admin.delete_bucket(Bucket="work")) == "BucketNotEmpty", "not empty")
admin.create_bucket(Bucket="scratch")
admin.put_object(Bucket="scratch", Key="x", Body=b"x")
admin.delete_object(Bucket="scratch", Key="x")
admin.delete_bucket(Bucket="scratch")
check("scratch" not in [b["Name"] for b in admin.list_buckets()["Buckets"]], "deleted bucket")

print(f"boto3 workout: {checks} checks passed")
