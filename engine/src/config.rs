//! Engine configuration.

use std::{path::PathBuf, sync::Arc};

use crate::{device::DiskHooks, error::StartError, policy::PolicyKind, rules::Rules};

/// Smallest supported page size.
pub const MIN_PAGE_SIZE: u32 = 64 << 10;
/// Largest supported page size.
pub const MAX_PAGE_SIZE: u32 = 64 << 20;
/// Default page size.
pub const DEFAULT_PAGE_SIZE: u32 = 4 << 20;
/// Default checksum granule.
pub const DEFAULT_CHUNK_SIZE: u32 = 4096;

/// How an engine is laid out on disk and on cores.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Cache directories (one cache file per shard in each). Must be on a file system that
    /// supports O_DIRECT.
    pub cache_dirs: Vec<PathBuf>,
    /// Total bytes the cache files may occupy, split evenly over shards and directories.
    pub capacity: u64,
    /// Page size: a power of two from 64 KiB to 64 MiB. Fixed for the life of a cache.
    pub page_size: u32,
    /// Checksum granule: a power of two from 4 KiB to the page size. Reads fetch and verify whole
    /// granules, so small granules make small reads cheap; each costs 4 bytes of memory per
    /// granule cached (0.1% of the cache at 4 KiB).
    pub chunk_size: u32,
    /// Number of shards (one executor thread each). 0 means one per available CPU.
    pub shards: usize,
    /// Pin shard `i` to the i-th CPU this process may run on.
    pub pin_cpus: bool,
    /// Eviction policy.
    pub policy: PolicyKind,
    /// Page I/Os in flight per shard that get registered (io_uring fixed) buffers; sizes each
    /// shard's registered arena to `page_size * queue_depth`. Extra I/Os still work, from heap
    /// buffers.
    pub queue_depth: usize,
    /// Requests from other threads a shard runs at once (backpressure for [`crate::ShardHandle`]).
    pub max_inflight: usize,
    /// Discard existing cache files that were made with other settings or whose superblock is
    /// damaged, instead of refusing to start.
    pub reformat: bool,
    /// Quota, TTL and pin per logical-path prefix (see [`crate::rules`]); empty by default.
    /// Pages are stored under a rule with [`crate::Shard::put_in_rule`].
    pub rules: Arc<Rules>,
    /// An interposer on every cache-file read, write and preallocation (see
    /// [`crate::DiskHooks`]); `None` (the default, and what the daemon uses) adds nothing but a
    /// `None` check per operation. Tests install a fault-injecting one.
    pub disk_hooks: Option<Arc<dyn DiskHooks>>,
    /// Bytes of dirty pages (written through the cluster, not in the under storage yet) the
    /// engine may hold, split evenly over shards; `None`: half the capacity. A dirty page
    /// beyond it is refused with [`crate::EngineError::DirtyFull`].
    pub dirty_limit: Option<u64>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            cache_dirs: Vec::new(),
            capacity: 1 << 30,
            page_size: DEFAULT_PAGE_SIZE,
            chunk_size: DEFAULT_CHUNK_SIZE,
            shards: 0,
            pin_cpus: true,
            policy: PolicyKind::default(),
            queue_depth: 16,
            max_inflight: 256,
            reformat: false,
            rules: Arc::default(),
            disk_hooks: None,
            dirty_limit: None,
        }
    }
}

impl EngineConfig {
    /// A configuration with one cache directory and the given capacity, defaults otherwise.
    pub fn new(dir: impl Into<PathBuf>, capacity: u64) -> Self {
        EngineConfig {
            cache_dirs: vec![dir.into()],
            capacity,
            ..Default::default()
        }
    }

    /// Checks the settings that do not need the disk.
    pub fn validate(&self) -> Result<(), StartError> {
        let bad = |m: String| Err(StartError::Config(m));
        if self.cache_dirs.is_empty() {
            return bad("no cache directory configured".into());
        }
        for (i, a) in self.cache_dirs.iter().enumerate() {
            if self.cache_dirs[..i].contains(a) {
                return bad(format!("cache directory {} listed twice", a.display()));
            }
        }
        if !self.page_size.is_power_of_two()
            || !(MIN_PAGE_SIZE..=MAX_PAGE_SIZE).contains(&self.page_size)
        {
            return bad(format!(
                "page size {} must be a power of two from {} KiB to {} MiB",
                self.page_size,
                MIN_PAGE_SIZE >> 10,
                MAX_PAGE_SIZE >> 20
            ));
        }
        if !self.chunk_size.is_power_of_two()
            || self.chunk_size < 4096
            || self.chunk_size > self.page_size
        {
            return bad(format!(
                "checksum chunk size {} must be a power of two from 4096 to the page size",
                self.chunk_size
            ));
        }
        if self.queue_depth == 0 || self.max_inflight == 0 {
            return bad("queue depth and max in-flight requests must be at least 1".into());
        }
        self.rules
            .limits(self.resolved_shards(), self.page_size)
            .map(|_| ())
    }

    /// Each shard's dirty limit in bytes: [`EngineConfig::dirty_limit`] (or half the
    /// capacity) over the shards.
    pub fn dirty_limit_per_shard(&self) -> u64 {
        let total = self.dirty_limit.unwrap_or(self.capacity / 2);
        total / self.resolved_shards().max(1) as u64
    }

    /// The shard count after resolving 0 to the available CPUs.
    pub fn resolved_shards(&self) -> usize {
        if self.shards > 0 {
            self.shards
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        }
    }
}
