//! `pagestore-client`: what a reader needs to use the cache.
//!
//! - [`ufs`]: the under storage: the mount table over object stores, object versions and file
//!   ids; also the [`ufs::UfsSource`] a `pagestored` node loads misses through.
//! - [`localfs`]: the store behind `file://` mounts, which never leaves its root directory.
//! - [`client`]: the cluster client: `stat`, `list`, `read`, parallel page fetches from the
//!   owning shards over QUIC, replica and under-storage fallback with dead-member back-off.
//! - [`handle`]: an open file implementing tokio's `AsyncRead` and `AsyncSeek`, version-pinned,
//!   with read-ahead.
//! - [`tls`]: where a client finds its TLS material.

pub mod client;
pub mod etcd;
pub mod handle;
pub mod localfs;
pub mod tls;
pub mod ufs;

pub use client::{
    Client, ClientOptions, ClusterSource, Error, LoadOutcome, ShardCounters, StatsSnapshot,
};
pub use handle::FileHandle;
