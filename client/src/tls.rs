//! Where a client finds its TLS material: a directory holding the cluster CA certificate
//! (`ca-cert.pem`, required: servers are verified against it) and, for clusters that require
//! client certificates, either `client-cert.pem` + `client-key.pem`, or the CA key
//! (`ca-key.pem`), from which an in-memory client certificate is issued. A node's own TLS
//! directory (`<cache dir>/tls`) therefore works for a client on that node.

use std::{path::Path, sync::Arc};

use pagestore_protocol::{frame, tls, transport};

use crate::client::Error;

/// A quinn client configuration from the TLS directory `dir`.
pub fn client_config(dir: &Path) -> Result<quinn::ClientConfig, Error> {
    fn cfg<E: std::error::Error + Send + Sync + 'static>(e: E) -> Error {
        Error::config_from(format!("TLS: {e}"), e)
    }
    let ca_path = dir.join("ca-cert.pem");
    if !ca_path.exists() {
        return Err(Error::config(format!(
            "no cluster CA certificate at {}: point --tls-dir (or PAGESTORE_TLS_DIR) at a \
             directory holding the cluster's ca-cert.pem (pagestored writes it to \
             <cache dir>/tls at first start)",
            ca_path.display()
        )));
    }
    let ca = tls::load_cert_pem(&ca_path).map_err(cfg)?;
    let (cert, key, ca_key) = (
        dir.join("client-cert.pem"),
        dir.join("client-key.pem"),
        dir.join("ca-key.pem"),
    );
    let identity = if cert.exists() && key.exists() {
        Some(tls::load_identity(&cert, &key).map_err(cfg)?)
    } else if ca_key.exists() {
        let ca = tls::ClusterCa::load(&ca_path, &ca_key).map_err(cfg)?;
        Some(
            ca.issue("pagestore client", tls::Role::Admin)
                .map_err(cfg)?,
        )
    } else {
        None
    };
    config_for(&ca, identity.as_ref())
}

/// A quinn client configuration that trusts servers signed by `ca` and presents `identity`
/// (a node's own certificate, when a node is the client of its peers).
pub fn config_for(
    ca: &quinn::rustls::pki_types::CertificateDer<'static>,
    identity: Option<&tls::Identity>,
) -> Result<quinn::ClientConfig, Error> {
    fn cfg<E: std::error::Error + Send + Sync + 'static>(e: E) -> Error {
        Error::config_from(format!("TLS: {e}"), e)
    }
    let rustls = tls::client_config(ca, identity, frame::ALPN).map_err(cfg)?;
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(rustls).map_err(cfg)?;
    let mut config = quinn::ClientConfig::new(Arc::new(crypto));
    config.transport_config(transport::transport_config());
    Ok(config)
}
