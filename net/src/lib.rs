//! `pagestore-net`: the wire protocol, per-shard QUIC endpoints and the consistent hash ring.
//!
//! Each shard of a node runs its own QUIC endpoint ([`endpoint`]) on its own UDP port (base port
//! plus shard index), driven by quinn-proto on the shard's glommio executor, so a request that
//! reaches a shard is served by that shard with no cross-core hand-off. Clients are ordinary
//! tokio programs using `quinn`; both sides use [`transport::transport_config`] and the TLS
//! settings of [`tls`].

pub mod client;
pub mod endpoint;
pub mod frame;
pub mod jobs;
pub mod members;
pub mod node;
pub mod node_id;
pub mod ring;
pub mod service;
pub mod source;
pub mod tls;
pub mod transport;
