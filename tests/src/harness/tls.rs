//! Certificates for TLS topologies, made at run time with rcgen: a CA, one certificate the
//! servers present (for `127.0.0.1` and `localhost`, valid for server and client use, since the
//! servers also connect to each other: replication, cluster bus, sentinels) and one for the
//! clients (tests, the harness's own connections). More can be issued for failure cases:
//! expired ones, or ones from a CA nobody trusts.
//!
//! The files live in a temporary directory that goes away with the [`Pki`].

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use tempfile::TempDir;

/// A private CA with the certificates of one TLS topology, as PEM files.
pub struct Pki {
    dir: TempDir,
    ca: CertifiedIssuer<'static, KeyPair>,
    /// The client certificate and key the harness connects with.
    client_pem: (Vec<u8>, Vec<u8>),
    server: Validity,
    issued: AtomicU32,
}

impl fmt::Debug for Pki {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pki")
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

/// Whether a certificate is valid now or has expired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Validity {
    /// rcgen's default: from 1975 to 4096.
    Current,
    /// During the year 2000 only.
    Expired,
}

impl Pki {
    /// A new CA; the servers' certificate (valid now) and a client certificate.
    ///
    /// # Panics
    ///
    /// If a certificate cannot be made or a file not written.
    pub fn new() -> Pki {
        Pki::with_server(Validity::Current)
    }

    /// A new CA whose servers present a certificate with the given validity (an expired one
    /// for the failure tests; redis-server starts with it all the same).
    ///
    /// # Panics
    ///
    /// If a certificate cannot be made or a file not written.
    pub fn with_server(server: Validity) -> Pki {
        let dir = tempfile::Builder::new()
            .prefix("lock-harness-pki-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot create a temporary directory: {e}"));
        let ca = new_ca("lock-tests CA");
        write(&dir.path().join("ca.pem"), ca.pem().as_bytes());
        let (cert, key) = issue(&ca, "redis-server", server, true);
        write(&dir.path().join("server.pem"), cert.as_bytes());
        write(&dir.path().join("server.key"), key.as_bytes());
        let (cert, key) = issue(&ca, "lock-tests client", Validity::Current, false);
        write(&dir.path().join("client.pem"), cert.as_bytes());
        write(&dir.path().join("client.key"), key.as_bytes());
        Pki {
            dir,
            ca,
            client_pem: (cert.into_bytes(), key.into_bytes()),
            server,
            issued: AtomicU32::new(0),
        }
    }

    /// The validity of the certificate the servers present.
    pub fn server_validity(&self) -> Validity {
        self.server
    }

    /// The directory of the files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The CA certificate (PEM): what clients trust, and servers check clients against.
    pub fn ca_file(&self) -> PathBuf {
        self.dir().join("ca.pem")
    }

    /// The certificate every server presents (also as a client of the other servers).
    pub fn server_cert_file(&self) -> PathBuf {
        self.dir().join("server.pem")
    }

    /// The key of [`Pki::server_cert_file`].
    pub fn server_key_file(&self) -> PathBuf {
        self.dir().join("server.key")
    }

    /// A client certificate signed by the CA.
    pub fn client_cert_file(&self) -> PathBuf {
        self.dir().join("client.pem")
    }

    /// The key of [`Pki::client_cert_file`].
    pub fn client_key_file(&self) -> PathBuf {
        self.dir().join("client.key")
    }

    /// Issues another client certificate from this CA with the given validity; returns the
    /// certificate and key files.
    ///
    /// # Panics
    ///
    /// If a certificate cannot be made or a file not written.
    pub fn issue_client(&self, validity: Validity) -> (PathBuf, PathBuf) {
        let n = self.issued.fetch_add(1, Ordering::Relaxed);
        let (cert, key) = issue(&self.ca, &format!("lock-tests client {n}"), validity, false);
        let cert_file = self.dir().join(format!("client-{n}.pem"));
        let key_file = self.dir().join(format!("client-{n}.key"));
        write(&cert_file, cert.as_bytes());
        write(&key_file, key.as_bytes());
        (cert_file, key_file)
    }

    /// The certificate of another CA, which signed nothing the servers present: a client
    /// trusting only it must refuse every server. Written next to the others.
    ///
    /// # Panics
    ///
    /// If a certificate cannot be made or a file not written.
    pub fn foreign_ca_file(&self) -> PathBuf {
        let path = self.dir().join("foreign-ca.pem");
        if !path.exists() {
            write(&path, new_ca("another CA").pem().as_bytes());
        }
        path
    }

    /// The CA and the client certificate as the lock service's TLS settings.
    pub fn lock_tls(&self) -> lock_runtime::TlsConfig {
        lock_runtime::TlsConfig::new()
            .with_ca_file(self.ca_file())
            .with_client_cert(self.client_cert_file(), self.client_key_file())
    }

    /// The certificates as the redis client takes them (the harness's own connections).
    pub fn redis_certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: Some(redis::ClientTlsConfig {
                client_cert: self.client_pem.0.clone(),
                client_key: self.client_pem.1.clone(),
            }),
            root_cert: Some(self.ca.pem().into_bytes()),
        }
    }

    /// The `redis.conf` / `sentinel.conf` lines of a TLS-only server on `port`: no plaintext
    /// port, clients must present a certificate of this CA, and the servers talk TLS to each
    /// other (replication and sentinels; the cluster bus with `cluster`).
    pub(crate) fn server_conf(&self, port: u16, cluster: bool) -> String {
        let mut conf = format!(
            "port 0\ntls-port {port}\ntls-cert-file \"{}\"\ntls-key-file \"{}\"\n\
             tls-ca-cert-file \"{}\"\ntls-auth-clients yes\ntls-replication yes\n",
            self.server_cert_file().display(),
            self.server_key_file().display(),
            self.ca_file().display()
        );
        if cluster {
            conf.push_str("tls-cluster yes\n");
        }
        conf
    }

    /// `redis-cli` arguments for a TLS connection with the client certificate.
    pub(crate) fn cli_args(&self) -> Vec<String> {
        vec![
            "--tls".to_owned(),
            "--cacert".to_owned(),
            self.ca_file().display().to_string(),
            "--cert".to_owned(),
            self.client_cert_file().display().to_string(),
            "--key".to_owned(),
            self.client_key_file().display().to_string(),
        ]
    }
}

impl Default for Pki {
    fn default() -> Self {
        Pki::new()
    }
}

fn new_ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new())
        .unwrap_or_else(|e| panic!("CA parameters: {e}"));
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let key = KeyPair::generate().unwrap_or_else(|e| panic!("CA key: {e}"));
    CertifiedIssuer::self_signed(params, key).unwrap_or_else(|e| panic!("CA certificate: {e}"))
}

/// A certificate for `127.0.0.1` and `localhost` signed by `ca`, and its key (PEM). Server
/// certificates may be used as client certificates too (servers connect to each other).
fn issue(
    ca: &CertifiedIssuer<'static, KeyPair>,
    name: &str,
    validity: Validity,
    server: bool,
) -> (String, String) {
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .unwrap_or_else(|e| panic!("certificate parameters: {e}"));
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = if server {
        vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ]
    } else {
        vec![ExtendedKeyUsagePurpose::ClientAuth]
    };
    if validity == Validity::Expired {
        params.not_before = rcgen::date_time_ymd(2000, 1, 1);
        params.not_after = rcgen::date_time_ymd(2001, 1, 1);
    }
    let key = KeyPair::generate().unwrap_or_else(|e| panic!("key: {e}"));
    let cert = params
        .signed_by(&key, ca)
        .unwrap_or_else(|e| panic!("certificate: {e}"));
    (cert.pem(), key.serialize_pem())
}

fn write(path: &Path, contents: &[u8]) {
    fs::write(path, contents).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
}
