//! TLS: the files of `[redis.tls]` as the redis client takes them. What a failed handshake
//! means is `crate::error::tls_failure`'s.
//!
//! Certificates and keys are read here and handed to the client; they never go into a message
//! (the redis client's own `Debug` of them is redacted too). Errors name the field and the path.

#[cfg(feature = "tls")]
use crate::config::LockConfig;
#[cfg(feature = "tls")]
use crate::error::LockError;

/// The CA and client certificate of `[redis.tls]`, read and checked now.
///
/// # Errors
/// [`ErrorKind::Config`](crate::ErrorKind::Config) naming the field and the path when a file
/// cannot be read or holds no PEM certificate (key).
#[cfg(feature = "tls")]
pub(super) fn certificates(config: &LockConfig) -> Result<redis::TlsCertificates, LockError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    install_crypto_provider();
    let Some(tls) = config.tls() else {
        return Ok(redis::TlsCertificates {
            client_tls: None,
            root_cert: None,
        });
    };
    let origin = config.origin();
    let read = |field: &str, path: &std::path::Path| {
        std::fs::read(path).map_err(|e| {
            LockError::config(format!(
                "{origin}: cannot read `redis.tls.{field}` {}: {e}",
                path.display()
            ))
            .with_source(e)
        })
    };
    // only whether the files parse: their contents never go into a message
    let not_pem = |field: &str, path: &std::path::Path, what: &str| {
        LockError::config(format!(
            "{origin}: `redis.tls.{field}` {} holds no {what}",
            path.display()
        ))
    };
    let certs_in = |pem: &[u8]| {
        let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(pem).collect();
        certs.is_ok_and(|c| !c.is_empty())
    };
    let root_cert = match tls.ca_file() {
        Some(path) => {
            let pem = read("ca_file", path)?;
            if !certs_in(&pem) {
                return Err(not_pem("ca_file", path, "PEM certificate"));
            }
            Some(pem)
        }
        None => None,
    };
    let client_tls = match (tls.cert_file(), tls.key_file()) {
        (Some(cert_path), Some(key_path)) => {
            let client_cert = read("cert_file", cert_path)?;
            if !certs_in(&client_cert) {
                return Err(not_pem("cert_file", cert_path, "PEM certificate"));
            }
            let client_key = read("key_file", key_path)?;
            if PrivateKeyDer::from_pem_slice(&client_key).is_err() {
                return Err(not_pem(
                    "key_file",
                    key_path,
                    "PEM private key (PKCS#8, PKCS#1 or SEC1)",
                ));
            }
            Some(redis::ClientTlsConfig {
                client_cert,
                client_key,
            })
        }
        _ => None,
    };
    Ok(redis::TlsCertificates {
        client_tls,
        root_cert,
    })
}

/// rustls needs a crypto provider; use ring unless the application installed one.
#[cfg(feature = "tls")]
fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // fails only when another thread installed one meanwhile: that one is used then
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}
