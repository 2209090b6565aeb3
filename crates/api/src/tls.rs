//! The API's TLS: the certificate it serves, generated at the first start or given by the
//! administrator.
//!
//! # Theory of operation
//! The certificate and key live in `DATA_DIR/tls/` (`cert.pem`, `key.pem`, the key mode
//! 0600). At the first start none is there and a self-signed one is made (rcgen: ECDSA
//! P-256, valid for `localhost`, `127.0.0.1`, `::1` and the host's name); later starts use
//! the same one, so a client that trusted it once keeps trusting it. An administrator
//! replaces it with their own by putting a PEM certificate chain and key there, or by
//! giving their paths to `tank serve` (`--api-cert`, `--api-key`). rustls with the ring
//! provider (no C toolchain), TLS 1.2 and 1.3, ALPN h2 and http/1.1.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Where the certificate and key are.
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Whether this start made them.
    pub generated: bool,
}

fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// The given files, or those of the data directory (made when missing).
pub fn files(data_dir: &Path, cert: Option<&Path>, key: Option<&Path>) -> Result<TlsFiles> {
    match (cert, key) {
        (Some(c), Some(k)) => {
            return Ok(TlsFiles {
                cert: c.to_path_buf(),
                key: k.to_path_buf(),
                generated: false,
            })
        }
        (None, None) => {}
        _ => bail!("give both --api-cert and --api-key, or neither"),
    }
    let dir = data_dir.join("tls");
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    if cert.exists() && key.exists() {
        return Ok(TlsFiles {
            cert,
            key,
            generated: false,
        });
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut names = vec!["localhost".to_string(), "127.0.0.1".into(), "::1".into()];
    names.extend(hostname());
    let made = rcgen::generate_simple_self_signed(names)
        .context("cannot make a self-signed certificate")?;
    write_private(&key, made.signing_key.serialize_pem().as_bytes())?;
    write_file(&cert, made.cert.pem().as_bytes())?;
    Ok(TlsFiles {
        cert,
        key,
        generated: true,
    })
}

fn write_file(path: &Path, data: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, data).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

fn write_private(path: &Path, data: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    f.write_all(data)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// The server configuration for the files.
pub fn server_config(files: &TlsFiles) -> Result<Arc<rustls::ServerConfig>> {
    let pem = std::fs::read(&files.cert)
        .with_context(|| format!("cannot read the certificate {}", files.cert.display()))?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .with_context(|| format!("{} is not a PEM certificate", files.cert.display()))?;
    if chain.is_empty() {
        bail!("{} holds no certificate", files.cert.display());
    }
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .with_context(|| format!("{} is not a PEM private key", files.key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .context("the certificate and key do not match")?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}
