//! Node setup shared by the server's integration tests (`quic.rs`, `miss.rs`, `bounds.rs`): a
//! node's TLS and QUIC settings from a test CA, a small engine in a temporary directory, node
//! options with the tests' defaults, and client pools.
#![allow(dead_code, clippy::unwrap_used)]

use std::{path::Path, sync::Arc, time::Duration};

use pagestore_client::pool::{Pool, PoolOptions};
use pagestore_engine::{format::Geometry, EngineConfig};
use pagestore_protocol::{
    frame,
    ring::{Ring, RingConfig},
    tls::{self, ClusterCa, Identity},
    transport,
};
use pagestore_server::{node::NodeOptions, spread::SpreadConfig};

/// Largest request a test node accepts (a 1 MiB page and its frame head).
pub const MAX_REQUEST: usize = (1 << 20) + 4096;

/// A temporary directory under the target directory: a real disk file system (O_DIRECT), not
/// tmpfs.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

/// The QUIC server settings of a node with a fresh node certificate from `ca`; clients must
/// present a certificate when `require_client_cert` is set.
pub fn server_config(ca: &ClusterCa, require_client_cert: bool) -> Arc<quinn_proto::ServerConfig> {
    let id = ca.issue("node", tls::Role::Node).unwrap();
    let rustls = tls::server_config(&id, &ca.cert_der(), require_client_cert, frame::ALPN).unwrap();
    let mut server = quinn_proto::ServerConfig::with_crypto(Arc::new(
        quinn_proto::crypto::rustls::QuicServerConfig::try_from(rustls).unwrap(),
    ));
    server.transport_config(transport::transport_config());
    Arc::new(server)
}

/// An engine of `shards` shards with exactly `slots` pages of `page` bytes each, in `dir`.
pub fn engine_config(dir: &Path, page: u32, slots: u32, shards: usize) -> EngineConfig {
    EngineConfig {
        cache_dirs: vec![dir.to_path_buf()],
        capacity: Geometry::new(page, 4096, slots).file_size * shards as u64,
        page_size: page,
        shards,
        pin_cpus: false,
        queue_depth: 4,
        ..Default::default()
    }
}

/// Options of a node listening on free loopback ports, with `MAX_REQUEST` as both the request
/// bound and the per-connection allowance, default limits, no under storage, no other nodes and
/// no replicas. Tests change what they need with struct update syntax.
pub fn node_options(
    server: Arc<quinn_proto::ServerConfig>,
    node_id: u128,
    ring: Ring,
) -> NodeOptions {
    NodeOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        server,
        node_id,
        ring: Arc::new(ring),
        max_request: MAX_REQUEST,
        max_buffered: MAX_REQUEST,
        limits: Default::default(),
        source: None,
        nodes: Vec::new(),
        replicas: 0,
        writeback: None,
        memory_cache: 0,
        spread: SpreadConfig::default(),
    }
}

/// An empty ring: a stand-alone node serves every key.
pub fn no_ring() -> Ring {
    Ring::new([], RingConfig::default(), 0).unwrap()
}

/// Client QUIC settings trusting `ca`, presenting `identity` if given.
pub fn client_config(ca: &ClusterCa, identity: Option<&Identity>) -> quinn::ClientConfig {
    let rustls = tls::client_config(&ca.cert_der(), identity, frame::ALPN).unwrap();
    let mut cfg = quinn::ClientConfig::new(Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(rustls).unwrap(),
    ));
    cfg.transport_config(transport::transport_config());
    cfg
}

/// A client pool bound to `bind`, with a 15 s request timeout (call inside a tokio runtime).
pub fn pool(ca: &ClusterCa, identity: Option<&Identity>, bind: &str) -> Arc<Pool> {
    let opts = PoolOptions {
        timeout: Duration::from_secs(15),
        ..Default::default()
    };
    Pool::new(client_config(ca, identity), bind.parse().unwrap(), opts).unwrap()
}

/// The bytes of a whole page of `file` (version 1), `len` bytes long.
pub fn page_bytes(file: u128, page: u64, len: u32) -> Vec<u8> {
    pagestore_testkit::data::page_bytes(file, page, 1, len as usize)
}
