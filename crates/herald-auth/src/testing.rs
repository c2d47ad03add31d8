//! Test support for the tests of this crate and of the crates that use it
//! (feature `testing`, never in a shipped build).

use std::sync::OnceLock;

use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::json;
use tokio::runtime::{Builder, Runtime};

use crate::error::AuthError;
use crate::jwt::{JwtVerifier, TokenGrant};

/// `verifier.verify(token)` run to its end from synchronous test code, on
/// one runtime shared by every call (one worker thread), so that a JWKS
/// client's pooled connections outlive each call.
///
/// # Errors
/// What [`JwtVerifier::verify`] returns.
///
/// # Panics
/// If the runtime cannot be built.
pub fn verify(verifier: &JwtVerifier, token: &str) -> Result<TokenGrant, AuthError> {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap()
        })
        .block_on(verifier.verify(token))
}

/// A P-256 key pair (ES256, RFC 7518 §3.4): its public key as a JWK with a
/// `kid` (RFC 7517; the coordinates as in RFC 7518 §6.2.1), and tokens it
/// signs.
pub struct EcKey(aws_lc_rs::signature::EcdsaKeyPair);

impl EcKey {
    /// A new random key pair.
    ///
    /// # Panics
    /// If the system's random source fails.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        use aws_lc_rs::signature::{EcdsaKeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
        Self(EcdsaKeyPair::generate(&ECDSA_P256_SHA256_FIXED_SIGNING).unwrap())
    }

    /// The public key as a JWK (`kty` EC, `crv` P-256, `alg` ES256) named
    /// `kid`.
    pub fn jwk(&self, kid: &str) -> serde_json::Value {
        use aws_lc_rs::signature::KeyPair;
        use base64::Engine;
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        // An uncompressed point: 0x04, then x and y, 32 bytes each.
        let point = self.0.public_key().as_ref();
        json!({"kty": "EC", "crv": "P-256", "kid": kid, "alg": "ES256",
               "x": b64(&point[1..33]), "y": b64(&point[33..65])})
    }

    /// A token for subject `u` expiring at `exp` (Unix seconds), signed with
    /// ES256 and naming `kid` in its header.
    ///
    /// # Panics
    /// If the key cannot be exported or the token not signed.
    pub fn token(&self, kid: &str, exp: u64) -> String {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(kid.to_owned());
        encode(
            &header,
            &json!({"sub": "u", "exp": exp}),
            &EncodingKey::from_ec_der(self.0.to_pkcs8v1().unwrap().as_ref()),
        )
        .unwrap()
    }
}
