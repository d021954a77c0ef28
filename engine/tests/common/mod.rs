//! Helpers shared by the engine's integration tests.
#![allow(dead_code)]

use std::path::Path;

use pagestore_engine::{format::Geometry, Engine, EngineConfig, PolicyKind};

#[allow(unused_imports)]
pub use futures_lite::future::block_on;

pub const KIB: u32 = 1024;

/// Deterministic bytes for a page: the same (file, page, version, len) always gives the same
/// content, so a reader can check any page it gets back.
pub fn page_bytes(file_id: u128, page: u64, version: u64, len: usize) -> Vec<u8> {
    let mut x = (file_id as u64)
        ^ ((file_id >> 64) as u64)
        ^ page.rotate_left(17)
        ^ version.rotate_left(41)
        ^ 0x9E37_79B9_7F4A_7C15;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

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

/// A small deterministic generator (xorshift64) for randomised tests.
pub struct Rng(pub u64);

impl Rng {
    /// Next value.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A value below `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
