"""Bad requests to tank's S3 endpoint, signed by hand with botocore's SigV4 signer where a
client library would refuse to send them: run by tests/s3.rs against a daemon it started on
127.0.0.1.

    python3 s3_bad_input.py ENDPOINT ADMIN_KEY ADMIN_SECRET

Each must get the S3 error a client expects (or a closed connection) and leave the bucket as
it was; the server must serve on afterwards. Prints "bad input: N checks passed".
"""

import datetime
import hashlib
import socket
import sys
import urllib.parse

import boto3
import botocore
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials

endpoint, ak, sk = sys.argv[1:4]
u = urllib.parse.urlparse(endpoint)
checks = 0


def check(cond, what):
    global checks
    if not cond:
        raise AssertionError(what)
    checks += 1


s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=ak, aws_secret_access_key=sk, region_name="us-east-1",
                  config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
s3.create_bucket(Bucket="bad")
s3.put_object(Bucket="bad", Key="keep", Body=b"kept")


def raw(method, path, body=b"", headers=None, when=None, sign=True):
    """Sends one request (signed with SigV4 at `when`), returns (status, body)."""
    req = AWSRequest(method=method, url=endpoint + path, data=body, headers=dict(headers or {}))
    if "x-amz-content-sha256" not in req.headers:
        req.headers["x-amz-content-sha256"] = hashlib.sha256(body).hexdigest()
    if sign:
        signer = SigV4Auth(Credentials(ak, sk), "s3", "us-east-1")
        if when is not None:
            # The signer takes the time from the clock: stand it somewhere else.
            orig = botocore.auth.get_current_datetime
            botocore.auth.get_current_datetime = lambda *a, **k: when
            try:
                signer.add_auth(req)
            finally:
                botocore.auth.get_current_datetime = orig
        else:
            signer.add_auth(req)
    p = req.prepare()
    s = socket.create_connection((u.hostname, u.port), timeout=30)
    head = f"{method} {path} HTTP/1.1\r\nHost: {u.netloc}\r\nConnection: close\r\n"
    for k, v in p.headers.items():
        if k.lower() not in ("host", "connection"):
            head += f"{k}: {v}\r\n"
    if body and "content-length" not in {k.lower() for k in p.headers}:
        head += f"Content-Length: {len(body)}\r\n"
    try:
        s.sendall(head.encode() + b"\r\n" + body)
    except (BrokenPipeError, ConnectionResetError):
        pass  # answered and closed before the body was all sent: the answer is read below
    data = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            data += b
    except (ConnectionResetError, socket.timeout):
        pass
    s.close()
    if not data:
        return None, b""
    status = int(data.split(b" ", 2)[1])
    return status, data.split(b"\r\n\r\n", 1)[-1]


def code(body):
    b = body.decode(errors="replace")
    return b.split("<Code>", 1)[1].split("</Code>", 1)[0] if "<Code>" in b else b[:80]


def intact():
    check(s3.get_object(Bucket="bad", Key="keep")["Body"].read() == b"kept", "the bucket as it was")


# Malformed XML: DeleteObjects, a multipart complete, tags, versioning.
st, b = raw("POST", "/bad?delete", b"<Delete><Object><Key>keep</Key></Object>", {"Content-MD5": ""})
check(st == 400 and code(b) in ("MalformedXML", "InvalidRequest", "InvalidDigest"), f"a cut Delete document: {st} {code(b)}")
intact()
up = s3.create_multipart_upload(Bucket="bad", Key="mp")["UploadId"]
s3.upload_part(Bucket="bad", Key="mp", UploadId=up, PartNumber=1, Body=b"part")
st, b = raw("POST", f"/bad/mp?uploadId={up}", b"<CompleteMultipartUpload><Part><PartNumber>one</PartNumber></Part>")
check(st == 400 and code(b) == "MalformedXML", f"a malformed complete: {st} {code(b)}")
check([x["UploadId"] for x in s3.list_multipart_uploads(Bucket="bad").get("Uploads", [])] == [up], "the upload still there")
st, b = raw("PUT", "/bad?tagging", b"<Tagging><TagSet><Tag><Key>a</Key>")
check(st == 400 and code(b) == "MalformedXML", f"malformed tags: {st} {code(b)}")
st, b = raw("PUT", "/bad?versioning", b"\x00\xffnot xml at all")
check(st == 400, f"a binary versioning body: {st} {code(b)}")
check("Status" not in s3.get_bucket_versioning(Bucket="bad"), "versioning untouched")
st, b = raw("PUT", "/bad?versioning", b"<VersioningConfiguration><Status>Sometimes</Status></VersioningConfiguration>")
check(st == 400 and code(b) == "MalformedXML", f"an unknown versioning status: {st} {code(b)}")

# Clock skew: a request signed 20 minutes off is refused, even with a good signature.
now = datetime.datetime.now(datetime.timezone.utc)
for off in (-20, 20):
    st, b = raw("GET", "/bad/keep", when=now + datetime.timedelta(minutes=off))
    check(st == 403 and code(b) == "RequestTimeTooSkewed", f"skewed by {off} min: {st} {code(b)}")
st, b = raw("GET", "/bad/keep", when=now + datetime.timedelta(minutes=2))
check(st == 200 and b == b"kept", f"two minutes off is within the allowance: {st}")

# The hand signer is right (a PUT it signs is taken), and a body that is not the one signed
# is refused.
st, b = raw("PUT", "/bad/signed", b"by hand", headers={"x-amz-meta-a": "b"})
check(st == 200, f"a PUT signed by hand: {st} {code(b)}")
req_body = b"evil"
st, b = raw("PUT", "/bad/keep", req_body, headers={"x-amz-content-sha256": hashlib.sha256(b"good").hexdigest()})
check(st in (400, 403), f"a body that is not the one signed: {st} {code(b)}")
intact()

# Oversized: a PUT that announces more than 5 GiB, a huge header block, a huge XML body.
st, b = raw("PUT", "/bad/huge", b"", headers={"Content-Length": str(6 << 30)})
check(st in (400, None) and (st is None or code(b) in ("EntityTooLarge", "MaxMessageLengthExceeded", "InvalidRequest")), f"6 GiB announced: {st} {code(b)}")
try:
    s3.head_object(Bucket="bad", Key="huge")
    check(False, "an oversized PUT left an object")
except botocore.exceptions.ClientError as e:
    check(e.response["Error"]["Code"] in ("404", "NoSuchKey"), "nothing left")
st, b = raw("GET", "/bad/keep", headers={"x-amz-meta-big": "x" * (1 << 20)}, sign=False)
check(st in (400, 431, None), f"a 1 MiB header: {st}")
big = b"<Tagging><TagSet>" + b"<Tag><Key>k</Key><Value>v</Value></Tag>" * 600_000 + b"</TagSet></Tagging>"
st, b = raw("PUT", "/bad?tagging", big)
check(st in (400, 413, None), f"a {len(big) >> 20} MiB XML body: {st} {code(b)}")
intact()

# A truncated aws-chunked body: the object keeps what it had.
chunk = b"5;chunk-signature=" + b"0" * 64 + b"\r\nhello\r\n"
st, b = raw("PUT", "/bad/keep", chunk, headers={"x-amz-content-sha256": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
                                               "x-amz-decoded-content-length": "100", "Content-Encoding": "aws-chunked"})
check(st in (400, 403), f"a cut, badly signed chunked body: {st} {code(b)}")
intact()

# Streaming aws-chunked uploads, made by hand: signed chunks, signed chunks with a signed
# trailer, unsigned chunks with a trailer; then each with something wrong.
import base64
import hmac
import zlib


def hm(k, m):
    return hmac.new(k, m.encode() if isinstance(m, str) else m, hashlib.sha256)


def chunked(key, data, mode, corrupt=None):
    """PUT `data` as aws-chunked in `mode` (signed, signed-trailer, unsigned-trailer)."""
    crc = base64.b64encode(zlib.crc32(data if corrupt != "checksum" else data + b"!").to_bytes(4, "big")).decode()
    sha = {"signed": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD", "signed-trailer": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER",
           "unsigned-trailer": "STREAMING-UNSIGNED-PAYLOAD-TRAILER"}[mode]
    headers = {"x-amz-content-sha256": sha, "Content-Encoding": "aws-chunked",
               "x-amz-decoded-content-length": str(len(data))}
    if mode != "signed":
        headers["x-amz-trailer"] = "x-amz-checksum-crc32"
    req = AWSRequest(method="PUT", url=f"{endpoint}/bad/{key}", data=b"", headers=headers)
    SigV4Auth(Credentials(ak, sk), "s3", "us-east-1").add_auth(req)
    ts = req.context["timestamp"]
    scope = f"{ts[:8]}/us-east-1/s3/aws4_request"
    skey = hm(("AWS4" + sk).encode(), ts[:8]).digest()
    for m in ("us-east-1", "s3", "aws4_request"):
        skey = hm(skey, m).digest()
    prev = req.headers["Authorization"].rsplit("Signature=", 1)[1]
    pieces = [data[i:i + 65536] for i in range(0, len(data), 65536)] + [b""]
    out = b""
    for i, piece in enumerate(pieces):
        if mode == "unsigned-trailer":
            out += f"{len(piece):x}\r\n".encode() + (piece + b"\r\n" if piece else b"")
            continue
        sts = "\n".join(["AWS4-HMAC-SHA256-PAYLOAD", ts, scope, prev, hashlib.sha256(b"").hexdigest(),
                         hashlib.sha256(piece).hexdigest()])
        sig = hm(skey, sts).hexdigest()
        if corrupt == "chunk" and i == 0:
            sig = "0" * 64
        prev = sig
        out += f"{len(piece):x};chunk-signature={sig}\r\n".encode() + piece + b"\r\n"
    if mode != "signed":
        if mode == "signed-trailer":
            out = out[:-2]  # the last chunk's line ends before the trailer
        trailer = f"x-amz-checksum-crc32:{crc}"
        out += trailer.encode() + b"\r\n"
        if mode == "signed-trailer":
            sts = "\n".join(["AWS4-HMAC-SHA256-TRAILER", ts, scope, prev, hashlib.sha256((trailer + "\n").encode()).hexdigest()])
            out += f"x-amz-trailer-signature:{hm(skey, sts).hexdigest()}\r\n".encode()
        out += b"\r\n"
    p = req.prepare()
    sock = socket.create_connection((u.hostname, u.port), timeout=30)
    head = f"PUT /bad/{key} HTTP/1.1\r\nHost: {u.netloc}\r\nConnection: close\r\nContent-Length: {len(out)}\r\n"
    for k, v in p.headers.items():
        if k.lower() not in ("host", "connection", "content-length"):
            head += f"{k}: {v}\r\n"
    sock.sendall(head.encode() + b"\r\n" + out)
    resp = b""
    while True:
        b = sock.recv(65536)
        if not b:
            break
        resp += b
    sock.close()
    return int(resp.split(b" ", 2)[1]), resp.split(b"\r\n\r\n", 1)[-1]


payload = bytes(range(256)) * 1000
for mode in ("signed", "signed-trailer", "unsigned-trailer"):
    st, b = chunked(f"chunked-{mode}", payload, mode)
    check(st == 200, f"aws-chunked {mode}: {st} {code(b)}")
    check(s3.get_object(Bucket="bad", Key=f"chunked-{mode}")["Body"].read() == payload, f"aws-chunked {mode}: its bytes")
st, b = chunked("keep", b"a chunk forged", "signed", corrupt="chunk")
check(st == 403 and code(b) == "SignatureDoesNotMatch", f"a forged chunk signature: {st} {code(b)}")
intact()
for mode in ("signed-trailer", "unsigned-trailer"):
    st, b = chunked("keep", b"a wrong checksum", mode, corrupt="checksum")
    check(st == 400 and code(b) in ("BadDigest", "InvalidRequest", "XAmzContentChecksumMismatch"), f"a wrong trailing checksum ({mode}): {st} {code(b)}")
    intact()

# The server serves on.
s3.put_object(Bucket="bad", Key="after", Body=b"still here")
check(s3.get_object(Bucket="bad", Key="after")["Body"].read() == b"still here", "serving on")
print(f"bad input: {checks} checks passed")
