//! Per-shard counters.

use std::cell::Cell;

/// Live counters, owned by one shard (plain cells: no atomics, nothing shared).
#[derive(Default)]
pub(crate) struct Counters {
    pub hits: Cell<u64>,
    pub hit_bytes: Cell<u64>,
    pub misses: Cell<u64>,
    pub inserts: Cell<u64>,
    pub insert_bytes: Cell<u64>,
    pub evictions: Cell<u64>,
    pub removals: Cell<u64>,
    pub checksum_failures: Cell<u64>,
    pub io_errors: Cell<u64>,
    pub dirty_puts: Cell<u64>,
    pub dirty_refused: Cell<u64>,
    pub syncs: Cell<u64>,
}

/// A snapshot of one shard's state and counters (since start).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShardStats {
    /// Shard index.
    pub shard: usize,
    /// Page slots.
    pub slots: u64,
    /// Bytes of page capacity (`slots * page_size`).
    pub capacity_bytes: u64,
    /// Pages cached.
    pub pages: u64,
    /// Bytes cached.
    pub bytes: u64,
    /// Reads served from the cache.
    pub hits: u64,
    /// Bytes served from the cache.
    pub hit_bytes: u64,
    /// Reads that found nothing (including pages dropped for a bad checksum).
    pub misses: u64,
    /// Pages written.
    pub inserts: u64,
    /// Bytes written.
    pub insert_bytes: u64,
    /// Pages evicted to make room.
    pub evictions: u64,
    /// Pages removed on request.
    pub removals: u64,
    /// Pages that failed checksum verification on read (dropped, never served).
    pub checksum_failures: u64,
    /// Disk I/O errors (the request failed; the shard kept serving).
    pub io_errors: u64,
    /// Metadata block writes issued.
    pub metadata_writes: u64,
    /// Pages restored from disk at start-up.
    pub recovered_pages: u64,
    /// Damaged or duplicate page records discarded at start-up.
    pub recovery_dropped: u64,
    /// Time spent opening and recovering the shard, in microseconds.
    pub recovery_micros: u64,
    /// Dirty pages (written through the cluster, not in the under storage yet).
    pub dirty_pages: u64,
    /// Bytes of those pages.
    pub dirty_bytes: u64,
    /// The most dirty bytes the shard takes.
    pub dirty_limit: u64,
    /// Dirty pages stored (each durable before it was acknowledged).
    pub dirty_puts: u64,
    /// Dirty pages refused at the dirty limit.
    pub dirty_refused: u64,
    /// `fdatasync` calls made to make dirty pages durable (one serves every page written
    /// before it started).
    pub syncs: u64,
}

impl ShardStats {
    /// Sums a set of shard snapshots (the `shard` field becomes the count of shards).
    pub fn total<'a>(all: impl IntoIterator<Item = &'a ShardStats>) -> ShardStats {
        let mut t = ShardStats::default();
        for s in all {
            t.shard += 1;
            t.slots += s.slots;
            t.capacity_bytes += s.capacity_bytes;
            t.pages += s.pages;
            t.bytes += s.bytes;
            t.hits += s.hits;
            t.hit_bytes += s.hit_bytes;
            t.misses += s.misses;
            t.inserts += s.inserts;
            t.insert_bytes += s.insert_bytes;
            t.evictions += s.evictions;
            t.removals += s.removals;
            t.checksum_failures += s.checksum_failures;
            t.io_errors += s.io_errors;
            t.metadata_writes += s.metadata_writes;
            t.recovered_pages += s.recovered_pages;
            t.dirty_pages += s.dirty_pages;
            t.dirty_bytes += s.dirty_bytes;
            t.dirty_limit += s.dirty_limit;
            t.dirty_puts += s.dirty_puts;
            t.dirty_refused += s.dirty_refused;
            t.syncs += s.syncs;
            t.recovery_dropped += s.recovery_dropped;
            t.recovery_micros = t.recovery_micros.max(s.recovery_micros);
        }
        t
    }
}
