//! The S3 client of backups (`tank send --to s3://`, `tank receive --from s3://`): the
//! service's [`Bucket`] over HTTP(S), for any S3-compatible store (AWS S3, Ceph RGW, MinIO,
//! Garage).
//!
//! # Theory of operation
//! `rusty-s3` builds and signs each request (AWS Signature V4, as a presigned URL, path-style
//! addressing so any endpoint and IP address works) and parses the XML answers; `ureq`
//! carries it (blocking, rustls with ring, no runtime of its own). Every call is one request
//! with a deadline; an error is the store's own code and message (`404 NoSuchUpload: ...`).
//! A part goes with its Content-MD5, which the store checks before it keeps the part.

use std::io::Read;
use std::time::Duration;

use base64::Engine;
use rusty_s3::actions::{
    CompleteMultipartUpload, CreateMultipartUpload, ListObjectsV2, ListParts, UploadPart,
};
use rusty_s3::{Credentials, S3Action, UrlStyle};
use tank_service::backup::{Bucket, BucketConnector, ObjectEntry, PartEntry, Remote};

/// How long a presigned request stays valid (it is sent at once).
const SIGN_FOR: Duration = Duration::from_secs(3600);

/// Connects [`Bucket`]s to S3 endpoints.
pub struct S3Connector;

impl BucketConnector for S3Connector {
    fn connect(&self, remote: &Remote, bucket: &str) -> Result<Box<dyn Bucket>, String> {
        let endpoint = remote
            .endpoint
            .parse()
            .map_err(|e| format!("bad endpoint '{}': {e}", remote.endpoint))?;
        let b = rusty_s3::Bucket::new(
            endpoint,
            UrlStyle::Path,
            bucket.to_string(),
            remote.region.clone(),
        )
        .map_err(|e| format!("bad endpoint '{}': {e}", remote.endpoint))?;
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(15)))
            .timeout_global(Some(Duration::from_secs(600)))
            .build()
            .into();
        Ok(Box::new(S3Bucket {
            bucket: b,
            creds: Credentials::new(remote.access_key.clone(), remote.secret_key.clone()),
            agent,
        }))
    }
}

struct S3Bucket {
    bucket: rusty_s3::Bucket,
    creds: Credentials,
    agent: ureq::Agent,
}

type Resp = ureq::http::Response<ureq::Body>;

/// The text between `<tag>` and `</tag>`, if there is one.
fn xml_field<'a>(xml: &'a str, tag: &str) -> Option<&'a str> {
    let start = xml.find(&format!("<{tag}>"))? + tag.len() + 2;
    let end = xml[start..].find(&format!("</{tag}>"))? + start;
    Some(&xml[start..end])
}

/// The response if it succeeded; else the store's status, code and message.
fn check(r: Result<Resp, ureq::Error>, what: &str) -> Result<Resp, String> {
    let mut r = r.map_err(|e| format!("{what}: {e}"))?;
    if r.status().is_success() {
        return Ok(r);
    }
    let status = r.status();
    let body = r
        .body_mut()
        .with_config()
        .limit(64 << 10)
        .read_to_string()
        .unwrap_or_default();
    let code = xml_field(&body, "Code").unwrap_or("");
    let msg = xml_field(&body, "Message").unwrap_or("");
    Err(format!(
        "{what}: {status} {code}{}{msg}",
        if msg.is_empty() { "" } else { ": " }
    )
    .trim_end()
    .to_string())
}

fn text(r: Resp, what: &str) -> Result<String, String> {
    r.into_body()
        .with_config()
        .limit(16 << 20)
        .read_to_string()
        .map_err(|e| format!("{what}: {e}"))
}

impl Bucket for S3Bucket {
    fn put(&self, key: &str, data: &[u8]) -> Result<(), String> {
        let url = self
            .bucket
            .put_object(Some(&self.creds), key)
            .sign(SIGN_FOR);
        check(
            self.agent.put(url.as_str()).send(data),
            &format!("PUT {key}"),
        )?;
        Ok(())
    }

    fn get(&self, key: &str) -> Result<Box<dyn Read + Send>, String> {
        let url = self
            .bucket
            .get_object(Some(&self.creds), key)
            .sign(SIGN_FOR);
        let r = check(self.agent.get(url.as_str()).call(), &format!("GET {key}"))?;
        Ok(Box::new(r.into_body().into_reader()))
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectEntry>, String> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut a = ListObjectsV2::new(&self.bucket, Some(&self.creds));
            a.with_prefix(prefix);
            if let Some(t) = &token {
                a.with_continuation_token(t.clone());
            }
            let url = a.sign(SIGN_FOR);
            let what = format!("LIST {prefix}");
            let body = text(check(self.agent.get(url.as_str()).call(), &what)?, &what)?;
            let page = ListObjectsV2::parse_response(&body).map_err(|e| format!("{what}: {e}"))?;
            out.extend(page.contents.into_iter().map(|c| ObjectEntry {
                key: c.key,
                size: c.size.unwrap_or(0),
            }));
            match page.next_continuation_token {
                Some(t) if !t.is_empty() => token = Some(t),
                _ => return Ok(out),
            }
        }
    }

    fn delete(&self, key: &str) -> Result<(), String> {
        let url = self
            .bucket
            .delete_object(Some(&self.creds), key)
            .sign(SIGN_FOR);
        check(
            self.agent.delete(url.as_str()).call(),
            &format!("DELETE {key}"),
        )?;
        Ok(())
    }

    fn create_multipart(&self, key: &str) -> Result<String, String> {
        let url = CreateMultipartUpload::new(&self.bucket, Some(&self.creds), key).sign(SIGN_FOR);
        let what = format!("CreateMultipartUpload {key}");
        let body = text(
            check(self.agent.post(url.as_str()).send_empty(), &what)?,
            &what,
        )?;
        let r = CreateMultipartUpload::parse_response(&body).map_err(|e| format!("{what}: {e}"))?;
        Ok(r.upload_id().to_string())
    }

    fn upload_part(
        &self,
        key: &str,
        upload: &str,
        number: u16,
        data: &[u8],
        md5: &[u8; 16],
    ) -> Result<String, String> {
        let url =
            UploadPart::new(&self.bucket, Some(&self.creds), key, number, upload).sign(SIGN_FOR);
        let r = check(
            self.agent
                .put(url.as_str())
                .header(
                    "Content-MD5",
                    base64::engine::general_purpose::STANDARD.encode(md5),
                )
                .send(data),
            &format!("UploadPart {number} of {key}"),
        )?;
        r.headers()
            .get("etag")
            .and_then(|e| e.to_str().ok())
            .map(str::to_string)
            .ok_or_else(|| format!("UploadPart {number} of {key}: no ETag in the answer"))
    }

    fn list_parts(&self, key: &str, upload: &str) -> Result<Option<Vec<PartEntry>>, String> {
        let mut out = Vec::new();
        let mut marker: Option<u16> = None;
        loop {
            let mut a = ListParts::new(&self.bucket, Some(&self.creds), key, upload);
            if let Some(m) = marker {
                a.set_part_number_marker(m);
            }
            let url = a.sign(SIGN_FOR);
            let what = format!("ListParts {key}");
            let mut r = self
                .agent
                .get(url.as_str())
                .call()
                .map_err(|e| format!("{what}: {e}"))?;
            if r.status() == 404 {
                // NoSuchUpload: completed, aborted or expired.
                let _ = r.body_mut().with_config().limit(64 << 10).read_to_string();
                return Ok(None);
            }
            let body = text(check(Ok(r), &what)?, &what)?;
            let page = ListParts::parse_response(&body).map_err(|e| format!("{what}: {e}"))?;
            out.extend(page.parts.into_iter().map(|p| PartEntry {
                number: p.number,
                etag: p.etag,
                size: p.size,
            }));
            match page.next_part_number_marker {
                Some(m) if xml_field(&body, "IsTruncated") == Some("true") => marker = Some(m),
                _ => return Ok(Some(out)),
            }
        }
    }

    fn complete(&self, key: &str, upload: &str, etags: &[String]) -> Result<(), String> {
        let action = CompleteMultipartUpload::new(
            &self.bucket,
            Some(&self.creds),
            key,
            upload,
            etags.iter().map(String::as_str),
        );
        let url = action.sign(SIGN_FOR);
        let body = action.body();
        let what = format!("CompleteMultipartUpload {key}");
        let r = check(self.agent.post(url.as_str()).send(body.as_bytes()), &what)?;
        // S3 may answer 200 with an error in the body.
        let answer = text(r, &what)?;
        if let Some(code) = xml_field(&answer, "Code") {
            return Err(format!(
                "{what}: {code}: {}",
                xml_field(&answer, "Message").unwrap_or("")
            ));
        }
        Ok(())
    }

    fn abort(&self, key: &str, upload: &str) -> Result<(), String> {
        let url = self
            .bucket
            .abort_multipart_upload(Some(&self.creds), key, upload)
            .sign(SIGN_FOR);
        check(
            self.agent.delete(url.as_str()).call(),
            &format!("AbortMultipartUpload {key}"),
        )?;
        Ok(())
    }
}
