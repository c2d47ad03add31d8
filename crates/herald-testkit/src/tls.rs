//! Certificates for TLS tests, generated in the test (never committed): a
//! certificate authority of the test's own ([`TestCa`]) that issues server
//! certificates for `localhost` and `127.0.0.1`, and a probe that reads
//! which certificate a server presents on a new connection
//! ([`presented_certificate`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls_pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;

use crate::{within, WAIT};

/// A certificate authority that lives as long as the test.
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    /// The CA's certificate, PEM.
    pub pem: String,
    der: CertificateDer<'static>,
}

/// A server certificate and its key, written as PEM files.
pub struct IssuedCert {
    /// The certificate file.
    pub cert: PathBuf,
    /// The private key file.
    pub key: PathBuf,
    /// The certificate, DER, to compare with what a server presents.
    pub der: Vec<u8>,
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}

impl TestCa {
    /// A new CA with a fresh key.
    ///
    /// # Panics
    /// When rcgen cannot generate it.
    pub fn new() -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "Herald test CA");
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("CA certificate");
        Self {
            pem: cert.pem(),
            der: cert.der().clone(),
            issuer: Issuer::new(params, key),
        }
    }

    /// Writes the CA certificate to `path` (for `--tls-ca`, `--ca-file`).
    ///
    /// # Panics
    /// When the file cannot be written.
    pub fn write(&self, path: &Path) {
        std::fs::write(path, &self.pem).expect("write the CA certificate");
    }

    /// Issues a server certificate for `localhost` and `127.0.0.1` and
    /// writes it and its key to `<dir>/<stem>.crt` and `<dir>/<stem>.key`.
    ///
    /// # Panics
    /// When rcgen cannot issue it or a file cannot be written.
    pub fn issue(&self, dir: &Path, stem: &str) -> IssuedCert {
        let params = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .expect("server certificate params");
        let key = KeyPair::generate().expect("server key");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("server certificate");
        let issued = IssuedCert {
            cert: dir.join(format!("{stem}.crt")),
            key: dir.join(format!("{stem}.key")),
            der: cert.der().to_vec(),
        };
        std::fs::write(&issued.cert, cert.pem()).expect("write the certificate");
        std::fs::write(&issued.key, key.serialize_pem()).expect("write the key");
        issued
    }

    /// An HTTP client builder that trusts this CA.
    ///
    /// # Panics
    /// When reqwest refuses the certificate.
    pub fn client_builder(&self) -> reqwest::ClientBuilder {
        reqwest::Client::builder()
            .tls_certs_merge([
                reqwest::Certificate::from_pem(self.pem.as_bytes()).expect("the CA certificate")
            ])
    }
}

/// The certificate (DER) that the server at `addr` presents on a new TLS
/// connection, verified against `ca` for the name `127.0.0.1`.
///
/// # Panics
/// When the connection or the handshake fails, or takes longer than
/// [`WAIT`].
pub async fn presented_certificate(addr: SocketAddr, ca: &TestCa) -> Vec<u8> {
    let mut roots = RootCertStore::empty();
    roots.add(ca.der.clone()).expect("the CA as a root");
    let config = ClientConfig::builder_with_provider(Arc::new(
        tokio_rustls::rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = TlsConnector::from(Arc::new(config));
    let name = ServerName::try_from("127.0.0.1").expect("a server name");
    let handshake = async {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        connector.connect(name, tcp).await
    };
    let stream = within("a TLS handshake", WAIT, handshake)
        .await
        .expect("the TLS handshake");
    let (_, connection) = stream.get_ref();
    connection
        .peer_certificates()
        .and_then(|chain| chain.first())
        .expect("a server certificate")
        .to_vec()
}
