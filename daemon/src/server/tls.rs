//! HTTPS for the console, the API, the WebSocket and `/metrics`: a certificate chain and its
//! private key in PEM files (`tls_cert_file`, `tls_key_file`), served with rustls (TLS 1.2 and
//! 1.3, the ring provider's safe defaults). The key is a secret: a key file other users can
//! read is refused, as a token file is. SIGHUP reads both files again ([`Tls::reload`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::ResolvesServerCert;
use rustls::sign::CertifiedKey;

/// Largest certificate chain or key file read.
const MAX_PEM_BYTES: u64 = 1 << 20;

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error(transparent)]
    Refused(#[from] crate::identity::SecretFileError),
    #[error("{path} is open to every user on this machine (mode {mode:o}): run `chmod 600 {path}`")]
    KeyReadable { path: String, mode: u32 },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: String },
    #[error("{path}: {why}")]
    Pem { path: String, why: String },
    #[error("the certificate and key do not make a TLS server: {0}")]
    Config(#[from] rustls::Error),
}

fn read(path: &Path, secret: bool) -> Result<Vec<u8>, TlsError> {
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;
    let shown = path.display().to_string();
    let failed = |source| TlsError::Read { path: shown.clone(), source };
    let (file, mode) = if secret {
        let (file, meta) = crate::identity::open_secret_file(path)?;
        (file, meta.permissions().mode())
    } else {
        let file = std::fs::File::open(path).map_err(failed)?;
        let mode = file.metadata().map_err(failed)?.permissions().mode();
        (file, mode)
    };
    if secret && mode & 0o004 != 0 {
        return Err(TlsError::KeyReadable { path: shown, mode: mode & 0o777 });
    }
    let mut bytes = Vec::new();
    file.take(MAX_PEM_BYTES).read_to_end(&mut bytes).map_err(failed)?;
    Ok(bytes)
}

/// The certificate and key files, and the pair in use: SIGHUP reads the files again, and a
/// pair that does not load leaves the one in use in place.
#[derive(Debug)]
pub struct Tls {
    cert_file: PathBuf,
    key_file: PathBuf,
    provider: Arc<rustls::crypto::CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
    /// What the server serves with; new handshakes take the current pair.
    pub config: Arc<rustls::ServerConfig>,
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.upgrade().map(|tls| tls.current.read().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

/// Hands the handshakes the pair in use (the server config cannot own the [`Tls`] it is in).
#[derive(Debug)]
struct Resolver(std::sync::Weak<Tls>);

fn load(
    cert_file: &Path,
    key_file: &Path,
    provider: &rustls::crypto::CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let pem_error = |path: &Path| {
        let path = path.display().to_string();
        move |e: rustls::pki_types::pem::Error| TlsError::Pem { path: path.clone(), why: e.to_string() }
    };
    let chain = read(cert_file, false)?;
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(&chain).collect::<Result<_, _>>().map_err(pem_error(cert_file))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate { path: cert_file.display().to_string() });
    }
    let key = PrivateKeyDer::from_pem_slice(&read(key_file, true)?).map_err(pem_error(key_file))?;
    // Refuses a key that is not the certificate's.
    Ok(CertifiedKey::from_der(certs, key, provider)?)
}

impl Tls {
    /// TLS from a PEM certificate chain (the server's first) and its PEM private key (PKCS#8,
    /// PKCS#1 or SEC1).
    pub fn load(cert_file: &Path, key_file: &Path) -> Result<Arc<Tls>, TlsError> {
        let provider = crate::http_client::crypto_provider();
        let pair = load(cert_file, key_file, &provider)?;
        let versions =
            rustls::ServerConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions()?;
        Ok(Arc::new_cyclic(|me| {
            let mut config = versions.with_no_client_auth().with_cert_resolver(Arc::new(Resolver(me.clone())));
            // HTTP/1.1 only: the server speaks nothing else (the WebSocket upgrade included).
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            Tls {
                cert_file: cert_file.to_path_buf(),
                key_file: key_file.to_path_buf(),
                provider,
                current: RwLock::new(Arc::new(pair)),
                config: Arc::new(config),
            }
        }))
    }

    /// Reads the files again (a renewed certificate): new connections get the new pair; on an
    /// error the pair in use stays.
    pub fn reload(&self) -> Result<(), TlsError> {
        let pair = load(&self.cert_file, &self.key_file, &self.provider)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(pair);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn files_that_are_not_a_certificate_and_key_are_refused_with_the_reason() {
        let dir = crate::test_support::ScratchDir::new("tls-files");
        let cert = dir.path().join("cert.pem");
        let key = dir.path().join("key.pem");
        std::fs::write(&cert, "not a certificate\n").unwrap();
        std::fs::write(&key, "not a key\n").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let error = Tls::load(&cert, &key).unwrap_err().to_string();
        assert!(error.contains("holds no PEM certificate"), "{error}");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::write(&cert, "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n").unwrap();
        let error = Tls::load(&cert, &key).unwrap_err().to_string();
        assert!(error.contains("open to every user") && error.contains("chmod 600"), "{error}");
        let missing = Tls::load(&dir.path().join("none.pem"), &key).unwrap_err().to_string();
        assert!(missing.contains("none.pem"), "{missing}");
    }
}
