//! Helpers shared by the engine's integration tests.
#![allow(dead_code)]

use std::path::Path;

use pagestore_engine::{format::Geometry, Engine, EngineConfig, PolicyKind};

#[allow(unused_imports)]
pub use futures_lite::future::block_on;

pub const KIB: u32 = 1024;

/// Deterministic bytes for a page: the same (file, page, version, len) always gives the same
/// content, so a reader can check any page it gets back. A small deterministic generator
/// (xorshift64) for randomised tests.
#[allow(unused_imports)]
pub use pagestore_testkit::data::{page_bytes, Xorshift as Rng};

/// A small engine: `slots` pages of `page_size` per shard, in `dir`.
pub fn config(dir: &Path, shards: usize, page_size: u32, slots: u64) -> EngineConfig {
    // Exactly `slots` slots per shard: the size of such a file (docs/FORMAT.md).
    let file = Geometry::new(page_size, 4096, slots as u32).file_size;
    EngineConfig {
        cache_dirs: vec![dir.to_path_buf()],
        capacity: file * shards as u64,
        page_size,
        shards,
        pin_cpus: false,
        queue_depth: 4,
        policy: PolicyKind::Lru,
        ..Default::default()
    }
}

pub fn start(cfg: EngineConfig) -> Engine {
    Engine::start(cfg).expect("engine starts")
}

pub fn tempdir() -> tempfile::TempDir {
    // Under the target directory: a real disk file system (O_DIRECT), not tmpfs.
    let base = Path::new(env!("CARGO_TARGET_TMPDIR"));
    tempfile::tempdir_in(base).expect("tempdir")
}

/// Asserts that `r` is the engine's refusal of a page of 5,000 bytes said to be in a
/// one-block (4,096-byte) DMA buffer.
pub fn assert_5000_in_one_block_refused<T: std::fmt::Debug>(
    r: &Result<T, pagestore_engine::EngineError>,
) {
    assert!(
        matches!(
            r,
            Err(pagestore_engine::EngineError::BufferTooShort {
                len: 5000,
                capacity: 4096
            })
        ),
        "{r:?}"
    );
}
