//! `pagestore-engine`: a shared-nothing, per-core page store.
//!
//! Each shard is one glommio executor pinned to one core. It owns a preallocated cache file in
//! every cache directory, an index of the pages in them, an eviction policy and its counters.
//! Pages are fixed-size pieces of files, keyed by `(file id, page index)`, written and read with
//! O_DIRECT over io_uring and checksummed in 4 KiB chunks; a page that fails its checksum is
//! dropped and reported as a miss, never served.
//!
//! Two ways in:
//! - on the shard's own executor, [`Shard`]'s methods (the hit path: no locks, no cross-core hop);
//! - from any other thread, a [`ShardHandle`] from [`Engine::shards`], which ships the request to
//!   the shard and awaits the reply.
//!
//! ```no_run
//! use pagestore_engine::{Engine, EngineConfig, PageKey};
//! let engine = Engine::start(EngineConfig::new("/var/cache/pagestore", 8 << 30))?;
//! let key = PageKey::new(42, 0);
//! let shard = engine.shard_of(&key);
//! futures_lite::future::block_on(async {
//!     shard.put(key, vec![7u8; 1000], 1).await?;
//!     assert_eq!(shard.get(key, 0, 1000).await?, Some(vec![7u8; 1000]));
//!     Ok::<_, pagestore_engine::EngineError>(())
//! })?;
//! # Ok::<_, Box<dyn std::error::Error>>(())
//! ```
//!
//! docs/ARCHITECTURE.md explains the threads and the hit path; docs/FORMAT.md the on-disk layout.

mod cachefile;
mod config;
mod device;
mod engine;
mod error;
pub mod event;
pub mod format;
pub mod index;
mod key;
pub mod policy;
pub mod probe;
pub mod rules;
mod shard;
mod stats;

pub use config::{
    EngineConfig, DEFAULT_CHUNK_SIZE, DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, MIN_PAGE_SIZE,
};
pub use device::{DiskHooks, DiskIo, DiskOp};
pub use engine::{shard_file, Engine, ShardHandle, ShardInit};
pub use error::{EngineError, Result, StartError};
/// glommio's DMA buffer, for [`Shard::put_buffer`].
pub use glommio::io::DmaBuffer;
pub use index::RuleStats;
pub use key::PageKey;
pub use policy::PolicyKind;
pub use rules::{Rule, Rules};
pub use shard::{DirtyFile, PageData, PageInfo, PutOutcome, Shard};
pub use stats::ShardStats;
