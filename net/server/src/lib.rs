//! `pagestore-server`: a node's network side, on the engine's glommio shards.
//!
//! Each shard of a node runs its own QUIC endpoint ([`endpoint`]) on its own UDP port (base port
//! plus shard index), driven by quinn-proto on the shard's glommio executor, so a request that
//! reaches a shard is served by that shard with no cross-core hand-off. [`service`] answers the
//! requests, [`loader`] brings misses in from the under storage, [`memory`] keeps the hottest
//! pages in RAM in front of the disk cache, [`hot`] counts the hottest files and pages and the
//! bytes per mount, [`spread`] decides which pages are hot enough to be served by replicas and
//! which copies have cooled, [`node`] starts it all. The
//! frames, ring and TLS settings come from `pagestore-protocol`; clients (tokio, quinn) are in
//! `pagestore-client`.

pub mod endpoint;
pub mod hot;
pub mod loader;
pub mod memory;
pub mod node;
pub mod service;
pub mod spread;

// The protocol's modules, reachable as `crate::frame` etc. inside this crate.
use pagestore_protocol::{frame, jobs, ring, source, tls, transport, writeback};
