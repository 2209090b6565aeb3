//! A small blocking HTTPS client of the API, for the load test and `tank bench-api`.
//!
//! # Theory of operation
//! HTTP/1.1 with keep-alive over rustls (ring), trusting exactly the certificate it is
//! given (the daemon's `DATA_DIR/tls/cert.pem`). One connection per client, opened at the
//! first request and again after the server closed it. Bodies are read by
//! `Content-Length` (the API always sends one on these routes) and bounded in size. Real
//! HTTP clients (curl) test the API's protocol handling; this one exists to make many
//! requests cheaply from many threads.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

/// Largest response body read.
const MAX_RESPONSE: usize = 64 << 20;

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A request's line and headers, ended by the empty line.
fn request_head(method: &str, path: &str, len: Option<usize>, headers: &[(&str, &str)]) -> String {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\n");
    if let Some(n) = len {
        head.push_str(&format!("Content-Length: {n}\r\n"));
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    head
}

/// Reads a response's status line; its code.
fn status_line(c: &mut impl BufRead) -> Result<u16> {
    let mut line = String::new();
    if c.read_line(&mut line)? == 0 {
        bail!("the server closed the connection");
    }
    line.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("not an HTTP status line: {line:?}"))
}

/// Reads a response's header lines up to the empty line (or the end): each (name in
/// lowercase, value trimmed).
fn header_lines(c: &mut impl BufRead) -> Result<Vec<(String, String)>> {
    let mut got = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        c.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            return Ok(got);
        }
        let (k, v) = l.split_once(':').unwrap_or((l, ""));
        got.push((k.to_ascii_lowercase(), v.trim().to_string()));
    }
}

/// A response: its status, its headers (lowercase names) and its body.
pub type Answer = (u16, Vec<(String, String)>, Vec<u8>);

pub struct HttpsClient {
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    conn: Option<BufReader<Tls>>,
    /// Connections opened so far.
    pub connects: u64,
}

impl HttpsClient {
    /// A client of the API at `addr` that trusts the certificate in `cert` (PEM).
    pub fn new(addr: SocketAddr, cert: &Path) -> Result<Self> {
        let pem = std::fs::read(cert).with_context(|| format!("cannot read {}", cert.display()))?;
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(&pem) {
            roots.add(c.context("not a PEM certificate")?)?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Self {
            addr,
            config: Arc::new(config),
            conn: None,
            connects: 0,
        })
    }

    fn connect(&mut self) -> Result<&mut BufReader<Tls>> {
        if self.conn.is_none() {
            let tcp = TcpStream::connect_timeout(&self.addr, Duration::from_secs(10))?;
            tcp.set_nodelay(true)?;
            tcp.set_read_timeout(Some(Duration::from_secs(60)))?;
            let name = ServerName::try_from("localhost").expect("a valid name");
            let conn = rustls::ClientConnection::new(self.config.clone(), name)?;
            self.conn = Some(BufReader::new(rustls::StreamOwned::new(conn, tcp)));
            self.connects += 1;
        }
        Ok(self.conn.as_mut().expect("connected"))
    }

    /// Closes the connection (the next request opens a new one).
    pub fn disconnect(&mut self) {
        self.conn = None;
    }

    /// One request: (status, body). Retried once on a connection the server had closed.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<(u16, Vec<u8>)> {
        self.request_with_headers(method, path, headers, body)
            .map(|(status, _, body)| (status, body))
    }

    /// One request: (status, the response's headers with lowercase names, body).
    pub fn request_with_headers(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Answer> {
        let fresh = self.conn.is_none();
        match self.try_request(method, path, headers, body) {
            Ok(r) => Ok(r),
            Err(_) if !fresh => {
                self.conn = None;
                self.try_request(method, path, headers, body)
            }
            Err(e) => {
                self.conn = None;
                Err(e)
            }
        }
    }

    /// A request whose body is a stream (the event stream): its status, and a reader of
    /// the rest of the connection (the body as sent, chunk framing included), which is
    /// the caller's from then on.
    pub fn stream(
        &mut self,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<(u16, Box<dyn BufRead + Send>)> {
        let head = request_head("GET", path, None, headers);
        self.conn = None;
        self.connect()?;
        let mut c = self.conn.take().expect("connected");
        c.get_mut().write_all(head.as_bytes())?;
        c.get_mut().flush()?;
        let status = status_line(&mut c)?;
        header_lines(&mut c)?;
        Ok((status, Box::new(c)))
    }

    fn try_request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Answer> {
        let head = request_head(method, path, Some(body.len()), headers);
        let c = self.connect()?;
        let s = c.get_mut();
        s.write_all(head.as_bytes())?;
        s.write_all(body)?;
        s.flush()?;
        let status = status_line(c)?;
        let got = header_lines(c)?;
        let value = |name: &str| got.iter().find(|(k, _)| k == name).map(|(_, v)| v);
        let close = value("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
        let Some(len) = value("content-length").and_then(|v| v.parse::<usize>().ok()) else {
            bail!("the response has no Content-Length");
        };
        if len > MAX_RESPONSE {
            bail!("a response of {len} bytes is too large");
        }
        let mut out = vec![0u8; len];
        c.read_exact(&mut out)?;
        if close {
            self.conn = None;
        }
        Ok((status, got, out))
    }
}
