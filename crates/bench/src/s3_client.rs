//! A small S3 client for the benchmark: PUT and GET of objects over one kept-alive HTTP/1.1
//! connection, signed with AWS Signature V4 (the payload unsigned, as the AWS SDKs send
//! it over TLS, so the client spends no time hashing bodies).
//!
//! Written here rather than taken from an SDK: the load generator must be light and the
//! same for every server it measures, and the AWS SDK for Rust would bring its own runtime
//! and retries into the timings. Only what the benchmark needs: no redirects, no retries,
//! no chunked request bodies.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

/// A connection to an S3 endpoint at `host:port` (plain HTTP).
pub struct S3Client {
    addr: String,
    access_key: String,
    secret_key: String,
    region: String,
    conn: Option<BufReader<TcpStream>>,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("any key length");
    m.update(data);
    m.finalize().into_bytes().to_vec()
}

/// `YYYYMMDD` and `YYYYMMDDTHHMMSSZ` of a time.
fn amz_dates(t: SystemTime) -> (String, String) {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let date = format!("{y:04}{m:02}{d:02}");
    let time = format!(
        "{date}T{:02}{:02}{:02}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    );
    (date, time)
}

impl S3Client {
    pub fn new(addr: &str, access_key: &str, secret_key: &str) -> S3Client {
        S3Client {
            addr: addr.to_string(),
            access_key: access_key.to_string(),
            secret_key: secret_key.to_string(),
            region: "us-east-1".into(),
            conn: None,
        }
    }

    /// The headers of a signed request for `method` on `path` (already URI-encoded).
    fn signed_headers(&self, method: &str, path: &str) -> String {
        let (date, time) = amz_dates(SystemTime::now());
        let payload = "UNSIGNED-PAYLOAD";
        let canonical = format!(
            "{method}\n{path}\n\nhost:{}\nx-amz-content-sha256:{payload}\nx-amz-date:{time}\n\nhost;x-amz-content-sha256;x-amz-date\n{payload}",
            self.addr
        );
        let scope = format!("{date}/{}/s3/aws4_request", self.region);
        let to_sign = format!(
            "AWS4-HMAC-SHA256\n{time}\n{scope}\n{}",
            hex(&Sha256::digest(canonical.as_bytes()))
        );
        let k = hmac(
            format!("AWS4{}", self.secret_key).as_bytes(),
            date.as_bytes(),
        );
        let k = hmac(&k, self.region.as_bytes());
        let k = hmac(&k, b"s3");
        let k = hmac(&k, b"aws4_request");
        let sig = hex(&hmac(&k, to_sign.as_bytes()));
        format!(
            "Host: {}\r\nx-amz-content-sha256: {payload}\r\nx-amz-date: {time}\r\nAuthorization: AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature={sig}\r\n",
            self.addr, self.access_key
        )
    }

    fn conn(&mut self) -> Result<&mut BufReader<TcpStream>> {
        if self.conn.is_none() {
            let s = TcpStream::connect(&self.addr)
                .with_context(|| format!("cannot connect to {}", self.addr))?;
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(Duration::from_secs(120)))?;
            s.set_write_timeout(Some(Duration::from_secs(120)))?;
            self.conn = Some(BufReader::with_capacity(256 << 10, s));
        }
        Ok(self.conn.as_mut().expect("just made"))
    }

    /// Sends a request and reads the reply: its status and, into `into`, its body.
    fn request(
        &mut self,
        method: &str,
        path: &str,
        body: &[u8],
        into: &mut Vec<u8>,
    ) -> Result<u16> {
        let head = format!(
            "{method} {path} HTTP/1.1\r\n{}Content-Length: {}\r\n\r\n",
            self.signed_headers(method, path),
            body.len()
        );
        let r = self.exchange(head.as_bytes(), body, into);
        if r.is_err() {
            self.conn = None;
        }
        r
    }

    fn exchange(&mut self, head: &[u8], body: &[u8], into: &mut Vec<u8>) -> Result<u16> {
        let c = self.conn()?;
        c.get_mut().write_all(head)?;
        c.get_mut().write_all(body)?;
        let mut line = String::new();
        c.read_line(&mut line)?;
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("not an HTTP reply: {line:?}"))?;
        let mut len = None;
        let mut chunked = false;
        let mut close = false;
        loop {
            line.clear();
            c.read_line(&mut line)?;
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            let (k, v) = l.split_once(':').unwrap_or((l, ""));
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
            match k.as_str() {
                "content-length" => len = v.parse::<usize>().ok(),
                "transfer-encoding" => chunked = v.eq_ignore_ascii_case("chunked"),
                "connection" => close = v.eq_ignore_ascii_case("close"),
                _ => {}
            }
        }
        into.clear();
        if chunked {
            loop {
                line.clear();
                c.read_line(&mut line)?;
                let n = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                    .context("a bad chunk header")?;
                if n == 0 {
                    line.clear();
                    c.read_line(&mut line)?;
                    break;
                }
                let at = into.len();
                into.resize(at + n, 0);
                c.read_exact(&mut into[at..])?;
                line.clear();
                c.read_line(&mut line)?;
            }
        } else if let Some(n) = len {
            into.resize(n, 0);
            c.read_exact(into)?;
        } else if method_has_no_body(status) {
        } else {
            bail!("a reply with neither a length nor chunks");
        }
        if close {
            self.conn = None;
        }
        Ok(status)
    }

    /// PUT of a bucket.
    pub fn make_bucket(&mut self, bucket: &str) -> Result<()> {
        let mut out = Vec::new();
        let s = self.request("PUT", &format!("/{bucket}"), &[], &mut out)?;
        if s != 200 && s != 409 {
            bail!(
                "cannot make bucket {bucket}: HTTP {s}: {}",
                String::from_utf8_lossy(&out)
            );
        }
        Ok(())
    }

    pub fn put(&mut self, bucket: &str, key: &str, body: &[u8]) -> Result<()> {
        let mut out = Vec::new();
        let s = self.request("PUT", &format!("/{bucket}/{key}"), body, &mut out)?;
        if s != 200 {
            bail!("PUT {key}: HTTP {s}: {}", String::from_utf8_lossy(&out));
        }
        Ok(())
    }

    /// GET of an object into `into`.
    pub fn get(&mut self, bucket: &str, key: &str, into: &mut Vec<u8>) -> Result<()> {
        let s = self.request("GET", &format!("/{bucket}/{key}"), &[], into)?;
        if s != 200 {
            bail!("GET {key}: HTTP {s}: {}", String::from_utf8_lossy(into));
        }
        Ok(())
    }
}

fn method_has_no_body(status: u16) -> bool {
    status == 204 || status == 304 || (100..200).contains(&status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_utc_civil_dates() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_764_072_245);
        assert_eq!(amz_dates(t).1, "20251125T120405Z");
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(amz_dates(t).0, "20000229");
    }
}
