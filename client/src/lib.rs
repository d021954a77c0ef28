//! `pagestore-client`: what a reader needs to use the cache, on tokio (no engine, no glommio).
//!
//! - [`pool`]: QUIC connections to shard endpoints (quinn), one request per stream.
//! - [`ufs`], [`localfs`], [`etcd`]: the mounts and membership, re-exported from
//!   `pagestore-mounts` (a client reads the under storage itself when the cache cannot answer).
//! - [`client`]: the cluster client: `stat`, `list`, `read`, parallel page fetches from the
//!   owning shards over QUIC, replica and under-storage fallback with dead-member back-off.
//! - [`handle`]: an open file implementing tokio's `AsyncRead` and `AsyncSeek`, version-pinned,
//!   with read-ahead.
//! - [`timing`]: each member's usual answer time, and the silence after which a request waiting
//!   on it is given up.
//! - [`tls`]: where a client finds its TLS material.
//! - [`writer`]: writing through the cluster to `back` and `transient` mounts, and their
//!   namespace changes (rename, delete, directories).

pub mod client;
pub mod handle;
pub mod pool;
mod spill;
pub mod spread;
pub mod timing;
pub mod tls;
pub mod writer;

pub use pagestore_mounts::{etcd, localfs, ufs};

pub use client::{
    BoxError, Client, ClientOptions, ClusterSource, Error, LoadOutcome, ShardStat, StatsSnapshot,
};
pub use handle::{FileHandle, ReadRun};
pub use pagestore_protocol::frame::{
    HotFile, HotPage, HotReport, JobRecord, JobState, MountBytes, ShardCounters,
};
pub use writer::{WriteOptions, Writer};
