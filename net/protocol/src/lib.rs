//! `pagestore-protocol`: everything both ends of a pagestore connection agree on, with no
//! runtime (it plays the part quinn-proto plays for quinn).
//!
//! - [`frame`]: the wire frames (a fixed preamble, an rkyv header, a raw payload) with explicit
//!   per-field limits.
//! - [`ring`]: the consistent hash ring that maps pages to shards; [`members`]: member lists.
//! - [`tls`]: the cluster CA, certificates with roles, rustls settings; [`transport`]: the QUIC
//!   settings both sides use.
//! - [`source`]: the under-storage seam a node loads misses through.
//! - [`jobs`]: preload job records; [`node_id`]: a node's persistent UUID.
//! - [`writeback`]: write-back version tags, write policies, the clock that orders changes.
//!
//! The server (`pagestore-server`, glommio) and the client (`pagestore-client`, tokio) are thin
//! runtimes around it.

pub mod frame;
pub mod jobs;
pub mod members;
pub mod node_id;
pub mod ring;
pub mod source;
pub mod tls;
pub mod transport;
pub mod writeback;
