//! TLS for direct exposure: the server's certificate and key, read from
//! PEM files, reloaded on demand (the `herald` binary reloads on SIGHUP) so
//! that certificates rotate without a restart.
//!
//! The certificate in use is swapped atomically: a handshake takes the one
//! current when it starts, and a reload that fails (a missing file, a key
//! that does not match the certificate) keeps the previous one. The crypto
//! is rustls with its aws-lc-rs provider (the provider `reqwest` already
//! uses here, so one is compiled in).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::crypto::aws_lc_rs;
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::rustls::ServerConfig as RustlsConfig;
use tokio_rustls::TlsAcceptor;

use herald_node::node_error::StartError;

/// The ALPN protocols offered (RFC 7301): HTTP/2, then HTTP/1.1.
const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// A node's TLS certificate chain and private key, from two PEM files,
/// swapped in place by [`TlsCertificates::reload`]. Cheap to clone (one
/// shared state); two clones compare equal.
#[derive(Clone)]
pub struct TlsCertificates {
    inner: Arc<Inner>,
}

/// The files and the certificate in use.
struct Inner {
    /// PEM file with the certificate chain, the node's certificate first.
    cert_path: PathBuf,
    /// PEM file with the private key (PKCS#8, PKCS#1 or SEC1).
    key_path: PathBuf,
    /// The certificate and key handshakes use now.
    current: RwLock<Arc<CertifiedKey>>,
}

impl TlsCertificates {
    /// Reads the certificate chain from `cert_path` and the private key from
    /// `key_path` (both PEM).
    ///
    /// # Errors
    /// [`StartError::Tls`] naming the file that cannot be read or parsed,
    /// or saying that the key does not match the certificate.
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Self, StartError> {
        let key = read_certified_key(cert_path, key_path)?;
        Ok(Self {
            inner: Arc::new(Inner {
                cert_path: cert_path.to_path_buf(),
                key_path: key_path.to_path_buf(),
                current: RwLock::new(Arc::new(key)),
            }),
        })
    }

    /// Reads both files again and, if they hold a usable certificate and
    /// key, serves them to every handshake from now on. Connections already
    /// open keep theirs.
    ///
    /// # Errors
    /// As [`TlsCertificates::load`]; the certificate in use is kept.
    pub fn reload(&self) -> Result<(), StartError> {
        let key = read_certified_key(&self.inner.cert_path, &self.inner.key_path)?;
        *self
            .inner
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(key);
        Ok(())
    }

    /// The certificate file's path.
    pub fn cert_path(&self) -> &Path {
        &self.inner.cert_path
    }

    /// The acceptor for incoming connections: TLS 1.2 and 1.3, ALPN `h2`
    /// and `http/1.1`, no client certificates.
    ///
    /// # Errors
    /// [`StartError::Tls`] when rustls refuses the protocol versions (not
    /// expected with its own provider).
    pub fn acceptor(&self) -> Result<TlsAcceptor, StartError> {
        let mut config =
            RustlsConfig::builder_with_provider(Arc::new(aws_lc_rs::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(|e| StartError::Tls(format!("TLS settings: {e}")))?
                .with_no_client_auth()
                .with_cert_resolver(Arc::new(Resolver(self.clone())));
        config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}

impl PartialEq for TlsCertificates {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Eq for TlsCertificates {}

impl fmt::Debug for TlsCertificates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsCertificates")
            .field("cert_path", &self.inner.cert_path)
            .field("key_path", &self.inner.key_path)
            .finish_non_exhaustive()
    }
}

/// Hands the current certificate to each handshake.
#[derive(Debug)]
struct Resolver(TlsCertificates);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let current = self
            .0
            .inner
            .current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Some(Arc::clone(&current))
    }
}

/// Reads and checks a certificate chain and its private key.
fn read_certified_key(cert_path: &Path, key_path: &Path) -> Result<CertifiedKey, StartError> {
    let chain = CertificateDer::pem_file_iter(cert_path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| {
            StartError::Tls(format!(
                "cannot read the certificate chain from {} (PEM): {e}",
                cert_path.display()
            ))
        })?;
    if chain.is_empty() {
        return Err(StartError::Tls(format!(
            "{} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            cert_path.display()
        )));
    }
    let key = PrivateKeyDer::from_pem_file(key_path).map_err(|e| {
        StartError::Tls(format!(
            "cannot read the private key from {} (PEM): {e}",
            key_path.display()
        ))
    })?;
    CertifiedKey::from_der(chain, key, &aws_lc_rs::default_provider()).map_err(|e| {
        StartError::Tls(format!(
            "the key in {} does not fit the certificate in {}: {e}",
            key_path.display(),
            cert_path.display()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate for `name`, written as PEM files in `dir`.
    fn write_pair(dir: &Path, stem: &str, name: &str) -> (PathBuf, PathBuf) {
        let certified = rcgen::generate_simple_self_signed(vec![name.to_owned()]).unwrap();
        let cert = dir.join(format!("{stem}.crt"));
        let key = dir.join(format!("{stem}.key"));
        std::fs::write(&cert, certified.cert.pem()).unwrap();
        std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
        (cert, key)
    }

    fn served_der(tls: &TlsCertificates) -> Vec<u8> {
        tls.inner.current.read().unwrap().cert[0].to_vec()
    }

    #[test]
    fn a_failed_reload_keeps_the_certificate_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = write_pair(dir.path(), "a", "a.test");
        let tls = TlsCertificates::load(&cert, &key).unwrap();
        let before = served_der(&tls);

        // A key from another pair does not fit.
        let (_, other_key) = write_pair(dir.path(), "b", "b.test");
        std::fs::copy(&other_key, &key).unwrap();
        let error = tls.reload().unwrap_err().to_string();
        assert!(error.contains("does not fit the certificate"), "{error}");
        assert_eq!(served_der(&tls), before);

        std::fs::write(&cert, "not pem").unwrap();
        let error = tls.reload().unwrap_err().to_string();
        assert!(error.contains("holds no PEM certificate"), "{error}");
        assert_eq!(served_der(&tls), before);
    }

    #[test]
    fn a_reload_serves_the_new_pair() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = write_pair(dir.path(), "a", "a.test");
        let tls = TlsCertificates::load(&cert, &key).unwrap();
        let before = served_der(&tls);
        let (new_cert, new_key) = write_pair(dir.path(), "b", "a.test");
        std::fs::rename(new_cert, &cert).unwrap();
        std::fs::rename(new_key, &key).unwrap();
        tls.reload().unwrap();
        assert_ne!(served_der(&tls), before);
    }

    #[test]
    fn missing_files_are_named() {
        let error = TlsCertificates::load(Path::new("/nonexistent/c.pem"), Path::new("k.pem"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("/nonexistent/c.pem"), "{error}");
    }
}
