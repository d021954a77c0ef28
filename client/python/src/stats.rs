//! `pagestore.stats()`: the seed's three numbers (hit ratio, read bandwidth, time to first
//! batch) as far as a client can know them: the hit ratio from every shard's `Counters`, the
//! read bandwidth and time to first batch of this process's own reads, beside the client's
//! counters and the last preload job's time to first page.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        OnceLock,
    },
    time::Instant,
};

use pyo3::{prelude::*, types::PyDict};

use pagestore_client::Client;

use crate::process;

/// This process's reads through the module. Times are nanoseconds since [`base`] plus one (0:
/// not yet).
#[derive(Default)]
pub struct ReadStats {
    /// When the first client of the process started connecting.
    connect: AtomicU64,
    /// When the first read ended.
    first_read_end: AtomicU64,
    /// When the first read started, and when the last one ended.
    first_start: AtomicU64,
    last_end: AtomicU64,
    bytes: AtomicU64,
    reads: AtomicU64,
}

fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

fn stamp(t: Instant) -> u64 {
    t.saturating_duration_since(base()).as_nanos() as u64 + 1
}

fn secs(a: u64, b: u64) -> Option<f64> {
    (a > 0 && b >= a).then(|| (b - a) as f64 / 1e9)
}

impl ReadStats {
    /// A client starts connecting (the first one is the start of "time to first batch").
    pub fn connecting(&self) {
        let _ = self.connect.compare_exchange(
            0,
            stamp(Instant::now()),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// A read that started at `t0` ended now with `bytes` bytes.
    pub fn record(&self, t0: Instant, bytes: u64) {
        let now = stamp(Instant::now());
        let _ =
            self.first_start
                .compare_exchange(0, stamp(t0), Ordering::Relaxed, Ordering::Relaxed);
        let _ = self
            .first_read_end
            .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
        self.last_end.fetch_max(now, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.reads.fetch_add(1, Ordering::Relaxed);
    }
}

/// The dict `pagestore.stats()` returns (see `python/pagestore/__init__.py`).
pub fn stats<'py>(py: Python<'py>, client: &Client) -> PyResult<Bound<'py, PyDict>> {
    let p = process()?;
    let (counters, jobs) = p.block_on(py, async {
        tokio::join!(client.shard_counters(), client.jobs())
    });
    let (mut hits, mut misses, mut hit_bytes, mut ufs_bytes) = (0u64, 0u64, 0u64, 0u64);
    let (mut answered, shards) = (0, counters.len());
    for c in counters.iter().filter_map(|(_, _, c)| c.as_ref()) {
        answered += 1;
        hits += c.hits;
        misses += c.misses;
        hit_bytes += c.hit_bytes;
        ufs_bytes += c.ufs_bytes;
    }
    let ratio = |a: u64, b: u64| (a + b > 0).then(|| a as f64 / (a + b) as f64);
    let r = &p.reads;
    let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let bytes = g(&r.bytes);
    let span = secs(g(&r.first_start), g(&r.last_end));
    let d = PyDict::new(py);
    d.set_item("hit_ratio", ratio(hits, misses))?;
    d.set_item("byte_hit_ratio", ratio(hit_bytes, ufs_bytes))?;
    d.set_item(
        "read_bandwidth",
        span.filter(|s| *s > 0.0).map(|s| bytes as f64 / s),
    )?;
    d.set_item(
        "time_to_first_batch",
        secs(g(&r.connect), g(&r.first_read_end)),
    )?;
    d.set_item("read_bytes", bytes)?;
    d.set_item("reads", g(&r.reads))?;
    d.set_item("read_secs", span)?;
    let last_job = jobs.ok().and_then(|j| j.into_iter().next());
    d.set_item(
        "preload_time_to_first_page",
        last_job.as_ref().and_then(|j| j.first_page_secs),
    )?;
    d.set_item("preload_job", last_job.as_ref().map(|j| j.id.clone()))?;
    let cluster = PyDict::new(py);
    cluster.set_item("hits", hits)?;
    cluster.set_item("misses", misses)?;
    cluster.set_item("hit_bytes", hit_bytes)?;
    cluster.set_item("ufs_bytes", ufs_bytes)?;
    cluster.set_item("shards", shards)?;
    cluster.set_item("shards_answered", answered)?;
    d.set_item("cluster", cluster)?;
    let s = client.stats();
    let c = PyDict::new(py);
    c.set_item("owner_reads", s.owner_reads)?;
    c.set_item("replica_reads", s.replica_reads)?;
    c.set_item("fallbacks", s.fallbacks)?;
    c.set_item("metadata_fallbacks", s.metadata_fallbacks)?;
    c.set_item("cluster_bytes", s.cluster_bytes)?;
    c.set_item("ufs_bytes", s.ufs_bytes)?;
    c.set_item("member_failures", s.member_failures)?;
    c.set_item("skipped_dead", s.skipped_dead)?;
    c.set_item("silent_gives_up", s.silent_gives_up)?;
    c.set_item("ports_refused", s.ports_refused)?;
    c.set_item("hedges", s.hedges)?;
    c.set_item("store_hedges", s.store_hedges)?;
    c.set_item("hedges_won", s.hedges_won)?;
    c.set_item("hedges_refused", s.hedges_refused)?;
    d.set_item("client", c)?;
    d.set_item("pid", p.pid())?;
    Ok(d)
}
