//! The webhook's serving certificate, taken up again when its files
//! change: cert-manager (or whoever rotates it) renews the Secret, the
//! kubelet updates the mounted files within about a minute, and the next
//! handshake after that serves the new pair, without a restart. With
//! `failurePolicy: Fail`, a restart to rotate would refuse every gated
//! pod while the webhook is down.
//!
//! The files are looked at (their size and modification time) at most
//! once a second, on a handshake. A pair that does not load (a key
//! written before its certificate, a half-written file) is said once and
//! the one in service kept; the next change is tried again.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio_rustls::rustls;
use tokio_rustls::rustls::crypto::CryptoProvider;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;

/// How often the files are looked at, at most.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// What identifies a file's contents cheaply: its size and modification
/// time; `None` where it cannot be read.
type Stamp = Option<(u64, SystemTime)>;

fn stamp(path: &Path) -> Stamp {
    let m = std::fs::metadata(path).ok()?;
    Some((m.len(), m.modified().ok()?))
}

/// The certificate chain and key from PEM files, checked to go together.
pub fn load(
    cert: &Path,
    key: &Path,
    provider: &CryptoProvider,
) -> Result<Arc<CertifiedKey>, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("--tls-cert {}: {e}", cert.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("--tls-cert {}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "--tls-cert {}: no certificate in it",
            cert.display()
        ));
    }
    let der = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("--tls-key {}: {e}", key.display()))?;
    CertifiedKey::from_der(chain, der, provider)
        .map(Arc::new)
        .map_err(|e| format!("--tls-cert and --tls-key do not go together: {e}"))
}

#[derive(Debug)]
struct Current {
    key: Arc<CertifiedKey>,
    stamps: (Stamp, Stamp),
    looked: Instant,
}

/// Serves the pair in the files, taking a changed pair up again.
#[derive(Debug)]
pub struct Reloading {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    current: Mutex<Current>,
}

impl Reloading {
    /// The pair as the files hold it now; an error where it does not load
    /// (the server does not start without one).
    pub fn new(
        cert: &Path,
        key: &Path,
        provider: Arc<CryptoProvider>,
    ) -> Result<Reloading, String> {
        let stamps = (stamp(cert), stamp(key));
        let loaded = load(cert, key, &provider)?;
        Ok(Reloading {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            provider,
            current: Mutex::new(Current {
                key: loaded,
                stamps,
                looked: Instant::now(),
            }),
        })
    }

    /// The pair to serve now: the files' if they changed and load.
    pub fn now(&self) -> Arc<CertifiedKey> {
        let mut c = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if c.looked.elapsed() >= LOOK_EVERY {
            c.looked = Instant::now();
            let stamps = (stamp(&self.cert), stamp(&self.key));
            if stamps != c.stamps {
                match load(&self.cert, &self.key, &self.provider) {
                    Ok(k) => {
                        eprintln!(
                            "preflight webhook: serving the renewed certificate in {}",
                            self.cert.display()
                        );
                        c.key = k;
                        c.stamps = stamps;
                    }
                    // Kept: the files may be mid-rotation. Said once per
                    // change seen, and tried again at the next one.
                    Err(e) => {
                        eprintln!(
                            "preflight webhook: the changed certificate is not taken (the one in service stays): {e}"
                        );
                        c.stamps = stamps;
                    }
                }
            }
        }
        Arc::clone(&c.key)
    }
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.now())
    }
}

/// The server's TLS settings over the reloading pair.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let resolver = Reloading::new(cert, key, Arc::clone(&provider))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(resolver));
    // The API server speaks HTTP/1.1 to a webhook that offers only that.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
