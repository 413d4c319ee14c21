//! HTTPS: the certificate, key and client CA files, checked so that an error names the file at
//! fault, and read again while serving so that a renewed certificate applies without a restart.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum_server::tls_rustls::RustlsConfig;

use super::ServeError;
use crate::clip::clip;

/// Certificate and key files (PEM) for HTTPS.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// Certificate chain.
    pub cert: PathBuf,
    /// Private key.
    pub key: PathBuf,
}

/// How often [`serve_with`](super::serve_with) re-reads the TLS files by default.
pub const TLS_RELOAD_INTERVAL: Duration = Duration::from_secs(30);

/// HTTPS settings: the server's certificate and, optionally, the CAs whose
/// client certificates the server requires.
#[derive(Debug, Clone)]
pub struct TlsSettings {
    /// The server's certificate chain and key.
    pub files: TlsFiles,
    /// PEM bundle of CA certificates. When set, every connection must present a
    /// client certificate that chains to one of them (mutual TLS); a client
    /// without one, or with one from another CA, fails the handshake. `None`:
    /// any client may connect.
    pub client_ca: Option<PathBuf>,
    /// How often the files are read again; a changed certificate, key or CA
    /// bundle applies to new connections without a restart (cert-manager and
    /// the kubelet replace mounted Secrets in place). Zero: never.
    pub reload_interval: Duration,
}

impl From<TlsFiles> for TlsSettings {
    fn from(files: TlsFiles) -> Self {
        TlsSettings {
            files,
            client_ca: None,
            reload_interval: TLS_RELOAD_INTERVAL,
        }
    }
}

/// The bytes of the TLS files, as last read.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct TlsMaterial {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

impl TlsSettings {
    /// Read the files.
    pub(super) fn read(&self) -> Result<TlsMaterial, ServeError> {
        let tls_err = |source| ServeError::Tls {
            cert: self.files.cert.clone(),
            key: self.files.key.clone(),
            source,
        };
        let cert = std::fs::read(&self.files.cert).map_err(tls_err)?;
        let key = std::fs::read(&self.files.key).map_err(tls_err)?;
        let client_ca = match &self.client_ca {
            Some(path) => Some(std::fs::read(path).map_err(|source| ServeError::ClientCa {
                path: path.clone(),
                source,
            })?),
            None => None,
        };
        Ok(TlsMaterial {
            cert,
            key,
            client_ca,
        })
    }

    /// Build the rustls configuration from what [`TlsSettings::read`] returned.
    pub(super) fn build(&self, m: &TlsMaterial) -> Result<rustls::ServerConfig, ServeError> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};

        let invalid = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
        let tls_err = |source| ServeError::Tls {
            cert: self.files.cert.clone(),
            key: self.files.key.clone(),
            source,
        };
        let cert_path = self.files.cert.display();
        let key_path = self.files.key.display();
        let chain = CertificateDer::pem_slice_iter(&m.cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| {
                tls_err(invalid(format!(
                    "certificate file {cert_path}: unreadable PEM: {e}"
                )))
            })?;
        if chain.is_empty() {
            return Err(tls_err(invalid(format!(
                "certificate file {cert_path}: {}",
                pem_contents(&m.cert, "CERTIFICATE")
            ))));
        }
        let key = PrivateKeyDer::from_pem_slice(&m.key).map_err(|e| {
            let what = match e {
                rustls::pki_types::pem::Error::NoItemsFound => pem_contents(&m.key, "PRIVATE KEY"),
                e => format!("unreadable PEM: {e}"),
            };
            tls_err(invalid(format!("key file {key_path}: {what}")))
        })?;
        // Checked here so that the error names the file at fault; rustls'
        // own messages ("peer sent no certificates", "keys are inconsistent")
        // name neither.
        let provider = rustls::crypto::ring::default_provider();
        let signing_key = provider
            .key_provider
            .load_private_key(key.clone_key())
            .map_err(|e| {
                tls_err(invalid(format!(
                    "key file {key_path}: unusable private key: {e}"
                )))
            })?;
        match rustls::sign::CertifiedKey::new(chain.clone(), signing_key).keys_match() {
            Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
            Err(rustls::Error::InconsistentKeys(_)) => {
                return Err(tls_err(invalid(format!(
                    "the private key in {key_path} does not match the first certificate in \
                     {cert_path}"
                ))));
            }
            Err(e) => {
                return Err(tls_err(invalid(format!(
                    "certificate file {cert_path}: the first certificate is not valid: {e}"
                ))));
            }
        }

        let provider = Arc::new(provider);
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_err(invalid(e.to_string())))?;
        let builder = match (&self.client_ca, &m.client_ca) {
            (Some(path), Some(pem)) => {
                let ca_err = |what: String| ServeError::ClientCa {
                    path: path.clone(),
                    source: invalid(what),
                };
                let mut roots = rustls::RootCertStore::empty();
                for cert in CertificateDer::pem_slice_iter(pem) {
                    let cert = cert.map_err(|e| ca_err(format!("unreadable PEM: {e}")))?;
                    roots
                        .add(cert)
                        .map_err(|e| ca_err(format!("not a CA certificate: {e}")))?;
                }
                if roots.is_empty() {
                    return Err(ca_err("the file holds no CERTIFICATE block".into()));
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .build()
                .map_err(|e| ca_err(e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
            _ => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(chain, key)
            .map_err(|e| tls_err(invalid(e.to_string())))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(config)
    }

    /// Read the files and build the rustls configuration.
    pub fn load(&self) -> Result<rustls::ServerConfig, ServeError> {
        self.build(&self.read()?)
    }
}

/// What a PEM file that lacks the `wanted` block holds instead, for an error
/// message: not PEM at all, nothing, or blocks of other kinds.
fn pem_contents(pem: &[u8], wanted: &str) -> String {
    let text = String::from_utf8_lossy(pem);
    let labels: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("-----BEGIN ")?.strip_suffix("-----"))
        .collect();
    if text.trim().is_empty() {
        "the file is empty".into()
    } else if labels.is_empty() {
        format!("not PEM (no \"-----BEGIN {wanted}-----\" line)")
    } else {
        format!(
            "holds no {wanted} block (found: {})",
            clip(&labels.join(", "))
        )
    }
}

/// Install rustls' ring crypto provider for the process (idempotent).
pub fn install_crypto_provider() {
    // Fails only when a provider is already installed, which is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Every `reload_interval`, read the TLS files again and swap in a new
/// configuration when their contents changed. A configuration that does not
/// build (a half-written file, a key that does not match) is reported and the
/// previous one kept.
pub(super) async fn reload_loop(
    settings: TlsSettings,
    mut current: TlsMaterial,
    config: RustlsConfig,
) {
    let mut tick = tokio::time::interval(settings.reload_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut last_error = None;
    loop {
        tick.tick().await;
        let next = settings.read().and_then(|m| {
            if m == current {
                Ok(None)
            } else {
                settings.build(&m).map(|c| Some((m, c)))
            }
        });
        match next {
            Ok(None) => last_error = None,
            Ok(Some((m, c))) => {
                config.reload_from_config(Arc::new(c));
                current = m;
                last_error = None;
                tracing::info!(
                    cert = %settings.files.cert.display(),
                    "reloaded the TLS certificate, key and client CA bundle"
                );
            }
            Err(e) => {
                let text = e.to_string();
                if last_error.as_ref() != Some(&text) {
                    tracing::warn!(error = %text, "TLS files changed but cannot be used; keeping the previous ones");
                    last_error = Some(text);
                }
            }
        }
    }
}
