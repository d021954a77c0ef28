//! TLS for the QUIC endpoints: a cluster CA, node certificates signed by it, and the rustls
//! configurations of servers (shards) and clients, with optional mutual TLS.
//!
//! A cluster is defined by its CA. Every node holds a certificate signed by that CA; clients
//! verify servers against it, and with mutual TLS required, servers verify clients against it
//! too, so a process without a cluster certificate can neither read, write nor join.

use std::{path::Path, sync::Arc};

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// Errors building TLS material or configurations.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Generating or signing a certificate failed.
    #[error("generating a certificate: {0}")]
    Generate(#[source] rcgen::Error),
    /// Reading or writing certificate files failed.
    #[error("{path}: {msg}", path = .0.display(), msg = .1)]
    Io(std::path::PathBuf, #[source] std::io::Error),
    /// A PEM file held no usable certificate or key.
    #[error("{path}: {msg}", path = .0.display(), msg = .1)]
    Pem(std::path::PathBuf, String),
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// The server name every node certificate carries and every client asks for. Nodes are
/// identified by the cluster CA's signature, not by DNS names.
pub const SERVER_NAME: &str = "pagestore";

/// Common name of the cluster CAs that `pagestored` and `pagectl` create.
pub const CA_NAME: &str = "pagestore cluster CA";

/// What the holder of a cluster certificate may do. The role is written into the certificate by
/// the cluster CA (as the DNS name `<role>.role.pagestore` beside [`SERVER_NAME`]), so it is as
/// trustworthy as the CA's signature; a peer without a certificate is a [`Role::Reader`].
///
/// | role | may |
/// |---|---|
/// | reader | read pages, metadata, listings, counters; ask a node to load pages from its own under storage |
/// | writer | also: store pages (`WritePage`), invalidate paths (`Invalidate`), keep job records (`Jobs` with a record) |
/// | admin | also: drop a file's pages (`RemoveFile`) |
/// | node | what a node's own certificate carries: everything an admin may do |
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Reads only (also every peer without a certificate).
    Reader,
    /// Reads and changes what the cache holds for paths it writes.
    Writer,
    /// Everything, including dropping cached files.
    Admin,
    /// A node of the cluster (its own certificate).
    Node,
}

impl Role {
    /// Every role, least privileged first.
    pub const ALL: [Role; 4] = [Role::Reader, Role::Writer, Role::Admin, Role::Node];

    /// The role's name in flags, certificates and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Reader => "reader",
            Role::Writer => "writer",
            Role::Admin => "admin",
            Role::Node => "node",
        }
    }

    /// Parses a role name (`reader`, `writer`, `admin`, `node`).
    pub fn parse(s: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == s)
    }

    /// Whether a peer with this role may do what needs `needed`.
    pub fn allows(self, needed: Role) -> bool {
        self >= needed
    }

    /// The certificate name that carries this role.
    fn dns_name(self) -> String {
        format!("{}.{ROLE_DOMAIN}", self.as_str())
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Certificates name their role as `<role>.role.pagestore`.
const ROLE_DOMAIN: &str = "role.pagestore";

/// The role of a peer that presented `chain` (leaf first; already verified against the cluster
/// CA by the TLS handshake), or of a peer without a certificate (`None`: a reader). A
/// certificate that names no role (made before roles existed) or several is a reader's.
pub fn peer_role(chain: Option<&[CertificateDer<'static>]>) -> Role {
    let Some(leaf) = chain.and_then(|c| c.first()) else {
        return Role::Reader;
    };
    let Ok(cert) = webpki::EndEntityCert::try_from(leaf) else {
        return Role::Reader;
    };
    let mut roles = cert.valid_dns_names().filter_map(|n| {
        n.strip_suffix(ROLE_DOMAIN)
            .and_then(|r| r.strip_suffix('.'))
            .and_then(Role::parse)
    });
    match (roles.next(), roles.next()) {
        (Some(r), None) => r,
        _ => Role::Reader,
    }
}

/// A certificate chain and its private key.
pub struct Identity {
    /// Leaf first.
    pub chain: Vec<CertificateDer<'static>>,
    /// PKCS#8 private key.
    pub key: PrivatePkcs8KeyDer<'static>,
}

impl Clone for Identity {
    fn clone(&self) -> Self {
        Identity {
            chain: self.chain.clone(),
            key: self.key.clone_key(),
        }
    }
}

/// A cluster certificate authority: signs node and client certificates.
pub struct ClusterCa {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

fn gen_err(e: rcgen::Error) -> TlsError {
    TlsError::Generate(e)
}

impl ClusterCa {
    /// A new CA with a fresh key.
    pub fn generate(name: &str) -> Result<ClusterCa, TlsError> {
        let key = rcgen::KeyPair::generate().map_err(gen_err)?;
        ClusterCa::generate_with_key(name, key)
    }

    /// Loads a CA written by [`ClusterCa::save`] with the standard name [`CA_NAME`] (as
    /// `pagestored` and `pagectl` create them), so that it can issue more certificates.
    pub fn load(cert_pem: &Path, key_pem: &Path) -> Result<ClusterCa, TlsError> {
        let cert = load_cert_pem(cert_pem)?;
        let key_text =
            std::fs::read_to_string(key_pem).map_err(|e| TlsError::Io(key_pem.into(), e))?;
        let key = rcgen::KeyPair::from_pem(&key_text)
            .map_err(|e| TlsError::Pem(key_pem.into(), format!("not a PEM private key: {e}")))?;
        let ca = ClusterCa::generate_with_key(CA_NAME, key)?;
        // The rebuilt certificate must name the same subject and key as the one on disk, or
        // certificates it issues would not chain to it.
        let ours = ca.cert.der().as_ref();
        let subject_and_key_match = cert
            .as_ref()
            .windows(CA_NAME.len())
            .any(|w| w == CA_NAME.as_bytes())
            && {
                let spki = ca.key.public_key_der();
                cert.as_ref()
                    .windows(spki.len())
                    .any(|w| w == spki.as_slice())
                    && ours.windows(spki.len()).any(|w| w == spki.as_slice())
            };
        if !subject_and_key_match {
            return Err(TlsError::Pem(
                cert_pem.into(),
                format!(
                    "not a CA made by pagestore (subject {CA_NAME:?}) with the key in {}",
                    key_pem.display()
                ),
            ));
        }
        Ok(ca)
    }

    fn generate_with_key(name: &str, key: rcgen::KeyPair) -> Result<ClusterCa, TlsError> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(gen_err)?;
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let cert = params.self_signed(&key).map_err(gen_err)?;
        Ok(ClusterCa { cert, key })
    }

    /// Writes the CA certificate and key as PEM (the key file is created mode 0600).
    pub fn save(&self, cert_pem: &Path, key_pem: &Path) -> Result<(), TlsError> {
        write_private(cert_pem, self.cert.pem().as_bytes(), 0o644)?;
        write_private(key_pem, self.key.serialize_pem().as_bytes(), 0o600)
    }

    /// The CA certificate (DER), for trust stores.
    pub fn cert_der(&self) -> CertificateDer<'static> {
        self.cert.der().clone()
    }

    /// Issues a certificate for a node or client with `role`, valid for [`SERVER_NAME`].
    pub fn issue(&self, common_name: &str, role: Role) -> Result<Identity, TlsError> {
        let key = rcgen::KeyPair::generate().map_err(gen_err)?;
        let mut params =
            rcgen::CertificateParams::new(vec![SERVER_NAME.to_string(), role.dns_name()])
                .map_err(gen_err)?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, common_name);
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .map_err(gen_err)?;
        Ok(Identity {
            chain: vec![cert.der().clone(), self.cert_der()],
            key: PrivatePkcs8KeyDer::from(key.serialize_der()),
        })
    }
}

fn write_private(path: &Path, bytes: &[u8], mode: u32) -> Result<(), TlsError> {
    use std::{io::Write, os::unix::fs::OpenOptionsExt};
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .map_err(|e| TlsError::Io(path.into(), e))?;
    f.write_all(bytes).map_err(|e| TlsError::Io(path.into(), e))
}

/// The crypto library behind TLS and QUIC packet protection (AES-GCM on every packet).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CryptoLib {
    /// rustls' `ring` provider.
    Ring,
    /// rustls' `aws-lc-rs` provider.
    AwsLc,
}

/// What this process's TLS configurations use: the crypto library and the TLS 1.3 cipher
/// suite it prefers (clients offer theirs in that order, and servers follow the client's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Crypto {
    /// The library.
    pub lib: CryptoLib,
    /// AES-128-GCM first (fewer AES rounds per byte), else AES-256-GCM first (rustls' own
    /// order); ChaCha20-Poly1305 last either way.
    pub aes128_first: bool,
}

/// The default: the faster pair on the served path as measured (docs/BENCHMARKS.md, "Issue 14:
/// hedged reads and the crypto provider").
pub const DEFAULT_CRYPTO: Crypto = Crypto {
    lib: CryptoLib::Ring,
    aes128_first: false,
};

/// The environment variable that overrides [`DEFAULT_CRYPTO`] for a process (for measuring,
/// and as a way out should one library misbehave on some CPU): `ring` or `aws-lc-rs`,
/// optionally followed by `:aes128` or `:aes256` (the preferred suite), e.g.
/// `aws-lc-rs:aes128`. Either end of a connection may use either: they negotiate the same
/// TLS 1.3 suites.
pub const CRYPTO_ENV: &str = "PAGESTORE_TLS_CRYPTO";

impl Crypto {
    /// Parses a [`CRYPTO_ENV`] value.
    pub fn parse(s: &str) -> Option<Crypto> {
        let (lib, suite) = match s.trim().split_once(':') {
            Some((lib, suite)) => (lib, Some(suite)),
            None => (s.trim(), None),
        };
        let lib = match lib {
            "ring" => CryptoLib::Ring,
            "aws-lc-rs" | "aws-lc" => CryptoLib::AwsLc,
            _ => return None,
        };
        let aes128_first = match suite {
            None => DEFAULT_CRYPTO.aes128_first,
            Some("aes128") => true,
            Some("aes256") => false,
            Some(_) => return None,
        };
        Some(Crypto { lib, aes128_first })
    }

    /// What this process uses: [`CRYPTO_ENV`] when set and valid (an invalid value is logged
    /// and ignored), else [`DEFAULT_CRYPTO`]. Read once.
    pub fn current() -> Crypto {
        static CURRENT: std::sync::OnceLock<Crypto> = std::sync::OnceLock::new();
        *CURRENT.get_or_init(|| match std::env::var(CRYPTO_ENV) {
            Ok(v) => Crypto::parse(&v).unwrap_or_else(|| {
                tracing::warn!(
                    value = %v,
                    "{CRYPTO_ENV}: expected ring or aws-lc-rs, optionally with :aes128 or \
                     :aes256; using the default"
                );
                DEFAULT_CRYPTO
            }),
            Err(_) => DEFAULT_CRYPTO,
        })
    }

    /// The rustls provider: the library's, with its cipher suites in this order.
    pub fn provider(&self) -> rustls::crypto::CryptoProvider {
        let mut p = match self.lib {
            CryptoLib::Ring => rustls::crypto::ring::default_provider(),
            CryptoLib::AwsLc => rustls::crypto::aws_lc_rs::default_provider(),
        };
        let first = if self.aes128_first {
            rustls::CipherSuite::TLS13_AES_128_GCM_SHA256
        } else {
            rustls::CipherSuite::TLS13_AES_256_GCM_SHA384
        };
        // Stable: the rest keep the library's order.
        p.cipher_suites.sort_by_key(|s| s.suite() != first);
        p
    }
}

impl std::fmt::Display for Crypto {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let lib = match self.lib {
            CryptoLib::Ring => "ring",
            CryptoLib::AwsLc => "aws-lc-rs",
        };
        let suite = if self.aes128_first {
            "aes128"
        } else {
            "aes256"
        };
        write!(f, "{lib}:{suite}")
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    static PROVIDER: std::sync::OnceLock<Arc<rustls::crypto::CryptoProvider>> =
        std::sync::OnceLock::new();
    PROVIDER
        .get_or_init(|| Arc::new(Crypto::current().provider()))
        .clone()
}

fn roots(ca: &CertificateDer<'static>) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(ca.clone())
        .map_err(|e| TlsError::Config(format!("cluster CA certificate: {e}")))?;
    Ok(roots)
}

/// A rustls server configuration for a shard endpoint: TLS 1.3, ALPN `alpn`, the node's
/// identity, and client certificates verified against the CA: required when
/// `require_client_cert`, else optional (a client without one is a [`Role::Reader`]; one that
/// presents a certificate the CA did not sign is refused either way).
pub fn server_config(
    identity: &Identity,
    ca: &CertificateDer<'static>,
    require_client_cert: bool,
    alpn: &[u8],
) -> Result<rustls::ServerConfig, TlsError> {
    let cfg = |e: rustls::Error| TlsError::Config(e.to_string());
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(cfg)?;
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots(ca)?),
        provider(),
    );
    let verifier = if require_client_cert {
        verifier
    } else {
        verifier.allow_unauthenticated()
    };
    let verifier = verifier
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = builder.with_client_cert_verifier(verifier);
    let mut config = builder
        .with_single_cert(
            identity.chain.clone(),
            PrivateKeyDer::Pkcs8(identity.key.clone_key()),
        )
        .map_err(cfg)?;
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(config)
}

/// A rustls client configuration: servers are verified against the cluster CA; `identity` is
/// presented when servers require client certificates.
pub fn client_config(
    ca: &CertificateDer<'static>,
    identity: Option<&Identity>,
    alpn: &[u8],
) -> Result<rustls::ClientConfig, TlsError> {
    let cfg = |e: rustls::Error| TlsError::Config(e.to_string());
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(cfg)?
        .with_root_certificates(roots(ca)?);
    let mut config = match identity {
        Some(id) => builder
            .with_client_auth_cert(id.chain.clone(), PrivateKeyDer::Pkcs8(id.key.clone_key()))
            .map_err(cfg)?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(config)
}

/// Reads the first certificate of a PEM file (e.g. the cluster CA certificate).
pub fn load_cert_pem(path: &Path) -> Result<CertificateDer<'static>, TlsError> {
    let data = std::fs::read(path).map_err(|e| TlsError::Io(path.into(), e))?;
    let mut rd = std::io::BufReader::new(&data[..]);
    let first = rustls_pemfile::certs(&mut rd).next();
    match first {
        Some(Ok(c)) => Ok(c),
        Some(Err(e)) => Err(TlsError::Pem(path.into(), e.to_string())),
        None => Err(TlsError::Pem(path.into(), "no certificate in file".into())),
    }
}

/// Reads a certificate chain (leaf first) and its private key from PEM files.
pub fn load_identity(cert_pem: &Path, key_pem: &Path) -> Result<Identity, TlsError> {
    let read = |p: &Path| std::fs::read(p).map_err(|e| TlsError::Io(p.into(), e));
    let certs = read(cert_pem)?;
    let chain: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut &certs[..])
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Pem(cert_pem.into(), e.to_string()))?;
    if chain.is_empty() {
        return Err(TlsError::Pem(
            cert_pem.into(),
            "no certificate in file".into(),
        ));
    }
    let keys = read(key_pem)?;
    let key = rustls_pemfile::pkcs8_private_keys(&mut &keys[..])
        .next()
        .ok_or_else(|| TlsError::Pem(key_pem.into(), "no PKCS#8 private key in file".into()))?
        .map_err(|e| TlsError::Pem(key_pem.into(), e.to_string()))?;
    Ok(Identity { chain, key })
}

fn pem_block(label: &str, der: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut b64 = String::with_capacity(der.len().div_ceil(3) * 4);
    for c in der.chunks(3) {
        let n = (c[0] as u32) << 16
            | (c.get(1).copied().unwrap_or(0) as u32) << 8
            | c.get(2).copied().unwrap_or(0) as u32;
        for (i, shift) in [18u32, 12, 6, 0].into_iter().enumerate() {
            if i <= c.len() {
                b64.push(T[(n >> shift) as usize & 63] as char);
            } else {
                b64.push('=');
            }
        }
    }
    let mut s = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        s.push_str(std::str::from_utf8(line).unwrap_or_default());
        s.push('\n');
    }
    s.push_str(&format!("-----END {label}-----\n"));
    s
}

/// Writes an identity as PEM: the chain to `cert_pem`, the key (mode 0600) to `key_pem`.
pub fn save_identity(id: &Identity, cert_pem: &Path, key_pem: &Path) -> Result<(), TlsError> {
    let chain: String = id
        .chain
        .iter()
        .map(|c| pem_block("CERTIFICATE", c))
        .collect();
    write_private(cert_pem, chain.as_bytes(), 0o644)?;
    write_private(
        key_pem,
        pem_block("PRIVATE KEY", id.key.secret_pkcs8_der()).as_bytes(),
        0o600,
    )
}

/// A node's TLS material: its identity and the CA its peers must chain to.
pub struct NodeTls {
    /// The node's certificate chain and key.
    pub identity: Identity,
    /// The cluster CA certificate (trust anchor for peers and clients).
    pub ca: CertificateDer<'static>,
}

impl NodeTls {
    /// The node's TLS material, kept in `dir`:
    /// - loaded if `node-cert.pem` and `node-key.pem` are there (with `ca-cert.pem`);
    /// - else, if the cluster's `ca-cert.pem` and `ca-key.pem` are there, a node certificate
    ///   is issued from that CA and written (how nodes join one cluster: copy the CA files into
    ///   each node's TLS directory before its first start);
    /// - else a new cluster CA is generated (`ca-cert.pem`, `ca-key.pem`) and a node
    ///   certificate issued from it: a one-node cluster, or the first node of a new one.
    pub fn load_or_create(dir: &Path, node_name: &str) -> Result<NodeTls, TlsError> {
        let (cert, key, ca_cert, ca_key) = (
            dir.join("node-cert.pem"),
            dir.join("node-key.pem"),
            dir.join("ca-cert.pem"),
            dir.join("ca-key.pem"),
        );
        if cert.exists() || key.exists() {
            let identity = load_identity(&cert, &key)?;
            let ca = load_cert_pem(&ca_cert)?;
            return Ok(NodeTls { identity, ca });
        }
        std::fs::create_dir_all(dir).map_err(|e| TlsError::Io(dir.into(), e))?;
        let cluster = if ca_cert.exists() && ca_key.exists() {
            ClusterCa::load(&ca_cert, &ca_key)?
        } else {
            let c = ClusterCa::generate(CA_NAME)?;
            c.save(&ca_cert, &ca_key)?;
            c
        };
        let identity = cluster.issue(node_name, Role::Node)?;
        save_identity(&identity, &cert, &key)?;
        // The trust anchor is the certificate on disk (a reloaded CA signs the same way but its
        // own certificate's bytes differ).
        Ok(NodeTls {
            identity,
            ca: load_cert_pem(&ca_cert)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_file_names_itself_and_keeps_the_io_error_as_source() {
        let missing = Path::new("/definitely/not/here/cert.pem");
        let e = load_identity(missing, missing).err().unwrap();
        assert!(matches!(e, TlsError::Io(..)), "{e:?}");
        assert!(
            e.to_string().starts_with("/definitely/not/here/cert.pem: "),
            "{e}"
        );
        let io = std::error::Error::source(&e)
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .unwrap();
        assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
    }

    #[test]
    fn node_tls_is_generated_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let a = NodeTls::load_or_create(dir.path(), "node-a").unwrap();
        let b = NodeTls::load_or_create(dir.path(), "node-a").unwrap();
        assert_eq!(a.identity.chain, b.identity.chain);
        assert_eq!(a.ca, b.ca);
        assert_eq!(
            a.identity.key.secret_pkcs8_der(),
            b.identity.key.secret_pkcs8_der()
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("node-key.pem"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        // The kept material still makes valid server and client configurations.
        server_config(&b.identity, &b.ca, true, b"x").unwrap();
        client_config(&b.ca, Some(&b.identity), b"x").unwrap();
    }

    #[test]
    fn the_crypto_choice_parses_and_orders_the_suites() {
        use rustls::CipherSuite as S;
        assert_eq!(
            Crypto::parse("ring"),
            Some(Crypto {
                lib: CryptoLib::Ring,
                ..DEFAULT_CRYPTO
            })
        );
        let aws = Crypto::parse("aws-lc-rs:aes128").unwrap();
        assert_eq!((aws.lib, aws.aes128_first), (CryptoLib::AwsLc, true));
        assert_eq!(aws.to_string(), "aws-lc-rs:aes128");
        assert_eq!(Crypto::parse(&aws.to_string()), Some(aws));
        assert_eq!(
            Crypto::parse("ring:aes256").map(|c| c.aes128_first),
            Some(false)
        );
        for bad in ["", "openssl", "ring:aes512", "ring:"] {
            assert_eq!(Crypto::parse(bad), None, "{bad}");
        }
        for lib in [CryptoLib::Ring, CryptoLib::AwsLc] {
            for aes128_first in [true, false] {
                let p = Crypto { lib, aes128_first }.provider();
                let tls13: Vec<S> = p
                    .cipher_suites
                    .iter()
                    .map(|s| s.suite())
                    .filter(|s| {
                        matches!(
                            s,
                            S::TLS13_AES_128_GCM_SHA256
                                | S::TLS13_AES_256_GCM_SHA384
                                | S::TLS13_CHACHA20_POLY1305_SHA256
                        )
                    })
                    .collect();
                let want = if aes128_first {
                    [S::TLS13_AES_128_GCM_SHA256, S::TLS13_AES_256_GCM_SHA384]
                } else {
                    [S::TLS13_AES_256_GCM_SHA384, S::TLS13_AES_128_GCM_SHA256]
                };
                assert_eq!(tls13[..2], want, "{lib:?}");
                assert_eq!(tls13[2], S::TLS13_CHACHA20_POLY1305_SHA256);
                assert_eq!(p.cipher_suites[0].suite(), want[0]);
            }
        }
    }

    #[test]
    fn nodes_join_a_cluster_by_sharing_its_ca_files() {
        let ca_dir = tempfile::tempdir().unwrap();
        let ca = ClusterCa::generate(CA_NAME).unwrap();
        ca.save(
            &ca_dir.path().join("ca-cert.pem"),
            &ca_dir.path().join("ca-key.pem"),
        )
        .unwrap();
        let node_dir = tempfile::tempdir().unwrap();
        for f in ["ca-cert.pem", "ca-key.pem"] {
            std::fs::copy(ca_dir.path().join(f), node_dir.path().join(f)).unwrap();
        }
        let node = NodeTls::load_or_create(node_dir.path(), "n1").unwrap();
        assert_eq!(node.ca, ca.cert_der(), "the node keeps the cluster's CA");
        // A certificate issued by the reloaded CA verifies against the original CA certificate.
        let reloaded = ClusterCa::load(
            &ca_dir.path().join("ca-cert.pem"),
            &ca_dir.path().join("ca-key.pem"),
        )
        .unwrap();
        let client = reloaded.issue("client", Role::Reader).unwrap();
        let roots = roots(&ca.cert_der()).unwrap();
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider(),
        )
        .build()
        .unwrap();
        verifier
            .verify_client_cert(&client.chain[0], &[], rustls::pki_types::UnixTime::now())
            .unwrap();
        // A CA with another key is refused.
        let other = ClusterCa::generate(CA_NAME).unwrap();
        other
            .save(
                &ca_dir.path().join("x-cert.pem"),
                &ca_dir.path().join("x-key.pem"),
            )
            .unwrap();
        assert!(ClusterCa::load(
            &ca_dir.path().join("ca-cert.pem"),
            &ca_dir.path().join("x-key.pem")
        )
        .is_err());
    }

    #[test]
    fn roles_are_read_from_the_certificate_the_ca_signed() {
        let ca = ClusterCa::generate(CA_NAME).unwrap();
        for role in Role::ALL {
            let id = ca.issue("peer", role).unwrap();
            assert_eq!(peer_role(Some(&id.chain)), role);
            assert_eq!(Role::parse(role.as_str()), Some(role));
        }
        assert_eq!(peer_role(None), Role::Reader, "no certificate: a reader");
        assert_eq!(peer_role(Some(&[])), Role::Reader);
        // A certificate that names no role (issued before roles existed) is a reader's.
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec![SERVER_NAME.to_string()]).unwrap();
        let old = params.signed_by(&key, &ca.cert, &ca.key).unwrap();
        assert_eq!(peer_role(Some(&[old.der().clone()])), Role::Reader);
        // Two role names: ambiguous, so the least.
        let key = rcgen::KeyPair::generate().unwrap();
        let params =
            rcgen::CertificateParams::new(vec![Role::Admin.dns_name(), Role::Writer.dns_name()])
                .unwrap();
        let two = params.signed_by(&key, &ca.cert, &ca.key).unwrap();
        assert_eq!(peer_role(Some(&[two.der().clone()])), Role::Reader);
        assert!(Role::Admin.allows(Role::Writer) && Role::Node.allows(Role::Admin));
        assert!(!Role::Reader.allows(Role::Writer) && !Role::Writer.allows(Role::Admin));
        assert_eq!(Role::parse("root"), None);
    }

    #[test]
    fn a_damaged_key_file_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        NodeTls::load_or_create(dir.path(), "n").unwrap();
        std::fs::write(dir.path().join("node-key.pem"), "garbage").unwrap();
        let e = NodeTls::load_or_create(dir.path(), "n")
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("node-key.pem") && e.contains("private key"),
            "{e}"
        );
    }
}
